#include "zfeed/cuda/gds.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zfeed/cuda/check.h"
#include "zfeed/cuda/copy_stream.h"
#include "zfeed/cuda/device.h"
#include "zfeed/cuda/pinned_pool.h"
#include "zfeed/util/error.h"

namespace zfeed::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// The part of the cuFile C API that zfeed calls, declared here so that nothing links against
// libcufile. Copied in layout (not in text) from cufile.h of the `nvidia-cufile` wheel 1.17.1.22
// (CUDA 13; site-packages/nvidia/cu13/include/cufile.h), whose types have kept these layouts since
// cuFile 1.0: CUfileError_t {CUfileOpError err; CUresult cu_err;} (two C enums, int-sized),
// CUfileDescr_t {enum type; union {int fd; void* handle;}; const CUfileFSOps_t* fs_ops;},
// CUfileHandle_t = void*, CUfileDrvProps_t below. cufile.h maps cuFileDriverClose to
// cuFileDriverClose_v2; zfeed never closes the driver (it is process-wide and reference-counted,
// and other libraries in the process may share it), so it resolves neither.
namespace abi {

struct CUfileError_t {
  int err;     // CUfileOpError: 0 success, 5001.. cuFile errors
  int cu_err;  // CUresult, where err is CU_FILE_CUDA_DRIVER_ERROR
};
static_assert(sizeof(CUfileError_t) == 8);

constexpr int CU_FILE_SUCCESS = 0;
constexpr int CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1;
constexpr int CU_FILE_CUDA_DRIVER_ERROR = 5011;
// CUFileBoolConfigParameter_t
constexpr int CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE = 1;
constexpr int CUFILE_PARAM_FORCE_COMPAT_MODE = 2;

struct CUfileDescr_t {
  int type;  // enum CUfileFileHandleType
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;  // const CUfileFSOps_t*; nullptr: the kernel file system
};
static_assert(sizeof(CUfileDescr_t) == 24 && offsetof(CUfileDescr_t, handle) == 8 &&
              offsetof(CUfileDescr_t, fs_ops) == 16);

struct CUfileDrvProps_t {
  struct {
    unsigned int major_version;
    unsigned int minor_version;
    size_t poll_thresh_size;
    size_t max_direct_io_size;
    unsigned int dstatusflags;
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
};
static_assert(sizeof(CUfileDrvProps_t) == 56);

using DriverOpen = CUfileError_t (*)();
using DriverGetProperties = CUfileError_t (*)(CUfileDrvProps_t*);
using HandleRegister = CUfileError_t (*)(void** handle, CUfileDescr_t* descr);
using HandleDeregister = void (*)(void* handle);
using BufRegister = CUfileError_t (*)(const void* base, size_t length, int flags);
using BufDeregister = CUfileError_t (*)(const void* base);
using Read = ssize_t (*)(void* handle, void* base, size_t size, off_t file_offset,
                         off_t base_offset);
using GetVersion = CUfileError_t (*)(int* version);
using SetParameterBool = CUfileError_t (*)(int param, bool value);
using GetParameterBool = CUfileError_t (*)(int param, bool* value);

}  // namespace abi

// Our own words for the cuFile status codes (CUfileOpError) a read is likely to meet.
std::string cufile_error_text(int code, int cu_err = 0) {
  const char* text = nullptr;
  switch (code) {
    case 5001:
      text = "nvidia-fs is not loaded and compat mode is off";
      break;
    case 5004:
      text = "nvidia-fs driver version mismatch";
      break;
    case 5007:
      text = "GPUDirect Storage is not supported on this platform";
      break;
    case 5008:
      text = "GPUDirect Storage is not supported for this file";
      break;
    case 5009:
      text = "GPUDirect Storage is not supported on this GPU";
      break;
    case 5010:
      text = "nvidia-fs ioctl error";
      break;
    case abi::CU_FILE_CUDA_DRIVER_ERROR:
      return "CUDA driver error " + std::to_string(cu_err) + " (CU_FILE_CUDA_DRIVER_ERROR)";
    case 5012:
      text = "invalid device pointer";
      break;
    case 5013:
      text = "invalid memory type";
      break;
    case 5014:
      text = "pointer range beyond its allocation";
      break;
    case 5015:
      text = "CUDA context mismatch";
      break;
    case 5018:
      text = "unsupported file type";
      break;
    case 5019:
      text = "unsupported open flags";
      break;
    case 5020:
      text = "file not opened with O_DIRECT";
      break;
    case 5022:
      text = "invalid arguments";
      break;
    case 5023:
      text = "buffer already registered";
      break;
    case 5025:
      text = "permission denied";
      break;
    case 5026:
      text = "driver already open";
      break;
    case 5029:
      text = "GPU not found";
      break;
    case 5030:
      text = "internal error";
      break;
    case 5033:
      text = "nvidia-fs setup error";
      break;
    case 5034:
      text = "GPUDirect Storage disabled by configuration for this file";
      break;
    case 5036:
      text = "pinning GPU memory failed";
      break;
    case 5043:
      text = "out of memory";
      break;
    case 5044:
      text = "I/O error";
      break;
    default:
      break;
  }
  return (text ? std::string(text) + " " : std::string()) + "(cuFile error " +
         std::to_string(code) + ")";
}

struct CufileApi {
  std::string path;
  int version = 0;
  abi::DriverOpen driver_open = nullptr;
  abi::DriverGetProperties driver_get_properties = nullptr;
  abi::HandleRegister handle_register = nullptr;
  abi::HandleDeregister handle_deregister = nullptr;
  abi::BufRegister buf_register = nullptr;      // optional
  abi::BufDeregister buf_deregister = nullptr;  // optional
  abi::Read read = nullptr;
  abi::GetVersion get_version = nullptr;               // optional (cuFile 1.8+)
  abi::SetParameterBool set_parameter_bool = nullptr;  // optional (cuFile 1.9+)
  abi::GetParameterBool get_parameter_bool = nullptr;  // optional (cuFile 1.9+)
};

template <typename F>
F symbol(void* library, const char* name) {
  void* address = ::dlsym(library, name);
  F function = nullptr;
  static_assert(sizeof(function) == sizeof(address));
  std::memcpy(&function, &address, sizeof address);
  return function;
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

bool is_file(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// site-packages / dist-packages folders under a Python prefix (<prefix>/lib/python3.*/...).
void add_site_dirs(const std::filesystem::path& prefix, std::vector<std::filesystem::path>& out) {
  std::error_code ec;
  for (const char* lib : {"lib", "lib64"}) {
    const std::filesystem::path dir = prefix / lib;
    if (!std::filesystem::is_directory(dir, ec)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("python3", 0) != 0) continue;
      out.push_back(entry.path() / "site-packages");
      out.push_back(entry.path() / "dist-packages");
    }
  }
}

}  // namespace

// The places cuFile is looked for, in order (declared for the tests in gds_test.cc).
std::vector<std::string> cufile_library_candidates();

std::vector<std::string> cufile_library_candidates() {
  const std::string forced = env("ZFEED_CUFILE_LIBRARY");
  if (!forced.empty()) return {forced};
  std::vector<std::string> candidates = {"libcufile.so.0", "libcufile.so"};
  for (const char* dir : {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                          "/usr/local/cuda/targets/sbsa-linux/lib"}) {
    const std::string path = std::string(dir) + "/libcufile.so.0";
    if (is_file(path)) candidates.push_back(path);
  }
  // The nvidia-cufile wheel: site-packages/nvidia/{cu13,cu12,cufile}/lib/libcufile.so.0.
  std::vector<std::filesystem::path> sites;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&cufile_library_candidates), &info) && info.dli_fname) {
    // zfeed's own module (site-packages/zfeed/_core*.so): its site-packages and the folders above.
    std::filesystem::path dir = std::filesystem::path(info.dli_fname).parent_path();
    for (int up = 0; up < 4 && !dir.empty() && dir != dir.root_path(); ++up) {
      sites.push_back(dir);
      dir = dir.parent_path();
    }
  }
  for (const char* name : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    const std::string prefix = env(name);
    if (!prefix.empty()) add_site_dirs(prefix, sites);
  }
  const std::string path_list = env("PATH");
  for (size_t start = 0; start <= path_list.size();) {
    size_t end = path_list.find(':', start);
    if (end == std::string::npos) end = path_list.size();
    const std::filesystem::path bin = path_list.substr(start, end - start);
    start = end + 1;
    if (bin.empty() || !is_file(bin / "python3")) continue;
    add_site_dirs(bin.parent_path(), sites);  // a virtual environment's own site-packages
    std::error_code ec;
    const std::filesystem::path real = std::filesystem::canonical(bin / "python3", ec);
    if (!ec) add_site_dirs(real.parent_path().parent_path(), sites);  // its base interpreter
  }
  const std::string home = env("HOME");
  if (!home.empty()) add_site_dirs(std::filesystem::path(home) / ".local", sites);
  add_site_dirs("/usr/local", sites);
  add_site_dirs("/usr", sites);
  sites.push_back("/usr/lib/python3/dist-packages");
  for (const auto& site : sites) {
    for (const char* flavour : {"cu13", "cu12", "cufile"}) {
      const std::string path = (site / "nvidia" / flavour / "lib" / "libcufile.so.0").string();
      if (is_file(path) &&
          std::find(candidates.begin(), candidates.end(), path) == candidates.end())
        candidates.push_back(path);
    }
  }
  return candidates;
}

