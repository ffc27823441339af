#include "zfeed/loader/loader.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "zfeed/codec/data_type.h"
#include "zfeed/store/http_store.h"
#include "zfeed/store/http_testing.h"
#include "zfeed/store/store_testing.h"
#include "zfeed/util/error.h"
#include "zfeed/util/fork_gate.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/group.h"

namespace zfeed::loader {
namespace {

using testing::error_of;

constexpr const char* kZstdCodecs = R"([{"name": "bytes", "configuration": {"endian": "little"}},
                                          {"name": "zstd", "configuration": {"level": 1}}])";
constexpr const char* kUncompressed =
    R"([{"name": "bytes", "configuration": {"endian": "little"}}])";
constexpr uint64_t kTimes = 12, kLat = 6, kLon = 8, kLevels = 3;

zarr::ArrayMetadata v3_metadata(const std::string& dtype, const std::vector<uint64_t>& shape,
                                const std::vector<uint64_t>& chunks, const Json& codecs,
                                const Json& attributes) {
  Json json = {{"zarr_format", 3},
               {"node_type", "array"},
               {"shape", shape},
               {"data_type", dtype},
               {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", chunks}}}}},
               {"chunk_key_encoding", {{"name", "default"}}},
               {"fill_value", 0},
               {"codecs", codecs},
               {"attributes", attributes}};
  return zarr::ArrayMetadata::parse_v3(json);
}

// Whole planes per chunk, `time_chunk` steps (and `level_chunk` levels) each.
// `named`: with dimension names (time, [level,] lat, lon).
zarr::ArrayMetadata meta(const std::string& dtype, std::vector<uint64_t> shape,
                         Json attributes = Json::object(), uint64_t time_chunk = 1,
                         uint64_t level_chunk = 1, const char* codecs = kZstdCodecs,
                         bool named = false) {
  std::vector<uint64_t> chunks = shape;
  chunks[0] = time_chunk;
  if (shape.size() == 4) chunks[1] = level_chunk;
  zarr::ArrayMetadata m = v3_metadata(dtype, shape, chunks, Json::parse(codecs), attributes);
  if (named) {
    m.dimension_names = shape.size() == 4
                            ? std::vector<std::optional<std::string>>{"time", "level", "lat", "lon"}
                            : std::vector<std::optional<std::string>>{"time", "lat", "lon"};
  }
  return m;
}

double value_of(int variable, uint64_t t, uint64_t level, uint64_t y, uint64_t x) {
  return 100.0 * variable + 10.0 * t + 3.0 * level + 0.25 * y + 0.0625 * x +
         (t * 7 + y * 3 + x) % 5 * 0.1;
}

// A small ERA5-like group: t2m float32 (time, lat, lon) without stats, z float64 (time, level,
// lat, lon) with per-level zfeed_stats, q int16 (time, lat, lon) with scalar stats.
// With time_chunk > 1 (or level_chunk > 1) the arrays' chunks hold several planes, so the loader
// reads them through its decoded-chunk cache.
std::shared_ptr<Store> make_store(uint64_t time_chunk = 1, uint64_t level_chunk = 1,
                                  const char* codecs = kZstdCodecs,
                                  std::shared_ptr<Store> store = make_memory_store(),
                                  bool named = false) {
  zarr::Group::create(store, "");
  auto t2m = zarr::Array::create(
      store, "t2m",
      meta("float32", {kTimes, kLat, kLon}, Json::object(), time_chunk, 1, codecs, named));
  auto z = zarr::Array::create(
      store, "z",
      meta("float64", {kTimes, kLevels, kLat, kLon},
           Json{{"zfeed_stats", {{"mean", {1000.0, 1003.0, 1006.0}}, {"std", {2.0, 4.0, 8.0}}}}},
           time_chunk, level_chunk, codecs, named));
  auto q = zarr::Array::create(
      store, "q",
      meta("int16", {kTimes, kLat, kLon}, Json::object(), time_chunk, 1, codecs, named));
  q.set_attributes(Json{{"zfeed_stats", {{"mean", 250.0}, {"std", 3.0}}}});
  std::vector<float> a(kTimes * kLat * kLon);
  std::vector<double> b(kTimes * kLevels * kLat * kLon);
  std::vector<int16_t> c(kTimes * kLat * kLon);
  for (uint64_t t = 0; t < kTimes; ++t) {
    for (uint64_t y = 0; y < kLat; ++y) {
      for (uint64_t x = 0; x < kLon; ++x) {
        const uint64_t i = (t * kLat + y) * kLon + x;
        a[i] = static_cast<float>(value_of(0, t, 0, y, x));
        c[i] = static_cast<int16_t>(std::lround(value_of(2, t, 0, y, x)));
        for (uint64_t l = 0; l < kLevels; ++l)
          b[((t * kLevels + l) * kLat + y) * kLon + x] = value_of(1, t, l, y, x);
      }
    }
  }
  t2m.write(t2m.full_selection(), a.data());
  z.write(z.full_selection(), b.data());
  q.write(q.full_selection(), c.data());
  return store;
}

VariableSpec var(std::string name, std::vector<uint64_t> levels = {}) {
  VariableSpec v;
  v.name = std::move(name);
  v.levels = std::move(levels);
  return v;
}

LoaderSpec base_spec(std::shared_ptr<Store> store) {
  LoaderSpec spec;
  spec.store = std::move(store);
  spec.inputs = {var("t2m"), var("z", {2, 0}), var("q")};
  spec.targets = {var("t2m"), var("q")};
  spec.batch_size = 3;
  spec.seed = 11;
  return spec;
}

// The expected channel plane: read directly with Array::read, cast and normalized as documented.
std::vector<float> expected_plane(const std::shared_ptr<Store>& store, const Channel& channel,
                                  uint64_t time, const std::optional<Crop>& crop = std::nullopt) {
  auto array = zarr::Array::open(store, channel.variable);
  const auto& m = array.metadata();
  zarr::Selection selection{{time, time + 1, 1}};
  if (channel.level) selection.push_back({*channel.level, *channel.level + 1, 1});
  Crop c = crop.value_or(Crop{0, kLat, 0, kLon});
  selection.push_back({c.lat_start, c.lat_start + c.lat_size, 1});
  selection.push_back({c.lon_start, c.lon_start + c.lon_size, 1});
  const size_t n = c.lat_size * c.lon_size;
  std::vector<uint8_t> raw(n * m.dtype.size());
  array.read(selection, raw.data());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    float v = 0;
    if (m.dtype.id == DataTypeId::kFloat32) std::memcpy(&v, &raw[i * 4], 4);
    if (m.dtype.id == DataTypeId::kFloat64) {
      double d;
      std::memcpy(&d, &raw[i * 8], 8);
      v = static_cast<float>(d);
    }
    if (m.dtype.id == DataTypeId::kInt16) {
      int16_t s;
      std::memcpy(&s, &raw[i * 2], 2);
      v = static_cast<float>(s);
    }
    if (channel.normalized) v = (v - channel.mean) / channel.std;
    out[i] = v;
  }
  return out;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

void check_batch(const std::shared_ptr<Store>& store, const Loader& loader, const Batch& batch) {
  const auto in = loader.input_shape(), out = loader.target_shape();
  const size_t plane = in[2] * in[3];
  for (uint64_t i = 0; i < batch.size; ++i) {
    const auto t = static_cast<uint64_t>(batch.times()[i]);
    const auto origin = loader.crop_origin(batch.epoch, t);
    EXPECT_EQ(batch.crops()[2 * i], static_cast<int64_t>(origin[0]));
    EXPECT_EQ(batch.crops()[2 * i + 1], static_cast<int64_t>(origin[1]));
    const std::optional<Crop> crop = Crop{origin[0], in[2], origin[1], in[3]};
    for (size_t c = 0; c < in[1]; ++c) {
      const Channel& ch = loader.input_channels()[c];
      auto want = expected_plane(store, ch, t + ch.time_offset, crop);
      EXPECT_TRUE(same_bits(batch.inputs() + (i * in[1] + c) * plane, want.data(), plane))
          << "sample " << i << " time " << t << " input channel " << c;
    }
    for (size_t c = 0; c < out[1]; ++c) {
      const Channel& ch = loader.target_channels()[c];
      auto want = expected_plane(store, ch, t + ch.time_offset, crop);
      EXPECT_TRUE(same_bits(batch.targets() + (i * out[1] + c) * plane, want.data(), plane))
          << "sample " << i << " time " << t << " target channel " << c;
    }
  }
}

TEST(Loader, ChannelsFollowTheSpec) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.history = 2;
  spec.lead = 3;
  Loader loader(spec);
  ASSERT_EQ(loader.input_channels().size(), 8u);  // 2 steps x (t2m, z@2, z@0, q)
  EXPECT_EQ(loader.input_channels()[1].variable, "z");
  EXPECT_EQ(loader.input_channels()[1].level, 2u);
  EXPECT_EQ(loader.input_channels()[1].time_offset, -1);
  EXPECT_EQ(loader.input_channels()[5].time_offset, 0);
  EXPECT_FALSE(loader.input_channels()[0].normalized);  // t2m has no stats
  EXPECT_TRUE(loader.input_channels()[1].normalized);
  EXPECT_EQ(loader.input_channels()[1].mean, 1006.0f);  // z's level 2 from zfeed_stats
  EXPECT_EQ(loader.input_channels()[1].std, 8.0f);
  EXPECT_EQ(loader.input_channels()[3].mean, 250.0f);
  EXPECT_EQ(loader.target_channels()[0].time_offset, 3);
  EXPECT_EQ(loader.num_samples(), kTimes - 1 - 3);  // t in [1, 8]
  EXPECT_EQ(loader.input_shape(), (std::array<uint64_t, 4>{3, 8, kLat, kLon}));
  EXPECT_EQ(loader.target_shape(), (std::array<uint64_t, 4>{3, 2, kLat, kLon}));
}

TEST(Loader, BatchesEqualDirectReadsNormalized) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.history = 2;
  spec.drop_last = false;
  Loader loader(spec);
  std::multiset<int64_t> times;
  uint64_t batches = 0;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->index, batches++);
    check_batch(store, loader, *batch);
    for (uint64_t i = 0; i < batch->size; ++i) times.insert(batch->times()[i]);
  }
  EXPECT_EQ(batches, loader.batches_per_epoch());
  std::multiset<int64_t> all;
  for (int64_t t = 1; t + 1 < static_cast<int64_t>(kTimes); ++t) all.insert(t);
  EXPECT_EQ(times, all);
  EXPECT_FALSE(loader.next());
  auto stats = loader.stats();
  EXPECT_EQ(stats.batches, batches);
  EXPECT_EQ(stats.samples, all.size());
  EXPECT_GT(stats.bytes_decoded, 0u);
  EXPECT_EQ(stats.bytes_delivered, all.size() * (8 + 2) * kLat * kLon * 4);
}

TEST(Loader, LeadZeroAndCrop) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.lead = 0;
  spec.crop = Crop{1, 4, 2, 5};
  spec.normalize = false;
  Loader loader(spec);
  EXPECT_EQ(loader.num_samples(), kTimes);
  EXPECT_EQ(loader.input_shape(), (std::array<uint64_t, 4>{3, 4, 4, 5}));
  EXPECT_FALSE(loader.input_channels()[3].normalized);
  while (auto batch = loader.next()) check_batch(store, loader, *batch);
}

