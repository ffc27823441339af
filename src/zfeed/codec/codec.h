// Codecs, in the three steps TensorStore's codec/codec.h describes: a JSON spec, a codec
// resolved against the data type and chunk shape at its place in the chain (the factory's job),
// and the work of encoding and decoding one chunk. The chain follows the Zarr v3 spec: zero or
// more array->array codecs, exactly one array->bytes codec, zero or more bytes->bytes codecs.
// Each codec registers itself by name beside its own code (ZFEED_REGISTER_CODEC).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zfeed/codec/data_type.h"
#include "zfeed/util/bytes.h"
#include "zfeed/util/json.h"

namespace zfeed {

// What a codec sees at its place in the chain: the element type, the chunk shape (C order,
// native byte order in memory) and the fill value.
struct ChunkSpec {
  DataType dtype;
  std::vector<uint64_t> shape;
  FillValue fill;

  uint64_t num_elements() const;
  uint64_t num_bytes() const { return num_elements() * dtype.size(); }
};

// "chunk holds 60 bytes, expected 64 for shape [4, 4] of float32": an uncompressed chunk of the
// wrong size, met by the bytes codec or by a partial read.
std::string chunk_size_mismatch(uint64_t size, const ChunkSpec& spec);

enum class CodecKind { kArrayToArray, kArrayToBytes, kBytesToBytes };

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecKind kind() const = 0;
  virtual std::string name() const = 0;
  // The {"name": ..., "configuration": ...} object that recreates this codec.
  virtual Json to_json() const = 0;
  // A short form for people: "zstd(level=3)".
  virtual std::string describe() const;
};

class ArrayToArrayCodec : public Codec {
 public:
  CodecKind kind() const final { return CodecKind::kArrayToArray; }
  virtual ChunkSpec encoded_spec(const ChunkSpec& decoded) const = 0;
  // Both buffers hold num_bytes() of the decoded spec; they do not overlap.
  virtual void encode(const uint8_t* decoded, const ChunkSpec& decoded_spec,
                      uint8_t* encoded) const = 0;
  virtual void decode(const uint8_t* encoded, const ChunkSpec& decoded_spec,
                      uint8_t* decoded) const = 0;
};

class ArrayToBytesCodec : public Codec {
 public:
  CodecKind kind() const final { return CodecKind::kArrayToBytes; }
  // `chunk` holds spec.num_bytes() native C-order bytes.
  virtual Bytes encode(const uint8_t* chunk, const ChunkSpec& spec) const = 0;
  // Decodes into `out` (spec.num_bytes()); errors name the fault, the caller adds the key.
  virtual void decode(ByteView encoded, const ChunkSpec& spec, uint8_t* out) const = 0;
  // True if the encoded bytes are the chunk's memory as it is (bytes in native order), so the
  // bytes->bytes codecs may decode straight into the caller's buffer.
  virtual bool is_native_layout(const ChunkSpec&) const { return false; }
  // The encoded size when it does not depend on the values (needed for shard index codecs).
  virtual std::optional<uint64_t> encoded_size(const ChunkSpec&) const { return std::nullopt; }
  // The most the encoded size can be, where known (a shard: its index and inner chunks' bounds);
  // bounds what a compressor after this codec may decode to.
  virtual std::optional<uint64_t> max_encoded_size(const ChunkSpec& spec) const {
    return encoded_size(spec);
  }
};

class BytesToBytesCodec : public Codec {
 public:
  CodecKind kind() const final { return CodecKind::kBytesToBytes; }
  virtual Bytes encode(ByteView decoded) const = 0;
  // Decodes into exactly `out`: an error if the stream holds more or fewer bytes.
  virtual void decode_into(ByteView encoded, MutableByteView out) const = 0;
  // Decodes when the size is not known in advance; more than `max_size` bytes is an error
  // (a decompression bomb).
  virtual Bytes decode(ByteView encoded, uint64_t max_size) const = 0;
  // Codecs that only check or strip (crc32c) return a view into `encoded` instead of copying.
  virtual std::optional<ByteView> decode_view(ByteView) const { return std::nullopt; }
  // Decodes only the first out.size() bytes of the stream (the rest is neither decoded nor
  // checked), for reads that need only the start of a chunk. False where the codec cannot stop
  // early; an error where the stream ends before out.size() bytes.
  virtual bool decode_prefix(ByteView, MutableByteView) const { return false; }
  virtual bool can_decode_prefix() const { return false; }
  // True for codecs that only check or strip (decode_view always answers, or throws).
  virtual bool only_checks() const { return false; }
  virtual std::optional<uint64_t> encoded_size(uint64_t) const { return std::nullopt; }
  // An upper bound on the encoded size, used to bound intermediate decodes.
  virtual uint64_t max_encoded_size(uint64_t decoded_size) const = 0;
};

