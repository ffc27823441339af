#include "zfeed/zarr/array.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <mutex>

#include "zfeed/codec/sharding.h"
#include "zfeed/util/box_copy.h"
#include "zfeed/util/error.h"
#include "zfeed/util/fork_gate.h"
#include "zfeed/util/scratch.h"
#include "zfeed/util/thread_pool.h"

namespace zfeed::zarr {
namespace {

// The part of a selection along one dimension that falls in one chunk.
struct Piece {
  uint64_t chunk;      // chunk index along the dimension
  uint64_t start;      // first selected position inside the chunk
  uint64_t out_start;  // its position in the selection
  uint64_t count;      // selected elements inside the chunk
};

std::vector<Piece> split(const Slice& slice, uint64_t chunk_size) {
  std::vector<Piece> pieces;
  const uint64_t n = slice.count();
  uint64_t k = 0;
  while (k < n) {
    uint64_t position = slice.start + k * slice.step;
    uint64_t chunk = position / chunk_size;
    uint64_t chunk_end =
        chunk + 1 > UINT64_MAX / chunk_size ? UINT64_MAX : (chunk + 1) * chunk_size;
    uint64_t m = std::min((chunk_end - position - 1) / slice.step + 1, n - k);
    pieces.push_back({chunk, position - chunk * chunk_size, k, m});
    k += m;
  }
  return pieces;
}

// Every combination of one piece per dimension, as a flat task list index -> pieces.
struct Plan {
  std::vector<std::vector<Piece>> pieces;
  uint64_t size() const {
    uint64_t total = 1;
    for (const auto& dim : pieces) total *= dim.size();
    return total;
  }
  // The pieces of task `task`, one per dimension.
  void task(uint64_t task, std::vector<const Piece*>& out) const {
    out.resize(pieces.size());
    for (size_t d = pieces.size(); d-- > 0;) {
      out[d] = &pieces[d][task % pieces[d].size()];
      task /= pieces[d].size();
    }
  }
};

// True if a box of `count` in an array of `shape` is one contiguous run.
bool is_contiguous(std::span<const uint64_t> count, std::span<const uint64_t> shape) {
  size_t d = 0;
  while (d < count.size() && count[d] == 1) ++d;
  for (size_t j = d + 1; j < count.size(); ++j) {
    if (count[j] != shape[j]) return false;
  }
  return true;
}

uint64_t element_offset(std::span<const uint64_t> start, std::span<const uint64_t> shape) {
  uint64_t offset = 0, stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    offset += start[d] * stride;
    stride *= shape[d];
  }
  return offset;
}

// Where the bytes of one chunk live: a whole store value, or a window of one (an inner chunk of
// a shard, read by range).
struct Source {
  const Store& store;
  std::string key;
  bool windowed = false;
  uint64_t offset = 0;
  uint64_t length = 0;

