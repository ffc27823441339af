#include "zfeed/zarr/stage.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "zfeed/util/error.h"
#include "zfeed/util/fork_gate.h"
#include "zfeed/util/json.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/group.h"

namespace zfeed::zarr {
namespace {

namespace fs = std::filesystem;

const std::string kStageLock = ".zfeed-stage.lock";
const char* const kMetadataNames[] = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"};

std::string join(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "/" + name;
}

// The grid indices of an array, its chunk (or shard) keys: every one, or where `held` is given
// those of its time chunks [first_chunk, stop_chunk).
void add_chunk_keys(const Array& array, const StagedTimeChunks* held, std::set<std::string>& keys) {
  const std::vector<uint64_t> grid = array.metadata().grid_shape();
  for (uint64_t extent : grid) {
    if (extent == 0) return;
  }
  std::vector<uint64_t> index(grid.size(), 0);
  uint64_t first = 0, stop = grid.empty() ? 1 : grid[0];
  if (held) {
    first = std::min(held->first_chunk, stop);
    stop = std::min(held->stop_chunk, stop);
    if (first == stop) return;
    index[0] = first;
  }
  for (;;) {
    keys.insert(array.chunk_key(index));
    size_t d = grid.size();
    while (d > 0) {  // the next index, the last dimension fastest
      const size_t k = d - 1;
      if (++index[k] < (k == 0 ? stop : grid[k])) break;
      index[k] = k == 0 ? first : 0;
      --d;
    }
    if (d == 0) return;
  }
}

const StagedTimeChunks* held_chunks(const StagedTimeRange* partial, const std::string& path) {
  if (!partial) return nullptr;
  for (const StagedTimeChunks& entry : partial->arrays) {
    if (entry.path == path) return &entry;
  }
  return nullptr;
}

// Keys of the hierarchy, with their sizes where a listing gave them.
using Entries = std::map<std::string, std::optional<uint64_t>>;

bool is_staging_file(const std::string& key) { return key == kStageRecord || key == kStageLock; }

// A node's metadata keys and everything under it, walked from the metadata (members are opened
// through their parent, which hands them its consolidated metadata: a store that cannot list has
// no other way to find them). Of the arrays `partial` names, the chunks it holds, from the grid,
// and their metadata without asking the store (an array found along time has dimension names,
// which a v2 array keeps in .zattrs): a partial copy of a cloud store of millions of chunks asks
// for the chunks it copies, not for a listing of all of them. Other arrays of a store that can
// list are listed (they are small: coordinates, static fields), else taken from their grid.
void add_node_entries(const std::shared_ptr<Store>& store, const Node& node,
                      const std::string& path, const StagedTimeRange* partial, Entries& entries) {
  const Array* array = std::get_if<Array>(&node);
  const StagedTimeChunks* held = array ? held_chunks(partial, path) : nullptr;
  if (held) {
    const std::vector<std::string> metadata_names =
        array->metadata().zarr_format == 2 ? std::vector<std::string>{".zarray", ".zattrs"}
                                           : std::vector<std::string>{"zarr.json"};
    for (const std::string& name : metadata_names) entries.emplace(join(path, name), std::nullopt);
    std::set<std::string> keys;
    add_chunk_keys(*array, held, keys);
    for (const std::string& key : keys) entries.emplace(key, std::nullopt);
    return;
  }
  if (array && store->can_list()) {
    for (auto& [key, size] : store->list_sizes(path.empty() ? "" : path + "/")) {
      if (!is_staging_file(key)) entries[key] = size;
    }
    return;
  }
  // The node's own format's documents only: a store that answers an absent key with 403 (a
  // bucket readable but not listable) must not be asked for the other format's.
  const int format = array ? array->metadata().zarr_format : std::get<Group>(node).zarr_format();
  for (const char* name : kMetadataNames) {
    const bool v3_name = std::string_view(name) == "zarr.json";
    if (v3_name != (format == 3)) continue;
    const std::string key = join(path, name);
    if (const auto size = store->size(key)) entries[key] = *size;
  }
  if (array) {
    std::set<std::string> keys;
    add_chunk_keys(*array, nullptr, keys);
    for (const std::string& key : keys) entries.emplace(key, std::nullopt);
    return;
  }
  const Group& group = std::get<Group>(node);
  for (const std::string& member : group.members()) {
    add_node_entries(store, group.open_member(member), join(path, member), partial, entries);
  }
}

// Calls `visit(array, path)` for each array of the hierarchy under `node`.
void for_each_array(const Node& node, const std::string& path,
                    const std::function<void(const Array&, const std::string&)>& visit) {
  if (const Array* array = std::get_if<Array>(&node)) {
    visit(*array, path);
    return;
  }
  const Group& group = std::get<Group>(node);
  for (const std::string& member : group.members()) {
    for_each_array(group.open_member(member), join(path, member), visit);
  }
}

std::string range_text(uint64_t start, uint64_t stop) {
  return "[" + std::to_string(start) + ", " + std::to_string(stop) + ")";
}

// What a copy of time steps options.time_range holds: the time chunks of each array whose first
// dimension is options.time_dim.
StagedTimeRange plan_time_range(const std::shared_ptr<Store>& source, const StageOptions& options,
                                const std::string& where) {
  // Plain variables, not a structured binding: the lambda below captures them.
  const uint64_t start = options.time_range->first, stop = options.time_range->second;
  if (start >= stop) {
    throw Error(where + ": the time range " + range_text(start, stop) + " holds no step");
  }
  StagedTimeRange range{options.time_dim, start, stop, {}};
  std::set<std::string> first_dims;
  for_each_array(open_node(source, ""), "", [&](const Array& array, const std::string& path) {
    const ArrayMetadata& meta = array.metadata();
    const std::optional<std::string> first =
        meta.rank() > 0 && meta.dimension_names ? (*meta.dimension_names)[0] : std::nullopt;
    if (meta.rank() >= 2) first_dims.insert(first ? "\"" + *first + "\"" : "unnamed");
    if (meta.rank() < 2 || first != options.time_dim) return;
    if (stop > meta.shape[0]) {
      throw Error(where + ": the time range " + range_text(start, stop) + " passes the end of " +
                  (path.empty() ? "the array" : path) + ", which has " +
                  std::to_string(meta.shape[0]) + " " + options.time_dim + " steps");
    }
    StagedTimeChunks entry;
    entry.path = path;
    const bool v2_keys = meta.key_encoding.kind == ChunkKeyEncoding::Kind::kV2;
    entry.separator = meta.key_encoding.separator;
    entry.chunk_prefix = v2_keys ? "" : std::string("c") + entry.separator;
    entry.time_chunk = meta.chunk_shape[0];
    entry.first_chunk = start / entry.time_chunk;
    entry.stop_chunk = (stop + entry.time_chunk - 1) / entry.time_chunk;
    range.arrays.push_back(std::move(entry));
  });
  if (range.arrays.empty()) {
    std::string seen;
    for (const std::string& name : first_dims) seen += (seen.empty() ? "" : ", ") + name;
    throw Error(where + ": no array of 2 or more dimensions has a first dimension named \"" +
                options.time_dim + "\"" +
                (seen.empty() ? std::string(" (there is none)")
                              : " (their first dimensions: " + seen + ")") +
                ": name the time dimension (--time-dim)");
  }
  return range;
}

// The descriptors of the staging locks this process holds. A flock belongs to the open file,
// which a forked child shares: the child closes its copies at once, so that the lock goes when
// the parent lets it go, not when the last child (a DataLoader worker) exits.
class LockDescriptors {
 public:
  static LockDescriptors& get() {
    static LockDescriptors* made = [] {
      auto* descriptors = new LockDescriptors;  // never destroyed: fork handlers use it
      ForkGate::add_fork_handlers([descriptors] { descriptors->mutex_.lock(); },
                                  [descriptors] { descriptors->mutex_.unlock(); },
                                  [descriptors] {
                                    for (int fd : descriptors->fds_) ::close(fd);
                                    descriptors->fds_.clear();
                                    descriptors->mutex_.unlock();
                                  });
      return descriptors;
    }();
    return *made;
  }
  // Opens `path` (O_CLOEXEC: an exec'd program gets none either) and keeps the descriptor.
  int open(const std::string& path) {
    std::lock_guard lock(mutex_);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) fds_.insert(fd);
    return fd;
  }
  // Closes `fd` unless a fork's child already did (in the child, where the lock is not its).
  void close(int fd) {
    std::lock_guard lock(mutex_);
    if (fds_.erase(fd)) ::close(fd);
  }

