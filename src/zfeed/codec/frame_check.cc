// The host's container checks of compressed chunks before nvCOMP sees them (see frame_check.h).
#include "zfeed/codec/frame_check.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace zfeed::codec {

const char* gpu_codec_name(GpuCodec codec) {
  switch (codec) {
    case GpuCodec::kZstd:
      return "zstd";
    case GpuCodec::kLz4:
      return "lz4";
    case GpuCodec::kLz4Block:
      return "lz4 block";
    case GpuCodec::kGzip:
      return "gzip";
    case GpuCodec::kZlib:
      return "zlib";
    case GpuCodec::kDeflate:
      return "deflate";
  }
  return "unknown";
}

namespace {

uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

uint64_t load_le(const uint8_t* p, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= uint64_t{p[i]} << (8 * i);
  return value;
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

// The zstd frame format (RFC 8878 section 3.1.1): magic, frame header, blocks, optional checksum.
// Walks every block header, so a truncated or overlong frame is caught before the GPU sees it.
std::string check_zstd(const uint8_t* data, size_t size, size_t decoded_size) {
  if (size < 4) return std::to_string(size) + " bytes is too short for a zstd frame";
  const uint32_t magic = load_le32(data);
  if ((magic & 0xFFFFFFF0u) == 0x184D2A50u)
    return "starts with a skippable frame (not decoded on the GPU)";
  if (magic != 0xFD2FB528u) return "not a zstd frame (magic " + hex32(magic) + ")";
  size_t pos = 4;
  auto truncated = [&](size_t needed) {
    return "frame truncated at byte " + std::to_string(size) + " of at least " +
           std::to_string(needed);
  };
  if (pos + 1 > size) return truncated(pos + 1);
  const uint8_t descriptor = data[pos++];
  const unsigned fcs_flag = descriptor >> 6, did_flag = descriptor & 3u;
  const bool single_segment = (descriptor >> 5) & 1u, checksum = (descriptor >> 2) & 1u;
  if ((descriptor >> 3) & 1u) return "reserved bit set in the frame header";
  const size_t did_size = did_flag == 3 ? 4 : did_flag;
  const size_t fcs_size = fcs_flag == 0 ? (single_segment ? 1 : 0) : size_t{1} << fcs_flag;
  const size_t header_end = pos + (single_segment ? 0 : 1) + did_size + fcs_size;
  if (header_end > size) return truncated(header_end);
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
    return "frame needs dictionary " + std::to_string(dictionary) + " (not supported)";
  pos += did_size;
  if (fcs_size) {
    uint64_t content = load_le(data + pos, fcs_size);
    if (fcs_size == 2) content += 256;
    if (content != decoded_size)
      return "frame says " + std::to_string(content) + " bytes, expected " +
             std::to_string(decoded_size);
    if (single_segment) window = content;
  }
  pos += fcs_size;
  uint64_t regenerated = 0;  // by raw and RLE blocks, which say their size
  for (;;) {
    if (pos + 3 > size) return truncated(pos + 3);
    const uint32_t header =
        uint32_t{data[pos]} | uint32_t{data[pos + 1]} << 8 | uint32_t{data[pos + 2]} << 16;
    const size_t block_start = pos;
    pos += 3;
    const unsigned type = (header >> 1) & 3u;
    const size_t block_size = header >> 3;
    if (type == 3) return "reserved block type at byte " + std::to_string(block_start);
    const uint64_t block_limit = std::min<uint64_t>(window, uint64_t{128} << 10);
    if (block_size > block_limit)
      return "block of " + std::to_string(block_size) + " bytes at byte " +
             std::to_string(block_start) + " is larger than the frame allows (" +
             std::to_string(block_limit) + ")";
    const size_t content = type == 1 ? 1 : block_size;
    if (pos + content > size) return truncated(pos + content);
    pos += content;
    if (type != 2) regenerated += block_size;
    if (regenerated > decoded_size)
      return "frame holds more than " + std::to_string(decoded_size) + " bytes (block at byte " +
             std::to_string(block_start) + ")";
    if (header & 1u) break;  // the last block
  }
  if (checksum) {
    if (pos + 4 > size) return truncated(pos + 4);
    pos += 4;
  }
  if (pos != size)
    return std::to_string(size - pos) + " bytes after the frame, which ends at byte " +
           std::to_string(pos) + " (several frames are not decoded on the GPU)";
  return "";
}

std::string check_gzip(const uint8_t* data, size_t size, size_t decoded_size) {
  if (size < 18) return std::to_string(size) + " bytes is too short for a gzip stream";
  if (data[0] != 0x1f || data[1] != 0x8b)
    return "not a gzip stream (starts with " + hex32(load_le32(data)) + ")";
  if (data[2] != 8) return "compression method " + std::to_string(data[2]) + " is not deflate";
  const uint8_t flags = data[3];
  if (flags & 0xE0u) return "reserved flag bits set in the gzip header";
  size_t pos = 10;
  const size_t trailer = size - 8;
  auto past_header = [&] { return "gzip header runs past the end of the stream"; };
  if (flags & 4u) {  // FEXTRA
    if (pos + 2 > trailer) return past_header();
    pos += 2 + (size_t{data[pos]} | size_t{data[pos + 1]} << 8);
  }
  for (uint8_t flag : {uint8_t{8}, uint8_t{16}}) {  // FNAME, FCOMMENT: zero-terminated
    if (!(flags & flag)) continue;
    while (pos < trailer && data[pos] != 0) ++pos;
    ++pos;
  }
  if (flags & 2u) pos += 2;  // FHCRC
  if (pos >= trailer) return past_header();
  const uint32_t isize = load_le32(data + size - 4);
  if (isize != static_cast<uint32_t>(decoded_size))
    return "trailer says " + std::to_string(isize) + " bytes (modulo 2^32), expected " +
           std::to_string(decoded_size);
  return "";
}

std::string check_zlib(const uint8_t* data, size_t size) {
  if (size < 7) return std::to_string(size) + " bytes is too short for a zlib stream";
  const unsigned cmf = data[0], flg = data[1];
  if ((cmf & 0x0Fu) != 8)
    return "compression method " + std::to_string(cmf & 0x0Fu) +
           " is not deflate (not a zlib stream)";
  if ((cmf >> 4) > 7) return "window size field " + std::to_string(cmf >> 4) + " is invalid";
  if (((cmf << 8) | flg) % 31 != 0) return "header check bits are wrong (not a zlib stream)";
  if (flg & 0x20u) return "stream needs a preset dictionary (not supported)";
  return "";
}

}  // namespace

GpuPayload gpu_payload(GpuCodec codec, const uint8_t* data, size_t size, size_t decoded_size) {
  GpuPayload payload{0, size, ""};
  if (size > 0 && data == nullptr) {
    payload.error = "no source bytes (null pointer)";
    return payload;
  }
  switch (codec) {
    case GpuCodec::kZstd:
      payload.error = check_zstd(data, size, decoded_size);
      if (payload.error.empty() && decoded_size > (size_t{1} << 31) - 1)
        payload.error = "chunk of " + std::to_string(decoded_size) +
                        " bytes is over nvCOMP's zstd limit of 2^31 - 1 bytes";
      break;
    case GpuCodec::kLz4:
      if (size < 4) {
        payload.error = std::to_string(size) + " bytes is too short for the LZ4 size header";
      } else if (load_le32(data) != decoded_size) {
        payload.error = "header says " + std::to_string(load_le32(data)) + " bytes, expected " +
                        std::to_string(decoded_size);
      } else if (size == 4 && decoded_size > 0) {
        payload.error = "empty LZ4 block";
      }
      payload.offset = 4;
      payload.size = size >= 4 ? size - 4 : 0;
      break;
    case GpuCodec::kLz4Block:
    case GpuCodec::kDeflate:
      if (size == 0 && decoded_size > 0) payload.error = "empty stream";
      break;
    case GpuCodec::kGzip:
      payload.error = check_gzip(data, size, decoded_size);
      break;
    case GpuCodec::kZlib:
      payload.error = check_zlib(data, size);
      payload.offset = 2;
      payload.size = size >= 6 ? size - 6 : 0;
      break;
  }
  if (payload.error.empty() && codec != GpuCodec::kZstd && decoded_size > 0xFFFFFFFFu)
    payload.error = "chunk of " + std::to_string(decoded_size) +
                    " bytes is over nvCOMP's limit of 2^32 - 1 bytes";
  return payload;
}

}  // namespace zfeed::codec
