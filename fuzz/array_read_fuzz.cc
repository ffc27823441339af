// libFuzzer target: Array::read over a memory store that holds a fixed array's metadata and
// fuzzed bytes as its first chunk ("c/0/0"; "0.0" for the v2 case). The first input byte picks
// the array; the rest is the chunk. Each input is read whole and through a strided partial
// selection (which reads a sharded chunk's index and inner chunks by range).
// Seeds: fuzz/corpus/array_read_fuzz (fuzz/make_corpus.py).
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "zfeed/store/store.h"
#include "zfeed/zarr/array.h"

namespace {

using namespace zfeed::fuzz;
using zfeed::zarr::Array;
using zfeed::zarr::Selection;

struct ArrayCase {
  const char* metadata_key;
  const char* metadata;
  const char* chunk_key;
};

// Keep in step with ARRAYS in fuzz/make_corpus.py. Every array is 2-D and its first chunk is
// read (shapes are larger than one chunk so the partial selection crosses chunk edges).
const ArrayCase kCases[] = {
    {"zarr.json",
     R"({"zarr_format": 3, "node_type": "array", "shape": [6, 10], "data_type": "uint16",
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [6, 8]}},
      "chunk_key_encoding": {"name": "default"}, "fill_value": 7,
      "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}]})",
     "c/0/0"},
    {"zarr.json",
     R"({"zarr_format": 3, "node_type": "array", "shape": [8, 8], "data_type": "float32",
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
      "chunk_key_encoding": {"name": "default"}, "fill_value": "NaN",
      "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 4],
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end"}}]})",
     "c/0/0"},
    {"zarr.json", R"({"zarr_format": 3, "node_type": "array", "shape": [8, 8], "data_type": "int8",
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
      "chunk_key_encoding": {"name": "default"}, "fill_value": -1,
      "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 8],
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 2],
          "codecs": [{"name": "bytes"}],
          "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
          "index_location": "start"}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_location": "start"}}]})",
     "c/0/0"},
    {".zarray",
     R"({"zarr_format": 2, "shape": [5, 9], "chunks": [5, 7], "dtype": ">i4", "order": "F",
      "fill_value": 0, "filters": null,
      "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}})",
     "0.0"},
    {"zarr.json",
     R"({"zarr_format": 3, "node_type": "array", "shape": [4, 12], "data_type": "float64",
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
      "chunk_key_encoding": {"name": "default"}, "fill_value": 0.5,
      "codecs": [{"name": "transpose", "configuration": {"order": [1, 0]}},
                 {"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"}]})",
     "c/0/0"},
    {"zarr.json", R"({"zarr_format": 3, "node_type": "array", "shape": [8, 8], "data_type": "int16",
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
      "chunk_key_encoding": {"name": "default"}, "fill_value": 3,
      "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [4, 4],
        "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 2],
          "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
          "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]})",
     "c/0/0"},
    // Uncompressed: a partial selection reads only its bytes of the chunk, by range.
    {"zarr.json",
     R"({"zarr_format": 3, "node_type": "array", "shape": [6, 10], "data_type": "uint32",
      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [6, 8]}},
      "chunk_key_encoding": {"name": "default"}, "fill_value": 5,
      "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]})",
     "c/0/0"},
};
constexpr size_t kNumCases = sizeof(kCases) / sizeof(kCases[0]);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const ArrayCase& c = kCases[data[0] % kNumCases];
  auto store = zfeed::make_memory_store();
  store->set(c.metadata_key, zfeed::as_bytes(c.metadata));
  store->set(c.chunk_key, zfeed::ByteView(data + 1, size - 1));
  Array array = Array::open(store);  // fixed, valid metadata: an error here is a finding
  const auto& meta = array.metadata();
  const size_t item = meta.dtype.size();

  Selection all = array.full_selection();
  std::vector<uint8_t> whole(meta.num_elements() * item);
  expect_error_or_success([&] { array.read(all, whole.data()); });

  // Strided, offset, and crossing the first chunk's edge in the last dimension.
  Selection part;
  for (size_t d = 0; d < meta.rank(); ++d) part.push_back({1, meta.shape[d], d == 0 ? 2u : 3u});
  uint64_t count = 1;
  for (const auto& s : part) count *= s.count();
  std::vector<uint8_t> some(count * item);
  expect_error_or_success([&] { array.read(part, some.data()); });

  // One element inside the first chunk.
  Selection one;
  for (size_t d = 0; d < meta.rank(); ++d) one.push_back({1, 2, 1});
  std::vector<uint8_t> single(item);
  expect_error_or_success([&] { array.read(one, single.data()); });
  return 0;
}
