#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "zfeed/store/mapped_read.h"
#include "zfeed/store/store.h"
#include "zfeed/util/error.h"
#include "zfeed/util/testing.h"

namespace zfeed {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every regular file below `dir`, relative to it.
std::vector<std::string> files_below(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(fs::relative(entry.path(), dir).string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(FileStore, KeysAreFilesUnderTheRoot) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  EXPECT_EQ(store->url(), "file://" + dir.path());
  store->set("arr/c/0/1", as_bytes("chunk"));
  EXPECT_EQ(read_file(dir / "arr/c/0/1"), "chunk");
  // Files written by others are visible.
  std::ofstream(dir / "other.json") << "{}";
  EXPECT_EQ(store->get("other.json")->as_string(), "{}");
}

TEST(FileStore, RootWithTrailingSlashAndRelativeRootAreNormalized) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path() + "///");
  EXPECT_EQ(store->url(), "file://" + dir.path());
}

TEST(FileStore, CreateOptionMakesTheRoot) {
  testing::TempDir dir;
  FileStoreOptions options;
  options.create = true;
  auto store = make_file_store(dir / "new/deeper", options);
  EXPECT_TRUE(fs::is_directory(dir / "new/deeper"));
  EXPECT_TRUE(store->list("").empty());
}

TEST(FileStore, WritesLeaveNoTemporaryFiles) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  for (int i = 0; i < 20; ++i)
    store->set("a/k" + std::to_string(i % 3), as_bytes(std::string(i * 100, 'x')));
  EXPECT_EQ(files_below(dir.path()), (std::vector<std::string>{"a/k0", "a/k1", "a/k2"}));
}

TEST(FileStore, WrittenFilesGetOrdinaryPermissions) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  store->set("k", as_bytes("v"));
  mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat info {};
  ASSERT_EQ(::stat((dir / "k").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0666 & ~mask);  // not mkstemp's 0600
}

TEST(FileStore, TemporaryFilesAreNotListed) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  store->set("g/k", as_bytes("v"));
  // A temporary file left by a killed writer.
  std::ofstream(dir / "g/.k.zfeed-tmp-abc123") << "torn";
  EXPECT_EQ(store->list(""), (std::vector<std::string>{"g/k"}));
  EXPECT_EQ(store->list_dir("g/"), (std::vector<std::string>{"k"}));
}

TEST(FileStore, FailedWriteKeepsOldValueAndLeavesNoTemp) {
  // The rename fails because the key names a non-empty directory: the temporary file must be
  // removed and nothing else changed.
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  store->set("d/inner", as_bytes("inner value"));
  std::string message = error_of([&] { store->set("d", as_bytes("new")); });
  EXPECT_CONTAINS(message, "file://" + dir.path() + "/d");
  EXPECT_EQ(store->get("d/inner")->as_string(), "inner value");
  EXPECT_EQ(files_below(dir.path()), (std::vector<std::string>{"d/inner"}));
}

TEST(FileStore, WriteThatFailsMidwayKeepsOldValue) {
  // A write that fails part-way (the file size limit stops it, as a full disk would) must leave
  // the old value intact and no temporary file behind.
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  store->set("c/0", as_bytes("old value"));
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string big(1 << 20, 'n');
  std::string message;
  try {
    store->set("c/0", as_bytes(big));
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_CONTAINS(message, "c/0");
  EXPECT_CONTAINS(message, "write failed");
  EXPECT_EQ(store->get("c/0")->as_string(), "old value");
  EXPECT_EQ(files_below(dir.path()), (std::vector<std::string>{"c/0"}));
}

TEST(FileStore, WriteIntoAPathBelowAFileFails) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  store->set("f", as_bytes("file"));
  std::string message = error_of([&] { store->set("f/child", as_bytes("x")); });
  EXPECT_CONTAINS(message, "f/child");
  EXPECT_EQ(store->get("f")->as_string(), "file");
}

TEST(FileStore, ReadersSeeOldOrNewNeverAMix) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  const std::string a(1 << 16, 'a'), b(1 << 16, 'b');
  store->set("k", as_bytes(a));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; i < 200 && !stop; ++i) store->set("k", as_bytes(i % 2 ? b : a));
  });
  int torn = 0;
  for (int i = 0; i < 300; ++i) {
    auto value = store->get("k");
    ASSERT_TRUE(value.has_value());
    std::string_view text = value->as_string();
    if (text != a && text != b) ++torn;
  }
  stop = true;
  writer.join();
  EXPECT_EQ(torn, 0);
}

