#include "zfeed/ingest/grib.h"

#include <eccodes.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "zfeed/codec/data_type.h"
#include "zfeed/util/box_copy.h"
#include "zfeed/util/error.h"

// ecCodes' build configuration says whether it was built thread-safe. It also defines HAVE_*
// macros, so it comes after everything else.
#if __has_include(<eccodes_config.h>)
#include <eccodes_config.h>
#endif
#if (defined(GRIB_PTHREADS) && GRIB_PTHREADS) || (defined(GRIB_OMP_THREADS) && GRIB_OMP_THREADS)
#define ZFEED_ECCODES_THREAD_SAFE 1
#else
#define ZFEED_ECCODES_THREAD_SAFE 0
#endif

namespace zfeed::ingest {
namespace {

// cfgrib sets ecCodes' missingValue to this before decoding and turns it into NaN; so does zfeed.
constexpr double kMissingValue = std::numeric_limits<float>::max();
// Larger grids than any real one (a 0.01 degree global grid has 6.5e8 points): a corrupt header.
constexpr uint64_t kMaxGridPoints = uint64_t{1} << 32;
// The largest Gaussian grid number read. ecCodes computes all 2N latitudes of a Gaussian grid in
// O(N^2) time (about 1.4 s for N=4096 on one core, 60 s for N=32768), whatever the rows a message
// holds; the finest regular Gaussian grids in use are far below this (F1280 is N=1280).
constexpr long kMaxGaussianN = 4096;
// A longer forecast step than any forecast or climate run has (1000 years, in seconds).
constexpr int64_t kMaxStepSeconds = int64_t{1000} * 365 * 86400;

// The seconds in a step unit (ecCodes' stepUnits: GRIB 2 code table 4.4's numbers, for either
// edition), months and longer at their shortest: for bounding a step only. nullopt: no such unit.
std::optional<int64_t> step_unit_seconds(long unit) {
  constexpr int64_t kDay = 86400;
  switch (unit) {
    case 0:
      return 60;  // minute
    case 1:
      return 3600;  // hour
    case 2:
      return kDay;  // day
    case 3:
      return 28 * kDay;  // month
    case 4:
      return 365 * kDay;  // year
    case 5:
      return 3650 * kDay;  // decade
    case 6:
      return 30 * 365 * kDay;  // normal (30 years)
    case 7:
      return 36500 * kDay;  // century
    case 10:
      return 3 * 3600;  // 3 hours
    case 11:
      return 6 * 3600;  // 6 hours
    case 12:
      return 12 * 3600;  // 12 hours
    case 13:
      return 1;  // second
    case 14:
      return 15 * 60;  // 15 minutes
    case 15:
      return 30 * 60;  // 30 minutes
    default:
      return std::nullopt;
  }
}
// The smallest whole message: GRIB 2's 16-byte indicator section and "7777" (GRIB 1 needs more).
constexpr uint64_t kMinMessageBytes = 20;

// The last error ecCodes logged on this thread: its return codes are terse ("Wrong message
// length"), its log says which section and which byte.
thread_local std::string last_eccodes_log;

void keep_eccodes_log(const codes_context*, int level, const char* message) {
  if ((level == GRIB_LOG_ERROR || level == GRIB_LOG_FATAL) && message != nullptr) {
    last_eccodes_log = message;
    while (!last_eccodes_log.empty() &&
           (last_eccodes_log.back() == '\n' || last_eccodes_log.back() == ' ')) {
      last_eccodes_log.pop_back();
    }
  }
}

// One of ecCodes' internal assertions failed: a corrupt message can reach them (seen: a bitmap
// section whose computed length is negative). ecCodes would abort the process; its assertion hook
// throws this instead, which unwinds through ecCodes' C frames (the library has unwind tables),
// leaving behind what ecCodes had allocated for that message.
class EccodesAssertion : public Error {
 public:
  using Error::Error;
};

void throw_eccodes_assertion(const char* message) {
  throw EccodesAssertion(std::string("ecCodes rejected it in an internal check (") +
                         (message ? message : "no message") + "): corrupt message");
}

// The default context, with ecCodes' own printing to stderr replaced by keep_eccodes_log and its
// assertions turned into exceptions.
codes_context* eccodes_context() {
  static codes_context* context = [] {
    codes_context* c = codes_context_get_default();
    codes_context_set_logging_proc(c, &keep_eccodes_log);
    codes_set_codes_assertion_failed_proc(&throw_eccodes_assertion);
    return c;
  }();
  return context;
}

std::string eccodes_error(int code) {
  std::string text = codes_get_error_message(code);
  if (!last_eccodes_log.empty()) {
    text += " (ecCodes: " + last_eccodes_log + ")";
    last_eccodes_log.clear();
  }
  return text;
}

std::mutex& decode_mutex() {
  static std::mutex mutex;
  return mutex;
}

struct HandleDeleter {
  void operator()(codes_handle* handle) const { codes_handle_delete(handle); }
};
using Handle = std::unique_ptr<codes_handle, HandleDeleter>;

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", value);
  return text;
}

// Typed access to one message's keys; errors name the message and the key.
class Keys {
 public:
  Keys(codes_handle* handle, const std::string& where) : handle_(handle), where_(where) {}

