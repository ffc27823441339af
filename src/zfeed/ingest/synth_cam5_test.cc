#include "zfeed/ingest/synth_cam5.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "zfeed/util/testing.h"
#include "zfeed/zarr/array.h"
#include "zfeed/zarr/group.h"

namespace zfeed::ingest {
namespace {

constexpr size_t kChannels = Cam5Synth::kChannels;

struct Sample {
  std::vector<float> channels;
  std::vector<uint8_t> labels;
};

Sample generate(const Cam5Synth& synth, double hours) {
  Sample sample{std::vector<float>(kChannels * synth.field_size()),
                std::vector<uint8_t>(synth.field_size())};
  synth.generate(hours, sample.channels, sample.labels);
  return sample;
}

size_t channel_index(const std::string& name) {
  const auto& variables = cam5_variables();
  for (size_t c = 0; c < variables.size(); ++c)
    if (variables[c].name == name) return c;
  throw std::runtime_error("no channel " + name);
}

TEST(SynthCam5, ChannelsInDeepCamOrder) {
  std::vector<std::string> names;
  for (const auto& v : cam5_variables()) names.push_back(v.name);
  EXPECT_EQ(names, (std::vector<std::string>{"TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS",
                                             "PSL", "T200", "T500", "PRECT", "TS", "TREFHT",
                                             "Z1000", "Z200", "ZBOT"}));
  EXPECT_EQ(names.size(), kChannels);
}

TEST(SynthCam5, DeterministicFromSeed) {
  Cam5Synth a(7, 48, 72), b(7, 48, 72), c(8, 48, 72);
  Sample sa = generate(a, 123), sb = generate(b, 123), sc = generate(c, 123);
  EXPECT_EQ(sa.channels, sb.channels);
  EXPECT_EQ(sa.labels, sb.labels);
  EXPECT_NE(sa.channels, sc.channels);
  EXPECT_THROW(Cam5Synth(0, 0, 4), Error);
}

// Over 8 samples at a modest grid: the class frequencies are near the published ones (DeepCAM:
// 0.046% cyclone, 1.33% river; SC18: under 0.1%, 1.7%), the classes look like what they mark, and
// every channel stays within plausible bounds.
TEST(SynthCam5, ClassFrequenciesAndFeatures) {
  const size_t nlat = 192, nlon = 288;
  Cam5Synth synth(1, nlat, nlon);
  const size_t n = synth.field_size();
  std::array<double, 3> count{};
  std::array<double, 3> psl_sum{}, tmq_sum{}, prect_sum{}, wind_sum{};
  const size_t tmq = channel_index("TMQ"), psl = channel_index("PSL"),
               prect = channel_index("PRECT"), u850 = channel_index("U850"),
               v850 = channel_index("V850");
  struct Range {
    double lo, hi;
  };
  const std::vector<Range> ranges = {{0, 110},   {-80, 80},   {-80, 80},       {-70, 70},
                                     {-70, 70},  {0, 0.03},   {50000, 106000}, {90000, 106000},
                                     {200, 240}, {225, 285},  {0, 1e-4},       {200, 320},
                                     {200, 320}, {-900, 500}, {10000, 13000},  {40, 80}};
  const size_t samples = 8;
  for (size_t s = 0; s < samples; ++s) {
    Sample sample = generate(synth, 0.0 + 27.0 * double(s));  // about one a day, 3-hourly aligned
    for (size_t c = 0; c < kChannels; ++c) {
      auto [lo, hi] = std::minmax_element(sample.channels.begin() + c * n,
                                          sample.channels.begin() + (c + 1) * n);
      EXPECT_GE(*lo, ranges[c].lo) << cam5_variables()[c].name;
      EXPECT_LE(*hi, ranges[c].hi) << cam5_variables()[c].name;
      EXPECT_GT(*hi, *lo) << cam5_variables()[c].name;
    }
    for (size_t p = 0; p < n; ++p) {
      uint8_t label = sample.labels[p];
      ASSERT_LE(label, 2);
      count[label] += 1;
      psl_sum[label] += sample.channels[psl * n + p];
      tmq_sum[label] += sample.channels[tmq * n + p];
      prect_sum[label] += sample.channels[prect * n + p];
      wind_sum[label] += std::hypot(sample.channels[u850 * n + p], sample.channels[v850 * n + p]);
    }
  }
  const double total = double(samples * n);
  const double cyclone = count[kTropicalCyclone] / total, river = count[kAtmosphericRiver] / total;
  std::printf("class frequencies: background %.4f%%, cyclone %.4f%%, river %.4f%%\n",
              100 * count[kBackground] / total, 100 * cyclone, 100 * river);
  EXPECT_GT(cyclone, 0);
  EXPECT_LT(cyclone, 0.002);
  EXPECT_GT(river, 0.01);
  EXPECT_LT(river, 0.03);
  auto mean = [&](const std::array<double, 3>& sum, int label) {
    return sum[label] / count[label];
  };
  std::printf(
      "mean PSL %.0f / %.0f / %.0f Pa, TMQ %.1f / %.1f / %.1f kg/m2, wind %.1f / %.1f / %.1f m/s\n",
      mean(psl_sum, 0), mean(psl_sum, 1), mean(psl_sum, 2), mean(tmq_sum, 0), mean(tmq_sum, 1),
      mean(tmq_sum, 2), mean(wind_sum, 0), mean(wind_sum, 1), mean(wind_sum, 2));
  EXPECT_LT(mean(psl_sum, kTropicalCyclone), mean(psl_sum, kBackground) - 500);
  EXPECT_GT(mean(tmq_sum, kTropicalCyclone), mean(tmq_sum, kBackground) + 10);
  EXPECT_GT(mean(prect_sum, kTropicalCyclone), 5 * mean(prect_sum, kBackground));
  EXPECT_GT(mean(wind_sum, kTropicalCyclone), mean(wind_sum, kBackground) + 5);
  EXPECT_GT(mean(tmq_sum, kAtmosphericRiver), mean(tmq_sum, kBackground) + 10);
  EXPECT_GT(mean(wind_sum, kAtmosphericRiver), mean(wind_sum, kBackground));
}

TEST(SynthCam5, FeaturesMoveSmoothlyInTime) {
  Cam5Synth synth(3, 96, 144);
  Sample a = generate(synth, 600), b = generate(synth, 603), far = generate(synth, 900);
  auto overlap = [](const Sample& x, const Sample& y) {
    double both = 0, either = 0;
    for (size_t p = 0; p < x.labels.size(); ++p) {
      both += x.labels[p] && x.labels[p] == y.labels[p];
      either += x.labels[p] || y.labels[p];
    }
    return either ? both / either : 1.0;
  };
  // Three hours apart the features have moved a little; 300 hours apart they are others.
  EXPECT_GT(overlap(a, b), 0.5);
  EXPECT_LT(overlap(a, far), 0.3);
  EXPECT_NE(a.channels, b.channels);
}

TEST(SynthCam5, WritesStore) {
  auto dir = std::filesystem::temp_directory_path() /
             ("zfeed_synth_cam5_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  Cam5SynthOptions options;
  options.output = dir.string();
  options.nlat = 12;
  options.nlon = 16;
  options.times = 5;
  options.seed = 4;
  options.shard_times = 2;
  write_cam5_synth(options);

  auto store = open_store(dir.string());
  auto group = zarr::Group::open(store, "");
  EXPECT_TRUE(group.is_consolidated());
  auto members = group.members();
  EXPECT_EQ(members.size(), kChannels + 4);  // the channels, labels, lat, lon, time
  auto psl = zarr::Array::open(store, "PSL");
  EXPECT_EQ(psl.metadata().shape, (std::vector<uint64_t>{5, 12, 16}));
  EXPECT_EQ(psl.read_chunk_shape(), (std::vector<uint64_t>{1, 12, 16}));
  EXPECT_EQ(psl.metadata().attributes["units"], "Pa");
  std::vector<float> values(5 * 12 * 16);
  psl.read(psl.full_selection(), values.data());
  Cam5Synth synth(4, 12, 16);
  Sample expected = generate(synth, 9);  // step 3 at 3-hourly steps
  const size_t n = synth.field_size();
  EXPECT_TRUE(std::equal(expected.channels.begin() + channel_index("PSL") * n,
                         expected.channels.begin() + (channel_index("PSL") + 1) * n,
                         values.begin() + 3 * n));
  auto labels = zarr::Array::open(store, "labels");
  EXPECT_EQ(labels.metadata().dtype.name(), "uint8");
  EXPECT_EQ(labels.metadata().attributes["flag_meanings"],
            "background tropical_cyclone atmospheric_river");
  std::vector<uint8_t> classes(5 * n);
  labels.read(labels.full_selection(), classes.data());
  EXPECT_TRUE(std::equal(expected.labels.begin(), expected.labels.end(), classes.begin() + 3 * n));

  // An existing output is kept unless overwrite; the stacked layout holds the same values.
  EXPECT_TRUE(
      testing::contains(testing::error_of([&] { write_cam5_synth(options); }), "--overwrite"));
  options.overwrite = true;
  options.stack = true;
  options.shard_times = 0;
  write_cam5_synth(options);
  EXPECT_EQ(zarr::Group::open(store, "").members(),
            (std::vector<std::string>{"data", "labels", "lat", "lon", "time"}));
  auto data = zarr::Array::open(store, "data");
  EXPECT_EQ(data.metadata().shape, (std::vector<uint64_t>{5, kChannels, 12, 16}));
  EXPECT_EQ(data.metadata().attributes["variables"][7], "PSL");
  std::vector<float> stacked(kChannels * n);
  data.read({{3, 4, 1}, {0, kChannels, 1}, {0, 12, 1}, {0, 16, 1}}, stacked.data());
  EXPECT_EQ(stacked, expected.channels);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zfeed::ingest
