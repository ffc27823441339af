// GPU batched decompression (gpu_decode.h) and the GPU decode plan of a Zarr codec chain
// (gpu_decode_plan.h). Chunks are compressed on the CPU with the libraries zfeed reads Zarr with
// (libzstd, liblz4, libdeflate), decoded on the GPU by nvCOMP and compared byte for byte. Without
// a GPU (or a build without nvCOMP) the device tests skip with the reason; the host checks of the
// containers, the plans and the behaviour without nvCOMP run everywhere CUDA is built.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "zfeed/cuda/device.h"
#include "zfeed/util/error.h"

#if ZFEED_HAVE_CUDA
#include "zfeed/cuda/check.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/gpu_decode.h"
#if !defined(ZFEED_CUDA_ONLY_BUILD) || ZFEED_HAVE_CPU_CODECS
#define ZFEED_TEST_CPU_CODECS 1
#include <libdeflate.h>
#include <lz4.h>
#include <zstd.h>
#endif
#ifndef ZFEED_CUDA_ONLY_BUILD
#define ZFEED_TEST_BLOSC 1
#include <blosc.h>

#include "zfeed/codec/blosc_gpu_plan.h"
#include "zfeed/codec/codec.h"
#include "zfeed/cuda/gpu_decode_plan.h"
#include "zfeed/store/store.h"
#include "zfeed/util/json.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/metadata.h"
#endif
#endif

namespace zfeed::cuda {
namespace {

#if ZFEED_HAVE_CUDA

using Buffer = std::vector<uint8_t>;

template <typename F>
std::string error_message(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no zfeed::Error";
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A smooth float32 field (waves over a latitude gradient, stored with 16-bit GRIB-like
// precision): compresses like weather data, neither noise nor constant.
Buffer smooth_field(size_t rows, size_t cols, int seed) {
  Buffer bytes(rows * cols * 4);
  float* values = reinterpret_cast<float*>(bytes.data());
  const double phase = 0.7 * seed;
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      const double lat = 3.14159 * (double(i) / rows - 0.5), lon = 6.28318 * double(j) / cols;
      double v = 250 + 40 * std::cos(lat) + 8 * std::sin(3 * lon + phase) * std::cos(2 * lat) +
                 3 * std::sin(11 * lon - 7 * lat + phase) + 0.5 * std::cos(29 * lon + 17 * lat);
      values[i * cols + j] = static_cast<float>(std::round(v * 256) / 256);  // 1/256 K steps
    }
  }
  return bytes;
}

#if ZFEED_TEST_CPU_CODECS

Buffer zstd_frame(const Buffer& data, int level = 3) {
  Buffer out(ZSTD_compressBound(data.size()));
  const size_t size = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), level);
  EXPECT_FALSE(ZSTD_isError(size));
  out.resize(size);
  return out;
}

// Through the streaming API, fed in pieces: the frame has no content size.
Buffer zstd_stream(const Buffer& data, bool checksum = false) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, checksum ? 1 : 0);
  Buffer out(ZSTD_compressBound(data.size()) + 1024);
  ZSTD_outBuffer output{out.data(), out.size(), 0};
  const size_t piece = 50000;
  for (size_t at = 0; at < data.size(); at += piece) {
    ZSTD_inBuffer input{data.data() + at, std::min(piece, data.size() - at), 0};
    while (input.pos < input.size)
      EXPECT_FALSE(ZSTD_isError(ZSTD_compressStream2(cctx, &output, &input, ZSTD_e_continue)));
  }
  ZSTD_inBuffer none{nullptr, 0, 0};
  size_t left = 0;
  do {
    left = ZSTD_compressStream2(cctx, &output, &none, ZSTD_e_end);
    EXPECT_FALSE(ZSTD_isError(left));
  } while (left != 0 && !ZSTD_isError(left));
  ZSTD_freeCCtx(cctx);
  out.resize(output.pos);
  return out;
}

Buffer lz4_block(const Buffer& data) {
  Buffer out(LZ4_compressBound(static_cast<int>(data.size())));
  const int size = LZ4_compress_default(
      reinterpret_cast<const char*>(data.data()), reinterpret_cast<char*>(out.data()),
      static_cast<int>(data.size()), static_cast<int>(out.size()));
  EXPECT_GT(size, 0);
  out.resize(size);
  return out;
}

// numcodecs' LZ4: the decoded size (4 bytes, little-endian), then the block.
Buffer lz4_numcodecs(const Buffer& data) {
  Buffer block = lz4_block(data);
  Buffer out(4 + block.size());
  const uint32_t size = static_cast<uint32_t>(data.size());
  std::memcpy(out.data(), &size, 4);
  if (!block.empty()) std::memcpy(out.data() + 4, block.data(), block.size());
  return out;
}

enum class Deflate { kGzip, kZlib, kRaw };
Buffer deflate(const Buffer& data, Deflate kind, int level = 6) {
  libdeflate_compressor* c = libdeflate_alloc_compressor(level);
  Buffer out(libdeflate_gzip_compress_bound(c, data.size()) + 64);
  size_t size = 0;
  switch (kind) {
    case Deflate::kGzip:
      size = libdeflate_gzip_compress(c, data.data(), data.size(), out.data(), out.size());
      break;
    case Deflate::kZlib:
      size = libdeflate_zlib_compress(c, data.data(), data.size(), out.data(), out.size());
      break;
    case Deflate::kRaw:
      size = libdeflate_deflate_compress(c, data.data(), data.size(), out.data(), out.size());
      break;
  }
  libdeflate_free_compressor(c);
  EXPECT_GT(size, 0u);
  out.resize(size);
  return out;
}

