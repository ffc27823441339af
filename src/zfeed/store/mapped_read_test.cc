#include "zfeed/store/mapped_read.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "zfeed/util/testing.h"

namespace zfeed {
namespace {

// A file of `size` bytes, each one a function of its position and `seed`.
std::string write_file(const std::string& path, size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + i / 4096 + seed);
  FILE* file = std::fopen(path.c_str(), "wb");
  EXPECT_NE(file, nullptr);
  EXPECT_EQ(std::fwrite(bytes.data(), 1, size, file), size);
  std::fclose(file);
  return path;
}

bool holds(const MappedRange& range, uint64_t offset, uint8_t seed) {
  const ByteView bytes = range.bytes();
  for (size_t k = 0; k < bytes.size(); ++k) {
    const size_t i = offset + k;
    if (bytes[k] != static_cast<uint8_t>(i * 31 + i / 4096 + seed)) return false;
  }
  return true;
}

struct OpenFile {
  explicit OpenFile(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~OpenFile() { ::close(fd); }
  int fd;
};

// Many mappings one after another in a thread (more than its arena holds, so it is reset several
// times), at offsets on and off page boundaries: each holds the file's bytes.
TEST(MappedRange, ManyMappingsInTurnHoldTheirBytes) {
  testing::TempDir dir;
  const size_t size = size_t{3} << 20;
  OpenFile file(write_file(dir.path() + "/f", size, 7));
  for (int i = 0; i < 60; ++i) {
    const uint64_t offset = static_cast<uint64_t>(i) * 40961 % (size / 2);
    const uint64_t length = size / 2 - static_cast<uint64_t>(i) * 1000;
    auto range = MappedRange::map(file.fd, offset, length);
    ASSERT_TRUE(range.has_value()) << i;
    ASSERT_EQ(range->bytes().size(), length);
    ASSERT_TRUE(holds(*range, offset, 7)) << i;
  }
  // Larger than a quarter of the arena: mapped on its own.
  OpenFile big(write_file(dir.path() + "/big", size_t{6} << 20, 9));
  auto range = MappedRange::map(big.fd, 100, (size_t{6} << 20) - 100);
  ASSERT_TRUE(range.has_value());
  EXPECT_TRUE(holds(*range, 100, 9));
}

// Mappings still in use when the arena is full are never replaced: the next ones go elsewhere,
// and every live one keeps its bytes.
TEST(MappedRange, LiveMappingsSurviveAFullArena) {
  testing::TempDir dir;
  const size_t size = size_t{4} << 20;
  OpenFile a(write_file(dir.path() + "/a", size, 1));
  OpenFile b(write_file(dir.path() + "/b", size, 2));
  for (int round = 0; round < 8; ++round) {
    // First 0-3 mappings used and let go, so the live ones below meet a full arena at each point.
    for (int i = 0; i < round % 4; ++i) ASSERT_TRUE(MappedRange::map(a.fd, 0, size).has_value());
    std::vector<MappedRange> live;
    for (int i = 0; i < 3; ++i) {
      auto range = MappedRange::map(i % 2 ? b.fd : a.fd, 0, size);
      ASSERT_TRUE(range.has_value());
      live.push_back(std::move(*range));
    }
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(holds(live[i], 0, i % 2 ? 2 : 1)) << round << i;
  }
}

// A file rewritten after a mapping of it was released reads as its new bytes, and threads that
// map and exit leave nothing behind that breaks the next ones.
TEST(MappedRange, RewrittenFilesAndExitedThreads) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/f";
  const size_t size = size_t{1} << 20;
  for (uint8_t seed = 0; seed < 40; ++seed) {
    write_file(path, size, seed);
    OpenFile file(path);
    auto range = MappedRange::map(file.fd, 0, size);
    ASSERT_TRUE(range.has_value());
    EXPECT_TRUE(holds(*range, 0, seed)) << int{seed};
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      OpenFile file(path);
      for (int i = 0; i < 40; ++i) {
        auto range = MappedRange::map(file.fd, 4096, size - 4096);
        EXPECT_TRUE(range.has_value() && holds(*range, 4096, 39));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace
}  // namespace zfeed
