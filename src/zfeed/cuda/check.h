// CUDA runtime errors as zfeed::Error (for the CUDA layer's own .cc and .cu files).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "zfeed/util/error.h"

namespace zfeed::cuda {

inline void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    // Cleared from the thread's last error, which launches are checked by (cudaGetLastError):
    // a failure handled here (an allocation the loader falls back from) must not fail the next
    // kernel launch, nor reach a consumer's own checks on this thread. (Sticky errors, which
    // end the context, stay whatever is cleared.)
    (void)cudaGetLastError();
    throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorName(error) + ": " +
                cudaGetErrorString(error));
  }
}

// Fills device memory and waits for it: cudaMemset runs on the legacy default stream, which does
// not order work on the non-blocking streams zfeed launches on.
inline void fill_device(void* pointer, int value, size_t bytes) {
  check(cudaMemset(pointer, value, bytes), "memset");
  check(cudaDeviceSynchronize(), "memset");
}

}  // namespace zfeed::cuda
