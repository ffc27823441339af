#include "zfeed/cuda/gpu_decode.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zfeed/cuda/device.h"
#include "zfeed/util/error.h"

#if ZFEED_HAVE_NVCOMP
#include <nvcomp.h>
#include <nvcomp/deflate.h>
#include <nvcomp/gzip.h>
#include <nvcomp/lz4.h>
#include <nvcomp/zstd.h>

#include "zfeed/codec/blosc_gpu_plan.h"
#include "zfeed/cuda/byte_gather_kernel.h"
#include "zfeed/cuda/check.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/frame_check_kernel.h"
#endif

namespace zfeed::cuda {

bool built_with_nvcomp() {
#if ZFEED_HAVE_NVCOMP
  return true;
#else
  return false;
#endif
}

bool gpu_decode_supported(GpuCodec codec) {
  return built_with_nvcomp() && static_cast<int>(codec) < kGpuCodecCount;
}

namespace {

constexpr const char* kNoNvcomp =
    "zfeed was built without nvCOMP (pip install nvidia-libnvcomp-cu13 into .venv, or set "
    "ZFEED_NVCOMP_ROOT, and rebuild)";

// Used by the nvCOMP build only (a build with CUDA but without nvCOMP has no decoder to fail).
[[maybe_unused]] std::string item_error(const GpuDecodeItem& item, const std::string& what) {
  return std::string(item.key) + ": GPU " + gpu_codec_name(item.codec) + " decode failed: " + what;
}

}  // namespace

std::string gpu_decode_unavailable_reason() {
  if (!built_with_nvcomp()) return kNoNvcomp;
  return cuda_status().reason;
}

#if !ZFEED_HAVE_NVCOMP

std::string nvcomp_version() { return ""; }

struct GpuDecoder::Impl {
  GpuDecoderStats stats;
};

GpuDecoder::GpuDecoder(GpuDecoderOptions) : impl_(std::make_unique<Impl>()) {}
GpuDecoder::~GpuDecoder() = default;

void GpuDecoder::decode(std::span<const GpuDecodeItem> items, cudaStream_t stream) {
  enqueue(items, stream);
}

void GpuDecoder::enqueue(std::span<const GpuDecodeItem> items, cudaStream_t stream) {
  prepare(items, stream);
}

void GpuDecoder::prepare(std::span<const GpuDecodeItem> items, cudaStream_t) {
  for (const GpuDecodeItem& item : items) {
    if (item.decoded_size > 0)
      throw UnsupportedError(std::string("GPU decoding is unavailable: ") + kNoNvcomp);
  }
}

void GpuDecoder::submit() {}

void GpuDecoder::finish() {}
bool GpuDecoder::pending() const { return false; }
void GpuDecoder::relaunch(cudaStream_t) {
  throw UnsupportedError(std::string("GPU decoding is unavailable: ") + kNoNvcomp);
}
GpuDecoderStats GpuDecoder::stats() const { return impl_->stats; }

#else  // ZFEED_HAVE_NVCOMP

std::string nvcomp_version() {
  nvcompProperties_t properties{};
  if (nvcompGetProperties(&properties) != nvcompSuccess) return "unknown";
  const uint32_t v = properties.version;  // major * 1000 + minor * 100 + patch
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 100) + "." +
         std::to_string(v % 100);
}

