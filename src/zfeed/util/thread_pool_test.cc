#include "zfeed/util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace zfeed {
namespace {

TEST(ThreadPool, SizeCountsTheCaller) {
  EXPECT_EQ(ThreadPool(1).size(), 1u);
  EXPECT_EQ(ThreadPool(4).size(), 4u);
  EXPECT_EQ(ThreadPool(0).size(), 1u);  // at least the caller
  EXPECT_GE(ThreadPool::shared().size(), 1u);
}

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{17}, size_t{10000}}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](size_t i) { hits[i].fetch_add(1); });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  std::vector<int> order;
  pool.parallel_for(5, [&](size_t i) { order.push_back(static_cast<int>(i)); });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(ThreadPool, ReturnsOnlyAfterEveryCallFinished) {
  ThreadPool pool(4);
  std::atomic<int> finished{0};
  pool.parallel_for(8, [&](size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    finished.fetch_add(1);
  });
  EXPECT_EQ(finished.load(), 8);
}

// Runs `body` on a thread and fails (instead of hanging the test run) if it takes too long.
void within_seconds(int seconds, const std::function<void()>& body) {
  auto future = std::async(std::launch::async, body);
  ASSERT_EQ(future.wait_for(std::chrono::seconds(seconds)), std::future_status::ready)
      << "deadlock: did not finish in " << seconds << " s";
  future.get();
}

TEST(ThreadPool, NestedParallelForDoesNotDeadlock) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(16 * 16);
  within_seconds(60, [&] {
    pool.parallel_for(16, [&](size_t outer) {
      pool.parallel_for(16, [&](size_t inner) {
        // A third level, as nested shards inside a per-chunk task do.
        pool.parallel_for(2, [&](size_t) {});
        hits[outer * 16 + inner].fetch_add(1);
      });
    });
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

TEST(ThreadPool, ConcurrentCallersShareThePool) {
  ThreadPool pool(3);
  std::atomic<int> total{0};
  within_seconds(60, [&] {
    std::vector<std::thread> callers;
    for (int c = 0; c < 4; ++c) {
      callers.emplace_back([&] { pool.parallel_for(100, [&](size_t) { total.fetch_add(1); }); });
    }
    for (auto& t : callers) t.join();
  });
  EXPECT_EQ(total.load(), 400);
}

TEST(ThreadPool, ExceptionPropagatesToCaller) {
  ThreadPool pool(4);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(100,
                                 [&](size_t i) {
                                   ran.fetch_add(1);
                                   if (i == 3) throw std::runtime_error("task 3 failed");
                                 }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 1);
  EXPECT_LE(ran.load(), 100);
  // The pool still works afterwards.
  std::atomic<int> after{0};
  pool.parallel_for(10, [&](size_t) { after.fetch_add(1); });
  EXPECT_EQ(after.load(), 10);
}

TEST(ThreadPool, ExceptionKeepsMessageAndFirstErrorWins) {
  ThreadPool pool(2);
  try {
    pool.parallel_for(1, [](size_t) { throw std::invalid_argument("only one"); });
    FAIL() << "did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "only one");
  }
  try {
    pool.parallel_for(50, [](size_t i) { throw std::out_of_range("task " + std::to_string(i)); });
    FAIL() << "did not throw";
  } catch (const std::out_of_range& e) {
    EXPECT_EQ(std::string(e.what()).rfind("task ", 0), 0u);
  }
}

TEST(ThreadPool, NestedExceptionPropagatesThroughOuterLevel) {
  ThreadPool pool(3);
  within_seconds(60, [&] {
    EXPECT_THROW(pool.parallel_for(8,
                                   [&](size_t outer) {
                                     pool.parallel_for(8, [&](size_t inner) {
                                       if (outer == 5 && inner == 2) throw std::logic_error("deep");
                                     });
                                   }),
                 std::logic_error);
  });
}

// start() returns before its calls finish; two Works in flight each run every index once;
// wait() returns once all of a Work's calls have finished.
TEST(ThreadPool, StartedWorkRunsWhileTheCallerGoesOn) {
  for (size_t threads : {size_t{1}, size_t{2}, size_t{4}}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> first(200), second(150);
    std::atomic<bool> release{false};
    ThreadPool::Work a = pool.start(first.size(), [&](size_t i) {
      if (i == 0 && threads > 1) {
        while (!release) std::this_thread::yield();
      }
      ++first[i];
    });
    ThreadPool::Work b = pool.start(second.size(), [&](size_t i) { ++second[i]; });
    EXPECT_TRUE(a.pending() && b.pending());
    release = true;  // start() returned with index 0 of `a` held up by this flag
    pool.wait(b);
    for (auto& count : second) EXPECT_EQ(count.load(), 1);
    pool.wait(a);
    for (auto& count : first) EXPECT_EQ(count.load(), 1);
    EXPECT_FALSE(a.pending());
    pool.wait(a);  // waiting again does nothing
  }
}

TEST(ThreadPool, StartedWorkRethrowsInWaitAndIsWaitedForWhenDropped) {
  ThreadPool pool(3);
  ThreadPool::Work failing = pool.start(50, [](size_t i) {
    if (i == 7) throw std::runtime_error("task 7 failed");
  });
  try {
    pool.wait(failing);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "task 7 failed");
  }
  std::atomic<int> done{0};
  {
    ThreadPool::Work dropped = pool.start(64, [&](size_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      ++done;
    });
  }  // its destructor waits: nothing it uses may go away under it
  EXPECT_EQ(done.load(), 64);
}

}  // namespace
}  // namespace zfeed
