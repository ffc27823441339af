// Copies and fills boxes of elements inside C-order arrays, the scatter step of every read and
// the gather step of every write. Adjacent dimensions that are contiguous on both sides are
// merged, so a chunk that spans whole rows moves with one memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace zfeed {

// A box inside a C-order array: the array's shape, the box origin and, optionally, a step per
// dimension (empty: all 1).
struct BoxRef {
  std::span<const uint64_t> shape;
  std::span<const uint64_t> start;
  std::span<const uint64_t> step = {};
};

// Copies `count` (elements per dimension) from the box in `src` to the box in `dst`.
void copy_box(const uint8_t* src, const BoxRef& src_box, uint8_t* dst, const BoxRef& dst_box,
              std::span<const uint64_t> count, size_t item_size);

// Writes the element `pattern` (item_size bytes) to every element of the box in `dst`.
void fill_box(uint8_t* dst, const BoxRef& dst_box, std::span<const uint64_t> count,
              const uint8_t* pattern, size_t item_size);

}  // namespace zfeed
