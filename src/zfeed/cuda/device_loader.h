// Batches on the GPU: a loader::Loader assembles raw values (float32, labels int64) into its
// batch buffers, pinned once (cudaHostRegister: the loader reuses the same few buffers); a copy
// stream moves each batch into device staging memory and a kernel normalizes and casts it into
// one of the device output buffers (loader/cast.h's per-element code, so the values equal the
// CPU loader's bit for bit). next() keeps `depth` batches in flight on the copy stream, so the
// copy of batch k+1 runs while the consumer's stream trains on batch k.
//
// Ordering, never a device-wide synchronize: a consumer stream waits on a batch's ready event
// (DeviceBatch::wait_on); when the consumer lets go of a batch (release() with the streams that
// used it), an event is recorded on each of those streams and the copy stream waits on them before
// it overwrites that output buffer. The host buffer goes back to the loader once its copy's event
// has completed.
//
// With decode="gpu", chunks of local stores may be read by cuFile straight into device memory
// (options.gds; the host loader then only locates them): several reads in flight, each chunk
// placed where its device address agrees with its file offset modulo 4 KiB, and their containers
// checked on the GPU before nvCOMP (cuda/frame_check_kernel.h). A failed cuFile read turns those
// reads over to the host for good and retries the batch. Built only with CUDA (ZFEED_HAVE_CUDA)
// and the loader (not ZFEED_CUDA_ONLY).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "zfeed/cuda/cast_kernels.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/gds.h"
#include "zfeed/cuda/gpu_decode.h"
#include "zfeed/loader/loader.h"
#include "zfeed/util/error.h"
#include "zfeed/util/json.h"

namespace zfeed::cuda {

struct DeviceLoaderOptions {
  int device = 0;
  // Batches enqueued on the copy stream ahead of the one handed out: 1 double-buffers, 2
  // triple-buffers.
  uint64_t depth = 2;
  // Where chunks are decoded: "cpu" (the host loader's threads), "gpu" (nvCOMP: the host reads
  // the stored chunks, the GPU decodes them in one batched call per codec; chunks nvCOMP does
  // not cover still decode on the CPU, in the same batch), "auto" (measures both on the first
  // batches and keeps the faster).
  std::string decode = "cpu";
  // How chunks that decode on the GPU are read, where their store keeps local files: "auto" (by
  // cuFile straight into GPU memory where GPUDirect Storage runs in full, i.e. with the nvidia-fs
  // driver; else by the host through its pinned batch memory), "on" (always by cuFile, also in
  // its compat mode; an error where cuFile is unavailable), "off" (by the host). "" takes
  // ZFEED_GDS, else "auto".
  std::string gds = "";
};

class DeviceLoader;

// One device output buffer: inputs and targets of a batch, lent to the consumer.
struct DeviceSlot {
  DeviceBuffer inputs, targets;
  Event ready{true};  // recorded on the copy stream after the batch's cast (timed: decode="auto")
  // Recorded on the consumer streams that used the batch; the copy stream waits on them before
  // the slot is overwritten. Guarded by DeviceLoader::Shared::mutex.
  std::vector<std::unique_ptr<Event>> released;
  size_t used_events = 0;
  uint64_t references = 0;  // handles the consumer holds
};

// A batch on the device. Its memory stays the consumer's until every copy of the handle is gone.
struct DeviceBatch {
  uint64_t epoch = 0, index = 0, size = 0;
  std::vector<int64_t> times;  // per sample
  std::vector<int64_t> crops;  // (lat_start, lon_start) per sample
  // Device pointers, shaped as the loader's input_shape() / target_shape() with `size` samples,
  // of the loader's input_type() / target_type().
  void* inputs = nullptr;
  void* targets = nullptr;
  // Makes `stream` wait until the batch is on the device (no host wait).
  void wait_on(cudaStream_t stream) const;
  // A reference to the slot, dropped by release(): the slot is reused once every reference is
  // released and the streams given there have passed the point of release.
  class Handle;
  std::shared_ptr<Handle> handle;
};

class DeviceBatch::Handle {
 public:
  Handle(std::shared_ptr<void> shared, DeviceSlot* slot)
      : shared_(std::move(shared)), slot_(slot) {}
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  // Records on `stream` the point after which the consumer no longer touches the batch (may be
  // called for several streams; nullptr: the legacy default stream).
  void used_on(cudaStream_t stream);
  DeviceSlot* slot() const { return slot_; }