TEST(Loader, GivenStatisticsOverrideTheAttribute) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.inputs[0].mean = {280.5};
  spec.inputs[0].std = {3.25};
  spec.inputs[1].mean = {1.0, 2.0};
  spec.inputs[1].std = {0.5, 0.25};
  Loader loader(spec);
  EXPECT_EQ(loader.input_channels()[0].mean, 280.5f);
  EXPECT_EQ(loader.input_channels()[2].std, 0.25f);
  auto batch = loader.next();
  ASSERT_TRUE(batch);
  check_batch(store, loader, *batch);
}

std::vector<std::vector<float>> drain(Loader& loader) {
  std::vector<std::vector<float>> out;
  while (auto batch = loader.next()) {
    const auto in = loader.input_shape(), tg = loader.target_shape();
    std::vector<float> v(batch->inputs(), batch->inputs() + batch->size * in[1] * in[2] * in[3]);
    v.insert(v.end(), batch->targets(), batch->targets() + batch->size * tg[1] * tg[2] * tg[3]);
    for (uint64_t i = 0; i < batch->size; ++i) v.push_back(static_cast<float>(batch->times()[i]));
    out.push_back(std::move(v));
  }
  return out;
}

TEST(Loader, ResumeYieldsTheRemainingBatchesBitForBit) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.batch_size = 2;
  spec.epoch = 3;
  spec.world_size = 2;
  spec.rank = 1;
  Loader full(spec);
  auto all = drain(full);
  ASSERT_EQ(all.size(), full.batches_per_epoch());
  for (uint64_t k : {0ull, 1ull, 2ull, all.size() * 1ull}) {
    Loader first(spec);
    for (uint64_t i = 0; i < k; ++i) ASSERT_TRUE(first.next());
    Json state = first.state();
    EXPECT_EQ(state["epoch"], 3);
    EXPECT_EQ(state["batch"], k);
    auto other = spec;
    other.seed = 999;  // the state's seed wins
    Loader resumed(other);
    resumed.restore(Json::parse(state.dump()));
    auto rest = drain(resumed);
    ASSERT_EQ(rest.size(), all.size() - k);
    for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], all[k + i]) << "batch " << k + i;
  }
  // The next epoch differs in order; set_epoch to the current epoch keeps the position.
  Loader loader(spec);
  ASSERT_TRUE(loader.next());
  loader.set_epoch(3);
  EXPECT_EQ(loader.position(), 1u);
  loader.set_epoch(4);
  EXPECT_EQ(loader.position(), 0u);
  const auto epoch4 = drain(loader);
  EXPECT_NE(epoch4, all);
  // An epoch that is over starts again when set again (a validation loader set to its epoch
  // before each evaluation); without set_epoch, iterating again moves on.
  loader.set_epoch(4);
  EXPECT_EQ(drain(loader), epoch4);
  loader.begin_iteration();
  EXPECT_EQ(loader.epoch(), 5u);
}

TEST(Loader, RestoreRejectsAnotherLayout) {
  auto store = make_store();
  auto spec = base_spec(store);
  Loader loader(spec);
  Json state = loader.state();
  spec.world_size = 2;
  Loader other(spec);
  EXPECT_CONTAINS(error_of([&] { other.restore(state); }), "world_size 1, this loader has 2");
  state["version"] = 7;
  EXPECT_CONTAINS(error_of([&] { loader.restore(state); }), "not a zfeed loader state");
}

TEST(Loader, BuffersAreReusedWithinTheBound) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.batch_size = 1;
  spec.prefetch = 2;
  Loader loader(spec);
  std::set<const float*> addresses;
  for (int epoch = 0; epoch < 4; ++epoch) {
    loader.begin_iteration();
    while (auto batch = loader.next()) addresses.insert(batch->inputs());
  }
  EXPECT_EQ(loader.epoch(), 3u);
  EXPECT_LE(addresses.size(), 3u);
  EXPECT_EQ(loader.stats().buffers, 3u);
  EXPECT_EQ(loader.stats().batches, 4 * loader.batches_per_epoch());
}

TEST(Loader, AConsumerKeepingEveryBatchDoesNotDeadlock) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.batch_size = 1;
  spec.prefetch = 1;
  Loader loader(spec);
  std::vector<Batch> kept;
  while (auto batch = loader.next()) kept.push_back(*batch);
  EXPECT_EQ(kept.size(), loader.batches_per_epoch());
  std::set<const float*> addresses;
  for (const auto& b : kept) addresses.insert(b.inputs());
  EXPECT_EQ(addresses.size(), kept.size());  // none was overwritten while held
  for (const auto& b : kept) check_batch(store, loader, b);
}

TEST(Loader, ReadErrorsSurfaceFromNext) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.shuffle = false;
  spec.batch_size = 2;
  store->set("q/c/5/0/0", ByteView(reinterpret_cast<const uint8_t*>("garbage!"), 8));
  Loader loader(spec);
  ASSERT_TRUE(loader.next());                                      // t = 0, 1
  ASSERT_TRUE(loader.next());                                      // t = 2, 3
  EXPECT_CONTAINS(error_of([&] { loader.next(); }), "q/c/5/0/0");  // t = 4, 5
  EXPECT_EQ(loader.position(), 2u);
  EXPECT_CONTAINS(error_of([&] { loader.next(); }), "q/c/5/0/0");  // retried, fails again
}

TEST(Loader, ErrorsNameTheProblem) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.inputs.push_back(var("nope"));
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { Loader{spec}; }),
                  "input variable 'nope' not found");
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "it holds: q, t2m, z");

  zarr::Array::create(store, "small", meta("float32", {kTimes, kLat, kLon - 1}));
  spec = base_spec(store);
  spec.targets.push_back(var("small"));
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }),
                  "'small' has shape (12, 6, 7) but 't2m' has (12, 6, 8)");

  spec = base_spec(store);
  spec.inputs[0].levels = {1};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "'t2m' has no level dimension");
  spec = base_spec(store);
  spec.inputs[1].levels = {3};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "level 3 is out of range");
  spec = base_spec(store);
  spec.lead = 12;
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "no valid samples");
  spec = base_spec(store);
  spec.crop = Crop{0, 7, 0, 8};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "does not fit the 6 x 8 grid");
  spec = base_spec(store);
  spec.inputs[0].mean = {1.0};
  spec.inputs[0].std = {0.0};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "std must be positive");
}

TEST(Loader, ChunksOfSeveralStepsAreDecodedOncePerEpochAndEqualDirectReads) {
  auto store = make_store(/*time_chunk=*/5, /*level_chunk=*/3);
  auto spec = base_spec(store);
  spec.drop_last = false;
  Loader loader(spec);
  EXPECT_EQ(loader.order(), "chunks");
  EXPECT_EQ(loader.sampler().options().group_size, 5u);
  EXPECT_GT(loader.cache_budget(), 0u);
  std::multiset<int64_t> times;
  while (auto batch = loader.next()) {
    check_batch(store, loader, *batch);
    for (uint64_t i = 0; i < batch->size; ++i) times.insert(batch->times()[i]);
  }
  EXPECT_EQ(times.size(), kTimes - 1);
  // 3 arrays x 3 time chunks (z: one level chunk), each decoded once in the epoch.
  EXPECT_EQ(loader.stats().chunks_decoded, 9u);
  EXPECT_GT(loader.stats().cache_hits, 0u);

  // The same samples in a random order re-decode chunks, and give the same values.
  spec.order = "random";
  Loader random(spec);
  EXPECT_EQ(random.order(), "random");
  while (auto batch = random.next()) check_batch(store, random, *batch);
}

// A time range: every sample's inputs (history included) and targets lie in it, each sample once
// per epoch, in both orders; resumes within it; ranges as Python slices take them.
TEST(Loader, TimeRangeKeepsEverySampleInside) {
  for (uint64_t time_chunk : {1ull, 5ull}) {
    auto store = make_store(time_chunk);
    auto spec = base_spec(store);
    spec.history = 2;
    spec.batch_size = 2;
    spec.drop_last = false;
    spec.time_range = {3, 11};
    Loader loader(spec);
    EXPECT_EQ(loader.order(), time_chunk > 1 ? "chunks" : "random");
    std::multiset<int64_t> times;
    while (auto batch = loader.next()) {
      check_batch(store, loader, *batch);
      for (uint64_t i = 0; i < batch->size; ++i) times.insert(batch->times()[i]);
    }
    // t - 1 >= 3 and t + 1 < 11.
    EXPECT_EQ(times, (std::multiset<int64_t>{4, 5, 6, 7, 8, 9})) << "time chunk " << time_chunk;

    Loader full(spec);
    auto all = drain(full);
    Loader first(spec);
    ASSERT_TRUE(first.next());
    const Json state = first.state();
    EXPECT_EQ(state["time_start"], 3);
    Loader resumed(spec);
    resumed.restore(state);
    auto rest = drain(resumed);
    ASSERT_EQ(rest.size(), all.size() - 1);
    for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], all[i + 1]);
    // Another range of as many samples is another sample set.
    auto shifted = spec;
    shifted.time_range = {4, 12};
    Loader other(shifted);
    EXPECT_CONTAINS(error_of([&] { other.restore(state); }), "time_start 3, this loader has 4");
  }
  auto store = make_store();
  auto spec = base_spec(store);
  spec.drop_last = false;
  spec.time_range = {std::nullopt, -2};  // [0, 10): t + 1 < 10
  Loader open_start(spec);
  std::set<int64_t> times;
  while (auto batch = open_start.next())
    for (uint64_t i = 0; i < batch->size; ++i) times.insert(batch->times()[i]);
  EXPECT_EQ(times, (std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  spec.time_range = {-3, std::nullopt};  // [9, 12)
  Loader open_stop(spec);
  EXPECT_EQ(open_stop.sampler().options().num_samples, 2u);
  spec.history = 2;
  spec.time_range = {5, 7};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }),
                  "no valid samples: time_range [5, 7) holds 2 of the 12 time steps with history 2 "
                  "and lead 1 (a sample spans 3 time steps)");
  spec.time_range = {};
  spec.lead = UINT64_MAX;  // history + lead must not wrap around to 1
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "no valid samples: 12 time steps");
  spec.lead = 1;
  spec.time_range = {20, 30};  // clamped to [12, 12)
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "time_range [12, 12) holds 0 of the 12");
  EXPECT_CONTAINS(error_of([&] {
                    LoaderSpec::from_json(store,
                                          Json::parse(R"({"inputs": ["t2m"], "time_range": [1]})"));
                  }),
                  "time_range is [start, stop]");
  EXPECT_CONTAINS(error_of([&] {
                    LoaderSpec::from_json(
                        store, Json::parse(R"({"inputs": ["t2m"], "time_range": [1, 2.5]})"));
                  }),
                  "of integers");
  const LoaderSpec parsed =
      LoaderSpec::from_json(store, Json::parse(R"({"inputs": ["t2m"], "time_range": [null, -4]})"));
  EXPECT_FALSE(parsed.time_range[0]);
  EXPECT_EQ(parsed.time_range[1], -4);
}

// With a cache smaller than the dataset, a chunk needed as a neighbor (the target step after a
// chunk's last sample) long before or after its own samples is read plane by plane and not
// cached, so that every chunk is decoded whole once in the epoch; batches stay exact.
TEST(Loader, ChunksNeededOnlyAsNeighborsAreReadAloneAndDecodedWholeOnce) {
  auto store = make_store(/*time_chunk=*/2);
  auto spec = base_spec(store);
  spec.drop_last = false;
  {
    Loader everything_fits(spec);
    while (auto batch = everything_fits.next()) check_batch(store, everything_fits, *batch);
    EXPECT_EQ(everything_fits.stats().planes_read_alone, 0u);
    spec.cache_bytes = everything_fits.cache_budget() / 2;  // 3 of the 6 time chunks
  }
  uint64_t read_alone = 0;
  for (uint64_t epoch : {0, 1, 2}) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    spec.epoch = epoch;
    Loader loader(spec);
    while (auto batch = loader.next()) check_batch(store, loader, *batch);
    // 6 time chunks of t2m and q, and of z's levels 0 and 2 (one chunk per level), once each
    // (read_cached without reads alone decoded 25 to 27 here).
    EXPECT_EQ(loader.stats().chunks_decoded, 6u * 4);
    read_alone += loader.stats().planes_read_alone;
  }
  EXPECT_GT(read_alone, 0u);
}

