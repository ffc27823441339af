// A Zarr array (v3 or v2) in a store: open or create it, read any strided selection into a
// caller's buffer, write any selection from one. Reads decode chunks in parallel on the shared
// thread pool and write each chunk's values straight into the caller's buffer; a chunk that
// covers a contiguous part of the output is decoded in place, with no intermediate copy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zfeed/codec/codec.h"
#include "zfeed/store/store.h"
#include "zfeed/zarr/metadata.h"

namespace zfeed::zarr {

// start, stop and step along one dimension (step >= 1, start <= stop <= extent).
struct Slice {
  uint64_t start = 0;
  uint64_t stop = 0;
  uint64_t step = 1;
  uint64_t count() const { return stop > start ? (stop - start - 1) / step + 1 : 0; }
};
using Selection = std::vector<Slice>;

struct StorageInfo {
  uint64_t stored_bytes = 0;     // bytes of every chunk (or shard) object present
  uint64_t objects_present = 0;  // chunk or shard objects present
  uint64_t objects_total = 0;    // chunk or shard objects the grid has
  bool known = true;  // false where the store cannot list (plain HTTP): the two above are 0
};

class Array {
 public:
  // Opens the array at `path` ("" for the store root); v3 (zarr.json) or v2 (.zarray).
  static Array open(std::shared_ptr<Store> store, const std::string& path = "");
  // Writes the metadata and returns the array. An existing node at `path` is an error unless
  // `overwrite`, which first removes everything under it.
  static Array create(std::shared_ptr<Store> store, const std::string& path, ArrayMetadata metadata,
                      bool overwrite = false);
  // From metadata already read (consolidated metadata).
  static Array from_metadata(std::shared_ptr<Store> store, const std::string& path,
                             ArrayMetadata metadata);

  const ArrayMetadata& metadata() const { return *metadata_; }
  const std::string& path() const { return path_; }
  const std::shared_ptr<Store>& store() const { return store_; }
  const CodecChain& codecs() const { return *chain_; }
  // The inner chunk shape where sharded (the read unit), else the chunk shape.
  std::vector<uint64_t> read_chunk_shape() const;

  Selection full_selection() const;
  // Reads `selection` into `out`: a dense C-order buffer of the selection's shape, native order.
  void read(const Selection& selection, void* out) const;
  // Reads several selections at once (a batch of samples, or random chunks), decoding the
  // chunks of all of them in one parallel pass: outs[i] receives selections[i].
  void read_many(std::span<const Selection> selections, std::span<void* const> outs) const;
  // Writes `in` (dense, C order, the selection's shape) into the selection. Chunks left holding
  // only the fill value are removed. A chunk (a whole shard where sharded) is written whole: one
  // the selection covers in part is read, updated and written back, so writers working at once
  // (threads, processes) must write disjoint sets of whole chunks (shards), as with
  // zarr-python: two writing parts of one shard at once lose one's update.
  void write(const Selection& selection, const void* in) const;

  // Replaces the user attributes and rewrites the metadata.
  void set_attributes(const Json& attributes);

  std::string chunk_key(std::span<const uint64_t> chunk_index) const;
  // The stored (encoded) bytes of one read chunk, by its index in the read chunk grid (see
  // read_chunk_shape): the chunk's value, or where sharded (one level) the inner chunk's byte
  // range, found through the shard's index. False where it is absent (the fill value); `where`
  // then says what was looked for, else the key and byte range read ("a/c/3/0/0 (bytes 96..4200)"),
  // for messages. Decoding them is `read_codecs()`'s job (a GPU decoder's).
  bool read_stored(std::span<const uint64_t> read_chunk_index, Bytes& out,
                   std::string* where = nullptr) const;
  // Where a read chunk's stored bytes lie in a local file (locate_stored).
  struct StoredLocation {
    std::string path;
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  // True where this array's store keeps its keys as local files (Store::local_path).
  bool stored_locally() const;
  // Where read_stored's bytes lie: the local file, the byte offset in it and the size, for a
  // consumer that reads them itself (GPUDirect Storage). False where the chunk is absent (the
  // fill value). The shard index is read (as read_stored reads it); the chunk's bytes are not.
  // Throws where the store has no local files, and as read_stored does for a bad shard index.
  // `where` as read_stored.
  bool locate_stored(std::span<const uint64_t> read_chunk_index, StoredLocation& out,
                     std::string* where = nullptr) const;
  // The codecs of a read chunk: the chain, or the inner chain where sharded.
  const CodecChain& read_codecs() const;
  StorageInfo storage_info() const;

 private:
  Array(std::shared_ptr<Store> store, std::string path, ArrayMetadata metadata);
  void write_metadata() const;

  std::shared_ptr<Store> store_;
  std::string path_;
  std::shared_ptr<ArrayMetadata> metadata_;
  std::shared_ptr<const CodecChain> chain_;
};

// "a/b" + "c" -> "a/b/c"; "" + "c" -> "c".
std::string join_key(std::string_view prefix, std::string_view name);
// Normalizes a user path: strips leading and trailing "/", rejects "." and "..".
std::string normalize_path(std::string_view path);

}  // namespace zfeed::zarr
