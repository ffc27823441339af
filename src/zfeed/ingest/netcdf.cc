#include "zfeed/ingest/netcdf.h"

#include <netcdf.h>

#include <cstring>
#include <mutex>

#include "zfeed/util/error.h"

namespace zfeed::ingest {
namespace {

std::mutex& netcdf_mutex() {
  static std::mutex mutex;
  return mutex;
}

void check(int status, const std::string& where) {
  if (status != NC_NOERR) throw Error(where + ": " + nc_strerror(status));
}

// The zfeed data type of a numeric netCDF type, or false for char, string and user types.
bool data_type_of(nc_type type, DataType* out) {
  switch (type) {
    case NC_BYTE:
      *out = DataType{DataTypeId::kInt8};
      return true;
    case NC_UBYTE:
      *out = DataType{DataTypeId::kUInt8};
      return true;
    case NC_SHORT:
      *out = DataType{DataTypeId::kInt16};
      return true;
    case NC_USHORT:
      *out = DataType{DataTypeId::kUInt16};
      return true;
    case NC_INT:
      *out = DataType{DataTypeId::kInt32};
      return true;
    case NC_UINT:
      *out = DataType{DataTypeId::kUInt32};
      return true;
    case NC_INT64:
      *out = DataType{DataTypeId::kInt64};
      return true;
    case NC_UINT64:
      *out = DataType{DataTypeId::kUInt64};
      return true;
    case NC_FLOAT:
      *out = DataType{DataTypeId::kFloat32};
      return true;
    case NC_DOUBLE:
      *out = DataType{DataTypeId::kFloat64};
      return true;
    default:
      return false;
  }
}

template <typename T>
Json numbers_to_json(const std::vector<uint8_t>& raw, size_t count) {
  std::vector<T> values(count);
  std::memcpy(values.data(), raw.data(), count * sizeof(T));
  if (count == 1) return Json(values[0]);
  Json array = Json::array();
  for (T v : values) array.push_back(v);
  return array;
}

Json read_attribute(int ncid, int varid, const char* name, const std::string& where) {
  nc_type type;
  size_t length;
  check(nc_inq_att(ncid, varid, name, &type, &length), where + ": attribute " + name);
  if (type == NC_CHAR) {
    std::string text(length, '\0');
    if (length)
      check(nc_get_att_text(ncid, varid, name, text.data()), where + ": attribute " + name);
    while (!text.empty() && text.back() == '\0') text.pop_back();
    return Json(text);
  }
  if (type == NC_STRING) {
    std::vector<char*> strings(length, nullptr);
    check(nc_get_att_string(ncid, varid, name, strings.data()), where + ": attribute " + name);
    Json value = Json::array();
    for (char* s : strings) value.push_back(std::string(s ? s : ""));
    nc_free_string(length, strings.data());
    return length == 1 ? value[0] : value;
  }
  DataType dtype;
  if (!data_type_of(type, &dtype)) return Json(nullptr);
  std::vector<uint8_t> raw(length * dtype.size());
  if (length) check(nc_get_att(ncid, varid, name, raw.data()), where + ": attribute " + name);
  if (length == 0) return Json::array();
  switch (dtype.id) {
    case DataTypeId::kInt8:
      return numbers_to_json<int8_t>(raw, length);
    case DataTypeId::kUInt8:
      return numbers_to_json<uint8_t>(raw, length);
    case DataTypeId::kInt16:
      return numbers_to_json<int16_t>(raw, length);
    case DataTypeId::kUInt16:
      return numbers_to_json<uint16_t>(raw, length);
    case DataTypeId::kInt32:
      return numbers_to_json<int32_t>(raw, length);
    case DataTypeId::kUInt32:
      return numbers_to_json<uint32_t>(raw, length);
    case DataTypeId::kInt64:
      return numbers_to_json<int64_t>(raw, length);
    case DataTypeId::kUInt64:
      return numbers_to_json<uint64_t>(raw, length);
    case DataTypeId::kFloat32:
      return numbers_to_json<float>(raw, length);
    default:
      return numbers_to_json<double>(raw, length);
  }
}

Json read_attributes(int ncid, int varid, int count, const std::string& where) {
  Json attributes = Json::object();
  for (int i = 0; i < count; ++i) {
    char name[NC_MAX_NAME + 1] = {};
    check(nc_inq_attname(ncid, varid, i, name), where);
    attributes[name] = read_attribute(ncid, varid, name, where);
  }
  return attributes;
}

std::string format_name(int format) {
  switch (format) {
    case NC_FORMAT_CLASSIC:
      return "netCDF-3 classic";
    case NC_FORMAT_64BIT_OFFSET:
      return "netCDF-3 64-bit offset";
    case NC_FORMAT_CDF5:
      return "netCDF-3 CDF5";
    case NC_FORMAT_NETCDF4:
      return "netCDF-4";
    case NC_FORMAT_NETCDF4_CLASSIC:
      return "netCDF-4 classic model";
    default:
      return "netCDF format " + std::to_string(format);
  }
}

}  // namespace

NetcdfSource::NetcdfSource(const std::string& path) : Source(path) {
  std::lock_guard lock(netcdf_mutex());
  check(nc_open(path.c_str(), NC_NOWRITE, &ncid_), path);
  try {
    int format = 0;
    check(nc_inq_format(ncid_, &format), path);
    format_ = format_name(format);
    int ndims = 0, nvars = 0, natts = 0, unlimited = 0;
    check(nc_inq(ncid_, &ndims, &nvars, &natts, &unlimited), path);
    attributes_ = read_attributes(ncid_, NC_GLOBAL, natts, path);
    std::vector<int> varids(static_cast<size_t>(nvars));
    int count = 0;
    check(nc_inq_varids(ncid_, &count, varids.data()), path);
    varids.resize(static_cast<size_t>(count));
    for (int varid : varids) {
      char name[NC_MAX_NAME + 1] = {};
      nc_type type;
      int var_ndims = 0, var_natts = 0;
      check(nc_inq_var(ncid_, varid, name, &type, &var_ndims, nullptr, &var_natts), path);
      std::vector<int> dimids(static_cast<size_t>(var_ndims));
      check(nc_inq_vardimid(ncid_, varid, dimids.data()), path + ": " + name);
      Variable variable;
      variable.name = name;
      if (!data_type_of(type, &variable.dtype)) {
        skipped_.push_back(variable.name + " (netCDF type " + std::to_string(type) +
                           ": only numeric variables are converted)");
        continue;
      }
      for (int dimid : dimids) {
        char dim_name[NC_MAX_NAME + 1] = {};
        size_t length = 0;
        check(nc_inq_dim(ncid_, dimid, dim_name, &length), path + ": " + variable.name);
        variable.dims.emplace_back(dim_name);
        variable.shape.push_back(length);
      }
      variable.attributes = read_attributes(ncid_, varid, var_natts, path + ": " + variable.name);
      varids_[variable.name] = varid;
      variables_.push_back(std::move(variable));
    }
  } catch (...) {
    nc_close(ncid_);
    throw;
  }
}

NetcdfSource::~NetcdfSource() {
  std::lock_guard lock(netcdf_mutex());
  nc_close(ncid_);
}

void NetcdfSource::read(const Variable& variable, std::span<const uint64_t> start,
                        std::span<const uint64_t> count, void* out) const {
  auto it = varids_.find(variable.name);
  if (it == varids_.end()) throw NotFoundError(path_ + ": no variable " + variable.name);
  if (start.size() != variable.rank() || count.size() != variable.rank()) {
    throw Error(path_ + ": " + variable.name + ": selection rank differs from the variable's");
  }
  std::vector<size_t> nc_start(start.begin(), start.end()), nc_count(count.begin(), count.end());
  for (size_t d = 0; d < variable.rank(); ++d) {
    if (start[d] + count[d] > variable.shape[d]) {
      throw Error(path_ + ": " + variable.name + ": hyperslab out of bounds in dimension " +
                  variable.dims[d]);
    }
    if (count[d] == 0) return;
  }
  std::lock_guard lock(netcdf_mutex());
  check(nc_get_vara(ncid_, it->second, nc_start.data(), nc_count.data(), out),
        path_ + ": reading " + variable.name);
}

}  // namespace zfeed::ingest