// Uncompressed planes are read by byte range straight into the batch, costing no more than a
// copy out of a cache would: such arrays skip the cache, and "auto" keeps a plain shuffle.
TEST(Loader, UncompressedPlanesAreReadByRangeWithoutTheCache) {
  testing::TempDir folder;
  auto store = make_store(/*time_chunk=*/4, /*level_chunk=*/3, kUncompressed,
                          make_file_store(folder.path()));  // a file store counts bytes read
  auto spec = base_spec(store);
  spec.drop_last = false;
  for (const std::string order : {"auto", "chunks"}) {
    SCOPED_TRACE(order);
    spec.order = order;
    Loader loader(spec);
    EXPECT_EQ(loader.order(), order == "auto" ? "random" : "chunks");
    EXPECT_EQ(loader.cache_budget(), 0u);
    uint64_t planes = 0;
    while (auto batch = loader.next()) {
      check_batch(store, loader, *batch);
      planes += batch->size * (loader.input_shape()[1] + loader.target_shape()[1]);
    }
    const auto stats = loader.stats();
    EXPECT_EQ(stats.chunks_decoded, 0u);
    EXPECT_EQ(stats.cache_hits, 0u);
    // Only the planes delivered were read (t2m float32, z float64 at 2 levels, q int16; targets
    // t2m and q): nothing else of their chunks.
    const uint64_t per_sample = (4 + 2 * 8 + 2 + 4 + 2) * kLat * kLon;
    EXPECT_EQ(stats.bytes_read, stats.samples * per_sample);
    EXPECT_EQ(planes, stats.samples * 6);
  }
}

// History reaching back into the previous chunk needs that chunk's last steps: decoding its start
// up to them, once per piece, would cost more than the whole chunk, so those go through the cache.
TEST(Loader, HistoryReachingIntoThePreviousChunkIsNotReadAlone) {
  auto store = make_store(/*time_chunk=*/4);
  auto spec = base_spec(store);
  spec.history = 3;
  spec.lead = 0;
  spec.drop_last = false;
  {
    Loader sizing(spec);
    spec.cache_bytes = sizing.cache_budget() / 6;  // small: the previous chunk is often gone
  }
  for (uint64_t epoch : {0, 1, 2}) {
    spec.epoch = epoch;
    Loader loader(spec);
    while (auto batch = loader.next()) check_batch(store, loader, *batch);
    EXPECT_EQ(loader.stats().planes_read_alone, 0u) << "epoch " << epoch;
  }
}

// Random layouts (chunks along every dimension, edge chunks, codecs, shards) and random specs
// (history, lead, crops, batch size, order, cache budget, epoch): every plane of every batch
// equals the values written, computed independently of Array::read, to the bit.
TEST(Loader, RandomLayoutsAndSpecsDeliverTheWrittenValues) {
  const std::vector<std::string> inner_codecs = {
      kZstdCodecs, kUncompressed,
      R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}])",
      R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"},
          {"name": "crc32c"}])"};
  uint64_t read_alone = 0, cache_hits = 0;
  for (uint32_t seed = 0; seed < 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto pick = [&](uint64_t low, uint64_t high) {
      return std::uniform_int_distribution<uint64_t>(low, high)(rng);
    };
    // The layout: t2m (time, lat, lon) float32 without stats, z (time, level, lat, lon) float64
    // with per-level stats.
    const uint64_t time_chunk = pick(1, 4), level_chunk = pick(1, 3);
    const uint64_t lat_chunk = std::vector<uint64_t>{6, 4, 3}[pick(0, 2)];
    const uint64_t lon_chunk = std::vector<uint64_t>{8, 5, 3}[pick(0, 2)];
    const std::string codecs = inner_codecs[pick(0, inner_codecs.size() - 1)];
    const bool sharded = pick(0, 2) == 0;
    SCOPED_TRACE("chunks " + std::to_string(time_chunk) + "/" + std::to_string(level_chunk) + "/" +
                 std::to_string(lat_chunk) + "/" + std::to_string(lon_chunk) +
                 (sharded ? " sharded " : " ") + codecs);
    auto store = make_memory_store();
    zarr::Group::create(store, "");
    auto create = [&](const std::string& name, const std::string& dtype,
                      std::vector<uint64_t> shape, Json attributes) {
      std::vector<uint64_t> chunks = {time_chunk, lat_chunk, lon_chunk};
      if (shape.size() == 4) chunks.insert(chunks.begin() + 1, level_chunk);
      Json chain = Json::parse(codecs);
      std::vector<uint64_t> grid = chunks;
      if (sharded) {
        grid[0] *= 2;  // two inner chunks along time per shard
        chain = Json::array({{{"name", "sharding_indexed"},
                              {"configuration", {{"chunk_shape", chunks}, {"codecs", chain}}}}});
      }
      return zarr::Array::create(store, name, v3_metadata(dtype, shape, grid, chain, attributes));
    };
    auto t2m = create("t2m", "float32", {kTimes, kLat, kLon}, Json::object());
    // Some cases hold missing values (NaN) in t2m, a static field (lat, lon), several leads.
    const bool nans = pick(0, 1) == 1, with_static = pick(0, 1) == 1;
    auto missing = [&](uint64_t t, uint64_t y, uint64_t x) { return nans && (t + y + x) % 7 == 0; };
    if (with_static) {
      auto orog = zarr::Array::create(
          store, "orog",
          v3_metadata("float32", {kLat, kLon}, {lat_chunk, lon_chunk}, Json::parse(codecs),
                      Json{{"zfeed_stats", {{"mean", 5.0}, {"std", 2.0}}}}));
      std::vector<float> c(kLat * kLon);
      for (uint64_t y = 0; y < kLat; ++y)
        for (uint64_t x = 0; x < kLon; ++x)
          c[y * kLon + x] = static_cast<float>(value_of(2, 0, 0, y, x));
      orog.write(orog.full_selection(), c.data());
    }
    auto z = create(
        "z", "float64", {kTimes, kLevels, kLat, kLon},
        Json{{"zfeed_stats", {{"mean", {1000.0, 1003.0, 1006.0}}, {"std", {2.0, 4.0, 8.0}}}}});
    std::vector<float> a(kTimes * kLat * kLon);
    std::vector<double> b(kTimes * kLevels * kLat * kLon);
    for (uint64_t t = 0; t < kTimes; ++t) {
      for (uint64_t y = 0; y < kLat; ++y) {
        for (uint64_t x = 0; x < kLon; ++x) {
          a[(t * kLat + y) * kLon + x] =
              missing(t, y, x) ? std::nanf("") : static_cast<float>(value_of(0, t, 0, y, x));
          for (uint64_t l = 0; l < kLevels; ++l)
            b[((t * kLevels + l) * kLat + y) * kLon + x] = value_of(1, t, l, y, x);
        }
      }
    }
    t2m.write(t2m.full_selection(), a.data());
    z.write(z.full_selection(), b.data());

    // The spec.
    LoaderSpec spec;
    spec.store = store;
    std::vector<uint64_t> levels = {0, 1, 2};
    std::shuffle(levels.begin(), levels.end(), rng);
    levels.resize(pick(1, 3));
    spec.inputs = {var("t2m"), var("z", levels)};
    if (with_static) spec.inputs.insert(spec.inputs.begin() + pick(0, 2), var("orog"));
    if (nans && pick(0, 1)) spec.fill_nan = -1.25f;
    spec.targets = pick(0, 1) ? std::vector<VariableSpec>{var("z", {levels[0]})}
                              : std::vector<VariableSpec>{var("t2m"), var("z", levels)};
    spec.history = pick(1, 3);
    if (pick(0, 2) == 0) spec.history_step = pick(2, 3);
    spec.lead = pick(0, 2);
    if (pick(0, 1)) {
      spec.leads = {0, 1, 2, 3};
      std::shuffle(spec.leads.begin(), spec.leads.end(), rng);
      spec.leads.resize(pick(1, 3));
    }
    switch (pick(0, 2)) {
      case 1: {
        const uint64_t lat_size = pick(1, kLat), lon_size = pick(1, kLon);
        spec.crop = Crop{pick(0, kLat - lat_size), lat_size, pick(0, kLon - lon_size), lon_size};
        break;
      }
      case 2:
        spec.random_crop = std::array<uint64_t, 2>{pick(1, kLat), pick(1, kLon)};
        break;
    }
    spec.batch_size = pick(1, 5);
    spec.drop_last = pick(0, 1) == 1;
    spec.order = std::vector<std::string>{"auto", "random", "chunks"}[pick(0, 2)];
    if (pick(0, 1)) spec.cache_bytes = pick(0, 3) * lat_chunk * lon_chunk * time_chunk * 8;
    spec.prefetch = pick(1, 3);
    spec.seed = seed;
    spec.epoch = pick(0, 2);

    Loader loader(spec);
    const auto in = loader.input_shape(), out = loader.target_shape();
    const size_t plane = in[2] * in[3];
    auto check = [&](const float* got, const Channel& channel, uint64_t time,
                     std::array<uint64_t, 2> origin, const std::string& what) {
      const int variable = channel.variable == "t2m" ? 0 : channel.variable == "z" ? 1 : 2;
      if (channel.is_static) time = 0;
      size_t wrong = 0;
      for (uint64_t y = 0; y < in[2]; ++y) {
        for (uint64_t x = 0; x < in[3]; ++x) {
          const uint64_t at_y = origin[0] + y, at_x = origin[1] + x;
          const double stored =
              variable == 0 && missing(time, at_y, at_x)
                  ? std::nan("")
                  : value_of(variable, time, channel.level.value_or(0), at_y, at_x);
          float want = static_cast<float>(stored);
          if (channel.normalized) want = (want - channel.mean) / channel.std;
          if (channel.fill_nan && std::isnan(want)) want = channel.nan_value;
          wrong += std::memcmp(&want, &got[y * in[3] + x], sizeof(float)) != 0;
        }
      }
      EXPECT_EQ(wrong, 0u) << what;
    };
    uint64_t samples = 0;
    while (auto batch = loader.next()) {
      for (uint64_t i = 0; i < batch->size; ++i, ++samples) {
        const auto t = static_cast<uint64_t>(batch->times()[i]);
        const auto origin = loader.crop_origin(batch->epoch, t);
        for (size_t c = 0; c < in[1]; ++c) {
          const Channel& channel = loader.input_channels()[c];
          check(batch->inputs() + (i * in[1] + c) * plane, channel, t + channel.time_offset, origin,
                "time " + std::to_string(t) + " input " + std::to_string(c));
        }
        for (size_t c = 0; c < out[1]; ++c) {
          const Channel& channel = loader.target_channels()[c];
          check(batch->targets() + (i * out[1] + c) * plane, channel, t + channel.time_offset,
                origin, "time " + std::to_string(t) + " target " + std::to_string(c));
        }
      }
    }
    const uint64_t all = loader.num_samples();
    EXPECT_EQ(samples, spec.drop_last ? all / spec.batch_size * spec.batch_size : all);
    read_alone += loader.stats().planes_read_alone;
    cache_hits += loader.stats().cache_hits;
    if (::testing::Test::HasFailure()) break;  // one failing case says enough
  }
  // The cases reach the cache and the reads alone.
  EXPECT_GT(read_alone, 0u);
  EXPECT_GT(cache_hits, 0u);
}

