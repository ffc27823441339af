// The host's check of a compressed chunk's container before it goes to nvCOMP on the GPU
// (zfeed::cuda::GpuDecoder), and the part of its stored bytes that nvCOMP decodes.
//
// nvCOMP decodes only well-formed zstd, deflate and gzip streams (corrupt input is undefined
// behaviour there), so each chunk's container is checked here first: the zstd frame structure
// (magic, header, every block header, the checksum field: a truncated frame is caught here), the
// LZ4 size header, the gzip header and its size trailer, the zlib header. A parser of untrusted
// bytes: CUDA-free (it needs only the standard library), so that fuzz builds, which leave the CUDA
// layer out, fuzz it (fuzz/frame_check_fuzz.cc). The CUDA layer takes these names into
// zfeed::cuda (src/zfeed/cuda/gpu_decode.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zfeed::codec {

// The stored forms nvCOMP decodes in one step.
enum class GpuCodec : uint8_t {
  kZstd,      // a zstd frame (v3 "zstd", v2 "zstd"), with or without a content size
  kLz4,       // numcodecs' LZ4 (v2 "lz4", v3 "numcodecs.lz4"): a 4-byte little-endian decoded
              // size, then an LZ4 block
  kLz4Block,  // a bare LZ4 block
  kGzip,      // RFC 1952 (v3 "gzip", v2 "gzip")
  kZlib,      // RFC 1950 (v2 "zlib", v3 "numcodecs.zlib"): decoded as the raw deflate stream
              // inside (its Adler-32 is not checked)
  kDeflate,   // a raw RFC 1951 deflate stream
};
inline constexpr int kGpuCodecCount = 6;

// "zstd", "lz4", "lz4 block", "gzip", "zlib", "deflate".
const char* gpu_codec_name(GpuCodec codec);

// The host's check of a chunk's container before it goes to the GPU, and the part of its stored
// bytes that nvCOMP decodes: [offset, offset + size). `error` ("" when the chunk may go) says what
// is wrong: "frame truncated at byte 1841 of at least 2048", "header says 100 bytes, expected
// 4096", "not a zstd frame (magic 0x0badcafe)". Needs no GPU. Where `error` is "", the payload
// lies inside [data, data + size).
struct GpuPayload {
  size_t offset = 0, size = 0;
  std::string error;
};
GpuPayload gpu_payload(GpuCodec codec, const uint8_t* data, size_t size, size_t decoded_size);

}  // namespace zfeed::codec
