#include "zfeed/codec/data_type.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "zfeed/util/error.h"

namespace zfeed {
namespace {

struct TypeInfo {
  DataTypeId id;
  std::string_view name;
  size_t size;
  size_t component_size;
  char numpy_kind;  // 0 where NumPy has no type string
};

constexpr TypeInfo kTypes[] = {
    {DataTypeId::kBool, "bool", 1, 1, 'b'},
    {DataTypeId::kInt8, "int8", 1, 1, 'i'},
    {DataTypeId::kInt16, "int16", 2, 2, 'i'},
    {DataTypeId::kInt32, "int32", 4, 4, 'i'},
    {DataTypeId::kInt64, "int64", 8, 8, 'i'},
    {DataTypeId::kUInt8, "uint8", 1, 1, 'u'},
    {DataTypeId::kUInt16, "uint16", 2, 2, 'u'},
    {DataTypeId::kUInt32, "uint32", 4, 4, 'u'},
    {DataTypeId::kUInt64, "uint64", 8, 8, 'u'},
    {DataTypeId::kFloat16, "float16", 2, 2, 'f'},
    {DataTypeId::kBFloat16, "bfloat16", 2, 2, 0},
    {DataTypeId::kFloat32, "float32", 4, 4, 'f'},
    {DataTypeId::kFloat64, "float64", 8, 8, 'f'},
    {DataTypeId::kComplex64, "complex64", 8, 4, 'c'},
    {DataTypeId::kComplex128, "complex128", 16, 8, 'c'},
};

const TypeInfo& info(DataTypeId id) { return kTypes[static_cast<size_t>(id)]; }

uint16_t double_to_minifloat(double value, int exponent_bits, int mantissa_bits) {
  const uint16_t sign = std::signbit(value) ? uint16_t(1u << (exponent_bits + mantissa_bits)) : 0;
  const uint16_t exponent_all_ones = uint16_t(((1u << exponent_bits) - 1) << mantissa_bits);
  if (std::isnan(value)) return uint16_t(exponent_all_ones | (1u << (mantissa_bits - 1)));
  double magnitude = std::fabs(value);
  if (std::isinf(magnitude)) return sign | exponent_all_ones;
  if (magnitude == 0) return sign;
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int min_exponent = 1 - bias;
  int frexp_exponent = 0;
  std::frexp(magnitude, &frexp_exponent);
  int exponent = frexp_exponent - 1;  // magnitude = 1.f * 2^exponent
  if (exponent < min_exponent) {
    // Subnormal: count quanta of 2^(min_exponent - mantissa_bits), rounding to nearest even.
    // A result of 2^mantissa_bits is the smallest normal, which the same bits encode.
    double quanta = std::nearbyint(std::ldexp(magnitude, mantissa_bits - min_exponent));
    return sign | static_cast<uint16_t>(quanta);
  }
  double scaled = std::nearbyint(std::ldexp(magnitude, mantissa_bits - exponent));
  if (scaled >= std::ldexp(1.0, mantissa_bits + 1)) {
    scaled = std::ldexp(1.0, mantissa_bits);
    ++exponent;
  }
  int biased = exponent + bias;
  if (biased >= (1 << exponent_bits) - 1) return sign | exponent_all_ones;  // overflow: infinity
  uint16_t mantissa = static_cast<uint16_t>(static_cast<uint32_t>(scaled) - (1u << mantissa_bits));
  return sign | uint16_t(biased << mantissa_bits) | mantissa;
}

double minifloat_to_double(uint16_t bits, int exponent_bits, int mantissa_bits) {
  const bool negative = (bits >> (exponent_bits + mantissa_bits)) & 1;
  const int exponent_field = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = bits & ((1 << mantissa_bits) - 1);
  const int bias = (1 << (exponent_bits - 1)) - 1;
  double magnitude;
  if (exponent_field == (1 << exponent_bits) - 1) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else if (exponent_field == 0) {
    magnitude = std::ldexp(double(mantissa), 1 - bias - mantissa_bits);
  } else {
    magnitude =
        std::ldexp(double(mantissa + (1 << mantissa_bits)), exponent_field - bias - mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

[[noreturn]] void bad_fill(const Json& value, DataType type, std::string_view why) {
  throw Error("fill_value " + value.dump() + " is not valid for data type " +
              std::string(type.name()) + ": " + std::string(why));
}

// A JSON number or special string as a double; hex bit patterns are handled by the caller.
double json_to_double(const Json& value, DataType type) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (text == "Infinity") return std::numeric_limits<double>::infinity();
    if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  bad_fill(value, type, "expected a number, \"NaN\", \"Infinity\", \"-Infinity\" or \"0x...\"");
}

// Parses one floating-point component of `size` bytes into `out`.
void parse_float_component(const Json& value, DataType type, size_t size, DataTypeId float_id,
                           uint8_t* out) {
  if (value.is_string() && value.get_ref<const std::string&>().starts_with("0x")) {
    const auto& text = value.get_ref<const std::string&>();
    if (text.size() != 2 + 2 * size) {
      bad_fill(value, type,
               "a hex bit pattern needs exactly " + std::to_string(2 * size) + " digits");
    }
    uint64_t bits = 0;
    for (size_t i = 2; i < text.size(); ++i) {
      char c = text[i];
      int digit = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
      if (digit < 0) bad_fill(value, type, "not a hex digit: '" + std::string(1, c) + "'");
      bits = (bits << 4) | uint64_t(digit);
    }
    std::memcpy(out, &bits, size);  // little-endian: the low bytes
    return;
  }
  double number = json_to_double(value, type);
  switch (float_id) {
    case DataTypeId::kFloat16: {
      uint16_t bits = double_to_float16(number);
      std::memcpy(out, &bits, 2);
      break;
    }
    case DataTypeId::kBFloat16: {
      uint16_t bits = double_to_bfloat16(number);
      std::memcpy(out, &bits, 2);
      break;
    }
    case DataTypeId::kFloat32: {
      float f = std::isnan(number) ? std::bit_cast<float>(0x7fc00000u) : static_cast<float>(number);
      std::memcpy(out, &f, 4);
      break;
    }
    default: {
      double d = std::isnan(number) ? std::bit_cast<double>(0x7ff8000000000000ull) : number;
      std::memcpy(out, &d, 8);
      break;
    }
  }
}

template <typename T>
void store_integer(const Json& value, DataType type, uint8_t* out) {
  T result{};
  if (value.is_number_unsigned()) {
    uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max()))
      bad_fill(value, type, "out of range");
    result = static_cast<T>(v);
  } else if (value.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0) bad_fill(value, type, "negative value for an unsigned type");
      if (static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        bad_fill(value, type, "out of range");
      }
    } else {
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
        bad_fill(value, type, "out of range");
      }
    }
    result = static_cast<T>(v);
  } else if (value.is_number_float()) {
    double v = value.get<double>();
    if (std::floor(v) != v) bad_fill(value, type, "not an integer");
    // Only doubles that are exact integers within 2^53 are accepted; larger ones lost digits.
    if (std::fabs(v) > 9007199254740992.0)
      bad_fill(value, type, "too large to be exact as a float");
    if (v < static_cast<double>(std::numeric_limits<T>::min()) ||
        v > static_cast<double>(std::numeric_limits<T>::max())) {
      bad_fill(value, type, "out of range");
    }
    result = static_cast<T>(v);
  } else {
    bad_fill(value, type, "expected an integer");
  }
  std::memcpy(out, &result, sizeof(T));
}

