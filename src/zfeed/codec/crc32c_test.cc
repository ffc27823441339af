#include "zfeed/codec/crc32c.h"

#include <gtest/gtest.h>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::make_chain;
using testing::make_spec;

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c(as_bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(ByteView{}), 0u);
  Bytes zeros(32);
  std::memset(zeros.data(), 0, 32);
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);  // RFC 3720 B.4
  Bytes ones(32);
  std::memset(ones.data(), 0xFF, 32);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
}

TEST(Crc32cCodec, AppendsLittleEndianChecksum) {
  auto spec = make_spec(DataTypeId::kUInt8, {9});
  CodecChain chain = make_chain(R"(["bytes", "crc32c"])", spec);
  Bytes values(as_bytes("123456789"));
  Bytes encoded = testing::expect_round_trip(chain, values);
  ASSERT_EQ(encoded.size(), 13u);
  const uint8_t expected_tail[] = {0x83, 0x92, 0x06, 0xE3};
  EXPECT_EQ(0, std::memcmp(encoded.data() + 9, expected_tail, 4));
  EXPECT_EQ(chain.encoded_size(), 13u);
}

TEST(Crc32cCodec, MismatchAndShortStreamsAreErrors) {
  auto spec = make_spec(DataTypeId::kFloat32, {8});
  CodecChain chain =
      make_chain(R"([{"name": "bytes", "configuration": {"endian": "little"}}, "crc32c"])", spec);
  Bytes values = testing::sample_chunk(spec, 3);
  Bytes good = chain.encode(values.data());
  for (size_t at : {size_t{0}, size_t{17}, good.size() - 1}) {
    Bytes bad = good;
    bad[at] ^= 0x01;
    std::string message = testing::decode_error(chain, bad);
    EXPECT_CONTAINS(message, "crc32c checksum mismatch");
    EXPECT_CONTAINS(message, "over 32 bytes");
  }
  EXPECT_CONTAINS(testing::decode_error(chain, good.view().first(3)),
                  "too short to hold a checksum");
  // Right checksum, wrong length for the chunk.
  Bytes longer(good.view().first(32));
  longer.append(as_bytes("xx"));
  uint32_t crc = crc32c(longer);
  longer.append({reinterpret_cast<uint8_t*>(&crc), 4});
  EXPECT_CONTAINS(testing::decode_error(chain, longer), "expected 32");
}

TEST(Crc32cCodec, AfterCompressionAndConfigRules) {
  auto spec = make_spec(DataTypeId::kInt16, {30, 30});
  CodecChain chain = make_chain(
      R"([{"name": "bytes", "configuration": {"endian": "big"}}, "zstd", "crc32c"])", spec);
  Bytes values = testing::sample_chunk(spec, 2);
  Bytes encoded = testing::expect_round_trip(chain, values);
  uint32_t stored;
  std::memcpy(&stored, encoded.data() + encoded.size() - 4, 4);
  EXPECT_EQ(stored, crc32c(encoded.view().first(encoded.size() - 4)));
  encoded[5] ^= 0x80;
  EXPECT_CONTAINS(testing::decode_error(chain, encoded), "crc32c checksum mismatch");
  EXPECT_CONTAINS(testing::error_of([&] {
                    make_chain(R"(["bytes", {"name": "crc32c", "configuration": {"x": 1}}])",
                               make_spec(DataTypeId::kUInt8, {4}));
                  }),
                  "codec crc32c: unknown configuration field \"x\"");
}

}  // namespace
}  // namespace zfeed
