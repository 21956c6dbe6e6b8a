// MoeLayer's public calls: argument checks, then the call's step programs (layer/calls.cc builds
// and runs them; program/ holds the programs and the executor).
#include "feplb/cuda/moe_layer.h"

#include <memory>
#include <vector>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/layer/layer_impl.h"

namespace feplb::cuda {
namespace {

// One call of a runtime at a time: marks it busy, and idle again when the call leaves (also by
// an exception).
class CallGuard {
 public:
  CallGuard(RuntimeState& rt, const char* who) : rt_(rt) {
    FEPLB_REQUIRE_INPUT(!rt_.calls.in_call.exchange(true, std::memory_order_acq_rel),
                        "{}: another call of this runtime is running (calls of one rank's runtime "
                        "must not overlap)",
                        who);
  }
  ~CallGuard() { rt_.calls.in_call.store(false, std::memory_order_release); }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

 private:
  RuntimeState& rt_;
};

// NaN in a failed queued call's outputs (every bit set: a NaN in bf16 and in fp32).
void poison_bf16(bf16* p, int64_t n, cudaStream_t s) {
  if (p && n > 0) FEPLB_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, static_cast<size_t>(n) * 2, s));
}
void poison_f32(float* p, int64_t n, cudaStream_t s) {
  if (p && n > 0) FEPLB_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, static_cast<size_t>(n) * 4, s));
}

// Planners whose plans the GPU layer runs: rows dispatched to the experts' homes (the two-phase
// path), or feplb's, whose one-hop plans send migrated rows straight to their helpers. Every plan
// is checked again by its StepLayout.
bool gpu_runnable(const Planner& planner) {
  return planner.limits().rows_via_homes || planner.name() == "feplb";
}

}  // namespace

std::unique_ptr<Planner> make_gpu_planner(const EpRuntime& runtime, std::string_view policy,
                                          const GemmCostModel* cost) {
  std::unique_ptr<Planner> planner =
      make_planner(policy, gpu_planner_context(runtime.config(), cost));
  FEPLB_REQUIRE_INPUT(gpu_runnable(*planner),
                      "layer: policy '{}' runs in simulation only (its plans keep rows at their "
                      "source or on resident "
                      "replicas; the GPU layer runs static, feplb-paper, feplb and oracle)",
                      policy);
  return planner;
}

MoeLayer::MoeLayer(EpRuntime& runtime, const LayerConfig& config,
                   std::unique_ptr<Planner> planner) {
  const std::shared_ptr<EpRuntime::State>& state = runtime.state_;
  RuntimeState& r = *state;
  r.check_usable("layer");
  FEPLB_REQUIRE_INPUT(planner != nullptr, "layer '{}': no planner", config.name);
  FEPLB_REQUIRE_INPUT(config.top_k >= 1 && config.top_k <= r.cfg.max_top_k,
                      "layer '{}': top_k {}, the runtime's max_top_k is {}", config.name,
                      config.top_k, r.cfg.max_top_k);
  const PlanLimits limits = planner->limits();
  FEPLB_REQUIRE_INPUT(
      gpu_runnable(*planner),
      "layer '{}': planner '{}' runs in simulation only (its plans keep rows at their source or on "
      "resident replicas)",
      config.name, planner->name());
  FEPLB_REQUIRE_INPUT(
      r.world == 1 || r.transport.supports_peer_copies() || limits.max_guest_experts == 0,
      "layer '{}': transport '{}' cannot copy into peers' buffers; use policy static", config.name,
      r.transport.name());
  // feplb compares its modes at its planner's speed on the slowest rank's host (modes named alike:
  // a planner made with other knobs ignores the times).
  planner->set_host_times(r.planner_times);
  impl_ = std::make_unique<Impl>(state, config, std::move(planner));
  Impl& m = *impl_;
  *m.planner_us.get() = 0;  // no plan yet
  m.K = config.top_k;
  m.layer_id = r.next_layer_id++;
  m.capacity.recv_rows = r.recv_cap;
  m.capacity.guest_rows = r.guest_cap;
  m.capacity.guest_slots = r.pool->slots();
  m.capacity.staging_slots = r.cfg.training ? r.pool->staging_slots() : -1;
}

