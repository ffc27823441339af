#include "zfeed/zarr/array.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <libdeflate.h>
#include <lz4.h>
#include <unistd.h>
#include <zstd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <utility>

#include "zfeed/codec/crc32c.h"
#include "zfeed/store/http_testing.h"
#include "zfeed/store/store_testing.h"
#include "zfeed/util/error.h"
#include "zfeed/util/fork_gate.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/group.h"

namespace zfeed::zarr {
namespace {

using testing::error_of;

constexpr const char* kLittle = R"({"name": "bytes", "configuration": {"endian": "little"}})";

ArrayMetadata v3_meta(const std::string& dtype, std::vector<uint64_t> shape,
                      std::vector<uint64_t> chunks,
                      const std::string& codecs = std::string("[") + kLittle + "]",
                      const std::string& fill = "0",
                      const std::string& key_encoding = R"({"name": "default"})") {
  Json json = {{"zarr_format", 3},
               {"node_type", "array"},
               {"shape", shape},
               {"data_type", dtype},
               {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", chunks}}}}},
               {"chunk_key_encoding", Json::parse(key_encoding)},
               {"fill_value", Json::parse(fill)},
               {"codecs", Json::parse(codecs)}};
  return ArrayMetadata::parse_v3(json);
}

ArrayMetadata v2_meta(const std::string& dtype, std::vector<uint64_t> shape,
                      std::vector<uint64_t> chunks, const std::string& compressor = "null",
                      const std::string& fill = "0", const std::string& order = "C",
                      const std::string& separator = ".") {
  Json zarray = {{"zarr_format", 2},
                 {"shape", shape},
                 {"chunks", chunks},
                 {"dtype", dtype},
                 {"fill_value", Json::parse(fill)},
                 {"order", order},
                 {"filters", nullptr},
                 {"compressor", Json::parse(compressor)},
                 {"dimension_separator", separator}};
  return ArrayMetadata::parse_v2(zarray, Json());
}

// A dense C-order model of an array, for checking reads and writes against.
template <typename T>
struct Model {
  std::vector<uint64_t> shape;
  std::vector<T> values;

  Model(std::vector<uint64_t> s, T fill) : shape(std::move(s)) {
    uint64_t n = 1;
    for (uint64_t e : shape) n *= e;
    values.assign(n, fill);
  }
  template <typename F>
  void for_each(const Selection& selection, F&& visit) const {
    const size_t rank = shape.size();
    std::vector<uint64_t> count(rank), index(rank, 0);
    uint64_t total = 1;
    for (size_t d = 0; d < rank; ++d) total *= (count[d] = selection[d].count());
    for (uint64_t n = 0; n < total; ++n) {
      uint64_t flat = 0;
      for (size_t d = 0; d < rank; ++d)
        flat = flat * shape[d] + selection[d].start + index[d] * selection[d].step;
      visit(n, flat);
      for (size_t d = rank; d-- > 0;) {
        if (++index[d] < count[d]) break;
        index[d] = 0;
      }
    }
  }
  std::vector<T> read(const Selection& selection) const {
    uint64_t total = 1;
    for (const auto& s : selection) total *= s.count();
    std::vector<T> out(total);
    for_each(selection, [&](uint64_t n, uint64_t flat) { out[n] = values[flat]; });
    return out;
  }
  void write(const Selection& selection, const std::vector<T>& in) {
    for_each(selection, [&](uint64_t n, uint64_t flat) { values[flat] = in[n]; });
  }
};

template <typename T>
std::vector<T> read_all(const Array& array, const Selection& selection) {
  uint64_t total = 1;
  for (const auto& s : selection) total *= s.count();
  std::vector<T> out(total);
  array.read(selection, out.data());
  return out;
}

template <typename T>
std::vector<T> ramp(size_t n, T start = T{1}) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i));
  return v;
}

// Records every read of a watched store (key and range), to check that sharded reads fetch only
// what they need.
class ReadLog {
 public:
  explicit ReadLog(testing::WatchedStore& store) {
    store.on_read = [this](std::string_view key, const ByteRange& range) {
      std::lock_guard lock(mutex_);
      reads_.push_back({std::string(key), range});
    };
  }
  std::vector<KeyRange> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(reads_, {});
  }

 private:
  std::mutex mutex_;
  std::vector<KeyRange> reads_;
};

TEST(Array, CreateOpenReadWriteWhole) {
  for (bool on_disk : {false, true}) {
    SCOPED_TRACE(on_disk ? "file" : "memory");
    testing::TempDir dir;
    std::shared_ptr<Store> store = on_disk ? make_file_store(dir.path()) : make_memory_store();
    Array created = Array::create(store, "group/temp", v3_meta("float32", {6, 10}, {4, 4}));
    auto values = ramp<float>(60, 0.5f);
    created.write(created.full_selection(), values.data());
    Array array = Array::open(store, "/group/temp/");
    EXPECT_EQ(array.path(), "group/temp");
    EXPECT_EQ(read_all<float>(array, array.full_selection()), values);
    // Parent groups were created, as zarr-python does.
    EXPECT_TRUE(store->get("zarr.json").has_value());
    EXPECT_TRUE(store->get("group/zarr.json").has_value());
    EXPECT_TRUE(std::holds_alternative<Group>(open_node(store, "group")));
    // 2 x 3 chunks, keys in the default encoding.
    EXPECT_EQ(store->list("group/temp/c/").size(), 6u);
    EXPECT_TRUE(store->get("group/temp/c/1/2").has_value());
  }
}

TEST(Array, StridedSelectionsMatchTheModel) {
  struct Layout {
    const char* dtype;
    std::string codecs;
  } layouts[] = {
      {"int32", std::string("[") + kLittle + "]"},
      {"int32", R"([{"name": "transpose", "configuration": {"order": [2, 0, 1]}},
                    {"name": "bytes", "configuration": {"endian": "big"}}, {"name": "zstd"}, {"name": "crc32c"}])"},
      {"int32", R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 3, 2],
                    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}],
                    "index_location": "start"}}])"},
  };
  const std::vector<uint64_t> shape{7, 11, 5}, chunks{4, 6, 4};
  for (const auto& layout : layouts) {
    SCOPED_TRACE(layout.codecs);
    auto store = make_memory_store();
    Array array =
        Array::create(store, "a", v3_meta(layout.dtype, shape, chunks, layout.codecs, "-7"));
    Model<int32_t> model(shape, -7);
    // Missing chunks read as the fill value.
    EXPECT_EQ(read_all<int32_t>(array, array.full_selection()), model.values);
    // Strided writes, then strided reads.
    std::vector<Selection> writes = {
        {{0, 7, 2}, {1, 11, 3}, {0, 5, 1}},
        {{3, 4, 1}, {0, 11, 1}, {2, 5, 2}},
        {{1, 6, 4}, {5, 7, 1}, {0, 5, 4}},
    };
    int32_t next = 100;
    for (const auto& selection : writes) {
      uint64_t total = 1;
      for (const auto& s : selection) total *= s.count();
      auto in = ramp<int32_t>(total, next);
      next += 1000;
      array.write(selection, in.data());
      model.write(selection, in);
    }
    std::vector<Selection> reads = {
        array.full_selection(),
        {{0, 7, 3}, {0, 11, 2}, {1, 5, 3}},
        {{6, 7, 1}, {10, 11, 1}, {4, 5, 1}},
        {{2, 6, 1}, {3, 9, 5}, {0, 5, 2}},
        {{0, 7, 100}, {0, 11, 1}, {0, 5, 1}},
    };
    for (const auto& selection : reads) {
      EXPECT_EQ(read_all<int32_t>(Array::open(store, "a"), selection), model.read(selection));
    }
    // An empty selection reads and writes nothing.
    Selection empty{{3, 3, 1}, {0, 11, 1}, {0, 5, 1}};
    array.read(empty, nullptr);
    array.write(empty, nullptr);
  }
}

