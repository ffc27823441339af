// The nanobind module behind the zfeed Python package: stores, arrays and groups, with reads
// and writes into NumPy buffers that release the GIL. Metadata crosses the boundary as JSON text.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "_interrupt.h"
#include "zfeed/codec/sharding.h"
#include "zfeed/ingest/source.h"
#include "zfeed/store/store.h"
#include "zfeed/util/error.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/cf.h"
#include "zfeed/zarr/group.h"
#include "zfeed/zarr/stage.h"

namespace nb = nanobind;

void bind_loader(nb::module_& m);  // _loader.cc
void bind_cuda(nb::module_& m);    // _cuda.cc
using namespace nb::literals;
using zfeed::Json;
using zfeed::zarr::Array;
using zfeed::zarr::Group;

namespace {

zfeed::zarr::Selection make_selection(const std::vector<uint64_t>& starts,
                                      const std::vector<uint64_t>& stops,
                                      const std::vector<uint64_t>& steps) {
  if (starts.size() != stops.size() || starts.size() != steps.size()) {
    throw zfeed::Error("selection: starts, stops and steps differ in length");
  }
  zfeed::zarr::Selection selection;
  for (size_t d = 0; d < starts.size(); ++d) selection.push_back({starts[d], stops[d], steps[d]});
  return selection;
}

uint64_t selection_bytes(const Array& array, const zfeed::zarr::Selection& selection) {
  uint64_t count = array.metadata().dtype.size();
  for (const auto& slice : selection) count *= slice.count();
  return count;
}

using Buffer = nb::ndarray<nb::c_contig, nb::device::cpu>;
using ReadOnlyBuffer = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

template <typename AnyBuffer>
void check_buffer(const AnyBuffer& buffer, uint64_t expected, const char* what) {
  uint64_t nbytes = buffer.nbytes();
  if (nbytes != expected) {
    throw zfeed::Error(std::string(what) + " buffer holds " + std::to_string(nbytes) +
                       " bytes, the selection needs " + std::to_string(expected));
  }
}

Json parse(const std::string& text) { return zfeed::parse_json(text, "metadata from Python"); }

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "zfeed's C++ engine";

  static nb::exception<zfeed::Error> zarr_error(m, "ZarrError", PyExc_RuntimeError);
  static nb::exception<zfeed::UnsupportedError> unsupported_error(m, "UnsupportedError",
                                                                  zarr_error.ptr());
  static nb::exception<zfeed::NotFoundError> not_found_error(m, "NodeNotFoundError",
                                                             zarr_error.ptr());

