// zstd (bytes->bytes). Frames may lack a content size (TensorStore's old v2 writer omitted it):
// those decode by streaming, bounded by the expected size. Encoding pledges the size.
// Spec: zarr-extensions codecs/zstd; numcodecs Zstd for v2.
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "zfeed/codec/codec.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

struct DCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

ZSTD_DCtx* thread_dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> context(ZSTD_createDCtx());
  if (!context) throw Error("zstd: out of memory creating a decompression context");
  return context.get();
}

ZSTD_CCtx* thread_cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> context(ZSTD_createCCtx());
  if (!context) throw Error("zstd: out of memory creating a compression context");
  return context.get();
}

[[noreturn]] void zstd_fail(size_t code, size_t encoded_size) {
  throw Error("zstd: corrupt or truncated stream of " + std::to_string(encoded_size) + " bytes (" +
              ZSTD_getErrorName(code) + ")");
}

// A stream whose first frame could not be measured: one that starts as a zstd frame was cut
// short or damaged (the usual corruption: a copy that stopped early), anything else is no zstd.
[[noreturn]] void unreadable_first_frame(ByteView encoded) {
  uint32_t magic = 0;
  if (encoded.size() >= 4) std::memcpy(&magic, encoded.data(), 4);  // little-endian, as zstd's
  if (magic == ZSTD_MAGICNUMBER ||
      (magic & ZSTD_MAGIC_SKIPPABLE_MASK) == ZSTD_MAGIC_SKIPPABLE_START) {
    throw Error("zstd: corrupt or truncated stream of " + std::to_string(encoded.size()) +
                " bytes (its first frame does not end within them)");
  }
  throw Error("zstd: not a zstd frame (" + std::to_string(encoded.size()) + " bytes)");
}

// The decoded size of the whole stream when every frame states its own (skippable frames count
// 0), else ZSTD_CONTENTSIZE_UNKNOWN. libzstd's one-shot and streaming decoders do not reject
// the same corrupt input (streaming accepts an empty compressed block, which one-shot calls
// corruption: facebook/zstd#3775), so decode and decode_into choose between them by this one
// rule and agree on every input.
unsigned long long stream_content_size(ByteView encoded) {
  if (encoded.empty()) return ZSTD_CONTENTSIZE_ERROR;
  unsigned long long total = 0;
  for (size_t pos = 0; pos < encoded.size();) {
    size_t frame = ZSTD_findFrameCompressedSize(encoded.data() + pos, encoded.size() - pos);
    if (ZSTD_isError(frame)) return pos == 0 ? ZSTD_CONTENTSIZE_ERROR : ZSTD_CONTENTSIZE_UNKNOWN;
    unsigned long long content = ZSTD_getFrameContentSize(encoded.data() + pos, frame);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
        __builtin_add_overflow(total, content, &total)) {
      return pos == 0 && content == ZSTD_CONTENTSIZE_ERROR ? ZSTD_CONTENTSIZE_ERROR
                                                           : ZSTD_CONTENTSIZE_UNKNOWN;
    }
    pos += frame;
  }
  return total;
}

class ZstdCodec final : public BytesToBytesCodec {
 public:
  ZstdCodec(int level, bool checksum) : level_(level), checksum_(checksum) {}

  std::string name() const override { return "zstd"; }
  Json to_json() const override {
    return {{"name", "zstd"}, {"configuration", {{"level", level_}, {"checksum", checksum_}}}};
  }

  Bytes encode(ByteView decoded) const override {
    ZSTD_CCtx* context = thread_cctx();
    ZSTD_CCtx_reset(context, ZSTD_reset_session_and_parameters);
    // Beyond zstd's levels (numcodecs takes any integer): the nearest one, as zstd itself does.
    ZSTD_CCtx_setParameter(context, ZSTD_c_compressionLevel,
                           std::clamp(level_, ZSTD_minCLevel(), ZSTD_maxCLevel()));
    ZSTD_CCtx_setParameter(context, ZSTD_c_checksumFlag, checksum_ ? 1 : 0);
    ZSTD_CCtx_setParameter(context, ZSTD_c_contentSizeFlag, 1);
    Bytes out(ZSTD_compressBound(decoded.size()));
    size_t size = ZSTD_compress2(context, out.data(), out.size(), decoded.data(), decoded.size());
    if (ZSTD_isError(size))
      throw Error(std::string("zstd: compression failed: ") + ZSTD_getErrorName(size));
    out.resize(size);
    return out;
  }

  // Streams every frame into `out`; returns the size, or out.size() + 1 if there is more.
  static size_t stream(ByteView encoded, MutableByteView out) {
    ZSTD_DCtx* context = thread_dctx();
    ZSTD_DCtx_reset(context, ZSTD_reset_session_only);
    ZSTD_inBuffer input{encoded.data(), encoded.size(), 0};
    ZSTD_outBuffer output{out.data(), out.size(), 0};
    for (;;) {
      const bool full = output.pos == output.size;
      size_t hint;
      if (!full) {
        hint = ZSTD_decompressStream(context, &output, &input);
      } else {
        // Full: one spare byte tells whether the stream holds more.
        uint8_t probe;
        ZSTD_outBuffer extra{&probe, 1, 0};
        hint = ZSTD_decompressStream(context, &extra, &input);
        if (!ZSTD_isError(hint) && extra.pos > 0) return out.size() + 1;
      }
      if (ZSTD_isError(hint)) zstd_fail(hint, encoded.size());
      if (input.pos == input.size) {
        if (hint == 0) return output.pos;
        // Out of input inside a frame: truncated, unless a full buffer still holds back output.
        if (full || output.pos < output.size) {
          throw Error("zstd: stream of " + std::to_string(encoded.size()) +
                      " bytes ends inside a frame (truncated)");
        }
      }
    }
  }