TEST(Array, EdgeChunksAreStoredFullAndCroppedOnRead) {
  auto store = make_memory_store();
  Array array = Array::create(
      store, "", v3_meta("uint16", {5, 7}, {2, 3}, std::string("[") + kLittle + "]", "9"));
  auto values = ramp<uint16_t>(35);
  array.write(array.full_selection(), values.data());
  // The corner chunk covers 1 x 1 valid element but is stored at the full 2 x 3.
  auto corner = store->get("c/2/2");
  ASSERT_TRUE(corner.has_value());
  ASSERT_EQ(corner->size(), 2u * 3 * 2);
  uint16_t stored[6];
  std::memcpy(stored, corner->data(), 12);
  EXPECT_EQ(stored[0], values[4 * 7 + 6]);
  for (int i = 1; i < 6; ++i) EXPECT_EQ(stored[i], 9) << "padding holds the fill value";
  EXPECT_EQ(read_all<uint16_t>(array, array.full_selection()), values);
  // Partial writes of an edge chunk keep the other values.
  uint16_t one = 500;
  array.write({{4, 5, 1}, {5, 6, 1}}, &one);
  values[4 * 7 + 5] = 500;
  EXPECT_EQ(read_all<uint16_t>(array, array.full_selection()), values);
}

TEST(Array, ChunksHoldingOnlyTheFillValueAreErased) {
  auto store = make_memory_store();
  Array array = Array::create(
      store, "x", v3_meta("float64", {4, 4}, {2, 2}, std::string("[") + kLittle + "]", "1.5"));
  std::vector<double> values(16, 1.5);
  values[0] = 2.0;
  array.write(array.full_selection(), values.data());
  EXPECT_EQ(store->list("x/c/"), (std::vector<std::string>{"x/c/0/0"}));
  // Writing the fill value back removes the chunk.
  double fill = 1.5;
  array.write({{0, 1, 1}, {0, 1, 1}}, &fill);
  EXPECT_TRUE(store->list("x/c/").empty());
  // -0.0 is not the fill value 0.0: such a chunk is kept.
  Array zero = Array::create(store, "z",
                             v3_meta("float64", {2}, {2}, std::string("[") + kLittle + "]", "0.0"));
  double negative_zero[2] = {-0.0, 0.0};
  zero.write(zero.full_selection(), negative_zero);
  EXPECT_TRUE(store->get("z/c/0").has_value());
  double back[2];
  zero.read(zero.full_selection(), back);
  EXPECT_TRUE(std::signbit(back[0]));
  // A NaN fill value is matched by bit pattern.
  Array nan = Array::create(
      store, "n", v3_meta("float32", {4}, {2}, std::string("[") + kLittle + "]", "\"NaN\""));
  float nans[4] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::quiet_NaN(),
                   1.0f, std::bit_cast<float>(0x7fc00001u)};
  nan.write(nan.full_selection(), nans);
  EXPECT_EQ(store->list("n/c/"), (std::vector<std::string>{"n/c/1"}));
  float read_back[4];
  nan.read(nan.full_selection(), read_back);
  EXPECT_EQ(std::bit_cast<uint32_t>(read_back[0]), 0x7fc00000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(read_back[3]), 0x7fc00001u);
}

TEST(Array, MissingChunksReadAsFill) {
  auto store = make_memory_store();
  Array array = Array::create(
      store, "",
      v3_meta("complex64", {3, 3}, {2, 2}, std::string("[") + kLittle + "]", "[1.0, -1.0]"));
  std::vector<float> out(18);
  array.read(array.full_selection(), out.data());
  for (size_t i = 0; i < 18; ++i) EXPECT_EQ(out[i], i % 2 ? -1.0f : 1.0f);
  // v2 with fill_value null: zeros, and chunks are never erased as "fill".
  Array v2 = Array::create(store, "v2", v2_meta("<i4", {4}, {2}, "null", "null"));
  std::vector<int32_t> values(4, 0);
  EXPECT_EQ(read_all<int32_t>(v2, v2.full_selection()), values);
  v2.write(v2.full_selection(), values.data());
  EXPECT_EQ(store->list("v2/").size(), 3u);  // .zarray + 2 chunks
}

TEST(Array, ZeroDimensionalArrays) {
  auto store = make_memory_store();
  Array v3 =
      Array::create(store, "s3", v3_meta("int64", {}, {}, std::string("[") + kLittle + "]", "0"));
  int64_t value = -9223372036854775807LL;
  v3.write({}, &value);
  EXPECT_TRUE(store->get("s3/c").has_value());
  int64_t back = 0;
  Array::open(store, "s3").read({}, &back);
  EXPECT_EQ(back, value);
  Array v2 = Array::create(store, "s2", v2_meta("<f8", {}, {}, R"({"id": "zlib", "level": 1})"));
  double d = 2.5;
  v2.write({}, &d);
  EXPECT_TRUE(store->get("s2/0").has_value());
  double back_d = 0;
  Array::open(store, "s2").read({}, &back_d);
  EXPECT_EQ(back_d, 2.5);
}

TEST(Array, ChunkKeyEncodings) {
  auto store = make_memory_store();
  struct Case {
    ArrayMetadata meta;
    const char* key;
  } cases[] = {
      {v3_meta("uint8", {4, 4}, {2, 2}, "[\"bytes\"]", "0"), "a/c/1/0"},
      {v3_meta("uint8", {4, 4}, {2, 2}, "[\"bytes\"]", "0",
               R"({"name": "default", "configuration": {"separator": "."}})"),
       "a/c.1.0"},
      {v3_meta("uint8", {4, 4}, {2, 2}, "[\"bytes\"]", "0", R"({"name": "v2"})"), "a/1.0"},
      {v3_meta("uint8", {4, 4}, {2, 2}, "[\"bytes\"]", "0",
               R"({"name": "v2", "configuration": {"separator": "/"}})"),
       "a/1/0"},
      {v2_meta("|u1", {4, 4}, {2, 2}), "a/1.0"},
      {v2_meta("|u1", {4, 4}, {2, 2}, "null", "0", "C", "/"), "a/1/0"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.key);
    Array array = Array::create(store, "a", c.meta, /*overwrite=*/true);
    const uint64_t index[] = {1, 0};
    EXPECT_EQ(array.chunk_key(index), c.key);
    uint8_t v = 7;
    array.write({{2, 3, 1}, {1, 2, 1}}, &v);
    EXPECT_EQ(store->list("a/").size(), c.meta.zarr_format == 3 ? 2u : 2u);
    EXPECT_TRUE(store->get(c.key).has_value());
    uint8_t back = 0;
    Array::open(store, "a").read({{2, 3, 1}, {1, 2, 1}}, &back);
    EXPECT_EQ(back, 7);
  }
}

TEST(Array, V2OrderFAndBigEndianRoundTrip) {
  auto store = make_memory_store();
  Array array = Array::create(
      store, "f", v2_meta(">i2", {5, 6}, {3, 4}, R"({"id": "zstd", "level": 1})", "0", "F"));
  auto values = ramp<int16_t>(30, -10);
  array.write(array.full_selection(), values.data());
  Array opened = Array::open(store, "f");
  EXPECT_EQ(opened.metadata().v2_order, 'F');
  EXPECT_EQ(read_all<int16_t>(opened, opened.full_selection()), values);
  // Chunk (0, 0) holds rows 0..2, columns 0..3 in Fortran order, big-endian.
  auto chunk = store->get("f/0.0");
  ASSERT_TRUE(chunk.has_value());
  Bytes raw(24);
  ASSERT_EQ(ZSTD_decompress(raw.data(), raw.size(), chunk->data(), chunk->size()), 24u);
  auto be16 = [&](size_t i) { return static_cast<int16_t>((raw[2 * i] << 8) | raw[2 * i + 1]); };
  EXPECT_EQ(be16(0), values[0]);  // (0, 0)
  EXPECT_EQ(be16(1), values[6]);  // (1, 0): Fortran order walks rows first
  EXPECT_EQ(be16(3), values[1]);  // (0, 1)
  // .zarray and .zattrs written as v2.
  Json zarray = Json::parse(store->get("f/.zarray")->as_string());
  EXPECT_EQ(zarray["order"], "F");
  EXPECT_EQ(zarray["dtype"], ">i2");
  EXPECT_EQ(zarray["compressor"]["id"], "zstd");
}

