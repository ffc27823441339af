// The local filesystem store: positional reads (pread) that need no shared file offset, so
// threads read concurrently, and writes that go to a temporary file in the same directory and
// are renamed over the key, so an interrupted write never leaves a torn value.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "zfeed/store/mapped_read.h"
#include "zfeed/store/store.h"
#include "zfeed/util/error.h"
#include "zfeed/util/io_counters.h"
#include "zfeed/util/paths.h"
#include "zfeed/util/scratch.h"

namespace zfeed {
namespace {

constexpr std::string_view kTempMarker = ".zfeed-tmp-";
// Values at least this large are mapped rather than read by with_bytes: a pread's copy then costs
// more than setting up and tearing down the mapping.
constexpr uint64_t kMapBytes = uint64_t{128} << 10;

uint64_t elapsed_ns(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

std::string errno_text(int error) { return std::strerror(error); }

// Counts a mapped read (MappedRange or MappedFileRead) as read from storage since `start` and
// calls `use` with its bytes. False where a page of the file was gone under it (another program
// shrank the file in place): what `use` made of the bytes is void, whatever it threw.
template <typename MappedRead>
bool use_mapped(const MappedRead& read, std::chrono::steady_clock::time_point start,
                const std::function<void(ByteView)>& use) {
  IoCounters& counters = thread_io_counters();
  counters.read_bytes += read.bytes().size();
  counters.read_ns += elapsed_ns(start);
  try {
    use(read.bytes());
  } catch (...) {
    if (!read.cut_short()) throw;
  }
  return !read.cut_short();
}

class FileStore final : public Store {
 public:
  FileStore(std::string root, FileStoreOptions options) : options_(options) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (options.create) fs::create_directories(root, ec);
    fs::path absolute = fs::absolute(root, ec);
    root_ = absolute.lexically_normal().string();
    current_umask();  // read it once here, before threads write
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
    MappedFiles::open_directory(root_);
  }
  ~FileStore() override { MappedFiles::close_directory(root_); }
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  std::string url() const override { return "file://" + root_; }

  std::optional<Bytes> get(std::string_view key, ByteRange range) const override {
    Bytes out;
    if (!get_into(key, range, out)) return std::nullopt;
    return out;
  }

  bool get_into(std::string_view key, ByteRange range, Bytes& out) const override {
    FileDescriptor fd(-1);
    struct stat info {};
    if (!open_value(key, fd, info)) return false;
    auto [begin, length] = range.resolve(static_cast<uint64_t>(info.st_size), where(key));
    out.resize(length);
    read_fully(fd.get(), out.mutable_view(), begin, key);
    return true;
  }

  bool with_bytes(std::string_view key, ByteRange range,
                  const std::function<void(ByteView)>& use) const override {
    check_key(key);
    const auto start = std::chrono::steady_clock::now();
    const bool keeping = mapped_reads_enabled() && mapped_file_cache_enabled();
    const std::string path = keeping ? path_of(key) : std::string();
    // A file read before through a mapping kept since: a stat says whether it is still the file.
    if (std::shared_ptr<MappedFile> file = keeping ? MappedFiles::kept(path) : nullptr) {
      struct stat info {};
      const bool present = stat_value(key, path, info);
      if (present && file->maps(info)) {
        std::optional<bool> done = read_kept(key, path, std::move(file), range, start, use);
        if (done) return *done;
      } else {
        // Gone or replaced: the old mapping must not hold the old file's pages and disk space.
        MappedFiles::forget(path, file.get());
      }
      if (!present) return false;
    }
    FileDescriptor fd(-1);
    struct stat info {};
    if (!open_value(key, fd, info)) return false;
    const auto size = static_cast<uint64_t>(info.st_size);
    if (keeping && size >= kMapBytes) {
      if (std::shared_ptr<MappedFile> file = MappedFiles::keep(path, fd.get(), info)) {
        std::optional<bool> done = read_kept(key, path, std::move(file), range, start, use);
        if (done) return *done;
      }
    }
    auto [begin, length] = range.resolve(size, where(key));
    if (length >= kMapBytes && mapped_reads_enabled()) {
      std::optional<MappedRange> mapped = MappedRange::map(fd.get(), begin, length);
      if (mapped) {
        if (use_mapped(*mapped, start, use)) return true;
        // The file shrank while it was mapped: read the value again as it is now.
        mapped.reset();
        fd.reset(-1);
        return Store::with_bytes(key, range, use);
      }
    }
    ScratchBuffer buffer(length);
    read_fully(fd.get(), buffer.bytes().mutable_view(), begin, key);
    use(buffer.bytes());
    return true;
  }

  // with_bytes through a kept mapping of the file (store/mapped_read.h): nullopt where the
  // thread cannot read through one more mapping (read the file the other ways then).
  std::optional<bool> read_kept(std::string_view key, const std::string& path,
                                std::shared_ptr<MappedFile> file, ByteRange range,
                                std::chrono::steady_clock::time_point start,
                                const std::function<void(ByteView)>& use) const {
    const MappedFile* mapped = file.get();
    auto [begin, length] = range.resolve(file->size(), where(key));
    std::optional<MappedFileRead> read = MappedFileRead::begin(std::move(file), begin, length);
    if (!read) return std::nullopt;
    if (use_mapped(*read, start, use)) return true;
    // The file shrank while it was read, and the mapping is no longer the file's: read the value
    // again as it is now.
    read.reset();
    MappedFiles::forget(path, mapped);
    return Store::with_bytes(key, range, use);
  }

  bool read_range_into(std::string_view key, uint64_t offset, MutableByteView out,
                       std::optional<uint64_t> expected_size) const override {
    FileDescriptor fd(-1);
    struct stat info {};
    if (!open_value(key, fd, info)) return false;
    const auto size = static_cast<uint64_t>(info.st_size);
    if (expected_size) check_size(key, size, *expected_size);
    ByteRange::range(offset, out.size()).resolve(size, where(key));
    read_fully(fd.get(), out, offset, key);
    return true;
  }

  std::optional<std::string> local_path(std::string_view key) const override {
    check_key(key);
    return path_of(key);
  }

  std::optional<uint64_t> size(std::string_view key) const override {
    check_key(key);
    struct stat info {};
    if (!stat_value(key, path_of(key), info)) return std::nullopt;
    return static_cast<uint64_t>(info.st_size);
  }

  void set(std::string_view key, ByteView value) override {
    check_key(key);
    std::string path = path_of(key);
    std::string directory = path.substr(0, path.rfind('/'));
    make_directories(directory, key);
    std::string name = path.substr(path.rfind('/') + 1);
    std::string temp = directory + "/." + name + std::string(kTempMarker) + "XXXXXX";
    FileDescriptor fd(::mkostemp(temp.data(), O_CLOEXEC));  // not inherited by an exec
    if (fd.get() < 0)
      throw Error(where(key) + ": cannot create a temporary file: " + errno_text(errno));
    auto discard = [&](const std::string& why) {
      ::unlink(temp.c_str());
      throw Error(where(key) + ": " + why);
    };
    const uint8_t* data = value.data();
    size_t left = value.size();
    while (left > 0) {
      ssize_t written = ::write(fd.get(), data, std::min<size_t>(left, size_t{1} << 30));
      if (written < 0) {
        if (errno == EINTR) continue;
        discard("write failed: " + errno_text(errno));
      }
      data += written;
      left -= static_cast<size_t>(written);
    }
    // mkstemp creates 0600; give the file the permissions an ordinary create would.
    ::fchmod(fd.get(), 0666 & ~current_umask());
    if (options_.sync && ::fsync(fd.get()) != 0) discard("fsync failed: " + errno_text(errno));
    if (::close(fd.release()) != 0) discard("close failed: " + errno_text(errno));
    if (::rename(temp.c_str(), path.c_str()) != 0) discard("rename failed: " + errno_text(errno));
    if (options_.sync) sync_directory(directory);
  }

  void erase(std::string_view key) override {
    check_key(key);
    if (::unlink(path_of(key).c_str()) != 0 && errno != ENOENT && errno != ENOTDIR) {
      throw Error(where(key) + ": cannot remove: " + errno_text(errno));
    }
  }

  void erase_prefix(std::string_view prefix) override {
    if (prefix.empty() || prefix.ends_with('/')) {
      // A whole directory: remove it in one go.
      std::string dir = prefix.empty() ? root_ : path_of(prefix.substr(0, prefix.size() - 1));
      if (!prefix.empty()) check_key(prefix.substr(0, prefix.size() - 1));
      std::error_code ec;
      if (prefix.empty()) {
        for (const auto& entry : std::filesystem::directory_iterator(root_, ec)) {
          std::filesystem::remove_all(entry.path(), ec);
        }
      } else {
        std::filesystem::remove_all(dir, ec);
      }
      if (ec) throw Error(url() + "/" + std::string(prefix) + ": cannot remove: " + ec.message());
      return;
    }
    Store::erase_prefix(prefix);
  }

  std::vector<std::string> list(std::string_view prefix) const override {
    // Walk from the deepest directory the prefix names.
    std::string dir_key(
        prefix.substr(0, prefix.rfind('/') == std::string_view::npos ? 0 : prefix.rfind('/')));
    if (!dir_key.empty()) check_key(dir_key);
    std::vector<std::string> keys;
    walk(dir_key, [&](const std::string& key) {
      if (key.starts_with(prefix)) keys.push_back(key);
    });
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  std::vector<std::string> list_dir(std::string_view prefix) const override {
    if (!prefix.empty()) check_key(prefix.substr(0, prefix.size() - 1));
    std::string dir = prefix.empty() ? root_ : path_of(prefix.substr(0, prefix.size() - 1));
    std::vector<std::string> names;
    DIR* handle = ::opendir(dir.c_str());
    if (handle == nullptr) return names;
    while (dirent* entry = ::readdir(handle)) {
      std::string_view name = entry->d_name;
      if (name == "." || name == ".." || name.find(kTempMarker) != std::string_view::npos) continue;
      names.emplace_back(name);
    }
    ::closedir(handle);
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_of(std::string_view key) const { return root_ + "/" + std::string(key); }
  std::string where(std::string_view key) const { return url() + "/" + std::string(key); }

  static mode_t current_umask() {
    static const mode_t mask = [] {
      mode_t m = ::umask(0);
      ::umask(m);
      return m;
    }();
    return mask;
  }

  // Stats `key`'s file (at `path`) into `info`: false where there is no file (or a directory).
  bool stat_value(std::string_view key, const std::string& path, struct stat& info) const {
    if (::stat(path.c_str(), &info) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return false;
      throw Error(where(key) + ": stat failed: " + errno_text(errno));
    }
    return !S_ISDIR(info.st_mode);
  }

  // Opens `key`'s file for reading into `fd` and gives its fstat in `info`: false where there is
  // no file (or a directory) there.
  bool open_value(std::string_view key, FileDescriptor& fd, struct stat& info) const {
    check_key(key);
    fd.reset(::open(path_of(key).c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT || errno == ENOTDIR) return false;
      throw Error(where(key) + ": cannot open: " + errno_text(errno));
    }
    if (::fstat(fd.get(), &info) != 0)
      throw Error(where(key) + ": stat failed: " + errno_text(errno));
    return !S_ISDIR(info.st_mode);
  }

  void read_fully(int fd, MutableByteView out, uint64_t offset, std::string_view key) const {
    const auto start = std::chrono::steady_clock::now();
    IoCounters& counters = thread_io_counters();
    counters.read_bytes += out.size();
    size_t done = 0;
    while (done < out.size()) {
      ssize_t got =
          ::pread(fd, out.data() + done, std::min<size_t>(out.size() - done, size_t{1} << 30),
                  static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw Error(where(key) + ": read failed: " + errno_text(errno));
      }
      if (got == 0) {
        throw Error(where(key) + ": file ended after " + std::to_string(offset + done) +
                    " bytes while reading " + std::to_string(out.size()) + " at offset " +
                    std::to_string(offset));
      }
      done += static_cast<size_t>(got);
    }
    counters.read_ns += elapsed_ns(start);
  }

  void make_directories(const std::string& directory, std::string_view key) const {
    struct stat info {};
    if (::stat(directory.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) return;
    std::error_code ec;
    std::filesystem::create_directories(directory, ec);
    if (ec)
      throw Error(where(key) + ": cannot create directory " + directory + ": " + ec.message());
  }

  void walk(const std::string& dir_key,
            const std::function<void(const std::string&)>& visit) const {
    std::string dir = dir_key.empty() ? root_ : path_of(dir_key);
    DIR* handle = ::opendir(dir.c_str());
    if (handle == nullptr) return;
    std::vector<std::pair<std::string, bool>> entries;
    while (dirent* entry = ::readdir(handle)) {
      std::string_view name = entry->d_name;
      if (name == "." || name == ".." || name.find(kTempMarker) != std::string_view::npos) continue;
      bool is_dir = entry->d_type == DT_DIR;
      if (entry->d_type == DT_UNKNOWN || entry->d_type == DT_LNK) {
        struct stat info {};
        is_dir =
            ::stat((dir + "/" + std::string(name)).c_str(), &info) == 0 && S_ISDIR(info.st_mode);
      }
      entries.emplace_back(std::string(name), is_dir);
    }
    ::closedir(handle);
    for (const auto& [name, is_dir] : entries) {
      std::string key = dir_key.empty() ? name : dir_key + "/" + name;
      if (is_dir) {
        walk(key, visit);
      } else {
        visit(key);
      }
    }
  }

  std::string root_;
  FileStoreOptions options_;
};

}  // namespace

std::shared_ptr<Store> make_file_store(const std::string& root, FileStoreOptions options) {
  return std::make_shared<FileStore>(root, options);
}

}  // namespace zfeed
