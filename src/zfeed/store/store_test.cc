// The Store contract, checked on every store: memory and filesystem.
#include "zfeed/store/store.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"

namespace zfeed {
namespace {

using testing::error_of;

struct StoreCase {
  std::string name;
  std::function<std::shared_ptr<Store>(const std::string& temp_dir)> make;
};

class StoreContract : public ::testing::TestWithParam<StoreCase> {
 protected:
  void SetUp() override { store_ = GetParam().make(dir_.path() + "/root"); }
  testing::TempDir dir_;
  std::shared_ptr<Store> store_;
};

std::string text_of(const std::optional<Bytes>& bytes) {
  return bytes ? std::string(bytes->as_string()) : std::string("<missing>");
}

TEST_P(StoreContract, SetGetOverwrite) {
  store_->set("a/b/c", as_bytes("hello"));
  EXPECT_EQ(text_of(store_->get("a/b/c")), "hello");
  store_->set("a/b/c", as_bytes("bye"));
  EXPECT_EQ(text_of(store_->get("a/b/c")), "bye");
  store_->set("empty", ByteView{});
  auto empty = store_->get("empty");
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_EQ(store_->size("empty"), 0u);
}

TEST_P(StoreContract, MissingKeysGiveNullopt) {
  EXPECT_FALSE(store_->get("nope").has_value());
  EXPECT_FALSE(store_->get("no/such/dir/key", ByteRange::range(0, 4)).has_value());
  EXPECT_FALSE(store_->size("nope").has_value());
  Bytes out;
  EXPECT_FALSE(store_->get_into("nope", ByteRange::all(), out));
  uint8_t buffer[4];
  EXPECT_FALSE(store_->read_into("nope", {buffer, 4}));
  // A "directory" is not a key.
  store_->set("dir/x", as_bytes("1"));
  EXPECT_FALSE(store_->get("dir").has_value());
  EXPECT_FALSE(store_->size("dir").has_value());
  // A key below a value is missing, not an error.
  EXPECT_FALSE(store_->get("dir/x/y").has_value());
}

TEST_P(StoreContract, Sizes) {
  store_->set("k", as_bytes("0123456789"));
  EXPECT_EQ(store_->size("k"), 10u);
}

TEST_P(StoreContract, ByteRanges) {
  store_->set("k", as_bytes("0123456789"));
  EXPECT_EQ(text_of(store_->get("k", ByteRange::range(2, 3))), "234");
  EXPECT_EQ(text_of(store_->get("k", ByteRange::range(0, 10))), "0123456789");
  EXPECT_EQ(text_of(store_->get("k", ByteRange::range(10, 0))), "");
  EXPECT_EQ(text_of(store_->get("k", ByteRange::suffix(4))), "6789");
  EXPECT_EQ(text_of(store_->get("k", ByteRange::suffix(10))), "0123456789");
  EXPECT_EQ(text_of(store_->get("k", ByteRange::suffix(0))), "");
  EXPECT_EQ(text_of(store_->get("k", ByteRange::all())), "0123456789");
}

TEST_P(StoreContract, OutOfBoundsRangesNameTheKey) {
  store_->set("arr/c/0/0", as_bytes("0123456789"));
  for (ByteRange range : {ByteRange::range(8, 3), ByteRange::range(11, 0), ByteRange::suffix(11),
                          ByteRange::range(UINT64_MAX, 2), ByteRange::range(2, UINT64_MAX)}) {
    std::string message = error_of([&] { store_->get("arr/c/0/0", range); });
    EXPECT_CONTAINS(message, "arr/c/0/0");
    EXPECT_CONTAINS(message, "outside");
  }
}

TEST_P(StoreContract, GetIntoReusesBuffer) {
  store_->set("k", as_bytes("abcdef"));
  Bytes out(100);
  ASSERT_TRUE(store_->get_into("k", ByteRange::range(1, 2), out));
  EXPECT_EQ(out.as_string(), "bc");
  ASSERT_TRUE(store_->get_into("k", ByteRange::all(), out));
  EXPECT_EQ(out.as_string(), "abcdef");
}

TEST_P(StoreContract, ReadIntoExactSize) {
  store_->set("k", as_bytes("abcdef"));
  uint8_t buffer[6];
  ASSERT_TRUE(store_->read_into("k", {buffer, 6}));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buffer), 6), "abcdef");
  uint8_t small[4];
  std::string message = error_of([&] { store_->read_into("k", {small, 4}); });
  EXPECT_CONTAINS(message, "k");
  EXPECT_CONTAINS(message, "expected 4 bytes, found 6");
}

