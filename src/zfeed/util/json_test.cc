#include "zfeed/util/json.h"

#include <gtest/gtest.h>

#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"

namespace zfeed {
namespace {

using testing::error_of;

TEST(Json, ParsesAndKeepsKeyOrder) {
  Json json = parse_json(R"({"z": 1, "a": [1, 2], "m": {"k": null}})", "doc");
  ASSERT_TRUE(json.is_object());
  std::vector<std::string> keys;
  for (const auto& [key, value] : json.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"z", "a", "m"}));
  EXPECT_EQ(json["a"][1], 2);
}

TEST(Json, MalformedNamesDocumentAndPosition) {
  std::string message = error_of([] { parse_json(R"({"a": 1,, })", "group/zarr.json"); });
  EXPECT_CONTAINS(message, "group/zarr.json");
  EXPECT_CONTAINS(message, "invalid JSON");
  EXPECT_CONTAINS(message, "byte");
}

TEST(Json, TruncatedAndEmptyDocumentsAreErrors) {
  EXPECT_CONTAINS(error_of([] { parse_json(R"({"shape": [1, 2)", "a/zarr.json"); }), "a/zarr.json");
  EXPECT_CONTAINS(error_of([] { parse_json("", "empty.json"); }), "empty.json");
  EXPECT_CONTAINS(error_of([] { parse_json(std::string_view("{\"a\":\0}", 7), "nul.json"); }),
                  "nul.json");
}

TEST(Json, DeeplyNestedDocumentsAreRefusedNotAStackOverflow) {
  std::string deep(100000, '[');
  std::string message = error_of([&] { parse_json(deep, "a/zarr.json"); });
  EXPECT_CONTAINS(message, "a/zarr.json");
  EXPECT_CONTAINS(message, "nested");
  // Brackets inside strings do not count.
  std::string text = "{\"a\": \"" + std::string(5000, '[') + "\"}";
  EXPECT_EQ(parse_json(text, "x")["a"].get<std::string>().size(), 5000u);
  std::string fine = std::string(100, '[') + std::string(100, ']');
  EXPECT_NO_THROW(parse_json(fine, "x"));
}

TEST(Json, TypeNames) {
  EXPECT_EQ(json_type_name(Json(nullptr)), "null");
  EXPECT_EQ(json_type_name(Json::object()), "an object");
  EXPECT_EQ(json_type_name(Json::array()), "an array");
  EXPECT_EQ(json_type_name(Json("x")), "a string");
  EXPECT_EQ(json_type_name(Json(true)), "a boolean");
  EXPECT_EQ(json_type_name(Json(-3)), "an integer");
  EXPECT_EQ(json_type_name(Json(3u)), "an integer");
  EXPECT_EQ(json_type_name(Json(1.5)), "a number");
}

TEST(Json, Uint64IsExact) {
  Json big = parse_json("18446744073709551615", "n");
  EXPECT_EQ(json_to_uint64(big, "n"), 18446744073709551615ull);
  EXPECT_EQ(json_to_uint64(parse_json("9007199254740993", "n"), "n"), 9007199254740993ull);
  EXPECT_EQ(json_to_uint64(Json(0), "n"), 0u);
  EXPECT_EQ(json_to_uint64(Json(4.0), "n"), 4u);  // integral floats are accepted
}

TEST(Json, Uint64RejectsNegativeFractionalAndNonNumbers) {
  EXPECT_CONTAINS(error_of([] { json_to_uint64(Json(-1), "shape[0]"); }), "shape[0]");
  EXPECT_CONTAINS(error_of([] { json_to_uint64(Json(-1), "shape[0]"); }), "negative");
  EXPECT_CONTAINS(error_of([] { json_to_uint64(Json(1.5), "chunk_shape[1]"); }), "chunk_shape[1]");
  EXPECT_CONTAINS(error_of([] { json_to_uint64(Json("3"), "x"); }), "non-negative integer");
  EXPECT_CONTAINS(error_of([] { json_to_uint64(Json(nullptr), "x"); }), "x");
  EXPECT_CONTAINS(error_of([] { json_to_uint64(parse_json("1e300", "n"), "big"); }), "big");
}

TEST(Json, StringOrFallback) {
  Json json = {{"name", "zstd"}, {"level", 3}};
  EXPECT_EQ(json_string_or(json, "name", "?"), "zstd");
  EXPECT_EQ(json_string_or(json, "level", "?"), "?");    // not a string
  EXPECT_EQ(json_string_or(json, "missing", "?"), "?");  // absent
  EXPECT_EQ(json_string_or(Json::array(), "name", "fallback"), "fallback");
}

TEST(Json, DumpIsIndentedAndRoundTrips) {
  Json json = {{"b", 1}, {"a", {1, 2}}};
  std::string text = dump_json(json);
  EXPECT_CONTAINS(text, "\n  \"b\": 1");
  EXPECT_EQ(parse_json(text, "x"), json);
}

}  // namespace
}  // namespace zfeed
