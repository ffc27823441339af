// zfeed._core.cuda_status(): whether CUDA is usable here and why not (a dict).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "zfeed/cuda/device.h"

namespace nb = nanobind;

void bind_cuda(nb::module_& m) {
  m.def("cuda_status", [] {
    const zfeed::cuda::CudaStatus status = zfeed::cuda::cuda_status();
    nb::dict out;
    out["available"] = status.available;
    out["reason"] = status.reason;
    out["built_with_cuda"] = status.built_with_cuda;
    out["runtime_version"] = status.runtime_version;
    out["driver_version"] = status.driver_version;
    nb::list devices;
    for (const auto& d : status.devices) {
      nb::dict device;
      device["index"] = d.index;
      device["name"] = d.name;
      device["compute_capability"] = nb::make_tuple(d.compute_major, d.compute_minor);
      device["total_memory"] = d.total_memory;
      device["multiprocessors"] = d.multiprocessors;
      devices.append(device);
    }
    out["devices"] = devices;
    out["device_count"] = status.devices.size();
    return out;
  });
}