  // Reads `range` of the value (window) into `out`; `value_size`, where given, is set to the whole
  // value's (window's) size where known.
  bool fetch(ByteRange range, Bytes& out, std::optional<uint64_t>* value_size = nullptr) const {
    if (!windowed) {
      if (!value_size) return store.get_into(key, range, out);
      return store.get_into_sized(key, range, out, *value_size);
    }
    if (value_size) *value_size = length;
    ByteRange absolute;
    switch (range.kind) {
      case ByteRange::Kind::kAll:
        absolute = ByteRange::range(offset, length);
        break;
      case ByteRange::Kind::kRange:
        absolute = window_range(range.offset, range.length);
        break;
      case ByteRange::Kind::kSuffix:
        if (range.length > length) {
          throw Error(store.url() + "/" + key + ": inner chunk of " + std::to_string(length) +
                      " bytes is too short for a " + std::to_string(range.length) +
                      "-byte shard index");
        }
        absolute = ByteRange::range(offset + length - range.length, range.length);
        break;
    }
    if (!store.get_into(key, absolute, out)) throw vanished();
    return true;
  }
  // Calls `use` with the whole value (or window), mapped where the store can (Store::with_bytes);
  // false where it is missing.
  bool with_bytes(const std::function<void(ByteView)>& use) const {
    if (!windowed) return store.with_bytes(key, ByteRange::all(), use);
    if (!store.with_bytes(key, ByteRange::range(offset, length), use)) throw vanished();
    return true;
  }
  // Reads out.size() bytes from `at` (within the window) straight into `out`, checking that the
  // value (the window) holds `expected_size` bytes.
  bool fetch_into(uint64_t at, MutableByteView out, uint64_t expected_size) const {
    if (!windowed) return store.read_range_into(key, at, out, expected_size);
    if (length != expected_size) {
      throw SizeMismatchError(where() + ": holds " + std::to_string(length) + " bytes, expected " +
                                  std::to_string(expected_size),
                              length, expected_size);
    }
    const ByteRange range = window_range(at, out.size());
    if (!store.read_range_into(key, range.offset, out, std::nullopt)) throw vanished();
    return true;
  }
  // [at, at + size) of the window, in the store value.
  ByteRange window_range(uint64_t at, uint64_t size) const {
    if (at > length || size > length - at) {
      throw Error(where() + ": " + ByteRange::range(at, size).describe() + " is outside the " +
                  std::to_string(length) + "-byte inner chunk");
    }
    return ByteRange::range(offset + at, size);
  }
  Error vanished() const { return Error(store.url() + "/" + key + ": vanished while reading"); }
  std::string where() const {
    std::string text = store.url() + "/" + key;
    if (windowed)
      text += " (bytes " + std::to_string(offset) + ".." + std::to_string(offset + length) + ")";
    return text;
  }
};

// A box inside one chunk: start and step per dimension, and how many elements.
struct Region {
  std::vector<uint64_t> start, step, count;
};

// One past the C-order index of the region's last element in a chunk of `shape` (0 if empty).
uint64_t region_end_offset(std::span<const uint64_t> shape, const Region& region) {
  uint64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (region.count[d] == 0) return 0;
    last = last * shape[d] + region.start[d] + (region.count[d] - 1) * region.step[d];
  }
  return last + 1;
}

