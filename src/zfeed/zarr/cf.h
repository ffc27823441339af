// The CF encoding of an array's values, as xarray decodes it (mask_and_scale): stored values equal
// to `_FillValue` or `missing_value` are missing (NaN), the others are raw * scale_factor +
// add_offset. Data preparation (ingest/cf.h), `zfeed stats` and the loader read it from here, so
// that they agree on what a stored value means.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "zfeed/codec/data_type.h"
#include "zfeed/util/json.h"
#include "zfeed/zarr/metadata.h"

namespace zfeed::zarr {

struct CfEncoding {
  bool packed = false;  // scale_factor or add_offset given
  double scale = 1.0;
  double offset = 0.0;
  std::vector<double> missing;  // stored values that decode to NaN (as unsigned, with wrap)
  // Signed integers that hold unsigned values (_Unsigned = "true", netCDF-3's way): 2^bits, added
  // to a negative stored value before anything else; 0 for none.
  double wrap = 0.0;
  bool active() const { return packed || !missing.empty() || wrap != 0.0; }
  // A stored value decoded: NaN where missing, else raw * scale + offset (raw itself where those
  // change nothing, so that -0.0 stays). The loader's per-element copy is loader::CfUnpack.
  double decode(double raw) const {
    if (wrap != 0.0 && raw < 0.0) raw += wrap;
    for (const double m : missing) {
      if (raw == m) return std::numeric_limits<double>::quiet_NaN();
    }
    return scale != 1.0 || offset != 0.0 ? raw * scale + offset : raw;
  }
};

// From `attributes` for values of `dtype`; inactive for half floats and non-numeric types (left as
// stored, as xarray leaves them). Throws zfeed::Error naming `what` for a non-numeric attribute.
CfEncoding cf_encoding(DataType dtype, const Json& attributes, const std::string& what);

// The same for an array; a Zarr v2 array with CF attributes also takes its fill_value as
// _FillValue where that attribute is absent (xarray's zarr backend does).
CfEncoding cf_encoding(const ArrayMetadata& meta, const std::string& what);

// The attributes xarray decodes a Zarr array with: its own, plus that v2 fill_value.
Json cf_attributes(const ArrayMetadata& meta);

}  // namespace zfeed::zarr
