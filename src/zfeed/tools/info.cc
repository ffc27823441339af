#include "zfeed/tools/info.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "zfeed/codec/sharding.h"
#if ZFEED_HAVE_CUDA
#include "zfeed/cuda/gpu_decode_plan.h"
#endif
#include "zfeed/store/staged_copy.h"
#include "zfeed/store/store.h"
#include "zfeed/zarr/group.h"

namespace zfeed::tools {
namespace {

std::string join_extents(const Json& extents, const char* separator) {
  std::string text;
  for (const auto& extent : extents)
    text += (text.empty() ? "" : separator) + std::to_string(extent.get<uint64_t>());
  return text;
}

// Read chunks smaller than this cost more in per-chunk overhead (a request or file each, a
// decoder call) than in decoding; larger than kLargeChunkBytes, a sample decodes far more than
// it uses and memory spikes.
constexpr uint64_t kSmallChunkBytes = uint64_t(1) << 20;
constexpr uint64_t kLargeChunkBytes = uint64_t(64) << 20;
// Below this ratio a compressor saves too little storage to pay for decompressing every read.
constexpr double kMinUsefulRatio = 1.1;

bool is_time_dimension(const std::optional<std::string>& name) {
  return name && (*name == "time" || *name == "valid_time" || *name == "t");
}

// Decoded over stored size of the chunks (or shards) that are stored: an array written in part
// compares its present part, not the whole array's decoded size. 0 where nothing is known.
double compression_ratio(uint64_t decoded, const zarr::StorageInfo& storage) {
  if (!storage.known || storage.stored_bytes == 0 || storage.objects_total == 0) return 0;
  const double present =
      double(decoded) * double(storage.objects_present) / double(storage.objects_total);
  return present / double(storage.stored_bytes);
}

std::string ratio_text(double ratio) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2fx", ratio);
  return text;
}

// True if the chain (the inner one for sharded arrays) compresses: a bytes->bytes codec that
// is not only a checksum.
bool compresses(const CodecChain& chain) {
  for (const auto& codec : chain.codecs())
    if (codec->kind() == CodecKind::kBytesToBytes && codec->name() != "crc32c") return true;
  return false;
}

// Advice on how the array is laid out for training reads: {"kind", "advice"} objects.
Json advise(const zarr::Array& array, const zarr::StorageInfo& storage) {
  const auto& meta = array.metadata();
  Json advice = Json::array();
  auto add = [&](const char* kind, const std::string& text) {
    advice.push_back({{"kind", kind}, {"advice", text}});
  };
  // Coordinates and other 1-D arrays are read whole once.
  if (meta.rank() < 2) return advice;
  const std::vector<uint64_t> chunk = array.read_chunk_shape();
  const uint64_t item = meta.dtype.size();
  const uint64_t chunk_bytes =
      std::accumulate(chunk.begin(), chunk.end(), item, std::multiplies<uint64_t>());
  const uint64_t decoded = meta.num_elements() * item;
  uint64_t chunks = 1;
  for (size_t d = 0; d < meta.rank(); ++d)
    chunks *= meta.shape[d] == 0 ? 0 : (meta.shape[d] + chunk[d] - 1) / chunk[d];
  std::optional<size_t> time_dim;
  for (size_t d = 0; d < meta.rank() && meta.dimension_names; ++d)
    if (is_time_dimension((*meta.dimension_names)[d])) time_dim = d;
  const bool sharded = array.codecs().sharding() != nullptr;
  const std::string what = sharded ? "inner chunks" : "chunks";
  std::string time_name = time_dim ? *(*meta.dimension_names)[*time_dim] : "time";

  // Uncompressed chunks are read by byte range: a read fetches only its part, however large the
  // chunk or however many steps it holds.
  const bool read_by_range = array.read_codecs().is_identity();
  if (time_dim && chunk[*time_dim] > 1 && meta.shape[*time_dim] > 1 && !read_by_range) {
    const uint64_t steps = chunk[*time_dim];
    // The files hold a shard's steps where sharded (meta.chunk_shape is the shard's shape).
    const uint64_t steps_per_file = meta.chunk_shape[*time_dim];
    add("time_chunks",
        "read " + what + " of " + std::to_string(steps) + " " + time_name +
            " steps: each t, t+1 sample decodes whole chunks to use 2 steps, and 2 chunks where it "
            "crosses a chunk edge; rechunk to one step per chunk (`zfeed rechunk --chunks " +
            time_name + "=1`, with --shards " + time_name + "=" + std::to_string(steps_per_file) +
            " to keep the number of files)");
  }
  if (chunk_bytes > kLargeChunkBytes && !read_by_range) {
    std::string fix;
    if (time_dim && chunk[*time_dim] > 1) {
      fix = "`zfeed rechunk --chunks " + time_name + "=1`";
    } else {
      // Split the first other dimension that is chunked more than 1 deep down to about 16 MiB.
      for (size_t d = 0; d < meta.rank(); ++d) {
        if (d == time_dim || chunk[d] <= 1) continue;
        uint64_t extent = std::max<uint64_t>(1, chunk[d] * (uint64_t(16) << 20) / chunk_bytes);
        const auto& name = meta.dimension_names ? (*meta.dimension_names)[d] : std::nullopt;
        fix = "`zfeed rechunk --chunks " + (time_dim ? time_name + "=1," : std::string()) +
              (name ? *name : "dim" + std::to_string(d)) + "=" + std::to_string(extent) + "`";
        break;
      }
    }
    add("large_chunks", "read " + what + " of " + human_bytes(double(chunk_bytes)) +
                            " decoded (over 64 MiB): every read decodes a whole chunk, so a "
                            "sample costs far more than it uses and memory spikes; use smaller "
                            "chunks" +
                            (fix.empty() ? std::string() : " (" + fix + ")"));
  }
  if (chunk_bytes < kSmallChunkBytes && chunks > 1 && decoded >= kSmallChunkBytes) {
    // A chunk that already holds one whole time step cannot grow without spanning several steps;
    // sharding takes away the per-file cost instead (nothing left to do when already sharded).
    bool whole_step = time_dim && chunk[*time_dim] == 1;
    for (size_t d = 0; d < meta.rank() && whole_step; ++d)
      if (d != time_dim && chunk[d] != meta.shape[d]) whole_step = false;
    std::string head = "read " + what + " of " + human_bytes(double(chunk_bytes)) +
                       " decoded are small (under 1 MiB): per-chunk overhead (a request or file "
                       "and a decoder call each) dominates the reads; ";
    if (whole_step && !sharded) {
      // Shards of about 64 MiB.
      uint64_t steps = std::clamp<uint64_t>(kLargeChunkBytes / chunk_bytes, 2,
                                            std::max<uint64_t>(2, meta.shape[*time_dim]));
      add("small_chunks", head + "they hold a whole " + time_name +
                              " step already, so group them into shards (`zfeed rechunk "
                              "--shards " +
                              time_name + "=" + std::to_string(steps) + "`)");
    } else if (!whole_step) {
      // Whole fields per time step: every dimension but time whole.
      std::string spec;
      uint64_t whole_field_bytes = item;
      for (size_t d = 0; d < meta.rank(); ++d) {
        const auto& dim = meta.dimension_names ? (*meta.dimension_names)[d] : std::nullopt;
        uint64_t extent = d == time_dim ? 1 : meta.shape[d];
        whole_field_bytes *= extent;
        spec += (spec.empty() ? "" : ",") + (dim ? *dim : "dim" + std::to_string(d)) + "=" +
                std::to_string(extent);
      }
      add("small_chunks",
          head + "use larger chunks" +
              (whole_field_bytes <= kLargeChunkBytes
                   ? ", e.g. whole fields per step (`zfeed rechunk --chunks " + spec + "`)"
                   : std::string()));
    }
  }
#if ZFEED_HAVE_CUDA
  // The GPU path (Loader(decode="gpu")) decodes only what nvCOMP covers (gpu_decode_plan).
  if (compresses(array.read_codecs())) {
    const cuda::GpuDecodePlan plan = cuda::gpu_decode_plan(array);
    if (!plan.gpu) {
      add("gpu_decode", "Loader(decode=\"gpu\") decodes these " + what + " on the CPU (" +
                            plan.reason +
                            "); rewritten with zstd they decode on the GPU (`zfeed rechunk "
                            "--codec zstd:3`)");
    }
  }
#endif
  if (const double ratio = compression_ratio(decoded, storage);
      ratio > 0 && compresses(sharded ? array.codecs().sharding()->inner() : array.codecs())) {
    if (ratio < kMinUsefulRatio) {
      add("compression", "compression saves little (ratio " + ratio_text(ratio) +
                             ") yet every read pays for decompression: store it uncompressed "
                             "(`zfeed rechunk --codec none`)");
    }
  }
  return advice;
}

// Gathers every array's advice below `node` as {"array", "kind", "advice"} objects.
void collect_advice(const Json& node, Json& out) {
  if (node["node_type"] == "array") {
    for (const auto& item : node["advice"])
      out.push_back({{"array", node["path"]}, {"kind", item["kind"]}, {"advice", item["advice"]}});
    return;
  }
  for (const auto& member : node["members"]) collect_advice(member, out);
}

Json describe_array(const zarr::Array& array, const std::string& name) {
  const auto& meta = array.metadata();
  Json json;
  json["name"] = name;
  json["path"] = array.path();
  json["node_type"] = "array";
  json["zarr_format"] = meta.zarr_format;
  json["shape"] = meta.shape;
  json["data_type"] = meta.dtype.name();
  Json dims = Json::array();
  for (size_t d = 0; d < meta.rank(); ++d) {
    dims.push_back(meta.dimension_names && (*meta.dimension_names)[d]
                       ? Json(*(*meta.dimension_names)[d])
                       : Json(nullptr));
  }
  json["dimension_names"] = dims;
  const CodecChain& chain = array.codecs();
  if (const ShardingCodec* sharding = chain.sharding()) {
    json["shard_shape"] = meta.chunk_shape;
    json["chunk_shape"] = array.read_chunk_shape();
    json["codecs"] = sharding->inner().describe();
    json["shard_codecs"] = chain.describe();
  } else {
    json["chunk_shape"] = meta.chunk_shape;
    json["shard_shape"] = nullptr;
    json["codecs"] = chain.describe();
  }
  json["fill_value"] = fill_value_to_json(meta.fill_value, meta.dtype);
  zarr::StorageInfo storage = array.storage_info();
  uint64_t decoded = meta.num_elements() * meta.dtype.size();
  json["decoded_bytes"] = decoded;
  // Unknown (null) where the store cannot list its keys.
  json["stored_bytes"] = storage.known ? Json(storage.stored_bytes) : Json(nullptr);
  json["objects_present"] = storage.known ? Json(storage.objects_present) : Json(nullptr);
  json["objects_total"] = storage.objects_total;
  const double ratio = compression_ratio(decoded, storage);
  json["compression_ratio"] = ratio > 0 ? Json(ratio) : Json(nullptr);
  json["attributes"] = meta.attributes;
#if ZFEED_HAVE_CUDA
  const cuda::GpuDecodePlan plan = cuda::gpu_decode_plan(array);
  json["gpu_decode"] = {{"gpu", plan.gpu},
                        {"codec", plan.gpu ? Json(cuda::gpu_codec_name(plan.codec)) : Json()},
                        {"reason", plan.reason}};
#endif
  json["advice"] = advise(array, storage);
  return json;
}

Json describe_group(const zarr::Group& group, const std::string& name) {
  Json json;
  json["name"] = name;
  json["path"] = group.path();
  json["node_type"] = "group";
  json["zarr_format"] = group.zarr_format();
  json["consolidated"] = group.is_consolidated();
  json["attributes"] = group.attributes();
  Json members = Json::array();
  for (const auto& member : group.members()) {
    zarr::Node node = group.open_member(member);
    if (auto* array = std::get_if<zarr::Array>(&node)) {
      members.push_back(describe_array(*array, member));
    } else {
      members.push_back(describe_group(std::get<zarr::Group>(node), member));
    }
  }
  json["members"] = members;
  return json;
}

void print_node(const Json& node, std::ostream& out, const std::string& indent, bool last,
                bool root) {
  std::string branch = root ? "" : (last ? "└── " : "├── ");
  std::string child_indent = root ? "" : indent + (last ? "    " : "│   ");
  const std::string name = node["name"].get<std::string>();
  if (node["node_type"] == "group") {
    out << indent << branch << (name.empty() ? "/" : name) << "  group (zarr v"
        << node["zarr_format"] << (node["consolidated"].get<bool>() ? ", consolidated" : "")
        << ")\n";
    const auto& members = node["members"];
    for (size_t i = 0; i < members.size(); ++i)
      print_node(members[i], out, child_indent, i + 1 == members.size(), false);
    return;
  }
  std::string shape;
  for (size_t d = 0; d < node["shape"].size(); ++d) {
    if (d) shape += ", ";
    const auto& dim = node["dimension_names"][d];
    shape += (dim.is_string() ? dim.get<std::string>() + "=" : std::string()) +
             std::to_string(node["shape"][d].get<uint64_t>());
  }
  out << indent << branch << (name.empty() ? "/" : name) << "  "
      << node["data_type"].get<std::string>() << " (" << shape << ")  zarr v" << node["zarr_format"]
      << "\n";
  std::string detail = child_indent + (root ? "  " : "    ");
  out << detail << "chunks " << join_extents(node["chunk_shape"], "x");
  if (!node["shard_shape"].is_null()) out << "  shards " << join_extents(node["shard_shape"], "x");
  out << "  codecs " << node["codecs"].get<std::string>() << "\n";
  double decoded = node["decoded_bytes"].get<double>();
  if (node["stored_bytes"].is_null()) {
    out << detail << human_bytes(decoded) << " decoded; stored size unknown (the store cannot "
        << "list its keys)\n";
    return;
  }
  double stored = node["stored_bytes"].get<double>();
  out << detail << "stored " << human_bytes(stored) << " of " << human_bytes(decoded) << " decoded";
  if (node["compression_ratio"].is_number()) {
    out << ", ratio " << ratio_text(node["compression_ratio"].get<double>());
  }
  out << "  (" << node["objects_present"] << " of " << node["objects_total"]
      << (node["shard_shape"].is_null() ? " chunks" : " shards") << " stored)\n";
}

}  // namespace

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

