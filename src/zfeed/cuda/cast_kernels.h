// Normalization and cast of a batch's planes on the GPU: each plane (one channel of one sample)
// holds `count` raw values of its source element type; the kernel writes
// store_value(normalization.apply(float(x))) of loader/cast.h into the output plane, so the GPU
// output equals the CPU loader's bit for bit (NaNs included: see normalize_like_host).
//
// The per-element functions below are ZFEED_HOST_DEVICE: cast_planes_host() runs the same code on
// the CPU (the reference of the tests). Built only with CUDA (ZFEED_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "zfeed/cuda/copy_stream.h"
#include "zfeed/loader/cast.h"

namespace zfeed::cuda {

using loader::Normalization;
using loader::OutputType;

// The element types a plane can hold (those the loader casts; bool is kUInt8).
enum class SourceType : uint8_t {
  kUInt8,
  kInt8,
  kUInt16,
  kInt16,
  kUInt32,
  kInt32,
  kUInt64,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64
};

size_t source_size(SourceType type);
const char* source_name(SourceType type);

struct CastPlane {
  const void* src = nullptr;  // aligned to source_size(type)
  void* dst = nullptr;        // aligned to output_size(out)
  uint64_t count = 0;
  SourceType type = SourceType::kFloat32;
  Normalization normalization;
};

ZFEED_HOST_DEVICE inline float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// IEEE binary16 to float32, exactly; NaN becomes the quiet NaN of its sign (as the CPU loader's
// float16_to_double does).
ZFEED_HOST_DEVICE inline float float16_bits_to_float(uint16_t half) {
  const uint32_t sign = uint32_t{half & 0x8000u} << 16;
  const uint32_t exponent = (half >> 10) & 0x1Fu;
  uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0x1F) return float_from_bits(sign | (mantissa ? 0x7FC00000u : 0x7F800000u));
  if (exponent == 0) {
    if (mantissa == 0) return float_from_bits(sign);
    uint32_t e = 113;  // 2^-14, the smallest normal exponent of binary16, in float32's bias
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      --e;
    }
    return float_from_bits(sign | (e << 23) | ((mantissa & 0x3FFu) << 13));
  }
  return float_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// float32 arithmetic gives the CPU's NaN bits on the device too. x86-64 returns the first NaN
// operand, quieted, else the "default NaN" 0xFFC00000 for an invalid operation (0/0, inf - inf);
// NVIDIA GPUs return the canonical NaN 0x7FFFFFFF. On the host this is the plain operation.
ZFEED_HOST_DEVICE inline float host_nan(float a, float b, float result) {
#if defined(__CUDA_ARCH__)
  if (result == result) return result;
  if (a != a) return float_from_bits(loader::float_bits(a) | 0x400000u);
  if (b != b) return float_from_bits(loader::float_bits(b) | 0x400000u);
  return float_from_bits(0xFFC00000u);
#else
  (void)a;
  (void)b;
  return result;
#endif
}

// Normalization::apply with the host's NaN results (see host_nan).
ZFEED_HOST_DEVICE inline float normalize_like_host(const Normalization& n, float value) {
#if defined(__CUDA_ARCH__)
  if (n.unpack.active) value = n.unpack.apply(value);  // float32 holds the stored value exactly
  if (!n.enabled) return n.fill(value);
  const float centered = host_nan(value, n.mean, value - n.mean);
  return n.fill(host_nan(centered, n.stdev, centered / n.stdev));
#else
  return n.apply(value);
#endif
}

// A source value as float32, as the CPU loader's to_float: static_cast for numbers; on the
// device a float64 NaN keeps its sign and top payload bits, quieted (as x86's cvtsd2ss).
template <typename T>
ZFEED_HOST_DEVICE inline float source_to_float(T value) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 8 && !(T(0.5) == T(0))) {  // double
    if (value != value) {
      uint64_t bits;
      std::memcpy(&bits, &value, 8);
      return float_from_bits(static_cast<uint32_t>(bits >> 32 & 0x80000000u) | 0x7FC00000u |
                             static_cast<uint32_t>((bits >> 29) & 0x3FFFFFu));
    }
  }
#endif
  return static_cast<float>(value);
}

