#include "zfeed/zarr/group.h"

#include <gtest/gtest.h>
#include <string.h>

#include <filesystem>
#include <fstream>

#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"

namespace zfeed::zarr {
namespace {

using testing::error_of;

ArrayMetadata small_v3(const std::string& dtype = "int16") {
  return ArrayMetadata::parse_v3(Json::parse(
      R"({"zarr_format": 3, "node_type": "array", "shape": [4, 6],
      "data_type": ")" +
      dtype + R"(", "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}},
      "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
      "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}],
      "attributes": {"units": "K"}, "dimension_names": ["y", "x"]})"));
}

ArrayMetadata small_v2() {
  return ArrayMetadata::parse_v2(
      Json::parse(
          R"({"zarr_format": 2, "shape": [4, 6], "chunks": [2, 3], "dtype": "<i2", "fill_value": 0,
                      "order": "C", "filters": null, "compressor": {"id": "zlib", "level": 1}})"),
      Json::parse(R"({"units": "K", "_ARRAY_DIMENSIONS": ["y", "x"]})"));
}

std::vector<int16_t> ramp16() {
  std::vector<int16_t> v(24);
  for (size_t i = 0; i < 24; ++i) v[i] = static_cast<int16_t>(i * 3 - 10);
  return v;
}

// A tree: root {title} / a (array), sub (group) / sub/b (array), sub/deeper (group).
void build_tree(const std::shared_ptr<Store>& store, int format) {
  Group::create(store, "", format, {{"title", "root"}});
  Array a = Array::create(store, "a", format == 3 ? small_v3() : small_v2());
  a.write(a.full_selection(), ramp16().data());
  Group::create(store, "sub", format, {{"level", 1}});
  Array b = Array::create(store, "sub/b", format == 3 ? small_v3() : small_v2());
  b.write(b.full_selection(), ramp16().data());
  Group::create(store, "sub/deeper", format);
}

TEST(Group, MembersAndNodes) {
  for (int format : {3, 2}) {
    SCOPED_TRACE(format);
    auto store = make_memory_store();
    build_tree(store, format);
    Group root = Group::open(store);
    EXPECT_EQ(root.zarr_format(), format);
    EXPECT_FALSE(root.is_consolidated());
    EXPECT_EQ(root.attributes(), Json({{"title", "root"}}));
    EXPECT_EQ(root.members(), (std::vector<std::string>{"a", "sub"}));
    Node a = root.open_member("a");
    ASSERT_TRUE(std::holds_alternative<Array>(a));
    EXPECT_EQ(std::get<Array>(a).path(), "a");
    EXPECT_EQ(std::get<Array>(a).metadata().attributes, Json({{"units", "K"}}));
    Node sub = root.open_member("sub");
    ASSERT_TRUE(std::holds_alternative<Group>(sub));
    const Group& sub_group = std::get<Group>(sub);
    EXPECT_EQ(sub_group.path(), "sub");
    EXPECT_EQ(sub_group.attributes(), Json({{"level", 1}}));
    EXPECT_EQ(sub_group.members(), (std::vector<std::string>{"b", "deeper"}));
    Node b = sub_group.open_member("b");
    std::vector<int16_t> values(24);
    std::get<Array>(b).read(std::get<Array>(b).full_selection(), values.data());
    EXPECT_EQ(values, ramp16());
    // open_node finds arrays and groups by path.
    EXPECT_TRUE(std::holds_alternative<Array>(open_node(store, "sub/b")));
    EXPECT_TRUE(std::holds_alternative<Group>(open_node(store, "sub/deeper")));
    EXPECT_TRUE(std::holds_alternative<Group>(open_node(store)));
    EXPECT_CONTAINS(error_of<NotFoundError>([&] { open_node(store, "missing"); }),
                    "no Zarr array or group here");
    EXPECT_THROW(root.open_member("missing"), NotFoundError);
    EXPECT_THROW(open_node(store, "../escape"), Error);
  }
}

TEST(Group, ChunkDirectoryNamedCIsNotAMember) {
  auto store = make_memory_store();
  Group root = Group::create(store, "");
  Array::create(store, "arr", small_v3());
  // A group member called "c" is still a member.
  Group::create(store, "c");
  EXPECT_EQ(root.members(), (std::vector<std::string>{"arr", "c"}));
  // The chunk folder "c" of an array is not.
  Array arr = Array::open(store, "arr");
  arr.write(arr.full_selection(), ramp16().data());
  EXPECT_TRUE(Group::open(store, "c").members().empty());
}

TEST(Group, Attributes) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  Group v3 = Group::create(store, "g3", 3, {{"a", 1}});
  v3.set_attributes({{"b", {1, 2}}});
  EXPECT_EQ(Group::open(store, "g3").attributes(), Json({{"b", {1, 2}}}));
  Group v2 = Group::create(store, "g2", 2, {{"a", 1}});
  EXPECT_EQ(Json::parse(store->get("g2/.zattrs")->as_string()), Json({{"a", 1}}));
  v2.set_attributes(Json::object());
  EXPECT_FALSE(store->get("g2/.zattrs").has_value());
  EXPECT_TRUE(Group::open(store, "g2").attributes().empty());
  EXPECT_THROW(v2.set_attributes(Json(3)), Error);
}