TEST(FileStore, ErasePrefixRemovesDirectoryAndRootContents) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  store->set("a/b/c", as_bytes("1"));
  store->set("a/d", as_bytes("2"));
  store->set("e", as_bytes("3"));
  store->erase_prefix("a/");
  EXPECT_FALSE(fs::exists(dir / "a"));
  EXPECT_EQ(store->list(""), (std::vector<std::string>{"e"}));
  store->erase_prefix("");
  EXPECT_TRUE(fs::is_directory(dir.path())) << "the root itself stays";
  EXPECT_TRUE(store->list("").empty());
}

TEST(FileStore, ListingsDoNotClimbOutOfTheRoot) {
  testing::TempDir dir;
  std::ofstream(dir / "secret") << "outside";
  FileStoreOptions options;
  options.create = true;
  auto store = make_file_store(dir / "root", options);
  store->set("k", as_bytes("v"));
  EXPECT_THROW(store->list_dir("../"), Error);
  EXPECT_THROW(store->list("../s"), Error);
  EXPECT_THROW(store->erase_prefix("../"), Error);
  EXPECT_TRUE(fs::exists(dir / "secret"));
}

TEST(FileStore, ReadIntoReadsInPlace) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  Bytes value = testing::pseudo_random_bytes(100000, 7);
  store->set("big", value);
  Bytes out(value.size());
  ASSERT_TRUE(store->read_into("big", out.mutable_view()));
  EXPECT_TRUE(testing::same_bytes(out.data(), value.data(), value.size()));
  Bytes range;
  ASSERT_TRUE(store->get_into("big", ByteRange::range(99990, 10), range));
  EXPECT_TRUE(testing::same_bytes(range.data(), value.data() + 99990, 10));
}

// The file behind a key, for consumers that read it by other means (GPUDirect Storage); keys
// are checked as get() checks them, so no path outside the root is ever handed out.
TEST(FileStore, LocalPathIsTheKeysFileUnderTheRoot) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path() + "/");
  store->set("arr/c/0/1", as_bytes("chunk"));
  EXPECT_EQ(store->local_path("arr/c/0/1"), dir / "arr/c/0/1");
  EXPECT_EQ(read_file(*store->local_path("arr/c/0/1")), "chunk");
  EXPECT_EQ(store->local_path("arr/c/9/9"), dir / "arr/c/9/9") << "need not exist";
  for (const char* key : {"..", "../secret", "a/../../secret", "/etc/passwd", "a//b", "", "a\\b"}) {
    SCOPED_TRACE(key);
    const std::string refused = error_of([&] { store->get(key); });
    EXPECT_CONTAINS(refused, "invalid key");
    EXPECT_EQ(error_of([&] { store->local_path(key); }), refused);
  }
  // Other stores keep no local files.
  auto memory = make_memory_store();
  memory->set("k", as_bytes("v"));
  EXPECT_FALSE(memory->local_path("k").has_value());
}

TEST(FileStore, MissingRootReadsAsEmpty) {
  testing::TempDir dir;
  auto store = make_file_store(dir / "does-not-exist");
  EXPECT_FALSE(store->get("zarr.json").has_value());
  EXPECT_TRUE(store->list("").empty());
  EXPECT_TRUE(store->list_dir("").empty());
}

// with_bytes hands over large values mapped and small ones read, whole or by range, equal to
// get(); a missing key is false without a call.
TEST(FileStore, WithBytesGivesTheValueMappedOrRead) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  for (const size_t size : {size_t{100}, size_t{1} << 20}) {
    Bytes value(size);
    for (size_t i = 0; i < size; ++i) value[i] = static_cast<uint8_t>(i * 131 + 7);
    store->set("v", value.view());
    for (const ByteRange range :
         {ByteRange::all(), ByteRange::range(5000 % size, size / 3), ByteRange::suffix(size / 2)}) {
      const Bytes want = *store->get("v", range);
      int calls = 0;
      EXPECT_TRUE(store->with_bytes("v", range, [&](ByteView bytes) {
        ++calls;
        EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), want.begin(), want.end()));
      }));
      EXPECT_EQ(calls, 1) << size << " " << range.describe();
    }
  }
  EXPECT_FALSE(store->with_bytes("missing", ByteRange::all(), [](ByteView) { FAIL(); }));
  EXPECT_NE(error_of([&] {
              store->with_bytes("v", ByteRange::range(1, 2) /* fine */, [](ByteView) {});
              store->with_bytes("v", ByteRange::range((1 << 20) - 1, 2), [](ByteView) {});
            }).find("v"),
            std::string::npos);
}

