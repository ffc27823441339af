#include "zfeed/util/fork_gate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "zfeed/util/testing.h"
#include "zfeed/util/thread_pool.h"

namespace zfeed {
namespace {

TEST(ForkGate, PassesNestAndAReleaseGivesThemUpForItsScope) {
  const int before = ForkGate::passes_held();
  {
    ForkGate::Pass outer;
    ForkGate::Pass inner;  // nested: never waits
    EXPECT_EQ(ForkGate::passes_held(), before + 2);
    {
      ForkGate::Release release;
      EXPECT_EQ(ForkGate::passes_held(), before);
    }
    EXPECT_EQ(ForkGate::passes_held(), before + 2);
  }
  EXPECT_EQ(ForkGate::passes_held(), before);
  ForkGate::Release without_passes;  // nothing to give up
  EXPECT_EQ(ForkGate::passes_held(), before);
}

TEST(ForkGate, ForkWaitsUntilWorkInProgressIsDone) {
  std::atomic<bool> started{false}, done{false};
  std::thread worker([&] {
    ForkGate::Pass pass;
    started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    done = true;
  });
  while (!started) std::this_thread::yield();
  const pid_t child = ::fork();  // waits for the worker's pass
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(done ? 0 : 1);
  EXPECT_TRUE(done.load());
  worker.join();
  EXPECT_EQ(testing::exit_status_of_child(child), 0) << "the child was forked mid-work";
}

// The shared pool busy with allocating work in another thread while the main thread forks again
// and again: every child gets a working pool (its own workers) and never inherits a lock held by
// a parent's thread mid-allocation (under ASan this hung before the gate).
TEST(ForkGate, ForkWhileThePoolIsBusyLeavesAUsableChild) {
  auto allocating_sum = [](size_t n) {
    std::atomic<uint64_t> total{0};
    ThreadPool::shared().parallel_for(n, [&](size_t i) {
      auto values = std::make_unique<std::vector<uint64_t>>(1000 + i % 7, i);
      total += std::accumulate(values->begin(), values->end(), uint64_t{0});
    });
    return total.load();
  };
  const uint64_t expected = allocating_sum(64);
  std::atomic<bool> stop{false}, running{false};
  std::thread busy([&] {  // as the loader's prefetch thread: it works holding a pass
    while (!stop) {
      ForkGate::Pass pass;
      running = true;
      EXPECT_EQ(allocating_sum(64), expected);
    }
  });
  // A thread's own start-up (the C library's and the sanitizer's allocations) is outside the
  // gate: the loader waits for its prefetch thread to run before it goes on, and so does this.
  while (!running) std::this_thread::yield();
  for (int round = 0; round < 20; ++round) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) ::_exit(allocating_sum(64) == expected ? 0 : 1);
    const int status = testing::exit_status_of_child(child, 30);
    if (status != 0) {
      ADD_FAILURE() << "round " << round << ": the child's pool failed (status " << status << ")";
      break;
    }
  }
  stop = true;
  busy.join();
}

}  // namespace
}  // namespace zfeed
