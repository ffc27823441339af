#include "zfeed/cuda/copy_stream.h"

#include <utility>

#include "zfeed/cuda/check.h"

namespace zfeed::cuda {

void set_device(int index) { check(cudaSetDevice(index), "cudaSetDevice"); }

DeviceScope::DeviceScope(int index) {
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current == index) return;
  check(cudaSetDevice(index), "cudaSetDevice");
  previous_ = current;
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

Stream::Stream() {
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}
Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}
void Stream::synchronize() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

Event::Event(bool timing) {
  check(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreate");
}
Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}
void Event::record(cudaStream_t stream) {
  check(cudaEventRecord(event_, stream), "cudaEventRecord");
}
void Event::wait_on(cudaStream_t stream) const {
  check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}
bool Event::ready() const {
  const cudaError_t error = cudaEventQuery(event_);
  if (error == cudaErrorNotReady) return false;
  check(error, "cudaEventQuery");
  return true;
}
void Event::synchronize() const { check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start.event_, event_), "cudaEventElapsedTime");
  return ms;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : size_(bytes) {
  void* data = nullptr;
  if (bytes) check(cudaMalloc(&data, bytes), "cudaMalloc");
  data_ = static_cast<uint8_t*>(data);
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void CopyStream::to_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()),
        "cudaMemcpyAsync (host to device)");
}
void CopyStream::to_host(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()),
        "cudaMemcpyAsync (device to host)");
}
void CopyStream::hand_over(Event& done, cudaStream_t consumer) {
  done.record(stream_.get());
  done.wait_on(consumer);
}

}  // namespace zfeed::cuda
