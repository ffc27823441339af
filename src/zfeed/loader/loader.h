// The training data loader: batches of samples from variables of a Zarr group, read with the
// Zarr engine straight into reused batch buffers, normalized and cast in the same pass, prefetched
// by a thread of zfeed's own, resumable exactly.
//
// A sample at time t stacks, as channels, the input variables at t - (history - 1) * history_step,
// ..., t - history_step, t (oldest
// first; within a time step the variables in the order given, each variable's levels in the
// order given) and the target variables at t + lead. Variables have dims (time, lat, lon) or
// (time, level, lat, lon) with a level selection, or are channels of a stacked array
// data(time, variable, lat, lon) whose "variables" attribute names them (anemoi-datasets' layout);
// all share the time and grid extents. An input variable with dims (lat, lon) is static (a
// land-sea mask, the orography): one channel, the same plane for every sample, after the
// history's channels; it is read once, when the loader is made. A batch is two dense buffers,
// inputs [batch, history * input_channels, lat, lon] and targets [batch, target_channels, lat, lon]
// (in the spec's dtype; integer target variables are labels: int64, not normalized), plus the
// sample times and, with random crops, each sample's crop origin.
//
// Planning: for each batch, every (sample, channel, time) becomes a piece: a plane of one array.
// Arrays whose read chunks hold one plane are read straight into the batch (decoded in place when
// no cast is needed, normalized while the plane is still in cache). Arrays whose read chunks hold
// several planes (several time steps, levels or stacked variables) go through the decoded-chunk
// cache: the batch's distinct chunks are decoded once, in parallel, then scattered.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zfeed/loader/cast.h"
#include "zfeed/loader/chunk_cache.h"
#include "zfeed/loader/sampler.h"
#include "zfeed/store/staged_copy.h"
#include "zfeed/store/store.h"
#include "zfeed/util/json.h"
#include "zfeed/util/thread_pool.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/stage.h"

