// zfeed._core.cuda_status(): whether CUDA is usable here and why not (a dict); gds_status(): the
// same for GPUDirect Storage reads; with CUDA,
// zfeed._core.DeviceLoader (batches on the GPU) and its tensors, which speak DLPack with stream
// semantics: __dlpack__(stream=s) makes the consumer's stream s wait on the batch's copy event,
// and when the consumer frees the tensor an event recorded on s tells zfeed when the memory may
// be overwritten.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "zfeed/cuda/device.h"

#if ZFEED_HAVE_CUDA
#include <Python.h>

#include "_loader.h"
#include "zfeed/cuda/device_loader.h"
#include "zfeed/cuda/gds.h"
#include "zfeed/util/error.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

#if ZFEED_HAVE_CUDA
namespace {

using zfeed::cuda::DeviceBatch;
using zfeed::cuda::DeviceLoader;
using zfeed::loader::OutputType;

// DLPack's ABI (dlpack.h v0.8, the unversioned capsule every consumer accepts).
struct DLDevice {
  int32_t device_type;  // kDLCUDA = 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // NULL: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
// DLPack 1.0: the versioned capsule ("dltensor_versioned"), for consumers that ask with
// max_version >= (1, 0).
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr int32_t kDLCUDA = 2;

DLDataType dl_type(OutputType type) {
  switch (type) {
    case OutputType::kFloat32:
      return {2, 32, 1};
    case OutputType::kFloat16:
      return {2, 16, 1};
    case OutputType::kBFloat16:
      return {4, 16, 1};
    case OutputType::kInt64:
      return {0, 64, 1};
  }
  return {2, 32, 1};
}

// One tensor of a device batch (its inputs or its targets).
struct CudaTensor {
  std::shared_ptr<DeviceBatch::Handle> handle;
  void* data = nullptr;
  std::vector<int64_t> shape;
  OutputType type = OutputType::kFloat32;
  int device = 0;
};

struct Exported {
  DLManagedTensor managed;
  DLManagedTensorVersioned versioned;
  std::shared_ptr<DeviceBatch::Handle> handle;
  std::vector<int64_t> shape;
};

// The DLPack stream argument as a CUDA stream (DLPack: None and 1 are the legacy default stream,
// 2 the per-thread default stream, -1 asks for no synchronization, 0 is not allowed).
std::optional<cudaStream_t> consumer_stream(const nb::object& stream) {
  if (stream.is_none()) return cudaStreamLegacy;
  const auto value = nb::cast<int64_t>(stream);
  if (value == -1) return std::nullopt;
  if (value == 0) throw zfeed::Error("__dlpack__: stream 0 is ambiguous (DLPack): pass 1 or 2");
  if (value == 1) return cudaStreamLegacy;
  if (value == 2) return cudaStreamPerThread;
  return reinterpret_cast<cudaStream_t>(static_cast<intptr_t>(value));
}

// A capsule still under its first name was never consumed: free it here (renamed "used_...": the
// consumer owns it and calls the deleter).
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed && managed->deleter) managed->deleter(managed);
  }
}
void versioned_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    auto* managed =
        static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, "dltensor_versioned"));
    if (managed && managed->deleter) managed->deleter(managed);
  }
}