// A value of `size` bytes, each a function of its position and `seed`.
Bytes patterned(size_t size, uint8_t seed) {
  Bytes value(size);
  for (size_t i = 0; i < size; ++i) value[i] = static_cast<uint8_t>(i * 131 + i / 4096 + seed);
  return value;
}

// What with_bytes hands over for `key`, and where (to tell a kept mapping's reuse).
std::pair<Bytes, const uint8_t*> bytes_of(const Store& store, std::string_view key,
                                          ByteRange range = ByteRange::all()) {
  Bytes got;
  const uint8_t* at = nullptr;
  EXPECT_TRUE(store.with_bytes(key, range, [&](ByteView bytes) {
    got = Bytes(bytes.size());
    std::copy(bytes.begin(), bytes.end(), got.data());
    at = bytes.data();
  }));
  return {std::move(got), at};
}

bool same_bytes(const Bytes& a, const Bytes& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Large values are read through one mapping of their file, kept from their second read on
// (those read once leave nothing mapped); a file replaced
// (written anew and renamed, as set() does), grown or shrunk in place reads as it is now, never
// as it was; closing the store lets its mappings go.
TEST(FileStore, KeptMappingsAreReusedAndFollowTheFile) {
  if (!mapped_reads_enabled() || !mapped_file_cache_enabled()) GTEST_SKIP() << "mappings not kept";
  testing::TempDir dir;
  const size_t kept_before = MappedFiles::kept_files();
  {
    auto store = make_file_store(dir.path());
    const size_t size = size_t{1} << 20;
    store->set("a", patterned(size, 1).view());
    store->set("b", patterned(size, 2).view());
    EXPECT_TRUE(same_bytes(bytes_of(*store, "a").first, patterned(size, 1)));
    EXPECT_TRUE(same_bytes(bytes_of(*store, "b").first, patterned(size, 2)));
    EXPECT_EQ(MappedFiles::kept_files(), kept_before) << "files read once are not kept";
    store->set("c", patterned(size, 4).view());
    {
      MappedFiles::RereadScope rereading;  // a loader's reads: kept from the first
      EXPECT_TRUE(same_bytes(bytes_of(*store, "c").first, patterned(size, 4)));
    }
    EXPECT_EQ(MappedFiles::kept_files(), kept_before + 1);
    auto [a1, at1] = bytes_of(*store, "a");
    auto [b1, bt1] = bytes_of(*store, "b");
    auto [a2, at2] = bytes_of(*store, "a", ByteRange::range(4096 * 3 + 5, 70000));
    EXPECT_TRUE(same_bytes(a1, patterned(size, 1)));
    EXPECT_TRUE(same_bytes(b1, patterned(size, 2)));
    EXPECT_TRUE(same_bytes(a2, *store->get("a", ByteRange::range(4096 * 3 + 5, 70000))));
    EXPECT_EQ(at2, at1 + 4096 * 3 + 5) << "the third read of a mapped again";
    EXPECT_EQ(MappedFiles::kept_files(), kept_before + 3);

    store->set("a", patterned(size, 3).view());  // a new file renamed over the old one
    EXPECT_TRUE(same_bytes(bytes_of(*store, "a").first, patterned(size, 3)));
    const std::string path = dir.path() + "/a";
    {
      std::ofstream grow(path, std::ios::binary | std::ios::app);
      grow << std::string(5000, 'x');
    }
    Bytes grown = bytes_of(*store, "a").first;
    ASSERT_EQ(grown.size(), size + 5000);
    EXPECT_EQ(grown[size + 4999], 'x');
    ASSERT_EQ(::truncate(path.c_str(), size - 200000), 0);  // shrunk in place, read after
    EXPECT_TRUE(same_bytes(bytes_of(*store, "a").first, *store->get("a", ByteRange::all())));
    EXPECT_EQ(MappedFiles::kept_files(), kept_before + 3);
    fs::remove(path);
    EXPECT_FALSE(store->with_bytes("a", ByteRange::all(), [](ByteView) { FAIL(); }));
  }
  EXPECT_EQ(MappedFiles::kept_files(), kept_before) << "the closed store's mappings were kept";
}

// Beyond the budget the least recently read mappings go (those still being read stay valid
// until their reads end); a file larger than the whole budget is mapped for its read alone.
TEST(FileStore, KeptMappingsStayWithinTheirBudget) {
  if (!mapped_reads_enabled() || !mapped_file_cache_enabled()) GTEST_SKIP() << "mappings not kept";
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  const size_t size = size_t{256} << 10;
  for (int i = 0; i < 12; ++i) store->set("v" + std::to_string(i), patterned(size, i).view());
  const uint64_t kept_bytes = MappedFiles::kept_bytes();
  const size_t kept_files = MappedFiles::kept_files();
  const auto budget = MappedFiles::set_budget(kept_bytes + 5 * size, kept_files + 3);  // 3 more
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 12; ++i) {
      const std::string key = "v" + std::to_string(i);
      // The read in progress outlives its mapping's eviction by the reads inside it.
      EXPECT_TRUE(store->with_bytes(key, ByteRange::all(), [&](ByteView bytes) {
        for (int j = 1; j <= 4; ++j) {
          const std::string other = "v" + std::to_string((i + j) % 12);
          EXPECT_TRUE(same_bytes(bytes_of(*store, other).first, patterned(size, (i + j) % 12)));
        }
        Bytes mine(bytes.size());
        std::copy(bytes.begin(), bytes.end(), mine.data());
        EXPECT_TRUE(same_bytes(mine, patterned(size, i))) << key;
      }));
      EXPECT_LE(MappedFiles::kept_files(), kept_files + 3);
      EXPECT_LE(MappedFiles::kept_bytes(), kept_bytes + 5 * size);
    }
  }
  store->set("big", patterned(6 * size, 99).view());
  EXPECT_TRUE(same_bytes(bytes_of(*store, "big").first, patterned(6 * size, 99)));
  EXPECT_LE(MappedFiles::kept_bytes(), kept_bytes + 5 * size);
  MappedFiles::set_budget(budget.first, budget.second);
}

