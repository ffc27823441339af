// Reading a local file by mapping it instead of copying it: the decoder then reads the page cache's
// pages in place, which saves the copy of a pread (about a tenth of the time it takes to read and
// decode a zstd chunk). Whole files are mapped once and the mappings kept between reads
// (MappedFiles, from the second read of a file on): reading a chunk again (the next epoch, the
// target that was an input) then costs a stat, not an open, an mmap, the page faults and the
// unmapping (together 13% of the loader's time on 2 cores). A mapping has one hazard a read does
// not: where another program shrinks the file in place while it is mapped (zarr-python's local
// store rewrites files in place), touching a page past the new end raises SIGBUS and would kill the
// process. zfeed's SIGBUS handler catches that for the mappings the faulting thread is reading: it
// puts a page of zeros where the missing page was, marks the mapping as cut short, and lets the
// reader go on; the reader then throws its result away and reads the file again
// (FileStore::with_bytes). A SIGBUS elsewhere goes to the handler that was there before zfeed's.
// Where mappings are not kept (ZFEED_MAP_CACHE=0, or a file larger than the budget), a thread's
// mappings of up to half of kMappedReadArenaBytes are placed one after another in a range of that
// size it reserves, and unmapped together when it is full (one TLB flush across the cores for many
// chunks, not one per chunk).
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "zfeed/util/bytes.h"

namespace zfeed {

// The most of a file's pages a thread keeps mapped after its reads are done with them (until its
// next mappings need the room), where mappings are not kept whole (MappedFiles).
inline constexpr size_t kMappedReadArenaBytes = size_t{8} << 20;

// A mapping belongs to the thread that made it (the handler looks in that thread's table): use
// and destroy it there.
class MappedRange {
 public:
  // Maps [offset, offset + length) of the open file `fd` read-only. Its pages come in as they are
  // first read (the kernel maps 16 at a time from the page cache, reading them from storage
  // first where needed), which cost less than MAP_POPULATE's one at a time: 4% of the loader's
  // throughput on 2 cores. nullopt where the range cannot be mapped (mmap fails, or the thread
  // already holds too many mappings): read it then.
  static std::optional<MappedRange> map(int fd, uint64_t offset, uint64_t length);

  MappedRange(MappedRange&& other) noexcept;
  MappedRange& operator=(MappedRange&&) = delete;
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;
  ~MappedRange();

  ByteView bytes() const { return {base_ + skip_, length_}; }
  // True where a page of the range was gone when read (the file shrank while it was mapped): its
  // bytes read as zeros, so whatever was made of them must be thrown away.
  bool cut_short() const;

 private:
  MappedRange(uint8_t* base, size_t mapped, size_t skip, size_t length, int slot, bool in_arena);
  uint8_t* base_ = nullptr;  // page-aligned
  size_t mapped_ = 0, skip_ = 0, length_ = 0;
  int slot_ = -1;          // in the thread's table of live mappings
  bool in_arena_ = false;  // placed in the thread's arena (mapped_read.cc): not unmapped alone
};

// A whole file mapped read-only, shared by the threads that read it and kept between their reads
// by MappedFiles; unmapped when the last holder lets it go.
class MappedFile {
 public:
  MappedFile(uint8_t* base, uint64_t size, uint64_t device, uint64_t inode)
      : base_(base), size_(size), device_(device), inode_(inode) {}
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint64_t size() const { return size_; }
  bool maps(const struct stat& info) const {
    return static_cast<uint64_t>(info.st_dev) == device_ &&
           static_cast<uint64_t>(info.st_ino) == inode_ &&
           static_cast<uint64_t>(info.st_size) == size_;
  }
  // Set where a reader found a page gone (the file shrank in place): zeros stand there now, so
  // the mapping no longer shows the file and is not used again.
  bool cut_short() const { return cut_short_.load() != 0; }