Buffer compress(GpuCodec codec, const Buffer& data) {
  switch (codec) {
    case GpuCodec::kZstd:
      return zstd_frame(data);
    case GpuCodec::kLz4:
      return lz4_numcodecs(data);
    case GpuCodec::kLz4Block:
      return lz4_block(data);
    case GpuCodec::kGzip:
      return deflate(data, Deflate::kGzip);
    case GpuCodec::kZlib:
      return deflate(data, Deflate::kZlib);
    case GpuCodec::kDeflate:
      return deflate(data, Deflate::kRaw);
    case GpuCodec::kBlosc:
      break;  // blosc_chunk(), where c-blosc is built in
  }
  return {};
}

#if ZFEED_TEST_BLOSC
// A c-blosc 1.x chunk (c-blosc's own compressor, as zarr-python and numcodecs write them).
Buffer blosc_chunk(const Buffer& data, const char* cname, int shuffle = BLOSC_SHUFFLE,
                   size_t typesize = 4, size_t blocksize = 0, int clevel = 5) {
  Buffer out(data.size() + BLOSC_MAX_OVERHEAD);
  const int size = blosc_compress_ctx(clevel, shuffle, typesize, data.size(), data.data(),
                                      out.data(), out.size(), cname, blocksize, 1);
  EXPECT_GT(size, 0) << cname;
  out.resize(static_cast<size_t>(std::max(size, 0)));
  return out;
}
#endif

#define ZFEED_NEED_CPU_CODECS() (void)0
#else
#define ZFEED_NEED_CPU_CODECS() \
  GTEST_SKIP() << "no libzstd/liblz4/libdeflate in this build (.gpu-deps/cpu-codecs)"
#endif  // ZFEED_TEST_CPU_CODECS

#define ZFEED_SKIP_WITHOUT_GPU_DECODE()                        \
  do {                                                         \
    const std::string why_ = gpu_decode_unavailable_reason();  \
    if (!why_.empty()) GTEST_SKIP() << "GPU decode: " << why_; \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Everywhere CUDA is built.

TEST(NvcompBuild, SaysWhetherNvcompIsBuiltIn) {
#if ZFEED_HAVE_NVCOMP
  EXPECT_TRUE(built_with_nvcomp());
  EXPECT_EQ(nvcomp_version().rfind("6.", 0), 0u) << nvcomp_version();
#else
  EXPECT_FALSE(built_with_nvcomp());
  EXPECT_EQ(nvcomp_version(), "");
  EXPECT_TRUE(contains(gpu_decode_unavailable_reason(), "zfeed was built without nvCOMP"))
      << gpu_decode_unavailable_reason();
#endif
  for (int c = 0; c < kGpuCodecCount; ++c)
    EXPECT_EQ(gpu_decode_supported(static_cast<GpuCodec>(c)), built_with_nvcomp());
  EXPECT_STREQ(gpu_codec_name(GpuCodec::kZstd), "zstd");
  EXPECT_STREQ(gpu_codec_name(GpuCodec::kLz4), "lz4");
  EXPECT_STREQ(gpu_codec_name(GpuCodec::kZlib), "zlib");
  std::printf("nvCOMP: built %d, version '%s', GPU decode %s\n", built_with_nvcomp(),
              nvcomp_version().c_str(),
              gpu_decode_unavailable_reason().empty() ? "available"
                                                      : gpu_decode_unavailable_reason().c_str());
}

TEST(NvcompStub, DecodingWithoutNvcompSaysSo) {
  if (built_with_nvcomp()) GTEST_SKIP() << "built with nvCOMP";
  GpuDecoder decoder;
  uint8_t src[8] = {}, dst[8] = {};
  const GpuDecodeItem item{GpuCodec::kZstd, src, 8, dst, 8, "t2m/c/0/0"};
  try {
    decoder.decode({&item, 1}, nullptr);
    FAIL() << "no exception";
  } catch (const UnsupportedError& e) {
    EXPECT_TRUE(contains(e.what(), "GPU decoding is unavailable: zfeed was built without nvCOMP"))
        << e.what();
  }
}

// An empty batch, or one whose chunks all decode to nothing, touches no GPU.
TEST(NvcompDecoder, EmptyBatchDoesNothing) {
  GpuDecoder decoder;
  decoder.decode({}, nullptr);
  const GpuDecodeItem nothing{GpuCodec::kZstd, nullptr, 0, nullptr, 0, "empty"};
  decoder.decode({&nothing, 1}, nullptr);
  EXPECT_FALSE(decoder.pending());
  EXPECT_EQ(decoder.stats().batches, 0u);
  EXPECT_EQ(decoder.stats().device_allocations, 0u);
}

TEST(NvcompPayload, ZstdFramesAreCheckedOnTheHost) {
  ZFEED_NEED_CPU_CODECS();
#if ZFEED_TEST_CPU_CODECS
  const Buffer data = smooth_field(64, 96, 1);
  const Buffer frame = zstd_frame(data);
  GpuPayload p = gpu_payload(GpuCodec::kZstd, frame.data(), frame.size(), data.size());
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.offset, 0u);
  EXPECT_EQ(p.size, frame.size());

  // The content size in the frame header must be the chunk's size.
  p = gpu_payload(GpuCodec::kZstd, frame.data(), frame.size(), data.size() + 4);
  EXPECT_EQ(p.error, "frame says " + std::to_string(data.size()) + " bytes, expected " +
                         std::to_string(data.size() + 4));

  // Truncated anywhere: in the header, in a block header, inside a block.
  for (size_t keep : {size_t{3}, size_t{5}, frame.size() / 2, frame.size() - 1}) {
    p = gpu_payload(GpuCodec::kZstd, frame.data(), keep, data.size());
    EXPECT_TRUE(contains(p.error, "truncated at byte " + std::to_string(keep)) ||
                contains(p.error, std::to_string(keep) + " bytes is too short"))
        << keep << ": " << p.error;
  }
  Buffer bad = frame;
  bad[0] ^= 0xFF;
  EXPECT_TRUE(contains(gpu_payload(GpuCodec::kZstd, bad.data(), bad.size(), data.size()).error,
                       "not a zstd frame (magic 0x"));
  Buffer longer = frame;
  longer.insert(longer.end(), frame.begin(), frame.end());  // two frames
  EXPECT_TRUE(
      contains(gpu_payload(GpuCodec::kZstd, longer.data(), longer.size(), data.size()).error,
               std::to_string(frame.size()) + " bytes after the frame"));

  // Streamed frames carry no content size (any expected size passes the header) and may carry a
  // checksum.
  const Buffer streamed = zstd_stream(data, /*checksum=*/true);
  ASSERT_EQ(ZSTD_getFrameContentSize(streamed.data(), streamed.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  EXPECT_EQ(gpu_payload(GpuCodec::kZstd, streamed.data(), streamed.size(), data.size()).error, "");
  EXPECT_TRUE(contains(
      gpu_payload(GpuCodec::kZstd, streamed.data(), streamed.size() - 2, data.size()).error,
      "truncated"));
#endif
}

TEST(NvcompPayload, Lz4GzipZlibContainersAreCheckedOnTheHost) {
  ZFEED_NEED_CPU_CODECS();
#if ZFEED_TEST_CPU_CODECS
  const Buffer data = smooth_field(32, 50, 2);
  const Buffer lz4 = lz4_numcodecs(data);
  GpuPayload p = gpu_payload(GpuCodec::kLz4, lz4.data(), lz4.size(), data.size());
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.offset, 4u);
  EXPECT_EQ(p.size, lz4.size() - 4);
  EXPECT_EQ(gpu_payload(GpuCodec::kLz4, lz4.data(), lz4.size(), 100).error,
            "header says " + std::to_string(data.size()) + " bytes, expected 100");
  EXPECT_EQ(gpu_payload(GpuCodec::kLz4, lz4.data(), 3, data.size()).error,
            "3 bytes is too short for the LZ4 size header");

  const Buffer gz = deflate(data, Deflate::kGzip);
  p = gpu_payload(GpuCodec::kGzip, gz.data(), gz.size(), data.size());
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.size, gz.size());
  EXPECT_TRUE(contains(gpu_payload(GpuCodec::kGzip, gz.data(), gz.size(), 7).error,
                       "trailer says " + std::to_string(data.size())));
  Buffer bad = gz;
  bad[0] = 0;
  EXPECT_TRUE(contains(gpu_payload(GpuCodec::kGzip, bad.data(), bad.size(), data.size()).error,
                       "not a gzip stream"));

  const Buffer zl = deflate(data, Deflate::kZlib);
  p = gpu_payload(GpuCodec::kZlib, zl.data(), zl.size(), data.size());
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.offset, 2u);
  EXPECT_EQ(p.size, zl.size() - 6);
  bad = zl;
  bad[1] ^= 1;  // breaks the header check bits
  EXPECT_TRUE(contains(gpu_payload(GpuCodec::kZlib, bad.data(), bad.size(), data.size()).error,
                       "header check bits"));
  EXPECT_TRUE(contains(gpu_payload(GpuCodec::kZlib, gz.data(), gz.size(), data.size()).error,
                       "not deflate"));
