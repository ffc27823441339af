// Test-only: writes small netCDF files with libnetcdf for the ingest tests. Where zfeed is built
// without netCDF (ZFEED_HAVE_NETCDF 0), a test that needs such files starts with
// ZFEED_REQUIRE_NETCDF(), which skips it saying why.
#pragma once

#include <gtest/gtest.h>
#if ZFEED_HAVE_NETCDF
#include <netcdf.h>
#endif

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "zfeed/ingest/source.h"

// Skips the test where this build reads no netCDF files (nor can write them).
#define ZFEED_REQUIRE_NETCDF()                                \
  if (!::zfeed::ingest::netcdf_support().available) {         \
    GTEST_SKIP() << ::zfeed::ingest::netcdf_support().reason; \
  }                                                           \
  static_assert(true)

namespace zfeed::testing {

#if !ZFEED_HAVE_NETCDF
inline void write_test_netcdf(const std::string& path, size_t, int = 0, bool = false, float = 10.0f,
                              int = 1) {
  throw std::logic_error(path + ": write_test_netcdf needs libnetcdf (ZFEED_REQUIRE_NETCDF skips)");
}
#else

inline void nc_check(int status) {
  if (status != NC_NOERR) throw std::runtime_error(nc_strerror(status));
}

// A file like a small packed reanalysis: time (unlimited, `nt` steps from `t0`, hours since
// 1900), lat (3), lon (4), t(time, lat, lon) int16 packed with scale_factor 0.5, add_offset 200
// and _FillValue -32767 (every 5th value missing), z(time, lat, lon) float32 with missing_value
// 1e20 at index 1, level_count(lat) int32 (count0, count0 + 1, count0 + 2), a char variable
// `label` (skipped) and global attributes. `netcdf4` writes netCDF-4 (HDF5) instead of classic.
inline void write_test_netcdf(const std::string& path, size_t nt, int t0 = 0, bool netcdf4 = false,
                              float lat0 = 10.0f, int count0 = 1) {
  int ncid, time_dim, lat_dim, lon_dim, str_dim;
  nc_check(nc_create(path.c_str(), netcdf4 ? NC_NETCDF4 : NC_CLOBBER, &ncid));
  nc_check(nc_def_dim(ncid, "time", NC_UNLIMITED, &time_dim));
  nc_check(nc_def_dim(ncid, "lat", 3, &lat_dim));
  nc_check(nc_def_dim(ncid, "lon", 4, &lon_dim));
  nc_check(nc_def_dim(ncid, "nchar", 5, &str_dim));
  int time_var, lat_var, lon_var, t_var, z_var, count_var, label_var;
  nc_check(nc_def_var(ncid, "time", NC_INT, 1, &time_dim, &time_var));
  nc_check(nc_def_var(ncid, "lat", NC_FLOAT, 1, &lat_dim, &lat_var));
  nc_check(nc_def_var(ncid, "lon", NC_FLOAT, 1, &lon_dim, &lon_var));
  int dims3[3] = {time_dim, lat_dim, lon_dim};
  nc_check(nc_def_var(ncid, "t", NC_SHORT, 3, dims3, &t_var));
  nc_check(nc_def_var(ncid, "z", NC_FLOAT, 3, dims3, &z_var));
  nc_check(nc_def_var(ncid, "level_count", NC_INT, 1, &lat_dim, &count_var));
  int label_dims[2] = {lat_dim, str_dim};
  nc_check(nc_def_var(ncid, "label", NC_CHAR, 2, label_dims, &label_var));
  auto text = [&](int var, const char* name, const std::string& value) {
    nc_check(nc_put_att_text(ncid, var, name, value.size(), value.c_str()));
  };
  text(NC_GLOBAL, "Conventions", "CF-1.6");
  text(NC_GLOBAL, "title", "zfeed test");
  int version = 3;
  nc_check(nc_put_att_int(ncid, NC_GLOBAL, "version", NC_INT, 1, &version));
  text(time_var, "units", "hours since 1900-01-01 00:00:00");
  text(time_var, "calendar", "gregorian");
  text(lat_var, "units", "degrees_north");
  text(lon_var, "units", "degrees_east");
  text(t_var, "units", "K");
  text(t_var, "long_name", "Temperature");
  double scale = 0.5, offset = 200.0;
  short fill = -32767;
  nc_check(nc_put_att_double(ncid, t_var, "scale_factor", NC_DOUBLE, 1, &scale));
  nc_check(nc_put_att_double(ncid, t_var, "add_offset", NC_DOUBLE, 1, &offset));
  nc_check(nc_put_att_short(ncid, t_var, "_FillValue", NC_SHORT, 1, &fill));
  float missing = 1e20f;
  nc_check(nc_put_att_float(ncid, z_var, "missing_value", NC_FLOAT, 1, &missing));
  double range[2] = {-1.5, 2.5};
  nc_check(nc_put_att_double(ncid, z_var, "valid_range", NC_DOUBLE, 2, range));
  nc_check(nc_enddef(ncid));

  std::vector<int> times(nt);
  for (size_t i = 0; i < nt; ++i) times[i] = t0 + int(i) * 6;
  size_t start1 = 0, count_t = nt;
  if (nt) nc_check(nc_put_vara_int(ncid, time_var, &start1, &count_t, times.data()));
  float lats[3] = {lat0, lat0 + 1, lat0 + 2}, lons[4] = {0, 90, 180, 270};
  nc_check(nc_put_var_float(ncid, lat_var, lats));
  nc_check(nc_put_var_float(ncid, lon_var, lons));
  int counts[3] = {count0, count0 + 1, count0 + 2};
  nc_check(nc_put_var_int(ncid, count_var, counts));
  nc_check(nc_put_var_text(ncid, label_var, "aaaaabbbbbccccc"));
  std::vector<short> t(nt * 12);
  std::vector<float> z(nt * 12);
  for (size_t i = 0; i < t.size(); ++i) {
    const size_t global = size_t(t0 / 6) * 12 + i;
    t[i] = global % 5 == 0 ? fill : short(global * 3 - 100);
    z[i] = i == 1 ? missing : float(global) * 0.25f;
  }
  size_t start3[3] = {0, 0, 0}, count3[3] = {nt, 3, 4};
  if (nt) {
    nc_check(nc_put_vara_short(ncid, t_var, start3, count3, t.data()));
    nc_check(nc_put_vara_float(ncid, z_var, start3, count3, z.data()));
  }
  nc_check(nc_close(ncid));
}
#endif  // ZFEED_HAVE_NETCDF

}  // namespace zfeed::testing
