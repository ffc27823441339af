#include "zfeed/zarr/stage.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>

#include "zfeed/ingest/stats.h"
#include "zfeed/store/http_testing.h"
#include "zfeed/util/error.h"
#include "zfeed/util/fork_gate.h"
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

// `source`'s keys served over plain HTTP by `server` (a store that cannot list), opened.
std::shared_ptr<Store> served(testing::TestServer& server, const Store& source) {
  for (const auto& key : source.list("")) {
    server.put("data/" + key, std::string(source.get(key)->as_string()));
  }
  return open_store(server.url() + "/data");
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
  auto remote = served(server, *source);
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

TEST(Stage, RefusesASourceThatIsNoZarrStoreAndLeavesNoCopy) {
  TempDir dir;
  const std::string destination = dir.path() + "/copy";
  // A mistyped path staged as a complete copy of nothing.
  EXPECT_CONTAINS(error_of<NotFoundError>(
                      [&] { stage(open_store(dir.path() + "/no-such.zarr"), destination); }),
                  "no-such.zarr: no Zarr store there to stage (no zarr.json, .zgroup or .zarray");
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { stage(make_memory_store(), destination); }),
                  "no Zarr store there to stage");
  auto files = make_memory_store();
  files->set("notes.txt", as_bytes("mine"));
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { stage(files, destination); }),
                  "no Zarr store there to stage");
  EXPECT_FALSE(std::filesystem::exists(destination));
  // A prefix holding stores, no metadata at its root, for a loader's group below it (the node
  // the copy is for): refused, saying to open the group's own URL, not to copy them all.
  auto stores = make_memory_store();
  stores->set("era5.zarr/zarr.json", as_bytes(R"({"zarr_format": 3, "node_type": "group"})"));
  stores->set("cam5.zarr/zarr.json", as_bytes(R"({"zarr_format": 3, "node_type": "group"})"));
  StageOptions for_a_group;
  for_a_group.node = "era5";
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { stage(stores, destination, for_a_group); }),
                  "/era5: no Zarr store there to stage");
  for_a_group.node = "era5.zarr";
  EXPECT_CONTAINS(error_of<Error>([&] { stage(stores, destination, for_a_group); }),
                  "no Zarr metadata at the store's root, so staging it would copy everything "
                  "below it for era5.zarr: open memory://");
  EXPECT_FALSE(std::filesystem::exists(destination));
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

TEST(Stage, StopsWhenAskedAndALaterRunFinishesTheCopy) {
  auto source = sample_hierarchy();
  TempDir dir;
  const std::string destination = dir.path() + "/copy";
  EXPECT_FALSE(stage_is_complete(source, destination));  // no directory yet
  std::atomic<int> asked{0};
  StageOptions options;
  options.threads = 1;
  options.stop = [&] { return ++asked > 4; };  // asked once before the values, then at each
  const StageResult stopped = stage(source, destination, options);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.copied, 3u);
  EXPECT_FALSE(stage_is_complete(source, destination));
  EXPECT_CONTAINS(error_of<Error>([&] { open_store(destination); }), "unfinished staged copy");
  const StageResult finished = stage(source, destination);
  EXPECT_FALSE(finished.stopped);
  EXPECT_EQ(finished.present, 3u);
  EXPECT_EQ(finished.copied + finished.present, source->list("").size());
  EXPECT_TRUE(stage_is_complete(source, destination));
  expect_same_hierarchy(source, destination);
}

