#include "feplb/core/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "feplb/core/copy_links.h"
#include "feplb/core/error.h"

namespace feplb {

double oracle_token_straggler(const Topology& topo, const std::vector<int64_t>& expert_counts) {
  std::vector<int64_t> dom_rows(static_cast<size_t>(topo.num_domains()), 0);
  int64_t total = 0;
  for (int e = 0; e < topo.num_experts(); ++e) {
    dom_rows[topo.domain_of(topo.home(e))] += expert_counts[e];
    total += expert_counts[e];
  }
  int64_t worst = 0;
  for (int64_t t : dom_rows)
    worst = std::max(worst, (t + topo.domain_size() - 1) / topo.domain_size());
  return static_cast<double>(worst) - static_cast<double>(total) / topo.num_ranks();
}

namespace {

// The copies' bytes by kind and link, weight copies and prefetches, and the guest slots they fill
// (`guest_slots` [gpu] += ; `rows_at` [gpu, expert]: rows computed there, to tell used prefetches
// from wasted ones).
void count_copies(const Plan& plan, const Topology& topo, const std::vector<int64_t>& rows_at,
                  std::vector<int64_t>& guest_slots, StepMetrics& m) {
  const int E = topo.num_experts();
  for (const Copy& c : plan.copies) {
    if (c.kind == CopyKind::kPrefetchWeights) {
      m.weight_bytes += c.bytes;
      ++m.prefetch_copies;
      m.prefetch_bytes += c.bytes;
      ++guest_slots[c.dst_gpu];
      if (rows_at[static_cast<size_t>(c.dst_gpu) * E + c.expert] > 0) {
        ++m.prefetch_hits;
        ++m.guest_weights_needed;
      } else {
        m.prefetch_wasted_bytes += c.bytes;
      }
    } else {
      if (is_weight_copy(c.kind)) {
        m.weight_bytes += c.bytes;
      } else {
        m.token_bytes += c.bytes;
      }
      if (c.kind == CopyKind::kWeights) {
        ++m.guest_experts;
        ++guest_slots[c.dst_gpu];
        ++m.guest_weights_needed;
      }
    }
    (topo.same_domain(c.src_gpu, c.dst_gpu) ? m.nvlink_bytes : m.network_bytes) += c.bytes;
  }
}

// Rows and modelled GEMM time per GPU: the token and GEMM stragglers, and the oracle's.
void measure_loads(const Plan& plan, const Topology& topo, const GemmCostModel& cost, GpuLoads& l,
                   StepMetrics& m) {
  const int R = topo.num_ranks();
  l.home_rows.assign(R, 0);
  l.guest_rows.assign(R, 0);
  l.gemm_ms.assign(R, 0.0);
  std::vector<int64_t> expert_counts(static_cast<size_t>(topo.num_experts()), 0);
  for (const Slice& s : plan.slices) {
    l.gemm_ms[s.gpu] += cost.expert_ms(s.rows);
    expert_counts[s.expert] += s.rows;
    (topo.home(s.expert) == s.gpu ? l.home_rows : l.guest_rows)[s.gpu] += s.rows;
  }
  int64_t total = 0, max_rows = 0;
  for (int g = 0; g < R; ++g) {
    const int64_t rows = l.home_rows[g] + l.guest_rows[g];
    total += rows;
    max_rows = std::max(max_rows, rows);
  }
  m.mean_rows = static_cast<double>(total) / R;
  m.token_straggler = static_cast<double>(max_rows) - m.mean_rows;
  m.token_max_over_mean = m.mean_rows > 0 ? static_cast<double>(max_rows) / m.mean_rows : 1.0;
  m.oracle_straggler = oracle_token_straggler(topo, expert_counts);
  double gemm_sum = 0.0;
  for (double g : l.gemm_ms) {
    gemm_sum += g;
    m.gemm_max_ms = std::max(m.gemm_max_ms, g);
  }
  m.gemm_straggler_ms = m.gemm_max_ms - gemm_sum / R;
}

// Each GPU runs its own work, its ready guests, then its owners' guests turn by turn, as the
// schedule orders them, its copies `delay_ms` later than the schedule assumed: the copies'
// exposed time and the static window's slack.
void measure_timelines(const Schedule& schedule, int R, double delay_ms, StepMetrics& m) {
  double slack = std::numeric_limits<double>::infinity();
  double finish_max = 0.0;
  for (int g = 0; g < R; ++g) {
    const Schedule::Timeline t = schedule.timeline(g, delay_ms);
    slack = std::min(slack, t.slack_ms);
    finish_max = std::max(finish_max, t.finish_ms);
  }
  m.window_slack_ms = std::isinf(slack) ? 0.0 : slack;
  m.copy_exposed_ms = std::max(0.0, finish_max - m.gemm_max_ms);
  if (m.copy_exposed_ms < 1e-12) m.copy_exposed_ms = 0.0;  // rounding of equal sums
  m.fits_static_window = std::isinf(slack) || slack >= 0.0;
}

}  // namespace

StepMetrics measure_plan(const Plan& plan, const Topology& topo, const GemmCostModel& cost,
                         double planner_us, GpuLoads* loads) {
  const int R = topo.num_ranks(), E = topo.num_experts();
  StepMetrics m;
  m.planner_us = planner_us;
  m.mode = plan.mode;
  // Non-home weights per GPU: resident replicas (held before the micro-batch) and copies.
  std::vector<int64_t> guest_slots(R, 0);
  for (const ResidentReplica& r : plan.resident) ++guest_slots[r.gpu];
  std::vector<int64_t> rows_at(static_cast<size_t>(R) * E, 0);  // [gpu, expert]
  for (const Slice& s : plan.slices) rows_at[static_cast<size_t>(s.gpu) * E + s.expert] += s.rows;

  // The plan's schedule (written by its planner, t = 0 when the GPUs start their expert GEMMs).
  // Phase-2 copies start once the plan exists, the planner's time after the GEMMs start (two-phase:
  // it planned while the dispatch ran), or at once (a plan made before the dispatch, whose latency
  // delays the dispatch, so every GPU, instead). The schedule assumed the planner's budget; the
  // copies of a plan ready later (earlier) land that much later (earlier).
  const double plan_ms = planner_us * 1e-3;
  m.plan_exposed_ms = plan.planned_before_dispatch ? plan_ms : 0.0;
  FEPLB_REQUIRE_INPUT(plan.schedule.written(plan.copies.size(), R),
                      "measure_plan: the plan has no schedule for its {} copies on {} GPUs "
                      "(Planner::plan writes one; a plan made by hand needs ScheduleWriter::write)",
                      plan.copies.size(), R);
  const Schedule& schedule = plan.schedule;
  const double delay_ms = (plan.planned_before_dispatch ? 0.0 : plan_ms) - schedule.copy_start_ms;
  count_copies(plan, topo, rows_at, guest_slots, m);
  GpuLoads l;
  measure_loads(plan, topo, cost, l, m);
  measure_timelines(schedule, R, delay_ms, m);
  m.max_guest_slots = *std::max_element(guest_slots.begin(), guest_slots.end());
  if (loads) *loads = std::move(l);
  return m;
}

void measure_traffic(const Plan& plan, const Topology& topo, const RoutingStep& routing,
                     const ExpertShape& shape, StepMetrics& m) {
  const int R = topo.num_ranks(), E = topo.num_experts();
  // received[d, e]: rows of e that GPU d receives in the dispatch; kept[s, e]: rows s keeps.
  std::vector<int64_t> received(static_cast<size_t>(R) * E, 0), kept(static_cast<size_t>(R) * E, 0);
  for (const Slice& s : plan.slices) {
    const size_t k = static_cast<size_t>(s.gpu) * E + s.expert;
    (s.source == RowSource::kSource ? kept : received)[k] += s.rows;
  }
  for (const Copy& c : plan.copies) {  // rows the home received and copied on to a helper
    if (c.kind == CopyKind::kTokenRows) {
      received[static_cast<size_t>(c.src_gpu) * E + c.expert] += c.rows;
    }
  }
  int64_t nvlink_rows = 0, network_rows = 0;
  for (int e = 0; e < E; ++e) {
    int s = 0, d = 0;
    int64_t left_s = routing.at(0, e) - kept[e], left_d = received[e];
    while (s < R && d < R) {
      if (left_s == 0) {
        if (++s < R) left_s = routing.at(s, e) - kept[static_cast<size_t>(s) * E + e];
        continue;
      }
      if (left_d == 0) {
        if (++d < R) left_d = received[static_cast<size_t>(d) * E + e];
        continue;
      }
      const int64_t rows = std::min(left_s, left_d);
      if (s != d) (topo.same_domain(s, d) ? nvlink_rows : network_rows) += rows;
      left_s -= rows;
      left_d -= rows;
    }
  }
  m.dispatch_nvlink_bytes = 2 * nvlink_rows * shape.row_bytes();
  m.dispatch_network_bytes = 2 * network_rows * shape.row_bytes();
}

}  // namespace feplb
