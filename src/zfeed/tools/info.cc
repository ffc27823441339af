#include "zfeed/tools/info.h"

#include <cstdio>

#include "zfeed/codec/sharding.h"
#include "zfeed/store/store.h"
#include "zfeed/zarr/group.h"

namespace zfeed::tools {
namespace {

std::string join_extents(const Json& extents, const char* separator) {
  std::string text;
  for (const auto& extent : extents) text += (text.empty() ? "" : separator) + std::to_string(extent.get<uint64_t>());
  return text;
}

Json describe_array(const zarr::Array& array, const std::string& name) {
  const auto& meta = array.metadata();
  Json json;
  json["name"] = name;
  json["path"] = array.path();
  json["node_type"] = "array";
  json["zarr_format"] = meta.zarr_format;
  json["shape"] = meta.shape;
  json["data_type"] = meta.dtype.name();
  Json dims = Json::array();
  for (size_t d = 0; d < meta.rank(); ++d) {
    dims.push_back(meta.dimension_names && (*meta.dimension_names)[d] ? Json(*(*meta.dimension_names)[d]) : Json(nullptr));
  }
  json["dimension_names"] = dims;
  const CodecChain& chain = array.codecs();
  if (const ShardingCodec* sharding = chain.sharding()) {
    json["shard_shape"] = meta.chunk_shape;
    json["chunk_shape"] = array.read_chunk_shape();
    json["codecs"] = sharding->inner().describe();
    json["shard_codecs"] = chain.describe();
  } else {
    json["chunk_shape"] = meta.chunk_shape;
    json["shard_shape"] = nullptr;
    json["codecs"] = chain.describe();
  }
  json["fill_value"] = fill_value_to_json(meta.fill_value, meta.dtype);
  zarr::StorageInfo storage = array.storage_info();
  uint64_t decoded = meta.num_elements() * meta.dtype.size();
  json["decoded_bytes"] = decoded;
  json["stored_bytes"] = storage.stored_bytes;
  json["objects_present"] = storage.objects_present;
  json["objects_total"] = storage.objects_total;
  json["compression_ratio"] = storage.stored_bytes ? Json(double(decoded) / double(storage.stored_bytes)) : Json(nullptr);
  json["attributes"] = meta.attributes;
  return json;
}

Json describe_group(const zarr::Group& group, const std::string& name) {
  Json json;
  json["name"] = name;
  json["path"] = group.path();
  json["node_type"] = "group";
  json["zarr_format"] = group.zarr_format();
  json["consolidated"] = group.is_consolidated();
  json["attributes"] = group.attributes();
  Json members = Json::array();
  for (const auto& member : group.members()) {
    zarr::Node node = group.open_member(member);
    if (auto* array = std::get_if<zarr::Array>(&node)) {
      members.push_back(describe_array(*array, member));
    } else {
      members.push_back(describe_group(std::get<zarr::Group>(node), member));
    }
  }
  json["members"] = members;
  return json;
}

void print_node(const Json& node, std::ostream& out, const std::string& indent, bool last, bool root) {
  std::string branch = root ? "" : (last ? "└── " : "├── ");
  std::string child_indent = root ? "" : indent + (last ? "    " : "│   ");
  const std::string name = node["name"].get<std::string>();
  if (node["node_type"] == "group") {
    out << indent << branch << (name.empty() ? "/" : name) << "  group (zarr v" << node["zarr_format"]
        << (node["consolidated"].get<bool>() ? ", consolidated" : "") << ")\n";
    const auto& members = node["members"];
    for (size_t i = 0; i < members.size(); ++i) print_node(members[i], out, child_indent, i + 1 == members.size(), false);
    return;
  }
  std::string shape;
  for (size_t d = 0; d < node["shape"].size(); ++d) {
    if (d) shape += ", ";
    const auto& dim = node["dimension_names"][d];
    shape += (dim.is_string() ? dim.get<std::string>() + "=" : std::string()) + std::to_string(node["shape"][d].get<uint64_t>());
  }
  out << indent << branch << (name.empty() ? "/" : name) << "  " << node["data_type"].get<std::string>() << " (" << shape
      << ")  zarr v" << node["zarr_format"] << "\n";
  std::string detail = child_indent + (root ? "  " : "    ");
  out << detail << "chunks " << join_extents(node["chunk_shape"], "x");
  if (!node["shard_shape"].is_null()) out << "  shards " << join_extents(node["shard_shape"], "x");
  out << "  codecs " << node["codecs"].get<std::string>() << "\n";
  double decoded = node["decoded_bytes"].get<double>();
  double stored = node["stored_bytes"].get<double>();
  out << detail << "stored " << human_bytes(stored) << " of " << human_bytes(decoded) << " decoded";
  if (stored > 0) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2fx", decoded / stored);
    out << ", ratio " << ratio;
  }
  out << "  (" << node["objects_present"] << " of " << node["objects_total"]
      << (node["shard_shape"].is_null() ? " chunks" : " shards") << " stored)\n";
}

}  // namespace

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

Json describe_store(const std::string& store_path) {
  auto store = open_store(store_path);
  zarr::Node node = zarr::open_node(store);
  Json json;
  if (auto* array = std::get_if<zarr::Array>(&node)) {
    json = describe_array(*array, "");
  } else {
    json = describe_group(std::get<zarr::Group>(node), "");
  }
  json["store"] = store->url();
  return json;
}

void print_info(const Json& description, std::ostream& out) {
  out << description["store"].get<std::string>() << "\n";
  print_node(description, out, "", true, true);
}

}  // namespace zfeed::tools
