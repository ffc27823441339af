// numcodecs' LZ4 (v2's "lz4", v3's "numcodecs.lz4"): an LZ4 block after a 4-byte
// little-endian header holding the decoded size.
#include <lz4.h>

#include <algorithm>
#include <cstring>

#include "zfeed/codec/codec.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

class Lz4Codec final : public BytesToBytesCodec {
 public:
  explicit Lz4Codec(int acceleration) : acceleration_(acceleration) {}

  std::string name() const override { return "numcodecs.lz4"; }
  Json to_json() const override {
    return {{"name", "numcodecs.lz4"}, {"configuration", {{"acceleration", acceleration_}}}};
  }

  Bytes encode(ByteView decoded) const override {
    if (decoded.size() > LZ4_MAX_INPUT_SIZE) throw Error("lz4: input too large");
    int bound = LZ4_compressBound(static_cast<int>(decoded.size()));
    Bytes out(4 + static_cast<size_t>(bound));
    uint32_t size = static_cast<uint32_t>(decoded.size());
    std::memcpy(out.data(), &size, 4);
    int written = LZ4_compress_fast(
        reinterpret_cast<const char*>(decoded.data()), reinterpret_cast<char*>(out.data() + 4),
        static_cast<int>(decoded.size()), bound, std::clamp(acceleration_, 1, 65537));
    if (written <= 0) throw Error("lz4: compression failed");
    out.resize(4 + static_cast<size_t>(written));
    return out;
  }

  static uint32_t header_size(ByteView encoded) {
    if (encoded.size() < 4)
      throw Error("lz4: " + std::to_string(encoded.size()) + " bytes is too short for the header");
    uint32_t size;
    std::memcpy(&size, encoded.data(), 4);
    return size;
  }

  void decode_into(ByteView encoded, MutableByteView out) const override {
    uint32_t size = header_size(encoded);
    if (size != out.size()) {
      throw Error("lz4: header says " + std::to_string(size) + " bytes, expected " +
                  std::to_string(out.size()));
    }
    if (out.size() > LZ4_MAX_INPUT_SIZE || encoded.size() - 4 > LZ4_MAX_INPUT_SIZE)
      throw Error("lz4: block too large");
    int got = LZ4_decompress_safe(
        reinterpret_cast<const char*>(encoded.data() + 4), reinterpret_cast<char*>(out.data()),
        static_cast<int>(encoded.size() - 4), static_cast<int>(out.size()));
    if (got < 0 || static_cast<size_t>(got) != out.size()) {
      throw Error("lz4: corrupt or truncated block (" + std::to_string(encoded.size()) + " bytes)");
    }
  }

  Bytes decode(ByteView encoded, uint64_t max_size) const override {
    uint32_t size = header_size(encoded);
    if (size > max_size) {
      throw Error("lz4: header says " + std::to_string(size) +
                  " bytes, more than the expected maximum " + std::to_string(max_size));
    }
    Bytes out(size);
    decode_into(encoded, out.mutable_view());
    return out;
  }

  uint64_t max_encoded_size(uint64_t decoded) const override {
    return 4 + decoded + decoded / 255 + 16;
  }

 private:
  int acceleration_;
};

std::shared_ptr<Codec> make_lz4(const Json& configuration, const ChunkSpec&) {
  CodecConfig config("numcodecs.lz4", configuration);
  config.reject_unknown({"acceleration"});
  // Any int, as numcodecs takes it (below 1 is 1, lz4 caps the top): it matters to encoding only.
  return std::make_shared<Lz4Codec>(
      static_cast<int>(config.integer("acceleration", INT32_MIN, INT32_MAX, 1)));
}

ZFEED_REGISTER_CODEC("numcodecs.lz4", make_lz4);

}  // namespace
}  // namespace zfeed
