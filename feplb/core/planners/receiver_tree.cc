#include "feplb/core/planners/receiver_tree.h"

#include <algorithm>

namespace feplb {

void ReceiverTree::reset(int n, bool late) {
  late_ok_ = late;
  size_ = 1;
  int depth = 0;
  while (size_ < n) {
    size_ *= 2;
    ++depth;
  }
  hot_.assign(static_cast<size_t>(2 * size_), Hot{});
  late_.assign(static_cast<size_t>(2 * size_), Late{});
  leaves_.assign(static_cast<size_t>(size_), Leaf{});
  stack_.reserve(static_cast<size_t>(depth + 2));  // a search holds one sibling per level
  pieces_.reserve(static_cast<size_t>(2 * depth + 2));
}

void ReceiverTree::put(int pos, int gpu, bool eligible, const Leaf& leaf) {
  const size_t i = static_cast<size_t>(size_ + pos);
  leaves_[static_cast<size_t>(pos)] = leaf;
  if (!eligible) {
    hot_[i] = Hot{};
    if (late_ok_) late_[i] = Late{};
    return;
  }
  hot_[i] = {static_cast<uint64_t>(leaf.load) << kGpuBits | static_cast<uint64_t>(gpu),
             leaf.home_ms - leaf.in_ms, leaf.home_ms};
  if (late_ok_)
    late_[i] = {leaf.home_ms + leaf.guest_ms, leaf.in_ms + leaf.guest_ms, leaf.guest_ms};
}

void ReceiverTree::pull(size_t i) {
  const Hot &a = hot_[2 * i], &b = hot_[2 * i + 1];
  hot_[i] = {std::min(a.key, b.key), std::max(a.max_slack, b.max_slack),
             std::max(a.max_home, b.max_home)};
  if (!late_ok_) return;
  const Late &x = late_[2 * i], &y = late_[2 * i + 1];
  late_[i] = {std::min(x.min_home_guest, y.min_home_guest),
              std::min(x.min_in_guest, y.min_in_guest), std::min(x.min_guest, y.min_guest)};
}

void ReceiverTree::build() {
  for (size_t i = static_cast<size_t>(size_) - 1; i >= 1; --i) pull(i);
}

void ReceiverTree::set(int pos, int gpu, bool eligible, const Leaf& leaf) {
  put(pos, gpu, eligible, leaf);
  for (size_t i = static_cast<size_t>(size_ + pos) / 2; i >= 1; i /= 2) pull(i);
}

int ReceiverTree::find(const Need& need, int from) const {
  if (need.timing < 2 || !late_ok_) return search(need, need.timing == 0 ? 0 : from, false);
  return search(need, 0, true);
}

// Over positions [from, size_) (late: all of them): the O(log n) subtrees that cover them, lightest
// first, each depth-first with the lighter child first; a subtree is skipped when it cannot beat
// the best receiver found so far or no receiver in it can accept the copy (bounds from its
// aggregates: the largest slack; the least queued work).
int ReceiverTree::search(const Need& need, int from, bool late) const {
  const double t = need.fixed_ms + need.per_row_ms * static_cast<double>(need.rows);
  // The window a hidden copy must leave its receiver: reserve_ms if it leaves the receiver room
  // for reserve_rows rows below reserve_to.
  const auto reserve_ms = [&](const Leaf& leaf) {
    return need.reserve_to - leaf.load - need.rows >= need.reserve_rows ? need.reserve_ms : 0.0;
  };
  const double by = need.finish_by_ms;
  // A hidden copy lands by home_ms after both the receiver's ingress (in_ms) and the donor's
  // egress (out_ms) are free.
  const auto may_hide = [&](size_t i) {
    return hot_[i].max_slack >= t && hot_[i].max_home >= need.out_ms + t;
  };
  const auto may_hold = [&](size_t i) {
    if (need.timing == 0 || may_hide(i)) return true;  // maybe hidden
    if (!late) return false;
    const Late& b = late_[i];
    if (need.timing == 3 && b.min_home_guest > by) return false;
    return b.min_in_guest + t <= by && need.out_ms + t + b.min_guest <= by;
  };
  const auto accepts = [&](size_t i) {
    const int gpu = static_cast<int>(hot_[i].key & ((uint64_t{1} << kGpuBits) - 1));
    if (need.skip != nullptr && need.skip[gpu]) return false;
    if (need.timing == 0) return true;
    const Leaf& leaf = leaves_[i - static_cast<size_t>(size_)];
    const double lands = std::max(leaf.in_ms, need.out_ms) + t;
    if (lands + reserve_ms(leaf) <= leaf.home_ms) return true;
    if (!late) return false;
    const double start = need.timing == 3 ? std::max(leaf.home_ms, lands) : lands;
    return start + leaf.guest_ms <= by;
  };
  pieces_.clear();
  for (int l = from + size_, r = 2 * size_; l < r; l /= 2, r /= 2) {
    if (l & 1) pieces_.push_back(l++);
    if (r & 1) pieces_.push_back(--r);
  }
  std::sort(pieces_.begin(), pieces_.end(), [&](int a, int b) {
    return hot_[static_cast<size_t>(a)].key < hot_[static_cast<size_t>(b)].key;
  });
  uint64_t best = kNone;
  for (int piece : pieces_) {
    const uint64_t least = hot_[static_cast<size_t>(piece)].key;
    if (least >= best) break;  // this and the rest are heavier
    stack_.clear();
    stack_.push_back(piece);
    while (!stack_.empty()) {
      const size_t i = static_cast<size_t>(stack_.back());
      stack_.pop_back();
      if (hot_[i].key >= best || !may_hold(i)) continue;
      if (i >= static_cast<size_t>(size_)) {
        if (accepts(i)) best = hot_[i].key;
        if (best == least) break;  // the least loaded of this piece, so of all that are left
        continue;
      }
      const bool left_first = hot_[2 * i].key < hot_[2 * i + 1].key;
      stack_.push_back(static_cast<int>(left_first ? 2 * i + 1 : 2 * i));  // searched second
      stack_.push_back(static_cast<int>(left_first ? 2 * i : 2 * i + 1));
    }
  }
  return best == kNone ? -1 : static_cast<int>(best & ((uint64_t{1} << kGpuBits) - 1));
}

}  // namespace feplb
