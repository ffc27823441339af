#include "zfeed/util/paths.h"

#include <fcntl.h>
#include <unistd.h>

namespace zfeed {

bool is_local_path(std::string_view path_or_url) {
  return path_or_url.find("://") == std::string_view::npos || path_or_url.starts_with("file://");
}

std::string strip_file_scheme(std::string_view path_or_url) {
  if (path_or_url.starts_with("file://")) path_or_url.remove_prefix(7);
  return std::string(path_or_url);
}

std::filesystem::path without_trailing_separator(const std::filesystem::path& path) {
  std::filesystem::path normal = path.lexically_normal();
  return normal.has_filename() ? normal : normal.parent_path();
}

void sync_directory(const std::filesystem::path& directory) {
  const int fd =
      ::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace zfeed
