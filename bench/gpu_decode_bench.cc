// GPU benchmark of scripts/gpu-check: nvCOMP batched decompression (GpuDecoder) of ERA5-like
// chunks against the CPU. The chunks are smooth weather-like float32 fields (temperature, wind,
// geopotential, humidity and pressure over a 640 x 1280 grid: latitude structure, planetary
// waves, drifting vortices, at the 16-bit precision of ERA5's GRIB packing), compressed on the
// CPU with zstd (level 3), separately numcodecs-style LZ4, and (built with the whole library)
// blosc with LZ4 inside and byte shuffle, as zarr-python writes by default. Measured, in decoded
// GB/s:
//   - GPU decode with the compressed bytes already on the device (CUDA events, best of 5 per
//     batch, batches of 16 chunks and of all of them);
//   - GPU end to end: host-resident compressed chunks -> pinned staging -> one H2D copy ->
//     nvCOMP -> statuses checked (wall clock, best of 3), with one decoder and, for batches of
//     16, two decoders on two streams overlapping one batch's staging with the other's decode;
//   - CPU: libzstd / liblz4 / c-blosc on every hardware thread (one chunk per task, c-blosc's
//     own threads off) into host memory.
// Every decoded chunk is compared with the original (exit 1 on a mismatch). Prints a Markdown
// table. Usage: zfeed_gpu_decode_bench [chunks [rows [cols]]] (default 192 640 1280). Exit status
// 3 when no CUDA device is usable (the reason is printed).
#include <lz4.h>
#include <zstd.h>
#if ZFEED_BENCH_BLOSC
#include <blosc.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gpu_bench_util.h"
#include "zfeed/cuda/check.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/device.h"
#include "zfeed/cuda/gpu_decode.h"
#include "zfeed/util/error.h"

using namespace zfeed::cuda;

namespace {

using Clock = std::chrono::steady_clock;
using Buffer = std::vector<uint8_t>;
constexpr int kDeviceRepeats = 5;
constexpr int kHostRepeats = 3;

unsigned hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

// Runs body(i) for i in [0, n) on `threads` threads, each taking the next index.
void parallel_for(size_t n, unsigned threads, const std::function<void(size_t)>& body) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) body(i);
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
}

