// Shared by the GPU benchmarks (zfeed_gpu_copy_bench, zfeed_gpu_decode_bench, zfeed_gds_bench).
#pragma once

#include <cstdio>

#include "zfeed/cuda/device.h"

// The CUDA status, after printing "no GPU: <reason>" where no device is usable; the benchmarks
// then exit with status 3 (scripts/gpu-check reads it as "no GPU here").
inline zfeed::cuda::CudaStatus usable_cuda_or_say_why() {
  zfeed::cuda::CudaStatus status = zfeed::cuda::cuda_status();
  if (!status.available) std::printf("no GPU: %s\n", status.reason.c_str());
  return status;
}