TEST(Loader, LevelChunksGoThroughTheCacheWithoutTimeChunks) {
  auto store = make_store(/*time_chunk=*/1, /*level_chunk=*/3);
  auto spec = base_spec(store);
  Loader loader(spec);
  EXPECT_EQ(loader.order(), "random");
  EXPECT_EQ(loader.cache_budget(), 0u);
  while (auto batch = loader.next()) check_batch(store, loader, *batch);
}

TEST(Loader, RandomCropsFollowTheSeedAndEpoch) {
  auto store = make_store(/*time_chunk=*/4);
  auto spec = base_spec(store);
  spec.random_crop = std::array<uint64_t, 2>{4, 5};
  Loader loader(spec);
  EXPECT_EQ(loader.input_shape(), (std::array<uint64_t, 4>{3, 4, 4, 5}));
  std::set<std::array<uint64_t, 2>> origins;
  while (auto batch = loader.next()) {
    check_batch(store, loader, *batch);
    for (uint64_t i = 0; i < batch->size; ++i)
      origins.insert(loader.crop_origin(0, static_cast<uint64_t>(batch->times()[i])));
  }
  EXPECT_GT(origins.size(), 1u);
  for (const auto& o : origins) {
    EXPECT_LE(o[0], kLat - 4);
    EXPECT_LE(o[1], kLon - 5);
  }
  Loader same(spec);
  EXPECT_EQ(same.crop_origin(0, 5), loader.crop_origin(0, 5));
  bool differs = false;
  for (uint64_t t = 0; t < kTimes; ++t)
    differs |= loader.crop_origin(1, t) != loader.crop_origin(0, t);
  EXPECT_TRUE(differs);
  spec.crop = Crop{0, 2, 0, 2};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "crop or random_crop, not both");
  spec.crop.reset();
  spec.random_crop = std::array<uint64_t, 2>{7, 2};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "does not fit the 6 x 8 grid");
}

TEST(Loader, HalfPrecisionBatchesRoundTheFloat32Values) {
  for (OutputType type : {OutputType::kFloat16, OutputType::kBFloat16}) {
    auto store = make_store(/*time_chunk=*/3);
    auto spec = base_spec(store);
    spec.dtype = type;
    Loader loader(spec);
    auto spec32 = spec;
    spec32.dtype = OutputType::kFloat32;
    Loader reference(spec32);
    const auto in = loader.input_shape();
    while (auto batch = loader.next()) {
      auto want = reference.next();
      ASSERT_TRUE(want);
      const size_t n = batch->size * in[1] * in[2] * in[3];
      for (size_t i = 0; i < n; ++i) {
        uint16_t got;
        std::memcpy(&got, batch->input_bytes() + 2 * i, 2);
        const float value = want->inputs()[i];
        const uint16_t expected = type == OutputType::kFloat16 ? float_to_float16_bits(value)
                                                               : float_to_bfloat16_bits(value);
        ASSERT_EQ(got, expected) << output_name(type) << " element " << i;
      }
    }
  }
}

// The GPU path's split (cuda::DeviceLoader): with defer_normalization the host assembles the
// float32 values un-normalized, and applying each channel's normalization and the cast to them,
// as the device kernel does with loader/cast.h's code, gives the CPU path's batch bit for bit.
TEST(Loader, DeferredNormalizationThenTheCastEqualsTheCpuPath) {
  for (OutputType type : {OutputType::kFloat32, OutputType::kFloat16, OutputType::kBFloat16}) {
    auto store = make_store(/*time_chunk=*/2);
    auto spec = base_spec(store);
    spec.dtype = type;
    Loader reference(spec);
    spec.defer_normalization = true;
    Loader deferred(spec);
    EXPECT_EQ(deferred.input_type(), type);
    EXPECT_EQ(deferred.assembled_input_type(), OutputType::kFloat32);
    EXPECT_EQ(deferred.assembled_target_type(), OutputType::kFloat32);
    const auto in = deferred.input_shape(), out = deferred.target_shape();
    const size_t plane = in[2] * in[3];
    auto check = [&](const uint8_t* raw, const uint8_t* want, uint64_t planes, uint64_t channels,
                     const std::vector<Channel>& meta) {
      const size_t size = output_size(type);
      for (uint64_t p = 0; p < planes; ++p) {
        const Normalization normalization = meta[p % channels].deferred_normalization();
        for (size_t k = 0; k < plane; ++k) {
          float value;
          std::memcpy(&value, raw + 4 * (p * plane + k), 4);
          uint8_t stored[8] = {};
          store_value(normalization.apply(value), type, stored);
          ASSERT_EQ(std::memcmp(stored, want + size * (p * plane + k), size), 0)
              << output_name(type) << " plane " << p << " element " << k;
        }
      }
    };
    uint64_t batches = 0;
    while (auto batch = deferred.next()) {
      auto want = reference.next();
      ASSERT_TRUE(want);
      check(batch->input_bytes(), want->input_bytes(), batch->size * in[1], in[1],
            deferred.input_channels());
      check(batch->target_bytes(), want->target_bytes(), batch->size * out[1], out[1],
            deferred.target_channels());
      ++batches;
    }
    EXPECT_EQ(batches, reference.batches_per_epoch());
  }
}

// Deferred batches hold float32 values, which round int32 and wider: where such an array is
// CF-encoded, the host decodes it from the exact stored value (a fill value of -2147483647,
// netCDF's default, is -2^31 as a float and would not match; a large offset would cancel the
// small scaled difference), and the consumer applies the rest.
TEST(Loader, DeferredBatchesOfWideIntegersAreCfDecodedFromTheExactValue) {
  auto store = make_store();
  const Json attributes = {{"scale_factor", 1e-6},
                           {"add_offset", -1000.0},
                           {"_FillValue", -2147483647},
                           {"zfeed_stats", {{"mean", 3.0}, {"std", 2.0}}}};
  auto wide = zarr::Array::create(store, "wide", meta("int32", {kTimes, kLat, kLon}, attributes));
  std::vector<int32_t> values(kTimes * kLat * kLon);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = i % 7 == 0 ? -2147483647 : 1000000033 + static_cast<int32_t>(i);
  }
  wide.write(wide.full_selection(), values.data());
  auto spec = base_spec(store);
  spec.inputs = {var("wide"), var("q")};
  spec.targets = {var("wide")};
  Loader reference(spec);
  spec.defer_normalization = true;
  Loader deferred(spec);
  EXPECT_TRUE(deferred.input_channels()[0].unpack_on_host);
  EXPECT_FALSE(deferred.input_channels()[1].unpack_on_host);  // int16: float32 holds it
  const auto in = deferred.input_shape();
  const size_t plane = in[2] * in[3];
  uint64_t nans = 0;
  while (auto batch = deferred.next()) {
    auto want = reference.next();
    ASSERT_TRUE(want);
    for (uint64_t p = 0; p < batch->size * in[1]; ++p) {
      const Normalization rest = deferred.input_channels()[p % in[1]].deferred_normalization();
      for (size_t k = 0; k < plane; ++k) {
        float raw, expected;
        std::memcpy(&raw, batch->input_bytes() + 4 * (p * plane + k), 4);
        std::memcpy(&expected, want->input_bytes() + 4 * (p * plane + k), 4);
        const float got = rest.apply(raw);
        nans += std::isnan(expected);
        ASSERT_EQ(std::memcmp(&got, &expected, 4), 0) << "plane " << p << " element " << k;
      }
    }
  }
  EXPECT_GT(nans, 0u);
}

