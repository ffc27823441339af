#include "zfeed/zarr/stage.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>

#include "zfeed/util/error.h"
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

// Every grid index of an array, its chunk (or shard) keys.
void add_chunk_keys(const Array& array, std::set<std::string>& keys) {
  const std::vector<uint64_t> grid = array.metadata().grid_shape();
  for (uint64_t extent : grid) {
    if (extent == 0) return;
  }
  std::vector<uint64_t> index(grid.size(), 0);
  for (;;) {
    keys.insert(array.chunk_key(index));
    size_t d = grid.size();
    while (d > 0 && ++index[d - 1] == grid[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

// A node's metadata keys and everything under it. Members are opened through their parent, which
// hands them its consolidated metadata (a store that cannot list has no other way to find them).
void add_node_keys(const std::shared_ptr<Store>& store, const Node& node, const std::string& path,
                   std::set<std::string>& keys) {
  for (const char* name : kMetadataNames) {
    const std::string key = join(path, name);
    if (store->size(key)) keys.insert(key);
  }
  if (const Array* array = std::get_if<Array>(&node)) {
    add_chunk_keys(*array, keys);
    return;
  }
  const Group& group = std::get<Group>(node);
  for (const std::string& member : group.members()) {
    add_node_keys(store, group.open_member(member), join(path, member), keys);
  }
}

// An exclusive lock on `path`, held until destruction (released by the kernel if the process
// dies, so a killed stager never blocks the next).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(path + ": cannot open the staging lock: " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        throw Error(path + ": cannot take the staging lock: " + std::strerror(errno));
      }
    }
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

std::optional<Json> read_record(const Store& destination) {
  const auto bytes = destination.get(kStageRecord);
  if (!bytes) return std::nullopt;
  try {
    Json record = parse_json(bytes->as_string(), "staging record");
    if (record.is_object()) return record;
  } catch (const Error&) {
  }
  return std::nullopt;  // unreadable: copy again
}

}  // namespace

namespace {

// The hierarchy's keys, each with its size where the store's listing gives it (listed once).
std::vector<std::pair<std::string, std::optional<uint64_t>>> hierarchy_entries(
    const std::shared_ptr<Store>& store) {
  std::vector<std::pair<std::string, std::optional<uint64_t>>> entries;
  if (store->can_list()) {
    for (auto& [key, size] : store->list_sizes("")) {
      // A staged copy staged again: its own record and lock are not the hierarchy's.
      if (key != kStageRecord && key != kStageLock) entries.emplace_back(std::move(key), size);
    }
    return entries;
  }
  std::set<std::string> keys;
  add_node_keys(store, open_node(store, ""), "", keys);
  for (const std::string& key : keys) entries.emplace_back(key, std::nullopt);
  return entries;
}

}  // namespace

std::vector<std::string> hierarchy_keys(const std::shared_ptr<Store>& store) {
  if (store->can_list()) {
    std::vector<std::string> keys = store->list("");
    std::erase_if(keys,
                  [](const std::string& key) { return key == kStageRecord || key == kStageLock; });
    return keys;
  }
  std::vector<std::string> keys;
  for (auto& [key, size] : hierarchy_entries(store)) keys.push_back(std::move(key));
  return keys;
}

StageResult stage(std::shared_ptr<Store> source, const std::string& destination_path,
                  const StageOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (destination_path.find("://") != std::string::npos) {
    throw UnsupportedError("stage: the destination \"" + destination_path +
                           "\" is not a local directory path");
  }
  FileStoreOptions store_options;
  store_options.create = true;
  std::shared_ptr<Store> destination = make_file_store(destination_path, store_options);
  const std::string where = "stage " + source->url() + " -> " + destination->url();

  // One process of the node copies; the others wait here, then find the record.
  FileLock lock((fs::path(destination_path) / kStageLock).string());
  StageResult result;
  if (const auto record = read_record(*destination)) {
    if (record->value("source", "") != source->url()) {
      throw Error(where + ": the destination holds a copy of " + record->value("source", "?") +
                  "; give another destination, or remove it");
    }
    if (record->value("complete", false)) {
      result.keys = record->value("keys", uint64_t{0});
      result.present = result.keys;
      result.already_complete = true;
      result.seconds = elapsed();
      if (options.progress) {
        options.progress({result.keys, result.keys, 0, result.seconds});
      }
      return result;
    }
  }
  if (!destination->get(kStageRecord)) {
    // Files that no staging of ours left: refuse to mix them with a copy.
    for (const std::string& key : destination->list("")) {
      if (key != kStageLock) {
        throw Error(where + ": the destination holds files (" + key +
                    ") and no staging record; give an empty or new directory");
      }
    }
  }
  // The record names the source before the first value lands, so that a resumed run knows
  // the values present are this source's.
  destination->set(kStageRecord,
                   as_bytes(Json{{"source", source->url()}, {"complete", false}}.dump(2)));

  const auto entries = hierarchy_entries(source);
  result.keys = entries.size();

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
  pool.parallel_for(entries.size(), [&](size_t i) {
    const auto& [key, listed_size] = entries[i];
    const auto have = destination->size(key);
    // A value present is complete (written whole); one of another listed size is copied again.
    if (have && (!listed_size || *listed_size == *have)) {
      ++present;
    } else if (auto value = source->get(key)) {
      destination->set(key, *value);  // whole, by temporary file and rename
      ++copied;
      bytes += value->size();
    } else {
      ++missing;
    }
    ++done;
    report(false);
  });
  result.copied = copied;
  result.present = present;
  result.missing = missing;
  result.bytes_copied = bytes;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  // Written last: a copy is complete only once every value is in place.
  destination->set(kStageRecord, as_bytes(Json{
                                     {"source", source->url()},
                                     {"complete", true},
                                     {"keys", result.keys},
                                     {"missing", result.missing},
                                     {"finished",
                                      date}}.dump(2)));
  result.seconds = elapsed();
  report(true);
  return result;
}

}  // namespace zfeed::zarr
