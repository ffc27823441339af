// The messages of the container checks of compressed chunks before nvCOMP sees them (the checks
// themselves: frame_check_core.h).
#include "zfeed/codec/frame_check.h"

#include <cstdio>
#include <string>

#include "zfeed/codec/blosc_gpu_plan.h"

namespace zfeed::codec {

const char* gpu_codec_name(GpuCodec codec) {
  switch (codec) {
    case GpuCodec::kZstd:
      return "zstd";
    case GpuCodec::kLz4:
      return "lz4";
    case GpuCodec::kLz4Block:
      return "lz4 block";
    case GpuCodec::kGzip:
      return "gzip";
    case GpuCodec::kZlib:
      return "zlib";
    case GpuCodec::kDeflate:
      return "deflate";
    case GpuCodec::kBlosc:
      return "blosc";
  }
  return "unknown";
}

namespace {

std::string hex32(uint64_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", static_cast<unsigned>(value));
  return text;
}

}  // namespace

std::string describe(const FrameVerdict& v) {
  using std::to_string;
  switch (v.problem) {
    case FrameProblem::kNone:
      return "";
    case FrameProblem::kNullSource:
      return "no source bytes (null pointer)";
    case FrameProblem::kZstdTooShort:
      return to_string(v.a) + " bytes is too short for a zstd frame";
    case FrameProblem::kZstdSkippable:
      return "starts with a skippable frame (not decoded on the GPU)";
    case FrameProblem::kZstdMagic:
      return "not a zstd frame (magic " + hex32(v.a) + ")";
    case FrameProblem::kTruncated:
      return "frame truncated at byte " + to_string(v.a) + " of at least " + to_string(v.b);
    case FrameProblem::kZstdReservedBit:
      return "reserved bit set in the frame header";
    case FrameProblem::kZstdDictionary:
      return "frame needs dictionary " + to_string(v.a) + " (not supported)";
    case FrameProblem::kZstdContentSize:
      return "frame says " + to_string(v.a) + " bytes, expected " + to_string(v.b);
    case FrameProblem::kZstdReservedBlock:
      return "reserved block type at byte " + to_string(v.a);
    case FrameProblem::kZstdBlockTooLarge:
      return "block of " + to_string(v.a) + " bytes at byte " + to_string(v.b) +
             " is larger than the frame allows (" + to_string(v.c) + ")";
    case FrameProblem::kZstdTooMuch:
      return "frame holds more than " + to_string(v.a) + " bytes (block at byte " + to_string(v.b) +
             ")";
    case FrameProblem::kZstdTrailing:
      return to_string(v.a) + " bytes after the frame, which ends at byte " + to_string(v.b) +
             " (several frames are not decoded on the GPU)";
    case FrameProblem::kZstdOverLimit:
      return "chunk of " + to_string(v.a) + " bytes is over nvCOMP's zstd limit of 2^31 - 1 bytes";
    case FrameProblem::kLz4TooShort:
      return to_string(v.a) + " bytes is too short for the LZ4 size header";
    case FrameProblem::kLz4Header:
      return "header says " + to_string(v.a) + " bytes, expected " + to_string(v.b);
    case FrameProblem::kLz4Empty:
      return "empty LZ4 block";
    case FrameProblem::kEmptyStream:
      return "empty stream";
    case FrameProblem::kGzipTooShort:
      return to_string(v.a) + " bytes is too short for a gzip stream";
    case FrameProblem::kGzipMagic:
      return "not a gzip stream (starts with " + hex32(v.a) + ")";
    case FrameProblem::kGzipMethod:
      return "compression method " + to_string(v.a) + " is not deflate";
    case FrameProblem::kGzipReservedFlags:
      return "reserved flag bits set in the gzip header";
    case FrameProblem::kGzipHeaderPastEnd:
      return "gzip header runs past the end of the stream";
    case FrameProblem::kGzipTrailer:
      return "trailer says " + to_string(v.a) + " bytes (modulo 2^32), expected " + to_string(v.b);
    case FrameProblem::kZlibTooShort:
      return to_string(v.a) + " bytes is too short for a zlib stream";
    case FrameProblem::kZlibMethod:
      return "compression method " + to_string(v.a) + " is not deflate (not a zlib stream)";
    case FrameProblem::kZlibWindow:
      return "window size field " + to_string(v.a) + " is invalid";
    case FrameProblem::kZlibCheckBits:
      return "header check bits are wrong (not a zlib stream)";
    case FrameProblem::kZlibDictionary:
      return "stream needs a preset dictionary (not supported)";
    case FrameProblem::kOverLimit32:
      return "chunk of " + to_string(v.a) + " bytes is over nvCOMP's limit of 2^32 - 1 bytes";
    case FrameProblem::kBloscOnDevice:
      return "a blosc chunk is split into its streams on the host: it cannot be decoded from "
             "GPU memory";
  }
  return "unknown problem " + to_string(static_cast<int>(v.problem));
}

GpuPayload gpu_payload(GpuCodec codec, const uint8_t* data, size_t size, size_t decoded_size) {
  if (codec == GpuCodec::kBlosc) {  // the whole chunk; its streams: plan_blosc_gpu
    const BloscGpuPlan plan = plan_blosc_gpu(data, size, decoded_size);
    return GpuPayload{0, size, plan.gpu ? "" : !plan.error.empty() ? plan.error : plan.why};
  }
  const FrameVerdict verdict = check_frame(codec, data, size, decoded_size);
  return GpuPayload{static_cast<size_t>(verdict.offset), static_cast<size_t>(verdict.size),
                    describe(verdict)};
}

}  // namespace zfeed::codec
