// sharding_indexed: index at start and end, nested shards, empty inner chunks, bad indexes.
#include "zfeed/codec/sharding.h"

#include <gtest/gtest.h>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/codec/crc32c.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::make_chain;
using testing::make_spec;

std::string sharding_json(
    const std::string& inner_shape, const std::string& inner_codecs, const char* location,
    const std::string& index_codecs =
        R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}])") {
  return R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": )" + inner_shape +
         R"(, "codecs": )" + inner_codecs + R"(, "index_codecs": )" + index_codecs +
         R"(, "index_location": ")" + location + "\"}}]";
}

const std::string kInnerBytes = R"([{"name": "bytes", "configuration": {"endian": "little"}}])";
const std::string kInnerZstd =
    R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}])";

// The (offset, nbytes) index of an encoded shard, read by hand.
std::vector<uint64_t> read_index(const Bytes& shard, size_t chunks, bool at_end) {
  const size_t size = 16 * chunks + 4;
  const uint8_t* start = at_end ? shard.data() + shard.size() - size : shard.data();
  EXPECT_EQ(crc32c({start, size - 4}), [&] {
    uint32_t v;
    std::memcpy(&v, start + size - 4, 4);
    return v;
  }());
  std::vector<uint64_t> entries(2 * chunks);
  std::memcpy(entries.data(), start, 16 * chunks);
  return entries;
}

TEST(ShardingCodec, RoundTripIndexAtStartAndEnd) {
  auto spec = make_spec(DataTypeId::kFloat32, {8, 12});
  Bytes values = testing::sample_chunk(spec, 90);
  for (const char* location : {"start", "end"}) {
    for (const std::string& inner : {kInnerBytes, kInnerZstd}) {
      SCOPED_TRACE(std::string(location) + " " + inner);
      CodecChain chain = make_chain(sharding_json("[4, 3]", inner, location), spec);
      ASSERT_NE(chain.sharding(), nullptr);
      EXPECT_EQ(chain.sharding()->num_inner_chunks(), 8u);
      EXPECT_EQ(chain.sharding()->index_size(), 8u * 16 + 4);
      EXPECT_EQ(chain.sharding()->index_at_end(), std::string(location) == "end");
      Bytes shard = testing::expect_round_trip(chain, values);
      auto entries = read_index(shard, 8, std::string(location) == "end");
      for (size_t c = 0; c < 8; ++c) {
        uint64_t offset = entries[2 * c], nbytes = entries[2 * c + 1];
        ASSERT_LE(offset + nbytes, shard.size());
        if (std::string(location) == "start") {
          EXPECT_GE(offset, 8u * 16 + 4);
        }
        if (inner == kInnerBytes) {
          EXPECT_EQ(nbytes, 4u * 3 * 4);
        }
      }
    }
  }
}

TEST(ShardingCodec, InnerChunkBytesAreTheInnerChainsEncoding) {
  // Decoding one inner chunk by hand from the index gives that region of the shard.
  auto spec = make_spec(DataTypeId::kUInt16, {4, 4});
  std::vector<uint16_t> values(16);
  for (size_t i = 0; i < 16; ++i) values[i] = static_cast<uint16_t>(100 + i);
  CodecChain chain = make_chain(sharding_json("[2, 2]", kInnerBytes, "end"), spec);
  Bytes shard = chain.encode(reinterpret_cast<uint8_t*>(values.data()));
  auto entries = read_index(shard, 4, true);
  // Inner chunk [1, 0] (C order: 2) holds rows 2..3, columns 0..1.
  ASSERT_EQ(entries[5], 8u);
  uint16_t inner[4];
  std::memcpy(inner, shard.data() + entries[4], 8);
  EXPECT_EQ(inner[0], 108);
  EXPECT_EQ(inner[1], 109);
  EXPECT_EQ(inner[2], 112);
  EXPECT_EQ(inner[3], 113);
}

TEST(ShardingCodec, EmptyInnerChunksAreLeftOut) {
  FillValue fill;
  float fill_value = -1.0f;
  std::memcpy(fill.bytes.data(), &fill_value, 4);
  auto spec = make_spec(DataTypeId::kFloat32, {4, 4}, fill);
  std::vector<float> values(16, -1.0f);
  values[0] = 5.0f;  // only inner chunk [0, 0] holds data
  for (const char* location : {"start", "end"}) {
    CodecChain chain = make_chain(sharding_json("[2, 2]", kInnerBytes, location), spec);
    Bytes shard =
        testing::expect_round_trip(chain, Bytes(reinterpret_cast<uint8_t*>(values.data()), 64));
    EXPECT_EQ(shard.size(), 4u * 16 + 4 + 16);
    auto entries = read_index(shard, 4, std::string(location) == "end");
    EXPECT_NE(entries[0], ShardIndex::kEmpty);
    for (size_t c = 1; c < 4; ++c) {
      EXPECT_EQ(entries[2 * c], ShardIndex::kEmpty);
      EXPECT_EQ(entries[2 * c + 1], ShardIndex::kEmpty);
    }
    ShardIndex index = chain.sharding()->decode_index(
        std::string(location) == "end" ? shard.view().last(68) : shard.view().first(68),
        shard.size());
    EXPECT_FALSE(index.is_empty(0));
    EXPECT_TRUE(index.is_empty(3));
  }
  // An all-fill shard is just the index, and decodes to the fill value.
  std::vector<float> all_fill(16, -1.0f);
  CodecChain chain = make_chain(sharding_json("[2, 2]", kInnerBytes, "end"), spec);
  Bytes shard =
      testing::expect_round_trip(chain, Bytes(reinterpret_cast<uint8_t*>(all_fill.data()), 64));
  EXPECT_EQ(shard.size(), 68u);
}

