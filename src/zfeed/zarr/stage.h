// Staging: a whole Zarr hierarchy copied from a remote (or shared) store to a node-local
// directory, so that training reads local files (mapped, at the decompressor's speed) instead of
// the network. Resumable and shared by the processes of a node: an interrupted copy goes on where
// it stopped (values are written whole by temporary file and rename, so a value present is a
// value complete), and the processes that stage the same destination at once wait for the one
// that copies (a lock file), then find the copy complete.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zfeed/store/store.h"

namespace zfeed::zarr {

struct StageProgress {
  uint64_t keys_done = 0, keys_total = 0;
  uint64_t bytes_copied = 0;  // this run
  double seconds = 0;
};

struct StageOptions {
  // Reads in flight: 0 for the source's own (ZFEED_IO_THREADS for a remote store, one per core
  // for a local one).
  size_t threads = 0;
  // Called now and then (at most every half second, and once at the end), one call at a time.
  std::function<void(const StageProgress&)> progress;
};

struct StageResult {
  uint64_t keys = 0;     // in the hierarchy
  uint64_t copied = 0;   // this run
  uint64_t present = 0;  // already in the destination (an earlier, interrupted run)
  uint64_t missing = 0;  // chunk keys of the grid the source does not hold (the fill value)
  uint64_t bytes_copied = 0;
  double seconds = 0;
  bool already_complete = false;  // an earlier run (or another process) had finished it
};

// The name of the record a finished copy leaves in the destination (a dot name: Zarr readers
// skip it).
inline constexpr const char* kStageRecord = ".zfeed-stage.json";

// Copies the Zarr hierarchy (a group and everything under it, or one array) at the root of
// `source` into the local directory `destination`, created if absent.
StageResult stage(std::shared_ptr<Store> source, const std::string& destination,
                  const StageOptions& options = {});

// Every key of the hierarchy at the root of `store`: listed where the store can list; else from
// its metadata (a group's members from its consolidated metadata, an array's chunk keys from its
// grid, which may name keys the store does not hold). Sorted.
std::vector<std::string> hierarchy_keys(const std::shared_ptr<Store>& store);

}  // namespace zfeed::zarr