 private:
  std::mutex mutex_;
  std::set<int> fds_;
};

// An exclusive lock on `path`, held until destruction (released by the kernel if the process
// dies, so a killed stager never blocks the next). While another process holds it, waits, asking
// `stop` (where given) now and then whether to give up (held() is false then).
class FileLock {
 public:
  FileLock(const std::string& path, const std::function<bool()>& stop) {
    fd_ = LockDescriptors::get().open(path);
    if (fd_ < 0) throw Error(path + ": cannot open the staging lock: " + std::strerror(errno));
    for (;;) {
      if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
        held_ = true;
        return;
      }
      if (errno == EWOULDBLOCK) {
        if (stop && stop()) return;
        ForkGate::Release waiting;  // for another process: a fork need not wait for that
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      } else if (errno != EINTR) {
        const int error = errno;
        LockDescriptors::get().close(fd_);
        throw Error(path + ": cannot take the staging lock: " + std::strerror(error));
      }
    }
  }
  ~FileLock() { LockDescriptors::get().close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool held() const { return held_; }

 private:
  int fd_ = -1;
  bool held_ = false;
};

}  // namespace

namespace {

// The hierarchy's keys, each with its size where the store's listing gives it (listed once):
// the whole listing of a store that can list, unless the copy is partial (add_node_entries).
std::vector<std::pair<std::string, std::optional<uint64_t>>> hierarchy_entries(
    const std::shared_ptr<Store>& store, const StagedTimeRange* partial = nullptr) {
  std::vector<std::pair<std::string, std::optional<uint64_t>>> entries;
  if (store->can_list() && !partial) {
    for (auto& [key, size] : store->list_sizes("")) {
      // A staged copy staged again: its own record and lock are not the hierarchy's.
      if (!is_staging_file(key)) entries.emplace_back(std::move(key), size);
    }
    return entries;
  }
  Entries walked;
  add_node_entries(store, open_node(store, ""), "", partial, walked);
  for (auto& [key, size] : walked) entries.emplace_back(key, size);
  return entries;
}

}  // namespace

