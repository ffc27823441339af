// numcodecs.lz4: an LZ4 block after a 4-byte little-endian decoded size.
#include <gtest/gtest.h>
#include <lz4.h>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::make_chain;
using testing::make_spec;

constexpr const char* kChain =
    R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "numcodecs.lz4", "configuration": {"acceleration": 1}}])";

Bytes numcodecs_lz4(ByteView data, uint32_t header_size) {
  Bytes out(4 + LZ4_compressBound(static_cast<int>(data.size())));
  std::memcpy(out.data(), &header_size, 4);
  int n = LZ4_compress_default(reinterpret_cast<const char*>(data.data()),
                               reinterpret_cast<char*>(out.data() + 4),
                               static_cast<int>(data.size()), static_cast<int>(out.size() - 4));
  out.resize(4 + static_cast<size_t>(n));
  return out;
}

TEST(Lz4Codec, RoundTripAndHeader) {
  auto spec = make_spec(DataTypeId::kInt64, {50, 20});
  Bytes values = testing::sample_chunk(spec, 61);
  Bytes encoded = testing::expect_round_trip(make_chain(kChain, spec), values);
  uint32_t header;
  std::memcpy(&header, encoded.data(), 4);
  EXPECT_EQ(header, values.size());
  // A block written by plain liblz4 (as numcodecs does) decodes.
  Bytes out(values.size());
  make_chain(kChain, spec)
      .decode(numcodecs_lz4(values, static_cast<uint32_t>(values.size())), out.data());
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), values.size()));
  testing::expect_round_trip(
      make_chain(R"(["bytes", {"name": "numcodecs.lz4", "configuration": {"acceleration": 50}}])",
                 make_spec(DataTypeId::kUInt8, {1000})),
      testing::sample_chunk(make_spec(DataTypeId::kUInt8, {1000})));
  // numcodecs takes an acceleration of 0 or below (lz4's default, 1): such stores open.
  testing::expect_round_trip(
      make_chain(R"(["bytes", {"name": "numcodecs.lz4", "configuration": {"acceleration": 0}}])",
                 make_spec(DataTypeId::kUInt8, {1000})),
      testing::sample_chunk(make_spec(DataTypeId::kUInt8, {1000})));
}

TEST(Lz4Codec, CorruptTruncatedAndBomb) {
  auto spec = make_spec(DataTypeId::kFloat32, {256});
  Bytes values = testing::sample_chunk(spec, 62);
  CodecChain chain = make_chain(kChain, spec);
  Bytes good = chain.encode(values.data());
  EXPECT_CONTAINS(testing::decode_error(chain, good.view().first(3)),
                  "lz4: 3 bytes is too short for the header");
  EXPECT_CONTAINS(testing::decode_error(chain, good.view().first(good.size() - 3)),
                  "lz4: corrupt or truncated block");
  Bytes garbage = testing::pseudo_random_bytes(300, 4);
  uint32_t size = 1024;
  std::memcpy(garbage.data(), &size, 4);
  EXPECT_CONTAINS(testing::decode_error(chain, garbage), "lz4");
  // Decompression bomb: a header that claims more than the chunk holds is refused up front...
  Bytes zeros(16 << 20);
  std::memset(zeros.data(), 0, zeros.size());
  Bytes bomb = numcodecs_lz4(zeros, static_cast<uint32_t>(zeros.size()));
  EXPECT_CONTAINS(testing::decode_error(chain, bomb),
                  "lz4: header says 16777216 bytes, expected 1024");
  // ...and one whose header lies about a longer block fails without writing past the output.
  Bytes liar = numcodecs_lz4(zeros.view().first(100000), 1024);
  EXPECT_CONTAINS(testing::decode_error(chain, liar), "lz4: corrupt or truncated block");
  // Unknown size: bounded by the maximum.
  CodecChain unknown = make_chain(
      R"([{"name": "bytes", "configuration": {"endian": "little"}}, "zstd", "numcodecs.lz4"])",
      spec);
  EXPECT_CONTAINS(testing::decode_error(unknown, bomb), "more than the expected maximum");
}

}  // namespace
}  // namespace zfeed
