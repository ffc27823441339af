// Ctrl-C during long work done with the GIL released (staging a store): Python runs signal
// handlers only on its main thread, and only when that thread runs Python, so C++ work must ask.
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "zfeed/util/fork_gate.h"

// A stop check (zarr::StageOptions::stop) for work started on the calling thread: asked on that
// thread, it runs Python's signal handlers (with the GIL) at most every 100 ms and says true
// once one raised (KeyboardInterrupt), leaving that error set for raise_if_interrupted; other
// threads see what it found.
inline std::function<bool()> python_interrupt_check() {
  struct State {
    std::thread::id owner = std::this_thread::get_id();
    std::atomic<bool> interrupted{false};
    std::chrono::steady_clock::time_point last{};
  };
  auto state = std::make_shared<State>();
  return [state] {
    if (state->interrupted) return true;
    if (std::this_thread::get_id() != state->owner) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now - state->last < std::chrono::milliseconds(100)) return false;
    state->last = now;
    // This thread may hold a fork pass (work inside the pool) while a Python thread that holds
    // the GIL waits in fork() for the passes: give them up while waiting for the GIL.
    zfeed::ForkGate::Release for_the_gil;
    nanobind::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() != 0) state->interrupted = true;
    return state->interrupted.load();
  };
}

// With the GIL held, after such work ended: raises the error a signal handler set, if any.
inline void raise_if_interrupted() {
  if (PyErr_Occurred()) throw nanobind::python_error();
}