template <typename T>
Json integer_json(const uint8_t* bytes) {
  T v;
  std::memcpy(&v, bytes, sizeof(T));
  return Json(v);
}

Json float_json(const uint8_t* bytes, size_t size, DataTypeId id) {
  uint64_t bits = 0;
  std::memcpy(&bits, bytes, size);
  double value;
  uint64_t canonical_nan;
  switch (id) {
    case DataTypeId::kFloat16:
      value = float16_to_double(uint16_t(bits));
      canonical_nan = 0x7e00;
      break;
    case DataTypeId::kBFloat16:
      value = bfloat16_to_double(uint16_t(bits));
      canonical_nan = 0x7fc0;
      break;
    case DataTypeId::kFloat32:
      value = std::bit_cast<float>(uint32_t(bits));
      canonical_nan = 0x7fc00000;
      break;
    default:
      value = std::bit_cast<double>(bits);
      canonical_nan = 0x7ff8000000000000ull;
      break;
  }
  if (std::isnan(value)) {
    if (bits == canonical_nan) return "NaN";
    static const char* digits = "0123456789abcdef";
    std::string text = "0x";
    for (int shift = int(size * 8) - 4; shift >= 0; shift -= 4)
      text += digits[(bits >> shift) & 15];
    return text;
  }
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return Json(value);
}

}  // namespace

