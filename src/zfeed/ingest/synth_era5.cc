#include "zfeed/ingest/synth_era5.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <numbers>

#include "zfeed/ingest/convert.h"
#include "zfeed/ingest/replace.h"
#include "zfeed/ingest/synth_common.h"
#include "zfeed/util/error.h"
#include "zfeed/util/paths.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

using namespace synth;  // the shared constants and uniform()
constexpr size_t kSystemSlots = 28;

// Saturation specific humidity (kg/kg) at 500 hPa over water for temperature t (K).
double saturation_q500(double t) { return synth::saturation_q(t, 50000.0); }

}  // namespace

const std::vector<Era5Variable>& era5_variables() {
  static const std::vector<Era5Variable> variables = {
      {"t2m", "K", "2 metre temperature"},
      {"u500", "m s**-1", "U component of wind at 500 hPa"},
      {"v500", "m s**-1", "V component of wind at 500 hPa"},
      {"t500", "K", "Temperature at 500 hPa"},
      {"z500", "m**2 s**-2", "Geopotential at 500 hPa"},
      {"q500", "kg kg**-1", "Specific humidity at 500 hPa"},
      {"msl", "Pa", "Mean sea level pressure"},
  };
  return variables;
}

std::vector<std::string> era5_default_variables() {
  return {"t2m", "u500", "v500", "t500", "z500", "q500"};
}

Era5Synth::Era5Synth(uint64_t seed, size_t nlat, size_t nlon, std::vector<std::string> variables)
    : seed_(seed), nlat_(nlat), nlon_(nlon), variables_(std::move(variables)) {
  synth::check_grid(nlat_, nlon_, "synth era5");
  if (variables_.empty()) throw Error("synth era5: no variables");
  for (size_t i = 0; i < variables_.size(); ++i) {
    if (std::find(variables_.begin(), variables_.begin() + i, variables_[i]) !=
        variables_.begin() + i) {
      throw Error("synth era5: --variables names \"" + variables_[i] + "\" twice");
    }
  }
  for (const auto& name : variables_) {
    const auto& known = era5_variables();
    if (std::none_of(known.begin(), known.end(),
                     [&](const Era5Variable& v) { return v.name == name; })) {
      std::string names;
      for (const auto& v : known) names += (names.empty() ? "" : ", ") + v.name;
      throw Error("synth era5: unknown variable \"" + name + "\" (known: " + names + ")");
    }
  }
  for (size_t i = 0; i < nlat_; ++i)
    lat_.push_back(90.0 - (double(i) + 0.5) * 180.0 / double(nlat_));
  for (size_t j = 0; j < nlon_; ++j) lon_.push_back(double(j) * 360.0 / double(nlon_));

  // A smooth pseudo land fraction: a few low spherical harmonics-like terms through a sigmoid.
  struct Term {
    double m, n, pm, pn, c;
  };
  std::vector<Term> terms;
  for (uint64_t k = 0; k < 6; ++k) {
    terms.push_back({1.0 + std::floor(3 * uniform(seed, 1, k, 0)),
                     1.0 + std::floor(3 * uniform(seed, 1, k, 1)), 2 * kPi * uniform(seed, 1, k, 2),
                     2 * kPi * uniform(seed, 1, k, 3), 0.5 + uniform(seed, 1, k, 4)});
  }
  land_.resize(nlat_ * nlon_);
  for (size_t i = 0; i < nlat_; ++i) {
    for (size_t j = 0; j < nlon_; ++j) {
      double s = 0;
      for (const auto& t : terms)
        s += t.c * std::cos(t.m * lon_[j] * kDeg + t.pm) * std::cos(t.n * lat_[i] * kDeg + t.pn);
      land_[i * nlon_ + j] = 1.0 / (1.0 + std::exp(-2.5 * (s - 0.4)));
    }
  }
  // Travelling planetary waves in both hemispheres.
  for (uint64_t k = 0; k < 8; ++k) {
    double hemisphere = (k % 2 == 0) ? 1.0 : -1.0;
    waves_.push_back({int(3 + std::floor(6 * uniform(seed, 2, k, 0))),
                      kGravity * (40 + 50 * uniform(seed, 2, k, 1)),
                      2 * kPi * uniform(seed, 2, k, 2), 0.15 + 0.35 * uniform(seed, 2, k, 3),
                      hemisphere * (40 + 15 * uniform(seed, 2, k, 4))});
  }
}

