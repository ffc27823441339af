// libFuzzer target: the S3 ListObjectsV2 response parser (store/http_store.h), which reads what
// a remote server sends. Any input either parses into as many keys as sizes or throws
// zfeed::Error; nothing else.
// Seeds: fuzz/corpus/list_objects_fuzz (fuzz/make_corpus.py).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "zfeed/store/http_store.h"
#include "zfeed/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const zfeed::ListPage page =
        zfeed::parse_list_objects(std::string_view(reinterpret_cast<const char*>(data), size));
    if (page.keys.size() != page.sizes.size()) std::abort();
  } catch (const zfeed::Error&) {
  }
  return 0;
}