std::vector<std::string> hierarchy_keys(const std::shared_ptr<Store>& store) {
  if (store->can_list()) {
    std::vector<std::string> keys = store->list("");
    std::erase_if(keys, is_staging_file);
    return keys;
  }
  std::vector<std::string> keys;
  for (auto& [key, size] : hierarchy_entries(store)) keys.push_back(std::move(key));
  return keys;
}

namespace {

// What a staging of `source` asks for: `options`, where the source is a partial staged copy its
// steps by default, never others (it lacks them).
StageOptions wanted_options(const Store& source, const StageOptions& options,
                            const std::string& where) {
  StageOptions wanted = options;
  if (const auto holds = staged_time_range(source)) {
    if (!wanted.time_range) {
      wanted.time_range = {holds->start, holds->stop};
      wanted.time_dim = holds->time_dim;
    } else if (wanted.time_dim != holds->time_dim || wanted.time_range->first < holds->start ||
               wanted.time_range->second > holds->stop) {
      throw Error(where + ": the source is a partial staged copy holding " + holds->time_dim +
                  " steps " + range_text(holds->start, holds->stop) + " only, not " +
                  wanted.time_dim + " steps " +
                  range_text(wanted.time_range->first, wanted.time_range->second));
    }
  }
  return wanted;
}

// Checks what `destination` holds against what is asked (`wanted`): true where it holds a
// complete copy that serves it (`result` says what), false where the copy is to be made or
// finished; throws where the destination holds something else.
bool check_destination(const Store& source, const Store& destination, const StageOptions& wanted,
                       const std::string& where, StageResult& result) {
  const auto& requested = wanted.time_range;
  const auto record = read_stage_record(destination);
  if (!record) {
    // Files that no staging of ours left: refuse to mix them with a copy.
    for (const std::string& key : destination.list("")) {
      if (key != kStageLock) {
        throw Error(where + ": the destination holds files (" + key +
                    ") and no staging record; give an empty or new directory");
      }
    }
    return false;
  }
  if (record->value("source", "") != source.url()) {
    throw Error(where + ": the destination holds a copy of " + record->value("source", "?") +
                "; give another destination, or remove it");
  }
  if (!record->value("complete", false)) return false;
  // A whole copy serves any time range; a partial one only its own.
  if (record->contains("partial")) {
    StagedTimeRange held = *staged_time_range(destination);
    const std::string holds = "the destination holds " + held.time_dim + " steps " +
                              range_text(held.start, held.stop) + " of the source only";
    if (!requested) {
      throw Error(where + ": " + holds + "; stage the whole source to another destination");
    }
    if (requested->first != held.start || requested->second != held.stop ||
        wanted.time_dim != held.time_dim) {
      throw Error(where + ": " + holds + ", not " + wanted.time_dim + " steps " +
                  range_text(requested->first, requested->second) +
                  "; give another destination for that range");
    }
    result.partial = std::move(held);
  }
  result.keys = record->value("keys", uint64_t{0});
  result.present = result.keys;
  result.already_complete = true;
  return true;
}

std::string stage_where(const Store& source, const Store& destination) {
  return "stage " + source.url() + " -> " + destination.url();
}

void check_local_destination(const std::string& destination_path) {
  if (destination_path.find("://") != std::string::npos) {
    throw UnsupportedError("stage: the destination \"" + destination_path +
                           "\" is not a local directory path");
  }
}

// A copy is of a whole Zarr hierarchy: a source without metadata at its root is refused (a
// mistyped path or prefix would otherwise stage as a complete copy of nothing, and a prefix
// holding several stores would be copied whole for the one a loader reads, StageOptions::node).
void require_metadata(const Store& source, const std::string& node) {
  auto has_metadata = [&](const std::string& path) {
    for (const char* name : {"zarr.json", ".zgroup", ".zarray"}) {
      if (source.size(join_key(path, name))) return true;
    }
    return false;
  };
  if (has_metadata("")) return;
  if (!node.empty() && has_metadata(node)) {
    throw Error(source.url() +
                ": no Zarr metadata at the store's root, so staging it would copy "
                "everything below it for " +
                node + ": open " + source.url() + "/" + node +
                " itself (the group's own URL or path, not path=\"" + node + "\")");
  }
  throw NotFoundError(source.url() + (node.empty() ? "" : "/" + node) +
                      ": no Zarr store there to stage (no zarr.json, .zgroup or .zarray)");
}

// A copy into its own source, or around it, would write into what it reads: refused before
// anything (the lock file first) is made there.
void check_apart(const Store& source, const std::string& destination_path) {
  const auto marker = source.local_path("zarr.json");  // a path in the root, held or not
  if (!marker) return;
  std::error_code ec;
  const fs::path from = fs::weakly_canonical(fs::path(*marker).parent_path(), ec);
  const fs::path to = fs::weakly_canonical(destination_path, ec);
  auto within = [](const fs::path& outer, const fs::path& inner) {
    return std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end()).first ==
           outer.end();
  };
  if (within(from, to) || within(to, from)) {
    throw Error("stage " + source.url() + " -> " + destination_path +
                ": the destination is, holds or lies inside the source; stage to another "
                "directory");
  }
}

}  // namespace

