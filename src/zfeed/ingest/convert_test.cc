#include "zfeed/ingest/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "zfeed/ingest/netcdf_testing.h"
#include "zfeed/ingest/stats.h"
#include "zfeed/store/store.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

using zfeed::testing::error_of;
using zfeed::testing::file_tree;
using zfeed::testing::TempDir;

// t's value at a global index (see write_test_netcdf), decoded.
float expected_t(size_t global) {
  return global % 5 == 0 ? NAN : float((global * 3.0 - 100) * 0.5 + 200);
}

// Writes dir/in.nc with `steps` times (write_test_netcdf) and returns options converting it to
// dir/`output`.
ConvertOptions netcdf_conversion(const TempDir& dir, size_t steps,
                                 const std::string& output = "out.zarr") {
  zfeed::testing::write_test_netcdf(dir / "in.nc", steps);
  ConvertOptions options;
  options.inputs = {dir / "in.nc"};
  options.output = dir / output;
  return options;
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

TEST(Convert, NetcdfToZarrV3) {
  ZFEED_REQUIRE_NETCDF();
  TempDir dir;
  ConvertOptions options = netcdf_conversion(dir, 4);
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
  ZFEED_REQUIRE_NETCDF();
  TempDir dir;
  ConvertOptions options = netcdf_conversion(dir, 2);
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

TEST(Convert, OverwriteKeepsTheOldStoreUntilTheNewOneIsComplete) {
  ZFEED_REQUIRE_NETCDF();
  TempDir dir;
  ConvertOptions options = netcdf_conversion(dir, 6);
  options.chunks = {{"time", 1}};
  options.codec = "none";
  convert(options);
  const auto old_files = file_tree(dir / "out.zarr");

  // An --overwrite cut short leaves the old store as it was, and says where the new one is.
  options.overwrite = true;
  options.codec = "gzip:6";
  options.on_progress = [](const ConvertProgress& p) {
    if (p.units_done >= 2) throw Error("interrupted");
  };
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "interrupted");
  EXPECT_EQ(file_tree(dir / "out.zarr"), old_files);
  const std::filesystem::path replacement = dir / ".out.zarr.zfeed-new";
  EXPECT_TRUE(std::filesystem::exists(replacement / std::string(kProgressKey)));
  options.overwrite = false;
  EXPECT_CONTAINS(error_of([&] { convert(options); }), ".out.zarr.zfeed-new");

  // The next --overwrite resumes it and swaps it in; nothing is left beside the store.
  options.overwrite = true;
  options.on_progress = nullptr;
  ConvertResult result = convert(options);
  EXPECT_GE(result.units_resumed, 2u);
  EXPECT_FALSE(std::filesystem::exists(replacement));
  EXPECT_FALSE(std::filesystem::exists(dir / ".out.zarr.zfeed-old"));
  EXPECT_EQ(zarr::Array::open(open_store(dir / "out.zarr"), "t").metadata().codecs.size(), 2u);
  expect_t_values(read_float(dir / "out.zarr", "t"));
  EXPECT_FALSE(std::filesystem::exists(dir / ("out.zarr/" + std::string(kProgressKey))));

  // A swap cut short between its two renames (a file system without exchange: the old store
  // aside, the new one complete) is finished by the next run, before it looks at the output.
  std::filesystem::rename(dir / "out.zarr", dir / ".out.zarr.zfeed-new");
  std::filesystem::create_directories(dir / ".out.zarr.zfeed-old");
  options.overwrite = false;
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "already exists");
  EXPECT_FALSE(std::filesystem::exists(dir / ".out.zarr.zfeed-old"));
  expect_t_values(read_float(dir / "out.zarr", "t"));

  // An unfinished replacement of other arguments is zfeed's own work: started over.
  options.overwrite = true;
  options.on_progress = [](const ConvertProgress& p) {
    if (p.units_done >= 2) throw Error("interrupted");
  };
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "interrupted");
  options.on_progress = nullptr;
  options.codec = "zstd:1";
  EXPECT_EQ(convert(options).units_resumed, 0u);
  EXPECT_FALSE(std::filesystem::exists(replacement));
  expect_t_values(read_float(dir / "out.zarr", "t"));
}

