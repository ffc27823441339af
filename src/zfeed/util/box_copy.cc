#include "zfeed/util/box_copy.h"

#include <cstring>
#include <vector>

namespace zfeed {
namespace {

struct Dim {
  uint64_t count;
  int64_t src_stride;  // bytes
  int64_t dst_stride;  // bytes
};

std::vector<int64_t> byte_strides(const BoxRef& box, size_t item_size) {
  const size_t rank = box.shape.size();
  std::vector<int64_t> strides(rank);
  int64_t stride = static_cast<int64_t>(item_size);
  for (size_t d = rank; d-- > 0;) {
    strides[d] = stride * static_cast<int64_t>(box.step.empty() ? 1 : box.step[d]);
    stride *= static_cast<int64_t>(box.shape[d]);
  }
  return strides;
}

int64_t origin_offset(const BoxRef& box, size_t item_size) {
  int64_t offset = 0, stride = static_cast<int64_t>(item_size);
  for (size_t d = box.shape.size(); d-- > 0;) {
    offset += static_cast<int64_t>(box.start[d]) * stride;
    stride *= static_cast<int64_t>(box.shape[d]);
  }
  return offset;
}

// Drops extent-1 dimensions and merges neighbours that are contiguous on both sides.
std::vector<Dim> simplify(std::span<const uint64_t> count, const std::vector<int64_t>& src,
                          const std::vector<int64_t>& dst) {
  std::vector<Dim> dims;
  for (size_t d = 0; d < count.size(); ++d) {
    if (count[d] == 1) continue;
    Dim dim{count[d], src[d], dst[d]};
    if (!dims.empty()) {
      Dim& outer = dims.back();
      if (outer.src_stride == static_cast<int64_t>(dim.count) * dim.src_stride &&
          outer.dst_stride == static_cast<int64_t>(dim.count) * dim.dst_stride) {
        outer.count *= dim.count;
        outer.src_stride = dim.src_stride;
        outer.dst_stride = dim.dst_stride;
        continue;
      }
    }
    dims.push_back(dim);
  }
  return dims;
}

template <size_t N>
void copy_items(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride,
                uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    std::memcpy(dst, src, N);
    src += src_stride;
    dst += dst_stride;
  }
}

void copy_run(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride, uint64_t n,
              size_t item) {
  if (src_stride == static_cast<int64_t>(item) && dst_stride == static_cast<int64_t>(item)) {
    std::memcpy(dst, src, n * item);
    return;
  }
  switch (item) {
    case 1:
      return copy_items<1>(src, src_stride, dst, dst_stride, n);
    case 2:
      return copy_items<2>(src, src_stride, dst, dst_stride, n);
    case 4:
      return copy_items<4>(src, src_stride, dst, dst_stride, n);
    case 8:
      return copy_items<8>(src, src_stride, dst, dst_stride, n);
    case 16:
      return copy_items<16>(src, src_stride, dst, dst_stride, n);
    default:
      for (uint64_t i = 0; i < n; ++i)
        std::memcpy(dst + i * dst_stride, src + i * src_stride, item);
  }
}

// Calls run(src_offset, dst_offset) for each innermost run, odometer style.
template <typename Run>
void for_each_run(const std::vector<Dim>& dims, Run&& run) {
  if (dims.size() <= 1) {
    run(0, 0);
    return;
  }
  const size_t outer = dims.size() - 1;
  std::vector<uint64_t> index(outer, 0);
  int64_t src = 0, dst = 0;
  for (;;) {
    run(src, dst);
    size_t d = outer;
    while (d-- > 0) {
      src += dims[d].src_stride;
      dst += dims[d].dst_stride;
      if (++index[d] < dims[d].count) break;
      src -= dims[d].src_stride * static_cast<int64_t>(dims[d].count);
      dst -= dims[d].dst_stride * static_cast<int64_t>(dims[d].count);
      index[d] = 0;
      if (d == 0) return;
    }
  }
}

}  // namespace

void copy_box(const uint8_t* src, const BoxRef& src_box, uint8_t* dst, const BoxRef& dst_box,
              std::span<const uint64_t> count, size_t item_size) {
  for (uint64_t extent : count) {
    if (extent == 0) return;
  }
  src += origin_offset(src_box, item_size);
  dst += origin_offset(dst_box, item_size);
  auto dims = simplify(count, byte_strides(src_box, item_size), byte_strides(dst_box, item_size));
  if (dims.empty()) {
    std::memcpy(dst, src, item_size);
    return;
  }
  const Dim inner = dims.back();
  for_each_run(dims, [&](int64_t src_offset, int64_t dst_offset) {
    copy_run(src + src_offset, inner.src_stride, dst + dst_offset, inner.dst_stride, inner.count,
             item_size);
  });
}

void fill_box(uint8_t* dst, const BoxRef& dst_box, std::span<const uint64_t> count,
              const uint8_t* pattern, size_t item_size) {
  for (uint64_t extent : count) {
    if (extent == 0) return;
  }
  dst += origin_offset(dst_box, item_size);
  auto strides = byte_strides(dst_box, item_size);
  auto dims = simplify(count, strides, strides);
  if (dims.empty()) {
    std::memcpy(dst, pattern, item_size);
    return;
  }
  bool zero = true;
  for (size_t i = 0; i < item_size; ++i) zero = zero && pattern[i] == 0;
  const Dim inner = dims.back();
  for_each_run(dims, [&](int64_t, int64_t dst_offset) {
    uint8_t* out = dst + dst_offset;
    if (inner.dst_stride == static_cast<int64_t>(item_size) && zero) {
      std::memset(out, 0, inner.count * item_size);
      return;
    }
    for (uint64_t i = 0; i < inner.count; ++i)
      std::memcpy(out + i * inner.dst_stride, pattern, item_size);
  });
}

}  // namespace zfeed