  // Defined and not coded as missing.
  bool has(const char* key) const {
    if (!codes_is_defined(handle_, key)) return false;
    int status = 0;
    const int missing = codes_is_missing(handle_, key, &status);
    return status != 0 || missing == 0;
  }
  std::string text(const char* key) const {
    char buffer[1024] = {};
    size_t length = sizeof buffer;
    check(codes_get_string(handle_, key, buffer, &length), key);
    return std::string(buffer, strnlen(buffer, std::min(length, sizeof buffer)));
  }
  long integer(const char* key) const {
    long value = 0;
    check(codes_get_long(handle_, key, &value), key);
    return value;
  }
  double real(const char* key) const {
    double value = 0;
    check(codes_get_double(handle_, key, &value), key);
    return value;
  }
  std::string text_or(const char* key, const std::string& fallback) const {
    return has(key) ? text(key) : fallback;
  }
  long integer_or(const char* key, long fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  // The value in its native type (integer, real or text), or null where absent or an array.
  Json native(const char* key) const {
    if (!has(key)) return nullptr;
    int type = 0;
    size_t size = 0;
    if (codes_get_native_type(handle_, key, &type) != 0) return nullptr;
    if (type != CODES_TYPE_STRING && (codes_get_size(handle_, key, &size) != 0 || size != 1)) {
      return nullptr;
    }
    switch (type) {
      case CODES_TYPE_LONG:
        return Json(static_cast<int64_t>(integer(key)));
      case CODES_TYPE_DOUBLE:
        return Json(real(key));
      case CODES_TYPE_STRING:
        return Json(text(key));
      default:
        return nullptr;
    }
  }

 private:
  void check(int status, const char* key) const {
    if (status != 0) throw Error(where_ + ": key " + key + ": " + eccodes_error(status));
  }

  codes_handle* handle_;
  const std::string& where_;
};

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
int64_t days_from_civil(int64_t year, int64_t month, int64_t day) {
  year -= month <= 2;
  const int64_t era = (year >= 0 ? year : year - 399) / 400;
  const int64_t year_of_era = year - era * 400;
  const int64_t day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
  const int64_t day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return era * 146097 + day_of_era - 719468;
}

// Seconds since 1970-01-01 of a GRIB date (YYYYMMDD) and time (HHMM).
int64_t epoch_seconds(long date, long time, const std::string& where, const char* what) {
  const long year = date / 10000, month = date / 100 % 100, day = date % 100;
  const long hour = time / 100, minute = time % 100;
  if (date < 0 || year > 9999 || month < 1 || month > 12 || day < 1 || day > 31 || time < 0 ||
      hour > 23 || minute > 59) {
    throw Error(where + ": " + what + " " + std::to_string(date) + " " + std::to_string(time) +
                " is not a valid date (YYYYMMDD) and time (HHMM)");
  }
  return days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60;
}

std::string iso_time(int64_t seconds) {
  // civil_from_days, the inverse of days_from_civil.
  const int64_t days = (seconds >= 0 ? seconds : seconds - 86399) / 86400;
  const int64_t in_day = seconds - days * 86400;
  const int64_t z = days + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t day_of_era = z - era * 146097;
  const int64_t year_of_era =
      (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146096) / 365;
  const int64_t day_of_year =
      day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
  const int64_t mp = (5 * day_of_year + 2) / 153;
  const int64_t day = day_of_year - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  const int64_t year = year_of_era + era * 400 + (month <= 2);
  char text[128];
  std::snprintf(text, sizeof text, "%04lld-%02lld-%02lldT%02lld:%02lld",
                static_cast<long long>(year), static_cast<long long>(month),
                static_cast<long long>(day), static_cast<long long>(in_day / 3600),
                static_cast<long long>(in_day / 60 % 60));
  return text;
}

// The horizontal grid of a message: what must be equal across the file.
struct Grid {
  std::string type;
  long ni = 0;
  long nj = 0;
  double lat_first = 0, lat_last = 0, lon_first = 0, lon_last = 0;
  bool westward = false;  // iScansNegatively: the points of a row run west
  long gaussian_n = 0;    // regular_gg only

  bool operator==(const Grid&) const = default;

