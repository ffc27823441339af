// What the CPU loader's and the device loader's bindings share: the properties that describe the
// batches (both read them from a zfeed::loader::Loader: the device loader's host loader).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "_interrupt.h"
#include "zfeed/loader/loader.h"
#include "zfeed/util/error.h"
#include "zfeed/util/json.h"

inline std::string channels_json(const std::vector<zfeed::loader::Channel>& channels) {
  zfeed::Json out = zfeed::Json::array();
  for (const auto& c : channels) {
    zfeed::Json item = {
        {"variable", c.variable}, {"time_offset", c.time_offset}, {"normalized", c.normalized}};
    item["level"] = c.level ? zfeed::Json(*c.level) : zfeed::Json();
    item["mean"] = c.normalized ? zfeed::Json(c.mean) : zfeed::Json();
    item["std"] = c.normalized ? zfeed::Json(c.std) : zfeed::Json();
    item["static"] = c.is_static;
    item["fill_nan"] = c.fill_nan ? zfeed::Json(c.nan_value) : zfeed::Json();
    zfeed::Json missing = zfeed::Json::array();
    for (unsigned i = 0; i < c.unpack.missing_count; ++i) missing.push_back(c.unpack.missing[i]);
    item["cf"] = c.unpack.active ? zfeed::Json{{"scale_factor", c.unpack.scale},
                                               {"add_offset", c.unpack.offset},
                                               {"missing", missing}}
                                 : zfeed::Json();
    out.push_back(item);
  }
  return out.dump();
}

// LoaderSpec's staging settings from the Python side: progress lines on stderr (C++'s: they need no
// GIL, so a copy in the background never waits on Python) and Ctrl-C stopping a copy made
// before the first batch.
inline void python_staging(zfeed::loader::LoaderSpec& spec, bool progress) {
  if (progress && !spec.stage_dir.empty()) {
    // In the background, lines (not redrawn in place): training prints beside them.
    spec.stage_progress =
        zfeed::zarr::stage_progress_printer("stage " + spec.stage_dir, spec.stage_in_background);
  }
  spec.stage_stop = python_interrupt_check();
}

// Makes a loader with the GIL released (staging, a remote store's reads wait on the network);
// where Ctrl-C stopped its staging, raises KeyboardInterrupt rather than the loader's error.
template <typename Make>
void construct_releasing_gil(Make make) {
  try {
    nanobind::gil_scoped_release release;
    make();
  } catch (const zfeed::Error&) {
    raise_if_interrupted();
    throw;
  }
}

// Runs `call()` (a call on `loader`) with the GIL released, taking its turn among the Python
// threads that share the loader, and returns what it returns.
template <typename AnyLoader, typename Call>
auto in_turn(AnyLoader& loader, Call call) {
  nanobind::gil_scoped_release release;
  std::lock_guard turn(loader.calls_mutex());
  return call();
}

// The loader's next batch (`loader.next(stop)`), asking Python's signal handlers while it waits:
// Ctrl-C raises KeyboardInterrupt at once, not when a stalled read gives up, and the batch stays
// due for the next call.
template <typename AnyLoader>
auto next_interruptibly(AnyLoader& loader) {
  const std::function<bool()> interrupted = python_interrupt_check();
  try {
    return in_turn(loader, [&] { return loader.next(interrupted); });
  } catch (const zfeed::InterruptedError&) {
    raise_if_interrupted();
    throw;
  }
}

// What staging did (LoaderSpec::stage_dir) as JSON, or "null" where the loader staged nothing.
inline std::string staged_json(const zfeed::loader::Loader& loader) {
  if (const auto progress = loader.staging_progress()) {
    return zfeed::Json{{"running", true},
                       {"keys_done", progress->keys_done},
                       {"keys", progress->keys_total},
                       {"bytes_copied", progress->bytes_copied},
                       {"seconds", progress->seconds}}
        .dump();
  }
  if (const auto failure = loader.staging_failure()) {
    return zfeed::Json{{"running", false}, {"failed", *failure}}.dump();
  }
  const auto staged = loader.staged();
  if (!staged) return "null";
  zfeed::Json out = {{"keys", staged->keys},
                     {"copied", staged->copied},
                     {"present", staged->present},
                     {"missing", staged->missing},
                     {"bytes_copied", staged->bytes_copied},
                     {"seconds", staged->seconds},
                     {"already_complete", staged->already_complete},
                     {"running", false}};
  out["time_range"] =
      staged->partial ? zfeed::Json{staged->partial->start, staged->partial->stop} : zfeed::Json();
  return out.dump();
}

// Adds the descriptive properties to `cls`; `host(self)` gives the zfeed::loader::Loader.
template <typename T, typename Host>
void add_loader_properties(nanobind::class_<T>& cls, Host host) {
  using zfeed::loader::Loader;
  cls.def_prop_ro("batches_per_epoch",
                  [host](const T& self) { return host(self).batches_per_epoch(); })
      .def_prop_ro("num_samples", [host](const T& self) { return host(self).num_samples(); })
      .def_prop_ro("input_shape", [host](const T& self) { return host(self).input_shape(); })
      .def_prop_ro("target_shape", [host](const T& self) { return host(self).target_shape(); })
      .def_prop_ro(
          "input_dtype",
          [host](const T& self) { return std::string(output_name(host(self).input_type())); })
      .def_prop_ro(
          "target_dtype",
          [host](const T& self) { return std::string(output_name(host(self).target_type())); })
      .def_prop_ro("label_targets", [host](const T& self) { return host(self).label_targets(); })
      .def_prop_ro("order", [host](const T& self) { return host(self).order(); })
      .def_prop_ro("window",
                   [host](const T& self) { return host(self).sampler().options().window; })
      .def_prop_ro("cache_budget", [host](const T& self) { return host(self).cache_budget(); })
      .def_prop_ro("memory_bound", [host](const T& self) { return host(self).memory_bound(); })
      .def_prop_ro("time_span", [host](const T& self) { return host(self).time_span(); })
      .def("staged_json", [host](const T& self) { return staged_json(host(self)); })
      .def("input_channels_json",
           [host](const T& self) { return channels_json(host(self).input_channels()); })
      .def("target_channels_json",
           [host](const T& self) { return channels_json(host(self).target_channels()); });
}
