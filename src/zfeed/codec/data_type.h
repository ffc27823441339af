// Zarr data types and fill values. Values in memory are always native (little-endian on every
// platform zfeed builds for); codecs convert to and from the stored byte order.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zfeed/util/json.h"

namespace zfeed {

enum class DataTypeId : uint8_t {
  kBool,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kComplex64,
  kComplex128,
};

enum class Endian { kLittle, kBig };

struct DataType {
  DataTypeId id = DataTypeId::kUInt8;

  size_t size() const;            // bytes per element
  size_t component_size() const;  // bytes per byte-swapped unit (complex64: 4)
  bool is_float() const;          // float16, bfloat16, float32, float64 (not complex)
  bool is_complex() const;
  bool is_integer() const;  // signed or unsigned (not bool)
  bool is_signed() const;
  std::string_view name() const;  // the v3 name: "float32"
  // NumPy's type string with byte order ("<f4", "|u1", "|b1"); bfloat16 has none and throws.
  std::string numpy_typestr(Endian endian = Endian::kLittle) const;

  // Parses a v3 data_type (a string; object forms are extensions zfeed does not implement).
  static DataType from_json_v3(const Json& value);
  // Parses a v2 dtype ("<f4", ">i8", "|b1") and reports its byte order.
  static DataType from_numpy_typestr(std::string_view typestr, Endian* endian);
  static DataType from_name(std::string_view name);  // throws UnsupportedError if unknown

  bool operator==(const DataType&) const = default;
};

// One element's value in native byte order; 16 bytes hold every type up to complex128.
struct FillValue {
  std::array<uint8_t, 16> bytes{};
  // v2's "fill_value": null (no fill value; missing chunks read as zeros).
  bool is_null = false;

  bool operator==(const FillValue&) const = default;
};

// Parses a fill value for `type`: numbers, "NaN", "Infinity", "-Infinity", "0x..." bit patterns,
// [re, im] for complex, true/false for bool; 64-bit integers exactly. `allow_null` for v2.
FillValue parse_fill_value(const Json& value, DataType type, bool allow_null);
Json fill_value_to_json(const FillValue& fill, DataType type);

// Writes `count` copies of the fill value's element into `out`.
void fill_with(uint8_t* out, size_t count, const FillValue& fill, DataType type);
// True if every element of the buffer equals the fill value bit for bit.
bool all_equal_fill(const uint8_t* data, size_t count, const FillValue& fill, DataType type);

// IEEE binary16 and bfloat16 conversions with round-to-nearest-even.
uint16_t double_to_float16(double value);
uint16_t double_to_bfloat16(double value);
double float16_to_double(uint16_t bits);
double bfloat16_to_double(uint16_t bits);

// Product of the extents, or an error naming `what` if it overflows 64 bits.
uint64_t checked_product(const std::vector<uint64_t>& extents, uint64_t factor,
                         std::string_view what);

}  // namespace zfeed
