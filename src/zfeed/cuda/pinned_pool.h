// A pool of page-locked host buffers (cudaHostAlloc), reused: pinning memory costs far more than
// copying it, so batches are assembled into buffers pinned once. The pool holds at most
// `max_bytes` (lent and free together); a request beyond that first frees unused buffers, then
// fails. Thread-safe; a lent buffer returns to the pool when its handle is dropped, also after
// the pool itself is gone. Built only with CUDA (ZFEED_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace zfeed::cuda {

class PinnedPool {
  struct State;

 public:
  // A lent buffer; returns to the pool on destruction.
  class Buffer {
   public:
    Buffer() = default;
    ~Buffer() { reset(); }
    Buffer(Buffer&& other) noexcept;
    Buffer& operator=(Buffer&& other) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    uint8_t* data() const { return data_; }
    size_t size() const { return size_; }          // the size asked for
    size_t capacity() const { return capacity_; }  // the size pinned
    void reset();                                  // returns the buffer to the pool now

   private:
    friend class PinnedPool;
    std::shared_ptr<State> state_;
    uint8_t* data_ = nullptr;
    size_t size_ = 0, capacity_ = 0;
  };

  explicit PinnedPool(size_t max_bytes);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A buffer of at least `bytes` (the smallest free one that fits, else a new one). Throws
  // zfeed::Error when the bound would be exceeded or cudaHostAlloc fails.
  Buffer acquire(size_t bytes);
  // Frees the buffers not lent out.
  void trim();

  size_t max_bytes() const;
  size_t bytes_pinned() const;  // lent and free
  size_t allocations() const;   // cudaHostAlloc calls so far
  size_t reuses() const;        // acquire() served from a free buffer

 private:
  std::shared_ptr<State> state_;
};

}  // namespace zfeed::cuda