TEST(Group, CreateKeepsOrReplaces) {
  auto store = make_memory_store();
  Group::create(store, "g", 3, {{"keep", true}});
  Array::create(store, "g/x", small_v3());
  // An existing group of the same format is kept as it is.
  Group again = Group::create(store, "g", 3);
  EXPECT_EQ(again.attributes(), Json({{"keep", true}}));
  EXPECT_EQ(again.members(), (std::vector<std::string>{"x"}));
  EXPECT_CONTAINS(error_of([&] { Group::create(store, "g", 2); }),
                  "a different Zarr node already exists");
  EXPECT_CONTAINS(error_of([&] { Group::create(store, "g/x", 3); }),
                  "a different Zarr node already exists");
  Group fresh = Group::create(store, "g", 2, Json::object(), true);
  EXPECT_EQ(fresh.zarr_format(), 2);
  EXPECT_TRUE(fresh.members().empty());
  EXPECT_THROW(Group::create(store, "h", 4), Error);
}

TEST(Group, OpenErrors) {
  auto store = make_memory_store();
  Array::create(store, "arr", small_v3());
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { Group::open(store, "arr"); }),
                  "is an array, not a group");
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { Group::open(store, "none"); }),
                  "no Zarr group here");
  store->set("bad/zarr.json", as_bytes("{\"zarr_format\": 3, \"node_type\": \"group\""));
  EXPECT_CONTAINS(error_of([&] { Group::open(store, "bad"); }), "bad/zarr.json");
  store->set("bad/zarr.json",
             as_bytes(R"({"zarr_format": 3, "node_type": "group", "attributes": []})"));
  EXPECT_CONTAINS(error_of([&] { Group::open(store, "bad"); }), "\"attributes\" must be an object");
  store->set("v2/.zgroup", as_bytes(R"({"zarr_format": 3})"));
  EXPECT_CONTAINS(error_of([&] { Group::open(store, "v2"); }),
                  "v2/.zgroup: \"zarr_format\" must be 2");
  store->set("v2/.zgroup", as_bytes(R"({"zarr_format": 2})"));
  store->set("v2/.zmetadata", as_bytes(R"({"zarr_consolidated_format": 1})"));
  EXPECT_CONTAINS(error_of([&] { Group::open(store, "v2"); }),
                  "v2/.zmetadata: missing the \"metadata\" object");
  store->set("v2/.zmetadata", as_bytes(R"({"metadata": )"));
  EXPECT_CONTAINS(error_of([&] { Group::open(store, "v2"); }), "v2/.zmetadata");
}

