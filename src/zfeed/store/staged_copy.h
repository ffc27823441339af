// A node-local staged copy (zarr/stage.h writes one) as a store: the directory's record
// (.zfeed-stage.json) says what the copy holds, and reading past it is an error, never the fill
// value. A copy of part of the time axis (the time chunks of one node's share of the samples)
// holds only those chunks of its arrays along time; a chunk it does not hold reads as an error
// naming the key and the time steps the copy holds, where a plain directory would answer
// "missing" and a reader would see the fill value (silent garbage). A copy still being made (or
// interrupted) cannot be opened at all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "zfeed/store/store.h"
#include "zfeed/util/json.h"

namespace zfeed {

// The name of the record a staged copy keeps at its root (a dot name: Zarr readers skip it).
inline constexpr const char* kStageRecord = ".zfeed-stage.json";

// The chunks of one array a partial copy holds along its first (time) dimension: the chunk keys
// under `path` whose first grid index is in [first_chunk, stop_chunk). Keys are the array's
// chunk keys as its key encoding writes them: "<path>/c/<t>/..." (default encoding) or
// "<path>/<t>.<...>" (v2), with `separator` between the indices.
struct StagedTimeChunks {
  std::string path;          // the array's path in the hierarchy ("" for a root array)
  std::string chunk_prefix;  // "c/" or "c." (default encoding), "" (v2)
  char separator = '/';
  uint64_t time_chunk = 1;  // time steps per chunk (shard) along the first dimension
  uint64_t first_chunk = 0, stop_chunk = 0;

  // The first grid index of `key` where it is one of this array's chunk keys, else nullopt.
  std::optional<uint64_t> time_chunk_of(std::string_view key) const;
  // Whether `key` is one of this array's chunk keys outside the chunks held.
  bool excludes(std::string_view key) const;

  Json to_json() const;
  static StagedTimeChunks from_json(const Json& json);  // throws on a malformed entry
};

// What a partial copy holds: time steps [start, stop) of the dimension `time_dim`, as the time
// chunks of each array whose first dimension it is.
struct StagedTimeRange {
  std::string time_dim;
  uint64_t start = 0, stop = 0;
  std::vector<StagedTimeChunks> arrays;

  // The array entry whose chunks exclude `key`, else null.
  const StagedTimeChunks* excluding(std::string_view key) const;

  Json to_json() const;
  static StagedTimeRange from_json(const Json& json);  // throws on a malformed record
};

// The staging record at the root of `store`, where there is one and it is a JSON object.
std::optional<Json> read_stage_record(const Store& store);

// What a complete staged copy at the root of `store` (or that `store` was opened inside, by
// open_staged_copy) holds of the time axis: nullopt for a whole copy, or for a store that is no
// staged copy.
std::optional<StagedTimeRange> staged_time_range(const Store& store);

// Wraps `directory` (a filesystem store) where it is a staged copy, or part of one (its path
// `root`, where given, lies under a directory with a staging record: one array of the copy): a
// store that reads the copy and refuses the chunks a partial copy does not hold; throws where
// the copy is incomplete (being made, or interrupted). Returns `directory` itself where it is no
// part of a staged copy.
std::shared_ptr<Store> open_staged_copy(std::shared_ptr<Store> directory,
                                        const std::string& root = "");

// The values of a copy being made that this run has checked against the source (present, of
// the listed size) or copied: the only ones a read-through store reads from the copy, since a
// value an earlier, interrupted copy left there may be of an older source (one appended to
// since). Thread-safe; taken only by threads that hold a fork pass (the pool's), so a forked
// child finds it free and reads the rest from the source.
class StagedKeys {
 public:
  void add(std::string_view key);
  bool contains(std::string_view key) const;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view key) const { return std::hash<std::string_view>{}(key); }
  };
  mutable std::shared_mutex mutex_;
  std::unordered_set<std::string, Hash, std::equal_to<>> keys_;
};

// A copy being made while it is read (a loader staging in the background): each value from
// `directory` (a filesystem store) where `staged` holds its key, else from `source`. A value in
// `staged` is complete (staging writes values whole, by temporary file and rename) and the
// source's, so a read sees the source's value either way, from local disk as soon as the copy
// holds it. Read-only; lists through the source, and names itself as the source.
std::shared_ptr<Store> make_read_through_store(std::shared_ptr<Store> source,
                                               std::shared_ptr<Store> directory,
                                               std::shared_ptr<const StagedKeys> staged);

}  // namespace zfeed