TEST(Stage, AChildForkedDuringACopyDoesNotKeepTheLock) {
  // A flock belongs to the open file, which a forked child shares: a DataLoader worker forked
  // while the parent copies must not hold the node's lock after the parent lets it go.
  auto source = sample_hierarchy();
  TempDir dir;
  const std::string destination = dir.path() + "/copy";
  std::mutex mutex;
  std::condition_variable changed;
  bool copying = false, forked = false;
  StageOptions options;
  options.stop = [&] {
    std::unique_lock lock(mutex);
    if (!copying) {
      copying = true;
      changed.notify_all();
      ForkGate::Release for_the_fork;
      changed.wait(lock, [&] { return forked; });
    }
    return false;
  };
  StageResult result;
  std::thread copier([&] { result = stage(source, destination, options); });
  pid_t child;
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return copying; });
  }
  child = ::fork();
  if (child == 0) {
    for (;;) ::pause();  // alive, doing nothing, until killed
  }
  {
    std::lock_guard lock(mutex);
    forked = true;
  }
  changed.notify_all();
  copier.join();
  EXPECT_FALSE(result.stopped);
  const int fd = ::open((destination + "/.zfeed-stage.lock").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0) << "the child still holds the lock";
  ::close(fd);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST(Stage, AProcessWaitingForAnotherOnesCopyStopsWhenAsked) {
  auto source = sample_hierarchy();
  TempDir dir;
  const std::string destination = dir.path() + "/copy";
  StageOptions stop_at_once;
  stop_at_once.stop = [] { return true; };
  stage(source, destination, stop_at_once);  // makes the directory
  // Another process holds the node's lock (a descriptor of this one contends as another would).
  const int held = ::open((destination + "/.zfeed-stage.lock").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  std::atomic<int> asked{0};
  StageOptions options;
  options.stop = [&] { return ++asked > 2; };
  const StageResult result = stage(source, destination, options);
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.copied, 0u);
  EXPECT_EQ(asked, 3);
  ::close(held);
}

TEST(Stage, StageIsCompleteJudgesTheDestinationAsStageDoes) {
  auto source = sample_hierarchy();
  TempDir dir;
  {
    FileStoreOptions create;
    create.create = true;
    make_file_store(dir.path() + "/busy", create)->set("notes.txt", as_bytes("mine"));
  }
  EXPECT_CONTAINS(error_of<Error>([&] { stage_is_complete(source, dir.path() + "/busy"); }),
                  "the destination holds files (notes.txt) and no staging record");
  stage(source, dir.path() + "/copy");
  EXPECT_TRUE(stage_is_complete(source, dir.path() + "/copy"));
  auto other = make_memory_store();
  open_store(dir.path() + "/copy")
      ->set(kStageRecord, as_bytes(R"({"source": "s3://elsewhere/x.zarr", "complete": true})"));
  EXPECT_CONTAINS(error_of<Error>([&] { stage_is_complete(source, dir.path() + "/copy"); }),
                  "the destination holds a copy of s3://elsewhere/x.zarr");
  EXPECT_CONTAINS(error_of<UnsupportedError>([&] { stage_is_complete(source, "s3://b/x"); }),
                  "is not a local directory path");
}

TEST(Stage, ProgressLinesSayHowFarTheCopyIs) {
  // Not a terminal here (a test's stderr is a file or pipe): whole lines, the first and the last.
  ::testing::internal::CaptureStderr();
  auto print = stage_progress_printer("stage /x");
  print({0, 10, 0, 0.0});
  print({5, 10, 3 << 20, 1.0});  // within 10 s of the last line: not printed
  print({10, 10, 6 << 20, 2.0});
  print({10, 10, 6 << 20, 2.0});  // stage() reports the end again: one last line
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "stage /x: 0/10 keys, 0.0 MiB copied, 0.0 MB/s\n"
            "stage /x: 10/10 keys, 6.0 MiB copied, 3.1 MB/s\n");
  // A copy found complete (nothing copied here) says nothing.
  ::testing::internal::CaptureStderr();
  stage_progress_printer("stage /x")({10, 10, 0, 0.1});
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// --- Partial copies: time steps [start, stop) of the arrays along time ----------------------

ArrayMetadata timed(std::vector<uint64_t> shape, std::vector<uint64_t> chunks, const char* codecs,
                    std::vector<std::string> dims, char separator = '/') {
  ArrayMetadata meta = metadata(std::move(shape), std::move(chunks), codecs);
  meta.dimension_names.emplace(dims.begin(), dims.end());
  meta.key_encoding.separator = separator;
  return meta;
}

const char* kShardedTime = R"([{"name": "sharding_indexed", "configuration": {
    "chunk_shape": [1, 4, 5], "index_location": "end",
    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
               {"name": "zstd", "configuration": {"level": 1}}],
    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}])";

