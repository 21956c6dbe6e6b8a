#include "feplb/core/planners/feplb/level_time.h"

#include <algorithm>

#include "feplb/core/planners/feplb/bisect.h"

namespace feplb::feplb_detail {
namespace {

// The most hand-backs per domain and plan.
constexpr int kMaxLevelMoves = 64;

}  // namespace

void TimeLeveller::level(const FeplbConfig& mode, const LoadMeasure& measure, int64_t row_budget,
                         Plan& out) {
  mode_ = &mode;
  measure_ = &measure;
  index_slices(out.slices);
  bool moved = false;
  for (int dom = 0; dom < ctx_.topo.num_domains(); ++dom) level_domain(dom, row_budget, out, moved);
  if (!moved) return;
  follow_slices(out);
  if (!no_copy_lands_later(before_, out)) out = before_;
}

double TimeLeveller::gemm_straggler_ms(const LoadMeasure& measure, const Plan& plan) {
  const int R = ctx_.topo.num_ranks();
  straggler_ms_.assign(static_cast<size_t>(R), 0.0);
  for (const Slice& sl : plan.slices) straggler_ms_[sl.gpu] += measure.gemm_ms(sl.rows);
  double most = 0.0, sum = 0.0;
  for (const double ms : straggler_ms_) {
    most = std::max(most, ms);
    sum += ms;
  }
  return most - sum / R;
}

void TimeLeveller::index_slices(const std::vector<Slice>& slices) {
  const Topology& topo = ctx_.topo;
  const int E = topo.num_experts(), R = topo.num_ranks();
  const size_t n = slices.size();
  level_ms_.assign(static_cast<size_t>(R), 0.0);
  level_rows_.assign(static_cast<size_t>(R), 0);
  home_slice_.assign(static_cast<size_t>(E), -1);
  for (size_t i = 0; i < n; ++i) {
    const Slice& sl = slices[i];
    level_ms_[sl.gpu] += gemm_ms(sl.rows);
    level_rows_[sl.gpu] += sl.rows;
    if (topo.home(sl.expert) == sl.gpu) home_slice_[sl.expert] = static_cast<int>(i);
  }
  // The guest slices (not at home, their expert has a slice at home), counted by GPU and by
  // expert: gpu_begin_[g + 1], expert_begin_[e + 1].
  guest_.resize(n);
  gpu_begin_.assign(static_cast<size_t>(R) + 1, 0);
  expert_begin_.assign(static_cast<size_t>(E) + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const Slice& sl = slices[i];
    guest_[i] = topo.home(sl.expert) != sl.gpu && home_slice_[sl.expert] >= 0;
    gpu_begin_[sl.gpu + 1] += guest_[i];
    expert_begin_[sl.expert + 1] += guest_[i];
  }
  for (int g = 0; g < R; ++g) gpu_begin_[g + 1] += gpu_begin_[g];
  for (int e = 0; e < E; ++e) expert_begin_[e + 1] += expert_begin_[e];
  // Bucketed in slice order (counting sort): begin[key] .. begin[key + 1] in the index.
  gpu_slice_.resize(static_cast<size_t>(gpu_begin_[R]));
  expert_slice_.resize(static_cast<size_t>(expert_begin_[E]));
  fill_.assign(gpu_begin_.begin(), gpu_begin_.end() - 1);
  expert_fill_.assign(expert_begin_.begin(), expert_begin_.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    if (!guest_[i]) continue;
    gpu_slice_[static_cast<size_t>(fill_[slices[i].gpu]++)] = static_cast<int>(i);
    expert_slice_[static_cast<size_t>(expert_fill_[slices[i].expert]++)] = static_cast<int>(i);
  }
}

void TimeLeveller::level_domain(int dom, int64_t row_budget, Plan& out, bool& moved) {
  const Topology& topo = ctx_.topo;
  const int first = topo.first_gpu_of_domain(dom), n = topo.domain_size();
  std::vector<Slice>& slices = out.slices;
  int64_t dom_rows = 0;
  for (int g = first; g < first + n; ++g) dom_rows += level_rows_[g];
  const int64_t row_cap = dom_rows / n + row_budget;
  for (int iter = 0; iter < std::min(4 * n, kMaxLevelMoves); ++iter) {
    // The domain's three largest times (GPU M the largest).
    int top[3] = {-1, -1, -1};
    for (int g = first; g < first + n; ++g) {
      for (int t = 0; t < 3; ++t) {
        if (top[t] < 0 || level_ms_[g] > level_ms_[top[t]]) {
          for (int u = 2; u > t; --u) top[u] = top[u - 1];
          top[t] = g;
          break;
        }
      }
    }
    const Move best = best_move(slices, top, row_cap);
    if (best.from < 0) break;
    if (!moved) before_ = out;  // copied, not swapped: no allocation once warm
    const int M = top[0];
    Slice& fs = slices[static_cast<size_t>(best.from)];
    Slice& ts = slices[static_cast<size_t>(best.to)];
    level_ms_[M] += gemm_ms(fs.rows - best.rows) - gemm_ms(fs.rows);
    level_ms_[ts.gpu] += gemm_ms(ts.rows + best.rows) - gemm_ms(ts.rows);
    level_rows_[M] -= best.rows;
    level_rows_[ts.gpu] += best.rows;
    fs.rows -= best.rows;
    ts.rows += best.rows;
    moved = true;
  }
}

TimeLeveller::Move TimeLeveller::best_move(const std::vector<Slice>& slices, const int (&top)[3],
                                           int64_t row_cap) const {
  const int M = top[0];
  Move best{level_ms_[M]};
  // M's guest slices back to their homes, or (rows in one hop) on to the expert's other helpers.
  for (int i = gpu_begin_[M]; i < gpu_begin_[M + 1]; ++i) {
    const int gs = gpu_slice_[static_cast<size_t>(i)];
    const Slice& sl = slices[static_cast<size_t>(gs)];
    consider(slices, top, row_cap, gs, home_slice_[sl.expert], best);
    if (sl.source != RowSource::kDispatched) continue;
    for (int j = expert_begin_[sl.expert]; j < expert_begin_[sl.expert + 1]; ++j) {
      const int os = expert_slice_[static_cast<size_t>(j)];
      const Slice& o = slices[static_cast<size_t>(os)];
      if (o.gpu != M && o.source == RowSource::kDispatched)
        consider(slices, top, row_cap, gs, os, best);
    }
  }
  // M's own rows on to the helpers its experts' rows reach in one hop (no copy grows).
  for (const int e : ctx_.topo.local_experts(M)) {
    if (home_slice_[e] < 0) continue;
    for (int i = expert_begin_[e]; i < expert_begin_[e + 1]; ++i) {
      const int gs = expert_slice_[static_cast<size_t>(i)];
      if (slices[static_cast<size_t>(gs)].source == RowSource::kDispatched)
        consider(slices, top, row_cap, home_slice_[e], gs, best);
    }
  }
  return best;
}

void TimeLeveller::consider(const std::vector<Slice>& slices, const int (&top)[3], int64_t row_cap,
                            int from, int to, Move& best) const {
  const int M = top[0];
  const Slice& fs = slices[static_cast<size_t>(from)];
  const Slice& ts = slices[static_cast<size_t>(to)];
  const int g = ts.gpu;
  if (fs.rows == 0 || ts.rows == 0) return;  // a slice given up
  const int64_t room = row_cap - level_rows_[g];
  double other = 0;  // the largest time but M's and g's
  for (const int t : top) {
    if (t >= 0 && t != M && t != g) {
      other = level_ms_[t];
      break;
    }
  }
  const auto m_ms = [&](int64_t r) {
    return level_ms_[M] - gemm_ms(fs.rows) + gemm_ms(fs.rows - r);
  };
  const auto g_ms = [&](int64_t r) {
    return level_ms_[g] - gemm_ms(ts.rows) + gemm_ms(ts.rows + r);
  };
  const auto offer = [&](int64_t r) {
    const double top_ms = std::max({m_ms(r), g_ms(r), other});
    if (top_ms < best.top_ms - 1e-9) best = {top_ms, from, to, r};
  };
  // A guest slice may go whole (its GEMM, fixed cost included, leaves M).
  if (ctx_.topo.home(fs.expert) != M && fs.rows <= room) offer(fs.rows);
  const int64_t a = mode_->slice_align_rows;
  const int64_t most = std::min(fs.rows - mode_->min_slice_rows, room) / a;
  if (most <= 0) return;
  // Where g's time passes M's: the best part is there or one step before.
  const int64_t cross =
      first_true(1, most + 1, [&](int64_t q) { return g_ms(q * a) >= m_ms(q * a); });
  if (cross > 1) offer((cross - 1) * a);
  if (cross <= most) offer(cross * a);
}

void TimeLeveller::follow_slices(Plan& out) const {
  std::vector<Slice>& slices = out.slices;
  size_t w = 0;
  for (size_t c = 0; c < out.copies.size(); ++c) {
    Copy& cp = out.copies[c];
    const bool rows = cp.kind == CopyKind::kTokenRows || cp.kind == CopyKind::kOutputRows;
    if (rows || cp.kind == CopyKind::kWeights) {
      const int helper = cp.kind == CopyKind::kOutputRows ? cp.src_gpu : cp.dst_gpu;
      for (int i = gpu_begin_[helper]; i < gpu_begin_[helper + 1]; ++i) {
        const Slice& sl = slices[static_cast<size_t>(gpu_slice_[i])];
        if (sl.expert != cp.expert) continue;
        if (sl.rows == 0) cp.bytes = -1;  // dropped below
        if (rows && sl.rows > 0) {
          cp.rows = sl.rows;
          cp.bytes = sl.rows * ctx_.shape.row_bytes();
        }
      }
    }
    if (cp.bytes >= 0) out.copies[w++] = cp;
  }
  out.copies.resize(w);
  std::erase_if(slices, [](const Slice& sl) { return sl.rows == 0; });
}

bool TimeLeveller::no_copy_lands_later(const Plan& before, const Plan& after) {
  const Knobs& k = ctx_.knobs;
  const double start_ms = planned_copy_start_ms(before, k, ctx_.topo);
  const auto was = copy_timer_.time(before, ctx_.topo, k, start_ms);
  before_end_ms_.resize(was.size());
  for (size_t i = 0; i < was.size(); ++i) before_end_ms_[i] = was[i].timed ? was[i].end_ms : 0.0;
  const auto now = copy_timer_.time(after, ctx_.topo, k, start_ms);
  size_t j = 0;
  for (size_t i = 0; i < now.size(); ++i, ++j) {
    const Copy& c = after.copies[i];
    const auto same = [&](const Copy& b) {
      return b.kind == c.kind && b.expert == c.expert && b.src_gpu == c.src_gpu &&
             b.dst_gpu == c.dst_gpu;
    };
    while (j < before.copies.size() && !same(before.copies[j])) ++j;
    if (j == before.copies.size()) return false;  // not a subsequence: keep the plan as it was
    if (now[i].timed && now[i].end_ms > before_end_ms_[j] + 1e-12) return false;
  }
  return true;
}

}  // namespace feplb::feplb_detail
