#include "feplb/core/plan.h"

#include <algorithm>

#include "feplb/core/error.h"

namespace feplb {

void Plan::clear(int num_experts) {
  slices.clear();
  copies.clear();
  resident.clear();
  planned_before_dispatch = false;
  reserve_us = -1;
  schedule.clear();
  mode.clear();
  dynamic.assign(static_cast<size_t>(num_experts), 0);
}

void Plan::add_migration(int expert, int home, int helper, int64_t rows, const ExpertShape& shape) {
  slices.push_back({expert, helper, rows, RowSource::kHome});
  copies.push_back({CopyKind::kWeights, expert, home, helper, 0, shape.weight_bytes()});
  copies.push_back({CopyKind::kTokenRows, expert, home, helper, rows, rows * shape.row_bytes()});
  copies.push_back({CopyKind::kOutputRows, expert, helper, home, rows, rows * shape.row_bytes()});
}

void Plan::add_migration(int expert, int home, int helper, int64_t rows, const ExpertShape& shape,
                         bool weights_prefetched, bool one_hop) {
  slices.push_back({expert, helper, rows, one_hop ? RowSource::kDispatched : RowSource::kHome});
  if (!weights_prefetched) {
    copies.push_back({CopyKind::kWeights, expert, home, helper, 0, shape.weight_bytes()});
  }
  if (!one_hop) {
    copies.push_back({CopyKind::kTokenRows, expert, home, helper, rows, rows * shape.row_bytes()});
    copies.push_back({CopyKind::kOutputRows, expert, helper, home, rows, rows * shape.row_bytes()});
  }
}

void Plan::add_prefetch(int expert, int home, int gpu, const ExpertShape& shape) {
  copies.push_back({CopyKind::kPrefetchWeights, expert, home, gpu, 0, shape.weight_bytes()});
}

void Plan::add_home_slices(const Topology& topo, const RoutingStep& routing,
                           const std::vector<int64_t>& moved_rows) {
  for (int e = 0; e < topo.num_experts(); ++e) {
    const int64_t rows = routing.expert_counts[e] - moved_rows[e];
    if (rows > 0) slices.push_back({e, topo.home(e), rows, RowSource::kHome});
  }
}

int64_t Plan::weight_bytes() const {
  int64_t b = 0;
  for (const Copy& c : copies) b += is_weight_copy(c.kind) ? c.bytes : 0;
  return b;
}

int64_t Plan::token_bytes() const {
  int64_t b = 0;
  for (const Copy& c : copies) b += is_weight_copy(c.kind) ? 0 : c.bytes;
  return b;
}

void validate(const Plan& plan, const Topology& topo, const RoutingStep& routing,
              const ExpertShape& shape, const PlanLimits& limits) {
  const int R = topo.num_ranks(), E = topo.num_experts();
  FEPLB_CHECK(routing.num_ranks == R && routing.num_experts == E, "routing {}x{} vs topology {}x{}",
              routing.num_ranks, routing.num_experts, R, E);
  FEPLB_CHECK(plan.dynamic.size() == static_cast<size_t>(E), "dynamic has {} entries, expected {}",
              plan.dynamic.size(), E);
  auto key = [E](int gpu, int expert) { return static_cast<size_t>(gpu) * E + expert; };
  std::vector<int64_t> rows_on(static_cast<size_t>(R) * E, 0);       // [gpu, expert] slice rows
  std::vector<int64_t> home_rows_on(static_cast<size_t>(R) * E, 0);  // of which RowSource::kHome
  std::vector<int64_t> computed(static_cast<size_t>(E), 0);
  for (const Slice& s : plan.slices) {
    FEPLB_CHECK(s.expert >= 0 && s.expert < E, "slice expert {} out of range", s.expert);
    FEPLB_CHECK(s.gpu >= 0 && s.gpu < R, "slice of expert {} on GPU {} out of range", s.expert,
                s.gpu);
    FEPLB_CHECK(s.rows > 0, "slice of expert {} on GPU {} has {} rows", s.expert, s.gpu, s.rows);
    FEPLB_CHECK(rows_on[key(s.gpu, s.expert)] == 0, "expert {} has two slices on GPU {}", s.expert,
                s.gpu);
    FEPLB_CHECK(
        !limits.rows_via_homes || s.source == RowSource::kHome,
        "expert {} on GPU {}: rows not dispatched to its home, in a plan that promises they are",
        s.expert, s.gpu);
    switch (s.source) {
      case RowSource::kSource:
        FEPLB_CHECK(s.rows <= routing.at(s.gpu, s.expert),
                    "expert {} computes {} source-local rows on GPU {}, which only sent {}",
                    s.expert, s.rows, s.gpu, routing.at(s.gpu, s.expert));
        break;
      case RowSource::kHome:
        home_rows_on[key(s.gpu, s.expert)] = s.rows;
        break;
      case RowSource::kDispatched:
        FEPLB_CHECK(s.gpu != topo.home(s.expert),
                    "expert {} has dispatched-slice rows on its home GPU {} (those are home rows)",
                    s.expert, s.gpu);
        break;
    }
    rows_on[key(s.gpu, s.expert)] = s.rows;
    computed[s.expert] += s.rows;
  }
  for (int e = 0; e < E; ++e) {
    FEPLB_CHECK(computed[e] == routing.expert_counts[e],
                "expert {}: {} rows computed, {} routed (every row exactly once)", e, computed[e],
                routing.expert_counts[e]);
  }
  // Resident replicas: on non-home GPUs, once each.
  std::vector<uint8_t> resident(static_cast<size_t>(R) * E, 0);
  for (const ResidentReplica& r : plan.resident) {
    FEPLB_CHECK(r.expert >= 0 && r.expert < E && r.gpu >= 0 && r.gpu < R,
                "resident replica of expert {} on GPU {} out of range", r.expert, r.gpu);
    FEPLB_CHECK(r.gpu != topo.home(r.expert), "replica of expert {} resident on its home GPU {}",
                r.expert, r.gpu);
    FEPLB_CHECK(!resident[key(r.gpu, r.expert)], "expert {} has two resident replicas on GPU {}",
                r.expert, r.gpu);
    resident[key(r.gpu, r.expert)] = 1;
  }
  // Copies: weights to every helper once, token rows in and outputs back matching its slice.
  std::vector<uint8_t> has_weights(static_cast<size_t>(R) * E, 0);
  std::vector<uint8_t> installed(static_cast<size_t>(R) * E, 0);
  std::vector<int64_t> rows_in(static_cast<size_t>(R) * E, 0),
      rows_out(static_cast<size_t>(R) * E, 0);
  for (const Copy& c : plan.copies) {
    FEPLB_CHECK(c.expert >= 0 && c.expert < E, "copy of expert {} out of range", c.expert);
    FEPLB_CHECK(c.src_gpu >= 0 && c.src_gpu < R && c.dst_gpu >= 0 && c.dst_gpu < R &&
                    c.src_gpu != c.dst_gpu,
                "copy of expert {} from GPU {} to GPU {} is invalid", c.expert, c.src_gpu,
                c.dst_gpu);
    FEPLB_CHECK(!limits.intra_domain_only || topo.same_domain(c.src_gpu, c.dst_gpu),
                "copy of expert {} from GPU {} to GPU {} leaves its NVLink domain", c.expert,
                c.src_gpu, c.dst_gpu);
    const int home = topo.home(c.expert);
    switch (c.kind) {
      case CopyKind::kWeights:
      case CopyKind::kPrefetchWeights:
        FEPLB_CHECK(c.src_gpu == home, "weights of expert {} copied from GPU {}, not its home {}",
                    c.expert, c.src_gpu, home);
        FEPLB_CHECK(c.bytes == shape.weight_bytes(), "weight copy of expert {} has {} bytes",
                    c.expert, c.bytes);
        FEPLB_CHECK(!has_weights[key(c.dst_gpu, c.expert)],
                    "weights of expert {} copied twice to GPU {}", c.expert, c.dst_gpu);
        FEPLB_CHECK(!resident[key(c.dst_gpu, c.expert)],
                    "weights of expert {} copied to GPU {}, which holds a resident replica",
                    c.expert, c.dst_gpu);
        has_weights[key(c.dst_gpu, c.expert)] = 1;
        break;
      case CopyKind::kReplicaWeights:
        FEPLB_CHECK(c.src_gpu == home,
                    "replica of expert {} installed from GPU {}, not its home {}", c.expert,
                    c.src_gpu, home);
        FEPLB_CHECK(c.bytes == shape.weight_bytes(), "replica install of expert {} has {} bytes",
                    c.expert, c.bytes);
        FEPLB_CHECK(resident[key(c.dst_gpu, c.expert)],
                    "replica of expert {} installed on GPU {} is not listed as resident", c.expert,
                    c.dst_gpu);
        FEPLB_CHECK(!installed[key(c.dst_gpu, c.expert)],
                    "replica of expert {} installed twice on GPU {}", c.expert, c.dst_gpu);
        installed[key(c.dst_gpu, c.expert)] = 1;
        break;
      case CopyKind::kTokenRows:
        FEPLB_CHECK(c.src_gpu == home, "rows of expert {} copied from GPU {}, not its home {}",
                    c.expert, c.src_gpu, home);
        FEPLB_CHECK(c.bytes == c.rows * shape.row_bytes(),
                    "token copy of expert {} has {} bytes for {} rows", c.expert, c.bytes, c.rows);
        rows_in[key(c.dst_gpu, c.expert)] += c.rows;
        break;
      case CopyKind::kOutputRows:
        FEPLB_CHECK(c.dst_gpu == home, "outputs of expert {} copied to GPU {}, not its home {}",
                    c.expert, c.dst_gpu, home);
        FEPLB_CHECK(c.bytes == c.rows * shape.row_bytes(), "output copy of expert {} has {} bytes",
                    c.expert, c.bytes);
        rows_out[key(c.src_gpu, c.expert)] += c.rows;
        break;
    }
  }
  std::vector<int64_t> guests(static_cast<size_t>(R), 0);
  for (int g = 0; g < R; ++g) {
    for (int e = 0; e < E; ++e) {
      const size_t k = key(g, e);
      if (g == topo.home(e)) {
        FEPLB_CHECK(rows_in[k] == 0 && !has_weights[k], "expert {} copied to its own home {}", e,
                    g);
        continue;
      }
      // A GPU holding a non-home expert's weights, copied or resident, uses a guest slot (FasterMoE
      // broadcasts weights to GPUs that may have no rows for them); rows there need the weights.
      const bool guest = has_weights[k] != 0 || resident[k] != 0;
      FEPLB_CHECK(guest || rows_on[k] == 0, "GPU {} computes guest expert {} without its weights",
                  g, e);
      FEPLB_CHECK(rows_in[k] == home_rows_on[k] && rows_out[k] == home_rows_on[k],
                  "expert {} on GPU {}: {} dispatched rows computed, {} copied in, {} copied back",
                  e, g, home_rows_on[k], rows_in[k], rows_out[k]);
      guests[g] += guest ? 1 : 0;
    }
    FEPLB_CHECK(guests[g] <= limits.max_guest_experts, "GPU {} computes {} guest experts, limit {}",
                g, guests[g], limits.max_guest_experts);
  }
}

std::string serialize(const Plan& plan) {
  std::string out;
  for (const Slice& s : plan.slices) {
    out += fmt::format("S {} {} {} {}\n", s.expert, s.gpu, s.rows, static_cast<int>(s.source));
  }
  for (const Copy& c : plan.copies) {
    out += fmt::format("C {} {} {} {} {} {}\n", static_cast<int>(c.kind), c.expert, c.src_gpu,
                       c.dst_gpu, c.rows, c.bytes);
  }
  for (const ResidentReplica& r : plan.resident) out += fmt::format("P {} {}\n", r.expert, r.gpu);
  if (plan.planned_before_dispatch) out += "B\n";
  out += "D";
  for (uint8_t d : plan.dynamic) out += d ? '1' : '0';
  out += '\n';
  return out;
}

}  // namespace feplb