void fill_ramp(const Array& array, float base) {
  std::vector<float> values(array.metadata().num_elements());
  std::iota(values.begin(), values.end(), base);
  array.write(array.full_selection(), values.data());
}

// Ten time steps: t2m in chunks of 2 steps, w (keys "c.1.0.0") in chunks of 3, sh in shards of
// 4; a 1-D time coordinate in chunks of 3 and a static (lat, lon) field, both copied whole.
std::shared_ptr<Store> timed_hierarchy() {
  auto store = make_memory_store();
  Group::create(store, "", 3);
  fill_ramp(
      Array::create(store, "t2m", timed({10, 4, 5}, {2, 4, 5}, kZstd, {"time", "lat", "lon"})),
      0.5f);
  fill_ramp(
      Array::create(store, "w", timed({10, 4, 5}, {3, 4, 5}, kZstd, {"time", "lat", "lon"}, '.')),
      1000.5f);
  fill_ramp(Array::create(store, "sh",
                          timed({10, 4, 5}, {4, 4, 5}, kShardedTime, {"time", "lat", "lon"})),
            2000.5f);
  fill_ramp(Array::create(store, "time", timed({10}, {3}, kZstd, {"time"})), 0.0f);
  fill_ramp(Array::create(store, "lsm", timed({4, 5}, {4, 5}, kZstd, {"lat", "lon"})), 0.0f);
  Group::open(store, "").consolidate();
  return store;
}

std::vector<float> read_steps(const Array& array, uint64_t start, uint64_t stop) {
  std::vector<float> out((stop - start) * 20);
  array.read(Selection{Slice{start, stop, 1}, Slice{0, 4, 1}, Slice{0, 5, 1}}, out.data());
  return out;
}

TEST(Stage, APartialCopyHoldsTheTimeChunksOfItsRange) {
  auto source = timed_hierarchy();
  TempDir dir;
  const std::string destination = dir.path() + "/part";
  StageOptions options;
  options.time_range = {{3, 7}};
  const StageResult result = stage(source, destination, options);
  ASSERT_TRUE(result.partial);
  EXPECT_EQ(result.partial->time_dim, "time");
  ASSERT_EQ(result.partial->arrays.size(), 3u);  // not the 1-D coordinate nor the static field

  auto files = make_file_store(destination);
  // t2m: chunks 1, 2, 3 (steps 2 to 7); w: 1, 2 (steps 3 to 8); sh: shards 0, 1 (steps 0 to 7).
  for (const char* key :
       {"t2m/c/1/0/0", "t2m/c/2/0/0", "t2m/c/3/0/0", "w/c.1.0.0", "w/c.2.0.0", "sh/c/0/0/0",
        "sh/c/1/0/0", "time/c/0", "time/c/3", "lsm/c/0/0", "zarr.json", "t2m/zarr.json"}) {
    EXPECT_TRUE(files->size(key)) << key;
  }
  for (const char* key : {"t2m/c/0/0/0", "t2m/c/4/0/0", "w/c.0.0.0", "w/c.3.0.0", "sh/c/2/0/0"}) {
    EXPECT_FALSE(files->size(key)) << key;
  }

  // Opened by path, the copy reads its steps as the source does, and refuses the others.
  auto copy = open_store(destination);
  for (const char* name : {"t2m", "w", "sh"}) {
    EXPECT_EQ(read_steps(Array::open(copy, name), 3, 7),
              read_steps(Array::open(source, name), 3, 7))
        << name;
  }
  EXPECT_EQ(read_all(Array::open(copy, "time")), read_all(Array::open(source, "time")));
  EXPECT_EQ(read_all(Array::open(copy, "lsm")), read_all(Array::open(source, "lsm")));
  const std::string error = error_of<Error>([&] { read_steps(Array::open(copy, "t2m"), 0, 1); });
  EXPECT_CONTAINS(error,
                  "t2m/c/0/0/0: time chunk 0 (time steps 0 to 1) is not in this partial "
                  "staged copy of memory://, which holds time steps [3, 7)");
  EXPECT_CONTAINS(error_of<Error>([&] { read_steps(Array::open(copy, "w"), 9, 10); }),
                  "w/c.3.0.0: time chunk 3 (time steps 9 to 11)");
  EXPECT_CONTAINS(error_of<Error>([&] { read_steps(Array::open(copy, "sh"), 8, 9); }),
                  "sh/c/2/0/0: time chunk 2");
  const auto held = staged_time_range(*copy);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->start, 3u);
  EXPECT_EQ(held->stop, 7u);
  EXPECT_FALSE(staged_time_range(*open_store(dir.path())));  // no record: no staged copy
}

