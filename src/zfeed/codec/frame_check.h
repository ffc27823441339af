// The host's check of a compressed chunk's container before it goes to nvCOMP on the GPU
// (zfeed::cuda::GpuDecoder), and the part of its stored bytes that nvCOMP decodes.
//
// nvCOMP decodes only well-formed zstd, deflate and gzip streams (corrupt input is undefined
// behaviour there), so each chunk's container is checked here first: the zstd frame structure
// (magic, header, every block header, the checksum field: a truncated frame is caught here), the
// LZ4 size header, the gzip header and its size trailer, the zlib header. A parser of untrusted
// bytes (its core, frame_check_core.h, also runs on the GPU): CUDA-free (it needs only the standard
// library), so that fuzz builds, which leave the CUDA layer out, fuzz it
// (fuzz/frame_check_fuzz.cc). The CUDA layer takes these names into zfeed::cuda
// (src/zfeed/cuda/gpu_decode.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "zfeed/codec/frame_check_core.h"

namespace zfeed::codec {

// GpuCodec, FrameVerdict and check_frame(): zfeed/codec/frame_check_core.h (host and device).

// "zstd", "lz4", "lz4 block", "gzip", "zlib", "deflate", "blosc".
const char* gpu_codec_name(GpuCodec codec);

// The host's check of a chunk's container before it goes to the GPU, and the part of its stored
// bytes that nvCOMP decodes: [offset, offset + size). `error` ("" when the chunk may go) says what
// is wrong: "frame truncated at byte 1841 of at least 2048", "header says 100 bytes, expected
// 4096", "not a zstd frame (magic 0x0badcafe)". Needs no GPU. Where `error` is "", the payload
// lies inside [data, data + size). For kBlosc the payload is the whole chunk, checked by
// plan_blosc_gpu (blosc_gpu_plan.h), whose error, or reason it cannot go (blosclz inside), is
// `error`.
struct GpuPayload {
  size_t offset = 0, size = 0;
  std::string error;
};
GpuPayload gpu_payload(GpuCodec codec, const uint8_t* data, size_t size, size_t decoded_size);

// The message of a verdict's problem ("" for kNone), as gpu_payload gives it: for verdicts made on
// the GPU (check_frame over device memory).
std::string describe(const FrameVerdict& verdict);

}  // namespace zfeed::codec
