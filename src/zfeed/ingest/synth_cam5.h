// Synthetic CAM5-like data for extreme-weather segmentation (SC18, MLPerf HPC DeepCAM): the 16
// channels in DeepCAM's order with plausible magnitudes, and per-pixel labels 0 background,
// 1 tropical cyclone, 2 atmospheric river. The fields are smooth large-scale backgrounds (latitude
// gradients, travelling planetary waves, moist convective clusters) plus the features the labels
// mark: tropical cyclones (warm-core vortices with low pressure, moisture, rain and cyclonic
// winds) and atmospheric rivers (long narrow filaments of water vapour with strong winds along
// them, reaching from the tropics toward mid-latitudes). The labels come from the same features,
// so a segmentation model can learn them; class frequencies are near the published ones (about
// 98% background, 0.05-0.1% cyclone, 1.7% river). Every time step is an analytic function of
// (seed, grid, time): features live, drift and decay across steps, and steps are generated
// independently (in parallel) and reproducibly.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace zfeed::ingest {

struct Cam5Variable {
  std::string name;       // "TMQ"
  std::string units;      // "kg/m2"
  std::string long_name;  // "Total (vertically integrated) precipitable water"
};

// The 16 channels in the SC18/DeepCAM order: TMQ, U850, V850, UBOT, VBOT, QREFHT, PS, PSL, T200,
// T500, PRECT, TS, TREFHT, Z1000, Z200, ZBOT.
const std::vector<Cam5Variable>& cam5_variables();

enum Cam5Label : uint8_t { kBackground = 0, kTropicalCyclone = 1, kAtmosphericRiver = 2 };

class Cam5Synth {
 public:
  // Latitudes from south to north including both poles as CAM's finite-volume grid has them
  // (-90 + i * 180 / (nlat - 1)), longitudes 0 .. 360 - 360 / nlon. Throws zfeed::Error for an
  // empty grid.
  Cam5Synth(uint64_t seed, size_t nlat, size_t nlon);

  size_t nlat() const { return nlat_; }
  size_t nlon() const { return nlon_; }
  const std::vector<double>& latitudes() const { return lat_; }
  const std::vector<double>& longitudes() const { return lon_; }
  size_t field_size() const { return nlat_ * nlon_; }
  static constexpr size_t kChannels = 16;

  // Fills channels[c * field_size() + i * nlon + j] with channel c (cam5_variables() order) and
  // labels[i * nlon + j] with the class at `hours` since 2000-01-01 00 UTC. Thread-safe (const).
  void generate(double hours, std::span<float> channels, std::span<uint8_t> labels) const;

 private:
  struct Cyclone {
    double lat, lon;
    double hemisphere;       // +1 north (counterclockwise), -1 south
    double intensity;        // growth and decay over the lifetime, 0..1
    double pressure_drop;    // Pa at the centre at full intensity
    double max_wind_radius;  // m
    double label_radius;     // m
  };
  struct River {
    // The centreline as a polyline of (lat, lon) points from the tropical end to the poleward end.
    std::vector<double> lat, lon;
    double intensity;   // 0..1
    double tmq_peak;    // kg/m2 above the background on the axis
    double half_width;  // m, the Gaussian sigma across the filament
    double wind;        // m/s along the filament at 850 hPa
  };
  struct Cluster {
    double lat, lon, radius, tmq, rain;
  };
  std::vector<Cyclone> cyclones_at(double hours) const;
  std::vector<River> rivers_at(double hours) const;
  std::vector<Cluster> clusters_at(double hours) const;

  uint64_t seed_;
  size_t nlat_, nlon_;
  std::vector<double> lat_, lon_;
  std::vector<double> topography_;  // m, a smooth pseudo surface height, nlat x nlon
  struct Wave {
    int wavenumber;
    double amplitude_m, phase, speed_deg_per_hour, centre_lat;
  };
  std::vector<Wave> waves_;
};

struct Cam5SynthOptions {
  std::string output;
  size_t nlat = 768, nlon = 1152;
  size_t times = 8;
  double step_hours = 3;   // CAM5's output interval in the DeepCAM data
  double start_hours = 0;  // hours since 2000-01-01 00 UTC
  uint64_t seed = 0;
  std::string codec = "zstd:3";
  size_t shard_times = 0;  // 0: unsharded, one time step per chunk
  // One data(time, variable, lat, lon) array with a `variables` attribute (anemoi-datasets'
  // layout) instead of one array per channel.
  bool stack = false;
  bool overwrite = false;
  bool progress = false;  // a progress line on stderr
  // Called with the number of blocks written so far after each (tests stop a run by throwing).
  std::function<void(uint64_t)> on_block;
};

// Writes the synthetic store (a Zarr v3 group, consolidated): the channels (or `data`), `labels`
// (uint8) and the time, lat and lon coordinates. An existing non-empty output is an error unless
// options.overwrite; an unfinished one written with the same options resumes (see SynthOutput).
void write_cam5_synth(const Cam5SynthOptions& options);

}  // namespace zfeed::ingest
