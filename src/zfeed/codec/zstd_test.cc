// zstd (bytes->bytes), including frames without a content size and corrupt streams.
#include <gtest/gtest.h>
#include <zstd.h>

#include "zfeed/codec/codec_testing.h"
#include "zfeed/util/error.h"

namespace zfeed {
namespace {

using testing::make_chain;
using testing::make_spec;

constexpr const char* kBytesZstd =
    R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 3}}])";

// A zstd frame of `data` written by the streaming API with no content size in its header.
Bytes frame_without_content_size(ByteView data, int level = 3) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  Bytes out(ZSTD_compressBound(data.size()) + 64);
  ZSTD_inBuffer input{data.data(), data.size(), 0};
  ZSTD_outBuffer output{out.data(), out.size(), 0};
  size_t left;
  do {
    left = ZSTD_compressStream2(cctx, &output, &input, ZSTD_e_end);
    EXPECT_FALSE(ZSTD_isError(left));
  } while (left != 0 && !ZSTD_isError(left));
  ZSTD_freeCCtx(cctx);
  out.resize(output.pos);
  return out;
}

Bytes frame_with_content_size(ByteView data, int level = 3) {
  Bytes out(ZSTD_compressBound(data.size()));
  size_t size = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), level);
  EXPECT_FALSE(ZSTD_isError(size));
  out.resize(size);
  return out;
}

Bytes concat(ByteView a, ByteView b) {
  Bytes out(a);
  out.append(b);
  return out;
}

TEST(ZstdCodec, RoundTripLevelsAndChecksum) {
  auto spec = make_spec(DataTypeId::kFloat32, {16, 32});
  Bytes values = testing::sample_chunk(spec);
  for (const char* config : {R"({"level": 1})", R"({"level": 3, "checksum": true})",
                             R"({"level": 19})", R"({"level": -3})", R"({})",
                             // numcodecs takes any level; zstd clamps it (kept as written)
                             R"({"level": 100})"}) {
    SCOPED_TRACE(config);
    CodecChain chain =
        make_chain(std::string(R"([{"name": "bytes", "configuration": {"endian": "little"}},
                                                 {"name": "zstd", "configuration": )") +
                       config + "}]",
                   spec);
    Bytes encoded = testing::expect_round_trip(chain, values);
    EXPECT_LT(encoded.size(), values.size());
    // Encoders pledge the size: the frame header holds it.
    EXPECT_EQ(ZSTD_getFrameContentSize(encoded.data(), encoded.size()), values.size());
  }
}

TEST(ZstdCodec, FrameWithoutContentSizeDecodes) {
  auto spec = make_spec(DataTypeId::kUInt16, {64, 64});
  Bytes values = testing::sample_chunk(spec, 4);
  Bytes frame = frame_without_content_size(values);
  ASSERT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  Bytes out(values.size());
  make_chain(kBytesZstd, spec).decode(frame, out.data());
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), values.size()));
}

TEST(ZstdCodec, FrameWithoutContentSizeWhereTheSizeIsUnknown) {
  // The outer zstd of [bytes, zstd, zstd] cannot know its decoded size: it streams, bounded.
  auto spec = make_spec(DataTypeId::kInt32, {100, 30});
  Bytes values = testing::sample_chunk(spec, 8);
  Bytes inner = frame_with_content_size(values);
  Bytes outer = frame_without_content_size(inner);
  CodecChain chain = make_chain(
      R"([{"name": "bytes", "configuration": {"endian": "little"}}, "zstd", "zstd"])", spec);
  Bytes out(values.size());
  chain.decode(outer, out.data());
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), values.size()));
  // And the chain's own encoding round-trips.
  testing::expect_round_trip(chain, values);
}

TEST(ZstdCodec, ConcatenatedFramesDecode) {
  auto spec = make_spec(DataTypeId::kUInt8, {2000});
  Bytes values = testing::sample_chunk(spec, 2);
  ByteView first = values.view().first(700), second = values.view().subspan(700);
  CodecChain chain = make_chain(kBytesZstd, spec);
  for (Bytes stream :
       {concat(frame_with_content_size(first), frame_with_content_size(second)),
        concat(frame_without_content_size(first), frame_without_content_size(second))}) {
    Bytes out(values.size());
    chain.decode(stream, out.data());
    EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), values.size()));
  }
}

