// The CUDA layer. Without a GPU (or a build without nvcc) only the status tests run; the device
// tests skip with cuda_status()'s reason. On a GPU, the cast kernel's output equals the host's
// (the same per-element code of loader/cast.h) bit for bit, NaNs included.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "zfeed/cuda/device.h"
#include "zfeed/cuda/testing.h"
#include "zfeed/util/error.h"

#if ZFEED_HAVE_CUDA
#include "zfeed/cuda/cast_kernels.h"
#include "zfeed/cuda/check.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/pinned_pool.h"
#ifndef ZFEED_CUDA_ONLY_BUILD
#include "zfeed/codec/data_type.h"
#endif
#endif

namespace zfeed::cuda {
namespace {

TEST(CudaStatus, SaysClearlyWhyCudaIsUnavailable) {
  const CudaStatus status = cuda_status();
  EXPECT_EQ(status.built_with_cuda, built_with_cuda());
  if (!status.built_with_cuda) {
    EXPECT_FALSE(status.available);
    EXPECT_EQ(status.reason, "zfeed was built without CUDA (nvcc not found at build time)");
  } else if (!status.available) {
    EXPECT_TRUE(status.reason.rfind("no CUDA driver: ", 0) == 0 ||
                status.reason == "no CUDA device")
        << status.reason;
    EXPECT_TRUE(status.devices.empty());
  } else {
    EXPECT_EQ(status.reason, "");
    ASSERT_FALSE(status.devices.empty());
    EXPECT_FALSE(status.devices[0].name.empty());
    EXPECT_GT(status.devices[0].total_memory, 0u);
  }
  std::printf("cuda_status: available=%d reason='%s' runtime=%d driver=%d devices=%zu\n",
              status.available, status.reason.c_str(), status.runtime_version,
              status.driver_version, status.devices.size());
}

TEST(CudaStatus, RequireDeviceThrowsWithTheReason) {
  const CudaStatus status = cuda_status();
  if (status.available) {
    EXPECT_NO_THROW(require_device(0, "device='cuda'"));
    EXPECT_THROW(require_device(static_cast<int>(status.devices.size()), "device='cuda:N'"),
                 UnsupportedError);
    return;
  }
  try {
    require_device(0, "device='cuda'");
    FAIL() << "no exception";
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(std::string(e.what()), "device='cuda' is unavailable: " + status.reason);
  }
}

#if ZFEED_HAVE_CUDA

#ifndef ZFEED_CUDA_ONLY_BUILD
// The host's float16 conversion equals the CPU loader's (float16_to_double, then to float) for
// every one of the 65536 bit patterns.
TEST(CudaCastHost, Float16ConversionEqualsTheLoaders) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float ours = float16_bits_to_float(static_cast<uint16_t>(bits));
    const float loaders = static_cast<float>(float16_to_double(static_cast<uint16_t>(bits)));
    ASSERT_EQ(loader::float_bits(ours), loader::float_bits(loaders)) << "bits " << bits;
  }
}
#endif

// Float32 bit patterns worth checking: zeros, infinities, NaNs (quiet, signalling, both signs),
// subnormals, the float16 and bfloat16 rounding boundaries and ties, then random patterns.
std::vector<uint32_t> interesting_float_bits(size_t random_count) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                0xFFC00000u, 0x7F800001u, 0xFFBFFFFFu, 0x7FFFFFFFu, 0x00000001u,
                                0x80000001u, 0x007FFFFFu, 0x00400000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                                0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x33000000u,
                                0x33000001u, 0x33800000u, 0x38800000u, 0x387FFFFFu, 0x3F808000u,
                                0x3F818000u, 0x3F807FFFu, 0x3F800001u, 0x43889333u, 0xC3889333u};
  for (uint32_t i = 0; i < 4096; ++i) bits.push_back(0x33000000u + i * 0x2000u);  // float16 edge
  std::mt19937_64 random(42);
  for (size_t i = 0; i < random_count; ++i) bits.push_back(static_cast<uint32_t>(random()));
  return bits;
}

struct Case {
  SourceType type;
  std::vector<uint8_t> raw;
  size_t count;
};

