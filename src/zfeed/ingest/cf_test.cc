#include "zfeed/ingest/cf.h"

#include <gtest/gtest.h>

#include <cmath>

#include "zfeed/util/testing.h"

namespace zfeed::ingest {
namespace {

Variable variable(DataTypeId id, Json attributes) {
  Variable v;
  v.name = "v";
  v.dtype = DataType{id};
  v.dims = {"x"};
  v.shape = {4};
  v.attributes = std::move(attributes);
  return v;
}

TEST(CfDecoding, UnpacksToFloat32WithNaN) {
  auto plan = plan_cf_decoding(variable(DataTypeId::kInt16, {{"scale_factor", 0.5},
                                                             {"add_offset", 10.0},
                                                             {"_FillValue", -1},
                                                             {"missing_value", -2},
                                                             {"units", "K"}}));
  EXPECT_TRUE(plan.active);
  EXPECT_EQ(plan.output.id, DataTypeId::kFloat32);
  EXPECT_EQ(plan.attributes, (Json{{"units", "K"}}));
  int16_t in[4] = {0, -1, 4, -2};
  float out[4];
  plan.apply(in, out, 4);
  EXPECT_EQ(out[0], 10.0f);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 12.0f);
  EXPECT_TRUE(std::isnan(out[3]));
}

TEST(CfDecoding, MasksFloatsAndKeepsTheirType) {
  auto plan = plan_cf_decoding(variable(DataTypeId::kFloat64, {{"_FillValue", 1e20}}));
  EXPECT_EQ(plan.output.id, DataTypeId::kFloat64);
  double in[4] = {1, 1e20, 3, 4};
  double out[4];
  plan.apply(in, out, 4);
  EXPECT_EQ(out[0], 1.0);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_TRUE(plan.attributes.empty());
}

TEST(CfDecoding, MaskedIntegersWidenLikeXarray) {
  EXPECT_EQ(plan_cf_decoding(variable(DataTypeId::kInt8, {{"_FillValue", 0}})).output.id,
            DataTypeId::kFloat32);
  EXPECT_EQ(plan_cf_decoding(variable(DataTypeId::kInt32, {{"_FillValue", 0}})).output.id,
            DataTypeId::kFloat64);
}

TEST(CfDecoding, PlainVariablesAreCopied) {
  auto plan = plan_cf_decoding(variable(DataTypeId::kInt32, {{"units", "1"}}));
  EXPECT_FALSE(plan.active);
  EXPECT_EQ(plan.output.id, DataTypeId::kInt32);
  int32_t in[4] = {1, 2, 3, 4}, out[4] = {};
  plan.apply(in, out, 4);
  EXPECT_EQ(out[3], 4);
  EXPECT_EQ(plan.attributes, (Json{{"units", "1"}}));
}

TEST(CfDecoding, MalformedAttributesAreErrors) {
  EXPECT_CONTAINS(zfeed::testing::error_of([] {
                    plan_cf_decoding(variable(DataTypeId::kInt16, {{"scale_factor", "big"}}));
                  }),
                  "scale_factor");
  // Named with the file where one is given.
  EXPECT_CONTAINS(
      zfeed::testing::error_of([] {
        plan_cf_decoding(variable(DataTypeId::kInt16, {{"scale_factor", "0.5"}}), "/data/e1.nc");
      }),
      "/data/e1.nc: v: attribute scale_factor must be a number");
  EXPECT_CONTAINS(zfeed::testing::error_of([] {
                    plan_cf_decoding(variable(DataTypeId::kFloat32, {{"_FillValue", "lots"}}));
                  }),
                  "v: attribute _FillValue must be numeric, got \"lots\"");
}

TEST(CfDecoding, AFloatFillValueAsXarrayWritesItOnZarrV3) {
  // The base64 of a little-endian double: NaN ("AAAAAAAA+H8="), -9999.0 ("AAAAAICHw8A=").
  auto nan_fill =
      plan_cf_decoding(variable(DataTypeId::kFloat32, {{"_FillValue", "AAAAAAAA+H8="}}));
  EXPECT_TRUE(nan_fill.encoding.missing.empty());
  auto plan = plan_cf_decoding(variable(DataTypeId::kFloat32, {{"_FillValue", "AAAAAICHw8A="}}));
  ASSERT_EQ(plan.encoding.missing.size(), 1u);
  EXPECT_EQ(plan.encoding.missing[0], -9999.0);
  float in[4] = {1.5f, -9999.0f, 2.0f, 0.0f}, out[4];
  plan.apply(in, out, 4);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_TRUE(std::isnan(out[1]));
  auto infinite = plan_cf_decoding(variable(DataTypeId::kFloat64, {{"_FillValue", "-Infinity"}}));
  EXPECT_EQ(infinite.encoding.missing, (std::vector<double>{-INFINITY}));
}

TEST(CfDecoding, UnsignedFlagReadsSignedIntegersAsUnsigned) {
  // netCDF-3 keeps uint16 radiances as short with _Unsigned = "true" (GOES-R ABI): -25536 is
  // 40000, and a _FillValue of -1 is 65535.
  auto plan = plan_cf_decoding(variable(
      DataTypeId::kInt16,
      {{"_Unsigned", "true"}, {"scale_factor", 0.01}, {"_FillValue", -1}, {"units", "W"}}));
  EXPECT_TRUE(plan.active);
  EXPECT_EQ(plan.attributes, (Json{{"units", "W"}}));
  int16_t in[4] = {-25536, -1, 100, 0};
  float out[4];
  plan.apply(in, out, 4);
  EXPECT_FLOAT_EQ(out[0], 400.0f);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_FLOAT_EQ(out[2], 1.0f);
  // Without packing or a fill value: the unsigned values, in a float type that holds them.
  auto bare = plan_cf_decoding(variable(DataTypeId::kInt8, {{"_Unsigned", "true"}}));
  EXPECT_TRUE(bare.active);
  int8_t small[2] = {-1, 5};
  float small_out[2];
  bare.apply(small, small_out, 2);
  EXPECT_EQ(small_out[0], 255.0f);
  EXPECT_EQ(small_out[1], 5.0f);
}

}  // namespace
}  // namespace zfeed::ingest
