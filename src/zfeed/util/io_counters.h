// Per-thread counters of time spent waiting on storage reads, so that a caller can split the time
// of a read-and-decode task into I/O and decoding: read the counters before and after the task on
// the same thread. Stores add to them where they block on a read (the file store's pread).
#pragma once

#include <cstdint>

namespace zfeed {

struct IoCounters {
  uint64_t read_ns = 0;
  uint64_t read_bytes = 0;
};

inline IoCounters& thread_io_counters() {
  thread_local IoCounters counters;
  return counters;
}

}  // namespace zfeed