std::vector<Era5Synth::System> Era5Synth::systems_at(double hours) const {
  std::vector<System> systems;
  for (uint64_t s = 0; s < kSystemSlots; ++s) {
    // Each slot holds one system at a time: born, grown, decayed over its lifetime, then the next.
    double life = 72 + 96 * uniform(seed_, 3, s, 0);
    double offset = life * uniform(seed_, 3, s, 1);
    double generation = std::floor((hours - offset) / life);
    double age = hours - offset - generation * life;
    auto g = uint64_t(int64_t(generation) + (int64_t(1) << 40));
    auto u = [&](uint64_t k) { return uniform(seed_, 4 + s, g, k); };
    double envelope = std::pow(std::sin(kPi * age / life), 2);
    bool tropical = s % 7 == 0;
    double hemisphere = (s % 2 == 0) ? 1.0 : -1.0;
    System sys{};
    double lat0 = tropical ? hemisphere * (10 + 10 * u(0)) : hemisphere * (32 + 33 * u(0));
    double speed_ms = tropical ? -(4 + 4 * u(1)) : (8 + 8 * u(1));    // westward in the tropics
    double speed_lat = hemisphere * (tropical ? 0.06 : 0.04) * u(2);  // degrees per hour, poleward
    sys.lat = std::clamp(lat0 + speed_lat * age, -85.0, 85.0);
    sys.speed_lon = speed_ms * 3.6 / (111.2 * std::cos(sys.lat * kDeg));  // degrees per hour
    sys.lon = std::fmod(360 * u(3) + sys.speed_lon * age, 360.0);
    bool low = tropical || u(4) < 0.7;
    double amplitude_gpm = tropical ? 60 + 60 * u(5) : (low ? 100 + 120 * u(5) : 60 + 90 * u(5));
    sys.amplitude = (low ? -1 : 1) * kGravity * amplitude_gpm * envelope;
    sys.radius = (tropical ? 550e3 + 300e3 * u(6) : 650e3 + 500e3 * u(6));
    sys.speed_lat = speed_lat;
    systems.push_back(sys);
  }
  return systems;
}

