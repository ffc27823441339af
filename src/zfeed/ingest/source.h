// A source of gridded variables for conversion: a netCDF file or a Zarr store, read the same way.
// Each variable has a name, a data type, named dimensions, a shape and attributes (as stored, not
// CF-decoded), and is read by hyperslab into a caller's buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zfeed/codec/data_type.h"
#include "zfeed/util/json.h"

namespace zfeed::ingest {

struct Variable {
  std::string name;
  DataType dtype;
  std::vector<std::string> dims;
  std::vector<uint64_t> shape;
  Json attributes = Json::object();

  size_t rank() const { return shape.size(); }
  // A coordinate: one dimension named like the variable.
  bool is_coordinate() const { return dims.size() == 1 && dims[0] == name; }
};

// What every source has (its path, variables, skipped variables and global attributes) lives
// here, filled by the subclass when it opens; a subclass adds read().
class Source {
 public:
  virtual ~Source() = default;

  // The path or URL, for messages.
  const std::string& path() const { return path_; }
  // The variables zfeed can read, in the source's order.
  const std::vector<Variable>& variables() const { return variables_; }
  // Variables the source holds but zfeed cannot convert (strings, chars), with the reason.
  const std::vector<std::string>& skipped() const { return skipped_; }
  // Global (group) attributes.
  const Json& attributes() const { return attributes_; }
  // Reads [start, start + count) of `variable` into `out`: dense, C order, native values of its
  // data type. Safe to call from several threads.
  virtual void read(const Variable& variable, std::span<const uint64_t> start,
                    std::span<const uint64_t> count, void* out) const = 0;

  // The variable named `name`, or nullptr.
  const Variable* find(std::string_view name) const;

 protected:
  explicit Source(std::string path) : path_(std::move(path)) {}

  std::string path_;
  std::vector<Variable> variables_;
  std::vector<std::string> skipped_;
  Json attributes_ = Json::object();
};

// Opens a netCDF-3/4 file or a GRIB 1/2 file (each recognized by its magic bytes; "GRIB" may
// follow a few bytes of padding) or a Zarr v2/v3 store (a directory or URL). Other formats are
// refused with a clear error, and so is a netCDF or GRIB file where this build reads no such files
// (zfeed::UnsupportedError saying why: see netcdf_support and grib_support).
std::unique_ptr<Source> open_source(const std::string& path);

// Whether this build of zfeed reads an optional input format (netCDF needs libnetcdf, GRIB needs
// ecCodes, each found when zfeed was built), and if not, why: "netCDF support was not built
// (libnetcdf was not found when zfeed was built)". For messages, tests and zfeed._core.build_info.
struct FormatSupport {
  bool available = false;
  std::string reason;  // empty where available
};
FormatSupport netcdf_support();
FormatSupport grib_support();

}  // namespace zfeed::ingest