#endif
}

#if ZFEED_TEST_BLOSC
// Blosc chunks are checked whole on the host (gpu_payload), and the decoder refuses, before any
// GPU work and naming the key, the ones it cannot take: blosclz or bit shuffle inside (the loader
// then decodes the batch on the CPU), a corrupt chunk, a chunk in device memory.
TEST(NvcompPayload, BloscChunksAreCheckedOnTheHost) {
  const Buffer data = smooth_field(64, 96, 3);
  const Buffer good = blosc_chunk(data, "zstd");
  GpuPayload p = gpu_payload(GpuCodec::kBlosc, good.data(), good.size(), data.size());
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.offset, 0u);
  EXPECT_EQ(p.size, good.size());
  const Buffer blosclz = blosc_chunk(data, "blosclz");
  EXPECT_TRUE(
      contains(gpu_payload(GpuCodec::kBlosc, blosclz.data(), blosclz.size(), data.size()).error,
               "blosclz has no nvCOMP decoder"));
  EXPECT_TRUE(contains(gpu_payload(GpuCodec::kBlosc, good.data(), 10, data.size()).error,
                       "blosc: corrupt chunk: 10 bytes"));
  EXPECT_TRUE(
      contains(gpu_payload(GpuCodec::kBlosc, good.data(), good.size(), 64).error, "expected 64"));
  if (!built_with_nvcomp()) return;  // the decoder's checks need nvCOMP built in

  GpuDecoder decoder;
  uint8_t dst[16];
  const Buffer bits = blosc_chunk(data, "lz4", BLOSC_BITSHUFFLE);
  const Buffer cut(good.begin(), good.begin() + good.size() / 2);
  auto refusal = [&](const Buffer& chunk, bool on_device = false) {
    GpuDecodeItem item{GpuCodec::kBlosc, chunk.data(), chunk.size(), dst, data.size(), "b/c/4"};
    item.src_on_device = on_device;
    return error_message([&] { decoder.decode({&item, 1}, nullptr); });
  };
  EXPECT_EQ(refusal(blosclz),
            "b/c/4: GPU blosc decode failed: blosc's inner compressor blosclz has no nvCOMP "
            "decoder");
  EXPECT_EQ(refusal(bits),
            "b/c/4: GPU blosc decode failed: blosc's bit shuffle is undone on the CPU");
  EXPECT_TRUE(contains(refusal(cut), "b/c/4: GPU blosc decode failed: blosc: corrupt chunk: "))
      << refusal(cut);
  EXPECT_TRUE(contains(refusal(good, true),
                       "b/c/4: GPU blosc decode failed: a blosc chunk is "
                       "split into its streams on the host"));
  EXPECT_FALSE(decoder.pending());
  EXPECT_EQ(decoder.stats().batches, 0u);
}
#endif

