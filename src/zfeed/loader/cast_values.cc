#include "zfeed/loader/cast_values.h"

#include <cstring>
#include <string>
#include <type_traits>

#include "zfeed/util/error.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace zfeed::loader {

namespace {

// Input element tags for values stored as 16-bit floats.
struct Float16Bits {
  uint16_t bits;
};
struct BFloat16Bits {
  uint16_t bits;
};

template <typename T>
float to_float(T value) {
  if constexpr (std::is_same_v<T, Float16Bits>) {
    return static_cast<float>(float16_to_double(value.bits));
  } else if constexpr (std::is_same_v<T, BFloat16Bits>) {
    uint32_t bits = uint32_t{value.bits} << 16;  // exact: bfloat16 is a float32's top half
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
  } else {
    return static_cast<float>(value);
  }
}

template <typename T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, Float16Bits> || std::is_same_v<T, BFloat16Bits>) {
    return static_cast<double>(to_float(value));
  } else {
    return static_cast<double>(value);
  }
}

// Stores value_of(each of the `count` T values at src) as Out at dst. One loop per way of making
// a value (below), each simple enough for the compiler to vectorize.
template <typename T, OutputType Out, typename ValueOf>
void store_each(const uint8_t* src, uint8_t* dst, size_t count, ValueOf value_of) {
  constexpr size_t kOut = Out == OutputType::kInt64 ? 8 : (Out == OutputType::kFloat32 ? 4 : 2);
  for (size_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, src + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<decltype(value_of(value)), int64_t>) {
      const int64_t label = value_of(value);
      std::memcpy(dst + i * kOut, &label, kOut);
    } else {
      store_value(value_of(value), Out, dst + i * kOut);
    }
  }
}

template <typename T, OutputType Out>
void cast_run(const uint8_t* src, uint8_t* dst, size_t count, Normalization normalization) {
  if constexpr (Out == OutputType::kInt64 && !std::is_same_v<T, Float16Bits> &&
                !std::is_same_v<T, BFloat16Bits> && std::is_integral_v<T>) {
    // Integer labels: exact, never through float; a missing value (CF) is kIgnoreLabel.
    const CfUnpack& cf = normalization.unpack;
    store_each<T, Out>(src, dst, count, [&](T value) -> int64_t {
      return cf.missing_count && cf.is_missing(static_cast<double>(value))
                 ? kIgnoreLabel
                 : static_cast<int64_t>(value);
    });
  } else if (normalization.unpack.active) {
    store_each<T, Out>(src, dst, count,
                       [&](T value) { return normalization.apply_stored(to_double(value)); });
  } else if (normalization.fill_nan) {
    store_each<T, Out>(src, dst, count,
                       [&](T value) { return normalization.apply(to_float(value)); });
  } else if (normalization.enabled) {
    store_each<T, Out>(src, dst, count,
                       [&](T value) { return normalization.scale(to_float(value)); });
  } else {
    store_each<T, Out>(src, dst, count, [](T value) { return to_float(value); });
  }
}

template <typename T>
void cast_to(const uint8_t* src, uint8_t* dst, OutputType out, size_t count,
             Normalization normalization) {
  switch (out) {
    case OutputType::kFloat32:
      return cast_run<T, OutputType::kFloat32>(src, dst, count, normalization);
    case OutputType::kFloat16:
      return cast_run<T, OutputType::kFloat16>(src, dst, count, normalization);
    case OutputType::kBFloat16:
      return cast_run<T, OutputType::kBFloat16>(src, dst, count, normalization);
    case OutputType::kInt64:
      return cast_run<T, OutputType::kInt64>(src, dst, count, normalization);
  }
}

