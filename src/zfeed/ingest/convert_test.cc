#include "zfeed/ingest/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "zfeed/ingest/netcdf_testing.h"
#include "zfeed/store/store.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

using zfeed::testing::error_of;
using zfeed::testing::TempDir;

// t's value at a global index (see write_test_netcdf), decoded.
float expected_t(size_t global) {
  return global % 5 == 0 ? NAN : float((global * 3.0 - 100) * 0.5 + 200);
}

std::vector<float> read_float(const std::string& store_path, const std::string& name) {
  auto array = zarr::Array::open(open_store(store_path), name);
  EXPECT_EQ(array.metadata().dtype.id, DataTypeId::kFloat32);
  std::vector<float> values(array.metadata().num_elements());
  array.read(array.full_selection(), values.data());
  return values;
}

void expect_t_values(const std::vector<float>& values, size_t first_global = 0) {
  for (size_t i = 0; i < values.size(); ++i) {
    float want = expected_t(first_global + i);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(values[i])) << i;
    } else {
      EXPECT_EQ(values[i], want) << i;
    }
  }
}

// Every file under `root` (relative path -> bytes).
std::map<std::string, std::string> tree(const std::string& root) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    files[std::filesystem::relative(entry.path(), root).string()] =
        std::string((std::istreambuf_iterator<char>(in)), {});
  }
  return files;
}

TEST(Convert, NetcdfToZarrV3) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "in.nc", 4);
  ConvertOptions options;
  options.inputs = {dir / "in.nc"};
  options.output = dir / "out.zarr";
  options.chunks = {{"time", 1}, {"lat", 2}};
  ConvertResult result = convert(options);
  EXPECT_EQ(result.variables,
            (std::vector<std::string>{"time", "lat", "lon", "t", "z", "level_count"}));
  ASSERT_EQ(result.skipped.size(), 1u);
  EXPECT_EQ(result.units_total, 3u + 4 + 4 + 1);

  auto store = open_store(dir / "out.zarr");
  EXPECT_FALSE(store->size(std::string(kProgressKey)).has_value());
  auto group = zarr::Group::open(store);
  EXPECT_TRUE(group.is_consolidated());
  EXPECT_EQ(group.attributes()["title"], "zfeed test");
  auto t = zarr::Array::open(store, "t");
  EXPECT_EQ(t.metadata().chunk_shape, (std::vector<uint64_t>{1, 2, 4}));
  EXPECT_EQ(t.metadata().dimension_names->at(0), "time");
  EXPECT_EQ(t.metadata().attributes, (Json{{"units", "K"}, {"long_name", "Temperature"}}));
  EXPECT_EQ(t.metadata().codecs[1]["name"], "zstd");
  expect_t_values(read_float(dir / "out.zarr", "t"));

  auto z = read_float(dir / "out.zarr", "z");
  EXPECT_TRUE(std::isnan(z[1]));
  EXPECT_EQ(z[5], 1.25f);
  auto time = zarr::Array::open(store, "time");
  EXPECT_EQ(time.metadata().dtype.id, DataTypeId::kInt32);
  EXPECT_EQ(time.metadata().attributes["units"], "hours since 1900-01-01 00:00:00");
  EXPECT_EQ(time.metadata().chunk_shape, (std::vector<uint64_t>{4}));
  auto counts = zarr::Array::open(store, "level_count");
  std::vector<int32_t> count_values(3);
  counts.read(counts.full_selection(), count_values.data());
  EXPECT_EQ(count_values, (std::vector<int32_t>{1, 2, 3}));
}

TEST(Convert, RefusesToOverwriteWithoutTheFlag) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "in.nc", 2);
  ConvertOptions options;
  options.inputs = {dir / "in.nc"};
  options.output = dir / "out.zarr";
  convert(options);
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "--overwrite");
  options.overwrite = true;
  options.codec = "none";
  convert(options);
  EXPECT_EQ(zarr::Array::open(open_store(dir / "out.zarr"), "t").metadata().codecs.size(), 1u);
  // Never removes something that is not a Zarr store.
  std::filesystem::create_directories(dir / "precious");
  std::ofstream(dir / "precious/notes.txt") << "keep me";
  options.output = dir / "precious";
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "not a Zarr store");
  EXPECT_TRUE(std::filesystem::exists(dir / "precious/notes.txt"));
}

