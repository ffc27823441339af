#include "zfeed/loader/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "zfeed/util/error.h"

namespace zfeed::loader {
namespace {

SamplerOptions options(uint64_t n, uint64_t batch, uint64_t rank, uint64_t world, bool drop_last,
                       uint64_t seed = 7) {
  SamplerOptions o;
  o.num_samples = n;
  o.batch_size = batch;
  o.seed = seed;
  o.rank = rank;
  o.world_size = world;
  o.drop_last = drop_last;
  return o;
}

TEST(SplitMix64, MatchesTheReferenceSequence) {
  // The first outputs of the reference implementation (Vigna's splitmix64.c) from seed 0.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(rng.next(), 0x06C45D188009454Full);
}

TEST(SplitMix64, BelowStaysInRange) {
  SplitMix64 rng(3);
  for (uint64_t bound : {1ull, 2ull, 3ull, 7ull, 1000ull, (1ull << 63) + 5}) {
    for (int i = 0; i < 200; ++i) EXPECT_LT(rng.below(bound), bound);
  }
  std::vector<int> counts(3, 0);
  for (int i = 0; i < 3000; ++i) ++counts[rng.below(3)];
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}

TEST(Sampler, ShuffleIsAPermutationDeterminedBySeedAndEpoch) {
  Sampler sampler(options(100, 10, 0, 1, true));
  auto e0 = sampler.epoch_indices(0);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint64_t> all(100);
  std::iota(all.begin(), all.end(), uint64_t{0});
  EXPECT_EQ(sorted, all);
  EXPECT_NE(e0, all);
  EXPECT_EQ(Sampler(options(100, 10, 0, 1, true)).epoch_indices(0), e0);
  EXPECT_NE(sampler.epoch_indices(1), e0);
  EXPECT_NE(Sampler(options(100, 10, 0, 1, true, 8)).epoch_indices(0), e0);
}

TEST(Sampler, OrderIsPinned) {
  // The order is part of the resume contract across versions and platforms: changing the PRNG or
  // the shuffle changes these.
  Sampler sampler(options(10, 2, 0, 1, true, 0));
  EXPECT_EQ(sampler.epoch_indices(0), (std::vector<uint64_t>{6, 9, 7, 1, 3, 4, 5, 2, 0, 8}));
}

TEST(Sampler, WithoutShuffleTheOrderIsNatural) {
  auto o = options(10, 3, 1, 2, false);
  o.shuffle = false;
  EXPECT_EQ(Sampler(o).epoch_indices(5), (std::vector<uint64_t>{1, 3, 5, 7, 9}));
}

TEST(Sampler, RanksSplitTheEpochWithEqualCounts) {
  for (uint64_t n : {1, 2, 5, 10, 17, 40}) {
    for (uint64_t world = 1; world <= 4; ++world) {
      for (bool drop_last : {true, false}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " world=" + std::to_string(world) +
                     " drop_last=" + std::to_string(drop_last));
        std::map<uint64_t, int> seen;
        size_t per_rank = 0;
        for (uint64_t rank = 0; rank < world; ++rank) {
          Sampler sampler(options(n, 3, rank, world, drop_last));
          auto mine = sampler.epoch_indices(4);
          if (rank == 0) per_rank = mine.size();
          EXPECT_EQ(mine.size(), per_rank);
          EXPECT_EQ(sampler.samples_per_rank(), mine.size());
          for (auto i : mine) ++seen[i];
          // The batches are the epoch's indices in order.
          std::vector<uint64_t> joined;
          for (uint64_t b = 0; b < sampler.batches_per_epoch(); ++b) {
            auto batch = sampler.batch_indices(4, b);
            EXPECT_LE(batch.size(), 3u);
            if (drop_last) {
              EXPECT_EQ(batch.size(), 3u);
            }
            joined.insert(joined.end(), batch.begin(), batch.end());
          }
          EXPECT_EQ(joined, std::vector<uint64_t>(mine.begin(), mine.begin() + joined.size()));
          if (!drop_last) {
            EXPECT_EQ(joined.size(), mine.size());
          }
        }
        if (drop_last) {
          EXPECT_EQ(per_rank, n / world);
          EXPECT_EQ(seen.size(), per_rank * world);  // no sample twice
          for (auto& [index, count] : seen) EXPECT_EQ(count, 1) << index;
        } else {
          EXPECT_EQ(per_rank, (n + world - 1) / world);
          EXPECT_EQ(seen.size(), n);  // every sample, the padding repeats a few
          int extra = 0;
          for (auto& [index, count] : seen) extra += count - 1;
          EXPECT_EQ(static_cast<uint64_t>(extra), per_rank * world - n);
        }
      }
    }
  }
}

TEST(Sampler, ChunkAwareOrderVisitsWholeChunksAWindowAtATime) {
  for (uint64_t offset : {0ull, 3ull}) {
    auto o = options(95, 4, 0, 1, false);
    o.group_size = 10;
    o.group_offset = offset;
    o.window = 3;
    Sampler sampler(o);
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      auto order = sampler.epoch_order(epoch);
      auto sorted = order;
      std::sort(sorted.begin(), sorted.end());
      std::vector<uint64_t> all(95);
      std::iota(all.begin(), all.end(), uint64_t{0});
      ASSERT_EQ(sorted, all) << "a permutation";
      // Consecutive windows hold whole groups: the groups seen so far change only at window
      // boundaries, and no window holds more than 3 groups.
      std::set<uint64_t> window_groups;
      std::set<uint64_t> finished;
      size_t in_window = 0, window_size = 0;  // samples seen in the window, and its size
      for (size_t i = 0; i < order.size(); ++i) {
        const uint64_t group = (order[i] + offset) / 10;
        ASSERT_FALSE(finished.count(group)) << "group " << group << " revisited";
        window_groups.insert(group);
        ASSERT_LE(window_groups.size(), 3u);
        // When every sample of the window's groups has been seen, the window closes.
        ++in_window;
        window_size = 0;
        for (uint64_t g : window_groups) {
          const uint64_t lo = std::max<uint64_t>(g * 10, offset) - offset;
          const uint64_t hi = std::min<uint64_t>((g + 1) * 10 - offset, 95);
          window_size += hi - lo;
        }
        if (in_window == window_size && (window_groups.size() == 3 || i + 1 == order.size())) {
          finished.insert(window_groups.begin(), window_groups.end());
          window_groups.clear();
          in_window = 0;
        }
      }
      EXPECT_NE(order, sampler.epoch_order(epoch + 1));
      // Within a window the samples are shuffled, not in time order.
      EXPECT_FALSE(std::is_sorted(order.begin(), order.begin() + 10));
    }
    // Ranks still split the chunk-aware epoch exactly.
    std::multiset<uint64_t> seen;
    for (uint64_t rank = 0; rank < 4; ++rank) {
      auto r = o;
      r.rank = rank;
      r.world_size = 4;
      r.drop_last = false;
      auto mine = Sampler(r).epoch_indices(1);
      EXPECT_EQ(mine.size(), 24u);
      seen.insert(mine.begin(), mine.end());
    }
    for (uint64_t i = 0; i < 95; ++i) EXPECT_GE(seen.count(i), 1u);
    EXPECT_EQ(seen.size(), 96u);  // one padded sample
  }
}

TEST(Sampler, RejectsBadOptions) {
  EXPECT_THROW(Sampler(options(10, 0, 0, 1, true)), Error);
  EXPECT_THROW(Sampler(options(10, 2, 2, 2, true)), Error);
  EXPECT_THROW(Sampler(options(10, 2, 0, 0, true)), Error);
  EXPECT_EQ(Sampler(options(0, 2, 0, 1, false)).batches_per_epoch(), 0u);
}

}  // namespace
}  // namespace zfeed::loader
