// The loader's decoded-chunk cache: whole read chunks (inner chunks of shards) decoded once and
// kept, least recently used first out, within a byte budget. With chunks of several time steps
// and the chunk-aware sample order, each chunk is then decoded once per epoch instead of once per
// sample that touches it. Entries are shared: a batch keeps the chunks it scatters from alive even
// if the cache evicts them meanwhile (so memory is the budget plus one batch's chunks at most).
// Used by the loader's planning thread only; not synchronized.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zfeed/util/bytes.h"

namespace zfeed::loader {

struct ChunkKey {
  uint32_t array = 0;
  std::vector<uint64_t> chunk;  // the chunk's grid index
  bool operator==(const ChunkKey& other) const = default;
};

struct ChunkKeyHash {
  size_t operator()(const ChunkKey& key) const;
};

class ChunkCache {
 public:
  explicit ChunkCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

  // The chunk, marked most recently used, or nullptr (counted as a hit or a miss).
  std::shared_ptr<Bytes> find(const ChunkKey& key);
  // Adds (or replaces) a decoded chunk, then evicts the least recently used entries until the
  // cache holds at most the budget. A chunk larger than the whole budget is not kept.
  void insert(const ChunkKey& key, std::shared_ptr<Bytes> chunk);
  // Whether the chunk is held, without marking or counting it.
  bool contains(const ChunkKey& key) const { return index_.count(key) > 0; }
  void clear();
  // The entries evicted (or refused) since the last call, for the caller to recycle their memory
  // once nobody else holds them.
  std::vector<std::shared_ptr<Bytes>> take_evicted() { return std::exchange(evicted_, {}); }

  uint64_t budget() const { return budget_; }
  uint64_t bytes() const { return bytes_; }
  size_t entries() const { return index_.size(); }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    ChunkKey key;
    std::shared_ptr<Bytes> chunk;
  };
  void evict_to(uint64_t limit);

  uint64_t budget_;
  uint64_t bytes_ = 0, hits_ = 0, misses_ = 0, evictions_ = 0;
  std::list<Entry> order_;  // most recently used first
  std::vector<std::shared_ptr<Bytes>> evicted_;
  std::unordered_map<ChunkKey, std::list<Entry>::iterator, ChunkKeyHash> index_;
};

}  // namespace zfeed::loader
