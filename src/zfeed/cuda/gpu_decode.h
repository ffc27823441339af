// Batched decompression of compressed chunks on the GPU with nvCOMP's batched C API: a batch of
// chunks (any mix of zstd, numcodecs LZ4, gzip, zlib and raw deflate) is staged through one
// pinned buffer, copied to the device in one transfer, decoded by one nvCOMP launch per codec
// straight into the caller's device buffers, and checked chunk by chunk (nvCOMP's status and the
// decoded size). Device and pinned buffers are kept and grown, so a steady stream of batches
// allocates nothing after the first.
//
// A blosc chunk (c-blosc 1.x, LZ4, zstd or zlib inside; no bit shuffle) is split on the host into
// its blocks' streams (codec/blosc_gpu_plan.h), each one more element of nvCOMP's batch; the
// streams blosc stored uncompressed are copied into place, and byte-shuffled blocks decode into a
// scratch buffer and are unshuffled into place, by one launch of a gather kernel each
// (cuda/byte_gather_kernel.h). A blosc chunk whose inner codec nvCOMP lacks (blosclz, snappy) or
// that is bit-shuffled is refused with an error saying so: the caller decodes it on the CPU.
//
// nvCOMP decodes only well-formed zstd, deflate and gzip streams (corrupt input is undefined
// behaviour there), so each chunk's container is checked on the host before it goes to the GPU:
// the zstd frame structure (magic, header, every block header, the checksum field: a truncated
// frame is caught here), the LZ4 size header, the gzip header and its size trailer, the zlib
// header (zfeed/codec/frame_check.h, fuzzed by fuzz/frame_check_fuzz.cc); chunks already in device
// memory are checked by the same code on the GPU (cuda/frame_check_kernel.h). Built only with CUDA
// (ZFEED_HAVE_CUDA); the decoding itself only with nvCOMP (ZFEED_HAVE_NVCOMP): without it, decoding
// a non-empty batch throws UnsupportedError("GPU decoding is unavailable: zfeed was built without
// nvCOMP ...").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "zfeed/codec/frame_check.h"
#include "zfeed/cuda/pinned_pool.h"