TEST(ShardingCodec, NestedShardsRoundTrip) {
  auto spec = make_spec(DataTypeId::kInt32, {8, 8});
  Bytes values = testing::sample_chunk(spec, 91);
  std::string inner_shard = sharding_json("[2, 2]", kInnerZstd, "start");
  for (const char* location : {"start", "end"}) {
    SCOPED_TRACE(location);
    CodecChain chain = make_chain(sharding_json("[4, 4]", inner_shard, location), spec);
    Json inner = chain.to_json()[0]["configuration"]["codecs"];
    ASSERT_EQ(inner.size(), 1u);
    EXPECT_EQ(inner[0]["name"], "sharding_indexed");
    EXPECT_EQ(inner[0]["configuration"]["chunk_shape"], Json::parse("[2, 2]"));
    EXPECT_EQ(inner[0]["configuration"]["index_location"], "start");
    testing::expect_round_trip(chain, values);
  }
  // Nested, with contiguous (row-split) inner chunks at both levels.
  CodecChain rows =
      make_chain(sharding_json("[4, 8]", sharding_json("[2, 8]", kInnerBytes, "end"), "end"), spec);
  testing::expect_round_trip(rows, values);
}

TEST(ShardingCodec, InnerCodecsWithTransposeAndCompression) {
  auto spec = make_spec(DataTypeId::kFloat64, {6, 4, 2});
  Bytes values = testing::sample_chunk(spec, 93);
  CodecChain chain =
      make_chain(sharding_json("[3, 2, 2]",
                               R"([{"name": "transpose", "configuration": {"order": [2, 1, 0]}},
                        {"name": "bytes", "configuration": {"endian": "big"}},
                        {"name": "blosc", "configuration": {"cname": "lz4", "shuffle": "shuffle", "typesize": 8}},
                        {"name": "crc32c"}])",
                               "end"),
                 spec);
  testing::expect_round_trip(chain, values);
}

// Many small inner chunks make a shard larger than its values (16 bytes of index and the inner
// codecs' overhead each): a compressor after the sharding codec must decode the shard whole.
TEST(ShardingCodec, AShardFollowedByACompressorLargerThanItsValuesDecodes) {
  auto spec = make_spec(DataTypeId::kUInt8, {131072});
  Bytes values = testing::sample_chunk(spec, 5);
  CodecChain chain = make_chain(
      R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [1],
            "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}},
          {"name": "gzip", "configuration": {"level": 1}}])",
      spec);
  // The shard's bound: its 16-byte index entries and one byte per inner chunk, then gzip's.
  ASSERT_TRUE(chain.max_encoded_size());
  EXPECT_GT(*chain.max_encoded_size(), 131072u * 17);
  testing::expect_round_trip(chain, values);
}

TEST(ShardingCodec, ConfigurationErrors) {
  auto spec = make_spec(DataTypeId::kUInt8, {8, 8});
  auto message = [&](const std::string& json) {
    return testing::error_of([&] { make_chain(json, spec); });
  };
  EXPECT_CONTAINS(message(sharding_json("[3, 4]", kInnerBytes, "end")),
                  "does not divide the shard shape");
  EXPECT_CONTAINS(message(sharding_json("[0, 4]", kInnerBytes, "end")), "must be positive");
  EXPECT_CONTAINS(message(sharding_json("[4]", kInnerBytes, "end")),
                  "\"chunk_shape\" must be an array of 2");
  EXPECT_CONTAINS(message(sharding_json("[4, -4]", kInnerBytes, "end")), "chunk_shape[1]");
  EXPECT_CONTAINS(message(sharding_json("[4, 4]", kInnerBytes, "middle")), "\"index_location\"");
  EXPECT_CONTAINS(message(sharding_json(
                      "[4, 4]", kInnerBytes, "end",
                      R"([{"name": "bytes", "configuration": {"endian": "little"}}, "zstd"])")),
                  "index_codecs must have a fixed encoded size");
  EXPECT_CONTAINS(
      message(R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 4]}}])"),
      "missing required field \"codecs\"");
  EXPECT_CONTAINS(message(sharding_json("[4, 4]", R"([{"name": "nope"}])", "end")),
                  "unsupported codec \"nope\"");
  // The default index codecs are bytes(little) + crc32c.
  CodecChain chain = make_chain(
      R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 4], "codecs": ["bytes"]}}])",
      spec);
  EXPECT_EQ(chain.sharding()->index_size(), 4u * 16 + 4);
  EXPECT_TRUE(chain.sharding()->index_at_end());
}

