#include "zfeed/loader/chunk_cache.h"

namespace zfeed::loader {

size_t ChunkKeyHash::operator()(const ChunkKey& key) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ key.array;
  for (uint64_t c : key.chunk) {
    h ^= c + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  }
  return static_cast<size_t>(h);
}

std::shared_ptr<Bytes> ChunkCache::find(const ChunkKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->chunk;
}

void ChunkCache::insert(const ChunkKey& key, std::shared_ptr<Bytes> chunk) {
  if (auto it = index_.find(key); it != index_.end()) {
    bytes_ -= it->second->chunk->size();
    evicted_.push_back(std::move(it->second->chunk));
    order_.erase(it->second);
    index_.erase(it);
  }
  if (!chunk) return;
  if (chunk->size() > budget_) {
    evicted_.push_back(std::move(chunk));
    return;
  }
  bytes_ += chunk->size();
  order_.push_front(Entry{key, std::move(chunk)});
  index_.emplace(key, order_.begin());
  evict_to(budget_);
}

void ChunkCache::evict_to(uint64_t limit) {
  while (bytes_ > limit && !order_.empty()) {
    Entry& last = order_.back();
    bytes_ -= last.chunk->size();
    evicted_.push_back(std::move(last.chunk));
    index_.erase(last.key);
    order_.pop_back();
    ++evictions_;
  }
}

void ChunkCache::clear() {
  for (auto& entry : order_) evicted_.push_back(std::move(entry.chunk));
  order_.clear();
  index_.clear();
  bytes_ = 0;
}

}  // namespace zfeed::loader
