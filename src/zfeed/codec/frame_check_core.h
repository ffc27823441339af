// The container checks of frame_check.h as plain functions over bytes, compiled for the host and,
// by nvcc, for the GPU: chunks read straight into GPU memory (GPUDirect Storage) are checked there
// by the same code before nvCOMP decodes them (zfeed/cuda/frame_check_kernel.cu). A verdict is a
// problem code and the numbers its message names; frame_check.cc turns it into text on the host.
// Needs nothing beyond <cstdint> and <cstddef>, so that it builds in device code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zfeed/util/host_device.h"

namespace zfeed::codec {

// The stored forms nvCOMP decodes: in one step, or (kBlosc) as several streams of one of the
// others.
enum class GpuCodec : uint8_t {
  kZstd,      // a zstd frame (v3 "zstd", v2 "zstd"), with or without a content size
  kLz4,       // numcodecs' LZ4 (v2 "lz4", v3 "numcodecs.lz4"): a 4-byte little-endian decoded
              // size, then an LZ4 block
  kLz4Block,  // a bare LZ4 block
  kGzip,      // RFC 1952 (v3 "gzip", v2 "gzip")
  kZlib,      // RFC 1950 (v2 "zlib", v3 "numcodecs.zlib"): decoded as the raw deflate stream
              // inside (its Adler-32 is not checked)
  kDeflate,   // a raw RFC 1951 deflate stream
  kBlosc,     // a c-blosc 1.x chunk with LZ4, zstd or zlib inside: split on the host into its
              // blocks' streams (blosc_gpu_plan.h), each decoded as kLz4Block, kZstd or kZlib
};
inline constexpr int kGpuCodecCount = 7;

// What is wrong with a chunk's container; the comments name the verdict's numbers.
enum class FrameProblem : uint8_t {
  kNone,
  kNullSource,
  kZstdTooShort,       // a: size
  kZstdSkippable,      //
  kZstdMagic,          // a: the magic found
  kTruncated,          // a: size, b: the bytes needed
  kZstdReservedBit,    //
  kZstdDictionary,     // a: the dictionary id
  kZstdContentSize,    // a: the frame's content size, b: expected
  kZstdReservedBlock,  // a: the block's byte
  kZstdBlockTooLarge,  // a: block size, b: its byte, c: the limit
  kZstdTooMuch,        // a: expected, b: the block's byte
  kZstdTrailing,       // a: bytes after the frame, b: where it ends
  kZstdOverLimit,      // a: decoded size
  kLz4TooShort,        // a: size
  kLz4Header,          // a: the header's size, b: expected
  kLz4Empty,           //
  kEmptyStream,        //
  kGzipTooShort,       // a: size
  kGzipMagic,          // a: the first four bytes
  kGzipMethod,         // a: the method
  kGzipReservedFlags,  //
  kGzipHeaderPastEnd,  //
  kGzipTrailer,        // a: the trailer's size, b: expected
  kZlibTooShort,       // a: size
  kZlibMethod,         // a: the method
  kZlibWindow,         // a: the window field
  kZlibCheckBits,      //
  kZlibDictionary,     //
  kOverLimit32,        // a: decoded size
  kBloscOnDevice,      //
};

// The part of a chunk's stored bytes nvCOMP decodes, [offset, offset + size), and the problem that
// keeps it from the GPU (kNone: it may go; the payload then lies inside the stored bytes).
struct FrameVerdict {
  uint64_t offset = 0, size = 0;
  uint64_t a = 0, b = 0, c = 0;
  FrameProblem problem = FrameProblem::kNone;
};

namespace frame_detail {

ZFEED_HOST_DEVICE inline uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

ZFEED_HOST_DEVICE inline uint64_t load_le(const uint8_t* p, uint64_t bytes) {
  uint64_t value = 0;
  for (uint64_t i = 0; i < bytes; ++i) value |= uint64_t{p[i]} << (8 * i);
  return value;
}

ZFEED_HOST_DEVICE inline FrameVerdict problem(FrameProblem what, uint64_t a = 0, uint64_t b = 0,
                                              uint64_t c = 0) {
  FrameVerdict verdict;
  verdict.problem = what;
  verdict.a = a;
  verdict.b = b;
  verdict.c = c;
  return verdict;
}

// The zstd frame format (RFC 8878 section 3.1.1): magic, frame header, blocks, optional checksum.
// Walks every block header, so a truncated or overlong frame is caught before nvCOMP sees it.
ZFEED_HOST_DEVICE inline FrameVerdict check_zstd(const uint8_t* data, uint64_t size,
                                                 uint64_t decoded_size) {
  if (size < 4) return problem(FrameProblem::kZstdTooShort, size);
  const uint32_t magic = load_le32(data);
  if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) return problem(FrameProblem::kZstdSkippable);
  if (magic != 0xFD2FB528u) return problem(FrameProblem::kZstdMagic, magic);
  uint64_t pos = 4;
  if (pos + 1 > size) return problem(FrameProblem::kTruncated, size, pos + 1);
  const uint8_t descriptor = data[pos++];
  const unsigned fcs_flag = descriptor >> 6, did_flag = descriptor & 3u;
  const bool single_segment = (descriptor >> 5) & 1u, checksum = (descriptor >> 2) & 1u;
  if ((descriptor >> 3) & 1u) return problem(FrameProblem::kZstdReservedBit);
  const uint64_t did_size = did_flag == 3 ? 4 : did_flag;
  const uint64_t fcs_size = fcs_flag == 0 ? (single_segment ? 1 : 0) : uint64_t{1} << fcs_flag;
  const uint64_t header_end = pos + (single_segment ? 0 : 1) + did_size + fcs_size;
  if (header_end > size) return problem(FrameProblem::kTruncated, size, header_end);
  // Blocks are at most min(window size, 128 KiB) (RFC 8878 3.1.1.2); a single-segment frame's
  // window is its content size.
  uint64_t window = uint64_t{128} << 10;
  if (!single_segment) {
    const unsigned exponent = data[pos] >> 3, mantissa = data[pos] & 7u;
    const uint64_t base = uint64_t{1} << (10 + exponent);
    window = base + base / 8 * mantissa;
    ++pos;
  }
  if (const uint64_t dictionary = load_le(data + pos, did_size); dictionary != 0)
    return problem(FrameProblem::kZstdDictionary, dictionary);
  pos += did_size;
  if (fcs_size) {
    uint64_t content = load_le(data + pos, fcs_size);
    if (fcs_size == 2) content += 256;
    if (content != decoded_size)
      return problem(FrameProblem::kZstdContentSize, content, decoded_size);
    if (single_segment) window = content;
  }
  pos += fcs_size;
  const uint64_t block_limit = window < (uint64_t{128} << 10) ? window : uint64_t{128} << 10;
  uint64_t regenerated = 0;  // by raw and RLE blocks, which say their size
  for (;;) {
    if (pos + 3 > size) return problem(FrameProblem::kTruncated, size, pos + 3);
    const uint32_t header =
        uint32_t{data[pos]} | uint32_t{data[pos + 1]} << 8 | uint32_t{data[pos + 2]} << 16;
    const uint64_t block_start = pos;
    pos += 3;
    const unsigned type = (header >> 1) & 3u;
    const uint64_t block_size = header >> 3;
    if (type == 3) return problem(FrameProblem::kZstdReservedBlock, block_start);
    if (block_size > block_limit)
      return problem(FrameProblem::kZstdBlockTooLarge, block_size, block_start, block_limit);
    const uint64_t content = type == 1 ? 1 : block_size;
    if (pos + content > size) return problem(FrameProblem::kTruncated, size, pos + content);
    pos += content;
    if (type != 2) regenerated += block_size;
    if (regenerated > decoded_size)
      return problem(FrameProblem::kZstdTooMuch, decoded_size, block_start);
    if (header & 1u) break;  // the last block
  }
  if (checksum) {
    if (pos + 4 > size) return problem(FrameProblem::kTruncated, size, pos + 4);
    pos += 4;
  }
  if (pos != size) return problem(FrameProblem::kZstdTrailing, size - pos, pos);
  if (decoded_size > (uint64_t{1} << 31) - 1)
    return problem(FrameProblem::kZstdOverLimit, decoded_size);
  return problem(FrameProblem::kNone);
}

ZFEED_HOST_DEVICE inline FrameVerdict check_gzip(const uint8_t* data, uint64_t size,
                                                 uint64_t decoded_size) {
  if (size < 18) return problem(FrameProblem::kGzipTooShort, size);
  if (data[0] != 0x1f || data[1] != 0x8b) return problem(FrameProblem::kGzipMagic, load_le32(data));
  if (data[2] != 8) return problem(FrameProblem::kGzipMethod, data[2]);
  const uint8_t flags = data[3];
  if (flags & 0xE0u) return problem(FrameProblem::kGzipReservedFlags);
  uint64_t pos = 10;
  const uint64_t trailer = size - 8;
  if (flags & 4u) {  // FEXTRA
    if (pos + 2 > trailer) return problem(FrameProblem::kGzipHeaderPastEnd);
    pos += 2 + (uint64_t{data[pos]} | uint64_t{data[pos + 1]} << 8);
  }
  const uint8_t terminated_fields[2] = {8, 16};  // FNAME, FCOMMENT: zero-terminated
  for (const uint8_t flag : terminated_fields) {
    if (!(flags & flag)) continue;
    while (pos < trailer && data[pos] != 0) ++pos;
    ++pos;
  }
  if (flags & 2u) pos += 2;  // FHCRC
  if (pos >= trailer) return problem(FrameProblem::kGzipHeaderPastEnd);
  const uint32_t isize = load_le32(data + size - 4);
  if (isize != static_cast<uint32_t>(decoded_size))
    return problem(FrameProblem::kGzipTrailer, isize, decoded_size);
  return problem(FrameProblem::kNone);
}

ZFEED_HOST_DEVICE inline FrameVerdict check_zlib(const uint8_t* data, uint64_t size) {
  if (size < 7) return problem(FrameProblem::kZlibTooShort, size);
  const unsigned cmf = data[0], flg = data[1];
  if ((cmf & 0x0Fu) != 8) return problem(FrameProblem::kZlibMethod, cmf & 0x0Fu);
  if ((cmf >> 4) > 7) return problem(FrameProblem::kZlibWindow, cmf >> 4);
  if (((cmf << 8) | flg) % 31 != 0) return problem(FrameProblem::kZlibCheckBits);
  if (flg & 0x20u) return problem(FrameProblem::kZlibDictionary);
  return problem(FrameProblem::kNone);
}

}  // namespace frame_detail

