// ReceiverTree::find against a scan of every leaf: the least (load, GPU) eligible, not skipped
// receiver whose own bounds may hold the copy and that accepts it, on random trees, needs and
// updates in every timing mode.
#include "feplb/core/planners/receiver_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace feplb {
namespace {

struct Gpu {
  bool eligible = false;
  ReceiverTree::Leaf leaf;
};

// What find() promises, leaf by leaf (the same expressions as the tree's bounds and checks).
bool takes(const ReceiverTree::Need& need, bool late_ok, const ReceiverTree::Leaf& leaf) {
  if (need.timing == 0) return true;
  const double t = need.fixed_ms + need.per_row_ms * static_cast<double>(need.rows);
  const double out_t = need.out_ms + t;
  const double by = need.finish_by_ms;
  const bool late = need.timing >= 2 && late_ok;
  bool may_hold = leaf.window_ms - leaf.in_ms >= t && leaf.window_ms >= out_t;
  if (!may_hold && late) {
    may_hold = !(need.timing == 3 && leaf.window_ms + leaf.guest_ms > by) &&
               (leaf.in_ms + leaf.guest_ms) + t <= by && out_t + leaf.guest_ms <= by;
  }
  if (!may_hold) return false;
  const double reserve =
      need.reserve_to - leaf.load - need.rows >= need.reserve_rows ? need.reserve_ms : 0.0;
  const double lands = std::max(leaf.in_ms, need.out_ms) + t;
  if (lands + reserve <= leaf.window_ms) return true;
  if (!late) return false;
  const double start = need.timing == 3 ? std::max(leaf.window_ms, lands) : lands;
  return start + leaf.guest_ms <= by;
}

// The least loaded eligible GPU not skipped that takes the copy (`any`: whether it does or not).
int scan(const std::vector<Gpu>& gpus, int first_gpu, const ReceiverTree::Need& need, bool late_ok,
         bool any = false) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(gpus.size()); ++i) {
    const int g = first_gpu + i;
    if (!gpus[i].eligible || (need.skip != nullptr && need.skip[g])) continue;
    if (!any && !takes(need, late_ok, gpus[i].leaf)) continue;
    if (best < 0 || gpus[i].leaf.load < gpus[best - first_gpu].leaf.load) best = g;
  }
  return best;
}

TEST(ReceiverTree, FindsWhatAScanOfEveryLeafFinds) {
  std::mt19937_64 rng(20261204);
  const auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  ReceiverTree tree;
  int checked = 0, found = 0, found_past_least = 0;
  for (const int n : {1, 2, 3, 8, 13, 72, 100}) {
    for (int round = 0; round < 40; ++round) {
      const bool late_ok = round % 2 == 1;
      const int first_gpu = pick(0, 3) * n;  // the domain's GPUs, as the spill numbers them
      // Loads from a narrow range, so that equal loads (ties broken by GPU) are common.
      const auto random_gpu = [&] {
        Gpu g;
        g.eligible = pick(0, 4) > 0;
        const double window = uniform(0.0, 1.0);
        g.leaf = {pick(0, 20) * 100, window, uniform(0.0, 1.2) * window, uniform(0.0, 0.5)};
        return g;
      };
      std::vector<Gpu> gpus(static_cast<size_t>(n));
      tree.reset(n, late_ok);
      for (int i = 0; i < n; ++i) {
        gpus[static_cast<size_t>(i)] = random_gpu();
        tree.put(i, first_gpu + i, gpus[i].eligible, gpus[i].leaf);
      }
      tree.build();
      std::vector<uint8_t> skip(static_cast<size_t>(first_gpu + n), 0);
      for (int q = 0; q < 60; ++q) {
        if (q % 3 == 2) {  // one GPU's new state, as the spill sets it after a slice
          const int i = pick(0, n - 1);
          gpus[static_cast<size_t>(i)] = random_gpu();
          tree.set(i, first_gpu + i, gpus[i].eligible, gpus[i].leaf);
        }
        for (uint8_t& s : skip) s = pick(0, 5) == 0 ? 1 : 0;
        ReceiverTree::Need need;
        need.timing = pick(0, 3);
        need.out_ms = uniform(0.0, 0.6);
        need.fixed_ms = uniform(0.0, 0.4);
        need.per_row_ms = pick(0, 1) ? uniform(0.0, 1e-4) : 0.0;
        need.rows = pick(0, 2000);
        if (pick(0, 1)) {
          need.reserve_to = pick(0, 2500);
          need.reserve_rows = pick(0, 500);
          need.reserve_ms = uniform(0.0, 0.2);
        }
        need.finish_by_ms = uniform(0.0, 2.0);
        need.skip = pick(0, 3) == 0 ? nullptr : skip.data();
        const int want = scan(gpus, first_gpu, need, late_ok);
        ASSERT_EQ(tree.find(need), want)
            << "n " << n << " round " << round << " query " << q << " timing " << need.timing;
        ++checked;
        found += want >= 0 ? 1 : 0;
        found_past_least += want >= 0 && want != scan(gpus, first_gpu, need, late_ok, true);
      }
    }
  }
  // Both answers are common, and so are answers beyond the least loaded receiver: the test would
  // notice a search that always or never finds one, or that stops at the first it tries.
  EXPECT_GT(found, checked / 5);
  EXPECT_LT(found, checked * 4 / 5);
  EXPECT_GT(found_past_least, checked / 10);
}

TEST(ReceiverTree, EmptyAndIneligibleTreesFindNone) {
  ReceiverTree tree;
  tree.reset(5, true);
  for (int i = 0; i < 5; ++i) tree.put(i, i, false, {});
  tree.build();
  ReceiverTree::Need need;
  need.timing = 0;
  EXPECT_EQ(tree.find(need), -1);
  tree.set(3, 3, true, {10, 1.0, 0.0, 0.0});
  EXPECT_EQ(tree.find(need), 3);
  std::vector<uint8_t> skip(5, 0);
  skip[3] = 1;
  need.skip = skip.data();
  EXPECT_EQ(tree.find(need), -1);
}

}  // namespace
}  // namespace feplb