std::function<void(const StageProgress&)> stage_progress_printer(std::string label,
                                                                 bool beside_other_output) {
  struct State {
    bool printed = false, finished = false;
    double last_line = -1;
  };
  auto state = std::make_shared<State>();
  const bool in_place = !beside_other_output && ::isatty(STDERR_FILENO) == 1;
  return [label = std::move(label), state, in_place](const StageProgress& p) {
    const bool done = p.keys_done == p.keys_total;
    if (state->finished) return;  // the last line is out (stage() reports the end twice)
    if (done && !state->printed && p.bytes_copied == 0) return;  // nothing copied here
    if (!in_place && !done && state->last_line >= 0 && p.seconds - state->last_line < 10) return;
    state->printed = true;
    state->finished = done;
    state->last_line = p.seconds;
    const double rate = p.seconds > 0 ? double(p.bytes_copied) / p.seconds / 1e6 : 0.0;
    std::fprintf(stderr, "%s%s: %llu/%llu keys, %.1f MiB copied, %.1f MB/s%s", in_place ? "\r" : "",
                 label.c_str(), static_cast<unsigned long long>(p.keys_done),
                 static_cast<unsigned long long>(p.keys_total), double(p.bytes_copied) / 1048576.0,
                 rate, done || !in_place ? "\n" : "   ");
    std::fflush(stderr);
  };
}

bool stage_is_complete(const std::shared_ptr<Store>& source, const std::string& destination_path,
                       const StageOptions& options) {
  check_local_destination(destination_path);
  std::error_code error;
  if (!fs::is_directory(destination_path, error)) return false;
  const std::shared_ptr<Store> destination = make_file_store(destination_path);
  const std::string where = stage_where(*source, *destination);
  StageResult result;
  return check_destination(*source, *destination, wanted_options(*source, options, where), where,
                           result);
}

