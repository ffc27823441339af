#include <gtest/gtest.h>

#include "zfeed/store/store.h"
#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"

namespace zfeed {
namespace {

using testing::error_of;

TEST(MemoryStore, UrlAndIndependentInstances) {
  auto a = make_memory_store();
  auto b = make_memory_store();
  EXPECT_EQ(a->url(), "memory://");
  a->set("k", as_bytes("v"));
  EXPECT_FALSE(b->get("k").has_value());
}

TEST(MemoryStore, ValuesAreCopiedOnSet) {
  auto store = make_memory_store();
  std::string text = "original";
  store->set("k", as_bytes(text));
  text[0] = 'X';
  EXPECT_EQ(store->get("k")->as_string(), "original");
  auto first = store->get("k");
  (*first)[0] = 'Y';  // a returned value is a copy too
  EXPECT_EQ(store->get("k")->as_string(), "original");
}

TEST(MemoryStore, RangeErrorNamesKeyRangeAndSize) {
  auto store = make_memory_store();
  store->set("t/c/3/0", as_bytes("12345"));
  std::string message = error_of([&] { store->get("t/c/3/0", ByteRange::range(3, 4)); });
  EXPECT_EQ(message, "memory://t/c/3/0: bytes 3..7 is outside the 5-byte value");
  message = error_of([&] { store->get("t/c/3/0", ByteRange::suffix(6)); });
  EXPECT_CONTAINS(message, "the last 6 bytes");
}

TEST(MemoryStore, ListIsExactPrefixMatch) {
  auto store = make_memory_store();
  store->set("a", as_bytes("1"));
  store->set("a/b", as_bytes("2"));
  store->set("a0", as_bytes("3"));
  store->set("b", as_bytes("4"));
  EXPECT_EQ(store->list("a"), (std::vector<std::string>{"a", "a/b", "a0"}));
  EXPECT_EQ(store->list("a/"), (std::vector<std::string>{"a/b"}));
  EXPECT_EQ(store->list_dir(""), (std::vector<std::string>{"a", "a0", "b"}));
}

}  // namespace
}  // namespace zfeed