void Era5Synth::anomaly_field(double hours, std::span<const System> systems,
                              std::vector<double>& out) const {
  // Separable parts computed once per row and per column, so a point costs a few multiply-adds
  // plus an exponential for each nearby system.
  const size_t nw = waves_.size(), ns = systems.size();
  std::vector<double> wave_row(nw * nlat_), wave_col(nw * nlon_), sys_cos_dlon(ns * nlon_);
  for (size_t k = 0; k < nw; ++k) {
    const Wave& w = waves_[k];
    double modulation =
        0.65 + 0.35 * std::cos(2 * kPi * hours / (240.0 + 37.0 * double(k)) + w.phase);
    for (size_t i = 0; i < nlat_; ++i) {
      double envelope = std::exp(-std::pow((lat_[i] - w.centre_lat) / 12.0, 2));
      wave_row[k * nlat_ + i] = envelope < 1e-6 ? 0.0 : w.amplitude * modulation * envelope;
    }
    for (size_t j = 0; j < nlon_; ++j) {
      wave_col[k * nlon_ + j] =
          std::cos(w.wavenumber * (lon_[j] - w.speed_deg_per_hour * hours) * kDeg + w.phase);
    }
  }
  for (size_t s = 0; s < ns; ++s) {
    for (size_t j = 0; j < nlon_; ++j)
      sys_cos_dlon[s * nlon_ + j] = std::cos((lon_[j] - systems[s].lon) * kDeg);
  }
  out.assign(nlat_ * nlon_, 0.0);
  for (size_t i = 0; i < nlat_; ++i) {
    double* row = out.data() + i * nlon_;
    for (size_t k = 0; k < nw; ++k) {
      double a = wave_row[k * nlat_ + i];
      if (a == 0) continue;
      const double* col = wave_col.data() + k * nlon_;
      for (size_t j = 0; j < nlon_; ++j) row[j] += a * col[j];
    }
    double slat = std::sin(lat_[i] * kDeg), clat = std::cos(lat_[i] * kDeg);
    for (size_t s = 0; s < ns; ++s) {
      const System& sys = systems[s];
      if (sys.amplitude == 0) continue;
      double ss = slat * std::sin(sys.lat * kDeg), cc = clat * std::cos(sys.lat * kDeg);
      double r2 = sys.radius * sys.radius;
      double scale = 2 * kEarthRadius * kEarthRadius / r2;  // squared chord over r2, per (1 - cos)
      // Rows farther than 4 radii in latitude alone contribute nothing.
      if (scale * (1 - (ss + cc)) > 16) continue;
      const double* cos_dlon = sys_cos_dlon.data() + s * nlon_;
      for (size_t j = 0; j < nlon_; ++j) {
        double d2 = scale * (1 - (ss + cc * cos_dlon[j]));
        if (d2 <= 16) row[j] += sys.amplitude * std::exp(-0.5 * d2);
      }
    }
  }
}

