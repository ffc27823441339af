#include "zfeed/util/box_copy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace zfeed {
namespace {

// Reference: element-by-element copy of a strided box between two C-order arrays.
template <typename T>
void reference_copy(const std::vector<T>& src, const std::vector<uint64_t>& src_shape,
                    const std::vector<uint64_t>& src_start, const std::vector<uint64_t>& src_step,
                    std::vector<T>& dst, const std::vector<uint64_t>& dst_shape,
                    const std::vector<uint64_t>& dst_start, const std::vector<uint64_t>& dst_step,
                    const std::vector<uint64_t>& count) {
  const size_t rank = count.size();
  uint64_t total = 1;
  for (uint64_t c : count) total *= c;
  std::vector<uint64_t> index(rank, 0);
  for (uint64_t n = 0; n < total; ++n) {
    uint64_t s = 0, d = 0;
    for (size_t k = 0; k < rank; ++k) {
      s = s * src_shape[k] + src_start[k] + index[k] * (src_step.empty() ? 1 : src_step[k]);
      d = d * dst_shape[k] + dst_start[k] + index[k] * (dst_step.empty() ? 1 : dst_step[k]);
    }
    dst[d] = src[s];
    for (size_t k = rank; k-- > 0;) {
      if (++index[k] < count[k]) break;
      index[k] = 0;
    }
  }
}

template <typename T>
std::vector<T> numbered(size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(i + 1);
  return v;
}

TEST(BoxCopy, WholeArrayIsOneMemcpyAndExact) {
  std::vector<uint64_t> shape{3, 4, 5};
  auto src = numbered<float>(60);
  std::vector<float> dst(60, -1);
  std::vector<uint64_t> zero{0, 0, 0};
  copy_box(reinterpret_cast<const uint8_t*>(src.data()), {shape, zero},
           reinterpret_cast<uint8_t*>(dst.data()), {shape, zero}, shape, sizeof(float));
  EXPECT_EQ(src, dst);
}

TEST(BoxCopy, SubBoxIntoLargerArray) {
  // A 2x3 chunk placed at (1, 2) of a 4x6 output: rows are not contiguous in the output.
  std::vector<uint64_t> chunk_shape{2, 3}, out_shape{4, 6};
  auto src = numbered<int32_t>(6);
  std::vector<int32_t> dst(24, 0), expected(24, 0);
  std::vector<uint64_t> zero{0, 0}, at{1, 2}, count{2, 3};
  copy_box(reinterpret_cast<const uint8_t*>(src.data()), {chunk_shape, zero},
           reinterpret_cast<uint8_t*>(dst.data()), {out_shape, at}, count, 4);
  reference_copy(src, chunk_shape, zero, {}, expected, out_shape, at, {}, count);
  EXPECT_EQ(dst, expected);
  // Values outside the box are untouched.
  EXPECT_EQ(dst[0], 0);
  EXPECT_EQ(dst[1 * 6 + 2], 1);
  EXPECT_EQ(dst[2 * 6 + 4], 6);
  EXPECT_EQ(dst[2 * 6 + 5], 0);
}

TEST(BoxCopy, StepsOnSourceSide) {
  // Every second row and every third column of a 6x9 array.
  std::vector<uint64_t> src_shape{6, 9}, out_shape{3, 3};
  auto src = numbered<uint16_t>(54);
  std::vector<uint16_t> dst(9, 0), expected(9, 0);
  std::vector<uint64_t> src_start{0, 1}, step{2, 3}, zero{0, 0}, count{3, 3};
  copy_box(reinterpret_cast<const uint8_t*>(src.data()), {src_shape, src_start, step},
           reinterpret_cast<uint8_t*>(dst.data()), {out_shape, zero}, count, 2);
  reference_copy(src, src_shape, src_start, step, expected, out_shape, zero, {}, count);
  EXPECT_EQ(dst, expected);
  EXPECT_EQ(dst[0], 2);              // (0, 1)
  EXPECT_EQ(dst[4], 2 * 9 + 4 + 1);  // (2, 4)
}

TEST(BoxCopy, StepsOnDestinationSide) {
  // The gather step of a strided write: scatter a dense 2x2 block into every other element.
  std::vector<uint64_t> dense{2, 2}, chunk{4, 4};
  auto src = numbered<uint64_t>(4);
  std::vector<uint64_t> dst(16, 0), expected(16, 0);
  std::vector<uint64_t> zero{0, 0}, start{1, 0}, step{2, 3}, count{2, 2};
  copy_box(reinterpret_cast<const uint8_t*>(src.data()), {dense, zero},
           reinterpret_cast<uint8_t*>(dst.data()), {chunk, start, step}, count, 8);
  reference_copy(src, dense, zero, {}, expected, chunk, start, step, count);
  EXPECT_EQ(dst, expected);
  EXPECT_EQ(dst[4 + 0], 1u);
  EXPECT_EQ(dst[4 + 3], 2u);
  EXPECT_EQ(dst[12 + 0], 3u);
  EXPECT_EQ(dst[12 + 3], 4u);
}

TEST(BoxCopy, EdgeChunkCroppedOnRead) {
  // The last chunk of a 10-wide array with chunks of 4 holds 2 valid columns.
  std::vector<uint64_t> chunk{3, 4}, out{3, 10};
  auto src = numbered<double>(12);
  std::vector<double> dst(30, 0), expected(30, 0);
  std::vector<uint64_t> zero{0, 0}, at{0, 8}, count{3, 2};
  copy_box(reinterpret_cast<const uint8_t*>(src.data()), {chunk, zero},
           reinterpret_cast<uint8_t*>(dst.data()), {out, at}, count, 8);
  reference_copy(src, chunk, zero, {}, expected, out, at, {}, count);
  EXPECT_EQ(dst, expected);
  EXPECT_EQ(dst[9], 2.0);
  EXPECT_EQ(dst[10 + 8], 5.0);
}

TEST(BoxCopy, MergedContiguousDimsMatchReference) {
  // Inner dims are whole on both sides (mergeable), the outer one is a sub-range; also size-1
  // dims in the middle, which are dropped.
  std::vector<uint64_t> src_shape{5, 1, 3, 4}, dst_shape{7, 1, 3, 4};
  auto src = numbered<int16_t>(60);
  std::vector<int16_t> dst(84, 0), expected(84, 0);
  std::vector<uint64_t> src_start{1, 0, 0, 0}, dst_start{3, 0, 0, 0}, count{3, 1, 3, 4};
  copy_box(reinterpret_cast<const uint8_t*>(src.data()), {src_shape, src_start},
           reinterpret_cast<uint8_t*>(dst.data()), {dst_shape, dst_start}, count, 2);
  reference_copy(src, src_shape, src_start, {}, expected, dst_shape, dst_start, {}, count);
  EXPECT_EQ(dst, expected);
}

TEST(BoxCopy, OddItemSizes) {
  // complex128 (16 bytes) and a 3-byte item go through the generic path.
  for (size_t item : {size_t{3}, size_t{16}}) {
    std::vector<uint64_t> src_shape{4, 4}, dst_shape{2, 2};
    std::vector<uint8_t> src(16 * item), dst(4 * item, 0);
    std::iota(src.begin(), src.end(), uint8_t{0});
    std::vector<uint64_t> start{1, 1}, step{2, 2}, zero{0, 0}, count{2, 2};
    copy_box(src.data(), {src_shape, start, step}, dst.data(), {dst_shape, zero}, count, item);
    const uint64_t picks[] = {1 * 4 + 1, 1 * 4 + 3, 3 * 4 + 1, 3 * 4 + 3};
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(0, std::memcmp(dst.data() + i * item, src.data() + picks[i] * item, item))
          << "item " << item << " element " << i;
    }
  }
}

