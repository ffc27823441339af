// GPU benchmark of scripts/gpu-check: host-to-device copy bandwidth from pinned (PinnedPool) and
// pageable memory, the copy through CopyStream's event hand-over, and the normalize/cast kernel's
// throughput on ERA5-sized planes (640 x 1280). Prints a Markdown table. Exit status 3 when no
// CUDA device is usable (the reason is printed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_bench_util.h"
#include "zfeed/cuda/cast_kernels.h"
#include "zfeed/cuda/check.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/device.h"
#include "zfeed/cuda/pinned_pool.h"

using namespace zfeed::cuda;
using zfeed::loader::OutputType;

namespace {

constexpr int kRepeats = 10;

// Best of kRepeats, in GB/s, of `bytes` moved by `body` enqueued on `stream`.
template <typename Body>
double best_gbps(size_t bytes, cudaStream_t stream, Body body) {
  Event start(true), stop(true);
  body();  // warm-up
  check(cudaStreamSynchronize(stream), "sync");
  float best = 1e30f;
  for (int i = 0; i < kRepeats; ++i) {
    start.record(stream);
    body();
    stop.record(stream);
    stop.synchronize();
    best = std::min(best, stop.elapsed_ms_since(start));
  }
  return static_cast<double>(bytes) / (best * 1e-3) / 1e9;
}

void row(const char* what, size_t bytes, double gbps, const char* note = "") {
  std::printf("| %s | %.0f MiB | %.1f | %s |\n", what, bytes / 1048576.0, gbps, note);
}

}  // namespace

int main(int argc, char** argv) {
  const CudaStatus status = usable_cuda_or_say_why();
  if (!status.available) return 3;
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024) << 20;  // MiB
  const DeviceInfo& device = status.devices[0];
  std::printf("device 0: %s, compute %d.%d, %zu MiB, %d SMs; runtime %d, driver %d\n\n",
              device.name.c_str(), device.compute_major, device.compute_minor,
              device.total_memory >> 20, device.multiprocessors, status.runtime_version,
              status.driver_version);
  std::printf("| what | size | GB/s (best of %d) | note |\n|---|---|---|---|\n", kRepeats);

  Stream stream;
  DeviceBuffer device_buffer(bytes);
  PinnedPool pool(2 * bytes + (64 << 20));
  PinnedPool::Buffer pinned = pool.acquire(bytes);
  std::memset(pinned.data(), 1, bytes);
  std::vector<uint8_t> pageable(bytes, 1);

  const double pinned_h2d = best_gbps(bytes, stream.get(), [&] {
    check(cudaMemcpyAsync(device_buffer.data(), pinned.data(), bytes, cudaMemcpyHostToDevice,
                          stream.get()),
          "h2d");
  });
  row("H2D cudaMemcpyAsync, pinned", bytes, pinned_h2d, "the ceiling");
  row("H2D cudaMemcpyAsync, pageable", bytes, best_gbps(bytes, stream.get(), [&] {
        check(cudaMemcpyAsync(device_buffer.data(), pageable.data(), bytes, cudaMemcpyHostToDevice,
                              stream.get()),
              "h2d");
      }));
  row("D2H cudaMemcpyAsync, pinned", bytes, best_gbps(bytes, stream.get(), [&] {
        check(cudaMemcpyAsync(pinned.data(), device_buffer.data(), bytes, cudaMemcpyDeviceToHost,
                              stream.get()),
              "d2h");
      }));

  // Batch-sized copies (6 x 640 x 1280 float32 = 18.75 MiB) through CopyStream, each handed over
  // to the consumer stream by an event, as the loader will do.
  {
    const size_t batch = size_t{6} * 640 * 1280 * 4;
    const size_t batches = bytes / batch;
    CopyStream copy;
    Event copied;
    const double gbps = best_gbps(batches * batch, stream.get(), [&] {
      for (size_t b = 0; b < batches; ++b) {
        copy.to_device(device_buffer.data() + b * batch, pinned.data() + b * batch, batch);
        copy.hand_over(copied, stream.get());
      }
    });
    char note[96];
    std::snprintf(note, sizeof note, "%zu batches of 18.75 MiB; %.0f%% of pinned", batches,
                  100.0 * gbps / pinned_h2d);
    row("H2D CopyStream + event hand-over", batches * batch, gbps, note);
  }

  // The cast kernel: float32 planes of 640 x 1280 -> float32 / bfloat16 / float16, normalized.
  {
    const size_t plane = size_t{640} * 1280;
    const size_t planes = bytes / 2 / (plane * 4);  // the input half of the device buffer
    DeviceBuffer out(planes * plane * 4), descriptors;
    check(cudaMemset(device_buffer.data(), 0x41, bytes), "memset");
    for (OutputType type : {OutputType::kFloat32, OutputType::kBFloat16, OutputType::kFloat16}) {
      std::vector<CastPlane> list;
      const size_t out_size = zfeed::loader::output_size(type);
      for (size_t p = 0; p < planes; ++p)
        list.push_back({device_buffer.data() + p * plane * 4,
                        out.data() + p * plane * out_size,
                        plane,
                        SourceType::kFloat32,
                        {true, 273.15f, 20.5f}});
      const size_t moved = planes * plane * (4 + out_size);
      const double gbps = best_gbps(moved, stream.get(),
                                    [&] { cast_planes(list, type, descriptors, stream.get()); });
      const std::string what = std::string("cast kernel float32 -> ") +
                               zfeed::loader::output_name(type) + ", normalized";
      char note[64];
      std::snprintf(note, sizeof note, "%zu planes; bytes read + written", planes);
      row(what.c_str(), moved, gbps, note);
    }
  }
  return 0;
}
