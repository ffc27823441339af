#include "zfeed/ingest/synth_cam5.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <optional>

#include "zfeed/ingest/convert.h"
#include "zfeed/ingest/synth_common.h"
#include "zfeed/ingest/synth_era5.h"
#include "zfeed/util/error.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

using namespace synth;                // the shared constants and uniform()
constexpr double kAirDensity = 1.15;  // kg/m3 near the surface

// Slots of features alive at once (each slot holds one feature at a time: born, grown, decayed,
// then the next). Together with the sizes below they set the class frequencies: about 4 labelled
// cyclones of 150-250 km radius (0.05-0.1% of pixels) and 5-6 rivers (about 1.7%).
constexpr size_t kCycloneSlots = 7;
constexpr size_t kRiverSlots = 10;
constexpr size_t kClusterSlots = 24;
// A cyclone is labelled once it is strong enough (TECA's detections require a minimum wind).
constexpr double kCycloneLabelIntensity = 0.35;
// A river pixel is one where the filament's water vapour anomaly exceeds this (kg/m2).
constexpr double kRiverLabelTmq = 10.0;
constexpr size_t kRiverPoints = 25;  // centreline polyline points

enum Channel : size_t {
  kTMQ,
  kU850,
  kV850,
  kUBOT,
  kVBOT,
  kQREFHT,
  kPS,
  kPSL,
  kT200,
  kT500,
  kPRECT,
  kTS,
  kTREFHT,
  kZ1000,
  kZ200,
  kZBOT,
};

// Where a slot's current feature is in its life: the generation (which feature) and its age.
struct Lifetime {
  uint64_t generation;
  double age, life;
  double envelope() const { return std::pow(std::sin(kPi * age / life), 2); }
};

Lifetime lifetime_at(uint64_t seed, uint64_t kind, uint64_t slot, double hours, double min_life,
                     double extra_life) {
  double life = min_life + extra_life * uniform(seed, kind, slot, 0);
  double offset = life * uniform(seed, kind, slot, 1);
  double generation = std::floor((hours - offset) / life);
  double age = hours - offset - generation * life;
  return {uint64_t(int64_t(generation) + (int64_t(1) << 40)), age, life};
}

double wrap_degrees(double dlon) { return std::remainder(dlon, 360.0); }

double smoothstep(double edge0, double edge1, double x) {
  double t = std::clamp((x - edge0) / (edge1 - edge0), 0.0, 1.0);
  return t * t * (3 - 2 * t);
}

// The rows and columns (with wrap-around) within `radius_m` of a box of latitudes and longitudes.
struct Window {
  size_t row_begin = 0, row_end = 0;
  std::vector<size_t> columns;
};

Window window_around(const std::vector<double>& lat, const std::vector<double>& lon, double lat_lo,
                     double lat_hi, double lon_lo, double lon_span, double radius_m) {
  Window window;
  double margin_lat = radius_m / kEarthRadius / kDeg;
  double lo = lat_lo - margin_lat, hi = lat_hi + margin_lat;
  auto first = std::lower_bound(lat.begin(), lat.end(), lo);
  auto last = std::upper_bound(lat.begin(), lat.end(), hi);
  window.row_begin = size_t(first - lat.begin());
  window.row_end = size_t(last - lat.begin());
  double poleward = std::min(89.0, std::max(std::abs(lo), std::abs(hi)));
  double margin_lon = margin_lat / std::cos(poleward * kDeg);
  if (lon_span + 2 * margin_lon >= 360 || poleward >= 89.0) {
    for (size_t j = 0; j < lon.size(); ++j) window.columns.push_back(j);
    return window;
  }
  for (size_t j = 0; j < lon.size(); ++j) {
    double from_start = std::fmod(lon[j] - (lon_lo - margin_lon) + 720.0, 360.0);
    if (from_start <= lon_span + 2 * margin_lon) window.columns.push_back(j);
  }
  return window;
}

// Saturation specific humidity (kg/kg) near the surface at temperature t (K), p = 1000 hPa.
double surface_saturation_q(double t) { return synth::saturation_q(t, 100000.0); }

}  // namespace