TEST(Stage, StatisticsOfAPartialCopyDefaultToTheStepsItHolds) {
  auto source = timed_hierarchy();
  TempDir dir;
  const std::string destination = dir.path() + "/part";
  StageOptions options;
  options.time_range = {{3, 7}};
  stage(source, destination, options);
  ingest::StatsOptions stats_options;
  stats_options.variables = {"t2m", "lsm"};
  stats_options.write_attributes = false;
  const auto stats = ingest::compute_store_stats(destination, stats_options);
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].time_start, 3u);  // t2m: the copy's steps, not the whole axis it lacks
  EXPECT_EQ(stats[0].time_stop, 7u);
  const Json expected = ingest::compute_array_stats(Array::open(source, "t2m"), "t2m",
                                                    [] {
                                                      ingest::StatsOptions steps;
                                                      steps.time_start = 3;
                                                      steps.time_stop = 7;
                                                      return steps;
                                                    }())
                            .to_json();
  EXPECT_EQ(stats[0].to_json(), expected);
  EXPECT_EQ(stats[1].to_json(),  // lsm: no time axis, copied whole
            ingest::compute_array_stats(Array::open(source, "lsm"), "lsm", {}).to_json());
  stats_options.time_start = 0;  // a range past the copy's steps is refused, naming them
  EXPECT_CONTAINS(error_of<Error>([&] { ingest::compute_store_stats(destination, stats_options); }),
                  "which holds time steps [3, 7)");
}

TEST(Stage, APartialCopyServesItsOwnRangeOnly) {
  auto source = timed_hierarchy();
  TempDir dir;
  StageOptions part;
  part.time_range = {{3, 7}};
  stage(source, dir.path() + "/part", part);
  const StageResult again = stage(source, dir.path() + "/part", part);
  EXPECT_TRUE(again.already_complete);
  ASSERT_TRUE(again.partial);
  EXPECT_EQ(again.partial->stop, 7u);
  StageOptions other;
  other.time_range = {{0, 4}};
  EXPECT_CONTAINS(error_of<Error>([&] { stage(source, dir.path() + "/part", other); }),
                  "the destination holds time steps [3, 7) of the source only, not time steps "
                  "[0, 4); give another destination for that range");
  EXPECT_CONTAINS(error_of<Error>([&] { stage(source, dir.path() + "/part"); }),
                  "stage the whole source to another destination");
  // A whole copy holds every range.
  stage(source, dir.path() + "/whole");
  const StageResult served = stage(source, dir.path() + "/whole", other);
  EXPECT_TRUE(served.already_complete);
  EXPECT_FALSE(served.partial);
}

TEST(Stage, ATimeRangeNeedsATimeDimensionItFits) {
  auto source = timed_hierarchy();
  TempDir dir;
  StageOptions options;
  options.time_range = {{3, 11}};
  EXPECT_CONTAINS(error_of<Error>([&] { stage(source, dir.path() + "/a", options); }),
                  "the time range [3, 11) passes the end of sh, which has 10 time steps");
  options.time_range = {{5, 5}};
  EXPECT_CONTAINS(error_of<Error>([&] { stage(source, dir.path() + "/b", options); }),
                  "the time range [5, 5) holds no step");
  options.time_range = {{0, 2}};
  options.time_dim = "valid_time";
  EXPECT_CONTAINS(error_of<Error>([&] { stage(source, dir.path() + "/c", options); }),
                  "no array of 2 or more dimensions has a first dimension named \"valid_time\" "
                  "(their first dimensions: \"lat\", \"time\"): name the time dimension");
}

