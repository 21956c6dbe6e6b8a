#include "feplb/core/plan.h"

#include <algorithm>
#include <cstdio>

#include "feplb/core/error.h"

namespace feplb {

void Plan::clear(int num_experts) {
  slices.clear();
  copies.clear();
  resident.clear();
  planned_before_dispatch = false;
  reserve_us = -1;
  extra_plans = 0;
  candidates = 1;
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

namespace {

// validate()'s checks, in its order, with the per-(GPU, expert) tallies they share.
class PlanChecker {
 public:
  PlanChecker(const Plan& plan, const Topology& topo, const RoutingStep& routing,
              const ExpertShape& shape, const PlanLimits& limits)
      : plan_(plan),
        topo_(topo),
        routing_(routing),
        shape_(shape),
        limits_(limits),
        R_(topo.num_ranks()),
        E_(topo.num_experts()),
        cells_(static_cast<size_t>(R_) * E_) {}

  void run() {
    FEPLB_CHECK(routing_.num_ranks == R_ && routing_.num_experts == E_,
                "routing {}x{} vs topology {}x{}", routing_.num_ranks, routing_.num_experts, R_,
                E_);
    FEPLB_CHECK(plan_.dynamic.size() == static_cast<size_t>(E_),
                "dynamic has {} entries, expected {}", plan_.dynamic.size(), E_);
    rows_on_.assign(cells_, 0);
    home_rows_on_.assign(cells_, 0);
    std::vector<int64_t> computed(static_cast<size_t>(E_), 0);
    for (const Slice& s : plan_.slices) {
      slice(s);
      computed[s.expert] += s.rows;
    }
    for (int e = 0; e < E_; ++e) {
      FEPLB_CHECK(computed[e] == routing_.expert_counts[e],
                  "expert {}: {} rows computed, {} routed (every row exactly once)", e, computed[e],
                  routing_.expert_counts[e]);
    }
    resident_replicas();
    has_weights_.assign(cells_, 0);
    installed_.assign(cells_, 0);
    rows_in_.assign(cells_, 0);
    rows_out_.assign(cells_, 0);
    for (const Copy& c : plan_.copies) copy(c);
    for (int g = 0; g < R_; ++g) gpu(g);
  }

 private:
  size_t key(int gpu, int expert) const { return static_cast<size_t>(gpu) * E_ + expert; }

  // A slice: in range, rows > 0, one per (GPU, expert), its rows' source possible.
  void slice(const Slice& s) {
    FEPLB_CHECK(s.expert >= 0 && s.expert < E_, "slice expert {} out of range", s.expert);
    FEPLB_CHECK(s.gpu >= 0 && s.gpu < R_, "slice of expert {} on GPU {} out of range", s.expert,
                s.gpu);
    FEPLB_CHECK(s.rows > 0, "slice of expert {} on GPU {} has {} rows", s.expert, s.gpu, s.rows);
    FEPLB_CHECK(rows_on_[key(s.gpu, s.expert)] == 0, "expert {} has two slices on GPU {}", s.expert,
                s.gpu);
    FEPLB_CHECK(
        !limits_.rows_via_homes || s.source == RowSource::kHome,
        "expert {} on GPU {}: rows not dispatched to its home, in a plan that promises they are",
        s.expert, s.gpu);
    switch (s.source) {
      case RowSource::kSource:
        FEPLB_CHECK(s.rows <= routing_.at(s.gpu, s.expert),
                    "expert {} computes {} source-local rows on GPU {}, which only sent {}",
                    s.expert, s.rows, s.gpu, routing_.at(s.gpu, s.expert));
        break;
      case RowSource::kHome:
        home_rows_on_[key(s.gpu, s.expert)] = s.rows;
        break;
      case RowSource::kDispatched:
        FEPLB_CHECK(s.gpu != topo_.home(s.expert),
                    "expert {} has dispatched-slice rows on its home GPU {} (those are home rows)",
                    s.expert, s.gpu);
        break;
    }
    rows_on_[key(s.gpu, s.expert)] = s.rows;
  }

  // Resident replicas: on non-home GPUs, once each.
  void resident_replicas() {
    resident_.assign(cells_, 0);
    for (const ResidentReplica& r : plan_.resident) {
      FEPLB_CHECK(r.expert >= 0 && r.expert < E_ && r.gpu >= 0 && r.gpu < R_,
                  "resident replica of expert {} on GPU {} out of range", r.expert, r.gpu);
      FEPLB_CHECK(r.gpu != topo_.home(r.expert), "replica of expert {} resident on its home GPU {}",
                  r.expert, r.gpu);
      FEPLB_CHECK(!resident_[key(r.gpu, r.expert)], "expert {} has two resident replicas on GPU {}",
                  r.expert, r.gpu);
      resident_[key(r.gpu, r.expert)] = 1;
    }
  }

  // A copy: weights to every helper once, token rows in and outputs back counted per slice.
  void copy(const Copy& c) {
    FEPLB_CHECK(c.expert >= 0 && c.expert < E_, "copy of expert {} out of range", c.expert);
    FEPLB_CHECK(c.src_gpu >= 0 && c.src_gpu < R_ && c.dst_gpu >= 0 && c.dst_gpu < R_ &&
                    c.src_gpu != c.dst_gpu,
                "copy of expert {} from GPU {} to GPU {} is invalid", c.expert, c.src_gpu,
                c.dst_gpu);
    FEPLB_CHECK(!limits_.intra_domain_only || topo_.same_domain(c.src_gpu, c.dst_gpu),
                "copy of expert {} from GPU {} to GPU {} leaves its NVLink domain", c.expert,
                c.src_gpu, c.dst_gpu);
    switch (c.kind) {
      case CopyKind::kWeights:
      case CopyKind::kPrefetchWeights:
        weights(c);
        break;
      case CopyKind::kReplicaWeights:
        replica(c);
        break;
      case CopyKind::kTokenRows:
        FEPLB_CHECK(c.src_gpu == topo_.home(c.expert),
                    "rows of expert {} copied from GPU {}, not its home {}", c.expert, c.src_gpu,
                    topo_.home(c.expert));
        FEPLB_CHECK(c.bytes == c.rows * shape_.row_bytes(),
                    "token copy of expert {} has {} bytes for {} rows", c.expert, c.bytes, c.rows);
        rows_in_[key(c.dst_gpu, c.expert)] += c.rows;
        break;
      case CopyKind::kOutputRows:
        FEPLB_CHECK(c.dst_gpu == topo_.home(c.expert),
                    "outputs of expert {} copied to GPU {}, not its home {}", c.expert, c.dst_gpu,
                    topo_.home(c.expert));
        FEPLB_CHECK(c.bytes == c.rows * shape_.row_bytes(), "output copy of expert {} has {} bytes",
                    c.expert, c.bytes);
        rows_out_[key(c.src_gpu, c.expert)] += c.rows;
        break;
    }
  }

  void weights(const Copy& c) {
    const int home = topo_.home(c.expert);
    FEPLB_CHECK(c.src_gpu == home, "weights of expert {} copied from GPU {}, not its home {}",
                c.expert, c.src_gpu, home);
    FEPLB_CHECK(c.bytes == shape_.weight_bytes(), "weight copy of expert {} has {} bytes", c.expert,
                c.bytes);
    FEPLB_CHECK(!has_weights_[key(c.dst_gpu, c.expert)],
                "weights of expert {} copied twice to GPU {}", c.expert, c.dst_gpu);
    FEPLB_CHECK(!resident_[key(c.dst_gpu, c.expert)],
                "weights of expert {} copied to GPU {}, which holds a resident replica", c.expert,
                c.dst_gpu);
    has_weights_[key(c.dst_gpu, c.expert)] = 1;
  }

  void replica(const Copy& c) {
    const int home = topo_.home(c.expert);
    FEPLB_CHECK(c.src_gpu == home, "replica of expert {} installed from GPU {}, not its home {}",
                c.expert, c.src_gpu, home);
    FEPLB_CHECK(c.bytes == shape_.weight_bytes(), "replica install of expert {} has {} bytes",
                c.expert, c.bytes);
    FEPLB_CHECK(resident_[key(c.dst_gpu, c.expert)],
                "replica of expert {} installed on GPU {} is not listed as resident", c.expert,
                c.dst_gpu);
    FEPLB_CHECK(!installed_[key(c.dst_gpu, c.expert)],
                "replica of expert {} installed twice on GPU {}", c.expert, c.dst_gpu);
    installed_[key(c.dst_gpu, c.expert)] = 1;
  }

  // GPU g: no copy to an expert's own home; a guest's rows need its weights and match the rows
  // copied in and back; at most limits.max_guest_experts guests.
  void gpu(int g) {
    int64_t guests = 0;
    for (int e = 0; e < E_; ++e) {
      const size_t k = key(g, e);
      if (g == topo_.home(e)) {
        FEPLB_CHECK(rows_in_[k] == 0 && !has_weights_[k], "expert {} copied to its own home {}", e,
                    g);
        continue;
      }
      // A GPU holding a non-home expert's weights, copied or resident, uses a guest slot (FasterMoE
      // broadcasts weights to GPUs that may have no rows for them); rows there need the weights.
      const bool guest = has_weights_[k] != 0 || resident_[k] != 0;
      FEPLB_CHECK(guest || rows_on_[k] == 0, "GPU {} computes guest expert {} without its weights",
                  g, e);
      FEPLB_CHECK(rows_in_[k] == home_rows_on_[k] && rows_out_[k] == home_rows_on_[k],
                  "expert {} on GPU {}: {} dispatched rows computed, {} copied in, {} copied back",
                  e, g, home_rows_on_[k], rows_in_[k], rows_out_[k]);
      guests += guest ? 1 : 0;
    }
    FEPLB_CHECK(guests <= limits_.max_guest_experts, "GPU {} computes {} guest experts, limit {}",
                g, guests, limits_.max_guest_experts);
  }

  const Plan& plan_;
  const Topology& topo_;
  const RoutingStep& routing_;
  const ExpertShape& shape_;
  const PlanLimits& limits_;
  const int R_, E_;
  const size_t cells_;
  std::vector<int64_t> rows_on_, home_rows_on_;  // [gpu, expert] slice rows; of RowSource::kHome
  std::vector<uint8_t> resident_, has_weights_, installed_;
  std::vector<int64_t> rows_in_, rows_out_;
};

}  // namespace

void validate(const Plan& plan, const Topology& topo, const RoutingStep& routing,
              const ExpertShape& shape, const PlanLimits& limits) {
  PlanChecker(plan, topo, routing, shape, limits).run();
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

namespace {
void put(std::string& out, const char* tag, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %s%a", tag, v);
  out += buf;
}
void put(std::string& out, const char* tag, int64_t v) {
  out += ' ';
  out += tag;
  out += std::to_string(v);
}
}  // namespace

std::string serialize(const Schedule& s) {
  std::string out;
  put(out, "s", s.copy_start_ms);
  for (const CopyTime& c : s.copies) {
    put(out, "c", c.start_ms);
    put(out, "", c.end_ms);
    put(out, "", int64_t{c.timed});
  }
  for (size_t g = 0; g < s.own_ms.size(); ++g) {
    put(out, "g", s.own_ms[g]);
    put(out, "", s.prefetch_ms[g]);
    put(out, "", s.ready_ms[g]);
  }
  for (int b : s.turn_begin) put(out, "tb", int64_t{b});
  for (const OwnerTurn& t : s.turns) {
    put(out, "t", int64_t{t.owner});
    put(out, "", t.lands_ms);
    put(out, "", t.gemm_ms);
    put(out, "", t.wait_ms);
  }
  for (int b : s.helper_begin) put(out, "hb", int64_t{b});
  for (int h : s.helpers) put(out, "h", int64_t{h});
  return out;
}

}  // namespace feplb