// Where in a chunk's stored bytes nvCOMP's input starts: after numcodecs' LZ4 size header and
// the zlib header; at the start for the others.
ZFEED_HOST_DEVICE constexpr uint64_t payload_offset(GpuCodec codec) {
  return codec == GpuCodec::kLz4 ? 4 : codec == GpuCodec::kZlib ? 2 : 0;
}

// The check of a chunk's container before it goes to nvCOMP, and the part of its stored bytes
// nvCOMP decodes. `data` may be device memory where this runs on the GPU.
ZFEED_HOST_DEVICE inline FrameVerdict check_frame(GpuCodec codec, const uint8_t* data,
                                                  uint64_t size, uint64_t decoded_size) {
  using namespace frame_detail;
  if (size > 0 && data == nullptr) return problem(FrameProblem::kNullSource);
  FrameVerdict verdict;
  const uint64_t offset = payload_offset(codec);
  uint64_t payload = size;
  switch (codec) {
    case GpuCodec::kZstd:
      verdict = check_zstd(data, size, decoded_size);
      break;
    case GpuCodec::kLz4:
      if (size < 4) {
        verdict = problem(FrameProblem::kLz4TooShort, size);
      } else if (load_le32(data) != decoded_size) {
        verdict = problem(FrameProblem::kLz4Header, load_le32(data), decoded_size);
      } else if (size == 4 && decoded_size > 0) {
        verdict = problem(FrameProblem::kLz4Empty);
      }
      payload = size >= 4 ? size - 4 : 0;
      break;
    case GpuCodec::kLz4Block:
    case GpuCodec::kDeflate:
      if (size == 0 && decoded_size > 0) verdict = problem(FrameProblem::kEmptyStream);
      break;
    case GpuCodec::kGzip:
      verdict = check_gzip(data, size, decoded_size);
      break;
    case GpuCodec::kZlib:
      verdict = check_zlib(data, size);
      payload = size >= 6 ? size - 6 : 0;  // the Adler-32 trailer is left out
      break;
    case GpuCodec::kBlosc:  // its streams are found and checked on the host
      verdict = problem(FrameProblem::kBloscOnDevice);
      break;
  }
  if (verdict.problem == FrameProblem::kNone && codec != GpuCodec::kZstd &&
      decoded_size > 0xFFFFFFFFu)
    verdict = problem(FrameProblem::kOverLimit32, decoded_size);
  verdict.offset = offset;
  verdict.size = payload;
  return verdict;
}

}  // namespace zfeed::codec
