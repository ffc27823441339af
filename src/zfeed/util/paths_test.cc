#include "zfeed/util/paths.h"

#include <gtest/gtest.h>

namespace zfeed {
namespace {

TEST(Paths, LocalPathsAndFileUrls) {
  EXPECT_TRUE(is_local_path("out.zarr"));
  EXPECT_TRUE(is_local_path("/data/out.zarr"));
  EXPECT_TRUE(is_local_path("file:///data/out.zarr"));
  EXPECT_FALSE(is_local_path("s3://bucket/out.zarr"));
  EXPECT_FALSE(is_local_path("memory://"));
  EXPECT_EQ(strip_file_scheme("file:///data/out.zarr"), "/data/out.zarr");
  EXPECT_EQ(strip_file_scheme("out.zarr"), "out.zarr");
  EXPECT_EQ(strip_file_scheme("s3://bucket/x"), "s3://bucket/x");
}

TEST(Paths, WithoutTrailingSeparator) {
  EXPECT_EQ(without_trailing_separator("out.zarr/"), "out.zarr");
  EXPECT_EQ(without_trailing_separator("./out.zarr//"), "out.zarr");
  EXPECT_EQ(without_trailing_separator("/data/a/../out.zarr/"), "/data/out.zarr");
  EXPECT_EQ(without_trailing_separator("/data/out.zarr"), "/data/out.zarr");
  EXPECT_EQ(without_trailing_separator("out.zarr/").filename(), "out.zarr");
}

}  // namespace
}  // namespace zfeed
