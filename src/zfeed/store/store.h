// Key-value byte stores with byte-range reads. Keys are "/"-separated relative paths
// ("temperature/c/0/1"); a store never lets a key climb out of its root.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zfeed/util/bytes.h"

namespace zfeed {

// Which bytes of a value to read: all, [offset, offset + length), or the last `length`.
struct ByteRange {
  enum class Kind { kAll, kRange, kSuffix };
  Kind kind = Kind::kAll;
  uint64_t offset = 0;
  uint64_t length = 0;

  static ByteRange all() { return {}; }
  static ByteRange range(uint64_t offset, uint64_t length) {
    return {Kind::kRange, offset, length};
  }
  static ByteRange suffix(uint64_t length) { return {Kind::kSuffix, 0, length}; }
  std::string describe() const;

  // The [begin, begin + length) this range selects in a value of `size` bytes; throws naming
  // `where` if it reaches past the end.
  std::pair<uint64_t, uint64_t> resolve(uint64_t size, std::string_view where) const;
};

struct KeyRange {
  std::string key;
  ByteRange range;
};

class Store {
 public:
  virtual ~Store() = default;

  // The value's bytes in `range`, or nullopt if the key does not exist. A range that reaches
  // past the end of the value is an error naming the key.
  virtual std::optional<Bytes> get(std::string_view key, ByteRange range = {}) const = 0;

  // Like get, but reads into `out` (reusing its capacity). Returns false if the key is missing.
  virtual bool get_into(std::string_view key, ByteRange range, Bytes& out) const;

  // get_into, also saying the whole value's size (nullopt where unknown): a shard's index, read
  // by range, is checked against it. By default a size() after the read; a remote store takes it
  // from the response, sparing a request per shard read.
  virtual bool get_into_sized(std::string_view key, ByteRange range, Bytes& out,
                              std::optional<uint64_t>& value_size) const;

  // Calls `use` with the value's bytes in `range`, valid only during the call, and returns true;
  // returns false (without calling it) if the key does not exist. For reads that consume the
  // bytes at once (a decode): the default reads them into a buffer of the thread's; the
  // filesystem store maps large values instead of copying them (store/mapped_read.h), and where
  // the file shrinks under the mapping it reads the value again and calls `use` again.
  virtual bool with_bytes(std::string_view key, ByteRange range,
                          const std::function<void(ByteView)>& use) const;

  // Several reads at once; stores that can overlap them (remote ones) override this.
  virtual std::vector<std::optional<Bytes>> get_many(std::span<const KeyRange> requests) const;

  // Reads the whole value straight into `out`, which must be exactly its size. Returns false if
  // the key does not exist; throws if the value's size differs from out.size()
  // (read_range_into from 0, checking the size).
  bool read_into(std::string_view key, MutableByteView out) const {
    return read_range_into(key, 0, out, out.size());
  }

  // Reads out.size() bytes of the value from `offset` straight into `out`. Returns false if the
  // key does not exist; a range past the value's end is an error naming the key, and so is a
  // value whose size is not `expected_size` where given (a partial read of an uncompressed chunk
  // checks the chunk's size as a whole read does). The default reads then copies; the filesystem
  // store reads in place.
  virtual bool read_range_into(std::string_view key, uint64_t offset, MutableByteView out,
                               std::optional<uint64_t> expected_size) const;

  // The value's size in bytes, or nullopt if the key does not exist.
  virtual std::optional<uint64_t> size(std::string_view key) const = 0;

  // Stores `value` under `key`, replacing what was there, atomically: a reader sees the old value
  // or the new one, never a mix.
  virtual void set(std::string_view key, ByteView value) = 0;

  // Removes the key; removing a missing key is not an error.
  virtual void erase(std::string_view key) = 0;

  // Removes every key under `prefix` ("" for all).
  virtual void erase_prefix(std::string_view prefix);

  // All keys that start with `prefix`, sorted.
  virtual std::vector<std::string> list(std::string_view prefix) const = 0;

  // All keys that start with `prefix`, sorted, with their values' sizes. The default asks each
  // key's size; object stores list sizes with the keys.
  virtual std::vector<std::pair<std::string, uint64_t>> list_sizes(std::string_view prefix) const;

  // Whether list() works: a plain HTTP server cannot list.
  virtual bool can_list() const { return true; }

  // The direct children of the "directory" `prefix` (which is "" or ends with "/"): names of
  // keys and of sub-directories, without the prefix, sorted.
  virtual std::vector<std::string> list_dir(std::string_view prefix) const;

  // How many reads to keep in flight: 0 for local stores (one per core: reads are CPU-bound),
  // more for remote ones, whose reads mostly wait (reads then run on ThreadPool::io()).
  virtual size_t read_concurrency() const { return 0; }

  // For error messages: "file:///data/era5.zarr", "memory://".
  virtual std::string url() const = 0;

  // The local file that holds `key`'s value, where this store keeps each key as a plain local
  // file (the filesystem store; the file need not exist), so that a consumer can read it by
  // other means (GPUDirect Storage); nullopt for every other store. Where a path is given, the
  // key is checked as get() checks it.
  virtual std::optional<std::string> local_path(std::string_view key) const;

  // Throws naming `key` where a value of `size` bytes should hold `expected`.
  void check_size(std::string_view key, uint64_t size, uint64_t expected) const;

  // Throws if `key` is empty, absolute, or has empty, "." or ".." components.
  static void check_key(std::string_view key);
};

std::shared_ptr<Store> make_memory_store();

struct FileStoreOptions {
  // fsync each written file (and its directory) before the rename that publishes it. Off by
  // default: the rename already keeps a killed process from leaving a torn value; turn it on to
  // survive power loss as well.
  bool sync = false;
  // Create the root directory if it does not exist.
  bool create = false;
};

std::shared_ptr<Store> make_file_store(const std::string& root, FileStoreOptions options = {});

// Opens a store from a path or URL: "file:///x", "/x", "x", "memory://", and the remote ones of
// store/http_store.h: "http(s)://host/x", "s3://bucket/x", "gs://bucket/x". A directory staged by
// `zfeed stage` opens as its record says (store/staged_copy.h).
std::shared_ptr<Store> open_store(const std::string& path_or_url, bool create = false);

}  // namespace zfeed
