#include "zfeed/ingest/grib.h"

#if ZFEED_HAVE_GRIB
#include <eccodes.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#define ZFEED_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZFEED_LSAN 1
#endif
#endif
#if ZFEED_LSAN
#include <sanitizer/lsan_interface.h>
#endif
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "zfeed/ingest/convert.h"
#include "zfeed/store/store.h"
#include "zfeed/util/testing.h"
#include "zfeed/zarr/array.h"

namespace zfeed::ingest {
namespace {

using zfeed::testing::error_of;
using zfeed::testing::TempDir;

// In every build a GRIB file is recognized by its signature; where zfeed was built without
// ecCodes, opening or converting one is an UnsupportedError that says so and why.
TEST(GribSource, AGribFileIsRecognizedAndRefusedClearlyWithoutEccodes) {
  TempDir dir;
  // A bulletin header, then "GRIB", a GRIB 1 length (28 bytes) and edition 1; nothing more.
  std::ofstream(dir / "header-only.grib", std::ios::binary)
      << std::string("\n\nGRIB\0\0\x1c\x01", 10);
  EXPECT_TRUE(looks_like_grib(dir / "header-only.grib"));
  if (grib_support().available) {
    EXPECT_TRUE(grib_support().reason.empty());
    EXPECT_CONTAINS(error_of([&] { open_source(dir / "header-only.grib"); }), "header-only.grib");
    return;
  }
  EXPECT_CONTAINS(grib_support().reason, "GRIB support was not built");
  std::string message = error_of<UnsupportedError>([&] { open_source(dir / "header-only.grib"); });
  EXPECT_CONTAINS(message, "header-only.grib: a GRIB file, but GRIB support was not built (");
  ConvertOptions options;
  options.inputs = {dir / "header-only.grib"};
  options.output = dir / "out.zarr";
  message = error_of<UnsupportedError>([&] { convert(options); });
  EXPECT_CONTAINS(message, "GRIB support was not built");
}

#if !ZFEED_HAVE_GRIB
TEST(GribSource, ReadsGribFiles) { GTEST_SKIP() << grib_support().reason; }
#else
std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The values of every message of a file, decoded by ecCodes directly, with the keys that place it.
struct Reference {
  std::string short_name;
  long number = 0;
  long date = 0;
  long time = 0;
  double level = 0;
  std::vector<float> values;
};

std::vector<Reference> decode_all(const std::string& path) {
  std::vector<Reference> messages;
  FILE* file = std::fopen(path.c_str(), "rb");
  EXPECT_NE(file, nullptr);
  int status = 0;
  while (codes_handle* h = codes_handle_new_from_file(nullptr, file, PRODUCT_GRIB, &status)) {
    Reference message;
    char name[64] = {};
    size_t length = sizeof name;
    codes_get_string(h, "shortName", name, &length);
    message.short_name = name;
    codes_get_long(h, "number", &message.number);
    codes_get_long(h, "dataDate", &message.date);
    codes_get_long(h, "dataTime", &message.time);
    codes_get_double(h, "level", &message.level);
    size_t size = 0;
    codes_get_size(h, "values", &size);
    std::vector<double> values(size);
    codes_get_double_array(h, "values", values.data(), &size);
    message.values.assign(values.begin(), values.end());
    messages.push_back(std::move(message));
    codes_handle_delete(h);
  }
  std::fclose(file);
  return messages;
}

template <typename T>
std::vector<T> read_whole(const Source& source, const std::string& name) {
  const Variable* variable = source.find(name);
  EXPECT_NE(variable, nullptr) << name;
  if (variable == nullptr) return {};
  uint64_t count = 1;
  for (uint64_t extent : variable->shape) count *= extent;
  std::vector<T> values(count);
  std::vector<uint64_t> start(variable->rank(), 0);
  source.read(*variable, start, variable->shape, values.data());
  return values;
}

// A GRIB message made from one of ecCodes' samples with the keys set.
struct FieldSpec {
  std::string sample = "regular_ll_sfc_grib2";
  std::string short_name = "t";
  long date = 20200101;
  long time = 0;
  std::string level_type = "surface";
  long level = 0;
  long ni = 4;
  long nj = 3;
  double lat_first = 10, lat_last = 8, lon_first = 0, lon_last = 3;
  std::vector<double> values;  // empty: a ramp
  bool bitmap = false;         // values equal to 9999 are missing
  bool westward = false;       // iScansNegatively
};

std::string make_message(const FieldSpec& spec) {
  codes_handle* h = codes_grib_handle_new_from_samples(nullptr, spec.sample.c_str());
  EXPECT_NE(h, nullptr) << spec.sample;
  auto ok = [&](int status, const char* key) {
    EXPECT_EQ(status, 0) << key << ": " << codes_get_error_message(status);
  };
  size_t length = spec.short_name.size();
  ok(codes_set_string(h, "shortName", spec.short_name.c_str(), &length), "shortName");
  ok(codes_set_long(h, "dataDate", spec.date), "dataDate");
  ok(codes_set_long(h, "dataTime", spec.time), "dataTime");
  if (spec.sample.starts_with("regular_ll")) {
    ok(codes_set_long(h, "Ni", spec.ni), "Ni");
    ok(codes_set_long(h, "Nj", spec.nj), "Nj");
    long edition = 0;
    codes_get_long(h, "edition", &edition);
    // GRIB 2 keeps the point count in its own key (GRIB 1 derives it from Ni and Nj).
    if (edition == 2) ok(codes_set_long(h, "numberOfDataPoints", spec.ni * spec.nj), "points");
    ok(codes_set_double(h, "latitudeOfFirstGridPointInDegrees", spec.lat_first), "lat1");
    ok(codes_set_double(h, "latitudeOfLastGridPointInDegrees", spec.lat_last), "lat2");
    ok(codes_set_double(h, "longitudeOfFirstGridPointInDegrees", spec.lon_first), "lon1");
    ok(codes_set_double(h, "longitudeOfLastGridPointInDegrees", spec.lon_last), "lon2");
    ok(codes_set_long(h, "iScansNegatively", spec.westward), "iScansNegatively");
    const double span =
        spec.westward ? spec.lon_first - spec.lon_last : spec.lon_last - spec.lon_first;
    const double di = spec.ni > 1 ? std::fmod(span + 360.0, 360.0) / double(spec.ni - 1) : 1;
    const double dj =
        spec.nj > 1 ? std::fabs(spec.lat_last - spec.lat_first) / double(spec.nj - 1) : 1;
    ok(codes_set_double(h, "iDirectionIncrementInDegrees", di), "di");
    ok(codes_set_double(h, "jDirectionIncrementInDegrees", dj), "dj");
    ok(codes_set_long(h, "jScansPositively", spec.lat_last > spec.lat_first), "jScansPositively");
  }
  length = spec.level_type.size();
  ok(codes_set_string(h, "typeOfLevel", spec.level_type.c_str(), &length), "typeOfLevel");
  ok(codes_set_long(h, "level", spec.level), "level");
  size_t points = static_cast<size_t>(spec.ni * spec.nj);
  if (!spec.sample.starts_with("regular_ll")) codes_get_size(h, "values", &points);
  std::vector<double> values = spec.values;
  if (values.empty()) {
    for (size_t i = 0; i < points; ++i) values.push_back(250.0 + double(i) + spec.time / 100.0);
  }
  EXPECT_EQ(values.size(), points);
  ok(codes_set_long(h, "bitsPerValue", 24), "bitsPerValue");
  if (spec.bitmap) {
    ok(codes_set_double(h, "missingValue", 9999), "missingValue");
    ok(codes_set_long(h, "bitmapPresent", 1), "bitmapPresent");
  }
  ok(codes_set_double_array(h, "values", values.data(), values.size()), "values");
  const void* message = nullptr;
  size_t size = 0;
  ok(codes_get_message(h, &message, &size), "message");
  std::string bytes(static_cast<const char*>(message), size);
  codes_handle_delete(h);
  return bytes;
}

constexpr int64_t kMarch2019 = 1551398400;  // 2019-03-01T00:00:00Z

TEST(GribSource, ReadsTheEra5HourlyFileAsCfgribDoes) {
  ZFEED_REQUIRE_SHARED(path, "data/era5-2mt-2019-03-uk.grib");
  GribSource source(path);
  EXPECT_EQ(source.message_count(), 744u);
  std::vector<std::string> names;
  for (const auto& variable : source.variables()) names.push_back(variable.name);
  EXPECT_EQ(names, (std::vector<std::string>{"number", "time", "step", "surface", "latitude",
                                             "longitude", "valid_time", "t2m"}));
  const Variable* t2m = source.find("t2m");
  ASSERT_NE(t2m, nullptr);
  EXPECT_EQ(t2m->dims, (std::vector<std::string>{"time", "latitude", "longitude"}));
  EXPECT_EQ(t2m->shape, (std::vector<uint64_t>{744, 33, 49}));
  EXPECT_EQ(t2m->dtype.id, DataTypeId::kFloat32);
  EXPECT_EQ(t2m->attributes["units"], "K");
  EXPECT_EQ(t2m->attributes["long_name"], "2 metre temperature");
  EXPECT_EQ(t2m->attributes["GRIB_shortName"], "2t");
  EXPECT_EQ(t2m->attributes["GRIB_paramId"], 167);
  EXPECT_EQ(t2m->attributes["coordinates"],
            "number time step surface latitude longitude valid_time");
  for (const char* scalar : {"number", "step", "surface"}) {
    ASSERT_NE(source.find(scalar), nullptr) << scalar;
    EXPECT_EQ(source.find(scalar)->rank(), 0u) << scalar;
  }
  EXPECT_EQ(read_whole<int64_t>(source, "number"), std::vector<int64_t>{0});
  EXPECT_EQ(read_whole<double>(source, "step"), std::vector<double>{0.0});
  const auto times = read_whole<int64_t>(source, "time");
  ASSERT_EQ(times.size(), 744u);
  for (size_t i = 0; i < times.size(); ++i) ASSERT_EQ(times[i], kMarch2019 + int64_t(i) * 3600);
  EXPECT_EQ(read_whole<int64_t>(source, "valid_time"), times);
  EXPECT_EQ(source.find("time")->attributes["units"], "seconds since 1970-01-01T00:00:00");
  const auto latitudes = read_whole<double>(source, "latitude");
  ASSERT_EQ(latitudes.size(), 33u);
  EXPECT_EQ(latitudes.front(), 58.0);
  EXPECT_EQ(latitudes[1], 57.75);
  EXPECT_EQ(latitudes.back(), 50.0);
  EXPECT_EQ(source.find("latitude")->attributes["stored_direction"], "decreasing");
  const auto longitudes = read_whole<double>(source, "longitude");
  ASSERT_EQ(longitudes.size(), 49u);
  EXPECT_EQ(longitudes.front(), -10.0);
  EXPECT_EQ(longitudes.back(), 2.0);
  EXPECT_EQ(source.attributes()["GRIB_edition"], 1);
  EXPECT_EQ(source.attributes()["GRIB_centre"], "ecmf");

  // Every field equals ecCodes' own decoding; a hyperslab is the matching sub-box.
  const auto reference = decode_all(path);
  ASSERT_EQ(reference.size(), 744u);
  const auto all = read_whole<float>(source, "t2m");
  for (size_t m = 0; m < 744; ++m) {
    ASSERT_TRUE(std::equal(reference[m].values.begin(), reference[m].values.end(),
                           all.begin() + m * 33 * 49))
        << "message " << m + 1;
  }
  std::vector<uint64_t> start{100, 3, 5}, count{3, 7, 11};
  std::vector<float> box(3 * 7 * 11);
  source.read(*t2m, start, count, box.data());
  for (uint64_t t = 0; t < 3; ++t) {
    for (uint64_t j = 0; j < 7; ++j) {
      for (uint64_t i = 0; i < 11; ++i) {
        ASSERT_EQ(box[(t * 7 + j) * 11 + i], reference[100 + t].values[(3 + j) * 49 + 5 + i]);
      }
    }
  }
  std::vector<uint64_t> bad_start{743, 0, 0}, bad_count{2, 1, 1};
  EXPECT_CONTAINS(error_of([&] { source.read(*t2m, bad_start, bad_count, box.data()); }),
                  "out of bounds");
}

TEST(GribSource, KeepsEnsembleMembersAndLevels) {
  ZFEED_REQUIRE_SHARED(path, "data/era5-levels-members.grib");
  GribSource source(path);
  for (const char* name : {"t", "z"}) {
    const Variable* variable = source.find(name);
    ASSERT_NE(variable, nullptr) << name;
    EXPECT_EQ(variable->dims, (std::vector<std::string>{"number", "time", "isobaricInhPa",
                                                        "latitude", "longitude"}));
    EXPECT_EQ(variable->shape, (std::vector<uint64_t>{10, 4, 2, 61, 120}));
  }
  EXPECT_EQ(read_whole<int64_t>(source, "number"),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(read_whole<double>(source, "isobaricInhPa"), (std::vector<double>{850, 500}));
  EXPECT_EQ(source.find("isobaricInhPa")->attributes["units"], "hPa");
  const int64_t jan1 = 1483228800;  // 2017-01-01T00:00:00Z
  EXPECT_EQ(read_whole<int64_t>(source, "time"),
            (std::vector<int64_t>{jan1, jan1 + 43200, jan1 + 86400, jan1 + 129600}));
  const auto latitudes = read_whole<double>(source, "latitude");
  EXPECT_EQ(latitudes.front(), 90.0);
  EXPECT_EQ(latitudes.back(), -90.0);
  const auto longitudes = read_whole<double>(source, "longitude");
  EXPECT_EQ(longitudes[1], 3.0);
  EXPECT_EQ(longitudes.back(), 357.0);

  // Each (number, time, level) field of t is its message, wherever that is in the file.
  const auto t = read_whole<float>(source, "t");
  const std::vector<long> dates{20170101, 20170101, 20170102, 20170102};
  const std::vector<long> hours{0, 1200, 0, 1200};
  const std::vector<double> levels{850, 500};
  size_t checked = 0;
  for (const auto& message : decode_all(path)) {
    if (message.short_name != "t") continue;
    size_t time = 0;
    while (dates[time] != message.date || hours[time] != message.time) ++time;
    const size_t level = message.level == 850 ? 0 : 1;
    const size_t field = ((size_t(message.number) * 4 + time) * 2 + level) * 61 * 120;
    ASSERT_TRUE(std::equal(message.values.begin(), message.values.end(), t.begin() + field))
        << "number " << message.number << " time " << time << " level " << message.level;
    ++checked;
  }
  EXPECT_EQ(checked, 80u);
}

TEST(GribSource, ReadsFromSeveralThreads) {
  ZFEED_REQUIRE_SHARED(path, "data/era5-2mt-2019-03-uk.grib");
  GribSource source(path);
  const Variable& t2m = *source.find("t2m");
  const auto whole = read_whole<float>(source, "t2m");
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      std::vector<float> field(33 * 49);
      for (uint64_t time = uint64_t(k); time < 744; time += 4) {
        std::vector<uint64_t> start{time, 0, 0}, count{1, 33, 49};
        source.read(t2m, start, count, field.data());
        if (!std::equal(field.begin(), field.end(), whole.begin() + time * 33 * 49))
          ++mismatches[k];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, (std::vector<int>{0, 0, 0, 0}));
}

TEST(GribSource, TruncatedOrCorruptFilesAreClearErrors) {
  ZFEED_REQUIRE_SHARED(path, "data/era5-2mt-2019-03-uk.grib");
  TempDir dir;
  const std::string bytes = read_file(path);
  // Cut inside message 6, which starts at byte 5 * 3360.
  write_file(dir / "truncated.grib", bytes.substr(0, 5 * 3360 + 1000));
  std::string message = error_of([&] { GribSource source(dir / "truncated.grib"); });
  EXPECT_CONTAINS(message, dir / "truncated.grib");
  EXPECT_CONTAINS(message, "message 6 at byte 16800");
  EXPECT_CONTAINS(message, "truncated or corrupt");

  // "GRIB" and garbage, after a few bytes of padding.
  std::string garbage("\0\0\0\0GRIB", 8);
  garbage += std::string("\x00\x01\x2c\x01", 4);  // a length of 300 bytes, edition 1
  for (int i = 0; i < 300; ++i) garbage.push_back(static_cast<char>((i * 37 + 11) & 0xff));
  write_file(dir / "garbage.grib", garbage);
  EXPECT_TRUE(looks_like_grib(dir / "garbage.grib"));
  message = error_of([&] { open_source(dir / "garbage.grib"); });
  EXPECT_CONTAINS(message, dir / "garbage.grib");
  EXPECT_CONTAINS(message, "message 1 at byte 4");

  write_file(dir / "text.txt", std::string(100, 'x') + "GRIB is mentioned here");
  EXPECT_FALSE(looks_like_grib(dir / "text.txt"));
  write_file(dir / "nothing.grib", std::string(100, 'x') + "GRI");
  message = error_of([&] { GribSource source(dir / "nothing.grib"); });
  EXPECT_CONTAINS(message, "no GRIB message");

  // The first message alone after padding opens through open_source.
  write_file(dir / "padded.grib", std::string(16, '\0') + bytes.substr(0, 3342));
  auto source = open_source(dir / "padded.grib");
  ASSERT_NE(source->find("t2m"), nullptr);
  EXPECT_EQ(source->find("t2m")->shape, (std::vector<uint64_t>{1, 33, 49}));
  EXPECT_EQ(read_whole<float>(*source, "t2m"), decode_all(path)[0].values);
}

TEST(GribSource, IrregularMessageSetsAreClearErrors) {
  ZFEED_REQUIRE_SHARED(path, "data/era5-levels-members.grib");
  TempDir dir;
  const std::string bytes = read_file(path);
  // Leave out message 3 (z, number 2, 2017-01-01 00:00, 500 hPa); messages are 14760 apart.
  write_file(dir / "gap.grib", bytes.substr(0, 2 * 14760) + bytes.substr(3 * 14760));
  std::string message = error_of([&] { GribSource source(dir / "gap.grib"); });
  EXPECT_CONTAINS(message, dir / "gap.grib");
  EXPECT_CONTAINS(message,
                  "variable z has no message for number 2, time 2017-01-01T00:00, "
                  "isobaricInhPa 500");
  // A message twice.
  write_file(dir / "twice.grib", bytes.substr(0, 14760) + bytes);
  message = error_of([&] { GribSource source(dir / "twice.grib"); });
  EXPECT_CONTAINS(message, "message 2 at byte 14760: a second field of z");
}

TEST(GribSource, DifferentGridsAndUnsupportedGridsAreClearErrors) {
  TempDir dir;
  FieldSpec small;
  FieldSpec other = small;
  other.ni = 5;
  other.lon_last = 4;
  other.time = 600;
  write_file(dir / "two-grids.grib", make_message(small) + make_message(other));
  std::string message = error_of([&] { GribSource source(dir / "two-grids.grib"); });
  EXPECT_CONTAINS(message, "message 2 at byte");
  EXPECT_CONTAINS(message, "differs from message 1's");
  EXPECT_CONTAINS(message, "5 x 3 points");

  FieldSpec reduced;
  reduced.sample = "reduced_gg_sfc_grib2";
  write_file(dir / "reduced.grib", make_message(small) + make_message(reduced));
  message = error_of<UnsupportedError>([&] { GribSource source(dir / "reduced.grib"); });
  EXPECT_CONTAINS(message, "message 2 at byte");
  EXPECT_CONTAINS(message, "grid type 'reduced_gg' is not supported");

  // One variable on two kinds of level.
  FieldSpec high = small;
  high.level_type = "isobaricInhPa";
  high.level = 500;
  write_file(dir / "levels.grib", make_message(small) + make_message(high));
  message = error_of([&] { GribSource source(dir / "levels.grib"); });
  EXPECT_CONTAINS(message, "variable t is on levels of type isobaricInhPa here but surface");
}

TEST(GribSource, Grib2WithBitmapGivesNaN) {
  TempDir dir;
  FieldSpec spec;
  spec.values = {1, 2, 9999, 4, 5, 6, 7, 9999, 9, 10, 11, 12};
  spec.bitmap = true;
  std::string bytes;
  for (long hour : {0L, 600L, 1200L}) {
    spec.time = hour;
    bytes += make_message(spec);
  }
  write_file(dir / "bitmap.grib2", bytes);
  GribSource source(dir / "bitmap.grib2");
  EXPECT_EQ(source.attributes()["GRIB_edition"], 2);
  const Variable* t = source.find("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<uint64_t>{3, 3, 4}));
  EXPECT_EQ(read_whole<double>(source, "latitude"), (std::vector<double>{10, 9, 8}));
  EXPECT_EQ(read_whole<double>(source, "longitude"), (std::vector<double>{0, 1, 2, 3}));
  const auto times = read_whole<int64_t>(source, "time");
  EXPECT_EQ(times, (std::vector<int64_t>{1577836800, 1577836800 + 21600, 1577836800 + 43200}));
  const auto values = read_whole<float>(source, "t");
  for (size_t field = 0; field < 3; ++field) {
    for (size_t i = 0; i < 12; ++i) {
      const float value = values[field * 12 + i];
      if (spec.values[i] == 9999) {
        EXPECT_TRUE(std::isnan(value)) << i;
      } else {
        EXPECT_NEAR(value, spec.values[i], 1e-3) << i;
      }
    }
  }
}

TEST(GribSource, LongitudesAcrossTheMeridianAndWestwardRows) {
  TempDir dir;
  auto longitudes = [&](double first, double last, long ni, bool westward) {
    FieldSpec spec;
    spec.ni = ni;
    spec.lon_first = first;
    spec.lon_last = last;
    spec.westward = westward;
    write_file(dir / "grid.grib2", make_message(spec));
    return read_whole<double>(GribSource(dir / "grid.grib2"), "longitude");
  };
  // A global grid from -180 (GRIB keeps it as 180) to 90, as ECMWF's open data runs.
  EXPECT_EQ(longitudes(-180, 90, 4, false), (std::vector<double>{-180, -90, 0, 90}));
  EXPECT_EQ(longitudes(350, 10, 3, false), (std::vector<double>{-10, 0, 10}));
  EXPECT_EQ(longitudes(0, 270, 4, false), (std::vector<double>{0, 90, 180, 270}));
  EXPECT_EQ(longitudes(90, 0, 4, true), (std::vector<double>{90, 60, 30, 0}));
  EXPECT_EQ(longitudes(10, 350, 3, true), (std::vector<double>{10, 0, -10}));
}

TEST(GribSource, RegularGaussianGrid) {
  TempDir dir;
  FieldSpec spec;
  spec.sample = "regular_gg_sfc_grib1";
  write_file(dir / "gg.grib", make_message(spec));
  GribSource source(dir / "gg.grib");
  // The latitudes are those ecCodes gives the grid.
  codes_handle* h = codes_grib_handle_new_from_samples(nullptr, "regular_gg_sfc_grib1");
  size_t size = 0;
  codes_get_size(h, "distinctLatitudes", &size);
  std::vector<double> expected(size);
  codes_get_double_array(h, "distinctLatitudes", expected.data(), &size);
  long nj = 0;
  codes_get_long(h, "Nj", &nj);
  codes_handle_delete(h);
  std::sort(expected.rbegin(), expected.rend());  // north to south, as the sample stores them
  const auto latitudes = read_whole<double>(source, "latitude");
  ASSERT_EQ(latitudes.size(), size_t(nj));
  ASSERT_EQ(latitudes.size(), expected.size());
  for (size_t j = 0; j < expected.size(); ++j) EXPECT_NEAR(latitudes[j], expected[j], 1e-9) << j;
}

// A message with one key set to `value` by ecCodes (as a corrupt header would say it).
std::string with_key(const std::string& message, const char* key, long value) {
  codes_handle* h = codes_handle_new_from_message_copy(nullptr, message.data(), message.size());
  EXPECT_NE(h, nullptr);
  if (h == nullptr) return message;
  EXPECT_EQ(codes_set_long(h, key, value), 0) << key;
  const void* bytes = nullptr;
  size_t size = 0;
  EXPECT_EQ(codes_get_message(h, &bytes, &size), 0);
  std::string out(static_cast<const char*>(bytes), size);
  codes_handle_delete(h);
  return out;
}

// ecCodes computes every latitude of a Gaussian grid in O(N^2) time, whatever rows a message
// holds: a header claiming N=30000 for a few rows is refused at once, not computed for a minute.
TEST(GribSource, RefusesAnImplausibleGaussianGridNumberQuickly) {
  TempDir dir;
  FieldSpec spec;
  spec.sample = "regular_gg_sfc_grib1";
  write_file(dir / "big-n.grib", with_key(make_message(spec), "N", 30000));
  const std::string error =
      error_of<UnsupportedError>([&] { GribSource source(dir / "big-n.grib"); });
  EXPECT_CONTAINS(error, "big-n.grib: message 1 at byte 0");
  EXPECT_CONTAINS(error, "Gaussian grid number N=30000 is over the N=4096 zfeed reads");
}

// ecCodes allocates as many values as the data section says it codes: a count far beyond the grid
// is refused before decoding, not turned into a multi-gigabyte allocation.
TEST(GribSource, RefusesACodedValueCountBeyondTheGrid) {
  TempDir dir;
  FieldSpec spec;
  spec.bitmap = true;  // (without one, the value count itself is refused first)
  spec.values = {1, 2, 9999, 4, 5, 6, 7, 8, 9999, 10, 11, 12};
  write_file(dir / "count.grib", with_key(make_message(spec), "numberOfValues", 704643091));
  GribSource source(dir / "count.grib");
  const std::string error = error_of([&] { read_whole<float>(source, "t"); });
  EXPECT_CONTAINS(error,
                  "count.grib: message 1 at byte 0: numberOfCodedValues 704643091 is more "
                  "than the grid's 12 points");
}

// A message that trips one of ecCodes' internal assertions (a bitmap section whose computed
// length is negative; found by grib_fuzz) is an error naming the file and message, not an abort
// of the process; the next file opens normally.
TEST(GribSource, AnEccodesAssertionIsAnErrorNotAnAbort) {
  const std::string input =
      std::string(ZFEED_SOURCE_DIR) + "/fuzz/regressions/grib_fuzz/eccodes-bitmap-assertion";
  // Unwinding out of ecCodes leaves what it had allocated for that message (the price of not
  // aborting); LeakSanitizer is told to ignore this one open, not ecCodes as a whole.
#if ZFEED_LSAN
  __lsan_disable();
#endif
  const std::string error = error_of([&] { GribSource source(input); });
#if ZFEED_LSAN
  __lsan_enable();
#endif
  EXPECT_CONTAINS(error,
                  "eccodes-bitmap-assertion: message 1 at byte 0: ecCodes rejected it in an "
                  "internal check (");
  TempDir dir;
  write_file(dir / "good.grib", make_message(FieldSpec{}));
  EXPECT_EQ(GribSource(dir / "good.grib").message_count(), 1u);
}

// GRIB 1 messages whose sections do not fit together (found by grib_fuzz): a bitmap flag cleared,
// so the bitmap section reads as a data section of no values; a grid section 4 bytes short, so
// the data section starts inside it. ecCodes 2.28 recursed without end computing numberOfPoints
// for both (a stack overflow). They are refused from their sections before ecCodes sees them.
TEST(GribSource, RefusesGrib1MessagesWhoseSectionsDoNotFit) {
  const std::string regressions = std::string(ZFEED_SOURCE_DIR) + "/fuzz/regressions/grib_fuzz/";
  EXPECT_CONTAINS(
      error_of([&] { GribSource source(regressions + "bitmap-flag-cleared-recursion"); }),
      "bitmap-flag-cleared-recursion: message 1 at byte 0: its data section codes 0 "
      "values for a grid of 128 x 64 points and it has no bitmap (corrupt message)");
  EXPECT_CONTAINS(
      error_of([&] { GribSource source(regressions + "short-grid-section-recursion"); }),
      "short-grid-section-recursion: message 1 at byte 0: grid description section at "
      "byte 60 is 28 bytes long (at least 32, ending by byte 104) (corrupt message)");
}

// A step in a missing unit (255) sent ecCodes' validity date into a minute-long loop; such a
// message is refused at once, naming the unit, and so is a step beyond 1000 years.
TEST(GribSource, RefusesAStepWithoutAUnitOfTimeOrBeyondAMillennium) {
  TempDir dir;
  FieldSpec spec;
  std::string message = with_key(make_message(spec), "forecastTime", 393216);
  write_file(dir / "unit.grib", with_key(message, "indicatorOfUnitOfTimeRange", 255));
  EXPECT_CONTAINS(error_of([&] { GribSource source(dir / "unit.grib"); }),
                  "unit.grib: message 1 at byte 0: step unit 255 is not a unit of time");
  // 393216 days, which ecCodes gives in hours.
  write_file(dir / "long.grib", with_key(message, "indicatorOfUnitOfTimeRange", 2));
  EXPECT_CONTAINS(error_of([&] { GribSource source(dir / "long.grib"); }),
                  "forecast step 9437184 (stepUnits 1) is over 1000 years");
}

TEST(GribSource, ConvertJoinsGribFilesAndRefusesMismatchedGrids) {
  TempDir dir;
  FieldSpec spec;
  spec.time = 0;
  const std::string first = make_message(spec);
  spec.time = 600;
  const std::string second = make_message(spec);
  spec.time = 1200;
  const std::string third = make_message(spec);
  write_file(dir / "a.grib", first + second);
  write_file(dir / "b.grib", third);

  ConvertOptions options;
  options.inputs = {dir / "a.grib", dir / "b.grib"};
  options.output = dir / "joined.zarr";
  options.chunks = {{"time", 1}};
  ConvertResult result = convert(options);
  EXPECT_NE(std::find(result.variables.begin(), result.variables.end(), "t"),
            result.variables.end());
  auto store = make_file_store(options.output);
  auto t = zarr::Array::open(store, "t");
  EXPECT_EQ(t.metadata().shape, (std::vector<uint64_t>{3, 3, 4}));
  std::vector<float> values(36);
  t.read(zarr::Selection{{0, 3, 1}, {0, 3, 1}, {0, 4, 1}}, values.data());
  GribSource a(dir / "a.grib"), b(dir / "b.grib");
  auto expected = read_whole<float>(a, "t");
  auto tail = read_whole<float>(b, "t");
  expected.insert(expected.end(), tail.begin(), tail.end());
  EXPECT_EQ(values, expected);
  auto time = zarr::Array::open(store, "time");
  std::vector<int64_t> times(3);
  time.read(zarr::Selection{{0, 3, 1}}, times.data());
  EXPECT_EQ(times, (std::vector<int64_t>{1577836800, 1577836800 + 21600, 1577836800 + 43200}));

  // A file on another grid.
  FieldSpec other = spec;
  other.lat_first = 20;
  other.lat_last = 18;
  write_file(dir / "c.grib", make_message(other));
  options.inputs = {dir / "a.grib", dir / "c.grib"};
  options.output = dir / "mismatched.zarr";
  std::string message = error_of([&] { convert(options); });
  EXPECT_CONTAINS(message, "mismatched grids");
  EXPECT_CONTAINS(message, "latitude");
  EXPECT_FALSE(std::filesystem::exists(dir / "mismatched.zarr"));
}
#endif  // ZFEED_HAVE_GRIB

}  // namespace
}  // namespace zfeed::ingest