 private:
  std::shared_ptr<void> shared_;  // keeps the loader's device state alive
  DeviceSlot* slot_;
  std::vector<cudaStream_t> streams_;
};

struct DeviceLoaderStats {
  uint64_t batches = 0;
  uint64_t bytes_to_device = 0;  // host-to-device copy bytes (raw values)
  uint64_t bytes_delivered = 0;  // device batch bytes in the output types
  uint64_t host_wait_ns = 0;     // next() waiting for the host loader's batch
  uint64_t copy_wait_ns = 0;     // next() waiting for a host buffer's copy to finish
  uint64_t copy_ns = 0;  // GPU time of the host-to-device copies (and nvCOMP decodes), by events
  uint64_t copies_timed = 0;        // batches whose copy time is in copy_ns
  uint64_t copy_bytes_timed = 0;    // the bytes those batches copied (raw and compressed)
  uint64_t slots = 0;               // device output buffers allocated
  uint64_t registered_bytes = 0;    // host batch memory pinned with cudaHostRegister
  uint64_t chunks_gpu_decoded = 0;  // chunks decoded by nvCOMP
  uint64_t bytes_gpu_decoded = 0;
  uint64_t compressed_to_device = 0;  // compressed bytes copied for nvCOMP
  uint64_t gpu_decode_failures = 0;   // batches nvCOMP (or the host's check) rejected a chunk of
  std::string last_gpu_decode_error;
  // decode: what was asked, what runs ("cpu" or "gpu"), why; with "auto", the measured cost per
  // batch of each path (the most of its stages' medians over the probe's batches: host assembly,
  // the consumer thread's staging, the GPU's time; in ms).
  std::string decode_asked, decode_mode, decode_reason;
  double auto_cpu_ms = 0, auto_gpu_ms = 0;
  // Their parts (medians, ms): the host loader's assembly, the consumer thread's staging, the GPU.
  struct ProbeParts {
    double host = 0, staging = 0, gpu = 0;
  };
  ProbeParts auto_cpu_parts, auto_gpu_parts;
  // read: how chunks that decode on the GPU are read: asked ("auto", "on", "off"), mode ("gds" or
  // "compat": cuFile into GPU memory; "host": the host loader's reads), why; what cuFile read.
  std::string read_asked, read_mode = "host", read_reason;
  uint64_t chunks_read_to_device = 0, bytes_read_to_device = 0;
  uint64_t cufile_bytes = 0, read_fallback_bytes = 0;  // of those: by cuFile, by pinned copies
  uint64_t read_failures = 0;                          // after one, the host reads
  std::string last_read_error;
  Json to_json() const;
};

class DeviceLoader {
 public:
  // Takes the host loader's spec; sets its defer_normalization and raises its prefetch by depth.
  DeviceLoader(loader::LoaderSpec spec, DeviceLoaderOptions options);
  ~DeviceLoader();
  DeviceLoader(const DeviceLoader&) = delete;
  DeviceLoader& operator=(const DeviceLoader&) = delete;

  // The next batch of the current epoch (its copy and cast enqueued; wait_on before use), or
  // nullopt at the end of the epoch. `interrupted` as for loader::Loader::next: asked while
  // waiting for the host loader's batch; InterruptedError leaves the batches in flight for the
  // next call.
  std::optional<DeviceBatch> next(const std::function<bool()>& interrupted = {});
  void set_epoch(uint64_t epoch);
  void begin_iteration();
  // The host loader's state, positioned after the batches handed to the consumer (not those
  // merely in flight).
  Json state() const;
  void restore(const Json& state);
  DeviceLoaderStats stats() const;

  const loader::Loader& host() const { return *host_; }
  int device() const { return options_.device; }
  uint64_t position() const { return handed_out_; }
  uint64_t epoch() const { return host_->epoch(); }

  struct Shared;

  // For one thread at a time; callers that share a loader among threads take turns on this.
  std::mutex& calls_mutex() const { return calls_mutex_; }

