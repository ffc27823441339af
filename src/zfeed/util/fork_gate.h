// fork() while zfeed's threads work: a forked child (a DataLoader worker, a multiprocessing fork)
// inherits every lock exactly as it was at the fork, and a lock held by a thread that does not
// exist in the child is held forever there. Our own locks can be taken across the fork, but not
// those inside the allocator (ASan's, jemalloc's) or a codec library. So zfeed's threads do their
// work holding a pass, and fork() first waits until no thread holds one: the child then inherits
// threads parked in a wait, never one in the middle of an allocation.
//
// Rules for code holding a pass: never block on another thread while holding it (wait with a
// ForkGate::Release in scope, declared before the lock), and take no lock when re-entering.
#pragma once

#include <functional>

namespace zfeed {

class ForkGate {
 public:
  // Held while working. Blocks while a fork is waiting, unless this thread already holds a pass
  // (nested work goes on, so that fork's wait for it ends).
  class Pass {
   public:
    Pass();
    ~Pass();
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
  };

  // Gives up this thread's passes for a blocking wait and takes them back at the end of scope.
  class Release {
   public:
    Release();
    ~Release();
    Release(const Release&) = delete;
    Release& operator=(const Release&) = delete;

   private:
    int held_ = 0;
  };

  // Runs around fork() after zfeed's threads have parked: `prepare` takes a lock in the parent
  // before the fork, `parent` releases it there, `child` makes it usable in the child (where
  // condition variables may still count the parent's threads as waiters). Handlers run in the
  // order added for prepare, in reverse for parent and child.
  static void add_fork_handlers(std::function<void()> prepare, std::function<void()> parent,
                                std::function<void()> child);

  // Passes held by all threads now (for tests).
  static int passes_held();
};

}  // namespace zfeed
