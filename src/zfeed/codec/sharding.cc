#include "zfeed/codec/sharding.h"

#include <cstring>

#include "zfeed/util/box_copy.h"
#include "zfeed/util/error.h"
#include "zfeed/util/scratch.h"
#include "zfeed/util/thread_pool.h"

namespace zfeed {

namespace {

// Per-dimension grid position of inner chunk `chunk` (C order).
std::vector<uint64_t> grid_position(uint64_t chunk, const std::vector<uint64_t>& grid) {
  std::vector<uint64_t> position(grid.size());
  for (size_t d = grid.size(); d-- > 0;) {
    position[d] = chunk % grid[d];
    chunk /= grid[d];
  }
  return position;
}

}  // namespace

ShardingCodec::ShardingCodec(const ChunkSpec& shard_spec, std::vector<uint64_t> inner_shape,
                             const Json& codecs, const Json& index_codecs, bool index_at_end)
    : shard_spec_(shard_spec), inner_shape_(std::move(inner_shape)), index_at_end_(index_at_end) {
  chunks_per_shard_.resize(inner_shape_.size());
  num_inner_chunks_ = 1;
  for (size_t d = 0; d < inner_shape_.size(); ++d) {
    chunks_per_shard_[d] = shard_spec.shape[d] / inner_shape_[d];
    num_inner_chunks_ *= chunks_per_shard_[d];
  }
  inner_ =
      CodecChain::from_json(codecs, ChunkSpec{shard_spec.dtype, inner_shape_, shard_spec.fill});
  std::vector<uint64_t> index_shape = chunks_per_shard_;
  index_shape.push_back(2);
  // Two uint64 per inner chunk: the index's byte count must fit 64 bits like any chunk's.
  checked_product(index_shape, sizeof(uint64_t), "codec sharding_indexed: the shard index");
  index_chain_ = CodecChain::from_json(index_codecs,
                                       ChunkSpec{DataType{DataTypeId::kUInt64}, index_shape, {}});
  auto size = index_chain_.encoded_size();
  if (!size) {
    throw Error(
        "codec sharding_indexed: index_codecs must have a fixed encoded size (such as bytes + "
        "crc32c), got " +
        index_chain_.describe());
  }
  index_size_ = *size;
}

std::optional<uint64_t> ShardingCodec::max_encoded_size(const ChunkSpec&) const {
  const std::optional<uint64_t> inner = inner_.max_encoded_size();
  if (!inner) return std::nullopt;
  // Saturated: a bound past 64 bits bounds nothing.
  if (*inner != 0 && num_inner_chunks_ > (UINT64_MAX - index_size_) / *inner) return UINT64_MAX;
  return index_size_ + num_inner_chunks_ * *inner;
}

Json ShardingCodec::to_json() const {
  return {{"name", "sharding_indexed"},
          {"configuration",
           {{"chunk_shape", inner_shape_},
            {"codecs", inner_.to_json()},
            {"index_codecs", index_chain_.to_json()},
            {"index_location", index_at_end_ ? "end" : "start"}}}};
}

std::string ShardingCodec::describe() const {
  std::string shape;
  for (uint64_t extent : inner_shape_) shape += (shape.empty() ? "" : "x") + std::to_string(extent);
  return "sharding_indexed(inner " + shape + ": " + inner_.describe() + ")";
}

std::string ShardingCodec::describe_inner(size_t chunk) const {
  auto position = grid_position(chunk, chunks_per_shard_);
  std::string text = "inner chunk [";
  for (size_t d = 0; d < position.size(); ++d)
    text += (d ? ", " : "") + std::to_string(position[d]);
  return text + "]";
}

ShardIndex ShardingCodec::decode_index(ByteView index_bytes,
                                       std::optional<uint64_t> shard_size) const {
  if (index_bytes.size() != index_size_) {
    throw Error("shard index is " + std::to_string(index_bytes.size()) + " bytes, expected " +
                std::to_string(index_size_));
  }
  ShardIndex index;
  index.entries.resize(num_inner_chunks_ * 2);
  try {
    index_chain_.decode(index_bytes, reinterpret_cast<uint8_t*>(index.entries.data()));
  } catch (const Error& e) {
    throw Error(std::string("shard index: ") + e.what());
  }
  for (size_t chunk = 0; chunk < num_inner_chunks_; ++chunk) {
    if (index.is_empty(chunk)) continue;
    uint64_t offset = index.offset(chunk), nbytes = index.nbytes(chunk);
    if (offset == ShardIndex::kEmpty || nbytes == ShardIndex::kEmpty) {
      throw Error("shard index entry for " + describe_inner(chunk) +
                  " is half the empty marker (offset " + std::to_string(offset) + ", " +
                  std::to_string(nbytes) + " bytes)");
    }
    uint64_t end;
    bool overflow = __builtin_add_overflow(offset, nbytes, &end);
    if (overflow || (shard_size && end > *shard_size)) {
      throw Error("shard index entry for " + describe_inner(chunk) + " points to bytes " +
                  std::to_string(offset) + ".." +
                  (overflow ? std::string("(overflow)") : std::to_string(end)) + " outside the " +
                  (shard_size ? std::to_string(*shard_size) + "-byte " : std::string()) + "shard");
    }
  }
  return index;
}

void ShardingCodec::decode(ByteView encoded, const ChunkSpec& spec, uint8_t* out) const {
  if (encoded.size() < index_size_) {
    throw Error("shard of " + std::to_string(encoded.size()) + " bytes is too short for its " +
                std::to_string(index_size_) + "-byte index");
  }
  ByteView index_bytes = index_at_end_ ? encoded.last(index_size_) : encoded.first(index_size_);
  ShardIndex index = decode_index(index_bytes, encoded.size());
  const size_t item = spec.dtype.size();
  const uint64_t inner_bytes = inner_.spec().num_bytes();
  // When the inner chunks split only the first dimension, each one is contiguous in the shard.
  bool contiguous = true;
  for (size_t d = 1; d < chunks_per_shard_.size(); ++d)
    contiguous = contiguous && chunks_per_shard_[d] == 1;
  ThreadPool::shared().parallel_for(num_inner_chunks_, [&](size_t chunk) {
    auto position = grid_position(chunk, chunks_per_shard_);
    std::vector<uint64_t> origin(position.size());
    for (size_t d = 0; d < position.size(); ++d) origin[d] = position[d] * inner_shape_[d];
    BoxRef dst{spec.shape, origin};
    BoxRef src{inner_shape_, std::vector<uint64_t>(inner_shape_.size(), 0)};
    if (index.is_empty(chunk)) {
      fill_box(out, dst, inner_shape_, spec.fill.bytes.data(), item);
      return;
    }
    ByteView bytes = encoded.subspan(index.offset(chunk), index.nbytes(chunk));
    try {
      if (contiguous) {
        inner_.decode(bytes, out + chunk * inner_bytes);
      } else {
        // Not a single thread_local buffer: a nested shard decodes on this thread too.
        ScratchBuffer scratch(inner_bytes);
        inner_.decode(bytes, scratch.data());
        std::vector<uint64_t> zero(inner_shape_.size(), 0);
        copy_box(scratch.data(), BoxRef{inner_shape_, zero}, out, dst, inner_shape_, item);
      }
    } catch (...) {
      rethrow_with_context(describe_inner(chunk));
    }
    (void)src;
  });
}

Bytes ShardingCodec::encode(const uint8_t* shard, const ChunkSpec& spec) const {
  const size_t item = spec.dtype.size();
  const uint64_t inner_bytes = inner_.spec().num_bytes();
  std::vector<Bytes> encoded(num_inner_chunks_);
  // One byte per flag: tasks set them concurrently, and std::vector<bool> packs neighbours into
  // one word, so concurrent writes to it lose updates.
  std::vector<uint8_t> present(num_inner_chunks_, 0);
  ThreadPool::shared().parallel_for(num_inner_chunks_, [&](size_t chunk) {
    auto position = grid_position(chunk, chunks_per_shard_);
    std::vector<uint64_t> origin(position.size());
    for (size_t d = 0; d < position.size(); ++d) origin[d] = position[d] * inner_shape_[d];
    Bytes values(inner_bytes);
    std::vector<uint64_t> zero(inner_shape_.size(), 0);
    copy_box(shard, BoxRef{spec.shape, origin}, values.data(), BoxRef{inner_shape_, zero},
             inner_shape_, item);
    // Inner chunks that hold only the fill value are left out, as zarr-python does.
    if (all_equal_fill(values.data(), inner_.spec().num_elements(), spec.fill, spec.dtype)) return;
    encoded[chunk] = inner_.encode(values.data());
    present[chunk] = 1;
  });
  std::vector<uint64_t> entries(num_inner_chunks_ * 2, ShardIndex::kEmpty);
  uint64_t offset = index_at_end_ ? 0 : index_size_;
  uint64_t total = index_size_;
  for (size_t chunk = 0; chunk < num_inner_chunks_; ++chunk) {
    if (!present[chunk]) continue;
    entries[2 * chunk] = offset;
    entries[2 * chunk + 1] = encoded[chunk].size();
    offset += encoded[chunk].size();
    total += encoded[chunk].size();
  }
  Bytes index = index_chain_.encode(reinterpret_cast<const uint8_t*>(entries.data()));
  Bytes out(total);
  uint8_t* cursor = out.data();
  if (!index_at_end_) {
    std::memcpy(cursor, index.data(), index.size());
    cursor += index.size();
  }
  for (size_t chunk = 0; chunk < num_inner_chunks_; ++chunk) {
    if (!present[chunk] || encoded[chunk].empty()) continue;
    std::memcpy(cursor, encoded[chunk].data(), encoded[chunk].size());
    cursor += encoded[chunk].size();
  }
  if (index_at_end_) std::memcpy(cursor, index.data(), index.size());
  return out;
}

namespace {

std::shared_ptr<Codec> make_sharding(const Json& configuration, const ChunkSpec& spec) {
  CodecConfig config("sharding_indexed", configuration);
  config.reject_unknown({"chunk_shape", "codecs", "index_codecs", "index_location"});
  const Json& shape_json = config.require("chunk_shape");
  if (!shape_json.is_array() || shape_json.size() != spec.shape.size()) {
    config.fail("\"chunk_shape\" must be an array of " + std::to_string(spec.shape.size()) +
                " integers, got " + shape_json.dump());
  }
  std::vector<uint64_t> inner_shape;
  for (size_t d = 0; d < shape_json.size(); ++d) {
    uint64_t extent = json_to_uint64(
        shape_json[d], "codec sharding_indexed: chunk_shape[" + std::to_string(d) + "]");
    if (extent == 0) config.fail("\"chunk_shape\" must be positive, got " + shape_json.dump());
    if (spec.shape[d] % extent != 0) {
      config.fail("inner chunk_shape " + shape_json.dump() +
                  " does not divide the shard shape in dimension " + std::to_string(d) + " (" +
                  std::to_string(spec.shape[d]) + ")");
    }
    inner_shape.push_back(extent);
  }
  const Json& codecs = config.require("codecs");
  static const Json kDefaultIndexCodecs = Json::array(
      {{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}, {{"name", "crc32c"}}});
  const Json* index_codecs = config.find("index_codecs");
  std::string location = config.string("index_location", "end");
  if (location != "start" && location != "end") {
    config.fail("\"index_location\" must be \"start\" or \"end\", got \"" + location + "\"");
  }
  return std::make_shared<ShardingCodec>(spec, std::move(inner_shape), codecs,
                                         index_codecs ? *index_codecs : kDefaultIndexCodecs,
                                         location == "end");
}

ZFEED_REGISTER_CODEC("sharding_indexed", make_sharding);

}  // namespace
}  // namespace zfeed