MoeLayer::~MoeLayer() {
  if (impl_) impl_->rt->drain_calls();  // queued calls use the layer
}

const LayerConfig& MoeLayer::config() const { return impl_->cfg; }
std::string_view MoeLayer::policy() const { return impl_->planner->name(); }
int MoeLayer::layer_id() const { return impl_->layer_id; }
const Plan& MoeLayer::last_plan() const {
  impl_->rt->drain_calls();
  impl_->settle_row_counts(/*all=*/true);
  return impl_->last_plan;
}
const RoutingStep& MoeLayer::last_routing() const {
  impl_->rt->drain_calls();
  impl_->settle_row_counts(/*all=*/true);
  return impl_->last_routing;
}
void MoeLayer::refine_gemm_algorithms(double budget_ms) {
  impl_->rt->drain_calls();
  impl_->rt->ffn.gemm.refine(budget_ms);
  if (budget_ms < 0) impl_->rt->ffn.refiner.drain();
}

// GPU times are spans of the forward's timeline.
const ForwardStats& MoeLayer::last_forward_stats() const {
  Impl& m = *impl_;
  m.rt->drain_calls();
  m.settle_row_counts(/*all=*/true);
  if (m.rt->cfg.timing) {
    const Timeline& t = m.forward_timeline;
    ForwardStats& s = m.fstats;
    s.forward_ms = t.ms(Mark::kStart, Mark::kEnd);
    s.dispatch_ms = t.ms(Mark::kStart, Mark::kDispatched);
    s.static_ms = t.ms(Mark::kDispatched, Mark::kStatic);
    const float between = t.waits_ms();
    s.wait_ms = t.ms(Mark::kStatic, Mark::kWaited) + between;
    s.guest_ms = t.ms(Mark::kWaited, Mark::kGuest) - between;
    s.return_ms = t.ms(Mark::kGuest, Mark::kReturned);
    s.combine_ms = t.ms(Mark::kReturned, Mark::kEnd);
    s.gpu_counts_to_first_copy_ms =
        t.gpu_marked(Mark::kFirstCopy) ? t.ms(Mark::kCounts, Mark::kFirstCopy) : 0.0f;
  }
  return m.fstats;
}

const BackwardStats& MoeLayer::last_backward_stats() const {
  Impl& m = *impl_;
  m.rt->drain_calls();
  if (m.rt->cfg.timing) {
    const Timeline& t = m.backward_timeline;
    BackwardStats& s = m.bstats;
    s.backward_ms = t.ms(Mark::kStart, Mark::kEnd);
    s.dispatch_ms = t.ms(Mark::kStart, Mark::kDispatched);
    s.combine_ms = t.ms(Mark::kReturned, Mark::kEnd);
    s.static_ms = t.ms(Mark::kDispatched, Mark::kStatic);
    const float between = t.waits_ms();
    s.wait_ms = t.ms(Mark::kStatic, Mark::kWaited) + between;
    s.guest_ms = t.ms(Mark::kWaited, Mark::kGuest) - between;
    s.results_wait_ms = t.ms(Mark::kGuest, Mark::kReturned);
  }
  return m.bstats;
}

// With the call thread, the wait is a call of its own: the event is recorded by the backwards
// queued before it. Its stream waits only for that event, not for the caller's work (the
// backwards already did).
void MoeLayer::sync_gradients(cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("sync_gradients");
  const bool captured = capture_id(stream, "sync_gradients") != 0;
  if (captured) m.require_capturable("sync_gradients", {}, 0);  // (one rank: an event wait)
  const auto wait = [&m, captured](cudaStream_t s) {
    FEPLB_CUDA_CHECK(
        cudaStreamWaitEvent(s, m.ev_grads_done.get(), captured ? cudaEventWaitExternal : 0));
  };
  if (!r.call_queue) return wait(stream);
  CallGuard guard(r, "sync_gradients");
  r.call_queue->submit(stream, wait, nullptr, /*after_caller=*/false);  // reads nothing of S's
}

