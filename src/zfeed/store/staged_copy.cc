#include "zfeed/store/staged_copy.h"

#include <charconv>
#include <filesystem>
#include <mutex>

#include "zfeed/util/error.h"
#include "zfeed/util/paths.h"

namespace zfeed {

std::optional<uint64_t> StagedTimeChunks::time_chunk_of(std::string_view key) const {
  if (!path.empty()) {
    if (!key.starts_with(path) || key.size() <= path.size() || key[path.size()] != '/') {
      return std::nullopt;
    }
    key.remove_prefix(path.size() + 1);
  }
  if (!key.starts_with(chunk_prefix)) return std::nullopt;
  key.remove_prefix(chunk_prefix.size());
  const size_t end = std::min(key.find(separator), key.size());
  if (end == 0) return std::nullopt;
  uint64_t index = 0;
  const auto [ptr, ec] = std::from_chars(key.data(), key.data() + end, index);
  if (ec != std::errc() || ptr != key.data() + end) return std::nullopt;
  return index;
}

bool StagedTimeChunks::excludes(std::string_view key) const {
  const auto index = time_chunk_of(key);
  return index && (*index < first_chunk || *index >= stop_chunk);
}

Json StagedTimeChunks::to_json() const {
  return Json{{"path", path},
              {"chunk_prefix", chunk_prefix},
              {"separator", std::string(1, separator)},
              {"time_chunk", time_chunk},
              {"chunks", {first_chunk, stop_chunk}}};
}

StagedTimeChunks StagedTimeChunks::from_json(const Json& json) {
  StagedTimeChunks entry;
  try {
    entry.path = json.at("path").get<std::string>();
    entry.chunk_prefix = json.at("chunk_prefix").get<std::string>();
    const std::string separator = json.at("separator").get<std::string>();
    if (separator.size() != 1) throw Error("separator must be one character");
    entry.separator = separator[0];
    entry.time_chunk = json.at("time_chunk").get<uint64_t>();
    const Json& chunks = json.at("chunks");
    if (!chunks.is_array() || chunks.size() != 2) throw Error("chunks must be [first, stop]");
    entry.first_chunk = chunks[0].get<uint64_t>();
    entry.stop_chunk = chunks[1].get<uint64_t>();
  } catch (const std::exception& e) {
    throw Error("array entry " + json.dump() + ": " + e.what());
  }
  return entry;
}

const StagedTimeChunks* StagedTimeRange::excluding(std::string_view key) const {
  for (const StagedTimeChunks& entry : arrays) {
    if (entry.excludes(key)) return &entry;
  }
  return nullptr;
}

Json StagedTimeRange::to_json() const {
  Json list = Json::array();
  for (const StagedTimeChunks& entry : arrays) list.push_back(entry.to_json());
  return Json{{"time_dim", time_dim}, {"time_range", {start, stop}}, {"arrays", list}};
}

StagedTimeRange StagedTimeRange::from_json(const Json& json) {
  StagedTimeRange range;
  try {
    range.time_dim = json.at("time_dim").get<std::string>();
    const Json& steps = json.at("time_range");
    if (!steps.is_array() || steps.size() != 2) throw Error("time_range must be [start, stop]");
    range.start = steps[0].get<uint64_t>();
    range.stop = steps[1].get<uint64_t>();
    for (const Json& entry : json.at("arrays")) {
      range.arrays.push_back(StagedTimeChunks::from_json(entry));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(e.what());
  }
  return range;
}

std::optional<Json> read_stage_record(const Store& store) {
  const auto bytes = store.get(kStageRecord);
  if (!bytes) return std::nullopt;
  try {
    Json record = parse_json(bytes->as_string(), kStageRecord);
    if (record.is_object()) return record;
  } catch (const Error&) {
  }
  return std::nullopt;
}

namespace {

StagedTimeRange parse_partial(const Json& record, const std::string& where) {
  try {
    return StagedTimeRange::from_json(record.at("partial"));
  } catch (const std::exception& e) {
    throw Error(where + ": the staging record's \"partial\" entry is malformed: " + e.what());
  }
}

// A complete partial copy: reads forward to the directory, and a missing value that is one of
// the chunks left out is an error instead of "missing" (which reads as the fill value).
class StagedCopyStore final : public Store {
 public:
  // `key_prefix`: where the directory opened lies inside the copy ("" at its root, "t2m/" for
  // one array's directory), as the record's paths are the copy's.
  StagedCopyStore(std::shared_ptr<Store> directory, std::string source, StagedTimeRange range,
                  std::string key_prefix)
      : directory_(std::move(directory)),
        source_(std::move(source)),
        range_(std::move(range)),
        key_prefix_(std::move(key_prefix)) {}

  const StagedTimeRange& range() const { return range_; }

  std::optional<Bytes> get(std::string_view key, ByteRange range) const override {
    auto value = directory_->get(key, range);
    if (!value) check_held(key);
    return value;
  }
  bool get_into(std::string_view key, ByteRange range, Bytes& out) const override {
    return directory_->get_into(key, range, out) || check_held(key);
  }
  bool with_bytes(std::string_view key, ByteRange range,
                  const std::function<void(ByteView)>& use) const override {
    return directory_->with_bytes(key, range, use) || check_held(key);
  }
  std::vector<std::optional<Bytes>> get_many(std::span<const KeyRange> requests) const override {
    auto values = directory_->get_many(requests);
    for (size_t i = 0; i < values.size(); ++i) {
      if (!values[i]) check_held(requests[i].key);
    }
    return values;
  }
  bool read_range_into(std::string_view key, uint64_t offset, MutableByteView out,
                       std::optional<uint64_t> expected_size) const override {
    return directory_->read_range_into(key, offset, out, expected_size) || check_held(key);
  }
  std::optional<uint64_t> size(std::string_view key) const override {
    auto size = directory_->size(key);
    if (!size) check_held(key);
    return size;
  }
  void set(std::string_view key, ByteView value) override { directory_->set(key, value); }
  void erase(std::string_view key) override { directory_->erase(key); }
  void erase_prefix(std::string_view prefix) override { directory_->erase_prefix(prefix); }
  std::vector<std::string> list(std::string_view prefix) const override {
    return directory_->list(prefix);
  }
  std::vector<std::pair<std::string, uint64_t>> list_sizes(std::string_view prefix) const override {
    return directory_->list_sizes(prefix);
  }
  bool can_list() const override { return directory_->can_list(); }
  std::vector<std::string> list_dir(std::string_view prefix) const override {
    return directory_->list_dir(prefix);
  }
  size_t read_concurrency() const override { return directory_->read_concurrency(); }
  std::string url() const override { return directory_->url(); }
  std::optional<std::string> local_path(std::string_view key) const override {
    return directory_->local_path(key);
  }

 private:
  // Returns false (the key is missing, as in the source) or throws where the copy left it out.
  bool check_held(std::string_view key_here) const {
    const std::string key = key_prefix_ + std::string(key_here);
    const StagedTimeChunks* entry = range_.excluding(key);
    if (!entry) return false;
    const uint64_t chunk = *entry->time_chunk_of(key);
    const uint64_t first = chunk * entry->time_chunk;
    const std::string steps = entry->time_chunk == 1
                                  ? range_.time_dim + " step " + std::to_string(first)
                                  : range_.time_dim + " steps " + std::to_string(first) + " to " +
                                        std::to_string(first + entry->time_chunk - 1);
    throw Error(url() + ": " + std::string(key_here) + ": time chunk " + std::to_string(chunk) +
                " (" + steps + ") is not in this partial staged copy of " + source_ +
                ", which holds " + range_.time_dim + " steps [" + std::to_string(range_.start) +
                ", " + std::to_string(range_.stop) +
                "): read the source, or stage the steps needed (zfeed stage --time)");
  }

  std::shared_ptr<Store> directory_;
  std::string source_;
  StagedTimeRange range_;
  std::string key_prefix_;
};

}  // namespace

std::optional<StagedTimeRange> staged_time_range(const Store& store) {
  if (const auto* copy = dynamic_cast<const StagedCopyStore*>(&store)) return copy->range();
  const auto record = read_stage_record(store);
  if (!record || !record->value("complete", false) || !record->contains("partial")) {
    return std::nullopt;
  }
  return parse_partial(*record, store.url());
}

namespace {

// The staging record of the copy that holds `root`: at `root`, or in the nearest directory above
// it that has one, with `root`'s path inside that copy ("t2m/").
std::optional<std::pair<Json, std::string>> enclosing_record(const Store& directory,
                                                             const std::string& root) {
  if (auto record = read_stage_record(directory)) return std::make_pair(*record, std::string());
  if (root.empty()) return std::nullopt;
  std::error_code error;
  const std::filesystem::path here = std::filesystem::weakly_canonical(root, error);
  if (error) return std::nullopt;
  for (std::filesystem::path above = here.parent_path(); !above.empty();
       above = above.parent_path()) {
    if (std::filesystem::exists(above / kStageRecord, error)) {
      // The nearest record decides, read as at a copy's root (unreadable: no staged copy).
      auto record = read_stage_record(*make_file_store(above.string()));
      if (!record) return std::nullopt;
      return std::make_pair(std::move(*record),
                            std::filesystem::relative(here, above).generic_string() + "/");
    }
    if (above == above.root_path()) break;
  }
  return std::nullopt;
}

}  // namespace

std::shared_ptr<Store> open_staged_copy(std::shared_ptr<Store> directory, const std::string& root) {
  const auto found = enclosing_record(*directory, root);
  if (!found) return directory;
  const auto& [record, key_prefix] = *found;
  const std::string source = record.value("source", std::string("?"));
  const std::string copy_root = strip_file_scheme(directory->url());
  if (!record.value("complete", false)) {
    std::string copy = copy_root;
    if (!key_prefix.empty()) copy.resize(copy.size() - std::min(copy.size(), key_prefix.size()));
    std::string command = "zfeed stage " + source + " " + copy;
    const Json& steps = record.value("time_range", Json());
    if (steps.is_array() && steps.size() == 2) {
      command += " --time " + steps[0].dump() + ":" + steps[1].dump();
      const std::string time_dim = record.value("time_dim", std::string("time"));
      if (time_dim != "time") command += " --time-dim " + time_dim;
    }
    throw Error(directory->url() + ": " + (key_prefix.empty() ? "an" : "part of an") +
                " unfinished staged copy of " + source + " (being made, or interrupted): run `" +
                command + "` to finish it (it resumes)");
  }
  if (!record.contains("partial")) return directory;
  StagedTimeRange range = parse_partial(record, directory->url());
  return std::make_shared<StagedCopyStore>(std::move(directory), source, std::move(range),
                                           key_prefix);
}

namespace {

class ReadThroughStore final : public Store {
 public:
  ReadThroughStore(std::shared_ptr<Store> source, std::shared_ptr<Store> directory,
                   std::shared_ptr<const StagedKeys> staged)
      : source_(std::move(source)), directory_(std::move(directory)), staged_(std::move(staged)) {}

  std::optional<Bytes> get(std::string_view key, ByteRange range) const override {
    if (staged_->contains(key)) {
      if (auto value = directory_->get(key, range)) return value;
    }
    return source_->get(key, range);
  }
  bool get_into(std::string_view key, ByteRange range, Bytes& out) const override {
    return (staged_->contains(key) && directory_->get_into(key, range, out)) ||
           source_->get_into(key, range, out);
  }
  bool with_bytes(std::string_view key, ByteRange range,
                  const std::function<void(ByteView)>& use) const override {
    return (staged_->contains(key) && directory_->with_bytes(key, range, use)) ||
           source_->with_bytes(key, range, use);
  }
  std::vector<std::optional<Bytes>> get_many(std::span<const KeyRange> requests) const override {
    std::vector<std::optional<Bytes>> values(requests.size());
    std::vector<KeyRange> remote;
    std::vector<size_t> remote_index;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (staged_->contains(requests[i].key)) {
        values[i] = directory_->get(requests[i].key, requests[i].range);
      }
      if (!values[i]) {
        remote.push_back(requests[i]);
        remote_index.push_back(i);
      }
    }
    // The values the copy lacks yet, at once (a remote source overlaps them).
    auto fetched = source_->get_many(remote);
    for (size_t k = 0; k < remote.size(); ++k) values[remote_index[k]] = std::move(fetched[k]);
    return values;
  }
  bool read_range_into(std::string_view key, uint64_t offset, MutableByteView out,
                       std::optional<uint64_t> expected_size) const override {
    return (staged_->contains(key) &&
            directory_->read_range_into(key, offset, out, expected_size)) ||
           source_->read_range_into(key, offset, out, expected_size);
  }
  std::optional<uint64_t> size(std::string_view key) const override {
    if (staged_->contains(key)) {
      if (auto size = directory_->size(key)) return size;
    }
    return source_->size(key);
  }
  void set(std::string_view key, ByteView) override { refuse_write(key); }
  void erase(std::string_view key) override { refuse_write(key); }
  void erase_prefix(std::string_view prefix) override { refuse_write(prefix); }
  std::vector<std::string> list(std::string_view prefix) const override {
    return source_->list(prefix);
  }
  std::vector<std::pair<std::string, uint64_t>> list_sizes(std::string_view prefix) const override {
    return source_->list_sizes(prefix);
  }
  bool can_list() const override { return source_->can_list(); }
  std::vector<std::string> list_dir(std::string_view prefix) const override {
    return source_->list_dir(prefix);
  }
  size_t read_concurrency() const override { return source_->read_concurrency(); }
  std::string url() const override { return source_->url(); }

 private:
  [[noreturn]] void refuse_write(std::string_view key) const {
    throw Error(source_->url() + ": " + std::string(key) + ": cannot write while it is staged to " +
                directory_->url() + " (read-only)");
  }

  std::shared_ptr<Store> source_, directory_;
  std::shared_ptr<const StagedKeys> staged_;
};

}  // namespace

void StagedKeys::add(std::string_view key) {
  std::unique_lock lock(mutex_);
  keys_.emplace(key);
}

bool StagedKeys::contains(std::string_view key) const {
  std::shared_lock lock(mutex_);
  return keys_.find(key) != keys_.end();
}

std::shared_ptr<Store> make_read_through_store(std::shared_ptr<Store> source,
                                               std::shared_ptr<Store> directory,
                                               std::shared_ptr<const StagedKeys> staged) {
  return std::make_shared<ReadThroughStore>(std::move(source), std::move(directory),
                                            std::move(staged));
}

}  // namespace zfeed
