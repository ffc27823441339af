// libFuzzer target: the blosc decoder (c-blosc 1.x frames of any inner compressor and shuffle).
// Seeds: fuzz/corpus/blosc_fuzz (fuzz/make_corpus.py).
#include "fuzz_util.h"

namespace {

const zfeed::fuzz::BytesCodecUnderTest& under_test() {
  static const auto instance = zfeed::fuzz::make_bytes_codec(
      zfeed::Json::parse(
          R"({"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0}})"),
      4096);
  return instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zfeed::fuzz::fuzz_bytes_codec(under_test(), data, size);
  return 0;
}