namespace {

// The library, its symbols and the device: probed once per process.
struct Probe {
  std::optional<CufileApi> api;
  std::string library_error;  // why api is empty
  bool device = false;
  std::string device_reason;
};

const Probe& probe() {
  static const Probe result = [] {
    Probe p;
    const std::vector<std::string> candidates = cufile_library_candidates();
    std::string first_error;
    void* library = nullptr;
    std::string loaded;
    for (const std::string& candidate : candidates) {
      ::dlerror();
      library = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (library) {
        loaded = candidate;
        break;
      }
      const char* why = ::dlerror();
      // A file that exists but does not load says more than a name not found on the path.
      if (first_error.empty() || candidate.find('/') != std::string::npos)
        first_error = why ? why : candidate + ": dlopen failed";
    }
    if (!library) {
      p.library_error = candidates.size() == 1 && !env("ZFEED_CUFILE_LIBRARY").empty()
                            ? "ZFEED_CUFILE_LIBRARY: " + first_error
                            : "libcufile.so.0 not found (" + first_error +
                                  "; looked on the loader's path, in /usr/local/cuda and for the "
                                  "nvidia-cufile wheel; set ZFEED_CUFILE_LIBRARY)";
    } else {
      CufileApi api;
      api.path = loaded;
      api.driver_open = symbol<abi::DriverOpen>(library, "cuFileDriverOpen");
      api.driver_get_properties =
          symbol<abi::DriverGetProperties>(library, "cuFileDriverGetProperties");
      api.handle_register = symbol<abi::HandleRegister>(library, "cuFileHandleRegister");
      api.handle_deregister = symbol<abi::HandleDeregister>(library, "cuFileHandleDeregister");
      api.buf_register = symbol<abi::BufRegister>(library, "cuFileBufRegister");
      api.buf_deregister = symbol<abi::BufDeregister>(library, "cuFileBufDeregister");
      api.read = symbol<abi::Read>(library, "cuFileRead");
      api.get_version = symbol<abi::GetVersion>(library, "cuFileGetVersion");
      api.set_parameter_bool = symbol<abi::SetParameterBool>(library, "cuFileSetParameterBool");
      api.get_parameter_bool = symbol<abi::GetParameterBool>(library, "cuFileGetParameterBool");
      const char* missing = !api.driver_open             ? "cuFileDriverOpen"
                            : !api.driver_get_properties ? "cuFileDriverGetProperties"
                            : !api.handle_register       ? "cuFileHandleRegister"
                            : !api.handle_deregister     ? "cuFileHandleDeregister"
                            : !api.read                  ? "cuFileRead"
                                                         : nullptr;
      if (missing) {
        p.library_error = loaded + " lacks " + missing;
      } else {
        if (!api.buf_register || !api.buf_deregister) api.buf_register = nullptr;
        int version = 0;
        if (api.get_version && api.get_version(&version).err == abi::CU_FILE_SUCCESS)
          api.version = version;
        p.api = std::move(api);
      }
      // The library stays loaded for the life of the process (it may hold the driver open).
    }
    const CudaStatus cuda = cuda_status();
    p.device = cuda.available;
    p.device_reason = cuda.reason;
    return p;
  }();
  return result;
}

bool nvidia_fs_loaded(std::string& version) {
  std::error_code ec;
  if (FILE* file = std::fopen("/proc/driver/nvidia-fs/version", "r")) {
    char line[128] = {};
    if (std::fgets(line, sizeof line, file)) version = line;
    std::fclose(file);
    while (!version.empty() && (version.back() == '\n' || version.back() == ' '))
      version.pop_back();
    return true;
  }
  return std::filesystem::exists("/sys/module/nvidia_fs", ec);
}

// cuFileDriverOpen and the mode it gives: once per process, on first need.
struct Driver {
  bool open = false;
  std::string mode = "off";
  std::string reason;
};

const Driver& driver(const CufileApi& api) {
  static const Driver result = [&api] {
    Driver d;
    cudaFree(nullptr);  // a current context for the calling thread, as cuFile expects
    cudaGetLastError();
    // Without nvidia-fs cuFile still reads (through POSIX, its "compat mode") where allowed:
    // allow it unless the user decided (CUFILE_ALLOW_COMPAT_MODE) or the driver is already open.
    if (api.set_parameter_bool && env("CUFILE_ALLOW_COMPAT_MODE").empty())
      api.set_parameter_bool(abi::CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, true);
    const abi::CUfileError_t opened = api.driver_open();
    if (opened.err != abi::CU_FILE_SUCCESS && opened.err != 5026 /* already open */) {
      d.reason = "cuFileDriverOpen failed: " + cufile_error_text(opened.err, opened.cu_err);
      return d;
    }
    d.open = true;
    std::string nvfs_version;
    const bool nvfs = nvidia_fs_loaded(nvfs_version);
    struct {
      abi::CUfileDrvProps_t props;
      unsigned char spare[256];  // room for fields later versions may add after those declared
    } padded{};
    const abi::CUfileDrvProps_t& props = padded.props;
    api.driver_get_properties(&padded.props);
    bool forced_compat = env("CUFILE_FORCE_COMPAT_MODE") == "true";
    bool value = false;
    if (api.get_parameter_bool &&
        api.get_parameter_bool(abi::CUFILE_PARAM_FORCE_COMPAT_MODE, &value).err ==
            abi::CU_FILE_SUCCESS &&
        value)
      forced_compat = true;
    if (nvfs && !forced_compat) {
      d.mode = "gds";
      if (nvfs_version.empty() && props.nvfs.major_version)
        nvfs_version = std::to_string(props.nvfs.major_version) + "." +
                       std::to_string(props.nvfs.minor_version);
      d.reason = "nvidia-fs loaded" + (nvfs_version.empty() ? "" : " (" + nvfs_version + ")") +
                 ": GPUDirect Storage";
    } else {
      d.mode = "compat";
      d.reason = forced_compat ? "CUFILE_FORCE_COMPAT_MODE: cuFile compat mode (POSIX reads "
                                 "through cuFile's bounce buffers)"
                               : "nvidia-fs not loaded: cuFile compat mode (POSIX reads through "
                                 "cuFile's bounce buffers)";
    }
    return d;
  }();
  return result;
}

GdsStatus status_for(GdsPolicy policy, const CufileApi** api_out) {
  GdsStatus status;
  if (api_out) *api_out = nullptr;
  if (policy == GdsPolicy::kOff) {
    status.reason = "turned off (ZFEED_GDS=off)";
    return status;
  }
  const Probe& p = probe();
  if (p.api) {
    status.library = p.api->path;
    status.version = p.api->version;
  }
  if (!p.api) {
    status.reason = "cuFile unavailable: " + p.library_error;
    return status;
  }
  if (!p.device) {
    status.reason = "cuFile unusable: " + p.device_reason;
    return status;
  }
  std::error_code ec;
  if (policy == GdsPolicy::kAuto && !std::filesystem::is_directory("/run/udev", ec)) {
    // As KvikIO does: cuFile's topology detection reads udev's database, and misbehaves without.
    status.reason =
        "cuFile skipped: /run/udev is missing (cuFile reads udev's device database; "
        "ZFEED_GDS=on tries it anyway)";
    return status;
  }
  if (std::filesystem::exists("/proc/driver/nvidia-fs", ec)) {
    bool node = false;
    for (int i = 0; i < 16 && !node; ++i)
      node = std::filesystem::exists("/dev/nvidia-fs" + std::to_string(i), ec);
    if (!node) {
      // Half set up (a container without the device nodes): libcufile's cuFileDriverOpen then
      // closes file descriptor 0 on its error path (fastsafetensors PR 102), so do not open it.
      status.reason = "cuFile skipped: nvidia-fs is loaded but /dev/nvidia-fs* is missing";
      return status;
    }
  }
  const Driver& d = driver(*p.api);
  status.mode = d.mode;
  status.reason = d.reason;
  status.available = d.open;
  if (d.open && api_out) *api_out = &*p.api;
  return status;
}

const char* fs_name(long type) {
  switch (static_cast<unsigned long>(type) & 0xFFFFFFFFul) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x858458F6:
      return "ramfs";
    case 0x794C7630:
      return "overlay";
    case 0x6969:
      return "nfs";
    case 0x65735546:
      return "fuse";
    case 0x01021997:
      return "9p";
    case 0x2FC12FC1:
      return "zfs";
    case 0x73717368:
      return "squashfs";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    case 0xFF534D42:
      return "cifs";
    default:
      return nullptr;
  }
}