TEST(Array, ThreadsWritingPartsOfOneShardLoseNothing) {
  // Time steps of one shard written by threads at once, as a convert script's workers would.
  auto store = make_memory_store();
  const std::string codecs =
      R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 8],
      "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}])";
  Array array = Array::create(store, "s", v3_meta("float32", {32, 8}, {32, 8}, codecs, "\"NaN\""));
  std::vector<std::thread> writers;
  for (uint64_t w = 0; w < 8; ++w) {
    writers.emplace_back([&, w] {
      Array mine = Array::open(store, "s");
      for (uint64_t t = w; t < 32; t += 8) {
        std::vector<float> row(8, float(t));
        mine.write({{t, t + 1, 1}, {0, 8, 1}}, row.data());
      }
    });
  }
  for (auto& writer : writers) writer.join();
  std::vector<float> values(32 * 8);
  array.read(array.full_selection(), values.data());
  for (uint64_t t = 0; t < 32; ++t) EXPECT_EQ(values[t * 8], float(t)) << "step " << t;
}

TEST(Array, AForkWhileThreadsWriteShardsLeavesBothProcessesWriting) {
  // A thread changes steps of shards (read, change, encode on the pool, store) while the main
  // thread forks, as a DataLoader starting workers would: neither process may hang, and the
  // child writes the same shards.
  auto store = make_memory_store();
  const std::string codecs =
      R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 16],
      "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}])";
  Array array = Array::create(store, "s", v3_meta("float32", {256, 16}, {8, 16}, codecs, "0"));
  std::vector<float> zeros(256 * 16, 0.0f);
  array.write(array.full_selection(), zeros.data());  // the pool is running before the forks
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  std::vector<float> rows(32 * 16);
  std::thread writer([&] {
    for (uint64_t i = 0; !stop; ++i) {
      // Each write holds a fork pass, as zfeed's own threads' work does, so that no fork lands
      // inside the allocator (ASan's, unlike glibc's, is not made safe across fork).
      ForkGate::Pass working;
      std::fill(rows.begin(), rows.end(), float(i));
      array.write({{i % 8, 256, 8}, {0, 16, 1}}, rows.data());  // one step of every shard
      ++writes;
    }
  });
  // Forks from here on: the writer's start-up (allocations outside any pass) is over.
  while (writes == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int fork_number = 0; fork_number < 20; ++fork_number) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      std::vector<float> mine(32 * 16, -1.0f);
      array.write({{1, 256, 8}, {0, 16, 1}}, mine.data());
      std::vector<float> back(32 * 16);
      array.read({{1, 256, 8}, {0, 16, 1}}, back.data());
      ::_exit(back == mine ? 0 : 1);
    }
    ASSERT_EQ(testing::exit_status_of_child(child, 30), 0) << "fork " << fork_number;
  }
  stop = true;
  writer.join();
}

TEST(Array, ShardedPartialReadFetchesIndexAndOneInnerChunk) {
  auto store = std::make_shared<testing::WatchedStore>(make_memory_store());
  ReadLog log(*store);
  const std::string codecs =
      R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 4],
      "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}]}}])";
  Array array = Array::create(store, "s", v3_meta("float32", {16, 16}, {8, 8}, codecs));
  EXPECT_EQ(array.read_chunk_shape(), (std::vector<uint64_t>{4, 4}));
  std::vector<float> values(256);
  for (size_t i = 0; i < 256; ++i) values[i] = std::sin(0.1f * static_cast<float>(i)) + 2.0f;
  array.write(array.full_selection(), values.data());
  Array opened = Array::open(store, "s");
  log.take();
  // One element: the index (a suffix read) and one inner chunk (a range read) of one shard.
  float one = 0;
  opened.read({{9, 10, 1}, {13, 14, 1}}, &one);
  EXPECT_EQ(one, values[9 * 16 + 13]);
  auto reads = log.take();
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0].key, "s/c/1/1");
  EXPECT_EQ(reads[0].range.kind, ByteRange::Kind::kSuffix);
  EXPECT_EQ(reads[0].range.length, 4u * 16 + 4);
  EXPECT_EQ(reads[1].key, "s/c/1/1");
  EXPECT_EQ(reads[1].range.kind, ByteRange::Kind::kRange);
  EXPECT_LT(reads[1].range.length, 4u * 4 * 4 + 64);
  // A whole shard is one read; the whole array matches.
  std::vector<float> shard(64);
  opened.read({{8, 16, 1}, {0, 8, 1}}, shard.data());
  reads = log.take();
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].range.kind, ByteRange::Kind::kAll);
  Model<float> model({16, 16}, 0);
  model.values = values;
  EXPECT_EQ(shard, model.read({{8, 16, 1}, {0, 8, 1}}));
  EXPECT_EQ(read_all<float>(opened, opened.full_selection()), values);
  // A strided read across shards and inner chunks.
  Selection strided{{1, 16, 3}, {0, 16, 5}};
  EXPECT_EQ(read_all<float>(opened, strided), model.read(strided));
}

// A read of the first time steps of a chunk of many decodes only the start of its zstd stream:
// shown by cutting the stored chunk after its first third, which those reads never reach. The
// last steps then fail with the key; a region reaching past 7/8 of the chunk decodes it whole.
TEST(Array, EarlyStepsOfAChunkDecodeOnlyTheStartOfItsStream) {
  auto store = make_memory_store();
  const std::string codecs = std::string("[") + kLittle + R"(, {"name": "zstd"}])";
  Array array = Array::create(store, "t", v3_meta("float32", {8, 256, 256}, {8, 256, 256}, codecs));
  std::vector<float> values(8 * 256 * 256);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = 280.0f + 10.0f * std::sin(0.001f * static_cast<float>(i % 65536)) +
                static_cast<float>(i / 65536);
  }
  array.write(array.full_selection(), values.data());
  Bytes stored = *store->get("t/c/0/0/0");
  stored.resize(stored.size() / 3);
  store->set("t/c/0/0/0", stored);
  const size_t plane = 256 * 256;
  std::vector<float> step(plane);
  array.read({{0, 1, 1}, {0, 256, 1}, {0, 256, 1}}, step.data());
  EXPECT_TRUE(std::equal(step.begin(), step.end(), values.begin()));
  std::vector<float> rows(2 * 256);  // rows 10 and 11 of step 1: a strided, cropped region
  array.read({{1, 2, 1}, {10, 12, 1}, {0, 256, 1}}, rows.data());
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), values.begin() + plane + 10 * 256));
  EXPECT_CONTAINS(error_of([&] {
                    array.read({{6, 7, 1}, {0, 256, 1}, {0, 256, 1}}, step.data());
                  }),
                  "t/c/0/0/0");
  // The whole chunk is decoded as a whole.
  EXPECT_CONTAINS(error_of([&] { array.read(array.full_selection(), values.data()); }),
                  "t/c/0/0/0");
}