// ---------------------------------------------------------------------------------------------
// On a GPU with nvCOMP.

// Device memory for a batch's outputs, read back for comparison.
struct DeviceOutputs {
  DeviceBuffer buffer;
  std::vector<size_t> offsets;

  // `sizes` bytes each; `skew` bytes past a 256-byte boundary (a misaligned destination).
  DeviceOutputs(const std::vector<size_t>& sizes, const std::vector<size_t>& skew = {}) {
    size_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      offsets.push_back(at + (i < skew.size() ? skew[i] : 0));
      at = (offsets.back() + sizes[i] + 511) / 256 * 256;
    }
    buffer = DeviceBuffer(at);
    fill_device(buffer.data(), 0xAB, at);
  }
  void* at(size_t i) const { return buffer.data() + offsets[i]; }
  Buffer read(size_t i, size_t size) const {
    Buffer out(size);
    check(cudaMemcpy(out.data(), at(i), size, cudaMemcpyDeviceToHost), "read back");
    return out;
  }
};

#if ZFEED_TEST_CPU_CODECS

// Decodes one chunk of each codec (separately) and compares.
TEST(NvcompDecode, EveryCodecRoundTrips) {
  ZFEED_SKIP_WITHOUT_GPU_DECODE();
  Stream stream;
  GpuDecoder decoder;
  const Buffer data = smooth_field(256, 384, 3);
  for (int c = 0; c < kGpuCodecCount; ++c) {
    const GpuCodec codec = static_cast<GpuCodec>(c);
    SCOPED_TRACE(gpu_codec_name(codec));
#if ZFEED_TEST_BLOSC
    const Buffer stored =
        codec == GpuCodec::kBlosc ? blosc_chunk(data, "lz4") : compress(codec, data);
#else
    if (codec == GpuCodec::kBlosc) continue;  // no c-blosc in the CUDA layer's own build
    const Buffer stored = compress(codec, data);
#endif
    DeviceOutputs out({data.size()});
    const GpuDecodeItem item{codec, stored.data(), stored.size(), out.at(0), data.size(), "chunk"};
    decoder.decode({&item, 1}, stream.get());
    EXPECT_TRUE(out.read(0, data.size()) == data);
  }
}

TEST(NvcompDecode, ZstdFrameWithoutContentSize) {
  ZFEED_SKIP_WITHOUT_GPU_DECODE();
  Stream stream;
  GpuDecoder decoder;
  const Buffer data = smooth_field(300, 333, 4);
  for (bool checksum : {false, true}) {
    const Buffer stored = zstd_stream(data, checksum);
    ASSERT_EQ(ZSTD_getFrameContentSize(stored.data(), stored.size()), ZSTD_CONTENTSIZE_UNKNOWN);
    DeviceOutputs out({data.size()});
    const GpuDecodeItem item{GpuCodec::kZstd, stored.data(), stored.size(),
                             out.at(0),       data.size(),   "t/c/0"};
    decoder.decode({&item, 1}, stream.get());
    EXPECT_TRUE(out.read(0, data.size()) == data) << "checksum " << checksum;
  }
}

// Several codecs and sizes in one batch (sizes not multiples of 4, destinations misaligned), and
// the decoder's buffers reused from one batch to the next.
TEST(NvcompDecode, MixedBatchAndBufferReuse) {
  ZFEED_SKIP_WITHOUT_GPU_DECODE();
  Stream stream;
  GpuDecoder decoder;
  const GpuCodec codecs[] = {GpuCodec::kZstd,     GpuCodec::kLz4,  GpuCodec::kGzip,
                             GpuCodec::kZlib,     GpuCodec::kZstd, GpuCodec::kDeflate,
                             GpuCodec::kLz4Block, GpuCodec::kLz4,  GpuCodec::kZstd};
  const size_t n = std::size(codecs);
  std::vector<Buffer> originals, stored;
  std::vector<size_t> sizes, skew;
  for (size_t i = 0; i < n; ++i) {
    Buffer field = smooth_field(40 + 37 * i, 64 + 21 * i, 10 + static_cast<int>(i));
    field.resize(field.size() - (i % 4));  // some sizes not a multiple of 4
    sizes.push_back(field.size());
    skew.push_back(i % 3 == 2 ? 4 : (i % 5 == 4 ? 1 : 0));
    stored.push_back(compress(codecs[i], field));
    originals.push_back(std::move(field));
  }
  DeviceOutputs out(sizes, skew);
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back("mixed/c/" + std::to_string(i));
  std::vector<GpuDecodeItem> items;
  for (size_t i = 0; i < n; ++i)
    items.push_back({codecs[i], stored[i].data(), stored[i].size(), out.at(i), sizes[i], keys[i]});

  uint64_t allocations = 0;
  for (int round = 0; round < 3; ++round) {
    fill_device(out.buffer.data(), 0, out.buffer.size());
    if (round == 1) {  // the two halves, with the host free in between
      decoder.enqueue(items, stream.get());
      EXPECT_TRUE(decoder.pending());
      decoder.finish();
    } else {
      decoder.decode(items, stream.get());
    }
    for (size_t i = 0; i < n; ++i)
      EXPECT_TRUE(out.read(i, sizes[i]) == originals[i]) << keys[i] << " round " << round;
    if (round == 0) allocations = decoder.stats().device_allocations;
  }
  const GpuDecoderStats stats = decoder.stats();
  EXPECT_EQ(stats.device_allocations, allocations) << "device buffers reallocated after warm-up";
  EXPECT_EQ(stats.batches, 3u);
  EXPECT_EQ(stats.items, 3 * n);
  EXPECT_LE(stats.launches, 3u * 4);  // one per nvCOMP family present
  std::printf("mixed batch: %llu launches, %llu bounced items, %zu device bytes\n",
              static_cast<unsigned long long>(stats.launches),
              static_cast<unsigned long long>(stats.bounced_items), stats.device_bytes);

  // relaunch() decodes the batch on the device again.
  fill_device(out.buffer.data(), 0, out.buffer.size());
  decoder.relaunch(stream.get());
  stream.synchronize();
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(out.read(i, sizes[i]) == originals[i]) << keys[i];
}

