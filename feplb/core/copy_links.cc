#include "feplb/core/copy_links.h"

namespace feplb {

std::span<const CopyTime> CopyTimer::time(const Plan& plan, const Topology& topo,
                                          const Knobs& knobs, double start_ms) {
  const int R = topo.num_ranks();
  const auto& copies = plan.copies;
  std::vector<CopyTime>& out = times_;
  out.assign(copies.size(), CopyTime{});
  const auto copy_ms = [&](const Copy& c) {
    const double gbps =
        topo.same_domain(c.src_gpu, c.dst_gpu) ? knobs.copy_gbps : knobs.internode_gbps;
    return link_ms(c.bytes, gbps, knobs.copy_setup_us);
  };
  const auto waited_for = [](CopyKind k) {
    return k != CopyKind::kOutputRows && k != CopyKind::kReplicaWeights;
  };
  // Prefetches: first in, first out on both links.
  const double prefetch_start = -knobs.prefetch_window_us * 1e-3;
  std::vector<double>& in_ms = in_ms_;
  std::vector<double>& out_ms = out_ms_;
  in_ms.assign(static_cast<size_t>(R), prefetch_start);
  out_ms.assign(static_cast<size_t>(R), prefetch_start);
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    if (c.kind != CopyKind::kPrefetchWeights) continue;
    const double at = std::max(in_ms[c.dst_gpu], out_ms[c.src_gpu]);
    out[i] = {at, at + copy_ms(c), true};
    in_ms[c.dst_gpu] = out_ms[c.src_gpu] = out[i].end_ms;
  }
  CopyLinks& links = links_;
  links.reset(R, start_ms);
  for (int g = 0; g < R; ++g) links.start_at(g, in_ms[g], out_ms[g]);
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    if (c.kind == CopyKind::kPrefetchWeights || !waited_for(c.kind)) continue;
    const double t = copy_ms(c);
    const bool with_rows = c.kind == CopyKind::kWeights && i + 1 < copies.size() &&
                           copies[i + 1].kind == CopyKind::kTokenRows &&
                           copies[i + 1].expert == c.expert && copies[i + 1].src_gpu == c.src_gpu &&
                           copies[i + 1].dst_gpu == c.dst_gpu;
    const double rows_t = with_rows ? copy_ms(copies[i + 1]) : 0.0;
    const double at = links.start(c.src_gpu, c.dst_gpu, t + rows_t);
    const double end = links.add(c.src_gpu, c.dst_gpu, t + rows_t);  // at + (t + rows_t)
    out[i] = {at, with_rows ? at + t : end, true};
    if (with_rows) out[++i] = {at + t, end, true};
  }
  return out;
}

}  // namespace feplb