// A read of part of an uncompressed chunk fetches only the bytes from the part's first element to
// its last: one time step of a chunk of many, a crop, an inner chunk's part inside a shard.
TEST(Array, PartialReadsOfUncompressedChunksFetchOnlyTheirBytes) {
  auto store = std::make_shared<testing::WatchedStore>(make_memory_store());
  ReadLog log(*store);
  const std::vector<uint64_t> shape{8, 16, 32};
  Array array = Array::create(store, "u", v3_meta("float32", shape, shape));
  Model<float> model(shape, 0);
  model.values = ramp<float>(8 * 16 * 32);
  array.write(array.full_selection(), model.values.data());
  log.take();

  const uint64_t plane = 16 * 32;
  const Selection step{{3, 4, 1}, {0, 16, 1}, {0, 32, 1}};
  EXPECT_EQ(read_all<float>(array, step), model.read(step));
  auto reads = log.take();
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].key, "u/c/0/0/0");
  EXPECT_EQ(reads[0].range.kind, ByteRange::Kind::kRange);
  EXPECT_EQ(reads[0].range.offset, 3 * plane * 4);
  EXPECT_EQ(reads[0].range.length, plane * 4);

  const Selection crop{{5, 6, 1}, {4, 6, 1}, {10, 20, 1}};  // rows 4..5, columns 10..19
  EXPECT_EQ(read_all<float>(array, crop), model.read(crop));
  reads = log.take();
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].range.offset, (5 * plane + 4 * 32) * 4);
  EXPECT_EQ(reads[0].range.length, (32 + 20) * 4u);

  for (const Selection& selection :
       {Selection{{1, 8, 3}, {2, 3, 1}, {0, 32, 5}}, Selection{{7, 8, 1}, {15, 16, 1}, {31, 32, 1}},
        Selection{{0, 8, 2}, {0, 16, 1}, {0, 32, 1}}}) {
    EXPECT_EQ(read_all<float>(array, selection), model.read(selection));
  }
  // The whole chunk is still one whole read.
  EXPECT_EQ(read_all<float>(array, array.full_selection()), model.values);
  reads = log.take();
  ASSERT_FALSE(reads.empty());
  EXPECT_EQ(reads.back().range.kind, ByteRange::Kind::kAll);

  // Inside a shard: the part of the inner chunk, by range, after the index.
  const std::string sharded = R"([{"name": "sharding_indexed", "configuration": {
      "chunk_shape": [4, 16, 32], "codecs": [)" +
                              std::string(kLittle) + "]}}]";
  Array shards = Array::create(store, "s", v3_meta("float32", shape, shape, sharded));
  shards.write(shards.full_selection(), model.values.data());
  log.take();
  const Selection late{{6, 7, 1}, {0, 16, 1}, {0, 32, 1}};
  EXPECT_EQ(read_all<float>(shards, late), model.read(late));
  reads = log.take();
  ASSERT_EQ(reads.size(), 2u);  // the index, then the step
  EXPECT_EQ(reads[1].range.kind, ByteRange::Kind::kRange);
  EXPECT_EQ(reads[1].range.length, plane * 4);
  // An index that gives the second inner chunk half its size: every read of it fails, naming the
  // shard and the sizes, and none reads the bytes after it (the index); the first inner chunk
  // still reads.
  Bytes shard = *store->get("s/c/0/0/0", ByteRange::all());
  const size_t index_at = shard.size() - (2 * 16 + 4);
  uint64_t nbytes = 2 * plane * 4;
  std::memcpy(shard.data() + index_at + 16 + 8, &nbytes, 8);
  const uint32_t checksum = crc32c(ByteView{shard.data() + index_at, 2 * 16});
  std::memcpy(shard.data() + index_at + 2 * 16, &checksum, 4);
  store->set("s/c/0/0/0", shard);
  const Selection first{{1, 2, 1}, {0, 16, 1}, {0, 32, 1}};
  EXPECT_EQ(read_all<float>(shards, first), model.read(first));
  const Selection early{{4, 5, 1}, {0, 16, 1}, {0, 32, 1}};
  for (const Selection& selection : {early, late, Selection{{4, 8, 2}, {1, 3, 1}, {0, 32, 7}}}) {
    const std::string message = error_of([&] { read_all<float>(shards, selection); });
    EXPECT_CONTAINS(message, "s/c/0/0/0");
    EXPECT_CONTAINS(message, "chunk holds 4096 bytes, expected 8192 for shape [4, 16, 32]");
  }

  // A chunk cut short, or too long, fails every read of it naming the key, as a whole read does.
  const Bytes whole = *store->get("u/c/0/0/0", ByteRange::all());
  for (const size_t size : {whole.size() / 2, whole.size() + 4}) {
    Bytes stored = whole;
    stored.resize(size);
    store->set("u/c/0/0/0", stored);
    for (const Selection& selection : {step, crop, array.full_selection()}) {
      const std::string message = error_of([&] { read_all<float>(array, selection); });
      EXPECT_CONTAINS(message, "u/c/0/0/0");
      EXPECT_CONTAINS(message, "chunk holds " + std::to_string(size) + " bytes, expected " +
                                   std::to_string(whole.size()) + " for shape [8, 16, 32]");
    }
  }
}

TEST(Array, NestedShardsPartialAndWhole) {
  auto store = make_memory_store();
  const std::string codecs =
      R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 4],
      "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 2],
                  "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                  "index_location": "start"}}]}}])";
  Array array = Array::create(store, "", v3_meta("int32", {10, 12}, {8, 8}, codecs, "-1"));
  EXPECT_EQ(array.read_chunk_shape(), (std::vector<uint64_t>{2, 2}));
  Model<int32_t> model({10, 12}, -1);
  auto values = ramp<int32_t>(120);
  model.values = values;
  array.write(array.full_selection(), values.data());
  for (const Selection& selection : std::vector<Selection>{{{0, 10, 1}, {0, 12, 1}},
                                                           {{5, 6, 1}, {3, 4, 1}},
                                                           {{0, 8, 1}, {0, 8, 1}},
                                                           {{1, 10, 2}, {2, 12, 3}}}) {
    EXPECT_EQ(read_all<int32_t>(array, selection), model.read(selection));
  }
  // Partly written shards: untouched inner chunks read as fill.
  auto store2 = make_memory_store();
  Array sparse = Array::create(store2, "", v3_meta("int32", {10, 12}, {8, 8}, codecs, "-1"));
  int32_t v = 42;
  sparse.write({{9, 10, 1}, {11, 12, 1}}, &v);
  Model<int32_t> sparse_model({10, 12}, -1);
  sparse_model.values[9 * 12 + 11] = 42;
  EXPECT_EQ(read_all<int32_t>(sparse, sparse.full_selection()), sparse_model.values);
  EXPECT_EQ(read_all<int32_t>(sparse, {{8, 10, 1}, {8, 12, 1}}),
            sparse_model.read({{8, 10, 1}, {8, 12, 1}}));
  EXPECT_EQ(store2->list("c/"), (std::vector<std::string>{"c/1/1"}));
}

// locate_stored finds, without reading them, exactly the bytes read_stored reads: whole chunk
// files, and inner chunks of shards with the index at either end; absent chunks (a missing
// chunk, an inner chunk left out of its shard, a missing shard) are absent for both.
TEST(Array, LocateStoredPointsAtTheBytesReadStoredReads) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  const std::string inner =
      std::string("[") + kLittle + R"(, {"name": "zstd", "configuration": {"level": 1}}])";
  auto sharded = [&](const std::string& location) {
    return R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 4], "codecs": )" +
           inner + R"(, "index_location": ")" + location + R"("}}])";
  };
  struct Case {
    std::string name;
    std::vector<uint64_t> chunks;
    std::string codecs;
  };
  for (const Case& c : {Case{"plain", {2, 4}, inner}, Case{"index_end", {4, 8}, sharded("end")},
                        Case{"index_start", {4, 8}, sharded("start")}}) {
    SCOPED_TRACE(c.name);
    Array array = Array::create(store, c.name, v3_meta("float32", {12, 8}, c.chunks, c.codecs));
    ASSERT_EQ(array.read_chunk_shape(), (std::vector<uint64_t>{2, 4}));
    EXPECT_TRUE(array.stored_locally());
    // Fill values (0) in read chunks (0, 1) and (3, *), and in rows 8.. (a whole shard).
    std::vector<float> values(12 * 8);
    for (uint64_t y = 0; y < 12; ++y) {
      for (uint64_t x = 0; x < 8; ++x) {
        const bool fill = (y < 2 && x >= 4) || (y >= 6 && y < 8) || y >= 8;
        values[y * 8 + x] = fill ? 0.0f : 1.0f + std::sin(0.3f * static_cast<float>(y * 8 + x));
      }
    }
    array.write(array.full_selection(), values.data());
    uint64_t present = 0;
    for (uint64_t y = 0; y < 6; ++y) {
      for (uint64_t x = 0; x < 2; ++x) {
        SCOPED_TRACE("read chunk " + std::to_string(y) + ", " + std::to_string(x));
        const std::vector<uint64_t> index{y, x};
        const bool absent = (y == 0 && x == 1) || y >= 3;
        Bytes stored;
        std::string read_where, locate_where;
        ASSERT_EQ(array.read_stored(index, stored, &read_where), !absent);
        Array::StoredLocation location;
        ASSERT_EQ(array.locate_stored(index, location, &locate_where), !absent);
        EXPECT_EQ(locate_where, read_where);
        if (absent) continue;
        ++present;
        const std::string key = c.name == "plain"
                                    ? array.chunk_key(index)
                                    : array.chunk_key(std::vector<uint64_t>{y / 2, 0});
        EXPECT_EQ(location.path, dir / key);
        EXPECT_CONTAINS(read_where, key);
        ASSERT_EQ(location.size, stored.size());
        if (c.name == "plain") {
          EXPECT_EQ(location.offset, 0u);
        } else if (c.name == "index_start") {
          EXPECT_GE(location.offset, 4u * 16 + 4);  // past the index
        }
        const Bytes located =
            testing::read_file_range(location.path, location.offset, location.size);
        EXPECT_TRUE(testing::same_bytes(located.data(), stored.data(), stored.size()));
      }
    }
    EXPECT_EQ(present, 5u);
  }
}

