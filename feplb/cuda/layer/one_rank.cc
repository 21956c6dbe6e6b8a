// The layer on one rank: nothing to exchange or balance, so nothing the call itself must know of
// its routing. Its rows are counted, placed and multiplied on the GPU (build_forward_one_rank,
// kCountedGemm) and the caller's thread never waits for the counts; they reach the host through
// a small pinned ring that later calls settle: the routing and plan of each forward, and the error
// of expert ids out of range. Nothing in such a call waits on the host, so it can be captured into
// a CUDA graph: a captured forward hands its counts to the layer through a captured host node
// instead (CaptureSink), at every replay.
#include <algorithm>
#include <chrono>
#include <mutex>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/spin_wait.h"
#include "feplb/cuda/layer/layer_impl.h"

namespace feplb::cuda {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

// Where the replays of a layer's captured forwards leave their rows per expert. The host nodes
// write it on CUDA's callback thread, the layer's calls read it: everything under `mu`. The pinned
// block is the layer's to free; a sink that outlives its layer (graphs still hold captured
// forwards) leaves it to the process, since a user object's destructor may not call CUDA.
struct CaptureSink {
  std::mutex mu;
  int32_t* pinned = nullptr;  // [kCapturedForwards, stride]: each captured forward's D2H target
  size_t stride = 0;          // E + 1
  std::vector<int> free_slots;
  std::vector<int32_t> latest;  // [stride] the latest replay's counts
  int64_t latest_pairs = 0;
  uint32_t latest_seq = 0;  // its forward's call number when it was captured
  uint64_t replays = 0, settled = 0;
  std::vector<int32_t> taken;  // the caller's copy of `latest` (settle_captured)
};

namespace {

// One captured forward, owned by its graph (a CUDA user object): its slot of the pinned block.
struct CapturedForward {
  std::shared_ptr<CaptureSink> sink;
  int slot = 0;
  int64_t pairs = 0;
  uint32_t seq = 0;
};

// The captured host node, at every replay once the counts' copy is done (CUDA's callback thread:
// no CUDA call).
void CUDART_CB captured_counts_arrived(void* p) {
  const auto& c = *static_cast<const CapturedForward*>(p);
  CaptureSink& s = *c.sink;
  std::lock_guard<std::mutex> lock(s.mu);
  const int32_t* counts = s.pinned + static_cast<size_t>(c.slot) * s.stride;
  std::copy(counts, counts + s.stride, s.latest.begin());
  s.latest_pairs = c.pairs;
  s.latest_seq = c.seq;
  ++s.replays;
}

// The user object's destructor, once the graph and its instances are gone: the slot is free again.
void CUDART_CB captured_forward_dropped(void* p) {
  auto* c = static_cast<CapturedForward*>(p);
  {
    std::lock_guard<std::mutex> lock(c->sink->mu);
    c->sink->free_slots.push_back(c->slot);
  }
  delete c;
}

}  // namespace

void MoeLayer::Impl::make_capture_sink() {
  auto s = std::make_shared<CaptureSink>();
  s->stride = static_cast<size_t>(rt->E + 1);
  FEPLB_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&s->pinned),
                                 kCapturedForwards * s->stride * sizeof(int32_t),
                                 cudaHostAllocDefault));
  for (int i = kCapturedForwards - 1; i >= 0; --i) s->free_slots.push_back(i);
  s->latest.assign(s->stride, 0);
  capture_sink = std::move(s);
}

MoeLayer::Impl::~Impl() {
  if (capture_sink && capture_sink.use_count() == 1)
    FEPLB_CUDA_WARN(cudaFreeHost(capture_sink->pinned));
}

void MoeLayer::Impl::require_capturable(const char* who, std::span<const ExpertParams> w,
                                        int64_t num_tokens) const {
  const RuntimeState& r = *rt;
  const char* why = nullptr;
  if (r.world != 1) {
    why =
        "its runtime has several ranks, whose calls wait on the host for the routing counts and "
        "the plan";
  } else if (r.call_queue) {
    why = "its runtime runs its calls on the call thread";
  } else if (!r.ffn.grouped) {
    why =
        "its expert GEMMs are cuBLAS calls per expert, which take their row counts from the "
        "host (the grouped GEMMs that read them on the GPU need an H100 or H200)";
  } else if (!w.empty() && !one_rank_runs(w, num_tokens)) {
    why =
        "this forward's expert GEMMs take their row counts from the host (a captured forward "
        "needs the grouped GEMMs for its batch: expert_gemm 'grouped', or 'auto' where it picks "
        "them; 16-byte aligned weights)";
  }
  if (!why && !w.empty()) {
    std::lock_guard<std::mutex> lock(capture_sink->mu);
    if (capture_sink->free_slots.empty()) {
      throw InputError(fmt::format(
          "{} of layer '{}': {} captured forwards of this layer are held by CUDA graphs that still "
          "exist, the most it keeps; destroy some of those graphs first",
          who, cfg.name, kCapturedForwards));
    }
  }
  if (why) {
    throw InputError(fmt::format(
        "{} of layer '{}': its stream is being captured into a CUDA graph, and this call cannot "
        "be: {}; call it outside the capture",
        who, cfg.name, why));
  }
}

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
  if (!b.captured && row_counts.empty()) {  // (a captured forward uses the capture sink)
    row_counts.resize(kRowCountRing);
    for (RowCounts& c : row_counts) c.counts = PinnedBuffer<int32_t>(static_cast<size_t>(r.E + 1));
  }
  h.one_rank = true;
  h.captured = b.captured;
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
  b.captured = h.captured;  // (the caller checked that the backward's stream is captured too)
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

