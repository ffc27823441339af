// Byte buffers. Bytes owns uninitialized-on-growth storage (a vector would zero every decoded
// chunk before overwriting it); ByteView and MutableByteView are non-owning spans.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>

namespace zfeed {

using ByteView = std::span<const uint8_t>;
using MutableByteView = std::span<uint8_t>;

class Bytes {
 public:
  Bytes() = default;
  explicit Bytes(size_t size) { resize(size); }
  Bytes(const uint8_t* data, size_t size) { assign(data, size); }
  explicit Bytes(ByteView view) { assign(view.data(), view.size()); }
  explicit Bytes(std::string_view text) {
    assign(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }

  Bytes(const Bytes& other) { assign(other.data(), other.size()); }
  Bytes& operator=(const Bytes& other) {
    if (this != &other) assign(other.data(), other.size());
    return *this;
  }
  Bytes(Bytes&& other) noexcept
      : data_(std::move(other.data_)), size_(other.size_), capacity_(other.capacity_) {
    other.size_ = other.capacity_ = 0;
  }
  Bytes& operator=(Bytes&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = other.size_;
    capacity_ = other.capacity_;
    other.size_ = other.capacity_ = 0;
    return *this;
  }

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  uint8_t& operator[](size_t i) { return data_[i]; }
  uint8_t operator[](size_t i) const { return data_[i]; }
  uint8_t* begin() { return data(); }
  uint8_t* end() { return data() + size_; }
  const uint8_t* begin() const { return data(); }
  const uint8_t* end() const { return data() + size_; }

  // New bytes past the old size are left uninitialized.
  void resize(size_t size) {
    reserve(size);
    size_ = size;
  }
  void reserve(size_t capacity) {
    if (capacity <= capacity_) return;
    auto grown = std::make_unique_for_overwrite<uint8_t[]>(capacity);
    if (size_ > 0) std::memcpy(grown.get(), data_.get(), size_);
    data_ = std::move(grown);
    capacity_ = capacity;
  }
  void assign(const uint8_t* data, size_t size) {
    resize(size);
    if (size > 0) std::memcpy(data_.get(), data, size);
  }
  void append(ByteView more) {
    if (more.empty()) return;
    size_t old = size_;
    if (old + more.size() > capacity_) reserve(std::max(old + more.size(), capacity_ * 2));
    size_ = old + more.size();
    std::memcpy(data_.get() + old, more.data(), more.size());
  }
  void clear() { size_ = 0; }

  ByteView view() const { return {data(), size_}; }
  MutableByteView mutable_view() { return {data(), size_}; }
  operator ByteView() const { return view(); }
  std::string_view as_string() const { return {reinterpret_cast<const char*>(data()), size_}; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

inline ByteView as_bytes(std::string_view text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

}  // namespace zfeed