TEST(ShardingCodec, CorruptIndexesAreErrors) {
  auto spec = make_spec(DataTypeId::kUInt16, {4, 4});
  Bytes values = testing::sample_chunk(spec, 94);
  CodecChain chain = make_chain(sharding_json("[2, 2]", kInnerBytes, "end"), spec);
  const ShardingCodec& codec = *chain.sharding();
  Bytes shard = chain.encode(values.data());
  const size_t index_at = shard.size() - codec.index_size();

  auto with_entry = [&](size_t chunk, uint64_t offset, uint64_t nbytes) {
    Bytes bad = shard;
    std::memcpy(bad.data() + index_at + 16 * chunk, &offset, 8);
    std::memcpy(bad.data() + index_at + 16 * chunk + 8, &nbytes, 8);
    uint32_t crc = crc32c({bad.data() + index_at, codec.index_size() - 4});
    std::memcpy(bad.data() + bad.size() - 4, &crc, 4);
    return bad;
  };
  // Pointing past the end of the shard.
  std::string message = testing::decode_error(chain, with_entry(3, shard.size() - 4, 8));
  EXPECT_CONTAINS(message, "inner chunk [1, 1]");
  EXPECT_CONTAINS(message, "outside the " + std::to_string(shard.size()) + "-byte shard");
  // Offset + nbytes overflowing 64 bits.
  message = testing::decode_error(chain, with_entry(1, UINT64_MAX - 2, 8));
  EXPECT_CONTAINS(message, "inner chunk [0, 1]");
  EXPECT_CONTAINS(message, "(overflow)");
  // Only one half of the empty marker, either half: an error even where the shard's size is
  // not known to bound the entry (a store that cannot say it).
  message = testing::decode_error(chain, with_entry(0, ShardIndex::kEmpty, 8));
  EXPECT_CONTAINS(message, "is half the empty marker");
  for (const auto& [offset, nbytes] : {std::pair<uint64_t, uint64_t>{ShardIndex::kEmpty, 8},
                                       std::pair<uint64_t, uint64_t>{0, ShardIndex::kEmpty}}) {
    const Bytes half = with_entry(0, offset, nbytes);
    EXPECT_CONTAINS(testing::error_of([&] {
                      codec.decode_index(half.view().last(codec.index_size()), std::nullopt);
                    }),
                    "shard index entry for inner chunk [0, 0] is half the empty marker");
  }
  // A wrong size for the inner chunk.
  message = testing::decode_error(chain, with_entry(2, 0, 7));
  EXPECT_CONTAINS(message, "inner chunk [1, 0]");
  EXPECT_CONTAINS(message, "chunk holds 7 bytes, expected 8");
  // A broken index checksum.
  Bytes bad = shard;
  bad[index_at + 3] ^= 1;
  message = testing::decode_error(chain, bad);
  EXPECT_CONTAINS(message, "shard index");
  EXPECT_CONTAINS(message, "crc32c checksum mismatch");
  // Shorter than the index.
  message = testing::decode_error(chain, shard.view().first(10));
  EXPECT_CONTAINS(message, "too short for its 68-byte index");
  EXPECT_CONTAINS(
      testing::error_of([&] { codec.decode_index(shard.view().first(67), std::nullopt); }),
      "shard index is 67 bytes, expected 68");
}

TEST(ShardingCodec, DescribeNamesInnerShapeAndCodecs) {
  auto spec = make_spec(DataTypeId::kUInt8, {8, 8});
  CodecChain chain = make_chain(sharding_json("[4, 2]", R"(["bytes", "crc32c"])", "end"), spec);
  EXPECT_EQ(chain.describe(), "sharding_indexed(inner 4x2: bytes > crc32c)");
  EXPECT_EQ(chain.sharding()->describe_inner(5), "inner chunk [1, 1]");
  EXPECT_EQ(chain.sharding()->chunks_per_shard(), (std::vector<uint64_t>{2, 4}));
}

}  // namespace
}  // namespace zfeed

namespace zfeed {
namespace {

// Inner chunks are encoded in parallel; each one's "present" flag must survive its neighbours'
// (a packed std::vector<bool> once lost them, dropping whole inner chunks from the shard).
TEST(ShardingCodec, ParallelEncodeKeepsEveryInnerChunk) {
  auto spec = testing::make_spec(DataTypeId::kUInt32, {16, 32});
  CodecChain chain = testing::make_chain(
      R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1], "codecs": )"
      R"([{"name": "bytes", "configuration": {"endian": "little"}}], "index_codecs": )"
      R"([{"name": "bytes", "configuration": {"endian": "little"}}], "index_location": "start"}}])",
      spec);
  Bytes values(spec.num_bytes());
  for (uint32_t i = 0; i < spec.num_elements(); ++i) {
    uint32_t v = i + 1;  // never the fill value 0, so every inner chunk is stored
    std::memcpy(values.data() + 4 * i, &v, 4);
  }
  for (int round = 0; round < 50; ++round) testing::expect_round_trip(chain, values);
}

}  // namespace
}  // namespace zfeed