TEST(Convert, ResumesAfterAnInterruptionAndEndsIdentical) {
  ZFEED_REQUIRE_NETCDF();
  TempDir dir;
  ConvertOptions options = netcdf_conversion(dir, 6, "whole.zarr");
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

  // The same output named as a file:// URL with a trailing separator resumes it.
  options.on_progress = nullptr;
  options.output = "file://" + dir / "resumed.zarr/";
  ConvertResult result = convert(options);
  EXPECT_GE(result.units_resumed, 3u);
  EXPECT_LT(result.units_resumed, result.units_total);
  EXPECT_EQ(file_tree(dir / "whole.zarr"), file_tree(dir / "resumed.zarr"));
  auto t = zarr::Array::open(open_store(dir / "resumed.zarr"), "t");
  EXPECT_EQ(t.metadata().chunk_shape, (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(t.read_chunk_shape(), (std::vector<uint64_t>{1, 3, 4}));
  expect_t_values(read_float(dir / "resumed.zarr", "t"));
}

TEST(Convert, AMalformedProgressRecordIsAClearError) {
  ZFEED_REQUIRE_NETCDF();
  TempDir dir;
  ConvertOptions options = netcdf_conversion(dir, 2);
  std::filesystem::create_directories(dir / "out.zarr");
  for (const char* text : {R"({"arguments": {}, "done": {"t": [[3, 1]]}})",
                           R"({"arguments": {}, "plans": {"t": ["rows"]}})", R"([1, 2])"}) {
    std::ofstream(dir / ("out.zarr/" + std::string(kProgressKey))) << text;
    EXPECT_CONTAINS(error_of([&] { convert(options); }),
                    std::string(kProgressKey) + ": not a progress record as zfeed writes it");
  }
}

TEST(Convert, JoinsInputsAlongTime) {
  ZFEED_REQUIRE_NETCDF();
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

  // The same input twice, or inputs out of order, would repeat or shuffle the times.
  options.overwrite = true;
  for (const auto& inputs : {std::vector<std::string>{dir / "a.nc", dir / "a.nc"},
                             std::vector<std::string>{dir / "b.nc", dir / "a.nc"}}) {
    options.inputs = inputs;
    EXPECT_CONTAINS(error_of([&] { convert(options); }),
                    "give the inputs in time order, each once");
  }
}

TEST(Convert, BadInputsAreClearErrors) {
  ZFEED_REQUIRE_NETCDF();
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "a.nc", 2, 0);
  zfeed::testing::write_test_netcdf(dir / "b.nc", 2, 12, false, 50.0f);  // another grid
  ConvertOptions options;
  options.inputs = {dir / "a.nc", dir / "b.nc"};
  options.output = dir / "out.zarr";
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "mismatched grids: coordinate lat");
  // A variable not along time is written from the first input: the others must agree.
  zfeed::testing::write_test_netcdf(dir / "c.nc", 2, 12, false, 10.0f, 7);
  options.inputs = {dir / "a.nc", dir / "c.nc"};
  EXPECT_CONTAINS(error_of([&] { convert(options); }),
                  "mismatched inputs: level_count, which is not along time, differs between");
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
  ZFEED_REQUIRE_NETCDF();
  TempDir dir;
  ConvertOptions options = netcdf_conversion(dir, 5, "a.zarr");
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
  EXPECT_CONTAINS(error_of([&] { compressor_codec("zstd:99", f4); }), "from -131072 to 22");
  EXPECT_CONTAINS(error_of([&] { compressor_codec("gzip:10", f4); }), "from 0 to 9");
  EXPECT_CONTAINS(error_of([&] { compressor_codec("blosc:zstd:-1", f4); }), "from 0 to 9");
  EXPECT_EQ(compressor_codec("zstd:-5", f4)["configuration"]["level"], -5);
}

