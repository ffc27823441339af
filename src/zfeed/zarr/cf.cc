#include "zfeed/zarr/cf.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "zfeed/util/error.h"

namespace zfeed::zarr {
namespace {

double number_attribute(const Json& attributes, const char* name, const std::string& what) {
  const Json& value = attributes[name];
  const Json& scalar = value.is_array() && value.size() == 1 ? value[0] : value;
  if (!scalar.is_number()) {
    throw Error(what + ": attribute " + name + " must be a number, got " + value.dump());
  }
  return scalar.get<double>();
}

// The bytes of standard base64 `text`; nullopt where it is not base64.
std::optional<std::vector<uint8_t>> base64_bytes(const std::string& text) {
  auto digit = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::vector<uint8_t> out;
  uint32_t bits = 0;
  int count = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '=') {
      if (i + 2 < text.size()) return std::nullopt;  // padding only at the end
      break;
    }
    const int value = digit(text[i]);
    if (value < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(value);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<uint8_t>(bits >> count));
    }
  }
  return out;
}

// A float fill value in a string: "NaN" (no value to match: NaN is missing anyway), "Infinity",
// "-Infinity", or the base64 of a little-endian double (xarray's zarr engine writes
// _FillValue so on Zarr v3).
std::optional<std::optional<double>> float_fill_text(const std::string& text) {
  if (text == "NaN" || text == "nan") return std::optional<double>();
  if (text == "Infinity" || text == "inf") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity" || text == "-inf") return -std::numeric_limits<double>::infinity();
  const auto bytes = base64_bytes(text);
  if (!bytes || bytes->size() != 8) return std::nullopt;
  uint64_t bits = 0;
  for (int i = 7; i >= 0; --i) bits = (bits << 8) | (*bytes)[static_cast<size_t>(i)];
  double value;
  std::memcpy(&value, &bits, sizeof value);
  if (std::isnan(value)) return std::optional<double>();
  return value;
}

void collect_missing(const Json& attributes, const char* name, const std::string& what,
                     bool float_values, std::vector<double>* out) {
  if (!attributes.contains(name)) return;
  const Json& value = attributes[name];
  auto add = [&](const Json& item) {
    if (item.is_number()) {
      out->push_back(item.get<double>());
      return;
    }
    if (item.is_null()) return;
    if (item.is_string()) {
      const std::string text = item.get<std::string>();
      if (text == "NaN" || text == "nan") return;
      if (float_values) {
        if (const auto fill = float_fill_text(text)) {
          if (*fill) out->push_back(**fill);
          return;
        }
      }
    }
    throw Error(what + ": attribute " + name + " must be numeric, got " + value.dump());
  };
  if (value.is_array()) {
    for (const auto& item : value) add(item);
  } else {
    add(value);
  }
}

}  // namespace

CfEncoding cf_encoding(DataType dtype, const Json& attributes, const std::string& what) {
  CfEncoding encoding;
  if (!attributes.is_object()) return encoding;
  const bool numeric = dtype.is_integer() || dtype.is_float();
  if (!numeric || dtype.id == DataTypeId::kFloat16 || dtype.id == DataTypeId::kBFloat16) {
    return encoding;
  }
  encoding.packed = attributes.contains("scale_factor") || attributes.contains("add_offset");
  if (attributes.contains("scale_factor"))
    encoding.scale = number_attribute(attributes, "scale_factor", what);
  if (attributes.contains("add_offset"))
    encoding.offset = number_attribute(attributes, "add_offset", what);
  const bool float_values = dtype.is_float();
  collect_missing(attributes, "_FillValue", what, float_values, &encoding.missing);
  collect_missing(attributes, "missing_value", what, float_values, &encoding.missing);
  // _Unsigned = "true" on a signed integer (netCDF-3 has no unsigned types): the values, and
  // the missing values given as negative numbers, are read as unsigned, as xarray reads them.
  if (attributes.contains("_Unsigned") && dtype.is_integer() && dtype.is_signed()) {
    const Json& flag = attributes["_Unsigned"];
    if ((flag.is_string() && (flag == "true" || flag == "True")) ||
        (flag.is_boolean() && flag.get<bool>())) {
      encoding.wrap = std::ldexp(1.0, static_cast<int>(dtype.size() * 8));
      for (double& m : encoding.missing) {
        if (m < 0) m += encoding.wrap;
      }
    }
  }
  return encoding;
}

Json cf_attributes(const ArrayMetadata& meta) {
  Json attributes = meta.attributes.is_object() ? meta.attributes : Json::object();
  const bool cf = attributes.contains("scale_factor") || attributes.contains("add_offset") ||
                  attributes.contains("missing_value");
  if (meta.zarr_format != 2 || attributes.contains("_FillValue") || meta.fill_value.is_null) {
    return attributes;
  }
  // xarray writes a float variable's _FillValue as the v2 fill_value alone (-9999.0: a mask).
  // A float fill_value of 0 is zarr-python's default rather than a mask (read as such it would
  // turn every zero, a dry hour's precipitation, into NaN), so zero counts only beside CF
  // attributes, as any fill value of an integer array does.
  const Json fill = fill_value_to_json(meta.fill_value, meta.dtype);
  const bool float_mask = meta.dtype.is_float() && fill.is_number() && fill.get<double>() != 0.0;
  if (cf || float_mask) attributes["_FillValue"] = fill;
  return attributes;
}

CfEncoding cf_encoding(const ArrayMetadata& meta, const std::string& what) {
  return cf_encoding(meta.dtype, cf_attributes(meta), what);
}

}  // namespace zfeed::zarr
