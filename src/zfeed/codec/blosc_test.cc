// blosc (bytes->bytes) through c-blosc: compressors, shuffles, typesizes, corrupt frames.
#include <blosc.h>
#include <gtest/gtest.h>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::make_chain;
using testing::make_spec;

std::string blosc_chain(const std::string& configuration) {
  return R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "blosc", "configuration": )" +
         configuration + "}]";
}

TEST(BloscCodec, RoundTripEveryCompressorAndShuffle) {
  for (DataTypeId id : {DataTypeId::kUInt8, DataTypeId::kInt16, DataTypeId::kFloat32,
                        DataTypeId::kFloat64, DataTypeId::kComplex128}) {
    auto spec = make_spec(id, {33, 17});
    Bytes values = testing::sample_chunk(spec, 41);
    for (const char* cname : {"lz4", "lz4hc", "zstd", "blosclz", "zlib"}) {
      for (const char* shuffle : {"noshuffle", "shuffle", "bitshuffle"}) {
        SCOPED_TRACE(std::string(spec.dtype.name()) + " " + cname + " " + shuffle);
        std::string configuration =
            std::string(R"({"cname": ")") + cname + R"(", "clevel": 5, "shuffle": ")" + shuffle +
            R"(", "typesize": )" + std::to_string(spec.dtype.size()) + R"(, "blocksize": 0})";
        CodecChain chain = make_chain(blosc_chain(configuration), spec);
        Bytes encoded = testing::expect_round_trip(chain, values);
        // The frame is self-describing: its header holds the decoded size and typesize.
        size_t nbytes = 0, cbytes = 0, blocksize = 0;
        blosc_cbuffer_sizes(encoded.data(), &nbytes, &cbytes, &blocksize);
        EXPECT_EQ(nbytes, values.size());
        EXPECT_EQ(cbytes, encoded.size());
        size_t typesize = 0;
        int flags = 0;
        blosc_cbuffer_metainfo(encoded.data(), &typesize, &flags);
        if (std::string(shuffle) != "noshuffle") {
          EXPECT_EQ(typesize, spec.dtype.size());
        }
      }
    }
  }
}

TEST(BloscCodec, TypesizeDiffersFromItemSize) {
  // zarr-python 3 once wrote typesize 1 for every type; such frames still decode.
  auto spec = make_spec(DataTypeId::kFloat32, {100});
  Bytes values = testing::sample_chunk(spec, 1);
  CodecChain writer =
      make_chain(blosc_chain(R"({"cname": "lz4", "shuffle": "shuffle", "typesize": 1})"), spec);
  CodecChain reader =
      make_chain(blosc_chain(R"({"cname": "zstd", "shuffle": "bitshuffle", "typesize": 4})"), spec);
  Bytes encoded = writer.encode(values.data());
  Bytes out(values.size());
  reader.decode(encoded, out.data());
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), values.size()));
}

TEST(BloscCodec, V2IntegerShuffleAndDefaults) {
  auto spec = make_spec(DataTypeId::kUInt16, {64});
  CodecChain chain = make_chain(
      blosc_chain(R"({"cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0})"), spec);
  Json configuration = chain.to_json()[1]["configuration"];
  EXPECT_EQ(configuration["shuffle"], "shuffle");
  EXPECT_EQ(configuration["typesize"], 2);  // from the item size
  CodecChain automatic = make_chain(blosc_chain(R"({"shuffle": -1})"), spec);
  EXPECT_EQ(automatic.to_json()[1]["configuration"]["shuffle"], "shuffle");
  CodecChain automatic_bytes =
      make_chain(blosc_chain(R"({"shuffle": -1})"), make_spec(DataTypeId::kUInt8, {8}));
  EXPECT_EQ(automatic_bytes.to_json()[1]["configuration"]["shuffle"], "bitshuffle");
  CodecChain none = make_chain(blosc_chain(R"({"shuffle": 0})"), spec);
  EXPECT_FALSE(none.to_json()[1]["configuration"].contains("typesize"));  // noshuffle: not needed
  testing::expect_round_trip(none, testing::sample_chunk(spec));
}

