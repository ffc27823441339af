#include "zfeed/ingest/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "zfeed/store/staged_copy.h"
#include "zfeed/util/error.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/cf.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {

void RunningStats::add_block(const double* values, size_t n, size_t stride) {
  RunningStats block;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    double x = values[i * stride];
    if (!std::isfinite(x)) {
      ++block.nan_count;
      continue;
    }
    ++block.count;
    sum += x;
    block.min = std::min(block.min, x);
    block.max = std::max(block.max, x);
  }
  if (block.count) {
    block.mean = sum / double(block.count);
    double squares = 0, correction = 0;
    for (size_t i = 0; i < n; ++i) {
      double x = values[i * stride];
      if (!std::isfinite(x)) continue;
      double d = x - block.mean;
      squares += d * d;
      correction += d;
    }
    // The corrected two-pass algorithm: removes the rounding error of the mean.
    block.m2 = std::max(0.0, squares - correction * correction / double(block.count));
    block.mean += correction / double(block.count);
  }
  merge(block);
}

void RunningStats::add(double value) { add_block(&value, 1); }

void RunningStats::merge(const RunningStats& other) {
  nan_count += other.nan_count;
  if (other.count == 0) return;
  if (count == 0) {
    uint64_t nans = nan_count;
    *this = other;
    nan_count = nans;
    return;
  }
  double n_a = double(count), n_b = double(other.count), n = n_a + n_b;
  double delta = other.mean - mean;
  mean += delta * n_b / n;
  m2 += other.m2 + delta * delta * n_a * n_b / n;
  count += other.count;
  min = std::min(min, other.min);
  max = std::max(max, other.max);
}

double RunningStats::std() const { return std::sqrt(variance()); }

namespace {

Json number(double value) { return std::isfinite(value) ? Json(value) : Json(nullptr); }

Json stats_json(const std::vector<RunningStats>& stats, double (*get)(const RunningStats&)) {
  Json list = Json::array();
  for (const auto& s : stats) list.push_back(number(get(s)));
  return list;
}

double get_mean(const RunningStats& s) { return s.count ? s.mean : NAN; }
double get_std(const RunningStats& s) { return s.std(); }
double get_min(const RunningStats& s) { return s.count ? s.min : NAN; }
double get_max(const RunningStats& s) { return s.count ? s.max : NAN; }

template <typename T>
void convert(const uint8_t* raw, size_t n, double* out) {
  for (size_t i = 0; i < n; ++i) {
    T value;
    std::memcpy(&value, raw + i * sizeof(T), sizeof(T));
    out[i] = double(value);
  }
}

// Half floats by their bits (`to_double` of 16-bit patterns).
void convert_half(const uint8_t* raw, size_t n, double* out, double (*to_double)(uint16_t)) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, raw + i * 2, 2);
    out[i] = to_double(bits);
  }
}

void to_double(DataType dtype, const uint8_t* raw, size_t n, double* out) {
  switch (dtype.id) {
    case DataTypeId::kFloat16:
      return convert_half(raw, n, out, float16_to_double);
    case DataTypeId::kBFloat16:
      return convert_half(raw, n, out, bfloat16_to_double);
    case DataTypeId::kFloat32:
      return convert<float>(raw, n, out);
    case DataTypeId::kFloat64:
      return convert<double>(raw, n, out);
    case DataTypeId::kInt8:
      return convert<int8_t>(raw, n, out);
    case DataTypeId::kInt16:
      return convert<int16_t>(raw, n, out);
    case DataTypeId::kInt32:
      return convert<int32_t>(raw, n, out);
    case DataTypeId::kInt64:
      return convert<int64_t>(raw, n, out);
    case DataTypeId::kUInt8:
      return convert<uint8_t>(raw, n, out);
    case DataTypeId::kUInt16:
      return convert<uint16_t>(raw, n, out);
    case DataTypeId::kUInt32:
      return convert<uint32_t>(raw, n, out);
    case DataTypeId::kUInt64:
      return convert<uint64_t>(raw, n, out);
    default:
      throw UnsupportedError("stats: data type " + std::string(dtype.name()) + " is not supported");
  }
}

}  // namespace

