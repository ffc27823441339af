// libFuzzer target: the GPU decoder's host-side container checks (gpu_payload in
// zfeed/codec/frame_check.h: the zstd frame walk, the numcodecs LZ4 size header, the gzip header
// and size trailer, the zlib header), which decide what nvCOMP may see.
// Input: a 4-byte little-endian decoded size, then the stored bytes.
// Seeds: fuzz/corpus/frame_check_fuzz (fuzz/make_corpus.py).
//
//  1. gpu_payload of every codec never crashes, hangs or reads outside the stored bytes (they are
//     copied into a buffer of their exact size, so ASan sees any overread);
//  2. where it accepts, the payload [offset, offset + size) lies inside the stored bytes and is
//     not empty when the chunk decodes to more than 0 bytes;
//  3. decoded sizes over nvCOMP's limits (2^31 - 1 for zstd, 2^32 - 1 for the others) are
//     rejected;
//  4. no false rejections: where the CPU library (libzstd, libdeflate, liblz4) decodes the stored
//     bytes as exactly one stream to N bytes, gpu_payload(codec, ..., N) accepts them. For zstd
//     both with the size from the input (ZSTD_decompress into a buffer of that size) and with the
//     size libzstd finds. Frames out of spec that libzstd still decodes (RLE blocks over 128 KiB)
//     are left out.
#include <libdeflate.h>
#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "zfeed/codec/frame_check.h"