  std::string describe() const {
    return type + " " + std::to_string(ni) + " x " + std::to_string(nj) + " points, latitude " +
           format_number(lat_first) + " to " + format_number(lat_last) + ", longitude " +
           format_number(lon_first) + " to " + format_number(lon_last) +
           (type == "regular_gg" ? ", N" + std::to_string(gaussian_n) : "");
  }
};

Grid grid_of(const Keys& keys, const std::string& where) {
  Grid grid;
  grid.type = keys.text_or("gridType", "unknown");
  if (grid.type != "regular_ll" && grid.type != "regular_gg") {
    throw UnsupportedError(where + ": grid type '" + grid.type +
                           "' is not supported (zfeed reads regular_ll and regular_gg grids)");
  }
  grid.ni = keys.integer("Ni");
  grid.nj = keys.integer("Nj");
  if (grid.ni < 1 || grid.nj < 1 ||
      static_cast<uint64_t>(grid.ni) * static_cast<uint64_t>(grid.nj) > kMaxGridPoints) {
    throw Error(where + ": a grid of " + std::to_string(grid.ni) + " x " + std::to_string(grid.nj) +
                " points (corrupt header?)");
  }
  const long points = keys.integer("numberOfPoints");
  if (static_cast<uint64_t>(points) !=
      static_cast<uint64_t>(grid.ni) * static_cast<uint64_t>(grid.nj)) {
    throw Error(where + ": numberOfPoints " + std::to_string(points) +
                " is not Ni x Nj = " + std::to_string(grid.ni) + " x " + std::to_string(grid.nj));
  }
  if (keys.integer_or("jPointsAreConsecutive", 0) != 0 ||
      keys.integer_or("alternativeRowScanning", 0) != 0) {
    throw UnsupportedError(where +
                           ": column-major or alternating row scanning is not supported (zfeed "
                           "reads grids stored row by row)");
  }
  grid.lat_first = keys.real("latitudeOfFirstGridPointInDegrees");
  grid.lat_last = keys.real("latitudeOfLastGridPointInDegrees");
  grid.lon_first = keys.real("longitudeOfFirstGridPointInDegrees");
  grid.lon_last = keys.real("longitudeOfLastGridPointInDegrees");
  grid.westward = keys.integer_or("iScansNegatively", 0) != 0;
  for (double degrees : {grid.lat_first, grid.lat_last, grid.lon_first, grid.lon_last}) {
    if (!std::isfinite(degrees) || std::fabs(degrees) > 720) {
      throw Error(where + ": grid corner " + format_number(degrees) + " degrees (corrupt header?)");
    }
  }
  if (grid.type == "regular_gg") {
    grid.gaussian_n = keys.integer("N");
    if (grid.gaussian_n > kMaxGaussianN) {
      throw UnsupportedError(where + ": Gaussian grid number N=" + std::to_string(grid.gaussian_n) +
                             " is over the N=" + std::to_string(kMaxGaussianN) +
                             " zfeed reads (corrupt header?)");
    }
    if (grid.gaussian_n < 1 || 2 * grid.gaussian_n < grid.nj) {
      throw Error(where + ": Gaussian grid number N=" + std::to_string(grid.gaussian_n) +
                  " does not fit its " + std::to_string(grid.nj) + " rows");
    }
  }
  return grid;
}

// Evenly spaced from `first` to `last` in `count` points, in the order the values are stored.
std::vector<double> spaced(double first, double last, long count) {
  std::vector<double> values(static_cast<size_t>(count));
  const double step = count > 1 ? (last - first) / static_cast<double>(count - 1) : 0.0;
  for (long i = 0; i < count; ++i)
    values[static_cast<size_t>(i)] = first + step * static_cast<double>(i);
  return values;
}

std::vector<double> longitudes_of(const Grid& grid) {
  double last = grid.lon_last;
  // GRIB keeps longitudes in [0, 360): a row that crosses the meridian eastward has its last
  // point "before" its first (350 to 10; a grid from -180, kept as 180, to 179.75), a westward
  // one the other way.
  if (grid.ni > 1 && !grid.westward && last < grid.lon_first) last += 360;
  if (grid.ni > 1 && grid.westward && last > grid.lon_first) last -= 360;
  std::vector<double> longitudes = spaced(grid.lon_first, last, grid.ni);
  // Past 360 after that: the same points from below 0 (-10 to 10; -180 to 179.75), so that the
  // coordinate stays monotonic and within [-180, 360].
  if (std::max(longitudes.front(), longitudes.back()) > 360) {
    for (double& longitude : longitudes) longitude -= 360;
  }
  return longitudes;
}

std::vector<double> latitudes_of(const Grid& grid, const std::string& where) {
  if (grid.type == "regular_ll") return spaced(grid.lat_first, grid.lat_last, grid.nj);
  // Gaussian: the rows are consecutive Gaussian latitudes of N, from the first grid point on.
  std::vector<double> gaussian(2 * static_cast<size_t>(grid.gaussian_n));
  if (int status = codes_get_gaussian_latitudes(grid.gaussian_n, gaussian.data()); status != 0) {
    throw Error(where + ": Gaussian latitudes of N=" + std::to_string(grid.gaussian_n) + ": " +
                eccodes_error(status));
  }
  size_t first = 0;
  for (size_t j = 1; j < gaussian.size(); ++j) {
    if (std::fabs(gaussian[j] - grid.lat_first) < std::fabs(gaussian[first] - grid.lat_first)) {
      first = j;
    }
  }
  const bool northward = grid.lat_last > grid.lat_first;
  const size_t rows = static_cast<size_t>(grid.nj);
  if (std::fabs(gaussian[first] - grid.lat_first) > 0.01 ||
      (northward ? first + 1 < rows : first + rows > gaussian.size())) {
    throw Error(where + ": the first grid latitude " + format_number(grid.lat_first) + " and " +
                std::to_string(grid.nj) +
                " rows do not fit the Gaussian latitudes of N=" + std::to_string(grid.gaussian_n));
  }
  std::vector<double> latitudes(rows);
  for (size_t j = 0; j < rows; ++j) latitudes[j] = gaussian[northward ? first - j : first + j];
  return latitudes;
}

// What cfgrib names a variable: cfVarName, else shortName, else the parameter id.
std::string variable_name_of(const Keys& keys) {
  for (const char* key : {"cfVarName", "shortName"}) {
    std::string name = keys.text_or(key, "");
    if (!name.empty() && name != "unknown" && name != "undef" && name != "~") return name;
  }
  return "paramId_" + std::to_string(keys.integer_or("paramId", 0));
}

// The variable attributes cfgrib writes: GRIB_<key> for its list of keys (the first few in its
// order, the rest sorted), then long_name, units and standard_name.
Json data_attributes(const Keys& keys, const std::string& grid_type) {
  static const std::vector<std::string> kLeading = {
      "paramId",   "dataType", "numberOfPoints", "typeOfLevel",
      "stepUnits", "stepType", "gridType",       "uvRelativeToGrid"};
  std::vector<std::string> rest = {"shortName",
                                   "units",
                                   "name",
                                   "cfName",
                                   "cfVarName",
                                   "missingValue",
                                   "totalNumber",
                                   "numberOfDirections",
                                   "numberOfFrequencies",
                                   "NV",
                                   "gridDefinitionDescription"};
  for (const char* key :
       {"Nx", "Ny", "iDirectionIncrementInDegrees", "iScansNegatively",
        "latitudeOfFirstGridPointInDegrees", "latitudeOfLastGridPointInDegrees",
        "longitudeOfFirstGridPointInDegrees", "longitudeOfLastGridPointInDegrees"}) {
    rest.emplace_back(key);
  }
  if (grid_type == "regular_ll") {
    for (const char* key :
         {"jDirectionIncrementInDegrees", "jPointsAreConsecutive", "jScansPositively"}) {
      rest.emplace_back(key);
    }
  } else {
    rest.emplace_back("N");
  }
  std::sort(rest.begin(), rest.end());
  Json attributes = Json::object();
  auto add = [&](const std::string& key) {
    Json value = key == "missingValue" ? Json(kMissingValue) : keys.native(key.c_str());
    if (!value.is_null()) attributes["GRIB_" + key] = std::move(value);
  };
  for (const auto& key : kLeading) add(key);
  for (const auto& key : rest) add(key);
  attributes["long_name"] = keys.text_or("name", "unknown");
  attributes["units"] = keys.text_or("units", "unknown");
  attributes["standard_name"] = keys.text_or("cfName", "unknown");
  return attributes;
}

// cfgrib's attributes of a level coordinate named by typeOfLevel.
Json level_attributes(const std::string& level_type) {
  if (level_type == "isobaricInhPa" || level_type == "isobaricInPa") {
    return {{"long_name", "pressure"},
            {"units", level_type == "isobaricInhPa" ? "hPa" : "Pa"},
            {"positive", "down"},
            {"stored_direction", "decreasing"},
            {"standard_name", "air_pressure"}};
  }
  if (level_type == "hybrid") {
    return {{"units", "1"},
            {"positive", "down"},
            {"long_name", "hybrid level"},
            {"standard_name", "atmosphere_hybrid_sigma_pressure_coordinate"}};
  }
  if (level_type == "heightAboveGround") {
    return {{"units", "m"},
            {"positive", "up"},
            {"long_name", "height above the surface"},
            {"standard_name", "height"}};
  }
  if (level_type == "depthBelowLand" || level_type == "depthBelowLandLayer") {
    return {{"units", "m"},
            {"positive", "down"},
            {"long_name", "soil depth"},
            {"standard_name", "depth"}};
  }
  return {{"long_name", "original GRIB coordinate for key: level(" + level_type + ")"},
          {"units", "1"}};
}

bool levels_descend(const std::string& level_type) {
  return level_type == "isobaricInhPa" || level_type == "isobaricInPa";
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

template <typename T>
std::vector<T> sorted_unique(std::vector<T> values, bool descending = false) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  if (descending) std::reverse(values.begin(), values.end());
  return values;
}

template <typename T>
uint64_t position_of(const std::vector<T>& values, T value) {
  return static_cast<uint64_t>(std::find(values.begin(), values.end(), value) - values.begin());
}

float to_float(double value) {
  if (std::isfinite(value) && std::fabs(value) > std::numeric_limits<float>::max()) {
    return value > 0 ? std::numeric_limits<float>::infinity()
                     : -std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(value);
}

// Where "GRIB" first occurs at or after `from` in the file open as `fd`, or `from` where it does
// not.
uint64_t find_magic(int fd, uint64_t from) {
  std::string window(4096, '\0');
  for (uint64_t base = from;;) {
    const ssize_t got = ::pread(fd, window.data(), window.size(), static_cast<off_t>(base));
    if (got < 4) return from;
    const size_t at = std::string_view(window.data(), static_cast<size_t>(got)).find("GRIB");
    if (at != std::string_view::npos) return base + at;
    base += static_cast<uint64_t>(got) - 3;  // a magic split across two windows
  }
}

// A 24-bit big-endian number, as GRIB 1 codes its lengths.
uint64_t u24(const uint8_t* p) { return uint64_t{p[0]} << 16 | uint64_t{p[1]} << 8 | p[2]; }

// The length the message at `at` declares in its indicator section, or 0 where it is not known
// (no full header there, an edition other than 1 and 2, or a GRIB 1 "large message", whose true
// length is coded elsewhere and bounded by 2^23 * 120 bytes).
uint64_t declared_length(int fd, uint64_t at) {
  uint8_t head[16] = {};
  const ssize_t got = ::pread(fd, head, sizeof head, static_cast<off_t>(at));
  if (got < 8 || std::memcmp(head, "GRIB", 4) != 0) return 0;
  if (head[7] == 1) {
    const uint64_t length = u24(head + 4);
    return length & 0x800000 ? 0 : length;
  }
  if (head[7] != 2 || got < 16) return 0;
  uint64_t length = 0;
  for (int i = 8; i < 16; ++i) length = length << 8 | head[i];
  return length;
}

// What is wrong with the sections of the GRIB 1 message of `length` bytes (its declared length)
// at `at`, "" where nothing is found: each section shorter than its fixed header or running past
// the message's end, a bitmap with fewer bits than the grid has points, or (without a bitmap) a
// data section coding fewer values than a regular grid's points. Read from the sections
// themselves before ecCodes sees the message: ecCodes 2.28 recurses without end computing
// numberOfPoints for some such messages (grib_fuzz found them: a cleared bitmap flag, so the
// bitmap reads as a data section of no values; a grid section cut short, so the data section
// starts inside it).
std::string grib1_structure_problem(int fd, uint64_t at, uint64_t length) {
  auto read = [&](uint64_t offset, uint8_t* out, size_t size) {
    return offset + size <= length &&
           ::pread(fd, out, size, static_cast<off_t>(at + offset)) == static_cast<ssize_t>(size);
  };
  const uint64_t end = length - 4;  // where "7777" starts (checked before)
  uint64_t offset = 8;
  std::string problem;
  // Reads the header of section `name` at `offset` into `header`: its length must hold the header
  // and end before "7777"; where not, says so in `problem`.
  auto section = [&](const char* name, uint8_t* header, size_t header_size, uint64_t minimum,
                     uint64_t& section_length) {
    if (!read(offset, header, header_size)) {
      problem = std::string(name) + " section at byte " + std::to_string(offset) +
                " runs past the message's end";
      return false;
    }
    section_length = u24(header);
    if (section_length < minimum || offset + section_length > end) {
      problem = std::string(name) + " section at byte " + std::to_string(offset) + " is " +
                std::to_string(section_length) + " bytes long (at least " +
                std::to_string(minimum) + ", ending by byte " + std::to_string(end) + ")";
      return false;
    }
    return true;
  };
  uint8_t pds[8] = {}, gds[10] = {}, bms[6] = {}, bds[11] = {};
  uint64_t pds_length = 0, gds_length = 0, bms_length = 0, bds_length = 0;
  if (!section("product definition", pds, sizeof pds, 28, pds_length)) return problem;
  const uint8_t flags = pds[7];
  const bool has_grid = flags & 0x80, has_bitmap = flags & 0x40;
  offset += pds_length;
  if (has_grid) {
    if (!section("grid description", gds, sizeof gds, 32, gds_length)) return problem;
    offset += gds_length;
  }
  if (has_bitmap) {
    if (!section("bitmap", bms, sizeof bms, 6, bms_length)) return problem;
    offset += bms_length;
  }
  if (!section("binary data", bds, sizeof bds, 11, bds_length)) return problem;
  // The rest needs a regular grid's point count.
  const uint64_t ni = uint64_t{gds[6]} << 8 | gds[7], nj = uint64_t{gds[8]} << 8 | gds[9];
  if (!has_grid || (gds[5] != 0 && gds[5] != 4) || ni == 0xFFFF || nj == 0xFFFF) return "";
  const uint64_t points = ni * nj;
  auto bits_in = [](uint64_t bytes, uint64_t unused) {
    return bytes * 8 - std::min(unused, bytes * 8);
  };
  if (has_bitmap) {
    const bool predefined = bms[4] != 0 || bms[5] != 0;  // a bitmap from a table, not coded here
    const uint64_t bitmap_bits = bits_in(bms_length - 6, bms[3]);
    if (!predefined && bitmap_bits < points)
      return "its bitmap has " + std::to_string(bitmap_bits) + " bits for a grid of " +
             std::to_string(ni) + " x " + std::to_string(nj) + " points";
    return "";
  }
  const uint64_t bits = bds[10];
  if ((bds[3] & 0xD0) != 0 || bits == 0) return "";  // simple packing of varying values only
  const uint64_t coded = bits_in(bds_length - 11, bds[3] & 0x0F) / bits;
  if (coded >= points) return "";
  return "its data section codes " + std::to_string(coded) + " values for a grid of " +
         std::to_string(ni) + " x " + std::to_string(nj) + " points and it has no bitmap";
}

}  // namespace

GribSource::GribSource(const std::string& path) : Source(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int error = errno;
    if (error == ENOENT) throw NotFoundError(path + ": no such file");
    throw Error(path + ": cannot open: " + std::strerror(error));
  }
  try {
    scan();
  } catch (const EccodesAssertion& assertion) {
    ::close(fd_);
    throw Error(path + ": " + assertion.what());
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

GribSource::~GribSource() { ::close(fd_); }

std::string GribSource::where(uint32_t index) const {
  return path_ + ": message " + std::to_string(index + 1) + " at byte " +
         std::to_string(messages_[index].offset);
}

void GribSource::scan() {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path_.c_str(), "rb"), &std::fclose);
  if (!file) throw Error(path_ + ": cannot open: " + std::strerror(errno));
  off_t file_size = ::lseek(fd_, 0, SEEK_END);
  if (file_size < 0) throw Error(path_ + ": cannot find its size: " + std::strerror(errno));

