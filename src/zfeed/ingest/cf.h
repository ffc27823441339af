// CF decoding of packed and masked variables, as xarray's open_dataset does it: `scale_factor`
// and `add_offset` unpack to float32; values equal to `_FillValue` or `missing_value` become NaN.
// Unpacked integers without a fill or missing value stay as they are.
#pragma once

#include <cstddef>
#include <vector>

#include "zfeed/codec/data_type.h"
#include "zfeed/ingest/source.h"
#include "zfeed/util/json.h"
#include "zfeed/zarr/cf.h"

namespace zfeed::ingest {

struct CfDecoding {
  bool active = false;  // false: values are copied unchanged
  DataType input;
  DataType output;                   // float32 where packed; float32/float64 where only masked
  zarr::CfEncoding encoding;         // scale, offset and the stored values that decode to NaN
  Json attributes = Json::object();  // the attributes to write (the CF encoding ones dropped)

  // Decodes `count` values of `input` at `in` into `out` (values of `output`). Without
  // `active`, copies.
  void apply(const void* in, void* out, size_t count) const;
};

// Plans the decoding of a variable from its data type and attributes. Throws zfeed::Error for
// malformed CF attributes (a non-numeric scale_factor).
CfDecoding plan_cf_decoding(const Variable& variable, const std::string& source_path = "");

}  // namespace zfeed::ingest