void read_region(const CodecChain& chain, const Source& source, const Region& region, uint8_t* out,
                 std::span<const uint64_t> out_shape, std::span<const uint64_t> out_start) {
  const ChunkSpec& spec = chain.spec();
  const size_t item = spec.dtype.size();
  const size_t rank = spec.shape.size();
  bool full = true;
  for (size_t d = 0; d < rank; ++d) {
    full = full && region.start[d] == 0 && region.step[d] == 1 && region.count[d] == spec.shape[d];
  }
  const bool direct = full && is_contiguous(region.count, out_shape);
  uint8_t* direct_out = out + element_offset(out_start, out_shape) * item;
  BoxRef out_box{out_shape, out_start};
  auto fill_region = [&] { fill_box(out, out_box, region.count, spec.fill.bytes.data(), item); };

  // A whole shard of a store of local files goes this way too: its inner chunks decode on the
  // pool's threads, and each must map (and so guard against SIGBUS: store/mapped_read.h) the
  // bytes it reads itself; a shard mapped by this thread and decoded on others is not guarded
  // there. Elsewhere (memory, remote stores) a whole shard is one read, its bytes in memory.
  const ShardingCodec* sharding = chain.sharding();
  if (sharding != nullptr && (!full || source.store.local_path(source.key))) {
    // Read the index, then only the inner chunks the region touches.
    ScratchBuffer index_bytes;
    ByteRange index_range = sharding->index_at_end() ? ByteRange::suffix(sharding->index_size())
                                                     : ByteRange::range(0, sharding->index_size());
    bool found = false;
    std::optional<uint64_t> shard_size;
    try {
      found = source.fetch(index_range, index_bytes.bytes(), &shard_size);
    } catch (const Error&) {
      // A shard shorter than its index: said as the sharding codec says it of a whole shard.
      const std::optional<uint64_t> size =
          source.windowed ? std::optional<uint64_t>(source.length) : source.store.size(source.key);
      if (size && *size < sharding->index_size()) {
        throw Error(source.where() + ": shard of " + std::to_string(*size) +
                    " bytes is too short for its " + std::to_string(sharding->index_size()) +
                    "-byte index");
      }
      throw;
    }
    if (!found) return fill_region();
    ShardIndex index;
    try {
      // Bound every entry by the shard's size (where known), so a corrupt index is reported as
      // such.
      index = sharding->decode_index(index_bytes.bytes(), shard_size);
    } catch (...) {
      rethrow_with_context(source.where());
    }
    Plan plan;
    const auto& inner_shape = sharding->inner_shape();
    for (size_t d = 0; d < rank; ++d) {
      Slice slice{region.start[d], region.start[d] + (region.count[d] - 1) * region.step[d] + 1,
                  region.step[d]};
      plan.pieces.push_back(split(slice, inner_shape[d]));
    }
    const auto& grid = sharding->chunks_per_shard();
    ThreadPool::for_reads(source.store.read_concurrency())
        .parallel_for(plan.size(), [&](size_t task) {
          std::vector<const Piece*> pieces;
          plan.task(task, pieces);
          Region inner;
          std::vector<uint64_t> inner_out_start(rank);
          uint64_t linear = 0;
          for (size_t d = 0; d < rank; ++d) {
            linear = linear * grid[d] + pieces[d]->chunk;
            inner.start.push_back(pieces[d]->start);
            inner.step.push_back(region.step[d]);
            inner.count.push_back(pieces[d]->count);
            inner_out_start[d] = out_start[d] + pieces[d]->out_start;
          }
          if (index.is_empty(linear)) {
            fill_box(out, BoxRef{out_shape, inner_out_start}, inner.count, spec.fill.bytes.data(),
                     item);
            return;
          }
          Source inner_source{source.store, source.key, true, source.offset + index.offset(linear),
                              index.nbytes(linear)};
          read_region(sharding->inner(), inner_source, inner, out, out_shape, inner_out_start);
        });
    return;
  }

  if (chain.is_identity()) {
    // Uncompressed: fetch only the bytes from the region's first element to its last (the whole
    // chunk, one time step of a chunk of many, a crop of a plane), straight into the output where
    // that is one run of both. The leading dimensions a partial region takes one element of, and
    // its start in the next, fold into the byte offset.
    uint64_t begin = 0, end = spec.num_elements();
    std::vector<uint64_t> start_in_part = region.start;
    bool one_run = direct;
    if (!full) {
      size_t outer = 0;
      while (outer + 1 < rank && region.count[outer] == 1) ++outer;
      std::vector<uint64_t> first(rank, 0);
      for (size_t d = 0; d <= outer; ++d) {
        first[d] = region.start[d];
        start_in_part[d] = 0;
      }
      begin = element_offset(first, spec.shape);
      end = region_end_offset(spec.shape, region);
      one_run = is_contiguous(region.count, spec.shape) && is_contiguous(region.count, out_shape) &&
                (region.count[outer] == 1 || region.step[outer] == 1);
    }
    if (end <= begin) return;
    // The store checks the chunk's size (the file store from its fstat), as a decode would: a
    // mismatch is reported as the bytes codec reports it.
    const size_t part_bytes = (end - begin) * item;
    ScratchBuffer part;
    if (!one_run) part.bytes().resize(part_bytes);
    uint8_t* target = one_run ? direct_out : part.data();
    bool found = false;
    try {
      found = source.fetch_into(begin * item, {target, part_bytes}, spec.num_bytes());
    } catch (const SizeMismatchError& error) {
      throw Error(source.where() + ": " + chunk_size_mismatch(error.size, spec));
    }
    if (!found) return fill_region();
    if (!one_run) {
      copy_box(part.data(), BoxRef{spec.shape, start_in_part, region.step}, out, out_box,
               region.count, item);
    }
    return;
  }
  // The stored bytes are decoded where they lie: in the page cache, where the store maps them.
  const bool found = source.with_bytes([&](ByteView encoded) {
    try {
      if (direct) {
        chain.decode(encoded, direct_out);
        return;
      }
      // A region that ends early in the chunk (a few time steps of a chunk of many) needs only
      // the start of the decoded chunk: decode no further than that where the chain can stop.
      ScratchBuffer decoded(spec.num_bytes());
      const uint64_t needed = region_end_offset(spec.shape, region) * item;
      if (!CodecChain::prefix_worth_it(needed, spec.num_bytes()) ||
          !chain.decode_prefix(encoded, decoded.data(), needed)) {
        chain.decode(encoded, decoded.data());
      }
      copy_box(decoded.data(), BoxRef{spec.shape, region.start, region.step}, out, out_box,
               region.count, item);
    } catch (...) {
      rethrow_with_context(source.where());
    }
  });
  if (!found) fill_region();
}