  // What places each message in its variable.
  struct Placed {
    int64_t number = 0;
    int64_t time = 0;  // reference time, seconds since 1970
    int64_t step = 0;  // validity - reference, seconds
    double level = 0;
  };
  // The messages of one variable.
  struct Group {
    std::string name;
    std::string level_type;
    uint32_t first_message = 0;
    std::vector<uint32_t> messages;
    Json attributes;
  };
  std::vector<Placed> placed;
  std::vector<Group> groups;
  std::map<std::string, uint32_t> group_of;
  std::optional<Grid> grid;
  std::vector<double> latitudes, longitudes;
  uint64_t end_of_last = 0;
  codes_context* context = eccodes_context();

  for (;;) {
    const uint32_t index = static_cast<uint32_t>(messages_.size());
    // ecCodes' reader allocates the length a message declares before reading it: a corrupt or
    // truncated message must not turn into a huge allocation, so check it against the file first.
    const off_t position = ::ftello(file.get());
    if (position >= 0) {
      const uint64_t at = find_magic(fd_, static_cast<uint64_t>(position));
      const uint64_t declared = declared_length(fd_, at);
      const std::string here =
          path_ + ": message " + std::to_string(index + 1) + " at byte " + std::to_string(at);
      char head[8] = {};
      if (::pread(fd_, head, sizeof head, static_cast<off_t>(at)) == sizeof head &&
          std::memcmp(head, "GRIB", 4) == 0 && head[7] != 1 && head[7] != 2) {
        throw UnsupportedError(here + ": GRIB edition " +
                               std::to_string(static_cast<uint8_t>(head[7])) +
                               " is not supported (zfeed reads GRIB 1 and 2)");
      }
      if (declared > static_cast<uint64_t>(file_size) - std::min<uint64_t>(at, file_size)) {
        throw Error(here + ": declares " + std::to_string(declared) + " bytes but the file ends " +
                    std::to_string(static_cast<uint64_t>(file_size) - at) +
                    " bytes after its start (truncated or corrupt file)");
      }
      // Shorter than its fixed sections, or not ended by "7777": ecCodes 2.28 overruns its
      // buffer on some of those.
      char end[4] = {};
      if (declared > 0 && (declared < kMinMessageBytes ||
                           ::pread(fd_, end, 4, static_cast<off_t>(at + declared - 4)) != 4 ||
                           std::memcmp(end, "7777", 4) != 0)) {
        throw Error(here + ": declares " + std::to_string(declared) +
                    " bytes but is not a whole message of that length (no \"7777\" at its end; "
                    "corrupt file)");
      }
      if (declared > 0 && head[7] == 1) {
        if (const std::string problem = grib1_structure_problem(fd_, at, declared);
            !problem.empty())
          throw Error(here + ": " + problem + " (corrupt message)");
      }
    }
    int status = 0;
    last_eccodes_log.clear();
    Handle handle;
    try {
      handle.reset(codes_handle_new_from_file(context, file.get(), PRODUCT_GRIB, &status));
    } catch (const EccodesAssertion& assertion) {
      throw Error(path_ + ": message " + std::to_string(index + 1) + " at byte " +
                  std::to_string(find_magic(fd_, end_of_last)) + ": " + assertion.what());
    }
    if (!handle) {
      if (status == GRIB_SUCCESS || status == GRIB_END_OF_FILE) break;
      const uint64_t at = find_magic(fd_, end_of_last);
      throw Error(path_ + ": message " + std::to_string(index + 1) + " at byte " +
                  std::to_string(at) +
                  ": cannot read it (truncated or corrupt file): " + eccodes_error(status));
    }
    if (index == std::numeric_limits<uint32_t>::max()) {
      throw Error(path_ + ": more than 2^32 messages");
    }
    // ecCodes gives the offset as a real number; below 2^53 bytes it is exact.
    double offset = -1;
    size_t length = 0;
    if (codes_get_double(handle.get(), "offset", &offset) != 0 || !(offset >= 0) ||
        offset > static_cast<double>(file_size) ||
        codes_get_message_size(handle.get(), &length) != 0 ||
        static_cast<uint64_t>(offset) < end_of_last ||
        static_cast<uint64_t>(offset) + length > static_cast<uint64_t>(file_size)) {
      throw Error(path_ + ": message " + std::to_string(index + 1) + " after byte " +
                  std::to_string(end_of_last) + ": ecCodes gives no valid position for it");
    }
    messages_.push_back({static_cast<uint64_t>(offset), length});
    end_of_last = static_cast<uint64_t>(offset) + length;
    const std::string where = this->where(index);
    Keys keys(handle.get(), where);

    Grid message_grid = grid_of(keys, where);
    if (!grid) {
      grid = message_grid;
      latitudes = latitudes_of(*grid, where);
      longitudes = longitudes_of(*grid);
      attributes_["GRIB_edition"] = keys.integer_or("edition", 0);
      attributes_["GRIB_centre"] = keys.text_or("centre", "unknown");
      attributes_["GRIB_centreDescription"] = keys.text_or("centreDescription", "unknown");
      attributes_["GRIB_subCentre"] = keys.integer_or("subCentre", 0);
      attributes_["Conventions"] = "CF-1.7";
      attributes_["institution"] = attributes_["GRIB_centreDescription"];
    } else if (message_grid != *grid) {
      throw Error(where + ": its grid (" + message_grid.describe() +
                  ") differs from message 1's (" + grid->describe() +
                  "); zfeed reads files whose messages share one grid (split the file, e.g. "
                  "with grib_copy -w)");
    }
    if (attributes_.contains("GRIB_edition") &&
        attributes_["GRIB_edition"] != keys.integer_or("edition", 0)) {
      attributes_.erase("GRIB_edition");  // mixed GRIB 1 and 2, as cfgrib leaves it out
    }

    Placed message;
    const std::string name = variable_name_of(keys);
    const std::string level_type = keys.text_or("typeOfLevel", "level");
    auto [it, inserted] = group_of.try_emplace(name, static_cast<uint32_t>(groups.size()));
    if (inserted) {
      groups.push_back({name, level_type, index, {}, data_attributes(keys, grid->type)});
    } else if (groups[it->second].level_type != level_type) {
      const Group& group = groups[it->second];
      throw Error(where + ": variable " + name + " is on levels of type " + level_type +
                  " here but " + group.level_type + " in message " +
                  std::to_string(group.first_message + 1) +
                  "; zfeed reads one level type per variable (split the file, e.g. with grib_copy "
                  "-w typeOfLevel=" +
                  group.level_type + ")");
    }
    groups[it->second].messages.push_back(index);
    message.number = keys.integer_or("number", 0);
    message.level = keys.has("level") ? keys.real("level") : 0.0;
    message.time = epoch_seconds(keys.integer("dataDate"), keys.integer("dataTime"), where,
                                 "dataDate/dataTime");
    // ecCodes takes minutes over the validity date of a corrupt step (an unknown or missing unit,
    // a huge count): check the step first. (Read after endStep, stepUnits is the unit endStep is
    // given in; before, it is ecCodes' default.)
    const long step = keys.integer("endStep");
    const long unit = keys.integer_or("stepUnits", 1);
    const std::optional<int64_t> unit_seconds = step_unit_seconds(unit);
    if (!unit_seconds) {
      throw Error(where + ": step unit " + std::to_string(unit) +
                  " is not a unit of time (stepUnits; corrupt header?)");
    }
    if (step < -kMaxStepSeconds / *unit_seconds || step > kMaxStepSeconds / *unit_seconds) {
      throw Error(where + ": forecast step " + std::to_string(step) + " (stepUnits " +
                  std::to_string(unit) + ") is over 1000 years (corrupt header?)");
    }
    message.step = epoch_seconds(keys.integer("validityDate"), keys.integer("validityTime"), where,
                                 "validityDate/validityTime") -
                   message.time;
    placed.push_back(message);
  }
  if (messages_.empty()) throw Error(path_ + ": no GRIB message in the file");
  ni_ = static_cast<uint64_t>(grid->ni);
  nj_ = static_cast<uint64_t>(grid->nj);