// Faults the host sees (a corrupt zstd magic, a truncated frame, a wrong LZ4 header) and faults
// only the GPU sees (a frame that decodes to fewer or more bytes than the chunk holds, a
// truncated LZ4 block): each error names the chunk's key; the decoder goes on working.
TEST(NvcompDecode, CorruptAndTruncatedChunksNameTheKey) {
  ZFEED_SKIP_WITHOUT_GPU_DECODE();
  Stream stream;
  GpuDecoder decoder;
  const Buffer data = smooth_field(128, 200, 5);
  const Buffer good = zstd_frame(data);
  DeviceOutputs out({data.size(), data.size()});
  auto decode_pair = [&](GpuCodec codec, const Buffer& bad, size_t bad_size) {
    const GpuDecodeItem items[] = {
        {GpuCodec::kZstd, good.data(), good.size(), out.at(0), data.size(), "t2m/c/0/0/0"},
        {codec, bad.data(), bad.size(), out.at(1), bad_size, "t2m/c/7/0/0"}};
    return error_message([&] { decoder.decode(items, stream.get()); });
  };

  Buffer corrupt = good;
  corrupt[1] ^= 0x40;
  EXPECT_TRUE(contains(decode_pair(GpuCodec::kZstd, corrupt, data.size()),
                       "t2m/c/7/0/0: GPU zstd decode failed: not a zstd frame"));
  const Buffer truncated(good.begin(), good.begin() + good.size() * 2 / 3);
  EXPECT_TRUE(contains(decode_pair(GpuCodec::kZstd, truncated, data.size()),
                       "t2m/c/7/0/0: GPU zstd decode failed: frame truncated at byte " +
                           std::to_string(truncated.size())));
  const Buffer lz4 = lz4_numcodecs(data);
  EXPECT_TRUE(contains(decode_pair(GpuCodec::kLz4, lz4, data.size() - 8),
                       "t2m/c/7/0/0: GPU lz4 decode failed: header says"));

  // No content size in the frame: only the GPU finds that the sizes differ.
  const Buffer streamed = zstd_stream(data);
  std::string message = decode_pair(GpuCodec::kZstd, streamed, data.size() - 100);
  EXPECT_EQ(message.rfind("t2m/c/7/0/0: GPU zstd decode failed: ", 0), 0u) << message;
  std::printf("output too small: %s\n", message.c_str());
  const Buffer smaller = zstd_stream(Buffer(data.begin(), data.end() - 100));
  message = decode_pair(GpuCodec::kZstd, smaller, data.size());
  EXPECT_TRUE(contains(message, "t2m/c/7/0/0: GPU zstd decode failed: decoded " +
                                    std::to_string(data.size() - 100) + " bytes, expected " +
                                    std::to_string(data.size())) ||
              contains(message, "t2m/c/7/0/0: GPU zstd decode failed: nvcomp status"))
      << message;
  // LZ4 blocks are bounds-checked by nvCOMP's CUDA decoder: a truncated one is reported.
  Buffer cut = lz4;
  cut.resize(4 + (lz4.size() - 4) / 2);
  message = decode_pair(GpuCodec::kLz4, cut, data.size());
  EXPECT_EQ(message.rfind("t2m/c/7/0/0: GPU lz4 decode failed: ", 0), 0u) << message;
  std::printf("truncated lz4: %s\n", message.c_str());

  // The decoder still decodes after the errors.
  const GpuDecodeItem item{GpuCodec::kZstd, good.data(), good.size(), out.at(1), data.size(), "ok"};
  decoder.decode({&item, 1}, stream.get());
  EXPECT_TRUE(out.read(1, data.size()) == data);
}