// The host half of decode="gpu": chunks handed over compressed (plain chunks, and inner chunks
// of shards read by range) decode, with the array's read codecs, to exactly the planes the loader
// would have written; arrays that do not qualify (float64, int16) are decoded by the loader as
// before, and an absent chunk's plane is filled by the loader.
// t2m again, as "t2m_sharded": shards of 4 time steps, one plane per inner chunk.
void add_sharded_t2m(const std::shared_ptr<Store>& store) {
  Json json = {
      {"zarr_format", 3},
      {"node_type", "array"},
      {"shape", {kTimes, kLat, kLon}},
      {"data_type", "float32"},
      {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", {4, kLat, kLon}}}}}},
      {"chunk_key_encoding", {{"name", "default"}}},
      {"fill_value", 0},
      {"codecs", Json::parse(R"([{"name": "sharding_indexed", "configuration": {
                  "chunk_shape": [1, 6, 8],
                  "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                             {"name": "zstd", "configuration": {"level": 1}}],
                  "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                   {"name": "crc32c"}]}}])")},
      {"attributes", Json::object()}};
  auto sharded = zarr::Array::create(store, "t2m_sharded", zarr::ArrayMetadata::parse_v3(json));
  std::vector<float> values(kTimes * kLat * kLon);
  zarr::Array::open(store, "t2m").read(sharded.full_selection(), values.data());
  sharded.write(sharded.full_selection(), values.data());
}

// The store of the pass-compressed tests: t2m (one time step absent) and a sharded copy of it.
void fill_pass_store(const std::shared_ptr<Store>& store) {
  auto memory = make_store();
  add_sharded_t2m(memory);
  for (const auto& key : memory->list("")) store->set(key, *memory->get(key));
  store->erase("t2m/c/5/0/0");  // absent: the fill value, written by the loader
}

// Their spec: both arrays, raw values (normalization left to the consumer).
LoaderSpec pass_spec(std::shared_ptr<Store> store) {
  auto spec = base_spec(std::move(store));
  spec.inputs.push_back(var("t2m_sharded"));
  spec.defer_normalization = true;
  return spec;
}

TEST(Loader, ChunksHandedOverCompressedDecodeToTheSamePlanes) {
  auto store = make_store();
  fill_pass_store(store);
  auto spec = pass_spec(store);
  Loader reference(spec);
  spec.pass_compressed = [](const zarr::Array&) { return true; };
  Loader passing(spec);
  ASSERT_TRUE(passing.set_pass_compressed(true));
  const auto in = passing.input_shape(), out = passing.target_shape();
  const size_t plane_bytes = in[2] * in[3] * 4;
  uint64_t handed_over = 0, absent = 0;
  bool saw_shard_range = false;
  while (auto batch = passing.next()) {
    auto want = reference.next();
    ASSERT_TRUE(want);
    const BatchMemory& memory = *batch->memory;
    for (size_t i = 0; i < memory.compressed_count; ++i) {
      const CompressedChunk& chunk = memory.compressed[i];
      if (chunk.decoded_size == 0) {
        ++absent;
        continue;
      }
      ASSERT_EQ(chunk.decoded_size, plane_bytes);
      uint8_t* dst = (chunk.target ? batch->target_bytes() : batch->input_bytes()) + chunk.offset;
      passing.array(chunk.array).read_codecs().decode(chunk.data, dst);
      saw_shard_range = saw_shard_range || chunk.key.find("t2m_sharded/c/") != std::string::npos;
      ++handed_over;
    }
    ASSERT_EQ(
        std::memcmp(batch->input_bytes(), want->input_bytes(), batch->size * in[1] * plane_bytes),
        0);
    ASSERT_EQ(std::memcmp(batch->target_bytes(), want->target_bytes(),
                          batch->size * out[1] * plane_bytes),
              0);
  }
  EXPECT_GT(handed_over, 0u);
  EXPECT_GT(absent, 0u);  // t2m at time 5 was asked for at least once
  EXPECT_TRUE(saw_shard_range);
  EXPECT_EQ(passing.stats().chunks_passed, handed_over);
  // Crops read parts of chunks: nothing qualifies, and the loader says why.
  spec.crop = Crop{1, 4, 2, 5};
  Loader cropped(spec);
  EXPECT_FALSE(cropped.set_pass_compressed(true));
  EXPECT_CONTAINS(cropped.pass_compressed_reason(), "crops");
}

// With locate_compressed on a file store, chunks handed over compressed are places in local
// files (the GPUDirect Storage path): no bytes in `data`, and the located range holds exactly the
// bytes read_stored reads (what a reading loader hands over), which decode to the loader's
// planes. Absent chunks are filled by the loader as before.
TEST(Loader, ChunksHandedOverCompressedAreLocatedInLocalFiles) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  fill_pass_store(store);
  auto spec = pass_spec(store);
  Loader reference(spec);
  spec.pass_compressed = [](const zarr::Array&) { return true; };
  Loader reading(spec);
  ASSERT_TRUE(reading.set_pass_compressed(true));
  EXPECT_FALSE(reading.locate_compressed()) << "off unless asked for";
  spec.locate_compressed = true;
  Loader locating(spec);
  ASSERT_TRUE(locating.set_pass_compressed(true));
  EXPECT_TRUE(locating.locate_compressed());

  const auto in = locating.input_shape(), out = locating.target_shape();
  const size_t plane_bytes = in[2] * in[3] * 4;
  uint64_t located = 0, absent = 0;
  bool saw_shard = false;
  while (auto batch = locating.next()) {
    auto read = reading.next();
    auto want = reference.next();
    ASSERT_TRUE(read && want);
    const BatchMemory& memory = *batch->memory;
    ASSERT_EQ(memory.compressed_count, read->memory->compressed_count);
    for (size_t i = 0; i < memory.compressed_count; ++i) {
      const CompressedChunk& chunk = memory.compressed[i];
      const CompressedChunk& read_chunk = read->memory->compressed[i];
      EXPECT_TRUE(chunk.data.empty());
      EXPECT_EQ(chunk.key, read_chunk.key);
      ASSERT_EQ(chunk.decoded_size, read_chunk.decoded_size);
      if (chunk.decoded_size == 0) {
        ++absent;
        EXPECT_TRUE(chunk.file.empty());
        EXPECT_EQ(chunk.stored_size, 0u);
        continue;
      }
      ++located;
      ASSERT_TRUE(chunk.file.starts_with(dir.path() + "/")) << chunk.file;
      saw_shard = saw_shard || chunk.file.find("t2m_sharded/c/") != std::string::npos;
      EXPECT_EQ(read_chunk.stored_size, read_chunk.data.size());
      EXPECT_TRUE(read_chunk.file.empty());
      ASSERT_EQ(chunk.stored_size, read_chunk.data.size());
      const Bytes bytes =
          testing::read_file_range(chunk.file, chunk.file_offset, chunk.stored_size);
      ASSERT_TRUE(testing::same_bytes(bytes.data(), read_chunk.data.data(), bytes.size()));
      uint8_t* dst = (chunk.target ? batch->target_bytes() : batch->input_bytes()) + chunk.offset;
      locating.array(chunk.array).read_codecs().decode(bytes, dst);
    }
    ASSERT_EQ(
        std::memcmp(batch->input_bytes(), want->input_bytes(), batch->size * in[1] * plane_bytes),
        0);
    ASSERT_EQ(std::memcmp(batch->target_bytes(), want->target_bytes(),
                          batch->size * out[1] * plane_bytes),
              0);
  }
  EXPECT_GT(located, 0u);
  EXPECT_GT(absent, 0u);
  EXPECT_TRUE(saw_shard);
  const LoaderStats stats = locating.stats();
  EXPECT_EQ(stats.chunks_located, located);
  EXPECT_EQ(stats.chunks_passed, located);
  EXPECT_EQ(stats.to_json()["chunks_located"], located);
  EXPECT_EQ(reading.stats().chunks_located, 0u);
}

// set_locate_compressed switches at run time, for the batches assembled from then on; a store
// without local files reads the chunks as before, whatever the spec asks.
TEST(Loader, LocatingCompressedChunksSwitchesAtRunTime) {
  auto memory = make_store();
  testing::TempDir dir;
  auto files = make_file_store(dir.path());
  for (const auto& key : memory->list("")) files->set(key, *memory->get(key));
  const std::vector<uint64_t> times{2, 5, 9};
  // Assembles `times` once; returns (chunks located, chunks read).
  auto assemble = [&](Loader& loader) {
    BatchMemory batch;
    const auto in = loader.input_shape(), out = loader.target_shape();
    batch.inputs.resize(in[0] * in[1] * in[2] * in[3] * 4);
    batch.targets.resize(out[0] * out[1] * out[2] * out[3] * 4);
    loader.assemble(0, times, batch.inputs.data(), batch.targets.data(), &batch);
    std::pair<uint64_t, uint64_t> counts{0, 0};
    for (size_t i = 0; i < batch.compressed_count; ++i) {
      const CompressedChunk& chunk = batch.compressed[i];
      if (chunk.decoded_size == 0) continue;
      if (!chunk.file.empty()) {
        EXPECT_TRUE(chunk.data.empty());
        ++counts.first;
      } else {
        EXPECT_EQ(chunk.stored_size, chunk.data.size());
        EXPECT_GT(chunk.data.size(), 0u);
        ++counts.second;
      }
    }
    return counts;
  };
  for (const bool local : {true, false}) {
    SCOPED_TRACE(local ? "file store" : "memory store");
    auto spec = base_spec(local ? files : memory);
    spec.defer_normalization = true;
    spec.pass_compressed = [](const zarr::Array&) { return true; };
    spec.locate_compressed = true;
    Loader loader(spec);
    ASSERT_TRUE(loader.set_pass_compressed(true));
    EXPECT_EQ(loader.locate_compressed(), local);
    // t2m, 3 samples: an input and a target plane each.
    const std::pair<uint64_t, uint64_t> located{6, 0}, read{0, 6};
    EXPECT_EQ(assemble(loader), local ? located : read);
    EXPECT_FALSE(loader.set_locate_compressed(false));
    EXPECT_FALSE(loader.locate_compressed());
    EXPECT_EQ(assemble(loader), read);
    EXPECT_EQ(loader.set_locate_compressed(true), local);
    EXPECT_EQ(assemble(loader), local ? located : read);

    // Arrays `locatable` says no for (blosc, which the host splits) are read, never located.
    spec.locatable = [](const zarr::Array&) { return false; };
    Loader reader(spec);
    ASSERT_TRUE(reader.set_pass_compressed(true));
    EXPECT_FALSE(reader.locate_compressed());
    EXPECT_EQ(assemble(reader), read);
  }
}

TEST(Loader, IntegerTargetsWithoutStatisticsAreLabels) {
  auto store = make_store();
  auto labels = zarr::Array::create(store, "labels", meta("uint8", {kTimes, kLat, kLon}));
  std::vector<uint8_t> values(kTimes * kLat * kLon);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7 % 3);
  labels.write(labels.full_selection(), values.data());
  auto spec = base_spec(store);
  spec.targets = {var("labels")};
  spec.lead = 0;
  Loader loader(spec);
  EXPECT_TRUE(loader.label_targets());
  EXPECT_EQ(loader.target_type(), OutputType::kInt64);
  while (auto batch = loader.next()) {
    for (uint64_t i = 0; i < batch->size; ++i) {
      const auto t = static_cast<uint64_t>(batch->times()[i]);
      for (size_t k = 0; k < kLat * kLon; ++k) {
        int64_t got;
        std::memcpy(&got, batch->target_bytes() + 8 * (i * kLat * kLon + k), 8);
        ASSERT_EQ(got, values[t * kLat * kLon + k]);
      }
    }
  }
  spec.targets = {var("labels"), var("t2m")};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "give one label variable");
  // q is int16 with statistics: a physical quantity, normalized to float.
  spec.targets = {var("q")};
  EXPECT_FALSE(Loader(spec).label_targets());
}

// fill_nan: the NaNs of a variable (sea surface temperature over land) become the given value
// after normalization, on each read path (a plane per chunk, chunks of several steps through the
// cache, uncompressed planes read by range); everything else is as without it.
TEST(Loader, FillNanReplacesMissingValuesOnEveryReadPath) {
  struct Layout {
    uint64_t time_chunk;
    const char* codecs;
  };
  for (const Layout layout :
       {Layout{1, kZstdCodecs}, Layout{3, kZstdCodecs}, Layout{1, kUncompressed}}) {
    SCOPED_TRACE("time chunk " + std::to_string(layout.time_chunk) +
                 (layout.codecs == kUncompressed ? ", uncompressed" : ", zstd"));
    auto store = make_store(layout.time_chunk, 1, layout.codecs);
    auto sst = zarr::Array::create(store, "sst",
                                   meta("float32", {kTimes, kLat, kLon},
                                        Json{{"zfeed_stats", {{"mean", 290.0}, {"std", 5.0}}}},
                                        layout.time_chunk, 1, layout.codecs));
    std::vector<float> values(kTimes * kLat * kLon);
    size_t missing = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const bool land = (i / kLon + i % kLon + i / (kLat * kLon)) % 5 == 0;
      values[i] = land ? std::nanf("") : 280.0f + static_cast<float>(i % 17);
      missing += land;
    }
    ASSERT_GT(missing, 0u);
    sst.write(sst.full_selection(), values.data());
    for (const bool normalize : {true, false}) {  // without: float32 planes decode in place
      auto spec = base_spec(store);
      spec.inputs = {var("sst"), var("t2m")};
      spec.targets = {var("sst")};
      spec.fill_nan = -2.0f;
      spec.normalize = normalize;
      Loader loader(spec);
      EXPECT_EQ(loader.input_channels()[0].normalized, normalize);
      EXPECT_TRUE(loader.input_channels()[0].fill_nan);
      EXPECT_EQ(loader.input_channels()[0].nan_value, -2.0f);
      size_t filled = 0;
      for (int epoch = 0; epoch < 2; ++epoch) {
        loader.begin_iteration();
        while (auto batch = loader.next()) {
          const size_t plane = kLat * kLon;
          for (uint64_t i = 0; i < batch->size; ++i) {
            const auto t = static_cast<uint64_t>(batch->times()[i]);
            auto check = [&](const float* got, const Channel& channel) {
              auto want = expected_plane(store, channel, t + channel.time_offset);
              for (size_t k = 0; k < plane; ++k) {
                if (std::isnan(want[k])) {
                  want[k] = -2.0f;
                  ++filled;
                }
              }
              EXPECT_TRUE(same_bits(got, want.data(), plane)) << channel.variable << " time " << t;
            };
            for (size_t c = 0; c < 2; ++c)
              check(batch->inputs() + (i * 2 + c) * plane, loader.input_channels()[c]);
            check(batch->targets() + i * plane, loader.target_channels()[0]);
          }
        }
      }
      EXPECT_GT(filled, 0u);
    }
  }
  auto store = make_store();
  auto spec = base_spec(store);
  spec.fill_nan = NAN;
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "fill_nan must be a finite number");
  EXPECT_EQ(*LoaderSpec::from_json(store, Json::parse(R"({"fill_nan": 1.5})")).fill_nan, 1.5f);
  EXPECT_FALSE(LoaderSpec::from_json(store, Json::parse(R"({"fill_nan": null})")).fill_nan);
  EXPECT_CONTAINS(
      error_of([&] { LoaderSpec::from_json(store, Json::parse(R"({"fill_nan": "zero"})")); }),
      "fill_nan must be a finite number or null, got \"zero\"");
}

