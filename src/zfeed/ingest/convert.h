// Conversion of netCDF files and Zarr stores into a training-ready Zarr v3 group: one array per
// variable with dimension names, chosen chunks, shards and codec, CF-decoded values, coordinates
// with their attributes, and consolidated metadata written last. Several inputs are joined along
// one dimension (time). Work goes in units of one output chunk row (the chunks or shards that share
// an index along the first dimension), in parallel on zfeed's thread pool; finished units are
// recorded in OUT/.zfeed-convert-progress.json, so a killed run, started again with the same
// arguments, skips them and ends identical to an uninterrupted run.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "zfeed/codec/data_type.h"
#include "zfeed/util/json.h"

namespace zfeed::ingest {

inline constexpr std::string_view kProgressKey = ".zfeed-convert-progress.json";

struct ConvertProgress {
  uint64_t units_done = 0;  // including units a previous run finished
  uint64_t units_total = 0;
  uint64_t units_resumed = 0;  // finished by a previous run
  uint64_t bytes_done = 0;     // decoded bytes written by this run
  uint64_t bytes_todo = 0;     // decoded bytes this run has to write in all
};

struct ConvertOptions {
  std::vector<std::string> inputs;
  std::string output;
  std::map<std::string, uint64_t> chunks;  // by dimension name; others whole
  std::map<std::string, uint64_t> shards;  // shard extent by dimension name; none: unsharded
  std::string codec = "zstd:3";
  std::vector<std::string> variables;  // empty: all (plus the coordinates they use)
  bool overwrite = false;
  std::string concat_dim = "time";
  // Called after each finished unit, one call at a time.
  std::function<void(const ConvertProgress&)> on_progress;
};

struct ConvertResult {
  std::vector<std::string> variables;  // written
  std::vector<std::string> skipped;    // in the inputs but not convertible, with the reason
  uint64_t units_total = 0;
  uint64_t units_resumed = 0;
  uint64_t bytes_written = 0;  // decoded bytes written by this run
};

ConvertResult convert(const ConvertOptions& options);

// "time=1,latitude=90" -> {time: 1, latitude: 90}; `what` names the option in errors.
std::map<std::string, uint64_t> parse_dim_sizes(std::string_view text, std::string_view what);
// The bytes->bytes codec for "zstd:3", "blosc:lz4[:5]", "gzip:6", "none" (null).
Json compressor_codec(std::string_view spec, DataType dtype);

}  // namespace zfeed::ingest