 private:
  mutable std::mutex calls_mutex_;
  // A batch's host-to-device copy: the host buffer is released once `copied` has completed;
  // the events time the copy (DeviceLoaderStats::copy_ns).
  struct Copy {
    loader::Batch host;
    std::shared_ptr<Event> started, copied;
    uint64_t bytes = 0;  // host-to-device bytes between the two events
  };
  struct InFlight {
    DeviceBatch batch;
    Copy copy;
    bool gpu_decoded = false;    // some of its chunks went through nvCOMP
    int decoder = -1;            // the decoder (index) that decodes its chunks
    uint64_t host_ns = 0;        // the host loader's assembly time
    uint64_t prepare_ns = 0;     // this thread's work in enqueue() (not its waits)
    DeviceSlot* slot = nullptr;  // for decode="auto"'s timing
  };
  // One more batch onto the copy stream; false at the end of the epoch.
  bool enqueue(const std::function<bool()>& interrupted);
  struct PipelineReset {};  // the batches in flight were dropped: start again (next() catches it)
  std::optional<DeviceBatch> next_batch(const std::function<bool()>& interrupted);
  // Waits for decoder d's batch and checks it; on failure falls back to the CPU.
  void finish_decode(size_t d);
  [[noreturn]] void fall_back_to_cpu(uint64_t batch_index, const Error& error);
  [[noreturn]] void reset_pipeline();  // back to the first batch not handed out
  void choose_read_path();
  // Reads the batch's located chunks into located_ with cuFile; their device addresses go into
  // `device_src` (by index in memory.compressed).
  void read_to_device(const loader::BatchMemory& memory, std::vector<const uint8_t*>& device_src);
  [[noreturn]] void read_failed(const Error& error);
  // decode="auto": times the batch's three stages, which overlap while batches stream (the host
  // loader's assembly, this thread's work in enqueue(), the GPU's work); once both paths have
  // kProbeBatches measured, keeps the one whose slowest stage (by its median) is faster.
  void probe(const InFlight& flight);
  void drain();  // waits for the copy stream and drops everything in flight
  void release_copied_host_batches(bool wait_for_all);
  void pin(const loader::Batch& batch);
  DeviceSlot* free_slot();

  DeviceLoaderOptions options_;
  std::unique_ptr<loader::Loader> host_;
  std::shared_ptr<Shared> shared_;
  Stream copy_stream_;
  DeviceBuffer staging_inputs_, staging_targets_;
  DeviceBuffer descriptors_inputs_, descriptors_targets_;
  std::deque<InFlight> in_flight_;  // enqueued, not yet handed out
  std::deque<Copy> copying_;        // handed out, the copy maybe still running
  std::unordered_set<const uint8_t*> pinned_;
  uint64_t handed_out_ = 0;     // batches handed out in the current epoch
  bool host_finished_ = false;  // the host loader reported the end of the epoch
  DeviceLoaderStats stats_;
  // Two decoders take turns on the copy stream: the host stages batch k+1's compressed bytes
  // while the GPU decodes batch k. Null where nothing decodes on the GPU.
  std::array<std::unique_ptr<GpuDecoder>, 2> decoders_;
  size_t next_decoder_ = 0;
  std::array<uint64_t, 2> pending_index_{};   // the batch each decoder's pending decode belongs to
  std::unique_ptr<DeviceFileReader> reader_;  // where chunks are read by cuFile
  DeviceBuffer located_;                      // the compressed chunks cuFile read
  bool located_registered_ = false;           // located_ is registered with cuFile
  std::vector<GpuCodec> codecs_;  // per host array: how nvCOMP decodes its chunks (where it does)
  std::vector<GpuDecodeItem> items_;
  std::vector<const uint8_t*> device_src_;  // per compressed chunk: where cuFile put it, or null
  // decode="auto": each batch's parts per path, the first kProbeWarmUp of a path left out (they
  // pay for allocations, registrations, each decoder's first batch, a pipeline filling up).
  std::vector<DeviceLoaderStats::ProbeParts> probe_cpu_, probe_gpu_;
  bool probing_ = false;
  static constexpr size_t kProbeWarmUp = 3;
  static constexpr size_t kProbeBatches = 5;  // measured per path after the warm-up
  std::optional<uint64_t> cpu_until_;         // decode on the CPU up to this batch (a failure)
  // GPU decoding failed on this many batches in a row (none decoded there in between): from
  // kGpuFailuresToGiveUp on, a failure that is no one chunk's (a batch past the staging pool, the
  // GPU's memory) would reset the pipeline at every batch, so the CPU decodes for good.
  uint64_t gpu_failures_in_a_row_ = 0;
  static constexpr uint64_t kGpuFailuresToGiveUp = 3;
  bool gpu_given_up_ = false;
  // Whether chunks go to the GPU now (no failure being served on the CPU, nor given up).
  bool gpu_decoding_wanted() const;
};

}  // namespace zfeed::cuda
