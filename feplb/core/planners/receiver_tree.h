// ReceiverTree: the GPUs of one NVLink domain that may still receive rows, in a tournament tree,
// so that feplb finds the least loaded receiver whose copy lands in time in O(log n) typical steps
// instead of scanning (or popping from a heap) every receiver: a subtree none of whose receivers
// can take the copy (by its largest window and slack) is never entered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace feplb {

class ReceiverTree {
 public:
  // One GPU's state, as the planner models it (times in ms from when the GEMMs start).
  struct Leaf {
    int64_t load = 0;      // rows it computes so far
    double window_ms = 0;  // a hidden copy into it must land by then: the GEMM time of the work
                           // it runs before (its own; with guests chained, an upper bound the
                           // caller checks exactly)
    double in_ms = 0;      // when its ingress is free (its queued copies have landed)
    double guest_ms = 0;   // GEMM time of its work that waits for copies
  };

  // What one copy of `rows` rows needs from the receiver h it goes to: it takes
  // fixed_ms + per_row_ms * rows on h's ingress and the donor's egress (free at out_ms), first in
  // first out, so it lands at max(in_ms, out_ms) + its time.
  struct Need {
    int timing = 1;  // 0: no timing (any receiver); 1: hidden: it lands by h's window_ms; 2 or 3:
                     // hidden, or late but h (idle until it lands, then its guests) still
                     // finishes by finish_by_ms (3: h's own work counted; 2: only the copies)
    double out_ms = 0;
    double fixed_ms = 0;
    double per_row_ms = 0;
    int64_t rows = 0;
    // A hidden copy that leaves its receiver room for reserve_rows rows below reserve_to must also
    // leave it reserve_ms of its window (a later slice's copy), so that the room is not stranded
    // behind it (reserve_to 0: no such rule).
    int64_t reserve_to = 0;
    int64_t reserve_rows = 0;
    double reserve_ms = 0;
    double finish_by_ms = 0;
    const uint8_t* skip = nullptr;  // [GPU index] non-zero: not offered (may be null)
  };

  // Empties the tree for n leaves (none eligible). Allocates only when n grows. `late`: the
  // searches may accept late copies (Need::timing 2 or 3; their bounds are kept only then).
  void reset(int n, bool late);
  // Makes leaf `pos` GPU `gpu` (< 2^20), eligible with state `leaf`, or not eligible: put() for
  // every leaf then build() once (O(n)), or set() for one leaf in a built tree (O(log n)).
  void put(int pos, int gpu, bool eligible, const Leaf& leaf);
  void build();
  void set(int pos, int gpu, bool eligible, const Leaf& leaf);
  // The eligible GPU with the least load (ties: the lower index) that `need` accepts, or -1:
  // with timing 1, a hidden copy; with timing 2 or 3, a hidden or a late copy (a late one accepted
  // here without the GEMM time of its own rows: the caller checks the exact rule).
  int find(const Need& need) const;
  // Changes with every reset(), put() and set() (never 0): equal versions, equal trees.
  uint64_t version() const { return version_; }

 private:
  static constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  static constexpr int kGpuBits = 20;
  // What a search reads at every node: the least (load, GPU) of the eligible leaves below, packed
  // as load << kGpuBits | GPU (kNone: none), their largest slack (window_ms - in_ms) and their
  // largest window_ms (the bound for a donor whose egress is free only later).
  struct Hot {
    uint64_t key = kNone;
    double max_slack = -std::numeric_limits<double>::infinity();
    double max_window = -std::numeric_limits<double>::infinity();
  };
  // Bounds for late copies, over the eligible leaves below.
  struct Late {
    double min_window_guest = std::numeric_limits<double>::infinity();
    double min_in_guest = std::numeric_limits<double>::infinity();
    double min_guest = std::numeric_limits<double>::infinity();
  };
  void write_leaf(int pos, int gpu, bool eligible, const Leaf& leaf);
  void pull(size_t i);
  // kAny: no timing; kHidden: hidden copies only; kLate: late copies too.
  enum class Mode { kAny, kHidden, kLate };
  template <Mode kMode>
  int search(const Need& need) const;

  int size_ = 1;  // leaves, a power of two >= n
  uint64_t version_ = 1;
  bool late_ok_ = false;
  std::vector<Hot> hot_;              // [2 * size_], root at 1, leaf i at size_ + i
  std::vector<Late> late_;            // [2 * size_] (only with late copies)
  std::vector<Leaf> leaves_;          // [size_] each leaf's state
  mutable std::vector<size_t> wait_;  // search(): the subtrees waiting to be searched
};

}  // namespace feplb