// The cast loops for every stored type (inlined into each caller below).
inline void cast_any(const uint8_t* src, DataType type, uint8_t* dst, OutputType out, size_t count,
                     Normalization normalization) {
  switch (type.id) {
    case DataTypeId::kBool:
    case DataTypeId::kUInt8:
      return cast_to<uint8_t>(src, dst, out, count, normalization);
    case DataTypeId::kInt8:
      return cast_to<int8_t>(src, dst, out, count, normalization);
    case DataTypeId::kInt16:
      return cast_to<int16_t>(src, dst, out, count, normalization);
    case DataTypeId::kUInt16:
      return cast_to<uint16_t>(src, dst, out, count, normalization);
    case DataTypeId::kInt32:
      return cast_to<int32_t>(src, dst, out, count, normalization);
    case DataTypeId::kUInt32:
      return cast_to<uint32_t>(src, dst, out, count, normalization);
    case DataTypeId::kInt64:
      return cast_to<int64_t>(src, dst, out, count, normalization);
    case DataTypeId::kUInt64:
      return cast_to<uint64_t>(src, dst, out, count, normalization);
    case DataTypeId::kFloat32:
      return cast_to<float>(src, dst, out, count, normalization);
    case DataTypeId::kFloat64:
      return cast_to<double>(src, dst, out, count, normalization);
    case DataTypeId::kFloat16:
      return cast_to<Float16Bits>(src, dst, out, count, normalization);
    case DataTypeId::kBFloat16:
      return cast_to<BFloat16Bits>(src, dst, out, count, normalization);
    default:
      throw UnsupportedError("loader: cannot cast " + std::string(type.name()) + " to " +
                             output_name(out));
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ZFEED_CAST_AVX2 1
// The same loops compiled for AVX2 (`flatten` inlines them here, so they take this target):
// twice the width of the baseline's SSE2, which halves the normalizing cast's time per plane
// (a division per value: (x - mean) / std, to equal numpy's float32 result to the last bit; the
// division is exact-rounded at any width). Chosen at run time where the CPU has AVX2.
__attribute__((target("avx2"), flatten)) void cast_any_avx2(const uint8_t* src, DataType type,
                                                            uint8_t* dst, OutputType out,
                                                            size_t count,
                                                            Normalization normalization) {
  cast_any(src, type, dst, out, count, normalization);
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

}  // namespace

void cast_values(const uint8_t* src, DataType type, uint8_t* dst, OutputType out, size_t count,
                 Normalization normalization) {
#if ZFEED_CAST_AVX2
  if (cpu_has_avx2()) return cast_any_avx2(src, type, dst, out, count, normalization);
#endif
  cast_any(src, type, dst, out, count, normalization);
}

void stream_values(const uint8_t* src, DataType type, uint8_t* dst, OutputType out, size_t count,
                   Normalization normalization) {
#if defined(__SSE2__)
  // Values are cast into a small block that stays in L1, then streamed out 16 bytes at a time:
  // the same cast_values code makes them, so they equal the plain path's bit for bit.
  constexpr size_t kBlockBytes = 4096, kStreamMinBytes = 16384;
  const size_t in_size = type.size(), out_size = output_size(out);
  if (count * out_size < kStreamMinBytes || reinterpret_cast<uintptr_t>(dst) % out_size != 0) {
    return cast_values(src, type, dst, out, count, normalization);
  }
  const size_t misalignment = reinterpret_cast<uintptr_t>(dst) % 16;
  const size_t head = misalignment ? (16 - misalignment) / out_size : 0;
  cast_values(src, type, dst, out, head, normalization);
  src += head * in_size;
  dst += head * out_size;
  count -= head;
  alignas(64) uint8_t block[kBlockBytes];
  const size_t per_block = kBlockBytes / out_size;
  for (; count >= per_block; count -= per_block) {
    cast_values(src, type, block, out, per_block, normalization);
    for (size_t i = 0; i < kBlockBytes; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_load_si128(reinterpret_cast<const __m128i*>(block + i)));
    }
    src += per_block * in_size;
    dst += kBlockBytes;
  }
  cast_values(src, type, dst, out, count, normalization);
  _mm_sfence();  // the streamed lines are visible before the batch is handed on
#else
  cast_values(src, type, dst, out, count, normalization);
#endif
}

}  // namespace zfeed::loader