namespace zfeed::loader {

struct VariableSpec {
  // The array's path inside the group, or a name in the stacked array's "variables" attribute.
  std::string name;
  // For (time, level, lat, lon) arrays: the level indices to stack (empty: every level). Must be
  // empty for (time, lat, lon) arrays and stacked channels.
  std::vector<uint64_t> levels;
  // Or the levels by their coordinate values, as xarray's .sel: the values of the coordinate
  // array named like the array's dimension 1, in the group ([500, 850] for hPa levels).
  std::vector<double> level_values;
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
  uint64_t lead = 1;  // targets at t + lead (0 allowed)
  // Targets at several leads (a rollout: t + 1, t + 2, ...), where given instead of `lead`: the
  // target channels of each lead in turn, in the order given (distinct; not for labels).
  std::vector<uint64_t> leads;
  uint64_t history = 1;  // input time steps
  // Time steps between two of them (6 for 6-hourly inputs from an hourly store; the lead is in
  // the store's steps too).
  uint64_t history_step = 1;
  // The part of the time axis the loader sees, [start, stop) as a Python slice takes them (either
  // absent: that end of the axis; negative: from the end): every sample's inputs and targets lie
  // in it, so a training and a validation loader over two ranges share no time step.
  std::array<std::optional<int64_t>, 2> time_range{};
  std::optional<Crop> crop;
  // A random window of this size per sample (drawn from (seed, epoch, sample time), so resumes
  // repeat it); the inputs and targets of a sample share it. Excludes `crop`.
  std::optional<std::array<uint64_t, 2>> random_crop;  // {lat_size, lon_size}
  // The element type of the inputs (and float targets): float32, float16 or bfloat16.
  OutputType dtype = OutputType::kFloat32;
  // The array holding stacked variables (dims (time, variable, lat, lon), attribute "variables"):
  // names not found as arrays are looked up there.
  std::string stacked = "data";
  // Sample order: "auto" (chunk-aware where some compressed array's read chunks hold several time
  // steps; uncompressed planes are read by byte range, needing no such order),
  // "random" (a plain shuffle) or "chunks".
  std::string order = "auto";
  uint64_t window = 0;  // time chunks in flight in the chunk-aware order (0: automatic)
  // Decoded-chunk cache budget in bytes (nullopt: automatic, enough for the chunk-aware window).
  std::optional<uint64_t> cache_bytes;
  uint64_t batch_size = 16;
  bool shuffle = true;
  uint64_t seed = 0;
  uint64_t rank = 0;
  uint64_t world_size = 1;
  // The samples split among the nodes of a cluster: those of `time_range` in `nodes` contiguous
  // blocks of equal count (the remainder left out), this loader taking block `node` (from 0)
  // and sharing it with the other processes of its node by `rank` and `world_size` (the node's
  // own: its local rank and local process count). A node then reads only the time steps of its
  // block, which is what `stage_dir` copies to its local disk. Equal blocks keep the batches per
  // epoch equal on every rank. 1: no split (every rank draws from all samples).
  uint64_t node = 0;
  uint64_t nodes = 1;
  // Where given, a local directory to copy what this loader reads into first (zarr/stage.h,
  // shared by the processes of a node: one copies, the others wait), then read the copy: the
  // time steps of its samples (time_range, or the node's block) of the arrays along time, and
  // everything else whole. Empty: read the store itself. A store that is itself a partial staged
  // copy gives the time steps it holds as the default time_range, and refuses others.
  std::string stage_dir;
  std::function<void(const zarr::StageProgress&)> stage_progress;  // StageOptions::progress
  // StageOptions::stop for a copy made before the first batch (Ctrl-C): where it stops the
  // copy, the constructor throws (the copy resumes with the next loader).
  std::function<bool()> stage_stop;
  // Copy to stage_dir on a thread of the loader's while its batches come from the store and from
  // what the copy holds already (store/staged_copy.h's read-through store), instead of copying
  // first: the first batch comes at once (no rank waits for its node's copy, which could outlast
  // a process group's timeout), and the copy alone serves the epochs that start after it is
  // done. A copy that fails ends the iteration with its error. Where stage_dir holds a complete
  // copy already, it is read as without this.
  bool stage_in_background = false;
  bool drop_last = true;  // see SamplerOptions::drop_last
  // Normalize with the given statistics, else with the "zfeed_stats" attribute
  // ({"mean": m, "std": s}, numbers or one per level), else leave the channel as it is.
  bool normalize = true;
  // NaN values (missing data: sea surface temperature over land) become this value in the batch,
  // after normalization (0: the channel's mean); nullopt leaves them NaN. Labels are not
  // affected (a NaN label is already kIgnoreLabel).
  std::optional<float> fill_nan;
  uint64_t prefetch = 2;  // batches kept ready ahead of the consumer (>= 1)
  uint64_t epoch = 0;     // the first epoch
  // The consumer normalizes and casts (the GPU path: cuda::DeviceLoader): batches hold the
  // values as float32 (labels as int64), exactly the float the CPU path would normalize, and
  // Channel::normalization() says what to apply; `dtype` is then the consumer's output type.
  bool defer_normalization = false;
  // Arrays whose chunks the consumer decodes (the GPU path, cuda::DeviceLoader with decode="gpu"):
  // where this says yes for an array of float32 values whose read chunks (inner chunks where
  // sharded) each hold exactly one whole plane of a batch (no crop), the loader reads the stored
  // chunk (by range inside its shard) and hands it over in
  // BatchMemory::compressed instead of decoding it; the plane in the batch buffer is left as it
  // is. Only with defer_normalization, and while set_pass_compressed(true).
  std::function<bool(const zarr::Array&)> pass_compressed;
  // Chunks handed over compressed are located, not read, where their array is stored_locally():
  // CompressedChunk::file, file_offset and stored_size say where the consumer reads them itself
  // (GPUDirect Storage). Other arrays' chunks are read into CompressedChunk::data as before.
  // Switched at run time by Loader::set_locate_compressed.
  bool locate_compressed = false;
  // Where given, only arrays it says yes for are located (blosc chunks are split into their
  // streams on the host, so it reads them).
  std::function<bool(const zarr::Array&)> locatable;

