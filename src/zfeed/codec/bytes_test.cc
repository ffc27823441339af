// bytes (array->bytes): every data type, both byte orders.
#include <gtest/gtest.h>

#include <complex>
#include <cstring>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::error_of;
using testing::make_chain;
using testing::make_spec;

constexpr DataTypeId kAllTypes[] = {
    DataTypeId::kBool,    DataTypeId::kInt8,      DataTypeId::kInt16,      DataTypeId::kInt32,
    DataTypeId::kInt64,   DataTypeId::kUInt8,     DataTypeId::kUInt16,     DataTypeId::kUInt32,
    DataTypeId::kUInt64,  DataTypeId::kFloat16,   DataTypeId::kBFloat16,   DataTypeId::kFloat32,
    DataTypeId::kFloat64, DataTypeId::kComplex64, DataTypeId::kComplex128,
};

std::string bytes_codec(const char* endian) {
  return std::string(R"([{"name": "bytes", "configuration": {"endian": ")") + endian + "\"}}]";
}

TEST(BytesCodec, RoundTripEveryTypeBothEndians) {
  for (DataTypeId id : kAllTypes) {
    for (const char* endian : {"little", "big"}) {
      auto spec = make_spec(id, {3, 5});
      SCOPED_TRACE(std::string(spec.dtype.name()) + " " + endian);
      Bytes values = testing::sample_chunk(spec, 11);
      if (id == DataTypeId::kBool) {
        for (auto& b : values) b &= 1;
      }
      Bytes encoded = testing::expect_round_trip(make_chain(bytes_codec(endian), spec), values);
      ASSERT_EQ(encoded.size(), spec.num_bytes());
      // Little-endian storage is the memory as it is; big-endian swaps each component.
      const size_t unit = spec.dtype.component_size();
      for (size_t i = 0; i < encoded.size(); ++i) {
        size_t expected_index = i;
        if (std::string(endian) == "big")
          expected_index = (i / unit) * unit + (unit - 1 - i % unit);
        ASSERT_EQ(encoded[i], values[expected_index]) << "byte " << i;
      }
    }
  }
}

TEST(BytesCodec, KnownBigEndianLayouts) {
  auto spec = make_spec(DataTypeId::kUInt32, {2});
  uint32_t values[2] = {0x01020304u, 0xA0B0C0D0u};
  Bytes encoded = make_chain(bytes_codec("big"), spec).encode(reinterpret_cast<uint8_t*>(values));
  const uint8_t expected[] = {1, 2, 3, 4, 0xA0, 0xB0, 0xC0, 0xD0};
  ASSERT_EQ(encoded.size(), 8u);
  EXPECT_EQ(0, std::memcmp(encoded.data(), expected, 8));

  // complex64 is real then imaginary, each swapped on its own.
  auto cspec = make_spec(DataTypeId::kComplex64, {1});
  std::complex<float> z(1.0f, -2.0f);
  Bytes cencoded = make_chain(bytes_codec("big"), cspec).encode(reinterpret_cast<uint8_t*>(&z));
  const uint8_t cexpected[] = {0x3f, 0x80, 0, 0, 0xc0, 0x00, 0, 0};
  ASSERT_EQ(cencoded.size(), 8u);
  EXPECT_EQ(0, std::memcmp(cencoded.data(), cexpected, 8));
}

TEST(BytesCodec, EndianRequiredForMultiByteTypesOnly) {
  std::string message =
      error_of([] { make_chain(R"(["bytes"])", make_spec(DataTypeId::kFloat32, {2})); });
  EXPECT_EQ(message, "codec bytes: \"endian\" is required for data type float32");
  for (DataTypeId id : {DataTypeId::kBool, DataTypeId::kInt8, DataTypeId::kUInt8}) {
    auto spec = make_spec(id, {4});
    CodecChain chain = make_chain(R"(["bytes"])", spec);
    EXPECT_EQ(chain.to_json(), Json::parse(R"([{"name": "bytes"}])"));
    Bytes values(4);
    for (size_t i = 0; i < 4; ++i) values[i] = static_cast<uint8_t>(i & 1);
    testing::expect_round_trip(chain, values);
  }
  EXPECT_CONTAINS(error_of([] {
                    make_chain(R"([{"name": "bytes", "configuration": {"endian": "middle"}}])",
                               make_spec(DataTypeId::kInt16, {2}));
                  }),
                  "\"endian\" must be \"little\" or \"big\"");
}

TEST(BytesCodec, ChunkOfWrongSizeNamesShapeAndType) {
  auto spec = make_spec(DataTypeId::kFloat32, {4, 6});
  CodecChain chain = make_chain(bytes_codec("little"), spec);
  Bytes short_chunk(95);
  EXPECT_EQ(testing::decode_error(chain, short_chunk),
            "chunk holds 95 bytes, expected 96 for shape [4, 6] of float32");
  Bytes long_chunk(97);
  EXPECT_CONTAINS(testing::decode_error(chain, long_chunk), "chunk holds 97 bytes, expected 96");
  EXPECT_CONTAINS(testing::decode_error(make_chain(bytes_codec("big"), spec), Bytes(3)),
                  "holds 3 bytes");
}

}  // namespace
}  // namespace zfeed
