// libFuzzer target: the numcodecs.lz4 decoder (a 4-byte size header and an LZ4 block).
// Seeds: fuzz/corpus/lz4_fuzz (fuzz/make_corpus.py).
#include "fuzz_util.h"

namespace {

const zfeed::fuzz::BytesCodecUnderTest& under_test() {
  static const auto instance = zfeed::fuzz::make_bytes_codec(
      zfeed::Json::parse(R"({"name": "numcodecs.lz4", "configuration": {"acceleration": 1}})"),
      4096);
  return instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zfeed::fuzz::fuzz_bytes_codec(under_test(), data, size);
  return 0;
}
