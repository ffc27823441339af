#include "zfeed/zarr/stage.h"

#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "zfeed/store/http_testing.h"
#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/group.h"

namespace zfeed::zarr {
namespace {

using testing::error_of;
using testing::TempDir;

ArrayMetadata metadata(std::vector<uint64_t> shape, std::vector<uint64_t> chunks,
                       const char* codecs) {
  Json json = {{"zarr_format", 3},
               {"node_type", "array"},
               {"shape", shape},
               {"data_type", "float32"},
               {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", chunks}}}}},
               {"chunk_key_encoding", {{"name", "default"}}},
               {"fill_value", -1},
               {"codecs", Json::parse(codecs)}};
  return ArrayMetadata::parse_v3(json);
}

const char* kZstd = R"([{"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "zstd", "configuration": {"level": 1}}])";
const char* kSharded = R"([{"name": "sharding_indexed", "configuration": {
    "chunk_shape": [1, 5], "index_location": "end",
    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}])";

// A group with a zstd array, a sharded array with one shard never written (the fill value), and
// a subgroup; consolidated, so that a store that cannot list still opens it.
std::shared_ptr<Store> sample_hierarchy() {
  auto store = make_memory_store();
  Group root = Group::create(store, "", 3, Json{{"title", "staged"}});
  Array t = Array::create(store, "t", metadata({4, 6, 10}, {1, 6, 10}, kZstd));
  std::vector<float> values(4 * 6 * 10);
  std::iota(values.begin(), values.end(), 0.25f);
  t.write(t.full_selection(), values.data());
  Group::create(store, "sub");
  Array s = Array::create(store, "sub/s", metadata({4, 10}, {2, 10}, kSharded));
  std::vector<float> half(2 * 10, 7.0f);
  s.write(Selection{Slice{0, 2, 1}, Slice{0, 10, 1}}, half.data());
  Group::open(store, "").consolidate();
  return store;
}

std::vector<float> read_all(const Array& array) {
  uint64_t count = 1;
  for (uint64_t extent : array.metadata().shape) count *= extent;
  std::vector<float> out(count);
  array.read(array.full_selection(), out.data());
  return out;
}

void expect_same_hierarchy(const std::shared_ptr<Store>& source, const std::string& copy) {
  auto local = open_store(copy);
  EXPECT_EQ(read_all(Array::open(local, "t")), read_all(Array::open(source, "t")));
  EXPECT_EQ(read_all(Array::open(local, "sub/s")), read_all(Array::open(source, "sub/s")));
  EXPECT_EQ(Group::open(local, "").attributes()["title"], "staged");
}

TEST(Stage, CopiesAListableStoreAndKnowsWhenItIsComplete) {
  auto source = sample_hierarchy();
  TempDir dir;
  const std::string destination = dir.path() + "/copy.zarr";
  std::vector<StageProgress> seen;
  StageOptions options;
  options.progress = [&](const StageProgress& p) { seen.push_back(p); };
  StageResult first = stage(source, destination, options);
  const auto keys = source->list("");
  EXPECT_EQ(first.keys, keys.size());
  EXPECT_EQ(first.copied, keys.size());
  EXPECT_EQ(first.present, 0u);
  EXPECT_FALSE(first.already_complete);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().keys_done, keys.size());
  EXPECT_EQ(seen.back().keys_total, keys.size());
  auto local = open_store(destination);
  for (const auto& key : keys)
    EXPECT_EQ(local->get(key)->as_string(), source->get(key)->as_string());
  expect_same_hierarchy(source, destination);
  const Json record = Json::parse(local->get(kStageRecord)->as_string());
  EXPECT_EQ(record["source"], "memory://");
  EXPECT_EQ(record["complete"], true);
  // Zarr readers skip the record and the lock.
  EXPECT_EQ(Group::open(local, "").members(), (std::vector<std::string>{"sub", "t"}));

  StageResult again = stage(source, destination);
  EXPECT_TRUE(again.already_complete);
  EXPECT_EQ(again.copied, 0u);
}

