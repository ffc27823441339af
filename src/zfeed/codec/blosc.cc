// blosc (bytes->bytes) through c-blosc 1.x: lz4, lz4hc, blosclz, zstd, zlib, snappy inside;
// byte shuffle and bit shuffle. Blosc frames are self-describing, so decoding needs no
// configuration; the header is validated before anything is decompressed.
// Spec: zarr-specs docs/v3/codecs/blosc; numcodecs Blosc for v2 (integer shuffle, typesize
// from the item size).
#include <blosc.h>

#include "zfeed/codec/codec.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

constexpr std::string_view kShuffleNames[] = {"noshuffle", "shuffle", "bitshuffle"};

class BloscCodec final : public BytesToBytesCodec {
 public:
  BloscCodec(std::string cname, int clevel, int shuffle, int typesize, int blocksize)
      : cname_(std::move(cname)),
        clevel_(clevel),
        shuffle_(shuffle),
        typesize_(typesize),
        blocksize_(blocksize) {}

  std::string name() const override { return "blosc"; }
  Json to_json() const override {
    Json configuration = {
        {"cname", cname_}, {"clevel", clevel_}, {"shuffle", kShuffleNames[shuffle_]}};
    if (shuffle_ != BLOSC_NOSHUFFLE) configuration["typesize"] = typesize_;
    configuration["blocksize"] = blocksize_;
    return {{"name", "blosc"}, {"configuration", configuration}};
  }

  Bytes encode(ByteView decoded) const override {
    Bytes out(decoded.size() + BLOSC_MAX_OVERHEAD);
    int size = blosc_compress_ctx(clevel_, shuffle_, static_cast<size_t>(typesize_), decoded.size(),
                                  decoded.data(), out.data(), out.size(), cname_.c_str(),
                                  static_cast<size_t>(blocksize_), 1);
    if (size <= 0) throw Error("blosc: compression failed (" + std::to_string(size) + ")");
    out.resize(static_cast<size_t>(size));
    return out;
  }

  static size_t validated_size(ByteView encoded) {
    size_t decoded_size = 0;
    if (encoded.size() < BLOSC_MIN_HEADER_LENGTH ||
        blosc_cbuffer_validate(encoded.data(), encoded.size(), &decoded_size) != 0) {
      throw Error("blosc: corrupt or truncated frame (" + std::to_string(encoded.size()) +
                  " bytes)");
    }
    return decoded_size;
  }

  void decode_into(ByteView encoded, MutableByteView out) const override {
    size_t size = validated_size(encoded);
    if (size != out.size()) {
      throw Error("blosc: frame holds " + std::to_string(size) + " bytes, expected " +
                  std::to_string(out.size()));
    }
    if (size == 0) return;
    int got = blosc_decompress_ctx(encoded.data(), out.data(), out.size(), 1);
    if (got < 0 || static_cast<size_t>(got) != size) {
      throw Error("blosc: corrupt frame (" + std::to_string(encoded.size()) + " bytes, error " +
                  std::to_string(got) + ")");
    }
  }

  Bytes decode(ByteView encoded, uint64_t max_size) const override {
    size_t size = validated_size(encoded);
    if (size > max_size) {
      throw Error("blosc: frame holds " + std::to_string(size) +
                  " bytes, more than the expected maximum " + std::to_string(max_size));
    }
    Bytes out(size);
    decode_into(encoded, out.mutable_view());
    return out;
  }

  uint64_t max_encoded_size(uint64_t decoded) const override {
    return decoded + BLOSC_MAX_OVERHEAD;
  }

 private:
  std::string cname_;
  int clevel_;
  int shuffle_;
  int typesize_;
  int blocksize_;
};

std::shared_ptr<Codec> make_blosc(const Json& configuration, const ChunkSpec& spec) {
  CodecConfig config("blosc", configuration);
  config.reject_unknown({"cname", "clevel", "shuffle", "typesize", "blocksize"});
  std::string cname = config.string("cname", "lz4");
  static const char* known[] = {"lz4", "lz4hc", "blosclz", "zstd", "zlib", "snappy"};
  bool is_known = false;
  for (const char* name : known) is_known = is_known || cname == name;
  if (!is_known)
    config.fail("unknown \"cname\" \"" + cname +
                "\" (expected lz4, lz4hc, blosclz, zstd, zlib or snappy)");
  if (blosc_get_complib_info(cname.c_str(), nullptr, nullptr) < 0) {
    throw UnsupportedError("codec blosc: this c-blosc build lacks the \"" + cname +
                           "\" compressor");
  }
  int clevel = static_cast<int>(config.integer("clevel", 0, 9, 5));
  int shuffle = BLOSC_NOSHUFFLE;
  const Json* shuffle_json = config.find("shuffle");
  if (shuffle_json && shuffle_json->is_string()) {
    std::string text = shuffle_json->get<std::string>();
    shuffle = -1;
    for (int i = 0; i < 3; ++i) {
      if (text == kShuffleNames[i]) shuffle = i;
    }
    if (shuffle < 0)
      config.fail("\"shuffle\" must be noshuffle, shuffle or bitshuffle, got \"" + text + "\"");
  } else if (shuffle_json && shuffle_json->is_number_integer()) {
    // numcodecs' integers: -1 = automatic (bit shuffle for 1-byte items, else byte shuffle).
    int64_t value = shuffle_json->get<int64_t>();
    if (value < -1 || value > 2)
      config.fail("\"shuffle\" must be -1, 0, 1 or 2, got " + std::to_string(value));
    shuffle = value == -1 ? (spec.dtype.size() == 1 ? BLOSC_BITSHUFFLE : BLOSC_SHUFFLE)
                          : static_cast<int>(value);
  } else if (shuffle_json) {
    config.fail("\"shuffle\" must be a string, got " + shuffle_json->dump());
  }
  // Required unless noshuffle by the spec; filled from the data type when absent, as
  // zarr-python does on creation.
  int typesize =
      static_cast<int>(config.integer("typesize", 1, 255, static_cast<int64_t>(spec.dtype.size())));
  int blocksize = static_cast<int>(config.integer("blocksize", 0, INT32_MAX, 0));
  return std::make_shared<BloscCodec>(cname, clevel, shuffle, typesize, blocksize);
}

ZFEED_REGISTER_CODEC("blosc", make_blosc);
// zarr-python's numcodecs.blosc: the same chunks, settings as numcodecs writes them.
ZFEED_REGISTER_CODEC("numcodecs.blosc", make_blosc);

}  // namespace
}  // namespace zfeed
