// Whether a Zarr array's chunks decode on the GPU (GpuDecoder), and as which GpuCodec: the chain
// must be a native-order `bytes` codec (little-endian, or 1-byte values) followed by exactly one
// compressor nvCOMP decodes: zstd, gzip, numcodecs.zlib (v2 "zlib"), numcodecs.lz4 (v2 "lz4"), or
// blosc with lz4, lz4hc, zstd or zlib inside and no bit shuffle (kBlosc: split into its streams).
// A v2 array qualifies with order "C", no filters and one of those compressors; a sharded v3
// array, by its inner chain (its inner chunks are read by range). Anything else (blosclz,
// transpose or v2 order "F", big-endian bytes, crc32c or a second compressor, no compressor)
// says why not, so the loader decodes those chunks on the CPU.
//
// Part of the whole library (it reads the codec chain), not of the CUDA layer alone
// (ZFEED_CUDA_ONLY).
#pragma once

#include <cstdint>
#include <string>

#include "zfeed/codec/codec.h"
#include "zfeed/cuda/gpu_decode.h"

namespace zfeed::zarr {
class Array;
}

namespace zfeed::cuda {

struct GpuDecodePlan {
  bool gpu = false;                  // the stored chunks decode on the GPU
  GpuCodec codec = GpuCodec::kZstd;  // how, where `gpu`
  bool inner_chunks = false;         // sharded: the plan is for the shard's inner chunks
  uint64_t decoded_size = 0;         // bytes of one (inner) chunk, decoded
  std::string reason;                // why not, where !gpu ("" where gpu)
};

// For chunks stored with `chain` (a sharding chain is not itself one step: plan its inner()).
GpuDecodePlan gpu_decode_plan(const CodecChain& chain);
// For the chunks the array is read by: its chain, or its inner chain where it is sharded.
GpuDecodePlan gpu_decode_plan(const zarr::Array& array);

}  // namespace zfeed::cuda
