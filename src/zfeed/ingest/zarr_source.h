// A Zarr v2 or v3 store (a group's direct member arrays, or a single array) as a conversion
// source, read through zfeed's own Array. For v2 arrays with CF packing attributes the array's
// fill_value stands for `_FillValue`, as xarray reads it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "zfeed/ingest/source.h"
#include "zfeed/zarr/array.h"

namespace zfeed::ingest {

class ZarrSource final : public Source {
 public:
  explicit ZarrSource(const std::string& path);

  const std::string& path() const override { return path_; }
  const std::vector<Variable>& variables() const override { return variables_; }
  const std::vector<std::string>& skipped() const override { return skipped_; }
  const Json& attributes() const override { return attributes_; }
  void read(const Variable& variable, std::span<const uint64_t> start,
            std::span<const uint64_t> count, void* out) const override;

 private:
  std::string path_;
  std::vector<Variable> variables_;
  std::map<std::string, zarr::Array> arrays_;
  std::vector<std::string> skipped_;
  Json attributes_ = Json::object();
};

}  // namespace zfeed::ingest
