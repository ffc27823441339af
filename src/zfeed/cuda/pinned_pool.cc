#include "zfeed/cuda/pinned_pool.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "zfeed/cuda/check.h"

namespace zfeed::cuda {

struct PinnedPool::State {
  std::mutex mutex;
  size_t max_bytes = 0;
  size_t pinned = 0;
  size_t allocations = 0, reuses = 0;
  std::multimap<size_t, uint8_t*> free;  // capacity -> buffer
  bool closed = false;                   // the pool is gone: returned buffers are freed

  void free_unused() {
    for (auto& [capacity, data] : free) {
      cudaFreeHost(data);
      pinned -= capacity;
    }
    free.clear();
  }
};

PinnedPool::Buffer::Buffer(Buffer&& other) noexcept
    : state_(std::move(other.state_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}

PinnedPool::Buffer& PinnedPool::Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    state_ = std::move(other.state_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void PinnedPool::Buffer::reset() {
  if (!data_) return;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->closed) {
      cudaFreeHost(data_);
      state_->pinned -= capacity_;
    } else {
      state_->free.emplace(capacity_, data_);
    }
  }
  state_.reset();
  data_ = nullptr;
  size_ = capacity_ = 0;
}

PinnedPool::PinnedPool(size_t max_bytes) : state_(std::make_shared<State>()) {
  state_->max_bytes = max_bytes;
}

PinnedPool::~PinnedPool() {
  std::lock_guard lock(state_->mutex);
  state_->free_unused();
  state_->closed = true;
}

PinnedPool::Buffer PinnedPool::acquire(size_t bytes) {
  Buffer buffer;
  std::lock_guard lock(state_->mutex);
  State& s = *state_;
  auto fit = s.free.lower_bound(bytes);
  if (fit != s.free.end()) {
    buffer.data_ = fit->second;
    buffer.capacity_ = fit->first;
    s.free.erase(fit);
    ++s.reuses;
  } else {
    if (s.pinned + bytes > s.max_bytes) s.free_unused();
    if (s.pinned + bytes > s.max_bytes)
      throw Error("pinned pool: " + std::to_string(bytes) +
                  " bytes more would exceed its bound of " + std::to_string(s.max_bytes) +
                  " bytes (" + std::to_string(s.pinned) + " lent out)");
    void* data = nullptr;
    check(cudaHostAlloc(&data, bytes ? bytes : 1, cudaHostAllocPortable), "cudaHostAlloc");
    s.pinned += bytes;
    ++s.allocations;
    buffer.data_ = static_cast<uint8_t*>(data);
    buffer.capacity_ = bytes;
  }
  buffer.size_ = bytes;
  buffer.state_ = state_;
  return buffer;
}

void PinnedPool::trim() {
  std::lock_guard lock(state_->mutex);
  state_->free_unused();
}

size_t PinnedPool::max_bytes() const { return state_->max_bytes; }
size_t PinnedPool::bytes_pinned() const {
  std::lock_guard lock(state_->mutex);
  return state_->pinned;
}
size_t PinnedPool::allocations() const {
  std::lock_guard lock(state_->mutex);
  return state_->allocations;
}
size_t PinnedPool::reuses() const {
  std::lock_guard lock(state_->mutex);
  return state_->reuses;
}

}  // namespace zfeed::cuda
