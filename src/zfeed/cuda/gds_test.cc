// GPUDirect Storage reads (cuda/gds.h). Without a GPU: gds_status() says why cuFile is unusable
// and never crashes, the library search honours ZFEED_CUFILE_LIBRARY and finds the nvidia-cufile
// wheel of a Python environment, and a reader refuses to start with a clear error. With a GPU:
// ranges at odd offsets and sizes land in device memory byte for byte under every policy, errors
// name the path, and ZFEED_GDS=off forces the pinned path and says so.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "zfeed/cuda/device.h"
#include "zfeed/cuda/testing.h"
#include "zfeed/util/error.h"

#if ZFEED_HAVE_CUDA
#include "zfeed/cuda/check.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/gds.h"
#endif

namespace zfeed::cuda {

#if ZFEED_HAVE_CUDA
std::vector<std::string> cufile_library_candidates();  // gds.cc
#endif

namespace {

#if ZFEED_HAVE_CUDA

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Sets an environment variable for the scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A fresh folder, removed at the end of the scope: under the current directory by default (a
// disk file system, where O_DIRECT and cuFile work; /tmp may be tmpfs), or under `parent`.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& parent = ".") {
    std::string pattern = parent + "/zfeed-gds-test-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = std::filesystem::absolute(pattern).string();
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST(GdsStatus, SaysWhyAndNeverCrashes) {
  const GdsStatus status = gds_status();
  const CudaStatus cuda = cuda_status();
  std::printf("gds_status: available=%d mode=%s reason='%s' library='%s' version=%d\n",
              status.available, status.mode.c_str(), status.reason.c_str(), status.library.c_str(),
              status.version);
  EXPECT_FALSE(status.reason.empty());
  if (status.available) {
    EXPECT_TRUE(status.mode == "gds" || status.mode == "compat") << status.mode;
    EXPECT_FALSE(status.library.empty());
  } else {
    EXPECT_EQ(status.mode, "off");
  }
  if (!cuda.available) {
    EXPECT_FALSE(status.available);
    // The library may or may not be found here; either way the reason says what stops cuFile.
    EXPECT_TRUE(has(status.reason, "cuFile unavailable: ") ||
                status.reason == "cuFile unusable: " + cuda.reason ||
                status.reason == "turned off (ZFEED_GDS=off)")
        << status.reason;
  }
  // Cached and stable.
  const GdsStatus again = gds_status();
  EXPECT_EQ(again.mode, status.mode);
  EXPECT_EQ(again.reason, status.reason);
}

TEST(GdsStatus, OffPolicySaysSo) {
  const GdsStatus status = gds_status(GdsPolicy::kOff);
  EXPECT_FALSE(status.available);
  EXPECT_EQ(status.mode, "off");
  EXPECT_EQ(status.reason, "turned off (ZFEED_GDS=off)");
  ScopedEnv off("ZFEED_GDS", "off");
  EXPECT_EQ(gds_status().reason, "turned off (ZFEED_GDS=off)");
}

TEST(GdsStatus, PolicyFromTheEnvironment) {
  {
    ScopedEnv unset("ZFEED_GDS", nullptr);
    EXPECT_EQ(gds_policy_from_env(), GdsPolicy::kAuto);
  }
  for (auto [value, policy] :
       {std::pair{"auto", GdsPolicy::kAuto}, std::pair{"", GdsPolicy::kAuto},
        std::pair{"off", GdsPolicy::kOff}, std::pair{"on", GdsPolicy::kOn}}) {
    ScopedEnv set("ZFEED_GDS", value);
    EXPECT_EQ(gds_policy_from_env(), policy) << value;
  }
  EXPECT_STREQ(gds_policy_name(GdsPolicy::kOn), "on");
  ScopedEnv bad("ZFEED_GDS", "yes");
  try {
    gds_policy_from_env();
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "ZFEED_GDS='yes': expected off, auto or on");
  }
  const GdsStatus status = gds_status();  // never throws
  EXPECT_FALSE(status.available);
  EXPECT_EQ(status.reason, "ZFEED_GDS='yes': expected off, auto or on");
}

TEST(GdsLibrary, HonoursZfeedCufileLibrary) {
  ScopedEnv forced("ZFEED_CUFILE_LIBRARY", "/nonexistent/libcufile.so.0");
  EXPECT_EQ(cufile_library_candidates(), std::vector<std::string>{"/nonexistent/libcufile.so.0"});
}

TEST(GdsLibrary, FindsTheWheelOfAVirtualEnvironment) {
  ScratchDir dir(std::filesystem::temp_directory_path().string());
  const std::string lib = dir / "venv/lib/python3.12/site-packages/nvidia/cu13/lib";
  std::filesystem::create_directories(lib);
  std::ofstream(lib + "/libcufile.so.0") << "not a library";
  ScopedEnv unforced("ZFEED_CUFILE_LIBRARY", nullptr);
  ScopedEnv venv("VIRTUAL_ENV", (dir / "venv").c_str());
  const std::vector<std::string> candidates = cufile_library_candidates();
  ASSERT_GE(candidates.size(), 3u);
  EXPECT_EQ(candidates[0], "libcufile.so.0");
  EXPECT_EQ(candidates[1], "libcufile.so");
  EXPECT_NE(std::find(candidates.begin(), candidates.end(), lib + "/libcufile.so.0"),
            candidates.end());
}

TEST(GdsReader, WithoutADeviceRefusesClearly) {
  const CudaStatus cuda = cuda_status();
  if (cuda.available) GTEST_SKIP() << "a CUDA device is present";
  try {
    DeviceFileReader reader(GdsPolicy::kAuto);
    FAIL() << "no exception";
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(std::string(e.what()), "DeviceFileReader is unavailable: " + cuda.reason);
  }
}

// --- with a GPU -------------------------------------------------------------------------------

// Byte i of the test files.
uint8_t pattern(uint64_t i, uint8_t salt = 0) {
  return static_cast<uint8_t>((i * 2654435761u) >> 13) ^ static_cast<uint8_t>(i >> 16) ^ salt;
}

std::string write_pattern(const std::string& path, size_t size, uint8_t salt = 0) {
  std::vector<char> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(pattern(i, salt));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(size));
  return path;
}

// Reads [offset, offset + size) to device offset `at` of `device`, copies back, compares.
void expect_read(DeviceFileReader& reader, const std::string& path, uint64_t offset, size_t size,
                 DeviceBuffer& device, size_t at, cudaStream_t stream = nullptr, uint8_t salt = 0) {
  SCOPED_TRACE("offset " + std::to_string(offset) + " size " + std::to_string(size) +
               " device offset " + std::to_string(at));
  fill_device(device.data(), 0xEE, device.size());
  reader.read(path, offset, size, device.data() + at, stream);
  std::vector<uint8_t> back(size + 2);
  check(cudaMemcpy(back.data(), device.data() + at - 1, size + 2, cudaMemcpyDeviceToHost),
        "copy back");
  EXPECT_EQ(back[0], 0xEE) << "wrote before the destination";
  EXPECT_EQ(back[size + 1], 0xEE) << "wrote past the destination";
  for (size_t i = 0; i < size; ++i)
    ASSERT_EQ(back[i + 1], pattern(offset + i, salt))
        << "byte " << i << " (" << reader.mode() << ": " << reader.reason() << ")";
}

void read_odd_ranges(GdsPolicy policy) {
  ScratchDir dir;
  const size_t file_size = (3 << 20) + 123;
  const std::string path = write_pattern(dir / "data.bin", file_size);
  DeviceFileReader reader(policy, 4 << 20);  // 2 MiB pieces: big reads take several
  std::printf("policy %s: cuFile mode %s; %s\n", gds_policy_name(policy),
              reader.cufile_mode().c_str(), reader.reason().c_str());
  DeviceBuffer device((4 << 20) + 3 * 4096);
  Stream stream;
  struct Range {
    uint64_t offset;
    size_t size;
    size_t at;  // device offset (at least 1: the byte before is checked)
  };
  const Range ranges[] = {
      {0, file_size, 4096},            // whole file, co-aligned
      {0, file_size, 1},               // whole file, not co-aligned
      {1, 1, 1},                       // one byte
      {4095, 4097, 4095},              // crosses one boundary, co-aligned: 1 + 4096
      {4096, 8192, 4096},              // exactly two aligned blocks
      {12345, (1 << 20) + 7, 12345},   // co-aligned head, body and tail
      {12345, (1 << 20) + 7, 777},     // not co-aligned
      {file_size - 5, 5, 3},           // the last bytes
      {file_size - 4100, 4100, 4092},  // an aligned block then the tail to EOF
      {100, 3000, 100},                // within one block
  };
  for (const Range& r : ranges) expect_read(reader, path, r.offset, r.size, device, r.at);
  for (const Range& r : ranges)
    expect_read(reader, path, r.offset, r.size, device, r.at, stream.get());
  const DeviceFileReader::Stats stats = reader.stats();
  std::printf("  cuFile %llu reads %llu bytes, pinned %llu reads %llu bytes\n",
              static_cast<unsigned long long>(stats.cufile_reads),
              static_cast<unsigned long long>(stats.cufile_bytes),
              static_cast<unsigned long long>(stats.fallback_reads),
              static_cast<unsigned long long>(stats.fallback_bytes));
  if (reader.cufile_mode() == "off") {
    EXPECT_EQ(stats.cufile_bytes, 0u);
  } else if (reinterpret_cast<uintptr_t>(device.data()) % 4096 == 0) {
    // The first read was co-aligned: cuFile took its body, unless the file cannot use cuFile.
    EXPECT_TRUE(stats.cufile_bytes > 0 || has(reader.reason(), "O_DIRECT") ||
                has(reader.reason(), "cuFile"))
        << reader.reason();
  }
  reader.read(path, 17, 0, nullptr);  // an empty read of an existing file: nothing to do
}

TEST(GdsReader, ReadsOddRangesThroughThePinnedPath) {
  ZFEED_SKIP_WITHOUT_CUDA();
  read_odd_ranges(GdsPolicy::kOff);
}

TEST(GdsReader, ReadsOddRangesUnderAuto) {
  ZFEED_SKIP_WITHOUT_CUDA();
  read_odd_ranges(GdsPolicy::kAuto);
}

// kOn only where kAuto opened cuFile too: kOn also opens the driver where kAuto declines to (no
// /run/udev), which can bring the process down in some VMs; zfeed_gds_bench tries that instead.
TEST(GdsReader, ReadsOddRangesUnderOnWhereCufileWorks) {
  ZFEED_SKIP_WITHOUT_CUDA();
  const GdsStatus status = gds_status(GdsPolicy::kAuto);
  if (!status.available) {
    if (has(status.reason, "cuFile unavailable: ")) {  // no library: kOn refuses to start
      try {
        DeviceFileReader reader(GdsPolicy::kOn);
        FAIL() << "no exception";
      } catch (const UnsupportedError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "ZFEED_GDS=on but cuFile is unavailable: " + status.reason);
      }
    }
    GTEST_SKIP() << "cuFile unavailable: " << status.reason;
  }
  read_odd_ranges(GdsPolicy::kOn);
}