namespace {

constexpr size_t kPayloadAlignment = 16;  // every codec's input alignment is at most 8
constexpr size_t kBounceAlignment = 256;
constexpr size_t kParallelCopyBytes = size_t{32} << 20;

size_t round_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

std::string status_text(nvcompStatus_t status) {
  const char* text = nvcompGetStatusString(status);
  return "nvcomp status " + std::to_string(static_cast<int>(status)) +
         (text && *text ? std::string(" (") + text + ")" : std::string());
}

nvcompDecompressBackend_t backend_of(NvcompBackend backend) {
  switch (backend) {
    case NvcompBackend::kCuda:
      return NVCOMP_DECOMPRESS_BACKEND_CUDA;
    case NvcompBackend::kHardware:
      return NVCOMP_DECOMPRESS_BACKEND_HARDWARE;
    case NvcompBackend::kDefault:
      break;
  }
  return NVCOMP_DECOMPRESS_BACKEND_DEFAULT;
}

// The nvCOMP family that decodes a codec's payload.
enum class Family : uint8_t { kZstd, kLz4, kGzip, kDeflate };
constexpr int kFamilies = 4;

Family family_of(GpuCodec codec) {
  switch (codec) {
    case GpuCodec::kZstd:
      return Family::kZstd;
    case GpuCodec::kLz4:
    case GpuCodec::kLz4Block:
      return Family::kLz4;
    case GpuCodec::kGzip:
      return Family::kGzip;
    case GpuCodec::kZlib:
    case GpuCodec::kDeflate:
    case GpuCodec::kBlosc:  // never a part's codec: its streams are one of the others
      break;
  }
  return Family::kDeflate;
}

const char* family_name(Family family) {
  constexpr const char* kNames[] = {"zstd", "lz4", "gzip", "deflate"};
  return kNames[static_cast<int>(family)];
}

// The options of each family's decompressor.
struct FamilyOptions {
  nvcompBatchedZstdDecompressOpts_t zstd = nvcompBatchedZstdDecompressDefaultOpts;
  nvcompBatchedLZ4DecompressOpts_t lz4 = nvcompBatchedLZ4DecompressDefaultOpts;
  nvcompBatchedGzipDecompressOpts_t gzip = nvcompBatchedGzipDecompressDefaultOpts;
  nvcompBatchedDeflateDecompressOpts_t deflate = nvcompBatchedDeflateDecompressDefaultOpts;

  explicit FamilyOptions(NvcompBackend backend) {
    // nvCOMP's defaults otherwise (gzip: the naive algorithm; its lookahead one, advised for
    // large chunks, is a candidate once measured on a GPU).
    zstd.backend = lz4.backend = gzip.backend = deflate.backend = backend_of(backend);
  }

  nvcompAlignmentRequirements_t alignments(Family family) const {
    nvcompAlignmentRequirements_t req{1, 1, 1};
    nvcompStatus_t status = nvcompSuccess;
    switch (family) {
      case Family::kZstd:
        status = nvcompBatchedZstdDecompressGetRequiredAlignments(zstd, &req);
        break;
      case Family::kLz4:
        status = nvcompBatchedLZ4DecompressGetRequiredAlignments(lz4, &req);
        break;
      case Family::kGzip:
        status = nvcompBatchedGzipDecompressGetRequiredAlignments(gzip, &req);
        break;
      case Family::kDeflate:
        status = nvcompBatchedDeflateDecompressGetRequiredAlignments(deflate, &req);
        break;
    }
    if (status != nvcompSuccess)
      throw Error(std::string("nvcomp: cannot query the ") + family_name(family) +
                  " decompressor's alignments: " + status_text(status));
    return req;
  }

