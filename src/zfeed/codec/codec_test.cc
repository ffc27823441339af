// The codec chain: registry, parsing, order rules, JSON round trips.
#include "zfeed/codec/codec.h"

#include <gtest/gtest.h>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::error_of;
using testing::make_chain;
using testing::make_spec;

TEST(CodecRegistry, EveryCodecInScopeIsRegistered) {
  for (const char* name : {"bytes", "transpose", "gzip", "zstd", "blosc", "crc32c",
                           "sharding_indexed", "numcodecs.zlib", "numcodecs.lz4"}) {
    EXPECT_TRUE(is_codec_registered(name)) << name;
  }
  EXPECT_FALSE(is_codec_registered("zfp"));
  auto names = registered_codecs();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_GE(names.size(), 9u);
}

TEST(CodecChain, JsonRoundTripForManyChains) {
  auto spec = make_spec(DataTypeId::kFloat32, {4, 6, 2});
  const char* chains[] = {
      R"([{"name": "bytes", "configuration": {"endian": "little"}}])",
      R"([{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"}])",
      R"([{"name": "transpose", "configuration": {"order": [2, 0, 1]}},
          {"name": "bytes", "configuration": {"endian": "little"}},
          {"name": "zstd", "configuration": {"level": 3, "checksum": true}}])",
      R"([{"name": "bytes", "configuration": {"endian": "little"}},
          {"name": "gzip", "configuration": {"level": 6}}])",
      R"([{"name": "bytes", "configuration": {"endian": "little"}},
          {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 4, "shuffle": "bitshuffle",
                                               "typesize": 4, "blocksize": 0}}])",
      R"([{"name": "bytes", "configuration": {"endian": "little"}},
          {"name": "numcodecs.zlib", "configuration": {"level": 2}},
          {"name": "numcodecs.lz4", "configuration": {"acceleration": 1}}])",
      R"([{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [2, 3, 1],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                       {"name": "zstd", "configuration": {"level": 1, "checksum": false}}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                             {"name": "crc32c"}],
            "index_location": "start"}}])",
  };
  for (const char* text : chains) {
    SCOPED_TRACE(text);
    CodecChain chain = make_chain(text, spec);
    Json written = chain.to_json();
    EXPECT_EQ(written, Json::parse(text));
    CodecChain again = CodecChain::from_json(written, spec);
    EXPECT_EQ(again.to_json(), written);
    EXPECT_EQ(again.describe(), chain.describe());
    testing::expect_round_trip(again, testing::sample_chunk(spec));
  }
}

TEST(CodecChain, Describe) {
  auto spec = make_spec(DataTypeId::kUInt16, {8});
  CodecChain chain = make_chain(
      R"([{"name": "bytes", "configuration": {"endian": "little"}},
          {"name": "zstd", "configuration": {"level": 3}}, {"name": "crc32c"}])",
      spec);
  EXPECT_EQ(chain.describe(), "bytes(endian=little) > zstd(level=3, checksum=false) > crc32c");
}

TEST(CodecChain, BareStringNamesAreAccepted) {
  auto spec = make_spec(DataTypeId::kUInt8, {16});
  CodecChain chain = make_chain(R"(["bytes", "crc32c"])", spec);
  EXPECT_EQ(chain.codecs().size(), 2u);
  testing::expect_round_trip(chain, testing::sample_chunk(spec));
}

