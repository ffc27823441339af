// gzip (RFC 1952) and numcodecs.zlib (RFC 1950).
#include <gtest/gtest.h>
#include <libdeflate.h>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::make_chain;
using testing::make_spec;

std::string chain_json(const char* name, int level) {
  return std::string(R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": ")") +
         name + R"(", "configuration": {"level": )" + std::to_string(level) + "}}]";
}

Bytes raw_compress(ByteView data, bool gzip, int level = 6) {
  libdeflate_compressor* c = libdeflate_alloc_compressor(level);
  size_t bound = gzip ? libdeflate_gzip_compress_bound(c, data.size())
                      : libdeflate_zlib_compress_bound(c, data.size());
  Bytes out(bound);
  size_t size = gzip ? libdeflate_gzip_compress(c, data.data(), data.size(), out.data(), bound)
                     : libdeflate_zlib_compress(c, data.data(), data.size(), out.data(), bound);
  libdeflate_free_compressor(c);
  out.resize(size);
  return out;
}

TEST(DeflateCodecs, RoundTripAllLevels) {
  auto spec = make_spec(DataTypeId::kFloat64, {20, 30});
  Bytes values = testing::sample_chunk(spec, 12);
  for (const char* name : {"gzip", "numcodecs.zlib"}) {
    for (int level = 0; level <= 9; ++level) {
      SCOPED_TRACE(std::string(name) + " level " + std::to_string(level));
      CodecChain chain = make_chain(chain_json(name, level), spec);
      Bytes encoded = testing::expect_round_trip(chain, values);
      ASSERT_GE(encoded.size(), 2u);
      if (std::string(name) == "gzip") {
        EXPECT_EQ(encoded[0], 0x1f);  // RFC 1952 magic
        EXPECT_EQ(encoded[1], 0x8b);
      } else {
        EXPECT_EQ(encoded[0] & 0x0f, 8);  // RFC 1950: CM = 8 (deflate)
        EXPECT_EQ(((encoded[0] << 8) | encoded[1]) % 31, 0);
      }
    }
  }
}

TEST(DeflateCodecs, ZlibLevelDefaultsAndGzipNeedsOne) {
  auto spec = make_spec(DataTypeId::kUInt8, {10});
  CodecChain chain = make_chain(R"(["bytes", "numcodecs.zlib"])", spec);
  EXPECT_EQ(chain.to_json()[1]["configuration"]["level"], 1);
  EXPECT_CONTAINS(testing::error_of([&] {
                    make_chain(R"(["bytes", {"name": "gzip", "configuration": {"level": 10}}])",
                               spec);
                  }),
                  "\"level\" must be in -1..9");
  // Levels numcodecs writes that mean something to encoding only: zlib's default (-1).
  for (const char* name : {"gzip", "numcodecs.zlib"}) {
    CodecChain any_level = make_chain(
        std::string(R"(["bytes", {"name": ")") + name + R"(", "configuration": {"level": -1}}])",
        spec);
    EXPECT_EQ(any_level.to_json()[1]["configuration"]["level"], -1);
    std::vector<uint8_t> values(10, 7);
    Bytes encoded = any_level.encode(values.data());
    std::vector<uint8_t> back(10);
    any_level.decode(encoded, back.data());
    EXPECT_EQ(back, values);
  }
}

TEST(DeflateCodecs, StreamsFromOtherWritersDecode) {
  auto spec = make_spec(DataTypeId::kInt16, {50, 50});
  Bytes values = testing::sample_chunk(spec, 13);
  Bytes out(values.size());
  make_chain(chain_json("gzip", 1), spec).decode(raw_compress(values, true, 12), out.data());
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), values.size()));
  make_chain(chain_json("numcodecs.zlib", 1), spec)
      .decode(raw_compress(values, false, 1), out.data());
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), values.size()));
}