  // From JSON: {"path", "inputs": [{"name", "levels" | "level_values", "mean", "std"} | "name",
  // ...], "targets", "lead" (a number, or a list for `leads`), "history", "history_step",
  // "time_range": [start | null, stop | null],
  // "crop": [lat_start, lat_size, lon_start, lon_size],
  // "random_crop": [lat_size, lon_size], "dtype", "stacked", "order", "window", "cache_bytes",
  // "batch_size", "shuffle", "seed", "rank", "world_size", "node", "nodes", "stage_dir",
  // "stage_in_background", "drop_last", "normalize", "fill_nan", "prefetch", "epoch"}.
  static LoaderSpec from_json(std::shared_ptr<Store> store, const Json& json);
};

// One channel of the inputs or the targets.
struct Channel {
  std::string variable;
  std::optional<uint64_t> level;  // the index along dim 1 (a level, or a stacked variable)
  int64_t time_offset = 0;        // relative to the sample time t
  bool normalized = false;
  float mean = 0.0f;  // out = (float(x) - mean) / std in float32, when normalized
  float std = 1.0f;
  bool is_static = false;  // a (lat, lon) input: the same plane for every sample
  CfUnpack unpack{};       // CF scale_factor / add_offset / missing values (zarr/cf.h), first
  bool fill_nan = false;   // NaN becomes nan_value (after normalization): LoaderSpec::fill_nan
  float nan_value = 0.0f;
  // With defer_normalization, where float32 cannot hold every stored value (int32, int64,
  // float64): the host applies `unpack` and the consumer the rest.
  bool unpack_on_host = false;
  // Everything, as the CPU path applies it to the stored values.
  Normalization normalization() const {
    return {normalized, mean, std, fill_nan, nan_value, unpack};
  }
  // What the host applies: all of it, or deferred only the CF decoding it keeps (unpack_on_host).
  Normalization host_normalization(bool deferred) const {
    if (!deferred) return normalization();
    Normalization host;
    if (unpack_on_host) host.unpack = unpack;
    return host;
  }
  // What a consumer of deferred batches applies to their float32 values.
  Normalization deferred_normalization() const {
    Normalization rest = normalization();
    if (unpack_on_host) rest.unpack = CfUnpack{};
    return rest;
  }
};

// A stored chunk handed to the consumer undecoded (LoaderSpec::pass_compressed).
struct CompressedChunk {
  bool target = false;        // its plane is in the targets buffer (else the inputs)
  uint64_t offset = 0;        // the byte offset of its plane in that buffer
  uint64_t decoded_size = 0;  // bytes it decodes to; 0: absent, the loader filled the plane
  uint32_t array = 0;         // Loader::array(index)
  std::string key;            // where it is stored (key, and byte range inside a shard)
  Bytes data;                 // its stored bytes; empty where located
  // Set where the chunk was located rather than read (LoaderSpec::locate_compressed): the local
  // file holding its stored bytes, at [file_offset, file_offset + stored_size). Else empty.
  std::string file;
  uint64_t file_offset = 0;
  uint64_t stored_size = 0;  // its stored bytes, located or read (data.size() then); 0: absent
};

// The memory of one batch; owned by the loader's pool and lent to the consumer.
struct BatchMemory {
  Bytes inputs;
  Bytes targets;
  std::vector<int64_t> times;
  std::vector<int64_t> crops;  // (lat_start, lon_start) per sample
  // The first compressed_count entries belong to this batch (the rest keep their memory for the
  // next batches).
  std::vector<CompressedChunk> compressed;
  size_t compressed_count = 0;
  uint64_t assemble_ns = 0;  // wall time the loader spent assembling this batch
};

struct Batch {
  uint64_t epoch = 0;
  uint64_t index = 0;  // within the epoch
  uint64_t size = 0;   // samples (batch_size, or fewer for the last batch without drop_last)
  // Returns to the pool when the last copy is dropped; only then is it reused.
  std::shared_ptr<BatchMemory> memory;
  uint8_t* input_bytes() const { return memory->inputs.data(); }
  uint8_t* target_bytes() const { return memory->targets.data(); }
  // Typed views, for float32 batches.
  float* inputs() const { return reinterpret_cast<float*>(memory->inputs.data()); }
  float* targets() const { return reinterpret_cast<float*>(memory->targets.data()); }
  int64_t* times() const { return memory->times.data(); }
  int64_t* crops() const { return memory->crops.data(); }
};

// Times are summed over zfeed's threads (read, decode, assemble) or wall time of one thread
// (wait, prefetch idle, batch).
struct LoaderStats {
  uint64_t read_ns = 0;          // waiting on storage reads
  uint64_t decode_ns = 0;        // decoding chunks (codecs), in place or into the cache
  uint64_t assemble_ns = 0;      // scatter, cast and normalization into the batch
  uint64_t batch_ns = 0;         // wall time the prefetch thread spent producing batches
  uint64_t wait_ns = 0;          // the consumer blocked in next()
  uint64_t idle_ns = 0;          // the prefetch thread waiting for a free buffer
  uint64_t bytes_read = 0;       // bytes read from storage (compressed)
  uint64_t bytes_decoded = 0;    // decoded chunk bytes (in the arrays' data types)
  uint64_t bytes_delivered = 0;  // bytes of the batches handed out
  uint64_t chunks_decoded = 0;   // through the cache (misses)
  // Planes read by themselves from a chunk of several, not cached: the chunk was needed only as a
  // neighbor (a target's or history's step beyond its samples' own chunk) far from its own
  // samples, so only its start is decoded (where the codecs can stop early) and its own window
  // decodes it whole.
  uint64_t planes_read_alone = 0;
  uint64_t chunks_passed = 0;   // handed over compressed (LoaderSpec::pass_compressed)
  uint64_t chunks_located = 0;  // of those, located in a local file, not read
  uint64_t cache_hits = 0;
  uint64_t cache_bytes = 0;  // held now
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
  // While it waits, `interrupted` (if given) is asked about every 100 ms on this thread; when it
  // says true, InterruptedError is thrown and the batch stays due for the next call.
  std::optional<Batch> next(const std::function<bool()>& interrupted = {});
  // Starts `epoch` at its first batch; the current epoch (a restored position) is kept when
  // `epoch` equals it and is not over (an epoch that is over starts again: a validation loader
  // set to epoch 0 before each evaluation reads the same samples each time).
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
  // The methods above are for one thread at a time; callers that share a loader among threads
  // (Python's) take turns on this.
  std::mutex& calls_mutex() const { return calls_mutex_; }

