#include "zfeed/zarr/metadata.h"

#include <gtest/gtest.h>

#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"

namespace zfeed::zarr {
namespace {

using testing::error_of;

const char* kFullV3 = R"({
  "zarr_format": 3,
  "node_type": "array",
  "shape": [10, 20, 30],
  "data_type": "float32",
  "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [5, 10, 30]}},
  "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
  "fill_value": "NaN",
  "codecs": [{"name": "transpose", "configuration": {"order": [2, 1, 0]}},
             {"name": "bytes", "configuration": {"endian": "little"}},
             {"name": "zstd", "configuration": {"level": 3, "checksum": false}}],
  "attributes": {"units": "K", "scale": 0.5, "nested": {"b": 1, "a": [1, 2]}},
  "dimension_names": ["time", null, "lon"]
})";

Json v3(std::string_view patch_json = "{}") {
  Json json = Json::parse(kFullV3);
  json.merge_patch(Json::parse(patch_json));
  return json;
}

std::string parse_error(const Json& json) {
  return error_of([&] { ArrayMetadata::parse_v3(json); });
}

TEST(MetadataV3, ParsesEveryField) {
  ArrayMetadata meta = ArrayMetadata::parse_v3(v3());
  EXPECT_EQ(meta.zarr_format, 3);
  EXPECT_EQ(meta.shape, (std::vector<uint64_t>{10, 20, 30}));
  EXPECT_EQ(meta.chunk_shape, (std::vector<uint64_t>{5, 10, 30}));
  EXPECT_EQ(meta.dtype.id, DataTypeId::kFloat32);
  EXPECT_EQ(meta.key_encoding.kind, ChunkKeyEncoding::Kind::kDefault);
  uint32_t bits;
  std::memcpy(&bits, meta.fill_value.bytes.data(), 4);
  EXPECT_EQ(bits, 0x7fc00000u);
  ASSERT_TRUE(meta.dimension_names.has_value());
  EXPECT_EQ((*meta.dimension_names)[0], "time");
  EXPECT_FALSE((*meta.dimension_names)[1].has_value());
  EXPECT_EQ(meta.attributes["units"], "K");
  EXPECT_EQ(meta.rank(), 3u);
  EXPECT_EQ(meta.grid_shape(), (std::vector<uint64_t>{2, 2, 1}));
  EXPECT_EQ(meta.num_elements(), 6000u);
  EXPECT_EQ(meta.codec_chain().describe(),
            "transpose(order=[2,1,0]) > bytes(endian=little) > zstd(level=3, checksum=false)");
}

TEST(MetadataV3, WriteRoundTrip) {
  ArrayMetadata meta = ArrayMetadata::parse_v3(v3());
  Json written = meta.to_json_v3();
  EXPECT_EQ(written, v3());  // every field as given (the input is already canonical)
  ArrayMetadata again = ArrayMetadata::parse_v3(written);
  EXPECT_EQ(again.to_json_v3(), written);
  // Attribute order is kept.
  std::vector<std::string> keys;
  for (const auto& [key, value] : written["attributes"].items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"units", "scale", "nested"}));
}

TEST(MetadataV3, OptionalFieldsAndDefaultsOnWrite) {
  Json json = v3();
  json.erase("attributes");
  json.erase("dimension_names");
  json["codecs"] =
      Json::parse(R"([{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "zstd"}])");
  ArrayMetadata meta = ArrayMetadata::parse_v3(json);
  EXPECT_TRUE(meta.attributes.empty());
  EXPECT_FALSE(meta.dimension_names.has_value());
  Json written = meta.to_json_v3();
  EXPECT_EQ(written["attributes"], Json::object());
  EXPECT_FALSE(written.contains("dimension_names"));
  EXPECT_EQ(written["codecs"][1],
            Json::parse(R"({"name": "zstd", "configuration": {"level": 0, "checksum": false}})"));
  EXPECT_NO_THROW(
      ArrayMetadata::parse_v3(v3(R"({"dimension_names": null, "storage_transformers": []})")));
}

TEST(MetadataV3, MissingRequiredFieldsAreNamed) {
  for (const char* field : {"zarr_format", "node_type", "shape", "data_type", "chunk_grid",
                            "chunk_key_encoding", "fill_value", "codecs"}) {
    Json json = v3();
    json.erase(field);
    EXPECT_EQ(parse_error(json), "missing required field \"" + std::string(field) + "\"") << field;
  }
  Json json = v3();
  json["chunk_grid"]["configuration"].erase("chunk_shape");
  EXPECT_EQ(parse_error(json), "missing required field \"chunk_shape\"");
  json = v3();
  json["chunk_grid"].erase("configuration");
  EXPECT_CONTAINS(parse_error(json), "chunk_grid: missing \"configuration\"");
}