TEST(Stage, CopiesAStoreThatCannotListFromItsMetadata) {
  auto source = sample_hierarchy();
  testing::TestServer server;
  for (const auto& key : source->list("")) {
    server.put("data/" + key, std::string(source->get(key)->as_string()));
  }
  auto remote = open_store(server.url() + "/data");
  ASSERT_FALSE(remote->can_list());
  const auto keys = hierarchy_keys(remote);
  // The listing's keys, and the key of the shard never written.
  auto listed = source->list("");
  EXPECT_EQ(keys.size(), listed.size() + 1);
  TempDir dir;
  StageResult result = stage(remote, dir.path() + "/copy");
  EXPECT_EQ(result.keys, listed.size() + 1);
  EXPECT_EQ(result.copied, listed.size());
  EXPECT_EQ(result.missing, 1u);
  expect_same_hierarchy(source, dir.path() + "/copy");
}

TEST(Stage, AnInterruptedCopyResumes) {
  auto source = sample_hierarchy();
  TempDir dir;
  const std::string destination = dir.path() + "/copy";
  // What a run killed part way leaves: the record naming the source, some values.
  {
    FileStoreOptions create;
    create.create = true;
    auto local = make_file_store(destination, create);
    local->set(kStageRecord, as_bytes(R"({"source": "memory://", "complete": false})"));
    local->set("t/zarr.json", *source->get("t/zarr.json"));
    local->set("t/c/0/0/0", *source->get("t/c/0/0/0"));
    // A value of another size than the source's listing says is copied again.
    local->set("t/c/1/0/0", as_bytes("stale"));
  }
  StageResult result = stage(source, destination);
  EXPECT_EQ(result.present, 2u);
  EXPECT_EQ(result.copied, source->list("").size() - 2);
  expect_same_hierarchy(source, destination);
}

TEST(Stage, RefusesDestinationsThatHoldSomethingElse) {
  auto source = sample_hierarchy();
  TempDir dir;
  {
    FileStoreOptions create;
    create.create = true;
    make_file_store(dir.path() + "/busy", create)->set("notes.txt", as_bytes("mine"));
  }
  EXPECT_CONTAINS(error_of<Error>([&] { stage(source, dir.path() + "/busy"); }),
                  "the destination holds files (notes.txt) and no staging record");
  stage(source, dir.path() + "/copy");
  auto other = sample_hierarchy();
  other->set("extra/zarr.json", as_bytes("{}"));
  // Another store's copy: the record names the source by URL.
  auto local = open_store(dir.path() + "/copy");
  local->set(kStageRecord, as_bytes(R"({"source": "s3://elsewhere/x.zarr", "complete": true})"));
  EXPECT_CONTAINS(error_of<Error>([&] { stage(other, dir.path() + "/copy"); }),
                  "the destination holds a copy of s3://elsewhere/x.zarr");
  EXPECT_CONTAINS(error_of<UnsupportedError>([&] { stage(source, "s3://bucket/x"); }),
                  "is not a local directory path");
}

TEST(Stage, ProcessesStagingOneDestinationAtOnceShareOneCopy) {
  // The lock is on the file, so two threads with their own descriptors contend as two
  // processes would: one copies, the other waits and finds the copy complete.
  auto source = sample_hierarchy();
  TempDir dir;
  const std::string destination = dir.path() + "/copy";
  StageResult results[2];
  std::thread first([&] { results[0] = stage(source, destination); });
  std::thread second([&] { results[1] = stage(source, destination); });
  first.join();
  second.join();
  EXPECT_EQ(results[0].already_complete + results[1].already_complete, 1);
  EXPECT_EQ(results[0].copied + results[1].copied, source->list("").size());
  expect_same_hierarchy(source, destination);
}

}  // namespace
}  // namespace zfeed::zarr
