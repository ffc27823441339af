#include "zfeed/cuda/gpu_decode_plan.h"

#include <optional>
#include <string_view>

#include "zfeed/codec/sharding.h"
#include "zfeed/util/json.h"
#include "zfeed/zarr/array.h"

namespace zfeed::cuda {
namespace {

std::optional<GpuCodec> compressor_codec(std::string_view name) {
  if (name == "zstd") return GpuCodec::kZstd;
  if (name == "gzip") return GpuCodec::kGzip;
  if (name == "numcodecs.zlib" || name == "zlib") return GpuCodec::kZlib;
  if (name == "numcodecs.lz4" || name == "lz4") return GpuCodec::kLz4;
  return std::nullopt;
}

// Why a blosc codec's chunks cannot decode on the GPU, "" where they can: nvCOMP decodes its
// LZ4, zstd and zlib streams, and the byte shuffle is undone by a kernel; not blosclz or snappy,
// nor the bit shuffle.
std::string blosc_why_not(const Json& json) {
  // The codec's own JSON (BloscCodec::to_json): cname and shuffle are always strings there.
  const Json configuration = json.value("configuration", Json::object());
  const std::string inner = configuration.value("cname", "");
  if (inner != "lz4" && inner != "lz4hc" && inner != "zstd" && inner != "zlib")
    return "blosc with " + inner +
           " inside: nvCOMP decodes blosc's lz4, lz4hc, zstd and zlib streams only";
  if (configuration.value("shuffle", "") == "bitshuffle")
    return "blosc's bit shuffle is undone on the CPU";
  return "";
}

GpuDecodePlan no(const CodecChain& chain, const std::string& why) {
  GpuDecodePlan plan;
  plan.decoded_size = chain.spec().num_bytes();
  plan.reason = "codecs [" + chain.describe() + "]: " + why;
  return plan;
}

}  // namespace

GpuDecodePlan gpu_decode_plan(const CodecChain& chain) {
  const auto& codecs = chain.codecs();
  if (chain.sharding())
    return no(chain, "sharded: the inner chunks are the unit to decode (plan the inner chain)");
  for (const auto& codec : codecs) {
    if (codec->kind() == CodecKind::kArrayToArray)
      return no(chain, codec->name() +
                           " reorders the values after decompression (Zarr v2 order \"F\" is a "
                           "transpose): not one GPU step");
  }
  const auto* bytes =
      codecs.empty() ? nullptr : dynamic_cast<const ArrayToBytesCodec*>(codecs.front().get());
  if (bytes == nullptr || bytes->name() != "bytes")
    return no(chain, "the array->bytes codec is not \"bytes\"");
  if (!bytes->is_native_layout(chain.spec()))
    return no(chain, "the values are stored big-endian: a byte swap is needed after decompression");
  if (codecs.size() == 1) return no(chain, "the chunks are stored uncompressed: nothing to decode");
  if (codecs.size() > 2)
    return no(chain, "more than one bytes->bytes codec (a checksum or a second compressor)");
  std::optional<GpuCodec> codec = compressor_codec(codecs[1]->name());
  if (codecs[1]->name() == "blosc") {
    // Each chunk's header says again what is inside; a chunk that differs from the metadata
    // (blosclz inside, say) is refused by the decoder and decoded on the CPU.
    const std::string why = blosc_why_not(codecs[1]->to_json());
    if (!why.empty()) return no(chain, why);
    codec = GpuCodec::kBlosc;
  }
  if (!codec)
    return no(chain, codecs[1]->name() +
                         " is not decoded by nvCOMP (zstd, gzip, zlib, lz4 and blosc with lz4, "
                         "zstd or zlib inside are)");
  GpuDecodePlan plan;
  plan.gpu = true;
  plan.codec = *codec;
  plan.decoded_size = chain.spec().num_bytes();
  return plan;
}

GpuDecodePlan gpu_decode_plan(const zarr::Array& array) {
  const CodecChain& chain = array.codecs();
  if (const ShardingCodec* sharding = chain.sharding()) {
    GpuDecodePlan plan = gpu_decode_plan(sharding->inner());
    plan.inner_chunks = true;
    return plan;
  }
  return gpu_decode_plan(chain);
}

}  // namespace zfeed::cuda