std::string fs_of(int fd) {
  struct statfs info {};
  if (::fstatfs(fd, &info) != 0) return "unknown";
  if (const char* name = fs_name(info.f_type)) return name;
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%lx", static_cast<unsigned long>(info.f_type));
  return std::string("of type ") + hex;
}

constexpr uint64_t kAlign = 4096;
constexpr size_t kMaxCufileCall = size_t{256} << 20;  // bytes per cuFileRead call

struct OpenFile {
  std::string path;
  const CufileApi* api = nullptr;
  int fd = -1;         // buffered: the fallback's preads
  int direct_fd = -1;  // O_DIRECT: registered with cuFile
  void* handle = nullptr;
  std::string no_cufile;  // why this file does not use cuFile ("" when it does)
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  timespec mtime{};
  uint64_t last_use = 0;
  std::atomic<bool> demoted{false};  // cuFile failed on it: the fallback from now on
  mutable std::mutex demoted_mutex;
  std::string demoted_why;

  void demote(const std::string& why) {
    std::lock_guard lock(demoted_mutex);
    if (!demoted.load()) demoted_why = why;
    demoted.store(true);
  }
  std::string demoted_reason() const {
    std::lock_guard lock(demoted_mutex);
    return demoted_why;
  }

  ~OpenFile() {
    if (handle) api->handle_deregister(handle);
    if (direct_fd >= 0) ::close(direct_fd);
    if (fd >= 0) ::close(fd);
  }
  bool same(const struct stat& st) const {
    return st.st_dev == device && st.st_ino == inode && st.st_size == size &&
           st.st_mtim.tv_sec == mtime.tv_sec && st.st_mtim.tv_nsec == mtime.tv_nsec;
  }
};