void MoeLayer::Impl::validate_experts(std::span<const ExpertParams> w, int64_t num_tokens,
                                      const char* who) const {
  FEPLB_REQUIRE_INPUT(static_cast<int>(w.size()) == rt->experts_per_rank,
                      "{} of layer '{}': weights of {} experts, this rank has {}", who, cfg.name,
                      w.size(), rt->experts_per_rank);
  for (size_t i = 0; i < w.size(); ++i) {
    FEPLB_REQUIRE_INPUT(w[i].gate_up && w[i].down,
                        "{} of layer '{}': local expert {} has a null weight pointer", who,
                        cfg.name, i);
    require_aligned(w[i].gate_up, who, "weights");
    require_aligned(w[i].down, who, "weights");
  }
  FEPLB_REQUIRE_INPUT(num_tokens >= 0 && num_tokens <= rt->cfg.max_tokens,
                      "{} of layer '{}': {} tokens, the runtime's max_tokens is {}", who, cfg.name,
                      num_tokens, rt->cfg.max_tokens);
}

// With the call thread every expert GEMM is grouped, and the grouped GEMMs read their operands by
// TMA: 16-byte aligned (without it, a misaligned batch runs per expert).
void MoeLayer::Impl::require_aligned(const void* p, const char* who, const char* what) const {
  FEPLB_REQUIRE_INPUT(!rt->call_queue || (reinterpret_cast<uintptr_t>(p) & 15) == 0,
                      "{} of layer '{}': {} at {} are not 16-byte aligned, which the runtime's "
                      "call thread needs (its expert GEMMs are grouped)",
                      who, cfg.name, what, p);
}

void MoeLayer::Impl::validate_grads(std::span<const ExpertGrads> grads, const char* who) const {
  FEPLB_REQUIRE_INPUT(static_cast<int>(grads.size()) == rt->experts_per_rank,
                      "{} of layer '{}': gradients of {} experts, this rank has {}", who, cfg.name,
                      grads.size(), rt->experts_per_rank);
  for (size_t i = 0; i < grads.size(); ++i) {
    const ExpertGrads& g = grads[i];
    const bool half = g.bf16_pair();
    FEPLB_REQUIRE_INPUT(
        half ? (g.gate_up_bf16 && g.down_bf16 && !g.gate_up && !g.down) : (g.gate_up && g.down),
        "{} of layer '{}': local expert {} needs both gradient pointers of one "
        "dtype (fp32 or bf16)",
        who, cfg.name, i);
    require_aligned(half ? static_cast<const void*>(g.gate_up_bf16) : g.gate_up, who, "gradients");
    require_aligned(half ? static_cast<const void*>(g.down_bf16) : g.down, who, "gradients");
    FEPLB_REQUIRE_INPUT(half == grads[0].bf16_pair(),
                        "{} of layer '{}': local expert {}'s gradients are {}, expert 0's {}: one "
                        "dtype per call",
                        who, cfg.name, i, half ? "bf16" : "fp32", half ? "fp32" : "bf16");
  }
}