TEST(BoxCopy, ZeroDimensional) {
  double src = 3.5, dst = 0;
  std::span<const uint64_t> none;
  copy_box(reinterpret_cast<const uint8_t*>(&src), {none, none}, reinterpret_cast<uint8_t*>(&dst),
           {none, none}, none, 8);
  EXPECT_EQ(dst, 3.5);
  double fill = -2.25;
  fill_box(reinterpret_cast<uint8_t*>(&dst), {none, none}, none,
           reinterpret_cast<const uint8_t*>(&fill), 8);
  EXPECT_EQ(dst, -2.25);
}

TEST(BoxCopy, EmptyCountTouchesNothing) {
  std::vector<uint64_t> shape{2, 2}, zero{0, 0}, count{0, 2};
  std::vector<int32_t> src{1, 2, 3, 4}, dst{9, 9, 9, 9};
  copy_box(reinterpret_cast<const uint8_t*>(src.data()), {shape, zero},
           reinterpret_cast<uint8_t*>(dst.data()), {shape, zero}, count, 4);
  EXPECT_EQ(dst, (std::vector<int32_t>{9, 9, 9, 9}));
  int32_t pattern = 7;
  fill_box(reinterpret_cast<uint8_t*>(dst.data()), {shape, zero}, count,
           reinterpret_cast<const uint8_t*>(&pattern), 4);
  EXPECT_EQ(dst, (std::vector<int32_t>{9, 9, 9, 9}));
}