// Static fields (dims (lat, lon): a land-sea mask, the orography) are input channels after the
// history's, the same plane for every sample, cropped with it; normalized like the others.
TEST(Loader, StaticInputsAreTheSamePlaneForEverySampleAfterTheHistory) {
  auto store = make_store();
  std::vector<uint8_t> mask(kLat * kLon);
  std::vector<float> height(kLat * kLon);
  for (size_t i = 0; i < mask.size(); ++i) {
    mask[i] = static_cast<uint8_t>((i / kLon + 2 * (i % kLon)) % 3 == 0);
    height[i] = 100.0f * static_cast<float>(i % 11) + 0.25f;
  }
  auto lsm = zarr::Array::create(
      store, "lsm",
      v3_metadata("uint8", {kLat, kLon}, {4, 4}, Json::parse(kZstdCodecs), Json::object()));
  lsm.write(lsm.full_selection(), mask.data());
  auto orog = zarr::Array::create(
      store, "orog",
      v3_metadata("float32", {kLat, kLon}, {kLat, kLon}, Json::parse(kZstdCodecs),
                  Json{{"zfeed_stats", {{"mean", 500.0}, {"std", 300.0}}}}));
  orog.write(orog.full_selection(), height.data());

  for (const bool deferred : {false, true}) {
    auto spec = base_spec(store);
    spec.inputs = {var("lsm"), var("t2m"), var("orog"), var("q")};
    spec.history = 2;
    spec.random_crop = std::array<uint64_t, 2>{4, 5};
    spec.defer_normalization = deferred;
    Loader loader(spec);
    const auto& channels = loader.input_channels();
    ASSERT_EQ(channels.size(), 6u);  // 2 steps x (t2m, q), then lsm and orog once
    EXPECT_EQ(channels[0].variable, "t2m");
    EXPECT_EQ(channels[3].variable, "q");
    EXPECT_EQ(channels[3].time_offset, 0);
    EXPECT_EQ(channels[4].variable, "lsm");
    EXPECT_TRUE(channels[4].is_static);
    EXPECT_FALSE(channels[4].normalized);
    EXPECT_EQ(channels[5].variable, "orog");
    EXPECT_TRUE(channels[5].is_static && channels[5].normalized);
    EXPECT_FALSE(channels[3].is_static);
    const auto in = loader.input_shape();
    EXPECT_EQ(in, (std::array<uint64_t, 4>{3, 6, 4, 5}));
    const size_t plane = in[2] * in[3];
    uint64_t batches = 0;
    while (auto batch = loader.next()) {
      ++batches;
      for (uint64_t i = 0; i < batch->size; ++i) {
        const auto y0 = static_cast<uint64_t>(batch->crops()[2 * i]);
        const auto x0 = static_cast<uint64_t>(batch->crops()[2 * i + 1]);
        const auto t = static_cast<uint64_t>(batch->times()[i]);
        const Crop crop{y0, in[2], x0, in[3]};
        if (!deferred) {  // the time channels as ever
          auto want = expected_plane(store, channels[1], t + channels[1].time_offset, crop);
          EXPECT_TRUE(same_bits(batch->inputs() + (i * 6 + 1) * plane, want.data(), plane));
        }
        for (size_t y = 0; y < in[2]; ++y) {
          for (size_t x = 0; x < in[3]; ++x) {
            const size_t k = (y0 + y) * kLon + x0 + x, at = y * in[3] + x;
            const float got_mask = batch->inputs()[(i * 6 + 4) * plane + at];
            const float got_height = batch->inputs()[(i * 6 + 5) * plane + at];
            ASSERT_EQ(got_mask, static_cast<float>(mask[k])) << "sample " << i;
            const float want_height = deferred ? height[k] : (height[k] - 500.0f) / 300.0f;
            ASSERT_EQ(got_height, want_height) << "sample " << i << " at " << y << ", " << x;
          }
        }
      }
    }
    EXPECT_EQ(batches, loader.batches_per_epoch());
    EXPECT_GE(loader.memory_bound(), 2 * kLat * kLon * 4);
  }

  auto spec = base_spec(store);
  spec.targets = {var("orog")};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }),
                  "target variable 'orog' has shape (6, 8), dims (lat, lon) without time: a "
                  "static field can only be an input");
  spec = base_spec(store);
  spec.inputs = {var("orog", {0})};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "is static (dims (lat, lon)) and has no levels");
  spec = base_spec(store);
  spec.inputs = {var("orog")};
  spec.targets = {};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "no variable has a time dimension");
  auto wide = zarr::Array::create(store, "wide",
                                  v3_metadata("float32", {kLat, kLon + 1}, {kLat, 3},
                                              Json::parse(kZstdCodecs), Json::object()));
  spec = base_spec(store);
  spec.inputs = {var("wide"), var("t2m")};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }),
                  "input variable 'wide' has shape (6, 9) but 't2m' has (12, 6, 8): a static field "
                  "needs the same lat and lon extents");
}

// A rollout's targets: every lead's target channels in turn, through each read path.
TEST(Loader, SeveralLeadsStackTheTargetsLeadAfterLead) {
  for (const uint64_t time_chunk : {uint64_t{1}, uint64_t{3}}) {
    SCOPED_TRACE("time chunk " + std::to_string(time_chunk));
    auto store = make_store(time_chunk);
    auto spec = base_spec(store);
    spec.leads = {3, 1};
    spec.history = 2;
    Loader loader(spec);
    const auto& targets = loader.target_channels();
    ASSERT_EQ(targets.size(), 4u);
    EXPECT_EQ(targets[0].variable, "t2m");
    EXPECT_EQ(targets[0].time_offset, 3);
    EXPECT_EQ(targets[1].variable, "q");
    EXPECT_EQ(targets[1].time_offset, 3);
    EXPECT_EQ(targets[2].variable, "t2m");
    EXPECT_EQ(targets[2].time_offset, 1);
    EXPECT_EQ(loader.num_samples(), kTimes - 1 - 3);  // t in [1, 8]
    EXPECT_EQ(loader.target_shape(), (std::array<uint64_t, 4>{3, 4, kLat, kLon}));
    std::multiset<int64_t> times;
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader.begin_iteration();
      while (auto batch = loader.next()) {
        check_batch(store, loader, *batch);
        for (uint64_t i = 0; i < batch->size; ++i) times.insert(batch->times()[i]);
      }
    }
    EXPECT_EQ(times.size(), 2 * ((kTimes - 1 - 3) / 3 * 3));  // drop_last: whole batches
    EXPECT_EQ(*times.begin(), 1);
    EXPECT_LE(*times.rbegin(), static_cast<int64_t>(kTimes - 1 - 3));
  }
  auto store = make_store();
  auto spec = base_spec(store);
  spec.leads = {1, 2, 1};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "lead 1 is given twice");
  spec.leads = {0, kTimes};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }),
                  "no valid samples: 12 time steps with history 1 and lead 12");
  auto labels = zarr::Array::create(store, "labels", meta("uint8", {kTimes, kLat, kLon}));
  spec.targets = {var("labels")};
  spec.leads = {0, 1};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "label targets take one lead, got 2");
  EXPECT_EQ(LoaderSpec::from_json(store, Json::parse(R"({"lead": [1, 2, 4]})")).leads,
            (std::vector<uint64_t>{1, 2, 4}));
  EXPECT_TRUE(LoaderSpec::from_json(store, Json::parse(R"({"lead": 2})")).leads.empty());
  EXPECT_CONTAINS(error_of([&] { LoaderSpec::from_json(store, Json::parse(R"({"lead": []})")); }),
                  "lead is a number or a non-empty list");
  EXPECT_CONTAINS(
      error_of([&] { LoaderSpec::from_json(store, Json::parse(R"({"lead": [1, -2]})")); }),
      "loader: lead");
}

// history_step: 6-hourly inputs from an hourly store (here every third step).
TEST(Loader, HistoryStepSpacesTheInputSteps) {
  for (const uint64_t time_chunk : {uint64_t{1}, uint64_t{4}}) {
    SCOPED_TRACE("time chunk " + std::to_string(time_chunk));
    auto store = make_store(time_chunk);
    auto spec = base_spec(store);
    spec.history = 3;
    spec.history_step = 3;
    spec.lead = 2;
    spec.drop_last = false;
    Loader loader(spec);
    const auto& inputs = loader.input_channels();
    ASSERT_EQ(inputs.size(), 12u);  // 3 steps x (t2m, z@2, z@0, q)
    EXPECT_EQ(inputs[0].time_offset, -6);
    EXPECT_EQ(inputs[4].time_offset, -3);
    EXPECT_EQ(inputs[8].time_offset, 0);
    EXPECT_EQ(loader.num_samples(), kTimes - 6 - 2);  // t in [6, 9]
    EXPECT_EQ(loader.sample_time(0), 6u);
    std::set<int64_t> times;
    while (auto batch = loader.next()) {
      check_batch(store, loader, *batch);
      for (uint64_t i = 0; i < batch->size; ++i) times.insert(batch->times()[i]);
    }
    EXPECT_EQ(times, (std::set<int64_t>{6, 7, 8, 9}));
  }
  auto store = make_store();
  auto spec = base_spec(store);
  spec.history = 3;
  spec.history_step = 6;
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }),
                  "no valid samples: 12 time steps with history 3 every 6 steps and lead 1 (a "
                  "sample spans 14 time steps)");
  spec.history_step = 0;
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "history_step must be at least 1");
  spec.history_step = UINT64_MAX / 2 + 1;  // (history - 1) * step must not wrap around
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "a sample spans more than the axis");
  spec.history = UINT64_MAX;  // refused before a channel is made per step
  spec.history_step = 1;
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "no valid samples");
  EXPECT_EQ(LoaderSpec::from_json(store, Json::parse(R"({"history_step": 6})")).history_step, 6u);
}

TEST(Loader, StackedVariablesAreChannelsOfOneArray) {
  auto store = make_memory_store();
  zarr::Group::create(store, "");
  auto data = zarr::Array::create(
      store, "data",
      meta("float32", {kTimes, 3, kLat, kLon},
           Json{{"variables", {"u", "v", "t"}},
                {"zfeed_stats", {{"mean", {1.0, 2.0, 3.0}}, {"std", {2.0, 4.0, 8.0}}}}},
           /*time_chunk=*/1, /*level_chunk=*/3));
  std::vector<float> values(kTimes * 3 * kLat * kLon);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) * 0.5f;
  data.write(data.full_selection(), values.data());
  LoaderSpec spec;
  spec.store = store;
  spec.inputs = {var("t"), var("u")};
  spec.targets = {var("v")};
  spec.batch_size = 2;
  Loader loader(spec);
  ASSERT_EQ(loader.input_channels().size(), 2u);
  EXPECT_EQ(loader.input_channels()[0].variable, "t");
  EXPECT_EQ(loader.input_channels()[0].level, 2u);
  EXPECT_EQ(loader.input_channels()[0].mean, 3.0f);
  const size_t plane = kLat * kLon;
  while (auto batch = loader.next()) {
    for (uint64_t i = 0; i < batch->size; ++i) {
      const auto t = static_cast<uint64_t>(batch->times()[i]);
      for (size_t k = 0; k < plane; ++k) {
        auto at = [&](uint64_t time, uint64_t c) { return values[(time * 3 + c) * plane + k]; };
        ASSERT_EQ(batch->inputs()[(i * 2 + 0) * plane + k], (at(t, 2) - 3.0f) / 8.0f);
        ASSERT_EQ(batch->inputs()[(i * 2 + 1) * plane + k], (at(t, 0) - 1.0f) / 2.0f);
        ASSERT_EQ(batch->targets()[i * plane + k], (at(t + 1, 1) - 2.0f) / 4.0f);
      }
    }
  }
  spec.inputs = {var("w")};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "stacked in 'data': u, v, t");
}

