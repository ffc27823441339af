// bytes (array->bytes): the chunk's elements in C order, in the configured byte order.
// Spec: zarr-specs docs/v3/codecs/bytes. "endian" is required for multi-byte types.
#include <cstring>

#include "zfeed/codec/codec.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

void byte_swap(const uint8_t* in, uint8_t* out, size_t total, size_t unit) {
  switch (unit) {
    case 2:
      for (size_t i = 0; i < total; i += 2) {
        uint16_t v;
        std::memcpy(&v, in + i, 2);
        v = __builtin_bswap16(v);
        std::memcpy(out + i, &v, 2);
      }
      break;
    case 4:
      for (size_t i = 0; i < total; i += 4) {
        uint32_t v;
        std::memcpy(&v, in + i, 4);
        v = __builtin_bswap32(v);
        std::memcpy(out + i, &v, 4);
      }
      break;
    case 8:
      for (size_t i = 0; i < total; i += 8) {
        uint64_t v;
        std::memcpy(&v, in + i, 8);
        v = __builtin_bswap64(v);
        std::memcpy(out + i, &v, 8);
      }
      break;
    default:
      if (in != out) std::memcpy(out, in, total);
  }
}

class BytesCodec final : public ArrayToBytesCodec {
 public:
  explicit BytesCodec(std::optional<Endian> endian) : endian_(endian) {}

  std::string name() const override { return "bytes"; }
  Json to_json() const override {
    Json json = {{"name", "bytes"}};
    if (endian_)
      json["configuration"] = {{"endian", *endian_ == Endian::kLittle ? "little" : "big"}};
    return json;
  }

  bool is_native_layout(const ChunkSpec& spec) const override {
    return spec.dtype.component_size() == 1 || endian_ == Endian::kLittle;
  }
  std::optional<uint64_t> encoded_size(const ChunkSpec& spec) const override {
    return spec.num_bytes();
  }

  Bytes encode(const uint8_t* chunk, const ChunkSpec& spec) const override {
    Bytes out(spec.num_bytes());
    if (is_native_layout(spec)) {
      if (!out.empty()) std::memcpy(out.data(), chunk, out.size());
    } else {
      byte_swap(chunk, out.data(), out.size(), spec.dtype.component_size());
    }
    return out;
  }

  void decode(ByteView encoded, const ChunkSpec& spec, uint8_t* out) const override {
    if (encoded.size() != spec.num_bytes()) throw Error(chunk_size_mismatch(encoded.size(), spec));
    if (is_native_layout(spec)) {
      if (!encoded.empty() && encoded.data() != out)
        std::memcpy(out, encoded.data(), encoded.size());
    } else {
      byte_swap(encoded.data(), out, encoded.size(), spec.dtype.component_size());
    }
  }

 private:
  std::optional<Endian> endian_;
};

std::shared_ptr<Codec> make_bytes(const Json& configuration, const ChunkSpec& spec) {
  CodecConfig config("bytes", configuration);
  config.reject_unknown({"endian"});
  std::optional<Endian> endian;
  if (config.find("endian")) {
    std::string text = config.string("endian", std::nullopt);
    if (text == "little") {
      endian = Endian::kLittle;
    } else if (text == "big") {
      endian = Endian::kBig;
    } else {
      config.fail("\"endian\" must be \"little\" or \"big\", got \"" + text + "\"");
    }
  } else if (spec.dtype.size() > 1) {
    config.fail("\"endian\" is required for data type " + std::string(spec.dtype.name()));
  }
  return std::make_shared<BytesCodec>(endian);
}

ZFEED_REGISTER_CODEC("bytes", make_bytes);

}  // namespace
}  // namespace zfeed
