#include "zfeed/ingest/netcdf.h"

#include <gtest/gtest.h>

#include <fstream>

#include "zfeed/ingest/convert.h"
#include "zfeed/ingest/netcdf_testing.h"
#include "zfeed/util/testing.h"

namespace zfeed::ingest {
namespace {

using zfeed::testing::TempDir;

// In every build a netCDF file is recognized by its signature; where zfeed was built without
// netCDF, opening or converting one is an UnsupportedError that says so and why.
TEST(NetcdfSource, ANetcdfFileIsRecognizedAndRefusedClearlyWithoutLibnetcdf) {
  TempDir dir;
  std::ofstream(dir / "header-only.nc", std::ios::binary) << std::string("CDF\x01\0\0\0\0", 8);
  EXPECT_TRUE(looks_like_netcdf(dir / "header-only.nc"));
  if (netcdf_support().available) {  // (libnetcdf takes these 8 bytes as an empty file)
    EXPECT_TRUE(netcdf_support().reason.empty());
    return;
  }
  EXPECT_CONTAINS(netcdf_support().reason, "netCDF support was not built");
  std::string message =
      zfeed::testing::error_of<UnsupportedError>([&] { open_source(dir / "header-only.nc"); });
  EXPECT_CONTAINS(message, "header-only.nc: a netCDF file, but netCDF support was not built (");
  ConvertOptions options;
  options.inputs = {dir / "header-only.nc"};
  options.output = dir / "out.zarr";
  message = zfeed::testing::error_of<UnsupportedError>([&] { convert(options); });
  EXPECT_CONTAINS(message, "netCDF support was not built");
}

#if !ZFEED_HAVE_NETCDF
TEST(NetcdfSource, ReadsNetcdfFiles) { ZFEED_REQUIRE_NETCDF(); }
#else
void check_file(const std::string& path, const char* format) {
  NetcdfSource source(path);
  EXPECT_EQ(source.format(), format);
  EXPECT_EQ(source.attributes()["Conventions"], "CF-1.6");
  EXPECT_EQ(source.attributes()["version"], 3);
  ASSERT_EQ(source.skipped().size(), 1u);
  EXPECT_CONTAINS(source.skipped()[0], "label");
  const Variable* t = source.find("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype.id, DataTypeId::kInt16);
  EXPECT_EQ(t->dims, (std::vector<std::string>{"time", "lat", "lon"}));
  EXPECT_EQ(t->shape, (std::vector<uint64_t>{4, 3, 4}));
  EXPECT_EQ(t->attributes["scale_factor"], 0.5);
  EXPECT_EQ(t->attributes["_FillValue"], -32767);
  EXPECT_EQ(t->attributes["units"], "K");
  EXPECT_FALSE(t->is_coordinate());
  const Variable* z = source.find("z");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->attributes["valid_range"], (Json::array({-1.5, 2.5})));
  const Variable* time = source.find("time");
  ASSERT_NE(time, nullptr);
  EXPECT_TRUE(time->is_coordinate());
  EXPECT_EQ(time->attributes["calendar"], "gregorian");

  // A hyperslab: time 1..3, lat 1..2, lon 2..3.
  std::vector<int16_t> values(2 * 2 * 2);
  std::vector<uint64_t> start{1, 1, 2}, count{2, 2, 2};
  source.read(*t, start, count, values.data());
  std::vector<int16_t> expected;
  for (uint64_t i = 1; i < 3; ++i) {
    for (uint64_t j = 1; j < 3; ++j) {
      for (uint64_t k = 2; k < 4; ++k) {
        size_t global = i * 12 + j * 4 + k;
        expected.push_back(global % 5 == 0 ? int16_t(-32767) : int16_t(global * 3 - 100));
      }
    }
  }
  EXPECT_EQ(values, expected);
  std::vector<uint64_t> bad_start{3, 0, 0}, bad_count{2, 1, 1};
  EXPECT_CONTAINS(
      zfeed::testing::error_of([&] { source.read(*t, bad_start, bad_count, values.data()); }),
      "out of bounds");
}

TEST(NetcdfSource, ReadsClassicFiles) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "a.nc", 4);
  EXPECT_TRUE(looks_like_netcdf(dir / "a.nc"));
  check_file(dir / "a.nc", "netCDF-3 classic");
}

TEST(NetcdfSource, ReadsNetcdf4Files) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "a.nc", 4, 0, true);
  EXPECT_TRUE(looks_like_netcdf(dir / "a.nc"));
  check_file(dir / "a.nc", "netCDF-4");
}

TEST(NetcdfSource, TruncatedAndMissingFilesAreErrors) {
  TempDir dir;
  zfeed::testing::write_test_netcdf(dir / "a.nc", 4);
  {
    std::ifstream in(dir / "a.nc", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out(dir / "cut.nc", std::ios::binary);
    out.write(bytes.data(), 200);
  }
  std::string message = zfeed::testing::error_of([&] {
    NetcdfSource source(dir / "cut.nc");
    const Variable* t = source.find("t");
    std::vector<int16_t> values(48);
    std::vector<uint64_t> start{0, 0, 0}, count{4, 3, 4};
    if (t) source.read(*t, start, count, values.data());
  });
  EXPECT_CONTAINS(message, "cut.nc");
  EXPECT_CONTAINS(zfeed::testing::error_of([&] { NetcdfSource source(dir / "none.nc"); }),
                  "none.nc");
  std::ofstream(dir / "text.nc") << "hello, not netCDF";
  EXPECT_FALSE(looks_like_netcdf(dir / "text.nc"));
}

TEST(NetcdfSource, ReadsTheSharedEcmwfFile) {
  ZFEED_REQUIRE_SHARED(path, "data/ecmwf-t-z-2007-01-01.nc");
  NetcdfSource source(path);
  EXPECT_EQ(source.format(), "netCDF-3 64-bit offset");
  const Variable* t = source.find("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<uint64_t>{1, 2, 181, 360}));
  EXPECT_EQ(t->dtype.id, DataTypeId::kInt16);
  EXPECT_TRUE(t->attributes.contains("scale_factor"));
}
#endif  // ZFEED_HAVE_NETCDF

}  // namespace
}  // namespace zfeed::ingest