// Only a store of local files has places to hand out; elsewhere locate_stored says so, naming
// the array, before looking anything up.
TEST(Array, LocateStoredNeedsAStoreOfLocalFiles) {
  auto store = make_memory_store();
  Array array = Array::create(
      store, "group/temperature",
      v3_meta("float32", {4, 4}, {2, 2}, std::string("[") + kLittle + R"(, "zstd"])"));
  std::vector<float> values(16, 2.5f);
  array.write(array.full_selection(), values.data());
  EXPECT_FALSE(array.stored_locally());
  Bytes stored;
  EXPECT_TRUE(array.read_stored(std::vector<uint64_t>{1, 1}, stored));
  Array::StoredLocation location;
  const std::string message = error_of([&] {
    array.locate_stored(std::vector<uint64_t>{1, 1}, location);
  });
  EXPECT_CONTAINS(message, "group/temperature");
  EXPECT_CONTAINS(message, "no local files");
}

// A corrupt shard index is reported by locate_stored as by read_stored.
TEST(Array, LocateStoredReportsABadShardIndexLikeReadStored) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  Array array = Array::create(
      store, "s",
      v3_meta("float32", {4, 4}, {4, 4},
              R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 2],
                  "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}])"));
  std::vector<float> values(16, 1.5f);
  array.write(array.full_selection(), values.data());
  Bytes shard = *store->get("s/c/0/0");
  shard[shard.size() - 4 * 16 - 4 + 1] ^= 0x40;  // a byte of the index; its crc32c no longer fits
  store->set("s/c/0/0", shard);
  const std::vector<uint64_t> index{1, 0};
  Bytes stored;
  Array::StoredLocation location;
  const std::string read_error = error_of([&] { array.read_stored(index, stored); });
  const std::string locate_error = error_of([&] { array.locate_stored(index, location); });
  EXPECT_CONTAINS(read_error, "crc32c checksum mismatch");
  EXPECT_EQ(locate_error, read_error);
  // A chunk index of the wrong rank: the same complaint, naming the operation.
  const std::vector<uint64_t> flat{1};
  EXPECT_CONTAINS(error_of([&] { array.locate_stored(flat, location); }),
                  "locate_stored: chunk index of 1 dimensions");
}

TEST(Array, ReadMany) {
  auto store = make_memory_store();
  Array array = Array::create(
      store, "", v3_meta("uint32", {6, 6}, {4, 4}, std::string("[") + kLittle + R"(, "zstd"])"));
  auto values = ramp<uint32_t>(36);
  array.write(array.full_selection(), values.data());
  Model<uint32_t> model({6, 6}, 0);
  model.values = values;
  std::vector<Selection> selections = {
      {{0, 6, 1}, {0, 6, 1}}, {{2, 5, 2}, {1, 6, 2}}, {{3, 3, 1}, {0, 6, 1}}};
  std::vector<std::vector<uint32_t>> outs(3);
  std::vector<void*> pointers;
  for (size_t i = 0; i < 3; ++i) {
    uint64_t total = 1;
    for (const auto& s : selections[i]) total *= s.count();
    outs[i].resize(total);
    pointers.push_back(outs[i].data());
  }
  array.read_many(selections, pointers);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(outs[i], model.read(selections[i])) << i;
}

TEST(Array, CreateRefusesExistingNodesUnlessOverwrite) {
  auto store = make_memory_store();
  Array first = Array::create(store, "a", v3_meta("uint8", {4}, {2}, "[\"bytes\"]", "0"));
  uint8_t values[4] = {1, 2, 3, 4};
  first.write(first.full_selection(), values);
  std::string message =
      error_of([&] { Array::create(store, "a", v3_meta("uint8", {4}, {2}, "[\"bytes\"]", "0")); });
  EXPECT_CONTAINS(message, "/a: a Zarr node already exists");
  Array second = Array::create(store, "a", v3_meta("uint8", {8}, {8}, "[\"bytes\"]", "0"), true);
  EXPECT_EQ(store->list("a/"), (std::vector<std::string>{"a/zarr.json"}));  // old chunks removed
  EXPECT_EQ(Array::open(store, "a").metadata().shape, (std::vector<uint64_t>{8}));
  EXPECT_THROW(Array::create(store, "../x", v3_meta("uint8", {4}, {2}, "[\"bytes\"]", "0")), Error);
}

TEST(Array, AttributesAndDimensionNames) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  ArrayMetadata meta = v3_meta("int8", {2, 3}, {2, 3}, "[\"bytes\"]", "0");
  meta.dimension_names = std::vector<std::optional<std::string>>{"y", std::nullopt};
  meta.attributes = {{"units", "m"}};
  Array array = Array::create(store, "", meta);
  array.set_attributes({{"units", "km"}, {"z", 1}});
  EXPECT_EQ(array.metadata().attributes["units"], "km");
  Array opened = Array::open(store);
  EXPECT_EQ(opened.metadata().attributes, Json({{"units", "km"}, {"z", 1}}));
  EXPECT_EQ(*opened.metadata().dimension_names, meta.dimension_names);
  EXPECT_THROW(array.set_attributes(Json::array()), Error);
  // v2: attributes and dimension names live in .zattrs.
  ArrayMetadata v2 = v2_meta("<u2", {3}, {2});
  v2.dimension_names = std::vector<std::optional<std::string>>{"x"};
  Array a2 = Array::create(store, "v2", v2);
  a2.set_attributes({{"long_name", "distance"}});
  Json zattrs = Json::parse(store->get("v2/.zattrs")->as_string());
  EXPECT_EQ(zattrs, Json::parse(R"({"long_name": "distance", "_ARRAY_DIMENSIONS": ["x"]})"));
  EXPECT_EQ(Array::open(store, "v2").metadata().attributes,
            Json::parse(R"({"long_name": "distance"})"));
}

TEST(Array, StorageInfo) {
  auto store = make_memory_store();
  Array array = Array::create(store, "a", v3_meta("uint8", {10}, {4}, "[\"bytes\"]", "0"));
  uint8_t v = 1;
  array.write({{9, 10, 1}}, &v);
  StorageInfo info = array.storage_info();
  EXPECT_EQ(info.objects_total, 3u);
  EXPECT_EQ(info.objects_present, 1u);
  EXPECT_EQ(info.stored_bytes, 4u);
  // Stray files beside the chunks, and keys off the grid, are no chunks.
  for (const char* stray : {"a/.DS_Store", "a/c/notes.txt", "a/c/7", "a/c/01", "a/c/2/0", "a/c"})
    store->set(stray, as_bytes("x"));
  info = array.storage_info();
  EXPECT_EQ(info.objects_present, 1u);
  EXPECT_EQ(info.stored_bytes, 4u);
  // The chunk keys of every encoding read back; others do not.
  ChunkKeyEncoding dotted{ChunkKeyEncoding::Kind::kV2, '.'};
  EXPECT_EQ(dotted.decode("3.0.12", 3), (std::vector<uint64_t>{3, 0, 12}));
  EXPECT_EQ(dotted.decode("0", 0), std::vector<uint64_t>{});
  EXPECT_FALSE(dotted.decode("3.0", 3));
  EXPECT_FALSE(dotted.decode("3.-1.2", 3));
  ChunkKeyEncoding nested{ChunkKeyEncoding::Kind::kDefault, '/'};
  EXPECT_EQ(nested.decode("c/4/5", 2), (std::vector<uint64_t>{4, 5}));
  EXPECT_EQ(nested.decode("c", 0), std::vector<uint64_t>{});
  EXPECT_FALSE(nested.decode("c/4/5/", 2));
  EXPECT_FALSE(nested.decode("d/4/5", 2));
}