// Chunks already in device memory (as cuFile reads them): checked on the GPU by the host's code,
// decoded in place, or from an aligned copy where the payload is misaligned (an LZ4 chunk one
// byte off); bad ones fail with the host check's message and never reach nvCOMP.
TEST(NvcompDecode, ChunksInDeviceMemoryAreCheckedOnTheGpu) {
  ZFEED_SKIP_WITHOUT_GPU_DECODE();
  Stream stream;
  GpuDecoder decoder;
  const GpuCodec codecs[] = {GpuCodec::kZstd, GpuCodec::kLz4,      GpuCodec::kGzip,
                             GpuCodec::kZlib, GpuCodec::kLz4Block, GpuCodec::kDeflate};
  const size_t n = std::size(codecs);
  std::vector<Buffer> originals, stored;
  std::vector<size_t> sizes, places;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    originals.push_back(smooth_field(50 + 13 * i, 70 + 9 * i, 20 + static_cast<int>(i)));
    sizes.push_back(originals.back().size());
    stored.push_back(compress(codecs[i], originals.back()));
    places.push_back(at + (i % 2));  // every other chunk one byte off
    at = (places.back() + stored.back().size() + 4095) / 4096 * 4096;
  }
  DeviceBuffer compressed(at);
  for (size_t i = 0; i < n; ++i)
    check(cudaMemcpy(compressed.data() + places[i], stored[i].data(), stored[i].size(),
                     cudaMemcpyHostToDevice),
          "upload");
  DeviceOutputs out(sizes);
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back("dev/c/" + std::to_string(i));
  std::vector<GpuDecodeItem> items;
  for (size_t i = 0; i < n; ++i) {
    GpuDecodeItem item{
        codecs[i], compressed.data() + places[i], stored[i].size(), out.at(i), sizes[i], keys[i]};
    item.src_on_device = true;
    items.push_back(item);
  }
  decoder.decode(items, stream.get());
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(out.read(i, sizes[i]) == originals[i]) << keys[i];
  const GpuDecoderStats stats = decoder.stats();
  EXPECT_EQ(stats.device_checked_items, n);
  std::printf("device chunks: %llu realigned of %zu\n",
              static_cast<unsigned long long>(stats.realigned_items), n);

  // A truncated zstd frame and a corrupt LZ4 header, on the device: the host check's messages.
  const Buffer truncated(stored[0].begin(), stored[0].begin() + stored[0].size() / 2);
  Buffer bad_header = stored[1];
  bad_header[0] ^= 1;
  for (const auto& [codec, bad] :
       {std::pair{GpuCodec::kZstd, truncated}, std::pair{GpuCodec::kLz4, bad_header}}) {
    const size_t index = codec == GpuCodec::kZstd ? 0 : 1;
    check(cudaMemcpy(compressed.data() + places[index], bad.data(), bad.size(),
                     cudaMemcpyHostToDevice),
          "upload");
    std::vector<GpuDecodeItem> batch = items;
    batch[index].src_size = bad.size();
    const std::string expected =
        keys[index] + ": GPU " + gpu_codec_name(codec) +
        " decode failed: " + gpu_payload(codec, bad.data(), bad.size(), sizes[index]).error;
    EXPECT_EQ(error_message([&] { decoder.decode(batch, stream.get()); }), expected);
    check(cudaMemcpy(compressed.data() + places[index], stored[index].data(), stored[index].size(),
                     cudaMemcpyHostToDevice),
          "upload");
  }
  // And it goes on decoding.
  decoder.decode(items, stream.get());
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(out.read(i, sizes[i]) == originals[i]) << keys[i];
}

#if ZFEED_TEST_BLOSC

// Blosc chunks of every inner codec nvCOMP decodes, byte-shuffled or not, element sizes that
// split blocks and that do not (3, 16), a partial last block, small forced blocks, incompressible
// values (stored streams; with clevel 0 the whole chunk a stored copy), misaligned destinations,
// all in one batch with a plain zstd chunk: each decodes to exactly its values.
TEST(NvcompDecode, BloscChunksDecodeOnTheGpu) {
  ZFEED_SKIP_WITHOUT_GPU_DECODE();
  Stream stream;
  GpuDecoder decoder;
  struct Case {
    const char* cname;
    int shuffle;
    size_t typesize, blocksize;
    int clevel;
    bool noise;
  };
  std::vector<Case> cases;
  for (const char* cname : {"lz4", "lz4hc", "zstd", "zlib"})
    for (int shuffle : {BLOSC_NOSHUFFLE, BLOSC_SHUFFLE})
      for (size_t typesize : {size_t{1}, size_t{4}, size_t{8}, size_t{3}, size_t{16}})
        cases.push_back({cname, shuffle, typesize, 0, 5, false});
  cases.push_back({"lz4", BLOSC_SHUFFLE, 4, 4096, 5, false});  // many small blocks
  cases.push_back({"zstd", BLOSC_SHUFFLE, 4, 0, 5, true});     // incompressible: stored streams
  cases.push_back({"lz4", BLOSC_SHUFFLE, 4, 0, 0, false});     // clevel 0: a stored copy
  const size_t n = cases.size() + 1;
  std::vector<Buffer> originals, stored;
  std::vector<size_t> sizes, skew;
  std::vector<std::string> keys;
  std::vector<GpuCodec> codecs;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Buffer values = smooth_field(97 + 11 * (i % 7), 301, static_cast<int>(i));
    values.resize(values.size() - (i % 5));  // a partial last block, a size not a multiple of 4
    if (c.noise) {
      uint64_t state = 0x9E3779B97F4A7C15ull + i;
      for (uint8_t& byte : values) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        byte = static_cast<uint8_t>(state >> 56);
      }
    }
    stored.push_back(blosc_chunk(values, c.cname, c.shuffle, c.typesize, c.blocksize, c.clevel));
    sizes.push_back(values.size());
    skew.push_back(i % 4 == 3 ? 1 : 0);
    keys.push_back(std::string("blosc/") + c.cname + "/s" + std::to_string(c.shuffle) + "/t" +
                   std::to_string(c.typesize) + "/c/" + std::to_string(i));
    codecs.push_back(GpuCodec::kBlosc);
    originals.push_back(std::move(values));
  }
  originals.push_back(smooth_field(64, 128, 99));
  stored.push_back(zstd_frame(originals.back()));
  sizes.push_back(originals.back().size());
  skew.push_back(0);
  keys.push_back("plain/c/0");
  codecs.push_back(GpuCodec::kZstd);
  DeviceOutputs out(sizes, skew);
  std::vector<GpuDecodeItem> items;
  for (size_t i = 0; i < n; ++i)
    items.push_back({codecs[i], stored[i].data(), stored[i].size(), out.at(i), sizes[i], keys[i]});
  for (int round = 0; round < 2; ++round) {
    fill_device(out.buffer.data(), 0, out.buffer.size());
    decoder.decode(items, stream.get());
    for (size_t i = 0; i < n; ++i)
      EXPECT_TRUE(out.read(i, sizes[i]) == originals[i]) << keys[i] << " round " << round;
  }
  const GpuDecoderStats stats = decoder.stats();
  EXPECT_EQ(stats.items, 2 * n);
  EXPECT_EQ(stats.blosc_items, 2 * (n - 1));
  EXPECT_GT(stats.nvcomp_inputs, stats.items);  // blosc's blocks are each an nvCOMP input
  EXPECT_GT(stats.byte_gathers, 0u);
  std::printf("blosc batch: %zu chunks, %llu nvCOMP inputs, %llu gathers, %llu launches\n", n,
              static_cast<unsigned long long>(stats.nvcomp_inputs / 2),
              static_cast<unsigned long long>(stats.byte_gathers / 2),
              static_cast<unsigned long long>(stats.launches / 2));

  // relaunch() runs the streams, the copies and the unshuffles again.
  fill_device(out.buffer.data(), 0, out.buffer.size());
  decoder.relaunch(stream.get());
  stream.synchronize();
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(out.read(i, sizes[i]) == originals[i]) << keys[i];
}

