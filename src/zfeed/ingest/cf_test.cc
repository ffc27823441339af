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
}

}  // namespace
}  // namespace zfeed::ingest