[[noreturn]] void throw_errno(const std::string& path, const std::string& what, int error) {
  const std::string message = path + ": " + what + ": " + std::strerror(error);
  if (error == ENOENT || error == ENOTDIR) throw NotFoundError(message);
  throw Error(message);
}

std::string file_size_text(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "";
  return " (the file holds " + std::to_string(st.st_size) + " bytes)";
}

}  // namespace

GdsPolicy gds_policy_from_name(const std::string& value, const std::string& what) {
  if (value.empty() || value == "auto") return GdsPolicy::kAuto;
  if (value == "off") return GdsPolicy::kOff;
  if (value == "on") return GdsPolicy::kOn;
  throw Error(what + "='" + value + "': expected off, auto or on");
}

GdsPolicy gds_policy_from_env() { return gds_policy_from_name(env("ZFEED_GDS"), "ZFEED_GDS"); }

const char* gds_policy_name(GdsPolicy policy) {
  switch (policy) {
    case GdsPolicy::kOff:
      return "off";
    case GdsPolicy::kOn:
      return "on";
    default:
      return "auto";
  }
}

GdsStatus gds_status(GdsPolicy policy) { return status_for(policy, nullptr); }

GdsStatus gds_status() {
  GdsPolicy policy;
  try {
    policy = gds_policy_from_env();
  } catch (const Error& e) {
    GdsStatus status;
    status.reason = e.what();
    return status;
  }
  return gds_status(policy);
}

