#include "zfeed/ingest/synth_era5.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "zfeed/ingest/convert.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

const std::vector<std::string> kSix = era5_default_variables();

std::vector<float> generate(const Era5Synth& synth, double hours) {
  std::vector<float> out(synth.variables().size() * synth.field_size());
  synth.generate(hours, out);
  return out;
}

TEST(SynthEra5, DeterministicFromSeed) {
  Era5Synth a(7, 24, 48, kSix), b(7, 24, 48, kSix), c(8, 24, 48, kSix);
  EXPECT_EQ(generate(a, 123), generate(b, 123));
  EXPECT_NE(generate(a, 123), generate(c, 123));
}

TEST(SynthEra5, PlausibleRanges) {
  Era5Synth synth(1, 64, 128, kSix);
  struct Range {
    double lo, hi;
  };
  // t2m, u500, v500, t500, z500, q500
  const std::vector<Range> ranges = {{210, 315}, {-60, 60},      {-60, 60},
                                     {215, 280}, {46000, 59000}, {0, 4e-3}};
  const size_t n = synth.field_size();
  for (double hours : {0.0, 1000.0, 4000.0, 6000.0}) {
    auto values = generate(synth, hours);
    for (size_t k = 0; k < kSix.size(); ++k) {
      auto [lo, hi] = std::minmax_element(values.begin() + k * n, values.begin() + (k + 1) * n);
      EXPECT_GE(*lo, ranges[k].lo) << kSix[k] << " at " << hours;
      EXPECT_LE(*hi, ranges[k].hi) << kSix[k] << " at " << hours;
      EXPECT_GT(*hi - *lo, 0) << kSix[k];
    }
    // The latitude gradient: the equator is warmer than the poles.
    double equator = values[(64 / 2) * 128], pole = values[0];
    EXPECT_GT(equator, pole + 20);
  }
  // Winds reach jet-like speeds somewhere.
  auto values = generate(synth, 500);
  auto [ulo, uhi] = std::minmax_element(values.begin() + n, values.begin() + 2 * n);
  EXPECT_GT(*uhi, 15);
  EXPECT_LT(*ulo, 0);
}

TEST(SynthEra5, Smooth) {
  Era5Synth synth(2, 160, 320, kSix);  // about 1.1 degrees (ERA5 is 0.25)
  auto values = generate(synth, 300);
  const size_t nlat = 160, nlon = 320, n = nlat * nlon;
  for (size_t k = 0; k < kSix.size(); ++k) {
    const float* f = values.data() + k * n;
    auto [lo, hi] = std::minmax_element(f, f + n);
    double range = *hi - *lo, worst = 0;
    for (size_t i = 0; i + 1 < nlat; ++i) {
      for (size_t j = 0; j < nlon; ++j) {
        worst = std::max(worst, double(std::abs(f[i * nlon + j] - f[(i + 1) * nlon + j])));
        worst = std::max(worst, double(std::abs(f[i * nlon + j] - f[i * nlon + (j + 1) % nlon])));
      }
    }
    std::printf("%s: largest neighbour difference %.3g of a range of %.3g\n", kSix[k].c_str(),
                worst, range);
    EXPECT_LT(worst, 0.2 * range) << kSix[k];
  }
}

