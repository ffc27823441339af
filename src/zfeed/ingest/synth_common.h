// What the synthetic ERA5 and CAM5 generators share: physical constants, a counter-based random
// number (the same value for the same (seed, a, b, c) on every machine and thread, so that any
// time step can be generated alone), and the saturation specific humidity.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>

#include "zfeed/util/error.h"

namespace zfeed::ingest::synth {

constexpr double kPi = std::numbers::pi;
constexpr double kDeg = kPi / 180.0;
constexpr double kGravity = 9.80665;      // m/s2
constexpr double kEarthRadius = 6.371e6;  // m
constexpr double kOmega = 7.2921e-5;      // rad/s
constexpr double kYearDays = 365.2425;

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform number in [0, 1) from (seed, a, b, c).
inline double uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = splitmix64(seed ^ splitmix64(a ^ splitmix64(b ^ splitmix64(c))));
  return double(h >> 11) * 0x1.0p-53;
}

// A grid of `nlat` x `nlon` that a synthesizer can hold: neither empty nor a plane past 2^30
// points (4 GiB of float32; ERA5's 0.25 degrees is 1.04e6). `what`: "synth era5".
inline void check_grid(size_t nlat, size_t nlon, const std::string& what) {
  if (nlat == 0 || nlon == 0) throw Error(what + ": the grid must not be empty");
  if (nlat > (size_t{1} << 30) / nlon) {
    throw Error(what + ": a grid of " + std::to_string(nlat) + " x " + std::to_string(nlon) +
                " is past the 2^30 points a plane may hold");
  }
}

// Saturation specific humidity (kg/kg) over water at temperature t (K) and pressure p (Pa).
inline double saturation_q(double t, double pressure) {
  double es = 611.2 * std::exp(17.67 * (t - 273.15) / (t - 29.65));  // Pa
  return 0.622 * es / pressure;
}

}  // namespace zfeed::ingest::synth
