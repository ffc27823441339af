// Byte gathers on the GPU, the steps of blosc decoding that are not nvCOMP's: copying the streams
// blosc stored uncompressed to their places, and undoing the byte shuffle of each block
// (codec/shuffle_core.h: the code the host's tests decode with). One launch takes a whole batch
// of them. Built only with CUDA (ZFEED_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace zfeed::cuda {

// Copies `size` bytes from src to dst where typesize is 1; else undoes the byte shuffle of one
// block of `size` bytes (codec::unshuffle_block). src and dst are device memory and must not
// overlap.
struct ByteGather {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  uint64_t size = 0;
  uint64_t typesize = 1;
};

// Enqueues `count` gathers (an array in device memory) on `stream`; returns at once. Nothing to
// do when count == 0.
void launch_byte_gathers(const ByteGather* gathers, size_t count, cudaStream_t stream);

}  // namespace zfeed::cuda
