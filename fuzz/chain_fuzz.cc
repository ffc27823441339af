// libFuzzer target: whole codec chains (transpose, bytes in both byte orders, crc32c, and a
// compressor) decoding fuzzed bytes into a fixed chunk shape. The first input byte picks the
// chain; the rest is the encoded chunk. Where a decode succeeds, encoding the values and
// decoding again must give the same values.
// Seeds: fuzz/corpus/chain_fuzz (fuzz/make_corpus.py).
#include <vector>

#include "fuzz_util.h"

namespace {

using zfeed::ChunkSpec;
using zfeed::CodecChain;
using zfeed::DataType;
using zfeed::DataTypeId;
using zfeed::Json;

struct ChainCase {
  DataTypeId dtype;
  std::vector<uint64_t> shape;
  const char* codecs;
};

// Keep in step with CHAINS in fuzz/make_corpus.py.
const ChainCase kCases[] = {
    {DataTypeId::kInt32,
     {8, 16},
     R"([{"name": "transpose", "configuration": {"order": [1, 0]}},
         {"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"}])"},
    {DataTypeId::kUInt16,
     {3, 5, 7},
     R"([{"name": "transpose", "configuration": {"order": [2, 0, 1]}},
         {"name": "bytes", "configuration": {"endian": "little"}}])"},
    {DataTypeId::kFloat64,
     {16},
     R"([{"name": "bytes", "configuration": {"endian": "big"}},
         {"name": "gzip", "configuration": {"level": 1}}, {"name": "crc32c"}])"},
    {DataTypeId::kComplex64,
     {4, 6},
     R"([{"name": "transpose", "configuration": {"order": [1, 0]}},
         {"name": "bytes", "configuration": {"endian": "big"}},
         {"name": "zstd", "configuration": {"level": 1, "checksum": true}}])"},
    {DataTypeId::kUInt8,
     {10, 10},
     R"([{"name": "bytes"}, {"name": "crc32c"}, {"name": "crc32c"}])"},
    {DataTypeId::kInt16,
     {2, 3, 4, 5},
     R"([{"name": "transpose", "configuration": {"order": [3, 1, 0, 2]}},
         {"name": "transpose", "configuration": {"order": [1, 0, 3, 2]}},
         {"name": "bytes", "configuration": {"endian": "little"}},
         {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 1, "shuffle": "bitshuffle", "typesize": 2}}])"},
};
constexpr size_t kNumCases = sizeof(kCases) / sizeof(kCases[0]);

const std::vector<CodecChain>& chains() {
  static const std::vector<CodecChain> instance = [] {
    std::vector<CodecChain> out;
    for (const auto& c : kCases) {
      out.push_back(
          CodecChain::from_json(Json::parse(c.codecs), ChunkSpec{DataType{c.dtype}, c.shape, {}}));
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
  zfeed::ByteView encoded(data + 1, size - 1);
  const uint64_t n = chain.spec().num_bytes();
  zfeed::Bytes out(n);
  if (!expect_error_or_success([&] { chain.decode(encoded, out.data()); })) return 0;
  zfeed::Bytes reencoded = chain.encode(out.data());
  zfeed::Bytes again(n);
  bool ok = expect_error_or_success([&] { chain.decode(reencoded, again.data()); });
  check(ok, chain.describe() + ": decoding its own encoding failed");
  check(same_bytes(out.data(), again.data(), n),
        chain.describe() + ": encode/decode round trip changed values");
  return 0;
}