TEST(MetadataV3, WrongFormatOrNodeType) {
  EXPECT_CONTAINS(parse_error(v3(R"({"zarr_format": 2})")), "\"zarr_format\" must be 3, got 2");
  EXPECT_CONTAINS(parse_error(v3(R"({"zarr_format": "3"})")), "\"zarr_format\" must be 3");
  EXPECT_CONTAINS(parse_error(v3(R"({"node_type": "group"})")), "\"node_type\" must be \"array\"");
  EXPECT_CONTAINS(parse_error(Json::array()), "metadata must be a JSON object");
}

TEST(MetadataV3, BadShapesAndChunks) {
  EXPECT_EQ(parse_error(v3(R"({"shape": [10, -20, 30]})")),
            "shape[1] must not be negative, got -20");
  EXPECT_CONTAINS(parse_error(v3(R"({"shape": [10, 20.5, 30]})")),
                  "shape[1] must be a non-negative integer");
  EXPECT_CONTAINS(parse_error(v3(R"({"shape": "big"})")), "\"shape\" must be an array of integers");
  EXPECT_EQ(parse_error(v3(R"({"chunk_grid": {"configuration": {"chunk_shape": [5, 0, 30]}}})")),
            "chunk_shape[1] must be positive, got 0");
  EXPECT_CONTAINS(
      parse_error(v3(R"({"chunk_grid": {"configuration": {"chunk_shape": [5, -1, 30]}}})")),
      "chunk_shape[1] must not be negative");
  EXPECT_CONTAINS(parse_error(v3(R"({"chunk_grid": {"configuration": {"chunk_shape": [5, 10]}}})")),
                  "chunk_shape has 2 dimensions, shape has 3");
  // 64-bit overflow of the byte counts.
  EXPECT_CONTAINS(parse_error(v3(R"({"shape": [4611686018427387904, 20, 30]})")),
                  "shape overflows 64-bit byte counts");
  EXPECT_CONTAINS(parse_error(v3(R"({"shape": [18446744073709551615, 1, 1],
                                     "chunk_grid": {"configuration": {"chunk_shape": [1, 1, 1]}}})")),
                  "overflows");
  EXPECT_CONTAINS(parse_error(v3(R"({"shape": [1, 1, 1],
                                     "chunk_grid": {"configuration": {"chunk_shape": [4294967296, 4294967296, 1]}}})")),
                  "chunk_shape overflows 64-bit byte counts");
  EXPECT_CONTAINS(parse_error(v3(R"({"shape": [18446744073709551616, 1, 1]})")), "shape[0]");
  EXPECT_CONTAINS(parse_error(v3(R"({"dimension_names": ["a", "b"]})")),
                  "dimension_names has 2 entries for 3");
  EXPECT_CONTAINS(parse_error(v3(R"({"dimension_names": ["a", 1, "c"]})")), "dimension_names");
}

TEST(MetadataV3, UnsupportedThingsSayWhat) {
  EXPECT_EQ(
      error_of<UnsupportedError>([] { ArrayMetadata::parse_v3(v3(R"({"data_type": "string"})")); }),
      "unsupported data type \"string\"");
  EXPECT_EQ(error_of<UnsupportedError>([] {
              ArrayMetadata::parse_v3(
                  v3(R"({"codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                                        {"name": "numcodecs.bz2"}]})"));
            }),
            "unsupported codec \"numcodecs.bz2\"");
  EXPECT_CONTAINS(error_of<UnsupportedError>([] {
                    ArrayMetadata::parse_v3(v3(R"({"chunk_grid": {"name": "rectilinear"}})"));
                  }),
                  "unsupported chunk_grid \"rectilinear\"");
  EXPECT_CONTAINS(error_of<UnsupportedError>([] {
                    ArrayMetadata::parse_v3(v3(R"({"chunk_key_encoding": {"name": "fancy"}})"));
                  }),
                  "unsupported chunk_key_encoding \"fancy\"");
  EXPECT_CONTAINS(error_of<UnsupportedError>([] {
                    ArrayMetadata::parse_v3(v3(R"({"storage_transformers": [{"name": "x"}]})"));
                  }),
                  "unsupported storage_transformers");
  EXPECT_CONTAINS(parse_error(v3(R"({"codecs": [{"name": "zstd"},
                                                {"name": "bytes", "configuration": {"endian": "little"}}]})")),
                  "codec chain out of order");
  EXPECT_CONTAINS(parse_error(v3(R"({"fill_value": "zero"})")),
                  "fill_value \"zero\" is not valid for data type float32");
}

