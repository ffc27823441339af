// Blosc's byte shuffle, undone one element at a time: the host loop and the GPU kernel
// (cuda/byte_gather_kernel.cu, one thread per element) run the same code. CUDA-free, like
// frame_check_core.h, so that nvcc builds it for the device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zfeed/util/host_device.h"

namespace zfeed::codec {

// A shuffled block of `block_size` bytes holds byte j of every element together: byte j of
// element i at j * elements + i, where elements = block_size / typesize; the bytes past the last
// whole element (the tail) stay in place.
ZFEED_HOST_DEVICE constexpr uint64_t shuffled_elements(uint64_t block_size, uint64_t typesize) {
  return typesize == 0 ? 0 : block_size / typesize;
}

// Puts element `i` of a shuffled block back together in `dst` (src and dst must not overlap).
ZFEED_HOST_DEVICE inline void unshuffle_element(const uint8_t* src, uint8_t* dst, uint64_t i,
                                                uint64_t elements, uint64_t typesize) {
  for (uint64_t j = 0; j < typesize; ++j) dst[i * typesize + j] = src[j * elements + i];
}

// Undoes the shuffle of one block (src and dst must not overlap).
inline void unshuffle_block(const uint8_t* src, uint8_t* dst, uint64_t block_size,
                            uint64_t typesize) {
  const uint64_t elements = shuffled_elements(block_size, typesize);
  for (uint64_t i = 0; i < elements; ++i) unshuffle_element(src, dst, i, elements, typesize);
  for (uint64_t k = elements * typesize; k < block_size; ++k) dst[k] = src[k];
}

}  // namespace zfeed::codec
