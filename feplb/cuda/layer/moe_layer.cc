// MoeLayer's public calls: argument checks, then the call's step programs (layer/calls.cc builds
// and runs them; program/ holds the programs and the executor).
#include "feplb/cuda/moe_layer.h"

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

MoeLayer::~MoeLayer() = default;

const LayerConfig& MoeLayer::config() const { return impl_->cfg; }
std::string_view MoeLayer::policy() const { return impl_->planner->name(); }
int MoeLayer::layer_id() const { return impl_->layer_id; }
const Plan& MoeLayer::last_plan() const {
  impl_->settle_row_counts(/*all=*/true);
  return impl_->last_plan;
}
const RoutingStep& MoeLayer::last_routing() const {
  impl_->settle_row_counts(/*all=*/true);
  return impl_->last_routing;
}
void MoeLayer::refine_gemm_algorithms(double budget_ms) {
  impl_->rt->ffn.gemm.refine(budget_ms);
  if (budget_ms < 0) impl_->rt->ffn.refiner.drain();
}

// GPU times are spans of the forward's timeline.
const ForwardStats& MoeLayer::last_forward_stats() const {
  Impl& m = *impl_;
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

void MoeLayer::sync_gradients(cudaStream_t stream) {
  impl_->rt->check_usable("sync_gradients");
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, impl_->ev_grads_done.get(), 0));
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
  }
  FEPLB_REQUIRE_INPUT(num_tokens >= 0 && num_tokens <= rt->cfg.max_tokens,
                      "{} of layer '{}': {} tokens, the runtime's max_tokens is {}", who, cfg.name,
                      num_tokens, rt->cfg.max_tokens);
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
  m.validate_experts(experts, 0, "prefetch");
  CallGuard guard(r, "prefetch");
  m.settle_row_counts(/*all=*/false);
  m.run_prefetch(experts, stream);
}

MicroBatch MoeLayer::forward(std::span<const ExpertParams> experts, const bf16* hidden,
                             const int32_t* topk_idx, const float* topk_weight, int64_t num_tokens,
                             bf16* out, cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("forward");
  m.validate_experts(experts, num_tokens, "forward");
  FEPLB_REQUIRE_INPUT(num_tokens == 0 || (hidden && topk_idx && topk_weight && out),
                      "forward of layer '{}': a null input or output pointer with {} tokens",
                      m.cfg.name, num_tokens);
  CallGuard guard(r, "forward");
  MicroBatch handle;
  Bindings b;
  m.start_host(b);
  m.settle_row_counts(/*all=*/false, &m.call_host);
  b.stream = stream;
  b.num_tokens = num_tokens;
  b.top_k = static_cast<int>(m.K);
  b.hidden = hidden;
  b.topk_idx = topk_idx;
  b.topk_weight = topk_weight;
  b.out = out;
  b.experts = experts;
  CallFacts f;
  MicroBatchState& h = m.begin_forward(handle, num_tokens, /*dispatched=*/false, b, f);
  m.carve_pairs = num_tokens * m.K;
  if (m.one_rank_runs(experts, num_tokens)) {
    m.run_forward_one_rank(handle, h, b);
    return handle;
  }
  m.begin_job(h, /*backward=*/false, /*dispatched=*/false, experts);
  m.timed(m.call_host.build_us, [&] { build_forward_prologue(m.prologue, f); });
  m.exec.run(m.prologue, b, m);
  m.check_plan(h, f, b);
  m.carve_plan(h, h.layout.recv_rows(r.rank), /*own_x_home=*/true, stream);
  m.run_forward_body(handle, h, f, b);
  return handle;
}

void MoeLayer::backward(MicroBatch&& mb, std::span<const ExpertParams> experts,
                        const bf16* grad_out, const float* topk_weight, bf16* grad_hidden,
                        float* grad_topk_weight, std::span<const ExpertGrads> grads, GradMode mode,
                        cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("backward");
  MicroBatchState& h = m.consumed(mb, /*dispatched=*/false, "backward");
  const int64_t num_tokens = h.num_tokens;
  m.validate_experts(experts, num_tokens, "backward");
  m.validate_grads(grads, "backward");
  FEPLB_REQUIRE_INPUT(
      num_tokens == 0 || (grad_out && topk_weight && grad_hidden && grad_topk_weight),
      "backward of layer '{}': a null input or output pointer with {} tokens", m.cfg.name,
      num_tokens);
  CallGuard guard(r, "backward");
  Bindings b;
  m.start_host(b);
  m.settle_row_counts(/*all=*/false, &m.call_host);
  b.stream = stream;
  b.num_tokens = num_tokens;
  b.top_k = static_cast<int>(m.K);
  b.grad_out = grad_out;
  b.topk_weight = topk_weight;
  b.out = grad_hidden;
  b.grad_topk_weight = grad_topk_weight;
  b.experts = experts;
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
  CallGuard guard(r, "forward_dispatched");
  m.settle_row_counts(/*all=*/false);
  // The caller dispatched the rows: plans that send rows straight to helpers cannot run here. A
  // planner that chooses its path (feplb's default) keeps to two phases from now on; the planner
  // is idle between calls (its last observe() ran before the previous call returned).
  if (!m.planner->limits().rows_via_homes) m.planner->keep_rows_via_homes();
  FEPLB_REQUIRE_INPUT(
      m.planner->limits().rows_via_homes,
      "forward_dispatched of layer '{}': planner '{}' plans rows in one hop (one_hop = 1), which "
      "needs the layer's own dispatch (forward())",
      m.cfg.name, m.planner->name());
  MicroBatch handle;
  Bindings b;
  m.start_host(b);
  b.stream = stream;
  b.caller_in = rows;
  b.caller_out = out_rows;
  b.experts = experts;
  CallFacts f;
  // A pending prefetch is settled as in forward(): used by this layer, dropped by another.
  MicroBatchState& h = m.begin_forward(handle, n, /*dispatched=*/true, b, f);
  m.rows_per_expert = rows_per_expert;
  m.begin_job(h, /*backward=*/false, /*dispatched=*/true, experts);
  m.timed(m.call_host.build_us, [&] { build_forward_prologue(m.prologue, f); });
  m.exec.run(m.prologue, b, m);
  m.check_plan(h, f, b);
  m.carve_plan(h, n, /*own_x_home=*/false, stream);
  h.x_home = const_cast<bf16*>(rows);  // the caller's, read only
  m.run_forward_body(handle, h, f, b);
  return handle;
}

void MoeLayer::backward_dispatched(MicroBatch&& mb, std::span<const ExpertParams> experts,
                                   const bf16* grad_out_rows, bf16* grad_rows,
                                   std::span<const ExpertGrads> grads, GradMode mode,
                                   cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("backward_dispatched");
  MicroBatchState& h = m.consumed(mb, /*dispatched=*/true, "backward_dispatched");
  const int64_t n = h.num_tokens;
  m.validate_experts(experts, 0, "backward_dispatched");
  m.validate_grads(grads, "backward_dispatched");
  FEPLB_REQUIRE_INPUT(n == 0 || (grad_out_rows && grad_rows),
                      "backward_dispatched of layer '{}': a null row pointer with {} rows",
                      m.cfg.name, n);
  CallGuard guard(r, "backward_dispatched");
  Bindings b;
  m.start_host(b);
  m.settle_row_counts(/*all=*/false, &m.call_host);
  b.stream = stream;
  b.caller_in = grad_out_rows;
  b.caller_out = grad_rows;
  b.experts = experts;
  b.grads = grads;
  // A pending prefetch is dropped, as in backward().
  m.run_backward(mb, h, mode, b);
}

}  // namespace feplb::cuda
