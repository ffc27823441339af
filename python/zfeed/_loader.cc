// Bindings of the training data loader (zfeed::loader::Loader). Batches come out as NumPy arrays
// that view the loader's batch buffers; each array owns a reference to its buffer, which returns
// to the loader's pool only when every array of the batch is dropped.
#include "_loader.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "zfeed/loader/loader.h"
#include "zfeed/util/error.h"

namespace nb = nanobind;
using namespace nb::literals;
using zfeed::loader::Batch;
using zfeed::loader::BatchMemory;
using zfeed::loader::Loader;

namespace {

nb::capsule owner_of(const std::shared_ptr<BatchMemory>& memory) {
  return nb::capsule(new std::shared_ptr<BatchMemory>(memory), [](void* p) noexcept {
    delete static_cast<std::shared_ptr<BatchMemory>*>(p);
  });
}

template <typename T>
nb::object typed_view(uint8_t* data, const size_t* dims,
                      const std::shared_ptr<BatchMemory>& memory) {
  return nb::cast(nb::ndarray<nb::numpy, T>(reinterpret_cast<T*>(data), 4, dims, owner_of(memory)));
}

// A NumPy view of a batch buffer. 16-bit floats come out as uint16 bits, which the Python side
// views as float16 or ml_dtypes.bfloat16 (NumPy has no bfloat16, nanobind no float16 type).
nb::object view(uint8_t* data, zfeed::loader::OutputType type, std::array<uint64_t, 4> shape,
                uint64_t size, const std::shared_ptr<BatchMemory>& memory) {
  const size_t dims[4] = {size, shape[1], shape[2], shape[3]};
  switch (type) {
    case zfeed::loader::OutputType::kFloat32:
      return typed_view<float>(data, dims, memory);
    case zfeed::loader::OutputType::kFloat16:
    case zfeed::loader::OutputType::kBFloat16:
      return typed_view<uint16_t>(data, dims, memory);
    case zfeed::loader::OutputType::kInt64:
      return typed_view<int64_t>(data, dims, memory);
  }
  return nb::none();
}

nb::object to_python(const Loader& loader, const Batch& batch) {
  size_t n = batch.size;
  nb::object times =
      nb::cast(nb::ndarray<nb::numpy, int64_t>(batch.times(), 1, &n, owner_of(batch.memory)));
  const size_t crop_dims[2] = {batch.size, 2};
  nb::object crops = nb::cast(
      nb::ndarray<nb::numpy, int64_t>(batch.crops(), 2, crop_dims, owner_of(batch.memory)));
  return nb::make_tuple(view(batch.input_bytes(), loader.input_type(), loader.input_shape(),
                             batch.size, batch.memory),
                        view(batch.target_bytes(), loader.target_type(), loader.target_shape(),
                             batch.size, batch.memory),
                        times, batch.epoch, batch.index, crops);
}

}  // namespace

void bind_loader(nb::module_& m) {
  auto cls = nb::class_<Loader>(m, "Loader");
  cls.def(
         "__init__",
         [](Loader* self, std::shared_ptr<zfeed::Store> store, const std::string& spec,
            bool stage_progress) {
           auto parsed = zfeed::loader::LoaderSpec::from_json(
               std::move(store), zfeed::parse_json(spec, "loader spec from Python"));
           python_staging(parsed, stage_progress);
           construct_releasing_gil([&] { new (self) Loader(std::move(parsed)); });
         },
         "store"_a, "spec"_a, "stage_progress"_a = true)
      .def("next",
           [](Loader& loader) -> nb::object {
             std::optional<Batch> batch = next_interruptibly(loader);
             if (!batch) return nb::none();
             return to_python(loader, *batch);
           })
      .def(
          "set_epoch",
          [](Loader& loader, uint64_t epoch) { in_turn(loader, [&] { loader.set_epoch(epoch); }); },
          "epoch"_a)
      .def("begin_iteration",
           [](Loader& loader) { in_turn(loader, [&] { loader.begin_iteration(); }); })
      .def("state_json",
           [](const Loader& loader) {
             return in_turn(loader, [&] { return loader.state(); }).dump();
           })
      .def(
          "restore_json",
          [](Loader& loader, const std::string& text) {
            auto state = zfeed::parse_json(text, "loader state");
            in_turn(loader, [&] { loader.restore(state); });
          },
          "state"_a)
      .def("stats_json", [](const Loader& loader) { return loader.stats().to_json().dump(); })
      .def_prop_ro("position", &Loader::position)
      .def_prop_ro("epoch", &Loader::epoch);
  add_loader_properties(cls, [](const Loader& loader) -> const Loader& { return loader; });
}