void check_selection(const Selection& selection, const ArrayMetadata& meta) {
  if (selection.size() != meta.rank()) {
    throw Error("selection has " + std::to_string(selection.size()) +
                " dimensions, the array has " + std::to_string(meta.rank()));
  }
  for (size_t d = 0; d < selection.size(); ++d) {
    const Slice& s = selection[d];
    if (s.step == 0)
      throw Error("selection step must be positive (dimension " + std::to_string(d) + ")");
    if (s.start > s.stop || s.stop > meta.shape[d]) {
      throw Error("selection " + std::to_string(s.start) + ":" + std::to_string(s.stop) +
                  " is out of bounds for dimension " + std::to_string(d) + " of extent " +
                  std::to_string(meta.shape[d]));
    }
  }
}

}  // namespace

std::string join_key(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) return std::string(name);
  if (name.empty()) return std::string(prefix);
  return std::string(prefix) + "/" + std::string(name);
}

std::string normalize_path(std::string_view path) {
  while (!path.empty() && path.front() == '/') path.remove_prefix(1);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (!path.empty()) Store::check_key(path);
  return std::string(path);
}

Array::Array(std::shared_ptr<Store> store, std::string path, ArrayMetadata metadata)
    : store_(std::move(store)),
      path_(std::move(path)),
      metadata_(std::make_shared<ArrayMetadata>(std::move(metadata))) {
  chain_ = std::make_shared<const CodecChain>(metadata_->codec_chain());
}

Array Array::from_metadata(std::shared_ptr<Store> store, const std::string& path,
                           ArrayMetadata metadata) {
  return Array(std::move(store), normalize_path(path), std::move(metadata));
}

Array Array::open(std::shared_ptr<Store> store, const std::string& path_in) {
  std::string path = normalize_path(path_in);
  std::string key = join_key(path, "zarr.json");
  if (auto bytes = store->get(key)) {
    std::string where = store->url() + "/" + key;
    try {
      Json json = parse_json(bytes->as_string(), "invalid JSON");
      if (json.is_object() && json_string_or(json, "node_type", "") == "group") {
        throw NotFoundError("is a group, not an array");
      }
      return Array(store, path, ArrayMetadata::parse_v3(json));
    } catch (...) {
      rethrow_with_context(where);
    }
  }
  key = join_key(path, ".zarray");
  if (auto bytes = store->get(key)) {
    std::string where = store->url() + "/" + key;
    try {
      Json zarray = parse_json(bytes->as_string(), "invalid JSON");
      Json zattrs;
      std::string attrs_key = join_key(path, ".zattrs");
      if (auto attrs = store->get(attrs_key))
        zattrs = parse_json(attrs->as_string(), attrs_key + ": invalid JSON");
      return Array(store, path, ArrayMetadata::parse_v2(zarray, zattrs));
    } catch (...) {
      rethrow_with_context(where);
    }
  }
  throw NotFoundError(store->url() + "/" + path + ": no Zarr array here (no zarr.json or .zarray)");
}

void Array::write_metadata() const {
  if (metadata_->zarr_format == 3) {
    store_->set(join_key(path_, "zarr.json"), as_bytes(dump_json(metadata_->to_json_v3())));
  } else {
    store_->set(join_key(path_, ".zarray"), as_bytes(dump_json(metadata_->to_zarray())));
    Json attrs = metadata_->to_zattrs();
    if (!attrs.empty()) {
      store_->set(join_key(path_, ".zattrs"), as_bytes(dump_json(attrs)));
    } else {
      store_->erase(join_key(path_, ".zattrs"));
    }
  }
}

Array Array::create(std::shared_ptr<Store> store, const std::string& path_in,
                    ArrayMetadata metadata, bool overwrite) {
  std::string path = normalize_path(path_in);
  metadata.validate();
  const bool exists = store->size(join_key(path, "zarr.json")) ||
                      store->size(join_key(path, ".zarray")) ||
                      store->size(join_key(path, ".zgroup"));
  if (exists) {
    if (!overwrite) {
      throw Error(store->url() + "/" + path +
                  ": a Zarr node already exists here (pass overwrite to replace it)");
    }
    store->erase_prefix(path.empty() ? "" : path + "/");
  }
  // Parent groups, as zarr-python creates them.
  if (!path.empty()) {
    std::vector<std::string> parents{""};
    for (size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      parents.push_back(path.substr(0, slash));
    }
    for (const auto& parent : parents) {
      if (store->size(join_key(parent, "zarr.json")) || store->size(join_key(parent, ".zgroup")) ||
          store->size(join_key(parent, ".zarray"))) {
        continue;
      }
      if (metadata.zarr_format == 3) {
        store->set(join_key(parent, "zarr.json"),
                   as_bytes(dump_json(GroupMetadata{}.to_json_v3())));
      } else {
        store->set(join_key(parent, ".zgroup"), as_bytes("{\n  \"zarr_format\": 2\n}"));
      }
    }
  }
  Array array(store, path, std::move(metadata));
  array.write_metadata();
  return array;
}

