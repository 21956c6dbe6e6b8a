// The layer on one rank: nothing to exchange or balance, so nothing the call itself must know of
// its routing. Its rows are counted, placed and multiplied on the GPU (build_forward_one_rank,
// kCountedGemm) and the caller's thread never waits for the counts; they reach the host through
// a small pinned ring that later calls settle: the routing and plan of each forward, and the error
// of expert ids out of range.
#include <algorithm>
#include <chrono>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/spin_wait.h"
#include "feplb/cuda/layer/layer_impl.h"

namespace feplb::cuda {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool MoeLayer::Impl::one_rank_runs(std::span<const ExpertParams> w, int64_t num_tokens) const {
  const RuntimeState& r = *rt;
  if (r.world != 1 || !r.ffn.grouped || r.calls.pending.active) return false;
  if (r.experts_per_rank > kernels::kFfnItemsPerLaunch) return false;
  if (r.cfg.expert_gemm != ExpertGemm::kGrouped &&
      !GroupedFfn::faster_than_per_expert(r.H, r.F, num_tokens * K, r.experts_per_rank))
    return false;
  return std::all_of(w.begin(), w.end(), [](const ExpertParams& p) {
    return aligned16(p.gate_up) && aligned16(p.down);
  });
}

void MoeLayer::Impl::run_forward_one_rank(MicroBatch& handle, MicroBatchState& h, Bindings& b) {
  RuntimeState& r = *rt;
  if (row_counts.empty()) {
    row_counts.resize(kRowCountRing);
    for (RowCounts& c : row_counts) c.counts = PinnedBuffer<int32_t>(static_cast<size_t>(r.E + 1));
  }
  h.one_rank = true;
  h.stats = ForwardStats{};
  timed(call_host.build_us, [&] { build_forward_one_rank(body); });
  exec.run(body, b, *this);
  fstats = ForwardStats{};  // the counts' part comes when the layer settles this forward
  fstats.host = finish_host();
  if (!r.cfg.training) handle.release();  // forward only: nothing to keep
}

void MoeLayer::Impl::run_backward_one_rank(MicroBatch& mb, MicroBatchState& h, GradMode mode,
                                           Bindings& b) {
  RuntimeState& r = *rt;
  for (const ExpertGrads& g : b.grads) {
    const bool f32 = !g.bf16_pair();
    FEPLB_REQUIRE_INPUT(
        f32 ? aligned16(g.gate_up) && aligned16(g.down)
            : aligned16(g.gate_up_bf16) && aligned16(g.down_bf16),
        "backward of layer '{}': its forward ran grouped GEMMs on one rank, which need "
        "16-byte aligned gradients",
        cfg.name);
  }
  b.call = r.board->next_call();
  b.mb = &h;
  bstats = BackwardStats{};
  timed(call_host.build_us, [&] { build_backward_one_rank(body, mode == GradMode::kOverwrite); });
  exec.run(body, b, *this);
  r.release(mb.slot_, mb.generation_, b.stream);
  mb.release();
  bstats.host = finish_host();
}

// HostAction::kStageRowCounts: the forward's rows per expert (and out-of-range pairs) into the
// ring's next entry; settle_row_counts made room at the call's start.
void MoeLayer::Impl::stage_row_counts(const Bindings& b) {
  RuntimeState& r = *rt;
  FEPLB_CHECK(row_counts_pending < row_counts.size(), "layer '{}': row-count ring full", cfg.name);
  RowCounts& c = row_counts[(row_counts_head + row_counts_pending) % row_counts.size()];
  const MicroBatchState& h = *b.mb;
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(c.counts.get(), h.expert_rows,
                                   static_cast<size_t>(r.E + 1) * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, b.stream));
  c.copied.record(b.stream);
  c.seq = h.forward_seq;
  c.pairs = b.num_tokens * b.top_k;
  c.slot = static_cast<int>(&h - r.batches.states.data());
  c.generation = h.generation;
  ++row_counts_pending;
}

void MoeLayer::Impl::settle_row_counts(bool all, HostTimes* t) {
  const auto start = Clock::now();
  double waited_us = 0;
  settle_ring(all, waited_us);
  if (!t) return;
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  t->await_us += waited_us;
  t->hooks_us += us - waited_us;
}

void MoeLayer::Impl::settle_ring(bool all, double& waited_us) {
  const RuntimeState& r = *rt;
  while (row_counts_pending > 0) {
    const RowCounts& c = row_counts[row_counts_head];
    if (all || row_counts_pending == row_counts.size()) {
      const auto t0 = Clock::now();
      const auto deadline = Clock::now() + std::chrono::duration<double>(r.cfg.timeout_s);
      for (uint64_t spins = 0;; ++spins) {
        const cudaError_t q = cudaEventQuery(c.copied.get());
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) FEPLB_CUDA_CHECK(q);
        if ((spins & 1023) == 0 && Clock::now() > deadline) {
          throw Error(
              fmt::format("layer '{}': the counts of its forward (call {}) never reached "
                          "the host in {:.0f} s",
                          cfg.name, c.seq, r.cfg.timeout_s));
        }
        spin_pause(spins);
      }
      waited_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    } else {
      const cudaError_t q = cudaEventQuery(c.copied.get());
      if (q == cudaErrorNotReady) return;
      FEPLB_CUDA_CHECK(q);
    }
    row_counts_head = (row_counts_head + 1) % row_counts.size();
    --row_counts_pending;
    settle(c);
  }
}

// One forward's counts on the host: its routing and its plan, which on one rank is every expert's
// rows at home (the planner does not plan: there is nothing to balance, nor to learn for later;
// it writes the plan's schedule, as for every plan).
void MoeLayer::Impl::settle(const RowCounts& c) {
  RuntimeState& r = *rt;
  const int E = static_cast<int>(r.E);
  const int32_t* counts = c.counts.get();
  int64_t counted = 0;
  for (int e = 0; e < E; ++e) counted += counts[e];
  const int64_t bad = counts[E];
  FEPLB_CHECK(counted + bad == c.pairs, "layer '{}': counted {} rows, expected tokens * top_k = {}",
              cfg.name, counted + bad, c.pairs);
  if (bad > 0) {
    throw InputError(fmt::format(
        "forward of layer '{}' (call {}): rank 0 routed {} (token, k) pairs to expert ids outside "
        "[0, {}) (topk_idx out of range); that forward left them out. On one rank the layer counts "
        "on the GPU and reports this at its next call",
        cfg.name, c.seq, bad, E));
  }
  RoutingStep& routing = last_routing;
  if (routing.num_ranks != 1 || routing.num_experts != E) routing = RoutingStep(0, 0, 1, E);
  routing.step = static_cast<int>(c.seq);
  routing.layer = layer_id;
  std::copy(counts, counts + E, routing.counts.begin());
  routing.sum_experts();
  last_plan.clear(E);
  for (int e = 0; e < E; ++e) {
    if (counts[e] > 0) last_plan.slices.push_back({e, 0, counts[e], RowSource::kHome});
  }
  last_plan.mode = "one rank";
  planner->write_schedule(last_plan);
  std::lock_guard<std::mutex> lock(r.batches.mu);
  MicroBatchState& h = r.batches.states[static_cast<size_t>(c.slot)];
  if (h.in_use && h.generation == c.generation) {
    h.routing = routing;
    h.plan = last_plan;
  }
}

}  // namespace feplb::cuda