StageResult stage(std::shared_ptr<Store> source, const std::string& destination_path,
                  const StageOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  check_local_destination(destination_path);
  require_metadata(*source, options.node);
  check_apart(*source, destination_path);
  FileStoreOptions store_options;
  store_options.create = true;
  std::shared_ptr<Store> destination = make_file_store(destination_path, store_options);
  const std::string where = stage_where(*source, *destination);

  // One process of the node copies; the others wait here, then find the record.
  StageResult result;
  FileLock lock((fs::path(destination_path) / kStageLock).string(), options.stop);
  if (!lock.held()) {
    result.stopped = true;
    result.seconds = elapsed();
    return result;
  }
  const StageOptions wanted = wanted_options(*source, options, where);
  const auto requested = wanted.time_range;
  if (check_destination(*source, *destination, wanted, where, result)) {
    result.seconds = elapsed();
    if (options.progress) options.progress({result.keys, result.keys, 0, result.seconds});
    return result;
  }
  if (requested) result.partial = plan_time_range(source, wanted, where);
  // The record names the source before the first value lands, so that a resumed run knows
  // the values present are this source's (and what was asked, for the hint to finish it).
  Json started{{"source", source->url()}, {"complete", false}};
  if (requested) {
    started["time_range"] = {requested->first, requested->second};
    started["time_dim"] = wanted.time_dim;
  }
  destination->set(kStageRecord, as_bytes(started.dump(2)));

  const auto entries = hierarchy_entries(source, result.partial ? &*result.partial : nullptr);
  result.keys = entries.size();
  if (options.stop && options.stop()) {
    result.stopped = true;
    result.seconds = elapsed();
    return result;
  }

  std::atomic<uint64_t> done{0}, copied{0}, present{0}, missing{0}, bytes{0};
  std::mutex progress_mutex;
  double last_report = -1;
  auto report = [&](bool final) {
    if (!options.progress) return;
    std::lock_guard guard(progress_mutex);
    const double now = elapsed();
    if (!final && now - last_report < 0.5) return;
    last_report = now;
    options.progress({done.load(), entries.size(), bytes.load(), now});
  };
  // --threads: a pool of that many; else the source's own concurrency.
  std::optional<ThreadPool> own_pool;
  ThreadPool& pool = options.threads == 0 ? ThreadPool::for_reads(source->read_concurrency())
                                          : own_pool.emplace(options.threads);
  std::atomic<bool> stopped{false};
  auto copy_entry = [&](size_t i) {
    if (stopped.load(std::memory_order_relaxed) || (options.stop && options.stop())) {
      stopped = true;
      return;
    }
    const auto& [key, listed_size] = entries[i];
    const auto have = destination->size(key);
    // A value present is complete (written whole); one of another listed size is copied again.
    if (have && (!listed_size || *listed_size == *have)) {
      ++present;
      if (options.on_staged) options.on_staged(key);
    } else if (auto value = source->get(key)) {
      destination->set(key, *value);  // whole, by temporary file and rename
      ++copied;
      bytes += value->size();
      if (options.on_staged) options.on_staged(key);
    } else {
      ++missing;
    }
    ++done;
    report(false);
  };
  // Shared with other work (a loader's reads): in rounds of a value for half the threads, so that
  // the other half take that work's tasks at once, not after a round's values.
  const size_t round = options.share_pool ? std::max<size_t>(1, pool.size() / 2) : entries.size();
  for (size_t first = 0; first < entries.size() && !stopped; first += round) {
    pool.parallel_for(std::min(round, entries.size() - first),
                      [&](size_t k) { copy_entry(first + k); });
  }
  result.copied = copied;
  result.present = present;
  result.missing = missing;
  result.bytes_copied = bytes;
  if (stopped) {  // left unfinished: a later run goes on from what is in place
    result.stopped = true;
    result.seconds = elapsed();
    return result;
  }
  // The values reach the disk before the record that calls them complete (also those a killed
  // run wrote and this one found): a node that loses power must not find a complete copy of
  // empty files.
  const int directory = ::open(destination_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory >= 0) {
    ::syncfs(directory);
    ::close(directory);
  }
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  // Written last: a copy is complete only once every value is in place.
  Json finished{{"source", source->url()},
                {"complete", true},
                {"keys", result.keys},
                {"missing", result.missing},
                {"finished", date}};
  if (result.partial) finished["partial"] = result.partial->to_json();
  destination->set(kStageRecord, as_bytes(finished.dump(2)));
  result.seconds = elapsed();
  report(true);
  return result;
}

}  // namespace zfeed::zarr
