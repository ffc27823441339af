// Synthetic ERA5-like fields for tests, demos and benchmarks at any size: smooth, plausible
// magnitudes, a daily and a seasonal cycle, and weather systems (travelling waves and vortices)
// that drift with the mid-latitude westerlies, so that a next-step model has something to learn
// and persistence is a fair but beatable baseline. Every time step is an analytic function of
// (seed, grid, time), so steps are generated independently (in parallel) and reproducibly.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zfeed/ingest/progress_record.h"
#include "zfeed/store/store.h"
#include "zfeed/util/json.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/metadata.h"

namespace zfeed::ingest {

struct Era5Variable {
  std::string name;       // "t2m"
  std::string units;      // "K"
  std::string long_name;  // "2 metre temperature"
};

// Every variable the generator knows: t2m, u500, v500, t500, z500, q500, msl.
const std::vector<Era5Variable>& era5_variables();
// The hackathon's six: t2m, u500, v500, t500, z500, q500.
std::vector<std::string> era5_default_variables();

class Era5Synth {
 public:
  // Latitudes from north to south at cell centres (90 - (i + 0.5) * 180 / nlat), longitudes
  // 0 .. 360 - 360 / nlon. Throws zfeed::Error for an unknown variable or an empty grid.
  Era5Synth(uint64_t seed, size_t nlat, size_t nlon, std::vector<std::string> variables);

  size_t nlat() const { return nlat_; }
  size_t nlon() const { return nlon_; }
  const std::vector<std::string>& variables() const { return variables_; }
  const std::vector<double>& latitudes() const { return lat_; }
  const std::vector<double>& longitudes() const { return lon_; }
  size_t field_size() const { return nlat_ * nlon_; }

  // Fills out[v * field_size() + i * nlon + j] with variable v at `hours` since 2000-01-01 00 UTC.
  // `out` holds variables().size() * field_size() floats. Thread-safe (const).
  void generate(double hours, std::span<float> out) const;

 private:
  struct System {
    double lat, lon, amplitude, radius, speed_lon, speed_lat;
  };
  // The geopotential anomaly (m2/s2) of the waves and systems over the grid.
  void anomaly_field(double hours, std::span<const System> systems, std::vector<double>& out) const;
  std::vector<System> systems_at(double hours) const;