Json ArrayStats::to_json() const {
  Json json;
  if (level_dim) {
    json["level_dim"] = *level_dim;
    json["mean"] = stats_json(levels, get_mean);
    json["std"] = stats_json(levels, get_std);
    json["min"] = stats_json(levels, get_min);
    json["max"] = stats_json(levels, get_max);
    Json counts = Json::array(), nans = Json::array();
    for (const auto& s : levels) {
      counts.push_back(s.count);
      nans.push_back(s.nan_count);
    }
    json["count"] = counts;
    json["nan_count"] = nans;
  } else {
    json["mean"] = number(get_mean(total));
    json["std"] = number(get_std(total));
    json["min"] = number(get_min(total));
    json["max"] = number(get_max(total));
    json["count"] = total.count;
    json["nan_count"] = total.nan_count;
  }
  json["time_range"] = along_time ? Json::array({time_start, time_stop}) : Json();
  return json;
}

ArrayStats compute_array_stats(const zarr::Array& array, const std::string& name,
                               const StatsOptions& options) {
  const auto& meta = array.metadata();
  const size_t rank = meta.rank();
  ArrayStats result;
  result.name = name;
  auto dim_name = [&](size_t d) -> std::string {
    if (meta.dimension_names && (*meta.dimension_names)[d]) return *(*meta.dimension_names)[d];
    return "dim_" + std::to_string(d);
  };
  if (rank == 0) throw Error(name + ": stats need at least one dimension");
  // The time dimension: the one named so, else the first of an array of 3 or more dimensions
  // ((time, [level,] lat, lon) as the loader reads them). An array of fewer without one (a
  // static field such as lsm(latitude, longitude), a 1-D coordinate named in --variables) has
  // no time steps: it is read whole, whatever the time range.
  size_t time_dim = 0;
  bool along_time = rank >= 3;
  for (size_t d = 0; d < rank; ++d) {
    if (dim_name(d) == "time" || dim_name(d) == "valid_time") {
      time_dim = d;
      along_time = true;
      break;
    }
  }
  result.along_time = along_time;
  std::vector<size_t> level_dims;
  for (size_t d = 0; d + 2 < rank; ++d) {
    if (d != time_dim) level_dims.push_back(d);
  }
  // The time range, Python-style.
  const auto nt = int64_t(meta.shape[time_dim]);
  auto resolve = [&](std::optional<int64_t> index, int64_t fallback) {
    if (!index) return fallback;
    int64_t i = *index < 0 ? *index + nt : *index;
    return std::clamp<int64_t>(i, 0, nt);
  };
  const auto t_start = along_time ? uint64_t(resolve(options.time_start, 0)) : 0;
  const auto t_stop =
      along_time ? std::max(t_start, uint64_t(resolve(options.time_stop, nt))) : uint64_t(nt);
  if (t_stop == t_start) {
    // No step, no statistics: null mean and std written as attributes would stop the loader.
    throw Error(name + ": the time range [" + std::to_string(t_start) + ", " +
                std::to_string(t_stop) + ") of its " + std::to_string(nt) +
                " steps selects none (--time START:STOP)");
  }
  result.time_start = t_start;
  result.time_stop = t_stop;

  uint64_t num_levels = 1;
  for (size_t d : level_dims) num_levels *= meta.shape[d];
  if (!level_dims.empty()) {
    std::string level_name;
    for (size_t d : level_dims) level_name += (level_name.empty() ? "" : ",") + dim_name(d);
    result.level_dim = level_name;
  }
  // Runs: the elements after the last level dimension (or the time dimension) are contiguous
  // and share one level.
  // The block along time: whole read chunks where they fit the budget.
  uint64_t per_time = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (d != time_dim) per_time *= meta.shape[d];
  }
  const uint64_t chunk_t = std::max<uint64_t>(1, array.read_chunk_shape()[time_dim]);
  const uint64_t bytes_per_time = per_time * (meta.dtype.size() + sizeof(double));
  const uint64_t fit =
      std::max<uint64_t>(1, options.max_block_bytes / std::max<uint64_t>(1, bytes_per_time));
  // A step larger than the budget (137 levels of a 0.25-degree grid: 1.7 GB) is read in slabs
  // along the first other dimension (levels, or rows), so that a task holds about the budget
  // whatever the array.
  const bool can_split = rank > 1;
  const size_t split_dim = time_dim == 0 ? 1 : 0;
  const uint64_t split_extent = can_split ? meta.shape[split_dim] : 1;
  uint64_t slab = split_extent;
  if (can_split && bytes_per_time > options.max_block_bytes && split_extent > 1) {
    const uint64_t per_slice = std::max<uint64_t>(1, bytes_per_time / split_extent);
    slab = std::clamp<uint64_t>(options.max_block_bytes / per_slice, 1, split_extent);
  }
  struct Block {
    uint64_t t0, t1, s0, s1;  // time steps [t0, t1), [s0, s1) along split_dim
  };
  std::vector<Block> blocks;
  for (uint64_t t = t_start; t < t_stop;) {
    uint64_t chunk_end = std::min(t_stop, (t / chunk_t + 1) * chunk_t);
    uint64_t end = std::min(chunk_end, t + fit);
    for (uint64_t s0 = 0; s0 < split_extent; s0 += slab) {
      blocks.push_back({t, end, s0, std::min(split_extent, s0 + slab)});
    }
    t = end;
  }

  // CF packing, as the loader decodes it.
  const zarr::CfEncoding cf = zarr::cf_encoding(meta, name);
  const bool decode = cf.active();

  // Strides of a C-order block of shape `block_shape`.
  auto summarize = [&](const Block& block) {
    zarr::Selection selection = array.full_selection();
    selection[time_dim] = {block.t0, block.t1, 1};
    if (can_split) selection[split_dim] = {block.s0, block.s1, 1};
    std::vector<uint64_t> shape(rank);
    uint64_t n = 1;
    for (size_t d = 0; d < rank; ++d) n *= (shape[d] = selection[d].count());
    std::vector<uint8_t> raw(n * meta.dtype.size());
    array.read(selection, raw.data());
    std::vector<double> values(n);
    to_double(meta.dtype, raw.data(), n, values.data());
    raw = {};
    if (decode) {
      for (double& x : values) x = cf.decode(x);
    }
    std::vector<RunningStats> partial(num_levels);
    // Run length: the product of the dimensions after the last level (or time) dimension.
    size_t last_outer = level_dims.empty() ? 0 : level_dims.back();
    if (!level_dims.empty()) last_outer = std::max(last_outer, time_dim);
    uint64_t run = 1;
    for (size_t d = level_dims.empty() ? 0 : last_outer + 1; d < rank; ++d) run *= shape[d];
    if (level_dims.empty()) {
      partial[0].add_block(values.data(), n);
      return partial;
    }
    std::vector<uint64_t> index(last_outer + 1, 0);
    for (uint64_t start = 0; start < n; start += run) {
      uint64_t level = 0;
      for (size_t d : level_dims) {
        level = level * meta.shape[d] + index[d] + (can_split && d == split_dim ? block.s0 : 0);
      }
      partial[level].add_block(values.data() + start, run);
      for (size_t d = last_outer + 1; d-- > 0;) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
    return partial;
  };

  result.levels.assign(num_levels, RunningStats{});
  if (level_dims.size() == 1 && meta.attributes.is_object() &&
      meta.attributes.contains("variables")) {
    const Json& names = meta.attributes["variables"];
    if (names.is_array() && names.size() == num_levels &&
        std::all_of(names.begin(), names.end(), [](const Json& n) { return n.is_string(); })) {
      for (const Json& n : names) result.level_names.push_back(n.get<std::string>());
    }
  }
  ThreadPool& pool = ThreadPool::shared();
  const size_t group = std::max<size_t>(1, pool.size() * 4);
  for (size_t first = 0; first < blocks.size(); first += group) {
    size_t count = std::min(group, blocks.size() - first);
    std::vector<std::vector<RunningStats>> partials(count);
    pool.parallel_for(count, [&](size_t i) {
      try {
        partials[i] = summarize(blocks[first + i]);
      } catch (...) {
        rethrow_with_context(name);
      }
    });
    for (const auto& partial : partials) {
      for (size_t l = 0; l < num_levels; ++l) result.levels[l].merge(partial[l]);
    }
  }
  for (const auto& level : result.levels) result.total.merge(level);
  if (level_dims.empty()) result.levels.clear();
  return result;
}