TEST(CodecChain, IdentityAndEncodedSize) {
  auto spec = make_spec(DataTypeId::kFloat64, {3, 5});
  EXPECT_TRUE(make_chain(R"([{"name": "bytes", "configuration": {"endian": "little"}}])", spec)
                  .is_identity());
  EXPECT_FALSE(
      make_chain(R"([{"name": "bytes", "configuration": {"endian": "big"}}])", spec).is_identity());
  EXPECT_FALSE(
      make_chain(R"([{"name": "bytes", "configuration": {"endian": "little"}}, "crc32c"])", spec)
          .is_identity());
  EXPECT_EQ(make_chain(R"([{"name": "bytes", "configuration": {"endian": "little"}}])", spec)
                .encoded_size(),
            120u);
  EXPECT_EQ(make_chain(R"([{"name": "bytes", "configuration": {"endian": "big"}}, "crc32c"])", spec)
                .encoded_size(),
            124u);
  EXPECT_FALSE(
      make_chain(R"([{"name": "bytes", "configuration": {"endian": "big"}}, "zstd"])", spec)
          .encoded_size()
          .has_value());
  // A single-byte type needs no endian and is native either way.
  EXPECT_TRUE(make_chain(R"(["bytes"])", make_spec(DataTypeId::kInt8, {4})).is_identity());
  EXPECT_EQ(make_chain(R"(["bytes"])", make_spec(DataTypeId::kBool, {4})).sharding(), nullptr);
}

TEST(CodecChain, UnknownCodecIsUnsupported) {
  auto spec = make_spec(DataTypeId::kFloat32, {4});
  std::string message = error_of<UnsupportedError>([&] {
    make_chain(R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zfp"}])",
               spec);
  });
  EXPECT_EQ(message, "unsupported codec \"zfp\"");
  message = error_of<UnsupportedError>([&] { make_chain(R"([{"name": "numcodecs.bz2"}])", spec); });
  EXPECT_CONTAINS(message, "unsupported codec \"numcodecs.bz2\"");
}

TEST(CodecChain, OutOfOrderChainsAreRejected) {
  auto spec = make_spec(DataTypeId::kFloat32, {4, 4});
  const std::string bytes = R"({"name": "bytes", "configuration": {"endian": "little"}})";
  const std::string transpose = R"({"name": "transpose", "configuration": {"order": [1, 0]}})";
  std::string message =
      error_of([&] { make_chain("[{\"name\": \"zstd\"}, " + bytes + "]", spec); });
  EXPECT_CONTAINS(message, "out of order");
  EXPECT_CONTAINS(message, "zstd");
  message = error_of([&] { make_chain("[" + bytes + ", " + transpose + "]", spec); });
  EXPECT_CONTAINS(message, "out of order");
  EXPECT_CONTAINS(message, "transpose");
  message = error_of([&] { make_chain("[" + bytes + ", " + bytes + "]", spec); });
  EXPECT_CONTAINS(message, "two array->bytes codecs");
  message = error_of([&] { make_chain("[" + transpose + "]", spec); });
  EXPECT_CONTAINS(message, "no array->bytes codec");
  message = error_of([&] { make_chain("[]", spec); });
  EXPECT_CONTAINS(message, "must not be empty");
  message = error_of([&] { make_chain(R"({"name": "bytes"})", spec); });
  EXPECT_CONTAINS(message, "codecs must be an array");
}

TEST(CodecChain, MalformedEntriesNameTheirPosition) {
  auto spec = make_spec(DataTypeId::kUInt8, {4});
  EXPECT_CONTAINS(error_of([&] { make_chain(R"(["bytes", 42])", spec); }), "codecs[1]");
  EXPECT_CONTAINS(error_of([&] { make_chain(R"([{"configuration": {}}])", spec); }), "codecs[0]");
  std::string message = error_of([&] { make_chain(R"([{"name": "bytes", "extra": 1}])", spec); });
  EXPECT_CONTAINS(message, "codecs[0] (bytes)");
  EXPECT_CONTAINS(message, "unknown field \"extra\"");
  message = error_of([&] { make_chain(R"([{"name": "bytes", "configuration": [1]}])", spec); });
  EXPECT_CONTAINS(message, "codec bytes: configuration must be an object");
}

TEST(CodecConfig, UnknownFieldsAndMustUnderstand) {
  auto spec = make_spec(DataTypeId::kUInt16, {4});
  std::string message = error_of([&] {
    make_chain(R"([{"name": "bytes", "configuration": {"endian": "little", "speed": 3}}])", spec);
  });
  EXPECT_EQ(message, "codec bytes: unknown configuration field \"speed\"");
  // An unknown field marked must_understand: false is ignored.
  CodecChain chain = make_chain(
      R"([{"name": "bytes", "configuration": {"endian": "little",
                                               "hint": {"must_understand": false, "x": 1}}}])",
      spec);
  testing::expect_round_trip(chain, testing::sample_chunk(spec));
  // must_understand: true is not enough.
  EXPECT_CONTAINS(error_of([&] {
                    make_chain(R"([{"name": "bytes", "configuration": {"endian": "little",
                                    "hint": {"must_understand": true}}}])",
                               spec);
                  }),
                  "unknown configuration field \"hint\"");
}

