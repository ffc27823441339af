#include "zfeed/util/fork_gate.h"

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <new>
#include <vector>

namespace zfeed {
namespace {

struct Handlers {
  std::function<void()> prepare, parent, child;
};

struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool forking = false;
  int active = 0;  // passes held, over all threads
  std::vector<Handlers> handlers;
};

Gate& gate() {
  static Gate* const instance = new Gate();  // never destroyed: threads may outlive statics
  return *instance;
}

thread_local int passes_of_this_thread = 0;

void before_fork() {
  Gate& g = gate();
  std::unique_lock lock(g.mutex);
  g.forking = true;
  g.cv.wait(lock, [&] { return g.active == passes_of_this_thread; });
  // Every other thread has parked; the gate's lock stays held across the fork, so no thread is
  // inside it when the child's copy is made.
  for (auto& handler : g.handlers) handler.prepare();
  lock.release();
}

void after_fork_in_parent() {
  Gate& g = gate();
  for (auto it = g.handlers.rbegin(); it != g.handlers.rend(); ++it) it->parent();
  g.forking = false;
  g.mutex.unlock();
  g.cv.notify_all();
}

void after_fork_in_child() {
  Gate& g = gate();
  for (auto it = g.handlers.rbegin(); it != g.handlers.rend(); ++it) it->child();
  g.forking = false;
  g.active = passes_of_this_thread;  // the other threads, and their passes, stayed in the parent
  new (&g.cv) std::condition_variable();  // it may count the parent's threads as waiters
  g.mutex.unlock();
}

void register_with_pthread() {
  static const bool registered = [] {
    ::pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    return true;
  }();
  (void)registered;
}

}  // namespace

ForkGate::Pass::Pass() {
  register_with_pthread();
  Gate& g = gate();
  std::unique_lock lock(g.mutex);
  if (passes_of_this_thread == 0) g.cv.wait(lock, [&] { return !g.forking; });
  ++g.active;
  ++passes_of_this_thread;
}

ForkGate::Pass::~Pass() {
  Gate& g = gate();
  std::lock_guard lock(g.mutex);
  --g.active;
  --passes_of_this_thread;
  if (g.forking) g.cv.notify_all();
}

ForkGate::Release::Release() : held_(passes_of_this_thread) {
  if (held_ == 0) return;
  Gate& g = gate();
  std::lock_guard lock(g.mutex);
  g.active -= held_;
  passes_of_this_thread = 0;
  if (g.forking) g.cv.notify_all();
}

ForkGate::Release::~Release() {
  if (held_ == 0) return;
  Gate& g = gate();
  std::unique_lock lock(g.mutex);
  g.cv.wait(lock, [&] { return !g.forking; });
  g.active += held_;
  passes_of_this_thread = held_;
}

void ForkGate::add_fork_handlers(std::function<void()> prepare, std::function<void()> parent,
                                 std::function<void()> child) {
  register_with_pthread();
  Gate& g = gate();
  std::lock_guard lock(g.mutex);
  g.handlers.push_back({std::move(prepare), std::move(parent), std::move(child)});
}

int ForkGate::passes_held() {
  Gate& g = gate();
  std::lock_guard lock(g.mutex);
  return g.active;
}

}  // namespace zfeed