void Era5Synth::generate(double hours, std::span<float> out) const {
  const size_t n = field_size();
  if (out.size() != variables_.size() * n)
    throw Error("synth era5: output buffer has the wrong size");
  const std::vector<System> systems = systems_at(hours);
  const double season = std::cos(2 * kPi * (hours / 24.0 - 15.0) / kYearDays);  // +1 mid-January
  const double utc_hour = std::fmod(hours, 24.0);

  // Geopotential at 500 hPa: climatology + season + weather; the anomaly kept for other fields.
  std::vector<double> z(n), anom(n);
  anomaly_field(hours, systems, anom);
  for (size_t i = 0; i < nlat_; ++i) {
    double lat = lat_[i];
    double slat = std::sin(lat * kDeg);
    double abs_lat = std::sqrt(lat * lat + 1.0);
    double climate = kGravity * (5620 - 300 * std::tanh((abs_lat - 45) / 12) - 70 * slat * season);
    for (size_t j = 0; j < nlon_; ++j) z[i * nlon_ + j] = climate + anom[i * nlon_ + j];
  }
  // Geostrophic winds from z (1/f regularized near the equator), by centred differences.
  std::vector<double> u(n, 0.0), v(n, 0.0), v_anom(n, 0.0);
  const double eps2 = std::pow(std::sin(12 * kDeg), 2);
  const double dlon = 2 * kPi / double(nlon_);
  for (size_t i = 0; i < nlat_; ++i) {
    double slat = std::sin(lat_[i] * kDeg);
    double inv_f = slat / (2 * kOmega * (slat * slat + eps2));
    double dx = kEarthRadius * std::cos(lat_[i] * kDeg) * dlon;
    size_t i0 = i > 0 ? i - 1 : i, i1 = i + 1 < nlat_ ? i + 1 : i;
    double dy = kEarthRadius * (lat_[i0] - lat_[i1]) * kDeg;  // northward distance from i1 to i0
    for (size_t j = 0; j < nlon_; ++j) {
      size_t jw = (j + nlon_ - 1) % nlon_, je = (j + 1) % nlon_;
      double dzdx = nlon_ >= 3 ? (z[i * nlon_ + je] - z[i * nlon_ + jw]) / (2 * dx) : 0.0;
      double dadx = nlon_ >= 3 ? (anom[i * nlon_ + je] - anom[i * nlon_ + jw]) / (2 * dx) : 0.0;
      double dzdy = i0 != i1 ? (z[i0 * nlon_ + j] - z[i1 * nlon_ + j]) / dy : 0.0;
      u[i * nlon_ + j] = -inv_f * dzdy;
      v[i * nlon_ + j] = inv_f * dzdx;
      v_anom[i * nlon_ + j] = inv_f * dadx;
    }
  }
  for (size_t k = 0; k < variables_.size(); ++k) {
    const std::string& name = variables_[k];
    float* field = out.data() + k * n;
    for (size_t i = 0; i < nlat_; ++i) {
      double lat = lat_[i];
      double slat = std::sin(lat * kDeg), clat = std::cos(lat * kDeg);
      double hemisphere = lat >= 0 ? 1.0 : -1.0;
      for (size_t j = 0; j < nlon_; ++j) {
        size_t p = i * nlon_ + j;
        double land = land_[p];
        // Warm air where the anomalous flow comes from the equator, and under ridges.
        double warm =
            anom[p] / kGravity + 8.0 * hemisphere * v_anom[p] * std::min(1.0, std::abs(slat) * 3);
        double t500 =
            266 - 30 * slat * slat - (3 + 3 * land) * slat * season + 0.03 * warm +
            0.3 * clat *
                std::cos(2 * kPi * (std::fmod(utc_hour + lon_[j] / 15.0 + 24.0, 24.0) - 15) / 24);
        double value = 0;
        if (name == "t2m") {
          double local_hour = std::fmod(utc_hour + lon_[j] / 15.0 + 24.0, 24.0);
          double diurnal =
              (1.0 + 5.0 * land) * clat * std::cos(2 * kPi * (local_hour - 14.0) / 24.0);
          value = 300 - 48 * slat * slat - (6 + 12 * land) * slat * season + diurnal + 0.025 * warm;
        } else if (name == "u500") {
          value = u[p];
        } else if (name == "v500") {
          value = v[p];
        } else if (name == "t500") {
          value = t500;
        } else if (name == "z500") {
          value = z[p];
        } else if (name == "q500") {
          double humidity =
              0.05 +
              0.6 / (1.0 + std::exp(anom[p] / (kGravity * 100.0) - 0.04 * hemisphere * v_anom[p]));
          value = humidity * saturation_q500(t500);
        } else if (name == "msl") {
          value = 101325 - 600 * slat * slat * season + 1.3 * anom[p];
        }
        field[p] = float(value);
      }
    }
  }
}

double parse_start_time(const std::string& text) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0;
  int fields = std::sscanf(text.c_str(), "%d-%d-%dT%d:%d", &year, &month, &day, &hour, &minute);
  if (fields < 3 || month < 1 || month > 12 || day < 1 || day > 31 || hour < 0 || hour > 23 ||
      minute < 0 || minute > 59) {
    throw Error("bad start time \"" + text + "\" (use YYYY-MM-DD or YYYY-MM-DDTHH[:MM])");
  }
  // Days from civil (Howard Hinnant's algorithm), relative to 2000-01-01.
  auto days_from_civil = [](int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
  };
  int64_t days = days_from_civil(year, month, day) - days_from_civil(2000, 1, 1);
  return double(days) * 24 + hour + minute / 60.0;
}

