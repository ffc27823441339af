#include "zfeed/codec/shuffle_core.h"
#include "zfeed/cuda/byte_gather_kernel.h"
#include "zfeed/cuda/check.h"

namespace zfeed::cuda {

namespace {

// Each thread block takes gathers in turn. A copy moves 16 bytes per thread where both ends are
// aligned; an unshuffle puts one element together per thread, so a warp's reads of byte j of 32
// elements are one contiguous run, and so are its writes over the element's bytes.
__global__ void gather_bytes(const ByteGather* gathers, size_t count) {
  for (size_t g = blockIdx.x; g < count; g += gridDim.x) {
    const ByteGather gather = gathers[g];
    if (gather.typesize <= 1) {
      uint64_t k = 0;
      if ((reinterpret_cast<uintptr_t>(gather.src) | reinterpret_cast<uintptr_t>(gather.dst)) %
              16 ==
          0) {
        const uint64_t vectors = gather.size / 16;
        const auto* src = reinterpret_cast<const uint4*>(gather.src);
        auto* dst = reinterpret_cast<uint4*>(gather.dst);
        for (uint64_t v = threadIdx.x; v < vectors; v += blockDim.x) dst[v] = src[v];
        k = vectors * 16;
      }
      for (k += threadIdx.x; k < gather.size; k += blockDim.x) gather.dst[k] = gather.src[k];
      continue;
    }
    const uint64_t elements = codec::shuffled_elements(gather.size, gather.typesize);
    for (uint64_t i = threadIdx.x; i < elements; i += blockDim.x)
      codec::unshuffle_element(gather.src, gather.dst, i, elements, gather.typesize);
    for (uint64_t k = elements * gather.typesize + threadIdx.x; k < gather.size; k += blockDim.x)
      gather.dst[k] = gather.src[k];
  }
}

}  // namespace

void launch_byte_gathers(const ByteGather* gathers, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  constexpr unsigned kThreads = 256;
  constexpr size_t kMaxBlocks = 8192;
  const unsigned blocks = static_cast<unsigned>(count < kMaxBlocks ? count : kMaxBlocks);
  gather_bytes<<<blocks, kThreads, 0, stream>>>(gathers, count);
  check(cudaGetLastError(), "launching the GPU byte gathers (blosc copies and unshuffles)");
}

}  // namespace zfeed::cuda
