#include "zfeed/store/mapped_read.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "zfeed/util/fork_gate.h"

namespace zfeed {
namespace {

// The live mappings of each thread, as the SIGBUS handler sees them: a table per thread in one
// process-wide array, which the handler scans for the faulting thread's (by its thread id, a
// system call). The handler touches no thread-local storage: in a library loaded with dlopen (the
// Python module), a thread's first use of it may allocate, and a SIGBUS that is not ours may come
// on any thread, in the middle of malloc. A thread claims a table at its first mapped read and
// gives it back when it ends; only it writes its table's slots (so the handler, which runs on the
// faulting thread, reads them consistently). Where all tables are taken, reads copy instead.
constexpr int kSlots = 4;
constexpr int kThreadTables = 4096;
struct Slot {
  std::atomic<uint8_t*> begin{nullptr};
  std::atomic<uint8_t*> end{nullptr};
  std::atomic<int> cut_short{0};
  std::atomic<std::atomic<int>*> shared_cut_short{nullptr};  // a kept mapping's flag, for its
                                                             // other readers
};
struct ThreadTable {
  std::atomic<pid_t> owner{0};  // the thread id of the thread that claimed it, 0 where free
  Slot slots[kSlots];
};
static_assert(std::atomic<uint8_t*>::is_always_lock_free && std::atomic<int>::is_always_lock_free &&
                  std::atomic<pid_t>::is_always_lock_free,
              "the SIGBUS handler needs lock-free atomics");
ThreadTable thread_tables[kThreadTables];
std::atomic<int> thread_tables_used{0};  // tables at or past this index were never claimed

pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

void clear(ThreadTable& table) {
  for (Slot& slot : table.slots) {
    slot.begin = nullptr;
    slot.end = nullptr;
    slot.shared_cut_short = nullptr;
    slot.cut_short = 0;
  }
}

// This thread's table: claimed at its first mapped read, given back at its end.
class ThreadTableClaim {
 public:
  ~ThreadTableClaim() {
    if (!table_) return;
    clear(*table_);
    table_->owner = 0;
  }
  // nullptr where every table is taken.
  ThreadTable* get() {
    if (!claimed_) claim();
    return table_;
  }
  ThreadTable* claimed() const { return table_; }

 private:
  void claim() {
    claimed_ = true;
    const pid_t me = this_thread_id();
    for (int i = 0; i < kThreadTables; ++i) {
      pid_t free = 0;
      if (thread_tables[i].owner.load(std::memory_order_relaxed) != 0 ||
          !thread_tables[i].owner.compare_exchange_strong(free, me))
        continue;
      table_ = &thread_tables[i];
      int used = thread_tables_used.load();
      while (used < i + 1 && !thread_tables_used.compare_exchange_weak(used, i + 1)) {
      }
      return;
    }
  }
  ThreadTable* table_ = nullptr;
  bool claimed_ = false;
};
thread_local ThreadTableClaim thread_table;

// In a forked child only the forking thread lives on, under a new thread id: its table follows
// it, the other threads' tables are free again.
void after_fork_in_child() {
  ThreadTable* mine = thread_table.claimed();
  const pid_t me = this_thread_id();
  const int used = thread_tables_used.load();
  for (int i = 0; i < used; ++i) {
    if (&thread_tables[i] == mine) {
      thread_tables[i].owner = me;
      continue;
    }
    clear(thread_tables[i]);
    thread_tables[i].owner = 0;
  }
}

// The index of the thread's slot that its next mapping goes into, -1 where none is free.
int free_slot() {
  ThreadTable* table = thread_table.get();
  if (!table) return -1;
  for (int s = 0; s < kSlots; ++s)
    if (table->slots[s].begin.load() == nullptr) return s;
  return -1;
}

// A slot free_slot gave this thread.
Slot& thread_slot(int s) { return thread_table.claimed()->slots[s]; }

// Makes slot `s` seen by the handler: the range goes in last, so that the handler never finds a
// range with another read's flags.
void occupy(int s, uint8_t* begin, uint8_t* end, std::atomic<int>* shared_cut_short) {
  Slot& slot = thread_slot(s);
  slot.cut_short = 0;
  slot.shared_cut_short = shared_cut_short;
  slot.end = end;
  slot.begin = begin;
}

void vacate(int s) {
  Slot& slot = thread_slot(s);
  slot.begin = nullptr;
  slot.end = nullptr;
  slot.shared_cut_short = nullptr;
}

// Whether the environment variable `name` is "0" (a switch turned off; anything else leaves it on).
bool turned_off(const char* name) {
  const char* value = std::getenv(name);
  return value && std::strcmp(value, "0") == 0;
}

// Where a thread's mappings go: a reserved range of address space (PROT_NONE, no memory behind
// it) that mappings are placed into one after another. A mapping that is done with stays there,
// unused, until the range is full; then one call puts the whole range back to PROT_NONE.
// Unmapping each one alone costs a TLB flush on every core that runs a thread of the process (an
// interrupt each, and the unmapping thread waits for them all): the loader did that once per
// chunk, which took 3-4% of its decoding time on 2 cores (more cores, more interrupts). The price
// is up to kMappedReadArenaBytes per thread of file pages that stay mapped (the page cache's
// pages, counted in the process's RSS) until the next reset or the thread's end.
constexpr size_t kArenaBytes = kMappedReadArenaBytes;
struct Arena {
  uint8_t* base = nullptr;
  size_t used = 0;
  int live = 0;         // mappings in the range still in use
  bool broken = false;  // a placement failed: the range may have a hole that is not ours