// A Zarr group with a level dimension: time(4) int32, level(3) = 1000, 850, 500, lat(3), lon(4);
// t(time, level, lat, lon) = 1000 t + 100 l + 10 y + x; t2m(time, lat, lon) = -(100 t + 10 y + x);
// q(time, lat, lon) int16 packed (scale 0.5, offset 1) with _FillValue -1 at [0, 0, 0];
// orog(lat, lon).
std::string write_level_store(const std::string& path,
                              std::vector<uint64_t> t_chunks = {2, 3, 3, 4}) {
  auto store = open_store(path);
  zarr::Group::create(store, "", 3, Json{{"title", "levels"}});
  auto make = [&](const std::string& name, std::vector<std::string> dims,
                  std::vector<uint64_t> shape, std::vector<uint64_t> chunks, DataTypeId type,
                  Json attributes,
                  const std::function<double(const std::vector<uint64_t>&)>& value) {
    zarr::ArrayMetadata meta;
    meta.shape = shape;
    meta.dtype = DataType{type};
    meta.chunk_shape = chunks;
    meta.fill_value = parse_fill_value(Json(0), meta.dtype, false);
    meta.codecs = Json::array({{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}},
                               {{"name", "zstd"}, {"configuration", {{"level", 1}}}}});
    meta.dimension_names = std::vector<std::optional<std::string>>(dims.begin(), dims.end());
    meta.attributes = attributes;
    auto array = zarr::Array::create(store, name, meta);
    uint64_t n = meta.num_elements();
    std::vector<uint8_t> bytes(n * meta.dtype.size());
    std::vector<uint64_t> index(shape.size(), 0);
    for (uint64_t i = 0; i < n; ++i) {
      double v = value(index);
      if (type == DataTypeId::kFloat32) reinterpret_cast<float*>(bytes.data())[i] = float(v);
      if (type == DataTypeId::kInt32) reinterpret_cast<int32_t*>(bytes.data())[i] = int32_t(v);
      if (type == DataTypeId::kInt16) reinterpret_cast<int16_t*>(bytes.data())[i] = int16_t(v);
      for (size_t d = shape.size(); d-- > 0;) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
    array.write(array.full_selection(), bytes.data());
  };
  make("time", {"time"}, {4}, {4}, DataTypeId::kInt32, {{"units", "hours since 2000-01-01"}},
       [](auto& i) { return 6.0 * double(i[0]); });
  make("level", {"level"}, {3}, {3}, DataTypeId::kInt32, {{"units", "hPa"}}, [](auto& i) {
    return std::vector<double>{1000, 850, 500}[i[0]];
  });
  make("lat", {"lat"}, {3}, {3}, DataTypeId::kFloat32, Json::object(),
       [](auto& i) { return 10.0 - 10.0 * double(i[0]); });
  make("lon", {"lon"}, {4}, {4}, DataTypeId::kFloat32, Json::object(),
       [](auto& i) { return 90.0 * double(i[0]); });
  make("t", {"time", "level", "lat", "lon"}, {4, 3, 3, 4}, t_chunks, DataTypeId::kFloat32,
       {{"units", "K"}}, [](auto& i) { return 1000.0 * i[0] + 100.0 * i[1] + 10.0 * i[2] + i[3]; });
  make("t2m", {"time", "lat", "lon"}, {4, 3, 4}, {1, 3, 4}, DataTypeId::kFloat32, Json::object(),
       [](auto& i) { return -(100.0 * i[0] + 10.0 * i[1] + i[2]); });
  make("q", {"time", "lat", "lon"}, {4, 3, 4}, {4, 3, 4}, DataTypeId::kInt16,
       {{"scale_factor", 0.5}, {"add_offset", 1.0}, {"_FillValue", -1}},
       [](auto& i) { return i[0] + i[1] + i[2] == 0 ? -1.0 : 12.0 * i[0] + 4.0 * i[1] + i[2]; });
  make("orog", {"lat", "lon"}, {3, 4}, {3, 4}, DataTypeId::kFloat32, Json::object(),
       [](auto& i) { return double(i[0] + i[1]); });
  zarr::Group::open(store, "").consolidate();
  return path;
}

