// The loader's sampler: which sample times an epoch visits, in which order, on which rank.
// Everything here is a pure function of (number of samples, seed, epoch, rank, world size), with
// its own PRNG (SplitMix64 + Fisher-Yates with unbiased bounded draws), so that an epoch's order
// is the same on every platform and standard library, and a resumed run sees the same batches.
#pragma once

#include <cstdint>
#include <vector>

namespace zfeed::loader {

// SplitMix64 (Steele, Lea and Flood 2014): a tiny, well-mixed 64-bit generator.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // A uniform integer in [0, bound) (bound >= 1), without modulo bias (rejection of the
  // biased low values).
  uint64_t below(uint64_t bound);

 private:
  uint64_t state_;
};

// Fisher-Yates shuffle of `values` driven by `rng` (the same on every platform).
void shuffle(std::vector<uint64_t>& values, SplitMix64& rng);

struct SamplerOptions {
  uint64_t num_samples = 0;  // samples in the dataset (indices 0 .. num_samples - 1)
  uint64_t batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  uint64_t rank = 0;
  uint64_t world_size = 1;
  // true: every rank gets floor(N / world_size) samples (the remainder of the epoch's order is
  // dropped) and the last incomplete batch is dropped. false: every rank gets
  // ceil(N / world_size) samples, the epoch's order padded by repeating its first samples (as
  // PyTorch's DistributedSampler pads), and the last batch may be smaller.
  bool drop_last = true;
  // Chunk-aware order (group_size > 1, with shuffle): sample i belongs to group
  // (i + group_offset) / group_size, the time chunk its reads start in. The epoch visits the groups
  // in a shuffled order, `window` groups at a time, and shuffles the samples within each window,
  // so that a batch still mixes samples from several places in time while each chunk is needed
  // during one window only (and a cache of a few windows decodes it once per epoch).
  uint64_t group_size = 1;
  uint64_t group_offset = 0;
  uint64_t window = 1;
};

class Sampler {
 public:
  explicit Sampler(SamplerOptions options);

  const SamplerOptions& options() const { return options_; }
  // Samples this rank sees per epoch (after padding or dropping; before dropping the last
  // incomplete batch).
  uint64_t samples_per_rank() const { return per_rank_; }
  uint64_t batches_per_epoch() const;
  // The dataset's sample indices this rank visits in `epoch`, in order (the whole epoch's
  // order from (seed, epoch), then every world_size-th element starting at rank).
  std::vector<uint64_t> epoch_indices(uint64_t epoch) const;
  // Batch `batch` (0-based) of `epoch`: a slice of epoch_indices(epoch).
  std::vector<uint64_t> batch_indices(uint64_t epoch, uint64_t batch) const;
  // The whole epoch's order of every sample (before rank sharding).
  std::vector<uint64_t> epoch_order(uint64_t epoch) const;

 private:
  SamplerOptions options_;
  uint64_t per_rank_ = 0;
};

}  // namespace zfeed::loader
