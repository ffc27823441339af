#include "zfeed/loader/cast_values.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace zfeed::loader {
namespace {

// Every size around the stream path's threshold and block, at every offset of the destination
// within 16 bytes: streamed values equal cast_values's bit for bit, and nothing outside the
// destination range is touched.
TEST(StreamValues, EqualsCastValuesAtEveryAlignmentAndSize) {
  const Normalization normalization{true, 281.5f, 17.25f};
  for (const auto& [name, out] :
       std::vector<std::pair<const char*, OutputType>>{{"float32", OutputType::kFloat32},
                                                       {"bfloat16", OutputType::kBFloat16},
                                                       {"float16", OutputType::kFloat16}}) {
    const size_t out_size = output_size(out);
    for (size_t count : {size_t{1}, size_t{1000}, size_t{4095}, size_t{4096}, size_t{5000},
                         size_t{20000}, size_t{204801}}) {
      std::vector<float> values(count);
      for (size_t i = 0; i < count; ++i)
        values[i] = 250.0f + 40.0f * std::sin(0.001f * static_cast<float>(i)) +
                    (i % 7 == 0 ? std::nanf("") : 0.0f);
      const auto* src = reinterpret_cast<const uint8_t*>(values.data());
      std::vector<uint8_t> want(count * out_size);
      cast_values(src, DataType::from_name("float32"), want.data(), out, count, normalization);
      for (size_t offset = 0; offset < 16; offset += out_size) {
        std::vector<uint8_t> got(count * out_size + 64, 0xAB);
        stream_values(src, DataType::from_name("float32"), got.data() + 16 + offset, out, count,
                      normalization);
        ASSERT_EQ(std::memcmp(got.data() + 16 + offset, want.data(), want.size()), 0)
            << name << " count " << count << " offset " << offset;
        for (size_t i = 0; i < 16 + offset; ++i) ASSERT_EQ(got[i], 0xAB) << "before, " << name;
        for (size_t i = 16 + offset + want.size(); i < got.size(); ++i)
          ASSERT_EQ(got[i], 0xAB) << "after, " << name << " count " << count;
      }
    }
  }
}

TEST(StreamValues, IntegerLabelsStayExact) {
  std::vector<int32_t> labels(100000);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % 3) - 1;
  std::vector<int64_t> got(labels.size());
  stream_values(reinterpret_cast<const uint8_t*>(labels.data()), DataType::from_name("int32"),
                reinterpret_cast<uint8_t*>(got.data()), OutputType::kInt64, labels.size(), {});
  for (size_t i = 0; i < labels.size(); ++i) ASSERT_EQ(got[i], labels[i]) << i;
}

}  // namespace
}  // namespace zfeed::loader