float level_t(uint64_t t, uint64_t l, uint64_t y, uint64_t x) {
  return float(1000.0 * t + 100.0 * l + 10.0 * y + x);
}

template <typename T>
std::vector<T> read_all_values(const std::string& path, const std::string& name) {
  auto array = zarr::Array::open(open_store(path), name);
  std::vector<T> values(array.metadata().num_elements());
  array.read(array.full_selection(), values.data());
  return values;
}

TEST(Convert, SelectsLevelsByValueAndByIndex) {
  TempDir dir;
  write_level_store(dir / "in.zarr");
  ConvertOptions options;
  options.inputs = {dir / "in.zarr"};
  options.output = dir / "sel.zarr";
  options.sel = {{"level", {"500", "1000"}}};
  options.variables = {"t"};
  convert(options);
  EXPECT_EQ(read_all_values<int32_t>(dir / "sel.zarr", "level"), (std::vector<int32_t>{500, 1000}));
  auto t = read_all_values<float>(dir / "sel.zarr", "t");
  ASSERT_EQ(t.size(), 4u * 2 * 3 * 4);
  for (uint64_t i = 0; i < 4; ++i) {
    for (uint64_t k = 0; k < 2; ++k) {
      EXPECT_EQ(t[((i * 2 + k) * 3 + 2) * 4 + 3], level_t(i, k == 0 ? 2 : 0, 2, 3));
    }
  }
  options.sel = {};
  options.isel = {{"level", {1}}, {"lon", {3, 0}}};
  options.output = dir / "isel.zarr";
  convert(options);
  EXPECT_EQ(read_all_values<int32_t>(dir / "isel.zarr", "level"), (std::vector<int32_t>{850}));
  EXPECT_EQ(read_all_values<float>(dir / "isel.zarr", "lon"), (std::vector<float>{270, 0}));
  auto t1 = read_all_values<float>(dir / "isel.zarr", "t");
  ASSERT_EQ(t1.size(), 4u * 1 * 3 * 2);
  EXPECT_EQ(t1[0], level_t(0, 1, 0, 3));
  EXPECT_EQ(t1[1], level_t(0, 1, 0, 0));
  EXPECT_EQ(t1[23], level_t(3, 1, 2, 0));

  options.isel = {};
  options.output = dir / "bad.zarr";
  options.sel = {{"level", {"700"}}};
  std::string error = error_of([&] { convert(options); });
  EXPECT_CONTAINS(error, "level=700");
  EXPECT_CONTAINS(error, "1000, 850, 500");
  options.sel = {{"height", {"2"}}};
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "no dimension 'height'");
  options.sel = {};
  options.isel = {{"level", {3}}};
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "out of range");
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.zarr"));
}