// The state of micro-batch `mb`, which a backward of this layer consumes.
MicroBatchState& MoeLayer::Impl::consumed(MicroBatch& mb, bool dispatched, const char* who) const {
  FEPLB_REQUIRE_INPUT(rt->cfg.training,
                      "{} of layer '{}': the runtime was built without training{}", who, cfg.name,
                      dispatched ? "" : " (RuntimeConfig::training)");
  FEPLB_REQUIRE_INPUT(!mb.rt_ || mb.rt_ == rt,
                      "{} of layer '{}': the micro-batch belongs to another runtime", who,
                      cfg.name);
  MicroBatchState& h = rt->batches.states[mb.checked()];
  if (!dispatched) {
    FEPLB_REQUIRE_INPUT(h.layer_id == layer_id,
                        "{} of layer '{}' (layer {}): the micro-batch is layer {}'s", who, cfg.name,
                        layer_id, h.layer_id);
  } else {
    FEPLB_REQUIRE_INPUT(h.layer_id == layer_id && h.dispatched,
                        "{} of layer '{}' (layer {}): the micro-batch is layer {}'s{}", who,
                        cfg.name, layer_id, h.layer_id,
                        h.dispatched ? "" : ", from forward() (use backward())");
  }
  return h;
}

// Weights before routing. Ordering, per helper h and guest slot: the copies wait for h's
// slots_quiet signal of the last call that used or wrote h's slots (its guests ran, or it waited
// for an earlier prefetch), so they never overwrite weights a guest GEMM still reads; h's next
// call waits for the copies (prefetch_landed) before its guests if it uses them, or before its
// first collective if it drops them, so no later copy into the same slots can overtake them. The
// slot pool's records say which expert each slot holds from here on (backward re-copies).
void MoeLayer::prefetch(std::span<const ExpertParams> experts, cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("prefetch");
  require_uncaptured(stream, "prefetch");
  m.validate_experts(experts, 0, "prefetch");
  CallGuard guard(r, "prefetch");
  m.settle_row_counts(/*all=*/false);
  if (!r.call_queue) return m.run_prefetch(experts, stream);
  r.call_queue->submit(
      stream,
      [&m, w = std::vector<ExpertParams>(experts.begin(), experts.end())](cudaStream_t s) {
        m.run_prefetch(w, s);
      },
      nullptr);
}

MicroBatch MoeLayer::forward(std::span<const ExpertParams> experts, const bf16* hidden,
                             const int32_t* topk_idx, const float* topk_weight, int64_t num_tokens,
                             bf16* out, cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("forward");
  const bool captured = capture_id(stream, "forward") != 0;
  m.validate_experts(experts, num_tokens, "forward");
  FEPLB_REQUIRE_INPUT(num_tokens == 0 || (hidden && topk_idx && topk_weight && out),
                      "forward of layer '{}': a null input or output pointer with {} tokens",
                      m.cfg.name, num_tokens);
  if (captured) m.require_capturable("forward", experts, num_tokens);
  CallGuard guard(r, "forward");
  MicroBatch handle;
  if (!r.call_queue) {
    m.forward_now(handle, experts, hidden, topk_idx, topk_weight, num_tokens, out, stream,
                  captured);
    return handle;
  }
  if (r.cfg.training) m.acquire_batch(handle, num_tokens, /*dispatched=*/false);
  const int slot = handle.slot_;
  const uint64_t generation = handle.generation_;
  r.call_queue->submit(
      stream,
      [&m, w = std::vector<ExpertParams>(experts.begin(), experts.end()), hidden, topk_idx,
       topk_weight, num_tokens, out, slot, generation](cudaStream_t s) {
        MicroBatch on_thread = m.adopt(slot, generation);
        m.forward_now(on_thread, w, hidden, topk_idx, topk_weight, num_tokens, out, s);
        on_thread.slot_ = -1;  // the caller's handle holds the micro-batch
      },
      [out, n = num_tokens * r.H](cudaStream_t s) { poison_bf16(out, n, s); });
  return handle;
}