TEST(DeflateCodecs, MultiMemberGzip) {
  auto spec = make_spec(DataTypeId::kUInt8, {3000});
  Bytes values = testing::sample_chunk(spec, 21);
  Bytes stream = raw_compress(values.view().first(1000), true);
  stream.append(raw_compress(values.view().subspan(1000), true));
  Bytes out(values.size());
  make_chain(chain_json("gzip", 5), spec).decode(stream, out.data());
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), values.size()));
}

TEST(DeflateCodecs, CorruptTruncatedAndStrayBytes) {
  auto spec = make_spec(DataTypeId::kFloat32, {40, 40});
  Bytes values = testing::sample_chunk(spec, 31);
  for (const char* name : {"gzip", "numcodecs.zlib"}) {
    SCOPED_TRACE(name);
    const char* label = std::string(name) == "gzip" ? "gzip" : "zlib";
    CodecChain chain = make_chain(chain_json(name, 5), spec);
    Bytes good = chain.encode(values.data());
    std::string message = testing::decode_error(chain, good.view().first(good.size() / 2));
    EXPECT_CONTAINS(message, label);
    EXPECT_CONTAINS(message, "corrupt or truncated");
    message = testing::decode_error(chain, good.view().first(good.size() - 1));
    EXPECT_CONTAINS(message, label);
    message = testing::decode_error(chain, testing::pseudo_random_bytes(500, 9));
    EXPECT_CONTAINS(message, label);
    Bytes flipped = good;
    for (size_t i = 20; i < 40; ++i) flipped[i] ^= 0xA5;  // checksums catch what inflate lets pass
    EXPECT_CONTAINS(testing::decode_error(chain, flipped), label);
    Bytes stray = good;
    stray.append(as_bytes("junk"));
    EXPECT_CONTAINS(testing::decode_error(chain, stray), label);
    EXPECT_CONTAINS(testing::decode_error(chain, ByteView{}), label);
  }
}

TEST(DeflateCodecs, DecompressionBombIsRefused) {
  auto spec = make_spec(DataTypeId::kUInt8, {4096});
  Bytes zeros(32 << 20);
  std::memset(zeros.data(), 0, zeros.size());
  for (bool gzip : {true, false}) {
    SCOPED_TRACE(gzip ? "gzip" : "zlib");
    Bytes bomb = raw_compress(zeros, gzip, 9);
    ASSERT_LT(bomb.size(), 64u * 1024);
    CodecChain chain = make_chain(chain_json(gzip ? "gzip" : "numcodecs.zlib", 5), spec);
    EXPECT_CONTAINS(testing::decode_error(chain, bomb), "more than the expected 4096 bytes");
    // Unknown size ([bytes, zstd, gzip]): bounded all the same.
    CodecChain unknown =
        make_chain(std::string(R"([{"name": "bytes"}, "zstd", {"name": ")") +
                       (gzip ? "gzip" : "numcodecs.zlib") + R"(", "configuration": {"level": 1}}])",
                   spec);
    EXPECT_CONTAINS(testing::decode_error(unknown, bomb), "more than the expected maximum");
    // A stream one byte short.
    Bytes short_values(4095);
    std::memset(short_values.data(), 3, short_values.size());
    EXPECT_CONTAINS(testing::decode_error(chain, raw_compress(short_values, gzip)),
                    "decodes to 4095 bytes, expected 4096");
  }
}

TEST(DeflateCodecs, UnknownSizePathRoundTrips) {
  auto spec = make_spec(DataTypeId::kUInt32, {64, 64});
  Bytes values = testing::sample_chunk(spec, 77);
  for (const char* text : {R"([{"name": "bytes", "configuration": {"endian": "little"}},
                               {"name": "gzip", "configuration": {"level": 1}},
                               {"name": "gzip", "configuration": {"level": 1}}])",
                           R"([{"name": "bytes", "configuration": {"endian": "little"}}, "zstd",
                               {"name": "numcodecs.zlib", "configuration": {"level": 1}}])"}) {
    testing::expect_round_trip(make_chain(text, spec), values);
  }
}

}  // namespace
}  // namespace zfeed
