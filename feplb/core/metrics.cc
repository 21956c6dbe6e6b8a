#include "feplb/core/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace feplb {

double oracle_token_straggler(const Topology& topo, const std::vector<int64_t>& expert_counts) {
  std::vector<int64_t> dom_rows(static_cast<size_t>(topo.num_domains()), 0);
  int64_t total = 0;
  for (int e = 0; e < topo.num_experts(); ++e) {
    dom_rows[topo.domain_of(topo.home(e))] += expert_counts[e];
    total += expert_counts[e];
  }
  int64_t worst = 0;
  for (int64_t t : dom_rows) worst = std::max(worst, (t + topo.domain_size() - 1) / topo.domain_size());
  return static_cast<double>(worst) - static_cast<double>(total) / topo.num_ranks();
}

StepMetrics measure_plan(const Plan& plan, const Topology& topo, const GemmCostModel& cost,
                         const Knobs& knobs, double planner_us,
                         GpuLoads* loads) {
  const int R = topo.num_ranks();
  StepMetrics m;
  m.planner_us = planner_us;
  std::vector<int64_t> home_rows(R, 0), guest_rows(R, 0);
  std::vector<double> gemm(R, 0.0), window(R, 0.0);
  std::vector<int64_t> expert_counts(static_cast<size_t>(topo.num_experts()), 0);
  for (const Slice& s : plan.slices) {
    const double ms = cost.expert_ms(s.rows);
    gemm[s.gpu] += ms;
    expert_counts[s.expert] += s.rows;
    if (topo.home(s.expert) == s.gpu) {
      home_rows[s.gpu] += s.rows;
      window[s.gpu] += ms;  // own work: needs no copy, so it hides the copies coming in
    } else {
      guest_rows[s.gpu] += s.rows;
    }
  }
  int64_t total = 0, max_rows = 0;
  for (int g = 0; g < R; ++g) {
    const int64_t rows = home_rows[g] + guest_rows[g];
    total += rows;
    max_rows = std::max(max_rows, rows);
  }
  m.mean_rows = static_cast<double>(total) / R;
  m.token_straggler = static_cast<double>(max_rows) - m.mean_rows;
  m.token_max_over_mean = m.mean_rows > 0 ? static_cast<double>(max_rows) / m.mean_rows : 1.0;
  m.oracle_straggler = oracle_token_straggler(topo, expert_counts);
  double gemm_sum = 0.0;
  for (double g : gemm) {
    gemm_sum += g;
    m.gemm_max_ms = std::max(m.gemm_max_ms, g);
  }
  m.gemm_straggler_ms = m.gemm_max_ms - gemm_sum / R;

  // Copy timing: copies are issued in plan order; a copy occupies the sender's egress link and
  // the receiver's ingress link from when both are free until it is done (first in, first out),
  // so a receiver has its copies when the last one into it ends.
  std::vector<double> in_ms(R, 0.0), out_ms(R, 0.0), needed(R, 0.0);
  std::vector<int64_t> num_in(R, 0);
  for (const Copy& c : plan.copies) {
    if (c.kind == CopyKind::kWeights) {
      m.weight_bytes += c.bytes;
      ++m.guest_experts;
    } else {
      m.token_bytes += c.bytes;
    }
    if (c.kind == CopyKind::kOutputRows) continue;  // after the GEMM, not in the window
    const double gbps = topo.same_domain(c.src_gpu, c.dst_gpu) ? knobs.copy_gbps : knobs.internode_gbps;
    const double t = static_cast<double>(c.bytes) / (gbps * 1e9) * 1e3 + knobs.copy_setup_us * 1e-3;
    const double end = std::max(in_ms[c.dst_gpu], out_ms[c.src_gpu]) + t;
    in_ms[c.dst_gpu] = out_ms[c.src_gpu] = end;
    needed[c.dst_gpu] = std::max(needed[c.dst_gpu], end);
    ++num_in[c.dst_gpu];
  }
  const double start_ms = (knobs.counts_to_host_us + planner_us) * 1e-3;
  double slack = std::numeric_limits<double>::infinity();
  for (int g = 0; g < R; ++g) {
    if (num_in[g] == 0) continue;
    slack = std::min(slack, window[g] - (start_ms + needed[g]));
  }
  m.window_slack_ms = std::isinf(slack) ? 0.0 : slack;
  double finish_max = 0.0;
  for (int g = 0; g < R; ++g) {
    const double finish = num_in[g] == 0 ? gemm[g]
                                         : std::max(window[g], start_ms + needed[g]) + (gemm[g] - window[g]);
    finish_max = std::max(finish_max, finish);
  }
  m.copy_exposed_ms = std::max(0.0, finish_max - m.gemm_max_ms);
  m.fits_static_window = std::isinf(slack) || slack >= 0.0;
  if (loads) {
    loads->home_rows = std::move(home_rows);
    loads->guest_rows = std::move(guest_rows);
    loads->gemm_ms = std::move(gemm);
  }
  return m;
}

}  // namespace feplb
