#include "zfeed/zarr/cf.h"

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

void collect_missing(const Json& attributes, const char* name, const std::string& what,
                     std::vector<double>* out) {
  if (!attributes.contains(name)) return;
  const Json& value = attributes[name];
  auto add = [&](const Json& item) {
    if (item.is_number()) {
      out->push_back(item.get<double>());
    } else if (!item.is_null() && !(item.is_string() && (item == "NaN" || item == "nan"))) {
      throw Error(what + ": attribute " + name + " must be numeric, got " + value.dump());
    }
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
  collect_missing(attributes, "_FillValue", what, &encoding.missing);
  collect_missing(attributes, "missing_value", what, &encoding.missing);
  return encoding;
}

Json cf_attributes(const ArrayMetadata& meta) {
  Json attributes = meta.attributes.is_object() ? meta.attributes : Json::object();
  const bool cf = attributes.contains("scale_factor") || attributes.contains("add_offset") ||
                  attributes.contains("missing_value");
  if (meta.zarr_format == 2 && cf && !attributes.contains("_FillValue") &&
      !meta.fill_value.is_null) {
    attributes["_FillValue"] = fill_value_to_json(meta.fill_value, meta.dtype);
  }
  return attributes;
}

CfEncoding cf_encoding(const ArrayMetadata& meta, const std::string& what) {
  return cf_encoding(meta.dtype, cf_attributes(meta), what);
}

}  // namespace zfeed::zarr
