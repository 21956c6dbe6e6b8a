#include "feplb/core/planners/feplb/candidates.h"

#include <algorithm>
#include <array>
#include <numeric>

namespace feplb::feplb_detail {
namespace {

// GPUs with at most this many local experts place each by counting those busier; with at most
// kFewLocalExperts, they choose their candidates by insertion.
constexpr size_t kRankedLocalExperts = 8;
constexpr size_t kFewLocalExperts = 32;

// Busiest first (ties: lower index): a total order, so any sort gives the same candidates.
struct Busier {
  const std::vector<int64_t>& c;
  bool operator()(int a, int b) const { return c[a] != c[b] ? c[a] > c[b] : a < b; }
};

// The rows the first `num` experts of `top` hold.
double rows_held(const std::vector<int64_t>& counts, const int* top, int num) {
  int64_t rows = 0;
  for (int i = 0; i < num; ++i) rows += counts[top[i]];
  return static_cast<double>(rows);
}

}  // namespace

void CandidateSets::choose(const PlannerContext& ctx, const FeplbConfig& mode,
                           const std::vector<int64_t>& counts, const std::vector<int64_t>& rows_at,
                           std::vector<uint8_t>& dynamic) {
  const Topology& topo = ctx.topo;
  const FeplbCandidates set = mode.candidate_set();
  const int local_n = topo.experts_per_rank();
  const int per_gpu = set == FeplbCandidates::kBusiest
                          ? static_cast<int>(std::min<int64_t>(mode.dyn, local_n))
                          : local_n;
  const bool from_placement = set == FeplbCandidates::kPlacementSets;
  const bool cover =
      mode.candidate_cover() > 0 && (from_placement || (per_gpu > 0 && per_gpu < local_n));
  candidates_.resize(static_cast<size_t>(topo.num_ranks()) * local_n);
  in_set_.resize(static_cast<size_t>(topo.num_experts()), 0);
  begin_.resize(static_cast<size_t>(topo.num_ranks()) + 1);
  const int n_dom = topo.domain_size();
  double dom_mean = 0.0;  // rows per GPU in g's domain
  int next = 0;
  for (int g = 0; g < topo.num_ranks(); ++g) {
    begin_[g] = next;
    int* const top = candidates_.data() + next;  // g's candidates, busiest first
    // The rows g's candidates should hold to bring it to its domain's mean.
    if (cover && g % n_dom == 0) {  // a domain's first GPU (domains are contiguous)
      const auto first = rows_at.begin() + g;
      dom_mean = static_cast<double>(std::accumulate(first, first + n_dom, int64_t{0})) / n_dom;
    }
    double wanted = cover ? mode.dyn_cover * (static_cast<double>(rows_at[g]) - dom_mean) : 0.0;
    int n = 0;
    if (from_placement) {
      n = choose_placement_set(ctx, g, wanted, counts, top);
      if (n == 0) wanted = 0.0;  // an empty set stays empty
    } else {
      n = choose_busiest(topo.local_experts(g), per_gpu, wanted, counts, top);
    }
    if (wanted > 0) {  // the fewest busiest (at least n) that hold the rows wanted
      int64_t rows = 0;
      int num = 0;
      for (; num < local_n - 1 && (num < n || static_cast<double>(rows) < wanted); ++num)
        rows += counts[top[num]];
      n = std::max(n, num);
    }
    for (int i = 0; i < n; ++i) dynamic[top[i]] = 1;
    next += n;
  }
  begin_[topo.num_ranks()] = next;
}

int CandidateSets::choose_busiest(std::span<const int> local, int per_gpu, double wanted,
                                  const std::vector<int64_t>& counts, int* top) {
  const Busier busier{counts};
  if (local.size() <= kRankedLocalExperts) {
    // Every local expert in place, busiest first: its place is how many are busier (busier is a
    // total order, so each place is taken once), counted without branches: which of two experts
    // is busier is a coin toss to the branch predictor. top has room for them all.
    const int k = static_cast<int>(local.size());
    std::array<int64_t, kRankedLocalExperts> rows;
    for (int i = 0; i < k; ++i) rows[i] = counts[local[i]];
    for (int i = 0; i < k; ++i) {
      int place = 0;
      for (int j = 0; j < k; ++j)
        place += static_cast<int>(rows[j] > rows[i]) |
                 (static_cast<int>(rows[j] == rows[i]) & static_cast<int>(local[j] < local[i]));
      top[place] = local[i];
    }
    return per_gpu;
  }
  if (local.size() <= kFewLocalExperts) {
    // The n busiest by insertion, straight into place (busier is a total order, so this is what
    // any sort gives).
    const auto insert_busiest = [&](int num) {
      int kept = 0;
      for (int e : local) {
        if (num == 0 || (kept == num && !busier(e, top[num - 1]))) continue;
        int q = kept < num ? kept++ : num - 1;
        for (; q > 0 && busier(e, top[q - 1]); --q) top[q] = top[q - 1];
        top[q] = e;
      }
    };
    insert_busiest(per_gpu);
    // Widened: every local expert but one, busiest first (choose() keeps those it needs).
    if (wanted > 0 && rows_held(counts, top, per_gpu) < wanted)
      insert_busiest(static_cast<int>(local.size()) - 1);
    return per_gpu;
  }
  order_.assign(local.begin(), local.end());
  std::partial_sort(order_.begin(), order_.begin() + per_gpu, order_.end(), busier);
  std::copy(order_.begin(), order_.begin() + per_gpu, top);
  if (wanted > 0 && rows_held(counts, top, per_gpu) < wanted) {
    std::sort(order_.begin(), order_.end(), busier);
    std::copy(order_.begin(), order_.end() - 1, top);
  }
  return per_gpu;
}

int CandidateSets::choose_placement_set(const PlannerContext& ctx, int g, double wanted,
                                        const std::vector<int64_t>& counts, int* top) {
  const Busier busier{counts};
  placement_dynamic_set(ctx, g, order_);
  const int n = static_cast<int>(order_.size());
  std::sort(order_.begin(), order_.end(), busier);
  std::copy(order_.begin(), order_.end(), top);
  if (n > 0 && wanted > 0 && rows_held(counts, top, n) < wanted) {
    // The other local experts after it, busiest first.
    for (int e : order_) in_set_[e] = 1;
    int m = n;
    for (int e : ctx.topo.local_experts(g)) {
      if (!in_set_[e]) top[m++] = e;
    }
    for (int e : order_) in_set_[e] = 0;
    std::sort(top + n, top + m, busier);
  }
  return n;
}

}  // namespace feplb::feplb_detail
