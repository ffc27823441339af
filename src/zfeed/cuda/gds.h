// Reads of local files straight into device memory: GPUDirect Storage (cuFile) where it works, a
// pipelined pread + pinned buffer + cudaMemcpyAsync path everywhere else, and a plain answer to
// "which path, and why".
//
// cuFile (libcufile.so.0) is loaded at run time with dlopen, so zfeed has no link-time dependency
// on it. The library is looked for at $ZFEED_CUFILE_LIBRARY when set (and only there), else as
// libcufile.so.0 / libcufile.so on the loader's path, in the CUDA toolkit, and in the
// `nvidia-cufile` wheel (site-packages/nvidia/{cu13,cu12,cufile}/lib) of the Python beside
// zfeed's own module, of $VIRTUAL_ENV, $CONDA_PREFIX and of the python3 on $PATH.
//
// Modes: "gds" (cuFile with the nvidia-fs kernel module: DMA from storage into GPU memory),
// "compat" (cuFile without nvidia-fs: cuFile's own POSIX reads through its bounce buffers) and
// "off" (zfeed's pinned fallback). The environment variable ZFEED_GDS chooses: "auto" (the
// default: cuFile where it loads and opens, else the fallback), "off" (always the fallback), "on"
// (cuFile or an error, never the fallback for a whole read).
//
// Built only with CUDA (ZFEED_HAVE_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace zfeed::cuda {

enum class GdsPolicy { kOff, kAuto, kOn };

// "off", "auto" or "on" as a policy ("" is kAuto). Throws zfeed::Error for any other value,
// naming `what` (the setting it came from: "ZFEED_GDS", "gds").
GdsPolicy gds_policy_from_name(const std::string& value, const std::string& what);
// ZFEED_GDS as a policy (unset or "" is kAuto).
GdsPolicy gds_policy_from_env();
const char* gds_policy_name(GdsPolicy policy);  // "off", "auto", "on"

struct GdsStatus {
  bool available = false;  // cuFile can be used (mode "gds" or "compat")
  std::string mode = "off";
  // Why this mode: "nvidia-fs 2.20 loaded", "nvidia-fs not loaded: cuFile compat mode (POSIX
  // reads through cuFile's bounce buffers)", "ZFEED_GDS=off", "cuFile unavailable:
  // libcufile.so.0 not found (...)", "no CUDA device", "cuFileDriverOpen failed: ...".
  std::string reason;
  std::string library;  // the cuFile library loaded ("" when none)
  int version = 0;      // cuFileGetVersion (1000 * major + 10 * minor), 0 when unknown
};

// The state of GPUDirect Storage under `policy`. The probe (library, symbols, device, driver
// open) runs once per process and is cached; thread-safe; never throws and never crashes without
// a driver, a device or the library. With kOff it opens nothing.
GdsStatus gds_status(GdsPolicy policy);
// The same under ZFEED_GDS (a bad value gives mode "off" with the complaint as the reason).
GdsStatus gds_status();

// Reads byte ranges of local files into device memory. Thread-safe: several threads may read
// through one reader at once. Files stay open (and registered with cuFile) between reads, up to
// a bound; a file replaced on disk (another inode, size or modification time) is reopened.
class DeviceFileReader {
 public:
  struct Stats {
    uint64_t cufile_reads = 0, cufile_bytes = 0;      // through cuFileRead
    uint64_t fallback_reads = 0, fallback_bytes = 0;  // through the pinned buffers
  };

  // Throws UnsupportedError without a CUDA device ("DeviceFileReader is unavailable: no CUDA
  // device") and, with GdsPolicy::kOn, where cuFile is unavailable (naming why); Error for a bad
  // ZFEED_GDS. `staging_bytes` bounds the pinned memory of the fallback (all threads together).
  explicit DeviceFileReader(GdsPolicy policy = gds_policy_from_env(),
                            size_t staging_bytes = size_t{128} << 20);
  ~DeviceFileReader();
  DeviceFileReader(const DeviceFileReader&) = delete;
  DeviceFileReader& operator=(const DeviceFileReader&) = delete;

  // Reads bytes [offset, offset + size) of the file at `path` into `device_ptr` (device or
  // managed memory of the current device) and returns once they are there. Work enqueued on
  // `stream` before the call completes first (cuFile: the reader waits for it; fallback: its
  // copies run on `stream` behind it); nullptr is the reader's own stream.
  //
  // cuFile takes the 4 KiB-aligned middle of a read whose file offset and device address agree
  // modulo 4 KiB (head and tail, each under 4 KiB, take the fallback); a read where they do not
  // agree takes the fallback under kAuto and cuFile (with its own bounce buffers) under kOn.
  // Throws NotFoundError naming the path when the file does not exist, Error naming the path for
  // a short read (the file ends before offset + size) or a failed read, and Error when
  // `device_ptr` is not device memory.
  void read(const std::string& path, uint64_t offset, size_t size, void* device_ptr,
            cudaStream_t stream = nullptr);

  // The path the last read took ("gds", "compat" or "off") and why; before any read, the path
  // reads will take (the reader's policy against gds_status()). E.g. "off" with "file system
  // tmpfs does not support O_DIRECT: /tmp/x" or "ZFEED_GDS=off".
  std::string mode() const;
  std::string reason() const;
  // The mode cuFile reads take in this reader ("gds" or "compat"), or "off" when it has none.
  const std::string& cufile_mode() const;
  GdsPolicy policy() const;
  Stats stats() const;

  // Registers device memory with cuFile (cuFileBufRegister) for faster reads into it; false when
  // this reader does not use cuFile or registration failed. Deregister before freeing it.
  bool register_buffer(void* device_ptr, size_t size);
  void deregister_buffer(void* device_ptr);

  // Closes the files kept open.
  void close_files();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace zfeed::cuda
