#include "zfeed/store/mapped_read.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace zfeed {
namespace {

// The thread's live mappings, as the SIGBUS handler sees them: a fixed table in thread-local
// storage, written only by the thread itself (so the handler, which runs on the faulting thread,
// reads it consistently) and touched before any fault can happen (so reaching it allocates
// nothing inside the handler).
constexpr int kSlots = 4;
struct Slot {
  uint8_t* begin = nullptr;
  uint8_t* end = nullptr;
  volatile sig_atomic_t cut_short = 0;
};
thread_local Slot slots[kSlots];

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
  if (info->si_code == BUS_ADRERR) {
    for (Slot& slot : slots) {
      if (address < slot.begin || address >= slot.end) continue;
      // A page past the file's end: zeros in its place, and the reader is told.
      auto* start =
          reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(address) & ~(page_bytes - 1));
      if (::mmap(start, page_bytes, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) !=
          MAP_FAILED) {
        slot.cut_short = 1;
        return;
      }
      break;
    }
  }
  // Not a mapping of ours: the handler from before takes it.
  if (previous_action.sa_flags & SA_SIGINFO) {
    if (previous_action.sa_sigaction) return previous_action.sa_sigaction(signal, info, context);
  } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    return previous_action.sa_handler(signal);
  }
  // The default: put it back; the faulting instruction runs again and faults the usual way.
  ::sigaction(SIGBUS, &previous_action, nullptr);
}

bool install_handler() {
  static const bool installed = [] {
    page_bytes = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    return ::sigaction(SIGBUS, &action, &previous_action) == 0;
  }();
  return installed;
}

}  // namespace

bool mapped_reads_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("ZFEED_MMAP");
    return !(value && std::strcmp(value, "0") == 0);
  }();
  return enabled;
}

std::optional<MappedRange> MappedRange::map(int fd, uint64_t offset, uint64_t length) {
  if (length == 0 || !install_handler()) return std::nullopt;
  int slot = -1;
  for (int s = 0; s < kSlots && slot < 0; ++s)
    if (slots[s].begin == nullptr) slot = s;
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
  slots[slot].cut_short = 0;
  slots[slot].end = base + mapped;
  slots[slot].begin = base;
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
  slots[slot_].begin = slots[slot_].end = nullptr;
  if (in_arena_) {
    --arena.live;  // its pages stay mapped, unused, until the arena is reset
  } else {
    ::munmap(base_, mapped_);
  }
}

bool MappedRange::cut_short() const { return slot_ >= 0 && slots[slot_].cut_short != 0; }

}  // namespace zfeed