// ---------------------------------------------------------------------------------------------

struct DeviceFileReader::State {
  GdsPolicy policy = GdsPolicy::kAuto;
  const CufileApi* api = nullptr;  // null: the fallback only
  std::string cufile_mode = "off";
  std::string default_reason;
  int device = 0;
  Stream own_stream;  // for reads given no stream

  // The fallback's staging: `slots` pinned buffers of `piece` bytes, each lent to one read at a
  // time (a read takes one, and a second where free, to overlap its pread with its copy).
  size_t piece = 0;
  PinnedPool pool;
  std::vector<PinnedPool::Buffer> slots;
  std::vector<size_t> free_slots;
  std::mutex slot_mutex;
  std::condition_variable slot_freed;

  std::mutex files_mutex;
  std::unordered_map<std::string, std::shared_ptr<OpenFile>> files;
  uint64_t use_clock = 0;
  static constexpr size_t kMaxOpenFiles = 64;

  std::mutex registered_mutex;
  std::map<uintptr_t, size_t> registered;  // cuFileBufRegister'd base -> size

  mutable std::mutex last_mutex;
  std::string last_mode, last_reason;

  std::atomic<uint64_t> cufile_reads{0}, cufile_bytes{0}, fallback_reads{0}, fallback_bytes{0};

  State(size_t staging_bytes, size_t piece_bytes)
      : piece(piece_bytes), pool(std::max(staging_bytes, 2 * piece_bytes)) {
    const size_t count = std::max<size_t>(2, staging_bytes / piece);
    slots.resize(count);
    for (size_t i = count; i-- > 0;) free_slots.push_back(i);
  }

  void set_last(const std::string& mode, const std::string& reason) {
    std::lock_guard lock(last_mutex);
    if (last_mode != mode) last_mode = mode;
    if (last_reason != reason) last_reason = reason;
  }

  std::shared_ptr<OpenFile> open(const std::string& path);
  size_t take_slot(bool wait);
  void give_slot(size_t slot);
  void fallback_read(OpenFile& file, uint64_t offset, size_t size, uint8_t* dst,
                     cudaStream_t stream);
  void cufile_read(OpenFile& file, uint64_t offset, size_t size, uint8_t* dst);
};