TEST(MetadataV3, MustUnderstand) {
  std::string message =
      error_of<UnsupportedError>([] { ArrayMetadata::parse_v3(v3(R"({"future": {"x": 1}})")); });
  EXPECT_CONTAINS(message, "unknown metadata field \"future\"");
  EXPECT_CONTAINS(error_of<UnsupportedError>([] {
                    ArrayMetadata::parse_v3(v3(R"({"future": {"must_understand": true}})"));
                  }),
                  "\"future\"");
  EXPECT_CONTAINS(
      error_of<UnsupportedError>([] { ArrayMetadata::parse_v3(v3(R"({"future": 5})")); }),
      "future");
  ArrayMetadata meta =
      ArrayMetadata::parse_v3(v3(R"({"future": {"must_understand": false, "x": 1}})"));
  EXPECT_EQ(meta.extra_fields["future"]["x"], 1);
  EXPECT_EQ(meta.to_json_v3()["future"], Json::parse(R"({"must_understand": false, "x": 1})"));
}

TEST(ChunkKeyEncoding, DefaultAndV2) {
  const uint64_t index[] = {1, 0, 23};
  ChunkKeyEncoding slash = ChunkKeyEncoding::parse(Json::parse(R"({"name": "default"})"));
  EXPECT_EQ(slash.encode(index), "c/1/0/23");
  ChunkKeyEncoding dot = ChunkKeyEncoding::parse(
      Json::parse(R"({"name": "default", "configuration": {"separator": "."}})"));
  EXPECT_EQ(dot.encode(index), "c.1.0.23");
  ChunkKeyEncoding v2 = ChunkKeyEncoding::parse(Json::parse(R"({"name": "v2"})"));
  EXPECT_EQ(v2.encode(index), "1.0.23");
  ChunkKeyEncoding v2_slash = ChunkKeyEncoding::parse(
      Json::parse(R"({"name": "v2", "configuration": {"separator": "/"}})"));
  EXPECT_EQ(v2_slash.encode(index), "1/0/23");
  // Zero-dimensional arrays.
  EXPECT_EQ(slash.encode({}), "c");
  EXPECT_EQ(dot.encode({}), "c");
  EXPECT_EQ(v2.encode({}), "0");
  EXPECT_EQ(v2_slash.encode({}), "0");
  // Written back in full.
  EXPECT_EQ(dot.to_json(),
            Json::parse(R"({"name": "default", "configuration": {"separator": "."}})"));
  EXPECT_EQ(v2.to_json(), Json::parse(R"({"name": "v2", "configuration": {"separator": "."}})"));
  EXPECT_CONTAINS(error_of([] {
                    ChunkKeyEncoding::parse(
                        Json::parse(R"({"name": "default", "configuration": {"separator": "-"}})"));
                  }),
                  "separator must be \"/\" or \".\"");
  EXPECT_CONTAINS(
      error_of([] {
        ChunkKeyEncoding::parse(Json::parse(R"({"name": "v2", "configuration": {"sep": "."}})"));
      }),
      "unknown configuration field \"sep\"");
  EXPECT_CONTAINS(error_of([] { ChunkKeyEncoding::parse(Json("default")); }), "must be an object");
}

const char* kZarray = R"({
  "chunks": [100, 100, 1],
  "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
  "dtype": ">f8",
  "fill_value": "NaN",
  "filters": null,
  "order": "F",
  "shape": [512, 512, 3],
  "zarr_format": 2,
  "dimension_separator": "/"
})";

