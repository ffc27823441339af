// Streams, events and device memory for overlapped host-to-device copies: a copy stream moves a
// batch while the consumer's stream runs the previous step; the consumer's stream waits on the
// copy's event (cudaStreamWaitEvent), so nothing ever waits on the whole device. Built only with
// CUDA (ZFEED_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace zfeed::cuda {

// Selects device `index` for the calling thread (cudaSetDevice).
void set_device(int index);

// Device `index` for the calling thread within the scope, then the thread's own again: calls
// from a consumer's thread (next(), a DLPack export) leave its current device (torch's "cuda")
// as they found it.
class DeviceScope {
 public:
  explicit DeviceScope(int index);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// A non-blocking stream (does not synchronize with the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// An event without timing (the cheapest kind), for ordering between streams.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  // Makes `stream` wait for the work before the last record() (no host wait).
  void wait_on(cudaStream_t stream) const;
  bool ready() const;  // cudaEventQuery: the recorded work is done
  void synchronize() const;
  // Milliseconds between `start` and this event (both recorded, with timing).
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

// Device memory from cudaMalloc.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A copy stream: enqueues host-to-device (and device-to-host) copies and records an event after
// them that a consumer stream waits on.
class CopyStream {
 public:
  CopyStream() = default;
  cudaStream_t stream() const { return stream_.get(); }
  // Enqueues the copy (asynchronous with respect to the host where `src` is page-locked).
  void to_device(void* dst, const void* src, size_t bytes);
  void to_host(void* dst, const void* src, size_t bytes);
  // Records the copies enqueued so far into `done` and makes `consumer` wait for them. The host
  // buffer may be reused once done.ready() (or after done.synchronize()).
  void hand_over(Event& done, cudaStream_t consumer);

 private:
  Stream stream_;
};

}  // namespace zfeed::cuda
