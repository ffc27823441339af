// The training data loader: batches of samples from variables of a Zarr group, read with the
// Zarr engine straight into reused batch buffers, normalized and cast in one pass, prefetched by a
// thread of zfeed's own, resumable exactly.
//
// A sample at time t stacks, as channels, the input variables at t - history + 1 .. t (oldest
// first; within a time step the variables in the order given, each variable's levels in the
// order given) and the target variables at t + lead. Variables have dims (time, lat, lon) or
// (time, level, lat, lon) with a level selection; all share the time and grid extents. A batch is
// two dense float32 buffers, inputs [batch, history * input_channels, lat, lon] and targets
// [batch, target_channels, lat, lon], plus the sample times.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "zfeed/loader/sampler.h"
#include "zfeed/store/store.h"
#include "zfeed/util/json.h"
#include "zfeed/zarr/array.h"

namespace zfeed::loader {

struct VariableSpec {
  std::string name;  // the array's path inside the group
  // For (time, level, lat, lon) arrays: the level indices to stack (empty: every level). Must be
  // empty for (time, lat, lon) arrays.
  std::vector<uint64_t> levels;
  // Given statistics: empty (use the array's "zfeed_stats" attribute, if any), one value, or one
  // per selected level.
  std::vector<double> mean;
  std::vector<double> std;
};

// A fixed spatial window [lat_start, lat_start + lat_size) x [lon_start, lon_start + lon_size).
struct Crop {
  uint64_t lat_start = 0, lat_size = 0, lon_start = 0, lon_size = 0;
};

struct LoaderSpec {
  std::shared_ptr<Store> store;
  std::string path;  // the group holding the variables ("" for the store root)
  std::vector<VariableSpec> inputs;
  std::vector<VariableSpec> targets;
  uint64_t lead = 1;     // targets at t + lead (0 allowed)
  uint64_t history = 1;  // input time steps
  std::optional<Crop> crop;
  uint64_t batch_size = 16;
  bool shuffle = true;
  uint64_t seed = 0;
  uint64_t rank = 0;
  uint64_t world_size = 1;
  bool drop_last = true;  // see SamplerOptions::drop_last
  // Normalize with the given statistics, else with the "zfeed_stats" attribute
  // ({"mean": m, "std": s}, numbers or one per level), else leave the channel as it is.
  bool normalize = true;
  uint64_t prefetch = 2;  // batches kept ready ahead of the consumer (>= 1)
  uint64_t epoch = 0;     // the first epoch

  // From JSON: {"path", "inputs": [{"name", "levels", "mean", "std"} | "name", ...], "targets",
  // "lead", "history", "crop": [lat_start, lat_size, lon_start, lon_size], "batch_size",
  // "shuffle", "seed", "rank", "world_size", "drop_last", "normalize", "prefetch", "epoch"}.
  static LoaderSpec from_json(std::shared_ptr<Store> store, const Json& json);
};

// One channel of the inputs or the targets.
struct Channel {
  std::string variable;
  std::optional<uint64_t> level;
  int64_t time_offset = 0;  // relative to the sample time t
  bool normalized = false;
  float mean = 0.0f;  // out = (float(x) - mean) / std in float32, when normalized
  float std = 1.0f;
};

// The memory of one batch; owned by the loader's pool and lent to the consumer.
struct BatchMemory {
  std::vector<float> inputs;
  std::vector<float> targets;
  std::vector<int64_t> times;
};

struct Batch {
  uint64_t epoch = 0;
  uint64_t index = 0;  // within the epoch
  uint64_t size = 0;   // samples (batch_size, or fewer for the last batch without drop_last)
  // Returns to the pool when the last copy is dropped; only then is it reused.
  std::shared_ptr<BatchMemory> memory;
  float* inputs() const { return memory->inputs.data(); }
  float* targets() const { return memory->targets.data(); }
  int64_t* times() const { return memory->times.data(); }
};

struct LoaderStats {
  uint64_t read_ns = 0;          // reading and decoding chunks into the batch (or a scratch)
  uint64_t assemble_ns = 0;      // cast and normalization
  uint64_t wait_ns = 0;          // the consumer blocked in next()
  uint64_t idle_ns = 0;          // the prefetch thread waiting for a free buffer
  uint64_t bytes_decoded = 0;    // values read from the arrays, in their data types
  uint64_t bytes_delivered = 0;  // float32 bytes of the batches handed out
  uint64_t batches = 0;
  uint64_t samples = 0;
  uint64_t buffers = 0;  // batch buffers allocated (prefetch + 1 while the consumer holds one)
  Json to_json() const;
};

class Loader {
 public:
  explicit Loader(LoaderSpec spec);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch of the current epoch, or nullopt when the epoch is over. Starts the prefetch
  // thread on first use. A read error surfaces here (the same batch is retried on the next call).
  std::optional<Batch> next();
  // Starts `epoch` at its first batch; the current epoch (a restored position) is kept when
  // `epoch` equals it.
  void set_epoch(uint64_t epoch);
  // Moves on to the next epoch if next() has reported the end of the current one (a restored
  // position at the end of an epoch first yields that epoch's remaining zero batches).
  void begin_iteration();

  uint64_t epoch() const { return epoch_; }
  uint64_t position() const { return position_; }  // batches handed out in this epoch
  uint64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  uint64_t num_samples() const { return sampler_.options().num_samples; }
  const Sampler& sampler() const { return sampler_; }
  const LoaderSpec& spec() const { return spec_; }

  // {"version", "epoch", "batch", "seed", "shuffle", "rank", "world_size", "batch_size",
  // "drop_last", "num_samples"}; restore() continues exactly after the last batch handed out.
  Json state() const;
  void restore(const Json& state);
  LoaderStats stats() const;

  const std::vector<Channel>& input_channels() const { return input_channels_; }
  const std::vector<Channel>& target_channels() const { return target_channels_; }
  // [batch_size, channels, lat, lon] of a full batch.
  std::array<uint64_t, 4> input_shape() const;
  std::array<uint64_t, 4> target_shape() const;
  // The sample time of dataset sample `index` (the latest input time step).
  uint64_t sample_time(uint64_t index) const { return spec_.history - 1 + index; }

  // Reads and assembles the samples at `times` into `inputs` and `targets` (dense, shaped as
  // input_shape() and target_shape() with times.size() samples), synchronously.
  void assemble(std::span<const uint64_t> times, float* inputs, float* targets);

  struct Shared;  // state shared with the prefetch thread and the lent buffers

 private:
  struct Source;  // one (variable, level) channel source
  void start_producer();
  void stop_producer();
  void produce(uint64_t epoch, uint64_t first_batch);

  LoaderSpec spec_;
  std::vector<zarr::Array> arrays_;  // one per distinct variable name
  std::vector<Source> input_sources_, target_sources_;
  std::vector<Channel> input_channels_, target_channels_;
  uint64_t time_extent_ = 0, lat_ = 0, lon_ = 0, lat_start_ = 0, lon_start_ = 0;
  Sampler sampler_{SamplerOptions{}};
  uint64_t epoch_ = 0, position_ = 0;
  bool finished_ = false;       // next() reported the end of the epoch
  std::vector<Bytes> scratch_;  // per array, for variables not stored as float32
  std::shared_ptr<Shared> shared_;
  std::thread producer_;
  bool producer_running_ = false;
};

}  // namespace zfeed::loader
