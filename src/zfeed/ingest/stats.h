// Streaming, numerically stable statistics of Zarr arrays (mean, std, min, max, counts of values
// and NaNs), per array and per level, for normalization by the loader. Each block of time steps
// is summarized exactly (two passes over the block in double) and blocks are merged with Chan's
// parallel formula, so a large mean does not swamp the variance and memory stays bounded.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "zfeed/store/store.h"
#include "zfeed/util/json.h"
#include "zfeed/zarr/array.h"

namespace zfeed::ingest {

struct RunningStats {
  uint64_t count = 0;      // finite values (NaNs and infinities excluded from the moments)
  uint64_t nan_count = 0;  // NaN values (infinities count here too: they have no moments)
  double mean = 0;
  double m2 = 0;  // sum of squared deviations from the mean
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();

  // Adds values[0 .. n) (strided by `stride`) exactly: two passes, then a merge.
  void add_block(const double* values, size_t n, size_t stride = 1);
  void add(double value);
  // Chan et al.'s pairwise merge.
  void merge(const RunningStats& other);
  double variance() const {
    return count ? m2 / double(count) : std::numeric_limits<double>::quiet_NaN();
  }
  double std() const;
};

struct ArrayStats {
  std::string name;
  std::optional<std::string> level_dim;  // the dimension stats are split along, if any
  uint64_t time_start = 0, time_stop = 0;
  bool along_time = true;  // false: no time dimension (a static field), read whole
  RunningStats total;
  std::vector<RunningStats> levels;  // one per level (empty without a level dimension)
  // The levels' names where the array says them: a stacked array's "variables" attribute (one
  // name per index along its one level dimension); else empty, and tables show indices.
  std::vector<std::string> level_names;

  // {"mean", "std", "min", "max", "count", "nan_count", "time_range": [a, b] or null where the
  // array has no time dimension}; with a level
  // dimension each of the first six is a list over levels and "level_dim" names the dimension.
  Json to_json() const;
};

struct StatsOptions {
  std::vector<std::string> variables;            // empty: every data array (not 1-D coordinates)
  std::optional<int64_t> time_start, time_stop;  // Python-style indices along time
  uint64_t max_block_bytes = 256ull << 20;       // bytes read at once per task
  bool write_attributes = true;
};

// Statistics of one array. The time dimension is the one named "time" (else the first); the level
// dimensions are those between it and the last two (spatial) ones; several are flattened in C
// order. CF packing (scale_factor, add_offset, _FillValue, missing_value) is decoded first.
ArrayStats compute_array_stats(const zarr::Array& array, const std::string& name,
                               const StatsOptions& options);

// Statistics of the arrays in the store at `path` (a group or one array), written as the
// "zfeed_stats" attribute of each array (and consolidated metadata rewritten where present).
std::vector<ArrayStats> compute_store_stats(const std::string& path, const StatsOptions& options);

void print_stats_table(const std::vector<ArrayStats>& stats, std::ostream& out);

}  // namespace zfeed::ingest