  // The coordinate values of each variable; variables must agree where they share a coordinate,
  // as cfgrib requires.
  struct Axes {
    std::vector<int64_t> numbers, times, steps;
    std::vector<double> levels;
  };
  std::vector<Axes> axes(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    Axes& a = axes[g];
    for (uint32_t m : groups[g].messages) {
      a.numbers.push_back(placed[m].number);
      a.times.push_back(placed[m].time);
      a.steps.push_back(placed[m].step);
      a.levels.push_back(placed[m].level);
    }
    a.numbers = sorted_unique(std::move(a.numbers));
    a.times = sorted_unique(std::move(a.times));
    a.steps = sorted_unique(std::move(a.steps));
    a.levels = sorted_unique(std::move(a.levels), levels_descend(groups[g].level_type));
  }
  auto disagree = [&](size_t a, size_t b, const std::string& coordinate, size_t count_a,
                      size_t count_b) {
    return Error(path_ + ": variables " + groups[a].name + " and " + groups[b].name +
                 " have different " + coordinate + " values (" + std::to_string(count_a) + " in " +
                 groups[a].name + ", " + std::to_string(count_b) + " in " + groups[b].name +
                 "); zfeed reads files whose variables share their coordinates (split the file, "
                 "e.g. with grib_copy -w shortName=" +
                 groups[b].name + ")");
  };
  std::map<std::string, size_t> first_with_level_type;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (axes[g].numbers != axes[0].numbers)
      throw disagree(0, g, "number", axes[0].numbers.size(), axes[g].numbers.size());
    if (axes[g].times != axes[0].times)
      throw disagree(0, g, "time", axes[0].times.size(), axes[g].times.size());
    if (axes[g].steps != axes[0].steps)
      throw disagree(0, g, "step", axes[0].steps.size(), axes[g].steps.size());
    auto [it, inserted] = first_with_level_type.try_emplace(groups[g].level_type, g);
    if (!inserted && axes[g].levels != axes[it->second].levels) {
      throw disagree(it->second, g, groups[g].level_type, axes[it->second].levels.size(),
                     axes[g].levels.size());
    }
  }
  const Axes& shared = axes[0];
  const bool number_dim = shared.numbers.size() > 1;
  const bool step_dim = shared.steps.size() > 1;

