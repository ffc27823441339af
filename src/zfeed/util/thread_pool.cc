#include "zfeed/util/thread_pool.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "zfeed/util/cancel.h"
#include "zfeed/util/fork_gate.h"

namespace zfeed {

struct ThreadPool::Job {
  size_t count = 0;
  const std::function<void(size_t)>* fn = nullptr;
  std::function<void(size_t)> owned;          // a started Work's function (fn points here)
  const std::atomic<bool>* cancel = nullptr;  // the submitter's CancelScope, for every task
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::condition_variable done_cv;
  size_t done = 0;
  std::exception_ptr error;

  bool exhausted() const { return next.load(std::memory_order_relaxed) >= count; }
};

ThreadPool::ThreadPool(size_t threads) : threads_(threads == 0 ? 1 : threads), pid_(::getpid()) {
  ForkGate::Pass pass;  // no fork while the workers start
  std::unique_lock lock(mutex_);
  start_workers(lock);
}

void ThreadPool::start_workers(std::unique_lock<std::mutex>& lock) {
  workers_.reserve(threads_ - 1);
  workers_started_ = 0;
  for (size_t i = 0; i + 1 < threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  // Wait until every worker runs: a new thread's start-up (the C library's and a sanitizer's
  // allocations) is outside the fork gate, so a fork() must not overlap it.
  work_available_.wait(lock, [this] { return workers_started_ == workers_.size(); });
}

void ThreadPool::restart_after_fork() {
  std::unique_lock lock(mutex_);
  if (pid_ == ::getpid()) return;
  // The parent's workers do not exist in this process: their handles are dropped without a join
  // (destroying a joinable std::thread would terminate), and so are the parent's pending jobs.
  (void)new std::vector<std::thread>(std::move(workers_));
  workers_.clear();
  jobs_.clear();
  stopping_ = false;
  pid_ = ::getpid();
  start_workers(lock);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run_some(Job& job) {
  const CancelScope scope(job.cancel);
  size_t finished = 0;
  for (;;) {
    size_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.count) break;
    if (!job.failed.load(std::memory_order_relaxed)) {
      try {
        (*job.fn)(i);
      } catch (...) {
        std::lock_guard lock(job.mutex);
        if (!job.error) job.error = std::current_exception();
        job.failed = true;
      }
    }
    ++finished;
  }
  if (finished > 0) {
    std::lock_guard lock(job.mutex);
    job.done += finished;
    if (job.done == job.count) job.done_cv.notify_all();
  }
}

void ThreadPool::worker_loop() {
  // A worker holds a fork pass except while idle, so fork() waits for the calls it runs and
  // for its allocations and frees around them (taking a job, dropping finished ones).
  // Running: the thread's start-up is done (start_workers waits for this). Said before taking
  // the pass, which waits while a fork is pending.
  {
    std::lock_guard lock(mutex_);
    ++workers_started_;
  }
  work_available_.notify_all();
  ForkGate::Pass pass;
  for (;;) {
    {
      ForkGate::Release idle;
      std::unique_lock lock(mutex_);
      work_available_.wait(lock, [this] {
        return stopping_ || std::any_of(jobs_.begin(), jobs_.end(),
                                        [](const auto& job) { return !job->exhausted(); });
      });
    }
    std::shared_ptr<Job> job;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      while (!jobs_.empty() && jobs_.front()->exhausted()) jobs_.pop_front();
      if (jobs_.empty()) continue;
      job = jobs_.front();
    }
    run_some(*job);
  }
}

std::shared_ptr<ThreadPool::Job> ThreadPool::submit(size_t n, const std::function<void(size_t)>* fn,
                                                    std::function<void(size_t)> owned) {
  auto job = std::make_shared<Job>();
  job->count = n;
  job->owned = std::move(owned);
  job->fn = fn ? fn : &job->owned;
  job->cancel = CancelScope::current();
  if (n < 2 || workers_.empty()) return job;  // the caller runs it all
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(job);
  }
  if (n - 1 >= workers_.size()) {
    work_available_.notify_all();
  } else {
    for (size_t i = 0; i + 1 < n; ++i) work_available_.notify_one();
  }
  return job;
}

void ThreadPool::finish(Job& job) {
  run_some(job);
  {
    ForkGate::Release release;  // waiting for the workers, who may be parked for a fork
    std::unique_lock lock(job.mutex);
    job.done_cv.wait(lock, [&] { return job.done == job.count; });
  }
  if (job.error) std::rethrow_exception(job.error);
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  ForkGate::Pass pass;  // given up only while waiting for the workers
  if (pid_ != ::getpid()) restart_after_fork();
  if (n == 1 || workers_.empty()) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  finish(*submit(n, &fn, {}));
}

ThreadPool::Work ThreadPool::start(size_t n, std::function<void(size_t)> fn) {
  Work work;
  if (n == 0) return work;
  if (pid_ != ::getpid()) restart_after_fork();
  work.pool_ = this;
  work.job_ = submit(n, nullptr, std::move(fn));
  return work;
}

void ThreadPool::wait(Work& work) {
  if (!work.job_) return;
  ForkGate::Pass pass;
  const std::shared_ptr<Job> job = std::move(work.job_);
  work.pool_ = nullptr;
  finish(*job);
}

ThreadPool::Work& ThreadPool::Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (job_) {
      try {
        pool_->wait(*this);
      } catch (...) {
      }
    }
    pool_ = std::exchange(other.pool_, nullptr);
    job_ = std::move(other.job_);
  }
  return *this;
}

ThreadPool::Work::~Work() {
  if (!job_) return;
  try {
    pool_->wait(*this);
  } catch (...) {
    // An unwaited Work is being dropped (the caller is unwinding): its error goes with it.
  }
}

namespace {

size_t threads_from_environment(const char* name, size_t fallback) {
  if (const char* env = std::getenv(name)) {
    long value = std::strtol(env, nullptr, 10);
    if (value > 0) return static_cast<size_t>(value);
  }
  return fallback;
}

}  // namespace

void ThreadPool::register_fork_handlers(ThreadPool& pool) {
  // Hold the pool's lock across fork() so that the child never inherits it locked.
  // In the child, the parent's workers may still be counted as waiters of the condition
  // variable (a notify would wait for them forever): start it afresh.
  ForkGate::add_fork_handlers([&pool] { pool.mutex_.lock(); }, [&pool] { pool.mutex_.unlock(); },
                              [&pool] {
                                new (&pool.work_available_) std::condition_variable();
                                pool.mutex_.unlock();
                              });
}

ThreadPool& ThreadPool::shared() {
  static ThreadPool pool([] {
    unsigned hardware = std::thread::hardware_concurrency();
    return threads_from_environment("ZFEED_NUM_THREADS", hardware == 0 ? 1 : hardware);
  }());
  static const bool registered = (register_fork_handlers(pool), true);
  (void)registered;
  return pool;
}

ThreadPool& ThreadPool::io() {
  static ThreadPool pool(threads_from_environment("ZFEED_IO_THREADS", 32));
  static const bool registered = (register_fork_handlers(pool), true);
  (void)registered;
  return pool;
}

ThreadPool& ThreadPool::for_reads(size_t concurrency) {
  ThreadPool& cpu = shared();
  return concurrency > cpu.size() ? io() : cpu;
}

}  // namespace zfeed
