#include "zfeed/cuda/device_loader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>
#include <utility>

#include "zfeed/cuda/check.h"
#include "zfeed/cuda/device.h"
#include "zfeed/cuda/gpu_decode_plan.h"
#include "zfeed/util/error.h"

namespace zfeed::cuda {

using loader::OutputType;

namespace {

uint64_t since_ns(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
}

uint64_t product(const std::array<uint64_t, 4>& shape) {
  return shape[0] * shape[1] * shape[2] * shape[3];
}

}  // namespace

struct DeviceLoader::Shared {
  std::mutex mutex;
  int device = 0;
  std::vector<std::unique_ptr<DeviceSlot>> slots;
};

void DeviceBatch::wait_on(cudaStream_t stream) const {
  if (handle) handle->slot()->ready.wait_on(stream);
}

DeviceBatch::Handle::~Handle() {
  auto* shared = static_cast<DeviceLoader::Shared*>(shared_.get());
  std::lock_guard lock(shared->mutex);
  try {
    std::optional<DeviceScope> device;
    if (!streams_.empty()) device.emplace(shared->device);
    for (cudaStream_t stream : streams_) {
      if (slot_->used_events == slot_->released.size())
        slot_->released.push_back(std::make_unique<Event>());
      slot_->released[slot_->used_events++]->record(stream);
    }
  } catch (const Error&) {
    // A destructor must not throw; a failed record leaves the CUDA context broken anyway, and
    // the next copy on it reports the error.
  }
  --slot_->references;
}

void DeviceBatch::Handle::used_on(cudaStream_t stream) {
  // A per-thread default stream is the using thread's, and the release is recorded on whichever
  // thread drops the batch last (autograd's, say): recorded on the legacy stream instead, which
  // waits for every blocking stream's work, the per-thread streams' included.
  if (stream == cudaStreamPerThread) stream = cudaStreamLegacy;
  auto* shared = static_cast<DeviceLoader::Shared*>(shared_.get());
  std::lock_guard lock(shared->mutex);
  for (cudaStream_t known : streams_)
    if (known == stream) return;
  streams_.push_back(stream);
}

Json DeviceLoaderStats::to_json() const {
  auto parts_json = [](const ProbeParts& p) {
    return Json{{"host_loader", p.host}, {"staging", p.staging}, {"gpu", p.gpu}};
  };
  return Json{{"batches", batches},
              {"bytes_to_device", bytes_to_device},
              {"bytes_delivered", bytes_delivered},
              {"host_wait_s", host_wait_ns * 1e-9},
              {"copy_wait_s", copy_wait_ns * 1e-9},
              {"copy_s", copy_ns * 1e-9},
              {"copies_timed", copies_timed},
              {"copy_bytes_timed", copy_bytes_timed},
              {"slots", slots},
              {"registered_bytes", registered_bytes},
              {"chunks_gpu_decoded", chunks_gpu_decoded},
              {"bytes_gpu_decoded", bytes_gpu_decoded},
              {"compressed_to_device", compressed_to_device},
              {"gpu_decode_failures", gpu_decode_failures},
              {"last_gpu_decode_error", last_gpu_decode_error},
              {"decode",
               {{"asked", decode_asked},
                {"mode", decode_mode},
                {"reason", decode_reason},
                {"auto_cpu_ms_per_batch", auto_cpu_ms},
                {"auto_gpu_ms_per_batch", auto_gpu_ms},
                {"auto_parts_ms",
                 {{"cpu", parts_json(auto_cpu_parts)}, {"gpu", parts_json(auto_gpu_parts)}}}}},
              {"read",
               {{"asked", read_asked},
                {"mode", read_mode},
                {"reason", read_reason},
                {"chunks_to_device", chunks_read_to_device},
                {"bytes_to_device", bytes_read_to_device},
                {"cufile_bytes", cufile_bytes},
                {"fallback_bytes", read_fallback_bytes},
                {"failures", read_failures},
                {"last_error", last_read_error}}}};
}

DeviceLoader::DeviceLoader(loader::LoaderSpec spec, DeviceLoaderOptions options)
    : options_(options), shared_(std::make_shared<Shared>()) {
  require_device(options_.device, "device='cuda:" + std::to_string(options_.device) + "'");
  if (options_.depth < 1) throw Error("loader: device depth must be at least 1");
  DeviceScope device(options_.device);
  shared_->device = options_.device;
  spec.defer_normalization = true;
  const std::string& decode = options_.decode;
  if (decode != "cpu" && decode != "gpu" && decode != "auto")
    throw Error("loader: decode must be 'cpu', 'gpu' or 'auto', got '" + decode + "'");
  stats_.decode_asked = decode;
  stats_.decode_mode = "cpu";
  const std::string unavailable = gpu_decode_unavailable_reason();
  if (decode == "gpu" && !unavailable.empty())
    throw UnsupportedError("decode='gpu' is unavailable: " + unavailable);
  if (decode == "cpu") {
    stats_.decode_reason = "asked for";
  } else if (!unavailable.empty()) {
    stats_.decode_reason = "GPU decoding is unavailable: " + unavailable;
  } else {
    spec.pass_compressed = [](const zarr::Array& array) {
      // A sharded array's inner chunks go the same way: the host reads each one's byte range.
      return gpu_decode_plan(array).gpu;
    };
    // Blosc chunks are split into their streams on the host, so the host reads them.
    spec.locatable = [](const zarr::Array& array) {
      return gpu_decode_plan(array).codec != GpuCodec::kBlosc;
    };
  }
  // The batches in flight on the copy stream hold host buffers too.
  spec.prefetch += options_.depth;
  const bool try_gpu = static_cast<bool>(spec.pass_compressed);
  host_ = std::make_unique<loader::Loader>(std::move(spec));
  if (try_gpu) {
    if (!host_->set_pass_compressed(decode == "gpu")) {
      stats_.decode_reason = "no array's chunks decode on the GPU in one nvCOMP step: " +
                             host_->pass_compressed_reason();
      // And what each array's codecs say (blosclz, a transpose...), where they say no.
      for (size_t a = 0; a < host_->num_arrays(); ++a) {
        const GpuDecodePlan plan = gpu_decode_plan(host_->array(a));
        if (!plan.gpu) stats_.decode_reason += "; " + host_->array(a).path() + ": " + plan.reason;
      }
    } else {
      for (auto& decoder : decoders_) decoder = std::make_unique<GpuDecoder>();
      for (size_t a = 0; a < host_->num_arrays(); ++a)
        codecs_.push_back(gpu_decode_plan(host_->array(a)).codec);
      if (decode == "gpu") {
        stats_.decode_mode = "gpu";
        stats_.decode_reason = "asked for";
      } else {
        probing_ = true;  // the CPU path first, then the GPU path, then the faster
        stats_.decode_reason = "measuring both paths";
      }
    }
  }
  choose_read_path();
  const uint64_t in_raw =
      product(host_->input_shape()) * output_size(host_->assembled_input_type());
  const uint64_t out_raw =
      product(host_->target_shape()) * output_size(host_->assembled_target_type());
  staging_inputs_ = DeviceBuffer(in_raw);
  staging_targets_ = DeviceBuffer(out_raw);
}

DeviceLoader::~DeviceLoader() {
  try {
    DeviceScope device(options_.device);
    drain();
    if (located_registered_) reader_->deregister_buffer(located_.data());
  } catch (const Error&) {
  }
  // The host loader frees its buffers: unpin them first.
  for (const uint8_t* pointer : pinned_) cudaHostUnregister(const_cast<uint8_t*>(pointer));
  host_.reset();
}

void DeviceLoader::pin(const loader::Batch& batch) {
  for (auto* bytes : {&batch.memory->inputs, &batch.memory->targets}) {
    if (bytes->size() == 0 || pinned_.count(bytes->data())) continue;
    check(cudaHostRegister(bytes->data(), bytes->size(), cudaHostRegisterDefault),
          "cudaHostRegister (batch buffer)");
    pinned_.insert(bytes->data());
    stats_.registered_bytes += bytes->size();
  }
}

void DeviceLoader::choose_read_path() {
  const GdsPolicy policy =
      options_.gds.empty() ? gds_policy_from_env() : gds_policy_from_name(options_.gds, "gds");
  const std::string asked = options_.gds.empty() ? "ZFEED_GDS" : "gds";
  stats_.read_asked = gds_policy_name(policy);
  stats_.read_mode = "host";
  if (!decoders_[0]) {
    stats_.read_reason = "chunks decode on the CPU, so the host reads them";
    // Asked of this loader (not machine-wide through ZFEED_GDS): say why it cannot be done.
    if (policy == GdsPolicy::kOn && !options_.gds.empty())
      throw UnsupportedError(
          "gds='on' reads the chunks that decode on the GPU, but " +
          (options_.decode == "cpu" ? std::string("decode='cpu'") : stats_.decode_reason));
    return;
  }
  if (policy == GdsPolicy::kOff) {
    stats_.read_reason = asked + "=off";
    return;
  }
  bool local = false, blosc_only = true;
  for (size_t a = 0; a < host_->num_arrays(); ++a) {
    if (!host_->array(a).stored_locally()) continue;
    local = true;
    blosc_only = blosc_only && codecs_[a] == GpuCodec::kBlosc;
  }
  if (!local || blosc_only) {
    stats_.read_reason =
        !local ? "the store keeps no local files (cuFile reads local files only)"
               : "the chunks are blosc's, which the host splits into their streams: it reads them";
    if (policy == GdsPolicy::kOn)
      throw UnsupportedError(asked + "=on: " +
                             (!local ? "GPUDirect Storage reads need a local store: "
                                     : "no chunk can be read into GPU memory: ") +
                             stats_.read_reason);
    return;
  }
  const GdsStatus status = gds_status(policy);
  if (policy == GdsPolicy::kAuto && status.mode != "gds") {
    // Without nvidia-fs, cuFile itself reads through bounce buffers: the host loader's threads,
    // reading into pinned batch memory, do the same work in parallel with decoding.
    stats_.read_reason = status.mode == "compat"
                             ? "cuFile would run in compat mode (" + status.reason +
                                   "): the host reads into pinned memory instead"
                             : status.reason;
    return;
  }
  reader_ = std::make_unique<DeviceFileReader>(policy);  // with kOn: throws where unavailable
  host_->set_locate_compressed(true);
  stats_.read_mode = reader_->cufile_mode();
  stats_.read_reason = status.reason;
}

void DeviceLoader::read_to_device(const loader::BatchMemory& memory,
                                  std::vector<const uint8_t*>& device_src) {
  // Each chunk goes where its device address agrees with its file offset modulo 4 KiB: cuFile
  // then moves it whole (head and tail excepted) by DMA.
  constexpr uint64_t kPage = 4096;
  std::vector<uint64_t> places(memory.compressed_count, 0);
  std::vector<size_t> todo;
  uint64_t end = 0;
  for (size_t i = 0; i < memory.compressed_count; ++i) {
    const loader::CompressedChunk& chunk = memory.compressed[i];
    if (chunk.decoded_size == 0 || chunk.file.empty()) continue;
    places[i] = (end + kPage - 1) / kPage * kPage + chunk.file_offset % kPage;
    end = places[i] + chunk.stored_size;
    todo.push_back(i);
  }
  if (todo.empty()) return;
  if (located_.size() < end) {
    if (located_registered_) reader_->deregister_buffer(located_.data());
    located_registered_ = false;
    located_ = DeviceBuffer();
    located_ = DeviceBuffer((end + end / 4 + (size_t{1} << 20) - 1) >> 20 << 20);
    located_registered_ = reader_->register_buffer(located_.data(), located_.size());
  }
  // Several reads in flight: storage and cuFile both gain from them.
  constexpr size_t kReadThreads = 8;
  const size_t threads = std::min(todo.size(), kReadThreads);
  std::atomic<size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  auto work = [&] {
    try {
      set_device(options_.device);
      for (size_t k = next++; k < todo.size(); k = next++) {
        const loader::CompressedChunk& chunk = memory.compressed[todo[k]];
        try {
          reader_->read(chunk.file, chunk.file_offset, chunk.stored_size,
                        located_.data() + places[todo[k]]);
        } catch (const Error& error) {
          throw Error(chunk.key + ": reading it into GPU memory: " + error.what());
        }
      }
    } catch (...) {
      std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = todo.size();
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
  if (failure) std::rethrow_exception(failure);
  for (size_t i : todo) {
    device_src[i] = located_.data() + places[i];
    ++stats_.chunks_read_to_device;
    stats_.bytes_read_to_device += memory.compressed[i].stored_size;
  }
  const DeviceFileReader::Stats read = reader_->stats();
  stats_.cufile_bytes = read.cufile_bytes;
  stats_.read_fallback_bytes = read.fallback_bytes;
}

void DeviceLoader::read_failed(const Error& error) {
  // The batch goes again with the host reading its chunks, as every later batch does: a chunk
  // that cannot be read at all then fails there with the CPU path's error.
  ++stats_.read_failures;
  stats_.last_read_error = error.what();
  stats_.read_mode = "host";
  stats_.read_reason =
      std::string("a cuFile read failed, so the host reads from then on: ") + error.what();
  host_->set_locate_compressed(false);
  reset_pipeline();
}

DeviceSlot* DeviceLoader::free_slot() {
  std::lock_guard lock(shared_->mutex);
  DeviceSlot* slot = nullptr;
  for (auto& candidate : shared_->slots) {
    if (candidate->references == 0) {
      slot = candidate.get();
      break;
    }
  }
  if (!slot) {
    auto fresh = std::make_unique<DeviceSlot>();
    fresh->inputs = DeviceBuffer(product(host_->input_shape()) * output_size(host_->input_type()));
    fresh->targets =
        DeviceBuffer(product(host_->target_shape()) * output_size(host_->target_type()));
    slot = fresh.get();
    shared_->slots.push_back(std::move(fresh));
    ++stats_.slots;
  }
  // The consumer's streams must be past their last use of the slot before it is overwritten.
  for (size_t i = 0; i < slot->used_events; ++i) slot->released[i]->wait_on(copy_stream_.get());
  slot->used_events = 0;
  ++slot->references;
  return slot;
}

bool DeviceLoader::enqueue(const std::function<bool()>& interrupted) {
  const auto wait_start = std::chrono::steady_clock::now();
  std::optional<loader::Batch> host_batch = host_->next(interrupted);
  stats_.host_wait_ns += since_ns(wait_start);
  if (!host_batch) {
    host_finished_ = true;
    return false;
  }
  const auto prepare_start = std::chrono::steady_clock::now();
  uint64_t waited_ns = 0;  // for earlier batches' GPU work: not this batch's cost
  pin(*host_batch);
  const loader::Batch& host = *host_batch;
  const auto in_shape = host_->input_shape(), out_shape = host_->target_shape();
  const uint64_t plane = in_shape[2] * in_shape[3];
  const uint64_t in_planes = host.size * in_shape[1], out_planes = host.size * out_shape[1];
  const size_t in_raw = output_size(host_->assembled_input_type());
  const size_t out_raw = output_size(host_->assembled_target_type());

  DeviceSlot* slot = free_slot();
  InFlight flight;
  flight.batch.handle = std::make_shared<DeviceBatch::Handle>(shared_, slot);
  const cudaStream_t stream = copy_stream_.get();
  // Chunks handed over compressed decode on the GPU into their planes of the staging buffers;
  // the host buffers are copied only where the host filled some plane.
  const size_t d = next_decoder_;
  if (decoders_[0]) {
    const auto decode_wait_start = std::chrono::steady_clock::now();
    if (reader_) {  // cuFile reads into located_, which a pending decode may still read
      for (size_t k = 0; k < decoders_.size(); ++k)
        if (decoders_[k]->pending()) finish_decode(k);
    } else if (decoders_[d]->pending()) {
      finish_decode(d);
    }
    waited_ns += since_ns(decode_wait_start);
  }
  items_.clear();
  uint64_t gpu_in = 0, gpu_out = 0, compressed_bytes = 0;
  const auto& memory = *host.memory;
  device_src_.assign(memory.compressed_count, nullptr);
  if (reader_) {  // located chunks need reading, also in a batch assembled before a switch
    try {
      read_to_device(memory, device_src_);
    } catch (const Error& error) {
      read_failed(error);
    }
  }
  for (size_t i = 0; i < memory.compressed_count; ++i) {
    const loader::CompressedChunk& chunk = memory.compressed[i];
    if (chunk.decoded_size == 0) continue;
    GpuDecodeItem item;
    item.codec = codecs_[chunk.array];
    if (device_src_[i]) {
      item.src = device_src_[i];
      item.src_size = chunk.stored_size;
      item.src_on_device = true;
    } else {
      item.src = chunk.data.data();
      item.src_size = chunk.data.size();
      compressed_bytes += chunk.data.size();
    }
    item.dst = (chunk.target ? staging_targets_ : staging_inputs_).data() + chunk.offset;
    item.decoded_size = chunk.decoded_size;
    item.key = chunk.key;
    items_.push_back(item);
    (chunk.target ? gpu_out : gpu_in) += 1;
  }
  if (!items_.empty()) {
    try {
      decoders_[d]->prepare(items_, stream);  // checks every chunk's container first
    } catch (const Error& error) {
      fall_back_to_cpu(host.index, error);
    }
  }
  flight.prepare_ns = since_ns(prepare_start) - waited_ns;
  // From here on only GPU work is enqueued: the events time the GPU's part of the batch.
  flight.copy.started = std::make_shared<Event>(true);
  flight.copy.started->record(stream);
  if (gpu_in < in_planes) {
    check(cudaMemcpyAsync(staging_inputs_.data(), host.input_bytes(), in_planes * plane * in_raw,
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (batch inputs)");
    stats_.bytes_to_device += in_planes * plane * in_raw;
    flight.copy.bytes += in_planes * plane * in_raw;
  }
  if (gpu_out < out_planes) {
    check(cudaMemcpyAsync(staging_targets_.data(), host.target_bytes(),
                          out_planes * plane * out_raw, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (batch targets)");
    stats_.bytes_to_device += out_planes * plane * out_raw;
    flight.copy.bytes += out_planes * plane * out_raw;
  }
  if (!items_.empty()) {
    try {
      decoders_[d]->submit();
    } catch (const Error& error) {
      fall_back_to_cpu(host.index, error);
    }
    pending_index_[d] = host.index;
    flight.decoder = static_cast<int>(d);
    next_decoder_ = (d + 1) % decoders_.size();
    flight.gpu_decoded = true;
    stats_.chunks_gpu_decoded += items_.size();
    stats_.bytes_gpu_decoded += (gpu_in + gpu_out) * plane * 4;
    stats_.compressed_to_device += compressed_bytes;
    flight.copy.bytes += compressed_bytes;
  }
  flight.copy.copied = std::make_shared<Event>(true);
  flight.copy.copied->record(stream);

  auto planes = [&](uint64_t count, uint64_t channels, const std::vector<loader::Channel>& meta,
                    const DeviceBuffer& src, size_t src_size, SourceType src_type,
                    const DeviceBuffer& dst, OutputType out, bool labels) {
    std::vector<CastPlane> list(count);
    for (uint64_t p = 0; p < count; ++p) {
      list[p].src = src.data() + p * plane * src_size;
      list[p].dst = dst.data() + p * plane * output_size(out);
      list[p].count = plane;
      list[p].type = src_type;
      if (!labels) list[p].normalization = meta[p % channels].deferred_normalization();
    }
    return list;
  };
  const auto input_planes =
      planes(in_planes, in_shape[1], host_->input_channels(), staging_inputs_, in_raw,
             SourceType::kFloat32, slot->inputs, host_->input_type(), false);
  cast_planes(input_planes, host_->input_type(), descriptors_inputs_, stream);
  const bool labels = host_->label_targets();
  const auto target_planes =
      planes(out_planes, out_shape[1], host_->target_channels(), staging_targets_, out_raw,
             labels ? SourceType::kInt64 : SourceType::kFloat32, slot->targets,
             host_->target_type(), labels);
  cast_planes(target_planes, host_->target_type(), descriptors_targets_, stream);
  slot->ready.record(stream);

  flight.batch.epoch = host.epoch;
  flight.batch.index = host.index;
  flight.batch.size = host.size;
  flight.batch.times.assign(host.times(), host.times() + host.size);
  flight.batch.crops.assign(host.crops(), host.crops() + 2 * host.size);
  flight.batch.inputs = slot->inputs.data();
  flight.batch.targets = slot->targets.data();
  stats_.bytes_delivered += in_planes * plane * output_size(host_->input_type()) +
                            out_planes * plane * output_size(host_->target_type());
  flight.host_ns = memory.assemble_ns;
  flight.slot = slot;
  flight.copy.host = std::move(*host_batch);
  in_flight_.push_back(std::move(flight));
  return true;
}

void DeviceLoader::release_copied_host_batches(bool wait_for_all) {
  const auto start = std::chrono::steady_clock::now();
  // At most `depth` handed-out batches may still hold their host buffer; wait for older copies.
  while (!copying_.empty() &&
         (wait_for_all || copying_.size() > options_.depth || copying_.front().copied->ready())) {
    const Copy& copy = copying_.front();
    copy.copied->synchronize();
    stats_.copy_ns += static_cast<uint64_t>(copy.copied->elapsed_ms_since(*copy.started) * 1e6);
    ++stats_.copies_timed;
    stats_.copy_bytes_timed += copy.bytes;
    copying_.pop_front();
  }
  stats_.copy_wait_ns += since_ns(start);
}

std::optional<DeviceBatch> DeviceLoader::next(const std::function<bool()>& interrupted) {
  DeviceScope device(options_.device);
  for (;;) {
    try {
      return next_batch(interrupted);
    } catch (const PipelineReset&) {
      // The pipeline was reset to the first batch not handed out, which now decodes on the CPU.
    }
  }
}

std::optional<DeviceBatch> DeviceLoader::next_batch(const std::function<bool()>& interrupted) {
  while (in_flight_.size() < options_.depth + 1 && !host_finished_) {
    if (!enqueue(interrupted)) break;
  }
  if (in_flight_.empty()) {
    release_copied_host_batches(true);  // the epoch's last copies: their time is in stats()
    return std::nullopt;
  }
  // A batch goes out only once its GPU decode is checked: a failure sends it to the CPU.
  const InFlight& front = in_flight_.front();
  if (front.decoder >= 0) {
    const auto d = static_cast<size_t>(front.decoder);
    if (decoders_[d]->pending() && pending_index_[d] == front.batch.index) finish_decode(d);
  }
  InFlight flight = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (probing_) probe(flight);
  if (flight.gpu_decoded) gpu_failures_in_a_row_ = 0;
  if (cpu_until_ && flight.batch.index >= *cpu_until_) {  // the failed batch is out: GPU again
    cpu_until_.reset();
    host_->set_pass_compressed(gpu_decoding_wanted());
  }
  copying_.push_back(std::move(flight.copy));
  release_copied_host_batches(false);
  ++handed_out_;
  ++stats_.batches;
  return std::move(flight.batch);
}

void DeviceLoader::finish_decode(size_t d) {
  try {
    decoders_[d]->finish();
  } catch (const Error& error) {
    fall_back_to_cpu(pending_index_[d], error);
  }
}

void DeviceLoader::fall_back_to_cpu(uint64_t batch_index, const Error& error) {
  // nvCOMP rejected a chunk. The batches in flight are dropped, the host loader goes back to the
  // first batch not handed out, and the batches up to the failed one decode on the CPU: a corrupt
  // chunk then fails there with the CPU path's error (and again on the next call, as the CPU
  // path retries a failed batch); a chunk only nvCOMP rejects is served. GPU decoding resumes
  // after the failed batch.
  ++stats_.gpu_decode_failures;
  stats_.last_gpu_decode_error = error.what();
  host_->set_pass_compressed(false);
  cpu_until_ = batch_index;
  if (++gpu_failures_in_a_row_ >= kGpuFailuresToGiveUp && !gpu_given_up_) {
    gpu_given_up_ = true;
    probing_ = false;
    stats_.decode_mode = "cpu";
    stats_.decode_reason =
        "GPU decoding failed on " + std::to_string(gpu_failures_in_a_row_) +
        " batches in a row, so the CPU decodes from here; the last: " + error.what();
  }
  reset_pipeline();
}

bool DeviceLoader::gpu_decoding_wanted() const {
  if (gpu_given_up_ || cpu_until_) return false;
  return probing_ ? probe_cpu_.size() >= kProbeWarmUp + kProbeBatches : stats_.decode_mode == "gpu";
}

void DeviceLoader::reset_pipeline() {
  const Json position = state();
  drain();
  host_->restore(position);
  host_finished_ = false;
  throw PipelineReset{};
}

void DeviceLoader::probe(const InFlight& flight) {
  flight.slot->ready.synchronize();
  DeviceLoaderStats::ProbeParts parts;
  parts.host = static_cast<double>(flight.host_ns) * 1e-6;
  parts.staging = static_cast<double>(flight.prepare_ns) * 1e-6;
  parts.gpu = flight.slot->ready.elapsed_ms_since(*flight.copy.started);
  auto& samples = flight.gpu_decoded ? probe_gpu_ : probe_cpu_;
  samples.push_back(parts);
  constexpr size_t kNeeded = kProbeWarmUp + kProbeBatches;
  if (!flight.gpu_decoded && probe_cpu_.size() == kNeeded && !cpu_until_)
    host_->set_pass_compressed(true);  // the CPU path is measured: now the GPU's
  if (probe_gpu_.size() < kNeeded || probe_cpu_.size() < kNeeded) return;
  // Batches stream through three stages that overlap (the host loader, this thread's staging, the
  // GPU), so a path runs at the pace of its slowest stage: the cost is the most of the stages'
  // medians over the measured batches. (Not the median of each batch's most: a stage's slow
  // batch is absorbed by the buffers between stages, and on the H200 that median said 135 ms
  // per batch for a GPU path that then ran at 49.)
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  auto summarize = [&](const std::vector<DeviceLoaderStats::ProbeParts>& all,
                       DeviceLoaderStats::ProbeParts& medians) {
    std::vector<double> host, staging, gpu;
    for (size_t i = kProbeWarmUp; i < all.size(); ++i) {
      host.push_back(all[i].host);
      staging.push_back(all[i].staging);
      gpu.push_back(all[i].gpu);
    }
    medians = {median(host), median(staging), median(gpu)};
    return std::max({medians.host, medians.staging, medians.gpu});
  };
  stats_.auto_cpu_ms = summarize(probe_cpu_, stats_.auto_cpu_parts);
  stats_.auto_gpu_ms = summarize(probe_gpu_, stats_.auto_gpu_parts);
  const bool gpu = stats_.auto_gpu_ms < stats_.auto_cpu_ms;
  host_->set_pass_compressed(gpu && !cpu_until_);
  stats_.decode_mode = gpu ? "gpu" : "cpu";
  auto describe = [](double ms, const DeviceLoaderStats::ProbeParts& p) {
    char text[160];
    std::snprintf(text, sizeof text, "%.1f ms (host loader %.1f, staging %.1f, GPU %.1f)", ms,
                  p.host, p.staging, p.gpu);
    return std::string(text);
  };
  stats_.decode_reason = "auto: per batch " + describe(stats_.auto_gpu_ms, stats_.auto_gpu_parts) +
                         " decoding on the GPU, " +
                         describe(stats_.auto_cpu_ms, stats_.auto_cpu_parts) + " on the CPU";
  probing_ = false;
}

void DeviceLoader::drain() {
  for (auto& decoder : decoders_) {
    if (!decoder || !decoder->pending()) continue;
    try {
      decoder->finish();
    } catch (const Error&) {
      // dropped with the batches in flight
    }
  }
  copy_stream_.synchronize();
  // Every copy has finished: those not yet timed (the last of an epoch, batches dropped) count
  // too, or the copy rate (bytes over time) would count bytes without their time.
  for (InFlight& flight : in_flight_) copying_.push_back(std::move(flight.copy));
  in_flight_.clear();
  try {
    release_copied_host_batches(true);
  } catch (const Error&) {
    // a failed copy: its time is lost with it
  }
  copying_.clear();
}

void DeviceLoader::set_epoch(uint64_t epoch) {
  const bool over = host_finished_ && in_flight_.empty();
  if (epoch == host_->epoch() && !over) return;  // as Loader::set_epoch
  DeviceScope device(options_.device);
  drain();
  host_->set_epoch(epoch);
  handed_out_ = 0;
  host_finished_ = false;
  // A failed batch's CPU stretch was of the epoch left: the new one decodes as chosen.
  cpu_until_.reset();
  host_->set_pass_compressed(gpu_decoding_wanted());
}

void DeviceLoader::begin_iteration() {
  if (!host_finished_ || !in_flight_.empty()) return;  // mid-epoch: go on where it stands
  host_->begin_iteration();
  handed_out_ = host_->position();
  host_finished_ = false;
}

Json DeviceLoader::state() const {
  Json state = host_->state();
  state["batch"] = handed_out_;
  return state;
}

void DeviceLoader::restore(const Json& state) {
  DeviceScope device(options_.device);
  drain();
  host_->restore(state);
  handed_out_ = host_->position();
  host_finished_ = false;
  cpu_until_.reset();
  host_->set_pass_compressed(gpu_decoding_wanted());
}

DeviceLoaderStats DeviceLoader::stats() const { return stats_; }

}  // namespace zfeed::cuda
