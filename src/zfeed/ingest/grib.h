// GRIB 1 and 2 files through the ecCodes C library, shown as cfgrib shows them to xarray
// (`xr.open_dataset(path, engine="cfgrib")`), so users see the same names, dims and coordinates.
//
// Opening scans every message once (its byte offset and length and the keys that place it) and
// groups the messages into variables named by ecCodes' `cfVarName` ("t2m" for 2t, "t"), with
// dims (number, time, step, <typeOfLevel>, latitude, longitude). As in cfgrib, number, step and
// the level dimension are squeezed to scalar coordinates where they hold one value; unlike cfgrib,
// `time` (the forecast reference time) always stays a dimension, so that single-time files join
// along it and every variable has the time axis training reads along. Coordinates are variables of
// their own: number (int64), time and valid_time (int64 CF "seconds since 1970-01-01T00:00:00"),
// step (float64 hours), the level (float64), latitude and longitude (float64). Values are float32
// with missing points (bitmap) as NaN.
//
// A read decodes only the messages in its hyperslab: their bytes are read with pread and handed to
// ecCodes, and the requested box is copied out. Reads are safe from several threads (ecCodes is
// thread-safe where built with threads, as Debian's is; otherwise decoding takes one lock).
//
// Unsupported grids (anything but regular_ll and regular_gg), messages whose grid differs from the
// first message's, truncated or corrupt messages and incomplete or duplicated message sets (a
// missing (time, level) combination) are zfeed::Error naming the file, the message number and its
// byte offset.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zfeed/ingest/source.h"

namespace zfeed::ingest {

class GribSource final : public Source {
 public:
  // Opens and scans the file; throws zfeed::Error naming the file (and message) if it cannot.
  explicit GribSource(const std::string& path);
  ~GribSource() override;
  GribSource(const GribSource&) = delete;
  GribSource& operator=(const GribSource&) = delete;

  void read(const Variable& variable, std::span<const uint64_t> start,
            std::span<const uint64_t> count, void* out) const override;

  // The number of GRIB messages in the file.
  size_t message_count() const { return messages_.size(); }

 private:
  struct Message {
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  // Where the fields of one data variable are: the message of each index along the dimensions
  // before latitude and longitude (C order).
  struct FieldTable {
    std::vector<uint64_t> header_shape;
    std::vector<uint32_t> messages;
  };

  void scan();
  // Decodes message `index` into `field` (nj x ni float32, NaN where missing).
  void decode(uint32_t index, std::vector<float>& field) const;
  std::string where(uint32_t index) const;

  int fd_ = -1;
  uint64_t ni_ = 0;  // points along a row (longitude)
  uint64_t nj_ = 0;  // rows (latitude)
  std::vector<Message> messages_;
  std::map<std::string, FieldTable> fields_;                 // data variables
  std::map<std::string, std::vector<uint8_t>> coordinates_;  // the values of the others
};

// True if the file starts with "GRIB" and an edition byte of 1 or 2, possibly after a few bytes of
// padding or a bulletin header (within its first 4 KiB).
bool looks_like_grib(const std::string& path);

}  // namespace zfeed::ingest