void Array::set_attributes(const Json& attributes) {
  if (!attributes.is_object()) throw Error("attributes must be a JSON object");
  auto updated = std::make_shared<ArrayMetadata>(*metadata_);
  updated->attributes = attributes;
  metadata_ = updated;
  write_metadata();
}

std::vector<uint64_t> Array::read_chunk_shape() const {
  const CodecChain* chain = chain_.get();
  while (const ShardingCodec* sharding = chain->sharding()) chain = &sharding->inner();
  return chain->spec().shape;
}

Selection Array::full_selection() const {
  Selection selection;
  for (uint64_t extent : metadata_->shape) selection.push_back({0, extent, 1});
  return selection;
}

std::string Array::chunk_key(std::span<const uint64_t> chunk_index) const {
  return join_key(path_, metadata_->key_encoding.encode(chunk_index));
}

const CodecChain& Array::read_codecs() const {
  const CodecChain* chain = chain_.get();
  while (const ShardingCodec* sharding = chain->sharding()) chain = &sharding->inner();
  return *chain;
}

namespace {

// Where one read chunk's stored bytes are: a whole store value, or (sharded) a window of the
// shard found through its index. nullopt where absent. The shard index is read; the chunk is not.
// `operation` names the caller in errors.
std::optional<Source> find_stored(const Array& array, std::span<const uint64_t> read_chunk_index,
                                  std::string* where, std::string_view operation) {
  const Store& store = *array.store();
  const ShardingCodec* sharding = array.codecs().sharding();
  if (!sharding) {
    Source source{store, array.chunk_key(read_chunk_index)};
    if (where) *where = source.where();
    return source;  // absence is found by the read (or size) itself, in one call
  }
  const std::string context = array.path() + ": " + std::string(operation);
  if (sharding->inner().sharding()) {
    throw UnsupportedError(context + ": nested sharding is not supported");
  }
  const auto& grid = sharding->chunks_per_shard();
  const size_t rank = grid.size();
  if (read_chunk_index.size() != rank) {
    throw Error(context + ": chunk index of " + std::to_string(read_chunk_index.size()) +
                " dimensions for a " + std::to_string(rank) + "-dimensional array");
  }
  std::vector<uint64_t> shard(rank);
  uint64_t linear = 0;
  for (size_t d = 0; d < rank; ++d) {
    shard[d] = read_chunk_index[d] / grid[d];
    linear = linear * grid[d] + read_chunk_index[d] % grid[d];
  }
  const Source source{store, array.chunk_key(shard)};
  if (where) *where = source.where() + " (inner chunk " + std::to_string(linear) + ")";
  ScratchBuffer index_bytes;
  const ByteRange index_range = sharding->index_at_end()
                                    ? ByteRange::suffix(sharding->index_size())
                                    : ByteRange::range(0, sharding->index_size());
  if (!source.fetch(index_range, index_bytes.bytes())) return std::nullopt;
  ShardIndex index;
  try {
    index = sharding->decode_index(index_bytes.bytes(), store.size(source.key));
  } catch (...) {
    rethrow_with_context(source.where());
  }
  if (index.is_empty(linear)) return std::nullopt;
  Source inner{store, source.key, true, index.offset(linear), index.nbytes(linear)};
  if (where) *where = inner.where();
  return inner;
}

}  // namespace

bool Array::read_stored(std::span<const uint64_t> read_chunk_index, Bytes& out,
                        std::string* where) const {
  const std::optional<Source> source = find_stored(*this, read_chunk_index, where, "read_stored");
  return source && source->fetch(ByteRange::all(), out);
}

bool Array::stored_locally() const {
  // Stores map all keys alike, so any valid key answers for the array's chunks.
  return store_->local_path(join_key(path_, "zarr.json")).has_value();
}

