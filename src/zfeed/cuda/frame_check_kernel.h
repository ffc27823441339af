// Container checks on the GPU, for chunks whose stored bytes are already in device memory (read
// there by cuFile): the host cannot look at them, so one thread per chunk runs the host's check
// (zfeed/codec/frame_check_core.h, the same code) over the device bytes, writes its verdict, and
// points nvCOMP's input arrays at the payload, or at nothing (size 0) for a chunk that fails, so
// that nvCOMP never decodes a malformed stream. Built only with CUDA (ZFEED_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "zfeed/codec/frame_check_core.h"

namespace zfeed::cuda {

// Device arrays of one batch (GpuDecoder's layout), all of `count` entries but `positions`, which
// lists the `checks` entries whose bytes are on the device.
struct DeviceFrameChecks {
  const void** in_ptrs = nullptr;   // in: the stored bytes; out: the payload
  size_t* in_sizes = nullptr;       // in: the stored size; out: the payload's (0 where it failed)
  size_t* out_capacity = nullptr;   // the decoded size; out: 0 where it failed
  const uint8_t* codecs = nullptr;  // codec::GpuCodec per entry
  const uint32_t* positions = nullptr;
  size_t checks = 0;
  codec::FrameVerdict* verdicts = nullptr;  // per checked entry, in the order of `positions`
};

// Enqueues the checks on `stream`; returns at once. Nothing to do when checks == 0.
void launch_frame_checks(const DeviceFrameChecks& batch, cudaStream_t stream);

}  // namespace zfeed::cuda
