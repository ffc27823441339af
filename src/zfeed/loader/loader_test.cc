#include "zfeed/loader/loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/group.h"

namespace zfeed::loader {
namespace {

using testing::error_of;

constexpr uint64_t kTimes = 12, kLat = 6, kLon = 8, kLevels = 3;

zarr::ArrayMetadata meta(const std::string& dtype, std::vector<uint64_t> shape,
                         Json attributes = Json::object()) {
  std::vector<uint64_t> chunks = shape;
  chunks[0] = 1;
  if (shape.size() == 4) chunks[1] = 1;
  Json json = {{"zarr_format", 3},
               {"node_type", "array"},
               {"shape", shape},
               {"data_type", dtype},
               {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", chunks}}}}},
               {"chunk_key_encoding", {{"name", "default"}}},
               {"fill_value", 0},
               {"codecs", Json::parse(R"([{"name": "bytes", "configuration": {"endian": "little"}},
                                          {"name": "zstd", "configuration": {"level": 1}}])")},
               {"attributes", attributes}};
  return zarr::ArrayMetadata::parse_v3(json);
}

double value_of(int variable, uint64_t t, uint64_t level, uint64_t y, uint64_t x) {
  return 100.0 * variable + 10.0 * t + 3.0 * level + 0.25 * y + 0.0625 * x +
         (t * 7 + y * 3 + x) % 5 * 0.1;
}

// A small ERA5-like group: t2m float32 (time, lat, lon) without stats, z float64 (time, level,
// lat, lon) with per-level zfeed_stats, q int16 (time, lat, lon) with scalar stats.
std::shared_ptr<Store> make_store() {
  auto store = make_memory_store();
  zarr::Group::create(store, "");
  auto t2m = zarr::Array::create(store, "t2m", meta("float32", {kTimes, kLat, kLon}));
  auto z = zarr::Array::create(
      store, "z",
      meta("float64", {kTimes, kLevels, kLat, kLon},
           Json{{"zfeed_stats", {{"mean", {1000.0, 1003.0, 1006.0}}, {"std", {2.0, 4.0, 8.0}}}}}));
  auto q = zarr::Array::create(store, "q", meta("int16", {kTimes, kLat, kLon}));
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
  const auto crop = loader.spec().crop;
  for (uint64_t i = 0; i < batch.size; ++i) {
    const auto t = static_cast<uint64_t>(batch.times()[i]);
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
  EXPECT_NE(drain(loader), all);
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

TEST(Loader, SpecFromJson) {
  auto store = make_store();
  auto spec = LoaderSpec::from_json(store, Json::parse(R"({
      "inputs": ["t2m", {"name": "z", "levels": [1], "mean": 5, "std": 2}], "targets": ["q"],
      "lead": 0, "history": 2, "batch_size": 4, "shuffle": false, "seed": 3, "rank": 1,
      "world_size": 2, "drop_last": false, "normalize": true, "prefetch": 3, "epoch": 2,
      "crop": [0, 2, 1, 3]})"));
  EXPECT_EQ(spec.inputs.size(), 2u);
  EXPECT_EQ(spec.inputs[1].levels, std::vector<uint64_t>{1});
  EXPECT_EQ(spec.inputs[1].mean, std::vector<double>{5});
  EXPECT_EQ(spec.history, 2u);
  EXPECT_EQ(spec.lead, 0u);
  EXPECT_EQ(spec.crop->lon_size, 3u);
  EXPECT_FALSE(spec.shuffle);
  EXPECT_EQ(spec.prefetch, 3u);
  EXPECT_CONTAINS(
      error_of([&] { LoaderSpec::from_json(store, Json::parse(R"({"inputs": [3]})")); }),
      "variable name");
}

}  // namespace
}  // namespace zfeed::loader