TEST(BloscCodec, BadConfigurations) {
  auto spec = make_spec(DataTypeId::kUInt16, {64});
  EXPECT_CONTAINS(
      testing::error_of([&] { make_chain(blosc_chain(R"({"cname": "brotli"})"), spec); }),
      "unknown \"cname\" \"brotli\"");
  EXPECT_CONTAINS(
      testing::error_of([&] { make_chain(blosc_chain(R"({"shuffle": "sideways"})"), spec); }),
      "\"shuffle\" must be noshuffle, shuffle or bitshuffle");
  EXPECT_CONTAINS(testing::error_of([&] { make_chain(blosc_chain(R"({"shuffle": 3})"), spec); }),
                  "\"shuffle\" must be -1, 0, 1 or 2");
  EXPECT_CONTAINS(testing::error_of([&] { make_chain(blosc_chain(R"({"clevel": 10})"), spec); }),
                  "clevel");
  EXPECT_CONTAINS(testing::error_of([&] { make_chain(blosc_chain(R"({"typesize": 0})"), spec); }),
                  "typesize");
  EXPECT_CONTAINS(testing::error_of([&] { make_chain(blosc_chain(R"({"shuffle": true})"), spec); }),
                  "\"shuffle\" must be a string");
}

TEST(BloscCodec, CorruptAndTruncatedFrames) {
  auto spec = make_spec(DataTypeId::kFloat32, {64, 64});
  Bytes values = testing::sample_chunk(spec, 51);
  CodecChain chain =
      make_chain(blosc_chain(R"({"cname": "lz4", "shuffle": "shuffle", "typesize": 4})"), spec);
  Bytes good = chain.encode(values.data());
  ASSERT_LT(good.size(), values.size());
  for (size_t keep : {size_t{0}, size_t{8}, size_t{15}, good.size() / 2, good.size() - 1}) {
    SCOPED_TRACE(keep);
    EXPECT_CONTAINS(testing::decode_error(chain, good.view().first(keep)), "blosc");
  }
  EXPECT_CONTAINS(testing::decode_error(chain, testing::pseudo_random_bytes(good.size(), 5)),
                  "blosc");
  // A header whose compressed size field lies.
  Bytes lying = good;
  uint32_t cbytes = static_cast<uint32_t>(good.size() + 1000);
  std::memcpy(lying.data() + 12, &cbytes, 4);
  EXPECT_CONTAINS(testing::decode_error(chain, lying), "blosc: corrupt or truncated frame");
  // Garbage in the compressed payload: an error or (if lz4 cannot tell) some values, never a crash.
  Bytes scrambled = good;
  for (size_t i = 32; i < scrambled.size(); i += 3) scrambled[i] ^= 0x3C;
  Bytes out(values.size());
  try {
    chain.decode(scrambled, out.data());
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "blosc");
  }
}

TEST(BloscCodec, DecompressionBombAndShortFrames) {
  auto spec = make_spec(DataTypeId::kUInt8, {1000});
  CodecChain chain = make_chain(blosc_chain(R"({"cname": "zstd", "shuffle": "noshuffle"})"), spec);
  auto spec_big = make_spec(DataTypeId::kUInt8, {1 << 22});
  CodecChain big_chain =
      make_chain(blosc_chain(R"({"cname": "zstd", "shuffle": "noshuffle"})"), spec_big);
  Bytes zeros(1 << 22);
  std::memset(zeros.data(), 0, zeros.size());
  Bytes bomb = big_chain.encode(zeros.data());
  ASSERT_LT(bomb.size(), 100000u);
  EXPECT_CONTAINS(testing::decode_error(chain, bomb),
                  "blosc: frame holds 4194304 bytes, expected 1000");
  auto spec_small = make_spec(DataTypeId::kUInt8, {999});
  Bytes small(999);
  std::memset(small.data(), 1, small.size());
  Bytes short_frame =
      make_chain(blosc_chain(R"({"cname": "lz4"})"), spec_small).encode(small.data());
  EXPECT_CONTAINS(testing::decode_error(chain, short_frame),
                  "frame holds 999 bytes, expected 1000");
  // Unknown size ([bytes, zstd, blosc]): bounded.
  CodecChain unknown = make_chain(
      R"([{"name": "bytes"}, "zstd", {"name": "blosc", "configuration": {"cname": "lz4"}}])", spec);
  EXPECT_CONTAINS(testing::decode_error(unknown, bomb), "more than the expected maximum");
}

}  // namespace
}  // namespace zfeed