TEST(ZstdCodec, EmptyChunk) {
  auto spec = make_spec(DataTypeId::kFloat64, {0});
  CodecChain chain = make_chain(kBytesZstd, spec);
  testing::expect_round_trip(chain, Bytes());
  Bytes frame = frame_without_content_size(ByteView{});
  chain.decode(frame, nullptr);
}

TEST(ZstdCodec, CorruptStreamsAreErrors) {
  auto spec = make_spec(DataTypeId::kFloat32, {32, 32});
  Bytes values = testing::sample_chunk(spec, 6);
  CodecChain chain = make_chain(kBytesZstd, spec);
  Bytes good = chain.encode(values.data());

  // Not a zstd frame at all.
  std::string message = testing::decode_error(chain, testing::pseudo_random_bytes(100, 3));
  EXPECT_CONTAINS(message, "zstd");
  EXPECT_CONTAINS(message, "not a zstd frame");

  // Truncated, with and without a content size.
  for (Bytes frame : {good, frame_without_content_size(values)}) {
    for (size_t keep : {frame.size() - 1, frame.size() / 2, size_t{6}, size_t{0}}) {
      SCOPED_TRACE(keep);
      message = testing::decode_error(chain, frame.view().first(keep));
      // Cut short after the magic number: a truncated stream, not "not a zstd frame".
      EXPECT_CONTAINS(message, keep >= 4 ? "zstd: corrupt or truncated stream" : "zstd");
    }
  }

  // Bytes flipped inside the compressed blocks.
  for (size_t at : {good.size() / 3, good.size() / 2, good.size() - 5}) {
    Bytes bad = good;
    for (size_t i = at; i < std::min(at + 8, bad.size()); ++i) bad[i] ^= 0x5A;
    Bytes out(values.size());
    try {
      chain.decode(bad, out.data());
      // A flip that zstd cannot detect (no checksum) must still leave a full, bounded output.
    } catch (const Error& e) {
      EXPECT_CONTAINS(std::string(e.what()), "zstd");
    }
  }
  // With a checksum every flip is caught.
  CodecChain checked = make_chain(
      R"([{"name": "bytes", "configuration": {"endian": "little"}},
          {"name": "zstd", "configuration": {"level": 3, "checksum": true}}])",
      spec);
  Bytes sealed = checked.encode(values.data());
  sealed[sealed.size() - 2] ^= 0xFF;
  EXPECT_CONTAINS(testing::decode_error(checked, sealed), "zstd");
}

TEST(ZstdCodec, DecompressionBombIsRefused) {
  auto spec = make_spec(DataTypeId::kUInt8, {1024});
  CodecChain chain = make_chain(kBytesZstd, spec);
  Bytes huge(64 << 20);  // 64 MiB of zeros compresses to a few KiB
  std::memset(huge.data(), 0, huge.size());
  // With the size in the header: refused before decompressing.
  std::string message = testing::decode_error(chain, frame_with_content_size(huge, 1));
  EXPECT_CONTAINS(message, "more than the expected 1024");
  // Without it: streaming stops at the expected size.
  message = testing::decode_error(chain, frame_without_content_size(huge, 1));
  EXPECT_CONTAINS(message, "more than the expected 1024");
  // Just one byte too many, or too few.
  Bytes one_more(1025), one_less(1023);
  std::memset(one_more.data(), 1, one_more.size());
  std::memset(one_less.data(), 1, one_less.size());
  EXPECT_CONTAINS(testing::decode_error(chain, frame_without_content_size(one_more)),
                  "more than the expected");
  EXPECT_CONTAINS(testing::decode_error(chain, frame_with_content_size(one_less)),
                  "decodes to 1023 bytes, expected 1024");
  EXPECT_CONTAINS(testing::decode_error(chain, frame_without_content_size(one_less)), "1023");

  // Where the size is not known in advance ([bytes, zstd, zstd]), the bound still holds.
  CodecChain unknown = make_chain(
      R"([{"name": "bytes", "configuration": {"endian": "little"}}, "zstd", "zstd"])", spec);
  message = testing::decode_error(unknown, frame_without_content_size(huge, 1));
  EXPECT_CONTAINS(message, "more than the expected maximum");
  message = testing::decode_error(unknown, frame_with_content_size(huge, 1));
  EXPECT_CONTAINS(message, "more than the expected maximum");
}