TEST(CodecConfig, IntegerFieldChecks) {
  auto spec = make_spec(DataTypeId::kUInt16, {4});
  auto chain_with = [&](const std::string& zstd_config) {
    return make_chain(R"([{"name": "bytes", "configuration": {"endian": "little"}},
                          {"name": "zstd", "configuration": )" +
                          zstd_config + "}]",
                      spec);
  };
  EXPECT_CONTAINS(error_of([&] { chain_with(R"({"level": "high"})"); }),
                  "\"level\" must be an integer");
  // Any level an int holds opens (numcodecs writes them; zstd clamps when encoding).
  EXPECT_NO_THROW(chain_with(R"({"level": 1000})"));
  EXPECT_CONTAINS(error_of([&] { chain_with(R"({"level": 4294967296})"); }),
                  "\"level\" must be in");
  EXPECT_CONTAINS(error_of([&] { chain_with(R"({"level": 18446744073709551615})"); }),
                  "out of range");
  EXPECT_CONTAINS(error_of([&] { chain_with(R"({"level": 1.5})"); }), "must be an integer");
  EXPECT_CONTAINS(error_of([&] { chain_with(R"({"checksum": 1})"); }),
                  "\"checksum\" must be true or false");
  EXPECT_NO_THROW(chain_with(R"({"level": -5})"));
  EXPECT_NO_THROW(chain_with(R"({})"));
}

TEST(CodecChain, ChainsOfSeveralBytesToBytesCodecs) {
  auto spec = make_spec(DataTypeId::kInt32, {10, 10});
  const char* chains[] = {
      R"([{"name": "bytes", "configuration": {"endian": "big"}}, "zstd", "zstd"])",
      R"([{"name": "bytes", "configuration": {"endian": "little"}}, "crc32c", "zstd", "crc32c"])",
      R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}},
          {"name": "blosc", "configuration": {"cname": "lz4", "shuffle": "shuffle", "typesize": 4}}])",
      R"([{"name": "transpose", "configuration": {"order": [1, 0]}},
          {"name": "transpose", "configuration": {"order": [1, 0]}},
          {"name": "bytes", "configuration": {"endian": "little"}}, "numcodecs.lz4", "crc32c"])",
  };
  for (const char* text : chains) {
    SCOPED_TRACE(text);
    testing::expect_round_trip(make_chain(text, spec), testing::sample_chunk(spec, 3));
  }
}

TEST(CodecChain, EmptyChunkShape) {
  // Zero-dimensional chunks hold one element; a zero extent holds none.
  auto scalar = make_spec(DataTypeId::kFloat64, {});
  testing::expect_round_trip(make_chain(R"([{"name": "bytes", "configuration": {"endian": "big"}},
                                                        {"name": "gzip", "configuration": {"level": 5}}])",
                                        scalar),
                             testing::sample_chunk(scalar));
  EXPECT_EQ(scalar.num_elements(), 1u);
  auto none = make_spec(DataTypeId::kInt16, {0, 4});
  EXPECT_EQ(none.num_bytes(), 0u);
  testing::expect_round_trip(
      make_chain(R"([{"name": "bytes", "configuration": {"endian": "big"}}, "zstd", "crc32c"])",
                 none),
      Bytes());
}

TEST(CodecChain, GzipNeedsALevel) {
  auto spec = make_spec(DataTypeId::kUInt8, {4});
  EXPECT_EQ(error_of([&] { make_chain(R"(["bytes", "gzip"])", spec); }),
            "codec gzip: missing required field \"level\"");
}

}  // namespace
}  // namespace zfeed
