#include "zfeed/ingest/replace.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "zfeed/util/error.h"
#include "zfeed/util/paths.h"

namespace zfeed::ingest {
namespace fs = std::filesystem;

namespace {

fs::path sibling(const fs::path& output, const char* suffix) {
  const fs::path path = without_trailing_separator(output);
  return path.parent_path() / ("." + path.filename().string() + suffix);
}

std::string errno_text(int error) { return std::strerror(error); }

}  // namespace

fs::path replacement_path(const fs::path& output) { return sibling(output, ".zfeed-new"); }

void swap_in_replacement(const fs::path& output, const fs::path& replacement) {
  const fs::path path = without_trailing_separator(output);
  const fs::path old = sibling(output, ".zfeed-old");
  std::error_code ec;
  if (::renameat2(AT_FDCWD, replacement.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    sync_directory(path.parent_path());  // the swap reaches the disk before the old store goes
    fs::remove_all(replacement, ec);     // now the old store
    return;
  }
  const int exchange_error = errno;
  if (exchange_error != EINVAL && exchange_error != ENOSYS && exchange_error != EOPNOTSUPP) {
    throw Error(path.string() + ": cannot put the new store (complete, at " + replacement.string() +
                ") in its place: " + errno_text(exchange_error));
  }
  // A file system without exchange (NFS, some FUSE): the old store steps aside first.
  fs::remove_all(old, ec);
  if (::rename(path.c_str(), old.c_str()) != 0) {
    throw Error(path.string() +
                ": cannot move the old store aside to put the new one (complete, at " +
                replacement.string() + ") in its place: " + errno_text(errno));
  }
  if (::rename(replacement.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::rename(old.c_str(), path.c_str());  // the old store back where it was
    throw Error(path.string() + ": cannot put the new store (complete, at " + replacement.string() +
                ") in its place: " + errno_text(error));
  }
  sync_directory(path.parent_path());
  fs::remove_all(old, ec);
}

bool is_complete_store(const fs::path& directory) {
  std::error_code ec;
  if (!fs::exists(directory / "zarr.json", ec)) return false;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(".zfeed-") && name.ends_with("-progress.json")) return false;
  }
  return !ec;
}

void finish_interrupted_swap(const fs::path& output) {
  const fs::path path = without_trailing_separator(output);
  const fs::path old = sibling(output, ".zfeed-old");
  std::error_code ec;
  if (fs::exists(path, ec) || !fs::is_directory(old, ec)) return;
  const fs::path replacement = replacement_path(output);
  // The new store goes in place if it was complete (the swap had begun), else the old comes back.
  const bool new_one = is_complete_store(replacement);
  const fs::path& back = new_one ? replacement : old;
  if (::rename(back.c_str(), path.c_str()) != 0) {
    throw Error(path.string() + ": an interrupted replacement left the store at " + back.string() +
                " and it cannot be moved back: " + errno_text(errno));
  }
  sync_directory(path.parent_path());
  if (new_one) fs::remove_all(old, ec);
}

}  // namespace zfeed::ingest