  // Anything else from the engine (a JSON type error deep in metadata) is still a ZarrError.
  nb::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const nlohmann::json::exception& e) {
      PyErr_SetString(zarr_error.ptr(), (std::string("malformed metadata: ") + e.what()).c_str());
    }
  });

  nb::class_<zfeed::Store>(m, "Store")
      .def_prop_ro("url", &zfeed::Store::url)
      .def("get",
           [](const zfeed::Store& store, const std::string& key) -> std::optional<nb::bytes> {
             std::optional<zfeed::Bytes> value;
             {
               nb::gil_scoped_release release;  // a remote store waits on the network
               value = store.get(key);
             }
             if (!value) return std::nullopt;
             return nb::bytes(reinterpret_cast<const char*>(value->data()), value->size());
           })
      .def("set",
           [](zfeed::Store& store, const std::string& key, nb::bytes value) {
             const zfeed::ByteView view(reinterpret_cast<const uint8_t*>(value.c_str()),
                                        value.size());
             nb::gil_scoped_release release;  // `value` stays alive: the caller holds it
             store.set(key, view);
           })
      .def("erase", &zfeed::Store::erase, nb::call_guard<nb::gil_scoped_release>())
      .def("list", &zfeed::Store::list, "prefix"_a = "", nb::call_guard<nb::gil_scoped_release>());

  m.def("open_store", &zfeed::open_store, "path"_a, "create"_a = false,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("memory_store", &zfeed::make_memory_store);

  nb::class_<Array>(m, "Array")
      .def_static("open", &Array::open, "store"_a, "path"_a = "",
                  nb::call_guard<nb::gil_scoped_release>())
      .def_static(
          "create",
          [](std::shared_ptr<zfeed::Store> store, const std::string& path,
             const std::string& metadata, const std::string& zattrs, bool overwrite) {
            Json json = parse(metadata);
            zfeed::zarr::ArrayMetadata meta;
            try {
              if (json.is_object() && json.contains("zarr_format") && json["zarr_format"] == 2) {
                meta = zfeed::zarr::ArrayMetadata::parse_v2(
                    json, zattrs.empty() ? Json() : parse(zattrs));
              } else {
                meta = zfeed::zarr::ArrayMetadata::parse_v3(json);
              }
            } catch (...) {
              zfeed::rethrow_with_context(path.empty() ? "array metadata"
                                                       : path + ": array metadata");
            }
            return Array::create(store, path, std::move(meta), overwrite);
          },
          "store"_a, "path"_a, "metadata"_a, "zattrs"_a = "", "overwrite"_a = false,
          nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("path", &Array::path)
      .def_prop_ro("store", &Array::store)
      // The CF encoding the loader and `zfeed stats` decode stored values with (zarr/cf.h), for
      // Python code that must read values as they do.
      .def("cf_encoding",
           [](const Array& a) {
             const auto e = zfeed::zarr::cf_encoding(a.metadata(), a.path());
             nb::dict out;
             out["packed"] = e.packed;
             out["scale"] = e.scale;
             out["offset"] = e.offset;
             out["missing"] = nb::tuple(nb::cast(e.missing));
             out["wrap"] = e.wrap;
             return out;
           })
      .def_prop_ro("shape", [](const Array& a) { return a.metadata().shape; })
      .def_prop_ro("chunk_shape", [](const Array& a) { return a.metadata().chunk_shape; })
      .def_prop_ro("read_chunk_shape", &Array::read_chunk_shape)
      .def_prop_ro("is_sharded", [](const Array& a) { return a.codecs().sharding() != nullptr; })
      .def_prop_ro("data_type",
                   [](const Array& a) { return std::string(a.metadata().dtype.name()); })
      .def_prop_ro("zarr_format", [](const Array& a) { return a.metadata().zarr_format; })
      .def_prop_ro("codecs_description", [](const Array& a) { return a.codecs().describe(); })
      .def_prop_ro("inner_codecs_description",
                   [](const Array& a) {
                     const auto* sharding = a.codecs().sharding();
                     return sharding ? sharding->inner().describe() : a.codecs().describe();
                   })
      .def("metadata_json",
           [](const Array& a) {
             const auto& meta = a.metadata();
             return meta.zarr_format == 3 ? meta.to_json_v3().dump() : meta.to_zarray().dump();
           })
      .def("attributes_json", [](const Array& a) { return a.metadata().attributes.dump(); })
      .def(
          "set_attributes_json",
          [](Array& a, const std::string& text) { a.set_attributes(parse(text)); },
          nb::call_guard<nb::gil_scoped_release>())
      .def("fill_value_json",
           [](const Array& a) {
             return zfeed::fill_value_to_json(a.metadata().fill_value, a.metadata().dtype).dump();
           })
      .def("dimension_names",
           [](const Array& a) {
             std::optional<std::vector<std::optional<std::string>>> names =
                 a.metadata().dimension_names;
             return names;
           })
      .def("codecs_json", [](const Array& a) { return a.codecs().to_json().dump(); })
      .def("storage_info",
           [](const Array& a) {
             zfeed::zarr::StorageInfo info;
             {
               nb::gil_scoped_release release;  // lists the store
               info = a.storage_info();
             }
             if (!info.known) {  // a store that cannot list (plain HTTP)
               return nb::make_tuple(nb::none(), nb::none(), info.objects_total);
             }
             return nb::make_tuple(info.stored_bytes, info.objects_present, info.objects_total);
           })
      .def(
          "read",
          [](const Array& a, const std::vector<uint64_t>& starts,
             const std::vector<uint64_t>& stops, const std::vector<uint64_t>& steps, Buffer out) {
            auto selection = make_selection(starts, stops, steps);
            check_buffer(out, selection_bytes(a, selection), "output");
            void* data = out.data();
            nb::gil_scoped_release release;
            a.read(selection, data);
          },
          "starts"_a, "stops"_a, "steps"_a, "out"_a)
      .def(
          "read_many",
          [](const Array& a, const std::vector<std::vector<std::vector<uint64_t>>>& selections,
             std::vector<Buffer> outs) {
            if (selections.size() != outs.size())
              throw zfeed::Error("read_many: selections and outputs differ in number");
            std::vector<zfeed::zarr::Selection> parsed;
            std::vector<void*> pointers;
            for (size_t i = 0; i < selections.size(); ++i) {
              if (selections[i].size() != 3)
                throw zfeed::Error("read_many: each selection is (starts, stops, steps)");
              parsed.push_back(
                  make_selection(selections[i][0], selections[i][1], selections[i][2]));
              check_buffer(outs[i], selection_bytes(a, parsed.back()), "output");
              pointers.push_back(outs[i].data());
            }
            nb::gil_scoped_release release;
            a.read_many(parsed, pointers);
          },
          "selections"_a, "outs"_a)
      .def(
          "write",
          [](const Array& a, const std::vector<uint64_t>& starts,
             const std::vector<uint64_t>& stops, const std::vector<uint64_t>& steps,
             ReadOnlyBuffer in) {
            auto selection = make_selection(starts, stops, steps);
            check_buffer(in, selection_bytes(a, selection), "input");
            const void* data = in.data();
            nb::gil_scoped_release release;
            a.write(selection, data);
          },
          "starts"_a, "stops"_a, "steps"_a, "values"_a);

  nb::class_<Group>(m, "Group")
      .def_static("open", &Group::open, "store"_a, "path"_a = "",
                  nb::call_guard<nb::gil_scoped_release>())
      .def_static(
          "create",
          [](std::shared_ptr<zfeed::Store> store, const std::string& path, int zarr_format,
             const std::string& attributes, bool overwrite) {
            return Group::create(store, path, zarr_format,
                                 attributes.empty() ? Json::object() : parse(attributes),
                                 overwrite);
          },
          "store"_a, "path"_a = "", "zarr_format"_a = 3, "attributes"_a = "", "overwrite"_a = false,
          nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("path", &Group::path)
      .def_prop_ro("store", &Group::store)
      .def_prop_ro("zarr_format", &Group::zarr_format)
      .def_prop_ro("is_consolidated", &Group::is_consolidated)
      .def("attributes_json", [](const Group& g) { return g.attributes().dump(); })
      .def(
          "set_attributes_json",
          [](Group& g, const std::string& text) { g.set_attributes(parse(text)); },
          nb::call_guard<nb::gil_scoped_release>())
      .def("members", &Group::members, nb::call_guard<nb::gil_scoped_release>())
      .def("open_member", &Group::open_member, "name"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("consolidate", &Group::consolidate, nb::call_guard<nb::gil_scoped_release>());

  m.def(
      "stage",
      [](std::shared_ptr<zfeed::Store> source, const std::string& destination, size_t threads,
         bool progress, std::optional<std::pair<uint64_t, uint64_t>> time_range,
         const std::string& time_dim) {
        zfeed::zarr::StageOptions options;
        options.threads = threads;
        options.time_range = time_range;
        options.time_dim = time_dim;
        if (progress) options.progress = zfeed::zarr::stage_progress_printer("stage");
        options.stop = python_interrupt_check();  // Ctrl-C
        zfeed::zarr::StageResult result;
        {
          nb::gil_scoped_release release;  // copies for minutes; other threads go on
          result = zfeed::zarr::stage(std::move(source), destination, options);
        }
        raise_if_interrupted();
        nb::dict out;
        out["keys"] = result.keys;
        out["copied"] = result.copied;
        out["present"] = result.present;
        out["missing"] = result.missing;
        out["bytes_copied"] = result.bytes_copied;
        out["seconds"] = result.seconds;
        out["already_complete"] = result.already_complete;
        out["time_range"] =
            result.partial ? nb::cast(std::make_pair(result.partial->start, result.partial->stop))
                           : nb::none();
        return out;
      },
      "source"_a, "destination"_a, "threads"_a = 0, "progress"_a = true,
      "time_range"_a = nb::none(), "time_dim"_a = "time");

  m.def("open_node", &zfeed::zarr::open_node, "store"_a, "path"_a = "",
        nb::call_guard<nb::gil_scoped_release>());
  m.def("registered_codecs", &zfeed::registered_codecs);
  // What this build holds: the optional input formats (with the reason where one is absent), and
  // whether CUDA and nvCOMP were compiled in (cuda_status() says whether a GPU is usable here).
  m.def("build_info", [] {
    nb::dict out;
    out["version"] = ZFEED_VERSION;
    const auto netcdf = zfeed::ingest::netcdf_support();
    const auto grib = zfeed::ingest::grib_support();
    out["netcdf"] = netcdf.available;
    out["netcdf_reason"] = netcdf.reason;
    out["grib"] = grib.available;
    out["grib_reason"] = grib.reason;
#ifdef ZFEED_HAVE_CUDA
    out["cuda"] = true;
#else
    out["cuda"] = false;
#endif
#ifdef ZFEED_HAVE_NVCOMP
    out["nvcomp"] = true;
#else
    out["nvcomp"] = false;
#endif
    return out;
  });

  bind_loader(m);
  bind_cuda(m);
}
