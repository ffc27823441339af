// libFuzzer target: the input bytes as a GRIB file, opened with GribSource (ecCodes' reader scans
// the messages, zfeed groups them into variables) and, where that succeeds, every variable read
// back: coordinates whole, data variables by their first field and by a small hyperslab of their
// last. Grids over 2^20 points are not read (a corrupt header can claim billions of points, and a
// read decodes whole messages). The file lives in memory (memfd), opened by its /proc path.
// Seeds: fuzz/corpus/grib_fuzz (fuzz/make_corpus.py: single messages cut from ../shared/data and
// small GRIB 2 messages made from ecCodes' samples).
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "zfeed/ingest/grib.h"

namespace {

using namespace zfeed::fuzz;

constexpr uint64_t kMaxPointsRead = uint64_t{1} << 20;

// The memory file the input is written to, opened once per process.
const std::string& input_path(int* fd_out) {
  static int fd = -1;
  static const std::string path = [] {
    fd = memfd_create("zfeed-grib-fuzz", MFD_CLOEXEC);
    if (fd < 0) finding("memfd_create failed");
    return "/proc/self/fd/" + std::to_string(fd);
  }();
  *fd_out = fd;
  return path;
}

void write_input(int fd, const uint8_t* data, size_t size) {
  if (ftruncate(fd, 0) != 0) finding("ftruncate failed");
  size_t done = 0;
  while (done < size) {
    const ssize_t wrote = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (wrote <= 0) finding("pwrite failed");
    done += static_cast<size_t>(wrote);
  }
}

void read_back(const zfeed::ingest::GribSource& source) {
  for (const auto& variable : source.variables()) {
    const size_t rank = variable.rank();
    std::vector<uint64_t> start(rank, 0), count = variable.shape;
    // Data variables are float32 (time, ..., latitude, longitude); coordinates are 64-bit.
    const bool field = variable.dtype.id == zfeed::DataTypeId::kFloat32;
    if (field) {
      if (variable.shape[rank - 1] * variable.shape[rank - 2] > kMaxPointsRead) continue;
      for (size_t d = 0; d + 2 < rank; ++d) count[d] = 1;
    }
    uint64_t elements = 1;
    for (uint64_t extent : count) elements *= extent;
    std::vector<uint8_t> out(elements * variable.dtype.size());
    source.read(variable, start, count, out.data());
    if (!field) continue;
    // The last field's middle row, from the middle column on.
    for (size_t d = 0; d + 2 < rank; ++d) start[d] = variable.shape[d] - 1;
    start[rank - 2] = variable.shape[rank - 2] / 2;
    count[rank - 2] = 1;
    start[rank - 1] = variable.shape[rank - 1] / 2;
    count[rank - 1] = variable.shape[rank - 1] - start[rank - 1];
    std::vector<float> row(count[rank - 1]);
    source.read(variable, start, count, row.data());
  }
}

}  // namespace

// ecCodes 2.28 leaks the accessors it built when it gives up on a corrupt message: its bug, not a
// zfeed finding. (zfeed's own handles are RAII; the unit tests check them under LeakSanitizer
// without this suppression.)
extern "C" const char* __lsan_default_suppressions() { return "leak:libeccodes.so\n"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = -1;
  const std::string& path = input_path(&fd);
  write_input(fd, data, size);
  expect_error_or_success([&] {
    zfeed::ingest::GribSource source(path);
    check(source.message_count() > 0, "a GRIB source without messages opened");
    read_back(source);
  });
  return 0;
}