TEST_P(StoreContract, ReadRangeInto) {
  store_->set("k", as_bytes("abcdef"));
  uint8_t buffer[3] = {};
  ASSERT_TRUE(store_->read_range_into("k", 2, {buffer, 3}, std::nullopt));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buffer), 3), "cde");
  ASSERT_TRUE(store_->read_range_into("k", 6, {buffer, 0}, 6));
  EXPECT_FALSE(store_->read_range_into("nope", 0, {buffer, 3}, std::nullopt));
  EXPECT_FALSE(store_->read_range_into("nope", 0, {buffer, 3}, 6));
  std::string message = error_of([&] { store_->read_range_into("k", 4, {buffer, 3}, {}); });
  EXPECT_CONTAINS(message, "k");
  EXPECT_CONTAINS(message, "bytes 4..7 is outside the 6-byte value");
  // The value's size checked where given, before anything is read.
  message = error_of([&] { store_->read_range_into("k", 0, {buffer, 3}, 8); });
  EXPECT_CONTAINS(message, "k: expected 8 bytes, found 6");
}

TEST_P(StoreContract, GetMany) {
  store_->set("a", as_bytes("AAAA"));
  store_->set("b", as_bytes("BBBBBB"));
  std::vector<KeyRange> requests{
      {"a", ByteRange::all()}, {"missing", ByteRange::all()}, {"b", ByteRange::suffix(2)}};
  auto results = store_->get_many(requests);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(text_of(results[0]), "AAAA");
  EXPECT_FALSE(results[1].has_value());
  EXPECT_EQ(text_of(results[2]), "BB");
}

TEST_P(StoreContract, EraseAndErasePrefix) {
  store_->set("x/1", as_bytes("1"));
  store_->set("x/2", as_bytes("2"));
  store_->set("xy", as_bytes("3"));
  store_->set("y/1", as_bytes("4"));
  store_->erase("x/1");
  EXPECT_FALSE(store_->get("x/1").has_value());
  store_->erase("x/1");        // missing: not an error
  store_->erase("never/was");  // nor here
  store_->erase_prefix("x/");
  EXPECT_FALSE(store_->get("x/2").has_value());
  EXPECT_TRUE(store_->get("xy").has_value());  // "x/" is not a prefix of "xy"
  EXPECT_TRUE(store_->get("y/1").has_value());
  store_->erase_prefix("");
  EXPECT_TRUE(store_->list("").empty());
}

TEST_P(StoreContract, ListIsSortedAndFiltered) {
  for (const char* key : {"b/zarr.json", "a/c/1", "a/c/0", "a/zarr.json", "ab", "zarr.json"}) {
    store_->set(key, as_bytes("x"));
  }
  EXPECT_EQ(store_->list(""), (std::vector<std::string>{"a/c/0", "a/c/1", "a/zarr.json", "ab",
                                                        "b/zarr.json", "zarr.json"}));
  EXPECT_EQ(store_->list("a/"), (std::vector<std::string>{"a/c/0", "a/c/1", "a/zarr.json"}));
  EXPECT_EQ(store_->list("a"), (std::vector<std::string>{"a/c/0", "a/c/1", "a/zarr.json", "ab"}));
  EXPECT_EQ(store_->list("a/c/"), (std::vector<std::string>{"a/c/0", "a/c/1"}));
  EXPECT_TRUE(store_->list("q/").empty());
}

TEST_P(StoreContract, ListDirGivesDirectChildren) {
  for (const char* key : {"g/a/zarr.json", "g/a/c/0", "g/b/zarr.json", "g/zarr.json", "h"}) {
    store_->set(key, as_bytes("x"));
  }
  EXPECT_EQ(store_->list_dir(""), (std::vector<std::string>{"g", "h"}));
  EXPECT_EQ(store_->list_dir("g/"), (std::vector<std::string>{"a", "b", "zarr.json"}));
  EXPECT_EQ(store_->list_dir("g/a/"), (std::vector<std::string>{"c", "zarr.json"}));
  EXPECT_TRUE(store_->list_dir("none/").empty());
}