TEST(Convert, StacksVariablesAsChannels) {
  TempDir dir;
  write_level_store(dir / "in.zarr");
  ConvertOptions options;
  options.inputs = {dir / "in.zarr"};
  options.output = dir / "stack.zarr";
  options.stack = true;
  options.variables = {"q", "t", "t2m"};
  options.sel = {{"level", {"850", "500"}}};
  ConvertResult result = convert(options);
  EXPECT_EQ(result.variables, (std::vector<std::string>{"lat", "lon", "time", "data"}));
  auto store = open_store(dir / "stack.zarr");
  auto data = zarr::Array::open(store, "data");
  const auto& meta = data.metadata();
  EXPECT_EQ(meta.shape, (std::vector<uint64_t>{4, 4, 3, 4}));
  EXPECT_EQ(meta.chunk_shape, (std::vector<uint64_t>{1, 4, 3, 4}));
  EXPECT_EQ(meta.dtype.id, DataTypeId::kFloat32);
  EXPECT_EQ(*meta.dimension_names->at(1), "variable");
  EXPECT_EQ(meta.attributes["variables"], Json::array({"q", "t_850", "t_500", "t2m"}));
  EXPECT_FALSE(store->size("level/zarr.json").has_value());
  auto values = read_all_values<float>(dir / "stack.zarr", "data");
  auto at = [&](uint64_t t, uint64_t c, uint64_t y, uint64_t x) {
    return values[((t * 4 + c) * 3 + y) * 4 + x];
  };
  EXPECT_TRUE(std::isnan(at(0, 0, 0, 0)));             // q's _FillValue
  EXPECT_EQ(at(2, 0, 1, 3), (24 + 4 + 3) * 0.5f + 1);  // q unpacked
  EXPECT_EQ(at(2, 1, 1, 3), level_t(2, 1, 1, 3));
  EXPECT_EQ(at(3, 2, 2, 0), level_t(3, 2, 2, 0));
  EXPECT_EQ(at(1, 3, 2, 1), -121.0f);

  // Per-channel statistics, in the layout the loader reads (one entry per index along dim 1).
  StatsOptions stats_options;
  auto stats = compute_store_stats(dir / "stack.zarr", stats_options);
  ASSERT_EQ(stats.size(), 1u);
  Json written = zarr::Array::open(open_store(dir / "stack.zarr"), "data")
                     .metadata()
                     .attributes["zfeed_stats"];
  EXPECT_EQ(written["level_dim"], "variable");
  ASSERT_EQ(written["mean"].size(), 4u);
  ASSERT_EQ(written["std"].size(), 4u);
  double t850 = 0;
  for (uint64_t t = 0; t < 4; ++t)
    for (uint64_t y = 0; y < 3; ++y)
      for (uint64_t x = 0; x < 4; ++x) t850 += level_t(t, 1, y, x) / 48.0;
  EXPECT_NEAR(written["mean"][1].get<double>(), t850, 1e-6);
  EXPECT_EQ(written["nan_count"][0], 1);

  // Variables of other shapes are refused, by name.
  options.output = dir / "bad.zarr";
  options.variables = {"t2m", "orog"};
  options.sel = {};
  EXPECT_CONTAINS(error_of([&] { convert(options); }), "--stack: orog has dimensions (lat, lon)");
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.zarr"));
}

TEST(Rechunk, KeepsValuesDataTypesAndAttributes) {
  TempDir dir;
  write_level_store(dir / "in.zarr");
  ConvertOptions options;
  options.inputs = {dir / "in.zarr"};
  options.output = dir / "out.zarr";
  options.chunks = {{"time", 1}, {"lon", 2}};
  options.shards = {{"time", 2}};
  rechunk(options);
  auto q = zarr::Array::open(open_store(dir / "out.zarr"), "q");
  EXPECT_EQ(q.metadata().dtype.id, DataTypeId::kInt16);  // still packed: no CF decoding
  EXPECT_EQ(q.metadata().attributes["scale_factor"], 0.5);
  EXPECT_EQ(q.read_chunk_shape(), (std::vector<uint64_t>{1, 3, 2}));
  EXPECT_EQ(read_all_values<int16_t>(dir / "out.zarr", "q"),
            read_all_values<int16_t>(dir / "in.zarr", "q"));
  auto t = zarr::Array::open(open_store(dir / "out.zarr"), "t");
  // Dimensions not named keep the input's chunk extent (level 3 of 3).
  EXPECT_EQ(t.read_chunk_shape(), (std::vector<uint64_t>{1, 3, 3, 2}));
  EXPECT_EQ(read_all_values<float>(dir / "out.zarr", "t"),
            read_all_values<float>(dir / "in.zarr", "t"));
  EXPECT_EQ(zarr::Group::open(open_store(dir / "out.zarr")).attributes()["title"], "levels");
  // The output never replaces its input.
  options.output = dir / "in.zarr";
  options.overwrite = true;
  EXPECT_CONTAINS(error_of([&] { rechunk(options); }), "is (or holds) the input");
  // Also named by a file:// URL, and an output inside the input.
  options.inputs = {"file://" + (dir / "in.zarr")};
  EXPECT_CONTAINS(error_of([&] { rechunk(options); }), "is (or holds) the input file://");
  options.inputs = {dir / "in.zarr"};
  options.output = dir / "in.zarr/t";
  EXPECT_CONTAINS(error_of([&] { rechunk(options); }), "the output lies inside the input");
  EXPECT_EQ(read_all_values<float>(dir / "out.zarr", "t"),
            read_all_values<float>(dir / "in.zarr", "t"));  // the input untouched
  options.inputs = {dir / "missing.nc"};
  EXPECT_CONTAINS(error_of([&] { rechunk(options); }), "missing.nc");
}

