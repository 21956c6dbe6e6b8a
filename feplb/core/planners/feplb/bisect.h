// Bisection over integers for feplb's searches (slice sizes, levels, the rows that shed a load):
// monotone predicates, no allocation, the predicate asked O(log range) times.
#pragma once

#include <algorithm>
#include <cstdint>

namespace feplb::feplb_detail {

// Bisection over [lo, hi] for a predicate false then true: the first x where it holds (hi if none
// before it).
template <typename Pred>
int64_t first_true(int64_t lo, int64_t hi, Pred pred) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// first_true() starting from a guess: steps of 1, 2, 4, ... away from it until the answer is
// bracketed, then bisection (O(log distance) calls, a few when the guess is close). Like
// first_true(), it never asks pred(hi).
template <typename Pred>
int64_t first_true_near(int64_t lo, int64_t hi, int64_t guess, Pred pred) {
  if (lo >= hi) return lo;
  guess = std::clamp(guess, lo, hi - 1);
  if (pred(guess)) {
    for (int64_t step = 1;; step *= 2) {
      const int64_t probe = guess - step;
      if (probe < lo) return first_true(lo, guess, pred);
      if (!pred(probe)) return first_true(probe + 1, guess, pred);
      guess = probe;
    }
  }
  for (int64_t step = 1;; step *= 2) {
    const int64_t probe = guess + step;
    if (probe >= hi) return first_true(guess + 1, hi, pred);
    if (pred(probe)) return first_true(guess + 1, probe, pred);
    guess = probe;
  }
}

// Bisection over [lo, hi] for a predicate true then false: the last x where it holds (lo if none
// after it).
template <typename Pred>
int64_t last_true(int64_t lo, int64_t hi, Pred pred) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (pred(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace feplb::feplb_detail
