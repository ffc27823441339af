// Reading a local file by mapping it instead of copying it: the decoder then reads the page
// cache's pages in place, which saves the copy of a pread (about a tenth of the time it takes to
// read and decode a zstd chunk). A mapping has one hazard a read does not: where another program
// shrinks the file in place while it is mapped (zarr-python's local store rewrites files in
// place), touching a page past the new end raises SIGBUS and would kill the process. zfeed's
// SIGBUS handler catches that for the mappings of the thread that faults: it puts a page of
// zeros where the missing page was, marks the mapping as cut short, and lets the reader go on;
// the reader then throws its result away and reads the file again (FileStore::with_bytes). A
// SIGBUS elsewhere goes to the handler that was there before zfeed's. A thread's mappings of up
// to half of kMappedReadArenaBytes are placed one after another in a range of that size it
// reserves, and unmapped together when it is full (one TLB flush across the cores for many
// chunks, not one per chunk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "zfeed/util/bytes.h"

namespace zfeed {

// The most of a file's pages a thread keeps mapped after its reads are done with them (until its
// next mappings need the room): part of the loader's memory bound.
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

// Whether reads map files (FileStore::with_bytes): the environment variable ZFEED_MMAP=0 turns
// it off (for comparisons), anything else or nothing leaves it on.
bool mapped_reads_enabled();

}  // namespace zfeed
