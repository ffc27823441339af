// Zarr groups (v3 zarr.json with node_type "group"; v2 .zgroup + .zattrs), their members, and
// consolidated metadata (v3 inline "consolidated_metadata"; v2 .zmetadata), read when present and
// written on request.
#pragma once

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "zfeed/store/store.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/metadata.h"

namespace zfeed::zarr {

class Group;
using Node = std::variant<Array, Group>;

class Group {
 public:
  static Group open(std::shared_ptr<Store> store, const std::string& path = "");
  // Creates a group (zarr_format 3 or 2); an existing group is kept unless `overwrite`.
  static Group create(std::shared_ptr<Store> store, const std::string& path, int zarr_format = 3,
                      const Json& attributes = Json::object(), bool overwrite = false);

  const std::string& path() const { return path_; }
  const std::shared_ptr<Store>& store() const { return store_; }
  int zarr_format() const { return metadata_.zarr_format; }
  const Json& attributes() const { return metadata_.attributes; }
  void set_attributes(const Json& attributes);
  bool is_consolidated() const { return metadata_.consolidated.has_value(); }

  // Names of the direct children that are arrays or groups, sorted.
  std::vector<std::string> members() const;
  Node open_member(const std::string& name) const;

  // Writes consolidated metadata for everything below this group.
  void consolidate();

 private:
  Group(std::shared_ptr<Store> store, std::string path, GroupMetadata metadata)
      : store_(std::move(store)), path_(std::move(path)), metadata_(std::move(metadata)) {}
  void write_metadata() const;

  std::shared_ptr<Store> store_;
  std::string path_;
  GroupMetadata metadata_;
};

// Opens whatever is at `path`: an array or a group, v3 or v2.
Node open_node(std::shared_ptr<Store> store, const std::string& path = "");

}  // namespace zfeed::zarr
