// The device loader (GPU batches): each batch copied back from the GPU equals the CPU loader's
// bit for bit (float32, float16, bfloat16, labels), resume positions count the batches handed
// out, and a batch the consumer keeps is never overwritten. Skips without a usable GPU.
#if ZFEED_HAVE_CUDA
#include "zfeed/cuda/device_loader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "zfeed/cuda/check.h"
#include "zfeed/cuda/device.h"
#include "zfeed/cuda/testing.h"
#include "zfeed/zarr/group.h"

namespace zfeed::cuda {
namespace {

using loader::LoaderSpec;
using loader::OutputType;
using loader::VariableSpec;

constexpr uint64_t kTimes = 20, kLat = 16, kLon = 24;

zarr::ArrayMetadata metadata(const std::string& dtype, uint64_t time_chunk, Json attributes) {
  Json json = {
      {"zarr_format", 3},
      {"node_type", "array"},
      {"shape", {kTimes, kLat, kLon}},
      {"data_type", dtype},
      {"chunk_grid",
       {{"name", "regular"}, {"configuration", {{"chunk_shape", {time_chunk, kLat, kLon}}}}}},
      {"chunk_key_encoding", {{"name", "default"}}},
      {"fill_value", 0},
      {"codecs", Json::parse(R"([{"name": "bytes", "configuration": {"endian": "little"}},
                                 {"name": "zstd", "configuration": {"level": 1}}])")},
      {"attributes", attributes}};
  return zarr::ArrayMetadata::parse_v3(json);
}

// t2m float32 with statistics (one time step per chunk), z float64 with statistics (4 per
// chunk: the cached path), mask uint8 labels.
std::shared_ptr<Store> make_store() {
  auto store = make_memory_store();
  zarr::Group::create(store, "");
  auto t2m = zarr::Array::create(
      store, "t2m", metadata("float32", 1, {{"zfeed_stats", {{"mean", 280.0}, {"std", 7.5}}}}));
  auto z = zarr::Array::create(
      store, "z", metadata("float64", 4, {{"zfeed_stats", {{"mean", 5.0e4}, {"std", 3.0e3}}}}));
  auto mask = zarr::Array::create(store, "mask", metadata("uint8", 1, Json::object()));
  const size_t n = kTimes * kLat * kLon;
  std::vector<float> a(n);
  std::vector<double> b(n);
  std::vector<uint8_t> c(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = 250.0f + static_cast<float>(i % 977) * 0.0625f;
    b[i] = 4.8e4 + static_cast<double>(i % 1009) * 3.3;
    c[i] = static_cast<uint8_t>(i * 7 % 3);
  }
  a[5] = std::numeric_limits<float>::quiet_NaN();
  t2m.write(t2m.full_selection(), a.data());
  z.write(z.full_selection(), b.data());
  mask.write(mask.full_selection(), c.data());
  return store;
}

VariableSpec var(const std::string& name) {
  VariableSpec v;
  v.name = name;
  return v;
}

LoaderSpec spec_of(std::shared_ptr<Store> store, OutputType type, bool labels) {
  LoaderSpec spec;
  spec.store = std::move(store);
  spec.inputs = {var("t2m"), var("z")};
  spec.targets = {labels ? var("mask") : var("t2m")};
  spec.lead = labels ? 0 : 1;
  spec.dtype = type;
  spec.batch_size = 3;
  spec.seed = 5;
  spec.drop_last = false;
  return spec;
}

std::vector<uint8_t> to_host(const void* device, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // a test: the plain way
  check(cudaMemcpy(out.data(), device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

TEST(CudaDeviceLoader, BatchesEqualTheCpuLoadersBitForBit) {
  ZFEED_SKIP_WITHOUT_CUDA();
  auto store = make_store();
  for (bool labels : {false, true}) {
    for (OutputType type : {OutputType::kFloat32, OutputType::kFloat16, OutputType::kBFloat16}) {
      loader::Loader reference(spec_of(store, type, labels));
      DeviceLoader device(spec_of(store, type, labels), {0, 2});
      const auto in = reference.input_shape(), out = reference.target_shape();
      const size_t in_sample = in[1] * in[2] * in[3] * output_size(reference.input_type());
      const size_t out_sample = out[1] * out[2] * out[3] * output_size(reference.target_type());
      uint64_t batches = 0;
      while (auto want = reference.next()) {
        auto got = device.next();
        ASSERT_TRUE(got);
        ASSERT_EQ(got->size, want->size);
        ASSERT_EQ(got->times, std::vector<int64_t>(want->times(), want->times() + want->size));
        got->wait_on(nullptr);
        const auto inputs = to_host(got->inputs, got->size * in_sample);
        const auto targets = to_host(got->targets, got->size * out_sample);
        ASSERT_EQ(std::memcmp(inputs.data(), want->input_bytes(), inputs.size()), 0)
            << output_name(type) << " batch " << batches << (labels ? " (labels)" : "");
        ASSERT_EQ(std::memcmp(targets.data(), want->target_bytes(), targets.size()), 0)
            << output_name(type) << " batch " << batches << (labels ? " (labels)" : "");
        ++batches;
      }
      EXPECT_FALSE(device.next());
      EXPECT_EQ(batches, reference.batches_per_epoch());
      EXPECT_EQ(device.stats().batches, batches);
    }
  }
}

TEST(CudaDeviceLoader, StateCountsTheBatchesHandedOutAndResumesExactly) {
  ZFEED_SKIP_WITHOUT_CUDA();
  auto store = make_store();
  DeviceLoader first(spec_of(store, OutputType::kFloat32, false), {0, 2});
  ASSERT_TRUE(first.next());
  ASSERT_TRUE(first.next());
  const Json state = first.state();
  EXPECT_EQ(state["batch"], 2);  // not the batches already in flight on the copy stream
  std::vector<std::vector<int64_t>> rest;
  while (auto batch = first.next()) rest.push_back(batch->times);
  DeviceLoader resumed(spec_of(store, OutputType::kFloat32, false), {0, 1});
  resumed.restore(state);
  for (const auto& times : rest) {
    auto batch = resumed.next();
    ASSERT_TRUE(batch);
    EXPECT_EQ(batch->times, times);
  }
  EXPECT_FALSE(resumed.next());
  // The next epoch starts after begin_iteration.
  resumed.begin_iteration();
  EXPECT_EQ(resumed.epoch(), 1u);
  EXPECT_TRUE(resumed.next());
}

TEST(CudaDeviceLoader, KeptBatchesAreNeverOverwritten) {
  ZFEED_SKIP_WITHOUT_CUDA();
  auto store = make_store();
  loader::Loader reference(spec_of(store, OutputType::kFloat32, false));
  DeviceLoader device(spec_of(store, OutputType::kFloat32, false), {0, 1});
  std::vector<DeviceBatch> kept;
  while (auto batch = device.next()) kept.push_back(std::move(*batch));  // the consumer keeps all
  const auto in = reference.input_shape();
  const size_t sample = in[1] * in[2] * in[3] * 4;
  for (const DeviceBatch& batch : kept) {
    auto want = reference.next();
    ASSERT_TRUE(want);
    const auto inputs = to_host(batch.inputs, batch.size * sample);
    ASSERT_EQ(std::memcmp(inputs.data(), want->input_bytes(), inputs.size()), 0)
        << "batch " << batch.index;
  }
  EXPECT_GE(device.stats().slots, kept.size());
  // Released on a stream: the slots are reused in the next epoch, no new ones needed.
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (DeviceBatch& batch : kept) batch.handle->used_on(stream);
  const uint64_t slots = device.stats().slots;
  kept.clear();
  device.begin_iteration();
  while (auto batch = device.next()) {
  }
  EXPECT_EQ(device.stats().slots, slots);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

}  // namespace
}  // namespace zfeed::cuda
#endif  // ZFEED_HAVE_CUDA
