// Test helpers of the CUDA layer: GPU tests skip with cuda_status()'s reason where no device is
// usable (no driver, no device, a build without nvcc).
#pragma once

#include <gtest/gtest.h>

#include "zfeed/cuda/device.h"

#define ZFEED_SKIP_WITHOUT_CUDA()                                           \
  do {                                                                      \
    const ::zfeed::cuda::CudaStatus status_ = ::zfeed::cuda::cuda_status(); \
    if (!status_.available) GTEST_SKIP() << status_.reason;                 \
  } while (0)
