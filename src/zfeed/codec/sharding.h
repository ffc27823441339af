// sharding_indexed (array->bytes): a shard holds a grid of inner chunks, each encoded with the
// inner codecs, and an index of (offset, nbytes) per inner chunk, at the start or the end.
// Spec: zarr-specs docs/v3/codecs/sharding-indexed. The Array reads single inner chunks by
// range (index first, then only the chunks needed) through the accessors below.
#pragma once

#include <cstdint>
#include <vector>

#include "zfeed/codec/codec.h"

namespace zfeed {

struct ShardIndex {
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  // (offset, nbytes) per inner chunk, in C order over the inner grid.
  std::vector<uint64_t> entries;

  bool is_empty(size_t chunk) const {
    return entries[2 * chunk] == kEmpty && entries[2 * chunk + 1] == kEmpty;
  }
  uint64_t offset(size_t chunk) const { return entries[2 * chunk]; }
  uint64_t nbytes(size_t chunk) const { return entries[2 * chunk + 1]; }
};

class ShardingCodec final : public ArrayToBytesCodec {
 public:
  ShardingCodec(const ChunkSpec& shard_spec, std::vector<uint64_t> inner_shape, const Json& codecs,
                const Json& index_codecs, bool index_at_end);

  std::string name() const override { return "sharding_indexed"; }
  Json to_json() const override;
  std::string describe() const override;

  Bytes encode(const uint8_t* shard, const ChunkSpec& spec) const override;
  void decode(ByteView encoded, const ChunkSpec& spec, uint8_t* out) const override;
  // The index and every inner chunk at its chain's bound (nullopt where that has none).
  std::optional<uint64_t> max_encoded_size(const ChunkSpec& spec) const override;

  const CodecChain& inner() const { return inner_; }
  const std::vector<uint64_t>& inner_shape() const { return inner_shape_; }
  const std::vector<uint64_t>& chunks_per_shard() const { return chunks_per_shard_; }
  uint64_t num_inner_chunks() const { return num_inner_chunks_; }
  bool index_at_end() const { return index_at_end_; }
  uint64_t index_size() const { return index_size_; }
  // Decodes and checks the index; `shard_size` (when known) bounds every entry.
  ShardIndex decode_index(ByteView index_bytes, std::optional<uint64_t> shard_size) const;
  // C-order position of inner chunk `grid` (per-dimension inner chunk indices).
  std::string describe_inner(size_t chunk) const;

 private:
  ChunkSpec shard_spec_;
  std::vector<uint64_t> inner_shape_;
  std::vector<uint64_t> chunks_per_shard_;
  uint64_t num_inner_chunks_ = 0;
  CodecChain inner_;
  CodecChain index_chain_;
  uint64_t index_size_ = 0;
  bool index_at_end_ = true;
};

}  // namespace zfeed