TEST(Loader, AForkedChildContinuesWithItsOwnThreads) {
  auto store = make_store(/*time_chunk=*/2);
  auto spec = base_spec(store);
  spec.batch_size = 2;
  Loader reference(spec);
  auto all = drain(reference);
  ASSERT_GE(all.size(), 3u);
  Loader loader(spec);
  ASSERT_TRUE(loader.next());  // the prefetch thread is running (and may hold its lock)
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // In the child: the rest of the epoch, from the child's own prefetch thread and pool.
    auto rest = drain(loader);
    bool same = rest.size() == all.size() - 1;
    for (size_t i = 0; same && i < rest.size(); ++i) same = rest[i] == all[i + 1];
    ::_exit(same ? 0 : 1);
  }
  EXPECT_EQ(testing::exit_status_of_child(child), 0) << "the forked child's batches differ";
  auto rest = drain(loader);  // the parent goes on too
  ASSERT_EQ(rest.size(), all.size() - 1);
  EXPECT_EQ(rest[0], all[1]);
}

// --- Samples split among nodes, each node staging its own time steps ------------------------

TEST(Loader, NodesSplitTheSamplesIntoContiguousBlocksOfEqualCount) {
  auto store = make_store();
  auto spec = base_spec(store);
  spec.batch_size = 2;
  spec.drop_last = false;
  // 11 samples (t = 0 to 10), 5 per node, 2 ranks per node: every rank the same batch count.
  spec.nodes = 2;
  std::set<uint64_t> batch_counts;
  for (uint64_t node = 0; node < 2; ++node) {
    spec.node = node;
    std::multiset<int64_t> times;
    for (uint64_t rank = 0; rank < 2; ++rank) {
      spec.rank = rank;
      spec.world_size = 2;
      Loader loader(spec);
      EXPECT_EQ(loader.time_span(), (std::pair<uint64_t, uint64_t>{5 * node, 5 * node + 6}));
      batch_counts.insert(loader.sampler().batches_per_epoch());
      while (auto batch = loader.next()) {
        check_batch(store, loader, *batch);
        for (uint64_t i = 0; i < batch->size; ++i) times.insert(batch->times()[i]);
      }
    }
    // Each of the node's 5 samples once, and one padded as DistributedSampler pads.
    std::set<int64_t> distinct(times.begin(), times.end());
    std::set<int64_t> block;
    for (int64_t t = 5 * static_cast<int64_t>(node); t < 5 * static_cast<int64_t>(node) + 5; ++t)
      block.insert(t);
    EXPECT_EQ(distinct, block) << "node " << node;
    EXPECT_EQ(times.size(), 6u);
  }
  EXPECT_EQ(batch_counts.size(), 1u);

  spec.rank = 0;
  spec.world_size = 1;
  spec.node = 0;
  spec.nodes = 12;
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "11 samples cannot be split among 12 nodes");
  spec.node = 3;
  spec.nodes = 3;
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "node 3 of 3 nodes: give 0 <= node < nodes");
  // A state saved on one node does not resume on another.
  spec.nodes = 2;
  spec.node = 0;
  spec.time_range = {0, 11};  // both nodes then start at 0 and 5; the check is on the node too
  Loader first(spec);
  ASSERT_TRUE(first.next());
  const Json state = first.state();
  EXPECT_EQ(state["nodes"], 2);
  spec.node = 1;
  Loader other(spec);
  EXPECT_CONTAINS(error_of([&] { other.restore(state); }), "saved with time_start 0");
}

TEST(Loader, ANodeStagesItsTimeStepsAndReadsTheCopy) {
  testing::TempDir dir;
  auto store = make_store(/*time_chunk=*/2, 1, kZstdCodecs, make_memory_store(), /*named=*/true);
  auto spec = base_spec(store);
  spec.batch_size = 2;
  spec.nodes = 2;
  spec.node = 1;  // samples t = 5 to 9: time steps [5, 11)
  Loader direct(spec);
  const auto want = drain(direct);
  spec.stage_dir = dir.path() + "/node1";
  Loader staged(spec);
  ASSERT_TRUE(staged.staged());
  ASSERT_TRUE(staged.staged()->partial);
  EXPECT_EQ(staged.staged()->partial->start, 5u);
  EXPECT_EQ(staged.staged()->partial->stop, 11u);
  EXPECT_EQ(staged.time_span(), (std::pair<uint64_t, uint64_t>{5, 11}));
  EXPECT_EQ(drain(staged), want);
  // Time chunks 2 to 5 (steps 4 to 11) of each array are on disk, not 0 and 1.
  auto files = make_file_store(dir.path() + "/node1");
  EXPECT_TRUE(files->size("t2m/c/2/0/0"));
  EXPECT_TRUE(files->size("z/c/5/0/0/0"));
  EXPECT_FALSE(files->size("t2m/c/1/0/0"));
  EXPECT_FALSE(files->size("q/c/0/0/0"));

  // The same spec again (a restarted job) finds the copy complete.
  Loader again(spec);
  EXPECT_TRUE(again.staged()->already_complete);
  EXPECT_EQ(drain(again), want);

  // The copy opened by path: its own steps by default, never others.
  auto copy = open_store(dir.path() + "/node1");
  LoaderSpec on_copy = base_spec(copy);
  on_copy.batch_size = 2;
  Loader reads_copy(on_copy);
  EXPECT_EQ(reads_copy.time_span(), (std::pair<uint64_t, uint64_t>{5, 11}));
  EXPECT_EQ(drain(reads_copy).size(), 2u);  // 5 samples in batches of 2, drop_last
  on_copy.time_range = {3, 11};
  EXPECT_CONTAINS(error_of([&] { Loader{on_copy}; }),
                  "time_range [3, 11) reaches past what the partial staged copy");
  on_copy.time_range = {};
  on_copy.nodes = 2;
  EXPECT_CONTAINS(error_of([&] { Loader{on_copy}; }),
                  "is a partial staged copy (time steps [5, 11)): to split the samples among "
                  "nodes, give the source and a staging directory (Python: stage=");
}

TEST(Loader, ACorruptChunkOfSeveralStepsFailsTheBatchWithoutAHang) {
  // Chunks of 4 steps go through the cache: pieces wait for their chunk's decode, and a failed
  // decode (or any failed task: the pool then skips the decodes not yet started) must release
  // every waiting piece. Many chunks in flight, one corrupt, on each of several loaders.
  for (int round = 0; round < 8; ++round) {
    auto store = make_store(/*time_chunk=*/4);
    store->set(round % 2 ? "z/c/1/0/0/0" : "q/c/2/0/0", as_bytes("not a zstd frame"));
    auto spec = base_spec(store);
    spec.batch_size = 10;
    spec.seed = static_cast<uint64_t>(round);
    Loader loader(spec);
    EXPECT_CONTAINS(error_of([&] {
                      while (loader.next()) {
                      }
                    }),
                    round % 2 ? "z/c/1/0/0/0" : "q/c/2/0/0");
  }
}

TEST(Loader, CropsThatWouldWrapAroundAreRefused) {
  auto spec = base_spec(make_store());
  spec.crop = Crop{UINT64_MAX, 2, 0, kLon};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "does not fit the 6 x 8 grid");
  spec.crop = Crop{0, kLat, 1, UINT64_MAX};
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }), "does not fit the 6 x 8 grid");
}

TEST(Loader, APartialCopyStagedAgainKeepsItsSteps) {
  testing::TempDir dir;
  auto store = make_store(/*time_chunk=*/2, 1, kZstdCodecs, make_memory_store(), /*named=*/true);
  zarr::StageOptions options;
  options.time_range = {{5, 11}};
  zarr::stage(store, dir.path() + "/shared", options);
  auto shared_copy = open_store(dir.path() + "/shared");
  // An absent end of the range is the copy's.
  auto spec = base_spec(shared_copy);
  spec.time_range = {std::nullopt, 9};
  EXPECT_EQ(Loader(spec).time_span(), (std::pair<uint64_t, uint64_t>{5, 9}));
  spec.time_range = {7, std::nullopt};
  EXPECT_EQ(Loader(spec).time_span(), (std::pair<uint64_t, uint64_t>{7, 11}));
  // Staged again (to a node's disk), it gives the copy its own steps, not the whole axis.
  spec.time_range = {};
  spec.stage_dir = dir.path() + "/local";
  Loader staged(spec);
  ASSERT_TRUE(staged.staged()->partial);
  EXPECT_EQ(staged.staged()->partial->start, 5u);
  EXPECT_EQ(staged.staged()->partial->stop, 11u);
  auto direct_spec = base_spec(store);
  direct_spec.time_range = {5, 11};
  Loader direct(direct_spec);
  EXPECT_EQ(drain(staged), drain(direct));
}

TEST(Loader, StagingPartOfTheTimeAxisNeedsItsName) {
  testing::TempDir dir;
  auto store = make_store();  // no dimension names
  auto spec = base_spec(store);
  spec.time_range = {2, 8};
  spec.stage_dir = dir.path() + "/copy";
  EXPECT_CONTAINS(error_of([&] { Loader{spec}; }),
                  "staging time steps [2, 8) needs the time dimension's name, and 't2m' has no "
                  "dimension names");
  // The whole axis needs no name: the whole store is copied.
  spec.time_range = {};
  Loader whole(spec);
  ASSERT_TRUE(whole.staged());
  EXPECT_FALSE(whole.staged()->partial);
  EXPECT_EQ(whole.staged()->copied, store->list("").size());
}

// --- Staging in the background ---------------------------------------------------------------

// make_store(2) with named dimensions, and an array "extra" the loaders here do not read (only a
// copy does), of `extra_chunks` chunks; watched.
std::shared_ptr<testing::WatchedStore> watched_store_with_extra(uint64_t extra_chunks) {
  auto inner = make_store(/*time_chunk=*/2, 1, kZstdCodecs, make_memory_store(), /*named=*/true);
  auto extra = zarr::Array::create(inner, "extra", meta("float32", {extra_chunks, 2, 2}));
  std::vector<float> values(extra_chunks * 4, 1.5f);
  extra.write(extra.full_selection(), values.data());
  return std::make_shared<testing::WatchedStore>(inner);
}

