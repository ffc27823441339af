#include "zfeed/cuda/device.h"

#include "zfeed/util/error.h"

#if ZFEED_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zfeed::cuda {

bool built_with_cuda() {
#if ZFEED_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

CudaStatus cuda_status() {
  CudaStatus status;
#if !ZFEED_HAVE_CUDA
  status.reason = "zfeed was built without CUDA (nvcc not found at build time)";
  return status;
#else
  status.built_with_cuda = true;
  cudaRuntimeGetVersion(&status.runtime_version);
  // cudaDriverGetVersion gives 0 (and success) where no driver is installed.
  if (cudaDriverGetVersion(&status.driver_version) != cudaSuccess) status.driver_version = 0;
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorNoDevice || (error == cudaSuccess && count == 0)) {
    cudaGetLastError();  // clear the sticky-free error state
    status.reason = "no CUDA device";
    return status;
  }
  if (error != cudaSuccess) {
    cudaGetLastError();
    status.reason = std::string("no CUDA driver: ") + cudaGetErrorString(error);
    return status;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    status.devices.push_back(
        {i, prop.name, prop.major, prop.minor, prop.totalGlobalMem, prop.multiProcessorCount});
  }
  if (status.devices.empty()) {
    status.reason = "no CUDA device";
    return status;
  }
  status.available = true;
  return status;
#endif
}

void require_device(int index, const std::string& what) {
  const CudaStatus status = cuda_status();
  if (!status.available) throw UnsupportedError(what + " is unavailable: " + status.reason);
  if (index < 0 || index >= static_cast<int>(status.devices.size()))
    throw UnsupportedError(what + " is unavailable: no CUDA device " + std::to_string(index) +
                           " (" + std::to_string(status.devices.size()) + " found)");
}

}  // namespace zfeed::cuda