  // Coordinates, in cfgrib's order.
  auto add_coordinate = [&](const std::string& name, DataType dtype, bool is_dim, uint64_t size,
                            Json attributes, std::vector<uint8_t> values) {
    Variable variable;
    variable.name = name;
    variable.dtype = dtype;
    if (is_dim) {
      variable.dims = {name};
      variable.shape = {size};
    }
    variable.attributes = std::move(attributes);
    coordinates_[name] = std::move(values);
    variables_.push_back(std::move(variable));
  };
  const DataType int64{DataTypeId::kInt64}, float64{DataTypeId::kFloat64};
  const std::string epoch = "seconds since 1970-01-01T00:00:00";
  add_coordinate("number", int64, number_dim, shared.numbers.size(),
                 {{"long_name", "ensemble member numerical id"},
                  {"units", "1"},
                  {"standard_name", "realization"}},
                 bytes_of(shared.numbers));
  add_coordinate("time", int64, true, shared.times.size(),
                 {{"long_name", "initial time of forecast"},
                  {"standard_name", "forecast_reference_time"},
                  {"units", epoch},
                  {"calendar", "proleptic_gregorian"}},
                 bytes_of(shared.times));
  std::vector<double> step_hours;
  for (int64_t seconds : shared.steps) step_hours.push_back(static_cast<double>(seconds) / 3600.0);
  add_coordinate("step", float64, step_dim, shared.steps.size(),
                 {{"long_name", "time since forecast_reference_time"},
                  {"standard_name", "forecast_period"},
                  {"units", "hours"},
                  // What xarray writes for a timedelta and needs to decode one from a store.
                  {"dtype", "timedelta64[ns]"}},
                 bytes_of(step_hours));
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string& level_type = groups[g].level_type;
    if (first_with_level_type.at(level_type) != g) continue;
    if (coordinates_.count(level_type) || group_of.count(level_type)) {
      throw Error(path_ + ": the level type " + level_type +
                  " clashes with the name of another coordinate or variable");
    }
    add_coordinate(level_type, float64, axes[g].levels.size() > 1, axes[g].levels.size(),
                   level_attributes(level_type), bytes_of(axes[g].levels));
  }
  Json latitude_attributes = {
      {"units", "degrees_north"}, {"standard_name", "latitude"}, {"long_name", "latitude"}};
  if (latitudes.size() > 1 && latitudes.front() > latitudes.back()) {
    latitude_attributes["stored_direction"] = "decreasing";
  }
  add_coordinate("latitude", float64, true, nj_, latitude_attributes, bytes_of(latitudes));
  add_coordinate(
      "longitude", float64, true, ni_,
      {{"units", "degrees_east"}, {"standard_name", "longitude"}, {"long_name", "longitude"}},
      bytes_of(longitudes));
  {
    std::vector<int64_t> valid;
    for (int64_t time : shared.times) {
      for (int64_t step : shared.steps) valid.push_back(time + step);
    }
    Variable variable;
    variable.name = "valid_time";
    variable.dtype = int64;
    variable.dims = {"time"};
    variable.shape = {shared.times.size()};
    if (step_dim) {
      variable.dims.push_back("step");
      variable.shape.push_back(shared.steps.size());
    }
    variable.attributes = {{"standard_name", "time"},
                           {"long_name", "time"},
                           {"units", epoch},
                           {"calendar", "proleptic_gregorian"}};
    coordinates_["valid_time"] = bytes_of(valid);
    variables_.push_back(std::move(variable));
  }
  for (const auto& group : groups) {
    if (coordinates_.count(group.name)) {
      throw Error(path_ + ": variable " + group.name + " has the name of a coordinate");
    }
  }

  // The data variables, each with the message of every (number, time, step, level).
  for (size_t g = 0; g < groups.size(); ++g) {
    const Group& group = groups[g];
    const Axes& a = axes[g];
    const bool level_dim = a.levels.size() > 1;
    Variable variable;
    variable.name = group.name;
    variable.dtype = DataType{DataTypeId::kFloat32};
    FieldTable table;
    auto add_dim = [&](const std::string& name, uint64_t size) {
      variable.dims.push_back(name);
      variable.shape.push_back(size);
      table.header_shape.push_back(size);
    };
    if (number_dim) add_dim("number", a.numbers.size());
    add_dim("time", a.times.size());
    if (step_dim) add_dim("step", a.steps.size());
    if (level_dim) add_dim(group.level_type, a.levels.size());
    variable.dims.insert(variable.dims.end(), {"latitude", "longitude"});
    variable.shape.insert(variable.shape.end(), {nj_, ni_});
    const uint64_t fields = checked_product(table.header_shape, 1, path_ + ": " + group.name);

    // (flat index, message), sorted: a repeated index is a duplicate, a gap a missing field.
    std::vector<std::pair<uint64_t, uint32_t>> slots;
    for (uint32_t m : group.messages) {
      const Placed& p = placed[m];
      uint64_t flat = 0;
      size_t d = 0;
      auto step_in = [&](uint64_t position) {
        flat = flat * table.header_shape[d] + position;
        ++d;
      };
      if (number_dim) step_in(position_of(a.numbers, p.number));
      step_in(position_of(a.times, p.time));
      if (step_dim) step_in(position_of(a.steps, p.step));
      if (level_dim) step_in(position_of(a.levels, p.level));
      slots.emplace_back(flat, m);
    }
    std::sort(slots.begin(), slots.end());
    for (size_t k = 1; k < slots.size(); ++k) {
      if (slots[k].first == slots[k - 1].first) {
        throw Error(where(slots[k].second) + ": a second field of " + group.name +
                    " for the same (number, time, step, level) as message " +
                    std::to_string(slots[k - 1].second + 1) +
                    "; zfeed reads files with one message per field");
      }
    }
    if (slots.size() != fields) {
      uint64_t missing = 0;
      while (missing < slots.size() && slots[missing].first == missing) ++missing;
      // The coordinates of the missing field, for the message.
      std::vector<uint64_t> position(table.header_shape.size());
      for (size_t d = position.size(), rest = missing; d-- > 0;) {
        position[d] = rest % table.header_shape[d];
        rest /= table.header_shape[d];
      }
      std::string label;
      size_t d = 0;
      auto describe = [&](const std::string& text) { label += (label.empty() ? "" : ", ") + text; };
      if (number_dim) describe("number " + std::to_string(a.numbers[position[d++]]));
      describe("time " + iso_time(a.times[position[d++]]));
      if (step_dim) describe("step " + format_number(a.steps[position[d++]] / 3600.0) + " h");
      if (level_dim) describe(group.level_type + " " + format_number(a.levels[position[d++]]));
      throw Error(path_ + ": variable " + group.name + " has no message for " + label + " (" +
                  std::to_string(slots.size()) + " of " + std::to_string(fields) +
                  " fields present); zfeed reads complete sets of (number, time, step, level) "
                  "fields");
    }
    table.messages.reserve(slots.size());
    for (const auto& slot : slots) table.messages.push_back(slot.second);

    variable.attributes = group.attributes;
    variable.attributes["coordinates"] =
        "number time step " + group.level_type + " latitude longitude valid_time";
    fields_[group.name] = std::move(table);
    variables_.push_back(std::move(variable));
  }
}