void MoeLayer::Impl::forward_now(MicroBatch& handle, std::span<const ExpertParams> weights,
                                 const bf16* hidden, const int32_t* topk_idx,
                                 const float* topk_weight, int64_t num_tokens, bf16* out,
                                 cudaStream_t stream, bool captured) {
  Impl& m = *this;
  RuntimeState& r = *rt;
  Bindings b;
  m.start_host(b);
  if (!captured) m.settle_row_counts(/*all=*/false, &m.call_host);  // (event queries: not then)
  b.stream = stream;
  b.captured = captured;
  b.num_tokens = num_tokens;
  b.top_k = static_cast<int>(m.K);
  b.hidden = hidden;
  b.topk_idx = topk_idx;
  b.topk_weight = topk_weight;
  b.out = out;
  b.experts = weights;
  CallFacts f;
  MicroBatchState& h = m.begin_forward(handle, num_tokens, /*dispatched=*/false, b, f);
  m.carve_pairs = num_tokens * m.K;
  if (m.one_rank_runs(weights, num_tokens)) return m.run_forward_one_rank(handle, h, b);
  FEPLB_CHECK(!captured, "layer '{}': a captured forward off the one-rank path", m.cfg.name);
  m.begin_job(h, /*backward=*/false, /*dispatched=*/false, weights);
  m.timed(m.call_host.build_us, [&] { build_forward_prologue(m.prologue, f); });
  m.exec.run(m.prologue, b, m);
  m.check_plan(h, f, b);
  m.carve_plan(h, h.layout.recv_rows(r.rank), /*own_x_home=*/true, stream);
  m.run_forward_body(handle, h, f, b);
}

void MoeLayer::backward(MicroBatch&& mb, std::span<const ExpertParams> experts,
                        const bf16* grad_out, const float* topk_weight, bf16* grad_hidden,
                        float* grad_topk_weight, std::span<const ExpertGrads> grads, GradMode mode,
                        cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("backward");
  const bool captured = capture_id(stream, "backward") != 0;
  MicroBatchState& h = m.consumed(mb, /*dispatched=*/false, "backward");
  if (captured) m.require_capturable("backward", {}, 0);
  FEPLB_REQUIRE_INPUT(
      captured == h.captured,
      "backward of layer '{}': {}; capture a micro-batch's forward and backward both (in one "
      "capture or two), or neither",
      m.cfg.name,
      captured ? "its stream is being captured into a CUDA graph, but its forward was not"
               : "its forward was captured into a CUDA graph (its saved activations are the "
                 "graph's), but this backward is not");
  const int64_t num_tokens = h.num_tokens;
  m.validate_experts(experts, num_tokens, "backward");
  m.validate_grads(grads, "backward");
  FEPLB_REQUIRE_INPUT(
      num_tokens == 0 || (grad_out && topk_weight && grad_hidden && grad_topk_weight),
      "backward of layer '{}': a null input or output pointer with {} tokens", m.cfg.name,
      num_tokens);
  CallGuard guard(r, "backward");
  if (!r.call_queue) {
    return m.backward_now(mb, experts, grad_out, topk_weight, grad_hidden, grad_topk_weight, grads,
                          mode, stream, captured);
  }
  r.call_queue->submit(
      stream,
      [&m, owned = std::make_shared<MicroBatch>(std::move(mb)),
       w = std::vector<ExpertParams>(experts.begin(), experts.end()), grad_out, topk_weight,
       grad_hidden, grad_topk_weight, g = std::vector<ExpertGrads>(grads.begin(), grads.end()),
       mode](cudaStream_t s) {
        m.backward_now(*owned, w, grad_out, topk_weight, grad_hidden, grad_topk_weight, g, mode, s);
      },
      [grad_hidden, grad_topk_weight, n = num_tokens, H = r.H, K = m.K](cudaStream_t s) {
        poison_bf16(grad_hidden, n * H, s);
        poison_f32(grad_topk_weight, n * K, s);
      });
}

void MoeLayer::Impl::backward_now(MicroBatch& mb, std::span<const ExpertParams> weights,
                                  const bf16* grad_out, const float* topk_weight, bf16* grad_hidden,
                                  float* grad_topk_weight, std::span<const ExpertGrads> grads,
                                  GradMode mode, cudaStream_t stream, bool captured) {
  Impl& m = *this;
  MicroBatchState& h = rt->batches.states[mb.checked()];
  const int64_t num_tokens = h.num_tokens;
  Bindings b;
  m.start_host(b);
  if (!captured) m.settle_row_counts(/*all=*/false, &m.call_host);
  b.stream = stream;
  b.captured = captured;
  b.num_tokens = num_tokens;
  b.top_k = static_cast<int>(m.K);
  b.grad_out = grad_out;
  b.topk_weight = topk_weight;
  b.out = grad_hidden;
  b.grad_topk_weight = grad_topk_weight;
  b.experts = weights;
  b.grads = grads;
  m.run_backward(mb, h, mode, b);
}