TEST(Group, ConsolidatedV3WriteAndRead) {
  auto store = make_memory_store();
  build_tree(store, 3);
  Group root = Group::open(store);
  root.consolidate();
  EXPECT_TRUE(root.is_consolidated());
  Json written = Json::parse(store->get("zarr.json")->as_string());
  ASSERT_TRUE(written.contains("consolidated_metadata"));
  EXPECT_EQ(written["consolidated_metadata"]["kind"], "inline");
  const Json& metadata = written["consolidated_metadata"]["metadata"];
  std::vector<std::string> keys;
  for (const auto& [key, value] : metadata.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "sub", "sub/b", "sub/deeper"}));
  EXPECT_EQ(metadata["a"]["node_type"], "array");
  EXPECT_EQ(metadata["sub"]["attributes"], Json({{"level", 1}}));

  // Reading uses the consolidated metadata: remove the members' own documents to prove it.
  store->erase("a/zarr.json");
  store->erase("sub/zarr.json");
  store->erase("sub/b/zarr.json");
  Group reopened = Group::open(store);
  ASSERT_TRUE(reopened.is_consolidated());
  EXPECT_EQ(reopened.attributes(), Json({{"title", "root"}}));
  EXPECT_EQ(reopened.members(), (std::vector<std::string>{"a", "sub"}));
  Node sub = reopened.open_member("sub");
  const Group& sub_group = std::get<Group>(sub);
  EXPECT_EQ(sub_group.attributes(), Json({{"level", 1}}));
  EXPECT_EQ(sub_group.members(), (std::vector<std::string>{"b", "deeper"}));
  Node b = sub_group.open_member("b");
  const Array& array = std::get<Array>(b);
  EXPECT_EQ(array.path(), "sub/b");
  std::vector<int16_t> values(24);
  array.read(array.full_selection(), values.data());
  EXPECT_EQ(values, ramp16());
  EXPECT_EQ(array.metadata().dimension_names->at(0), "y");
  EXPECT_THROW(reopened.open_member("nothing"), NotFoundError);
  // Consolidating again lists the store, not the old consolidated data.
  Array::create(store, "a", small_v3(), true);
  Array::create(store, "sub/b", small_v3(), true);
  Group::create(store, "sub", 3, {{"level", 2}}, false);
  Array::create(store, "new", small_v3("float64"));
  reopened.consolidate();
  Group latest = Group::open(store);
  EXPECT_EQ(latest.members(), (std::vector<std::string>{"a", "new", "sub"}));
  EXPECT_EQ(std::get<Array>(latest.open_member("new")).metadata().dtype.id, DataTypeId::kFloat64);
}

TEST(Group, ConsolidatedV2WriteAndRead) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  build_tree(store, 2);
  Group root = Group::open(store);
  root.consolidate();
  Json zmetadata = Json::parse(store->get(".zmetadata")->as_string());
  EXPECT_EQ(zmetadata["zarr_consolidated_format"], 1);
  const Json& metadata = zmetadata["metadata"];
  for (const char* key : {".zgroup", ".zattrs", "a/.zarray", "a/.zattrs", "sub/.zgroup",
                          "sub/.zattrs", "sub/b/.zarray", "sub/b/.zattrs", "sub/deeper/.zgroup"}) {
    EXPECT_TRUE(metadata.contains(key)) << key;
  }
  EXPECT_EQ(metadata["a/.zattrs"]["_ARRAY_DIMENSIONS"], Json::parse(R"(["y", "x"])"));
  EXPECT_EQ(metadata[".zattrs"], Json({{"title", "root"}}));
  std::filesystem::remove(dir / "sub/b/.zarray");
  Group reopened = Group::open(store);
  ASSERT_TRUE(reopened.is_consolidated());
  EXPECT_EQ(reopened.members(), (std::vector<std::string>{"a", "sub"}));
  const Group sub = std::get<Group>(reopened.open_member("sub"));
  EXPECT_EQ(sub.attributes(), Json({{"level", 1}}));
  const Array b = std::get<Array>(sub.open_member("b"));
  std::vector<int16_t> values(24);
  b.read(b.full_selection(), values.data());
  EXPECT_EQ(values, ramp16());
  EXPECT_EQ(*b.metadata().dimension_names, (std::vector<std::optional<std::string>>{"y", "x"}));
}