TEST(Rechunk, KeepsTheMaskOfAZarrV2FillValue) {
  // As xarray writes a packed variable to Zarr v2: _FillValue as the fill_value alone.
  TempDir dir;
  auto store = open_store(dir / "v2.zarr");
  zarr::Group::create(store, "", 2, Json::object());
  const Json zarray = {{"zarr_format", 2}, {"shape", {4, 3}},       {"chunks", {2, 3}},
                       {"dtype", "<i2"},   {"compressor", nullptr}, {"fill_value", -32767},
                       {"order", "C"},     {"filters", nullptr},    {"dimension_separator", "."}};
  const Json zattrs = {
      {"scale_factor", 0.002}, {"add_offset", 260.0}, {"_ARRAY_DIMENSIONS", {"time", "x"}}};
  auto t = zarr::Array::create(store, "t", zarr::ArrayMetadata::parse_v2(zarray, zattrs));
  std::vector<int16_t> values = {1, -32767, 3, 4, 5, 6, -32767, 8, 9, 10, 11, 12};
  t.write(t.full_selection(), values.data());
  ConvertOptions options;
  options.inputs = {dir / "v2.zarr"};
  options.output = dir / "out.zarr";
  options.chunks = {{"time", 1}};
  rechunk(options);
  auto out = zarr::Array::open(open_store(dir / "out.zarr"), "t");
  // Still packed, and still masked: read as the input, the two missing values stay missing.
  ASSERT_TRUE(out.metadata().attributes.contains("_FillValue"));
  EXPECT_EQ(out.metadata().attributes["_FillValue"], -32767);
  EXPECT_EQ(read_all_values<int16_t>(dir / "out.zarr", "t"), values);
}

// An array large enough for the budget to matter: 48 x 64 x 64 float32 (768 KiB), chunks of 8
// time steps rechunked to one step and 32 x 32.
std::string write_big_store(const std::string& path) {
  auto store = open_store(path);
  zarr::Group::create(store, "", 3, Json::object());
  zarr::ArrayMetadata meta;
  meta.shape = {48, 64, 64};
  meta.dtype = DataType{DataTypeId::kFloat32};
  meta.chunk_shape = {8, 64, 64};
  meta.fill_value = parse_fill_value(Json("NaN"), meta.dtype, false);
  meta.codecs = Json::array({{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}},
                             {{"name", "zstd"}, {"configuration", {{"level", 1}}}}});
  meta.dimension_names = std::vector<std::optional<std::string>>{"time", "y", "x"};
  auto array = zarr::Array::create(store, "field", meta);
  std::vector<float> values(48 * 64 * 64);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = float(std::sin(double(i) * 0.001) * 100 + double(i % 7));
  array.write(array.full_selection(), values.data());
  return path;
}