nb::object export_dlpack(CudaTensor& tensor, const nb::object& stream,
                         const nb::object& max_version, const nb::object& dl_device,
                         const nb::object& copy) {
  if (!dl_device.is_none()) {
    auto wanted = nb::cast<std::pair<int, int>>(dl_device);
    if (wanted.first != kDLCUDA || wanted.second != tensor.device)
      throw nb::buffer_error("__dlpack__: the batch lives on the GPU; no copy to another device");
  }
  if (!copy.is_none() && nb::cast<bool>(copy))
    throw nb::buffer_error("__dlpack__: copy=True is not supported (the batch is shared)");
  const bool versioned =
      !max_version.is_none() && nb::cast<std::pair<int, int>>(max_version).first >= 1;
  const std::optional<cudaStream_t> consumer = consumer_stream(stream);
  if (consumer) {
    zfeed::cuda::DeviceScope device(tensor.device);
    tensor.handle->slot()->ready.wait_on(*consumer);
    tensor.handle->used_on(*consumer);
  }
  auto* exported = new Exported{};
  exported->handle = tensor.handle;
  exported->shape = tensor.shape;
  DLTensor& dl = exported->managed.dl_tensor;
  dl.data = tensor.data;
  dl.device = {kDLCUDA, tensor.device};
  dl.ndim = static_cast<int32_t>(exported->shape.size());
  dl.dtype = dl_type(tensor.type);
  dl.shape = exported->shape.data();
  dl.strides = nullptr;
  dl.byte_offset = 0;
  exported->managed.manager_ctx = exported;
  exported->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<Exported*>(self->manager_ctx);
  };
  exported->versioned.version = {1, 0};
  exported->versioned.manager_ctx = exported;
  exported->versioned.deleter = [](DLManagedTensorVersioned* self) {
    delete static_cast<Exported*>(self->manager_ctx);
  };
  exported->versioned.flags = 0;
  exported->versioned.dl_tensor = dl;
  PyObject* capsule = versioned ? PyCapsule_New(&exported->versioned, "dltensor_versioned",
                                                versioned_capsule_destructor)
                                : PyCapsule_New(&exported->managed, "dltensor", capsule_destructor);
  if (!capsule) {
    delete exported;
    throw nb::python_error();
  }
  return nb::steal(capsule);
}

template <typename T>
nb::object numpy_copy(const std::vector<T>& values, std::initializer_list<size_t> dims) {
  auto* owned = new std::vector<T>(values);
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), dims.size(), dims.begin(), owner));
}

std::vector<int64_t> shape_of(std::array<uint64_t, 4> shape, uint64_t size, bool labels) {
  if (labels)
    return {static_cast<int64_t>(size), static_cast<int64_t>(shape[2]),
            static_cast<int64_t>(shape[3])};
  return {static_cast<int64_t>(size), static_cast<int64_t>(shape[1]),
          static_cast<int64_t>(shape[2]), static_cast<int64_t>(shape[3])};
}

}  // namespace
#endif

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

  // GPUDirect Storage (cuFile) under a policy ("auto", "on", "off"; "": ZFEED_GDS).
  m.def(
      "gds_status",
      [](const std::string& policy) {
        nb::dict out;
#if ZFEED_HAVE_CUDA
        const zfeed::cuda::GdsStatus status =
            policy.empty()
                ? zfeed::cuda::gds_status()
                : zfeed::cuda::gds_status(zfeed::cuda::gds_policy_from_name(policy, "gds"));
        out["available"] = status.available;
        out["mode"] = status.mode;
        out["reason"] = status.reason;
        out["library"] = status.library;
        out["version"] = status.version;
#else
        (void)policy;
        out["available"] = false;
        out["mode"] = "off";
        out["reason"] = "zfeed was built without CUDA";
        out["library"] = "";
        out["version"] = 0;
#endif
        return out;
      },
      "policy"_a = "",
      "Whether GPUDirect Storage (cuFile) reads run here under `policy` ('auto', 'on', 'off'; "
      "'' takes ZFEED_GDS): a dict of available, mode ('gds': DMA with nvidia-fs, 'compat': "
      "cuFile's own POSIX reads, 'off'), reason, library and version.");