// Tags for 16-bit float sources.
struct Float16Tag {};
struct BFloat16Tag {};

template <typename T, OutputType Out>
ZFEED_HOST_DEVICE inline void cast_element(const CastPlane& plane, uint64_t i) {
  constexpr size_t kOut = Out == OutputType::kInt64 ? 8 : (Out == OutputType::kFloat32 ? 4 : 2);
  alignas(8) uint8_t stored[8];
  if constexpr (std::is_same_v<T, Float16Tag> || std::is_same_v<T, BFloat16Tag>) {
    const uint16_t bits = static_cast<const uint16_t*>(plane.src)[i];
    const float value = std::is_same_v<T, Float16Tag> ? float16_bits_to_float(bits)
                                                      : float_from_bits(uint32_t{bits} << 16);
    loader::store_value(normalize_like_host(plane.normalization, value), Out, stored);
  } else {
    const T value = static_cast<const T*>(plane.src)[i];
    if constexpr (Out == OutputType::kInt64 && std::is_integral_v<T>) {
      const int64_t label = static_cast<int64_t>(value);  // integer labels: exact, not via float
      std::memcpy(stored, &label, 8);
    } else {
      loader::store_value(normalize_like_host(plane.normalization, source_to_float(value)), Out,
                          stored);
    }
  }
  if constexpr (kOut == 8) {
    uint64_t word;
    std::memcpy(&word, stored, 8);
    static_cast<uint64_t*>(plane.dst)[i] = word;
  } else if constexpr (kOut == 4) {
    uint32_t word;
    std::memcpy(&word, stored, 4);
    static_cast<uint32_t*>(plane.dst)[i] = word;
  } else {
    uint16_t word;
    std::memcpy(&word, stored, 2);
    static_cast<uint16_t*>(plane.dst)[i] = word;
  }
}

template <typename T, OutputType Out>
ZFEED_HOST_DEVICE inline void cast_range_as(const CastPlane& plane, uint64_t first,
                                            uint64_t stride) {
  for (uint64_t i = first; i < plane.count; i += stride) cast_element<T, Out>(plane, i);
}

// Elements first, first + stride, ... of `plane`.
template <OutputType Out>
ZFEED_HOST_DEVICE inline void cast_range(const CastPlane& plane, uint64_t first, uint64_t stride) {
  switch (plane.type) {
    case SourceType::kUInt8:
      return cast_range_as<uint8_t, Out>(plane, first, stride);
    case SourceType::kInt8:
      return cast_range_as<int8_t, Out>(plane, first, stride);
    case SourceType::kUInt16:
      return cast_range_as<uint16_t, Out>(plane, first, stride);
    case SourceType::kInt16:
      return cast_range_as<int16_t, Out>(plane, first, stride);
    case SourceType::kUInt32:
      return cast_range_as<uint32_t, Out>(plane, first, stride);
    case SourceType::kInt32:
      return cast_range_as<int32_t, Out>(plane, first, stride);
    case SourceType::kUInt64:
      return cast_range_as<uint64_t, Out>(plane, first, stride);
    case SourceType::kInt64:
      return cast_range_as<int64_t, Out>(plane, first, stride);
    case SourceType::kFloat16:
      return cast_range_as<Float16Tag, Out>(plane, first, stride);
    case SourceType::kBFloat16:
      return cast_range_as<BFloat16Tag, Out>(plane, first, stride);
    case SourceType::kFloat32:
      return cast_range_as<float, Out>(plane, first, stride);
    case SourceType::kFloat64:
      return cast_range_as<double, Out>(plane, first, stride);
  }
}

// The CPU reference: the same per-element code on the host.
void cast_planes_host(std::span<const CastPlane> planes, OutputType out);

// Normalizes and casts `planes` (pointers into device memory, or mapped pinned memory) into
// `out` on `stream`: one launch for the whole batch. The plane descriptors travel through
// `descriptors` (grown as needed; keep it alive until the stream has run the launch). Throws
// zfeed::Error for misaligned planes or a failed launch.
void cast_planes(std::span<const CastPlane> planes, OutputType out, DeviceBuffer& descriptors,
                 cudaStream_t stream);

}  // namespace zfeed::cuda