std::shared_ptr<OpenFile> DeviceFileReader::State::open(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    std::lock_guard lock(files_mutex);
    files.erase(path);
    throw_errno(path, "stat", error);
  }
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  {
    std::lock_guard lock(files_mutex);
    auto found = files.find(path);
    if (found != files.end()) {
      if (found->second->same(st)) {
        found->second->last_use = ++use_clock;
        return found->second;
      }
      files.erase(found);  // replaced or changed on disk: reopen
    }
  }
  auto file = std::make_shared<OpenFile>();
  file->path = path;
  file->api = api;
  file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->fd < 0) throw_errno(path, "open", errno);
  if (::fstat(file->fd, &st) != 0) throw_errno(path, "fstat", errno);
  file->device = st.st_dev;
  file->inode = st.st_ino;
  file->size = st.st_size;
  file->mtime = st.st_mtim;
  if (!api) {
    file->no_cufile = default_reason;
  } else {
    file->direct_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (file->direct_fd < 0) {
      const int error = errno;
      file->no_cufile =
          error == EINVAL
              ? "file system " + fs_of(file->fd) + " does not support O_DIRECT: " + path
              : "open with O_DIRECT: " + std::string(std::strerror(error)) + ": " + path;
    } else {
      abi::CUfileDescr_t descr{};
      descr.type = abi::CU_FILE_HANDLE_TYPE_OPAQUE_FD;
      descr.handle.fd = file->direct_fd;
      descr.fs_ops = nullptr;
      const abi::CUfileError_t registered_handle = api->handle_register(&file->handle, &descr);
      if (registered_handle.err != abi::CU_FILE_SUCCESS) {
        file->handle = nullptr;
        file->no_cufile = "cuFileHandleRegister on " + fs_of(file->fd) + ": " +
                          cufile_error_text(registered_handle.err, registered_handle.cu_err) +
                          ": " + path;
      }
    }
    if (!file->handle && policy == GdsPolicy::kOn)
      throw UnsupportedError("ZFEED_GDS=on but cuFile cannot read this file: " + file->no_cufile);
  }
  std::lock_guard lock(files_mutex);
  file->last_use = ++use_clock;
  files[path] = file;
  while (files.size() > kMaxOpenFiles) {
    auto oldest = std::min_element(files.begin(), files.end(), [](const auto& a, const auto& b) {
      return a.second->last_use < b.second->last_use;
    });
    files.erase(oldest);  // still open while a read holds it
  }
  return file;
}

size_t DeviceFileReader::State::take_slot(bool wait) {
  std::unique_lock lock(slot_mutex);
  if (!wait && free_slots.empty()) return SIZE_MAX;
  slot_freed.wait(lock, [&] { return !free_slots.empty(); });
  const size_t slot = free_slots.back();
  free_slots.pop_back();
  lock.unlock();
  if (!slots[slot].data()) {
    try {
      slots[slot] = pool.acquire(piece);
    } catch (...) {
      give_slot(slot);
      throw;
    }
  }
  return slot;
}

void DeviceFileReader::State::give_slot(size_t slot) {
  {
    std::lock_guard lock(slot_mutex);
    free_slots.push_back(slot);
  }
  slot_freed.notify_one();
}