#if ZFEED_HAVE_CUDA
  nb::class_<CudaTensor>(m, "CudaTensor",
                         "A tensor of a device batch; zero-copy into torch or CuPy via DLPack")
      .def("__dlpack__", &export_dlpack, "stream"_a = nb::none(), nb::kw_only(),
           "max_version"_a = nb::none(), "dl_device"_a = nb::none(), "copy"_a = nb::none(),
           nb::sig("def __dlpack__(self, stream=None, *, max_version=None, dl_device=None, "
                   "copy=None) -> object"))
      .def("__dlpack_device__",
           [](const CudaTensor& t) { return nb::make_tuple(kDLCUDA, t.device); })
      .def_prop_ro("shape", [](const CudaTensor& t) { return t.shape; })
      .def_prop_ro("dtype", [](const CudaTensor& t) { return std::string(output_name(t.type)); })
      .def_prop_ro("device", [](const CudaTensor& t) { return "cuda:" + std::to_string(t.device); })
      .def_prop_ro("data_ptr",
                   [](const CudaTensor& t) { return reinterpret_cast<uintptr_t>(t.data); })
      .def("__repr__", [](const CudaTensor& t) {
        std::string dims;
        for (int64_t d : t.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
        return "<zfeed.CudaTensor shape=(" + dims + ") dtype=" + output_name(t.type) +
               " device=cuda:" + std::to_string(t.device) + ">";
      });

  auto cls = nb::class_<DeviceLoader>(m, "DeviceLoader");
  cls.def(
         "__init__",
         [](DeviceLoader* self, std::shared_ptr<zfeed::Store> store, const std::string& spec,
            int device, uint64_t depth, const std::string& decode, const std::string& gds,
            bool stage_progress) {
           auto parsed = zfeed::loader::LoaderSpec::from_json(
               std::move(store), zfeed::parse_json(spec, "loader spec from Python"));
           python_staging(parsed, stage_progress);
           construct_releasing_gil([&] {
             new (self) DeviceLoader(std::move(parsed), {device, depth, decode, gds});
           });
         },
         "store"_a, "spec"_a, "device"_a = 0, "depth"_a = 2, "decode"_a = "cpu", "gds"_a = "",
         "stage_progress"_a = true)
      .def("next",
           [](DeviceLoader& loader) -> nb::object {
             std::optional<DeviceBatch> batch = next_interruptibly(loader);
             if (!batch) return nb::none();
             const auto& host = loader.host();
             CudaTensor inputs{batch->handle, batch->inputs,
                               shape_of(host.input_shape(), batch->size, false), host.input_type(),
                               loader.device()};
             CudaTensor targets{batch->handle, batch->targets,
                                shape_of(host.target_shape(), batch->size, host.label_targets()),
                                host.target_type(), loader.device()};
             return nb::make_tuple(nb::cast(std::move(inputs)), nb::cast(std::move(targets)),
                                   numpy_copy(batch->times, {batch->size}), batch->epoch,
                                   batch->index, numpy_copy(batch->crops, {batch->size, 2}));
           })
      .def(
          "set_epoch",
          [](DeviceLoader& loader, uint64_t epoch) {
            in_turn(loader, [&] { loader.set_epoch(epoch); });
          },
          "epoch"_a)
      .def("begin_iteration",
           [](DeviceLoader& loader) { in_turn(loader, [&] { loader.begin_iteration(); }); })
      .def_prop_ro("epoch", &DeviceLoader::epoch)
      .def_prop_ro("position", &DeviceLoader::position)
      .def_prop_ro("device", &DeviceLoader::device)
      .def("state_json",
           [](const DeviceLoader& loader) {
             return in_turn(loader, [&] { return loader.state(); }).dump();
           })
      .def(
          "restore_json",
          [](DeviceLoader& loader, const std::string& text) {
            auto state = zfeed::parse_json(text, "loader state");
            in_turn(loader, [&] { loader.restore(state); });
          },
          "state"_a)
      .def("stats_json", [](const DeviceLoader& loader) {
        zfeed::Json stats = loader.host().stats().to_json();
        stats["device"] = loader.stats().to_json();
        return stats.dump();
      });
  add_loader_properties(
      cls, [](const DeviceLoader& l) -> const zfeed::loader::Loader& { return l.host(); });
#endif
}