void GribSource::decode(uint32_t index, std::vector<float>& field) const {
  const Message& message = messages_[index];
  std::vector<uint8_t> bytes(message.length);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::pread(fd_, bytes.data() + done, bytes.size() - done,
                                static_cast<off_t>(message.offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(where(index) + ": read failed: " + std::strerror(errno));
    }
    if (got == 0) {
      throw Error(where(index) + ": the file ends after " + std::to_string(done) + " of its " +
                  std::to_string(bytes.size()) + " bytes (truncated since it was opened?)");
    }
    done += static_cast<size_t>(got);
  }
  const size_t points = static_cast<size_t>(ni_ * nj_);
  std::vector<double> values(points);
  long bitmap = 0;
  try {
    // Debian's ecCodes is built thread-safe; another build decodes one message at a time.
    std::unique_lock<std::mutex> lock;
    if (!ZFEED_ECCODES_THREAD_SAFE) lock = std::unique_lock<std::mutex>(decode_mutex());
    last_eccodes_log.clear();
    Handle handle(codes_handle_new_from_message(eccodes_context(), bytes.data(), bytes.size()));
    if (!handle) {
      throw Error(where(index) + ": ecCodes cannot parse the message" +
                  (last_eccodes_log.empty() ? std::string() : ": " + last_eccodes_log));
    }
    auto check = [&](int status, const char* what) {
      if (status != 0) throw Error(where(index) + ": " + what + ": " + eccodes_error(status));
    };
    if (codes_get_long(handle.get(), "bitmapPresent", &bitmap) != 0) bitmap = 0;
    // Missing points come as missingValue with a bitmap and also without one (complex packing's
    // missing value management): set it to a value no field holds, whichever.
    check(codes_set_double(handle.get(), "missingValue", kMissingValue), "missingValue");
    size_t size = 0;
    check(codes_get_size(handle.get(), "values", &size), "values");
    if (size != points) {
      throw Error(where(index) + ": " + std::to_string(size) + " values for a grid of " +
                  std::to_string(points) + " points");
    }
    // ecCodes allocates the coded values the data section declares before it unpacks them: a
    // corrupt count must not become a huge allocation. A bitmap only ever lowers the count.
    long coded = 0;
    check(codes_get_long(handle.get(), "numberOfCodedValues", &coded), "numberOfCodedValues");
    if (coded < 0 || static_cast<uint64_t>(coded) > points) {
      throw Error(where(index) + ": numberOfCodedValues " + std::to_string(coded) +
                  " is more than the grid's " + std::to_string(points) +
                  " points (corrupt data section?)");
    }
    size_t length = points;
    check(codes_get_double_array(handle.get(), "values", values.data(), &length),
          "decoding the values");
    if (length != points) {
      throw Error(where(index) + ": decoded " + std::to_string(length) + " values for a grid of " +
                  std::to_string(points) + " points");
    }
  } catch (const EccodesAssertion& assertion) {
    throw Error(where(index) + ": " + assertion.what());
  }
  field.resize(points);
  for (size_t i = 0; i < points; ++i) {
    field[i] =
        values[i] == kMissingValue ? std::numeric_limits<float>::quiet_NaN() : to_float(values[i]);
  }
}

