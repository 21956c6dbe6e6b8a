#include "feplb/core/planners/feplb/refined.h"

#include <algorithm>

namespace feplb {

FeplbRefinedOneHop::FeplbRefinedOneHop(const PlannerContext& ctx, const FeplbConfig& prediction)
    : Planner(ctx),
      prediction_(prediction),
      label_(prediction.label() + ", refined from the previous micro-batch"),
      engine_(ctx) {}

PlanLimits FeplbRefinedOneHop::limits() const {
  PlanLimits l = Planner::limits();
  l.rows_via_homes = false;  // migrated rows go straight to their helpers
  return l;
}

FeplbRefinedOneHop::Layer* FeplbRefinedOneHop::find_layer(int64_t layer) {
  for (Layer& l : layers_) {
    if (l.layer == layer) return &l;
  }
  return nullptr;
}

std::span<const Copy> FeplbRefinedOneHop::prefetch(int64_t layer) const {
  return engine_.prefetch(layer);
}

void FeplbRefinedOneHop::observe(const RoutingStep& routing) {
  // The full plan of these counts predicts the next micro-batch's helpers: all its pairs, and of
  // them as many as land within the prefetch window and fit the guest slots go before routing
  // (PrefetchHistory).
  engine_.plan_with(prediction_, routing, full_);
  engine_.record(routing.layer, full_);
  Layer* l = find_layer(routing.layer);
  if (!l) {
    layers_.push_back({routing.layer, {}});
    l = &layers_.back();
  }
  l->pairs.clear();
  for (const Slice& s : full_.slices) {
    const int home = ctx_.topo.home(s.expert);
    if (s.gpu != home) l->pairs.push_back({s.expert, s.gpu, false});
  }
}

void FeplbRefinedOneHop::make_plan(const RoutingStep& routing, Plan& out) {
  const Layer* l = find_layer(routing.layer);
  if (!l) {  // no prediction yet: the full plan on these counts
    engine_.plan_with(prediction_, routing, out);
    out.mode = prediction_.label();
    return;
  }
  refine(l->pairs, engine_.prefetch(routing.layer), routing, out);
  out.mode = label_;
}

void FeplbRefinedOneHop::refine(std::span<const Entry> pairs, std::span<const Copy> prefetched,
                                const RoutingStep& routing, Plan& out) {
  const Topology& topo = ctx_.topo;
  const int E = topo.num_experts(), R = topo.num_ranks();
  out.clear(E);
  out.planned_before_dispatch = true;
  index_helpers(pairs, prefetched, out);
  moved_.assign(static_cast<size_t>(E), 0);
  prefetched_at_.resize(static_cast<size_t>(R));  // set for each shared expert's helpers
  // Experts without helpers stay home; the others, busiest first, are water-filled.
  load_unshared(routing);
  for (int e : shared_) {
    const int home = topo.home(e);
    const int64_t c = routing.expert_counts[e];
    holders_.clear();
    for (int i = helper_begin_[e]; i < helper_begin_[e + 1]; ++i) {
      const Entry& h = entries_[static_cast<size_t>(i)];
      holders_.push_back(h.gpu);
      prefetched_at_[h.gpu] = h.prefetched ? 1 : 0;
    }
    holders_.push_back(home);
    water_fill(home, c);
    for (size_t i = 0; i < holders_.size(); ++i) {
      const int g = holders_[i];
      load_[g] += share_[i];
      if (g == home || share_[i] == 0) continue;
      out.add_migration(e, home, g, share_[i], ctx_.shape, prefetched_at_[g] != 0,
                        /*one_hop=*/true);
      moved_[e] += share_[i];
    }
    out.dynamic[e] = 1;
  }
  out.add_home_slices(topo, routing, moved_);
}

// The predicted helpers by expert (CSR): the previous plan's pairs and the prefetched ones (the
// same with prefetch_history = 1; older pairs too above it), each once, flagged when its weights
// were prefetched.
void FeplbRefinedOneHop::index_helpers(std::span<const Entry> pairs,
                                       std::span<const Copy> prefetched, Plan& out) {
  const int E = ctx_.topo.num_experts();
  entries_.assign(pairs.begin(), pairs.end());
  for (const Copy& c : prefetched) {
    entries_.push_back({c.expert, c.dst_gpu, true});
    out.copies.push_back(c);
  }
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    return a.expert != b.expert ? a.expert < b.expert
           : a.gpu != b.gpu     ? a.gpu < b.gpu
                                : a.prefetched > b.prefetched;
  });
  entries_.erase(std::unique(entries_.begin(), entries_.end(),
                             [](const Entry& a, const Entry& b) {
                               return a.expert == b.expert && a.gpu == b.gpu;
                             }),
                 entries_.end());
  helper_begin_.assign(static_cast<size_t>(E) + 1, 0);
  for (const Entry& h : entries_) ++helper_begin_[static_cast<size_t>(h.expert) + 1];
  for (int e = 0; e < E; ++e) helper_begin_[e + 1] += helper_begin_[e];
}

// Experts without a predicted helper load their homes; the others (with rows) are the shared
// experts, busiest first.
void FeplbRefinedOneHop::load_unshared(const RoutingStep& routing) {
  const Topology& topo = ctx_.topo;
  load_.assign(static_cast<size_t>(topo.num_ranks()), 0);
  shared_.clear();
  for (int e = 0; e < topo.num_experts(); ++e) {
    const int64_t c = routing.expert_counts[e];
    if (helper_begin_[e + 1] == helper_begin_[e]) {
      load_[topo.home(e)] += c;
    } else if (c > 0) {
      shared_.push_back(e);
    }
  }
  sort_ids_descending(shared_, [&](int e) { return routing.expert_counts[e]; });
}

// Water-fills `c` rows over holders_ (the expert's helpers and its `home`) into share_ (holders_
// ends sorted by load); a helper whose share is below a minimum slice is dropped (the smallest
// first) and the rest filled again, until every helper's share is 0 or a slice.
void FeplbRefinedOneHop::water_fill(int home, int64_t c) {
  const int64_t min_rows = prediction_.min_slice_rows;
  for (;;) {
    sort_ids_ascending(holders_, [&](int g) { return load_[g]; });
    const size_t n = holders_.size();
    int64_t sum = 0;
    size_t k = 0;  // the first k holders are filled to a common level
    while (k < n && (k == 0 || (c + sum) / static_cast<int64_t>(k) > load_[holders_[k]])) {
      sum += load_[holders_[k]];
      ++k;
    }
    const int64_t level = (c + sum) / static_cast<int64_t>(k);
    share_.assign(n, 0);
    int64_t given = 0;
    for (size_t i = 0; i < k; ++i) {
      share_[i] = std::max<int64_t>(0, level - load_[holders_[i]]);
      given += share_[i];
    }
    share_[0] += c - given;  // the rounding, to the least loaded
    size_t smallest = n;
    for (size_t i = 0; i < n; ++i) {
      if (holders_[i] == home || share_[i] == 0 || share_[i] >= min_rows) continue;
      if (smallest == n || share_[i] < share_[smallest]) smallest = i;
    }
    if (smallest == n) return;
    holders_.erase(holders_.begin() + static_cast<std::ptrdiff_t>(smallest));
  }
}

}  // namespace feplb