std::vector<Case> source_cases() {
  std::vector<Case> cases;
  std::mt19937_64 random(7);
  auto add = [&](SourceType type, size_t count, auto fill) {
    Case c{type, std::vector<uint8_t>(count * source_size(type)), count};
    fill(c.raw.data(), count);
    cases.push_back(std::move(c));
  };
  const std::vector<uint32_t> floats = interesting_float_bits(1 << 20);
  add(SourceType::kFloat32, floats.size(),
      [&](uint8_t* p, size_t) { std::memcpy(p, floats.data(), floats.size() * 4); });
  add(SourceType::kFloat16, 65536, [](uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(i);
  });
  add(SourceType::kBFloat16, 65536, [](uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(i);
  });
  add(SourceType::kFloat64, 1 << 18, [&](uint8_t* p, size_t n) {
    const double specials[] = {
        0.0,    -0.0, 1e-310, -1e-320, 1e300, -1e300, 65519.99, 65520.0, 3.4028235677973366e38,
        1.0 / 3};
    for (size_t i = 0; i < n; ++i) {
      uint64_t bits = random();
      if (i < 10) std::memcpy(&bits, &specials[i], 8);
      if (i >= 10 && i < 20) bits = 0x7FF0000000000001ull * (i - 9) | (i & 1 ? 1ull << 63 : 0);
      reinterpret_cast<uint64_t*>(p)[i] = bits;
    }
  });
  auto integers = [&](SourceType type) {
    add(type, 1 << 16, [&](uint8_t* p, size_t n) {
      for (size_t i = 0; i < n * source_size(type); ++i) p[i] = static_cast<uint8_t>(random());
    });
  };
  for (SourceType type :
       {SourceType::kUInt8, SourceType::kInt8, SourceType::kUInt16, SourceType::kInt16,
        SourceType::kUInt32, SourceType::kInt32, SourceType::kUInt64, SourceType::kInt64})
    integers(type);
  return cases;
}

TEST(CudaCast, KernelEqualsHostBitForBit) {
  ZFEED_SKIP_WITHOUT_CUDA();
  const std::vector<Case> cases = source_cases();
  const Normalization normalizations[] = {
      {false, 0.0f, 1.0f}, {true, 273.15f, 20.5f}, {true, 0.0f, 3.0f}, {true, 1.0f, 0.0f}};
  Stream stream;
  DeviceBuffer descriptors;
  for (OutputType out :
       {OutputType::kFloat32, OutputType::kFloat16, OutputType::kBFloat16, OutputType::kInt64}) {
    for (const Case& c : cases) {
      // One launch with a plane per normalization.
      const size_t out_bytes = c.count * loader::output_size(out);
      DeviceBuffer src(c.raw.size()), dst(out_bytes * 4);
      check(cudaMemcpy(src.data(), c.raw.data(), c.raw.size(), cudaMemcpyHostToDevice), "copy");
      std::vector<CastPlane> device_planes, host_planes;
      std::vector<uint8_t> expected(out_bytes * 4, 0xAB), actual(out_bytes * 4, 0xCD);
      for (size_t k = 0; k < 4; ++k) {
        device_planes.push_back(
            {src.data(), dst.data() + k * out_bytes, c.count, c.type, normalizations[k]});
        host_planes.push_back(
            {c.raw.data(), expected.data() + k * out_bytes, c.count, c.type, normalizations[k]});
      }
      cast_planes(device_planes, out, descriptors, stream.get());
      stream.synchronize();
      check(cudaMemcpy(actual.data(), dst.data(), actual.size(), cudaMemcpyDeviceToHost), "copy");
      cast_planes_host(host_planes, out);
      for (size_t k = 0; k < 4; ++k) {
        const size_t size = loader::output_size(out);
        for (size_t i = 0; i < c.count; ++i) {
          const uint8_t* e = expected.data() + k * out_bytes + i * size;
          const uint8_t* a = actual.data() + k * out_bytes + i * size;
          if (std::memcmp(e, a, size) != 0) {
            uint64_t ev = 0, av = 0, in = 0;
            std::memcpy(&ev, e, size);
            std::memcpy(&av, a, size);
            std::memcpy(&in, c.raw.data() + i * source_size(c.type), source_size(c.type));
            FAIL() << source_name(c.type) << " -> " << loader::output_name(out) << " normalization "
                   << k << " element " << i << ": input bits 0x" << std::hex << in << ", host 0x"
                   << ev << ", device 0x" << av;
          }
        }
      }
    }
  }
}

TEST(CudaCast, RefusesMisalignedPlanes) {
  ZFEED_SKIP_WITHOUT_CUDA();
  DeviceBuffer src(64), dst(64), descriptors;
  const CastPlane plane{src.data() + 1, dst.data(), 4, SourceType::kFloat32, {}};
  EXPECT_THROW(cast_planes({&plane, 1}, OutputType::kFloat32, descriptors, nullptr), Error);
}

