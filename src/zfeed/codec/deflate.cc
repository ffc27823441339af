// gzip (v3 and v2: the RFC 1952 container) and zlib (v2's "zlib", v3's "numcodecs.zlib": the
// RFC 1950 container), both through libdeflate, the fastest inflate on the CPU.
// Spec: zarr-specs docs/v3/codecs/gzip; numcodecs GZip and Zlib.
#include <libdeflate.h>

#include <cstring>

#include "zfeed/codec/codec.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

enum class Container { kGzip, kZlib };

struct DecompressorDeleter {
  void operator()(libdeflate_decompressor* d) const { libdeflate_free_decompressor(d); }
};

libdeflate_decompressor* thread_decompressor() {
  thread_local std::unique_ptr<libdeflate_decompressor, DecompressorDeleter> decompressor(
      libdeflate_alloc_decompressor());
  if (!decompressor) throw Error("out of memory allocating a deflate decompressor");
  return decompressor.get();
}

class DeflateCodec final : public BytesToBytesCodec {
 public:
  DeflateCodec(Container container, std::string name, int level)
      : container_(container), name_(std::move(name)), level_(level) {}

  std::string name() const override { return name_; }
  Json to_json() const override {
    return {{"name", name_}, {"configuration", {{"level", level_}}}};
  }

  const char* label() const { return container_ == Container::kGzip ? "gzip" : "zlib"; }

  Bytes encode(ByteView decoded) const override {
    // libdeflate's levels 1..12 are stronger at the top; 0 stores (supported since 1.15), so
    // map 0 to 1 for older libraries.
    // -1 is zlib's default level (6), which numcodecs passes through.
    int level = level_ == 0 ? 1 : level_ < 0 ? 6 : level_;
    libdeflate_compressor* compressor = libdeflate_alloc_compressor(level);
    if (compressor == nullptr) throw Error(std::string(label()) + ": cannot create a compressor");
    size_t bound = container_ == Container::kGzip
                       ? libdeflate_gzip_compress_bound(compressor, decoded.size())
                       : libdeflate_zlib_compress_bound(compressor, decoded.size());
    Bytes out(bound);
    size_t size = container_ == Container::kGzip
                      ? libdeflate_gzip_compress(compressor, decoded.data(), decoded.size(),
                                                 out.data(), bound)
                      : libdeflate_zlib_compress(compressor, decoded.data(), decoded.size(),
                                                 out.data(), bound);
    libdeflate_free_compressor(compressor);
    if (size == 0) throw Error(std::string(label()) + ": compression failed");
    out.resize(size);
    return out;
  }

  // Inflates every member of `encoded` into `out`; returns the bytes written, or throws. Sets
  // *too_small instead of throwing when `out` is too small (so the caller can grow it).
  size_t inflate(ByteView encoded, MutableByteView out, bool* too_small) const {
    libdeflate_decompressor* decompressor = thread_decompressor();
    size_t in_done = 0, out_done = 0;
    do {
      size_t in_used = 0, out_used = 0;
      libdeflate_result result =
          container_ == Container::kGzip
              ? libdeflate_gzip_decompress_ex(decompressor, encoded.data() + in_done,
                                              encoded.size() - in_done, out.data() + out_done,
                                              out.size() - out_done, &in_used, &out_used)
              : libdeflate_zlib_decompress_ex(decompressor, encoded.data() + in_done,
                                              encoded.size() - in_done, out.data() + out_done,
                                              out.size() - out_done, &in_used, &out_used);
      if (result == LIBDEFLATE_INSUFFICIENT_SPACE) {
        *too_small = true;
        return 0;
      }
      if (result != LIBDEFLATE_SUCCESS) {
        throw Error(std::string(label()) + ": corrupt or truncated stream (" +
                    std::to_string(encoded.size()) + " bytes)");
      }
      in_done += in_used;
      out_done += out_used;
      // gzip allows several members back to back (RFC 1952 section 2.2).
    } while (container_ == Container::kGzip && in_done < encoded.size());
    if (in_done != encoded.size()) {
      throw Error(std::string(label()) + ": " + std::to_string(encoded.size() - in_done) +
                  " stray bytes after the stream");
    }
    *too_small = false;
    return out_done;
  }

  void decode_into(ByteView encoded, MutableByteView out) const override {
    bool too_small = false;
    size_t size = inflate(encoded, out, &too_small);
    if (too_small) {
      throw Error(std::string(label()) + ": stream decodes to more than the expected " +
                  std::to_string(out.size()) + " bytes");
    }
    if (size != out.size()) {
      throw Error(std::string(label()) + ": stream decodes to " + std::to_string(size) +
                  " bytes, expected " + std::to_string(out.size()));
    }
  }

  Bytes decode(ByteView encoded, uint64_t max_size) const override {
    uint64_t guess = std::max<uint64_t>(encoded.size() * 4, 1 << 16);
    if (container_ == Container::kGzip && encoded.size() >= 18) {
      uint32_t isize;  // the trailer holds the size modulo 2^32
      std::memcpy(&isize, encoded.data() + encoded.size() - 4, 4);
      guess = isize;
    }
    uint64_t capacity = std::min(guess, max_size);
    for (;;) {
      Bytes out(capacity + 1);  // one spare byte tells "fits exactly" from "too small"
      bool too_small = false;
      size_t size = inflate(encoded, out.mutable_view(), &too_small);
      if (!too_small) {
        if (size > max_size) break;
        out.resize(size);
        return out;
      }
      if (capacity >= max_size) break;
      capacity = std::min(capacity * 2 + 1024, max_size);
    }
    throw Error(std::string(label()) + ": stream decodes to more than the expected maximum of " +
                std::to_string(max_size) + " bytes");
  }

  uint64_t max_encoded_size(uint64_t decoded) const override {
    return decoded + decoded / 1000 * 5 + 1024;  // stored blocks cost 5 bytes per 65535
  }

 private:
  Container container_;
  std::string name_;
  int level_;
};

CodecFactory deflate_factory(Container container, std::string name) {
  return [container, name](const Json& configuration, const ChunkSpec&) -> std::shared_ptr<Codec> {
    CodecConfig config(name, configuration);
    config.reject_unknown({"level"});
    int level = static_cast<int>(config.integer(
        "level", -1, 9, container == Container::kZlib ? 1 : std::optional<int64_t>()));
    return std::make_shared<DeflateCodec>(container, name, level);
  };
}

ZFEED_REGISTER_CODEC("gzip", deflate_factory(Container::kGzip, "gzip"));
ZFEED_REGISTER_CODEC("numcodecs.zlib", deflate_factory(Container::kZlib, "numcodecs.zlib"));
ZFEED_REGISTER_CODEC("numcodecs.gzip", deflate_factory(Container::kGzip, "numcodecs.gzip"));

}  // namespace
}  // namespace zfeed