bool Array::locate_stored(std::span<const uint64_t> read_chunk_index, StoredLocation& out,
                          std::string* where) const {
  if (!stored_locally()) {
    throw Error(store_->url() + "/" + path_ +
                ": locate_stored: the store keeps no local files (only a file store does); read "
                "the chunk with read_stored instead");
  }
  const std::optional<Source> source = find_stored(*this, read_chunk_index, where, "locate_stored");
  if (!source) return false;
  std::optional<std::string> path = store_->local_path(source->key);
  if (!path) throw Error(source->where() + ": locate_stored: no local file for this key");
  if (source->windowed) {
    out.offset = source->offset;
    out.size = source->length;
  } else {
    const std::optional<uint64_t> size = store_->size(source->key);
    if (!size) return false;
    out.offset = 0;
    out.size = *size;
  }
  out.path = std::move(*path);
  return true;
}

void Array::read(const Selection& selection, void* out) const {
  read_many({&selection, 1}, {&out, 1});
}

void Array::read_many(std::span<const Selection> selections, std::span<void* const> outs) const {
  const ArrayMetadata& meta = *metadata_;
  if (selections.size() != outs.size())
    throw Error("read_many: selections and outputs differ in number");
  const size_t rank = meta.rank();
  struct Request {
    const Selection* selection;
    uint8_t* out;
    std::vector<uint64_t> out_shape;
    Plan plan;
  };
  std::vector<Request> requests;
  std::vector<uint64_t> first_task{0};  // prefix sums of the task counts
  for (size_t i = 0; i < selections.size(); ++i) {
    check_selection(selections[i], meta);
    Request request{
        &selections[i], static_cast<uint8_t*>(outs[i]), std::vector<uint64_t>(rank), {}};
    bool empty = false;
    for (size_t d = 0; d < rank; ++d) {
      request.out_shape[d] = selections[i][d].count();
      empty = empty || request.out_shape[d] == 0;
      request.plan.pieces.push_back(split(selections[i][d], meta.chunk_shape[d]));
    }
    if (empty) continue;
    first_task.push_back(first_task.back() + request.plan.size());
    requests.push_back(std::move(request));
  }
  ThreadPool::for_reads(store_->read_concurrency())
      .parallel_for(first_task.back(), [&](size_t task) {
        size_t r =
            std::upper_bound(first_task.begin(), first_task.end(), task) - first_task.begin() - 1;
        const Request& request = requests[r];
        std::vector<const Piece*> pieces;
        request.plan.task(task - first_task[r], pieces);
        std::vector<uint64_t> chunk_index(rank), out_start(rank);
        Region region;
        for (size_t d = 0; d < rank; ++d) {
          chunk_index[d] = pieces[d]->chunk;
          out_start[d] = pieces[d]->out_start;
          region.start.push_back(pieces[d]->start);
          region.step.push_back((*request.selection)[d].step);
          region.count.push_back(pieces[d]->count);
        }
        Source source{*store_, chunk_key(chunk_index)};
        read_region(*chain_, source, region, request.out, request.out_shape, out_start);
      });
}

namespace {

// Writes of one chunk (or shard) in this process take turns: a write that covers part of it
// reads, changes and stores it back, and two at once (threads writing neighbouring time steps
// of one shard) would each store their own change over the other's. Striped by the value's
// whole URL, so that Array objects of one array share the lock however its store was opened
// (a group's store and key "t2m/c/0", or the array's own store and key "c/0").
std::unique_lock<std::mutex> take_chunk_write_turn(const Store& store, const std::string& key) {
  struct Locks {
    std::array<std::mutex, 256> stripes;
    Locks() {
      // A forked child has none of the parent's threads: stripes they held are made anew.
      ForkGate::add_fork_handlers([] {}, [] {},
                                  [this] {
                                    for (auto& stripe : stripes) new (&stripe) std::mutex();
                                  });
    }
  };
  static Locks& locks = *new Locks();  // never destroyed: the fork handler refers to it
  std::string url = store.url();
  if (!url.empty() && url.back() != '/') url += '/';
  std::mutex& stripe = locks.stripes[std::hash<std::string>()(url + key) % locks.stripes.size()];
  // The holder may encode a shard on the pool, giving up its fork pass there (and waiting, if a
  // fork is under way, for the fork to end): wait for the turn without a pass, or the fork would
  // wait for this thread and this thread for the holder.
  ForkGate::Release waiting;
  return std::unique_lock(stripe);
}

}  // namespace

