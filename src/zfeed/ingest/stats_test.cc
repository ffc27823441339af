#include "zfeed/ingest/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "zfeed/util/testing.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

struct Reference {
  double mean = NAN, std = NAN, min = NAN, max = NAN;
  uint64_t count = 0, nans = 0;
};

// Two passes in long double.
Reference two_pass(const std::vector<double>& values) {
  Reference r;
  long double sum = 0;
  for (double x : values) {
    if (std::isnan(x)) {
      ++r.nans;
      continue;
    }
    ++r.count;
    sum += x;
    r.min = r.count == 1 ? x : std::min(r.min, x);
    r.max = r.count == 1 ? x : std::max(r.max, x);
  }
  long double mean = sum / r.count, m2 = 0;
  for (double x : values) {
    if (!std::isnan(x)) m2 += (x - mean) * (x - mean);
  }
  r.mean = double(mean);
  r.std = double(std::sqrt(m2 / r.count));
  return r;
}

TEST(RunningStats, MatchesTwoPassWithLargeOffsetAndNaNs) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0, 1);
  std::vector<double> values;
  for (int i = 0; i < 100000; ++i) values.push_back(i % 97 == 0 ? NAN : 1e9 + normal(rng));
  Reference ref = two_pass(values);

  // Merged from uneven blocks, as the parallel reader does.
  RunningStats stats;
  size_t start = 0, size = 1;
  while (start < values.size()) {
    size_t n = std::min(size, values.size() - start);
    RunningStats block;
    block.add_block(values.data() + start, n);
    stats.merge(block);
    start += n;
    size = size * 3 + 1;
  }
  EXPECT_EQ(stats.count, ref.count);
  EXPECT_EQ(stats.nan_count, ref.nans);
  EXPECT_NEAR(stats.mean, ref.mean, 1e-6);
  EXPECT_NEAR(stats.std(), ref.std, 1e-6 * ref.std);
  EXPECT_EQ(stats.min, ref.min);
  EXPECT_EQ(stats.max, ref.max);

  // A naive sum of squares loses the variance entirely at this offset.
  double sum = 0, sum2 = 0;
  for (double x : values) {
    if (!std::isnan(x)) sum += x, sum2 += x * x;
  }
  double naive = sum2 / double(ref.count) - std::pow(sum / double(ref.count), 2);
  EXPECT_GT(std::abs(std::sqrt(std::abs(naive)) - ref.std), 0.1);

  // One value at a time gives the same.
  RunningStats single;
  for (double x : values) single.add(x);
  EXPECT_NEAR(single.std(), ref.std, 1e-6 * ref.std);
}

TEST(RunningStats, AllNaN) {
  RunningStats stats;
  std::vector<double> values(10, NAN);
  stats.add_block(values.data(), values.size());
  EXPECT_EQ(stats.count, 0u);
  EXPECT_EQ(stats.nan_count, 10u);
  EXPECT_TRUE(std::isnan(stats.std()));
}

zarr::Array make_array(std::shared_ptr<Store> store, const std::string& name,
                       std::vector<uint64_t> shape, std::vector<uint64_t> chunks,
                       std::vector<std::string> dims) {
  zarr::ArrayMetadata meta;
  meta.shape = std::move(shape);
  meta.dtype = DataType{DataTypeId::kFloat32};
  meta.chunk_shape = std::move(chunks);
  meta.fill_value = parse_fill_value("NaN", meta.dtype, false);
  meta.codecs = Json::array({{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}});
  meta.dimension_names = std::vector<std::optional<std::string>>(dims.begin(), dims.end());
  return zarr::Array::create(store, name, meta);
}

