#include "zfeed/zarr/cf.h"

#include <gtest/gtest.h>

#include "zfeed/util/testing.h"

namespace zfeed::zarr {
namespace {

using testing::error_of;

ArrayMetadata v2(const std::string& dtype, const Json& fill, const Json& attributes) {
  Json json = {{"zarr_format", 2},   {"shape", {4}}, {"chunks", {4}},         {"dtype", dtype},
               {"fill_value", fill}, {"order", "C"}, {"compressor", nullptr}, {"filters", nullptr}};
  return ArrayMetadata::parse_v2(json, attributes);
}

TEST(CfEncoding, ReadsScaleOffsetAndMissingValues) {
  const auto packed = cf_encoding(DataType::from_name("int16"),
                                  Json{{"scale_factor", {0.5}},
                                       {"add_offset", 10},
                                       {"_FillValue", -1},
                                       {"missing_value", {-2, -3}}},
                                  "t2m");
  EXPECT_TRUE(packed.packed && packed.active());
  EXPECT_EQ(packed.scale, 0.5);
  EXPECT_EQ(packed.offset, 10.0);
  EXPECT_EQ(packed.missing, (std::vector<double>{-1, -2, -3}));
  const auto masked = cf_encoding(DataType::from_name("float32"), Json{{"_FillValue", "NaN"}}, "x");
  EXPECT_FALSE(masked.active());  // a NaN fill needs no masking
  EXPECT_FALSE(
      cf_encoding(DataType::from_name("float16"), Json{{"scale_factor", 2}}, "h").active());
  EXPECT_FALSE(cf_encoding(DataType::from_name("int8"), Json::object(), "plain").active());
  EXPECT_CONTAINS(error_of([] {
                    cf_encoding(DataType::from_name("int16"), Json{{"scale_factor", "big"}}, "t2m");
                  }),
                  "t2m: attribute scale_factor must be a number, got \"big\"");
}

// xarray takes a v2 array's fill_value as _FillValue; zfeed does where the array has CF
// attributes (a plain zarr-python array's fill_value 0 is no missing value).
TEST(CfEncoding, AV2FillValueCountsBesideCfAttributes) {
  const auto packed = cf_encoding(v2("<i2", -32767, Json{{"scale_factor", 0.1}}), "t");
  EXPECT_EQ(packed.missing, (std::vector<double>{-32767}));
  EXPECT_FALSE(cf_encoding(v2("<i2", 0, Json::object()), "plain").active());
  const auto explicit_fill =
      cf_encoding(v2("<i2", 0, Json{{"add_offset", 1.0}, {"_FillValue", 7}}), "t");
  EXPECT_EQ(explicit_fill.missing, (std::vector<double>{7}));
  // A float array's fill_value other than 0 is a mask by itself (xarray writes _FillValue so);
  // 0, zarr-python's default, is not (a dry hour's precipitation is no missing value).
  EXPECT_EQ(cf_encoding(v2("<f4", -9999.0, Json::object()), "sst").missing,
            (std::vector<double>{-9999.0}));
  EXPECT_FALSE(cf_encoding(v2("<f4", 0.0, Json::object()), "tp").active());
  EXPECT_FALSE(cf_encoding(v2("<f8", "NaN", Json::object()), "t").active());
}

}  // namespace
}  // namespace zfeed::zarr