  ~Arena() {
    if (base && !broken) ::munmap(base, kArenaBytes);
  }

  // Room for `bytes` at the end of the range, or nullptr where the mapping goes elsewhere.
  uint8_t* place(size_t bytes) {
    if (broken || bytes > kArenaBytes / 2) return nullptr;
    if (base == nullptr) {
      void* reserved = ::mmap(nullptr, kArenaBytes, PROT_NONE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (reserved == MAP_FAILED) {
        broken = true;
        return nullptr;
      }
      base = static_cast<uint8_t*>(reserved);
    }
    if (used + bytes > kArenaBytes) {
      if (live > 0) return nullptr;
      if (::mmap(base, kArenaBytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
        broken = true;
        return nullptr;
      }
      used = 0;
    }
    return base + used;
  }
};
thread_local Arena arena;

struct sigaction previous_action {};
size_t page_bytes = 4096;  // set before the handler is installed

void on_sigbus(int signal, siginfo_t* info, void* context) {
  auto* address = static_cast<uint8_t*>(info->si_addr);
  const int saved_errno = errno;  // the interrupted code's, which mmap may overwrite
  ThreadTable* table = nullptr;
  if (info->si_code == BUS_ADRERR) {
    const pid_t me = this_thread_id();
    const int used = thread_tables_used.load();
    for (int i = 0; i < used && !table; ++i)
      if (thread_tables[i].owner.load() == me) table = &thread_tables[i];
  }
  if (table) {
    for (Slot& slot : table->slots) {
      uint8_t* begin = slot.begin.load();
      if (begin == nullptr || address < begin || address >= slot.end.load()) continue;
      // A page past the file's end: zeros in its place, and the reader is told.
      auto* start =
          reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(address) & ~(page_bytes - 1));
      // A kept mapping is marked before the zeros go in, so that another thread reading the page
      // after them finds the mark when its read ends.
      if (std::atomic<int>* shared = slot.shared_cut_short.load()) shared->store(1);
      if (::mmap(start, page_bytes, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) !=
          MAP_FAILED) {
        slot.cut_short = 1;
        errno = saved_errno;
        return;
      }
      break;
    }
  }
  errno = saved_errno;
  // Not a mapping of ours: the handler from before takes it.
  if (previous_action.sa_flags & SA_SIGINFO) {
    if (previous_action.sa_sigaction) return previous_action.sa_sigaction(signal, info, context);
  } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    return previous_action.sa_handler(signal);
  }
  // The default: put it back; the faulting instruction runs again and faults the usual way. A
  // SIGBUS sent by kill() or raise() (si_code <= 0) has no instruction to run again: it is sent
  // once more, to be taken the default way too.
  ::sigaction(SIGBUS, &previous_action, nullptr);
  if (info->si_code <= 0) ::raise(SIGBUS);
}

bool install_handler() {
  static const bool installed = [] {
    page_bytes = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    ForkGate::add_fork_handlers([] {}, [] {}, after_fork_in_child);
    return ::sigaction(SIGBUS, &action, &previous_action) == 0;
  }();
  return installed;
}

}  // namespace

bool mapped_reads_enabled() {
  static const bool enabled = !turned_off("ZFEED_MMAP");
  return enabled;
}

std::optional<MappedRange> MappedRange::map(int fd, uint64_t offset, uint64_t length) {
  if (length == 0 || !install_handler()) return std::nullopt;
  const int slot = free_slot();
  if (slot < 0) return std::nullopt;
  const uint64_t aligned = offset / page_bytes * page_bytes;
  const size_t skip = static_cast<size_t>(offset - aligned);
  const size_t mapped = skip + static_cast<size_t>(length);
  const size_t whole_pages = (mapped + page_bytes - 1) / page_bytes * page_bytes;
  if (uint8_t* place = arena.place(whole_pages)) {
    // MAP_FIXED replaces the reserved pages there. Should it fail, the range may no longer be
    // all ours, so the thread stops using it (and maps as below).
    if (::mmap(place, mapped, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd,
               static_cast<off_t>(aligned)) != MAP_FAILED) {
      arena.used += whole_pages;
      ++arena.live;
      return MappedRange(place, mapped, skip, static_cast<size_t>(length), slot, true);
    }
    arena.broken = true;
  }
  void* base = ::mmap(nullptr, mapped, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(aligned));
  if (base == MAP_FAILED) return std::nullopt;
  return MappedRange(static_cast<uint8_t*>(base), mapped, skip, static_cast<size_t>(length), slot,
                     false);
}

MappedRange::MappedRange(uint8_t* base, size_t mapped, size_t skip, size_t length, int slot,
                         bool in_arena)
    : base_(base), mapped_(mapped), skip_(skip), length_(length), slot_(slot), in_arena_(in_arena) {
  occupy(slot, base, base + mapped, nullptr);
}

MappedRange::MappedRange(MappedRange&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      mapped_(other.mapped_),
      skip_(other.skip_),
      length_(other.length_),
      slot_(std::exchange(other.slot_, -1)),
      in_arena_(other.in_arena_) {}

MappedRange::~MappedRange() {
  if (!base_) return;
  vacate(slot_);
  if (in_arena_) {
    --arena.live;  // its pages stay mapped, unused, until the arena is reset
  } else {
    ::munmap(base_, mapped_);
  }
}

bool MappedRange::cut_short() const { return slot_ >= 0 && thread_slot(slot_).cut_short != 0; }

// ---------------------------------------------------------------------------------------------
// Kept mappings of whole files

MappedFile::~MappedFile() { ::munmap(base_, static_cast<size_t>(size_)); }

std::optional<MappedFileRead> MappedFileRead::begin(std::shared_ptr<MappedFile> file,
                                                    uint64_t offset, uint64_t length) {
  const int slot = free_slot();
  if (slot < 0) return std::nullopt;
  return MappedFileRead(std::move(file), offset, length, slot);
}

MappedFileRead::MappedFileRead(std::shared_ptr<MappedFile> file, uint64_t offset, uint64_t length,
                               int slot)
    : file_(std::move(file)), offset_(offset), length_(length), slot_(slot) {
  occupy(slot, file_->base_, file_->base_ + file_->size_, &file_->cut_short_);
}

MappedFileRead::MappedFileRead(MappedFileRead&& other) noexcept
    : file_(std::move(other.file_)),
      offset_(other.offset_),
      length_(other.length_),
      slot_(std::exchange(other.slot_, -1)) {}

MappedFileRead::~MappedFileRead() {
  if (slot_ < 0) return;
  vacate(slot_);
}

bool MappedFileRead::cut_short() const {
  return (slot_ >= 0 && thread_slot(slot_).cut_short != 0) || file_->cut_short();
}

namespace {

thread_local bool rereading = false;  // in a MappedFiles::RereadScope

constexpr size_t kMaxKeptFiles = 16384;
constexpr size_t kMaxReadOnce = 4 * kMaxKeptFiles;

uint64_t default_kept_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || size <= 0) return uint64_t{8} << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) / 2;
}