TEST(MetadataV2, ParsesIntoAnEquivalentV3Chain) {
  ArrayMetadata meta = ArrayMetadata::parse_v2(
      Json::parse(kZarray),
      Json::parse(R"({"units": "m", "_ARRAY_DIMENSIONS": ["y", "x", "band"]})"));
  EXPECT_EQ(meta.zarr_format, 2);
  EXPECT_EQ(meta.dtype.id, DataTypeId::kFloat64);
  EXPECT_EQ(meta.v2_endian, Endian::kBig);
  EXPECT_EQ(meta.v2_order, 'F');
  EXPECT_EQ(meta.key_encoding.kind, ChunkKeyEncoding::Kind::kV2);
  EXPECT_EQ(meta.key_encoding.separator, '/');
  EXPECT_EQ(meta.codecs, Json::parse(R"([
      {"name": "transpose", "configuration": {"order": [2, 1, 0]}},
      {"name": "bytes", "configuration": {"endian": "big"}},
      {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}}])"));
  ASSERT_TRUE(meta.dimension_names.has_value());
  EXPECT_EQ(*meta.dimension_names, (std::vector<std::optional<std::string>>{"y", "x", "band"}));
  EXPECT_EQ(meta.attributes, Json::parse(R"({"units": "m"})"));  // _ARRAY_DIMENSIONS moved out
}

TEST(MetadataV2, WriteRoundTrip) {
  ArrayMetadata meta = ArrayMetadata::parse_v2(
      Json::parse(kZarray), Json::parse(R"({"_ARRAY_DIMENSIONS": ["y", "x", "b"]})"));
  Json zarray = meta.to_zarray();
  Json expected = Json::parse(kZarray);
  for (const auto& [key, value] : expected.items()) EXPECT_EQ(zarray[key], value) << key;
  EXPECT_EQ(meta.to_zattrs(), Json::parse(R"({"_ARRAY_DIMENSIONS": ["y", "x", "b"]})"));
  ArrayMetadata again = ArrayMetadata::parse_v2(zarray, meta.to_zattrs());
  EXPECT_EQ(again.codecs, meta.codecs);
  EXPECT_EQ(again.to_zarray(), zarray);
}

TEST(MetadataV2, DefaultsAndNullFill) {
  Json zarray =
      Json::parse(R"({"chunks": [4], "compressor": null, "dtype": "|u1", "fill_value": null,
                                "filters": null, "order": "C", "shape": [10], "zarr_format": 2})");
  ArrayMetadata meta = ArrayMetadata::parse_v2(zarray, Json());
  EXPECT_TRUE(meta.fill_value.is_null);
  EXPECT_EQ(meta.key_encoding.separator, '.');
  EXPECT_EQ(meta.codecs, Json::parse(R"([{"name": "bytes"}])"));
  EXPECT_TRUE(meta.to_zattrs().empty());
  EXPECT_TRUE(meta.to_zarray()["fill_value"].is_null());
  // filters [] is tolerated on read; an order of "F" on a 1-d array needs no transpose.
  zarray["filters"] = Json::array();
  zarray["order"] = "F";
  EXPECT_EQ(ArrayMetadata::parse_v2(zarray, Json()).codecs.size(), 1u);
}

TEST(MetadataV2, CompressorsMapBothWays) {
  struct Case {
    const char* compressor;
    const char* codec;
  } cases[] = {
      {R"({"id": "zstd", "level": 3})",
       R"({"name": "zstd", "configuration": {"level": 3, "checksum": false}})"},
      {R"({"id": "zlib", "level": 4})",
       R"({"name": "numcodecs.zlib", "configuration": {"level": 4}})"},
      {R"({"id": "gzip", "level": 5})", R"({"name": "gzip", "configuration": {"level": 5}})"},
      {R"({"id": "lz4", "acceleration": 2})",
       R"({"name": "numcodecs.lz4", "configuration": {"acceleration": 2}})"},
  };
  for (const auto& c : cases) {
    Json codec = v2_compressor_to_codec(Json::parse(c.compressor), DataType{DataTypeId::kInt16});
    EXPECT_EQ(codec, Json::parse(c.codec)) << c.compressor;
    Json back = codec_to_v2_compressor(codec);
    Json original = Json::parse(c.compressor);
    for (const auto& [key, value] : original.items()) EXPECT_EQ(back[key], value) << c.compressor;
  }
  Json blosc = codec_to_v2_compressor(Json::parse(
      R"({"name": "blosc", "configuration": {"cname": "zstd", "clevel": 3, "shuffle": "bitshuffle", "typesize": 4}})"));
  EXPECT_EQ(blosc["shuffle"], 2);
  EXPECT_EQ(blosc["cname"], "zstd");
  EXPECT_EQ(error_of<UnsupportedError>(
                [] { v2_compressor_to_codec(Json::parse(R"({"id": "bz2"})"), DataType{}); }),
            "unsupported v2 compressor \"bz2\" (zfeed reads blosc, zstd, zlib, gzip, lz4)");
  EXPECT_CONTAINS(error_of<UnsupportedError>(
                      [] { codec_to_v2_compressor(Json::parse(R"({"name": "crc32c"})")); }),
                  "has no Zarr v2 compressor form");
  EXPECT_CONTAINS(
      error_of([] { v2_compressor_to_codec(Json::parse(R"({"level": 1})"), DataType{}); }),
      "\"compressor\" must be null or an object with an \"id\"");
}

