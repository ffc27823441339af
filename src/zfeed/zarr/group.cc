#include "zfeed/zarr/group.h"

#include <functional>
#include <utility>

#include "zfeed/util/error.h"

namespace zfeed::zarr {

namespace {

// Where a store's root has no metadata yet because `zfeed synth` or `zfeed convert` is writing it
// (their metadata goes last) or was interrupted: says so, for the not-found error. The progress
// records' keys are the ingest layer's (kSynthProgressKey, kProgressKey).
std::string unfinished_output_hint(const Store& store, const std::string& path) {
  if (!path.empty()) return "";
  const std::pair<const char*, const char*> records[] = {
      {".zfeed-synth-progress.json", "zfeed synth"},
      {".zfeed-convert-progress.json", "zfeed convert` or `zfeed rechunk"}};
  for (const auto& [key, command] : records) {
    if (store.size(key)) {
      return std::string("; it is an unfinished `") + command +
             "` output (being written, or interrupted): run the same command again to finish it";
    }
  }
  return "";
}

std::optional<Json> read_json(const Store& store, const std::string& key) {
  auto bytes = store.get(key);
  if (!bytes) return std::nullopt;
  return parse_json(bytes->as_string(), store.url() + "/" + key);
}

// v2's .zmetadata ({"a/.zarray": ..., "a/.zattrs": ...}) as per-member documents
// ({"a": {".zarray": ..., ".zattrs": ...}}), the form the rest of the code reads.
Json regroup_v2_consolidated(const Json& flat) {
  Json members = Json::object();
  for (const auto& [key, value] : flat.items()) {
    size_t slash = key.rfind('/');
    if (slash == std::string::npos) continue;  // the group's own .zgroup and .zattrs
    std::string member = key.substr(0, slash);
    std::string file = key.substr(slash + 1);
    if (file == ".zarray" || file == ".zgroup" || file == ".zattrs") members[member][file] = value;
  }
  return members;
}

// The entries of a consolidated map below `name`, relative to it.
Json sub_map(const Json& consolidated, const std::string& name) {
  Json sub = Json::object();
  std::string prefix = name + "/";
  for (const auto& [key, value] : consolidated.items()) {
    if (key.starts_with(prefix)) sub[key.substr(prefix.size())] = value;
  }
  return sub;
}

}  // namespace

Group Group::open(std::shared_ptr<Store> store, const std::string& path_in) {
  std::string path = normalize_path(path_in);
  std::string key = join_key(path, "zarr.json");
  if (auto bytes = store->get(key)) {
    try {
      Json json = parse_json(bytes->as_string(), "invalid JSON");
      if (json.is_object() && json_string_or(json, "node_type", "") == "array")
        throw NotFoundError("is an array, not a group");
      return Group(store, path, GroupMetadata::parse_v3(json));
    } catch (...) {
      rethrow_with_context(store->url() + "/" + key);
    }
  }
  key = join_key(path, ".zgroup");
  if (auto zgroup = read_json(*store, key)) {
    GroupMetadata meta;
    meta.zarr_format = 2;
    if (!zgroup->is_object() || !(*zgroup).contains("zarr_format") ||
        (*zgroup)["zarr_format"] != 2) {
      throw Error(store->url() + "/" + key + ": \"zarr_format\" must be 2");
    }
    if (auto attrs = read_json(*store, join_key(path, ".zattrs"))) {
      if (!attrs->is_object())
        throw Error(store->url() + "/" + join_key(path, ".zattrs") + ": must be a JSON object");
      meta.attributes = *attrs;
    }
    std::string zmetadata_key = join_key(path, ".zmetadata");
    if (auto zmetadata = read_json(*store, zmetadata_key)) {
      if (!zmetadata->is_object() || !zmetadata->contains("metadata") ||
          !(*zmetadata)["metadata"].is_object()) {
        throw Error(store->url() + "/" + zmetadata_key + ": missing the \"metadata\" object");
      }
      meta.consolidated = regroup_v2_consolidated((*zmetadata)["metadata"]);
    }
    return Group(store, path, std::move(meta));
  }
  throw NotFoundError(store->url() + "/" + path + ": no Zarr group here (no zarr.json or .zgroup)" +
                      unfinished_output_hint(*store, path));
}

Group Group::create(std::shared_ptr<Store> store, const std::string& path_in, int zarr_format,
                    const Json& attributes, bool overwrite) {
  std::string path = normalize_path(path_in);
  if (zarr_format != 2 && zarr_format != 3) throw Error("zarr_format must be 2 or 3");
  const bool exists = store->size(join_key(path, "zarr.json")) ||
                      store->size(join_key(path, ".zarray")) ||
                      store->size(join_key(path, ".zgroup"));
  if (exists) {
    if (!overwrite) {
      try {
        Group existing = open(store, path);
        if (existing.zarr_format() == zarr_format) return existing;
      } catch (const NotFoundError&) {
      }
      throw Error(store->url() + "/" + path +
                  ": a different Zarr node already exists here (pass overwrite to replace it)");
    }
    store->erase_prefix(path.empty() ? "" : path + "/");
  }
  GroupMetadata meta;
  meta.zarr_format = zarr_format;
  meta.attributes = attributes;
  Group group(store, path, meta);
  group.write_metadata();
  return group;
}

void Group::write_metadata() const {
  if (metadata_.zarr_format == 3) {
    store_->set(join_key(path_, "zarr.json"), as_bytes(dump_json(metadata_.to_json_v3())));
    return;
  }
  store_->set(join_key(path_, ".zgroup"), as_bytes(dump_json(Json{{"zarr_format", 2}})));
  if (!metadata_.attributes.empty()) {
    store_->set(join_key(path_, ".zattrs"), as_bytes(dump_json(metadata_.attributes)));
  } else {
    store_->erase(join_key(path_, ".zattrs"));
  }
}

void Group::set_attributes(const Json& attributes) {
  if (!attributes.is_object()) throw Error("attributes must be a JSON object");
  metadata_.attributes = attributes;
  write_metadata();
}

std::vector<std::string> Group::members() const {
  std::vector<std::string> names;
  if (metadata_.consolidated) {
    for (const auto& [key, value] : metadata_.consolidated->items()) {
      if (key.find('/') == std::string::npos) names.push_back(key);
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  std::string prefix = path_.empty() ? "" : path_ + "/";
  for (const auto& name : store_->list_dir(prefix)) {
    if (name.starts_with('.') || name == "zarr.json") continue;
    std::string child = join_key(path_, name);
    if (store_->size(join_key(child, "zarr.json")) || store_->size(join_key(child, ".zarray")) ||
        store_->size(join_key(child, ".zgroup"))) {
      names.push_back(name);
    }
  }
  return names;
}

Node Group::open_member(const std::string& name) const {
  std::string child = join_key(path_, normalize_path(name));
  if (metadata_.consolidated) {
    auto it = metadata_.consolidated->find(name);
    if (it == metadata_.consolidated->end()) {
      throw NotFoundError(store_->url() + "/" + child +
                          ": no such member in the consolidated metadata");
    }
    const Json& doc = *it;
    try {
      if (doc.contains(".zarray")) {
        return Array::from_metadata(
            store_, child, ArrayMetadata::parse_v2(doc[".zarray"], doc.value(".zattrs", Json())));
      }
      if (doc.contains(".zgroup")) {
        GroupMetadata meta;
        meta.zarr_format = 2;
        meta.attributes = doc.value(".zattrs", Json::object());
        meta.consolidated = sub_map(*metadata_.consolidated, name);
        return Group(store_, child, meta);
      }
      if (json_string_or(doc, "node_type", "") == "array")
        return Array::from_metadata(store_, child, ArrayMetadata::parse_v3(doc));
      GroupMetadata meta = GroupMetadata::parse_v3(doc);
      meta.consolidated = sub_map(*metadata_.consolidated, name);
      return Group(store_, child, meta);
    } catch (...) {
      rethrow_with_context(store_->url() + "/" + child + " (consolidated metadata)");
    }
  }
  return open_node(store_, child);
}

void Group::consolidate() {
  Json flat = Json::object();  // v3: path -> zarr.json; v2: "path/.zarray" etc.
  std::function<void(const Group&, const std::string&)> visit = [&](const Group& group,
                                                                    const std::string& prefix) {
    Group live =
        Group::open(group.store_, group.path_);  // list the store, not older consolidated data
    live.metadata_.consolidated.reset();
    for (const auto& name : live.members()) {
      std::string relative = prefix.empty() ? name : prefix + "/" + name;
      Node node = live.open_member(name);
      if (auto* array = std::get_if<Array>(&node)) {
        if (metadata_.zarr_format == 3) {
          flat[relative] =
              array->metadata().zarr_format == 3 ? array->metadata().to_json_v3() : Json();
        } else {
          flat[relative + "/.zarray"] = array->metadata().to_zarray();
          flat[relative + "/.zattrs"] = array->metadata().to_zattrs();
        }
      } else {
        const Group& sub = std::get<Group>(node);
        if (metadata_.zarr_format == 3) {
          GroupMetadata plain = sub.metadata_;
          plain.consolidated.reset();
          flat[relative] = plain.to_json_v3();
        } else {
          flat[relative + "/.zgroup"] = Json{{"zarr_format", 2}};
          flat[relative + "/.zattrs"] = sub.attributes();
        }
        visit(sub, relative);
      }
    }
  };
  visit(*this, "");
  if (metadata_.zarr_format == 3) {
    metadata_.consolidated = flat;
    write_metadata();
    return;
  }
  Json metadata = Json::object();
  metadata[".zgroup"] = Json{{"zarr_format", 2}};
  metadata[".zattrs"] = metadata_.attributes;
  for (const auto& [key, value] : flat.items()) metadata[key] = value;
  store_->set(join_key(path_, ".zmetadata"),
              as_bytes(dump_json(Json{{"metadata", metadata}, {"zarr_consolidated_format", 1}})));
  metadata_.consolidated = regroup_v2_consolidated(metadata);
}

Node open_node(std::shared_ptr<Store> store, const std::string& path_in) {
  std::string path = normalize_path(path_in);
  std::string key = join_key(path, "zarr.json");
  if (auto bytes = store->get(key)) {
    Json json;
    try {
      json = parse_json(bytes->as_string(), "invalid JSON");
    } catch (...) {
      rethrow_with_context(store->url() + "/" + key);
    }
    if (json.is_object() && json_string_or(json, "node_type", "") == "group")
      return Group::open(store, path);
    return Array::open(store, path);
  }
  if (store->size(join_key(path, ".zarray"))) return Array::open(store, path);
  if (store->size(join_key(path, ".zgroup"))) return Group::open(store, path);
  throw NotFoundError(store->url() + (path.empty() ? "" : "/" + path) +
                      ": no Zarr array or group here (no zarr.json, .zarray or .zgroup)" +
                      unfinished_output_hint(*store, path));
}

}  // namespace zfeed::zarr
