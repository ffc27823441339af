// libFuzzer target: the blosc decoder (c-blosc 1.x frames of any inner compressor and shuffle),
// and the GPU plan of the same bytes (codec/blosc_gpu_plan.h): every stream it plans lies inside
// the chunk and inside the decoded output.
// Seeds: fuzz/corpus/blosc_fuzz (fuzz/make_corpus.py).
#include <cstdlib>

#include "fuzz_util.h"
#include "zfeed/codec/blosc_gpu_plan.h"

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
  const zfeed::codec::BloscGpuPlan plan = zfeed::codec::plan_blosc_gpu(data, size, 4096);
  for (const auto& stream : plan.streams) {
    if (stream.src_offset + stream.src_size > size || stream.dst_offset + stream.size > 4096)
      std::abort();
  }
  // Either a plan, or a reason (an error for a corrupt chunk), never both or neither.
  if (plan.gpu != (plan.error.empty() && plan.why.empty())) std::abort();
  return 0;
}