const std::vector<Cam5Variable>& cam5_variables() {
  static const std::vector<Cam5Variable> variables = {
      {"TMQ", "kg/m2", "Total (vertically integrated) precipitable water"},
      {"U850", "m/s", "Zonal wind at 850 mbar pressure surface"},
      {"V850", "m/s", "Meridional wind at 850 mbar pressure surface"},
      {"UBOT", "m/s", "Lowest model level zonal wind"},
      {"VBOT", "m/s", "Lowest model level meridional wind"},
      {"QREFHT", "kg/kg", "Reference height humidity"},
      {"PS", "Pa", "Surface pressure"},
      {"PSL", "Pa", "Sea level pressure"},
      {"T200", "K", "Temperature at 200 mbar pressure surface"},
      {"T500", "K", "Temperature at 500 mbar pressure surface"},
      {"PRECT", "m/s", "Total (convective and large-scale) precipitation rate (liq + ice)"},
      {"TS", "K", "Surface temperature (radiative)"},
      {"TREFHT", "K", "Reference height temperature"},
      {"Z1000", "m", "Geopotential Z at 1000 mbar pressure surface"},
      {"Z200", "m", "Geopotential Z at 200 mbar pressure surface"},
      {"ZBOT", "m", "Lowest model level height"},
  };
  return variables;
}

Cam5Synth::Cam5Synth(uint64_t seed, size_t nlat, size_t nlon)
    : seed_(seed), nlat_(nlat), nlon_(nlon) {
  synth::check_grid(nlat_, nlon_, "synth cam5");
  for (size_t i = 0; i < nlat_; ++i)
    lat_.push_back(nlat_ == 1 ? 0.0 : -90.0 + double(i) * 180.0 / double(nlat_ - 1));
  for (size_t j = 0; j < nlon_; ++j) lon_.push_back(double(j) * 360.0 / double(nlon_));

  // Smooth pseudo continents (a few low harmonics through a sigmoid) with mountains on them.
  struct Term {
    double m, n, pm, pn, c;
  };
  std::vector<Term> land_terms, mountain_terms;
  for (uint64_t k = 0; k < 6; ++k) {
    auto u = [&](uint64_t c) { return uniform(seed, 1, k, c); };
    land_terms.push_back({1.0 + std::floor(3 * u(0)), 1.0 + std::floor(3 * u(1)), 2 * kPi * u(2),
                          2 * kPi * u(3), 0.5 + u(4)});
    mountain_terms.push_back({3.0 + std::floor(6 * u(5)), 2.0 + std::floor(5 * u(6)),
                              2 * kPi * u(7), 2 * kPi * u(8), 0.5 + u(9)});
  }
  // Each term is separable: cos(m lon + pm) per column times cos(n lat + pn) per row.
  auto tabulate = [&](const std::vector<Term>& terms, std::vector<double>& rows,
                      std::vector<double>& columns) {
    rows.assign(terms.size() * nlat_, 0.0);
    columns.assign(terms.size() * nlon_, 0.0);
    for (size_t k = 0; k < terms.size(); ++k) {
      const Term& t = terms[k];
      for (size_t i = 0; i < nlat_; ++i)
        rows[k * nlat_ + i] = t.c * std::cos(t.n * lat_[i] * kDeg + t.pn);
      for (size_t j = 0; j < nlon_; ++j)
        columns[k * nlon_ + j] = std::cos(t.m * lon_[j] * kDeg + t.pm);
    }
  };
  std::vector<double> land_rows, land_columns, mountain_rows, mountain_columns;
  tabulate(land_terms, land_rows, land_columns);
  tabulate(mountain_terms, mountain_rows, mountain_columns);
  topography_.resize(nlat_ * nlon_);
  for (size_t i = 0; i < nlat_; ++i) {
    for (size_t j = 0; j < nlon_; ++j) {
      double land_sum = 0, ridges = 0;
      for (size_t k = 0; k < land_terms.size(); ++k) {
        land_sum += land_rows[k * nlat_ + i] * land_columns[k * nlon_ + j];
        ridges += mountain_rows[k * nlat_ + i] * mountain_columns[k * nlon_ + j];
      }
      double land = 1.0 / (1.0 + std::exp(-3.0 * (land_sum - 0.5)));
      ridges = std::max(0.0, ridges);
      // Continents 150 m high with mountain ranges up to about 3 km.
      topography_[i * nlon_ + j] = land * (150 + 2800 * (1 - std::exp(-0.3 * ridges * ridges)));
    }
  }
  // Travelling planetary waves (geopotential height at 200 hPa) in both hemispheres.
  for (uint64_t k = 0; k < 8; ++k) {
    double hemisphere = (k % 2 == 0) ? 1.0 : -1.0;
    auto u = [&](uint64_t c) { return uniform(seed, 2, k, c); };
    waves_.push_back({int(3 + std::floor(5 * u(0))), 50 + 90 * u(1), 2 * kPi * u(2),
                      0.15 + 0.35 * u(3), hemisphere * (40 + 15 * u(4))});
  }
}

