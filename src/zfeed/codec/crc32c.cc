// crc32c (bytes->bytes): appends the CRC-32C (Castagnoli) of the stream as 4 little-endian
// bytes. Spec: zarr-specs docs/v3/codecs/crc32c. Checked with ISA-L's crc32_iscsi.
#include "zfeed/codec/crc32c.h"

#include <isa-l/crc.h>

#include <cstdio>
#include <cstring>

#include "zfeed/codec/codec.h"
#include "zfeed/util/error.h"

namespace zfeed {

uint32_t crc32c(ByteView data) {
  uint32_t crc = 0xFFFFFFFFu;
  const uint8_t* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    int n = static_cast<int>(std::min<size_t>(left, size_t{1} << 30));
    crc = crc32_iscsi(const_cast<unsigned char*>(p), n, crc);
    p += n;
    left -= static_cast<size_t>(n);
  }
  return crc ^ 0xFFFFFFFFu;
}

namespace {

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

class Crc32cCodec final : public BytesToBytesCodec {
 public:
  std::string name() const override { return "crc32c"; }
  Json to_json() const override { return {{"name", "crc32c"}}; }

  Bytes encode(ByteView decoded) const override {
    Bytes out(decoded.size() + 4);
    if (!decoded.empty()) std::memcpy(out.data(), decoded.data(), decoded.size());
    uint32_t checksum = crc32c(decoded);
    std::memcpy(out.data() + decoded.size(), &checksum, 4);
    return out;
  }

  bool only_checks() const override { return true; }
  std::optional<ByteView> decode_view(ByteView encoded) const override {
    if (encoded.size() < 4) {
      throw Error("crc32c: " + std::to_string(encoded.size()) +
                  " bytes is too short to hold a checksum");
    }
    ByteView payload = encoded.first(encoded.size() - 4);
    uint32_t stored;
    std::memcpy(&stored, encoded.data() + payload.size(), 4);
    uint32_t computed = crc32c(payload);
    if (stored != computed) {
      throw Error("crc32c checksum mismatch: stored " + hex32(stored) + ", computed " +
                  hex32(computed) + " over " + std::to_string(payload.size()) + " bytes");
    }
    return payload;
  }

  void decode_into(ByteView encoded, MutableByteView out) const override {
    ByteView payload = *decode_view(encoded);
    if (payload.size() != out.size()) {
      throw Error("crc32c: payload is " + std::to_string(payload.size()) + " bytes, expected " +
                  std::to_string(out.size()));
    }
    if (!out.empty()) std::memcpy(out.data(), payload.data(), out.size());
  }

  Bytes decode(ByteView encoded, uint64_t max_size) const override {
    ByteView payload = *decode_view(encoded);
    if (payload.size() > max_size) throw Error("crc32c: payload larger than expected");
    return Bytes(payload);
  }

  std::optional<uint64_t> encoded_size(uint64_t decoded) const override { return decoded + 4; }
  uint64_t max_encoded_size(uint64_t decoded) const override { return decoded + 4; }
};

std::shared_ptr<Codec> make_crc32c(const Json& configuration, const ChunkSpec&) {
  CodecConfig("crc32c", configuration).reject_unknown({});
  return std::make_shared<Crc32cCodec>();
}

// numcodecs' CRC32C (zarr-python's numcodecs.crc32c): the same checksum after the data, where
// `location` is "end" (its default); at the start it is another layout.
std::shared_ptr<Codec> make_numcodecs_crc32c(const Json& configuration, const ChunkSpec&) {
  CodecConfig config("numcodecs.crc32c", configuration);
  config.reject_unknown({"location"});
  const std::string location = config.string("location", "end");
  if (location != "end") {
    throw UnsupportedError("codec numcodecs.crc32c: location \"" + location +
                           "\" is not supported (the checksum after the data, \"end\", is)");
  }
  return std::make_shared<Crc32cCodec>();
}

ZFEED_REGISTER_CODEC("crc32c", make_crc32c);
ZFEED_REGISTER_CODEC("numcodecs.crc32c", make_numcodecs_crc32c);

}  // namespace
}  // namespace zfeed
