// The per-element math of batch assembly: normalization (x - mean) / std in float32 and the cast
// to the batch's element type. Plain inline functions without library calls, so that the CUDA
// kernels (issue: GPU batches) compile the same code and give the same bits as the CPU path.
#pragma once

#include <cstdint>
#include <cstring>

#include "zfeed/util/host_device.h"

namespace zfeed::loader {

// The element types a batch can hold.
enum class OutputType : uint8_t { kFloat32, kFloat16, kBFloat16, kInt64 };

inline size_t output_size(OutputType type) {
  switch (type) {
    case OutputType::kFloat32:
      return 4;
    case OutputType::kFloat16:
    case OutputType::kBFloat16:
      return 2;
    case OutputType::kInt64:
      return 8;
  }
  return 0;
}

inline const char* output_name(OutputType type) {
  switch (type) {
    case OutputType::kFloat32:
      return "float32";
    case OutputType::kFloat16:
      return "float16";
    case OutputType::kBFloat16:
      return "bfloat16";
    case OutputType::kInt64:
      return "int64";
  }
  return "?";
}

ZFEED_HOST_DEVICE inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// IEEE binary16 with round-to-nearest-even (overflow to infinity, subnormals kept, NaN stays a
// quiet NaN with its sign).
ZFEED_HOST_DEVICE inline uint16_t float_to_float16_bits(float value) {
  const uint32_t x = float_bits(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t magnitude = x & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u)
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (magnitude < 0x38800000u) {                                               // below 2^-14
    if (magnitude <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: ties to 0
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14 .. 24
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (magnitude - 0x38000000u) >> 13;  // exponent bias 127 -> 15
  const uint32_t rest = magnitude & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

// bfloat16 (the top half of a float32) with round-to-nearest-even; NaN stays a quiet NaN.
ZFEED_HOST_DEVICE inline uint16_t float_to_bfloat16_bits(float value) {
  const uint32_t x = float_bits(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// A CF-encoded channel's stored values as xarray decodes them (zarr/cf.h): a missing one is NaN,
// the others raw * scale + offset in float64, then float32.
struct CfUnpack {
  static constexpr unsigned kMaxMissing = 4;
  bool active = false;
  double scale = 1.0;
  double offset = 0.0;
  double missing[kMaxMissing] = {};
  unsigned missing_count = 0;
  // 2^bits for signed integers stored as unsigned (_Unsigned = "true"): a negative raw value
  // is raw + wrap. 0: none.
  double wrap = 0.0;
  ZFEED_HOST_DEVICE double unsigned_raw(double raw) const {
    return wrap != 0.0 && raw < 0.0 ? raw + wrap : raw;
  }
  ZFEED_HOST_DEVICE bool is_missing(double raw) const {
    raw = unsigned_raw(raw);
    bool found = false;
    for (unsigned i = 0; i < missing_count; ++i) found |= raw == missing[i];
    return found;
  }
  ZFEED_HOST_DEVICE float apply(double raw) const {
    if (is_missing(raw)) {
      const uint32_t quiet_nan = 0x7FC00000u;  // numpy's NaN, as float32
      float out;
      std::memcpy(&out, &quiet_nan, sizeof out);
      return out;
    }
    raw = unsigned_raw(raw);
#if defined(__CUDA_ARCH__)
    return static_cast<float>(__dadd_rn(__dmul_rn(raw, scale), offset));  // no FMA: as the host
#else
    return static_cast<float>(raw * scale + offset);
#endif
  }
};

// One channel's normalization: out = (float(x) - mean) / stdev in float32 (a division, not a
// multiplication by 1 / stdev, so that the result equals NumPy's (x - mean) / std to the bit);
// then, with fill_nan, a NaN (a missing value: sea surface temperature over land) becomes
// nan_value, in the normalized units (0: the channel's mean).
struct Normalization {
  bool enabled = false;
  float mean = 0.0f;
  float stdev = 1.0f;
  bool fill_nan = false;
  float nan_value = 0.0f;
  CfUnpack unpack{};  // applied first, to the stored value
  ZFEED_HOST_DEVICE float scale(float value) const {
    return enabled ? (value - mean) / stdev : value;
  }
  ZFEED_HOST_DEVICE float fill(float value) const {
    return fill_nan && value != value ? nan_value : value;
  }
  ZFEED_HOST_DEVICE float apply(float value) const {
    return fill(scale(unpack.active ? unpack.apply(value) : value));
  }
  // The same from a stored value wider than float32 holds exactly (int32, float64 with CF).
  ZFEED_HOST_DEVICE float apply_stored(double value) const {
    return fill(scale(unpack.active ? unpack.apply(value) : static_cast<float>(value)));
  }
  // Whether apply() changes anything.
  bool identity() const { return !enabled && !fill_nan && !unpack.active; }
};

// PyTorch's default ignore_index: the label of a missing (NaN) value in a float-stored label array.
inline constexpr int64_t kIgnoreLabel = -100;

// Stores one float value as `type` (kInt64 truncates toward zero, for labels stored as floats;
// NaN and values beyond int64 become kIgnoreLabel).
ZFEED_HOST_DEVICE inline void store_value(float value, OutputType type, uint8_t* out) {
  switch (type) {
    case OutputType::kFloat32:
      std::memcpy(out, &value, 4);
      return;
    case OutputType::kFloat16: {
      const uint16_t bits = float_to_float16_bits(value);
      std::memcpy(out, &bits, 2);
      return;
    }
    case OutputType::kBFloat16: {
      const uint16_t bits = float_to_bfloat16_bits(value);
      std::memcpy(out, &bits, 2);
      return;
    }
    case OutputType::kInt64: {
      const bool representable = value > -9.2e18f && value < 9.2e18f;  // false for NaN
      const int64_t label = representable ? static_cast<int64_t>(value) : kIgnoreLabel;
      std::memcpy(out, &label, 8);
      return;
    }
  }
}

}  // namespace zfeed::loader