void Array::write(const Selection& selection, const void* in_ptr) const {
  const ArrayMetadata& meta = *metadata_;
  check_selection(selection, meta);
  const uint8_t* in = static_cast<const uint8_t*>(in_ptr);
  const size_t rank = meta.rank();
  const size_t item = meta.dtype.size();
  std::vector<uint64_t> in_shape(rank);
  Plan plan;
  for (size_t d = 0; d < rank; ++d) {
    in_shape[d] = selection[d].count();
    if (in_shape[d] == 0) return;
    plan.pieces.push_back(split(selection[d], meta.chunk_shape[d]));
  }
  const ChunkSpec& spec = chain_->spec();
  ThreadPool::for_reads(store_->read_concurrency()).parallel_for(plan.size(), [&](size_t task) {
    std::vector<const Piece*> pieces;
    plan.task(task, pieces);
    std::vector<uint64_t> chunk_index(rank), in_start(rank), start(rank), step(rank), count(rank);
    bool covers_valid = true, full = true;
    for (size_t d = 0; d < rank; ++d) {
      chunk_index[d] = pieces[d]->chunk;
      in_start[d] = pieces[d]->out_start;
      start[d] = pieces[d]->start;
      step[d] = selection[d].step;
      count[d] = pieces[d]->count;
      uint64_t origin = chunk_index[d] * meta.chunk_shape[d];
      uint64_t valid = std::min(meta.chunk_shape[d], meta.shape[d] - origin);
      covers_valid =
          covers_valid && start[d] == 0 && (step[d] == 1 || count[d] == 1) && count[d] == valid;
      full = full && count[d] == meta.chunk_shape[d] && start[d] == 0 &&
             (step[d] == 1 || count[d] == 1);
    }
    std::string key = chunk_key(chunk_index);
    const std::unique_lock turn = take_chunk_write_turn(*store_, key);
    const uint8_t* values;
    ScratchBuffer chunk;
    if (full && is_contiguous(count, in_shape)) {
      values = in + element_offset(in_start, in_shape) * item;  // encode straight from the input
    } else {
      chunk.bytes().resize(spec.num_bytes());
      if (covers_valid) {
        if (!full) fill_with(chunk.data(), spec.num_elements(), spec.fill, spec.dtype);
      } else {
        ScratchBuffer existing;
        if (store_->get_into(key, ByteRange::all(), existing.bytes())) {
          try {
            chain_->decode(existing.bytes(), chunk.data());
          } catch (...) {
            rethrow_with_context(store_->url() + "/" + key);
          }
        } else {
          fill_with(chunk.data(), spec.num_elements(), spec.fill, spec.dtype);
        }
      }
      copy_box(in, BoxRef{in_shape, in_start}, chunk.data(), BoxRef{spec.shape, start, step}, count,
               item);
      values = chunk.data();
    }
    if (!spec.fill.is_null && all_equal_fill(values, spec.num_elements(), spec.fill, spec.dtype)) {
      store_->erase(key);
      return;
    }
    Bytes encoded = chain_->encode(values);
    store_->set(key, encoded);
  });
}

StorageInfo Array::storage_info() const {
  StorageInfo info;
  info.objects_total = checked_product(metadata_->grid_shape(), 1, "the number of chunks");
  std::string prefix = path_.empty() ? "" : path_ + "/";
  if (!store_->can_list()) {
    info.known = false;
    return info;
  }
  // Only the keys of the chunk grid count: not metadata, nor stray files (".DS_Store", notes).
  const std::vector<uint64_t> grid = metadata_->grid_shape();
  for (const auto& [key, size] : store_->list_sizes(prefix)) {
    const std::string_view name = std::string_view(key).substr(prefix.size());
    const auto index = metadata_->key_encoding.decode(name, grid.size());
    if (!index) continue;
    bool on_grid = true;
    for (size_t d = 0; d < grid.size(); ++d) on_grid = on_grid && (*index)[d] < grid[d];
    if (!on_grid) continue;
    info.stored_bytes += size;
    ++info.objects_present;
  }
  return info;
}

}  // namespace zfeed::zarr