  const std::vector<Channel>& input_channels() const { return input_channels_; }
  const std::vector<Channel>& target_channels() const { return target_channels_; }
  // [batch_size, channels, lat, lon] of a full batch.
  std::array<uint64_t, 4> input_shape() const;
  std::array<uint64_t, 4> target_shape() const;
  OutputType input_type() const { return spec_.dtype; }
  OutputType target_type() const { return labels_ ? OutputType::kInt64 : spec_.dtype; }
  // The element types of the batch buffers: input_type() and target_type(), or float32 (labels
  // int64) with defer_normalization.
  OutputType assembled_input_type() const {
    return spec_.defer_normalization ? OutputType::kFloat32 : input_type();
  }
  OutputType assembled_target_type() const {
    return spec_.defer_normalization && !labels_ ? OutputType::kFloat32 : target_type();
  }
  bool label_targets() const { return labels_; }
  // The order in use ("random" or "chunks"), its time chunk (group) size and window.
  std::string order() const { return sampler_.options().group_size > 1 ? "chunks" : "random"; }
  uint64_t cache_budget() const { return cache_.budget(); }
  // The memory the loader holds at most: the batch buffers (prefetch + 1), the cache budget, one
  // batch's worth of chunks in flight, the static planes and the threads' scratch buffers (an
  // estimate; the consumer keeping batches adds to it). The chunk files it maps are the page
  // cache's pages.
  uint64_t memory_bound() const;
  // The sample time of dataset sample `index` (the latest input time step).
  uint64_t sample_time(uint64_t index) const { return time_start_ + back_ + index; }
  // The time steps [first, second) this loader's samples read (time_range, narrowed to the
  // node's block where split among nodes).
  std::pair<uint64_t, uint64_t> time_span() const { return {time_start_, time_stop_}; }
  // What staging (LoaderSpec::stage_dir) did, where it was asked for and is done.
  std::optional<zarr::StageResult> staged() const;
  // Where a copy runs in the background (LoaderSpec::stage_in_background): how far it is; nullopt
  // once it is done (staged() says what it did) and where none runs.
  std::optional<zarr::StageProgress> staging_progress() const;
  // Why a copy in the background failed, where one did: the loader reads from the source (and
  // the values the copy holds) from then on, as it did while the copy ran.
  std::optional<std::string> staging_failure() const;

  // The crop origin (lat_start, lon_start) of the sample at `time` in `epoch`.
  std::array<uint64_t, 2> crop_origin(uint64_t epoch, uint64_t time) const;

  // Reads and assembles the samples at `times` (cropped as in `epoch`) into `inputs` and
  // `targets` (dense, shaped as input_shape() and target_shape() with times.size() samples, of
  // input_type() and target_type()), synchronously.
  // With `memory` (whose buffers `inputs` and `targets` are), chunks may be handed over
  // compressed in memory->compressed (see LoaderSpec::pass_compressed).
  // Not while next() is in use: it shares the decoded-chunk cache with the prefetch thread,
  // which is for one thread at a time (call it on a loader whose batches are not iterated).
  void assemble(uint64_t epoch, std::span<const uint64_t> times, void* inputs, void* targets,
                BatchMemory* memory = nullptr);