TEST(CudaPinnedPool, ReusesBuffersWithinItsBound) {
  ZFEED_SKIP_WITHOUT_CUDA();
  PinnedPool pool(3 << 20);
  uint8_t* first_data = nullptr;
  {
    PinnedPool::Buffer first = pool.acquire(1 << 20);
    first_data = first.data();
    std::memset(first.data(), 1, first.size());
  }
  PinnedPool::Buffer again = pool.acquire(512 << 10);  // fits the free 1 MiB buffer
  EXPECT_EQ(again.data(), first_data);
  EXPECT_EQ(again.size(), 512u << 10);
  EXPECT_EQ(again.capacity(), 1u << 20);
  EXPECT_EQ(pool.allocations(), 1u);
  EXPECT_EQ(pool.reuses(), 1u);
  PinnedPool::Buffer second = pool.acquire(2 << 20);  // 3 MiB pinned: at the bound
  EXPECT_EQ(pool.bytes_pinned(), 3u << 20);
  EXPECT_THROW(pool.acquire(1), Error);  // both lent: nothing to free
  second.reset();
  PinnedPool::Buffer third = pool.acquire(1);  // served from the free 2 MiB buffer
  EXPECT_EQ(pool.allocations(), 2u);
  third.reset();
  PinnedPool::Buffer big = pool.acquire(2 << 20);  // reuse
  big.reset();
  // 1 MiB lent and 2 MiB free: 2 MiB + 1 more would pass the bound even with the free one gone.
  EXPECT_THROW(pool.acquire((2 << 20) + 1), Error);
  EXPECT_EQ(pool.bytes_pinned(), 1u << 20);  // the attempt freed the unused 2 MiB
  again.reset();
  PinnedPool::Buffer bigger = pool.acquire((2 << 20) + 1);  // frees the unused 1 MiB to fit
  EXPECT_EQ(pool.bytes_pinned(), (2u << 20) + 1);
  pool.trim();
  EXPECT_EQ(pool.bytes_pinned(), (2u << 20) + 1);  // lent: trim keeps it
}

TEST(CudaPinnedPool, BufferOutlivesThePool) {
  ZFEED_SKIP_WITHOUT_CUDA();
  PinnedPool::Buffer buffer;
  {
    PinnedPool pool(1 << 20);
    buffer = pool.acquire(4096);
  }
  std::memset(buffer.data(), 7, buffer.size());
  buffer.reset();  // freed, not returned
}

// Pinned host -> device on a copy stream; a consumer stream waits on the copy's event (no
// device-wide synchronize), normalizes on the device, and copies back.
TEST(CudaCopyStream, CopyEventAndConsumerRoundTrip) {
  ZFEED_SKIP_WITHOUT_CUDA();
  constexpr size_t kCount = 1 << 22;
  PinnedPool pool(64 << 20);
  PinnedPool::Buffer host = pool.acquire(kCount * 4), back = pool.acquire(kCount * 4);
  auto* values = reinterpret_cast<float*>(host.data());
  for (size_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(i % 1000) + 0.25f;
  DeviceBuffer device(kCount * 4), normalized(kCount * 4), descriptors;
  CopyStream copy;
  Stream consumer;
  Event copied;
  copy.to_device(device.data(), host.data(), kCount * 4);
  copy.hand_over(copied, consumer.get());
  const CastPlane plane{
      device.data(), normalized.data(), kCount, SourceType::kFloat32, {true, 500.0f, 2.0f}};
  cast_planes({&plane, 1}, OutputType::kFloat32, descriptors, consumer.get());
  Event done;
  check(cudaMemcpyAsync(back.data(), normalized.data(), kCount * 4, cudaMemcpyDeviceToHost,
                        consumer.get()),
        "copy back");
  done.record(consumer.get());
  done.synchronize();
  EXPECT_TRUE(copied.ready());
  EXPECT_TRUE(done.ready());
  const auto* out = reinterpret_cast<const float*>(back.data());
  for (size_t i = 0; i < kCount; ++i)
    ASSERT_EQ(loader::float_bits(out[i]), loader::float_bits((values[i] - 500.0f) / 2.0f)) << i;
}

#else

TEST(CudaCast, KernelEqualsHostBitForBit) { GTEST_SKIP() << cuda_status().reason; }

#endif  // ZFEED_HAVE_CUDA

}  // namespace
}  // namespace zfeed::cuda