// Real data written by xarray + zarr-python 2: a consolidated v2 group with CF attributes.
TEST(RealData, EcmwfZarrMatchesTheNetcdfFile) {
  ZFEED_REQUIRE_SHARED(zarr_path, "data/ecmwf-t-z-2007-01-01.zarr");
  const std::string nc_path = testing::shared_dir() + "/data/ecmwf-t-z-2007-01-01.nc";
  auto store = make_file_store(zarr_path);
  Group root = Group::open(store);
  EXPECT_TRUE(root.is_consolidated());
  EXPECT_EQ(root.zarr_format(), 2);
  EXPECT_EQ(root.attributes()["Conventions"], "CF-1.6");
  EXPECT_EQ(root.members(),
            (std::vector<std::string>{"latitude", "level", "longitude", "t", "time", "z"}));
  std::ifstream in(nc_path, std::ios::binary);
  const std::string nc{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_FALSE(nc.empty());
  for (const char* name : {"t", "z"}) {
    SCOPED_TRACE(name);
    Array array = std::get<Array>(root.open_member(name));
    const auto& meta = array.metadata();
    EXPECT_EQ(meta.shape, (std::vector<uint64_t>{1, 2, 181, 360}));
    EXPECT_EQ(meta.dtype.id, DataTypeId::kInt16);
    EXPECT_EQ(*meta.dimension_names,
              (std::vector<std::optional<std::string>>{"time", "level", "latitude", "longitude"}));
    EXPECT_TRUE(meta.attributes.contains("scale_factor"));
    EXPECT_FALSE(meta.attributes.contains("_ARRAY_DIMENSIONS"));
    std::vector<int16_t> values(2 * 181 * 360);
    array.read(array.full_selection(), values.data());
    // The same read without the consolidated metadata gives the same values.
    std::vector<int16_t> direct(values.size());
    Array::open(store, name).read(array.full_selection(), direct.data());
    EXPECT_EQ(values, direct);
    // netCDF-3 stores the packed int16 values big-endian and contiguously: find them there.
    std::string big_endian(values.size() * 2, '\0');
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t v = static_cast<uint16_t>(values[i]);
      big_endian[2 * i] = static_cast<char>(v >> 8);
      big_endian[2 * i + 1] = static_cast<char>(v & 0xff);
    }
    EXPECT_NE(nc.find(big_endian), std::string::npos) << name << " does not match the netCDF file";
    // A strided read of a window matches the whole.
    std::vector<int16_t> window(2 * 10 * 12);
    array.read({{0, 1, 1}, {0, 2, 1}, {100, 120, 2}, {7, 360, 30}}, window.data());
    for (size_t l = 0; l < 2; ++l) {
      for (size_t r = 0; r < 10; ++r) {
        for (size_t c = 0; c < 12; ++c) {
          ASSERT_EQ(window[(l * 10 + r) * 12 + c],
                    values[(l * 181 + 100 + 2 * r) * 360 + 7 + 30 * c]);
        }
      }
    }
  }
}

TEST(RealData, AstronautV2ArraysAgree) {
  ZFEED_REQUIRE_SHARED(path, "conformance/zarr-v2-astronaut.zarr");
  auto store = make_file_store(path);
  Group root = Group::open(store);
  EXPECT_EQ(root.members(), (std::vector<std::string>{"blosc", "gzip", "raw", "zlib"}));
  std::vector<uint8_t> raw(512 * 512 * 3);
  Array raw_array = std::get<Array>(root.open_member("raw"));
  raw_array.read(raw_array.full_selection(), raw.data());
  // The image is not blank, and its edge chunks (512 = 5 * 100 + 12) were cropped correctly.
  size_t nonzero = 0;
  for (uint8_t v : raw) nonzero += v != 0;
  EXPECT_GT(nonzero, raw.size() / 2);
  for (const char* name : {"blosc", "gzip", "zlib"}) {
    SCOPED_TRACE(name);
    Array array = std::get<Array>(root.open_member(name));
    std::vector<uint8_t> values(raw.size());
    array.read(array.full_selection(), values.data());
    EXPECT_TRUE(values == raw);
    // A read across the edge chunks.
    std::vector<uint8_t> corner(15 * 15 * 3);
    array.read({{497, 512, 1}, {497, 512, 1}, {0, 3, 1}}, corner.data());
    for (size_t r = 0; r < 15; ++r) {
      for (size_t c = 0; c < 15; ++c) {
        for (size_t k = 0; k < 3; ++k) {
          ASSERT_EQ(corner[(r * 15 + c) * 3 + k], raw[((497 + r) * 512 + 497 + c) * 3 + k]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace zfeed::zarr
