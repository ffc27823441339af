// Blosc's byte shuffle, undone one output byte at a time: the index function is all a GPU kernel
// (one thread per byte) and the host loop need, so both compute the same thing. CUDA-free, like
// frame_check_core.h, so that nvcc builds it for the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zfeed/util/host_device.h"

namespace zfeed::codec {

// A shuffled block of `block_size` bytes holds byte j of every element together: byte j of
// element i at j * elements + i, where elements = block_size / typesize; the bytes past the last
// whole element stay in place. The source index of output byte `k`:
ZFEED_HOST_DEVICE constexpr uint64_t unshuffle_source(uint64_t k, uint64_t block_size,
                                                      uint64_t typesize) {
  const uint64_t elements = block_size / typesize;
  if (k >= elements * typesize) return k;
  return (k % typesize) * elements + k / typesize;
}

// Undoes the shuffle of one block (src and dst must not overlap).
inline void unshuffle_block(const uint8_t* src, uint8_t* dst, uint64_t block_size,
                            uint64_t typesize) {
  for (uint64_t k = 0; k < block_size; ++k) dst[k] = src[unshuffle_source(k, block_size, typesize)];
}

}  // namespace zfeed::codec