zarr::ArrayMetadata synth_array_metadata(std::vector<uint64_t> shape, DataType dtype,
                                         std::vector<uint64_t> chunks,
                                         std::optional<std::vector<uint64_t>> shard,
                                         const Json& compressor, std::vector<std::string> dims,
                                         Json attributes) {
  zarr::ArrayMetadata meta;
  meta.zarr_format = 3;
  meta.shape = std::move(shape);
  meta.dtype = dtype;
  meta.fill_value = parse_fill_value(dtype.is_float() ? Json("NaN") : Json(0), dtype, false);
  Json chain = Json::array({{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}});
  if (!compressor.is_null()) chain.push_back(compressor);
  if (shard) {
    meta.chunk_shape = *shard;
    meta.codecs = Json::array(
        {{{"name", "sharding_indexed"},
          {"configuration",
           {{"chunk_shape", chunks},
            {"codecs", chain},
            {"index_codecs",
             Json::array({{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}},
                          {{"name", "crc32c"}}})},
            {"index_location", "end"}}}}});
  } else {
    meta.chunk_shape = std::move(chunks);
    meta.codecs = chain;
  }
  std::vector<std::optional<std::string>> names(dims.begin(), dims.end());
  meta.dimension_names = names;
  meta.attributes = std::move(attributes);
  return meta;
}

namespace {

// Whether a progress record was written by a run of these arguments and plan.
bool same_run(const std::optional<Json>& document, const Json& arguments, const Json& plan) {
  return document && document->value("arguments", Json()) == arguments &&
         ProgressRecord::recorded_plan(*document, "blocks") == plan;
}

}  // namespace

SynthOutput::SynthOutput(const std::string& output, bool overwrite, const std::string& what,
                         Json arguments, uint64_t blocks)
    : local_(is_local_path(output)) {
  if (local_) {
    output_path_ = strip_file_scheme(output);
    finish_interrupted_swap(output_path_);
  }
  store_ = open_store(output, /*create=*/true);
  const Json plan = Json::array({blocks});
  std::optional<Json> previous;
  if (const std::optional<Json> recorded =
          ProgressRecord::read(*store_, std::string(kSynthProgressKey))) {
    previous = continue_unfinished(*recorded, overwrite, what, arguments, plan);
  } else if (!store_->list("").empty()) {
    previous = make_way(overwrite, arguments, plan);
  }
  record_.emplace(store_, std::string(std::string(kSynthProgressKey)), what, std::move(arguments));
  if (previous) {
    resuming_ = true;
    record_->load(*previous, "blocks", plan);
    for (uint64_t b = 0; b < blocks; ++b) resumed_ += record_->is_done("blocks", b);
  }
  record_->set_plan("blocks", plan);
  record_->save();  // first: the output is marked incomplete before anything else is written
}

std::optional<Json> SynthOutput::continue_unfinished(const Json& recorded, bool overwrite,
                                                     const std::string& what, const Json& arguments,
                                                     const Json& plan) {
  // An unfinished output: the same command resumes it; --overwrite starts it over.
  if (overwrite) {
    store_->erase_prefix("");
    return std::nullopt;
  }
  if (!same_run(recorded, arguments, plan)) {
    throw Error(store_->url() + ": holds an unfinished " + what + " with other arguments (" +
                recorded.value("arguments", Json()).dump() +
                "); run it again with those, or pass --overwrite");
  }
  return recorded;
}

std::optional<Json> SynthOutput::make_way(bool overwrite, const Json& arguments, const Json& plan) {
  if (!overwrite) {
    std::string also;
    if (local_ && std::filesystem::exists(replacement_path(output_path_))) {
      also = " (an earlier --overwrite was cut short: its unfinished store " +
             replacement_path(output_path_).string() + " resumes with --overwrite)";
    }
    throw Error(store_->url() +
                ": already exists and is not empty (pass --overwrite to replace it)" + also);
  }
  // --overwrite replaces a Zarr store, never a directory of other files.
  bool zarr = false;
  for (const char* marker : {"zarr.json", ".zgroup", ".zarray"})
    zarr = zarr || store_->size(marker);
  if (!zarr) {
    throw Error(store_->url() +
                ": holds files and is not a Zarr store; refusing to replace it (give a new or "
                "empty directory)");
  }
  if (!local_) {
    store_->erase_prefix("");  // no rename on an object store
    return std::nullopt;
  }
  // Written beside the old store, which stays whole until finish() swaps the new one in.
  replacing_ = true;
  write_path_ = replacement_path(output_path_);
  FileStoreOptions options;
  options.create = true;
  store_ = make_file_store(write_path_.string(), options);
  std::optional<Json> earlier = ProgressRecord::read(*store_, std::string(kSynthProgressKey));
  if (same_run(earlier, arguments, plan)) return earlier;
  store_->erase_prefix("");  // zfeed's own unfinished work, of other arguments: start over
  return std::nullopt;
}