  size_t temp_bytes(Family family, size_t count, size_t max_chunk, size_t total,
                    cudaStream_t stream) const {
    size_t bytes = 0;
    nvcompStatus_t status = nvcompSuccess;
    switch (family) {
      case Family::kZstd:
        status =
            nvcompBatchedZstdDecompressGetTempSize(count, max_chunk, zstd, &bytes, total, stream);
        break;
      case Family::kLz4:
        status =
            nvcompBatchedLZ4DecompressGetTempSize(count, max_chunk, lz4, &bytes, total, stream);
        break;
      case Family::kGzip:
        status =
            nvcompBatchedGzipDecompressGetTempSize(count, max_chunk, gzip, &bytes, total, stream);
        break;
      case Family::kDeflate:
        status = nvcompBatchedDeflateDecompressGetTempSize(count, max_chunk, deflate, &bytes, total,
                                                           stream);
        break;
    }
    if (status != nvcompSuccess)
      throw Error(std::string("nvcomp: cannot size the ") + family_name(family) +
                  " decompressor's temporary memory for " + std::to_string(count) +
                  " chunks: " + status_text(status));
    return bytes;
  }
};

// A batch's arrays, the same layout in pinned staging and on the device: six arrays of n entries,
// one per nvCOMP input (8 bytes each; statuses take 4 of them), the codecs (a byte each), then
// for the m entries whose bytes are on the device their positions and the GPU's verdicts on them,
// then g byte gathers (the copies out of the bounce buffer and of blosc's stored streams, then
// blosc's unshuffles), then the payloads.
struct Layout {
  size_t n = 0, m = 0, g = 0;
  size_t in_ptrs() const { return 0; }
  size_t in_sizes() const { return 8 * n; }
  size_t out_ptrs() const { return 16 * n; }
  size_t out_capacity() const { return 24 * n; }
  size_t out_actual() const { return 32 * n; }  // read back with the statuses
  size_t statuses() const { return 40 * n; }
  size_t results_bytes() const { return 16 * n; }
  size_t codecs() const { return 48 * n; }
  size_t positions() const { return round_up(49 * n, 8); }
  size_t verdicts() const { return round_up(positions() + 4 * m, 8); }  // read back
  size_t verdicts_bytes() const { return m * sizeof(codec::FrameVerdict); }
  size_t gathers() const { return round_up(verdicts() + verdicts_bytes(), 16); }
  size_t payloads() const { return round_up(gathers() + g * sizeof(ByteGather), 256); }
};

// One nvCOMP input: a chunk, or one stream of a blosc chunk.
struct Part {
  uint32_t item = 0;  // the batch's item
  GpuCodec codec =
      GpuCodec::kZstd;     // how nvCOMP decodes it (for a blosc stream, blosc's inner codec)
  bool on_device = false;  // the item's bytes are in device memory
  bool blosc = false;
  const uint8_t* src = nullptr;  // host bytes: the payload; device bytes: the stored chunk
  size_t src_size = 0;
  uint8_t* dst = nullptr;
  size_t decoded_size = 0;
  int64_t verdict = -1;  // its verdict's index, where its bytes are checked on the GPU
};

// Host bytes copied into the staging buffer at `offset`: a part's payload or a stored stream.
struct Staged {
  const uint8_t* src = nullptr;
  size_t size = 0, offset = 0;
};

// A stream blosc stored as it is: staged with the payloads, then copied into place on the GPU.
struct StoredStream {
  const uint8_t* src = nullptr;  // host
  size_t size = 0;
  uint8_t* dst = nullptr;  // device
  size_t offset = 0;       // into the device buffer, once laid out
};

struct Group {
  Family family;
  size_t first = 0, count = 0;  // into the sorted arrays
  size_t max_chunk = 0, total = 0;
};

// A device chunk whose payload nvCOMP cannot read in place: copied into the payload area.
struct Realign {
  size_t position;  // in the sorted arrays
  size_t offset;    // into the device buffer
  const void* src;  // the stored bytes on the device
  size_t size;
};

struct Bounce {
  size_t position;  // in the sorted arrays
  uint8_t* dst;
  size_t offset;  // into the bounce buffer
  size_t size;
};

// A blosc chunk of the batch and its plan.
struct BloscChunk {
  uint32_t item = 0;
  codec::BloscGpuPlan plan;
  size_t shuffled_offset = 0;  // where its streams decode, where it is byte-shuffled
};

}  // namespace

struct GpuDecoder::Impl {
  GpuDecoderOptions options;
  FamilyOptions family_options;
  std::unique_ptr<PinnedPool> own_pool;
  PinnedPool* pool = nullptr;
  PinnedPool::Buffer staging;
  // `shuffled`: blosc's byte-shuffled streams decode here before each block is unshuffled into
  // place.
  DeviceBuffer device, temp, bounce, shuffled;
  bool have_alignments = false;
  nvcompAlignmentRequirements_t alignments[kFamilies]{};
  GpuDecoderStats stats;

  // The last batch enqueued.
  Layout layout;
  std::vector<Group> groups;
  std::vector<Bounce> bounces;
  size_t temp_bytes = 0;
  std::vector<Part> parts;        // in the arrays' order (by family), kept until the next batch
  std::vector<Staged> staged;     // the host bytes to stage, in staging order
  std::vector<std::string> keys;  // by item
  std::vector<Realign> realigns;
  std::vector<BloscChunk> blosc_chunks;
  std::vector<StoredStream> stored;
  std::vector<ByteGather> unshuffles;
  size_t copy_gathers = 0, unshuffle_gathers = 0;  // launched in this order
  // Between prepare() and submit(): the bytes staged (arrays and payloads), of them the payloads'.
  bool prepared = false;
  size_t staged_bytes = 0, payload_bytes = 0;
  size_t batch_items = 0, batch_blosc_items = 0, batch_decoded_bytes = 0;
  std::string first_key, last_key;  // of the batch, for errors that name no chunk
  // Recorded after the batch's last step on the stream: finish() waits for this batch only, so
  // other work on the stream (another decoder's batch) goes on. Made by the first submit(): a
  // decoder is made (and given empty batches) where no driver runs.
  std::unique_ptr<Event> done;
  bool pending = false;
  bool launched = false;  // a batch is on the device (relaunch() may run it again)
  cudaStream_t stream = nullptr;