// Threads reading one kept mapping while its file is shrunk and restored in place, over and
// over: no SIGBUS kills the process, every read either ends with a `use` of the file's bytes as
// they were at some moment or fails naming the key, and afterwards reads see the file as it is.
TEST(FileStore, KeptMappingsSurviveFilesShrunkUnderConcurrentReads) {
  if (!mapped_reads_enabled() || !mapped_file_cache_enabled()) GTEST_SKIP() << "mappings not kept";
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  const size_t size = size_t{2} << 20, cut = 5000;
  const Bytes value = patterned(size, 5);
  store->set("chunk", value.view());
  const std::string path = dir.path() + "/chunk";
  std::atomic<bool> stop{false};
  std::atomic<int> whole{0}, short_reads{0}, failed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      MappedFiles::RereadScope rereading;
      while (!stop.load()) {
        try {
          Bytes last;
          store->with_bytes("chunk", ByteRange::all(), [&](ByteView bytes) {
            last = Bytes(bytes.size());
            std::copy(bytes.begin(), bytes.end(), last.data());  // every page
          });
          if (same_bytes(last, value)) {
            ++whole;
          } else {
            // Shrunk or being restored: the value's start, then what is being written; never
            // longer than the file.
            EXPECT_LE(last.size(), size);
            ++short_reads;
          }
        } catch (const Error& error) {
          EXPECT_NE(std::string(error.what()).find("chunk"), std::string::npos) << error.what();
          ++failed;
        }
      }
    });
  }
  for (int round = 0; round < 200; ++round) {
    ASSERT_EQ(::truncate(path.c_str(), cut), 0);
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, value.data(), size, 0), static_cast<ssize_t>(size));
    ::close(fd);
  }
  stop = true;
  for (std::thread& reader : readers) reader.join();
  EXPECT_GT(whole.load() + short_reads.load() + failed.load(), 0);
  EXPECT_TRUE(same_bytes(bytes_of(*store, "chunk").first, value));
  std::printf("reads: %d whole, %d of a file being rewritten, %d failed\n", whole.load(),
              short_reads.load(), failed.load());
}