zarr::Array SynthOutput::create_array(const std::string& name, zarr::ArrayMetadata metadata) {
  if (resuming_) {
    try {
      return zarr::Array::open(store_, name);  // the same arguments: the same metadata
    } catch (const NotFoundError&) {
    }
  }
  zarr::Array array = zarr::Array::create(store_, name, std::move(metadata));
  store_->erase("zarr.json");  // the root group Array::create made waits for finish()
  return array;
}

void SynthOutput::mark_done(uint64_t block) {
  uint64_t done;
  {
    std::lock_guard lock(mutex_);
    record_->mark_done("blocks", block);
    done = ++written_;
  }
  if (on_block) on_block(resumed_ + done);
}

void SynthOutput::finish(const Json& attributes) {
  zarr::Group::create(store_, "", 3, attributes, true).consolidate();
  store_->erase(std::string(kSynthProgressKey));
  if (replacing_) swap_in_replacement(output_path_, write_path_);
}

std::vector<int64_t> synth_hours(uint64_t times, double start_hours, double step_hours,
                                 const std::string& what) {
  if (times == 0) throw Error(what + ": --times must be at least 1");
  if (!(step_hours > 0)) throw Error(what + ": the time step must be positive");
  if (std::floor(step_hours) != step_hours || std::floor(start_hours) != start_hours)
    throw Error(what + ": the start and the step must be whole hours");
  std::vector<int64_t> hours(times);
  for (uint64_t t = 0; t < times; ++t)
    hours[t] = int64_t(start_hours) + int64_t(t) * int64_t(step_hours);
  return hours;
}

void write_synth_coordinates(SynthOutput& output, const std::string& lat_name,
                             const std::string& lon_name, const std::vector<double>& latitudes,
                             const std::vector<double>& longitudes,
                             const std::vector<int64_t>& hours) {
  const DataType f64{DataTypeId::kFloat64}, i64{DataTypeId::kInt64};
  auto write = [&](const std::string& name, const void* values, uint64_t size, DataType dtype,
                   Json attributes) {
    auto array = output.create_array(
        name, synth_array_metadata({size}, dtype, {std::min<uint64_t>(size, 1u << 20)},
                                   std::nullopt, nullptr, {name}, std::move(attributes)));
    array.write(array.full_selection(), values);
  };
  write(lat_name, latitudes.data(), latitudes.size(), f64,
        {{"units", "degrees_north"}, {"standard_name", "latitude"}, {"long_name", "latitude"}});
  write(lon_name, longitudes.data(), longitudes.size(), f64,
        {{"units", "degrees_east"}, {"standard_name", "longitude"}, {"long_name", "longitude"}});
  write("time", hours.data(), hours.size(), i64,
        {{"units", "hours since 2000-01-01"},
         {"calendar", "standard"},
         {"standard_name", "time"},
         {"long_name", "time"}});
}

SynthProgress::SynthProgress(bool enabled, std::string label, std::string unit, uint64_t total,
                             double bytes_per_step)
    : enabled_(enabled),
      label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      bytes_per_step_(bytes_per_step),
      started_(std::chrono::steady_clock::now()),
      last_print_(started_) {}

void SynthProgress::add(uint64_t steps) {
  done_ += steps;
  print(false);
}

void SynthProgress::skip(uint64_t steps) {
  skipped_ += steps;
  done_ += steps;
}

void SynthProgress::finish() { print(true); }