  // Turns handing over compressed chunks on or off for the batches assembled from now on (the
  // prefetched ones keep how they were made). Returns whether any array qualifies.
  bool set_pass_compressed(bool enabled);
  bool passes_compressed() const { return pass_enabled_.load(); }
  // Turns locating (rather than reading) the chunks handed over compressed on or off for the
  // batches assembled from now on (LoaderSpec::locate_compressed). Returns whether locating is now
  // on: false where turned off or where no array is stored_locally().
  bool set_locate_compressed(bool enabled);
  bool locate_compressed() const { return locate_enabled_.load(); }
  // Why no array qualifies for pass_compressed ("" where some does).
  const std::string& pass_compressed_reason() const { return pass_reason_; }
  size_t num_arrays() const { return arrays_.size(); }
  const zarr::Array& array(size_t index) const { return arrays_[index]; }

  struct Shared;  // state shared with the prefetch thread and the lent buffers

 private:
  struct Source;  // one (variable, level) channel source
  struct Piece;   // one plane of one array to place into the batch
  using ChunkMap = std::unordered_map<ChunkKey, std::shared_ptr<Bytes>, ChunkKeyHash>;
  // Reads the batch's pieces: `cached` through the decoded-chunk cache, `direct` alone.
  void read_pieces(std::span<const Piece> cached, std::span<const Piece> direct,
                   BatchMemory* memory);
  void read_direct_piece(const Piece& piece, BatchMemory* memory);
  void scatter_cached_piece(const Piece& piece, const ChunkMap& chunks) const;
  void decode_chunk(const ChunkKey& key, Bytes& out) const;
  void chunk_box(const ChunkKey& key, std::vector<uint64_t>& start,
                 std::vector<uint64_t>& count) const;
  // Splits the pieces of arrays with several planes per read chunk into those read through the
  // cache (`kept`) and those read alone (`alone`, by read_direct_piece): pieces of chunks missing
  // from the cache that `batch` (the epoch's batch being assembled; none for assemble()) needs only
  // as a neighbor (a target's or history's step) while the chunk's own samples are done or further
  // away than the cache keeps a chunk, so that it would be evicted before they come; only where
  // reading them alone costs less than the whole chunk.
  void choose_reads_alone(std::span<const Piece> pieces, std::optional<uint64_t> batch,
                          std::vector<Piece>& kept, std::vector<Piece>& alone);
  bool needed_only_as_neighbor(const Piece& piece, std::optional<uint64_t> batch) const;
  // The planes reading a piece alone decodes: the chunk's start up to the piece's plane, in the
  // chunk's C order (time, then level).
  uint64_t planes_to_read_alone(const Piece& piece) const;
  // The read chunks a piece's crop touches along lat and lon (first and last chunk index).
  struct ChunkSpan {
    uint64_t first, last;
  };
  std::array<ChunkSpan, 2> chunk_spans(const Piece& piece) const;
  // Planes (time steps, times levels) one read chunk of an array holds.
  uint64_t planes_per_read_chunk(size_t array) const {
    const auto& chunk = read_chunks_[array];
    return chunk[0] * (chunk.size() == 4 ? chunk[1] : 1);
  }
  ChunkKey chunk_key(const Piece& piece, uint64_t y, uint64_t x) const;
  // Stages the loader's data to spec_.stage_dir and reopens the arrays there (reference: the
  // array with the time axis), or starts a copy in the background.
  void stage_and_reopen(size_t reference);
  void start_background_stage(zarr::StageOptions options);
  // Opens the arrays again from spec_.store (names: their paths in the group), and sees which are
  // local files now.
  void reopen_arrays();
  // local_: the arrays stored in local files (and locatable).
  void find_local_arrays();
  // With a copy in the background: rethrows its error, and once it is done and no batch is being
  // prepared (`idle`), reads the copy alone.
  void check_background_stage(bool idle);
  struct BackgroundStage;  // the copying thread and what it reports
  // time_start_ and time_stop_ from spec_.time_range; an error where no sample fits in them.
  void resolve_time_range();
  void assemble_batch(uint64_t epoch, std::optional<uint64_t> batch,
                      std::span<const uint64_t> times, void* inputs, void* targets,
                      BatchMemory* memory);
  // The batch's planes as pieces: those read alone (`direct`) and those read through the cache
  // (`cached`); and the entries of the chunks handed over compressed.
  void plan_pieces(uint64_t epoch, std::span<const uint64_t> times, void* inputs, void* targets,
                   BatchMemory* memory, std::vector<Piece>& direct,
                   std::vector<Piece>& cached) const;
  struct Flight;  // a batch whose reads run while the prefetch thread prepares the next
  // Sets own_batches_ for an epoch's order (this rank's sample indices).
  void plan_own_batches(std::span<const uint64_t> indices);
  void start_producer();
  void stop_producer();
  void produce(uint64_t epoch, uint64_t first_batch);  // the prefetch thread
  void produce_batches(uint64_t epoch, uint64_t first_batch);

