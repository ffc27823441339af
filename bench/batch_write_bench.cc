// How the loader writes decoded planes into a batch, on all cores: the cost of the batch writes
// beside the decode itself. Each thread decodes zstd planes (ERA5-like float32, 1 time step per
// chunk) and writes them normalized into a batch buffer of 16 samples x 12 channels, two such
// buffers in turn (so the batch is not in cache, as in a loader), in four ways:
//
//   decode only          into a reused per-thread buffer, nothing written to the batch (what the
//                        loader benchmark's `limit` does)
//   in place             decoded into the batch, then normalized there (the loader before)
//   scratch + plain      decoded into a reused buffer, cast into the batch with plain stores
//   scratch + streaming  the same with streaming stores (loader::stream_values, the loader now)
//
// Usage: zfeed_batch_write_bench [lat lon [threads [rounds]]] (default 320 640, all cores, 5).
// Prints GB/s of decoded bytes (1e9) for each, the best of `rounds`, and each against `decode
// only`. Every way's batch is checked against the values.
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "zfeed/loader/cast_values.h"
#include "zfeed/util/bytes.h"

namespace {

using zfeed::Bytes;
using zfeed::DataType;
using zfeed::loader::Normalization;
using zfeed::loader::OutputType;

constexpr size_t kSamples = 16, kChannels = 12;

// A smooth field at 0.01 precision: a planetary wave, a gradient and small-scale noise.
std::vector<float> make_plane(size_t lat, size_t lon, uint64_t seed) {
  std::vector<float> values(lat * lon);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t y = 0; y < lat; ++y) {
    for (size_t x = 0; x < lon; ++x) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      const double noise = static_cast<double>(state % 1000) / 1000.0 - 0.5;
      const double value = 250.0 + 40.0 * std::cos(3.14159 * static_cast<double>(y) / lat) +
                           8.0 * std::sin(0.02 * static_cast<double>(x) + 0.1 * seed) + noise;
      values[y * lon + x] = static_cast<float>(std::round(value * 100.0) / 100.0);
    }
  }
  return values;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t lat = argc > 2 ? std::strtoull(argv[1], nullptr, 10) : 320;
  const size_t lon = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 640;
  const unsigned threads = argc > 3 && std::atoi(argv[3]) > 0
                               ? static_cast<unsigned>(std::atoi(argv[3]))
                               : std::max(1u, std::thread::hardware_concurrency());
  const int rounds = argc > 4 ? std::max(1, std::atoi(argv[4])) : 5;
  const size_t plane = lat * lon, plane_bytes = plane * 4, planes = kSamples * kChannels;

  // The batch's planes: kChannels distinct fields, compressed once each with zstd level 3.
  std::vector<std::vector<float>> fields;
  std::vector<std::string> frames;
  size_t stored = 0;
  for (size_t c = 0; c < kChannels; ++c) {
    fields.push_back(make_plane(lat, lon, c + 1));
    std::string frame(ZSTD_compressBound(plane_bytes), '\0');
    const size_t size =
        ZSTD_compress(frame.data(), frame.size(), fields.back().data(), plane_bytes, 3);
    if (ZSTD_isError(size)) {
      std::fprintf(stderr, "zstd: %s\n", ZSTD_getErrorName(size));
      return 1;
    }
    frame.resize(size);
    stored += size;
    frames.push_back(std::move(frame));
  }
  const Normalization normalization{true, 260.0f, 25.0f};
  const DataType float32 = DataType::from_name("float32");
  std::vector<Bytes> batches(2);
  for (Bytes& batch : batches) {
    batch.resize(planes * plane_bytes);
    std::memset(batch.data(), 0, batch.size());  // touched once, as a loader's reused buffers
  }

  enum class Way { kDecodeOnly, kInPlace, kScratchPlain, kScratchStreaming };
  auto run = [&](Way way, uint8_t* batch) {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        Bytes scratch(plane_bytes);
        ZSTD_DCtx* context = ZSTD_createDCtx();
        for (size_t p = t; p < planes; p += threads) {
          const std::string& frame = frames[p % kChannels];
          uint8_t* dst = batch + p * plane_bytes;
          uint8_t* into = way == Way::kInPlace ? dst : scratch.data();
          ZSTD_decompressDCtx(context, into, plane_bytes, frame.data(), frame.size());
          if (way == Way::kInPlace) {
            zfeed::loader::cast_values(dst, float32, dst, OutputType::kFloat32, plane,
                                       normalization);
          } else if (way == Way::kScratchPlain) {
            zfeed::loader::cast_values(scratch.data(), float32, dst, OutputType::kFloat32, plane,
                                       normalization);
          } else if (way == Way::kScratchStreaming) {
            zfeed::loader::stream_values(scratch.data(), float32, dst, OutputType::kFloat32, plane,
                                         normalization);
          }
        }
        ZSTD_freeDCtx(context);
      });
    }
    for (std::thread& thread : pool) thread.join();
  };

  std::printf(
      "batch writes: %zu planes of %zu x %zu float32 (%.1f MB each; zstd level 3, ratio "
      "%.2f), %u threads, best of %d rounds\n\n",
      planes, lat, lon, plane_bytes / 1e6,
      static_cast<double>(kChannels * plane_bytes) / static_cast<double>(stored), threads, rounds);
  std::printf("| way | GB/s | of decode only |\n|---|---:|---:|\n");
  const std::pair<Way, const char*> ways[] = {
      {Way::kDecodeOnly, "decode only"},
      {Way::kInPlace, "in place (the loader before)"},
      {Way::kScratchPlain, "scratch + plain stores"},
      {Way::kScratchStreaming, "scratch + streaming stores (the loader now)"}};
  double decode_only = 0;
  int failures = 0;
  for (const auto& [way, name] : ways) {
    double best = 0;
    for (int r = 0; r < rounds * 2; ++r) {  // each round writes both batches in turn
      uint8_t* batch = batches[static_cast<size_t>(r) % 2].data();
      const double start = now_s();
      run(way, batch);
      best = std::max(best, static_cast<double>(planes * plane_bytes) / (now_s() - start) / 1e9);
    }
    if (way == Way::kDecodeOnly) decode_only = best;
    if (way != Way::kDecodeOnly) {
      for (size_t p = 0; p < planes; ++p) {
        const auto* got = reinterpret_cast<const float*>(batches[0].data() + p * plane_bytes);
        const std::vector<float>& field = fields[p % kChannels];
        for (size_t i = 0; i < plane; i += 997) {
          const float want = normalization.apply(field[i]);
          if (std::memcmp(&got[i], &want, 4) != 0) {
            ++failures;
            break;
          }
        }
      }
    }
    std::printf("| %s | %.2f | %.2f |\n", name, best, best / decode_only);
  }
  if (failures) std::printf("\n%d planes differ from the expected values\n", failures);
  return failures ? 1 : 0;
}