TEST(Rechunk, StaysWithinTheMemoryBudget) {
  TempDir dir;
  write_big_store(dir / "in.zarr");
  ConvertOptions options;
  options.inputs = {dir / "in.zarr"};
  options.output = dir / "out.zarr";
  options.chunks = {{"time", 1}, {"y", 32}, {"x", 32}};
  options.threads = 2;  // the budgets below hold for 2 threads' working buffers
  options.max_memory = 2 << 20;
  ConvertResult result = rechunk(options);
  EXPECT_LE(result.thread_bytes + result.peak_unit_bytes, options.max_memory);
  EXPECT_EQ(read_all_values<float>(dir / "out.zarr", "field"),
            read_all_values<float>(dir / "in.zarr", "field"));
  EXPECT_EQ(zarr::Array::open(open_store(dir / "out.zarr"), "field").metadata().chunk_shape,
            (std::vector<uint64_t>{1, 32, 32}));

  // One thread (a pool of its own where the shared one is bigger): half the working buffers.
  options.output = dir / "one-thread.zarr";
  options.threads = 1;
  const ConvertResult one_thread = rechunk(options);
  EXPECT_EQ(2 * one_thread.thread_bytes, result.thread_bytes);
  EXPECT_EQ(read_all_values<float>(dir / "one-thread.zarr", "field"),
            read_all_values<float>(dir / "in.zarr", "field"));
  options.threads = 2;

  // A budget for barely one input chunk row: units split, still within it.
  options.output = dir / "tight.zarr";
  options.max_memory = 600 << 10;
  result = rechunk(options);
  EXPECT_LE(result.thread_bytes + result.peak_unit_bytes, options.max_memory);
  EXPECT_EQ(read_all_values<float>(dir / "tight.zarr", "field"),
            read_all_values<float>(dir / "in.zarr", "field"));

  // Too small for one chunk: refused before anything is written, naming the budget that works.
  options.output = dir / "none.zarr";
  options.max_memory = 64 << 10;
  std::string error = error_of([&] { rechunk(options); });
  EXPECT_CONTAINS(error, "--max-memory 64KiB is too small");
  EXPECT_CONTAINS(error, "give --max-memory");
  EXPECT_FALSE(std::filesystem::exists(dir / "none.zarr"));
  // A budget is never printed larger than it is (100 bytes were "1KiB").
  options.max_memory = 100;
  EXPECT_CONTAINS(error_of([&] { rechunk(options); }), "--max-memory 100B is too small");
  options.max_memory = (64 << 10) + 1000;
  EXPECT_CONTAINS(error_of([&] { rechunk(options); }), "--max-memory 64KiB is too small");
}

TEST(Rechunk, ResumesAfterAnInterruptionAndEndsIdentical) {
  TempDir dir;
  write_big_store(dir / "in.zarr");
  ConvertOptions options;
  options.inputs = {dir / "in.zarr"};
  options.output = dir / "whole.zarr";
  options.chunks = {{"time", 1}, {"y", 32}};
  options.threads = 2;  // the budgets below hold for 2 threads' working buffers
  options.max_memory = 1 << 20;
  rechunk(options);
  options.output = dir / "resumed.zarr";
  options.on_progress = [](const ConvertProgress& p) {
    if (p.units_done >= 2) throw Error("interrupted");
  };
  EXPECT_CONTAINS(error_of([&] { rechunk(options); }), "interrupted");
  EXPECT_TRUE(std::filesystem::exists(dir / ("resumed.zarr/" + std::string(kProgressKey))));
  EXPECT_FALSE(std::filesystem::exists(dir / "resumed.zarr/zarr.json"));
  options.on_progress = nullptr;
  options.max_memory = 2 << 20;  // another budget: the recorded units still fit it and are kept
  ConvertResult result = rechunk(options);
  EXPECT_GE(result.units_resumed, 2u);
  EXPECT_EQ(file_tree(dir / "whole.zarr"), file_tree(dir / "resumed.zarr"));
}

TEST(Convert, ParsesSelectionsAndMemorySizes) {
  EXPECT_EQ(parse_dim_values("level=500,850", "--sel"),
            (std::pair<std::string, std::vector<std::string>>{"level", {"500", "850"}}));
  EXPECT_CONTAINS(error_of([] { parse_dim_values("level", "--sel"); }), "DIM=V1,V2");
  EXPECT_EQ(parse_memory_size("512MiB", "--max-memory"), uint64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("2GiB", "--max-memory"), uint64_t{2} << 30);
  EXPECT_EQ(parse_memory_size("1.5G", "--max-memory"), uint64_t{3} << 29);
  EXPECT_EQ(parse_memory_size("100MB", "--max-memory"), uint64_t{100000000});
  EXPECT_EQ(parse_memory_size("4096", "--max-memory"), uint64_t{4096});
  EXPECT_CONTAINS(error_of([] { parse_memory_size("lots", "--max-memory"); }), "512MiB");
  EXPECT_CONTAINS(error_of([] { parse_memory_size("-1G", "--max-memory"); }), "--max-memory");
}

}  // namespace
}  // namespace zfeed::ingest
