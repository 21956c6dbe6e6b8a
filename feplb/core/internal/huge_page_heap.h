// Transparent huge pages for the heap while a large file is read (private to feplb_core): the
// counts of a large trace are hundreds of MB of fresh memory, and on a virtual machine a 4 KiB page
// fault can cost tens of microseconds, most of the read time (docs/trace-format.md).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace feplb {

// While it lives, the heap that glibc grows (the main arena, with sbrk) is advised
// MADV_HUGEPAGE as it grows. Call grown() after each large allocation. It pays where the heap grows
// by whole huge pages at a time: a process that reads large traces sets that itself (the feplb CLI
// and the reader's benchmark: mallopt(M_TOP_PAD, 64 MiB) in main); a library does not change its
// process's allocator. A no-op where the kernel has no transparent huge pages, and for allocations
// in other arenas (other threads).
class HugePageHeap {
 public:
  HugePageHeap() : top_(current_top()) {}
  HugePageHeap(const HugePageHeap&) = delete;
  HugePageHeap& operator=(const HugePageHeap&) = delete;

  // Advises the whole huge pages the heap grew by since the last call, before they are touched.
  void grown() {
    const uintptr_t top = current_top();
    if (top == top_) return;
    const uintptr_t lo = (top_ + kHugePage - 1) & ~(kHugePage - 1);
    const uintptr_t hi = top & ~(kHugePage - 1);
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
    top_ = top;
  }

 private:
  static constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  static uintptr_t current_top() { return reinterpret_cast<uintptr_t>(::sbrk(0)); }
  uintptr_t top_;
};

}  // namespace feplb
