// Staging: a whole Zarr hierarchy copied from a remote (or shared) store to a node-local
// directory, so that training reads local files (mapped, at the decompressor's speed) instead of
// the network. Resumable and shared by the processes of a node: an interrupted copy goes on where
// it stopped (values are written whole by temporary file and rename, so a value present is a
// value complete), and the processes that stage the same destination at once wait for the one
// that copies (a lock file), then find the copy complete. A copy may hold part of the time axis
// only (one node's share of the samples: loader/loader.h's `nodes`): its record says which, and
// opened by path it refuses the chunks it does not hold (store/staged_copy.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zfeed/store/staged_copy.h"
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
  // Only time steps [first, second) of the arrays whose first dimension is named `time_dim`
  // (those of rank 2 or more: 1-D coordinates are small and copied whole): the chunks (shards)
  // that hold any of those steps. Everything else in the hierarchy is copied whole.
  std::optional<std::pair<uint64_t, uint64_t>> time_range;
  std::string time_dim = "time";
  // Asked now and then (between values, and while another process of the node holds the copy):
  // where it returns true, the copy stops early and stage() returns with `stopped` set, leaving
  // the values in place for a later run to go on from.
  std::function<bool()> stop;
  // The pool (threads == 0) is shared with other work that must not wait for the whole copy (a
  // loader's reads, beside its copy in the background): the values are copied in rounds of one
  // for each of half the pool's threads, so that the other half take work queued meanwhile.
  bool share_pool = false;
  // Called with each value's key once it is in place: found present (of the source's listed
  // size) or copied; not for values the source lacks. From the copying threads.
  std::function<void(std::string_view key)> on_staged;
  // The group the copy is made for (a loader's, below the store's root): its metadata must be in
  // the source. The store's whole hierarchy is copied all the same.
  std::string node;
};

struct StageResult {
  uint64_t keys = 0;     // in the hierarchy
  uint64_t copied = 0;   // this run
  uint64_t present = 0;  // already in the destination (an earlier, interrupted run)
  uint64_t missing = 0;  // chunk keys of the grid the source does not hold (the fill value)
  uint64_t bytes_copied = 0;
  double seconds = 0;
  bool already_complete = false;  // an earlier run (or another process) had finished it
  bool stopped = false;           // StageOptions::stop ended it early: the copy is unfinished
  // What the copy holds of the time axis, where it holds part of it (nullopt: everything).
  std::optional<StagedTimeRange> partial;
};

// Copies the Zarr hierarchy (a group and everything under it, or one array) at the root of
// `source` into the local directory `destination`, created if absent. A destination already
// holding a complete copy of the whole source serves any time range; one holding another time
// range of it is refused.
StageResult stage(std::shared_ptr<Store> source, const std::string& destination,
                  const StageOptions& options = {});

// Whether `destination` holds a complete copy that stage() would take as it is (without the
// lock: a copy is complete once its record says so); false where it holds nothing yet or an
// unfinished copy of the source; throws where stage() would refuse the destination.
bool stage_is_complete(const std::shared_ptr<Store>& source, const std::string& destination,
                       const StageOptions& options = {});

// A progress line on stderr ("LABEL: 120/4000 keys, 310.2 MiB copied, 95.1 MB/s"): on a terminal
// redrawn in place at each call, elsewhere (a job's log file) or `beside_other_output` (a copy in
// the background of training that prints too) one line every 10 seconds; the last line once,
// when the copy is done. Silent where nothing was copied (the copy was there already, or another
// process of the node made it).
std::function<void(const StageProgress&)> stage_progress_printer(std::string label,
                                                                 bool beside_other_output = false);

// Every key of the hierarchy at the root of `store`: listed where the store can list; else from
// its metadata (a group's members from its consolidated metadata, an array's chunk keys from its
// grid, which may name keys the store does not hold). Sorted.
std::vector<std::string> hierarchy_keys(const std::shared_ptr<Store>& store);

}  // namespace zfeed::zarr