namespace {

void collect_arrays(const zarr::Group& group, const std::string& prefix,
                    std::vector<std::pair<std::string, zarr::Array>>& out) {
  for (const auto& member : group.members()) {
    zarr::Node node = group.open_member(member);
    std::string name = prefix.empty() ? member : prefix + "/" + member;
    if (auto* array = std::get_if<zarr::Array>(&node)) {
      out.emplace_back(name, *array);
    } else {
      collect_arrays(std::get<zarr::Group>(node), name, out);
    }
  }
}

// The arrays that others name in CF's "coordinates" (auxiliary coordinates, as xarray and GRIB
// conversions mark 2-D latitude and longitude) or "bounds" (a coordinate's cell bounds) attribute.
// Names are those of the referring array's group.
std::set<std::string> coordinate_names(
    const std::vector<std::pair<std::string, zarr::Array>>& arrays) {
  std::set<std::string> names;
  for (const auto& [name, array] : arrays) {
    const size_t slash = name.rfind('/');
    const std::string prefix = slash == std::string::npos ? "" : name.substr(0, slash + 1);
    const Json& attributes = array.metadata().attributes;
    for (const char* key : {"coordinates", "bounds"}) {
      auto it = attributes.find(key);
      if (it == attributes.end() || !it->is_string()) continue;
      std::istringstream words(it->get<std::string>());
      for (std::string word; words >> word;) names.insert(prefix + word);
    }
  }
  return names;
}

}  // namespace