  explicit Impl(GpuDecoderOptions o) : options(o), family_options(o.backend) {
    if (options.pool) {
      pool = options.pool;
    } else {
      own_pool = std::make_unique<PinnedPool>(options.max_staging_bytes);
      pool = own_pool.get();
    }
  }

  // Buffers grow to a quarter more than asked (or half again their size): batches of a stream
  // differ by a few percent, and each regrowth costs a synchronizing cudaFree or a new pinned
  // allocation (tens of milliseconds for hundreds of megabytes).
  static size_t grown_size(size_t bytes, size_t old_size) {
    return round_up(std::max(bytes + bytes / 4, old_size + old_size / 2), size_t{1} << 20);
  }

  void grow(DeviceBuffer& buffer, size_t bytes) {
    if (buffer.size() >= bytes) return;
    const size_t size = grown_size(bytes, buffer.size());
    stats.device_bytes -= buffer.size();
    buffer = DeviceBuffer();  // free first: the old and new need not fit together
    buffer = DeviceBuffer(size);
    stats.device_bytes += size;
    ++stats.device_allocations;
  }

  void grow_staging(size_t bytes) {
    if (staging.data() && staging.size() >= bytes) return;
    const size_t size = grown_size(bytes, staging.size());
    staging.reset();
    if (own_pool) own_pool->trim();
    staging = pool->acquire(size <= pool->max_bytes() ? size : bytes);
  }

  std::string part_error(const Part& r, const std::string& what) const {
    return keys[r.item] + ": GPU " +
           (r.blosc ? std::string("blosc (") + gpu_codec_name(r.codec) + " streams)"
                    : std::string(gpu_codec_name(r.codec))) +
           " decode failed: " + what;
  }

  void launch(cudaStream_t s) {
    uint8_t* base = device.data();
    auto ptrs = [&](size_t offset, const Group& g) {
      return reinterpret_cast<void**>(base + offset) + g.first;
    };
    auto sizes = [&](size_t offset, const Group& g) {
      return reinterpret_cast<size_t*>(base + offset) + g.first;
    };
    for (const Group& g : groups) {
      const void* const* in = ptrs(layout.in_ptrs(), g);
      const size_t* in_sizes = sizes(layout.in_sizes(), g);
      const size_t* capacity = sizes(layout.out_capacity(), g);
      size_t* actual = sizes(layout.out_actual(), g);
      void* const* out = ptrs(layout.out_ptrs(), g);
      nvcompStatus_t* statuses =
          reinterpret_cast<nvcompStatus_t*>(base + layout.statuses()) + g.first;
      const FamilyOptions& o = family_options;
      nvcompStatus_t status = nvcompSuccess;
      switch (g.family) {
        case Family::kZstd:
          status =
              nvcompBatchedZstdDecompressAsync(in, in_sizes, capacity, actual, g.count, temp.data(),
                                               temp_bytes, out, o.zstd, statuses, s);
          break;
        case Family::kLz4:
          status =
              nvcompBatchedLZ4DecompressAsync(in, in_sizes, capacity, actual, g.count, temp.data(),
                                              temp_bytes, out, o.lz4, statuses, s);
          break;
        case Family::kGzip:
          status =
              nvcompBatchedGzipDecompressAsync(in, in_sizes, capacity, actual, g.count, temp.data(),
                                               temp_bytes, out, o.gzip, statuses, s);
          break;
        case Family::kDeflate:
          status = nvcompBatchedDeflateDecompressAsync(in, in_sizes, capacity, actual, g.count,
                                                       temp.data(), temp_bytes, out, o.deflate,
                                                       statuses, s);
          break;
      }
      if (status != nvcompSuccess) {
        cudaStreamSynchronize(s);  // the staging buffer may still be read by the copy
        pending = launched = false;
        throw Error(std::string("GPU ") + family_name(g.family) + " decode of " +
                    std::to_string(g.count) + " chunks (first " + keys[parts[g.first].item] +
                    ") failed to launch: " + status_text(status));
      }
      ++stats.launches;
    }
    // Then the copies out of the bounce buffer and of blosc's stored streams, then the unshuffles,
    // which read what the decoders and the copies wrote.
    const auto* gathers = reinterpret_cast<const ByteGather*>(base + layout.gathers());
    launch_byte_gathers(gathers, copy_gathers, s);
    launch_byte_gathers(gathers + copy_gathers, unshuffle_gathers, s);
  }