// A blosc chunk whose stream the host cannot fault (an LZ4 block cut short but its size field
// intact is only found by nvCOMP) fails naming the key; the decoder goes on.
TEST(NvcompDecode, CorruptBloscStreamsNameTheKey) {
  ZFEED_SKIP_WITHOUT_GPU_DECODE();
  Stream stream;
  GpuDecoder decoder;
  const Buffer values = smooth_field(128, 256, 7);
  const Buffer good = blosc_chunk(values, "lz4", BLOSC_SHUFFLE, 4, 0, 5);
  const codec::BloscGpuPlan plan = codec::plan_blosc_gpu(good.data(), good.size(), values.size());
  ASSERT_TRUE(plan.gpu) << plan.error << plan.why;
  ASSERT_FALSE(plan.streams.front().stored);
  Buffer bad = good;
  // Garble the middle of the first stream: nvCOMP's LZ4 decoder reports it, or it decodes to a
  // different size.
  const auto& first = plan.streams.front();
  for (size_t k = first.src_offset + first.src_size / 3; k < first.src_offset + first.src_size / 2;
       ++k)
    bad[k] = static_cast<uint8_t>(bad[k] * 31 + 7);
  DeviceOutputs out({values.size(), values.size()});
  const GpuDecodeItem items[] = {
      {GpuCodec::kBlosc, good.data(), good.size(), out.at(0), values.size(), "b/c/0"},
      {GpuCodec::kBlosc, bad.data(), bad.size(), out.at(1), values.size(), "b/c/1"}};
  std::string message;
  try {
    decoder.decode(items, stream.get());
  } catch (const Error& e) {
    message = e.what();
  }
  // Garbled LZ4 may still decode to the right size (to wrong values): then no error is the
  // honest outcome, and the values differ.
  if (!message.empty()) {
    EXPECT_EQ(message.rfind("b/c/1: GPU blosc (lz4 block streams) decode failed: ", 0), 0u)
        << message;
  } else {
    EXPECT_FALSE(out.read(1, values.size()) == values);
  }
  std::printf("garbled blosc stream: %s\n", message.empty() ? "(decoded)" : message.c_str());
  const GpuDecodeItem item{GpuCodec::kBlosc, good.data(),   good.size(),
                           out.at(1),        values.size(), "ok"};
  decoder.decode({&item, 1}, stream.get());
  EXPECT_TRUE(out.read(1, values.size()) == values);
}

#endif  // ZFEED_TEST_BLOSC
#endif  // ZFEED_TEST_CPU_CODECS

// ---------------------------------------------------------------------------------------------
// GPU decode plans of Zarr codec chains (the whole library only).

#ifndef ZFEED_CUDA_ONLY_BUILD

CodecChain chain_of(const std::string& codecs, DataTypeId type = DataTypeId::kFloat32) {
  return CodecChain::from_json(Json::parse(codecs), ChunkSpec{DataType{type}, {4, 8}, {}});
}

TEST(NvcompPlan, V3BytesThenOneCompressorIsOneGpuStep) {
  const std::string bytes = R"({"name": "bytes", "configuration": {"endian": "little"}})";
  struct Case {
    std::string compressor;
    GpuCodec codec;
  };
  for (const Case& c :
       {Case{R"({"name": "zstd", "configuration": {"level": 3}})", GpuCodec::kZstd},
        Case{R"({"name": "zstd", "configuration": {"level": 1, "checksum": true}})",
             GpuCodec::kZstd},
        Case{R"({"name": "gzip", "configuration": {"level": 5}})", GpuCodec::kGzip},
        Case{R"({"name": "numcodecs.zlib", "configuration": {"level": 1}})", GpuCodec::kZlib},
        Case{R"({"name": "numcodecs.lz4"})", GpuCodec::kLz4}}) {
    const GpuDecodePlan plan = gpu_decode_plan(chain_of("[" + bytes + "," + c.compressor + "]"));
    EXPECT_TRUE(plan.gpu) << c.compressor << ": " << plan.reason;
    EXPECT_EQ(plan.codec, c.codec) << c.compressor;
    EXPECT_EQ(plan.decoded_size, 4u * 8 * 4);
    EXPECT_EQ(plan.reason, "");
  }
  // Blosc with an inner codec nvCOMP decodes, shuffled or not: split into its streams.
  for (const char* cname : {"lz4", "lz4hc", "zstd", "zlib"}) {
    for (const char* shuffle : {"noshuffle", "shuffle"}) {
      const GpuDecodePlan plan = gpu_decode_plan(chain_of(
          "[" + bytes + R"(, {"name": "blosc", "configuration": {"cname": ")" + cname +
          R"(", "clevel": 5, "shuffle": ")" + shuffle + R"(", "typesize": 4, "blocksize": 0}}])"));
      EXPECT_TRUE(plan.gpu) << cname << " " << shuffle << ": " << plan.reason;
      EXPECT_EQ(plan.codec, GpuCodec::kBlosc);
    }
  }
  // One-byte values need no endianness.
  EXPECT_TRUE(
      gpu_decode_plan(chain_of(R"([{"name": "bytes"}, {"name": "zstd"}])", DataTypeId::kUInt8))
          .gpu);
}