TEST(SynthEra5, TimeVaryingAndPersistenceBeatable) {
  Era5Synth synth(3, 48, 96, kSix);
  const size_t n = synth.field_size(), steps = 48;
  std::vector<std::vector<float>> series;
  for (size_t t = 0; t < steps; ++t) series.push_back(generate(synth, double(t)));  // hourly
  for (size_t k = 0; k < kSix.size(); ++k) {
    // Anomalies from each point's mean over time; their lag-1 correlation.
    std::vector<double> mean(n, 0.0);
    for (const auto& s : series)
      for (size_t p = 0; p < n; ++p) mean[p] += s[k * n + p] / double(steps);
    double cov = 0, var0 = 0, var1 = 0, persistence = 0, extrapolation = 0;
    for (size_t t = 1; t + 1 < steps; ++t) {
      for (size_t p = 0; p < n; ++p) {
        double a = series[t][k * n + p] - mean[p], b = series[t + 1][k * n + p] - mean[p];
        double prev = series[t - 1][k * n + p] - mean[p];
        cov += a * b;
        var0 += a * a;
        var1 += b * b;
        persistence += (b - a) * (b - a);
        extrapolation += (b - (2 * a - prev)) * (b - (2 * a - prev));
      }
    }
    double correlation = cov / std::sqrt(var0 * var1);
    std::printf("%s: lag-1 correlation %.5f, persistence %.4g, extrapolation %.4g\n",
                kSix[k].c_str(), correlation, persistence, extrapolation);
    EXPECT_GT(correlation, 0.5) << kSix[k];
    EXPECT_LT(correlation, 0.9995) << kSix[k];
    EXPECT_GT(persistence, 0) << kSix[k];
    // Something to learn: a linear extrapolation of the last two steps beats persistence.
    EXPECT_LT(extrapolation, persistence) << kSix[k];
  }
}

TEST(SynthEra5, UnknownVariableAndEmptyGrid) {
  EXPECT_TRUE(testing::contains(testing::error_of([] {
                                  Era5Synth(0, 4, 4, {"t2m", "nope"});
                                }),
                                "nope"));
  EXPECT_TRUE(testing::contains(testing::error_of([] { Era5Synth(0, 0, 4, {"t2m"}); }), "empty"));
}

TEST(SynthEra5, StartTimeAndCodec) {
  EXPECT_EQ(parse_start_time("2000-01-01"), 0);
  EXPECT_EQ(parse_start_time("2000-01-02T06"), 30);
  EXPECT_EQ(parse_start_time("2019-03-01"), 167976);  // 6999 days
  EXPECT_EQ(parse_start_time("1999-12-31T23"), -1);
  const DataType f4{DataTypeId::kFloat32};
  EXPECT_TRUE(compressor_codec("none", f4).is_null());
  EXPECT_EQ(compressor_codec("zstd:5", f4)["configuration"]["level"], 5);
  EXPECT_TRUE(testing::contains(testing::error_of([&] { compressor_codec("brotli", f4); }),
                                "unknown codec"));
}