// One ERA5-like field: variable `var` (6 kinds) at time step `step`, rows x cols from north to
// south. Every term is separable (a row profile times a column profile), so a field costs a few
// multiply-adds per point; then GRIB's simple packing: 16 bits over the field's range.
void era5_like(size_t var, size_t step, size_t rows, size_t cols, float* out) {
  constexpr double kPi = 3.14159265358979323846;
  struct Kind {
    double mean, equator_to_pole, wave, vortex;
  };
  // t2m (K), u500, v500 (m/s), z500 (m2/s2), q700 (kg/kg), msl (Pa).
  const Kind kinds[] = {{278, -45, 6, 4},
                        {8, 12, 10, 15},
                        {0, 0, 9, 15},
                        {54000, -6000, 900, 600},
                        {0.004, -0.003, 0.001, 0.0015},
                        {101200, 600, 900, 1500}};
  const Kind& k = kinds[var % 6];
  const double t = 0.25 * double(step) + 1.7 * double(var);
  std::vector<double> lat(rows), lon(cols);
  for (size_t i = 0; i < rows; ++i) lat[i] = kPi * (0.5 - (i + 0.5) / rows);
  for (size_t j = 0; j < cols; ++j) lon[j] = 2 * kPi * double(j) / cols;
  // Terms: a latitude profile, planetary waves (wavenumbers 2..7) drifting east, and vortices.
  struct Term {
    std::vector<double> row, col;
  };
  std::vector<Term> terms;
  Term base{std::vector<double>(rows), std::vector<double>(cols, 1.0)};
  for (size_t i = 0; i < rows; ++i)
    base.row[i] = k.mean + k.equator_to_pole * std::pow(std::sin(lat[i]), 2) +
                  0.1 * k.equator_to_pole * std::sin(lat[i]) * std::cos(2 * kPi * t / 365);
  terms.push_back(std::move(base));
  for (int m = 2; m <= 7; ++m) {
    Term wave{std::vector<double>(rows), std::vector<double>(cols)};
    const double amplitude = k.wave / (m - 1), speed = 0.3 / m, phase = 1.3 * m + 0.4 * var;
    for (size_t i = 0; i < rows; ++i)
      wave.row[i] =
          amplitude * std::pow(std::cos(lat[i]), 2) * std::sin(2 * lat[i] * (m % 3 + 1) + phase);
    for (size_t j = 0; j < cols; ++j) wave.col[j] = std::cos(m * (lon[j] - speed * t) + phase);
    terms.push_back(std::move(wave));
  }
  for (int v = 0; v < 8; ++v) {
    Term vortex{std::vector<double>(rows), std::vector<double>(cols)};
    const double clat = (0.35 + 0.05 * (v % 4)) * kPi * (v % 2 ? 1 : -1);
    const double clon = std::fmod(1.1 * v + 0.05 * t, 2 * kPi), radius = 0.08 + 0.02 * (v % 3);
    const double sign = (v % 3 == 0) ? -1 : 1;
    for (size_t i = 0; i < rows; ++i)
      vortex.row[i] = sign * k.vortex * std::exp(-std::pow((lat[i] - clat) / radius, 2));
    for (size_t j = 0; j < cols; ++j) {
      double d = std::fabs(lon[j] - clon);
      d = std::min(d, 2 * kPi - d);
      vortex.col[j] = std::exp(-std::pow(d / (1.5 * radius), 2));
    }
    terms.push_back(std::move(vortex));
  }
  double low = 1e300, high = -1e300;
  std::vector<double> field(rows * cols, 0.0);
  for (size_t i = 0; i < rows; ++i) {
    double* row = field.data() + i * cols;
    for (const Term& term : terms) {
      const double r = term.row[i];
      for (size_t j = 0; j < cols; ++j) row[j] += r * term.col[j];
    }
    for (size_t j = 0; j < cols; ++j) {
      low = std::min(low, row[j]);
      high = std::max(high, row[j]);
    }
  }
  // GRIB simple packing, 16 bits: value = low + n * 2^E.
  const int e = static_cast<int>(std::ceil(std::log2(std::max(high - low, 1e-30) / 65535.0)));
  const double scale = std::ldexp(1.0, e);
  for (size_t p = 0; p < rows * cols; ++p)
    out[p] = static_cast<float>(low + std::round((field[p] - low) / scale) * scale);
}

struct Codec {
  const char* label;
  GpuCodec gpu;
  std::vector<Buffer> stored;
  size_t stored_bytes = 0;
};