// A captured forward (HostAction::kStageRowCounts while capturing): a slot of the sink for its
// counts, owned by the graph from here on; at every replay the counts' copy, then the host node.
void MoeLayer::Impl::stage_captured_counts(const Bindings& b) {
  CaptureSink& s = *capture_sink;
  int slot = -1;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    FEPLB_CHECK(!s.free_slots.empty(), "layer '{}': no capture slot left", cfg.name);
    slot = s.free_slots.back();
    s.free_slots.pop_back();
  }
  auto* c = new CapturedForward{capture_sink, slot, b.num_tokens * b.top_k, b.mb->forward_seq};
  cudaUserObject_t obj = nullptr;
  const cudaError_t made =
      cudaUserObjectCreate(&obj, c, captured_forward_dropped, 1, cudaUserObjectNoDestructorSync);
  if (made != cudaSuccess) {
    captured_forward_dropped(c);
    FEPLB_CUDA_CHECK(made);
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  cudaError_t kept = cudaStreamGetCaptureInfo(b.stream, &status, nullptr, &graph);
  if (kept == cudaSuccess) kept = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove);
  if (kept != cudaSuccess) {
    FEPLB_CUDA_WARN(cudaUserObjectRelease(obj, 1));
    FEPLB_CUDA_CHECK(kept);
  }
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(s.pinned + static_cast<size_t>(slot) * s.stride,
                                   b.mb->expert_rows, s.stride * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, b.stream));
  FEPLB_CUDA_CHECK(cudaLaunchHostFunc(b.stream, captured_counts_arrived, c));
}

// The latest replay's counts, where one came since the last settled (the caller's thread).
void MoeLayer::Impl::settle_captured() {
  if (!capture_sink) return;
  CaptureSink& s = *capture_sink;
  int64_t pairs = 0;
  uint32_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.settled == s.replays) return;
    s.settled = s.replays;
    s.taken.assign(s.latest.begin(), s.latest.end());
    pairs = s.latest_pairs;
    seq = s.latest_seq;
  }
  settle_counts(s.taken.data(), pairs, seq);
}

void MoeLayer::Impl::settle_row_counts(bool all, HostTimes* t) {
  const auto start = Clock::now();
  double waited_us = 0;
  settle_captured();
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
  settle_counts(c.counts.get(), c.pairs, c.seq);
  std::lock_guard<std::mutex> lock(r.batches.mu);
  MicroBatchState& h = r.batches.states[static_cast<size_t>(c.slot)];
  if (h.in_use && h.generation == c.generation) {
    h.routing = last_routing;
    h.plan = last_plan;
  }
}

void MoeLayer::Impl::settle_counts(const int32_t* counts, int64_t pairs, uint32_t seq) {
  RuntimeState& r = *rt;
  const int E = static_cast<int>(r.E);
  int64_t counted = 0;
  for (int e = 0; e < E; ++e) counted += counts[e];
  const int64_t bad = counts[E];
  FEPLB_CHECK(counted + bad == pairs, "layer '{}': counted {} rows, expected tokens * top_k = {}",
              cfg.name, counted + bad, pairs);
  if (bad > 0) {
    throw InputError(fmt::format(
        "forward of layer '{}' (call {}): rank 0 routed {} (token, k) pairs to expert ids outside "
        "[0, {}) (topk_idx out of range); that forward left them out. On one rank the layer counts "
        "on the GPU and reports this at its next call (for a forward in a CUDA graph, the next "
        "call after the replay)",
        cfg.name, seq, bad, E));
  }
  RoutingStep& routing = last_routing;
  if (routing.num_ranks != 1 || routing.num_experts != E) routing = RoutingStep(0, 0, 1, E);
  routing.step = static_cast<int>(seq);
  routing.layer = layer_id;
  std::copy(counts, counts + E, routing.counts.begin());
  routing.sum_experts();
  last_plan.clear(E);
  for (int e = 0; e < E; ++e) {
    if (counts[e] > 0) last_plan.slices.push_back({e, 0, counts[e], RowSource::kHome});
  }
  last_plan.mode = "one rank";
  planner->write_schedule(last_plan);
}

}  // namespace feplb::cuda
