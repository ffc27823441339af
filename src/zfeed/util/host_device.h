// ZFEED_HOST_DEVICE marks inline functions that nvcc compiles for the GPU too (the same code, so
// the same bits on both sides); plain inline functions in a host-only build.
#pragma once

#if defined(__CUDACC__)
#define ZFEED_HOST_DEVICE __host__ __device__
#else
#define ZFEED_HOST_DEVICE
#endif
