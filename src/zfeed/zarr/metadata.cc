#include "zfeed/zarr/metadata.h"

#include <charconv>

#include "zfeed/util/error.h"

namespace zfeed::zarr {
namespace {

std::vector<uint64_t> parse_extents(const Json& value, std::string_view field, bool positive) {
  if (!value.is_array()) {
    throw Error("\"" + std::string(field) + "\" must be an array of integers, got " + value.dump());
  }
  std::vector<uint64_t> extents;
  for (size_t i = 0; i < value.size(); ++i) {
    uint64_t extent = json_to_uint64(value[i], std::string(field) + "[" + std::to_string(i) + "]");
    if (positive && extent == 0) {
      throw Error(std::string(field) + "[" + std::to_string(i) + "] must be positive, got 0");
    }
    extents.push_back(extent);
  }
  return extents;
}

const Json& require(const Json& json, std::string_view field) {
  auto it = json.find(field);
  if (it == json.end()) throw Error("missing required field \"" + std::string(field) + "\"");
  return *it;
}

bool must_understand_false(const Json& value) {
  return value.is_object() && value.contains("must_understand") &&
         value["must_understand"] == false;
}

void check_format(const Json& json, int expected) {
  if (!json.is_object()) throw Error("metadata must be a JSON object, got " + json_type_name(json));
  const Json& format = require(json, "zarr_format");
  if (!format.is_number_integer() || format.get<int64_t>() != expected) {
    throw Error("\"zarr_format\" must be " + std::to_string(expected) + ", got " + format.dump());
  }
}

}  // namespace

std::string ChunkKeyEncoding::encode(std::span<const uint64_t> chunk_index) const {
  std::string key;
  if (kind == Kind::kDefault) {
    key = "c";
    for (uint64_t i : chunk_index) {
      key += separator;
      key += std::to_string(i);
    }
    return key;
  }
  if (chunk_index.empty()) return "0";
  for (size_t d = 0; d < chunk_index.size(); ++d) {
    if (d) key += separator;
    key += std::to_string(chunk_index[d]);
  }
  return key;
}

std::optional<std::vector<uint64_t>> ChunkKeyEncoding::decode(std::string_view key,
                                                              size_t rank) const {
  std::vector<uint64_t> index;
  std::string_view rest = key;
  if (kind == Kind::kDefault) {
    if (!rest.starts_with('c')) return std::nullopt;
    rest.remove_prefix(1);
  } else if (rank == 0) {
    return key == "0" ? std::optional(index) : std::nullopt;
  }
  for (size_t d = 0; d < rank; ++d) {
    if (kind == Kind::kDefault || d > 0) {
      if (!rest.starts_with(separator)) return std::nullopt;
      rest.remove_prefix(1);
    }
    uint64_t value = 0;
    const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (error != std::errc() || end == rest.data()) return std::nullopt;
    index.push_back(value);
    rest.remove_prefix(size_t(end - rest.data()));
  }
  if (!rest.empty() || encode(index) != key) return std::nullopt;  // "c/01" is no chunk's key
  return index;
}

Json ChunkKeyEncoding::to_json() const {
  return {{"name", kind == Kind::kDefault ? "default" : "v2"},
          {"configuration", {{"separator", std::string(1, separator)}}}};
}

ChunkKeyEncoding ChunkKeyEncoding::parse(const Json& value) {
  if (!value.is_object() || !value.contains("name") || !value["name"].is_string()) {
    throw Error("\"chunk_key_encoding\" must be an object with a \"name\", got " + value.dump());
  }
  ChunkKeyEncoding encoding;
  std::string name = value["name"].get<std::string>();
  if (name == "default") {
    encoding.kind = Kind::kDefault;
    encoding.separator = '/';
  } else if (name == "v2") {
    encoding.kind = Kind::kV2;
    encoding.separator = '.';
  } else {
    throw UnsupportedError("unsupported chunk_key_encoding \"" + name + "\"");
  }
  if (value.contains("configuration")) {
    const Json& configuration = value["configuration"];
    if (!configuration.is_object())
      throw Error("chunk_key_encoding configuration must be an object");
    for (const auto& [key, field] : configuration.items()) {
      if (key != "separator")
        throw Error("chunk_key_encoding: unknown configuration field \"" + key + "\"");
      if (!field.is_string() || (field != "/" && field != ".")) {
        throw Error("chunk_key_encoding separator must be \"/\" or \".\", got " + field.dump());
      }
      encoding.separator = field.get<std::string>()[0];
    }
  }
  return encoding;
}

ArrayMetadata ArrayMetadata::parse_v3(const Json& json) {
  check_format(json, 3);
  const Json& node_type = require(json, "node_type");
  if (node_type != "array") throw Error("\"node_type\" must be \"array\", got " + node_type.dump());
  ArrayMetadata meta;
  meta.zarr_format = 3;
  meta.shape = parse_extents(require(json, "shape"), "shape", false);
  meta.dtype = DataType::from_json_v3(require(json, "data_type"));

  const Json& grid = require(json, "chunk_grid");
  if (!grid.is_object() || !grid.contains("name") || !grid["name"].is_string()) {
    throw Error("\"chunk_grid\" must be an object with a \"name\", got " + grid.dump());
  }
  if (grid["name"] != "regular") {
    throw UnsupportedError("unsupported chunk_grid \"" + grid["name"].get<std::string>() +
                           "\" (zfeed reads \"regular\")");
  }
  if (!grid.contains("configuration") || !grid["configuration"].is_object()) {
    throw Error("chunk_grid: missing \"configuration\"");
  }
  meta.chunk_shape =
      parse_extents(require(grid["configuration"], "chunk_shape"), "chunk_shape", true);
  meta.key_encoding = ChunkKeyEncoding::parse(require(json, "chunk_key_encoding"));
  meta.fill_value = parse_fill_value(require(json, "fill_value"), meta.dtype, false);
  meta.codecs = require(json, "codecs");
  if (auto it = json.find("attributes"); it != json.end()) {
    if (!it->is_object())
      throw Error("\"attributes\" must be an object, got " + json_type_name(*it));
    meta.attributes = *it;
  }
  if (auto it = json.find("dimension_names"); it != json.end() && !it->is_null()) {
    if (!it->is_array())
      throw Error("\"dimension_names\" must be an array, got " + json_type_name(*it));
    std::vector<std::optional<std::string>> names;
    for (const auto& name : *it) {
      if (name.is_null()) {
        names.emplace_back();
      } else if (name.is_string()) {
        names.emplace_back(name.get<std::string>());
      } else {
        throw Error("\"dimension_names\" entries must be strings or null, got " + name.dump());
      }
    }
    meta.dimension_names = std::move(names);
  }
  if (auto it = json.find("storage_transformers"); it != json.end()) {
    if (!it->is_array()) throw Error("\"storage_transformers\" must be an array");
    if (!it->empty()) throw UnsupportedError("unsupported storage_transformers " + it->dump());
  }
  static const std::string_view known[] = {
      "zarr_format",         "node_type",  "shape",  "data_type",  "chunk_grid",
      "chunk_key_encoding",  "fill_value", "codecs", "attributes", "dimension_names",
      "storage_transformers"};
  for (const auto& [key, value] : json.items()) {
    bool is_known = false;
    for (auto name : known) is_known = is_known || key == name;
    if (is_known) continue;
    if (!must_understand_false(value)) {
      throw UnsupportedError("unknown metadata field \"" + key +
                             "\" (not marked \"must_understand\": false)");
    }
    meta.extra_fields[key] = value;
  }
  meta.validate();
  return meta;
}

void ArrayMetadata::validate() const {
  if (chunk_shape.size() != shape.size()) {
    throw Error("chunk_shape has " + std::to_string(chunk_shape.size()) +
                " dimensions, shape has " + std::to_string(shape.size()));
  }
  for (size_t d = 0; d < chunk_shape.size(); ++d) {
    if (chunk_shape[d] == 0) throw Error("chunk_shape[" + std::to_string(d) + "] must be positive");
  }
  if (dimension_names && dimension_names->size() != shape.size()) {
    throw Error("dimension_names has " + std::to_string(dimension_names->size()) + " entries for " +
                std::to_string(shape.size()) + " dimensions");
  }
  checked_product(shape, dtype.size(), "shape");
  checked_product(chunk_shape, dtype.size(), "chunk_shape");
  // The number of chunks must be addressable too.
  checked_product(grid_shape(), 1, "the number of chunks");
  codec_chain();
}

std::vector<uint64_t> ArrayMetadata::grid_shape() const {
  std::vector<uint64_t> grid(shape.size());
  for (size_t d = 0; d < shape.size(); ++d)
    grid[d] = shape[d] / chunk_shape[d] + (shape[d] % chunk_shape[d] != 0);
  return grid;
}

uint64_t ArrayMetadata::num_elements() const {
  uint64_t count = 1;
  for (uint64_t extent : shape) count *= extent;
  return count;
}

Json ArrayMetadata::to_json_v3() const {
  Json json;
  json["zarr_format"] = 3;
  json["node_type"] = "array";
  json["shape"] = shape;
  json["data_type"] = dtype.name();
  json["chunk_grid"] = {{"name", "regular"}, {"configuration", {{"chunk_shape", chunk_shape}}}};
  json["chunk_key_encoding"] = key_encoding.to_json();
  // v3 requires a fill value; v2's null one means missing chunks read as zeros.
  json["fill_value"] = fill_value_to_json(fill_value.is_null ? FillValue{} : fill_value, dtype);
  json["codecs"] = codec_chain().to_json();
  json["attributes"] = attributes;
  if (dimension_names) {
    Json names = Json::array();
    for (const auto& name : *dimension_names) names.push_back(name ? Json(*name) : Json(nullptr));
    json["dimension_names"] = names;
  }
  for (const auto& [key, value] : extra_fields.items()) json[key] = value;
  return json;
}

Json v2_compressor_to_codec(const Json& compressor, DataType dtype) {
  (void)dtype;
  if (!compressor.is_object() || !compressor.contains("id") || !compressor["id"].is_string()) {
    throw Error("\"compressor\" must be null or an object with an \"id\", got " +
                compressor.dump());
  }
  std::string id = compressor["id"].get<std::string>();
  auto field = [&](const char* name, Json fallback) {
    return compressor.contains(name) ? compressor[name] : fallback;
  };
  if (id == "blosc") {
    return {{"name", "blosc"},
            {"configuration",
             {{"cname", field("cname", "lz4")},
              {"clevel", field("clevel", 5)},
              {"shuffle", field("shuffle", 1)},
              {"blocksize", field("blocksize", 0)}}}};
  }
  if (id == "zstd") {
    return {
        {"name", "zstd"},
        {"configuration", {{"level", field("level", 1)}, {"checksum", field("checksum", false)}}}};
  }
  if (id == "zlib")
    return {{"name", "numcodecs.zlib"}, {"configuration", {{"level", field("level", 1)}}}};
  if (id == "gzip") return {{"name", "gzip"}, {"configuration", {{"level", field("level", 1)}}}};
  if (id == "lz4")
    return {{"name", "numcodecs.lz4"},
            {"configuration", {{"acceleration", field("acceleration", 1)}}}};
  throw UnsupportedError("unsupported v2 compressor \"" + id +
                         "\" (zfeed reads blosc, zstd, zlib, gzip, lz4)");
}

Json codec_to_v2_compressor(const Json& codec) {
  std::string name = json_string_or(codec, "name", "");
  Json configuration =
      codec.is_object() && codec.contains("configuration") && codec["configuration"].is_object()
          ? codec["configuration"]
          : Json::object();
  if (name == "blosc") {
    Json shuffle = configuration.value("shuffle", Json("noshuffle"));
    int shuffle_number = shuffle == "shuffle" ? 1 : shuffle == "bitshuffle" ? 2 : 0;
    if (shuffle.is_number_integer()) shuffle_number = shuffle.get<int>();
    return {{"id", "blosc"},
            {"cname", configuration.value("cname", "lz4")},
            {"clevel", configuration.value("clevel", 5)},
            {"shuffle", shuffle_number},
            {"blocksize", configuration.value("blocksize", 0)}};
  }
  if (name == "zstd") {
    return {{"id", "zstd"},
            {"level", configuration.value("level", 0)},
            {"checksum", configuration.value("checksum", false)}};
  }
  if (name == "gzip") return {{"id", "gzip"}, {"level", configuration.value("level", 1)}};
  if (name == "numcodecs.zlib" || name == "zlib")
    return {{"id", "zlib"}, {"level", configuration.value("level", 1)}};
  if (name == "numcodecs.lz4" || name == "lz4") {
    return {{"id", "lz4"}, {"acceleration", configuration.value("acceleration", 1)}};
  }
  throw UnsupportedError("codec \"" + name + "\" has no Zarr v2 compressor form");
}

ArrayMetadata ArrayMetadata::parse_v2(const Json& zarray, const Json& zattrs) {
  check_format(zarray, 2);
  ArrayMetadata meta;
  meta.zarr_format = 2;
  meta.shape = parse_extents(require(zarray, "shape"), "shape", false);
  meta.chunk_shape = parse_extents(require(zarray, "chunks"), "chunks", true);
  const Json& dtype = require(zarray, "dtype");
  if (!dtype.is_string())
    throw UnsupportedError("unsupported v2 dtype " + dtype.dump() + " (structured types)");
  meta.dtype = DataType::from_numpy_typestr(dtype.get<std::string>(), &meta.v2_endian);
  meta.fill_value = parse_fill_value(require(zarray, "fill_value"), meta.dtype, true);
  const Json& order = require(zarray, "order");
  if (order != "C" && order != "F")
    throw Error("\"order\" must be \"C\" or \"F\", got " + order.dump());
  meta.v2_order = order.get<std::string>()[0];
  meta.key_encoding.kind = ChunkKeyEncoding::Kind::kV2;
  meta.key_encoding.separator = '.';
  if (auto it = zarray.find("dimension_separator"); it != zarray.end() && !it->is_null()) {
    if (*it != "." && *it != "/")
      throw Error("\"dimension_separator\" must be \".\" or \"/\", got " + it->dump());
    meta.key_encoding.separator = it->get<std::string>()[0];
  }
  if (auto it = zarray.find("filters"); it != zarray.end() && !it->is_null()) {
    if (!it->is_array()) throw Error("\"filters\" must be null or an array, got " + it->dump());
    if (!it->empty()) throw UnsupportedError("unsupported v2 filters " + it->dump());
  }
  meta.v2_compressor = zarray.contains("compressor") ? zarray["compressor"] : Json(nullptr);

  Json codecs = Json::array();
  if (meta.v2_order == 'F' && meta.shape.size() > 1) {
    std::vector<size_t> reversed;
    for (size_t d = meta.shape.size(); d-- > 0;) reversed.push_back(d);
    codecs.push_back({{"name", "transpose"}, {"configuration", {{"order", reversed}}}});
  }
  Json bytes = {{"name", "bytes"}};
  if (meta.dtype.size() > 1) {
    bytes["configuration"] = {{"endian", meta.v2_endian == Endian::kLittle ? "little" : "big"}};
  }
  codecs.push_back(bytes);
  if (!meta.v2_compressor.is_null())
    codecs.push_back(v2_compressor_to_codec(meta.v2_compressor, meta.dtype));
  meta.codecs = codecs;

  if (!zattrs.is_null()) {
    if (!zattrs.is_object())
      throw Error(".zattrs must be a JSON object, got " + json_type_name(zattrs));
    meta.attributes = zattrs;
    if (auto it = meta.attributes.find("_ARRAY_DIMENSIONS"); it != meta.attributes.end()) {
      if (it->is_array() && it->size() == meta.shape.size()) {
        std::vector<std::optional<std::string>> names;
        bool valid = true;
        for (const auto& name : *it) {
          valid = valid && name.is_string();
          if (valid) names.emplace_back(name.get<std::string>());
        }
        if (valid) {
          meta.dimension_names = std::move(names);
          meta.attributes.erase(it);
        }
      }
    }
  }
  meta.validate();
  return meta;
}

Json ArrayMetadata::to_zarray() const {
  Json json;
  json["chunks"] = chunk_shape;
  json["compressor"] = v2_compressor;
  json["dimension_separator"] = std::string(1, key_encoding.separator);
  json["dtype"] = dtype.numpy_typestr(v2_endian);
  json["fill_value"] = fill_value_to_json(fill_value, dtype);
  json["filters"] = nullptr;
  json["order"] = std::string(1, v2_order);
  json["shape"] = shape;
  json["zarr_format"] = 2;
  return json;
}

Json ArrayMetadata::to_zattrs() const {
  Json json = attributes;
  if (dimension_names) {
    Json names = Json::array();
    for (size_t d = 0; d < dimension_names->size(); ++d) {
      const auto& name = (*dimension_names)[d];
      names.push_back(name ? *name : "dim_" + std::to_string(d));
    }
    json["_ARRAY_DIMENSIONS"] = names;
  }
  return json;
}

GroupMetadata GroupMetadata::parse_v3(const Json& json) {
  check_format(json, 3);
  const Json& node_type = require(json, "node_type");
  if (node_type != "group") throw Error("\"node_type\" must be \"group\", got " + node_type.dump());
  GroupMetadata meta;
  for (const auto& [key, value] : json.items()) {
    if (key == "zarr_format" || key == "node_type") continue;
    if (key == "attributes") {
      if (!value.is_object())
        throw Error("\"attributes\" must be an object, got " + json_type_name(value));
      meta.attributes = value;
    } else if (key == "consolidated_metadata") {
      if (value.is_null()) continue;
      if (!value.is_object() || !value.contains("metadata") || !value["metadata"].is_object()) {
        throw Error("\"consolidated_metadata\" must be an object with a \"metadata\" object");
      }
      if (json_string_or(value, "kind", "inline") != "inline") {
        throw UnsupportedError("unsupported consolidated_metadata kind " + value["kind"].dump());
      }
      meta.consolidated = value["metadata"];
    } else if (!must_understand_false(value)) {
      throw UnsupportedError("unknown metadata field \"" + key +
                             "\" (not marked \"must_understand\": false)");
    }
  }
  return meta;
}

Json GroupMetadata::to_json_v3() const {
  Json json = {{"zarr_format", 3}, {"node_type", "group"}, {"attributes", attributes}};
  if (consolidated) {
    json["consolidated_metadata"] = {
        {"kind", "inline"}, {"must_understand", false}, {"metadata", *consolidated}};
  }
  return json;
}

}  // namespace zfeed::zarr