namespace zfeed::cuda {

// The stored forms nvCOMP decodes in one step (kZstd, kLz4, kLz4Block, kGzip, kZlib, kDeflate),
// and their names: declared CUDA-free in zfeed/codec/frame_check.h.
using codec::gpu_codec_name;
using codec::GpuCodec;
using codec::kGpuCodecCount;

// True when zfeed was built with nvCOMP (ZFEED_HAVE_NVCOMP).
bool built_with_nvcomp();
// True when this build decodes `codec` on the GPU (every GpuCodec where nvCOMP is built in).
bool gpu_decode_supported(GpuCodec codec);
// The version of the nvCOMP library loaded ("6.0.0"), "" without nvCOMP.
std::string nvcomp_version();
// Why GPU decoding cannot run here, "" where it can: "zfeed was built without nvCOMP (...)", or
// cuda_status()'s reason.
std::string gpu_decode_unavailable_reason();

// The host's check of a chunk's container before it goes to the GPU, and the part of its stored
// bytes nvCOMP decodes (gpu_payload(codec, data, size, decoded_size) -> GpuPayload{offset, size,
// error}): CUDA-free, in zfeed/codec/frame_check.h, so that fuzz builds fuzz it.
using codec::gpu_payload;
using codec::GpuPayload;

// One chunk of a batch.
struct GpuDecodeItem {
  GpuCodec codec = GpuCodec::kZstd;  // kBlosc: the chunk's header says what is inside
  const uint8_t* src = nullptr;      // the stored bytes, in host memory (pageable or pinned)
  size_t src_size = 0;
  void* dst = nullptr;      // device memory for decoded_size bytes (any alignment)
  size_t decoded_size = 0;  // the size the chunk must decode to exactly; 0: nothing to do
  std::string_view key;     // names the chunk in errors ("era5.zarr/t2m/c/3/0/0")
  // `src` is device memory (read there by cuFile; not for kBlosc) that stays untouched until
  // finish(): its container is checked on the GPU by the host's code, and nvCOMP reads it in place
  // (or from an aligned copy, where the payload is not aligned as nvCOMP requires).
  bool src_on_device = false;
};

// Which of nvCOMP's decoders runs: its own choice, the CUDA kernels, or the hardware
// decompression engine (Blackwell; LZ4 and deflate family only, chunks of at most 4 MB, and no
// detection of corrupt input).
enum class NvcompBackend : uint8_t { kDefault, kCuda, kHardware };

struct GpuDecoderOptions {
  // Staging buffers come from `pool` when given (shared with the loader), else from a pool of the
  // decoder's own bounded by max_staging_bytes. A batch needs its compressed bytes (each chunk
  // rounded up to 16 bytes) plus 48 bytes per chunk.
  PinnedPool* pool = nullptr;
  size_t max_staging_bytes = size_t{2} << 30;
  NvcompBackend backend = NvcompBackend::kDefault;
  // Host threads that copy the compressed bytes into the pinned staging buffer when a batch holds
  // more than 32 MiB of them (0: std::thread::hardware_concurrency(), at most 8).
  unsigned copy_threads = 0;
};

struct GpuDecoderStats {
  uint64_t batches = 0;           // non-empty batches enqueued
  uint64_t items = 0;             // chunks decoded
  uint64_t blosc_items = 0;       // of those, blosc chunks (split into their streams)
  uint64_t nvcomp_inputs = 0;     // nvCOMP batch elements: chunks, and blosc's compressed streams
  uint64_t byte_gathers = 0;      // copies and unshuffles on the GPU (blosc, misaligned outputs)
  uint64_t compressed_bytes = 0;  // copied to the device
  uint64_t decoded_bytes = 0;
  uint64_t launches = 0;            // nvCOMP batched decompress calls
  uint64_t device_allocations = 0;  // cudaMalloc calls (only while buffers grow)
  uint64_t bounced_items = 0;       // chunks decoded into scratch, then copied to a misaligned dst
  uint64_t device_checked_items = 0;  // src_on_device chunks (checked on the GPU)
  uint64_t realigned_items = 0;       // src_on_device chunks copied first to align their payload
  size_t device_bytes = 0;            // device memory held
};

// Decodes batches of chunks on the GPU. Not thread-safe: one per thread (or stream) that decodes.
// Uses the device current when a batch is enqueued.
class GpuDecoder {
 public:
  explicit GpuDecoder(GpuDecoderOptions options = {});
  ~GpuDecoder();
  GpuDecoder(const GpuDecoder&) = delete;
  GpuDecoder& operator=(const GpuDecoder&) = delete;

  // Decodes `items` on `stream` and waits for them: on return every dst holds its chunk. Throws
  // zfeed::Error naming the first failing chunk ("<key>: GPU zstd decode failed: nvcomp status
  // nvcompErrorCannotDecompress (12)", "...: decoded 1000 bytes, expected 4096", "...: frame
  // truncated at byte 1841 of 2048"), UnsupportedError without nvCOMP. An empty batch (or one
  // whose chunks all decode to 0 bytes) does nothing.
  void decode(std::span<const GpuDecodeItem> items, cudaStream_t stream);

  // decode() in two halves, so the host can work while the GPU decodes. enqueue() checks the
  // chunks' containers (throwing before any GPU work for a bad one), stages them and enqueues the
  // copy, the decompression and the read-back of the results on `stream`, and returns; the items'
  // src buffers may be reused at once. finish() waits for that work and checks every chunk. Until
  // finish() returns, the dst buffers must not be read and enqueue() must not be called again.
  void enqueue(std::span<const GpuDecodeItem> items, cudaStream_t stream);
  void finish();
  bool pending() const;

  // enqueue() in two halves again: prepare() does the host's work (the checks, staging the bytes
  // in pinned memory; it throws for a bad chunk) and submit() enqueues the GPU's work on the
  // stream prepare() was given. Between the two the caller may enqueue other work on that stream
  // (and time the GPU's part alone). finish() waits only for this decoder's last batch, so two
  // decoders on one stream take turns: one prepares a batch while the GPU decodes the other's.
  void prepare(std::span<const GpuDecodeItem> items, cudaStream_t stream);
  void submit();

  // Enqueues the last batch's decompression again on `stream` (its compressed bytes are still on
  // the device), without waiting or checking: for benchmarks that time the decoder alone.
  void relaunch(cudaStream_t stream);

  GpuDecoderStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zfeed::cuda
