// For tests: a store that forwards to another and lets a test watch, slow down or fail its reads.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zfeed/store/store.h"

namespace zfeed::testing {

// Every read (get, and the reads the Store defaults build on it) calls `on_read` with the key and
// the byte range first, from whatever thread reads; `reads` counts them. Set on_read before
// sharing the store.
class WatchedStore final : public Store {
 public:
  explicit WatchedStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  std::optional<Bytes> get(std::string_view key, ByteRange range) const override {
    ++reads;
    if (on_read) on_read(key, range);
    return inner_->get(key, range);
  }
  std::optional<uint64_t> size(std::string_view key) const override { return inner_->size(key); }
  void set(std::string_view key, ByteView value) override { inner_->set(key, value); }
  void erase(std::string_view key) override { inner_->erase(key); }
  std::vector<std::string> list(std::string_view prefix) const override {
    return inner_->list(prefix);
  }
  std::vector<std::pair<std::string, uint64_t>> list_sizes(std::string_view prefix) const override {
    return inner_->list_sizes(prefix);
  }
  std::string url() const override { return inner_->url(); }

  std::function<void(std::string_view key, const ByteRange& range)> on_read;
  mutable std::atomic<uint64_t> reads{0};

 private:
  std::shared_ptr<Store> inner_;
};

}  // namespace zfeed::testing
