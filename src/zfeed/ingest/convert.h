// Conversion of netCDF files and Zarr stores into a training-ready Zarr v3 group: one array per
// variable with dimension names, chosen chunks, shards and codec, CF-decoded values, coordinates
// with their attributes, and consolidated metadata written last. Several inputs are joined along
// one dimension (time); coordinate values or indices can be selected along any dimension (levels);
// all data variables can be stacked into one array data(time, variable, lat, lon) as
// anemoi-datasets lays it out.
//
// Work goes in units of whole output chunks (or shards): by default one row of them along the
// first dimension, fewer where --max-memory asks for it. Units run in parallel on zfeed's thread
// pool, admitted only while the memory they and the threads' working buffers need stays within
// the budget. Finished units are recorded in OUT/.zfeed-convert-progress.json, so a killed run,
// started again with the same arguments, skips them and ends identical to an uninterrupted run.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zfeed/codec/data_type.h"
#include "zfeed/util/json.h"

namespace zfeed::ingest {

inline constexpr std::string_view kProgressKey = ".zfeed-convert-progress.json";
inline constexpr uint64_t kDefaultMaxMemory = uint64_t{2} << 30;

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
  std::map<std::string, uint64_t>
      chunks;  // by dimension name; others whole (see keep_source_chunks)
  std::map<std::string, uint64_t> shards;  // shard extent by dimension name; none: unsharded
  std::string codec = "zstd:3";
  std::vector<std::string> variables;  // empty: all (plus the coordinates they use)
  bool overwrite = false;
  std::string concat_dim = "time";
  // Coordinate values (matched against the dimension's coordinate variable) or indices to keep
  // along a dimension, in the order given.
  std::map<std::string, std::vector<std::string>> sel;
  std::map<std::string, std::vector<uint64_t>> isel;
  // One float32 array data(time, variable, lat, lon) holding every data variable as channels.
  bool stack = false;
  // Bound on the memory the work units in flight and the threads' buffers take.
  uint64_t max_memory = kDefaultMaxMemory;
  // Threads that read, convert and write units; 0: the shared pool's (ZFEED_NUM_THREADS, else
  // one per core). Each has working buffers inside max_memory, so fewer threads fit a smaller
  // budget.
  size_t threads = 0;
  // Rechunking: values, data types, fill values and attributes exactly as stored (no CF
  // decoding), and dimensions not named in `chunks` keep the input's chunk extent.
  bool rechunk = false;
  // Called after each finished unit, one call at a time.
  std::function<void(const ConvertProgress&)> on_progress;
};

struct ConvertResult {
  std::vector<std::string> variables;  // written
  std::vector<std::string> skipped;    // in the inputs but not convertible, with the reason
  uint64_t units_total = 0;
  uint64_t units_resumed = 0;
  uint64_t bytes_written = 0;  // decoded bytes written by this run
  // The memory accounting: the bytes reserved for the threads' working buffers, and the most
  // bytes the units in flight held at once (both within max_memory).
  uint64_t thread_bytes = 0;
  uint64_t peak_unit_bytes = 0;
  uint64_t max_units_in_flight = 0;
};

ConvertResult convert(const ConvertOptions& options);

// `zfeed rechunk`: one Zarr store rewritten with new chunks, shards and codec; values, data types,
// fill values and attributes as stored. Sets options.rechunk.
ConvertResult rechunk(ConvertOptions options);

// "time=1,latitude=90" -> {time: 1, latitude: 90}; `what` names the option in errors.
std::map<std::string, uint64_t> parse_dim_sizes(std::string_view text, std::string_view what);
// "level=500,850" -> {"level", {"500", "850"}}; `what` names the option in errors.
std::pair<std::string, std::vector<std::string>> parse_dim_values(std::string_view text,
                                                                  std::string_view what);
// "512MiB", "2GiB", "1.5G", "100MB", "4096" -> bytes (K, M, G, T and KiB.. are powers of 1024;
// KB, MB, GB, TB powers of 1000).
uint64_t parse_memory_size(std::string_view text, std::string_view what);
// The bytes->bytes codec for "zstd:3", "blosc:lz4[:5]", "gzip:6", "none" (null).
Json compressor_codec(std::string_view spec, DataType dtype);

}  // namespace zfeed::ingest
