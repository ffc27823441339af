#include "zfeed/loader/loader.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>

#include "zfeed/codec/data_type.h"
#include "zfeed/util/error.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/group.h"

namespace zfeed::loader {

namespace {

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
  if (value.contains("mean") && !value["mean"].is_null())
    spec.mean = json_numbers(value["mean"], what + "mean");
  if (value.contains("std") && !value["std"].is_null())
    spec.std = json_numbers(value["std"], what + "std");
  if (spec.mean.empty() != spec.std.empty())
    throw Error(what + "give both mean and std, or neither");
  return spec;
}

template <typename T>
void convert_plain(const uint8_t* src, float* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, src + i * sizeof(T), sizeof(T));
    dst[i] = static_cast<float>(value);
  }
}

// Casts `count` values of `type` at `src` to float32 at `dst` (src == dst for float32).
void convert_to_float(const uint8_t* src, DataType type, float* dst, size_t count) {
  switch (type.id) {
    case DataTypeId::kBool:
    case DataTypeId::kUInt8:
      return convert_plain<uint8_t>(src, dst, count);
    case DataTypeId::kInt8:
      return convert_plain<int8_t>(src, dst, count);
    case DataTypeId::kInt16:
      return convert_plain<int16_t>(src, dst, count);
    case DataTypeId::kUInt16:
      return convert_plain<uint16_t>(src, dst, count);
    case DataTypeId::kInt32:
      return convert_plain<int32_t>(src, dst, count);
    case DataTypeId::kUInt32:
      return convert_plain<uint32_t>(src, dst, count);
    case DataTypeId::kInt64:
      return convert_plain<int64_t>(src, dst, count);
    case DataTypeId::kUInt64:
      return convert_plain<uint64_t>(src, dst, count);
    case DataTypeId::kFloat64:
      return convert_plain<double>(src, dst, count);
    case DataTypeId::kFloat32:
      if (static_cast<const void*>(src) != static_cast<const void*>(dst)) {
        std::memcpy(dst, src, count * sizeof(float));
      }
      return;
    case DataTypeId::kFloat16:
    case DataTypeId::kBFloat16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = static_cast<float>(type.id == DataTypeId::kFloat16 ? float16_to_double(bits)
                                                                    : bfloat16_to_double(bits));
      }
      return;
    default:
      throw UnsupportedError("loader: cannot cast " + std::string(type.name()) + " to float32");
  }
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
  uint_field("lead", spec.lead);
  uint_field("history", spec.history);
  uint_field("batch_size", spec.batch_size);
  uint_field("seed", spec.seed);
  uint_field("rank", spec.rank);
  uint_field("world_size", spec.world_size);
  uint_field("prefetch", spec.prefetch);
  uint_field("epoch", spec.epoch);
  bool_field("shuffle", spec.shuffle);
  bool_field("drop_last", spec.drop_last);
  bool_field("normalize", spec.normalize);
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
              {"assemble_s", assemble_ns * 1e-9},
              {"wait_s", wait_ns * 1e-9},
              {"prefetch_idle_s", idle_ns * 1e-9},
              {"bytes_decoded", bytes_decoded},
              {"bytes_delivered", bytes_delivered},
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
  bool producer_waiting = false;
  bool producer_done = false;
  size_t input_elements = 0, target_elements = 0, batch_size = 0;

  std::atomic<uint64_t> read_ns{0}, assemble_ns{0}, wait_ns{0}, idle_ns{0}, bytes_decoded{0},
      bytes_delivered{0}, batches{0}, samples{0}, buffers{0};

  std::unique_ptr<BatchMemory> allocate() {
    auto memory = std::make_unique<BatchMemory>();
    memory->inputs.resize(input_elements);
    memory->targets.resize(target_elements);
    memory->times.resize(batch_size);
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
};

// ---------------------------------------------------------------------------------------------
// Construction

