// How a c-blosc 1.x chunk decodes on the GPU: its blocks' compressed streams, each an nvCOMP
// item (LZ4 blocks, zstd frames, zlib streams) or a stored copy, and where each goes; then, for
// byte-shuffled chunks, the unshuffle of each block (shuffle_core.h). Parsed on the host from the
// chunk's header and block offsets, every offset and size checked against the chunk, so a corrupt
// chunk gets an error naming what is wrong and never reaches nvCOMP. CUDA-free: tested and fuzzed
// everywhere.
//
// The frame (c-blosc 1.x, format version 2): 16 bytes of header (version, compressor version,
// flags, typesize, decoded size, block size, stored size, little-endian), then unless the chunk is
// stored as a plain copy (flag 0x2) one int32 start per block, and at each start the block's
// streams: `typesize` of them where the block was split (flag 0x10 clear, typesize <= 16,
// block_size / typesize >= 128, not the last partial block), else one; each an int32 size and
// its bytes, stored as is where the size equals the stream's decoded size. Flags 0x1 and 0x4 are
// byte and bit shuffle; bits 5-7 the compressor (0 blosclz, 1 lz4/lz4hc, 2 snappy, 3 zlib, 4 zstd).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zfeed/codec/frame_check_core.h"

namespace zfeed::codec {

struct BloscGpuStream {
  uint64_t src_offset = 0, src_size = 0;  // in the stored chunk
  uint64_t dst_offset = 0, size = 0;      // in the decoded (or, shuffled, staged) chunk
  bool stored = false;                    // a plain copy, no decoding
};

struct BloscGpuBlock {
  uint64_t offset = 0, size = 0;  // in the decoded chunk
};

struct BloscGpuPlan {
  // Whether the chunk decodes on the GPU; if not, `why` says why (blosclz, snappy, bit shuffle),
  // and `error` is set instead where the chunk is corrupt.
  bool gpu = false;
  std::string why, error;
  GpuCodec codec = GpuCodec::kLz4Block;  // of every non-stored stream
  uint64_t decoded_size = 0, typesize = 1;
  // Byte-shuffled: the streams decode into a staging copy of the chunk, then each block is
  // unshuffled into place; else they decode into place.
  bool shuffled = false;
  std::vector<BloscGpuStream> streams;
  std::vector<BloscGpuBlock> blocks;
};

// The plan of the chunk `data` (its stored bytes), which must decode to `decoded_size` bytes.
BloscGpuPlan plan_blosc_gpu(const uint8_t* data, size_t size, uint64_t decoded_size);

}  // namespace zfeed::codec