TEST(GdsReader, ReadsIntoManagedMemory) {
  ZFEED_SKIP_WITHOUT_CUDA();
  ScratchDir dir;
  const std::string path = write_pattern(dir / "data.bin", 1 << 20);
  void* managed = nullptr;
  check(cudaMallocManaged(&managed, 1 << 20), "cudaMallocManaged");
  DeviceFileReader reader(GdsPolicy::kAuto);
  reader.read(path, 0, 1 << 20, managed);
  check(cudaDeviceSynchronize(), "sync");
  const auto* bytes = static_cast<const uint8_t*>(managed);
  for (size_t i = 0; i < (1 << 20); ++i) ASSERT_EQ(bytes[i], pattern(i)) << i;
  if (reader.cufile_mode() != "off") {
    EXPECT_EQ(reader.mode(), "off");
    EXPECT_TRUE(has(reader.reason(), "managed memory") || has(reader.reason(), "O_DIRECT") ||
                has(reader.reason(), "cuFile"))
        << reader.reason();
  }
  cudaFree(managed);
}

TEST(GdsReader, ZfeedGdsOffForcesThePinnedPathAndSaysSo) {
  ZFEED_SKIP_WITHOUT_CUDA();
  ScopedEnv off("ZFEED_GDS", "off");
  DeviceFileReader reader;
  EXPECT_EQ(reader.policy(), GdsPolicy::kOff);
  EXPECT_EQ(reader.mode(), "off");
  EXPECT_EQ(reader.cufile_mode(), "off");
  EXPECT_EQ(reader.reason(), "turned off (ZFEED_GDS=off)");
  ScratchDir dir;
  const std::string path = write_pattern(dir / "data.bin", 1 << 20);
  DeviceBuffer device(1 << 20);
  reader.read(path, 0, 1 << 20, device.data());
  EXPECT_EQ(reader.mode(), "off");
  EXPECT_EQ(reader.reason(), "turned off (ZFEED_GDS=off)");
  EXPECT_EQ(reader.stats().cufile_bytes, 0u);
  EXPECT_EQ(reader.stats().fallback_bytes, 1u << 20);
  EXPECT_FALSE(reader.register_buffer(device.data(), device.size()));
}