  // Copies the staged host bytes into the pinned staging buffer; with several threads for large
  // batches.
  void copy_payloads() {
    unsigned threads = options.copy_threads
                           ? options.copy_threads
                           : std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
    if (payload_bytes < kParallelCopyBytes) threads = 1;
    // Thread t copies the bytes [t * total / threads, (t + 1) * total / threads) of the staged
    // bytes laid end to end.
    auto work = [&](unsigned t) {
      const size_t begin = payload_bytes * t / threads, end = payload_bytes * (t + 1) / threads;
      size_t at = 0;
      for (const Staged& piece : staged) {
        if (at >= end) return;
        const size_t lo = std::max(at, begin), hi = std::min(at + piece.size, end);
        if (lo < hi)
          std::memcpy(staging.data() + piece.offset + (lo - at), piece.src + (lo - at), hi - lo);
        at += piece.size;
      }
    };
    if (threads == 1) return work(0);
    std::vector<std::thread> pool_threads;
    for (unsigned t = 1; t < threads; ++t) pool_threads.emplace_back(work, t);
    work(0);
    for (std::thread& thread : pool_threads) thread.join();
  }

  // Checks every chunk on the host (nothing reaches the GPU from a bad batch) and splits it into
  // parts: one per chunk, or one per compressed stream of a blosc chunk (whose stored streams and
  // unshuffles become byte gathers).
  void split(std::span<const GpuDecodeItem> items) {
    parts.clear();
    blosc_chunks.clear();
    stored.clear();
    unshuffles.clear();
    keys.resize(std::max(keys.size(), items.size()));
    batch_items = batch_blosc_items = batch_decoded_bytes = 0;
    size_t shuffled_bytes = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const GpuDecodeItem& item = items[i];
      if (item.decoded_size == 0) continue;
      if (item.dst == nullptr) throw Error(item_error(item, "no destination (null pointer)"));
      Part part;
      part.item = static_cast<uint32_t>(i);
      part.codec = item.codec;
      part.dst = static_cast<uint8_t*>(item.dst);
      part.decoded_size = item.decoded_size;
      if (item.codec == GpuCodec::kBlosc) {
        if (item.src_on_device) {
          codec::FrameVerdict verdict;
          verdict.problem = codec::FrameProblem::kBloscOnDevice;
          throw Error(item_error(item, codec::describe(verdict)));
        }
        codec::BloscGpuPlan plan =
            codec::plan_blosc_gpu(item.src, item.src_size, item.decoded_size);
        if (!plan.gpu) throw Error(item_error(item, plan.error.empty() ? plan.why : plan.error));
        BloscChunk chunk{part.item, std::move(plan), shuffled_bytes};
        if (chunk.plan.shuffled)
          shuffled_bytes = round_up(shuffled_bytes + item.decoded_size, kBounceAlignment);
        blosc_chunks.push_back(std::move(chunk));
      } else if (item.src_on_device) {
        // Checked on the GPU once the batch is there (launch_frame_checks).
        if (item.src == nullptr && item.src_size > 0)
          throw Error(item_error(item, "no source bytes (null pointer)"));
        part.on_device = true;
        part.src = item.src;
        part.src_size = item.src_size;
        parts.push_back(part);
      } else {
        const GpuPayload payload =
            gpu_payload(item.codec, item.src, item.src_size, item.decoded_size);
        if (!payload.error.empty()) throw Error(item_error(item, payload.error));
        part.src = item.src + payload.offset;
        part.src_size = payload.size;
        parts.push_back(part);
      }
      keys[i] = item.key;
      if (batch_items == 0) first_key = item.key;
      last_key = item.key;
      ++batch_items;
      batch_decoded_bytes += item.decoded_size;
    }
    if (blosc_chunks.empty()) return;
    grow(shuffled, shuffled_bytes);
    for (const BloscChunk& chunk : blosc_chunks) {
      const GpuDecodeItem& item = items[chunk.item];
      const codec::BloscGpuPlan& plan = chunk.plan;
      auto* dst = static_cast<uint8_t*>(item.dst);
      uint8_t* out = plan.shuffled ? shuffled.data() + chunk.shuffled_offset : dst;
      for (const codec::BloscGpuStream& s : plan.streams) {
        const uint8_t* src = item.src + s.src_offset;
        if (s.stored) {
          stored.push_back({src, s.size, out + s.dst_offset, 0});
          continue;
        }
        const GpuPayload payload = gpu_payload(plan.codec, src, s.src_size, s.size);
        if (!payload.error.empty())
          throw Error(item_error(item, std::string(gpu_codec_name(plan.codec)) +
                                           " stream at byte " + std::to_string(s.src_offset) +
                                           ": " + payload.error));
        Part part;
        part.item = chunk.item;
        part.codec = plan.codec;
        part.blosc = true;
        part.src = src + payload.offset;
        part.src_size = payload.size;
        part.dst = out + s.dst_offset;
        part.decoded_size = s.size;
        parts.push_back(part);
      }
      if (plan.shuffled) {
        for (const codec::BloscGpuBlock& b : plan.blocks)
          unshuffles.push_back({out + b.offset, dst + b.offset, b.size, plan.typesize});
      }
      ++batch_blosc_items;
    }
  }

  // The host's half: checks, layout, device buffers grown, arrays and payloads staged.
  void prepare(std::span<const GpuDecodeItem> items, cudaStream_t s) {
    if (pending) throw Error("GpuDecoder: prepare() before finish() of the previous batch");
    prepared = false;
    // The device holds the last batch no more: split() frees and refills what relaunch() would
    // read, and may throw half way.
    launched = false;
    split(items);
    if (parts.empty() && stored.empty()) return;
    if (!have_alignments) {
      for (int f = 0; f < kFamilies; ++f)
        alignments[f] = family_options.alignments(static_cast<Family>(f));
      have_alignments = true;
    }

    // Sort by family (stable: the batch's order within each), so each launch takes a contiguous
    // range of the arrays.
    std::stable_sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) {
      return family_of(a.codec) < family_of(b.codec);
    });
    const size_t n = parts.size();
    layout.n = n;
    layout.m = 0;
    groups.clear();
    bounces.clear();
    size_t bounce_bytes = 0;
    for (size_t pos = 0; pos < n; ++pos) {
      const Part& part = parts[pos];
      const Family family = family_of(part.codec);
      if (groups.empty() || groups.back().family != family) groups.push_back({family, pos});
      Group& g = groups.back();
      ++g.count;
      g.max_chunk = std::max(g.max_chunk, part.decoded_size);
      g.total += part.decoded_size;
      const size_t output_alignment = alignments[static_cast<int>(family)].output;
      if (reinterpret_cast<uintptr_t>(part.dst) % std::max<size_t>(output_alignment, 1) != 0) {
        bounces.push_back({pos, part.dst, bounce_bytes, part.decoded_size});
        bounce_bytes = round_up(bounce_bytes + part.decoded_size, kBounceAlignment);
      }
      if (part.on_device) parts[pos].verdict = static_cast<int64_t>(layout.m++);
    }
    copy_gathers = bounces.size() + stored.size();
    unshuffle_gathers = unshuffles.size();
    layout.g = copy_gathers + unshuffle_gathers;

    // The payloads' places: the parts' host bytes (and device bytes nvCOMP cannot read in place),
    // then blosc's stored streams.
    realigns.clear();
    staged.clear();
    std::vector<size_t> offsets(n);
    payload_bytes = 0;
    size_t at = layout.payloads();
    for (size_t pos = 0; pos < n; ++pos) {
      const Part& part = parts[pos];
      const Family family = family_of(part.codec);
      const size_t input_alignment =
          std::max(kPayloadAlignment, alignments[static_cast<int>(family)].input);
      if (part.on_device) {
        const size_t skip = codec::payload_offset(part.codec);
        const auto payload_address = reinterpret_cast<uintptr_t>(part.src) + skip;
        const size_t needed = std::max<size_t>(alignments[static_cast<int>(family)].input, 1);
        if (payload_address % needed != 0) {
          at = round_up(at + skip, input_alignment) - skip;
          realigns.push_back({pos, at, part.src, part.src_size});
          at += part.src_size;
        }
      } else {
        at = round_up(at, input_alignment);
        offsets[pos] = at;
        staged.push_back({part.src, part.src_size, at});
        at += part.src_size;
        payload_bytes += part.src_size;
      }
    }
    for (StoredStream& copy : stored) {
      at = round_up(at, kPayloadAlignment);
      copy.offset = at;
      staged.push_back({copy.src, copy.size, at});
      at += copy.size;
      payload_bytes += copy.size;
    }
    const size_t total = at;

    temp_bytes = 0;
    for (const Group& g : groups)
      temp_bytes = std::max(temp_bytes,
                            family_options.temp_bytes(g.family, g.count, g.max_chunk, g.total, s));
    grow(device, total);
    grow(temp, temp_bytes);
    grow(bounce, bounce_bytes);
    grow_staging(total);

    // The arrays, with device addresses, then the gathers, then the payloads.
    uint8_t* host = staging.data();
    uint8_t* base = device.data();
    auto host_ptrs = [&](size_t offset) { return reinterpret_cast<void**>(host + offset); };
    auto host_sizes = [&](size_t offset) { return reinterpret_cast<size_t*>(host + offset); };
    size_t bounce_index = 0, realign_index = 0;
    auto* positions = reinterpret_cast<uint32_t*>(host + layout.positions());
    for (size_t pos = 0; pos < n; ++pos) {
      const Part& part = parts[pos];
      if (part.on_device) {
        // The stored bytes (or their aligned copy): the GPU's check moves the pointer to the
        // payload and sets its size.
        const void* src = part.src;
        if (realign_index < realigns.size() && realigns[realign_index].position == pos)
          src = base + realigns[realign_index++].offset;
        host_ptrs(layout.in_ptrs())[pos] = const_cast<void*>(src);
        host_sizes(layout.in_sizes())[pos] = part.src_size;
        positions[part.verdict] = static_cast<uint32_t>(pos);
      } else {
        host_ptrs(layout.in_ptrs())[pos] = base + offsets[pos];
        host_sizes(layout.in_sizes())[pos] = part.src_size;
      }
      host[layout.codecs() + pos] = static_cast<uint8_t>(part.codec);
      void* out = part.dst;
      if (bounce_index < bounces.size() && bounces[bounce_index].position == pos)
        out = bounce.data() + bounces[bounce_index++].offset;
      host_ptrs(layout.out_ptrs())[pos] = out;
      host_sizes(layout.out_capacity())[pos] = part.decoded_size;
      host_sizes(layout.out_actual())[pos] = 0;
      reinterpret_cast<nvcompStatus_t*>(host + layout.statuses())[pos] = nvcompSuccess;
    }
    auto* gathers = reinterpret_cast<ByteGather*>(host + layout.gathers());
    for (const Bounce& b : bounces) *gathers++ = {bounce.data() + b.offset, b.dst, b.size, 1};
    for (const StoredStream& st : stored) *gathers++ = {base + st.offset, st.dst, st.size, 1};
    for (const ByteGather& u : unshuffles) *gathers++ = u;
    copy_payloads();
    staged_bytes = total;
    stream = s;
    prepared = true;
  }

  // The GPU's half, enqueued on the stream prepare() was given.
  void submit() {
    if (!prepared) return;  // nothing to decode
    prepared = false;
    try {
      enqueue(stream);
    } catch (...) {
      // Whatever was enqueued finishes before the staging buffer can be refilled by the next
      // prepare(), and nothing half launched is launched again.
      cudaStreamSynchronize(stream);
      pending = launched = false;
      throw;
    }
    ++stats.batches;
    stats.items += batch_items;
    stats.blosc_items += batch_blosc_items;
    stats.nvcomp_inputs += layout.n;
    stats.byte_gathers += layout.g;
    stats.compressed_bytes += payload_bytes;
    stats.decoded_bytes += batch_decoded_bytes;
    stats.bounced_items += bounces.size();
    stats.device_checked_items += layout.m;
    stats.realigned_items += realigns.size();
  }

  // submit()'s copies and launches, then the event finish() waits on.
  void enqueue(cudaStream_t s) {
    uint8_t* host = staging.data();
    uint8_t* base = device.data();
    check(cudaMemcpyAsync(base, host, staged_bytes, cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (GPU decode input)");
    for (const Realign& r : realigns) {
      check(cudaMemcpyAsync(base + r.offset, r.src, r.size, cudaMemcpyDeviceToDevice, s),
            "cudaMemcpyAsync (aligning a chunk read to the device)");
    }
    DeviceFrameChecks checks;
    checks.in_ptrs = reinterpret_cast<const void**>(base + layout.in_ptrs());
    checks.in_sizes = reinterpret_cast<size_t*>(base + layout.in_sizes());
    checks.out_capacity = reinterpret_cast<size_t*>(base + layout.out_capacity());
    checks.codecs = base + layout.codecs();
    checks.positions = reinterpret_cast<const uint32_t*>(base + layout.positions());
    checks.checks = layout.m;
    checks.verdicts = reinterpret_cast<codec::FrameVerdict*>(base + layout.verdicts());
    launch_frame_checks(checks, s);
    launched = true;
    launch(s);
    if (layout.n > 0)
      check(cudaMemcpyAsync(host + layout.out_actual(), base + layout.out_actual(),
                            layout.results_bytes(), cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync (GPU decode statuses)");
    if (layout.m > 0)
      check(cudaMemcpyAsync(host + layout.verdicts(), base + layout.verdicts(),
                            layout.verdicts_bytes(), cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync (GPU frame checks)");
    if (!done) done = std::make_unique<Event>();
    done->record(s);
    pending = true;
  }

  void finish() {
    if (!pending) return;
    pending = false;
    if (const cudaError_t error = cudaEventSynchronize(done->get()); error != cudaSuccess) {
      launched = false;
      throw Error("GPU decode of " + std::to_string(batch_items) + " chunks (" + first_key +
                  (batch_items > 1 ? " ... " + last_key : std::string()) +
                  "): cuda: cudaEventSynchronize: " + cudaGetErrorName(error) + ": " +
                  cudaGetErrorString(error));
    }
    const uint8_t* host = staging.data();
    const size_t* actual = reinterpret_cast<const size_t*>(host + layout.out_actual());
    const nvcompStatus_t* statuses =
        reinterpret_cast<const nvcompStatus_t*>(host + layout.statuses());
    // The first failure in the batch's order names the chunk; the count says how many more.
    size_t first = layout.n, failures = 0;
    std::string what;
    const auto* verdicts = reinterpret_cast<const codec::FrameVerdict*>(host + layout.verdicts());
    for (size_t pos = 0; pos < layout.n; ++pos) {
      const Part& r = parts[pos];
      std::string why;
      if (r.verdict >= 0 && verdicts[r.verdict].problem != codec::FrameProblem::kNone) {
        why = codec::describe(verdicts[r.verdict]);  // never reached nvCOMP
      } else if (statuses[pos] != nvcompSuccess) {
        why = status_text(statuses[pos]);
      } else if (actual[pos] != r.decoded_size) {
        why = "decoded " + std::to_string(actual[pos]) + " bytes, expected " +
              std::to_string(r.decoded_size);
      }
      if (why.empty()) continue;
      ++failures;
      if (first == layout.n || r.item < parts[first].item) {
        first = pos;
        what = std::move(why);
      }
    }
    if (failures == 0) return;
    std::string message = part_error(parts[first], what);
    if (failures > 1)
      message += " (and " + std::to_string(failures - 1) + " more of the batch's " +
                 (batch_blosc_items > 0 ? "chunks and blosc streams" : "chunks") + " failed)";
    throw Error(message);
  }
};

GpuDecoder::GpuDecoder(GpuDecoderOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

GpuDecoder::~GpuDecoder() {
  // The staging buffer must not return to a shared pool while the GPU may still read it.
  if (impl_->pending) cudaEventSynchronize(impl_->done->get());
}

void GpuDecoder::decode(std::span<const GpuDecodeItem> items, cudaStream_t stream) {
  impl_->prepare(items, stream);
  impl_->submit();
  impl_->finish();
}

void GpuDecoder::enqueue(std::span<const GpuDecodeItem> items, cudaStream_t stream) {
  impl_->prepare(items, stream);
  impl_->submit();
}

void GpuDecoder::prepare(std::span<const GpuDecodeItem> items, cudaStream_t stream) {
  impl_->prepare(items, stream);
}

void GpuDecoder::submit() { impl_->submit(); }

void GpuDecoder::finish() { impl_->finish(); }
bool GpuDecoder::pending() const { return impl_->pending; }

void GpuDecoder::relaunch(cudaStream_t stream) {
  if (impl_->pending) throw Error("GpuDecoder: relaunch() before finish()");
  if (!impl_->launched) throw Error("GpuDecoder: relaunch() without a batch on the device");
  impl_->launch(stream);
}

GpuDecoderStats GpuDecoder::stats() const { return impl_->stats; }

#endif  // ZFEED_HAVE_NVCOMP

}  // namespace zfeed::cuda
