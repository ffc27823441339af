// GPUDirect Storage benchmark: writes a file (1 GiB by default) and reads all of it into GPU
// memory with DeviceFileReader, through cuFile (ZFEED_GDS=on semantics: "gds" with nvidia-fs,
// "compat" without) and through the pinned fallback (pread + cudaMemcpyAsync), with the page
// cache warm and cold. Prints a Markdown table with GB/s, the mode and its reason; checks the
// bytes that arrived; deletes the file at the end. Exit status 3 when no CUDA device is usable.
//
//   zfeed_gds_bench [PATH [MIB]]     (PATH defaults to ./zfeed_gds_bench.tmp, MIB to 1024)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "gpu_bench_util.h"
#include "zfeed/cuda/check.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/device.h"
#include "zfeed/cuda/gds.h"

using namespace zfeed::cuda;

namespace {

uint64_t word_at(uint64_t index) {  // the file's 64-bit words
  uint64_t x = index * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  x ^= x >> 31;
  return x * 0xBF58476D1CE4E5B9ull;
}

// Removes the file when the benchmark ends, however it ends.
struct TempFile {
  std::string path;
  ~TempFile() {
    if (!path.empty()) ::unlink(path.c_str());
  }
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void write_file(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw zfeed::Error(path + ": cannot create: " + std::strerror(errno));
  std::vector<uint64_t> block((8 << 20) / 8);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, block.size() * 8);
    for (size_t i = 0; i < (n + 7) / 8; ++i) block[i] = word_at(done / 8 + i);
    if (::write(fd, block.data(), n) != static_cast<ssize_t>(n)) {
      ::close(fd);
      throw zfeed::Error(path + ": write failed: " + std::strerror(errno));
    }
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
}

void drop_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Checks 1 MiB at 9 places of what arrived.
bool verify(const DeviceBuffer& device, size_t bytes) {
  const size_t sample = std::min<size_t>(bytes, 1 << 20) / 8 * 8;
  std::vector<uint64_t> back(sample / 8);
  for (int k = 0; k <= 8; ++k) {
    const size_t at = (bytes - sample) / 8 * k / 8 * 8;
    check(cudaMemcpy(back.data(), device.data() + at, sample, cudaMemcpyDeviceToHost), "verify");
    for (size_t i = 0; i < back.size(); ++i)
      if (back[i] != word_at(at / 8 + i)) return false;
  }
  return true;
}

struct Row {
  std::string path, mode, reason;
  double gbps = 0, seconds = 0;
  bool ok = false;
};

Row run(const char* what, GdsPolicy policy, const std::string& path, DeviceBuffer& device,
        size_t bytes) {
  Row row;
  row.path = what;
  try {
    DeviceFileReader reader(policy);
    reader.register_buffer(device.data(), device.size());
    check(cudaMemset(device.data(), 0, bytes), "memset");
    check(cudaDeviceSynchronize(), "sync");
    const auto start = std::chrono::steady_clock::now();
    reader.read(path, 0, bytes, device.data());
    row.seconds = seconds_since(start);
    row.gbps = static_cast<double>(bytes) / row.seconds / 1e9;
    row.mode = reader.mode();
    row.reason = reader.reason();
    row.ok = verify(device, bytes);
    reader.deregister_buffer(device.data());
  } catch (const std::exception& e) {
    row.mode = "-";
    row.reason = e.what();
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const CudaStatus cuda = usable_cuda_or_say_why();
  if (!cuda.available) return 3;
  TempFile file{argc > 1 ? argv[1] : "zfeed_gds_bench.tmp"};
  const size_t bytes = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024) << 20;
  try {
    const GdsStatus status = gds_status(GdsPolicy::kOn);
    std::printf("device 0: %s; cuFile: %s (%s), version %d, %s\n\n", cuda.devices[0].name.c_str(),
                status.mode.c_str(), status.reason.c_str(), status.version,
                status.library.empty() ? "no library" : status.library.c_str());
    const auto start = std::chrono::steady_clock::now();
    write_file(file.path, bytes);
    const double write_s = seconds_since(start);
    DeviceBuffer device(bytes);
    std::vector<Row> rows;
    rows.push_back(
        run("pinned fallback, page cache warm", GdsPolicy::kOff, file.path, device, bytes));
    drop_page_cache(file.path);
    rows.push_back(
        run("cuFile (O_DIRECT), page cache dropped", GdsPolicy::kOn, file.path, device, bytes));
    drop_page_cache(file.path);
    rows.push_back(
        run("pinned fallback, page cache dropped", GdsPolicy::kOff, file.path, device, bytes));
    rows.push_back(
        run("ZFEED_GDS=auto, page cache warm", GdsPolicy::kAuto, file.path, device, bytes));
    std::printf("%zu MiB file %s written in %.2f s (%.2f GB/s, fsync included)\n\n", bytes >> 20,
                file.path.c_str(), write_s, static_cast<double>(bytes) / write_s / 1e9);
    std::printf("| path | GB/s | s | bytes checked | mode | reason |\n|---|---|---|---|---|---|\n");
    for (const Row& row : rows)
      std::printf("| %s | %.2f | %.3f | %s | %s | %s |\n", row.path.c_str(), row.gbps, row.seconds,
                  row.mode == "-" ? "-" : (row.ok ? "ok" : "MISMATCH"), row.mode.c_str(),
                  row.reason.c_str());
    for (const Row& row : rows)
      if (row.mode != "-" && !row.ok) return 1;
  } catch (const std::exception& e) {
    std::printf("gds bench failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