TEST(Stage, APartialCopyOfAStoreThatCannotList) {
  auto source = timed_hierarchy();
  testing::TestServer server;
  auto remote = served(server, *source);
  TempDir dir;
  StageOptions options;
  options.time_range = {{3, 7}};
  const StageResult result = stage(remote, dir.path() + "/part", options);
  auto copy = open_store(dir.path() + "/part");
  EXPECT_EQ(read_steps(Array::open(copy, "sh"), 3, 7), read_steps(Array::open(source, "sh"), 3, 7));
  EXPECT_FALSE(make_file_store(dir.path() + "/part")->size("t2m/c/0/0/0"));
  // From the grid: t2m 3 chunks, w 2, sh 2, the coordinate's 4 and lsm's 1, and the metadata.
  EXPECT_EQ(result.copied, 3u + 2 + 2 + 4 + 1 + 6);
}

// A store that records the prefixes it is asked to list.
class ListRecordingStore final : public Store {
 public:
  explicit ListRecordingStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  std::optional<Bytes> get(std::string_view key, ByteRange range) const override {
    return inner_->get(key, range);
  }
  std::optional<uint64_t> size(std::string_view key) const override { return inner_->size(key); }
  void set(std::string_view key, ByteView value) override { inner_->set(key, value); }
  void erase(std::string_view key) override { inner_->erase(key); }
  std::vector<std::string> list(std::string_view prefix) const override {
    listed.emplace_back(prefix);
    return inner_->list(prefix);
  }
  std::vector<std::pair<std::string, uint64_t>> list_sizes(std::string_view prefix) const override {
    listed.emplace_back(prefix);
    return inner_->list_sizes(prefix);
  }
  std::string url() const override { return inner_->url(); }
  mutable std::vector<std::string> listed;

 private:
  std::shared_ptr<Store> inner_;
};

TEST(Stage, APartialCopyListsOnlyTheArraysItCopiesWhole) {
  // A cloud store of millions of chunks is not listed whole for a few of them: the time chunks
  // come from the grid, and only the other arrays (a coordinate, a static field) are listed.
  auto source = std::make_shared<ListRecordingStore>(timed_hierarchy());
  TempDir dir;
  StageOptions options;
  options.time_range = {{3, 7}};
  const StageResult result = stage(source, dir.path() + "/part", options);
  std::sort(source->listed.begin(), source->listed.end());
  EXPECT_EQ(source->listed, (std::vector<std::string>{"lsm/", "time/"}));
  EXPECT_EQ(result.missing, 0u);
  auto copy = open_store(dir.path() + "/part");
  EXPECT_EQ(read_steps(Array::open(copy, "w"), 3, 7), read_steps(Array::open(source, "w"), 3, 7));
}

TEST(Stage, APartialCopyStagedAgainIsPartialToo) {
  auto source = timed_hierarchy();
  TempDir dir;
  StageOptions part;
  part.time_range = {{3, 7}};
  stage(source, dir.path() + "/part", part);
  auto first = open_store(dir.path() + "/part");
  // Without a range: the copy's own steps (its other chunks are not there to copy).
  const StageResult again = stage(first, dir.path() + "/again");
  ASSERT_TRUE(again.partial);
  EXPECT_EQ(again.partial->start, 3u);
  EXPECT_EQ(again.partial->stop, 7u);
  auto second = open_store(dir.path() + "/again");
  EXPECT_EQ(read_steps(Array::open(second, "t2m"), 3, 7),
            read_steps(Array::open(source, "t2m"), 3, 7));
  EXPECT_CONTAINS(error_of<Error>([&] { read_steps(Array::open(second, "t2m"), 0, 1); }),
                  "is not in this partial staged copy");
  StageOptions inside;
  inside.time_range = {{4, 6}};
  const StageResult narrower = stage(first, dir.path() + "/narrower", inside);
  EXPECT_EQ(narrower.partial->start, 4u);
  StageOptions outside;
  outside.time_range = {{0, 6}};
  EXPECT_CONTAINS(error_of<Error>([&] { stage(first, dir.path() + "/outside", outside); }),
                  "the source is a partial staged copy holding time steps [3, 7) only, not time "
                  "steps [0, 6)");
}

