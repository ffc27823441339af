#include "zfeed/codec/blosc_gpu_plan.h"

#include <algorithm>

namespace zfeed::codec {

namespace {

constexpr size_t kHeaderSize = 16;
constexpr uint8_t kByteShuffle = 0x1, kStored = 0x2, kBitShuffle = 0x4, kDontSplit = 0x10;
constexpr uint64_t kMaxSplits = 16, kMinBufferSize = 128;

uint32_t read_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// A plan that gives the chunk to no GPU copy or stream, saying why in `note` (`why` or `error`).
BloscGpuPlan without_gpu(BloscGpuPlan plan, std::string BloscGpuPlan::*note, std::string text) {
  plan.gpu = false;
  plan.*note = std::move(text);
  plan.streams.clear();
  plan.blocks.clear();
  return plan;
}

// A chunk the GPU path does not take as it is: the CPU decodes it with c-blosc, which reads what
// it can and refuses what is corrupt with its own error.
BloscGpuPlan on_cpu(BloscGpuPlan plan, const std::string& why) {
  return without_gpu(std::move(plan), &BloscGpuPlan::why, "blosc chunk for the CPU: " + why);
}

BloscGpuPlan corrupt(BloscGpuPlan plan, const std::string& what) {
  return without_gpu(std::move(plan), &BloscGpuPlan::error, "blosc: corrupt chunk: " + what);
}

}  // namespace

BloscGpuPlan plan_blosc_gpu(const uint8_t* data, size_t size, uint64_t decoded_size) {
  BloscGpuPlan plan;
  plan.decoded_size = decoded_size;
  if (data == nullptr || size < kHeaderSize)
    return corrupt(plan, std::to_string(size) + " bytes, shorter than the 16-byte header");
  const uint8_t version = data[0], flags = data[2];
  const uint64_t typesize = data[3];
  const uint64_t nbytes = read_u32(data + 4), block_size = read_u32(data + 8);
  const uint64_t stored_size = read_u32(data + 12);
  plan.typesize = typesize;
  if (version == 0 || version > 2)
    return corrupt(plan, "format version " + std::to_string(version) + " (c-blosc 1.x writes 1-2)");
  if (nbytes != decoded_size)
    return corrupt(plan, "it holds " + std::to_string(nbytes) + " bytes, expected " +
                             std::to_string(decoded_size));
  if (stored_size > size)
    return corrupt(plan, "its header says " + std::to_string(stored_size) + " bytes, " +
                             std::to_string(size) + " are stored");
  // What the plan below does not cover exactly as c-blosc reads it goes to c-blosc.
  if (version != 2) return on_cpu(plan, "format version " + std::to_string(version));
  if (typesize == 0) return on_cpu(plan, "type size 0");
  if (flags & 0x08) return on_cpu(plan, "reserved flag 0x08 set");
  if (stored_size != size) {
    return on_cpu(plan, "its header says " + std::to_string(stored_size) + " bytes of " +
                            std::to_string(size));
  }
  if (flags & kStored) {  // the values follow the header as they are
    if (kHeaderSize + nbytes != stored_size)
      return on_cpu(plan, "a stored copy of " + std::to_string(nbytes) + " bytes in " +
                              std::to_string(stored_size));
    plan.gpu = true;
    if (nbytes > 0) plan.streams.push_back({kHeaderSize, nbytes, 0, nbytes, true});
    plan.blocks.push_back({0, nbytes});
    return plan;
  }
  const unsigned compressor = flags >> 5;
  switch (compressor) {
    case 1:
      plan.codec = GpuCodec::kLz4Block;
      break;
    case 3:
      plan.codec = GpuCodec::kZlib;
      break;
    case 4:
      plan.codec = GpuCodec::kZstd;
      break;
    default:
      plan.why = std::string("blosc's inner compressor ") +
                 (compressor == 0   ? "blosclz"
                  : compressor == 2 ? "snappy"
                                    : "(unknown)") +
                 " has no nvCOMP decoder";
      return plan;
  }
  if ((flags & kBitShuffle) && block_size >= typesize) {
    plan.why = "blosc's bit shuffle is undone on the CPU";
    return plan;
  }
  if (nbytes == 0) {
    plan.gpu = true;
    return plan;
  }
  if (block_size == 0) return corrupt(plan, "block size 0");
  if (block_size > nbytes && nbytes > 0) {
    return on_cpu(plan, "block size " + std::to_string(block_size) + " past its " +
                            std::to_string(nbytes) + " bytes");
  }
  const uint64_t blocks = (nbytes + block_size - 1) / block_size;
  if (kHeaderSize + 4 * blocks > stored_size)
    return corrupt(plan, std::to_string(blocks) + " block starts do not fit in " +
                             std::to_string(stored_size) + " bytes");
  plan.shuffled = (flags & kByteShuffle) && typesize > 1;
  const bool dont_split = flags & kDontSplit;
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t offset = b * block_size;
    const uint64_t bsize = std::min(block_size, nbytes - offset);
    const bool leftover = bsize < block_size;
    const uint64_t splits = !dont_split && typesize <= kMaxSplits &&
                                    block_size / typesize >= kMinBufferSize && !leftover
                                ? typesize
                                : 1;
    if (bsize % splits != 0) {  // the streams would not cover the block
      return on_cpu(plan, "block " + std::to_string(b) + " of " + std::to_string(bsize) +
                              " bytes split in " + std::to_string(splits) + " streams");
    }
    const uint64_t split_size = bsize / splits;
    uint64_t at = read_u32(data + kHeaderSize + 4 * b);
    for (uint64_t s = 0; s < splits; ++s) {
      if (at < kHeaderSize + 4 * blocks || at + 4 > stored_size)
        return corrupt(plan, "block " + std::to_string(b) + " starts past its bounds");
      const uint64_t stream_size = read_u32(data + at);
      at += 4;
      if (stream_size > stored_size - at)
        return corrupt(plan, "block " + std::to_string(b) + "'s stream " + std::to_string(s) +
                                 " of " + std::to_string(stream_size) + " bytes runs past the end");
      if (stream_size == 0)
        return corrupt(plan, "block " + std::to_string(b) + " has an empty stream");
      plan.streams.push_back(
          {at, stream_size, offset + s * split_size, split_size, stream_size == split_size});
      at += stream_size;
    }
    plan.blocks.push_back({offset, bsize});
  }
  plan.gpu = true;
  return plan;
}

}  // namespace zfeed::codec
