#include "zfeed/util/error.h"

#include <gtest/gtest.h>

#include <new>

#include "zfeed/util/json.h"
#include "zfeed/util/testing.h"

namespace zfeed {
namespace {

using testing::error_of;

template <typename E>
void rethrow_inside(E error) {
  try {
    throw error;
  } catch (...) {
    rethrow_with_context("memory://a/c/0");
  }
}

TEST(Error, HierarchyIsCatchableAsError) {
  EXPECT_THROW(throw UnsupportedError("x"), Error);
  EXPECT_THROW(throw NotFoundError("x"), Error);
  EXPECT_THROW(throw Error("x"), std::runtime_error);
}

TEST(Error, RethrowWithContextKeepsTypeAndPrefixes) {
  std::string message = error_of<UnsupportedError>(
      [] { rethrow_inside(UnsupportedError("unsupported codec \"zfp\"")); });
  EXPECT_EQ(message, "memory://a/c/0: unsupported codec \"zfp\"");
  message = error_of<NotFoundError>([] { rethrow_inside(NotFoundError("gone")); });
  EXPECT_EQ(message, "memory://a/c/0: gone");
  message = error_of<Error>([] { rethrow_inside(Error("zstd: corrupt")); });
  EXPECT_EQ(message, "memory://a/c/0: zstd: corrupt");
}

TEST(Error, RethrowWithContextTurnsJsonAndAllocationErrorsIntoError) {
  std::string message = error_of<Error>([] {
    try {
      Json json = Json::parse(R"({"a": "text"})");
      (void)json["a"].get<int>();
    } catch (...) {
      rethrow_with_context("store/zarr.json");
    }
  });
  EXPECT_CONTAINS(message, "store/zarr.json: malformed metadata");
  message = error_of<Error>([] { rethrow_inside(std::bad_alloc()); });
  EXPECT_EQ(message, "memory://a/c/0: out of memory");
}

}  // namespace
}  // namespace zfeed
