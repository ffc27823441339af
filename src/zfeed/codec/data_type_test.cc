#include "zfeed/codec/data_type.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"

namespace zfeed {
namespace {

using testing::error_of;

template <typename T>
T fill_as(const FillValue& fill) {
  T value;
  std::memcpy(&value, fill.bytes.data(), sizeof(T));
  return value;
}

FillValue parse(std::string_view json, DataTypeId id) {
  return parse_fill_value(Json::parse(json), DataType{id}, false);
}

// Parses, prints and parses again; returns the printed JSON.
Json round_trip(std::string_view json, DataTypeId id) {
  FillValue fill = parse(json, id);
  Json printed = fill_value_to_json(fill, DataType{id});
  EXPECT_EQ(parse_fill_value(printed, DataType{id}, false), fill)
      << json << " -> " << printed.dump();
  return printed;
}

TEST(DataType, NamesSizesAndKinds) {
  struct Row {
    const char* name;
    size_t size, component;
  } rows[] = {{"bool", 1, 1},    {"int8", 1, 1},      {"int16", 2, 2},      {"int32", 4, 4},
              {"int64", 8, 8},   {"uint8", 1, 1},     {"uint16", 2, 2},     {"uint32", 4, 4},
              {"uint64", 8, 8},  {"float16", 2, 2},   {"bfloat16", 2, 2},   {"float32", 4, 4},
              {"float64", 8, 8}, {"complex64", 8, 4}, {"complex128", 16, 8}};
  for (const auto& row : rows) {
    DataType type = DataType::from_name(row.name);
    EXPECT_EQ(type.name(), row.name);
    EXPECT_EQ(type.size(), row.size) << row.name;
    EXPECT_EQ(type.component_size(), row.component) << row.name;
    EXPECT_EQ(DataType::from_json_v3(Json(row.name)), type);
  }
  EXPECT_TRUE(DataType{DataTypeId::kBFloat16}.is_float());
  EXPECT_FALSE(DataType{DataTypeId::kComplex64}.is_float());
  EXPECT_TRUE(DataType{DataTypeId::kComplex64}.is_complex());
  EXPECT_TRUE(DataType{DataTypeId::kUInt8}.is_integer());
  EXPECT_FALSE(DataType{DataTypeId::kBool}.is_integer());
  EXPECT_TRUE(DataType{DataTypeId::kInt64}.is_signed());
  EXPECT_FALSE(DataType{DataTypeId::kUInt64}.is_signed());
}

TEST(DataType, UnknownTypesAreUnsupported) {
  EXPECT_EQ(error_of<UnsupportedError>([] { DataType::from_name("float8_e4m3"); }),
            "unsupported data type \"float8_e4m3\"");
  EXPECT_CONTAINS(
      error_of<UnsupportedError>([] { DataType::from_json_v3(Json::parse(R"({"name": "r24"})")); }),
      "unsupported data type \"r24\"");
  EXPECT_CONTAINS(error_of([] { DataType::from_json_v3(Json(5)); }), "data_type must be a string");
}

TEST(DataType, NumpyTypestrings) {
  Endian endian;
  EXPECT_EQ(DataType::from_numpy_typestr("<f4", &endian).id, DataTypeId::kFloat32);
  EXPECT_EQ(endian, Endian::kLittle);
  EXPECT_EQ(DataType::from_numpy_typestr(">i8", &endian).id, DataTypeId::kInt64);
  EXPECT_EQ(endian, Endian::kBig);
  EXPECT_EQ(DataType::from_numpy_typestr("|b1", &endian).id, DataTypeId::kBool);
  EXPECT_EQ(DataType::from_numpy_typestr("|u1", &endian).id, DataTypeId::kUInt8);
  EXPECT_EQ(DataType::from_numpy_typestr("<c16", &endian).id, DataTypeId::kComplex128);
  EXPECT_EQ(DataType::from_numpy_typestr("<f2", &endian).id, DataTypeId::kFloat16);
  for (const char* bad :
       {"<f3", "f4", "<U10", "|f4", "<M8[ns]", "", "<i99999999999999999999", "%i4"}) {
    EXPECT_CONTAINS(error_of<UnsupportedError>([&] { DataType::from_numpy_typestr(bad, &endian); }),
                    "unsupported v2 dtype");
  }
  EXPECT_EQ(DataType{DataTypeId::kFloat64}.numpy_typestr(Endian::kBig), ">f8");
  EXPECT_EQ(DataType{DataTypeId::kInt8}.numpy_typestr(Endian::kBig), "|i1");
  EXPECT_EQ(DataType{DataTypeId::kBool}.numpy_typestr(), "|b1");
  EXPECT_EQ(DataType{DataTypeId::kComplex64}.numpy_typestr(), "<c8");
  EXPECT_THROW(DataType{DataTypeId::kBFloat16}.numpy_typestr(), UnsupportedError);
}

TEST(FillValue, Numbers) {
  EXPECT_EQ(fill_as<int16_t>(parse("-300", DataTypeId::kInt16)), -300);
  EXPECT_EQ(fill_as<uint8_t>(parse("255", DataTypeId::kUInt8)), 255);
  EXPECT_EQ(fill_as<float>(parse("1.5", DataTypeId::kFloat32)), 1.5f);
  EXPECT_EQ(fill_as<double>(parse("-2.25e10", DataTypeId::kFloat64)), -2.25e10);
  EXPECT_EQ(fill_as<double>(parse("3", DataTypeId::kFloat64)), 3.0);
  EXPECT_EQ(fill_as<int32_t>(parse("7.0", DataTypeId::kInt32)), 7);
  EXPECT_EQ(fill_as<uint8_t>(parse("true", DataTypeId::kBool)), 1);
  EXPECT_EQ(fill_as<uint8_t>(parse("false", DataTypeId::kBool)), 0);
  EXPECT_EQ(fill_as<uint8_t>(parse("1", DataTypeId::kBool)), 1);
  EXPECT_EQ(round_trip("-300", DataTypeId::kInt16), Json(-300));
  EXPECT_EQ(round_trip("true", DataTypeId::kBool), Json(true));
  EXPECT_EQ(round_trip("0.1", DataTypeId::kFloat64), Json(0.1));
}

TEST(FillValue, SixtyFourBitExtremesAreExact) {
  EXPECT_EQ(fill_as<uint64_t>(parse("18446744073709551615", DataTypeId::kUInt64)), UINT64_MAX);
  EXPECT_EQ(fill_as<int64_t>(parse("-9223372036854775808", DataTypeId::kInt64)), INT64_MIN);
  EXPECT_EQ(fill_as<int64_t>(parse("9223372036854775807", DataTypeId::kInt64)), INT64_MAX);
  EXPECT_EQ(fill_as<uint64_t>(parse("9007199254740993", DataTypeId::kUInt64)), 9007199254740993ull);
  EXPECT_EQ(round_trip("18446744073709551615", DataTypeId::kUInt64).dump(), "18446744073709551615");
  EXPECT_EQ(round_trip("-9223372036854775808", DataTypeId::kInt64).dump(), "-9223372036854775808");
  EXPECT_EQ(round_trip("9007199254740993", DataTypeId::kInt64).dump(), "9007199254740993");
}

TEST(FillValue, OutOfRangeIntegersAreErrors) {
  struct Case {
    const char* json;
    DataTypeId id;
    const char* why;
  } cases[] = {
      {"256", DataTypeId::kUInt8, "out of range"},
      {"-1", DataTypeId::kUInt64, "negative"},
      {"-129", DataTypeId::kInt8, "out of range"},
      {"9223372036854775808", DataTypeId::kInt64, "out of range"},
      {"1.5", DataTypeId::kInt32, "not an integer"},
      {"1e19", DataTypeId::kUInt64, "too large to be exact"},
      {"\"NaN\"", DataTypeId::kInt32, "expected an integer"},
      {"2", DataTypeId::kBool, "expected true or false"},
      {"null", DataTypeId::kFloat32, "a fill value is required"},
      {"\"nan\"", DataTypeId::kFloat32, "expected a number"},
      {"[1, 2]", DataTypeId::kFloat64, "expected a number"},
      {"1.0", DataTypeId::kComplex64, "expected [real, imaginary]"},
      {"[1.0]", DataTypeId::kComplex128, "expected [real, imaginary]"},
      {"\"0x7fc0\"", DataTypeId::kFloat32, "exactly 8 digits"},
      {"\"0x7fc0000g\"", DataTypeId::kFloat32, "not a hex digit"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.json);
    std::string message = error_of([&] { parse(c.json, c.id); });
    EXPECT_CONTAINS(message, "fill_value");
    EXPECT_CONTAINS(message, std::string(DataType{c.id}.name()));
    EXPECT_CONTAINS(message, c.why);
  }
}

TEST(FillValue, SpecialFloats) {
  for (DataTypeId id :
       {DataTypeId::kFloat16, DataTypeId::kBFloat16, DataTypeId::kFloat32, DataTypeId::kFloat64}) {
    SCOPED_TRACE(std::string(DataType{id}.name()));
    EXPECT_EQ(round_trip("\"NaN\"", id), Json("NaN"));
    EXPECT_EQ(round_trip("\"Infinity\"", id), Json("Infinity"));
    EXPECT_EQ(round_trip("\"-Infinity\"", id), Json("-Infinity"));
  }
  EXPECT_EQ(fill_as<uint32_t>(parse("\"NaN\"", DataTypeId::kFloat32)), 0x7fc00000u);
  EXPECT_EQ(fill_as<uint64_t>(parse("\"NaN\"", DataTypeId::kFloat64)), 0x7ff8000000000000ull);
  EXPECT_EQ(fill_as<uint16_t>(parse("\"NaN\"", DataTypeId::kFloat16)), 0x7e00u);
  EXPECT_EQ(fill_as<uint16_t>(parse("\"NaN\"", DataTypeId::kBFloat16)), 0x7fc0u);
  EXPECT_EQ(fill_as<float>(parse("\"-Infinity\"", DataTypeId::kFloat32)),
            -std::numeric_limits<float>::infinity());
  // -0.0 keeps its sign.
  EXPECT_EQ(fill_as<uint64_t>(parse("-0.0", DataTypeId::kFloat64)), 0x8000000000000000ull);
  EXPECT_EQ(round_trip("-0.0", DataTypeId::kFloat64).dump(), "-0.0");
  EXPECT_EQ(fill_as<uint16_t>(parse("-0.0", DataTypeId::kFloat16)), 0x8000u);
}

TEST(FillValue, HexBitPatternsKeepNaNPayloads) {
  FillValue fill = parse("\"0x7fc00001\"", DataTypeId::kFloat32);
  EXPECT_EQ(fill_as<uint32_t>(fill), 0x7fc00001u);
  EXPECT_EQ(fill_value_to_json(fill, DataType{DataTypeId::kFloat32}), Json("0x7fc00001"));
  EXPECT_EQ(round_trip("\"0xFFF8000000000123\"", DataTypeId::kFloat64), Json("0xfff8000000000123"));
  EXPECT_EQ(round_trip("\"0x7e01\"", DataTypeId::kFloat16), Json("0x7e01"));
  EXPECT_EQ(round_trip("\"0xffc1\"", DataTypeId::kBFloat16), Json("0xffc1"));
  // A hex pattern of an ordinary number prints as the number.
  EXPECT_EQ(round_trip("\"0x3f800000\"", DataTypeId::kFloat32), Json(1.0));
  EXPECT_EQ(fill_as<float>(parse("\"0x3f800000\"", DataTypeId::kFloat32)), 1.0f);
}

TEST(FillValue, Complex) {
  FillValue fill = parse("[1.5, -2.0]", DataTypeId::kComplex64);
  EXPECT_EQ(fill_as<float>(fill), 1.5f);
  float imaginary;
  std::memcpy(&imaginary, fill.bytes.data() + 4, 4);
  EXPECT_EQ(imaginary, -2.0f);
  EXPECT_EQ(round_trip("[1.5, -2.0]", DataTypeId::kComplex64), Json::parse("[1.5, -2.0]"));
  EXPECT_EQ(round_trip("[\"NaN\", \"Infinity\"]", DataTypeId::kComplex128),
            Json::parse("[\"NaN\", \"Infinity\"]"));
  EXPECT_EQ(round_trip("[\"0x7ff8000000000001\", 0]", DataTypeId::kComplex128),
            Json::parse("[\"0x7ff8000000000001\", 0.0]"));
}

TEST(FillValue, NullOnlyWhereAllowed) {
  FillValue fill = parse_fill_value(Json(nullptr), DataType{DataTypeId::kInt32}, true);
  EXPECT_TRUE(fill.is_null);
  EXPECT_TRUE(fill_value_to_json(fill, DataType{DataTypeId::kInt32}).is_null());
}

TEST(Float16, RoundsToNearestEven) {
  EXPECT_EQ(double_to_float16(1.0), 0x3c00);
  EXPECT_EQ(double_to_float16(-2.0), 0xc000);
  EXPECT_EQ(double_to_float16(65504.0), 0x7bff);  // largest finite
  EXPECT_EQ(double_to_float16(65520.0), 0x7c00);  // halfway to the next: rounds up to infinity
  EXPECT_EQ(double_to_float16(65519.99), 0x7bff);
  EXPECT_EQ(double_to_float16(1e10), 0x7c00);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(double_to_float16(1.0 + std::ldexp(1.0, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): rounds up.
  EXPECT_EQ(double_to_float16(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);
  EXPECT_EQ(double_to_float16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -20)), 0x3c01);
  // Subnormals: the smallest is 2^-24; half of it ties to zero, 3/2 of it to 2 * 2^-24.
  EXPECT_EQ(double_to_float16(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(double_to_float16(std::ldexp(1.0, -25)), 0x0000);
  EXPECT_EQ(double_to_float16(std::ldexp(3.0, -25)), 0x0002);
  EXPECT_EQ(double_to_float16(std::ldexp(1023.5, -24)),
            0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(double_to_float16(std::ldexp(1.0, -14)), 0x0400);
  EXPECT_EQ(float16_to_double(0x3c00), 1.0);
  EXPECT_EQ(float16_to_double(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(float16_to_double(0x7bff), 65504.0);
  EXPECT_TRUE(std::isinf(float16_to_double(0xfc00)));
  EXPECT_TRUE(std::isnan(float16_to_double(0x7e00)));
  for (uint32_t bits = 0; bits < 0x7c00; ++bits) {  // every finite positive value round-trips
    ASSERT_EQ(double_to_float16(float16_to_double(static_cast<uint16_t>(bits))), bits);
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(double_to_bfloat16(1.0), 0x3f80);
  EXPECT_EQ(double_to_bfloat16(-1.0), 0xbf80);
  EXPECT_EQ(double_to_bfloat16(1.0 + std::ldexp(1.0, -8)), 0x3f80);      // tie, to even
  EXPECT_EQ(double_to_bfloat16(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);  // tie, to even (up)
  EXPECT_EQ(double_to_bfloat16(1.0 + std::ldexp(1.0, -8) + 1e-6), 0x3f81);
  EXPECT_EQ(double_to_bfloat16(3.3895313892515355e38), 0x7f7f);  // largest finite
  EXPECT_EQ(double_to_bfloat16(3.4e38), 0x7f80);                 // overflows to infinity
  EXPECT_EQ(double_to_bfloat16(std::ldexp(1.0, -133)), 0x0001);  // smallest subnormal
  EXPECT_EQ(bfloat16_to_double(0x3f80), 1.0);
  EXPECT_EQ(bfloat16_to_double(0x4049), 3.140625);
  for (uint32_t bits = 0; bits < 0x7f80; bits += 7) {
    ASSERT_EQ(double_to_bfloat16(bfloat16_to_double(static_cast<uint16_t>(bits))), bits);
  }
  EXPECT_EQ(fill_as<uint16_t>(parse("3.14159", DataTypeId::kBFloat16)), 0x4049);
  EXPECT_EQ(fill_as<uint16_t>(parse("0.1", DataTypeId::kFloat16)), 0x2e66);
}

TEST(FillWith, WritesPatternAndComparesBitwise) {
  DataType f32{DataTypeId::kFloat32};
  FillValue nan = parse("\"0x7fc00001\"", DataTypeId::kFloat32);
  std::vector<uint32_t> buffer(1000, 0);
  fill_with(reinterpret_cast<uint8_t*>(buffer.data()), 999, nan, f32);
  for (size_t i = 0; i < 999; ++i) ASSERT_EQ(buffer[i], 0x7fc00001u) << i;
  EXPECT_EQ(buffer[999], 0u);
  EXPECT_TRUE(all_equal_fill(reinterpret_cast<uint8_t*>(buffer.data()), 999, nan, f32));
  EXPECT_FALSE(all_equal_fill(reinterpret_cast<uint8_t*>(buffer.data()), 1000, nan, f32));
  // Another NaN payload is not the fill value.
  buffer[500] = 0x7fc00000u;
  EXPECT_FALSE(all_equal_fill(reinterpret_cast<uint8_t*>(buffer.data()), 999, nan, f32));
  // -0.0 is not 0.0.
  FillValue zero = parse("0.0", DataTypeId::kFloat32);
  float values[3] = {0.0f, -0.0f, 0.0f};
  EXPECT_FALSE(all_equal_fill(reinterpret_cast<uint8_t*>(values), 3, zero, f32));
  values[1] = 0.0f;
  EXPECT_TRUE(all_equal_fill(reinterpret_cast<uint8_t*>(values), 3, zero, f32));
  EXPECT_TRUE(all_equal_fill(nullptr, 0, zero, f32));
  // complex128: 16-byte pattern.
  FillValue complex = parse("[1.0, 2.0]", DataTypeId::kComplex128);
  std::vector<double> pairs(10);
  fill_with(reinterpret_cast<uint8_t*>(pairs.data()), 5, complex,
            DataType{DataTypeId::kComplex128});
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(pairs[i], i % 2 ? 2.0 : 1.0);
}

TEST(CheckedProduct, OverflowNamesTheField) {
  EXPECT_EQ(checked_product({2, 3, 4}, 8, "shape"), 192u);
  EXPECT_EQ(checked_product({}, 8, "shape"), 8u);
  EXPECT_EQ(checked_product({0, UINT64_MAX}, 8, "shape"), 0u);
  EXPECT_EQ(error_of([] {
              checked_product({1ull << 32, 1ull << 32}, 1, "chunk_shape");
            }),
            "chunk_shape overflows 64-bit byte counts");
  EXPECT_CONTAINS(error_of([] { checked_product({1ull << 61}, 8, "shape"); }), "overflows");
}

}  // namespace
}  // namespace zfeed
