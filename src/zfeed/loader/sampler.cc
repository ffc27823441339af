#include "zfeed/loader/sampler.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "zfeed/util/error.h"

namespace zfeed::loader {

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::below(uint64_t bound) {
  // Rejection of the low 2^64 mod bound values, so that every residue is equally likely.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

void shuffle(std::vector<uint64_t>& values, SplitMix64& rng) {
  for (size_t i = values.size(); i > 1; --i) {
    const uint64_t j = rng.below(i);
    std::swap(values[i - 1], values[j]);
  }
}

Sampler::Sampler(SamplerOptions options) : options_(options) {
  if (options_.batch_size == 0) throw Error("loader: batch_size must be at least 1");
  if (options_.world_size == 0) throw Error("loader: world_size must be at least 1");
  if (options_.rank >= options_.world_size) {
    throw Error("loader: rank " + std::to_string(options_.rank) + " is not below world_size " +
                std::to_string(options_.world_size));
  }
  const uint64_t n = options_.num_samples, w = options_.world_size;
  per_rank_ = options_.drop_last ? n / w : (n + w - 1) / w;
}

uint64_t Sampler::batches_per_epoch() const {
  const uint64_t b = options_.batch_size;
  return options_.drop_last ? per_rank_ / b : (per_rank_ + b - 1) / b;
}

std::vector<uint64_t> Sampler::epoch_order(uint64_t epoch) const {
  const uint64_t n = options_.num_samples;
  std::vector<uint64_t> order(n);
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (!options_.shuffle || n == 0) return order;
  // Distinct streams per epoch: the epoch goes through the mixer before seeding.
  SplitMix64 mix(epoch ^ 0xD1B54A32D192ED03ull);
  SplitMix64 rng(options_.seed ^ mix.next());
  if (options_.group_size <= 1) {
    shuffle(order, rng);
    return order;
  }
  const uint64_t g = options_.group_size, offset = options_.group_offset;
  const uint64_t first_group = offset / g, last_group = (n - 1 + offset) / g;
  std::vector<uint64_t> groups(last_group - first_group + 1);
  std::iota(groups.begin(), groups.end(), first_group);
  shuffle(groups, rng);
  order.clear();
  const uint64_t window = std::max<uint64_t>(1, options_.window);
  for (size_t begin = 0; begin < groups.size(); begin += window) {
    const size_t end = std::min<size_t>(groups.size(), begin + window);
    std::vector<uint64_t> samples;
    for (size_t k = begin; k < end; ++k) {
      // The samples whose time (i + offset) falls in group groups[k].
      const uint64_t lo = std::max<uint64_t>(groups[k] * g, offset) - offset;
      const uint64_t hi = std::min<uint64_t>((groups[k] + 1) * g - offset, n);
      for (uint64_t i = lo; i < hi; ++i) samples.push_back(i);
    }
    shuffle(samples, rng);
    order.insert(order.end(), samples.begin(), samples.end());
  }
  return order;
}

std::vector<uint64_t> Sampler::epoch_indices(uint64_t epoch) const {
  const uint64_t n = options_.num_samples, w = options_.world_size;
  const std::vector<uint64_t> order = epoch_order(epoch);
  std::vector<uint64_t> mine;
  mine.reserve(per_rank_);
  for (uint64_t k = 0; k < per_rank_; ++k) {
    const uint64_t position = k * w + options_.rank;  // < per_rank_ * w <= n + w - 1
    mine.push_back(order[position % n]);              // padding repeats the order's start
  }
  return mine;
}

std::vector<uint64_t> Sampler::batch_indices(uint64_t epoch, uint64_t batch) const {
  if (batch >= batches_per_epoch()) return {};
  auto all = epoch_indices(epoch);
  const uint64_t begin = batch * options_.batch_size;
  const uint64_t end = std::min<uint64_t>(all.size(), begin + options_.batch_size);
  return std::vector<uint64_t>(all.begin() + begin, all.begin() + end);
}

}  // namespace zfeed::loader