TEST(MetadataV2, BadInput) {
  auto message = [](std::string_view patch) {
    Json zarray = Json::parse(kZarray);
    zarray.merge_patch(Json::parse(patch));
    return error_of([&] { ArrayMetadata::parse_v2(zarray, Json()); });
  };
  EXPECT_CONTAINS(message(R"({"zarr_format": 3})"), "\"zarr_format\" must be 2");
  EXPECT_CONTAINS(message(R"({"shape": [512, -1, 3]})"), "shape[1] must not be negative");
  EXPECT_CONTAINS(message(R"({"chunks": [0, 100, 1]})"), "chunks[0] must be positive");
  EXPECT_CONTAINS(message(R"({"dtype": "<U8"})"), "unsupported v2 dtype \"<U8\"");
  EXPECT_CONTAINS(message(R"({"order": "K"})"), "\"order\" must be \"C\" or \"F\"");
  EXPECT_CONTAINS(message(R"({"dimension_separator": "-"})"), "\"dimension_separator\" must be");
  EXPECT_CONTAINS(message(R"({"filters": [{"id": "delta"}]})"), "unsupported v2 filters");
  EXPECT_CONTAINS(message(R"({"compressor": {"id": "snappy-ish"}})"), "unsupported v2 compressor");
  EXPECT_CONTAINS(message(R"({"fill_value": "x"})"), "fill_value");
  for (const char* field : {"shape", "chunks", "dtype", "fill_value", "order"}) {
    Json zarray = Json::parse(kZarray);
    zarray.erase(field);
    EXPECT_EQ(error_of([&] { ArrayMetadata::parse_v2(zarray, Json()); }),
              "missing required field \"" + std::string(field) + "\"");
  }
  EXPECT_CONTAINS(error_of([] { ArrayMetadata::parse_v2(Json::parse(kZarray), Json::array()); }),
                  ".zattrs must be a JSON object");
}

TEST(GroupMetadata, ParseAndWrite) {
  GroupMetadata meta =
      GroupMetadata::parse_v3(Json::parse(R"({"zarr_format": 3, "node_type": "group",
      "attributes": {"title": "t"},
      "consolidated_metadata": {"kind": "inline", "must_understand": false, "metadata": {"a": {"x": 1}}}})"));
  EXPECT_EQ(meta.attributes["title"], "t");
  ASSERT_TRUE(meta.consolidated.has_value());
  EXPECT_EQ((*meta.consolidated)["a"]["x"], 1);
  Json written = meta.to_json_v3();
  EXPECT_EQ(written["consolidated_metadata"]["kind"], "inline");
  EXPECT_EQ(GroupMetadata::parse_v3(written).consolidated, meta.consolidated);
  EXPECT_FALSE(GroupMetadata::parse_v3(Json::parse(R"({"zarr_format": 3, "node_type": "group",
                                                      "consolidated_metadata": null})"))
                   .consolidated.has_value());
  EXPECT_CONTAINS(
      error_of<UnsupportedError>([] {
        GroupMetadata::parse_v3(Json::parse(R"({"zarr_format": 3, "node_type": "group", "x": 1})"));
      }),
      "unknown metadata field \"x\"");
  EXPECT_CONTAINS(
      error_of([] {
        GroupMetadata::parse_v3(Json::parse(R"({"zarr_format": 3, "node_type": "array"})"));
      }),
      "\"node_type\" must be \"group\"");
  EXPECT_CONTAINS(
      error_of([] { GroupMetadata::parse_v3(Json::parse(R"({"node_type": "group"})")); }),
      "missing required field \"zarr_format\"");
  EXPECT_CONTAINS(error_of<UnsupportedError>([] {
                    GroupMetadata::parse_v3(Json::parse(R"({"zarr_format": 3, "node_type": "group",
                        "consolidated_metadata": {"kind": "remote", "metadata": {}}})"));
                  }),
                  "unsupported consolidated_metadata kind");
}

}  // namespace
}  // namespace zfeed::zarr
