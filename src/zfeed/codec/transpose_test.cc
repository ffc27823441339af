// transpose (array->array).
#include <gtest/gtest.h>

#include <cstring>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::error_of;
using testing::make_chain;
using testing::make_spec;

std::string transpose_then_bytes(const std::string& order) {
  return R"([{"name": "transpose", "configuration": {"order": )" + order +
         R"(}}, {"name": "bytes", "configuration": {"endian": "little"}}])";
}

TEST(TransposeCodec, TwoDimensionalIsMatrixTranspose) {
  auto spec = make_spec(DataTypeId::kInt32, {2, 3});
  int32_t values[6] = {0, 1, 2, 10, 11, 12};  // [[0,1,2],[10,11,12]]
  CodecChain chain = make_chain(transpose_then_bytes("[1, 0]"), spec);
  Bytes encoded = chain.encode(reinterpret_cast<uint8_t*>(values));
  ASSERT_EQ(encoded.size(), 24u);
  const int32_t expected[6] = {0, 10, 1, 11, 2, 12};
  EXPECT_EQ(0, std::memcmp(encoded.data(), expected, 24));
  int32_t decoded[6] = {};
  chain.decode(encoded, reinterpret_cast<uint8_t*>(decoded));
  EXPECT_EQ(0, std::memcmp(decoded, values, 24));
}

TEST(TransposeCodec, ThreeDimensionalMatchesDefinition) {
  // encoded[e0, e1, e2] = decoded[d] with e_i = d_{order[i]}.
  const std::vector<uint64_t> shape{2, 3, 4};
  const std::vector<size_t> order{2, 0, 1};
  auto spec = make_spec(DataTypeId::kUInt16, shape);
  std::vector<uint16_t> values(24);
  for (size_t i = 0; i < 24; ++i) values[i] = static_cast<uint16_t>(i * 7 + 1);
  CodecChain chain = make_chain(transpose_then_bytes("[2, 0, 1]"), spec);
  Bytes encoded = chain.encode(reinterpret_cast<uint8_t*>(values.data()));
  std::vector<uint64_t> encoded_shape{shape[order[0]], shape[order[1]],
                                      shape[order[2]]};  // 4, 2, 3
  for (uint64_t a = 0; a < 2; ++a) {
    for (uint64_t b = 0; b < 3; ++b) {
      for (uint64_t c = 0; c < 4; ++c) {
        uint64_t d[3] = {a, b, c};
        uint64_t e[3] = {d[order[0]], d[order[1]], d[order[2]]};
        uint64_t encoded_index = (e[0] * encoded_shape[1] + e[1]) * encoded_shape[2] + e[2];
        uint16_t got;
        std::memcpy(&got, encoded.data() + encoded_index * 2, 2);
        ASSERT_EQ(got, values[(a * 3 + b) * 4 + c]) << a << "," << b << "," << c;
      }
    }
  }
  testing::expect_round_trip(chain, Bytes(reinterpret_cast<uint8_t*>(values.data()), 48));
}

TEST(TransposeCodec, EveryPermutationRoundTrips) {
  auto spec = make_spec(DataTypeId::kComplex128, {2, 3, 5});
  Bytes values = testing::sample_chunk(spec, 5);
  for (const char* order :
       {"[0, 1, 2]", "[0, 2, 1]", "[1, 0, 2]", "[1, 2, 0]", "[2, 0, 1]", "[2, 1, 0]"}) {
    SCOPED_TRACE(order);
    testing::expect_round_trip(make_chain(transpose_then_bytes(order), spec), values);
  }
}

TEST(TransposeCodec, InverseOfTwoTransposesIsIdentity) {
  // [1, 2, 0] then [2, 0, 1] composes to the identity: the stored bytes equal the plain layout.
  auto spec = make_spec(DataTypeId::kFloat32, {3, 4, 5});
  Bytes values = testing::sample_chunk(spec, 9);
  CodecChain chain = make_chain(
      R"([{"name": "transpose", "configuration": {"order": [1, 2, 0]}},
          {"name": "transpose", "configuration": {"order": [2, 0, 1]}},
          {"name": "bytes", "configuration": {"endian": "little"}}])",
      spec);
  Bytes encoded = testing::expect_round_trip(chain, values);
  ASSERT_EQ(encoded.size(), values.size());
  EXPECT_TRUE(testing::same_bytes(encoded.data(), values.data(), values.size()));
}

TEST(TransposeCodec, LegacyCAndFStrings) {
  auto spec = make_spec(DataTypeId::kInt8, {2, 3, 4});
  CodecChain f =
      make_chain(R"([{"name": "transpose", "configuration": {"order": "F"}}, "bytes"])", spec);
  EXPECT_EQ(f.to_json()[0]["configuration"]["order"], Json::parse("[2, 1, 0]"));
  CodecChain c =
      make_chain(R"([{"name": "transpose", "configuration": {"order": "C"}}, "bytes"])", spec);
  EXPECT_EQ(c.to_json()[0]["configuration"]["order"], Json::parse("[0, 1, 2]"));
  testing::expect_round_trip(f, testing::sample_chunk(spec));
}

TEST(TransposeCodec, InvalidOrdersAreRejected) {
  auto spec = make_spec(DataTypeId::kInt8, {2, 3});
  for (const char* order :
       {"[0, 0]", "[0, 2]", "[-1, 0]", "[1.5, 0]", "[0]", "[0, 1, 2]", "\"X\"", "7"}) {
    SCOPED_TRACE(order);
    std::string message = error_of([&] {
      make_chain(std::string(R"([{"name": "transpose", "configuration": {"order": )") + order +
                     "}}, \"bytes\"]",
                 spec);
    });
    EXPECT_CONTAINS(message, "codec transpose");
    EXPECT_CONTAINS(message, "\"order\"");
  }
  EXPECT_CONTAINS(error_of([&] { make_chain(R"([{"name": "transpose"}, "bytes"])", spec); }),
                  "missing required field \"order\"");
}

}  // namespace
}  // namespace zfeed
