#include "feplb/core/planners/receiver_tree.h"

#include <algorithm>

#include "feplb/core/error.h"

namespace feplb {

void ReceiverTree::reset(int n, bool late) {
  FEPLB_CHECK(n <= (1 << kGpuBits), "receiver tree: {} leaves, at most {}", n, 1 << kGpuBits);
  ++version_;
  late_ok_ = late;
  size_ = 1;
  while (size_ < n) size_ *= 2;
  // put() writes leaves [0, n) and build() every inner node: only the padding leaves need
  // clearing (no leaf beyond them is ever read).
  hot_.resize(static_cast<size_t>(2 * size_));
  leaves_.resize(static_cast<size_t>(size_));
  std::fill(hot_.begin() + size_ + n, hot_.end(), Hot{});
  wait_.resize(static_cast<size_t>(2 * size_));  // a search offers each node at most once
  if (late) {
    late_.resize(static_cast<size_t>(2 * size_));
    std::fill(late_.begin() + size_ + n, late_.end(), Late{});
  }
}

inline void ReceiverTree::write_leaf(int pos, int gpu, bool eligible, const Leaf& leaf) {
  const size_t i = static_cast<size_t>(size_ + pos);
  leaves_[static_cast<size_t>(pos)] = leaf;
  if (!eligible) {
    hot_[i] = Hot{};
    if (late_ok_) late_[i] = Late{};
    return;
  }
  hot_[i] = {static_cast<uint64_t>(leaf.load) << kGpuBits | static_cast<uint64_t>(gpu),
             leaf.window_ms - leaf.in_ms, leaf.window_ms};
  if (late_ok_)
    late_[i] = {leaf.window_ms + leaf.guest_ms, leaf.in_ms + leaf.guest_ms, leaf.guest_ms};
}

inline void ReceiverTree::pull(size_t i) {
  const Hot &a = hot_[2 * i], &b = hot_[2 * i + 1];
  hot_[i] = {std::min(a.key, b.key), std::max(a.max_slack, b.max_slack),
             std::max(a.max_window, b.max_window)};
  if (!late_ok_) return;
  const Late &x = late_[2 * i], &y = late_[2 * i + 1];
  late_[i] = {std::min(x.min_window_guest, y.min_window_guest),
              std::min(x.min_in_guest, y.min_in_guest), std::min(x.min_guest, y.min_guest)};
}

void ReceiverTree::put(int pos, int gpu, bool eligible, const Leaf& leaf) {
  ++version_;
  write_leaf(pos, gpu, eligible, leaf);
}

void ReceiverTree::build() {
  for (size_t i = static_cast<size_t>(size_) - 1; i >= 1; --i) pull(i);
}

void ReceiverTree::set(int pos, int gpu, bool eligible, const Leaf& leaf) {
  ++version_;
  write_leaf(pos, gpu, eligible, leaf);
  // Up to the root, each node from the one below (kept in registers) and its sibling.
  size_t i = static_cast<size_t>(size_ + pos);
  Hot hot = hot_[i];
  for (; i > 1; i /= 2) {
    const Hot& sib = hot_[i ^ 1];
    hot = {std::min(hot.key, sib.key), std::max(hot.max_slack, sib.max_slack),
           std::max(hot.max_window, sib.max_window)};
    hot_[i / 2] = hot;
  }
  if (!late_ok_) return;
  i = static_cast<size_t>(size_ + pos);
  Late late = late_[i];
  for (; i > 1; i /= 2) {
    const Late& sib = late_[i ^ 1];
    late = {std::min(late.min_window_guest, sib.min_window_guest),
            std::min(late.min_in_guest, sib.min_in_guest), std::min(late.min_guest, sib.min_guest)};
    late_[i / 2] = late;
  }
}

int ReceiverTree::find(const Need& need) const {
  if (need.timing == 0) return search<Mode::kAny>(need);
  if (need.timing < 2 || !late_ok_) return search<Mode::kHidden>(need);
  return search<Mode::kLate>(need);
}

// Best first from the root: a subtree is searched in the order of its least loaded GPU and
// skipped when no receiver in it can accept the copy (bounds from its aggregates: the largest
// slack and window; the least queued work), so the first leaf that accepts is the answer.
template <ReceiverTree::Mode kMode>
int ReceiverTree::search(const Need& need) const {
  const double t = need.fixed_ms + need.per_row_ms * static_cast<double>(need.rows);
  const double out_t = need.out_ms + t;  // a hidden copy's receiver has at least this window
  // The window a hidden copy must leave its receiver: reserve_ms if it leaves the receiver room
  // for reserve_rows rows below reserve_to.
  const auto reserve_ms = [&](const Leaf& leaf) {
    return need.reserve_to - leaf.load - need.rows >= need.reserve_rows ? need.reserve_ms : 0.0;
  };
  const double by = need.finish_by_ms;
  const Hot* const hot = hot_.data();
  const auto may_hold = [&](size_t i) {
    if constexpr (kMode == Mode::kAny) return true;
    // A hidden copy lands by window_ms after both the receiver's ingress (in_ms) and the donor's
    // egress (out_ms) are free.
    const bool maybe_hidden = (hot[i].max_slack >= t) & (hot[i].max_window >= out_t);
    if constexpr (kMode == Mode::kHidden) return maybe_hidden;
    if (maybe_hidden) return true;
    const Late& b = late_[i];
    if (need.timing == 3 && b.min_window_guest > by) return false;
    return b.min_in_guest + t <= by && out_t + b.min_guest <= by;
  };
  const auto accepts = [&](size_t i) {
    const int gpu = static_cast<int>(hot[i].key & ((uint64_t{1} << kGpuBits) - 1));
    if (need.skip != nullptr && need.skip[gpu]) return false;
    if constexpr (kMode == Mode::kAny) return true;
    const Leaf& leaf = leaves_[i - static_cast<size_t>(size_)];
    const double lands = std::max(leaf.in_ms, need.out_ms) + t;
    if (lands + reserve_ms(leaf) <= leaf.window_ms) return true;
    if constexpr (kMode == Mode::kHidden) return false;
    const double start = need.timing == 3 ? std::max(leaf.window_ms, lands) : lands;
    return start + leaf.guest_ms <= by;
  };
  const size_t first_leaf = static_cast<size_t>(size_);
  // Most often the least loaded GPU takes the copy: where its own bounds may hold it and it
  // accepts it, it is the answer (the subtrees above it hold bounds at least as wide, so the
  // search below would reach it first), found by following the least key down.
  if (hot[1].key == kNone) return -1;
  size_t least_leaf = 1;
  // (Branch-free: which child holds the least key is a coin toss to the branch predictor.)
  while (least_leaf < first_leaf) {
    least_leaf *= 2;
    least_leaf += static_cast<size_t>(hot[least_leaf].key != hot[least_leaf / 2].key);
  }
  if (may_hold(least_leaf) && accepts(least_leaf))
    return static_cast<int>(hot[1].key & ((uint64_t{1} << kGpuBits) - 1));
  // Depth first, the lighter child first and the heavier one waiting on a stack, skipping any
  // subtree whose least loaded GPU is no lighter than the best accepted so far (or that cannot
  // hold the copy): the answer is the least loaded leaf that may hold and accepts the copy, as a
  // best-first search finds it, without ordering the waiting subtrees. The stack holds at most one
  // subtree per level.
  size_t* const stack = wait_.data();
  size_t depth = 0;
  if (may_hold(1)) stack[depth++] = 1;
  uint64_t best = kNone;
  while (depth > 0) {
    size_t i = stack[--depth];
    if (hot[i].key >= best) continue;
    for (;;) {
      if (i >= first_leaf) {
        if (accepts(i)) best = hot[i].key;
        break;
      }
      const size_t left = 2 * i;
      const size_t right_first = static_cast<size_t>(hot[left + 1].key < hot[left].key);
      const size_t lighter = left + right_first, heavier = left + 1 - right_first;
      if constexpr (kMode == Mode::kLate) {
        if (hot[heavier].key < best && may_hold(heavier)) stack[depth++] = heavier;
      } else {  // branch-free: both tests are cheap here, and their outcome a coin toss
        stack[depth] = heavier;
        depth += static_cast<size_t>((hot[heavier].key < best) & may_hold(heavier));
      }
      if (!may_hold(lighter)) break;  // its key is i's, below the best: no need to check it
      i = lighter;
    }
  }
  return best == kNone ? -1 : static_cast<int>(best & ((uint64_t{1} << kGpuBits) - 1));
}

}  // namespace feplb