// Holds every read of `key` (every read, where `key` is empty) from `store` until open(). The
// wait gives up the thread's fork pass: a test may fork meanwhile.
class ReadGate {
 public:
  ReadGate(testing::WatchedStore& store, std::string key) {
    store.on_read = [this, key = std::move(key)](std::string_view read, const ByteRange&) {
      if (!key.empty() && read != key) return;
      ForkGate::Release waiting;
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return open_; });
    };
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Waits (up to a minute) until the loader's copy in the background is done.
void wait_for_background_copy(const Loader& loader) {
  for (int i = 0; i < 6000 && loader.staging_progress(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(loader.staging_progress()) << "the copy did not end";
}

TEST(Loader, AnInterruptEndsTheWaitForABatchWhichStaysDue) {
  auto source = watched_store_with_extra(1);
  auto spec = base_spec(source);
  spec.shuffle = false;
  spec.batch_size = 2;
  Loader loader(spec);
  ReadGate stalled(*source, "");  // as a remote store that stopped answering
  int asked = 0;
  EXPECT_CONTAINS(error_of<InterruptedError>([&] { loader.next([&] { return ++asked == 3; }); }),
                  "interrupted while waiting for batch 0 of epoch 0");
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(loader.position(), 0u);
  stalled.open();
  auto batch = loader.next([] { return false; });
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->index, 0u);
  check_batch(source, loader, *batch);
}

TEST(Loader, DroppingALoaderEndsItsReadsFromAStalledServer) {
  // The store served over HTTP by a server that then stops answering: reads hang until their
  // stall timeout (30 s here), retried. A loader dropped meanwhile (after a Ctrl-C) ends them.
  auto source = make_store();
  testing::TestServer server;
  for (const auto& key : source->list(""))
    server.put(key, std::string(source->get(key)->as_string()));
  auto remote = make_http_store(http_store_options(server.url()));
  auto spec = base_spec(remote);
  spec.shuffle = false;
  spec.batch_size = 2;
  auto loader = std::make_unique<Loader>(spec);
  server.stall = true;
  int asked = 0;
  EXPECT_CONTAINS(error_of<InterruptedError>([&] { loader->next([&] { return ++asked == 3; }); }),
                  "interrupted while waiting for batch 0");
  const auto start = std::chrono::steady_clock::now();
  loader.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Loader, StagesInTheBackgroundWhileItServesBatches) {
  testing::TempDir dir;
  auto source = watched_store_with_extra(4);
  // The copy cannot finish before the first epoch is read: the loader must not wait for it.
  ReadGate gate(*source, "extra/c/3/0/0");
  auto spec = base_spec(source);
  spec.batch_size = 2;
  spec.nodes = 2;
  spec.node = 1;  // samples t = 5 to 9: time steps [5, 11)
  spec.stage_dir = dir.path() + "/node1";
  spec.stage_in_background = true;
  auto direct_spec = base_spec(make_store(2, 1, kZstdCodecs, make_memory_store(), true));
  direct_spec.batch_size = 2;
  direct_spec.nodes = 2;
  direct_spec.node = 1;
  Loader direct(direct_spec);

  Loader staging(spec);
  EXPECT_FALSE(staging.staged());
  ASSERT_TRUE(staging.staging_progress());
  EXPECT_EQ(drain(staging), drain(direct));  // the first epoch, read through to the source
  EXPECT_TRUE(staging.staging_progress());
  gate.open();
  wait_for_background_copy(staging);

  // The next epoch reads the copy alone: no read of the source.
  const uint64_t reads_before = source->reads;
  staging.begin_iteration();
  direct.begin_iteration();
  EXPECT_EQ(drain(staging), drain(direct));
  EXPECT_EQ(source->reads, reads_before);
  ASSERT_TRUE(staging.staged());
  EXPECT_GT(staging.staged()->copied, 0u);
  ASSERT_TRUE(staging.staged()->partial);
  EXPECT_EQ(staging.staged()->partial->start, 5u);
  EXPECT_EQ(staging.staged()->partial->stop, 11u);

  // A loader made on the complete copy reads it at once.
  Loader again(spec);
  ASSERT_TRUE(again.staged());
  EXPECT_TRUE(again.staged()->already_complete);
  EXPECT_FALSE(again.staging_progress());
}

TEST(Loader, AForkedChildOfALoaderStagingInTheBackgroundReadsThroughToTheSource) {
  testing::TempDir dir;
  auto source = watched_store_with_extra(4);
  ReadGate gate(*source, "extra/c/3/0/0");
  auto spec = base_spec(source);
  spec.stage_dir = dir.path() + "/copy";
  spec.stage_in_background = true;
  Loader reference(base_spec(make_store(2, 1, kZstdCodecs, make_memory_store(), true)));
  const auto all = drain(reference);
  Loader loader(spec);
  ASSERT_TRUE(loader.staging_progress());  // the copy waits at the gate
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The copying thread stayed in the parent: the child reads through, and ends cleanly.
    const bool same = drain(loader) == all && loader.staging_progress();
    ::_exit(same ? 0 : 1);
  }
  EXPECT_EQ(testing::exit_status_of_child(child), 0) << "the forked child's batches differ";
  gate.open();
  wait_for_background_copy(loader);
  EXPECT_EQ(drain(loader), all);
  EXPECT_TRUE(loader.staged());
}

TEST(Loader, ALoaderEndedWhileItStagesStopsTheCopyForALaterOneToFinish) {
  testing::TempDir dir;
  auto source = watched_store_with_extra(200);
  source->on_read = [](std::string_view key, const ByteRange&) {
    if (key.starts_with("extra/c/")) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  auto spec = base_spec(source);
  spec.stage_dir = dir.path() + "/copy";
  spec.stage_in_background = true;
  {
    Loader staging(spec);
    for (int i = 0;
         i < 6000 && staging.staging_progress() && staging.staging_progress()->keys_done == 0;
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }  // ended while it copies: the copy stops within a round of values
  EXPECT_CONTAINS(error_of([&] { open_store(dir.path() + "/copy"); }), "unfinished staged copy");
  spec.stage_in_background = false;
  Loader finishing(spec);
  ASSERT_TRUE(finishing.staged());
  EXPECT_GT(finishing.staged()->present, 0u);
  EXPECT_GT(finishing.staged()->copied, 0u);
}

TEST(Loader, ABackgroundCopyReadsNothingAnEarlierCopyLeftUntilItHasCheckedIt) {
  // An interrupted copy, then the source changes: the values the copy holds are of the source as
  // it was, so reads go to the source until this run's copy has checked them.
  testing::TempDir dir;
  auto source = watched_store_with_extra(4);
  const std::string copy = dir.path() + "/copy";
  const size_t keys = source->list("").size();
  int asked = 0;
  zarr::StageOptions all_but_one;
  all_but_one.threads = 1;
  all_but_one.stop = [&] { return ++asked > int(keys); };  // asked before the values, then each
  ASSERT_TRUE(zarr::stage(source, copy, all_but_one).stopped);
  for (const char* key : {"extra/c/0/0/0", "extra/c/1/0/0", "extra/c/2/0/0", "extra/c/3/0/0"})
    std::filesystem::remove(copy + "/" + key);
  auto t2m = zarr::Array::open(source, "t2m");
  std::vector<float> changed(kTimes * kLat * kLon);
  for (size_t i = 0; i < changed.size(); ++i) changed[i] = 500.0f + float(i % 7);
  t2m.write(t2m.full_selection(), changed.data());

  ReadGate gate(*source, "extra/c/3/0/0");  // this run's copy checks no t2m value meanwhile
  auto spec = base_spec(source);
  spec.stage_dir = copy;
  spec.stage_in_background = true;
  Loader staging(spec);
  ASSERT_TRUE(staging.staging_progress());
  Loader direct(base_spec(source));
  EXPECT_EQ(drain(staging), drain(direct));
  gate.open();
  wait_for_background_copy(staging);
}

TEST(Loader, ABackgroundCopyThatFailsLeavesTheLoaderReadingTheSource) {
  testing::TempDir dir;
  auto source = watched_store_with_extra(2);
  // The copy's read of a value the loader does not read fails (a node's disk full is alike).
  source->on_read = [](std::string_view key, const ByteRange&) {
    if (key == "extra/c/1/0/0") throw Error("memory://: extra/c/1/0/0: connection reset");
  };
  auto spec = base_spec(source);
  spec.stage_dir = dir.path() + "/copy";
  spec.stage_in_background = true;
  Loader staging(spec);
  wait_for_background_copy(staging);
  Loader direct(base_spec(source));
  EXPECT_EQ(drain(staging), drain(direct));  // every batch, through the source
  ASSERT_TRUE(staging.staging_failure());
  EXPECT_CONTAINS(*staging.staging_failure(),
                  "loader: staging memory:// to " + dir.path() +
                      "/copy in the background failed: memory://: extra/c/1/0/0: connection reset; "
                      "reading from the source instead");
  EXPECT_FALSE(staging.staged());
  EXPECT_FALSE(staging.staging_progress());
  // The next epoch reads through the source too.
  staging.set_epoch(1);
  direct.set_epoch(1);
  EXPECT_EQ(drain(staging), drain(direct));
}

TEST(Cast, Float16AndBFloat16RoundToNearestEven) {
  // Every 997th float32 bit pattern (and the edge values), against the double conversions.
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 997) {
    float value;
    const auto b = static_cast<uint32_t>(bits);
    std::memcpy(&value, &b, 4);
    const uint16_t half = float_to_float16_bits(value), want_half = double_to_float16(value);
    const uint16_t brain = float_to_bfloat16_bits(value), want_brain = double_to_bfloat16(value);
    if (std::isnan(value)) {
      ASSERT_EQ(half & 0x7C00, 0x7C00);
      ASSERT_NE(half & 0x3FF, 0);
      ASSERT_EQ(brain & 0x7F80, 0x7F80);
      ASSERT_NE(brain & 0x7F, 0);
      continue;
    }
    ASSERT_EQ(half, want_half) << "float16 of bits " << std::hex << b;
    ASSERT_EQ(brain, want_brain) << "bfloat16 of bits " << std::hex << b;
  }
  EXPECT_EQ(float_to_float16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_float16_bits(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_float16_bits(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_float16_bits(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_float16_bits(-0.0f), 0x8000);
}

TEST(Loader, SpecFromJson) {
  auto store = make_store();
  auto spec = LoaderSpec::from_json(store, Json::parse(R"({
      "inputs": ["t2m", {"name": "z", "levels": [1], "mean": 5, "std": 2}], "targets": ["q"],
      "lead": 0, "history": 2, "batch_size": 4, "shuffle": false, "seed": 3, "rank": 1,
      "world_size": 2, "drop_last": false, "normalize": true, "prefetch": 3, "epoch": 2,
      "crop": [0, 2, 1, 3], "dtype": "bfloat16", "order": "random", "window": 3,
      "cache_bytes": 1000, "stacked": "fields"})"));
  EXPECT_EQ(spec.inputs.size(), 2u);
  EXPECT_EQ(spec.inputs[1].levels, std::vector<uint64_t>{1});
  EXPECT_EQ(spec.inputs[1].mean, std::vector<double>{5});
  EXPECT_EQ(spec.history, 2u);
  EXPECT_EQ(spec.lead, 0u);
  EXPECT_EQ(spec.crop->lon_size, 3u);
  EXPECT_FALSE(spec.shuffle);
  EXPECT_EQ(spec.prefetch, 3u);
  EXPECT_EQ(spec.dtype, OutputType::kBFloat16);
  EXPECT_EQ(spec.order, "random");
  EXPECT_EQ(spec.window, 3u);
  EXPECT_EQ(spec.cache_bytes, 1000u);
  EXPECT_EQ(spec.stacked, "fields");
  EXPECT_EQ(LoaderSpec::from_json(store, Json::parse(R"({"inputs": [{"name": "z",
                                                       "level_values": [500, 850.5]}]})"))
                .inputs[0]
                .level_values,
            (std::vector<double>{500, 850.5}));
  EXPECT_CONTAINS(
      error_of([&] { LoaderSpec::from_json(store, Json::parse(R"({"dtype": "float8"})")); }),
      "dtype must be float32, float16 or bfloat16");
  EXPECT_CONTAINS(
      error_of([&] { LoaderSpec::from_json(store, Json::parse(R"({"inputs": [3]})")); }),
      "variable name");
}

}  // namespace
}  // namespace zfeed::loader