  LoaderSpec spec_;
  // Where the reads run: one thread per core, or the I/O pool for a remote store.
  ThreadPool* pool_ = nullptr;
  std::vector<zarr::Array> arrays_;  // one per distinct variable name
  std::vector<Source> input_sources_, target_sources_;
  std::vector<std::vector<uint64_t>> read_chunks_;  // per array: its read chunk shape
  std::vector<Channel> input_channels_, target_channels_;
  // Static inputs (dims (lat, lon)): the whole plane, read once, in the assembled input type
  // (normalized unless deferred); each sample copies its crop of it.
  struct StaticPlane {
    size_t array = 0;
    size_t channel = 0;  // in input_channels_
    Bytes values;
  };
  std::vector<StaticPlane> statics_;
  std::vector<bool> static_;           // per array: a static input
  std::vector<bool> cached_;           // per array: its read chunks hold several planes, compressed
  std::vector<bool> prefix_readable_;  // per array: decoding the start of a chunk costs less
  std::vector<bool> passable_;         // per array: its chunks may be handed over compressed
  std::atomic<bool> pass_enabled_{false};
  std::vector<bool> local_;  // per array: stored_locally() and spec_.locatable
  std::atomic<bool> locate_enabled_{false};
  bool locate_requested_ = false;  // the last set_locate_compressed()
  std::string pass_reason_;
  uint64_t time_extent_ = 0, lat_ = 0, lon_ = 0, lat_start_ = 0, lon_start_ = 0;
  uint64_t time_start_ = 0, time_stop_ = 0;  // spec_.time_range resolved against time_extent_
  // The time steps a partial staged copy read as the store holds (store/staged_copy.h).
  std::optional<StagedTimeRange> store_holds_;
  std::optional<zarr::StageResult> staged_;
  std::optional<std::string> staging_failure_;
  std::vector<std::string> array_names_;  // per array: its path in spec_.path's group
  std::unique_ptr<BackgroundStage> background_;
  // Guards staged_, staging_failure_ and background_ (not what it points to) for staged(),
  // staging_failure() and staging_progress(),
  // which another thread may ask while next() swaps in the finished copy.
  mutable std::mutex staged_mutex_;
  mutable std::mutex calls_mutex_;
  std::vector<uint64_t> leads_;  // spec_.leads, else {spec_.lead}
  uint64_t max_lead_ = 0;
  uint64_t back_ = 0;  // how far the history reaches back: (history - 1) * history_step
  uint64_t full_lat_ = 0, full_lon_ = 0;
  bool labels_ = false;
  ChunkCache cache_{0};
  // With the chunk-aware order, per time step: the first and last batch of the epoch whose samples
  // have it as their (latest input) time; {max, 0} where none has. Empty otherwise.
  std::vector<std::pair<uint64_t, uint64_t>> own_batches_;
  uint64_t horizon_batches_ = 1;  // about how many batches a decoded chunk stays in the cache
  // Decoded-chunk buffers no longer in use, reused for the next chunks: fresh memory costs a page
  // fault per 4 KiB, as much as decoding it. At most one batch's worth of chunks is kept.
  std::vector<std::shared_ptr<Bytes>> spare_chunks_;
  Sampler sampler_{SamplerOptions{}};
  uint64_t epoch_ = 0, position_ = 0;
  bool finished_ = false;  // next() reported the end of the epoch
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<std::thread> producer_;
  int producer_pid_ = 0;  // the process that started the producer (a forked child has none)
};

}  // namespace zfeed::loader