std::vector<Cam5Synth::Cyclone> Cam5Synth::cyclones_at(double hours) const {
  std::vector<Cyclone> cyclones;
  for (uint64_t s = 0; s < kCycloneSlots; ++s) {
    Lifetime t = lifetime_at(seed_, 3, s, hours, 96, 144);
    auto u = [&](uint64_t k) { return uniform(seed_, 100 + s, t.generation, k); };
    Cyclone c{};
    c.hemisphere = u(0) < 0.65 ? 1.0 : -1.0;  // most cyclones form in the northern hemisphere
    double drift_west = 3 + 3 * u(1), drift_pole = 0.6 + 1.2 * u(2);  // m/s
    double lat0 = 7 + 11 * u(3);
    double lat = lat0 + drift_pole * 3600 * t.age / kEarthRadius / kDeg;
    c.lat = c.hemisphere * std::min(lat, 38.0);
    double lon_per_hour = drift_west * 3600 / (kEarthRadius * std::cos(c.lat * kDeg)) / kDeg;
    c.lon = std::fmod(360 * u(4) - lon_per_hour * t.age + 3600.0, 360.0);
    c.intensity = t.envelope();
    c.pressure_drop = 2000 + 5000 * u(5);
    c.max_wind_radius = 40e3 + 70e3 * u(6);
    c.label_radius = 150e3 + 100e3 * u(7);
    cyclones.push_back(c);
  }
  return cyclones;
}

std::vector<Cam5Synth::River> Cam5Synth::rivers_at(double hours) const {
  std::vector<River> rivers;
  for (uint64_t s = 0; s < kRiverSlots; ++s) {
    Lifetime t = lifetime_at(seed_, 4, s, hours, 48, 96);
    auto u = [&](uint64_t k) { return uniform(seed_, 200 + s, t.generation, k); };
    River r;
    double hemisphere = s % 2 == 0 ? 1.0 : -1.0;
    // From the tropical moisture reservoir poleward and eastward, bent, drifting east.
    double lat0 = 12 + 10 * u(0), lat1 = 42 + 16 * u(1);
    double lon0 = 360 * u(2), lon_span = 25 + 35 * u(3);
    double drift = (5 + 5 * u(4)) * 3600 / (kEarthRadius * std::cos(35 * kDeg)) / kDeg;
    lon0 += drift * t.age;
    double bend_lat = (lat0 + lat1) / 2 + (u(5) - 0.5) * 10;
    double bend_lon = lon0 + lon_span * (0.5 + 0.5 * (u(6) - 0.5));
    for (size_t k = 0; k < kRiverPoints; ++k) {
      double f = double(k) / double(kRiverPoints - 1), g = 1 - f;
      double lat = g * g * lat0 + 2 * g * f * bend_lat + f * f * lat1;  // quadratic Bezier
      double lon = g * g * lon0 + 2 * g * f * bend_lon + f * f * (lon0 + lon_span);
      r.lat.push_back(hemisphere * lat);
      r.lon.push_back(std::fmod(lon + 3600.0, 360.0));
    }
    r.intensity = t.envelope();
    r.tmq_peak = 20 + 16 * u(7);
    r.half_width = 150e3 + 110e3 * u(8);
    r.wind = 12 + 10 * u(9);
    rivers.push_back(std::move(r));
  }
  return rivers;
}

std::vector<Cam5Synth::Cluster> Cam5Synth::clusters_at(double hours) const {
  std::vector<Cluster> clusters;
  for (uint64_t s = 0; s < kClusterSlots; ++s) {
    Lifetime t = lifetime_at(seed_, 5, s, hours, 12, 48);
    auto u = [&](uint64_t k) { return uniform(seed_, 300 + s, t.generation, k); };
    double envelope = t.envelope();
    clusters.push_back({(u(0) - 0.5) * 36, std::fmod(360 * u(1) - 0.2 * t.age + 360.0, 360.0),
                        150e3 + 350e3 * u(2), (4 + 8 * u(3)) * envelope,
                        (1e-6 + 3e-6 * u(4)) * envelope});
  }
  return clusters;
}

