#include "zfeed/cuda/check.h"
#include "zfeed/cuda/frame_check_kernel.h"

namespace zfeed::cuda {

namespace {

__global__ void check_frames(DeviceFrameChecks batch) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= batch.checks) return;
  const uint32_t pos = batch.positions[i];
  const auto* data = static_cast<const uint8_t*>(batch.in_ptrs[pos]);
  const codec::FrameVerdict verdict =
      codec::check_frame(static_cast<codec::GpuCodec>(batch.codecs[pos]), data, batch.in_sizes[pos],
                         batch.out_capacity[pos]);
  batch.verdicts[i] = verdict;
  if (verdict.problem == codec::FrameProblem::kNone) {
    batch.in_ptrs[pos] = data + verdict.offset;
    batch.in_sizes[pos] = verdict.size;
  } else {
    batch.in_sizes[pos] = 0;
    batch.out_capacity[pos] = 0;
  }
}

}  // namespace

void launch_frame_checks(const DeviceFrameChecks& batch, cudaStream_t stream) {
  if (batch.checks == 0) return;
  // A few chunks per batch, each walked serially by one thread: small blocks spread them out.
  constexpr unsigned kThreads = 32;
  const unsigned blocks = static_cast<unsigned>((batch.checks + kThreads - 1) / kThreads);
  check_frames<<<blocks, kThreads, 0, stream>>>(batch);
  check(cudaGetLastError(), "launching the GPU frame checks");
}

}  // namespace zfeed::cuda
