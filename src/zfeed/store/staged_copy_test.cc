#include "zfeed/store/staged_copy.h"

#include <gtest/gtest.h>

#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"

namespace zfeed {
namespace {

using testing::error_of;
using testing::TempDir;

StagedTimeChunks chunks(std::string path, std::string prefix, char separator) {
  StagedTimeChunks entry;
  entry.path = std::move(path);
  entry.chunk_prefix = std::move(prefix);
  entry.separator = separator;
  entry.time_chunk = 4;
  entry.first_chunk = 2;
  entry.stop_chunk = 5;
  return entry;
}

TEST(StagedCopy, FindsTheTimeChunkOfEachKeyEncoding) {
  const StagedTimeChunks v3 = chunks("era5/t2m", "c/", '/');
  EXPECT_EQ(v3.time_chunk_of("era5/t2m/c/17/0/3"), 17u);
  EXPECT_EQ(v3.time_chunk_of("era5/t2m/c/7"), 7u);
  EXPECT_FALSE(v3.time_chunk_of("era5/t2m/zarr.json"));
  EXPECT_FALSE(v3.time_chunk_of("era5/t2m2/c/1/0/0"));  // another array sharing the prefix
  EXPECT_FALSE(v3.time_chunk_of("era5/t2m/c//0"));
  EXPECT_FALSE(v3.time_chunk_of("era5/t2m/c/x1/0"));
  EXPECT_TRUE(v3.excludes("era5/t2m/c/1/0/0"));
  EXPECT_FALSE(v3.excludes("era5/t2m/c/2/0/0"));
  EXPECT_FALSE(v3.excludes("era5/t2m/c/4/0/0"));
  EXPECT_TRUE(v3.excludes("era5/t2m/c/5/0/0"));

  const StagedTimeChunks dotted = chunks("w", "c.", '.');
  EXPECT_EQ(dotted.time_chunk_of("w/c.3.0.0"), 3u);
  const StagedTimeChunks v2 = chunks("", "", '.');  // a root array
  EXPECT_EQ(v2.time_chunk_of("12.0.0"), 12u);
  EXPECT_FALSE(v2.time_chunk_of(".zarray"));
  EXPECT_FALSE(v2.time_chunk_of(".zattrs"));

  StagedTimeRange range{"time", 8, 20, {v3, dotted}};
  const StagedTimeRange back = StagedTimeRange::from_json(range.to_json());
  ASSERT_EQ(back.arrays.size(), 2u);
  EXPECT_EQ(back.arrays[1].chunk_prefix, "c.");
  EXPECT_EQ(back.arrays[1].separator, '.');
  EXPECT_EQ(back.stop, 20u);
  EXPECT_EQ(back.excluding("w/c.9.0.0"), &back.arrays[1]);
  EXPECT_EQ(back.excluding("w/c.3.0.0"), nullptr);
}

TEST(StagedCopy, AMalformedRecordIsAnErrorNamingTheDirectory) {
  TempDir dir;
  FileStoreOptions create;
  create.create = true;
  auto directory = make_file_store(dir.path() + "/copy", create);
  directory->set(kStageRecord, as_bytes(R"({"source": "s3://b/x", "complete": true,
                                            "partial": {"time_dim": "time", "time_range": [1]}})"));
  EXPECT_CONTAINS(error_of<Error>([&] { open_staged_copy(directory); }),
                  "copy: the staging record's \"partial\" entry is malformed: time_range must be "
                  "[start, stop]");
  // No record: the directory as it is.
  auto plain = make_file_store(dir.path(), create);
  EXPECT_EQ(open_staged_copy(plain), plain);
}

}  // namespace
}  // namespace zfeed