// The kept mappings: a list from most to least recently read, and an index by path.
class KeptMappings {
 public:
  static KeptMappings& instance() {
    static KeptMappings* kept = [] {
      auto* made = new KeptMappings();  // never destroyed: threads may read at exit
      // Held across fork(), so that the child never inherits it locked by a thread it lacks.
      ForkGate::add_fork_handlers([made] { made->mutex_.lock(); },
                                  [made] { made->mutex_.unlock(); },
                                  [made] { made->mutex_.unlock(); });
      return made;
    }();
    return *kept;
  }

  std::shared_ptr<MappedFile> kept(const std::string& path) {
    std::lock_guard lock(mutex_);
    auto found = index_.find(path);
    if (found == index_.end() || found->second->file->cut_short()) return nullptr;
    order_.splice(order_.begin(), order_, found->second);
    return found->second->file;
  }

  std::shared_ptr<MappedFile> keep(const std::string& path, int fd, const struct stat& info) {
    {
      std::lock_guard lock(mutex_);
      if (static_cast<uint64_t>(info.st_size) > budget_bytes_) return nullptr;
      // Kept from its second read on: a file read once (a one-pass job: rechunk, convert,
      // stats) is mapped for that read alone, as before, and leaves nothing behind.
      if (!index_.contains(path) && !rereading && read_once_.insert(path).second) {
        if (read_once_.size() > kMaxReadOnce) read_once_ = {path};  // start afresh
        return nullptr;
      }
    }
    std::shared_ptr<MappedFile> file = map_file(fd, info);
    if (!file) return nullptr;
    std::vector<std::shared_ptr<MappedFile>> dropped;  // unmapped after the lock is let go
    std::lock_guard lock(mutex_);
    auto found = index_.find(path);
    if (found != index_.end()) drop(found->second, dropped);
    order_.push_front(Entry{path, file});
    index_.emplace(path, order_.begin());
    bytes_ += file->size();
    while (order_.size() > 1 && (bytes_ > budget_bytes_ || order_.size() > budget_files_)) {
      drop(std::prev(order_.end()), dropped);
    }
    return file;
  }

