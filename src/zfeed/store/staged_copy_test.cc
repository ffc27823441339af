#include "zfeed/store/staged_copy.h"

#include <gtest/gtest.h>

#include "zfeed/store/store_testing.h"
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

TEST(StagedCopy, AReadThroughStoreReadsTheCopyWhereStagingHasPutAValue) {
  auto source = std::make_shared<testing::WatchedStore>(make_memory_store());
  source->set("a/zarr.json", as_bytes("{}"));
  source->set("a/c/0", as_bytes("source 0"));
  source->set("a/c/1", as_bytes("source 1"));
  TempDir dir;
  FileStoreOptions create;
  create.create = true;
  auto copy = make_file_store(dir.path() + "/copy", create);
  // Told apart by their bytes here; a real copy holds the source's.
  copy->set("a/c/0", as_bytes("copied 0"));
  auto staged = std::make_shared<StagedKeys>();
  auto store = make_read_through_store(source, copy, staged);

  // A value this run has not checked (an earlier copy's: the source may have changed since) is
  // the source's; once staging has checked or copied it, the copy's.
  EXPECT_EQ(std::string(store->get("a/c/0")->as_string()), "source 0");
  EXPECT_EQ(source->reads, 1u);
  staged->add("a/c/0");
  source->reads = 0;
  EXPECT_EQ(std::string(store->get("a/c/0")->as_string()), "copied 0");
  EXPECT_EQ(source->reads, 0u);
  EXPECT_EQ(std::string(store->get("a/c/1")->as_string()), "source 1");
  EXPECT_EQ(source->reads, 1u);
  Bytes into;
  ASSERT_TRUE(store->get_into("a/c/0", ByteRange::range(7, 1), into));
  EXPECT_EQ(std::string(into.as_string()), "0");
  std::string seen;
  ASSERT_TRUE(store->with_bytes("a/c/1", ByteRange::suffix(1), [&](ByteView bytes) {
    seen.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }));
  EXPECT_EQ(seen, "1");
  char out[6];
  ASSERT_TRUE(store->read_range_into("a/c/1", 0, {reinterpret_cast<uint8_t*>(out), 6}, 8));
  EXPECT_EQ(std::string(out, 6), "source");
  const KeyRange requests[] = {{"a/c/0", {}}, {"a/c/1", {}}, {"a/c/9", {}}};
  const auto values = store->get_many(requests);
  EXPECT_EQ(std::string(values[0]->as_string()), "copied 0");
  EXPECT_EQ(std::string(values[1]->as_string()), "source 1");
  EXPECT_FALSE(values[2]);
  EXPECT_FALSE(store->get("a/c/9"));
  EXPECT_EQ(store->size("a/c/1"), 8u);
  // Once the copy holds a value, it is read there.
  copy->set("a/c/1", as_bytes("copied 1"));
  staged->add("a/c/1");
  const uint64_t before = source->reads;
  EXPECT_EQ(std::string(store->get("a/c/1")->as_string()), "copied 1");
  EXPECT_EQ(source->reads, before);

  // The source's listing and name; no writes.
  EXPECT_EQ(store->list("a/c/"), (std::vector<std::string>{"a/c/0", "a/c/1"}));
  EXPECT_EQ(store->url(), "memory://");
  EXPECT_FALSE(store->local_path("a/c/0"));
  EXPECT_CONTAINS(error_of([&] { store->set("a/c/2", as_bytes("x")); }),
                  "memory://: a/c/2: cannot write while it is staged to file://");
  EXPECT_CONTAINS(error_of([&] { store->erase("a/c/0"); }), "cannot write while it is staged");
}

}  // namespace
}  // namespace zfeed