void SynthProgress::print(bool final) {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (!final && now - last_print_ < std::chrono::milliseconds(200)) return;
  last_print_ = now;
  const double seconds = std::chrono::duration<double>(now - started_).count();
  const uint64_t steps = done_.load(), written = steps - skipped_.load();
  const double mb = double(written) * bytes_per_step_ / 1e6;
  const double eta = written ? seconds * double(total_ - steps) / double(written) : 0;
  std::fprintf(stderr, "\r%s: %llu/%llu %s (%.0f%%), %.1f MB/s, ETA %.0f s   ", label_.c_str(),
               (unsigned long long)steps, (unsigned long long)total_, unit_.c_str(),
               100.0 * double(steps) / double(total_), seconds > 0 ? mb / seconds : 0.0, eta);
  if (final) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

void write_era5_synth(const SynthOptions& options) {
  std::vector<std::string> variables =
      options.variables.empty() ? era5_default_variables() : options.variables;
  Era5Synth synth(options.seed, options.nlat, options.nlon, variables);
  const std::vector<int64_t> hours =
      synth_hours(options.times, options.start_hours, options.step_hours, "synth era5");
  const Json compressor = compressor_codec(options.codec, DataType{DataTypeId::kFloat32});

  const uint64_t block = synth_block_steps(options);
  const size_t blocks = size_t((options.times + block - 1) / block);
  Json arguments = synth_arguments("era5", options);
  arguments["variables"] = variables;
  SynthOutput output(options.output, options.overwrite, "synth era5", arguments, blocks);
  output.on_block = options.on_block;
  const DataType f32{DataTypeId::kFloat32};
  Json root_attributes = {
      {"title", "zfeed synthetic ERA5-like data"},
      {"source", "zfeed synth era5"},
      {"zfeed_synth",
       {{"kind", "era5"}, {"seed", options.seed}, {"step_hours", options.step_hours}}}};

  const uint64_t nt = options.times, nlat = options.nlat, nlon = options.nlon;
  write_synth_coordinates(output, "latitude", "longitude", synth.latitudes(), synth.longitudes(),
                          hours);

  // Variables: chunks of one time step over the whole grid, optionally in shards of N steps.
  std::vector<zarr::Array> arrays;
  for (const auto& name : variables) {
    const auto& known = era5_variables();
    auto info = std::find_if(known.begin(), known.end(),
                             [&](const Era5Variable& v) { return v.name == name; });
    std::optional<std::vector<uint64_t>> shard;
    if (options.shard_times) shard = std::vector<uint64_t>{block, nlat, nlon};
    arrays.push_back(output.create_array(
        name, synth_array_metadata({nt, nlat, nlon}, f32, {1, nlat, nlon}, shard, compressor,
                                   {"time", "latitude", "longitude"},
                                   {{"units", info->units}, {"long_name", info->long_name}})));
  }

  const size_t field = synth.field_size();
  SynthProgress progress(options.progress, "synth era5", "steps", nt,
                         double(field) * double(variables.size()) * 4);
  ThreadPool::shared().parallel_for(blocks, [&](size_t b) {
    uint64_t t0 = b * block, t1 = std::min<uint64_t>(nt, t0 + block);
    size_t steps = size_t(t1 - t0);
    if (output.is_done(b)) {
      progress.skip(steps);
      return;
    }
    std::vector<float> values(variables.size() * field);
    std::vector<std::vector<float>> per_variable(variables.size(),
                                                 std::vector<float>(steps * field));
    for (size_t s = 0; s < steps; ++s) {
      synth.generate(double(hours[t0 + s]), values);
      for (size_t k = 0; k < variables.size(); ++k) {
        std::copy_n(values.data() + k * field, field, per_variable[k].data() + s * field);
      }
    }
    for (size_t k = 0; k < variables.size(); ++k) {
      arrays[k].write({{t0, t1, 1}, {0, nlat, 1}, {0, nlon, 1}}, per_variable[k].data());
    }
    output.mark_done(b);
    progress.add(steps);
  });
  progress.finish();
  output.finish(root_attributes);
}

}  // namespace zfeed::ingest
