#include "zfeed/loader/loader.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <initializer_list>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "zfeed/codec/data_type.h"
#include "zfeed/loader/cast_values.h"
#include "zfeed/store/mapped_read.h"
#include "zfeed/util/cancel.h"
#include "zfeed/util/error.h"
#include "zfeed/util/fork_gate.h"
#include "zfeed/util/io_counters.h"
#include "zfeed/util/scratch.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/cf.h"
#include "zfeed/zarr/group.h"

namespace zfeed::loader {

namespace {

// Whether float32 holds every value of `type` exactly (the deferred batches' element type).
bool float32_holds_exactly(DataType type) {
  switch (type.id) {
    case DataTypeId::kBool:
    case DataTypeId::kInt8:
    case DataTypeId::kUInt8:
    case DataTypeId::kInt16:
    case DataTypeId::kUInt16:
    case DataTypeId::kFloat16:
    case DataTypeId::kBFloat16:
    case DataTypeId::kFloat32:
      return true;
    default:
      return false;
  }
}

using Clock = std::chrono::steady_clock;

uint64_t elapsed_ns(Clock::time_point since) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count());
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

std::vector<double> json_numbers(const Json& value, const std::string& what) {
  std::vector<double> out;
  if (value.is_number()) {
    out.push_back(value.get<double>());
  } else if (value.is_array()) {
    for (const auto& item : value) {
      if (!item.is_number()) throw Error(what + " must be numbers, got " + json_type_name(item));
      out.push_back(item.get<double>());
    }
  } else {
    throw Error(what + " must be a number or a list of numbers, got " + json_type_name(value));
  }
  return out;
}

VariableSpec parse_variable(const Json& value, const char* role) {
  VariableSpec spec;
  if (value.is_string()) {
    spec.name = value.get<std::string>();
    return spec;
  }
  if (!value.is_object() || !value.contains("name") || !value["name"].is_string()) {
    throw Error(std::string("loader: each of the ") + role +
                " is a variable name or {\"name\": ..., \"levels\": [...]}, got " + value.dump());
  }
  spec.name = value["name"].get<std::string>();
  const std::string what = std::string("loader: ") + role + " variable '" + spec.name + "': ";
  if (value.contains("levels") && !value["levels"].is_null()) {
    const Json& levels = value["levels"];
    if (levels.is_array()) {
      for (const auto& level : levels) spec.levels.push_back(json_to_uint64(level, what + "level"));
    } else {
      spec.levels.push_back(json_to_uint64(levels, what + "level"));
    }
  }
  if (value.contains("level_values") && !value["level_values"].is_null())
    spec.level_values = json_numbers(value["level_values"], what + "level_values");
  if (value.contains("mean") && !value["mean"].is_null())
    spec.mean = json_numbers(value["mean"], what + "mean");
  if (value.contains("std") && !value["std"].is_null())
    spec.std = json_numbers(value["std"], what + "std");
  if (spec.mean.empty() != spec.std.empty())
    throw Error(what + "give both mean and std, or neither");
  return spec;
}

// Dimension names, where an array has them, must not contradict the layout the loader reads: time
// first, the grid last (a store written (lat, lon, time) would otherwise be read wrongly, with no
// error, wherever its shape agrees with the others').
bool named_like(const std::optional<std::string>& name,
                std::initializer_list<std::string_view> names) {
  if (!name) return false;
  std::string lower = *name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return std::find(names.begin(), names.end(), lower) != names.end();
}

void check_dimension_order(const std::vector<std::optional<std::string>>& dims, bool is_static,
                           const std::string& what) {
  const std::initializer_list<std::string_view> grid = {"lat", "latitude", "lon",  "longitude",
                                                        "x",   "y",        "rlat", "rlon"};
  const std::initializer_list<std::string_view> levels = {
      "level", "lev", "plev", "pressure_level", "isobaricinhpa", "height", "depth"};
  const std::initializer_list<std::string_view> times = {"time", "valid_time", "t",
                                                         "forecast_reference_time"};
  bool wrong = !is_static && (named_like(dims[0], grid) || named_like(dims[0], levels));
  for (size_t d = dims.size() - 2; d < dims.size(); ++d) wrong |= named_like(dims[d], times);
  if (!wrong) return;
  std::string text;
  for (const auto& dim : dims) text += (text.empty() ? "" : ", ") + dim.value_or("?");
  throw Error(what + " has dims (" + text + "): the loader reads " +
              (is_static ? std::string("(lat, lon)")
                         : std::string("(time, lat, lon) or (time, level, lat, lon)")) +
              "; rewrite it in that order (zfeed convert, or xarray's transpose)");
}

bool is_integer_type(DataType type) {
  switch (type.id) {
    case DataTypeId::kBool:
    case DataTypeId::kUInt8:
    case DataTypeId::kInt8:
    case DataTypeId::kInt16:
    case DataTypeId::kUInt16:
    case DataTypeId::kInt32:
    case DataTypeId::kUInt32:
    case DataTypeId::kInt64:
    case DataTypeId::kUInt64:
      return true;
    default:
      return false;
  }
}

OutputType parse_output_type(const std::string& name) {
  if (name == "float32") return OutputType::kFloat32;
  if (name == "float16") return OutputType::kFloat16;
  if (name == "bfloat16") return OutputType::kBFloat16;
  throw Error("loader: dtype must be float32, float16 or bfloat16, got '" + name + "'");
}

uint64_t product(std::span<const uint64_t> values) {
  uint64_t p = 1;
  for (uint64_t v : values) p *= v;
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Spec

LoaderSpec LoaderSpec::from_json(std::shared_ptr<Store> store, const Json& json) {
  if (!json.is_object()) throw Error("loader: the spec must be a JSON object");
  LoaderSpec spec;
  spec.store = std::move(store);
  auto uint_field = [&](const char* name, uint64_t& field) {
    if (json.contains(name) && !json[name].is_null()) {
      field = json_to_uint64(json[name], std::string("loader: ") + name);
    }
  };
  auto bool_field = [&](const char* name, bool& field) {
    if (json.contains(name) && !json[name].is_null()) {
      if (!json[name].is_boolean())
        throw Error(std::string("loader: ") + name + " must be true or false");
      field = json[name].get<bool>();
    }
  };
  if (json.contains("path") && json["path"].is_string())
    spec.path = zarr::normalize_path(json["path"].get<std::string>());
  for (const char* role : {"inputs", "targets"}) {
    if (!json.contains(role)) continue;
    if (!json[role].is_array())
      throw Error(std::string("loader: ") + role + " must be a list of variables");
    auto& list = std::string_view(role) == "inputs" ? spec.inputs : spec.targets;
    for (const auto& item : json[role]) list.push_back(parse_variable(item, role));
  }
  if (json.contains("lead") && json["lead"].is_array()) {
    for (const auto& lead : json["lead"])
      spec.leads.push_back(json_to_uint64(lead, "loader: lead"));
    if (spec.leads.empty()) throw Error("loader: lead is a number or a non-empty list, got []");
  } else {
    uint_field("lead", spec.lead);
  }
  uint_field("history", spec.history);
  uint_field("history_step", spec.history_step);
  uint_field("batch_size", spec.batch_size);
  uint_field("seed", spec.seed);
  uint_field("rank", spec.rank);
  uint_field("world_size", spec.world_size);
  uint_field("node", spec.node);
  uint_field("nodes", spec.nodes);
  uint_field("prefetch", spec.prefetch);
  uint_field("epoch", spec.epoch);
  bool_field("shuffle", spec.shuffle);
  bool_field("drop_last", spec.drop_last);
  bool_field("stage_in_background", spec.stage_in_background);
  bool_field("normalize", spec.normalize);
  if (json.contains("fill_nan") && !json["fill_nan"].is_null()) {
    const Json& value = json["fill_nan"];
    if (!value.is_number() || !std::isfinite(value.get<double>()))
      throw Error("loader: fill_nan must be a finite number or null, got " + value.dump());
    spec.fill_nan = static_cast<float>(value.get<double>());
  }
  auto string_field = [&](const char* name, std::string& field) {
    if (json.contains(name) && !json[name].is_null()) {
      if (!json[name].is_string())
        throw Error(std::string("loader: ") + name + " must be a string");
      field = json[name].get<std::string>();
    }
  };
  std::string dtype = "float32";
  string_field("dtype", dtype);
  spec.dtype = parse_output_type(dtype);
  string_field("stacked", spec.stacked);
  string_field("order", spec.order);
  string_field("stage_dir", spec.stage_dir);
  uint_field("window", spec.window);
  if (json.contains("cache_bytes") && !json["cache_bytes"].is_null())
    spec.cache_bytes = json_to_uint64(json["cache_bytes"], "loader: cache_bytes");
  if (json.contains("time_range") && !json["time_range"].is_null()) {
    const Json& range = json["time_range"];
    if (!range.is_array() || range.size() != 2)
      throw Error("loader: time_range is [start, stop] (either may be null), got " + range.dump());
    for (size_t end = 0; end < 2; ++end) {
      if (range[end].is_null()) continue;
      if (!range[end].is_number_integer())
        throw Error("loader: time_range is [start, stop] of integers, got " + range.dump());
      spec.time_range[end] = range[end].get<int64_t>();
    }
  }
  if (json.contains("random_crop") && !json["random_crop"].is_null()) {
    const Json& size = json["random_crop"];
    if (!size.is_array() || size.size() != 2)
      throw Error("loader: random_crop is [lat_size, lon_size], got " + size.dump());
    spec.random_crop = std::array<uint64_t, 2>{json_to_uint64(size[0], "loader: random_crop"),
                                               json_to_uint64(size[1], "loader: random_crop")};
  }
  if (json.contains("crop") && !json["crop"].is_null()) {
    const Json& crop = json["crop"];
    if (!crop.is_array() || crop.size() != 4) {
      throw Error("loader: crop is [lat_start, lat_size, lon_start, lon_size], got " + crop.dump());
    }
    spec.crop =
        Crop{json_to_uint64(crop[0], "loader: crop"), json_to_uint64(crop[1], "loader: crop"),
             json_to_uint64(crop[2], "loader: crop"), json_to_uint64(crop[3], "loader: crop")};
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------
// Stats

Json LoaderStats::to_json() const {
  return Json{{"read_s", read_ns * 1e-9},
              {"decode_s", decode_ns * 1e-9},
              {"assemble_s", assemble_ns * 1e-9},
              {"batch_s", batch_ns * 1e-9},
              {"wait_s", wait_ns * 1e-9},
              {"prefetch_idle_s", idle_ns * 1e-9},
              {"bytes_read", bytes_read},
              {"bytes_decoded", bytes_decoded},
              {"bytes_delivered", bytes_delivered},
              {"chunks_decoded", chunks_decoded},
              {"planes_read_alone", planes_read_alone},
              {"chunks_passed", chunks_passed},
              {"chunks_located", chunks_located},
              {"cache_hits", cache_hits},
              {"cache_bytes", cache_bytes},
              {"batches", batches},
              {"samples", samples},
              {"buffers", buffers}};
}

// ---------------------------------------------------------------------------------------------
// Shared state of the consumer, the prefetch thread and the lent buffers

struct Loader::Shared {
  struct Ready {
    uint64_t index = 0;
    uint64_t size = 0;
    std::unique_ptr<BatchMemory> memory;
    std::exception_ptr error;
  };

  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::unique_ptr<BatchMemory>> free;
  std::deque<Ready> ready;
  bool stop = false;
  // Set with stop: the prefetch's reads from a remote store end instead of running to their
  // stall timeout and retries (a loader dropped after Ctrl-C, a set_epoch, waits for them).
  std::atomic<bool> cancel_reads{false};
  bool producer_started = false;  // the prefetch thread runs (its start-up is done)
  bool producer_parked = false;   // it has produced all it will and waits to exit
  bool producer_may_exit = false;
  bool producer_waiting = false;
  bool producer_done = false;
  size_t input_bytes = 0, target_bytes = 0, batch_size = 0;

  std::atomic<uint64_t> read_ns{0}, decode_ns{0}, assemble_ns{0}, batch_ns{0}, wait_ns{0},
      idle_ns{0}, bytes_read{0}, bytes_decoded{0}, bytes_delivered{0}, chunks_decoded{0},
      planes_read_alone{0}, chunks_passed{0}, chunks_located{0}, cache_hits{0}, cache_bytes{0},
      batches{0}, samples{0}, buffers{0};

  std::unique_ptr<BatchMemory> allocate() {
    auto memory = std::make_unique<BatchMemory>();
    memory->inputs.resize(input_bytes);
    memory->targets.resize(target_bytes);
    memory->times.resize(batch_size);
    memory->crops.resize(2 * batch_size);
    ++buffers;
    return memory;
  }
  void give_back(BatchMemory* memory) {
    {
      std::lock_guard lock(mutex);
      free.emplace_back(memory);
    }
    cv.notify_all();
  }
};

struct Loader::Source {
  size_t array = 0;
  std::optional<uint64_t> level;
  size_t channel = 0;  // within one time step's channels
  bool label = false;  // an integer target without statistics: a segmentation label
};

struct Loader::Piece {
  size_t array = 0;
  uint64_t time = 0;
  std::optional<uint64_t> level;
  uint64_t lat_start = 0, lon_start = 0;  // the crop origin in the array
  uint8_t* dst = nullptr;                 // lat_ x lon_ values of `out`
  OutputType out = OutputType::kFloat32;
  Normalization normalization;
  int64_t compressed = -1;    // its index in BatchMemory::compressed, where handed over compressed
  bool located = false;       // handed over as a place in a local file, not read
  int64_t static_plane = -1;  // a static input's plane: its index in statics_, copied from there
};

// ---------------------------------------------------------------------------------------------
// Fork safety: fork() first waits for the prefetch thread and the pool to park (ForkGate), then
// holds every live loader's lock across the fork, so that a forked child (a DataLoader worker, a
// multiprocessing fork) never inherits a lock held by a thread that does not exist there; the
// child's loader then notices it has no prefetch thread and starts its own.

namespace {

std::mutex& live_loaders_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<Loader::Shared*>& live_loaders() {
  static std::vector<Loader::Shared*> loaders;
  return loaders;
}
void register_fork_handlers() {
  static const bool registered = [] {
    ForkGate::add_fork_handlers(
        [] {
          live_loaders_mutex().lock();
          for (Loader::Shared* shared : live_loaders()) shared->mutex.lock();
        },
        [] {
          for (Loader::Shared* shared : live_loaders()) shared->mutex.unlock();
          live_loaders_mutex().unlock();
        },
        [] {
          // In the child the parent's threads are gone, yet a condition variable may still
          // count them as waiters (a broadcast would wait for them forever): start it afresh.
          for (Loader::Shared* shared : live_loaders()) {
            new (&shared->cv) std::condition_variable();
            shared->mutex.unlock();
          }
          live_loaders_mutex().unlock();
        });
    return true;
  }();
  (void)registered;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

Loader::Loader(LoaderSpec spec) : spec_(std::move(spec)), shared_(std::make_shared<Shared>()) {
  if (!spec_.store) throw Error("loader: no store");
  pool_ = &ThreadPool::for_reads(spec_.store->read_concurrency());
  if (spec_.inputs.empty()) throw Error("loader: no input variables");
  if (spec_.history == 0) throw Error("loader: history must be at least 1");
  if (spec_.history_step == 0) throw Error("loader: history_step must be at least 1");
  // Saturated: a huge history or step from a spec must not wrap around to a short reach.
  back_ = spec_.history - 1 > UINT64_MAX / spec_.history_step
              ? UINT64_MAX
              : (spec_.history - 1) * spec_.history_step;
  if (spec_.prefetch == 0) throw Error("loader: prefetch must be at least 1");
  if (spec_.crop && spec_.random_crop) throw Error("loader: give crop or random_crop, not both");
  if (spec_.order != "auto" && spec_.order != "random" && spec_.order != "chunks") {
    throw Error("loader: order must be auto, random or chunks, got '" + spec_.order + "'");
  }
  leads_ = spec_.leads.empty() ? std::vector<uint64_t>{spec_.lead} : spec_.leads;
  for (size_t i = 0; i < leads_.size(); ++i) {
    if (std::find(leads_.begin(), leads_.begin() + static_cast<ptrdiff_t>(i), leads_[i]) !=
        leads_.begin() + static_cast<ptrdiff_t>(i)) {
      throw Error("loader: lead " + std::to_string(leads_[i]) + " is given twice");
    }
  }
  max_lead_ = *std::max_element(leads_.begin(), leads_.end());
  if (spec_.nodes == 0 || spec_.node >= spec_.nodes) {
    throw Error("loader: node " + std::to_string(spec_.node) + " of " +
                std::to_string(spec_.nodes) + " nodes: give 0 <= node < nodes");
  }
  // A partial staged copy (zfeed stage --time) holds some time steps only: read, or staged
  // again, it gives the loader no other.
  store_holds_ = staged_time_range(*spec_.store);
  if (spec_.stage_dir.empty()) {
    if (store_holds_ && spec_.nodes > 1) {
      throw Error("loader: " + spec_.store->url() + " is a partial staged copy (" +
                  store_holds_->time_dim + " steps [" + std::to_string(store_holds_->start) + ", " +
                  std::to_string(store_holds_->stop) +
                  ")): to split the samples among nodes, give the source and a staging directory "
                  "(Python: stage=, recipes: --stage-dir), so that each node copies its own "
                  "block");
    }
  }
  if (spec_.fill_nan && !std::isfinite(*spec_.fill_nan)) {
    throw Error("loader: fill_nan must be a finite number, got " + std::to_string(*spec_.fill_nan));
  }
  const std::string where = spec_.store->url() + (spec_.path.empty() ? "" : "/" + spec_.path);

  std::vector<std::string>& names = array_names_;
  auto open_array = [&](const std::string& name) -> size_t {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return i;
    }
    arrays_.push_back(zarr::Array::open(spec_.store, zarr::join_key(spec_.path, name)));
    names.push_back(name);
    return arrays_.size() - 1;
  };
  // The stacked array's channel names, if the group has one.
  std::optional<std::vector<std::string>> stacked_names;
  auto stacked_channels = [&]() -> const std::vector<std::string>* {
    if (!stacked_names) {
      stacked_names.emplace();
      try {
        const size_t a = open_array(spec_.stacked);
        const Json& attributes = arrays_[a].metadata().attributes;
        if (arrays_[a].metadata().rank() == 4 && attributes.is_object() &&
            attributes.contains("variables") && attributes["variables"].is_array()) {
          for (const auto& item : attributes["variables"]) {
            stacked_names->push_back(item.is_string() ? item.get<std::string>() : item.dump());
          }
        }
      } catch (const NotFoundError&) {
      }
    }
    return stacked_names->empty() ? nullptr : &*stacked_names;
  };
  // An array by name, else a channel of the stacked array: (array, stacked channel index).
  auto find_variable = [&](const std::string& name,
                           const char* role) -> std::pair<size_t, std::optional<uint64_t>> {
    try {
      return {open_array(name), std::nullopt};
    } catch (const NotFoundError&) {
      if (const auto* channels = stacked_channels()) {
        for (size_t c = 0; c < channels->size(); ++c) {
          if ((*channels)[c] == name) return {open_array(spec_.stacked), c};
        }
      }
      std::string members;
      try {
        for (const auto& member : zarr::Group::open(spec_.store, spec_.path).members()) {
          members += (members.empty() ? "" : ", ") + member;
        }
      } catch (const Error&) {
      }
      if (const auto* channels = stacked_channels()) {
        members +=
            std::string(members.empty() ? "" : "; ") + "stacked in '" + spec_.stacked + "': ";
        for (size_t c = 0; c < channels->size(); ++c) members += (c ? ", " : "") + (*channels)[c];
      }
      throw NotFoundError("loader: " + std::string(role) + " variable '" + name +
                          "' not found in " + where +
                          (members.empty() ? "" : " (it holds: " + members + ")"));
    } catch (const Error&) {
      rethrow_with_context("loader: " + std::string(role) + " variable '" + name + "'");
    }
  };

  std::optional<size_t> reference;  // the array the others are checked against (it has time)
  std::vector<Channel> static_channels;
  std::vector<size_t> static_arrays;
  // Level values to indices along dim 1, through the coordinate array named like that dimension
  // (as xarray's .sel).
  auto level_indices = [&](const zarr::Array& array, const VariableSpec& variable,
                           const std::string& what) {
    const auto& meta = array.metadata();
    if (meta.rank() != 4) throw Error(what + " has no level dimension to select level_values on");
    if (!variable.levels.empty())
      throw Error(what + ": give levels (indices) or level_values, not both");
    const auto& dims = meta.dimension_names;
    if (!dims || !(*dims)[1]) {
      throw Error(what +
                  ": its dimension 1 has no name, so no coordinate holds its level values: "
                  "give levels (indices)");
    }
    const std::string dim = *(*dims)[1];
    std::optional<zarr::Array> coordinate;
    try {
      coordinate = zarr::Array::open(spec_.store, zarr::join_key(spec_.path, dim));
    } catch (const NotFoundError&) {
      throw Error(what + ": no coordinate array '" + dim +
                  "' in the group to find level_values in");
    }
    const auto& cm = coordinate->metadata();
    if (cm.rank() != 1 || cm.shape[0] != meta.shape[1]) {
      throw Error(what + ": the coordinate '" + dim + "' has shape " + shape_text(cm.shape) +
                  ", not (" + std::to_string(meta.shape[1]) + ")");
    }
    Bytes raw(cm.shape[0] * cm.dtype.size());
    coordinate->read(coordinate->full_selection(), raw.data());
    std::vector<float> values(cm.shape[0]);
    cast_values(raw.data(), cm.dtype, reinterpret_cast<uint8_t*>(values.data()),
                OutputType::kFloat32, values.size(), Normalization{});
    auto text = [](double value) {
      std::ostringstream out;
      out << std::setprecision(10) << value;
      return out.str();
    };
    std::vector<uint64_t> indices;
    for (const double wanted : variable.level_values) {
      const auto found = std::find(values.begin(), values.end(), static_cast<float>(wanted));
      if (found == values.end()) {
        std::string held;
        for (const float v : values) held += (held.empty() ? "" : ", ") + text(v);
        throw Error(what + ": level value " + text(wanted) + " is not in the coordinate '" + dim +
                    "' (it holds " + held + ")");
      }
      indices.push_back(static_cast<uint64_t>(found - values.begin()));
    }
    return indices;
  };
  auto resolve = [&](const std::vector<VariableSpec>& variables, const char* role,
                     std::vector<Source>& sources, std::vector<Channel>& channels) {
    for (VariableSpec variable : variables) {
      const auto [a, stacked_channel] = find_variable(variable.name, role);
      const auto& meta = arrays_[a].metadata();
      const std::string what = std::string("loader: ") + role + " variable '" + variable.name + "'";
      if (!variable.level_values.empty()) {
        if (stacked_channel)
          throw Error(what + " is a channel of the stacked array '" + spec_.stacked +
                      "' and has no levels to select");
        variable.levels = level_indices(arrays_[a], variable, what);
      }
      const bool is_static = meta.rank() == 2 && !stacked_channel;
      if (is_static && std::string_view(role) != "input") {
        throw Error(what + " has shape " + shape_text(meta.shape) +
                    ", dims (lat, lon) without time: a static field can only be an input");
      }
      if (meta.rank() != 3 && meta.rank() != 4 && !is_static) {
        throw Error(what + " has shape " + shape_text(meta.shape) +
                    ": expected dims (time, lat, lon), (time, level, lat, lon), or (lat, lon) "
                    "for a static input");
      }
      if (meta.dtype.is_complex())
        throw UnsupportedError(what + " is " + std::string(meta.dtype.name()) +
                               ": complex values cannot be cast to a batch");
      if (meta.dimension_names && !stacked_channel)
        check_dimension_order(*meta.dimension_names, is_static, what);
      const size_t r = meta.rank();
      if (!is_static) {  // static fields are checked against the grid once it is known
        if (!reference) reference = a;
        const auto& first = arrays_[*reference].metadata();
        const size_t r0 = first.rank();
        if (meta.shape[0] != first.shape[0] || meta.shape[r - 2] != first.shape[r0 - 2] ||
            meta.shape[r - 1] != first.shape[r0 - 1]) {
          throw Error(what + " has shape " + shape_text(meta.shape) + " but '" + names[*reference] +
                      "' has " + shape_text(first.shape) +
                      ": every variable needs the same time, lat and lon extents");
        }
      }
      std::vector<std::optional<uint64_t>> levels;
      if (is_static) {
        if (!variable.levels.empty())
          throw Error(what + " is static (dims (lat, lon)) and has no levels to select");
        levels.push_back(std::nullopt);
      } else if (stacked_channel) {
        if (!variable.levels.empty())
          throw Error(what + " is a channel of the stacked array '" + spec_.stacked +
                      "' and has no levels to select");
        levels.push_back(*stacked_channel);
      } else if (r == 3) {
        if (!variable.levels.empty())
          throw Error(what + " has no level dimension, but levels were given");
        levels.push_back(std::nullopt);
      } else if (variable.levels.empty()) {
        for (uint64_t l = 0; l < meta.shape[1]; ++l) levels.push_back(l);
      } else {
        for (uint64_t l : variable.levels) {
          if (l >= meta.shape[1]) {
            throw Error(what + ": level " + std::to_string(l) + " is out of range (the array has " +
                        std::to_string(meta.shape[1]) + " levels)");
          }
          levels.push_back(l);
        }
      }
      // Statistics: given, else the zfeed_stats attribute, else none. An attribute with a list
      // holds one value per index along dim 1 (levels, or stacked variables).
      std::vector<double> mean = variable.mean, stdev = variable.std;
      bool per_level_attribute = false;
      if (spec_.normalize && mean.empty() && meta.attributes.is_object() &&
          meta.attributes.contains("zfeed_stats")) {
        const Json& stats = meta.attributes["zfeed_stats"];
        if (!stats.is_object() || !stats.contains("mean") || !stats.contains("std")) {
          throw Error(what + ": the zfeed_stats attribute must be {\"mean\": ..., \"std\": ...}");
        }
        mean = json_numbers(stats["mean"], what + ": zfeed_stats mean");
        stdev = json_numbers(stats["std"], what + ": zfeed_stats std");
        per_level_attribute = r == 4 && mean.size() > 1;
        if (per_level_attribute &&
            (mean.size() != meta.shape[1] || stdev.size() != meta.shape[1])) {
          throw Error(what + ": zfeed_stats has " + std::to_string(mean.size()) + " means and " +
                      std::to_string(stdev.size()) + " stds for " + std::to_string(meta.shape[1]) +
                      " entries along dim 1");
        }
      }
      if (!per_level_attribute && mean.size() > 1 &&
          (mean.size() != levels.size() || stdev.size() != levels.size())) {
        throw Error(what + ": give one mean and std, or one per selected level (" +
                    std::to_string(levels.size()) + "), got " + std::to_string(mean.size()) +
                    " and " + std::to_string(stdev.size()));
      }
      // CF encoding (scale_factor, add_offset, missing values): decoded as xarray does, first.
      const zarr::CfEncoding cf = zarr::cf_encoding(meta, what);
      if (cf.missing.size() > CfUnpack::kMaxMissing) {
        throw UnsupportedError(what + " has " + std::to_string(cf.missing.size()) +
                               " _FillValue and missing_value values; at most " +
                               std::to_string(CfUnpack::kMaxMissing) + " are supported");
      }
      CfUnpack unpack;
      unpack.active = cf.active();
      unpack.scale = cf.scale;
      unpack.offset = cf.offset;
      unpack.wrap = cf.wrap;
      for (const double m : cf.missing) unpack.missing[unpack.missing_count++] = m;
      // An integer target without statistics is a label (a segmentation mask); with statistics,
      // or CF-packed, it is a physical quantity, normalized like any other.
      const bool has_stats = !variable.mean.empty() || (meta.attributes.is_object() &&
                                                        meta.attributes.contains("zfeed_stats"));
      const bool label = std::string_view(role) == "target" && is_integer_type(meta.dtype) &&
                         !has_stats && !cf.packed;
      for (size_t k = 0; k < levels.size(); ++k) {
        Channel channel;
        channel.variable = variable.name;
        channel.level = levels[k];
        if (spec_.normalize && !mean.empty() && !label) {
          const size_t i = per_level_attribute ? *levels[k] : (mean.size() == 1 ? 0 : k);
          channel.normalized = true;
          channel.mean = static_cast<float>(mean[i]);
          channel.std = static_cast<float>(stdev[i]);
          if (!(channel.std > 0.0f) || !std::isfinite(channel.std) ||
              !std::isfinite(channel.mean)) {
            throw Error(what + ": std must be positive and finite, mean finite (got mean " +
                        std::to_string(mean[i]) + ", std " + std::to_string(stdev[i]) + ")");
          }
        }
        if (spec_.fill_nan && !label) {
          channel.fill_nan = true;
          channel.nan_value = *spec_.fill_nan;
        }
        channel.unpack = unpack;
        // Deferred, the consumer gets float32 values: where those would round the stored ones
        // (wide integers, float64), the host decodes CF first, from the exact value.
        channel.unpack_on_host =
            spec_.defer_normalization && unpack.active && !float32_holds_exactly(meta.dtype);
        if (is_static) {
          channel.is_static = true;
          static_channels.push_back(channel);
          static_arrays.push_back(a);
          continue;
        }
        sources.push_back(Source{a, levels[k], channels.size(), label});
        channels.push_back(channel);
      }
    }
  };
  std::vector<Channel> step_channels;
  resolve(spec_.inputs, "input", input_sources_, step_channels);
  resolve(spec_.targets, "target", target_sources_, target_channels_);
  if (!reference) {
    throw Error(
        "loader: no variable has a time dimension: static (lat, lon) inputs go with at least one "
        "(time, lat, lon) or (time, level, lat, lon) variable");
  }
  // The samples' time span must fit the axis (checked before a channel is made per history step).
  time_extent_ = arrays_[*reference].metadata().shape[0];
  resolve_time_range();
  if (!spec_.stage_dir.empty()) stage_and_reopen(*reference);
  for (uint64_t h = 0; h < spec_.history; ++h) {
    for (Channel channel : step_channels) {
      channel.time_offset = -static_cast<int64_t>((spec_.history - 1 - h) * spec_.history_step);
      input_channels_.push_back(channel);
    }
  }
  // The targets' channels once per lead, lead after lead.
  {
    const std::vector<Channel> one_lead = std::move(target_channels_);
    target_channels_.clear();
    for (const uint64_t lead : leads_) {
      for (Channel channel : one_lead) {
        channel.time_offset = static_cast<int64_t>(lead);
        target_channels_.push_back(channel);
      }
    }
  }
  static_.assign(arrays_.size(), false);
  for (size_t k = 0; k < static_arrays.size(); ++k) {
    const auto& meta = arrays_[static_arrays[k]].metadata();
    const auto& first = arrays_[*reference].metadata();
    const size_t r0 = first.rank();
    if (meta.shape[0] != first.shape[r0 - 2] || meta.shape[1] != first.shape[r0 - 1]) {
      throw Error("loader: input variable '" + static_channels[k].variable + "' has shape " +
                  shape_text(meta.shape) + " but '" + names[*reference] + "' has " +
                  shape_text(first.shape) +
                  ": a static field needs the same lat and lon extents as the others");
    }
    static_[static_arrays[k]] = true;
    statics_.push_back(StaticPlane{static_arrays[k], input_channels_.size(), {}});
    input_channels_.push_back(static_channels[k]);
  }

  // Label targets come out as int64, one channel.
  size_t label_targets = 0;
  for (const auto& source : target_sources_) label_targets += source.label ? 1 : 0;
  if (label_targets > 0) {
    if (target_sources_.size() != 1) {
      throw Error(
          "loader: integer targets without statistics are labels (segmentation masks): "
          "give one label variable with one channel as the only target, got " +
          std::to_string(target_sources_.size()) + " target channels of which " +
          std::to_string(label_targets) + " are labels");
    }
    labels_ = true;
    if (leads_.size() > 1) {
      throw Error("loader: label targets take one lead, got " + std::to_string(leads_.size()));
    }
  }

  const auto& first = arrays_[*reference].metadata();
  full_lat_ = lat_ = first.shape[first.rank() - 2];
  full_lon_ = lon_ = first.shape[first.rank() - 1];
  if (spec_.crop) {
    const Crop& c = *spec_.crop;
    if (c.lat_size == 0 || c.lon_size == 0 || c.lat_size > lat_ ||
        c.lat_start > lat_ - c.lat_size || c.lon_size > lon_ || c.lon_start > lon_ - c.lon_size) {
      throw Error("loader: crop [" + std::to_string(c.lat_start) + ", " +
                  std::to_string(c.lat_size) + ", " + std::to_string(c.lon_start) + ", " +
                  std::to_string(c.lon_size) + "] (lat_start, lat_size, " +
                  "lon_start, lon_size) does not fit the " + std::to_string(lat_) + " x " +
                  std::to_string(lon_) + " grid");
    }
    lat_start_ = c.lat_start;
    lon_start_ = c.lon_start;
    lat_ = c.lat_size;
    lon_ = c.lon_size;
  }
  if (spec_.random_crop) {
    const auto [h, w] = *spec_.random_crop;
    if (h == 0 || w == 0 || h > lat_ || w > lon_) {
      throw Error("loader: random_crop [" + std::to_string(h) + ", " + std::to_string(w) +
                  "] (lat_size, lon_size) does not fit the " + std::to_string(lat_) + " x " +
                  std::to_string(lon_) + " grid");
    }
    lat_ = h;
    lon_ = w;
  }

  // Which arrays go through the decoded-chunk cache, and the time chunking that sets the order:
  // that of the cached arrays, or with order "chunks" of every array.
  uint64_t time_chunk = 1, any_time_chunk = 1, chunk_row_bytes = 0;
  std::vector<std::pair<uint64_t, uint64_t>> cached_rows_of;  // (bytes, steps) of a time chunk
  read_chunks_.resize(arrays_.size());
  cached_.resize(arrays_.size());
  prefix_readable_.resize(arrays_.size());
  for (size_t a = 0; a < arrays_.size(); ++a) {
    const auto& meta = arrays_[a].metadata();
    read_chunks_[a] = arrays_[a].read_chunk_shape();
    const auto& chunk = read_chunks_[a];
    const CodecChain& codecs = arrays_[a].read_codecs();
    prefix_readable_[a] = codecs.prefix_saves_work();
    // An uncompressed plane is read by byte range straight into the batch, as cheaply as from a
    // cache: such arrays need neither the cache nor the chunk-aware order.
    if (static_[a]) continue;  // read once, below
    cached_[a] = planes_per_read_chunk(a) > 1 && !codecs.is_identity();
    any_time_chunk = std::max(any_time_chunk, chunk[0]);
    if (!cached_[a]) continue;
    time_chunk = std::max(time_chunk, chunk[0]);
    // One time chunk of the array (all of its chunks along the other dims).
    uint64_t row = chunk[0] * meta.dtype.size();
    for (size_t d = 1; d < meta.rank(); ++d)
      row *= (meta.shape[d] + chunk[d] - 1) / chunk[d] * chunk[d];
    cached_rows_of.emplace_back(row, chunk[0]);
  }
  // A row of the cache is one time chunk of the order (time_chunk steps, the largest): an array
  // with shorter time chunks has several of its own in it.
  for (const auto& [row, steps] : cached_rows_of) {
    chunk_row_bytes += row * ((time_chunk + steps - 1) / steps);
  }
  // Arrays whose chunks may go to the consumer compressed: float32 planes, one whole plane per
  // chunk, no crop (the chunk is the plane in the batch).
  passable_.assign(arrays_.size(), false);
  if (spec_.pass_compressed && spec_.defer_normalization) {
    pass_reason_ = "no array has float32 chunks of one whole plane each";
    if (spec_.crop || spec_.random_crop) pass_reason_ = "crops read parts of chunks";
    for (size_t a = 0; a < arrays_.size() && !spec_.crop && !spec_.random_crop; ++a) {
      const auto& meta = arrays_[a].metadata();
      const auto& chunk = read_chunks_[a];
      const size_t r = chunk.size();
      passable_[a] = !static_[a] && planes_per_read_chunk(a) == 1 &&
                     meta.dtype.id == DataTypeId::kFloat32 && chunk[r - 2] == meta.shape[r - 2] &&
                     chunk[r - 1] == meta.shape[r - 1] && spec_.pass_compressed(arrays_[a]);
      if (passable_[a]) pass_reason_.clear();
    }
  } else {
    pass_reason_ = "not asked for";
  }
  find_local_arrays();
  set_locate_compressed(spec_.locate_compressed);

  if (spec_.order == "chunks") time_chunk = any_time_chunk;
  const bool chunk_order =
      spec_.shuffle && (spec_.order == "chunks" || (spec_.order == "auto" && time_chunk > 1));

  SamplerOptions options;
  options.num_samples = time_stop_ - time_start_ - back_ - max_lead_;
  options.batch_size = spec_.batch_size;
  options.shuffle = spec_.shuffle;
  options.seed = spec_.seed;
  options.rank = spec_.rank;
  options.world_size = spec_.world_size;
  options.drop_last = spec_.drop_last;
  uint64_t window = 1;
  if (chunk_order && time_chunk > 1) {
    window = spec_.window > 0
                 ? spec_.window
                 : std::max<uint64_t>(2, (spec_.batch_size + time_chunk - 1) / time_chunk);
    options.group_size = time_chunk;
    options.group_offset = time_start_ + back_;  // groups are time chunks
    options.window = window;
  }
  sampler_ = Sampler(options);
  epoch_ = spec_.epoch;
  // The cache: given, else enough for two windows of time chunks plus the chunks a window's
  // last samples reach into (history and lead), else nothing kept between batches.
  uint64_t budget = 0;
  if (spec_.cache_bytes) {
    budget = *spec_.cache_bytes;
  } else if (options.group_size > 1) {
    // Time chunks a window's samples reach beyond it: back by the history, ahead by the lead.
    const uint64_t reach = std::max<uint64_t>(1, (back_ + max_lead_ + time_chunk - 1) / time_chunk);
    budget = (2 * window + 1 + reach) * chunk_row_bytes;
  }
  cache_ = ChunkCache(budget);
  // How many batches a decoded chunk stays cached: each batch brings about batch_size / time_chunk
  // new time chunks, and the window under way holds `window` of the budget's.
  const uint64_t cached_rows = chunk_row_bytes > 0 ? budget / chunk_row_bytes : 0;
  if (cached_rows * time_chunk >= time_stop_ - time_start_) {
    horizon_batches_ = UINT64_MAX;  // everything fits
  } else {
    horizon_batches_ = std::max<uint64_t>(
        1, (cached_rows > window ? cached_rows - window : 0) * time_chunk / spec_.batch_size);
  }

  // The static planes, whole, as the batch holds them (normalized unless the consumer does it).
  for (StaticPlane& plane : statics_) {
    const zarr::Array& array = arrays_[plane.array];
    const Channel& channel = input_channels_[plane.channel];
    const size_t count = full_lat_ * full_lon_;
    Bytes raw(count * array.metadata().dtype.size());
    try {
      array.read(array.full_selection(), raw.data());
    } catch (const Error&) {
      rethrow_with_context("loader: static input variable '" + channel.variable + "'");
    }
    plane.values.resize(count * output_size(assembled_input_type()));
    cast_values(raw.data(), array.metadata().dtype, plane.values.data(), assembled_input_type(),
                count, channel.host_normalization(spec_.defer_normalization));
  }

  auto in = input_shape(), out = target_shape();
  shared_->input_bytes = in[0] * in[1] * in[2] * in[3] * output_size(assembled_input_type());
  shared_->target_bytes = out[0] * out[1] * out[2] * out[3] * output_size(assembled_target_type());
  shared_->batch_size = spec_.batch_size;
  for (uint64_t i = 0; i < spec_.prefetch + 1; ++i) shared_->free.push_back(shared_->allocate());
  register_fork_handlers();
  std::lock_guard lock(live_loaders_mutex());
  live_loaders().push_back(shared_.get());
}

Loader::~Loader() {
  stop_producer();
  background_.reset();  // stops a copy in the background (a later loader goes on from there)
  std::lock_guard lock(live_loaders_mutex());
  auto& loaders = live_loaders();
  loaders.erase(std::remove(loaders.begin(), loaders.end(), shared_.get()), loaders.end());
}

std::array<uint64_t, 4> Loader::input_shape() const {
  return {spec_.batch_size, input_channels_.size(), lat_, lon_};
}
std::array<uint64_t, 4> Loader::target_shape() const {
  return {spec_.batch_size, target_channels_.size(), lat_, lon_};
}

uint64_t Loader::memory_bound() const {
  const uint64_t batch = shared_->input_bytes + shared_->target_bytes;
  // One batch's distinct chunks in flight: at most every plane of the batch in its own chunk.
  // Direct reads (and reads alone) keep per thread at most a stored and a decoded read chunk and
  // a plane to cast from (the thread's scratch buffers).
  uint64_t in_flight = 0, scratch = 0;
  const uint64_t samples = spec_.batch_size;
  auto add = [&](const std::vector<Source>& sources, uint64_t steps) {
    for (const auto& source : sources) {
      const auto& meta = arrays_[source.array].metadata();
      const uint64_t chunk_bytes = product(read_chunks_[source.array]) * meta.dtype.size();
      if (cached_[source.array]) in_flight += samples * steps * chunk_bytes;
      scratch = std::max<uint64_t>(scratch, 2 * chunk_bytes + lat_ * lon_ * meta.dtype.size());
    }
  };
  add(input_sources_, spec_.history);
  add(target_sources_, 1);
  // In flight twice: the batch's chunks, and as many spare buffers kept for the next batch.
  // The chunk files read stay mapped (store/mapped_read.h): those are the page cache's pages,
  // not the loader's memory, though the process's resident size counts them (RssFile).
  uint64_t statics = 0;  // the static planes, whole
  for (const StaticPlane& plane : statics_) statics += plane.values.size();
  return (spec_.prefetch + 1) * batch + cache_.budget() + 2 * in_flight + pool_->size() * scratch +
         statics;
}

std::array<uint64_t, 2> Loader::crop_origin(uint64_t epoch, uint64_t time) const {
  if (!spec_.random_crop) return {lat_start_, lon_start_};
  SplitMix64 rng(spec_.seed ^ (0xA0761D6478BD642Full * (epoch + 1)) ^
                 (0xE7037ED1A0B428DBull * (time + 1)));
  const uint64_t lat = rng.below(full_lat_ - lat_ + 1);
  const uint64_t lon = rng.below(full_lon_ - lon_ + 1);
  return {lat, lon};
}

// ---------------------------------------------------------------------------------------------
// Assembly

bool Loader::set_pass_compressed(bool enabled) {
  const bool any = std::find(passable_.begin(), passable_.end(), true) != passable_.end();
  pass_enabled_ = enabled && any;
  return any;
}

void Loader::find_local_arrays() {
  local_.assign(arrays_.size(), false);
  for (size_t a = 0; a < arrays_.size(); ++a)
    local_[a] = arrays_[a].stored_locally() && (!spec_.locatable || spec_.locatable(arrays_[a]));
}

bool Loader::set_locate_compressed(bool enabled) {
  locate_requested_ = enabled;
  const bool any = std::find(local_.begin(), local_.end(), true) != local_.end();
  locate_enabled_ = enabled && any;
  return locate_enabled_;
}

void Loader::assemble(uint64_t epoch, std::span<const uint64_t> times, void* inputs, void* targets,
                      BatchMemory* memory) {
  assemble_batch(epoch, std::nullopt, times, inputs, targets, memory);
}

void Loader::assemble_batch(uint64_t epoch, std::optional<uint64_t> batch,
                            std::span<const uint64_t> times, void* inputs, void* targets,
                            BatchMemory* memory) {
  const auto batch_start = Clock::now();
  std::vector<Piece> direct, cached;
  plan_pieces(epoch, times, inputs, targets, memory, direct, cached);
  std::vector<Piece> kept, alone;
  choose_reads_alone(cached, batch, kept, alone);
  direct.insert(direct.end(), alone.begin(), alone.end());
  read_pieces(kept, direct, memory);
  const uint64_t batch_ns = elapsed_ns(batch_start);
  shared_->batch_ns += batch_ns;
  if (memory) memory->assemble_ns = batch_ns;
}

void Loader::plan_pieces(uint64_t epoch, std::span<const uint64_t> times, void* inputs_ptr,
                         void* targets_ptr, BatchMemory* memory, std::vector<Piece>& direct,
                         std::vector<Piece>& cached) const {
  auto* inputs = static_cast<uint8_t*>(inputs_ptr);
  auto* targets = static_cast<uint8_t*>(targets_ptr);
  const size_t plane = lat_ * lon_;
  const size_t step_channels = input_sources_.size();
  const size_t input_channels = input_channels_.size(), target_channels = target_channels_.size();
  const OutputType in_type = assembled_input_type(), out_type = assembled_target_type();
  const size_t in_size = output_size(in_type), out_size = output_size(out_type);
  auto add = [&](const Source& source, uint64_t time, std::array<uint64_t, 2> origin, uint8_t* dst,
                 OutputType out, const Channel& channel) {
    // Deferred, the consumer normalizes (unpacking too) from the raw values; labels are
    // never normalized, their missing values become kIgnoreLabel here.
    const Normalization normalization =
        channel.host_normalization(spec_.defer_normalization && !source.label);
    Piece piece{source.array, time, source.level, origin[0], origin[1], dst, out, normalization};
    (cached_[source.array] ? cached : direct).push_back(piece);
  };
  for (size_t i = 0; i < times.size(); ++i) {
    const auto origin = crop_origin(epoch, times[i]);
    for (uint64_t h = 0; h < spec_.history; ++h) {
      const uint64_t time = times[i] - (spec_.history - 1 - h) * spec_.history_step;
      for (const auto& source : input_sources_) {
        const size_t c = h * step_channels + source.channel;
        add(source, time, origin, inputs + (i * input_channels + c) * plane * in_size, in_type,
            input_channels_[c]);
      }
    }
    for (size_t k = 0; k < statics_.size(); ++k) {
      Piece piece;
      piece.array = statics_[k].array;
      piece.lat_start = origin[0];
      piece.lon_start = origin[1];
      piece.dst = inputs + (i * input_channels + statics_[k].channel) * plane * in_size;
      piece.out = in_type;
      piece.static_plane = static_cast<int64_t>(k);
      direct.push_back(piece);
    }
    for (size_t l = 0; l < leads_.size(); ++l) {
      for (const auto& source : target_sources_) {
        const size_t c = l * target_sources_.size() + source.channel;
        add(source, times[i] + leads_[l], origin,
            targets + (i * target_channels + c) * plane * out_size, out_type, target_channels_[c]);
      }
    }
  }
  // Chunks handed over compressed: their entries, in the order of the pieces.
  if (memory) {
    memory->compressed_count = 0;
    if (pass_enabled_) {
      const bool locate = locate_enabled_;  // one answer for the whole batch
      for (Piece& piece : direct) {
        if (!passable_[piece.array]) continue;
        const size_t index = memory->compressed_count++;
        if (memory->compressed.size() < memory->compressed_count) memory->compressed.emplace_back();
        CompressedChunk& chunk = memory->compressed[index];
        chunk.target = piece.dst >= targets && piece.dst < targets + memory->targets.size();
        chunk.offset = static_cast<uint64_t>(piece.dst - (chunk.target ? targets : inputs));
        chunk.decoded_size = plane * 4;
        chunk.array = static_cast<uint32_t>(piece.array);
        piece.compressed = static_cast<int64_t>(index);
        piece.located = locate && local_[piece.array];
      }
    }
  }
}

// A piece read alone: raw float32 decodes straight into the batch; anything else decodes into
// the thread's scratch and is cast and normalized into the batch (stream_values). Handed over
// compressed, it is only read.
void Loader::read_direct_piece(const Piece& piece, BatchMemory* memory) {
  const size_t plane = lat_ * lon_;
  if (piece.static_plane >= 0) {  // the sample's crop of a static plane, ready in the batch's type
    const auto start = Clock::now();
    const Bytes& values = statics_[static_cast<size_t>(piece.static_plane)].values;
    const size_t out_size = output_size(piece.out), row = lon_ * out_size;
    const uint8_t* src = values.data() + (piece.lat_start * full_lon_ + piece.lon_start) * out_size;
    if (lon_ == full_lon_) {
      std::memcpy(piece.dst, src, lat_ * row);
    } else {
      for (uint64_t y = 0; y < lat_; ++y)
        std::memcpy(piece.dst + y * row, src + y * full_lon_ * out_size, row);
    }
    shared_->assemble_ns += elapsed_ns(start);
    return;
  }
  const zarr::Array& array = arrays_[piece.array];
  const DataType type = array.metadata().dtype;
  if (piece.compressed >= 0) {  // read only: the consumer decodes
    CompressedChunk& chunk = memory->compressed[static_cast<size_t>(piece.compressed)];
    IoCounters& io = thread_io_counters();
    const IoCounters io_before = io;
    const auto start = Clock::now();
    // The read chunk holds exactly this plane: its index is (time, level, 0, 0).
    std::vector<uint64_t> index = {piece.time};
    if (piece.level) index.push_back(*piece.level);
    index.push_back(0);
    index.push_back(0);
    bool found = false;
    chunk.file.clear();
    chunk.file_offset = 0;
    if (piece.located) {
      zarr::Array::StoredLocation location;
      found = array.locate_stored(index, location, &chunk.key);
      chunk.data.clear();
      if (found) {
        chunk.file = std::move(location.path);
        chunk.file_offset = location.offset;
      }
      chunk.stored_size = found ? location.size : 0;
    } else {
      found = array.read_stored(index, chunk.data, &chunk.key);
      chunk.stored_size = found ? chunk.data.size() : 0;
    }
    const uint64_t io_ns = io.read_ns - io_before.read_ns;
    shared_->read_ns += std::max(io_ns, elapsed_ns(start));
    // Located bytes are read by the consumer, not here.
    shared_->bytes_read += found && !piece.located ? chunk.stored_size : 0;
    if (found) {
      ++shared_->chunks_passed;
      if (piece.located) ++shared_->chunks_located;
      return;
    }
    chunk.data.clear();
    chunk.decoded_size = 0;  // absent: the fill value, written below like any plane
  }
  zarr::Selection selection{{piece.time, piece.time + 1, 1}};
  if (piece.level) selection.push_back({*piece.level, *piece.level + 1, 1});
  selection.push_back({piece.lat_start, piece.lat_start + lat_, 1});
  selection.push_back({piece.lon_start, piece.lon_start + lon_, 1});
  IoCounters& io = thread_io_counters();
  const IoCounters io_before = io;
  const auto start = Clock::now();
  uint64_t decode_end_ns = 0;
  if (type.id == DataTypeId::kFloat32 && piece.out == OutputType::kFloat32 &&
      piece.normalization.identity()) {
    array.read(selection, piece.dst);  // raw values: decoded straight into the batch
    decode_end_ns = elapsed_ns(start);
  } else {
    // Decoded into this thread's scratch (reused, so mostly in cache), then cast and normalized
    // into the batch with streaming stores: the batch's lines are written once and never read
    // here, where decoding in place and normalizing there read and wrote each line twice.
    ScratchBuffer scratch(plane * type.size());
    array.read(selection, scratch.data());
    decode_end_ns = elapsed_ns(start);
    stream_values(scratch.data(), type, piece.dst, piece.out, plane, piece.normalization);
  }
  const uint64_t total_ns = elapsed_ns(start);
  const uint64_t io_ns = io.read_ns - io_before.read_ns;
  shared_->read_ns += io_ns;
  shared_->decode_ns += decode_end_ns > io_ns ? decode_end_ns - io_ns : 0;
  shared_->assemble_ns += total_ns - decode_end_ns;
  shared_->bytes_read += io.read_bytes - io_before.read_bytes;
  shared_->bytes_decoded += plane * type.size();
}

std::array<Loader::ChunkSpan, 2> Loader::chunk_spans(const Piece& piece) const {
  const auto& chunk = read_chunks_[piece.array];
  const size_t r = chunk.size();
  return {ChunkSpan{piece.lat_start / chunk[r - 2], (piece.lat_start + lat_ - 1) / chunk[r - 2]},
          ChunkSpan{piece.lon_start / chunk[r - 1], (piece.lon_start + lon_ - 1) / chunk[r - 1]}};
}

ChunkKey Loader::chunk_key(const Piece& piece, uint64_t y, uint64_t x) const {
  const auto& chunk = read_chunks_[piece.array];
  ChunkKey key;
  key.array = static_cast<uint32_t>(piece.array);
  key.chunk.push_back(piece.time / chunk[0]);
  if (chunk.size() == 4) key.chunk.push_back(piece.level.value_or(0) / chunk[1]);
  key.chunk.push_back(y);
  key.chunk.push_back(x);
  return key;
}

bool Loader::needed_only_as_neighbor(const Piece& piece, std::optional<uint64_t> batch) const {
  if (!batch || own_batches_.empty()) return false;
  const uint64_t steps = read_chunks_[piece.array][0];
  const uint64_t begin = piece.time / steps * steps;
  const uint64_t end = std::min<uint64_t>(begin + steps, own_batches_.size());
  uint64_t first = UINT64_MAX, last = 0;
  for (uint64_t t = begin; t < end; ++t) {
    first = std::min(first, own_batches_[t].first);
    last = std::max(last, own_batches_[t].second);
  }
  const bool own_soon = first <= *batch || first - *batch <= horizon_batches_;
  return first == UINT64_MAX || !own_soon || *batch > last;
}

uint64_t Loader::planes_to_read_alone(const Piece& piece) const {
  const auto& chunk = read_chunks_[piece.array];
  uint64_t plane = piece.time % chunk[0];
  if (chunk.size() == 4) plane = plane * chunk[1] + piece.level.value_or(0) % chunk[1];
  return plane + 1;
}

void Loader::choose_reads_alone(std::span<const Piece> pieces, std::optional<uint64_t> batch,
                                std::vector<Piece>& kept, std::vector<Piece>& alone) {
  // Reading alone costs planes_to_read_alone once per piece: it is chosen only where the codecs
  // can stop early and those costs add up to less than the chunk (a target step or two past a
  // chunk's end, not a history reaching back into the previous one).
  std::vector<bool> candidate(pieces.size());
  std::unordered_map<ChunkKey, uint64_t, ChunkKeyHash> alone_planes;  // planes read per chunk
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Piece& piece = pieces[p];
    bool ok = prefix_readable_[piece.array] && needed_only_as_neighbor(piece, batch);
    const auto [ys, xs] = chunk_spans(piece);
    for (uint64_t y = ys.first; ok && y <= ys.last; ++y) {
      for (uint64_t x = xs.first; ok && x <= xs.last; ++x)
        ok = !cache_.contains(chunk_key(piece, y, x));
    }
    candidate[p] = ok;
    if (!ok) continue;
    for (uint64_t y = ys.first; y <= ys.last; ++y) {
      for (uint64_t x = xs.first; x <= xs.last; ++x)
        alone_planes[chunk_key(piece, y, x)] += planes_to_read_alone(piece);
    }
  }
  kept.reserve(pieces.size());
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Piece& piece = pieces[p];
    bool read_alone = candidate[p];
    const uint64_t planes = planes_per_read_chunk(piece.array);
    const auto [ys, xs] = chunk_spans(piece);
    for (uint64_t y = ys.first; read_alone && y <= ys.last; ++y) {
      for (uint64_t x = xs.first; read_alone && x <= xs.last; ++x)
        read_alone = CodecChain::prefix_worth_it(alone_planes[chunk_key(piece, y, x)], planes);
    }
    (read_alone ? alone : kept).push_back(piece);
  }
  shared_->planes_read_alone += alone.size();
}

// The box of a read chunk in its array: [start, start + count) per dimension.
void Loader::chunk_box(const ChunkKey& key, std::vector<uint64_t>& start,
                       std::vector<uint64_t>& count) const {
  const auto& meta = arrays_[key.array].metadata();
  const auto& chunk = read_chunks_[key.array];
  start.resize(chunk.size());
  count.resize(chunk.size());
  for (size_t d = 0; d < chunk.size(); ++d) {
    start[d] = key.chunk[d] * chunk[d];
    count[d] = std::min(chunk[d], meta.shape[d] - start[d]);
  }
}

// Reads and decodes a whole read chunk into `out` (its size).
void Loader::decode_chunk(const ChunkKey& key, Bytes& out) const {
  std::vector<uint64_t> start, count;
  chunk_box(key, start, count);
  zarr::Selection selection;
  for (size_t d = 0; d < start.size(); ++d) selection.push_back({start[d], start[d] + count[d], 1});
  IoCounters& io = thread_io_counters();
  const IoCounters io_before = io;
  const auto begin = Clock::now();
  arrays_[key.array].read(selection, out.data());
  const uint64_t total_ns = elapsed_ns(begin), io_ns = io.read_ns - io_before.read_ns;
  shared_->read_ns += io_ns;
  shared_->decode_ns += total_ns > io_ns ? total_ns - io_ns : 0;
  shared_->bytes_read += io.read_bytes - io_before.read_bytes;
  shared_->bytes_decoded += out.size();
}

// Scatters a piece from its decoded chunks (cast and normalized on the way).
void Loader::scatter_cached_piece(const Piece& piece, const ChunkMap& chunks) const {
  const auto begin = Clock::now();
  const DataType type = arrays_[piece.array].metadata().dtype;
  const size_t element = type.size(), out_size = output_size(piece.out);
  const auto [ys, xs] = chunk_spans(piece);
  std::vector<uint64_t> start, count;
  for (uint64_t y = ys.first; y <= ys.last; ++y) {
    for (uint64_t x = xs.first; x <= xs.last; ++x) {
      const ChunkKey key = chunk_key(piece, y, x);
      const Bytes& bytes = *chunks.at(key);
      chunk_box(key, start, count);
      const size_t r = start.size();
      // The plane (time, level) inside the chunk, then the rows of the crop it covers.
      uint64_t plane_index = piece.time - start[0];
      if (r == 4) plane_index = plane_index * count[1] + (piece.level.value_or(0) - start[1]);
      const uint64_t rows = count[r - 2], cols = count[r - 1];
      const uint64_t y0 = std::max(piece.lat_start, start[r - 2]);
      const uint64_t y1 = std::min(piece.lat_start + lat_, start[r - 2] + rows);
      const uint64_t x0 = std::max(piece.lon_start, start[r - 1]);
      const uint64_t x1 = std::min(piece.lon_start + lon_, start[r - 1] + cols);
      // Rows that span both the chunk's and the piece's width are one run in both.
      const bool whole_rows = x1 - x0 == cols && cols == lon_;
      const uint64_t run_rows = whole_rows ? y1 - y0 : 1;
      for (uint64_t row = y0; row < y1; row += run_rows) {
        const uint64_t src =
            (plane_index * rows + (row - start[r - 2])) * cols + (x0 - start[r - 1]);
        const uint64_t dst = (row - piece.lat_start) * lon_ + (x0 - piece.lon_start);
        stream_values(bytes.data() + src * element, type, piece.dst + dst * out_size, piece.out,
                      (x1 - x0) * run_rows, piece.normalization);
      }
    }
  }
  shared_->assemble_ns += elapsed_ns(begin);
}

// One batch's reads as one set of tasks on the pool, longest first: the decodes of whole chunks
// missing from the cache, then the pieces read alone, then the pieces whose chunks are all
// cached, then those that wait for a decode. A thread that reaches a waiting piece before its
// chunks are decoded waits for them (claimed earlier, they are being decoded), while the others
// go on with the rest: short tasks fill the time of the last decodes, where a barrier after each
// kind of task left most threads idle at 16 cores (a whole chunk of 10 steps decodes for ~10 ms).
void Loader::read_pieces(std::span<const Piece> cached, std::span<const Piece> direct,
                         BatchMemory* memory) {
  // The batch's distinct chunks, from the cache or missing; each cached piece is ready now or
  // waits for the decodes of the missing chunks it needs.
  ChunkMap chunks;
  std::vector<ChunkKey> missing;
  std::unordered_map<ChunkKey, size_t, ChunkKeyHash> missing_index;
  std::vector<const Piece*> ready;
  std::vector<std::pair<const Piece*, std::vector<size_t>>> waiting;
  for (const Piece& piece : cached) {
    std::vector<size_t> needs;
    const auto [ys, xs] = chunk_spans(piece);
    for (uint64_t y = ys.first; y <= ys.last; ++y) {
      for (uint64_t x = xs.first; x <= xs.last; ++x) {
        ChunkKey key = chunk_key(piece, y, x);
        if (auto known = missing_index.find(key); known != missing_index.end()) {
          needs.push_back(known->second);
          continue;
        }
        if (chunks.count(key)) continue;  // cached
        auto found = cache_.find(key);
        if (found) {
          ++shared_->cache_hits;
        } else {
          needs.push_back(missing.size());
          missing_index.emplace(key, missing.size());
          missing.push_back(key);
        }
        chunks.emplace(std::move(key), std::move(found));
      }
    }
    if (needs.empty()) {
      ready.push_back(&piece);
    } else {
      waiting.emplace_back(&piece, std::move(needs));
    }
  }
  std::vector<std::shared_ptr<Bytes>> decoded(missing.size());
  for (size_t m = 0; m < missing.size(); ++m) {
    std::vector<uint64_t> start, count;
    chunk_box(missing[m], start, count);
    const size_t size = product(count) * arrays_[missing[m].array].metadata().dtype.size();
    if (!spare_chunks_.empty()) {
      decoded[m] = std::move(spare_chunks_.back());
      spare_chunks_.pop_back();
      decoded[m]->resize(size);
    } else {
      decoded[m] = std::make_shared<Bytes>(size);
    }
    chunks[missing[m]] = decoded[m];  // filled by its decode task
  }

  enum : uint8_t { kPending = 0, kDecoded = 1, kFailed = 2 };
  std::unique_ptr<std::atomic<uint8_t>[]> state(new std::atomic<uint8_t>[missing.size()]());
  const size_t decodes = missing.size(), alone = direct.size(), now = ready.size();
  // Once a task fails the pool skips the tasks not yet started, decodes among them, so a failure
  // marks every decode still pending failed: a task waiting on one must not wait forever.
  auto fail_pending = [&] {
    for (size_t m = 0; m < decodes; ++m) {
      uint8_t pending = kPending;
      if (state[m].compare_exchange_strong(pending, kFailed, std::memory_order_acq_rel)) {
        state[m].notify_all();
      }
    }
  };
  pool_->parallel_for(decodes + alone + now + waiting.size(), [&](size_t task) {
    MappedFiles::RereadScope rereading;  // every epoch reads these files again
    try {
      if (task < decodes) {
        decode_chunk(missing[task], *decoded[task]);
        state[task].store(kDecoded, std::memory_order_release);
        state[task].notify_all();
        return;
      }
      task -= decodes;
      if (task < alone) return read_direct_piece(direct[task], memory);
      task -= alone;
      if (task < now) return scatter_cached_piece(*ready[task], chunks);
      const auto& [piece, needs] = waiting[task - now];
      for (size_t m : needs) {
        state[m].wait(kPending, std::memory_order_acquire);
        if (state[m].load(std::memory_order_acquire) == kFailed) return;  // an error is raised
      }
      scatter_cached_piece(*piece, chunks);
    } catch (...) {
      fail_pending();
      throw;
    }
  });
  shared_->chunks_decoded += missing.size();
  for (size_t m = 0; m < missing.size(); ++m) cache_.insert(missing[m], decoded[m]);
  shared_->cache_bytes = cache_.bytes();

  // Recycle the buffers nobody holds any more (decoded for this batch only, or evicted).
  chunks.clear();
  decoded.clear();  // what is left is held by the cache or was evicted (or refused) by it
  auto evicted = cache_.take_evicted();
  const size_t keep = std::max<size_t>(missing.size(), 4);
  for (auto& chunk : evicted) {
    if (chunk && chunk.use_count() == 1 && spare_chunks_.size() < keep) {
      spare_chunks_.push_back(std::move(chunk));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Prefetch

// A batch whose reads run on the pool while the prefetch thread prepares the next one.
struct Loader::Flight {
  Shared::Ready ready;
  std::vector<Piece> pieces;
  Clock::time_point start;
  ThreadPool::Work work;  // last: destroyed (waited for) first
};

void Loader::produce(uint64_t epoch, uint64_t first_batch) {
  Shared& shared = *shared_;
  // Running: the thread's start-up is done. Said before taking a pass, which waits while a fork
  // is pending (start_producer holds one until this).
  {
    std::lock_guard lock(shared.mutex);
    shared.producer_started = true;
  }
  shared.cv.notify_all();
  {
    const CancelScope cancellable(&shared.cancel_reads);  // carried into the pool's tasks
    produce_batches(epoch, first_batch);
  }
  // Parked, holding no pass, until stop_producer() lets it go while holding one: the thread's
  // exit (the C library's and a sanitizer's frees) is thus never under way across a fork.
  std::unique_lock lock(shared.mutex);
  shared.producer_parked = true;
  shared.cv.notify_all();
  shared.cv.wait(lock, [&] { return shared.producer_may_exit; });
}

void Loader::produce_batches(uint64_t epoch, uint64_t first_batch) {
  Shared& shared = *shared_;
  ForkGate::Pass pass;  // given up only while waiting for a buffer (and inside the pool's waits)
  // Where no array goes through the decoded-chunk cache, each batch's reads depend on nothing of
  // the others': the next batch's reads are queued before the last ones of this batch finish, so
  // the threads that finish early start on them instead of waiting (on many cores a batch's last
  // reads otherwise leave most threads idle for a while).
  // ZFEED_OVERLAP_BATCHES=0 turns this off (for comparisons).
  static const bool overlap_allowed = [] {
    const char* value = std::getenv("ZFEED_OVERLAP_BATCHES");
    return !(value && std::string_view(value) == "0");
  }();
  const bool overlap =
      overlap_allowed && std::none_of(cached_.begin(), cached_.end(), [](bool c) { return c; });
  std::unique_ptr<Flight> flight;
  Clock::time_point last_landed{};
  // Waits for the flight's reads and hands its batch over.
  enum class Landed { kGoOn, kFailed, kStopped };
  // Hands a batch to the consumer (or its buffer back, where the loader is stopping).
  auto hand_over = [&](Shared::Ready ready) -> Landed {
    const bool failed = static_cast<bool>(ready.error);
    {
      std::lock_guard lock(shared.mutex);
      if (shared.stop) {
        shared.free.push_back(std::move(ready.memory));
        return Landed::kStopped;
      }
      shared.ready.push_back(std::move(ready));
    }
    shared.cv.notify_all();
    return failed ? Landed::kFailed : Landed::kGoOn;
  };
  auto land = [&]() -> Landed {
    std::unique_ptr<Flight> landing = std::move(flight);
    try {
      pool_->wait(landing->work);
    } catch (...) {
      landing->ready.error = std::current_exception();
    }
    // A batch's time counts from when the previous one landed where they overlapped.
    const uint64_t batch_ns = elapsed_ns(std::max(landing->start, last_landed));
    last_landed = Clock::now();
    shared.batch_ns += batch_ns;
    landing->ready.memory->assemble_ns = batch_ns;
    return hand_over(std::move(landing->ready));
  };
  // Stopping with a batch in flight: its reads finish (they use its buffer), the buffer returns.
  auto abandon = [&] {
    if (!flight) return;
    try {
      pool_->wait(flight->work);
    } catch (...) {
    }
    std::lock_guard lock(shared.mutex);
    shared.free.push_back(std::move(flight->ready.memory));
    flight.reset();
  };
  try {
    const auto indices = sampler_.epoch_indices(epoch);
    plan_own_batches(indices);
    const uint64_t batches = sampler_.batches_per_epoch();
    const uint64_t batch_size = spec_.batch_size;
    Landed landed = Landed::kGoOn;
    for (uint64_t b = first_batch; b < batches && landed == Landed::kGoOn; ++b) {
      if (flight) {
        // No buffer free for the next batch: hand this one over first, so that the consumer,
        // which may be waiting for it, can give one back.
        bool none_free = false;
        {
          std::lock_guard lock(shared.mutex);
          none_free = shared.free.empty();
        }
        if (none_free && (landed = land()) != Landed::kGoOn) break;
      }
      Shared::Ready ready;
      ready.index = b;
      {
        ForkGate::Release release;
        std::unique_lock lock(shared.mutex);
        const auto idle_start = Clock::now();
        shared.producer_waiting = true;
        shared.cv.notify_all();
        shared.cv.wait(lock, [&] { return shared.stop || !shared.free.empty(); });
        shared.producer_waiting = false;
        shared.idle_ns += elapsed_ns(idle_start);
        if (shared.stop) {
          lock.unlock();
          return abandon();
        }
        ready.memory = std::move(shared.free.back());
        shared.free.pop_back();
      }
      const uint64_t begin = b * batch_size;
      const uint64_t end = std::min<uint64_t>(indices.size(), begin + batch_size);
      ready.size = end - begin;
      std::vector<uint64_t> times(ready.size);
      for (uint64_t i = 0; i < ready.size; ++i) {
        times[i] = sample_time(indices[begin + i]);
        ready.memory->times[i] = static_cast<int64_t>(times[i]);
        const auto origin = crop_origin(epoch, times[i]);
        ready.memory->crops[2 * i] = static_cast<int64_t>(origin[0]);
        ready.memory->crops[2 * i + 1] = static_cast<int64_t>(origin[1]);
      }
      if (overlap) {
        auto next = std::make_unique<Flight>();
        next->ready = std::move(ready);
        next->start = Clock::now();
        BatchMemory* memory = next->ready.memory.get();
        try {
          std::vector<Piece> cached;  // none here
          plan_pieces(epoch, times, memory->inputs.data(), memory->targets.data(), memory,
                      next->pieces, cached);
          next->work = pool_->start(next->pieces.size(), [this, batch = next.get()](size_t i) {
            MappedFiles::RereadScope rereading;
            read_direct_piece(batch->pieces[i], batch->ready.memory.get());
          });
        } catch (...) {
          next->ready.error = std::current_exception();
        }
        if (flight) landed = land();
        flight = std::move(next);
        continue;
      }
      try {
        assemble_batch(epoch, b, times, ready.memory->inputs.data(), ready.memory->targets.data(),
                       ready.memory.get());
      } catch (...) {
        ready.error = std::current_exception();
      }
      landed = hand_over(std::move(ready));
    }
    // The last batch in flight lands; after a failure or a stop, the next one is dropped.
    if (flight && landed == Landed::kGoOn) landed = land();
    if (landed == Landed::kStopped) return abandon();
    abandon();
  } catch (...) {
    abandon();
    std::lock_guard lock(shared.mutex);
    Shared::Ready ready;
    ready.error = std::current_exception();
    shared.ready.push_back(std::move(ready));
  }
  {
    std::lock_guard lock(shared.mutex);
    shared.producer_done = true;
  }
  shared.cv.notify_all();
}

void Loader::plan_own_batches(std::span<const uint64_t> indices) {
  own_batches_.clear();
  if (sampler_.options().group_size <= 1) return;
  own_batches_.assign(time_extent_, {UINT64_MAX, 0});
  for (uint64_t p = 0; p < indices.size(); ++p) {
    auto& [first, last] = own_batches_[sample_time(indices[p])];
    const uint64_t b = p / spec_.batch_size;
    first = std::min(first, b);
    last = std::max(last, b);
  }
}

void Loader::start_producer() {
  if (producer_ && producer_pid_ != ::getpid()) {
    // A forked child: the prefetch thread stayed in the parent. Drop its handle without a join
    // and whatever it had prepared (its batch in progress is lost with it), then start afresh.
    (void)producer_.release();
    std::lock_guard lock(shared_->mutex);
    for (auto& ready : shared_->ready) {
      if (ready.memory) shared_->free.push_back(std::move(ready.memory));
    }
    shared_->ready.clear();
    if (shared_->free.empty()) shared_->free.push_back(shared_->allocate());
  }
  if (producer_) return;
  // Held until the thread runs: a thread's start-up (the C library's and a sanitizer's
  // allocations) is outside the fork gate, so a fork() from elsewhere waits for it.
  ForkGate::Pass pass;
  {
    std::lock_guard lock(shared_->mutex);
    shared_->stop = false;
    shared_->cancel_reads = false;
    shared_->producer_started = false;
    shared_->producer_parked = false;
    shared_->producer_may_exit = false;
    shared_->producer_done = false;
    shared_->producer_waiting = false;
  }
  producer_pid_ = ::getpid();
  producer_ = std::make_unique<std::thread>(
      [this, epoch = epoch_, first = position_] { produce(epoch, first); });
  std::unique_lock lock(shared_->mutex);
  shared_->cv.wait(lock, [&] { return shared_->producer_started; });
}

void Loader::stop_producer() {
  if (!producer_) return;
  if (producer_pid_ != ::getpid()) {
    (void)producer_.release();  // a forked child: the thread is not ours to join
  } else {
    {
      std::unique_lock lock(shared_->mutex);
      shared_->stop = true;
      shared_->cancel_reads = true;
      shared_->cv.notify_all();
      shared_->cv.wait(lock, [&] { return shared_->producer_parked; });
    }
    // The thread takes no pass any more: hold one while it exits, so that no fork overlaps that.
    ForkGate::Pass pass;
    {
      std::lock_guard lock(shared_->mutex);
      shared_->producer_may_exit = true;
    }
    shared_->cv.notify_all();
    producer_->join();
    producer_.reset();
  }
  std::lock_guard lock(shared_->mutex);
  for (auto& ready : shared_->ready) {
    if (ready.memory) shared_->free.push_back(std::move(ready.memory));
  }
  shared_->ready.clear();
  shared_->stop = false;
}

std::optional<Batch> Loader::next(const std::function<bool()>& interrupted) {
  check_background_stage(!producer_);
  if (position_ >= batches_per_epoch()) {
    stop_producer();
    finished_ = true;
    return std::nullopt;
  }
  start_producer();
  Shared& shared = *shared_;
  const auto wait_start = Clock::now();
  constexpr auto kInterruptCheckPeriod = std::chrono::milliseconds(100);
  auto next_check = wait_start + kInterruptCheckPeriod;
  Shared::Ready ready;
  {
    std::unique_lock lock(shared.mutex);
    for (;;) {
      if (!shared.ready.empty() || shared.producer_done) break;
      // The consumer holds every buffer and the prefetch thread needs one: lend one more rather
      // than wait forever (the memory bound assumes the consumer drops its batches).
      if (shared.producer_waiting && shared.free.empty()) {
        shared.free.push_back(shared.allocate());
        shared.cv.notify_all();
      }
      if (!interrupted) {
        shared.cv.wait(lock);
      } else if (Clock::now() < next_check) {
        shared.cv.wait_until(lock, next_check);
      } else {
        lock.unlock();  // the check may take the GIL, which a thread waiting for this lock holds
        const bool stop = interrupted();
        lock.lock();
        if (stop) {
          shared.wait_ns += elapsed_ns(wait_start);
          throw InterruptedError("loader: interrupted while waiting for batch " +
                                 std::to_string(position_) + " of epoch " + std::to_string(epoch_));
        }
        next_check = Clock::now() + kInterruptCheckPeriod;
      }
    }
    if (shared.ready.empty()) throw Error("loader: the prefetch thread ended before the epoch did");
    ready = std::move(shared.ready.front());
    shared.ready.pop_front();
  }
  shared.wait_ns += elapsed_ns(wait_start);
  if (ready.error) {
    if (ready.memory) shared.give_back(ready.memory.release());
    stop_producer();  // the next call starts again at this batch
    std::rethrow_exception(ready.error);
  }
  if (ready.index != position_) throw Error("loader: internal: batch out of order");
  ++position_;
  ++shared.batches;
  shared.samples += ready.size;
  const auto in = input_shape(), out = target_shape();
  shared.bytes_delivered +=
      ready.size * (in[1] * in[2] * in[3] * output_size(assembled_input_type()) +
                    out[1] * out[2] * out[3] * output_size(assembled_target_type()));
  Batch batch;
  batch.epoch = epoch_;
  batch.index = ready.index;
  batch.size = ready.size;
  std::shared_ptr<Shared> owner = shared_;
  batch.memory = std::shared_ptr<BatchMemory>(
      ready.memory.release(), [owner](BatchMemory* memory) { owner->give_back(memory); });
  return batch;
}

void Loader::set_epoch(uint64_t epoch) {
  if (epoch == epoch_ && !finished_) return;
  stop_producer();
  epoch_ = epoch;
  position_ = 0;
  finished_ = false;
}

void Loader::begin_iteration() {
  if (!finished_) return;
  stop_producer();
  ++epoch_;
  position_ = 0;
  finished_ = false;
}

// ---------------------------------------------------------------------------------------------
// Time range

void Loader::resolve_time_range() {
  const auto extent = static_cast<int64_t>(time_extent_);
  // As Python's slice.indices with step 1: negative ends count from the end, then clamp.
  auto resolve = [&](const std::optional<int64_t>& end, int64_t otherwise) {
    if (!end) return otherwise;
    const int64_t at = *end < 0 ? *end + extent : *end;
    return std::clamp<int64_t>(at, 0, extent);
  };
  const bool ranged = spec_.time_range[0] || spec_.time_range[1];
  // A partial staged copy: its time steps are the axis's ends (a range's absent end is the
  // copy's), and the loader never reads others (they read as errors).
  int64_t held_start = 0, held_stop = extent;
  if (store_holds_) {
    held_start = static_cast<int64_t>(std::min<uint64_t>(store_holds_->start, time_extent_));
    held_stop = static_cast<int64_t>(std::min<uint64_t>(store_holds_->stop, time_extent_));
  }
  const int64_t start = resolve(spec_.time_range[0], held_start);
  const int64_t stop = std::max(start, resolve(spec_.time_range[1], held_stop));
  if (store_holds_) {
    if (start < held_start || stop > held_stop) {
      throw Error("loader: time_range [" + std::to_string(start) + ", " + std::to_string(stop) +
                  ") reaches past what the partial staged copy " + spec_.store->url() + " holds (" +
                  store_holds_->time_dim + " steps [" + std::to_string(held_start) + ", " +
                  std::to_string(held_stop) + ")): stage those steps, or read the source");
    }
  }
  time_start_ = static_cast<uint64_t>(start);
  time_stop_ = static_cast<uint64_t>(stop);
  // The history's reach + 1 + lead, saturated: huge values from a spec must not wrap around to a
  // small span.
  const uint64_t span = back_ >= UINT64_MAX - 1 || max_lead_ > UINT64_MAX - back_ - 1
                            ? UINT64_MAX
                            : back_ + 1 + max_lead_;
  if (time_stop_ - time_start_ < span) {
    throw Error("loader: no valid samples: " +
                (ranged ? "time_range [" + std::to_string(start) + ", " + std::to_string(stop) +
                              ") holds " + std::to_string(stop - start) + " of the " +
                              std::to_string(extent) + " time steps"
                        : std::to_string(extent) + " time steps") +
                " with history " + std::to_string(spec_.history) +
                (spec_.history_step > 1 ? " every " + std::to_string(spec_.history_step) + " steps"
                                        : std::string()) +
                " and lead " + std::to_string(max_lead_) + " (a sample spans " +
                (span == UINT64_MAX ? std::string("more than the axis") : std::to_string(span)) +
                " time steps)");
  }
  if (spec_.nodes > 1) {
    // Contiguous blocks of equal count: node k's samples are [k * per_node, (k + 1) * per_node)
    // of the range's, so its time steps are those samples' reach.
    const uint64_t samples = time_stop_ - time_start_ - span + 1;
    const uint64_t per_node = samples / spec_.nodes;
    if (per_node == 0) {
      throw Error("loader: " + std::to_string(samples) + " samples cannot be split among " +
                  std::to_string(spec_.nodes) + " nodes");
    }
    time_start_ += spec_.node * per_node;
    time_stop_ = time_start_ + per_node - 1 + span;
  }
}

// A copy made on a thread of the loader's (LoaderSpec::stage_in_background).
struct Loader::BackgroundStage {
  std::shared_ptr<Store> source;
  std::atomic<bool> stop{false};
  // Taken by the thread only while it holds a fork pass, so a forked child finds it free.
  std::mutex mutex;
  std::condition_variable cv;
  bool started = false, done = false;  // under mutex
  // Where the finished thread parks until end() lets it exit.
  std::mutex park_mutex;
  std::condition_variable park_cv;
  bool may_exit = false;         // under park_mutex
  zarr::StageProgress progress;  // the latest
  std::optional<zarr::StageResult> result;
  std::exception_ptr error;
  std::unique_ptr<std::thread> thread;
  int pid = 0;  // the process that started the thread (a forked child has none)

  ~BackgroundStage() { end(); }

  // Stops the copy where it is running, lets the thread go and joins it (it parks when done, so
  // that its exit never overlaps a fork); in a forked child, where it does not exist, only
  // forgets it.
  void end() {
    if (!thread) return;
    if (pid != ::getpid()) {
      (void)thread.release();
      return;
    }
    stop = true;
    {
      // Until the copy has stopped, hold no pass: a fork meanwhile waits for the copy's threads,
      // which wait for it to end (ForkGate's rule: no pass held across a wait for other work).
      ForkGate::Release for_the_copy;
      std::unique_lock lock(mutex);
      cv.wait(lock, [&] { return done; });
    }
    {
      ForkGate::Pass pass;  // held while the thread exits: no fork meanwhile
      {
        std::lock_guard lock(park_mutex);
        may_exit = true;
      }
      park_cv.notify_all();
      thread->join();
    }
    thread.reset();
  }
};

// Copies what the loader reads (its time span of the arrays along time, the rest whole) to
// spec_.stage_dir, then reads the copy: the arrays are opened again from it. In the background
// (where no complete copy is there yet): reads through to the source meanwhile.
void Loader::stage_and_reopen(size_t reference) {
  zarr::StageOptions options;
  options.progress = spec_.stage_progress;
  options.node = spec_.path;
  if (time_start_ != 0 || time_stop_ != time_extent_) {
    const auto& meta = arrays_[reference].metadata();
    if (!meta.dimension_names || !(*meta.dimension_names)[0]) {
      throw Error("loader: staging time steps [" + std::to_string(time_start_) + ", " +
                  std::to_string(time_stop_) + ") needs the time dimension's name, and '" +
                  array_names_[reference] + "' has no dimension names");
    }
    options.time_range = {time_start_, time_stop_};
    options.time_dim = *(*meta.dimension_names)[0];
  }
  spec_.stage_progress = nullptr;  // not needed again
  if (spec_.stage_in_background &&
      !zarr::stage_is_complete(spec_.store, spec_.stage_dir, options)) {
    start_background_stage(std::move(options));
    return;
  }
  // The store's whole hierarchy is staged (the loader's group may be part of it).
  options.stop = std::move(spec_.stage_stop);
  staged_ = zarr::stage(spec_.store, spec_.stage_dir, options);
  if (staged_->stopped) {
    throw Error("loader: staging " + spec_.store->url() + " to " + spec_.stage_dir +
                " was stopped before it was done (the next loader staging there goes on from "
                "where it stopped)");
  }
  spec_.store = open_store(spec_.stage_dir);
  pool_ = &ThreadPool::for_reads(spec_.store->read_concurrency());
  reopen_arrays();
}

void Loader::reopen_arrays() {
  for (size_t a = 0; a < arrays_.size(); ++a) {
    arrays_[a] = zarr::Array::open(spec_.store, zarr::join_key(spec_.path, array_names_[a]));
  }
  find_local_arrays();
}

void Loader::start_background_stage(zarr::StageOptions options) {
  background_ = std::make_unique<BackgroundStage>();
  BackgroundStage* stage = background_.get();  // outlives the thread: end() joins it
  stage->source = spec_.store;
  FileStoreOptions create;
  create.create = true;
  // Values come from the copy once this run has checked or copied them (metadata too: a copy
  // an earlier run left may be of the source as it was).
  auto staged_keys = std::make_shared<StagedKeys>();
  spec_.store =
      make_read_through_store(stage->source, make_file_store(spec_.stage_dir, create), staged_keys);
  reopen_arrays();
  options.on_staged = [staged_keys](std::string_view key) { staged_keys->add(key); };
  // The loader's reads run on the same pool as the copy's, half of whose threads it leaves free.
  options.share_pool = true;
  options.stop = [stage] { return stage->stop.load(); };
  options.progress = [stage, report = std::move(options.progress)](const zarr::StageProgress& p) {
    {
      std::lock_guard lock(stage->mutex);
      stage->progress = p;
    }
    if (report) report(p);
  };
  // Held until the thread runs: its start-up is outside the fork gate (see start_producer).
  ForkGate::Pass pass;
  stage->pid = ::getpid();
  stage->thread = std::make_unique<std::thread>(
      [stage, directory = spec_.stage_dir, options = std::move(options)] {
        {
          std::lock_guard lock(stage->mutex);
          stage->started = true;
        }
        stage->cv.notify_all();
        {
          ForkGate::Pass working;
          std::optional<zarr::StageResult> result;
          std::exception_ptr error;
          try {
            result = zarr::stage(stage->source, directory, options);
          } catch (...) {
            error = std::current_exception();
          }
          {
            std::lock_guard lock(stage->mutex);
            stage->result = std::move(result);
            stage->error = error;
            stage->done = true;
          }
          stage->cv.notify_all();
        }
        // Parked, holding no pass, until end() lets it go while holding one.
        std::unique_lock park(stage->park_mutex);
        stage->park_cv.wait(park, [&] { return stage->may_exit; });
      });
  std::unique_lock lock(stage->mutex);
  stage->cv.wait(lock, [&] { return stage->started; });
}

void Loader::check_background_stage(bool idle) {
  if (!background_) return;
  std::optional<std::string> failure;
  {
    std::lock_guard lock(background_->mutex);
    if (!background_->done) return;
    if (background_->error) {
      try {
        std::rethrow_exception(background_->error);
      } catch (const std::exception& e) {
        failure = e.what();
      } catch (...) {
        failure = "an unknown error";
      }
    }
  }
  if (failure) {
    // Training goes on: the reads through to the source serve every value as they did while
    // the copy ran (a node's disk filling up should not end a run whose data is reachable).
    // The next loader staging there goes on from what the copy holds.
    const std::string message = "loader: staging " + background_->source->url() + " to " +
                                spec_.stage_dir + " in the background failed: " + *failure +
                                "; reading from the source instead";
    std::fprintf(stderr, "zfeed: warning: %s\n", message.c_str());
    background_->end();
    std::lock_guard lock(staged_mutex_);
    staging_failure_ = message;
    background_.reset();
    return;
  }
  if (!idle) return;
  // Done: from now on the copy alone (local files, read on the cores' pool).
  background_->end();
  spec_.store = open_store(spec_.stage_dir);
  pool_ = &ThreadPool::for_reads(spec_.store->read_concurrency());
  reopen_arrays();
  set_locate_compressed(locate_requested_);
  std::lock_guard lock(staged_mutex_);
  staged_ = background_->result;
  background_.reset();
}

std::optional<zarr::StageResult> Loader::staged() const {
  std::lock_guard guard(staged_mutex_);
  if (!background_) return staged_;
  std::lock_guard lock(background_->mutex);
  return background_->result;  // set once the copy is done
}

std::optional<std::string> Loader::staging_failure() const {
  std::lock_guard guard(staged_mutex_);
  return staging_failure_;
}

std::optional<zarr::StageProgress> Loader::staging_progress() const {
  std::lock_guard guard(staged_mutex_);
  if (!background_) return std::nullopt;
  std::lock_guard lock(background_->mutex);
  if (background_->done) return std::nullopt;
  return background_->progress;
}

// ---------------------------------------------------------------------------------------------
// State

Json Loader::state() const {
  const auto& o = sampler_.options();
  return Json{{"version", 1},
              {"epoch", epoch_},
              {"batch", position_},
              {"seed", o.seed},
              {"shuffle", o.shuffle},
              {"rank", o.rank},
              {"world_size", o.world_size},
              {"batch_size", o.batch_size},
              {"drop_last", o.drop_last},
              {"num_samples", o.num_samples},
              {"time_start", time_start_},
              {"group_size", o.group_size},
              {"window", o.window},
              {"node", spec_.node},
              {"nodes", spec_.nodes}};
}

void Loader::restore(const Json& state) {
  if (!state.is_object() || !state.contains("version") || state["version"] != 1) {
    throw Error("loader state: not a zfeed loader state (version 1): " + state.dump());
  }
  SamplerOptions options = sampler_.options();
  auto field = [&](const char* name) -> const Json& {
    if (!state.contains(name)) throw Error(std::string("loader state: missing \"") + name + "\"");
    return state[name];
  };
  auto expect = [&](const char* name, uint64_t mine) {
    const uint64_t saved = json_to_uint64(field(name), std::string("loader state: ") + name);
    if (saved != mine) {
      throw Error(std::string("loader state: saved with ") + name + " " + std::to_string(saved) +
                  ", this loader has " + std::to_string(mine));
    }
  };
  expect("num_samples", options.num_samples);
  if (state.contains("time_start")) expect("time_start", time_start_);  // absent in older states
  expect("batch_size", options.batch_size);
  expect("rank", options.rank);
  expect("world_size", options.world_size);
  if (state.contains("nodes")) {  // absent in older states
    expect("node", spec_.node);
    expect("nodes", spec_.nodes);
  }
  if (!field("drop_last").is_boolean() || field("drop_last").get<bool>() != options.drop_last) {
    throw Error("loader state: saved with a different drop_last");
  }
  if (state.contains("group_size")) {  // the chunk-aware order (absent in older states)
    expect("group_size", options.group_size);
    expect("window", options.window);
  }
  if (!field("shuffle").is_boolean()) throw Error("loader state: shuffle must be true or false");
  options.shuffle = field("shuffle").get<bool>();
  options.seed = json_to_uint64(field("seed"), "loader state: seed");
  const uint64_t epoch = json_to_uint64(field("epoch"), "loader state: epoch");
  const uint64_t batch = json_to_uint64(field("batch"), "loader state: batch");
  if (batch > sampler_.batches_per_epoch()) {
    throw Error("loader state: batch " + std::to_string(batch) + " is past the epoch's " +
                std::to_string(sampler_.batches_per_epoch()) + " batches");
  }
  stop_producer();
  sampler_ = Sampler(options);
  spec_.seed = options.seed;
  spec_.shuffle = options.shuffle;
  epoch_ = epoch;
  position_ = batch;
  finished_ = false;
}

LoaderStats Loader::stats() const {
  const Shared& s = *shared_;
  LoaderStats stats;
  stats.read_ns = s.read_ns;
  stats.decode_ns = s.decode_ns;
  stats.assemble_ns = s.assemble_ns;
  stats.batch_ns = s.batch_ns;
  stats.wait_ns = s.wait_ns;
  stats.idle_ns = s.idle_ns;
  stats.bytes_read = s.bytes_read;
  stats.bytes_decoded = s.bytes_decoded;
  stats.bytes_delivered = s.bytes_delivered;
  stats.chunks_decoded = s.chunks_decoded;
  stats.planes_read_alone = s.planes_read_alone;
  stats.chunks_passed = s.chunks_passed;
  stats.chunks_located = s.chunks_located;
  stats.cache_hits = s.cache_hits;
  stats.cache_bytes = s.cache_bytes;
  stats.batches = s.batches;
  stats.samples = s.samples;
  stats.buffers = s.buffers;
  return stats;
}

}  // namespace zfeed::loader