Buffer zstd_compress(const uint8_t* data, size_t size) {
  Buffer out(ZSTD_compressBound(size));
  const size_t n = ZSTD_compress(out.data(), out.size(), data, size, 3);
  if (ZSTD_isError(n)) throw zfeed::Error(std::string("zstd: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

Buffer lz4_compress(const uint8_t* data, size_t size) {  // numcodecs' LZ4: size header + block
  Buffer out(4 + LZ4_compressBound(static_cast<int>(size)));
  const uint32_t header = static_cast<uint32_t>(size);
  std::memcpy(out.data(), &header, 4);
  const int n = LZ4_compress_default(reinterpret_cast<const char*>(data),
                                     reinterpret_cast<char*>(out.data() + 4),
                                     static_cast<int>(size), static_cast<int>(out.size() - 4));
  if (n <= 0) throw zfeed::Error("lz4: compression failed");
  out.resize(4 + n);
  return out;
}

#if ZFEED_BENCH_BLOSC
Buffer blosc_compress(const uint8_t* data, size_t size) {  // LZ4 inside, byte shuffle of floats
  Buffer out(size + BLOSC_MAX_OVERHEAD);
  const int n =
      blosc_compress_ctx(5, BLOSC_SHUFFLE, 4, size, data, out.data(), out.size(), "lz4", 0, 1);
  if (n <= 0) throw zfeed::Error("blosc: compression failed");
  out.resize(static_cast<size_t>(n));
  return out;
}
#endif

Buffer compress(GpuCodec codec, const uint8_t* data, size_t size) {
#if ZFEED_BENCH_BLOSC
  if (codec == GpuCodec::kBlosc) return blosc_compress(data, size);
#endif
  return codec == GpuCodec::kZstd ? zstd_compress(data, size) : lz4_compress(data, size);
}

void cpu_decode(GpuCodec codec, const Buffer& stored, uint8_t* out, size_t size) {
#if ZFEED_BENCH_BLOSC
  if (codec == GpuCodec::kBlosc) {
    const int n = blosc_decompress_ctx(stored.data(), out, size, 1);
    if (n != static_cast<int>(size)) throw zfeed::Error("cpu blosc decode failed");
    return;
  }
#endif
  if (codec == GpuCodec::kZstd) {
    const size_t n = ZSTD_decompress(out, size, stored.data(), stored.size());
    if (ZSTD_isError(n) || n != size) throw zfeed::Error("cpu zstd decode failed");
  } else {
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(stored.data() + 4),
                                      reinterpret_cast<char*>(out),
                                      static_cast<int>(stored.size() - 4), static_cast<int>(size));
    if (n != static_cast<int>(size)) throw zfeed::Error("cpu lz4 decode failed");
  }
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The first chunk that differs from the original, or -1.
long first_mismatch(const std::vector<Buffer>& originals, const uint8_t* decoded, size_t chunk) {
  for (size_t i = 0; i < originals.size(); ++i)
    if (std::memcmp(originals[i].data(), decoded + i * chunk, chunk) != 0) return long(i);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  const CudaStatus status = usable_cuda_or_say_why();
  if (!status.available) return 3;
  if (!built_with_nvcomp()) {
    std::printf("no GPU decoding: %s\n", gpu_decode_unavailable_reason().c_str());
    return 3;
  }
  const size_t chunks = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 192;
  const size_t rows = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 640;
  const size_t cols = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1280;
  const size_t chunk = rows * cols * 4, total = chunks * chunk;
  const unsigned threads = hardware_threads();
  const DeviceInfo& device = status.devices[0];
  std::printf(
      "device 0: %s, compute %d.%d, %zu MiB, %d SMs; runtime %d, driver %d; nvCOMP %s; "
      "%u CPU threads\n",
      device.name.c_str(), device.compute_major, device.compute_minor, device.total_memory >> 20,
      device.multiprocessors, status.runtime_version, status.driver_version,
      nvcomp_version().c_str(), threads);

  try {
    const auto prepare = Clock::now();
    std::vector<Buffer> originals(chunks, Buffer(chunk));
    parallel_for(chunks, threads, [&](size_t i) {
      era5_like(i % 6, i / 6, rows, cols, reinterpret_cast<float*>(originals[i].data()));
    });
    std::vector<Codec> codecs;
    codecs.push_back({"zstd (level 3)", GpuCodec::kZstd, {}});
    codecs.push_back({"lz4 (numcodecs)", GpuCodec::kLz4, {}});
#if ZFEED_BENCH_BLOSC
    codecs.push_back({"blosc (lz4, shuffle)", GpuCodec::kBlosc, {}});
#endif
    for (Codec& c : codecs) {
      c.stored.resize(chunks);
      parallel_for(chunks, threads,
                   [&](size_t i) { c.stored[i] = compress(c.gpu, originals[i].data(), chunk); });
      for (const Buffer& s : c.stored) c.stored_bytes += s.size();
    }
    std::printf(
        "data: %zu chunks of %zu x %zu float32 (%.2f MiB each, %.0f MiB in all): 6 "
        "ERA5-like fields at 16-bit GRIB precision; prepared in %.1f s\n\n",
        chunks, rows, cols, chunk / 1048576.0, total / 1048576.0, seconds_since(prepare));

    Stream stream, stream2;
    DeviceBuffer device_out(total);
    Buffer host_out(total);
    std::memset(host_out.data(), 0, total);  // touched once, before any timing
    std::vector<std::string> keys;
    for (size_t i = 0; i < chunks; ++i) keys.push_back("era5/c/" + std::to_string(i));

    std::printf(
        "| codec | ratio | batch | GPU decode, data on GPU (GB/s) | GPU end to end from "
        "host (GB/s) | CPU, %u threads (GB/s) | GPU / CPU | end to end / CPU |\n"
        "|---|---|---|---|---|---|---|---|\n",
        threads);
    for (Codec& c : codecs) {
      const double ratio = double(total) / double(c.stored_bytes);
      auto items_of = [&](size_t first, size_t count) {
        std::vector<GpuDecodeItem> items;
        for (size_t i = first; i < first + count && i < chunks; ++i)
          items.push_back({c.gpu, c.stored[i].data(), c.stored[i].size(),
                           device_out.data() + i * chunk, chunk, keys[i]});
        return items;
      };
      auto verify_device = [&](const char* what) {
        check(cudaMemcpy(host_out.data(), device_out.data(), total, cudaMemcpyDeviceToHost),
              "read back");
        const long bad = first_mismatch(originals, host_out.data(), chunk);
        if (bad >= 0) {
          std::printf("MISMATCH: %s, %s: chunk %ld differs from the original\n", c.label, what,
                      bad);
          std::exit(1);
        }
      };

      // The CPU: every hardware thread, one chunk per task.
      double cpu_best = 1e30;
      for (int r = 0; r < kHostRepeats; ++r) {
        const auto start = Clock::now();
        parallel_for(chunks, threads, [&](size_t i) {
          cpu_decode(c.gpu, c.stored[i], host_out.data() + i * chunk, chunk);
        });
        cpu_best = std::min(cpu_best, seconds_since(start));
      }
      if (const long bad = first_mismatch(originals, host_out.data(), chunk); bad >= 0) {
        std::printf("MISMATCH: %s on the CPU: chunk %ld\n", c.label, bad);
        return 1;
      }
      const double cpu_gbps = total / cpu_best / 1e9;

      for (size_t batch : {size_t{16}, chunks}) {
        if (batch > chunks) continue;
        const size_t batches = (chunks + batch - 1) / batch;
        GpuDecoder decoder, decoder2;
        // Decoder alone: each batch staged once, then its decompression timed on the device.
        fill_device(device_out.data(), 0, total);
        Event start(true), stop(true);
        double device_seconds = 0;
        for (size_t b = 0; b < batches; ++b) {
          const auto items = items_of(b * batch, batch);
          decoder.decode(items, stream.get());
          float best = 1e30f;
          for (int r = 0; r < kDeviceRepeats; ++r) {
            start.record(stream.get());
            decoder.relaunch(stream.get());
            stop.record(stream.get());
            stop.synchronize();
            best = std::min(best, stop.elapsed_ms_since(start));
          }
          device_seconds += best * 1e-3;
        }
        verify_device("decoder alone");
        const double device_gbps = total / device_seconds / 1e9;

        // End to end from host memory, one decoder.
        fill_device(device_out.data(), 0, total);
        double e2e_best = 1e30;
        for (int r = 0; r < kHostRepeats; ++r) {
          const auto begin = Clock::now();
          for (size_t b = 0; b < batches; ++b)
            decoder.decode(items_of(b * batch, batch), stream.get());
          e2e_best = std::min(e2e_best, seconds_since(begin));
        }
        verify_device("end to end");
        const double e2e_gbps = total / e2e_best / 1e9;
        std::printf("| %s | %.2f | %zu | %.1f | %.1f | %.1f | %.1fx | %.1fx |\n", c.label, ratio,
                    batch, device_gbps, e2e_gbps, cpu_gbps, device_gbps / cpu_gbps,
                    e2e_gbps / cpu_gbps);

        if (batches < 2) continue;
        // End to end with two decoders on two streams: batch k+1 is staged while k decodes.
        fill_device(device_out.data(), 0, total);
        GpuDecoder* pair[2] = {&decoder, &decoder2};
        cudaStream_t streams[2] = {stream.get(), stream2.get()};
        double piped_best = 1e30;
        for (int r = 0; r < kHostRepeats; ++r) {
          const auto begin = Clock::now();
          for (size_t b = 0; b < batches; ++b) {
            GpuDecoder& d = *pair[b % 2];
            d.finish();
            d.enqueue(items_of(b * batch, batch), streams[b % 2]);
          }
          decoder.finish();
          decoder2.finish();
          piped_best = std::min(piped_best, seconds_since(begin));
        }
        verify_device("two decoders");
        const double piped_gbps = total / piped_best / 1e9;
        std::printf("| %s | %.2f | %zu, 2 decoders overlapped | | %.1f | %.1f | | %.1fx |\n",
                    c.label, ratio, batch, piped_gbps, cpu_gbps, piped_gbps / cpu_gbps);
        const GpuDecoderStats s = decoder.stats();
        if (s.device_allocations > 4)
          std::printf("note: %llu device allocations in one decoder (expected a few)\n",
                      static_cast<unsigned long long>(s.device_allocations));
      }
    }
    std::printf(
        "\nGB/s are decoded bytes per second (1e9); ratio = decoded / stored bytes; "
        "every decoded chunk equals the original.\n");
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return 0;
}