TEST(Stage, AnArrayOfAPartialCopyOpenedByItsOwnPathRefusesTheStepsLeftOut) {
  auto source = timed_hierarchy();
  TempDir dir;
  StageOptions part;
  part.time_range = {{3, 7}};
  stage(source, dir.path() + "/part", part);
  auto array_dir = open_store(dir.path() + "/part/t2m");
  const Array t2m = Array::open(array_dir, "");
  EXPECT_EQ(read_steps(t2m, 3, 7), read_steps(Array::open(source, "t2m"), 3, 7));
  EXPECT_CONTAINS(error_of<Error>([&] { read_steps(t2m, 0, 1); }),
                  "/part/t2m: c/0/0/0: time chunk 0 (time steps 0 to 1) is not in this partial "
                  "staged copy");
  const auto held = staged_time_range(*array_dir);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->start, 3u);
  // An unfinished copy does not open by an array's path either.
  auto files = make_file_store(dir.path() + "/part");
  files->set(kStageRecord, as_bytes(R"({"source": "memory://", "complete": false})"));
  EXPECT_CONTAINS(error_of<Error>([&] { open_store(dir.path() + "/part/t2m"); }),
                  "part of an unfinished staged copy of memory:// (being made, or interrupted): "
                  "run `zfeed stage memory:// " +
                      dir.path() + "/part`");
}

TEST(Stage, AnUnfinishedCopyDoesNotOpen) {
  auto source = timed_hierarchy();
  TempDir dir;
  {
    FileStoreOptions create;
    create.create = true;
    make_file_store(dir.path() + "/part", create)
        ->set(kStageRecord, as_bytes(R"({"source": "s3://b/era5.zarr", "complete": false,
                                         "time_range": [3, 7], "time_dim": "valid_time"})"));
  }
  EXPECT_CONTAINS(error_of<Error>([&] { open_store(dir.path() + "/part"); }),
                  "an unfinished staged copy of s3://b/era5.zarr (being made, or interrupted): "
                  "run `zfeed stage s3://b/era5.zarr " +
                      dir.path() +
                      "/part --time 3:7 --time-dim valid_time` to finish it (it resumes)");
}

TEST(Stage, APartialCopyOfAZarrV2Group) {
  auto store = make_memory_store();
  Group::create(store, "", 2);
  for (const char* separator : {".", "/"}) {
    Json zarray = {
        {"zarr_format", 2},   {"shape", {6, 2}},       {"chunks", {4, 2}},
        {"dtype", "<f4"},     {"fill_value", nullptr}, {"order", "C"},
        {"filters", nullptr}, {"compressor", nullptr}, {"dimension_separator", separator}};
    const std::string name = separator[0] == '.' ? "dot" : "slash";
    fill_ramp(
        Array::create(store, name,
                      ArrayMetadata::parse_v2(zarray, Json{{"_ARRAY_DIMENSIONS", {"time", "x"}}})),
        0.5f);
  }
  TempDir dir;
  StageOptions options;
  options.time_range = {{4, 6}};
  stage(store, dir.path() + "/part", options);
  auto files = make_file_store(dir.path() + "/part");
  EXPECT_TRUE(files->size("dot/1.0"));
  EXPECT_FALSE(files->size("dot/0.0"));
  EXPECT_TRUE(files->size("slash/1/0"));
  EXPECT_FALSE(files->size("slash/0/0"));
  EXPECT_TRUE(files->size("dot/.zarray"));
  auto copy = open_store(dir.path() + "/part");
  std::vector<float> got(4), want(4);
  const Selection last{Slice{4, 6, 1}, Slice{0, 2, 1}};
  Array::open(copy, "slash").read(last, got.data());
  Array::open(store, "slash").read(last, want.data());
  EXPECT_EQ(got, want);
  EXPECT_CONTAINS(error_of<Error>([&] { read_all(Array::open(copy, "dot")); }),
                  "dot/0.0: time chunk 0 (time steps 0 to 3) is not in this partial staged copy");
}

}  // namespace
}  // namespace zfeed::zarr