TEST(GdsReader, ErrorsNameThePath) {
  ZFEED_SKIP_WITHOUT_CUDA();
  ScratchDir dir;
  const std::string path = write_pattern(dir / "data.bin", 10000);
  DeviceBuffer device(1 << 16);
  for (GdsPolicy policy : {GdsPolicy::kOff, GdsPolicy::kAuto}) {
    DeviceFileReader reader(policy);
    const std::string missing = dir / "missing.bin";
    try {
      reader.read(missing, 0, 16, device.data());
      FAIL() << "no exception";
    } catch (const NotFoundError& e) {
      EXPECT_EQ(std::string(e.what()), missing + ": stat: No such file or directory");
    }
    try {
      reader.read(path, 8192, 4096, device.data());
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), path +
                                           ": short read: bytes [8192, 12288) requested, the "
                                           "file holds 10000 bytes");
    }
    std::vector<uint8_t> host(64);
    try {
      reader.read(path, 0, 64, host.data());
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_TRUE(has(e.what(), path + ": DeviceFileReader: the destination ")) << e.what();
      EXPECT_TRUE(has(e.what(), "is not device memory")) << e.what();
    }
    try {
      reader.read(dir / "", 0, 16, device.data());
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_TRUE(has(e.what(), "not a regular file")) << e.what();
    }
  }
}

