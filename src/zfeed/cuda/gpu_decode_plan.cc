#include "zfeed/cuda/gpu_decode_plan.h"

#include <optional>
#include <string_view>

#include "zfeed/codec/sharding.h"
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
  const std::optional<GpuCodec> codec = compressor_codec(codecs[1]->name());
  if (!codec)
    return no(chain,
              codecs[1]->name() + " is not decoded by nvCOMP (zstd, gzip, zlib and lz4 are)");
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
