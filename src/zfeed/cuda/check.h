// CUDA runtime errors as zfeed::Error (for the CUDA layer's own .cc and .cu files).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "zfeed/util/error.h"

namespace zfeed::cuda {

inline void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorName(error) + ": " +
                cudaGetErrorString(error));
}

}  // namespace zfeed::cuda
