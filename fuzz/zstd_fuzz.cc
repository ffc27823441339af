// libFuzzer target: the zstd decoder (frames with and without a content size, several frames,
// checksums). Seeds: fuzz/corpus/zstd_fuzz (fuzz/make_corpus.py).
#include "fuzz_util.h"

namespace {

const zfeed::fuzz::BytesCodecUnderTest& under_test() {
  static const auto instance = zfeed::fuzz::make_bytes_codec(
      zfeed::Json::parse(R"({"name": "zstd", "configuration": {"level": 1, "checksum": false}})"),
      4096);
  return instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zfeed::fuzz::fuzz_bytes_codec(under_test(), data, size);
  return 0;
}
