// Per-thread reusable buffers for decoded and encoded chunks. Taking a fresh allocation per chunk
// costs a page fault per 4 KiB on every read; a small pool per thread avoids that, and unlike a
// single thread_local buffer it stays correct when decoding nests (a shard inside a shard).
#pragma once

#include <vector>

#include "zfeed/util/bytes.h"

namespace zfeed {

class ScratchBuffer {
 public:
  ScratchBuffer() : bytes_(take()) {}
  explicit ScratchBuffer(size_t size) : bytes_(take()) { bytes_.resize(size); }
  ~ScratchBuffer() { give_back(std::move(bytes_)); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  Bytes& bytes() { return bytes_; }
  uint8_t* data() { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }

 private:
  static constexpr size_t kKeepPerThread = 4;
  static std::vector<Bytes>& pool() {
    thread_local std::vector<Bytes> buffers;
    return buffers;
  }
  static Bytes take() {
    auto& buffers = pool();
    if (buffers.empty()) return Bytes();
    Bytes bytes = std::move(buffers.back());
    buffers.pop_back();
    return bytes;
  }
  static void give_back(Bytes bytes) {
    auto& buffers = pool();
    if (buffers.size() < kKeepPerThread) {
      bytes.clear();
      buffers.push_back(std::move(bytes));
    }
  }

  Bytes bytes_;
};

}  // namespace zfeed