  void decode_into(ByteView encoded, MutableByteView out) const override {
    unsigned long long content = stream_content_size(encoded);
    if (content == ZSTD_CONTENTSIZE_ERROR) {
      unreadable_first_frame(encoded);
    }
    if (content != ZSTD_CONTENTSIZE_UNKNOWN) {
      if (content > out.size()) {
        throw Error("zstd: frame holds " + std::to_string(content) +
                    " bytes, more than the expected " + std::to_string(out.size()));
      }
      size_t size = ZSTD_decompressDCtx(thread_dctx(), out.data(), out.size(), encoded.data(),
                                        encoded.size());
      if (ZSTD_isError(size)) {
        if (ZSTD_getErrorCode(size) == ZSTD_error_dstSize_tooSmall) {
          throw Error("zstd: stream decodes to more than the expected " +
                      std::to_string(out.size()) + " bytes");
        }
        zstd_fail(size, encoded.size());
      }
      if (size != out.size()) {
        throw Error("zstd: stream decodes to " + std::to_string(size) + " bytes, expected " +
                    std::to_string(out.size()));
      }
      return;
    }
    size_t size = stream(encoded, out);
    if (size > out.size()) {
      throw Error("zstd: stream decodes to more than the expected " + std::to_string(out.size()) +
                  " bytes");
    }
    if (size != out.size()) {
      throw Error("zstd: stream decodes to " + std::to_string(size) + " bytes, expected " +
                  std::to_string(out.size()));
    }
  }

  bool can_decode_prefix() const override { return true; }
  // Streams only until `out` is full: decoding stops there, mid-block, mid-frame.
  bool decode_prefix(ByteView encoded, MutableByteView out) const override {
    // Only the first frame's header is checked: the rest of the stream may never be reached.
    if (ZSTD_getFrameContentSize(encoded.data(), encoded.size()) == ZSTD_CONTENTSIZE_ERROR) {
      unreadable_first_frame(encoded);
    }
    ZSTD_DCtx* context = thread_dctx();
    ZSTD_DCtx_reset(context, ZSTD_reset_session_only);
    ZSTD_inBuffer input{encoded.data(), encoded.size(), 0};
    ZSTD_outBuffer output{out.data(), out.size(), 0};
    while (output.pos < output.size) {
      const size_t before_in = input.pos, before_out = output.pos;
      const size_t hint = ZSTD_decompressStream(context, &output, &input);
      if (ZSTD_isError(hint)) zstd_fail(hint, encoded.size());
      const bool stalled = input.pos == before_in && output.pos == before_out;
      if (output.pos < output.size && ((input.pos == input.size && hint == 0) || stalled)) {
        throw Error("zstd: stream of " + std::to_string(encoded.size()) + " bytes decodes to " +
                    std::to_string(output.pos) + " bytes, fewer than the " +
                    std::to_string(out.size()) + " needed");
      }
    }
    return true;
  }

  Bytes decode(ByteView encoded, uint64_t max_size) const override {
    unsigned long long content = stream_content_size(encoded);
    if (content == ZSTD_CONTENTSIZE_ERROR) {
      unreadable_first_frame(encoded);
    }
    uint64_t capacity = content != ZSTD_CONTENTSIZE_UNKNOWN
                            ? content
                            : std::max<uint64_t>(encoded.size() * 4, 1 << 16);
    if (capacity > max_size) {
      if (content != ZSTD_CONTENTSIZE_UNKNOWN) {
        throw Error("zstd: frame holds " + std::to_string(content) +
                    " bytes, more than the expected maximum " + std::to_string(max_size));
      }
      capacity = max_size;
    }
    if (content != ZSTD_CONTENTSIZE_UNKNOWN) {  // the same decoder decode_into uses
      Bytes out(content);
      decode_into(encoded, out.mutable_view());
      return out;
    }
    for (;;) {
      Bytes out(capacity);
      size_t size = stream(encoded, out.mutable_view());
      if (size <= capacity) {
        out.resize(size);
        return out;
      }
      if (capacity >= max_size) break;
      capacity = std::min(capacity * 2 + 1024, max_size);
    }
    throw Error("zstd: stream decodes to more than the expected maximum of " +
                std::to_string(max_size) + " bytes");
  }

  uint64_t max_encoded_size(uint64_t decoded) const override { return ZSTD_compressBound(decoded); }

 private:
  int level_;
  bool checksum_;
};

std::shared_ptr<Codec> make_zstd(const Json& configuration, const ChunkSpec&) {
  CodecConfig config("zstd", configuration);
  config.reject_unknown({"level", "checksum"});
  // Any int: the level matters to encoding only (clamped there), and stores written with one
  // out of range (numcodecs takes any) must open.
  int level = static_cast<int>(config.integer("level", INT32_MIN, INT32_MAX, 0));
  bool checksum = false;
  if (const Json* value = config.find("checksum")) {
    if (!value->is_boolean())
      config.fail("\"checksum\" must be true or false, got " + value->dump());
    checksum = value->get<bool>();
  }
  return std::make_shared<ZstdCodec>(level, checksum);
}

ZFEED_REGISTER_CODEC("zstd", make_zstd);
// zarr-python's numcodecs codecs (numcodecs.zarr3): the same frames and settings.
ZFEED_REGISTER_CODEC("numcodecs.zstd", make_zstd);

}  // namespace
}  // namespace zfeed