size_t DataType::size() const { return info(id).size; }
size_t DataType::component_size() const { return info(id).component_size; }
std::string_view DataType::name() const { return info(id).name; }
bool DataType::is_float() const {
  return id == DataTypeId::kFloat16 || id == DataTypeId::kBFloat16 || id == DataTypeId::kFloat32 ||
         id == DataTypeId::kFloat64;
}
bool DataType::is_complex() const {
  return id == DataTypeId::kComplex64 || id == DataTypeId::kComplex128;
}
bool DataType::is_integer() const { return id >= DataTypeId::kInt8 && id <= DataTypeId::kUInt64; }
bool DataType::is_signed() const { return id >= DataTypeId::kInt8 && id <= DataTypeId::kInt64; }

std::string DataType::numpy_typestr(Endian endian) const {
  const auto& type = info(id);
  if (type.numpy_kind == 0) {
    throw UnsupportedError("data type " + std::string(type.name) +
                           " has no NumPy type string (Zarr v2)");
  }
  char order = type.size == 1 ? '|' : endian == Endian::kLittle ? '<' : '>';
  return std::string(1, order) + type.numpy_kind + std::to_string(type.size);
}

DataType DataType::from_name(std::string_view name) {
  for (const auto& type : kTypes) {
    if (type.name == name) return DataType{type.id};
  }
  throw UnsupportedError("unsupported data type \"" + std::string(name) + "\"");
}

DataType DataType::from_json_v3(const Json& value) {
  if (value.is_string()) return from_name(value.get_ref<const std::string&>());
  if (value.is_object() && value.contains("name") && value["name"].is_string()) {
    throw UnsupportedError("unsupported data type \"" + value["name"].get<std::string>() + "\"");
  }
  throw Error("data_type must be a string, got " + value.dump());
}

DataType DataType::from_numpy_typestr(std::string_view typestr, Endian* endian) {
  auto fail = [&]() -> DataType {
    throw UnsupportedError("unsupported v2 dtype \"" + std::string(typestr) + "\"");
  };
  if (typestr.size() < 3) fail();
  char order = typestr[0];
  char kind = typestr[1];
  if (order != '<' && order != '>' && order != '|' && order != '=') fail();
  size_t size = 0;
  for (char c : typestr.substr(2)) {
    if (c < '0' || c > '9') fail();
    size = size * 10 + size_t(c - '0');
    if (size > 64) fail();
  }
  for (const auto& type : kTypes) {
    if (type.numpy_kind == kind && type.size == size) {
      if (endian) *endian = order == '>' ? Endian::kBig : Endian::kLittle;
      if (order == '|' && size > 1) fail();
      return DataType{type.id};
    }
  }
  return fail();
}

FillValue parse_fill_value(const Json& value, DataType type, bool allow_null) {
  FillValue fill;
  if (value.is_null()) {
    if (!allow_null) bad_fill(value, type, "a fill value is required");
    fill.is_null = true;
    return fill;
  }
  uint8_t* out = fill.bytes.data();
  switch (type.id) {
    case DataTypeId::kBool:
      if (value.is_boolean()) {
        out[0] = value.get<bool>() ? 1 : 0;
      } else if (value.is_number_integer() &&
                 (value.get<int64_t>() == 0 || value.get<int64_t>() == 1)) {
        out[0] = uint8_t(value.get<int64_t>());
      } else {
        bad_fill(value, type, "expected true or false");
      }
      break;
    case DataTypeId::kInt8:
      store_integer<int8_t>(value, type, out);
      break;
    case DataTypeId::kInt16:
      store_integer<int16_t>(value, type, out);
      break;
    case DataTypeId::kInt32:
      store_integer<int32_t>(value, type, out);
      break;
    case DataTypeId::kInt64:
      store_integer<int64_t>(value, type, out);
      break;
    case DataTypeId::kUInt8:
      store_integer<uint8_t>(value, type, out);
      break;
    case DataTypeId::kUInt16:
      store_integer<uint16_t>(value, type, out);
      break;
    case DataTypeId::kUInt32:
      store_integer<uint32_t>(value, type, out);
      break;
    case DataTypeId::kUInt64:
      store_integer<uint64_t>(value, type, out);
      break;
    case DataTypeId::kFloat16:
    case DataTypeId::kBFloat16:
    case DataTypeId::kFloat32:
    case DataTypeId::kFloat64:
      parse_float_component(value, type, type.size(), type.id, out);
      break;
    case DataTypeId::kComplex64:
    case DataTypeId::kComplex128: {
      if (!value.is_array() || value.size() != 2)
        bad_fill(value, type, "expected [real, imaginary]");
      DataTypeId component =
          type.id == DataTypeId::kComplex64 ? DataTypeId::kFloat32 : DataTypeId::kFloat64;
      size_t half = type.component_size();
      parse_float_component(value[0], type, half, component, out);
      parse_float_component(value[1], type, half, component, out + half);
      break;
    }
  }
  return fill;
}

