// Reads that wait on the network, done for work nobody may want any more (a loader's prefetch,
// stopped when the loader is dropped or moved to another epoch): the work runs in a CancelScope
// over a flag its owner sets, the thread pool carries the scope into the tasks it runs for that
// work, and a remote store's transfer (or its wait before a retry) ends with an error once the
// flag is set, instead of running to its stall timeout and retries.
#pragma once

#include <atomic>

namespace zfeed {

class CancelScope {
 public:
  // `flag` must outlive the scope and any work started in it (nullptr: work nobody cancels).
  explicit CancelScope(const std::atomic<bool>* flag) : saved_(current_) { current_ = flag; }
  ~CancelScope() { current_ = saved_; }
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

  // The flag of the work this thread does now, for work it hands to other threads.
  static const std::atomic<bool>* current() { return current_; }
  static bool cancelled() { return current_ && current_->load(std::memory_order_relaxed); }

 private:
  const std::atomic<bool>* saved_;
  static inline thread_local const std::atomic<bool>* current_ = nullptr;
};

}  // namespace zfeed
