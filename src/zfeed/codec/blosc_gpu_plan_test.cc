#include "zfeed/codec/blosc_gpu_plan.h"

#include <blosc.h>
#include <gtest/gtest.h>
#include <libdeflate.h>
#include <lz4.h>
#include <zstd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "zfeed/codec/shuffle_core.h"

namespace zfeed::codec {
namespace {

std::vector<uint8_t> compress(const std::vector<uint8_t>& values, const char* cname, int clevel,
                              int shuffle, size_t typesize, size_t blocksize) {
  std::vector<uint8_t> out(values.size() + BLOSC_MAX_OVERHEAD);
  const int size = blosc_compress_ctx(clevel, shuffle, typesize, values.size(), values.data(),
                                      out.data(), out.size(), cname, blocksize, 1);
  EXPECT_GT(size, 0) << cname;
  out.resize(static_cast<size_t>(std::max(size, 0)));
  return out;
}

// What the GPU does with a plan, done on the CPU: each stream decoded (or copied) to its place,
// then each block unshuffled.
std::vector<uint8_t> decode_as_planned(const BloscGpuPlan& plan,
                                       const std::vector<uint8_t>& chunk) {
  std::vector<uint8_t> staged(plan.decoded_size), out(plan.decoded_size);
  libdeflate_decompressor* inflater = libdeflate_alloc_decompressor();
  for (const BloscGpuStream& s : plan.streams) {
    const uint8_t* src = chunk.data() + s.src_offset;
    uint8_t* dst = staged.data() + s.dst_offset;
    EXPECT_LE(s.dst_offset + s.size, plan.decoded_size);
    if (s.stored) {
      std::memcpy(dst, src, s.size);
      continue;
    }
    size_t got = 0;
    switch (plan.codec) {
      case GpuCodec::kLz4Block:
        got = static_cast<size_t>(std::max(
            0, LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                                   static_cast<int>(s.src_size), static_cast<int>(s.size))));
        break;
      case GpuCodec::kZstd:
        got = ZSTD_decompress(dst, s.size, src, s.src_size);
        break;
      case GpuCodec::kZlib:
        EXPECT_EQ(libdeflate_zlib_decompress(inflater, src, s.src_size, dst, s.size, &got),
                  LIBDEFLATE_SUCCESS);
        break;
      default:
        ADD_FAILURE() << "unexpected codec";
    }
    EXPECT_EQ(got, s.size) << "stream at " << s.src_offset;
  }
  libdeflate_free_decompressor(inflater);
  if (!plan.shuffled) return staged;
  for (const BloscGpuBlock& b : plan.blocks)
    unshuffle_block(staged.data() + b.offset, out.data() + b.offset, b.size, plan.typesize);
  return out;
}

std::vector<uint8_t> smooth_values(size_t bytes) {
  std::vector<uint8_t> values(bytes);
  std::vector<float> floats(bytes / 4 + 1);
  for (size_t i = 0; i < floats.size(); ++i)
    floats[i] = 280.0f + 10.0f * std::sin(0.001f * static_cast<float>(i));
  std::memcpy(values.data(), floats.data(), bytes);
  return values;
}

// Every compressor nvCOMP decodes, with and without byte shuffle, element sizes that do and do
// not split blocks, forced small blocks with a partial last one, a chunk stored as a copy: the
// plan's streams, decoded and unshuffled, give back exactly the values c-blosc compressed.
TEST(BloscGpuPlan, DecodingThePlanGivesTheValues) {
  for (const char* cname : {"lz4", "lz4hc", "zstd", "zlib"}) {
    for (int shuffle : {BLOSC_NOSHUFFLE, BLOSC_SHUFFLE}) {
      for (size_t typesize : {size_t{1}, size_t{2}, size_t{4}, size_t{8}, size_t{3}, size_t{16}}) {
        for (size_t bytes : {size_t{100}, size_t{65536 * 3 + 1000}, size_t{1000003}}) {
          for (size_t blocksize : {size_t{0}, size_t{4096}}) {
            for (int clevel : {0, 5}) {
              const std::vector<uint8_t> values = smooth_values(bytes);
              const std::vector<uint8_t> chunk =
                  compress(values, cname, clevel, shuffle, typesize, blocksize);
              const BloscGpuPlan plan = plan_blosc_gpu(chunk.data(), chunk.size(), bytes);
              SCOPED_TRACE(std::string(cname) + " shuffle " + std::to_string(shuffle) +
                           " typesize " + std::to_string(typesize) + " bytes " +
                           std::to_string(bytes) + " blocksize " + std::to_string(blocksize) +
                           " clevel " + std::to_string(clevel));
              ASSERT_TRUE(plan.gpu) << plan.why << plan.error;
              ASSERT_TRUE(decode_as_planned(plan, chunk) == values);
            }
          }
        }
      }
    }
  }
}

TEST(BloscGpuPlan, SplitBlocksGiveOneStreamPerByteOfTheElement) {
  // Forced splitting (as blosclz and pre-1.14 c-blosc wrote): typesize streams per whole block.
  blosc_set_splitmode(BLOSC_ALWAYS_SPLIT);
  const std::vector<uint8_t> values = smooth_values(300000);
  const std::vector<uint8_t> chunk = compress(values, "lz4", 5, BLOSC_SHUFFLE, 4, 65536);
  blosc_set_splitmode(BLOSC_FORWARD_COMPAT_SPLIT);
  const BloscGpuPlan plan = plan_blosc_gpu(chunk.data(), chunk.size(), values.size());
  ASSERT_TRUE(plan.gpu) << plan.error;
  // c-blosc enlarges a split codec's block by the typesize: 262144 bytes, so two blocks.
  EXPECT_EQ(plan.blocks.size(), 2u);
  EXPECT_EQ(plan.streams.size(), 4u + 1);  // the last, partial block is never split
  EXPECT_TRUE(decode_as_planned(plan, chunk) == values);
}

TEST(BloscGpuPlan, SaysWhyNotForBloscOnlyCodecsAndBitShuffle) {
  const std::vector<uint8_t> values = smooth_values(100000);
  for (const char* cname : {"blosclz"}) {
    const auto chunk = compress(values, cname, 5, BLOSC_SHUFFLE, 4, 0);
    const BloscGpuPlan plan = plan_blosc_gpu(chunk.data(), chunk.size(), values.size());
    EXPECT_FALSE(plan.gpu);
    EXPECT_NE(plan.why.find("blosclz has no nvCOMP decoder"), std::string::npos) << plan.why;
    EXPECT_TRUE(plan.error.empty());
  }
  const auto chunk = compress(values, "lz4", 5, BLOSC_BITSHUFFLE, 4, 0);
  const BloscGpuPlan plan = plan_blosc_gpu(chunk.data(), chunk.size(), values.size());
  EXPECT_FALSE(plan.gpu);
  EXPECT_NE(plan.why.find("bit shuffle"), std::string::npos) << plan.why;
}

TEST(BloscGpuPlan, CorruptChunksSayWhatIsWrong) {
  const std::vector<uint8_t> values = smooth_values(200000);
  const std::vector<uint8_t> chunk = compress(values, "zstd", 5, BLOSC_SHUFFLE, 4, 16384);
  auto error_of = [&](std::vector<uint8_t> bytes, uint64_t expected) {
    return plan_blosc_gpu(bytes.data(), bytes.size(), expected).error;
  };
  EXPECT_NE(error_of({1, 2, 3}, 10).find("shorter than the 16-byte header"), std::string::npos);
  EXPECT_NE(error_of(chunk, 100).find("holds 200000 bytes, expected 100"), std::string::npos);
  std::vector<uint8_t> truncated(chunk.begin(), chunk.end() - 50);
  EXPECT_NE(error_of(truncated, values.size()).find("are stored"), std::string::npos);
  std::vector<uint8_t> bad_start = chunk;
  bad_start[16] = 0xFF;  // the first block's start, far past the end
  bad_start[17] = 0xFF;
  bad_start[18] = 0xFF;
  EXPECT_NE(error_of(bad_start, values.size()).find("block 0 starts past its bounds"),
            std::string::npos);
  std::vector<uint8_t> long_stream = chunk;
  const uint32_t start = uint32_t{chunk[16]} | uint32_t{chunk[17]} << 8;
  long_stream[start + 3] = 0x7F;  // the first stream's size, past the end
  EXPECT_NE(error_of(long_stream, values.size()).find("runs past the end"), std::string::npos);
}

// Headers c-blosc refuses (or reads otherwise than the plan would) go to the CPU, whose c-blosc
// reports them, never to the GPU with streams that leave bytes of the block unwritten.
TEST(BloscGpuPlan, HeadersTheGpuPlanDoesNotCoverGoToTheCpu) {
  const std::vector<uint8_t> values = smooth_values(200000);
  const std::vector<uint8_t> chunk = compress(values, "lz4", 5, BLOSC_SHUFFLE, 4, 16384);
  ASSERT_TRUE(plan_blosc_gpu(chunk.data(), chunk.size(), values.size()).gpu);
  auto why_of = [&](std::vector<uint8_t> bytes) {
    const BloscGpuPlan plan = plan_blosc_gpu(bytes.data(), bytes.size(), values.size());
    EXPECT_FALSE(plan.gpu);
    EXPECT_TRUE(plan.error.empty()) << plan.error;
    return plan.why;
  };
  auto changed = [&](size_t at, uint8_t value) {
    std::vector<uint8_t> bytes = chunk;
    bytes[at] = value;
    return bytes;
  };
  EXPECT_NE(why_of(changed(0, 1)).find("format version 1"), std::string::npos);
  EXPECT_NE(why_of(changed(3, 0)).find("type size 0"), std::string::npos);
  EXPECT_NE(why_of(changed(2, chunk[2] | 0x08)).find("reserved flag"), std::string::npos);
  std::vector<uint8_t> trailing = chunk;
  trailing.push_back(0);
  EXPECT_NE(why_of(trailing).find("bytes of"), std::string::npos);
  // Type size 7 over blocks of 16384 bytes: 7 streams of 2340 bytes leave 4 bytes of each block.
  EXPECT_NE(why_of(changed(3, 7)).find("split in 7 streams"), std::string::npos);
}

TEST(Unshuffle, InvertsBloscsShuffleWithATail) {
  for (uint64_t typesize : {2u, 3u, 4u, 8u}) {
    std::vector<uint8_t> values(1003), shuffled(values.size()), back(values.size());
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7 + 1);
    const uint64_t elements = values.size() / typesize;
    for (uint64_t i = 0; i < elements; ++i)
      for (uint64_t j = 0; j < typesize; ++j) shuffled[j * elements + i] = values[i * typesize + j];
    for (size_t k = elements * typesize; k < values.size(); ++k) shuffled[k] = values[k];
    unshuffle_block(shuffled.data(), back.data(), values.size(), typesize);
    EXPECT_EQ(back, values) << typesize;
  }
}

}  // namespace
}  // namespace zfeed::codec
