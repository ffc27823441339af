// Whether zfeed can use a CUDA device here, and why not when it cannot. Compiles in every build:
// without nvcc at build time (no ZFEED_HAVE_CUDA) cuda_status() says so.
#pragma once

#include <string>
#include <vector>

namespace zfeed::cuda {

// True when zfeed was built with nvcc (the CUDA layer and its kernels are in the binary).
bool built_with_cuda();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  size_t total_memory = 0;  // bytes
  int multiprocessors = 0;
};

struct CudaStatus {
  bool available = false;
  // Why CUDA is unavailable ("" when available): "zfeed was built without CUDA (nvcc not found at
  // build time)", "no CUDA driver: <cudaGetErrorString>" or "no CUDA device".
  std::string reason;
  bool built_with_cuda = false;
  int runtime_version = 0;  // cudaRuntimeGetVersion (1000 * major + 10 * minor); 0 without CUDA
  int driver_version = 0;   // cudaDriverGetVersion; 0 without a driver
  std::vector<DeviceInfo> devices;
};

// Asks the CUDA runtime once per call (cheap after the first: the runtime caches the driver).
// Never throws and never crashes on a machine without a driver.
CudaStatus cuda_status();

// Throws UnsupportedError("<what> is unavailable: <reason>") unless CUDA device `index` exists.
void require_device(int index, const std::string& what);

}  // namespace zfeed::cuda