void Cam5Synth::generate(double hours, std::span<float> channels, std::span<uint8_t> labels) const {
  const size_t n = field_size();
  if (channels.size() != kChannels * n || labels.size() != n)
    throw Error("synth cam5: output buffers have the wrong size");
  const double season = std::cos(2 * kPi * (hours / 24.0 - 15.0) / kYearDays);  // +1 mid-January
  const double itcz = 2 - 6 * season;                                           // degrees north
  auto field = [&](Channel c) { return channels.data() + c * n; };
  std::vector<double> tmq_anomaly(n, 0.0), river_anomaly(n, 0.0);
  std::vector<float> rain(n, 0.0f);
  std::fill(labels.begin(), labels.end(), uint8_t(kBackground));

  // Planetary waves: Z200 anomaly and its geostrophic winds, from the analytic derivatives.
  std::vector<double> z_wave(n, 0.0), u_wave(n, 0.0), v_wave(n, 0.0);
  const double eps2 = std::pow(std::sin(12 * kDeg), 2);
  for (const Wave& w : waves_) {
    double modulation = 0.65 + 0.35 * std::cos(2 * kPi * hours / 260.0 + w.phase);
    std::vector<double> cos_col(nlon_), sin_col(nlon_);
    for (size_t j = 0; j < nlon_; ++j) {
      double x = w.wavenumber * (lon_[j] - w.speed_deg_per_hour * hours) * kDeg + w.phase;
      cos_col[j] = std::cos(x);
      sin_col[j] = std::sin(x);
    }
    for (size_t i = 0; i < nlat_; ++i) {
      double d = (lat_[i] - w.centre_lat) / 13.0;
      double a = w.amplitude_m * modulation * std::exp(-d * d);
      if (a < 1e-6) continue;
      double da_dlat = a * (-2 * d / 13.0) / kDeg;  // per radian
      double slat = std::sin(lat_[i] * kDeg);
      double g_over_f = kGravity * slat / (2 * kOmega * (slat * slat + eps2));
      double clat = std::max(std::cos(lat_[i] * kDeg), 0.05);
      for (size_t j = 0; j < nlon_; ++j) {
        size_t p = i * nlon_ + j;
        z_wave[p] += a * cos_col[j];
        u_wave[p] += -g_over_f * da_dlat * cos_col[j] / kEarthRadius;
        v_wave[p] += g_over_f * (-a * w.wavenumber * sin_col[j]) / (kEarthRadius * clat);
      }
    }
  }

  // Backgrounds: zonal climatology, season, waves, continents.
  for (size_t i = 0; i < nlat_; ++i) {
    double lat = lat_[i], abs_lat = std::abs(lat);
    double slat = std::sin(lat * kDeg), s2 = slat * slat;
    double hemisphere = lat >= 0 ? 1.0 : -1.0;
    double winter = hemisphere * season;  // +1 in the hemisphere's winter
    double moist = std::exp(-std::pow((lat - itcz) / 24.0, 2));
    double trades = -7 * std::exp(-std::pow((lat - itcz) / 15.0, 2));
    double westerlies = (hemisphere > 0 ? 9 : 12) * std::exp(-std::pow((abs_lat - 47) / 12.0, 2));
    double polar_easterlies = -3 * std::exp(-std::pow((abs_lat - 72) / 8.0, 2));
    double hadley_inflow =
        -1.5 * std::tanh((lat - itcz) / 8.0) * std::exp(-std::pow((lat - itcz) / 20.0, 2));
    double psl_zonal = 101200 + 800 * std::exp(-std::pow((abs_lat - 32) / 10.0, 2)) -
                       1300 * std::exp(-std::pow((abs_lat - 62) / 10.0, 2)) -
                       250 * std::exp(-std::pow((lat - itcz) / 8.0, 2)) + 300 * winter * s2;
    for (size_t j = 0; j < nlon_; ++j) {
      size_t p = i * nlon_ + j;
      double height = topography_[p];
      double land = std::min(1.0, height / 150.0);
      double zw = z_wave[p];
      field(kTMQ)[p] = float(std::max(
          1.0, 4 + 46 * moist - 6 * land * moist + 0.03 * zw - 3 * std::max(0.0, winter) * s2));
      field(kU850)[p] = float(trades + westerlies + polar_easterlies + 0.5 * u_wave[p]);
      field(kV850)[p] = float(hadley_inflow + 0.5 * v_wave[p]);
      field(kPSL)[p] = float(psl_zonal + 4.0 * zw);
      field(kT200)[p] = float(216 + 7 * std::exp(-std::pow((abs_lat - 50) / 20.0, 2)) -
                              3 * winter * s2 + 0.01 * zw);
      field(kT500)[p] = float(268 - 32 * s2 - 4 * winter * s2 + 0.03 * zw);
      field(kTS)[p] =
          float(302 - 50 * s2 - (4 + 10 * land) * winter * s2 - 0.0065 * height + 0.012 * zw);
      field(kZ200)[p] = float(12350 - 1300 * s2 - 120 * winter * s2 + zw);
      field(kPRECT)[p] = 0;
    }
  }

  // Moist convective clusters in the tropics: blobs of water vapour and rain without a vortex,
  // so that moisture alone does not make a cyclone.
  for (const Cluster& c : clusters_at(hours)) {
    if (c.tmq <= 0) continue;
    double lat_c = c.lat + itcz;
    Window w = window_around(lat_, lon_, lat_c, lat_c, c.lon, 0, 3 * c.radius);
    for (size_t i = w.row_begin; i < w.row_end; ++i) {
      double y = (lat_[i] - lat_c) * kDeg * kEarthRadius;
      double clat = std::cos((lat_[i] + lat_c) / 2 * kDeg);
      for (size_t j : w.columns) {
        double x = wrap_degrees(lon_[j] - c.lon) * kDeg * kEarthRadius * clat;
        double g = std::exp(-(x * x + y * y) / (c.radius * c.radius));
        size_t p = i * nlon_ + j;
        tmq_anomaly[p] += c.tmq * g;
        rain[p] += float(c.rain * g * g);
      }
    }
  }

  // Atmospheric rivers.
  for (const River& r : rivers_at(hours)) {
    if (r.intensity < 1e-3) continue;
    // The pixels within reach of the centreline's bounding box; then, per pixel, the nearest
    // point of the centreline and how far along it lies (for the taper at both ends).
    const size_t m = r.lat.size();
    auto [lat_lo, lat_hi] = std::minmax_element(r.lat.begin(), r.lat.end());
    double lon_span = 0;
    for (double lon : r.lon)
      lon_span = std::max(lon_span, std::fmod(lon - r.lon.front() + 720.0, 360.0));
    double reach = 3.5 * r.half_width;
    Window w = window_around(lat_, lon_, *lat_lo, *lat_hi, r.lon.front(), lon_span, reach);
    std::vector<double> length(m, 0.0), unwrapped(m, 0.0);  // degrees east of the first point
    for (size_t k = 1; k < m; ++k) {
      unwrapped[k] = unwrapped[k - 1] + wrap_degrees(r.lon[k] - r.lon[k - 1]);
      double dy = (r.lat[k] - r.lat[k - 1]) * kDeg * kEarthRadius;
      double dx = (unwrapped[k] - unwrapped[k - 1]) * kDeg * kEarthRadius *
                  std::cos((r.lat[k] + r.lat[k - 1]) / 2 * kDeg);
      length[k] = length[k - 1] + std::hypot(dx, dy);
    }
    const double total = length.back();
    std::vector<double> ys(m), xs(m);
    for (size_t i = w.row_begin; i < w.row_end; ++i) {
      // The centreline in metres in a plane tangent at this row's latitude.
      double clat = std::cos(lat_[i] * kDeg);
      for (size_t k = 0; k < m; ++k) {
        ys[k] = (r.lat[k] - lat_[i]) * kDeg * kEarthRadius;
        xs[k] = unwrapped[k] * kDeg * kEarthRadius * clat;
      }
      for (size_t j : w.columns) {
        // The nearest point of the polyline.
        double x0 = wrap_degrees(lon_[j] - r.lon.front()) * kDeg * kEarthRadius * clat;
        double best_d2 = 1e300, best_s = 0, dir_x = 1, dir_y = 0;
        for (size_t k = 0; k + 1 < m; ++k) {
          double ax = xs[k] - x0, ay = ys[k];
          double ex = xs[k + 1] - xs[k], ey = ys[k + 1] - ys[k], e2 = ex * ex + ey * ey;
          double f = e2 > 0 ? std::clamp(-(ax * ex + ay * ey) / e2, 0.0, 1.0) : 0.0;
          double px = ax + f * ex, py = ay + f * ey, d2 = px * px + py * py;
          if (d2 < best_d2) {
            best_d2 = d2;
            best_s = (length[k] + f * (length[k + 1] - length[k])) / total;
            double e = std::sqrt(e2);
            dir_x = e > 0 ? ex / e : 1;
            dir_y = e > 0 ? ey / e : 0;
          }
        }
        if (best_d2 > reach * reach) continue;
        double taper = smoothstep(0.0, 0.2, best_s) * (1 - smoothstep(0.8, 1.0, best_s));
        double across = std::exp(-0.5 * best_d2 / (r.half_width * r.half_width));
        double strength = r.intensity * taper;
        double anomaly = r.tmq_peak * strength * across;
        size_t p = i * nlon_ + j;
        river_anomaly[p] = std::max(river_anomaly[p], anomaly);
        // The moisture is carried by a low-level jet along the filament.
        double jet = r.wind * strength * std::exp(-0.25 * best_d2 / (r.half_width * r.half_width));
        field(kU850)[p] += float(jet * dir_x);
        field(kV850)[p] += float(jet * dir_y);
        field(kTS)[p] += float(2.0 * strength * across);
        field(kT500)[p] += float(2.5 * strength * across);
        rain[p] += float(4e-7 * strength * across * across);
      }
    }
    // The extratropical low at the poleward end that drives the river.
    double low_lat = r.lat.back(), low_lon = r.lon.back(), low_radius = 900e3;
    Window lw = window_around(lat_, lon_, low_lat, low_lat, low_lon, 0, 2.5 * low_radius);
    for (size_t i = lw.row_begin; i < lw.row_end; ++i) {
      double y = (lat_[i] - low_lat) * kDeg * kEarthRadius;
      double clat = std::cos((lat_[i] + low_lat) / 2 * kDeg);
      for (size_t j : lw.columns) {
        double x = wrap_degrees(lon_[j] - low_lon) * kDeg * kEarthRadius * clat;
        double g = std::exp(-(x * x + y * y) / (low_radius * low_radius));
        size_t p = i * nlon_ + j;
        field(kPSL)[p] -= float(1800 * r.intensity * g);
        field(kZ200)[p] -= float(90 * r.intensity * g);
      }
    }
  }
  for (size_t p = 0; p < n; ++p) {
    if (river_anomaly[p] > kRiverLabelTmq) labels[p] = kAtmosphericRiver;
    tmq_anomaly[p] += river_anomaly[p];
  }

  // Tropical cyclones: Holland pressure profiles (B = 1.5) with their cyclostrophic winds, a moist
  // core, rain bands and a warm core aloft.
  constexpr double kHollandB = 1.5;
  for (const Cyclone& c : cyclones_at(hours)) {
    if (c.intensity < 1e-3) continue;
    const double reach = 1500e3, drop = c.pressure_drop * c.intensity;
    const bool labelled = c.intensity >= kCycloneLabelIntensity;
    Window w = window_around(lat_, lon_, c.lat, c.lat, c.lon, 0, reach);
    for (size_t i = w.row_begin; i < w.row_end; ++i) {
      double y = (lat_[i] - c.lat) * kDeg * kEarthRadius;
      double clat = std::cos((lat_[i] + c.lat) / 2 * kDeg);
      for (size_t j : w.columns) {
        double x = wrap_degrees(lon_[j] - c.lon) * kDeg * kEarthRadius * clat;
        double r = std::hypot(x, y);
        if (r >= reach) continue;
        double fade = std::pow(1 - (r / reach) * (r / reach), 2);
        double xb = std::pow(c.max_wind_radius / std::max(r, 1.0), kHollandB);
        double profile = std::exp(-xb);
        double wind = std::sqrt(kHollandB * drop / kAirDensity * xb * profile) * fade;
        size_t p = i * nlon_ + j;
        double rr = r / 1e3;  // km
        field(kPSL)[p] -= float(drop * (1 - profile) * fade);
        if (r > 0) {  // tangential, counterclockwise in the north, clockwise in the south
          field(kU850)[p] += float(-c.hemisphere * wind * y / r);
          field(kV850)[p] += float(c.hemisphere * wind * x / r);
        }
        tmq_anomaly[p] += 24 * c.intensity * std::exp(-std::pow(rr / 350, 2));
        double bands = 0.5 + 0.5 * std::cos(2 * std::atan2(y, x) * c.hemisphere - rr / 60);
        rain[p] += float(c.intensity * (1.4e-5 * std::exp(-std::pow(rr / 110, 2)) +
                                        2.5e-6 * bands * std::exp(-std::pow(rr / 380, 2))));
        field(kT500)[p] += float(6 * c.intensity * std::exp(-std::pow(rr / 300, 2)));
        field(kT200)[p] += float(4 * c.intensity * std::exp(-std::pow(rr / 420, 2)));
        field(kZ200)[p] += float(70 * c.intensity * std::exp(-std::pow(rr / 500, 2)));
        field(kTS)[p] -= float(1.0 * c.intensity * std::exp(-std::pow(rr / 200, 2)));
        if (labelled && r <= c.label_radius) labels[p] = kTropicalCyclone;
      }
    }
  }

  // Fields that follow from the others.
  for (size_t i = 0; i < nlat_; ++i) {
    double turn = (lat_[i] >= 0 ? 1.0 : -1.0) * 20 * kDeg;  // friction turns surface winds to low
    double ct = std::cos(turn), st = std::sin(turn);
    for (size_t j = 0; j < nlon_; ++j) {
      size_t p = i * nlon_ + j;
      double height = topography_[p];
      double tmq = std::max(0.5, double(field(kTMQ)[p]) + tmq_anomaly[p]);
      field(kTMQ)[p] = float(tmq);
      double u = field(kU850)[p], v = field(kV850)[p];
      double slow = 0.8 - 0.25 * std::min(1.0, height / 1500);
      field(kUBOT)[p] = float(slow * (u * ct - v * st));
      field(kVBOT)[p] = float(slow * (u * st + v * ct));
      double ts = field(kTS)[p];
      double trefht = ts - 0.8 - 0.5 * std::min(1.0, height / 1000);
      field(kTREFHT)[p] = float(trefht);
      // Near-surface humidity tracks the column water vapour, below saturation.
      field(kQREFHT)[p] =
          float(std::min(0.92 * surface_saturation_q(trefht), 3.4e-4 * tmq * (1 - 0.2 * tmq / 80)));
      // Rain picks up sharply with column water vapour (the observed exponential pickup).
      double pickup = 2.5e-8 * std::exp(std::min(6.0, (tmq - 45) / 7.5));
      field(kPRECT)[p] = float(pickup + rain[p]);
      double psl = field(kPSL)[p];
      field(kPS)[p] =
          float(psl * std::exp(-kGravity * height / (287.05 * (ts + 0.00325 * height))));
      field(kZ1000)[p] = float((psl - 100000) * 287.05 * ts / (psl * kGravity));
      field(kZBOT)[p] = float(287.05 * trefht / kGravity * 0.0075);
    }
  }
}