Json fill_value_to_json(const FillValue& fill, DataType type) {
  if (fill.is_null) return nullptr;
  const uint8_t* bytes = fill.bytes.data();
  switch (type.id) {
    case DataTypeId::kBool:
      return Json(bytes[0] != 0);
    case DataTypeId::kInt8:
      return integer_json<int8_t>(bytes);
    case DataTypeId::kInt16:
      return integer_json<int16_t>(bytes);
    case DataTypeId::kInt32:
      return integer_json<int32_t>(bytes);
    case DataTypeId::kInt64:
      return integer_json<int64_t>(bytes);
    case DataTypeId::kUInt8:
      return integer_json<uint8_t>(bytes);
    case DataTypeId::kUInt16:
      return integer_json<uint16_t>(bytes);
    case DataTypeId::kUInt32:
      return integer_json<uint32_t>(bytes);
    case DataTypeId::kUInt64:
      return integer_json<uint64_t>(bytes);
    case DataTypeId::kComplex64:
      return Json::array({float_json(bytes, 4, DataTypeId::kFloat32),
                          float_json(bytes + 4, 4, DataTypeId::kFloat32)});
    case DataTypeId::kComplex128:
      return Json::array({float_json(bytes, 8, DataTypeId::kFloat64),
                          float_json(bytes + 8, 8, DataTypeId::kFloat64)});
    default:
      return float_json(bytes, type.size(), type.id);
  }
}

void fill_with(uint8_t* out, size_t count, const FillValue& fill, DataType type) {
  const size_t item = type.size();
  const size_t total = count * item;
  if (total == 0) return;
  bool zero = true;
  for (size_t i = 0; i < item; ++i) zero = zero && fill.bytes[i] == 0;
  if (zero) {
    std::memset(out, 0, total);
    return;
  }
  std::memcpy(out, fill.bytes.data(), item);
  size_t done = item;
  while (done < total) {  // doubling copies
    size_t step = std::min(done, total - done);
    std::memcpy(out + done, out, step);
    done += step;
  }
}

bool all_equal_fill(const uint8_t* data, size_t count, const FillValue& fill, DataType type) {
  const size_t item = type.size();
  if (count == 0) return true;
  if (std::memcmp(data, fill.bytes.data(), item) != 0) return false;
  // Every element equals the first, and the first equals the fill value.
  return std::memcmp(data, data + item, (count - 1) * item) == 0;
}

uint16_t double_to_float16(double value) { return double_to_minifloat(value, 5, 10); }
uint16_t double_to_bfloat16(double value) { return double_to_minifloat(value, 8, 7); }
double float16_to_double(uint16_t bits) { return minifloat_to_double(bits, 5, 10); }
double bfloat16_to_double(uint16_t bits) { return minifloat_to_double(bits, 8, 7); }

uint64_t checked_product(const std::vector<uint64_t>& extents, uint64_t factor,
                         std::string_view what) {
  uint64_t product = factor;
  for (uint64_t extent : extents) {
    if (__builtin_mul_overflow(product, extent, &product)) {
      throw Error(std::string(what) + " overflows 64-bit byte counts");
    }
  }
  return product;
}

}  // namespace zfeed