// A file shrunk in place while it is mapped (another program rewriting it) must not kill the
// process with SIGBUS: the pages past its new end read as zeros, and the value is read again as
// it is now, so the last call of `use` sees the new bytes.
TEST(FileStore, WithBytesSurvivesAFileShrunkWhileMapped) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  const size_t size = size_t{4} << 20;
  Bytes value(size);
  for (size_t i = 0; i < size; ++i) value[i] = static_cast<uint8_t>(i % 251 + 1);
  store->set("chunk", value.view());
  const std::string path = dir.path() + "/chunk";
  std::vector<size_t> seen;
  uint64_t sum = 0;
  EXPECT_TRUE(store->with_bytes("chunk", ByteRange::all(), [&](ByteView bytes) {
    seen.push_back(bytes.size());
    if (seen.size() == 1) {
      ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
    }
    for (uint8_t b : bytes) sum += b;  // touches every page, those past the new end too
  }));
  if (seen.size() == 1 && seen[0] == 1000) GTEST_SKIP() << "values this size are not mapped";
  ASSERT_EQ(seen.size(), 2u) << "the value was not read again";
  EXPECT_EQ(seen[0], size);
  EXPECT_EQ(seen[1], 1000u);
  // A range that the shrunk file no longer holds is an error naming the key, not a crash.
  store->set("chunk", value.view());
  const std::string message = error_of([&] {
    store->with_bytes("chunk", ByteRange::range(size / 2, size / 4), [&](ByteView bytes) {
      EXPECT_EQ(::truncate(path.c_str(), 1000), 0);
      for (uint8_t b : bytes) sum += b;
    });
  });
  EXPECT_NE(message.find("chunk"), std::string::npos) << message;
  // And mapped reads go on working.
  store->set("chunk", value.view());
  EXPECT_TRUE(store->with_bytes("chunk", ByteRange::all(), [&](ByteView bytes) {
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), value.begin(), value.end()));
  }));
}

// Reads the 4 MiB value "chunk" (written anew) and shrinks its file to 1000 bytes in the middle of
// the read; the sizes the read's `use` was called with (4 MiB then 1000 where the value was mapped
// and read again).
void write_four_mib(Store& store) {
  const size_t size = size_t{4} << 20;
  Bytes value(size);
  for (size_t i = 0; i < size; ++i) value[i] = static_cast<uint8_t>(i % 251 + 1);
  store.set("chunk", value.view());
}

std::vector<size_t> read_while_shrinking(Store& store, const std::string& path) {
  write_four_mib(store);
  std::vector<size_t> seen;
  uint64_t sum = 0;
  store.with_bytes("chunk", ByteRange::all(), [&](ByteView bytes) {
    seen.push_back(bytes.size());
    if (seen.size() == 1 && ::truncate(path.c_str(), 1000) != 0) std::abort();
    for (uint8_t b : bytes) sum += b;  // touches every page, those past the new end too
  });
  return seen;
}

// The SIGBUS handler finds the faulting thread's mappings by its thread id: a forked child's
// thread (a new id) and threads started after thousands of others have come and gone (each took
// a table of mappings and must have given it back) are still covered.
TEST(FileStore, ShrunkFilesAreSurvivedInForkedChildrenAndOnNewThreads) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  const std::string path = dir.path() + "/chunk";
  const std::vector<size_t> read_again = {size_t{4} << 20, 1000};
  const std::vector<size_t> first = read_while_shrinking(*store, path);
  if (first.size() == 1 && first[0] == 1000) GTEST_SKIP() << "values this size are not mapped";
  ASSERT_EQ(first, read_again);

  write_four_mib(*store);
  for (int i = 0; i < 5000; ++i) {
    std::thread([&] {
      EXPECT_TRUE(store->with_bytes("chunk", ByteRange::all(), [](ByteView bytes) {
        EXPECT_EQ(bytes.size(), size_t{4} << 20);
      }));
    }).join();
  }
  std::vector<size_t> on_new_thread;
  std::thread([&] { on_new_thread = read_while_shrinking(*store, path); }).join();
  EXPECT_EQ(on_new_thread, read_again);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit codes: 0 all survived and read again, 2 the forking thread's read, 3 a new thread's.
    if (read_while_shrinking(*store, path) != read_again) ::_exit(2);
    std::vector<size_t> in_child_thread;
    std::thread([&] { in_child_thread = read_while_shrinking(*store, path); }).join();
    ::_exit(in_child_thread == read_again ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A SIGBUS sent to the process (kill, raise), not a fault of a mapping, is taken the default way
// (the process ends), and is not swallowed by the mapping guard, which must stay in place.
TEST(FileStore, ASentSigbusIsNotSwallowedByTheMappingGuard) {
  testing::TempDir dir;
  auto store = make_file_store(dir.path());
  const std::string path = dir.path() + "/chunk";
  const std::vector<size_t> first = read_while_shrinking(*store, path);  // installs the guard
  if (first.size() == 1 && first[0] == 1000) GTEST_SKIP() << "values this size are not mapped";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int quiet = ::open("/dev/null", O_WRONLY);  // AddressSanitizer's report of it, if any
    if (quiet >= 0) ::dup2(quiet, STDERR_FILENO);
    ::raise(SIGBUS);
    ::_exit(0);  // survived: the signal was swallowed
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // Ended by the signal (or, under AddressSanitizer, whose handler came before ours, by its
  // report): not on, as if nothing had happened.
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the SIGBUS was swallowed";
}

}  // namespace
}  // namespace zfeed