  uint64_t seed_;
  size_t nlat_, nlon_;
  std::vector<std::string> variables_;
  std::vector<double> lat_, lon_;
  std::vector<double> land_;  // a smooth pseudo land fraction in [0, 1], nlat x nlon
  struct Wave {
    int wavenumber;
    double amplitude, phase, speed_deg_per_hour, centre_lat;
  };
  std::vector<Wave> waves_;
};

struct SynthOptions {
  std::string output;
  std::vector<std::string> variables;  // empty: the default six
  size_t nlat = 320, nlon = 640;
  size_t times = 24;
  double step_hours = 1;
  double start_hours = 0;  // hours since 2000-01-01 00 UTC
  uint64_t seed = 0;
  std::string codec = "zstd:3";
  size_t shard_times = 0;  // 0: unsharded, one time step per chunk
  bool overwrite = false;
  bool progress = false;  // a progress line on stderr
  // Called with the number of blocks written so far after each (tests stop a run by throwing).
  std::function<void(uint64_t)> on_block;
};

// The codec spec ("zstd:3", "blosc:lz4", "none") is read by convert.h's compressor_codec.

// Writes the synthetic store (a Zarr v3 group, consolidated). An existing non-empty output is an
// error unless options.overwrite; an unfinished one written with the same options resumes (see
// SynthOutput).
void write_era5_synth(const SynthOptions& options);

// "2000-01-01", "2000-01-01T06", "2000-01-01T06:00" -> hours since 2000-01-01 00 UTC.
double parse_start_time(const std::string& text);

// The metadata of a synthetic array (shared by the era5 and cam5 synthesizers): Zarr v3, little
// endian, `compressor` (null: none) inside sharding_indexed with a crc32c index when `shard` is
// given, NaN fill for floats and 0 otherwise.
zarr::ArrayMetadata synth_array_metadata(std::vector<uint64_t> shape, DataType dtype,
                                         std::vector<uint64_t> chunks,
                                         std::optional<std::vector<uint64_t>> shard,
                                         const Json& compressor, std::vector<std::string> dims,
                                         Json attributes);

// The time steps each block (shard, or chunk where unsharded) of either synthesizer holds: a
// shard is never longer than the steps there are.
template <class Options>
uint64_t synth_block_steps(const Options& options) {
  if (!options.shard_times) return 1;
  return std::max<uint64_t>(1, std::min<uint64_t>(options.shard_times, options.times));
}

// What a resumed run of either synthesizer must repeat, of the options both take (`kind`: "era5").
template <class Options>
Json synth_arguments(const std::string& kind, const Options& options) {
  return {{"kind", kind},
          {"nlat", options.nlat},
          {"nlon", options.nlon},
          {"times", options.times},
          {"step_hours", options.step_hours},
          {"start_hours", options.start_hours},
          {"seed", options.seed},
          {"codec", options.codec},
          {"shard_times", options.shard_times}};
}

inline constexpr std::string_view kSynthProgressKey = ".zfeed-synth-progress.json";

// Where a synthesizer writes, in units of blocks of time steps (a shard's, else one step's). While
// it writes, the store has no root group and holds a progress record (kSynthProgressKey): an
// interrupted run leaves nothing that opens as a complete store, and the same command run again
// resumes it, skipping the blocks done. An existing store is an error naming it unless
// `overwrite`, which replaces only a Zarr store; a local one stays whole until the new one is
// complete (written beside it, then swapped in; see replace.h).
class SynthOutput {
 public:
  // `what`: "synth era5"; `arguments`: what a resumed run must repeat.
  SynthOutput(const std::string& output, bool overwrite, const std::string& what, Json arguments,
              uint64_t blocks);
  const std::shared_ptr<Store>& store() const { return store_; }
  // A new array, or on a resumed run the one it made. The root group waits for finish().
  zarr::Array create_array(const std::string& name, zarr::ArrayMetadata metadata);
  bool is_done(uint64_t block) const { return record_->is_done("blocks", block); }
  void mark_done(uint64_t block);  // thread-safe
  // Called with the blocks written so far after each mark_done() (may throw to stop the run).
  std::function<void(uint64_t)> on_block;
  uint64_t blocks_resumed() const { return resumed_; }
  // The root group with `attributes` and the consolidated metadata, then the record goes and a
  // replacement takes the old store's place.
  void finish(const Json& attributes);

 private:
  // The record an unfinished output holds: the one to resume, or none (--overwrite erased it);
  // other arguments are refused.
  std::optional<Json> continue_unfinished(const Json& recorded, bool overwrite,
                                          const std::string& what, const Json& arguments,
                                          const Json& plan);
  // An existing store without a record: refused without --overwrite; else the record of an
  // earlier, interrupted replacement to resume, or none.
  std::optional<Json> make_way(bool overwrite, const Json& arguments, const Json& plan);

  bool local_;
  std::filesystem::path output_path_, write_path_;
  bool replacing_ = false, resuming_ = false;
  std::shared_ptr<Store> store_;
  std::optional<ProgressRecord> record_;
  uint64_t resumed_ = 0, written_ = 0;
  std::mutex mutex_;
};

// The times, in hours since 2000-01-01: start + t * step for t < times. `what` ("synth era5")
// names the command in the errors (no times, a step not positive, not whole hours).
std::vector<int64_t> synth_hours(uint64_t times, double start_hours, double step_hours,
                                 const std::string& what);

// Writes the coordinates of a synthetic store: latitudes and longitudes in degrees under the
// given names, and time in hours since 2000-01-01.
void write_synth_coordinates(SynthOutput& output, const std::string& lat_name,
                             const std::string& lon_name, const std::vector<double>& latitudes,
                             const std::vector<double>& longitudes,
                             const std::vector<int64_t>& hours);

// A synthesizer's progress on stderr, at most five times a second and once at the end:
// "synth era5: 10/96 steps (10%), 55.0 MB/s, ETA 3 s". Thread-safe; silent unless enabled.
class SynthProgress {
 public:
  SynthProgress(bool enabled, std::string label, std::string unit, uint64_t total,
                double bytes_per_step);
  void add(uint64_t steps);
  // Steps a previous run wrote: counted as done, not in the rate.
  void skip(uint64_t steps);
  void finish();

 private:
  void print(bool final);

  bool enabled_;
  std::string label_, unit_;
  uint64_t total_;
  double bytes_per_step_;
  std::atomic<uint64_t> done_{0}, skipped_{0};
  std::mutex mutex_;
  std::chrono::steady_clock::time_point started_, last_print_;
};

}  // namespace zfeed::ingest
