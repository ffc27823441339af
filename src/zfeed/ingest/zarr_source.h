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

  void read(const Variable& variable, std::span<const uint64_t> start,
            std::span<const uint64_t> count, void* out) const override;

 private:
  std::map<std::string, zarr::Array> arrays_;
};

}  // namespace zfeed::ingest