// Builds a codec from its configuration (an empty object when absent) for the spec it will see.
using CodecFactory =
    std::function<std::shared_ptr<Codec>(const Json& configuration, const ChunkSpec& spec)>;

void register_codec(std::string name, CodecFactory factory);
bool is_codec_registered(std::string_view name);
std::vector<std::string> registered_codecs();

struct CodecRegistration {
  CodecRegistration(std::string name, CodecFactory factory) {
    register_codec(std::move(name), std::move(factory));
  }
};
#define ZFEED_CONCAT_INNER(a, b) a##b
#define ZFEED_CONCAT(a, b) ZFEED_CONCAT_INNER(a, b)
#define ZFEED_REGISTER_CODEC(name, factory) \
  static const ::zfeed::CodecRegistration ZFEED_CONCAT(codec_registration_, __LINE__)(name, factory)

// Helpers for codec factories: read configuration fields with errors that name the codec.
class CodecConfig {
 public:
  CodecConfig(std::string codec, const Json& configuration);
  const Json* find(std::string_view field) const;
  const Json& require(std::string_view field) const;
  int64_t integer(std::string_view field, int64_t low, int64_t high,
                  std::optional<int64_t> fallback) const;
  std::string string(std::string_view field, std::optional<std::string> fallback) const;
  // Errors for fields the codec does not know, unless marked "must_understand": false.
  void reject_unknown(std::initializer_list<std::string_view> known) const;
  [[noreturn]] void fail(std::string_view why) const;

 private:
  std::string codec_;
  const Json& configuration_;
};

class ShardingCodec;

// A resolved codec chain for one chunk spec.
class CodecChain {
 public:
  CodecChain() = default;
  // `codecs` is the metadata's "codecs" array.
  static CodecChain from_json(const Json& codecs, const ChunkSpec& spec);
  Json to_json() const;
  std::string describe() const;  // "bytes(little) > zstd(level=3) > crc32c"

  const ChunkSpec& spec() const { return spec_; }
  Bytes encode(const uint8_t* chunk) const;
  // Decodes one encoded chunk into `out` (spec().num_bytes() bytes, native C order).
  void decode(ByteView encoded, uint8_t* out) const;
  // Decodes only the first `size` bytes of the chunk (native C order) into `out`, decoding no
  // more of the stream than that needs. False (nothing written) where the chain cannot: a
  // transpose, a non-native bytes codec, or a compressor that cannot stop early (only zstd can).
  bool decode_prefix(ByteView encoded, uint8_t* out, uint64_t size) const;
  // Whether decode_prefix can (true also for uncompressed chains).
  bool can_decode_prefix() const;
  // Whether decode_prefix also does less work than decode: a compressor that stops early (an
  // uncompressed chunk is read whole either way).
  bool prefix_saves_work() const;
  // Whether decoding `part` bytes of a chunk of `whole` by decode_prefix is worth it: above 7/8 of
  // it, decoding all of it in one call costs as little as streaming only the start.
  static bool prefix_worth_it(uint64_t part, uint64_t whole) { return part * 8 <= whole * 7; }

  // True if the stored bytes are exactly the chunk in memory (a single native bytes codec).
  bool is_identity() const;
  // The sharding codec when it is the whole chain (so inner chunks can be read by range).
  const ShardingCodec* sharding() const;
  std::optional<uint64_t> encoded_size() const;
  // The most an encoded chunk can be, where the codecs bound it.
  std::optional<uint64_t> max_encoded_size() const;
  const std::vector<std::shared_ptr<const Codec>>& codecs() const { return all_; }

 private:
  ChunkSpec spec_;
  std::vector<std::shared_ptr<const ArrayToArrayCodec>> array_to_array_;
  std::vector<ChunkSpec> array_to_array_specs_;  // the decoded spec each one sees
  std::shared_ptr<const ArrayToBytesCodec> array_to_bytes_;
  ChunkSpec array_to_bytes_spec_;
  std::vector<std::shared_ptr<const BytesToBytesCodec>> bytes_to_bytes_;
  std::vector<std::shared_ptr<const Codec>> all_;
};

}  // namespace zfeed