// Rows a framework dispatched itself: phase 2 and the GEMMs only.
MicroBatch MoeLayer::forward_dispatched(std::span<const ExpertParams> experts, const bf16* rows,
                                        std::span<const int64_t> rows_per_expert, bf16* out_rows,
                                        cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("forward_dispatched");
  require_uncaptured(stream, "forward_dispatched");
  FEPLB_REQUIRE_INPUT(static_cast<int>(rows_per_expert.size()) == r.experts_per_rank,
                      "forward_dispatched of layer '{}': rows of {} experts, this rank has {}",
                      m.cfg.name, rows_per_expert.size(), r.experts_per_rank);
  int64_t n = 0;
  for (size_t i = 0; i < rows_per_expert.size(); ++i) {
    FEPLB_REQUIRE_INPUT(rows_per_expert[i] >= 0 && rows_per_expert[i] <= (int64_t{1} << 30),
                        "forward_dispatched of layer '{}': local expert {} has {} rows", m.cfg.name,
                        i, rows_per_expert[i]);
    n += rows_per_expert[i];
  }
  FEPLB_REQUIRE_INPUT(n <= r.recv_cap,
                      "forward_dispatched of layer '{}': {} rows, over the runtime's receive "
                      "capacity {} (recv_capacity_rows)",
                      m.cfg.name, n, r.recv_cap);
  m.validate_experts(experts, 0, "forward_dispatched");
  FEPLB_REQUIRE_INPUT(n == 0 || (rows && out_rows),
                      "forward_dispatched of layer '{}': a null row pointer with {} "
                      "rows",
                      m.cfg.name, n);
  m.require_aligned(rows, "forward_dispatched", "rows");
  m.require_aligned(out_rows, "forward_dispatched", "rows");
  CallGuard guard(r, "forward_dispatched");
  m.settle_row_counts(/*all=*/false);
  // The caller dispatched the rows: plans that send rows straight to helpers cannot run here. A
  // planner that chooses its path (feplb's default) keeps to two phases from now on; the planner
  // is idle between calls (its last observe() ran before the previous call returned; with the
  // call thread, once the calls queued have run: the layer's first such call waits for them).
  if (!m.keeps_rows_via_homes) {
    r.drain_calls();
    if (!m.planner->limits().rows_via_homes) m.planner->keep_rows_via_homes();
    FEPLB_REQUIRE_INPUT(
        m.planner->limits().rows_via_homes,
        "forward_dispatched of layer '{}': planner '{}' plans rows in one hop (one_hop = 1), "
        "which needs the layer's own dispatch (forward())",
        m.cfg.name, m.planner->name());
    m.keeps_rows_via_homes = true;
  }
  MicroBatch handle;
  if (!r.call_queue) {
    m.forward_dispatched_now(handle, experts, rows, rows_per_expert, n, out_rows, stream);
    return handle;
  }
  m.acquire_batch(handle, n, /*dispatched=*/true);
  const int slot = handle.slot_;
  const uint64_t generation = handle.generation_;
  r.call_queue->submit(
      stream,
      [&m, w = std::vector<ExpertParams>(experts.begin(), experts.end()), rows,
       counts = std::vector<int64_t>(rows_per_expert.begin(), rows_per_expert.end()), n, out_rows,
       slot, generation](cudaStream_t s) {
        MicroBatch on_thread = m.adopt(slot, generation);
        m.forward_dispatched_now(on_thread, w, rows, counts, n, out_rows, s);
        on_thread.slot_ = -1;  // the caller's handle holds the micro-batch
      },
      [out_rows, count = n * r.H](cudaStream_t s) { poison_bf16(out_rows, count, s); });
  return handle;
}