TEST(GdsReader, RereadsAFileReplacedOnDisk) {
  ZFEED_SKIP_WITHOUT_CUDA();
  ScratchDir dir;
  const std::string path = write_pattern(dir / "data.bin", 65536, 0);
  DeviceBuffer device(65536 + 8192);
  DeviceFileReader reader(GdsPolicy::kAuto);
  expect_read(reader, path, 0, 65536, device, 4096, nullptr, 0);
  write_pattern(dir / "next.bin", 65536, 0x5A);
  std::filesystem::rename(dir / "next.bin", path);  // as FileStore writes: temp + rename
  expect_read(reader, path, 0, 65536, device, 4096, nullptr, 0x5A);
}

TEST(GdsReader, ThreadsShareOneReader) {
  ZFEED_SKIP_WITHOUT_CUDA();
  ScratchDir dir;
  const size_t file_size = 8 << 20;
  const std::string path = write_pattern(dir / "data.bin", file_size);
  DeviceFileReader reader(GdsPolicy::kAuto, 2 << 20);  // fewer staging slots than threads
  DeviceBuffer device(file_size);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      const size_t part = file_size / 6 / 4096 * 4096;
      const size_t begin = t * part, size = t == 5 ? file_size - begin : part;
      for (int repeat = 0; repeat < 3; ++repeat)
        reader.read(path, begin, size, device.data() + begin);
    });
  for (std::thread& thread : threads) thread.join();
  std::vector<uint8_t> back(file_size);
  check(cudaMemcpy(back.data(), device.data(), file_size, cudaMemcpyDeviceToHost), "copy back");
  for (size_t i = 0; i < file_size; ++i) ASSERT_EQ(back[i], pattern(i)) << i;
}

// tmpfs (/dev/shm): O_DIRECT may be refused there; the read still lands, and the reason says so.
TEST(GdsReader, ReadsFromTmpfsWhateverItsPath) {
  ZFEED_SKIP_WITHOUT_CUDA();
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  ScratchDir dir("/dev/shm");
  const std::string path = write_pattern(dir / "data.bin", 1 << 20);
  DeviceBuffer device((1 << 20) + 8192);
  DeviceFileReader reader(GdsPolicy::kAuto);
  expect_read(reader, path, 4096, (1 << 20) - 4096, device, 4096);
  std::printf("tmpfs: %s: %s\n", reader.mode().c_str(), reader.reason().c_str());
  if (reader.mode() == "off" && reader.cufile_mode() != "off") {
    EXPECT_TRUE(has(reader.reason(), "tmpfs") || has(reader.reason(), "cuFile")) << reader.reason();
  }
}

#else

TEST(GdsStatus, SaysWhyAndNeverCrashes) { GTEST_SKIP() << cuda_status().reason; }

#endif  // ZFEED_HAVE_CUDA

}  // namespace
}  // namespace zfeed::cuda
