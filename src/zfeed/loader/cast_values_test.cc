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

// fill_nan: NaN (of every source float type, any payload or sign) becomes nan_value after the
// normalization, in every output type; other values, infinities included, are as without it.
TEST(CastValues, FillNanReplacesOnlyNaNAfterNormalizing) {
  const float quiet = std::nanf(""), negative = -std::nanf("1");
  const float inf = INFINITY;
  const std::vector<float> values = {270.0f, quiet, 281.5f, negative, inf, -inf, 0.0f, 300.25f};
  const std::vector<double> doubles(values.begin(), values.end());
  for (const bool normalized : {true, false}) {
    const Normalization plain{normalized, 281.5f, 17.25f};
    Normalization filled = plain;
    filled.fill_nan = true;
    filled.nan_value = -3.5f;
    for (const auto& [source, bytes] : std::vector<std::pair<const char*, const uint8_t*>>{
             {"float32", reinterpret_cast<const uint8_t*>(values.data())},
             {"float64", reinterpret_cast<const uint8_t*>(doubles.data())}}) {
      for (const OutputType out :
           {OutputType::kFloat32, OutputType::kBFloat16, OutputType::kFloat16}) {
        const size_t size = output_size(out), n = values.size();
        std::vector<uint8_t> want(n * size), got(n * size), streamed(n * size), fill(size);
        cast_values(bytes, DataType::from_name(source), want.data(), out, n, plain);
        cast_values(bytes, DataType::from_name(source), got.data(), out, n, filled);
        stream_values(bytes, DataType::from_name(source), streamed.data(), out, n, filled);
        store_value(-3.5f, out, fill.data());
        for (size_t i = 0; i < n; ++i) {
          const uint8_t* expected = std::isnan(values[i]) ? fill.data() : want.data() + i * size;
          EXPECT_EQ(std::memcmp(got.data() + i * size, expected, size), 0)
              << source << " -> " << output_name(out) << " value " << i;
          EXPECT_EQ(std::memcmp(streamed.data() + i * size, expected, size), 0) << i;
        }
      }
    }
  }
  EXPECT_TRUE(Normalization{}.identity());
  EXPECT_FALSE((Normalization{false, 0.0f, 1.0f, true, 0.0f}.identity()));
}

// CF unpacking: raw * scale + offset in float64 then float32 (as xarray, then a cast), missing
// values NaN (then filled, where asked), before the normalization; integer labels' missing values
// become kIgnoreLabel.
TEST(CastValues, CfUnpackingComesFirst) {
  const std::vector<int16_t> raw = {-32767, 0, 1, -1, 12345, 32767};
  Normalization n{true, 280.0f, 10.0f};
  n.unpack.active = true;
  n.unpack.scale = 0.002;
  n.unpack.offset = 280.0;
  n.unpack.missing[0] = -32767;
  n.unpack.missing_count = 1;
  std::vector<float> got(raw.size()), filled(raw.size());
  cast_values(reinterpret_cast<const uint8_t*>(raw.data()), DataType::from_name("int16"),
              reinterpret_cast<uint8_t*>(got.data()), OutputType::kFloat32, raw.size(), n);
  EXPECT_TRUE(std::isnan(got[0]));
  for (size_t i = 1; i < raw.size(); ++i) {
    const float physical = static_cast<float>(static_cast<double>(raw[i]) * 0.002 + 280.0);
    EXPECT_EQ(got[i], (physical - 280.0f) / 10.0f) << i;
  }
  n.fill_nan = true;
  n.nan_value = 0.5f;
  cast_values(reinterpret_cast<const uint8_t*>(raw.data()), DataType::from_name("int16"),
              reinterpret_cast<uint8_t*>(filled.data()), OutputType::kFloat32, raw.size(), n);
  EXPECT_EQ(filled[0], 0.5f);
  EXPECT_EQ(filled[4], got[4]);
  EXPECT_FALSE(n.identity());
  // A float32 copy of the stored value unpacks the same (the GPU path unpacks from it).
  EXPECT_EQ(n.apply(static_cast<float>(raw[4])), got[4]);

  const std::vector<uint8_t> labels = {0, 1, 255, 2};
  Normalization masked;
  masked.unpack.active = true;
  masked.unpack.missing[0] = 255;
  masked.unpack.missing_count = 1;
  std::vector<int64_t> out(labels.size());
  cast_values(labels.data(), DataType::from_name("uint8"), reinterpret_cast<uint8_t*>(out.data()),
              OutputType::kInt64, labels.size(), masked);
  EXPECT_EQ(out, (std::vector<int64_t>{0, 1, kIgnoreLabel, 2}));
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
