// netCDF-3 and netCDF-4 files through the libnetcdf C API: the root group's variables with their
// dimensions, shapes, types and attributes, read by hyperslab (nc_get_vara). libnetcdf is not
// thread-safe, so every call into it takes one process-wide lock.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "zfeed/ingest/source.h"

namespace zfeed::ingest {

class NetcdfSource final : public Source {
 public:
  // Opens the file read-only; throws zfeed::Error naming the file if libnetcdf cannot.
  explicit NetcdfSource(const std::string& path);
  ~NetcdfSource() override;
  NetcdfSource(const NetcdfSource&) = delete;
  NetcdfSource& operator=(const NetcdfSource&) = delete;

  void read(const Variable& variable, std::span<const uint64_t> start,
            std::span<const uint64_t> count, void* out) const override;

  // The file format in words: "classic", "64-bit offset", "netCDF-4", ...
  const std::string& format() const { return format_; }

 private:
  int ncid_ = -1;
  std::string format_;
  std::map<std::string, int> varids_;
};

// True if the file starts with a netCDF-3 ("CDF\1", "CDF\2", "CDF\5") or HDF5 signature.
bool looks_like_netcdf(const std::string& path);

}  // namespace zfeed::ingest