TEST(Array, SelectionErrors) {
  auto store = make_memory_store();
  Array array = Array::create(store, "", v3_meta("uint8", {4, 4}, {2, 2}, "[\"bytes\"]", "0"));
  uint8_t out[16];
  EXPECT_CONTAINS(error_of([&] {
                    array.read({{0, 4, 1}}, out);
                  }),
                  "selection has 1 dimensions, the array has 2");
  EXPECT_CONTAINS(error_of([&] {
                    array.read({{0, 5, 1}, {0, 4, 1}}, out);
                  }),
                  "out of bounds for dimension 0");
  EXPECT_CONTAINS(error_of([&] { array.read({{3, 2, 1}, {0, 4, 1}}, out); }), "out of bounds");
  EXPECT_CONTAINS(error_of([&] {
                    array.write({{0, 4, 0}, {0, 4, 1}}, out);
                  }),
                  "step must be positive");
}

TEST(Array, OpenErrorsNameTheDocument) {
  auto store = make_memory_store();
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { Array::open(store, "nothing"); }),
                  "no Zarr array here");
  Group::create(store, "g");
  EXPECT_CONTAINS(error_of<NotFoundError>([&] { Array::open(store, "g"); }),
                  "is a group, not an array");

  struct Case {
    std::string text;
    std::string expected;
  } cases[] = {
      {"{\"zarr_format\": 3, \"node_type\": \"array\",", "invalid JSON"},  // truncated
      {"{\"zarr_format\": 3,, }", "invalid JSON"},                         // malformed
      {"", "invalid JSON"},
      {"[1, 2]", "metadata must be a JSON object"},
      {R"({"zarr_format": 3, "node_type": "array"})", "missing required field \"shape\""},
      {R"({"zarr_format": 3, "node_type": "array", "shape": "x"})", "\"shape\" must be an array"},
      {R"({"zarr_format": 3, "node_type": "array", "shape": [2], "data_type": "float32",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
           "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
           "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zfp"}]})",
       "unsupported codec \"zfp\""},
      {R"({"zarr_format": 3, "node_type": "array", "shape": [2], "data_type": "float32",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
           "chunk_key_encoding": {"name": "default"}, "fill_value": 0, "codecs": {"name": "bytes"}})",
       "codecs must be an array"},
      {R"({"zarr_format": 3, "node_type": "array", "shape": [2], "data_type": "float32",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
           "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
           "codecs": [{"name": "bytes", "configuration": {"endian": "little", "x": 1}}]})",
       "unknown configuration field \"x\""},
      {R"({"zarr_format": 3, "node_type": "array", "shape": [2], "data_type": "float32",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
           "chunk_key_encoding": {"name": "default"}, "fill_value": {"re": 1},
           "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]})",
       "fill_value"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    store->set("bad/zarr.json", as_bytes(c.text));
    std::string message = error_of([&] { Array::open(store, "bad"); });
    EXPECT_CONTAINS(message, "bad/zarr.json");
    EXPECT_CONTAINS(message, c.expected);
  }
  store->erase("bad/zarr.json");
  store->set("bad/.zarray",
             as_bytes(R"({"zarr_format": 2, "shape": [2], "chunks": [2], "dtype": "<f4",)"));
  EXPECT_CONTAINS(error_of([&] { Array::open(store, "bad"); }), "bad/.zarray");
  store->set(
      "bad/.zarray",
      as_bytes(R"({"zarr_format": 2, "shape": [2], "chunks": [2], "dtype": "<f4", "order": "C",
                                          "fill_value": 0, "filters": null, "compressor": null})"));
  store->set("bad/.zattrs", as_bytes("{oops"));
  EXPECT_CONTAINS(error_of([&] { Array::open(store, "bad"); }), "bad/.zattrs");
}

// Bad chunk data, met through Array::read: every error names the chunk's key and the fault.
class BadChunks : public ::testing::Test {
 protected:
  // Creates array "t" with one 4x4 float32 chunk (in a 4x8 array) and `codecs`; returns the
  // good encoded bytes of chunk c/0/0.
  Bytes setup(const std::string& codecs) {
    array_ = std::make_unique<Array>(
        Array::create(store_, "t", v3_meta("float32", {4, 8}, {4, 4}, codecs, "0"), true));
    std::vector<float> values(32);
    for (size_t i = 0; i < 32; ++i) values[i] = 1.0f + static_cast<float>(i % 5);
    array_->write(array_->full_selection(), values.data());
    return *store_->get("t/c/0/0");
  }
  std::string read_error(ByteView chunk, bool whole = true) {
    store_->set("t/c/0/0", chunk);
    std::vector<float> out(32);
    Selection selection = whole ? array_->full_selection() : Selection{{1, 2, 1}, {1, 2, 1}};
    std::string message = error_of([&] { array_->read(selection, out.data()); });
    EXPECT_CONTAINS(message, "t/c/0/0");
    return message;
  }
  std::shared_ptr<Store> store_ = make_memory_store();
  std::unique_ptr<Array> array_;
};

const std::string kRaw = std::string("[") + kLittle + "]";

TEST_F(BadChunks, ChunkTooShortOrLongForItsShape) {
  Bytes good = setup(kRaw);
  EXPECT_CONTAINS(read_error(good.view().first(60)),
                  "chunk holds 60 bytes, expected 64 for shape [4, 4] of float32");
  EXPECT_CONTAINS(read_error(good.view().first(60), false), "chunk holds 60 bytes, expected 64");
  Bytes longer(good);
  longer.append(as_bytes("x"));
  EXPECT_CONTAINS(read_error(longer), "chunk holds 65 bytes");
  // With a compressor the size mismatch is found after decoding.
  Bytes zgood = setup(std::string("[") + kLittle + R"(, "crc32c"])");
  Bytes shorter(zgood.view().first(40));
  uint32_t crc = crc32c(shorter);
  shorter.append({reinterpret_cast<uint8_t*>(&crc), 4});
  EXPECT_CONTAINS(read_error(shorter), "chunk holds 40 bytes, expected 64");
}

TEST_F(BadChunks, CorruptZstd) {
  Bytes good =
      setup(std::string("[") + kLittle + R"(, {"name": "zstd", "configuration": {"level": 3}}])");
  EXPECT_CONTAINS(read_error(good.view().first(good.size() - 3)), "zstd");
  EXPECT_CONTAINS(read_error(testing::pseudo_random_bytes(50, 1)), "zstd: not a zstd frame");
  Bytes flipped = good;
  flipped[4] ^= 0xFF;  // frame header descriptor
  EXPECT_CONTAINS(read_error(flipped), "zstd");
}

TEST_F(BadChunks, CorruptGzipAndZlib) {
  Bytes good =
      setup(std::string("[") + kLittle + R"(, {"name": "gzip", "configuration": {"level": 5}}])");
  EXPECT_CONTAINS(read_error(good.view().first(good.size() / 2)),
                  "gzip: corrupt or truncated stream");
  Bytes flipped = good;
  flipped[good.size() - 6] ^= 0x10;  // the CRC-32 trailer
  EXPECT_CONTAINS(read_error(flipped), "gzip");
  good = setup(std::string("[") + kLittle + R"(, "numcodecs.zlib"])");
  EXPECT_CONTAINS(read_error(good.view().first(good.size() - 1)), "zlib");
}