// decode_prefix gives exactly the first bytes of the full decode, from one frame or several,
// with or without content sizes, through a crc32c too; it stops early enough that a stream cut
// after the needed part still gives it.
TEST(ZstdCodec, PrefixDecodesEqualTheStartOfTheWholeDecode) {
  // 1 MiB: zstd stops at block boundaries (128 KiB of output), so it needs several blocks.
  auto spec = make_spec(DataTypeId::kFloat32, {1024, 256});
  const Bytes values = testing::sample_chunk(spec);
  const ByteView half_values{values.data(), values.size() / 2};
  const ByteView rest_values{values.data() + values.size() / 2, values.size() / 2};
  const CodecChain chain = make_chain(kBytesZstd, spec);
  const CodecChain checked = make_chain(
      R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"},
          {"name": "crc32c"}])",
      spec);
  const std::vector<std::pair<std::string, Bytes>> streams = {
      {"one frame", chain.encode(values.data())},
      {"no content size", frame_without_content_size(values)},
      {"two frames",
       concat(frame_with_content_size(half_values), frame_without_content_size(rest_values))}};
  for (const auto& [name, stream] : streams) {
    for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{4096}, values.size() / 2 - 3,
                          values.size() / 2 + 5, values.size() - 1, values.size()}) {
      SCOPED_TRACE(name + ", " + std::to_string(size) + " bytes");
      Bytes out(size);
      ASSERT_TRUE(chain.decode_prefix(stream, out.data(), size));
      EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), size));
    }
  }
  Bytes out(1000);
  ASSERT_TRUE(checked.decode_prefix(checked.encode(values.data()), out.data(), out.size()));
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), out.size()));

  // Cut after a third: the first quarter still decodes, the first half is a clear error.
  Bytes cut = chain.encode(values.data());
  cut.resize(cut.size() / 3);
  Bytes quarter(values.size() / 4);
  ASSERT_TRUE(chain.decode_prefix(cut, quarter.data(), quarter.size()));
  EXPECT_TRUE(testing::same_bytes(quarter.data(), values.data(), quarter.size()));
  Bytes half(values.size() / 2);
  EXPECT_CONTAINS(testing::error_of([&] { chain.decode_prefix(cut, half.data(), half.size()); }),
                  "needed");
  EXPECT_CONTAINS(testing::error_of([&] {
                    chain.decode_prefix(Bytes(std::string_view("not zstd")), half.data(), 8);
                  }),
                  "not a zstd frame");
}

TEST(ZstdCodec, ChainsThatCannotStopEarlySayNo) {
  auto spec = make_spec(DataTypeId::kFloat32, {8, 8});
  const Bytes values = testing::sample_chunk(spec);
  Bytes out(values.size());
  for (const char* codecs :
       {R"([{"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "bytes",
            "configuration": {"endian": "little"}}, {"name": "zstd"}])",
        R"([{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "zstd"}])",
        R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip",
            "configuration": {"level": 1}}])"}) {
    SCOPED_TRACE(codecs);
    const CodecChain chain = make_chain(codecs, spec);
    EXPECT_FALSE(chain.can_decode_prefix());
    EXPECT_FALSE(chain.decode_prefix(chain.encode(values.data()), out.data(), 16));
  }
  for (const char* codecs :
       {R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}])",
        R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"},
            {"name": "crc32c"}])",
        R"([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}])"}) {
    EXPECT_TRUE(make_chain(codecs, spec).can_decode_prefix()) << codecs;
  }
  // Uncompressed: the prefix is the stored bytes themselves.
  const CodecChain raw =
      make_chain(R"([{"name": "bytes", "configuration": {"endian": "little"}}])", spec);
  ASSERT_TRUE(raw.decode_prefix(raw.encode(values.data()), out.data(), 16));
  EXPECT_TRUE(testing::same_bytes(out.data(), values.data(), 16));
  EXPECT_FALSE(raw.decode_prefix(raw.encode(values.data()), out.data(), values.size() + 1));
}

}  // namespace
}  // namespace zfeed