TEST(NvcompPlan, OtherChainsSayWhyNot) {
  auto reason = [](const std::string& codecs) {
    const GpuDecodePlan plan = gpu_decode_plan(chain_of(codecs));
    EXPECT_FALSE(plan.gpu) << codecs;
    return plan.reason;
  };
  const std::string little = R"({"name": "bytes", "configuration": {"endian": "little"}})";
  EXPECT_TRUE(contains(reason("[" + little + R"(, {"name": "blosc", "configuration": {"cname":
      "blosclz", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0}}])"),
                       "blosc with blosclz inside"));
  EXPECT_TRUE(contains(reason("[" + little + R"(, {"name": "blosc", "configuration": {"cname":
      "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": 4, "blocksize": 0}}])"),
                       "bit shuffle"));
  EXPECT_TRUE(contains(reason(R"([{"name": "bytes", "configuration": {"endian": "big"}},
                                  {"name": "zstd"}])"),
                       "big-endian"));
  EXPECT_TRUE(contains(reason(R"([{"name": "transpose", "configuration": {"order": [1, 0]}},)" +
                              little + R"(, {"name": "zstd"}])"),
                       "transpose reorders the values"));
  EXPECT_TRUE(contains(reason("[" + little + R"(, {"name": "zstd"}, {"name": "crc32c"}])"),
                       "more than one bytes->bytes codec"));
  EXPECT_TRUE(contains(reason("[" + little + "]"), "stored uncompressed"));
  const std::string sharded = reason(R"([{"name": "sharding_indexed", "configuration": {
      "chunk_shape": [2, 4], "codecs": [)" +
                                     little + R"(, {"name": "zstd"}],
      "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}])");
  EXPECT_TRUE(contains(sharded, "sharded")) << sharded;
}

TEST(NvcompPlan, V2ArraysAndShardedArrays) {
  auto v2_plan = [](const std::string& compressor, const std::string& order = "C",
                    const std::string& dtype = "<f4") {
    const Json zarray = Json::parse(R"({"zarr_format": 2, "shape": [10, 20], "chunks": [5, 20],
        "dtype": ")" + dtype + R"(", "compressor": )" +
                                    compressor + R"(, "fill_value": 0, "order": ")" + order +
                                    R"(", "filters": null})");
    return gpu_decode_plan(zarr::ArrayMetadata::parse_v2(zarray, Json()).codec_chain());
  };
  EXPECT_EQ(v2_plan(R"({"id": "zstd", "level": 3})").codec, GpuCodec::kZstd);
  EXPECT_EQ(v2_plan(R"({"id": "zlib", "level": 1})").codec, GpuCodec::kZlib);
  EXPECT_EQ(v2_plan(R"({"id": "gzip", "level": 1})").codec, GpuCodec::kGzip);
  EXPECT_EQ(v2_plan(R"({"id": "lz4", "acceleration": 1})").codec, GpuCodec::kLz4);
  for (const char* compressor : {R"({"id": "zstd"})", R"({"id": "lz4"})"})
    EXPECT_TRUE(v2_plan(compressor).gpu) << compressor;
  EXPECT_EQ(v2_plan(R"({"id": "zstd"})").decoded_size, 5u * 20 * 4);
  EXPECT_FALSE(v2_plan(R"({"id": "zstd"})", "F").gpu);
  EXPECT_FALSE(v2_plan(R"({"id": "zstd"})", "C", ">f4").gpu);
  EXPECT_TRUE(v2_plan(R"({"id": "zstd"})", "C", "|u1").gpu);
  EXPECT_FALSE(v2_plan("null").gpu);
  EXPECT_EQ(v2_plan(R"({"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 1})").codec,
            GpuCodec::kBlosc);
  EXPECT_TRUE(v2_plan(R"({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 0})").gpu);
  EXPECT_FALSE(v2_plan(R"({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2})").gpu);
  EXPECT_FALSE(v2_plan(R"({"id": "blosc", "cname": "blosclz", "clevel": 5, "shuffle": 1})").gpu);

  // A sharded v3 array is planned by its inner chunks.
  auto store = make_memory_store();
  zarr::ArrayMetadata meta = zarr::ArrayMetadata::parse_v3(Json::parse(R"({
      "zarr_format": 3, "node_type": "array", "shape": [8, 16], "data_type": "float32",
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 16]}},
      "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
      "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 8],
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "zstd", "configuration": {"level": 3}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                         {"name": "crc32c"}]}}]})"));
  const zarr::Array array = zarr::Array::create(store, "t2m", meta);
  const GpuDecodePlan plan = gpu_decode_plan(array);
  EXPECT_TRUE(plan.gpu) << plan.reason;
  EXPECT_TRUE(plan.inner_chunks);
  EXPECT_EQ(plan.codec, GpuCodec::kZstd);
  EXPECT_EQ(plan.decoded_size, 2u * 8 * 4);
}

#endif  // ZFEED_CUDA_ONLY_BUILD

#else  // !ZFEED_HAVE_CUDA

TEST(NvcompBuild, NeedsCuda) { GTEST_SKIP() << cuda_status().reason; }

#endif  // ZFEED_HAVE_CUDA

}  // namespace
}  // namespace zfeed::cuda