TEST_F(BadChunks, CorruptBlosc) {
  Bytes good = setup(
      std::string("[") + kLittle +
      R"(, {"name": "blosc", "configuration": {"cname": "lz4", "shuffle": "shuffle", "typesize": 4}}])");
  EXPECT_CONTAINS(read_error(good.view().first(good.size() - 1)),
                  "blosc: corrupt or truncated frame");
  EXPECT_CONTAINS(read_error(good.view().first(10)), "blosc");
  EXPECT_CONTAINS(read_error(testing::pseudo_random_bytes(80, 3)), "blosc");
}

TEST_F(BadChunks, Crc32cMismatch) {
  Bytes good = setup(std::string("[") + kLittle + R"(, "zstd", "crc32c"])");
  Bytes bad = good;
  bad[0] ^= 1;
  std::string message = read_error(bad);
  EXPECT_CONTAINS(message, "crc32c checksum mismatch");
  EXPECT_CONTAINS(read_error(bad, false), "crc32c checksum mismatch");
}

TEST_F(BadChunks, ShardIndexPointingOutsideTheShard) {
  Bytes good = setup(R"([{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 2],
      "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}])");
  const size_t index_at = good.size() - (4 * 16 + 4);
  Bytes bad = good;
  uint64_t offset = good.size() + 100, nbytes = 16;
  std::memcpy(bad.data() + index_at, &offset, 8);  // inner chunk [0, 0]
  std::memcpy(bad.data() + index_at + 8, &nbytes, 8);
  uint32_t crc = crc32c({bad.data() + index_at, 64});
  std::memcpy(bad.data() + bad.size() - 4, &crc, 4);
  std::string whole = read_error(bad);
  EXPECT_CONTAINS(whole, "inner chunk [0, 0]");
  EXPECT_CONTAINS(whole, "outside");
  // Partial read of inner chunk [0, 0]: found by the range read.
  std::string partial = read_error(bad, false);
  EXPECT_CONTAINS(partial, "outside");
  // A corrupt index checksum.
  Bytes broken = good;
  broken[index_at + 1] ^= 0x40;
  EXPECT_CONTAINS(read_error(broken, false), "shard index: crc32c checksum mismatch");
  EXPECT_CONTAINS(read_error(broken, true), "crc32c checksum mismatch");
  // Shorter than the index.
  EXPECT_CONTAINS(read_error(good.view().first(20), false), "too short for its 68-byte index");
  EXPECT_CONTAINS(read_error(good.view().first(20), true), "too short for its 68-byte index");
}

Bytes zstd_frame(ByteView data, bool content_size) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, content_size ? 1 : 0);
  Bytes out(ZSTD_compressBound(data.size()) + 64);
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  while (ZSTD_compressStream2(cctx, &o, &in, ZSTD_e_end) != 0) {
  }
  ZSTD_freeCCtx(cctx);
  out.resize(o.pos);
  return out;
}

TEST_F(BadChunks, DecompressionBombs) {
  Bytes zeros(64 << 20);
  std::memset(zeros.data(), 0, zeros.size());
  // zstd, with and without a content size.
  setup(std::string("[") + kLittle + R"(, "zstd"])");
  EXPECT_CONTAINS(read_error(zstd_frame(zeros, true)), "more than the expected 64");
  EXPECT_CONTAINS(read_error(zstd_frame(zeros, false)), "more than the expected 64");
  // gzip and zlib.
  for (bool gzip : {true, false}) {
    setup(std::string("[") + kLittle +
          (gzip ? R"(, {"name": "gzip", "configuration": {"level": 1}}])"
                : R"(, "numcodecs.zlib"])"));
    libdeflate_compressor* c = libdeflate_alloc_compressor(9);
    Bytes bomb(1 << 20);
    size_t n =
        gzip ? libdeflate_gzip_compress(c, zeros.data(), zeros.size(), bomb.data(), bomb.size())
             : libdeflate_zlib_compress(c, zeros.data(), zeros.size(), bomb.data(), bomb.size());
    libdeflate_free_compressor(c);
    ASSERT_GT(n, 0u);
    bomb.resize(n);
    EXPECT_CONTAINS(read_error(bomb), "more than the expected 64");
  }
  // blosc: a frame whose header says 4 MiB.
  Bytes bomb = setup(std::string("[") + kLittle +
                     R"(, {"name": "blosc", "configuration": {"cname": "zstd"}}])");
  {
    auto big_store = make_memory_store();
    Array big = Array::create(
        big_store, "",
        v3_meta("uint8", {1 << 22}, {1 << 22},
                std::string(
                    "[\"bytes\", {\"name\": \"blosc\", \"configuration\": {\"cname\": \"zstd\"}}]"),
                "1"));
    std::vector<uint8_t> big_values(1 << 22, 0);
    big.write(big.full_selection(), big_values.data());
    bomb = *big_store->get("c/0");
  }
  EXPECT_CONTAINS(read_error(bomb), "blosc: frame holds 4194304 bytes, expected 64");
  // numcodecs.lz4: a header that says 64 MiB.
  setup(std::string("[") + kLittle + R"(, "numcodecs.lz4"])");
  Bytes lz4(4 + LZ4_compressBound(1 << 20));
  uint32_t claimed = 64u << 20;
  std::memcpy(lz4.data(), &claimed, 4);
  int n = LZ4_compress_default(reinterpret_cast<const char*>(zeros.data()),
                               reinterpret_cast<char*>(lz4.data() + 4), 1 << 20,
                               static_cast<int>(lz4.size() - 4));
  lz4.resize(4 + static_cast<size_t>(n));
  EXPECT_CONTAINS(read_error(lz4), "lz4: header says 67108864 bytes, expected 64");
}

TEST_F(BadChunks, WriteOverACorruptChunkNamesIt) {
  Bytes good = setup(std::string("[") + kLittle + R"(, "zstd"])");
  store_->set("t/c/0/0", as_bytes("garbage"));
  float v = 3;
  std::string message = error_of([&] { array_->write({{0, 1, 1}, {0, 1, 1}}, &v); });
  EXPECT_CONTAINS(message, "t/c/0/0: zstd");
}

TEST_F(BadChunks, FileStoreErrorsNameTheFile) {
  testing::TempDir dir;
  store_ = make_file_store(dir.path());
  Bytes good = setup(kRaw);
  store_->set("t/c/0/0", good.view().first(10));
  std::vector<float> out(32);
  std::string message = error_of([&] { array_->read(array_->full_selection(), out.data()); });
  EXPECT_CONTAINS(message, "file://" + dir.path() + "/t/c/0/0");
  EXPECT_CONTAINS(message, "chunk holds 10 bytes, expected 64");
}