 private:
  friend class MappedFileRead;
  uint8_t* base_;
  uint64_t size_, device_, inode_;
  std::atomic<int> cut_short_{0};  // lock-free: the SIGBUS handler sets it
};

// A thread's read of a kept mapping, seen by the SIGBUS handler while it lasts: begin, use and
// end it on one thread.
class MappedFileRead {
 public:
  // nullopt where the thread already reads through too many mappings (read the file then).
  static std::optional<MappedFileRead> begin(std::shared_ptr<MappedFile> file, uint64_t offset,
                                             uint64_t length);
  MappedFileRead(MappedFileRead&& other) noexcept;
  MappedFileRead& operator=(MappedFileRead&&) = delete;
  MappedFileRead(const MappedFileRead&) = delete;
  MappedFileRead& operator=(const MappedFileRead&) = delete;
  ~MappedFileRead();

  ByteView bytes() const { return {file_->base_ + offset_, length_}; }
  // True where a page of the file was gone when read, by this read or another thread's: what was
  // made of the bytes must be thrown away.
  bool cut_short() const;

 private:
  MappedFileRead(std::shared_ptr<MappedFile> file, uint64_t offset, uint64_t length, int slot);
  std::shared_ptr<MappedFile> file_;
  uint64_t offset_ = 0, length_ = 0;
  int slot_ = -1;
};

// The process's kept mappings of whole files, by path, from a file's second read on (a file read
// once, as one-pass jobs like rechunk read, is mapped for that read alone and leaves nothing
// behind), or its first in a RereadScope; least recently read dropped first beyond a budget: half
// the machine's memory in mapped file sizes (more than that would not stay in the page cache
// anyway) and 16384 files (well under Linux's default of 65530 mappings a process). The pages are
// the page cache's: keeping them mapped holds page tables (2 MB per GB read), not memory of
// zfeed's, though the resident size counts them (RssFile), and the kernel still reclaims them as it
// would the cache. A mapping of a file that was since replaced (a new inode) or resized is not
// used: the next read maps the file as it is now.
class MappedFiles {
 public:
  // The kept mapping of the file at `path`, nullptr where none is (no system call: a read looks
  // here first, then checks with a stat that the mapping still maps the file, MappedFile::maps).
  static std::shared_ptr<MappedFile> kept(const std::string& path);
  // After a read opened the file at `path` (`fd`, and `info` its fstat): a mapping of it, kept,
  // where this is its second read or the thread is in a RereadScope; nullptr where it is read
  // once (map it for this read alone then), or keeping is off, the file is larger than the
  // budget, or mmap fails.
  static std::shared_ptr<MappedFile> keep(const std::string& path, int fd, const struct stat& info);
  // In its scope, the thread's reads are of files it will read again (a loader's, every epoch):
  // their mappings are kept from the first read on.
  class RereadScope {
   public:
    RereadScope();
    ~RereadScope();
    RereadScope(const RereadScope&) = delete;
    RereadScope& operator=(const RereadScope&) = delete;

   private:
    bool outer_;
  };
  // Drops the kept mapping of `path` if it is `file` (after a read found it cut short).
  static void forget(const std::string& path, const MappedFile* file);
  // A store rooted at `directory` opens and closes: when the last store of a directory closes,
  // the mappings of files under it are dropped (so that deleted files free their disk space).
  static void open_directory(const std::string& directory);
  static void close_directory(const std::string& directory);
  // What is kept now (tests, stats), and the budget (tests make it small): set_budget returns the
  // one it replaces.
  static uint64_t kept_bytes();
  static size_t kept_files();
  static std::pair<uint64_t, size_t> set_budget(uint64_t bytes, size_t files);
};

// Whether mappings are kept between reads: ZFEED_MAP_CACHE=0 turns it off (each read then maps
// its range and lets it go), anything else or nothing leaves it on.
bool mapped_file_cache_enabled();

// Whether reads map files (FileStore::with_bytes): the environment variable ZFEED_MMAP=0 turns
// it off (for comparisons), anything else or nothing leaves it on.
bool mapped_reads_enabled();

}  // namespace zfeed