std::vector<ArrayStats> compute_store_stats(const std::string& path, const StatsOptions& options) {
  auto store = open_store(path);
  zarr::Node root = zarr::open_node(store, "");
  std::vector<std::pair<std::string, zarr::Array>> arrays;
  zarr::Group* group = std::get_if<zarr::Group>(&root);
  if (group) {
    collect_arrays(*group, "", arrays);
  } else {
    arrays.emplace_back(path, std::get<zarr::Array>(root));
  }
  std::vector<std::pair<std::string, zarr::Array>> chosen;
  if (!options.variables.empty()) {
    for (const auto& want : options.variables) {
      auto it = std::find_if(arrays.begin(), arrays.end(),
                             [&](const auto& a) { return a.first == want; });
      if (it == arrays.end()) throw Error(store->url() + ": no array named \"" + want + "\"");
      chosen.push_back(*it);
    }
  } else {
    // Data arrays: more than one dimension (1-D arrays are coordinates), and not named by another
    // array as its coordinates or bounds (CF: 2-D latitude and longitude, time_bnds).
    const std::set<std::string> named = coordinate_names(arrays);
    for (const auto& a : arrays) {
      if (!group || (a.second.metadata().rank() >= 2 && !named.count(a.first))) chosen.push_back(a);
    }
  }
  // A partial staged copy holds some time steps of the arrays along time: those are the default
  // range there (a range past them is refused by the copy's reads, naming what it holds).
  const std::optional<StagedTimeRange> held = staged_time_range(*store);
  std::vector<ArrayStats> results;
  for (auto& [name, array] : chosen) {
    StatsOptions array_options = options;
    const std::string& array_path = array.path();
    const bool along_held_time =
        held && std::any_of(held->arrays.begin(), held->arrays.end(),
                            [&](const StagedTimeChunks& a) { return a.path == array_path; });
    if (along_held_time && !options.time_start && !options.time_stop) {
      array_options.time_start = int64_t(held->start);
      array_options.time_stop = int64_t(held->stop);
    }
    results.push_back(compute_array_stats(array, name, array_options));
    if (options.write_attributes) {
      Json attributes = array.metadata().attributes;
      attributes["zfeed_stats"] = results.back().to_json();
      array.set_attributes(attributes);
    }
  }
  if (options.write_attributes && group && group->is_consolidated())
    zarr::Group::open(store, "").consolidate();
  return results;
}

void print_stats_table(const std::vector<ArrayStats>& stats, std::ostream& out) {
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %-8s %14s %10s %14s %14s %14s %14s\n", "variable",
                "level", "count", "nan", "mean", "std", "min", "max");
  out << line;
  auto row = [&](const std::string& name, const std::string& level, const RunningStats& s) {
    std::snprintf(line, sizeof line, "%-16s %-8s %14llu %10llu %14.6g %14.6g %14.6g %14.6g\n",
                  name.c_str(), level.c_str(), (unsigned long long)s.count,
                  (unsigned long long)s.nan_count, get_mean(s), s.std(), get_min(s), get_max(s));
    out << line;
  };
  for (const auto& a : stats) {
    if (a.levels.empty()) {
      row(a.name, "-", a.total);
    } else {
      for (size_t l = 0; l < a.levels.size(); ++l) {
        row(a.name, a.level_names.size() == a.levels.size() ? a.level_names[l] : std::to_string(l),
            a.levels[l]);
      }
    }
  }
}

}  // namespace zfeed::ingest