// Conformance: arrays written by zarrs, every data type and codec in scope, against the plain
// bytes variant of the same data type.
TEST(Conformance, ZarrsSnapshots) {
  ZFEED_REQUIRE_SHARED(root, "conformance/zarrs-snapshots/supported/regular");
  namespace fs = std::filesystem;
  const std::set<std::string> types = {"bool",     "int8",    "int16",   "int32",     "int64",
                                       "uint8",    "uint16",  "uint32",  "uint64",    "float16",
                                       "bfloat16", "float32", "float64", "complex64", "complex128"};
  const std::set<std::string> codecs = {
      "bytes",  "transpose",        "gzip",           "zstd",         "blosc",
      "crc32c", "sharding_indexed", "numcodecs.zlib", "numcodecs.lz4"};
  size_t checked = 0, unsupported = 0;
  for (const auto& type : types) {
    if (!fs::is_directory(root + "/" + type)) continue;
    // Reference values per fill value, from the a2b/bytes variants.
    std::map<std::string, std::vector<uint8_t>> reference;
    for (const auto& entry : fs::directory_iterator(root + "/" + type + "/a2b/bytes")) {
      auto store = make_file_store(entry.path().string());
      Array array = Array::open(store);
      std::vector<uint8_t> values(array.metadata().num_elements() * array.metadata().dtype.size());
      array.read(array.full_selection(), values.data());
      reference[fill_value_to_json(array.metadata().fill_value, array.metadata().dtype).dump()] =
          values;
    }
    ASSERT_FALSE(reference.empty()) << type;
    for (const auto& entry : fs::recursive_directory_iterator(root + "/" + type)) {
      if (entry.path().filename() != "zarr.json") continue;
      const std::string dir = entry.path().parent_path().string();
      SCOPED_TRACE(dir);
      auto store = make_file_store(dir);
      Json json = Json::parse(store->get("zarr.json")->as_string());
      bool in_scope = true;
      std::function<void(const Json&)> scan = [&](const Json& chain) {
        for (const auto& codec : chain) {
          std::string name = codec.is_string() ? codec.get<std::string>() : codec.value("name", "");
          if (!codecs.count(name)) in_scope = false;
          if (codec.is_object() && codec.contains("configuration") &&
              codec["configuration"].contains("codecs")) {
            scan(codec["configuration"]["codecs"]);
          }
        }
      };
      scan(json["codecs"]);
      if (!in_scope) {
        std::string message = error_of<UnsupportedError>([&] { Array::open(store); });
        EXPECT_CONTAINS(message, "unsupported codec");
        ++unsupported;
        continue;
      }
      Array array = Array::open(store);
      std::vector<uint8_t> values(array.metadata().num_elements() * array.metadata().dtype.size());
      array.read(array.full_selection(), values.data());
      std::string fill =
          fill_value_to_json(array.metadata().fill_value, array.metadata().dtype).dump();
      const auto& expected = reference.count(fill) ? reference[fill] : reference.begin()->second;
      EXPECT_TRUE(values == expected) << "values differ from the a2b/bytes variant";
      // A partial strided read agrees with the whole.
      Selection selection{{1, 8, 3}, {2, 24, 5}};
      std::vector<uint8_t> part(3 * 5 * array.metadata().dtype.size());
      array.read(selection, part.data());
      const size_t item = array.metadata().dtype.size();
      for (size_t r = 0; r < 3; ++r) {
        for (size_t c = 0; c < 5; ++c) {
          ASSERT_EQ(0, std::memcmp(part.data() + (r * 5 + c) * item,
                                   expected.data() + ((1 + 3 * r) * 24 + 2 + 5 * c) * item, item));
        }
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 100u);
  EXPECT_GT(unsupported, 10u);
  std::cout << "zarrs snapshots: " << checked << " arrays equal to their bytes variant, "
            << unsupported << " refused as unsupported\n";
}

TEST(Conformance, ZarrsSnapshotsOutOfScopeTypesAreRefused) {
  ZFEED_REQUIRE_SHARED(root, "conformance/zarrs-snapshots/supported/regular/string");
  namespace fs = std::filesystem;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.path().filename() != "zarr.json") continue;
    auto store = make_file_store(entry.path().parent_path().string());
    std::string message = error_of<UnsupportedError>([&] { Array::open(store); });
    EXPECT_CONTAINS(message, "unsupported");
    EXPECT_CONTAINS(message, "zarr.json");
  }
}

TEST(Array, ReadsOverHttpEqualTheirSource) {
  // An array written to memory, then served over HTTP: read whole, in part and many at once,
  // with its chunk reads in flight together.
  auto memory = make_memory_store();
  Json json = {
      {"zarr_format", 3},
      {"node_type", "array"},
      {"shape", {6, 20, 30}},
      {"data_type", "float32"},
      {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", {1, 10, 15}}}}}},
      {"chunk_key_encoding", {{"name", "default"}}},
      {"fill_value", 0},
      {"codecs", Json::parse(R"([{"name": "bytes", "configuration": {"endian": "little"}},
                                           {"name": "zstd", "configuration": {"level": 1}}])")}};
  const ArrayMetadata meta = ArrayMetadata::parse_v3(json);
  auto array = Array::create(memory, "t", meta);
  std::vector<float> values(6 * 20 * 30);
  std::iota(values.begin(), values.end(), 0.5f);
  array.write(array.full_selection(), values.data());
  testing::TestServer server;
  for (const auto& key : memory->list(""))
    server.put("store/" + key, testing::text(*memory->get(key)));
  auto remote = Array::open(open_store(server.url() + "/store"), "t");
  std::vector<float> back(values.size());
  remote.read(remote.full_selection(), back.data());
  EXPECT_EQ(back, values);
  EXPECT_GT(server.max_in_flight.load(), 1);
  std::vector<float> step(20 * 30);
  remote.read(Selection{Slice{3, 4, 1}, Slice{0, 20, 1}, Slice{0, 30, 1}}, step.data());
  EXPECT_TRUE(std::equal(step.begin(), step.end(), values.begin() + 3 * 600));
}

// A whole shard read from a local store while another program shrinks its file in place (and
// writes it back): its inner chunks decode on the pool's threads, each mapping the bytes it
// reads, so a fault past the file's new end is taken by the SIGBUS guard (the read is repeated
// or fails naming the key), never the end of the process.
TEST(Array, WholeShardsSurviveAFileShrunkUnderTheRead) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  const char* codecs = R"([{"name": "sharding_indexed", "configuration": {
      "chunk_shape": [1, 128, 128], "index_location": "end",
      "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
      "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}])";
  Json json = {
      {"zarr_format", 3},
      {"node_type", "array"},
      {"shape", {8, 128, 128}},
      {"data_type", "float32"},
      {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", {8, 128, 128}}}}}},
      {"chunk_key_encoding", {{"name", "default"}}},
      {"fill_value", 0},
      {"codecs", Json::parse(codecs)}};
  Array array = Array::create(store, "a", ArrayMetadata::parse_v3(json));
  std::vector<float> values(8 * 128 * 128);
  std::iota(values.begin(), values.end(), 1.0f);
  array.write(array.full_selection(), values.data());
  const std::string path = dir.path() + "/a/c/0/0/0";
  const std::string shard = std::string(store->get("a/c/0/0/0")->as_string());
  std::atomic<bool> stop{false};
  std::atomic<int> equal{0}, other{0}, failed{0};
  std::thread reader([&] {
    std::vector<float> out(values.size());
    while (!stop) {
      try {
        array.read(array.full_selection(), out.data());
        (out == values ? equal : other)++;
      } catch (const Error& error) {
        // The file was being rewritten: its index read as nonsense, or was not there yet.
        EXPECT_NE(std::string(error.what()).find("a/c/0/0/0"), std::string::npos) << error.what();
        ++failed;
      }
    }
  });
  // Until the reader has read 300 times (or 5 s have passed).
  const auto start = std::chrono::steady_clock::now();
  while (equal + other + failed < 300 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, shard.data(), shard.size(), 0), static_cast<ssize_t>(shard.size()));
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::microseconds(500));  // whole for a while
  }
  stop = true;
  reader.join();
  std::printf("whole-shard reads: %d equal, %d of a file being rewritten, %d failed\n",
              equal.load(), other.load(), failed.load());
  std::vector<float> out(values.size());
  array.read(array.full_selection(), out.data());
  EXPECT_EQ(out, values);
  EXPECT_GT(equal + other + failed, 0);
}

TEST(Array, AStepLargerThanTheExtentTakesTheFirstElement) {
  EXPECT_EQ((Slice{0, 10, UINT64_MAX}.count()), 1u);
  EXPECT_EQ((Slice{3, 10, UINT64_MAX - 1}.count()), 1u);
  EXPECT_EQ((Slice{0, 10, 3}.count()), 4u);
  EXPECT_EQ((Slice{5, 5, 1}.count()), 0u);
  auto store = make_memory_store();
  Array array = Array::create(store, "a", v3_meta("int32", {10}, {4}));
  std::vector<int32_t> values = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  array.write(array.full_selection(), values.data());
  int32_t out = -1;
  array.read(Selection{Slice{2, 10, UINT64_MAX}}, &out);
  EXPECT_EQ(out, 2);
}

}  // namespace
}  // namespace zfeed::zarr