Json describe_store(const std::string& store_path) {
  auto store = open_store(store_path);
  zarr::Node node = zarr::open_node(store);
  Json json;
  if (auto* array = std::get_if<zarr::Array>(&node)) {
    json = describe_array(*array, "");
  } else {
    json = describe_group(std::get<zarr::Group>(node), "");
  }
  json["store"] = store->url();
  if (const auto record = read_stage_record(*store)) {  // a staged copy: of what, and how much
    Json staged = {{"source", record->value("source", std::string("?"))}};
    const auto held = staged_time_range(*store);
    staged["time_range"] = held ? Json{held->start, held->stop} : Json();
    staged["time_dim"] = held ? Json(held->time_dim) : Json();
    json["staged"] = staged;
  }
  Json advice = Json::array();
  collect_advice(json, advice);
  json["advice"] = advice;
  return json;
}

void print_info(const Json& description, std::ostream& out) {
  out << description["store"].get<std::string>() << "\n";
  if (description.contains("staged")) {
    const Json& staged = description["staged"];
    out << "staged copy of " << staged["source"].get<std::string>();
    if (!staged["time_range"].is_null()) {
      out << ", " << staged["time_dim"].get<std::string>() << " steps ["
          << staged["time_range"][0].get<uint64_t>() << ", "
          << staged["time_range"][1].get<uint64_t>()
          << ") only (the chunks of other steps are not in it)";
    }
    out << "\n";
  }
  print_node(description, out, "", true, true);
  const Json& advice = description["advice"];
  if (advice.empty()) return;
  out << "\nadvice:\n";
  for (const auto& item : advice) {
    std::string path = item["array"].get<std::string>();
    out << "  " << (path.empty() ? "/" : path) << ": " << item["advice"].get<std::string>() << "\n";
  }
}

}  // namespace zfeed::tools