  void forget(const std::string& path, const MappedFile* file) {
    std::vector<std::shared_ptr<MappedFile>> dropped;
    std::lock_guard lock(mutex_);
    auto found = index_.find(path);
    if (found != index_.end() && found->second->file.get() == file) drop(found->second, dropped);
  }

  void open_directory(const std::string& directory) {
    std::lock_guard lock(mutex_);
    ++open_directories_[directory];
  }

  void close_directory(const std::string& directory) {
    std::vector<std::shared_ptr<MappedFile>> dropped;
    std::lock_guard lock(mutex_);
    auto open = open_directories_.find(directory);
    if (open == open_directories_.end() || --open->second > 0) return;
    open_directories_.erase(open);
    const std::string prefix = directory + "/";
    for (auto entry = order_.begin(); entry != order_.end();) {
      auto next = std::next(entry);
      if (entry->path.compare(0, prefix.size(), prefix) == 0) drop(entry, dropped);
      entry = next;
    }
  }

  uint64_t bytes() {
    std::lock_guard lock(mutex_);
    return bytes_;
  }
  size_t files() {
    std::lock_guard lock(mutex_);
    return order_.size();
  }
  std::pair<uint64_t, size_t> set_budget(uint64_t bytes, size_t files) {
    std::vector<std::shared_ptr<MappedFile>> dropped;
    std::lock_guard lock(mutex_);
    const std::pair<uint64_t, size_t> before{budget_bytes_, budget_files_};
    budget_bytes_ = bytes;
    budget_files_ = files;
    while (!order_.empty() && (bytes_ > budget_bytes_ || order_.size() > budget_files_)) {
      drop(std::prev(order_.end()), dropped);
    }
    return before;
  }

 private:
  struct Entry {
    std::string path;
    std::shared_ptr<MappedFile> file;
  };

  static std::shared_ptr<MappedFile> map_file(int fd, const struct stat& info) {
    if (!S_ISREG(info.st_mode) || info.st_size <= 0) return nullptr;
    void* base = ::mmap(nullptr, static_cast<size_t>(info.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return nullptr;
    return std::make_shared<MappedFile>(
        static_cast<uint8_t*>(base), static_cast<uint64_t>(info.st_size),
        static_cast<uint64_t>(info.st_dev), static_cast<uint64_t>(info.st_ino));
  }

  // Under the lock; the mapping goes when `dropped` does (and its readers are done).
  void drop(std::list<Entry>::iterator entry, std::vector<std::shared_ptr<MappedFile>>& dropped) {
    bytes_ -= entry->file->size();
    dropped.push_back(std::move(entry->file));
    index_.erase(entry->path);
    order_.erase(entry);
  }

  std::mutex mutex_;
  std::list<Entry> order_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  std::unordered_map<std::string, int> open_directories_;
  std::unordered_set<std::string> read_once_;  // read since it was last cleared, not kept
  uint64_t bytes_ = 0;
  uint64_t budget_bytes_ = default_kept_bytes();
  size_t budget_files_ = kMaxKeptFiles;
};

}  // namespace

bool mapped_file_cache_enabled() {
  static const bool enabled = !turned_off("ZFEED_MAP_CACHE");
  return enabled;
}

std::shared_ptr<MappedFile> MappedFiles::kept(const std::string& path) {
  return KeptMappings::instance().kept(path);
}

std::shared_ptr<MappedFile> MappedFiles::keep(const std::string& path, int fd,
                                              const struct stat& info) {
  if (!mapped_file_cache_enabled() || !install_handler()) return nullptr;
  return KeptMappings::instance().keep(path, fd, info);
}

MappedFiles::RereadScope::RereadScope() : outer_(std::exchange(rereading, true)) {}

MappedFiles::RereadScope::~RereadScope() { rereading = outer_; }

void MappedFiles::forget(const std::string& path, const MappedFile* file) {
  KeptMappings::instance().forget(path, file);
}

void MappedFiles::open_directory(const std::string& directory) {
  KeptMappings::instance().open_directory(directory);
}

void MappedFiles::close_directory(const std::string& directory) {
  KeptMappings::instance().close_directory(directory);
}

uint64_t MappedFiles::kept_bytes() { return KeptMappings::instance().bytes(); }

size_t MappedFiles::kept_files() { return KeptMappings::instance().files(); }

std::pair<uint64_t, size_t> MappedFiles::set_budget(uint64_t bytes, size_t files) {
  return KeptMappings::instance().set_budget(bytes, files);
}

}  // namespace zfeed