void GribSource::read(const Variable& variable, std::span<const uint64_t> start,
                      std::span<const uint64_t> count, void* out) const {
  const Variable* own = find(variable.name);
  if (own == nullptr) throw NotFoundError(path_ + ": no variable " + variable.name);
  const size_t rank = own->rank();
  if (start.size() != rank || count.size() != rank) {
    throw Error(path_ + ": " + own->name + ": selection rank differs from the variable's");
  }
  for (size_t d = 0; d < rank; ++d) {
    if (start[d] > own->shape[d] || count[d] > own->shape[d] - start[d]) {
      throw Error(path_ + ": " + own->name + ": hyperslab out of bounds in dimension " +
                  own->dims[d]);
    }
  }
  for (size_t d = 0; d < rank; ++d) {
    if (count[d] == 0) return;
  }
  auto* destination = static_cast<uint8_t*>(out);
  if (auto it = coordinates_.find(own->name); it != coordinates_.end()) {
    if (rank == 0) {
      std::memcpy(destination, it->second.data(), it->second.size());
      return;
    }
    const std::vector<uint64_t> origin(rank, 0);
    copy_box(it->second.data(), BoxRef{own->shape, start}, destination, BoxRef{count, origin},
             count, own->dtype.size());
    return;
  }
  const FieldTable& table = fields_.at(own->name);
  const size_t header = table.header_shape.size();
  const uint64_t grid_shape[2] = {nj_, ni_};
  const uint64_t grid_start[2] = {start[header], start[header + 1]};
  const uint64_t box_shape[2] = {count[header], count[header + 1]};
  const uint64_t box_origin[2] = {0, 0};
  const uint64_t box_bytes = box_shape[0] * box_shape[1] * sizeof(float);
  std::vector<uint64_t> offset(header, 0);  // within the hyperslab, along the header dims
  std::vector<float> field;
  for (;;) {
    uint64_t flat = 0;
    for (size_t d = 0; d < header; ++d) flat = flat * table.header_shape[d] + start[d] + offset[d];
    decode(table.messages[flat], field);
    copy_box(reinterpret_cast<const uint8_t*>(field.data()), BoxRef{grid_shape, grid_start},
             destination, BoxRef{box_shape, box_origin}, box_shape, sizeof(float));
    destination += box_bytes;
    size_t d = header;
    while (d > 0 && ++offset[d - 1] == count[d - 1]) offset[--d] = 0;
    if (d == 0) break;
  }
}

}  // namespace zfeed::ingest