// pread into pinned buffers, cudaMemcpyAsync on `stream`, two buffers in flight.
void DeviceFileReader::State::fallback_read(OpenFile& file, uint64_t offset, size_t size,
                                            uint8_t* dst, cudaStream_t stream) {
  if (size == 0) return;
  struct Lane {
    size_t slot = SIZE_MAX;
    std::optional<Event> copied;
    bool pending = false;
  };
  Lane lanes[2];
  auto finish = [&](bool rethrowing) {
    for (Lane& lane : lanes) {
      if (lane.pending) {
        lane.pending = false;
        if (rethrowing)
          cudaEventSynchronize(lane.copied->get());  // the buffer must be idle before reuse
        else
          lane.copied->synchronize();
      }
      if (lane.slot != SIZE_MAX) give_slot(std::exchange(lane.slot, SIZE_MAX));
    }
  };
  int lane_count = 1;
  try {
    // Taken inside: a failed take (a pinned allocation) gives back the slot already taken.
    lanes[0].slot = take_slot(true);
    if (size > piece) lanes[1].slot = take_slot(false);
    lane_count = lanes[1].slot == SIZE_MAX ? 1 : 2;
    for (int i = 0; i < lane_count; ++i) lanes[i].copied.emplace();
    size_t done = 0;
    for (uint64_t n = 0; done < size; ++n) {
      Lane& lane = lanes[n % lane_count];
      if (lane.pending) {
        lane.copied->synchronize();
        lane.pending = false;
      }
      uint8_t* buffer = slots[lane.slot].data();
      const size_t want = std::min(piece, size - done);
      size_t got = 0;
      while (got < want) {
        const ssize_t r =
            ::pread(file.fd, buffer + got, want - got, static_cast<off_t>(offset + done + got));
        if (r < 0) {
          if (errno == EINTR) continue;
          throw_errno(file.path,
                      "read of " + std::to_string(want - got) + " bytes at offset " +
                          std::to_string(offset + done + got),
                      errno);
        }
        if (r == 0)
          throw Error(file.path + ": short read: bytes [" + std::to_string(offset) + ", " +
                      std::to_string(offset + size) + ") requested, the file ends at byte " +
                      std::to_string(offset + done + got) + file_size_text(file.fd));
        got += static_cast<size_t>(r);
      }
      check(cudaMemcpyAsync(dst + done, buffer, want, cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (pinned to device)");
      lane.copied->record(stream);
      lane.pending = true;
      done += want;
    }
    finish(false);
  } catch (...) {
    finish(true);
    throw;
  }
  fallback_reads.fetch_add(1, std::memory_order_relaxed);
  fallback_bytes.fetch_add(size, std::memory_order_relaxed);
}

void DeviceFileReader::State::cufile_read(OpenFile& file, uint64_t offset, size_t size,
                                          uint8_t* dst) {
  if (size == 0) return;
  // Into a registered buffer: its base and our offset in it, as cuFile looks buffers up by base.
  uint8_t* base = dst;
  {
    std::lock_guard lock(registered_mutex);
    auto it = registered.upper_bound(reinterpret_cast<uintptr_t>(dst));
    if (it != registered.begin()) {
      --it;
      if (reinterpret_cast<uintptr_t>(dst) + size <= it->first + it->second)
        base = reinterpret_cast<uint8_t*>(it->first);
    }
  }
  size_t done = 0;
  while (done < size) {
    const size_t count = std::min(size - done, kMaxCufileCall);
    const ssize_t r = api->read(file.handle, base, count, static_cast<off_t>(offset + done),
                                static_cast<off_t>(dst - base + done));
    if (r < 0) {
      const std::string where = "cuFileRead of " + std::to_string(count) + " bytes at offset " +
                                std::to_string(offset + done);
      if (r == -1) throw_errno(file.path, where, errno);
      throw Error(file.path + ": " + where + ": " + cufile_error_text(static_cast<int>(-r)));
    }
    if (r == 0)
      throw Error(file.path + ": short read: bytes [" + std::to_string(offset) + ", " +
                  std::to_string(offset + size) + ") requested, the file ends at byte " +
                  std::to_string(offset + done) + file_size_text(file.fd));
    done += static_cast<size_t>(r);
  }
  cufile_reads.fetch_add(1, std::memory_order_relaxed);
  cufile_bytes.fetch_add(size, std::memory_order_relaxed);
}

DeviceFileReader::DeviceFileReader(GdsPolicy policy, size_t staging_bytes) {
  require_device(0, "DeviceFileReader");
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const size_t piece = std::clamp<size_t>(staging_bytes / 2 / kAlign * kAlign, 64 << 10, 8 << 20);
  state_ = std::make_unique<State>(staging_bytes, piece);
  state_->policy = policy;
  state_->device = device;
  const CufileApi* api = nullptr;
  const GdsStatus status = status_for(policy, &api);
  if (policy == GdsPolicy::kOn && !status.available)
    throw UnsupportedError("ZFEED_GDS=on but cuFile is unavailable: " + status.reason);
  state_->api = api;
  state_->cufile_mode = api ? status.mode : "off";
  state_->default_reason = status.reason;
  state_->last_mode = state_->cufile_mode;
  state_->last_reason = status.reason;
}

DeviceFileReader::~DeviceFileReader() {
  if (!state_) return;
  close_files();
  std::lock_guard lock(state_->registered_mutex);
  if (state_->api && state_->api->buf_deregister)
    for (const auto& [base, size] : state_->registered)
      state_->api->buf_deregister(reinterpret_cast<const void*>(base));
}

void DeviceFileReader::read(const std::string& path, uint64_t offset, size_t size, void* device_ptr,
                            cudaStream_t stream) {
  State& s = *state_;
  bool managed = false;
  if (size > 0) {
    cudaPointerAttributes attributes{};
    const cudaError_t error = cudaPointerGetAttributes(&attributes, device_ptr);
    if (error != cudaSuccess) cudaGetLastError();
    if (error != cudaSuccess ||
        (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)) {
      char address[32];
      std::snprintf(address, sizeof address, "%p", device_ptr);
      throw Error(path + ": DeviceFileReader: the destination " + address +
                  " is not device memory");
    }
    managed = attributes.type == cudaMemoryTypeManaged;
  }
  const std::shared_ptr<OpenFile> file = s.open(path);
  if (offset + size > static_cast<uint64_t>(file->size) || offset + size < offset)
    throw Error(path + ": short read: bytes [" + std::to_string(offset) + ", " +
                std::to_string(offset + size) + ") requested, the file holds " +
                std::to_string(file->size) + " bytes");
  if (size == 0) return;
  auto* dst = static_cast<uint8_t*>(device_ptr);
  const cudaStream_t copy_stream = stream ? stream : s.own_stream.get();
  if (!file->handle || file->demoted.load()) {
    s.set_last("off", file->demoted.load() ? file->demoted_reason() : file->no_cufile);
    s.fallback_read(*file, offset, size, dst, copy_stream);
    return;
  }
  const bool co_aligned = (offset - reinterpret_cast<uintptr_t>(dst)) % kAlign == 0;
  const uint64_t head =
      co_aligned ? std::min<uint64_t>(size, (kAlign - offset % kAlign) % kAlign) : 0;
  const uint64_t body = co_aligned ? (size - head) / kAlign * kAlign : 0;
  if ((body == 0 || managed) && s.policy != GdsPolicy::kOn) {
    char why[160];
    if (managed)
      std::snprintf(why, sizeof why, "managed memory (cuFile reads into cudaMalloc memory)");
    else if (co_aligned)
      std::snprintf(why, sizeof why,
                    "a read of %zu bytes at offset %llu spans no whole 4 KiB block", size,
                    static_cast<unsigned long long>(offset));
    else
      std::snprintf(why, sizeof why, "file offset %llu and device address %p disagree modulo 4 KiB",
                    static_cast<unsigned long long>(offset), device_ptr);
    s.set_last("off", std::string(why) + ": pinned path");
    s.fallback_read(*file, offset, size, dst, copy_stream);
    return;
  }
  // cuFile reads synchronously: the work before us on the caller's stream goes first.
  if (stream) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  // kOn with no aligned block: all of it through cuFile (its own bounce buffers).
  const uint64_t first = body ? head : 0, count = body ? body : size;
  try {
    s.cufile_read(*file, offset + first, count, dst + first);
  } catch (const NotFoundError&) {
    throw;
  } catch (const Error& e) {
    // Under kAuto a file cuFile fails on (an O_DIRECT read the file system refuses, ...) reads
    // through the pinned path from now on; a real fault (a short read) fails there too.
    if (s.policy == GdsPolicy::kOn) throw;
    file->demote(std::string("cuFile failed, pinned path from now on: ") + e.what());
    s.set_last("off", file->demoted_reason());
    s.fallback_read(*file, offset, size, dst, copy_stream);
    return;
  }
  s.set_last(s.cufile_mode, s.default_reason);
  if (body) {
    s.fallback_read(*file, offset, head, dst, copy_stream);
    s.fallback_read(*file, offset + head + body, size - head - body, dst + head + body,
                    copy_stream);
  }
}

std::string DeviceFileReader::mode() const {
  std::lock_guard lock(state_->last_mutex);
  return state_->last_mode;
}
std::string DeviceFileReader::reason() const {
  std::lock_guard lock(state_->last_mutex);
  return state_->last_reason;
}
const std::string& DeviceFileReader::cufile_mode() const { return state_->cufile_mode; }
GdsPolicy DeviceFileReader::policy() const { return state_->policy; }

DeviceFileReader::Stats DeviceFileReader::stats() const {
  Stats stats;
  stats.cufile_reads = state_->cufile_reads.load();
  stats.cufile_bytes = state_->cufile_bytes.load();
  stats.fallback_reads = state_->fallback_reads.load();
  stats.fallback_bytes = state_->fallback_bytes.load();
  return stats;
}

bool DeviceFileReader::register_buffer(void* device_ptr, size_t size) {
  State& s = *state_;
  if (!s.api || !s.api->buf_register || size == 0) return false;
  std::lock_guard lock(s.registered_mutex);
  if (s.registered.count(reinterpret_cast<uintptr_t>(device_ptr))) return true;
  if (s.api->buf_register(device_ptr, size, 0).err != abi::CU_FILE_SUCCESS) return false;
  s.registered[reinterpret_cast<uintptr_t>(device_ptr)] = size;
  return true;
}

void DeviceFileReader::deregister_buffer(void* device_ptr) {
  State& s = *state_;
  std::lock_guard lock(s.registered_mutex);
  auto it = s.registered.find(reinterpret_cast<uintptr_t>(device_ptr));
  if (it == s.registered.end()) return;
  s.api->buf_deregister(device_ptr);
  s.registered.erase(it);
}

void DeviceFileReader::close_files() {
  std::lock_guard lock(state_->files_mutex);
  state_->files.clear();
}

}  // namespace zfeed::cuda