void MoeLayer::Impl::forward_dispatched_now(MicroBatch& handle,
                                            std::span<const ExpertParams> weights, const bf16* rows,
                                            std::span<const int64_t> counts, int64_t n,
                                            bf16* out_rows, cudaStream_t stream) {
  Impl& m = *this;
  Bindings b;
  m.start_host(b);
  b.stream = stream;
  b.caller_in = rows;
  b.caller_out = out_rows;
  b.experts = weights;
  CallFacts f;
  // A pending prefetch is settled as in forward(): used by this layer, dropped by another.
  MicroBatchState& h = m.begin_forward(handle, n, /*dispatched=*/true, b, f);
  m.rows_per_expert = counts;
  m.begin_job(h, /*backward=*/false, /*dispatched=*/true, weights);
  m.timed(m.call_host.build_us, [&] { build_forward_prologue(m.prologue, f); });
  m.exec.run(m.prologue, b, m);
  m.check_plan(h, f, b);
  m.carve_plan(h, n, /*own_x_home=*/false, stream);
  h.x_home = const_cast<bf16*>(rows);  // the caller's, read only
  m.run_forward_body(handle, h, f, b);
}

void MoeLayer::backward_dispatched(MicroBatch&& mb, std::span<const ExpertParams> experts,
                                   const bf16* grad_out_rows, bf16* grad_rows,
                                   std::span<const ExpertGrads> grads, GradMode mode,
                                   cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("backward_dispatched");
  require_uncaptured(stream, "backward_dispatched");
  MicroBatchState& h = m.consumed(mb, /*dispatched=*/true, "backward_dispatched");
  const int64_t n = h.num_tokens;
  m.validate_experts(experts, 0, "backward_dispatched");
  m.validate_grads(grads, "backward_dispatched");
  FEPLB_REQUIRE_INPUT(n == 0 || (grad_out_rows && grad_rows),
                      "backward_dispatched of layer '{}': a null row pointer with {} rows",
                      m.cfg.name, n);
  m.require_aligned(grad_out_rows, "backward_dispatched", "rows");
  m.require_aligned(grad_rows, "backward_dispatched", "rows");
  CallGuard guard(r, "backward_dispatched");
  if (!r.call_queue) {
    return m.backward_dispatched_now(mb, experts, grad_out_rows, grad_rows, grads, mode, stream);
  }
  r.call_queue->submit(
      stream,
      [&m, owned = std::make_shared<MicroBatch>(std::move(mb)),
       w = std::vector<ExpertParams>(experts.begin(), experts.end()), grad_out_rows, grad_rows,
       g = std::vector<ExpertGrads>(grads.begin(), grads.end()), mode](cudaStream_t s) {
        m.backward_dispatched_now(*owned, w, grad_out_rows, grad_rows, g, mode, s);
      },
      [grad_rows, count = n * r.H](cudaStream_t s) { poison_bf16(grad_rows, count, s); });
}

void MoeLayer::Impl::backward_dispatched_now(MicroBatch& mb, std::span<const ExpertParams> weights,
                                             const bf16* grad_out_rows, bf16* grad_rows,
                                             std::span<const ExpertGrads> grads, GradMode mode,
                                             cudaStream_t stream) {
  Impl& m = *this;
  MicroBatchState& h = rt->batches.states[mb.checked()];
  Bindings b;
  m.start_host(b);
  m.settle_row_counts(/*all=*/false, &m.call_host);
  b.stream = stream;
  b.caller_in = grad_out_rows;
  b.caller_out = grad_rows;
  b.experts = weights;
  b.grads = grads;
  // A pending prefetch is dropped, as in backward().
  m.run_backward(mb, h, mode, b);
}

}  // namespace feplb::cuda