Loader::Loader(LoaderSpec spec) : spec_(std::move(spec)), shared_(std::make_shared<Shared>()) {
  if (!spec_.store) throw Error("loader: no store");
  if (spec_.inputs.empty()) throw Error("loader: no input variables");
  if (spec_.history == 0) throw Error("loader: history must be at least 1");
  if (spec_.prefetch == 0) throw Error("loader: prefetch must be at least 1");
  const std::string where = spec_.store->url() + (spec_.path.empty() ? "" : "/" + spec_.path);

  std::vector<std::string> names;
  auto array_of = [&](const std::string& name, const char* role) -> size_t {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return i;
    }
    try {
      arrays_.push_back(zarr::Array::open(spec_.store, zarr::join_key(spec_.path, name)));
    } catch (const NotFoundError&) {
      std::string members;
      try {
        for (const auto& member : zarr::Group::open(spec_.store, spec_.path).members()) {
          members += (members.empty() ? "" : ", ") + member;
        }
      } catch (const Error&) {
      }
      throw NotFoundError("loader: " + std::string(role) + " variable '" + name +
                          "' not found in " + where +
                          (members.empty() ? "" : " (it holds: " + members + ")"));
    } catch (const Error&) {
      rethrow_with_context("loader: " + std::string(role) + " variable '" + name + "'");
    }
    names.push_back(name);
    return arrays_.size() - 1;
  };

  size_t reference = 0;  // the array the others are checked against
  auto resolve = [&](const std::vector<VariableSpec>& variables, const char* role,
                     std::vector<Source>& sources, std::vector<Channel>& channels) {
    for (const auto& variable : variables) {
      const size_t a = array_of(variable.name, role);
      const auto& meta = arrays_[a].metadata();
      const std::string what = std::string("loader: ") + role + " variable '" + variable.name + "'";
      if (meta.rank() != 3 && meta.rank() != 4) {
        throw Error(what + " has shape " + shape_text(meta.shape) +
                    ": expected dims (time, lat, lon) or (time, level, lat, lon)");
      }
      if (meta.dtype.is_complex())
        throw UnsupportedError(what + " is " + std::string(meta.dtype.name()) +
                               ": complex values cannot be cast to float32");
      const auto& first = arrays_[reference].metadata();
      const size_t r = meta.rank(), r0 = first.rank();
      if (meta.shape[0] != first.shape[0] || meta.shape[r - 2] != first.shape[r0 - 2] ||
          meta.shape[r - 1] != first.shape[r0 - 1]) {
        throw Error(what + " has shape " + shape_text(meta.shape) + " but '" + names[reference] +
                    "' has " + shape_text(first.shape) +
                    ": every variable needs the same time, lat and lon extents");
      }
      std::vector<std::optional<uint64_t>> levels;
      if (r == 3) {
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
      // Statistics: given, else the zfeed_stats attribute, else none.
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
                      " levels");
        }
      }
      if (!per_level_attribute && mean.size() > 1 &&
          (mean.size() != levels.size() || stdev.size() != levels.size())) {
        throw Error(what + ": give one mean and std, or one per selected level (" +
                    std::to_string(levels.size()) + "), got " + std::to_string(mean.size()) +
                    " and " + std::to_string(stdev.size()));
      }
      for (size_t k = 0; k < levels.size(); ++k) {
        Channel channel;
        channel.variable = variable.name;
        channel.level = levels[k];
        if (spec_.normalize && !mean.empty()) {
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
        sources.push_back(Source{a, levels[k], channels.size()});
        channels.push_back(channel);
      }
    }
  };
  std::vector<Channel> step_channels;
  resolve(spec_.inputs, "input", input_sources_, step_channels);
  resolve(spec_.targets, "target", target_sources_, target_channels_);
  for (uint64_t h = 0; h < spec_.history; ++h) {
    for (Channel channel : step_channels) {
      channel.time_offset = static_cast<int64_t>(h) - static_cast<int64_t>(spec_.history - 1);
      input_channels_.push_back(channel);
    }
  }
  for (auto& channel : target_channels_) channel.time_offset = static_cast<int64_t>(spec_.lead);

  const auto& first = arrays_[reference].metadata();
  time_extent_ = first.shape[0];
  lat_ = first.shape[first.rank() - 2];
  lon_ = first.shape[first.rank() - 1];
  if (spec_.crop) {
    const Crop& c = *spec_.crop;
    if (c.lat_size == 0 || c.lon_size == 0 || c.lat_start + c.lat_size > lat_ ||
        c.lon_start + c.lon_size > lon_) {
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
  if (time_extent_ < spec_.history + spec_.lead) {
    throw Error("loader: no valid samples: " + std::to_string(time_extent_) +
                " time steps with history " + std::to_string(spec_.history) + " and lead " +
                std::to_string(spec_.lead));
  }
  SamplerOptions options;
  options.num_samples = time_extent_ - spec_.history - spec_.lead + 1;
  options.batch_size = spec_.batch_size;
  options.shuffle = spec_.shuffle;
  options.seed = spec_.seed;
  options.rank = spec_.rank;
  options.world_size = spec_.world_size;
  options.drop_last = spec_.drop_last;
  sampler_ = Sampler(options);
  epoch_ = spec_.epoch;
  scratch_.resize(arrays_.size());

  auto in = input_shape(), out = target_shape();
  shared_->input_elements = in[0] * in[1] * in[2] * in[3];
  shared_->target_elements = out[0] * out[1] * out[2] * out[3];
  shared_->batch_size = spec_.batch_size;
  for (uint64_t i = 0; i < spec_.prefetch + 1; ++i) shared_->free.push_back(shared_->allocate());
}

Loader::~Loader() { stop_producer(); }

std::array<uint64_t, 4> Loader::input_shape() const {
  return {spec_.batch_size, input_channels_.size(), lat_, lon_};
}
std::array<uint64_t, 4> Loader::target_shape() const {
  return {spec_.batch_size, target_channels_.size(), lat_, lon_};
}

// ---------------------------------------------------------------------------------------------
// Assembly: read every (sample, variable, level, time) straight into its channel's place, then
// cast and normalize in one pass over the channels.

void Loader::assemble(std::span<const uint64_t> times, float* inputs, float* targets) {
  const size_t plane = lat_ * lon_;
  const size_t step_channels = input_sources_.size();
  struct Piece {
    float* dst;
    uint8_t* src;  // where read_many writes: dst for float32, else the array's scratch
    const Channel* channel;
  };
  std::vector<std::vector<zarr::Selection>> selections(arrays_.size());
  std::vector<std::vector<Piece>> pieces(arrays_.size());

  // Scratch space first (its pointers must not move while pieces are recorded).
  std::vector<size_t> reads(arrays_.size(), 0);
  for (const auto& s : input_sources_) reads[s.array] += times.size() * spec_.history;
  for (const auto& s : target_sources_) reads[s.array] += times.size();
  for (size_t a = 0; a < arrays_.size(); ++a) {
    const DataType type = arrays_[a].metadata().dtype;
    if (type.id != DataTypeId::kFloat32) scratch_[a].resize(reads[a] * plane * type.size());
    selections[a].reserve(reads[a]);
    pieces[a].reserve(reads[a]);
  }
  auto add = [&](const Source& source, uint64_t time, float* dst, const Channel& channel) {
    const zarr::Array& array = arrays_[source.array];
    zarr::Selection selection{{time, time + 1, 1}};
    if (source.level) selection.push_back({*source.level, *source.level + 1, 1});
    selection.push_back({lat_start_, lat_start_ + lat_, 1});
    selection.push_back({lon_start_, lon_start_ + lon_, 1});
    const DataType type = array.metadata().dtype;
    uint8_t* src =
        type.id == DataTypeId::kFloat32
            ? reinterpret_cast<uint8_t*>(dst)
            : scratch_[source.array].data() + pieces[source.array].size() * plane * type.size();
    selections[source.array].push_back(std::move(selection));
    pieces[source.array].push_back(Piece{dst, src, &channel});
  };
  const size_t input_channels = input_channels_.size(), target_channels = target_channels_.size();
  for (size_t i = 0; i < times.size(); ++i) {
    for (uint64_t h = 0; h < spec_.history; ++h) {
      const uint64_t time = times[i] + 1 + h - spec_.history;
      for (const auto& source : input_sources_) {
        const size_t c = h * step_channels + source.channel;
        add(source, time, inputs + (i * input_channels + c) * plane, input_channels_[c]);
      }
    }
    for (const auto& source : target_sources_) {
      add(source, times[i] + spec_.lead, targets + (i * target_channels + source.channel) * plane,
          target_channels_[source.channel]);
    }
  }

  auto start = Clock::now();
  uint64_t decoded = 0;
  for (size_t a = 0; a < arrays_.size(); ++a)
    decoded += pieces[a].size() * plane * arrays_[a].metadata().dtype.size();
  ThreadPool::shared().parallel_for(arrays_.size(), [&](size_t a) {
    if (selections[a].empty()) return;
    std::vector<void*> outs;
    outs.reserve(pieces[a].size());
    for (const auto& piece : pieces[a]) outs.push_back(piece.src);
    arrays_[a].read_many(selections[a], outs);
  });
  shared_->read_ns += elapsed_ns(start);
  shared_->bytes_decoded += decoded;

  start = Clock::now();
  std::vector<std::pair<size_t, size_t>> work;  // (array, piece) needing a cast or normalization
  for (size_t a = 0; a < arrays_.size(); ++a) {
    const bool cast = arrays_[a].metadata().dtype.id != DataTypeId::kFloat32;
    for (size_t p = 0; p < pieces[a].size(); ++p) {
      if (cast || pieces[a][p].channel->normalized) work.emplace_back(a, p);
    }
  }
  ThreadPool::shared().parallel_for(work.size(), [&](size_t w) {
    const auto [a, p] = work[w];
    const Piece& piece = pieces[a][p];
    convert_to_float(piece.src, arrays_[a].metadata().dtype, piece.dst, plane);
    if (piece.channel->normalized) {
      const float mean = piece.channel->mean, stdev = piece.channel->std;
      float* values = piece.dst;
      for (size_t k = 0; k < plane; ++k) values[k] = (values[k] - mean) / stdev;
    }
  });
  shared_->assemble_ns += elapsed_ns(start);
}

// ---------------------------------------------------------------------------------------------
// Prefetch

void Loader::produce(uint64_t epoch, uint64_t first_batch) {
  Shared& shared = *shared_;
  try {
    const auto indices = sampler_.epoch_indices(epoch);
    const uint64_t batches = sampler_.batches_per_epoch();
    const uint64_t batch_size = spec_.batch_size;
    for (uint64_t b = first_batch; b < batches; ++b) {
      Shared::Ready ready;
      ready.index = b;
      {
        std::unique_lock lock(shared.mutex);
        const auto idle_start = Clock::now();
        shared.producer_waiting = true;
        shared.cv.notify_all();
        shared.cv.wait(lock, [&] { return shared.stop || !shared.free.empty(); });
        shared.producer_waiting = false;
        shared.idle_ns += elapsed_ns(idle_start);
        if (shared.stop) return;
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
      }
      try {
        assemble(times, ready.memory->inputs.data(), ready.memory->targets.data());
      } catch (...) {
        ready.error = std::current_exception();
      }
      const bool failed = static_cast<bool>(ready.error);
      {
        std::lock_guard lock(shared.mutex);
        if (shared.stop) {
          shared.free.push_back(std::move(ready.memory));
          return;
        }
        shared.ready.push_back(std::move(ready));
      }
      shared.cv.notify_all();
      if (failed) break;
    }
  } catch (...) {
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

void Loader::start_producer() {
  if (producer_running_) return;
  {
    std::lock_guard lock(shared_->mutex);
    shared_->stop = false;
    shared_->producer_done = false;
    shared_->producer_waiting = false;
  }
  producer_ = std::thread([this, epoch = epoch_, first = position_] { produce(epoch, first); });
  producer_running_ = true;
}

void Loader::stop_producer() {
  if (!producer_running_) return;
  {
    std::lock_guard lock(shared_->mutex);
    shared_->stop = true;
  }
  shared_->cv.notify_all();
  producer_.join();
  producer_running_ = false;
  std::lock_guard lock(shared_->mutex);
  for (auto& ready : shared_->ready) {
    if (ready.memory) shared_->free.push_back(std::move(ready.memory));
  }
  shared_->ready.clear();
  shared_->stop = false;
}

std::optional<Batch> Loader::next() {
  if (position_ >= batches_per_epoch()) {
    stop_producer();
    finished_ = true;
    return std::nullopt;
  }
  start_producer();
  Shared& shared = *shared_;
  const auto wait_start = Clock::now();
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
      shared.cv.wait(lock);
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
      ready.size * (in[1] * in[2] * in[3] + out[1] * out[2] * out[3]) * sizeof(float);
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
  if (epoch == epoch_) return;
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
              {"num_samples", o.num_samples}};
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
  expect("batch_size", options.batch_size);
  expect("rank", options.rank);
  expect("world_size", options.world_size);
  if (!field("drop_last").is_boolean() || field("drop_last").get<bool>() != options.drop_last) {
    throw Error("loader state: saved with a different drop_last");
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
  stats.assemble_ns = s.assemble_ns;
  stats.wait_ns = s.wait_ns;
  stats.idle_ns = s.idle_ns;
  stats.bytes_decoded = s.bytes_decoded;
  stats.bytes_delivered = s.bytes_delivered;
  stats.batches = s.batches;
  stats.samples = s.samples;
  stats.buffers = s.buffers;
  return stats;
}

}  // namespace zfeed::loader