TEST(ArrayStats, PerLevelTimeRangeAndAttributes) {
  auto store = make_memory_store();
  auto group = zarr::Group::create(store, "");
  // (time=6, level=3, lat=4, lon=5) with a large offset per level and NaNs.
  const uint64_t nt = 6, nl = 3, ny = 4, nx = 5;
  auto array = make_array(store, "t", {nt, nl, ny, nx}, {4, 1, ny, nx},
                          {"time", "level", "latitude", "longitude"});
  std::vector<float> values(nt * nl * ny * nx);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 2);
  for (size_t i = 0; i < values.size(); ++i) {
    size_t level = (i / (ny * nx)) % nl;
    values[i] = i % 13 == 0 ? NAN : 1e4f * float(level + 1) + normal(rng);
  }
  array.write(array.full_selection(), values.data());
  auto flat =
      make_array(store, "flat", {nt, ny, nx}, {1, ny, nx}, {"time", "latitude", "longitude"});
  flat.write(flat.full_selection(), values.data());
  make_array(store, "coordinate", {nt}, {nt}, {"time"});
  group.consolidate();

  StatsOptions options;
  options.time_start = 1;
  options.time_stop = -1;         // steps 1 .. 4
  options.max_block_bytes = 100;  // forces blocks smaller than a chunk
  ArrayStats s = compute_array_stats(zarr::Array::open(store, "t"), "t", options);
  EXPECT_EQ(s.level_dim, "level");
  EXPECT_EQ(s.time_start, 1u);
  EXPECT_EQ(s.time_stop, 5u);
  ASSERT_EQ(s.levels.size(), nl);
  for (size_t l = 0; l < nl; ++l) {
    std::vector<double> level_values;
    for (size_t t = 1; t < 5; ++t)
      for (size_t p = 0; p < ny * nx; ++p)
        level_values.push_back(values[(t * nl + l) * ny * nx + p]);
    Reference ref = two_pass(level_values);
    EXPECT_EQ(s.levels[l].count, ref.count);
    EXPECT_EQ(s.levels[l].nan_count, ref.nans);
    EXPECT_NEAR(s.levels[l].mean, ref.mean, 1e-9 * std::abs(ref.mean));
    EXPECT_NEAR(s.levels[l].std(), ref.std, 1e-9 * ref.std);
    EXPECT_EQ(s.levels[l].min, ref.min);
    EXPECT_EQ(s.levels[l].max, ref.max);
  }
  Json json = s.to_json();
  EXPECT_EQ(json["level_dim"], "level");
  EXPECT_EQ(json["mean"].size(), nl);
  EXPECT_EQ(json["time_range"], Json::array({1, 5}));

  // Levels print as indices; a stacked array's "variables" attribute names them.
  std::ostringstream table;
  print_stats_table({s}, table);
  EXPECT_CONTAINS(table.str(), "\nt                2 ");
  auto stacked = zarr::Array::open(store, "t");
  stacked.set_attributes(Json{{"variables", {"t2m", "u500", "z500"}}});
  ArrayStats named = compute_array_stats(zarr::Array::open(store, "t"), "data", options);
  EXPECT_EQ(named.level_names, (std::vector<std::string>{"t2m", "u500", "z500"}));
  std::ostringstream named_table;
  print_stats_table({named}, named_table);
  EXPECT_CONTAINS(named_table.str(), "\ndata             z500 ");

  ArrayStats f = compute_array_stats(zarr::Array::open(store, "flat"), "flat", StatsOptions{});
  EXPECT_FALSE(f.level_dim);
  Reference ref = two_pass(std::vector<double>(values.begin(), values.begin() + nt * ny * nx));
  EXPECT_EQ(f.total.count, ref.count);
  EXPECT_EQ(f.total.nan_count, ref.nans);
  EXPECT_NEAR(f.total.mean, ref.mean, 1e-9 * std::abs(ref.mean));
  EXPECT_NEAR(f.total.std(), ref.std, 1e-9 * ref.std);
  EXPECT_TRUE(f.to_json()["mean"].is_number());
  // A step larger than the budget is read in slabs of rows: the same statistics.
  StatsOptions small;
  small.max_block_bytes = 100;
  ArrayStats slabs = compute_array_stats(zarr::Array::open(store, "flat"), "flat", small);
  EXPECT_EQ(slabs.total.count, ref.count);
  EXPECT_EQ(slabs.total.nan_count, ref.nans);
  EXPECT_NEAR(slabs.total.mean, ref.mean, 1e-9 * std::abs(ref.mean));
  EXPECT_NEAR(slabs.total.std(), ref.std, 1e-9 * ref.std);
  EXPECT_EQ(slabs.total.min, ref.min);
  EXPECT_EQ(slabs.total.max, ref.max);
}

TEST(ArrayStats, AStaticFieldIsReadWholeWhateverTheTimeRange) {
  auto store = make_memory_store();
  auto lsm = make_array(store, "lsm", {3, 2}, {3, 2}, {"latitude", "longitude"});
  std::vector<float> values = {0, 1, 2, 3, 4, 5};
  lsm.write(lsm.full_selection(), values.data());
  StatsOptions first_step;
  first_step.time_start = 0;
  first_step.time_stop = 1;  // was taken as the first latitude
  ArrayStats stats = compute_array_stats(lsm, "lsm", first_step);
  EXPECT_EQ(stats.total.count, 6u);
  EXPECT_DOUBLE_EQ(stats.total.mean, 2.5);
  EXPECT_TRUE(stats.to_json()["time_range"].is_null());
}

TEST(StoreStats, WritesAttributesAndReconsolidates) {
  auto dir =
      std::filesystem::temp_directory_path() / ("zfeed_stats_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto store = open_store(dir.string(), true);
  auto group = zarr::Group::create(store, "");
  auto array = make_array(store, "x", {3, 2, 2}, {1, 2, 2}, {"time", "latitude", "longitude"});
  std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, NAN};
  array.write(array.full_selection(), values.data());
  array.set_attributes({{"coordinates", "lat  lon"}});
  make_array(store, "time", {3}, {3}, {"time"}).set_attributes({{"bounds", "time_bnds"}});
  make_array(store, "time_bnds", {3, 2}, {3, 2}, {"time", "nv"});
  make_array(store, "lat", {2, 2}, {2, 2}, {"latitude", "longitude"});
  make_array(store, "lon", {2, 2}, {2, 2}, {"latitude", "longitude"});
  group.consolidate();

  // Coordinates are left out: the 1-D one, those x names in "coordinates" (2-D latitude and
  // longitude) and the bounds time names.
  auto results = compute_store_stats(dir.string(), StatsOptions{});
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].name, "x");
  EXPECT_EQ(results[0].total.count, 11u);
  EXPECT_EQ(results[0].total.nan_count, 1u);
  EXPECT_DOUBLE_EQ(results[0].total.mean, 6.0);
  Json attrs = zarr::Array::open(store, "x").metadata().attributes;
  EXPECT_DOUBLE_EQ(attrs["zfeed_stats"]["mean"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(attrs["zfeed_stats"]["max"].get<double>(), 11.0);
  // The consolidated copy says the same.
  auto reopened = zarr::Group::open(store, "");
  ASSERT_TRUE(reopened.is_consolidated());
  auto node = reopened.open_member("x");
  EXPECT_DOUBLE_EQ(
      std::get<zarr::Array>(node).metadata().attributes["zfeed_stats"]["min"].get<double>(), 1.0);

  StatsOptions unknown;
  unknown.variables = {"nope"};
  EXPECT_TRUE(testing::contains(
      testing::error_of([&] { compute_store_stats(dir.string(), unknown); }), "nope"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zfeed::ingest