TEST(Convert, ResumesAfterAnInterruptionAndEndsIdentical) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "in.nc", 6);
  ConvertOptions options;
  options.inputs = {dir / "in.nc"};
  options.output = dir / "whole.zarr";
  options.chunks = {{"time", 1}};
  options.shards = {{"time", 2}};
  convert(options);

  options.output = dir / "resumed.zarr";
  options.on_progress = [](const ConvertProgress& p) {
    if (p.units_done >= 3) throw Error("interrupted");
  };
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "interrupted");
  auto store = open_store(dir / "resumed.zarr");
  EXPECT_TRUE(store->size(std::string(kProgressKey)).has_value());
  EXPECT_THROW(zarr::Group::open(store), NotFoundError);  // not complete-looking

  // Different arguments are refused while the record is there.
  ConvertOptions other = options;
  other.codec = "gzip:6";
  EXPECT_CONTAINS(error_of([&] { convert(other); }), "unfinished conversion");

  options.on_progress = nullptr;
  ConvertResult result = convert(options);
  EXPECT_GE(result.units_resumed, 3u);
  EXPECT_LT(result.units_resumed, result.units_total);
  EXPECT_EQ(tree(dir / "whole.zarr"), tree(dir / "resumed.zarr"));
  auto t = zarr::Array::open(open_store(dir / "resumed.zarr"), "t");
  EXPECT_EQ(t.metadata().chunk_shape, (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(t.read_chunk_shape(), (std::vector<uint64_t>{1, 3, 4}));
  expect_t_values(read_float(dir / "resumed.zarr", "t"));
}

TEST(Convert, JoinsInputsAlongTime) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "a.nc", 3, 0);
  zfeed::testing::write_test_netcdf(dir / "b.nc", 2, 18, true);  // netCDF-4, time 18, 24
  ConvertOptions options;
  options.inputs = {dir / "a.nc", dir / "b.nc"};
  options.output = dir / "out.zarr";
  options.chunks = {{"time", 2}};
  options.variables = {"t"};
  ConvertResult result = convert(options);
  EXPECT_EQ(result.variables, (std::vector<std::string>{"time", "lat", "lon", "t"}));
  expect_t_values(read_float(dir / "out.zarr", "t"));
  auto time = zarr::Array::open(open_store(dir / "out.zarr"), "time");
  std::vector<int32_t> times(5);
  time.read(time.full_selection(), times.data());
  EXPECT_EQ(times, (std::vector<int32_t>{0, 6, 12, 18, 24}));
}

TEST(Convert, BadInputsAreClearErrors) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "a.nc", 2, 0);
  zfeed::testing::write_test_netcdf(dir / "b.nc", 2, 12, false, 50.0f);  // another grid
  ConvertOptions options;
  options.inputs = {dir / "a.nc", dir / "b.nc"};
  options.output = dir / "out.zarr";
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "mismatched grids: coordinate lat");
  options.inputs = {dir / "a.nc"};
  options.variables = {"nope"};
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { convert(options); }), "no variable 'nope'");
  options.variables = {};
  options.chunks = {{"level", 1}};
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "no dimension 'level'");
  options.chunks = {{"time", 2}};
  options.shards = {{"time", 3}};
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "not a multiple");
  EXPECT_FALSE(std::filesystem::exists(dir / "out.zarr"));
  options.inputs = {dir / "missing.nc"};
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "missing.nc");
}

TEST(Convert, RechunksZarrStores) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "in.nc", 5);
  ConvertOptions options;
  options.inputs = {dir / "in.nc"};
  options.output = dir / "a.zarr";
  options.chunks = {{"time", 5}, {"lon", 3}};
  options.codec = "gzip:6";
  convert(options);
  options.inputs = {dir / "a.zarr"};
  options.output = dir / "b.zarr";
  options.chunks = {{"time", 1}};
  options.shards = {{"time", 4}};
  options.codec = "blosc:lz4";
  convert(options);
  auto t = zarr::Array::open(open_store(dir / "b.zarr"), "t");
  EXPECT_EQ(t.read_chunk_shape(), (std::vector<uint64_t>{1, 3, 4}));
  EXPECT_EQ(t.metadata().chunk_shape, (std::vector<uint64_t>{4, 3, 4}));
  EXPECT_EQ(t.metadata().attributes, (Json{{"units", "K"}, {"long_name", "Temperature"}}));
  expect_t_values(read_float(dir / "b.zarr", "t"));
  EXPECT_EQ(zarr::Group::open(open_store(dir / "b.zarr")).attributes()["title"], "zfeed test");
}

TEST(Convert, ParsesOptions) {
  EXPECT_EQ(parse_dim_sizes("time=1,latitude=90", "--chunks"),
            (std::map<std::string, uint64_t>{{"time", 1}, {"latitude", 90}}));
  EXPECT_TRUE(parse_dim_sizes("", "--chunks").empty());
  EXPECT_CONTAINS(error_of([] { parse_dim_sizes("time=0", "--chunks"); }), "positive integer");
  EXPECT_CONTAINS(error_of([] { parse_dim_sizes("time", "--chunks"); }), "DIM=SIZE");
  EXPECT_CONTAINS(error_of([] { parse_dim_sizes("time=1,time=2", "--chunks"); }), "twice");
  DataType f4{DataTypeId::kFloat32};
  EXPECT_EQ(compressor_codec("zstd:5", f4)["configuration"]["level"], 5);
  EXPECT_EQ(compressor_codec("blosc:lz4", f4)["configuration"]["typesize"], 4);
  EXPECT_TRUE(compressor_codec("none", f4).is_null());
  EXPECT_CONTAINS(error_of([&] { compressor_codec("lzma", f4); }), "unknown codec");
  EXPECT_CONTAINS(error_of([&] { compressor_codec("zstd:x", f4); }), "integer");
}

}  // namespace
}  // namespace zfeed::ingest
