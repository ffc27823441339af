// libFuzzer target: the sharding_indexed codec with a fixed inner grid. The first input byte
// picks the configuration; the rest is a whole shard. Its index bytes go through decode_index
// (every entry it accepts must lie inside the shard), and the whole shard through decode.
// Seeds: fuzz/corpus/shard_index_fuzz (fuzz/make_corpus.py).
#include <optional>
#include <vector>

#include "fuzz_util.h"
#include "zfeed/codec/sharding.h"

namespace {

using zfeed::ChunkSpec;
using zfeed::CodecChain;
using zfeed::DataType;
using zfeed::DataTypeId;
using zfeed::Json;

struct ShardCase {
  DataTypeId dtype;
  std::vector<uint64_t> shape;
  const char* configuration;
};

// Keep in step with SHARDS in fuzz/make_corpus.py.
const ShardCase kCases[] = {
    // Index at the end with the default index codecs (bytes + crc32c); a 2 x 3 inner grid.
    {DataTypeId::kUInt16,
     {4, 6},
     R"({"chunk_shape": [2, 2], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
         "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
         "index_location": "end"})"},
    // Index at the start without a checksum, so that fuzzed entries reach the bounds checks.
    {DataTypeId::kUInt16,
     {4, 6},
     R"({"chunk_shape": [2, 2], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
         "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
         "index_location": "start"})"},
    // Compressed inner chunks that split only the first dimension (the contiguous path).
    {DataTypeId::kFloat32,
     {8, 4},
     R"({"chunk_shape": [2, 4],
         "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}],
         "index_codecs": [{"name": "bytes", "configuration": {"endian": "big"}}],
         "index_location": "end"})"},
    // A shard inside a shard.
    {DataTypeId::kUInt8,
     {4, 4},
     R"({"chunk_shape": [2, 4],
         "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 2],
                     "codecs": [{"name": "bytes"}],
                     "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}],
         "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
         "index_location": "start"})"},
    // A shard inside a shard, neither split along the first dimension only (both copy boxes).
    {DataTypeId::kUInt8,
     {4, 4},
     R"({"chunk_shape": [2, 2],
         "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1],
                     "codecs": [{"name": "bytes"}],
                     "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}],
         "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]})"},
};
constexpr size_t kNumCases = sizeof(kCases) / sizeof(kCases[0]);

const std::vector<CodecChain>& chains() {
  static const std::vector<CodecChain> instance = [] {
    std::vector<CodecChain> out;
    for (const auto& c : kCases) {
      Json codecs = Json::array(
          {{{"name", "sharding_indexed"}, {"configuration", Json::parse(c.configuration)}}});
      out.push_back(CodecChain::from_json(codecs, ChunkSpec{DataType{c.dtype}, c.shape, {}}));
    }
    return out;
  }();
  return instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zfeed::fuzz;
  if (size == 0) return 0;
  const CodecChain& chain = chains()[data[0] % kNumCases];
  const zfeed::ShardingCodec& sharding = *chain.sharding();
  zfeed::ByteView shard(data + 1, size - 1);

  // The index alone, as a partial read fetches it: bounded by the shard's size, and unbounded.
  if (shard.size() >= sharding.index_size()) {
    zfeed::ByteView index_bytes = sharding.index_at_end() ? shard.last(sharding.index_size())
                                                          : shard.first(sharding.index_size());
    zfeed::ShardIndex index;
    if (expect_error_or_success(
            [&] { index = sharding.decode_index(index_bytes, shard.size()); })) {
      check(index.entries.size() == 2 * sharding.num_inner_chunks(),
            "shard index: wrong number of entries");
      for (size_t chunk = 0; chunk < sharding.num_inner_chunks(); ++chunk) {
        if (index.is_empty(chunk)) continue;
        check(index.offset(chunk) <= shard.size() &&
                  index.nbytes(chunk) <= shard.size() - index.offset(chunk),
              "shard index: accepted an entry outside the shard");
      }
    }
    expect_error_or_success([&] { sharding.decode_index(index_bytes, std::nullopt); });
  }
  // Index bytes of the wrong size must be an error.
  expect_error_or_success([&] { sharding.decode_index(shard, shard.size()); });

  // The whole shard.
  const uint64_t n = chain.spec().num_bytes();
  zfeed::Bytes out(n);
  if (!expect_error_or_success([&] { chain.decode(shard, out.data()); })) return 0;
  zfeed::Bytes reencoded = chain.encode(out.data());
  zfeed::Bytes again(n);
  check(expect_error_or_success([&] { chain.decode(reencoded, again.data()); }),
        "sharding: decoding its own encoding failed");
  check(same_bytes(out.data(), again.data(), n),
        "sharding: encode/decode round trip changed values");
  return 0;
}
