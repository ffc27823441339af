#include <string>
#include <type_traits>

#include "zfeed/cuda/cast_kernels.h"
#include "zfeed/cuda/check.h"

namespace zfeed::cuda {

size_t source_size(SourceType type) {
  switch (type) {
    case SourceType::kUInt8:
    case SourceType::kInt8:
      return 1;
    case SourceType::kUInt16:
    case SourceType::kInt16:
    case SourceType::kFloat16:
    case SourceType::kBFloat16:
      return 2;
    case SourceType::kUInt32:
    case SourceType::kInt32:
    case SourceType::kFloat32:
      return 4;
    case SourceType::kUInt64:
    case SourceType::kInt64:
    case SourceType::kFloat64:
      return 8;
  }
  return 0;
}

const char* source_name(SourceType type) {
  static const char* const names[] = {"uint8",   "int8",     "uint16",  "int16",
                                      "uint32",  "int32",    "uint64",  "int64",
                                      "float16", "bfloat16", "float32", "float64"};
  return names[static_cast<int>(type)];
}

namespace {

template <OutputType Out>
__global__ void cast_planes_kernel(const CastPlane* planes, uint32_t num_planes) {
  for (uint32_t p = blockIdx.y; p < num_planes; p += gridDim.y) {
    const CastPlane plane = planes[p];
    const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
    const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    cast_range<Out>(plane, first, stride);  // one type per plane: no divergence
  }
}

template <OutputType Out>
void cast_planes_host_as(std::span<const CastPlane> planes) {
  for (const CastPlane& plane : planes) cast_range<Out>(plane, 0, 1);
}

}  // namespace

void cast_planes_host(std::span<const CastPlane> planes, OutputType out) {
  switch (out) {
    case OutputType::kFloat32:
      return cast_planes_host_as<OutputType::kFloat32>(planes);
    case OutputType::kFloat16:
      return cast_planes_host_as<OutputType::kFloat16>(planes);
    case OutputType::kBFloat16:
      return cast_planes_host_as<OutputType::kBFloat16>(planes);
    case OutputType::kInt64:
      return cast_planes_host_as<OutputType::kInt64>(planes);
  }
}

void cast_planes(std::span<const CastPlane> planes, OutputType out, DeviceBuffer& descriptors,
                 cudaStream_t stream) {
  if (planes.empty()) return;
  uint64_t longest = 0;
  for (const CastPlane& plane : planes) {
    const auto src = reinterpret_cast<uintptr_t>(plane.src);
    const auto dst = reinterpret_cast<uintptr_t>(plane.dst);
    if (src % source_size(plane.type) || dst % loader::output_size(out))
      throw Error(std::string("cuda cast: a plane of ") + source_name(plane.type) + " to " +
                  loader::output_name(out) + " is not aligned to its element size");
    if (plane.count > longest) longest = plane.count;
  }
  const size_t bytes = planes.size() * sizeof(CastPlane);
  if (descriptors.size() < bytes) descriptors = DeviceBuffer(bytes);
  // From pageable memory: returns once staged, so `planes` may go away after this call.
  check(cudaMemcpyAsync(descriptors.data(), planes.data(), bytes, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (cast descriptors)");
  constexpr unsigned kThreads = 256;
  const uint64_t blocks_per_plane = (longest + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(blocks_per_plane < 1024 ? blocks_per_plane : 1024),
                  static_cast<unsigned>(planes.size() < 65535 ? planes.size() : 65535));
  const auto* device_planes = reinterpret_cast<const CastPlane*>(descriptors.data());
  const auto count = static_cast<uint32_t>(planes.size());
  switch (out) {
    case OutputType::kFloat32:
      cast_planes_kernel<OutputType::kFloat32><<<grid, kThreads, 0, stream>>>(device_planes, count);
      break;
    case OutputType::kFloat16:
      cast_planes_kernel<OutputType::kFloat16><<<grid, kThreads, 0, stream>>>(device_planes, count);
      break;
    case OutputType::kBFloat16:
      cast_planes_kernel<OutputType::kBFloat16>
          <<<grid, kThreads, 0, stream>>>(device_planes, count);
      break;
    case OutputType::kInt64:
      cast_planes_kernel<OutputType::kInt64><<<grid, kThreads, 0, stream>>>(device_planes, count);
      break;
  }
  check(cudaGetLastError(), "cast kernel launch");
}

}  // namespace zfeed::cuda