void write_cam5_synth(const Cam5SynthOptions& options) {
  Cam5Synth synth(options.seed, options.nlat, options.nlon);
  const std::vector<int64_t> hours =
      synth_hours(options.times, options.start_hours, options.step_hours, "synth cam5");
  const Json compressor = compressor_codec(options.codec, DataType{DataTypeId::kFloat32});

  // One time step per chunk over the whole grid, optionally in shards of N steps.
  const uint64_t block = synth_block_steps(options);
  const size_t blocks = size_t((options.times + block - 1) / block);
  Json arguments = synth_arguments("cam5", options);
  arguments["stack"] = options.stack;
  SynthOutput output(options.output, options.overwrite, "synth cam5", arguments, blocks);
  output.on_block = options.on_block;
  const auto& variables = cam5_variables();
  Json names = Json::array();
  for (const auto& v : variables) names.push_back(v.name);
  const Json class_names = Json::array({"background", "tropical_cyclone", "atmospheric_river"});
  Json root_attributes = {
      {"title", "zfeed synthetic CAM5-like data for extreme-weather segmentation"},
      {"source", "zfeed synth cam5"},
      {"zfeed_synth",
       {{"kind", "cam5"},
        {"seed", options.seed},
        {"step_hours", options.step_hours},
        {"layout", options.stack ? "stack" : "variables"}}},
      {"classes", class_names}};
  if (options.stack) root_attributes["variables"] = names;

  const DataType f32{DataTypeId::kFloat32}, u8{DataTypeId::kUInt8};
  const uint64_t nt = options.times, nlat = options.nlat, nlon = options.nlon;
  write_synth_coordinates(output, "lat", "lon", synth.latitudes(), synth.longitudes(), hours);

  auto shard_of = [&](std::vector<uint64_t> chunk) -> std::optional<std::vector<uint64_t>> {
    if (!options.shard_times) return std::nullopt;
    chunk[0] = block;
    return chunk;
  };
  const std::vector<std::string> field_dims = {"time", "lat", "lon"};
  std::vector<zarr::Array> channel_arrays;
  std::optional<zarr::Array> stacked;
  if (options.stack) {
    Json units = Json::array(), long_names = Json::array();
    for (const auto& v : variables) {
      units.push_back(v.units);
      long_names.push_back(v.long_name);
    }
    std::vector<uint64_t> chunk = {1, Cam5Synth::kChannels, nlat, nlon};
    stacked = output.create_array(
        "data",
        synth_array_metadata({nt, Cam5Synth::kChannels, nlat, nlon}, f32, chunk, shard_of(chunk),
                             compressor, {"time", "variable", "lat", "lon"},
                             {{"variables", names},
                              {"variable_units", units},
                              {"variable_long_names", long_names},
                              {"long_name", "CAM5-like channels, stacked"}}));
  } else {
    for (const auto& v : variables) {
      std::vector<uint64_t> chunk = {1, nlat, nlon};
      channel_arrays.push_back(output.create_array(
          v.name,
          synth_array_metadata({nt, nlat, nlon}, f32, chunk, shard_of(chunk), compressor,
                               field_dims, {{"units", v.units}, {"long_name", v.long_name}})));
    }
  }
  std::vector<uint64_t> label_chunk = {1, nlat, nlon};
  auto labels = output.create_array(
      "labels",
      synth_array_metadata({nt, nlat, nlon}, u8, label_chunk, shard_of(label_chunk), compressor,
                           field_dims,
                           {{"long_name", "extreme weather class per pixel"},
                            {"classes", class_names},
                            {"flag_values", Json::array({0, 1, 2})},
                            {"flag_meanings", "background tropical_cyclone atmospheric_river"}}));

  const size_t field = synth.field_size(), channels = Cam5Synth::kChannels;
  SynthProgress progress(options.progress, "synth cam5", "samples", nt,
                         double(field) * (double(channels) * 4 + 1));
  // A block of steps (one shard, or one step unsharded): the stacked layout is what generate()
  // writes per step; the per-variable one is a transpose through one step's worth of scratch.
  auto generate_step = [&](uint64_t t0, size_t steps, size_t s, std::vector<float>& values,
                           std::vector<uint8_t>& classes) {
    std::span<uint8_t> step_labels(classes.data() + s * field, field);
    if (options.stack) {
      synth.generate(double(hours[t0 + s]),
                     std::span<float>(values.data() + s * channels * field, channels * field),
                     step_labels);
      return;
    }
    std::vector<float> step_values(channels * field);
    synth.generate(double(hours[t0 + s]), step_values, step_labels);
    for (size_t c = 0; c < channels; ++c)
      std::copy_n(step_values.data() + c * field, field, values.data() + (c * steps + s) * field);
  };
  // Writes array k of the block: a channel (or the stacked data) or, last, the labels.
  const size_t outputs = (options.stack ? 1 : channels) + 1;
  auto write_output = [&](uint64_t t0, uint64_t t1, size_t k, const std::vector<float>& values,
                          const std::vector<uint8_t>& classes) {
    const size_t steps = size_t(t1 - t0);
    if (k + 1 == outputs) {
      labels.write({{t0, t1, 1}, {0, nlat, 1}, {0, nlon, 1}}, classes.data());
    } else if (options.stack) {
      stacked->write({{t0, t1, 1}, {0, channels, 1}, {0, nlat, 1}, {0, nlon, 1}}, values.data());
    } else {
      channel_arrays[k].write({{t0, t1, 1}, {0, nlat, 1}, {0, nlon, 1}},
                              values.data() + k * steps * field);
    }
  };
  auto& pool = ThreadPool::shared();
  if (block == 1) {
    // One step per task: memory stays at about two steps per thread.
    pool.parallel_for(size_t(nt), [&](size_t t) {
      if (output.is_done(t)) {
        progress.skip(1);
        return;
      }
      std::vector<float> values(channels * field);
      std::vector<uint8_t> classes(field);
      generate_step(t, 1, 0, values, classes);
      for (size_t k = 0; k < outputs; ++k) write_output(t, t + 1, k, values, classes);
      output.mark_done(t);
      progress.add(1);
    });
  } else {
    // Shards one after the other, their steps and arrays in parallel: memory stays at one shard
    // of every array, however many threads there are.
    for (size_t b = 0; b < blocks; ++b) {
      uint64_t t0 = b * block, t1 = std::min<uint64_t>(nt, t0 + block);
      size_t steps = size_t(t1 - t0);
      if (output.is_done(b)) {
        progress.skip(steps);
        continue;
      }
      std::vector<float> values(steps * channels * field);
      std::vector<uint8_t> classes(steps * field);
      pool.parallel_for(steps, [&](size_t s) {
        generate_step(t0, steps, s, values, classes);
        progress.add(1);
      });
      pool.parallel_for(outputs, [&](size_t k) { write_output(t0, t1, k, values, classes); });
      output.mark_done(b);
    }
  }
  progress.finish();
  output.finish(root_attributes);
}

}  // namespace zfeed::ingest