TEST(SynthEra5, WritesStore) {
  auto dir =
      std::filesystem::temp_directory_path() / ("zfeed_synth_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  SynthOptions options;
  options.output = dir.string();
  options.nlat = 8;
  options.nlon = 16;
  options.times = 5;
  options.step_hours = 6;
  options.seed = 4;
  options.shard_times = 2;
  options.variables = {"t2m", "z500"};
  write_era5_synth(options);

  auto store = open_store(dir.string());
  auto group = zarr::Group::open(store, "");
  EXPECT_TRUE(group.is_consolidated());
  EXPECT_EQ(group.members(),
            (std::vector<std::string>{"latitude", "longitude", "t2m", "time", "z500"}));
  auto t2m = zarr::Array::open(store, "t2m");
  EXPECT_EQ(t2m.metadata().shape, (std::vector<uint64_t>{5, 8, 16}));
  EXPECT_EQ(t2m.read_chunk_shape(), (std::vector<uint64_t>{1, 8, 16}));
  EXPECT_EQ(t2m.metadata().attributes["units"], "K");
  std::vector<float> values(5 * 8 * 16);
  t2m.read(t2m.full_selection(), values.data());
  Era5Synth synth(4, 8, 16, {"t2m", "z500"});
  auto expected = generate(synth, 18);  // step 3 at 6-hourly steps
  EXPECT_TRUE(std::equal(expected.begin(), expected.begin() + 128, values.begin() + 3 * 128));
  auto time = zarr::Array::open(store, "time");
  std::vector<int64_t> hours(5);
  time.read(time.full_selection(), hours.data());
  EXPECT_EQ(hours, (std::vector<int64_t>{0, 6, 12, 18, 24}));
  EXPECT_EQ(time.metadata().attributes["units"], "hours since 2000-01-01");

  // An existing output is kept unless overwrite.
  EXPECT_TRUE(
      testing::contains(testing::error_of([&] { write_era5_synth(options); }), "--overwrite"));
  options.overwrite = true;
  options.variables = {"q500"};
  write_era5_synth(options);
  EXPECT_EQ(zarr::Group::open(store, "").members(),
            (std::vector<std::string>{"latitude", "longitude", "q500", "time"}));
  // A shard longer than the steps there are holds them all.
  options.shard_times = 100;
  write_era5_synth(options);
  EXPECT_EQ(zarr::Array::open(store, "q500").metadata().chunk_shape,
            (std::vector<uint64_t>{5, 8, 16}));
  // --overwrite replaces a Zarr store, never a directory of someone's files.
  const std::string other = (dir / "thesis").string();
  std::filesystem::create_directories(other + "/photos");
  make_file_store(other)->set("notes.txt", as_bytes("mine"));
  options.output = other;
  EXPECT_TRUE(testing::contains(testing::error_of([&] { write_era5_synth(options); }),
                                "holds files and is not a Zarr store; refusing to replace it"));
  EXPECT_TRUE(make_file_store(other)->size("notes.txt"));
  std::filesystem::remove_all(dir);
}

TEST(SynthEra5, ResumesAfterAnInterruptionAndKeepsAStoreItReplaces) {
  testing::TempDir dir;
  SynthOptions options;
  options.output = dir / "whole.zarr";
  options.nlat = 8;
  options.nlon = 16;
  options.times = 9;
  options.shard_times = 2;
  options.variables = {"t2m", "z500"};
  write_era5_synth(options);

  // Cut short: no root group (the store does not open as complete), a record that says so.
  options.output = dir / "resumed.zarr";
  options.on_block = [](uint64_t blocks) {
    if (blocks >= 2) throw Error("interrupted");
  };
  EXPECT_TRUE(
      testing::contains(testing::error_of([&] { write_era5_synth(options); }), "interrupted"));
  auto store = open_store(options.output);
  EXPECT_CONTAINS(testing::error_of<NotFoundError>([&] { zarr::open_node(store, ""); }),
                  "it is an unfinished `zfeed synth` output (being written, or interrupted): run "
                  "the same command again to finish it");
  EXPECT_CONTAINS(testing::error_of<NotFoundError>([&] { zarr::Group::open(store, ""); }),
                  "unfinished `zfeed synth` output");
  EXPECT_TRUE(store->size(std::string(kSynthProgressKey)));
  // Other arguments are refused while the record is there; the same ones resume.
  SynthOptions other = options;
  other.seed = 5;
  EXPECT_TRUE(testing::contains(testing::error_of([&] { write_era5_synth(other); }),
                                "unfinished synth era5 with other arguments"));
  uint64_t first_count = 0;
  options.on_block = [&](uint64_t blocks) {
    if (!first_count) first_count = blocks;
  };
  write_era5_synth(options);
  EXPECT_GE(first_count, 3u);  // the blocks of the first run counted as done
  EXPECT_EQ(testing::file_tree(dir / "whole.zarr"), testing::file_tree(dir / "resumed.zarr"));

  // --overwrite cut short keeps the store it replaces whole; the next one finishes it.
  const auto before = testing::file_tree(options.output);
  options.overwrite = true;
  options.seed = 5;
  options.on_block = [](uint64_t blocks) {
    if (blocks >= 2) throw Error("interrupted");
  };
  EXPECT_TRUE(
      testing::contains(testing::error_of([&] { write_era5_synth(options); }), "interrupted"));
  EXPECT_EQ(testing::file_tree(options.output), before);
  EXPECT_TRUE(std::filesystem::exists(dir / ".resumed.zarr.zfeed-new"));
  options.on_block = nullptr;
  write_era5_synth(options);
  EXPECT_FALSE(std::filesystem::exists(dir / ".resumed.zarr.zfeed-new"));
  EXPECT_NE(testing::file_tree(options.output), before);
  EXPECT_TRUE(zarr::Group::open(store, "").is_consolidated());
}

}  // namespace
}  // namespace zfeed::ingest
