#include <map>
#include <mutex>
#include <shared_mutex>

#include "zfeed/store/store.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

// Slices `value` by `range`, or throws naming `key` if the range reaches past its end.
Bytes slice(const Bytes& value, const ByteRange& range, std::string_view key) {
  auto [begin, length] = range.resolve(value.size(), "memory://" + std::string(key));
  return Bytes(value.data() + begin, length);
}

class MemoryStore final : public Store {
 public:
  std::optional<Bytes> get(std::string_view key, ByteRange range) const override {
    check_key(key);
    std::shared_lock lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return slice(it->second, range, key);
  }

  std::optional<uint64_t> size(std::string_view key) const override {
    check_key(key);
    std::shared_lock lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second.size();
  }

  void set(std::string_view key, ByteView value) override {
    check_key(key);
    Bytes copy(value);
    std::unique_lock lock(mutex_);
    values_.insert_or_assign(std::string(key), std::move(copy));
  }

  void erase(std::string_view key) override {
    check_key(key);
    std::unique_lock lock(mutex_);
    auto it = values_.find(key);
    if (it != values_.end()) values_.erase(it);
  }

  std::vector<std::string> list(std::string_view prefix) const override {
    std::shared_lock lock(mutex_);
    std::vector<std::string> keys;
    for (auto it = values_.lower_bound(prefix); it != values_.end(); ++it) {
      if (!it->first.starts_with(prefix)) break;
      keys.push_back(it->first);
    }
    return keys;
  }

  std::string url() const override { return "memory://"; }

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::string, Bytes, std::less<>> values_;
};

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

}  // namespace zfeed
