// A small thread pool for data-parallel loops. The calling thread works too, and a task may
// itself call parallel_for (a shard's inner chunks inside a per-shard task) without deadlock.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace zfeed {

class ThreadPool {
  struct Job;

 public:
  // `threads` counts the caller: a pool of size n starts n - 1 workers.
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Runs fn(i) for every i in [0, n) and returns when all have finished. If any throws, the
  // first exception is rethrown here once every started call has returned; calls not yet
  // started are skipped.
  void parallel_for(size_t n, const std::function<void(size_t)>& fn);

  // parallel_for in two halves, so that the caller can prepare the next work while the workers
  // run this: start() queues fn(i) for every i in [0, n) and returns at once; wait() runs what is
  // left of it on the calling thread too, returns when every call has finished, and rethrows the
  // first exception. A Work must be waited for before whatever fn uses goes away (its destructor
  // waits, and drops an exception). Works queue in order: the workers finish the tasks of one
  // before they take the next's, so two in flight overlap only at the first's end.
  class Work {
   public:
    Work() = default;
    Work(Work&&) noexcept = default;
    Work& operator=(Work&& other) noexcept;
    ~Work();
    bool pending() const { return job_ != nullptr; }

   private:
    friend class ThreadPool;
    ThreadPool* pool_ = nullptr;
    std::shared_ptr<Job> job_;
  };
  Work start(size_t n, std::function<void(size_t)> fn);
  void wait(Work& work);

  // The process-wide pool: ZFEED_NUM_THREADS threads, or one per hardware thread. It survives
  // fork(): its lock is held across the fork (so the child's copy is consistent), and the child's
  // first parallel_for starts fresh workers (the parent's do not exist there).
  static ThreadPool& shared();

  // The process-wide pool for work that mostly waits (reads from remote stores, whose round
  // trips overlap only with many in flight): ZFEED_IO_THREADS threads, 32 by default. Forks as
  // shared() does.
  static ThreadPool& io();

  // The pool to read `concurrency` things at once on: shared() where that is 0 (CPU-bound
  // local reads) or no more than it has, io() otherwise.
  static ThreadPool& for_reads(size_t concurrency);

 private:
  std::shared_ptr<Job> submit(size_t n, const std::function<void(size_t)>* fn,
                              std::function<void(size_t)> owned);
  static void finish(Job& job);
  static void register_fork_handlers(ThreadPool& pool);
  void start_workers(std::unique_lock<std::mutex>& lock);  // `lock` holds mutex_
  void restart_after_fork();
  void worker_loop();
  static void run_some(Job& job);

  std::mutex mutex_;
  std::condition_variable work_available_;
  std::deque<std::shared_ptr<Job>> jobs_;
  std::vector<std::thread> workers_;
  size_t workers_started_ = 0;  // under mutex_: workers that reached their loop
  bool stopping_ = false;
  size_t threads_ = 1;
  int pid_ = 0;  // the process whose workers these are
};

}  // namespace zfeed
