// Helpers shared by the C++ unit tests (included by *_test.cc only, never by the library).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "zfeed/util/bytes.h"
#include "zfeed/util/error.h"

namespace zfeed::testing {

// Runs `fn`, expects it to throw `E` (zfeed::Error by default) and returns the message. A
// different exception or none at all is a test failure (and returns "").
template <typename E = Error, typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong exception type: " << e.what();
    return "";
  } catch (...) {
    ADD_FAILURE() << "threw a non-std exception";
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// EXPECT_CONTAINS(message, "c/0/0") with the message printed on failure.
#define EXPECT_CONTAINS(text, part)                       \
  EXPECT_TRUE(::zfeed::testing::contains((text), (part))) \
      << "expected \"" << (part) << "\" in: " << (text)

// [offset, offset + size) of a file, read by itself (as a GPUDirect Storage consumer reads a
// located chunk). A failed or short read is a test failure.
inline Bytes read_file_range(const std::string& path, uint64_t offset, uint64_t size) {
  Bytes out(size);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  if (fd < 0) return out;
  const ssize_t got = ::pread(fd, out.data(), size, static_cast<off_t>(offset));
  ::close(fd);
  EXPECT_EQ(got, static_cast<ssize_t>(size)) << path;
  return out;
}

// A fresh directory under $TMPDIR, removed with everything in it at the end of the scope.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "zfeed-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

// Every file under `root` (relative path -> bytes), to compare two stores byte for byte.
inline std::map<std::string, std::string> file_tree(const std::filesystem::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    files[std::filesystem::relative(entry.path(), root).string()] =
        std::string((std::istreambuf_iterator<char>(in)), {});
  }
  return files;
}

// The shared data folder (../shared next to the checkout), or "" when it is absent.
inline std::string shared_dir() {
  std::filesystem::path dir = std::filesystem::path(ZFEED_SOURCE_DIR) / ".." / "shared";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return "";
  return std::filesystem::canonical(dir, ec).string();
}

// Skips the test when the shared path `relative` (under ../shared) does not exist.
#define ZFEED_REQUIRE_SHARED(var, relative)                              \
  std::string var = ::zfeed::testing::shared_dir();                      \
  if (var.empty() || !std::filesystem::exists(var + "/" + (relative))) { \
    GTEST_SKIP() << "shared test data ../shared/" << (relative)          \
                 << " is absent (ZFEED_SOURCE_DIR/../shared); skipping"; \
  }                                                                      \
  var += "/" + std::string(relative)

template <typename T>
std::vector<T> iota_values(size_t n, T start = T{}, T step = T{1}) {
  std::vector<T> values(n);
  T v = start;
  for (auto& x : values) {
    x = v;
    v = static_cast<T>(v + step);
  }
  return values;
}

// Deterministic pseudo-random bytes (xorshift), compressible enough when `smooth`.
inline Bytes pseudo_random_bytes(size_t n, uint64_t seed = 1, bool smooth = false) {
  Bytes out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    // Smooth: a slow ramp with a little noise in every eighth byte (compresses well).
    out[i] = smooth ? static_cast<uint8_t>((i / 64) + (i % 8 == 0 ? (x & 3) : 0))
                    : static_cast<uint8_t>(x);
  }
  return out;
}

inline bool same_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

}  // namespace zfeed::testing

namespace zfeed::testing {

// The exit status of a forked child, waiting at most `seconds`: a child still running then has
// hung (a lock inherited from a thread that stayed in the parent); it is killed and the test
// fails saying so, instead of hanging the whole test run. Returns -1 unless the child exited.
inline int exit_status_of_child(pid_t child, double seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  for (;;) {
    const pid_t got = ::waitpid(child, &status, WNOHANG);
    if (got == child) break;
    if (got < 0) {
      ADD_FAILURE() << "waitpid failed: " << std::strerror(errno);
      return -1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      // Where gdb is at hand, the hung child's threads' stacks say which lock it waits for.
      std::string stacks;
      const std::string command = "gdb -p " + std::to_string(child) +
                                  " -batch -ex 'thread apply all bt 30' 2>/dev/null | grep -E "
                                  "'^(Thread|#)' | head -150";
      if (FILE* pipe = ::popen(command.c_str(), "r")) {
        char line[512];
        while (std::fgets(line, sizeof line, pipe)) stacks += line;
        ::pclose(pipe);
      }
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      ADD_FAILURE() << "the forked child hung (killed after " << seconds << " s)"
                    << (stacks.empty() ? std::string() : "; its threads:\n" + stacks);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!WIFEXITED(status)) {
    ADD_FAILURE() << "the forked child did not exit normally (status " << status << ")";
    return -1;
  }
  return WEXITSTATUS(status);
}

}  // namespace zfeed::testing
