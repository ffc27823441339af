#include "zfeed/ingest/source.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "zfeed/ingest/grib.h"
#include "zfeed/ingest/netcdf.h"
#include "zfeed/ingest/zarr_source.h"
#include "zfeed/util/error.h"
#include "zfeed/zarr/cf.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {

const Variable* Source::find(std::string_view name) const {
  for (const auto& variable : variables()) {
    if (variable.name == name) return &variable;
  }
  return nullptr;
}

// The magic-byte checks live here, not beside the readers, so that they exist in every build:
// a netCDF or GRIB file is recognized (and refused by name) also where its reader was not built.
bool looks_like_netcdf(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  char magic[8] = {};
  if (!file.read(magic, sizeof magic)) return false;
  if (std::memcmp(magic, "CDF", 3) == 0 && (magic[3] == 1 || magic[3] == 2 || magic[3] == 5))
    return true;
  return std::memcmp(magic, "\x89HDF\r\n\x1a\n", 8) == 0;
}

bool looks_like_grib(const std::string& path) {
  // How far into a file "GRIB" may start (bulletin headers, padding).
  constexpr size_t kMagicSearchBytes = 4096;
  std::ifstream file(path, std::ios::binary);
  std::string head(kMagicSearchBytes, '\0');
  file.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(file.gcount()));
  // "GRIB", three bytes (GRIB 1: the length; GRIB 2: reserved and discipline), the edition.
  for (size_t at = head.find("GRIB"); at != std::string::npos; at = head.find("GRIB", at + 1)) {
    if (at + 7 < head.size() && (head[at + 7] == 1 || head[at + 7] == 2)) return true;
  }
  return false;
}

// CMake defines ZFEED_HAVE_NETCDF and ZFEED_HAVE_GRIB (1 or 0) and, for an absent format, why.
#ifndef ZFEED_NETCDF_ABSENT
#define ZFEED_NETCDF_ABSENT "libnetcdf was not found when zfeed was built"
#endif
#ifndef ZFEED_GRIB_ABSENT
#define ZFEED_GRIB_ABSENT "ecCodes was not found when zfeed was built"
#endif

FormatSupport netcdf_support() {
#if ZFEED_HAVE_NETCDF
  return {true, ""};
#else
  return {false, "netCDF support was not built (" ZFEED_NETCDF_ABSENT ")"};
#endif
}

FormatSupport grib_support() {
#if ZFEED_HAVE_GRIB
  return {true, ""};
#else
  return {false, "GRIB support was not built (" ZFEED_GRIB_ABSENT ")"};
#endif
}

std::unique_ptr<Source> open_source(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    if (looks_like_netcdf(path)) {
#if ZFEED_HAVE_NETCDF
      return std::make_unique<NetcdfSource>(path);
#else
      throw UnsupportedError(path + ": a netCDF file, but " + netcdf_support().reason);
#endif
    }
    if (looks_like_grib(path)) {
#if ZFEED_HAVE_GRIB
      return std::make_unique<GribSource>(path);
#else
      throw UnsupportedError(path + ": a GRIB file, but " + grib_support().reason);
#endif
    }
    throw Error(path +
                ": not a netCDF or GRIB file (no netCDF-3, HDF5 or GRIB signature) and not a Zarr "
                "store");
  }
  if (path.find("://") == std::string::npos && !std::filesystem::exists(path, ec)) {
    throw NotFoundError(path + ": no such file or directory");
  }
  return std::make_unique<ZarrSource>(path);
}

namespace {

std::string base_name(const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  std::string name = std::filesystem::path(trimmed).filename().string();
  if (name.ends_with(".zarr")) name.resize(name.size() - 5);
  return name.empty() ? "data" : name;
}

Variable variable_of(const zarr::Array& array, const std::string& name) {
  const auto& meta = array.metadata();
  Variable variable;
  variable.name = name;
  variable.dtype = meta.dtype;
  variable.shape = meta.shape;
  for (size_t d = 0; d < meta.rank(); ++d) {
    const bool named = meta.dimension_names && (*meta.dimension_names)[d].has_value();
    variable.dims.push_back(named ? *(*meta.dimension_names)[d] : "dim_" + std::to_string(d));
  }
  variable.attributes = zarr::cf_attributes(meta);  // a v2 fill_value as _FillValue, as xarray
  return variable;
}

}  // namespace

ZarrSource::ZarrSource(const std::string& path) : Source(path) {
  auto store = open_store(path);
  zarr::Node node = zarr::open_node(store, "");
  if (auto* array = std::get_if<zarr::Array>(&node)) {
    std::string name = base_name(path);
    variables_.push_back(variable_of(*array, name));
    arrays_.emplace(name, *array);
    return;
  }
  const auto& group = std::get<zarr::Group>(node);
  attributes_ = group.attributes();
  for (const auto& member : group.members()) {
    zarr::Node child = group.open_member(member);
    if (auto* array = std::get_if<zarr::Array>(&child)) {
      if (array->metadata().dtype.is_complex()) {
        skipped_.push_back(member + " (complex values are not converted)");
        continue;
      }
      variables_.push_back(variable_of(*array, member));
      arrays_.emplace(member, *array);
    } else {
      skipped_.push_back(member + " (a subgroup: only the group's own arrays are converted)");
    }
  }
}

void ZarrSource::read(const Variable& variable, std::span<const uint64_t> start,
                      std::span<const uint64_t> count, void* out) const {
  auto it = arrays_.find(variable.name);
  if (it == arrays_.end()) throw NotFoundError(path_ + ": no array " + variable.name);
  zarr::Selection selection;
  for (size_t d = 0; d < start.size(); ++d) selection.push_back({start[d], start[d] + count[d], 1});
  it->second.read(selection, out);
}

}  // namespace zfeed::ingest