namespace {

using zfeed::codec::gpu_codec_name;
using zfeed::codec::gpu_payload;
using zfeed::codec::GpuCodec;
using zfeed::codec::GpuPayload;
using zfeed::fuzz::check;
using zfeed::fuzz::finding;

// The oracles decode into at most this many bytes.
constexpr size_t kMaxOracleBytes = zfeed::fuzz::kMaxDecodedBytes;

uint8_t* scratch() {
  static const std::unique_ptr<uint8_t[]> buffer(new uint8_t[kMaxOracleBytes]);
  return buffer.get();
}

ZSTD_DCtx* zstd_context() {
  static ZSTD_DCtx* const context = ZSTD_createDCtx();
  return context;
}

libdeflate_decompressor* deflate_decompressor() {
  static libdeflate_decompressor* const decompressor = libdeflate_alloc_decompressor();
  return decompressor;
}

std::string describe(GpuCodec codec, size_t size, size_t decoded_size) {
  return std::string(gpu_codec_name(codec)) + " (" + std::to_string(size) + " stored bytes, " +
         std::to_string(decoded_size) + " decoded)";
}

// Invariant 2 on every answer; returns whether it accepted.
bool checked_payload(GpuCodec codec, const uint8_t* data, size_t size, size_t decoded_size) {
  const GpuPayload p = gpu_payload(codec, data, size, decoded_size);
  if (!p.error.empty()) return false;
  const std::string what = describe(codec, size, decoded_size);
  check(p.offset <= size && p.size <= size - p.offset,
        what + ": accepted with payload [" + std::to_string(p.offset) + ", " +
            std::to_string(p.offset + p.size) + ") outside the stored bytes");
  check(decoded_size == 0 || p.size > 0, what + ": accepted with an empty payload");
  return true;
}

// Invariant 4: `codec`'s CPU decoder read the stored bytes as one stream of `decoded` bytes.
void must_accept(GpuCodec codec, const uint8_t* data, size_t size, size_t decoded) {
  const GpuPayload p = gpu_payload(codec, data, size, decoded);
  if (!p.error.empty())
    finding(describe(codec, size, decoded) +
            ": the CPU decoder reads it, gpu_payload rejects it: " + p.error);
  checked_payload(codec, data, size, decoded);
}

// Whether every block of the zstd frame `data` (one whole frame, as libzstd found) says at most
// min(window, 128 KiB). RFC 8878 limits every block, raw and RLE included, to Block_Maximum_Size
// (the smaller of the window and 128 KiB; zstd's authors confirm it for RLE blocks in
// facebook/zstd#3072), but libzstd 1.5.4 decodes longer RLE blocks: such frames are out of spec,
// and gpu_payload may reject them. Written apart from gpu_payload's walk, from the format.
bool zstd_blocks_in_spec(const uint8_t* data, size_t size) {
  if (size < 5) return false;
  const uint8_t descriptor = data[4];
  const unsigned fcs_flag = descriptor >> 6, did_flag = descriptor & 3u;
  const bool single_segment = descriptor & 0x20u;
  const size_t fcs_bytes = fcs_flag == 0 ? (single_segment ? 1 : 0) : size_t{1} << fcs_flag;
  size_t pos = 5 + (single_segment ? 0 : 1) + (did_flag == 3 ? 4 : did_flag) + fcs_bytes;
  if (pos > size) return false;
  uint64_t limit = uint64_t{128} << 10;
  if (single_segment) {
    uint64_t content = 0;
    for (size_t i = 0; i < fcs_bytes; ++i)
      content |= uint64_t{data[pos - fcs_bytes + i]} << (8 * i);
    if (fcs_bytes == 2) content += 256;
    limit = std::min(limit, content);
  } else {
    const uint64_t base = uint64_t{1} << (10 + (data[5] >> 3));
    limit = std::min(limit, base + base / 8 * (data[5] & 7u));
  }
  for (;;) {
    if (pos + 3 > size) return false;
    const uint32_t header =
        data[pos] | uint32_t{data[pos + 1]} << 8 | uint32_t{data[pos + 2]} << 16;
    const size_t block_size = header >> 3;
    if (block_size > limit) return false;
    pos += 3 + (((header >> 1) & 3u) == 1 ? 1 : block_size);
    if (header & 1u) return true;
  }
}

void zstd_oracle(const uint8_t* data, size_t size, size_t decoded_size) {
  // One zstd frame, exactly (several frames and skippable frames are not decoded on the GPU).
  if (size < 4 || data[0] != 0x28 || data[1] != 0xB5 || data[2] != 0x2F || data[3] != 0xFD) return;
  if (ZSTD_findFrameCompressedSize(data, size) != size) return;
  if (!zstd_blocks_in_spec(data, size)) return;
  // An 8-byte content size of 2^64 - 1 is libzstd's "unknown" sentinel, so libzstd decodes such a
  // frame whatever it holds; gpu_payload takes the field at its word and rejects the frame (it
  // then decodes on the CPU): a safe disagreement, not a false rejection.
  if (ZSTD_getFrameContentSize(data, size) == ZSTD_CONTENTSIZE_UNKNOWN && (data[4] >> 6) == 3)
    return;
  if (decoded_size <= kMaxOracleBytes) {
    const size_t n = ZSTD_decompressDCtx(zstd_context(), scratch(), decoded_size, data, size);
    if (!ZSTD_isError(n) && n == decoded_size) {
      must_accept(GpuCodec::kZstd, data, size, decoded_size);
      return;
    }
  }
  const size_t n = ZSTD_decompressDCtx(zstd_context(), scratch(), kMaxOracleBytes, data, size);
  if (!ZSTD_isError(n)) must_accept(GpuCodec::kZstd, data, size, n);
}

void deflate_family_oracle(const uint8_t* data, size_t size) {
  libdeflate_decompressor* d = deflate_decompressor();
  size_t used = 0, n = 0;
  if (libdeflate_gzip_decompress_ex(d, data, size, scratch(), kMaxOracleBytes, &used, &n) ==
          LIBDEFLATE_SUCCESS &&
      used == size)
    must_accept(GpuCodec::kGzip, data, size, n);
  if (libdeflate_zlib_decompress_ex(d, data, size, scratch(), kMaxOracleBytes, &used, &n) ==
          LIBDEFLATE_SUCCESS &&
      used == size)
    must_accept(GpuCodec::kZlib, data, size, n);
  if (libdeflate_deflate_decompress_ex(d, data, size, scratch(), kMaxOracleBytes, &used, &n) ==
          LIBDEFLATE_SUCCESS &&
      used == size)
    must_accept(GpuCodec::kDeflate, data, size, n);
}

void lz4_oracle(const uint8_t* data, size_t size) {
  constexpr size_t kMaxLz4 = LZ4_MAX_INPUT_SIZE;
  if (size > kMaxLz4) return;
  const int n =
      LZ4_decompress_safe(reinterpret_cast<const char*>(data), reinterpret_cast<char*>(scratch()),
                          static_cast<int>(size), static_cast<int>(kMaxOracleBytes));
  if (n >= 0) must_accept(GpuCodec::kLz4Block, data, size, static_cast<size_t>(n));
  if (size < 4) return;
  // numcodecs: the decoded size, then the block.
  const uint32_t header = uint32_t{data[0]} | uint32_t{data[1]} << 8 | uint32_t{data[2]} << 16 |
                          uint32_t{data[3]} << 24;
  if (header > kMaxOracleBytes) return;
  const int m = LZ4_decompress_safe(reinterpret_cast<const char*>(data + 4),
                                    reinterpret_cast<char*>(scratch()), static_cast<int>(size - 4),
                                    static_cast<int>(header));
  if (m >= 0 && static_cast<uint32_t>(m) == header) must_accept(GpuCodec::kLz4, data, size, header);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t input_size) {
  const size_t prefix = input_size < 4 ? input_size : 4;
  size_t decoded_size = 0;
  for (size_t i = 0; i < prefix; ++i) decoded_size |= size_t{input[i]} << (8 * i);
  // The stored bytes in a buffer of their own exact size (none for an empty input: a null
  // pointer with size 0, as a caller may pass).
  const size_t size = input_size - prefix;
  std::vector<uint8_t> stored(input + prefix, input + input_size);
  const uint8_t* data = size ? stored.data() : nullptr;

  for (int c = 0; c < zfeed::codec::kGpuCodecCount; ++c) {
    const GpuCodec codec = static_cast<GpuCodec>(c);
    checked_payload(codec, data, size, decoded_size);
    // Over nvCOMP's limits: always rejected.
    const size_t over = codec == GpuCodec::kZstd ? size_t{1} << 31 : size_t{1} << 32;
    check(!checked_payload(codec, data, size, decoded_size | over),
          describe(codec, size, decoded_size | over) + ": accepted over nvCOMP's size limit");
  }
  // A null pointer with bytes is refused, not read.
  if (size > 0)
    check(!gpu_payload(GpuCodec::kZstd, nullptr, size, decoded_size).error.empty(),
          "gpu_payload accepted a null pointer with " + std::to_string(size) + " bytes");

  zstd_oracle(data, size, decoded_size);
  if (size > 0) {
    deflate_family_oracle(data, size);
    lz4_oracle(data, size);
  }
  return 0;
}
