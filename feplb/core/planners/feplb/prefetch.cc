#include "feplb/core/planners/feplb/prefetch.h"

#include <algorithm>

namespace feplb::feplb_detail {

void PrefetchHistory::record(int64_t layer, const Plan& plan) {
  LayerPrefetch& lp = layer_state(layer);
  const int64_t H = ctx_.knobs.prefetch_history;
  if (static_cast<int64_t>(lp.history.size()) < H) lp.history.emplace_back();
  auto& slot = lp.history[static_cast<size_t>(lp.next % H)];
  slot.clear();
  for (const Slice& sl : plan.slices) {
    if (sl.gpu != ctx_.topo.home(sl.expert))
      slot.push_back({sl.expert, sl.gpu, lp.next, sl.rows, 1});
  }
  ++lp.next;
  predict(lp);
}

std::span<const Copy> PrefetchHistory::predicted(int64_t layer) const {
  for (const LayerPrefetch& lp : layers_) {
    if (lp.layer == layer) return lp.predicted;
  }
  return {};
}

PrefetchHistory::LayerPrefetch& PrefetchHistory::layer_state(int64_t layer) {
  for (LayerPrefetch& lp : layers_) {
    if (lp.layer == layer) return lp;
  }
  layers_.emplace_back();
  layers_.back().layer = layer;
  return layers_.back();
}

void PrefetchHistory::predict(LayerPrefetch& lp) {
  const Topology& topo = ctx_.topo;
  const Knobs& k = ctx_.knobs;
  merged_.clear();
  for (const auto& h : lp.history) merged_.insert(merged_.end(), h.begin(), h.end());
  std::sort(merged_.begin(), merged_.end(), [](const Pair& a, const Pair& b) {
    return a.expert != b.expert ? a.expert < b.expert
           : a.gpu != b.gpu     ? a.gpu < b.gpu
                                : a.step > b.step;
  });
  size_t w = 0;  // one entry per pair: count, latest step, its rows then
  for (size_t i = 0; i < merged_.size(); ++i) {
    if (w > 0 && merged_[w - 1].expert == merged_[i].expert &&
        merged_[w - 1].gpu == merged_[i].gpu) {
      ++merged_[w - 1].count;
    } else {
      merged_[w++] = merged_[i];
    }
  }
  merged_.resize(w);
  std::sort(merged_.begin(), merged_.end(), [](const Pair& a, const Pair& b) {
    if (a.count != b.count) return a.count > b.count;
    if (a.step != b.step) return a.step > b.step;
    if (a.rows != b.rows) return a.rows > b.rows;
    return a.expert != b.expert ? a.expert < b.expert : a.gpu < b.gpu;
  });
  const int R = topo.num_ranks();
  const double window_ms = k.prefetch_window_us * 1e-3;
  const double t = static_cast<double>(ctx_.shape.weight_bytes()) / (k.copy_gbps * 1e9) * 1e3 +
                   k.copy_setup_us * 1e-3;
  in_ms_.assign(static_cast<size_t>(R), 0.0);
  out_ms_.assign(static_cast<size_t>(R), 0.0);
  slots_.assign(static_cast<size_t>(R), 0);
  lp.predicted.clear();
  for (const Pair& p : merged_) {
    const int home = topo.home(p.expert);
    if (slots_[p.gpu] >= k.max_num_dyn) continue;
    const double end = std::max(in_ms_[p.gpu], out_ms_[home]) + t;
    if (end > window_ms) continue;
    in_ms_[p.gpu] = out_ms_[home] = end;
    ++slots_[p.gpu];
    lp.predicted.push_back(
        {CopyKind::kPrefetchWeights, p.expert, home, p.gpu, 0, ctx_.shape.weight_bytes()});
  }
}

void PrefetchedWeights::add(const PlannerContext& ctx, std::span<const Copy> prefetches, Plan& out,
                            std::vector<int64_t>& guests, CopyLinks& links) {
  const Topology& topo = ctx.topo;
  const Knobs& k = ctx.knobs;
  const int E = topo.num_experts(), R = topo.num_ranks();
  begin_.assign(static_cast<size_t>(E) + 1, 0);
  if (prefetches.empty()) return;
  const double t = static_cast<double>(ctx.shape.weight_bytes()) / (k.copy_gbps * 1e9) * 1e3 +
                   k.copy_setup_us * 1e-3;
  in_ms_.assign(static_cast<size_t>(R), -k.prefetch_window_us * 1e-3);
  out_ms_.assign(static_cast<size_t>(R), -k.prefetch_window_us * 1e-3);
  for (const Copy& p : prefetches) {
    const int e = p.expert, g = p.dst_gpu, home = p.src_gpu;
    out.copies.push_back(p);
    ++guests[g];
    ++begin_[e + 1];
    const double end = std::max(in_ms_[g], out_ms_[home]) + t;
    in_ms_[g] = out_ms_[home] = end;
  }
  for (int g = 0; g < R; ++g) links.start_at(g, in_ms_[g], out_ms_[g]);
  for (int e = 0; e < E; ++e) begin_[e + 1] += begin_[e];
  gpu_.resize(prefetches.size());
  fill_.assign(begin_.begin(), begin_.end() - 1);
  for (const Copy& p : prefetches) gpu_[static_cast<size_t>(fill_[p.expert]++)] = p.dst_gpu;
}

}  // namespace feplb::feplb_detail
