#include "zfeed/ingest/cf.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "zfeed/util/error.h"
#include "zfeed/zarr/cf.h"

namespace zfeed::ingest {
namespace {

template <typename In, typename Out>
void decode(const CfDecoding& plan, const void* in_bytes, void* out_bytes, size_t count) {
  const In* in = static_cast<const In*>(in_bytes);
  Out* out = static_cast<Out*>(out_bytes);
  for (size_t i = 0; i < count; ++i) {
    out[i] = static_cast<Out>(plan.encoding.decode(static_cast<double>(in[i])));
  }
}

// Half floats (cast to a wider float, as --stack does): by their bits.
template <typename Out>
void decode_half(const CfDecoding& plan, const void* in_bytes, void* out_bytes, size_t count,
                 double (*to_double)(uint16_t)) {
  const auto* in = static_cast<const uint16_t*>(in_bytes);
  Out* out = static_cast<Out*>(out_bytes);
  for (size_t i = 0; i < count; ++i) {
    out[i] = static_cast<Out>(plan.encoding.decode(to_double(in[i])));
  }
}

template <typename Out>
void decode_from(const CfDecoding& plan, const void* in, void* out, size_t count) {
  switch (plan.input.id) {
    case DataTypeId::kFloat16:
      return decode_half<Out>(plan, in, out, count, float16_to_double);
    case DataTypeId::kBFloat16:
      return decode_half<Out>(plan, in, out, count, bfloat16_to_double);
    case DataTypeId::kInt8:
      return decode<int8_t, Out>(plan, in, out, count);
    case DataTypeId::kUInt8:
      return decode<uint8_t, Out>(plan, in, out, count);
    case DataTypeId::kInt16:
      return decode<int16_t, Out>(plan, in, out, count);
    case DataTypeId::kUInt16:
      return decode<uint16_t, Out>(plan, in, out, count);
    case DataTypeId::kInt32:
      return decode<int32_t, Out>(plan, in, out, count);
    case DataTypeId::kUInt32:
      return decode<uint32_t, Out>(plan, in, out, count);
    case DataTypeId::kInt64:
      return decode<int64_t, Out>(plan, in, out, count);
    case DataTypeId::kUInt64:
      return decode<uint64_t, Out>(plan, in, out, count);
    case DataTypeId::kFloat32:
      return decode<float, Out>(plan, in, out, count);
    case DataTypeId::kFloat64:
      return decode<double, Out>(plan, in, out, count);
    default:
      throw UnsupportedError("CF decoding of " + std::string(plan.input.name()) + " values");
  }
}

}  // namespace

CfDecoding plan_cf_decoding(const Variable& variable, const std::string& source_path) {
  CfDecoding plan;
  plan.input = variable.dtype;
  plan.output = variable.dtype;
  plan.attributes = variable.attributes;
  const Json& attrs = variable.attributes;
  const bool packed = attrs.contains("scale_factor") || attrs.contains("add_offset");
  const bool masked = attrs.contains("_FillValue") || attrs.contains("missing_value");
  const bool unsigned_flag = attrs.contains("_Unsigned");
  if (!packed && !masked && !unsigned_flag) return plan;
  const bool numeric = variable.dtype.is_integer() || variable.dtype.is_float();
  if (!numeric || variable.dtype.id == DataTypeId::kFloat16 ||
      variable.dtype.id == DataTypeId::kBFloat16) {
    return plan;  // left as stored
  }
  plan.encoding =
      zarr::cf_encoding(variable.dtype, attrs,
                        source_path.empty() ? variable.name : source_path + ": " + variable.name);
  if (!packed && !masked && plan.encoding.wrap == 0.0) return plan;  // _Unsigned on no signed type
  plan.active = true;
  if (packed) {
    plan.output = DataType{DataTypeId::kFloat32};
  } else if (variable.dtype.is_integer()) {
    // As xarray: small integers fit float32 exactly, wider ones need float64.
    plan.output =
        DataType{variable.dtype.size() <= 2 ? DataTypeId::kFloat32 : DataTypeId::kFloat64};
  }
  for (const char* name :
       {"scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned"}) {
    plan.attributes.erase(name);
  }
  return plan;
}

void CfDecoding::apply(const void* in, void* out, size_t count) const {
  if (!active) {
    std::memcpy(out, in, count * input.size());
    return;
  }
  if (output.id == DataTypeId::kFloat32) {
    decode_from<float>(*this, in, out, count);
  } else {
    decode_from<double>(*this, in, out, count);
  }
}

}  // namespace zfeed::ingest
