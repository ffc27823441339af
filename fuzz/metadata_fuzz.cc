// libFuzzer target: metadata documents as text. zarr.json (array or group, with consolidated
// metadata), .zarray (with an optional .zattrs), and .zmetadata (v2 consolidated) are parsed,
// validated, and their codec chains resolved. Metadata zfeed accepts must survive being written
// and read back.
// Seeds: fuzz/corpus/metadata_fuzz (fuzz/make_corpus.py: real documents from ../shared).
#include <optional>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "zfeed/codec/sharding.h"
#include "zfeed/zarr/metadata.h"

namespace {

using zfeed::Json;
using zfeed::zarr::ArrayMetadata;
using zfeed::zarr::GroupMetadata;
using namespace zfeed::fuzz;

// A sharded chain's index, as a read decodes it (an all-empty index, where small enough to
// hold in memory).
void exercise_sharding(const zfeed::CodecChain& chain) {
  const zfeed::ShardingCodec* sharding = chain.sharding();
  if (sharding == nullptr) return;
  if (sharding->index_size() <= (uint64_t{1} << 16)) {
    std::vector<uint8_t> index_bytes(sharding->index_size(), 0xff);
    expect_error_or_success([&] {
      sharding->decode_index({index_bytes.data(), index_bytes.size()}, std::nullopt);
    });
  }
  exercise_sharding(sharding->inner());
}

void exercise_array(const ArrayMetadata& meta) {
  zfeed::CodecChain chain = meta.codec_chain();
  (void)chain.describe();
  (void)chain.encoded_size();
  exercise_sharding(chain);
  (void)meta.grid_shape();
  std::vector<uint64_t> last = meta.grid_shape();
  for (auto& extent : last) extent = extent ? extent - 1 : 0;
  (void)meta.key_encoding.encode(last);
}

void check_round_trip_v3(const ArrayMetadata& meta) {
  Json written = meta.to_json_v3();
  ArrayMetadata again;
  check(expect_error_or_success([&] { again = ArrayMetadata::parse_v3(written); }),
        "zarr.json written by zfeed does not parse: " + written.dump());
  // A v2 null fill value is written as zero (what missing chunks read as).
  const zfeed::FillValue fill = meta.fill_value.is_null ? zfeed::FillValue{} : meta.fill_value;
  check(again.shape == meta.shape && again.chunk_shape == meta.chunk_shape &&
            again.dtype == meta.dtype && again.fill_value == fill,
        "zarr.json round trip changed the array: " + written.dump());
}

void parse_v3_node(const Json& json) {
  if (json.is_object() && json.contains("node_type") && json["node_type"] == "group") {
    GroupMetadata group = GroupMetadata::parse_v3(json);
    (void)group.to_json_v3();
    if (group.consolidated) {
      for (const auto& item : group.consolidated->items()) {
        const Json& member = item.value();
        expect_error_or_success([&] { parse_v3_node(member); });
      }
    }
    return;
  }
  ArrayMetadata meta = ArrayMetadata::parse_v3(json);
  exercise_array(meta);
  check_round_trip_v3(meta);
}

void parse_v2_array(const Json& zarray, const Json& zattrs) {
  ArrayMetadata meta = ArrayMetadata::parse_v2(zarray, zattrs);
  exercise_array(meta);
  Json written = meta.to_zarray();
  Json written_attrs = meta.to_zattrs();
  ArrayMetadata again;
  check(expect_error_or_success([&] { again = ArrayMetadata::parse_v2(written, written_attrs); }),
        ".zarray written by zfeed does not parse: " + written.dump());
  check(again.shape == meta.shape && again.chunk_shape == meta.chunk_shape &&
            again.dtype == meta.dtype && again.fill_value == meta.fill_value,
        ".zarray round trip changed the array: " + written.dump());
  check_round_trip_v3(meta);
}

void parse_document(const Json& json) {
  if (!json.is_object()) {
    // Still a metadata document to every parser: each must say no with a zfeed::Error.
    expect_error_or_success([&] { ArrayMetadata::parse_v3(json); });
    expect_error_or_success([&] { ArrayMetadata::parse_v2(json, Json()); });
    expect_error_or_success([&] { GroupMetadata::parse_v3(json); });
    return;
  }
  // .zmetadata: {"metadata": {"t/.zarray": {...}, "t/.zattrs": {...}}, "zarr_consolidated_format":
  // 1}
  if (json.contains("metadata") && json["metadata"].is_object() && !json.contains("zarr_format")) {
    const Json& documents = json["metadata"];
    for (const auto& item : documents.items()) {
      const std::string& key = item.key();
      const Json& value = item.value();
      std::string_view name(key);
      if (!name.ends_with(".zarray")) continue;
      std::string attrs_key = key.substr(0, key.size() - 7) + ".zattrs";
      Json zattrs = documents.contains(attrs_key) ? documents[attrs_key] : Json();
      expect_error_or_success([&] { parse_v2_array(value, zattrs); });
    }
    return;
  }
  // A .zarray and its .zattrs in one document: {"zarray": {...}, "zattrs": {...}} (the seeds'
  // form for a pair), else a plain v2 or v3 document.
  if (json.contains("zarray") && !json.contains("zarr_format")) {
    expect_error_or_success(
        [&] { parse_v2_array(json["zarray"], json.contains("zattrs") ? json["zattrs"] : Json()); });
    return;
  }
  if (json.contains("zarr_format") && json["zarr_format"] == 2) {
    expect_error_or_success([&] { parse_v2_array(json, Json()); });
    return;
  }
  expect_error_or_success([&] { parse_v3_node(json); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  Json json;
  if (!expect_error_or_success([&] { json = zfeed::parse_json(text, "zarr.json"); })) return 0;
  parse_document(json);
  return 0;
}