TEST_P(StoreContract, KeysThatClimbOutAreRefused) {
  const char* bad[] = {"..", "../x",  "a/../../x", "/abs", "/etc/passwd", "a//b",
                       ".",  "a/./b", "a/",        "",     "a\\b"};
  for (const char* key : bad) {
    SCOPED_TRACE(key);
    EXPECT_CONTAINS(error_of([&] { store_->get(key); }), "invalid key");
    EXPECT_CONTAINS(error_of([&] { store_->set(key, as_bytes("x")); }), "invalid key");
    EXPECT_CONTAINS(error_of([&] { store_->erase(key); }), "invalid key");
    EXPECT_CONTAINS(error_of([&] { store_->size(key); }), "invalid key");
    Bytes out;
    EXPECT_CONTAINS(error_of([&] { store_->get_into(key, ByteRange::all(), out); }), "invalid key");
  }
  EXPECT_TRUE(store_->list("").empty()) << "a refused set must write nothing";
}

TEST_P(StoreContract, ConcurrentReadersAndWriters) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        std::string key = "t" + std::to_string(t) + "/" + std::to_string(i % 5);
        std::string value(100 + i, char('a' + t));
        store_->set(key, as_bytes(value));
        auto got = store_->get(key);
        ASSERT_TRUE(got.has_value());
        EXPECT_EQ(got->size(), value.size());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(store_->list("").size(), 20u);
}

INSTANTIATE_TEST_SUITE_P(
    Stores, StoreContract,
    ::testing::Values(StoreCase{"memory", [](const std::string&) { return make_memory_store(); }},
                      StoreCase{"file",
                                [](const std::string& dir) {
                                  FileStoreOptions options;
                                  options.create = true;
                                  return make_file_store(dir, options);
                                }},
                      StoreCase{"file_sync",
                                [](const std::string& dir) {
                                  FileStoreOptions options;
                                  options.create = true;
                                  options.sync = true;
                                  return make_file_store(dir, options);
                                }}),
    [](const ::testing::TestParamInfo<StoreCase>& param_info) { return param_info.param.name; });

TEST(Store, CheckKeyAcceptsOrdinaryKeys) {
  for (const char* key : {"zarr.json", "a/b/c/0/1", "c", ".zarray", "x..y", "...", "a/.b"}) {
    EXPECT_NO_THROW(Store::check_key(key)) << key;
  }
}

TEST(Store, CheckKeyNamesTheReason) {
  EXPECT_CONTAINS(error_of([] { Store::check_key("../up"); }), "climbs out");
  EXPECT_CONTAINS(error_of([] { Store::check_key("/abs"); }), "absolute");
  EXPECT_CONTAINS(error_of([] { Store::check_key("a//b"); }), "empty path component");
  EXPECT_CONTAINS(error_of([] { Store::check_key(""); }), "empty");
  EXPECT_CONTAINS(error_of([] { Store::check_key(std::string_view("a\0b", 3)); }), "NUL");
}

TEST(Store, ByteRangeDescribe) {
  EXPECT_EQ(ByteRange::all().describe(), "all bytes");
  EXPECT_EQ(ByteRange::range(4, 6).describe(), "bytes 4..10");
  EXPECT_EQ(ByteRange::suffix(16).describe(), "the last 16 bytes");
}

TEST(Store, OpenStoreByUrl) {
  EXPECT_EQ(open_store("memory://")->url(), "memory://");
  testing::TempDir dir;
  auto store = open_store("file://" + dir.path());
  EXPECT_EQ(store->url(), "file://" + dir.path());
  store->set("k", as_bytes("v"));
  EXPECT_EQ(open_store(dir.path())->get("k")->as_string(), "v");
  EXPECT_EQ(open_store("s3://bucket/x")->url(), "s3://bucket/x");
  EXPECT_EQ(open_store("http://host/x/")->url(), "http://host/x");
  std::string message = error_of<UnsupportedError>([] { open_store("ftp://host/x"); });
  EXPECT_CONTAINS(message, "unsupported store URL");
  EXPECT_CONTAINS(message, "ftp://host/x");
}

}  // namespace
}  // namespace zfeed