TEST(BoxCopy, SingleElementBox) {
  std::vector<uint64_t> shape{3, 3}, at{2, 1}, zero{0, 0}, one{1, 1}, single{1, 1};
  auto src = numbered<int32_t>(9);
  int32_t out = 0;
  copy_box(reinterpret_cast<const uint8_t*>(src.data()), {shape, at},
           reinterpret_cast<uint8_t*>(&out), {single, zero}, one, 4);
  EXPECT_EQ(out, 8);
}

TEST(FillBox, FillsOnlyTheBoxWithPattern) {
  std::vector<uint64_t> shape{4, 5}, at{1, 1}, count{2, 3};
  std::vector<float> dst(20, 0);
  float pattern = 1.5f;
  fill_box(reinterpret_cast<uint8_t*>(dst.data()), {shape, at}, count,
           reinterpret_cast<const uint8_t*>(&pattern), 4);
  for (uint64_t r = 0; r < 4; ++r) {
    for (uint64_t c = 0; c < 5; ++c) {
      bool inside = r >= 1 && r < 3 && c >= 1 && c < 4;
      EXPECT_EQ(dst[r * 5 + c], inside ? 1.5f : 0.0f) << r << "," << c;
    }
  }
}

TEST(FillBox, ZeroPatternWithStepsAndNegativeZeroKept) {
  // A zero pattern takes the memset path only where runs are contiguous; with steps it must
  // still skip the elements between.
  std::vector<uint64_t> shape{2, 6}, zero{0, 0}, step{1, 2}, count{2, 3};
  std::vector<float> dst(12, 9.0f);
  float pattern = 0.0f;
  fill_box(reinterpret_cast<uint8_t*>(dst.data()), {shape, zero, step}, count,
           reinterpret_cast<const uint8_t*>(&pattern), 4);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(dst[i], i % 2 == 0 ? 0.0f : 9.0f) << i;
  // -0.0 is not the all-zero byte pattern: it must be written bit for bit.
  float negative_zero = -0.0f;
  std::vector<uint64_t> whole{2, 6};
  fill_box(reinterpret_cast<uint8_t*>(dst.data()), {shape, zero}, whole,
           reinterpret_cast<const uint8_t*>(&negative_zero), 4);
  for (float v : dst) EXPECT_TRUE(std::signbit(v));
}

TEST(FillBox, WholeArrayMergedAndLargeItem) {
  std::vector<uint64_t> shape{3, 2, 2}, zero{0, 0, 0};
  std::vector<uint8_t> dst(12 * 16, 0);
  uint8_t pattern[16];
  for (int i = 0; i < 16; ++i) pattern[i] = static_cast<uint8_t>(i + 1);
  fill_box(dst.data(), {shape, zero}, shape, pattern, 16);
  for (size_t e = 0; e < 12; ++e) EXPECT_EQ(0, std::memcmp(dst.data() + e * 16, pattern, 16)) << e;
}

}  // namespace
}  // namespace zfeed
