#include "feplb/core/planners/feplb/copy_rules.h"

#include <algorithm>

namespace feplb::feplb_detail {

void own_ms_at_home(const Topology& topo, const std::vector<double>& expert_ms,
                    std::vector<double>& out) {
  out.assign(static_cast<size_t>(topo.num_ranks()), 0.0);
  for (int g = 0; g < topo.num_ranks(); ++g) {
    for (int e : topo.local_experts(g)) out[g] += expert_ms[e];
  }
}

void TimedRule::start(const Topology& topo, const LoadMeasure& measure,
                      std::span<const double> own) {
  measure_ = &measure;
  own_ms_.assign(own.begin(), own.end());
  guest_ms_.assign(static_cast<size_t>(topo.num_ranks()), 0.0);
}

void HiddenCopies::start(const Topology& topo, const LoadMeasure& measure,
                         std::span<const double> own) {
  TimedRule::start(topo, measure, own);
  arrivals_.resize(static_cast<size_t>(topo.num_ranks()));
  for (auto& a : arrivals_) a.clear();
}

void HiddenCopies::arrive(std::vector<Arrival>& a, int d, double lands_ms, double gemm_ms) {
  const auto it = std::find_if(a.begin(), a.end(), [d](const Arrival& x) { return x.donor == d; });
  if (it == a.end()) {
    a.push_back({d, lands_ms, gemm_ms});
  } else {
    it->lands_ms = std::max(it->lands_ms, lands_ms);
    it->gemm_ms += gemm_ms;
  }
}

bool HiddenCopies::guests_in_time(int h, int d, double lands_ms, double gemm) const {
  std::vector<Arrival>& a = arrival_scratch_;
  a.assign(arrivals_[h].begin(), arrivals_[h].end());
  arrive(a, d, lands_ms, gemm);
  std::sort(a.begin(), a.end(), [](const Arrival& x, const Arrival& y) {
    return x.lands_ms != y.lands_ms ? x.lands_ms < y.lands_ms : x.donor < y.donor;
  });
  double ready_ms = own_ms_[h];  // when h has run all the work whose copies landed before
  for (const Arrival& x : a) {
    if (x.lands_ms > ready_ms) return false;
    ready_ms += x.gemm_ms;
  }
  return true;
}

void ExposedBeforeDonor::start(const Topology& topo, const LoadMeasure& measure,
                               std::span<const double> own) {
  TimedRule::start(topo, measure, own);
  late_finish_ms_.assign(static_cast<size_t>(topo.num_ranks()), 0.0);
}

void LateByBusiest::targets_set(const Topology& topo, const Loads& loads,
                                std::span<const int64_t> targets, int64_t tol) {
  finish_by_ms_ = 0.0;
  const int n = topo.domain_size();
  for (int dom = 0; dom < topo.num_domains(); ++dom) {
    const int first = topo.first_gpu_of_domain(dom);
    for (int g = first; g < first + n; ++g) {
      if (loads.load[g] <= targets[dom] + tol) finish_by_ms_ = std::max(finish_by_ms_, own_ms_[g]);
    }
  }
}

}  // namespace feplb::feplb_detail
