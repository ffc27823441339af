// Array and group metadata for Zarr v3 (zarr.json) and v2 (.zarray, .zgroup, .zattrs): parsed,
// validated and written. A v2 array is described by the v3 codec chain that decodes it (order F
// is a transpose, the dtype's byte order a bytes codec, the compressor a bytes->bytes codec), so
// everything after parsing is shared.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zfeed/codec/codec.h"
#include "zfeed/codec/data_type.h"
#include "zfeed/util/json.h"

namespace zfeed::zarr {

struct ChunkKeyEncoding {
  enum class Kind { kDefault, kV2 };
  Kind kind = Kind::kDefault;
  char separator = '/';

  // "c/1/2" (default), "1.2" (v2); "c" and "0" for zero-dimensional arrays.
  std::string encode(std::span<const uint64_t> chunk_index) const;
  // The chunk index of `key` for an array of `rank` dimensions, where encode() of it gives `key`
  // exactly; nullopt for any other key (a stray file beside the chunks).
  std::optional<std::vector<uint64_t>> decode(std::string_view key, size_t rank) const;
  Json to_json() const;
  static ChunkKeyEncoding parse(const Json& value);
};

struct ArrayMetadata {
  int zarr_format = 3;
  std::vector<uint64_t> shape;
  DataType dtype;
  std::vector<uint64_t> chunk_shape;  // the shard shape where the array is sharded
  ChunkKeyEncoding key_encoding;
  FillValue fill_value;
  Json codecs = Json::array();  // the v3 chain (for v2, its equivalent)
  std::optional<std::vector<std::optional<std::string>>> dimension_names;
  Json attributes = Json::object();
  // Fields marked "must_understand": false that zfeed does not use, kept when rewriting.
  Json extra_fields = Json::object();

  // v2 only: what .zarray says, kept so that it is written back as it was.
  Endian v2_endian = Endian::kLittle;
  char v2_order = 'C';
  Json v2_compressor;  // null or {"id": ...}

  static ArrayMetadata parse_v3(const Json& json);
  // `zattrs` may be null (no .zattrs); `_ARRAY_DIMENSIONS` becomes dimension_names.
  static ArrayMetadata parse_v2(const Json& zarray, const Json& zattrs);

  Json to_json_v3() const;
  Json to_zarray() const;
  Json to_zattrs() const;  // attributes plus _ARRAY_DIMENSIONS

  // Checks the fields against each other and resolves the codec chain (throws on any fault).
  void validate() const;

  size_t rank() const { return shape.size(); }
  std::vector<uint64_t> grid_shape() const;  // chunks per dimension
  uint64_t num_elements() const;
  ChunkSpec chunk_spec() const { return ChunkSpec{dtype, chunk_shape, fill_value}; }
  CodecChain codec_chain() const { return CodecChain::from_json(codecs, chunk_spec()); }
};

struct GroupMetadata {
  int zarr_format = 3;
  Json attributes = Json::object();
  // Consolidated metadata: member path (relative to this group) -> that member's metadata
  // document (v3: its zarr.json; v2: {".zarray"/".zgroup": ..., ".zattrs": ...}).
  std::optional<Json> consolidated;

  static GroupMetadata parse_v3(const Json& json);
  Json to_json_v3() const;
};

// Maps a v2 compressor ({"id": "blosc", ...}) to the equivalent v3 codec, and back.
Json v2_compressor_to_codec(const Json& compressor, DataType dtype);
Json codec_to_v2_compressor(const Json& codec);

}  // namespace zfeed::zarr
