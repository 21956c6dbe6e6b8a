#include "feplb/cuda/moe_layer.h"

#include <algorithm>

#include "feplb/cuda/ce_copy.h"
#include "feplb/cuda/check.h"
#include "feplb/cuda/expert_ffn.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/spin_wait.h"

namespace feplb::cuda {

using Clock = std::chrono::steady_clock;

// Host time a forward or backward may spend, after enqueueing its GPU work, choosing exact GEMM
// algorithms for row counts it met for the first time (feplb/cuda/gemm.h).
constexpr double kGemmRefineBudgetMs = 1.0;

struct MoeLayer::Peer {
  bf16* guest_in = nullptr;  // [guest_cap, H]
  bf16* guest_dy = nullptr;  // [guest_cap, H] (training)
  bf16* yrecv = nullptr;     // [recv_cap, H]
};

namespace {

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

bool gpu_planner_supported(const std::string& policy) {
  return policy == "static" || policy == "feplb-paper" || policy == "feplb" || policy == "oracle";
}

}  // namespace

int default_staging_slots(const Knobs& knobs) {
  return static_cast<int>(std::max<int64_t>({1, knobs.dyn * knobs.max_helpers_per_expert, knobs.max_num_dyn}));
}

MoeLayer::MoeLayer(const LayerConfig& config, Transport& transport, const GemmCostModel* cost)
    : cfg_(config), transport_(transport), routing_(), plan_() {
  const Topology& topo = cfg_.topo;
  rank_ = transport_.rank();
  world_ = transport_.world_size();
  FEPLB_REQUIRE_INPUT(world_ == topo.num_ranks(), "layer: transport has {} ranks, topology {}", world_,
                      topo.num_ranks());
  FEPLB_REQUIRE_INPUT(cfg_.shape.dtype == Dtype::kBf16, "layer: only bf16 experts are supported");
  FEPLB_REQUIRE_INPUT(cfg_.shape.hidden > 0 && cfg_.shape.hidden % 8 == 0 && cfg_.shape.ffn > 0 &&
                          cfg_.shape.ffn % 8 == 0,
                      "layer: hidden {} and ffn {} must be positive multiples of 8", cfg_.shape.hidden,
                      cfg_.shape.ffn);
  FEPLB_REQUIRE_INPUT(cfg_.top_k >= 1 && cfg_.top_k <= topo.num_experts(), "layer: top_k {} for {} experts",
                      cfg_.top_k, topo.num_experts());
  FEPLB_REQUIRE_INPUT(cfg_.max_tokens >= 0, "layer: max_tokens {}", cfg_.max_tokens);
  FEPLB_REQUIRE_INPUT(gpu_planner_supported(cfg_.policy),
                      "layer: policy '{}' runs in simulation only (the GPU layer runs static, feplb-paper, "
                      "feplb and oracle)", cfg_.policy);
  FEPLB_REQUIRE_INPUT(world_ == 1 || transport_.supports_peer_copies() || cfg_.policy == "static",
                      "layer: transport '{}' cannot copy into peers' buffers; use policy static",
                      transport_.name());
  validate_knobs(cfg_.knobs);
  H_ = cfg_.shape.hidden;
  F_ = cfg_.shape.ffn;
  K_ = cfg_.top_k;
  E_ = topo.num_experts();
  experts_per_rank_ = topo.experts_per_rank();
  if (!cost) {
    own_cost_ = std::make_unique<RooflineCostModel>(cfg_.shape, cfg_.knobs);
    cost = own_cost_.get();
  }
  planner_ = make_planner(cfg_.policy, PlannerContext{topo, cfg_.shape, cfg_.knobs, cost});

  const int64_t pairs = cfg_.max_tokens * K_;
  recv_cap_ = cfg_.recv_capacity_rows ? cfg_.recv_capacity_rows : pairs * world_;
  guest_cap_ = cfg_.guest_capacity_rows ? cfg_.guest_capacity_rows : 2 * pairs;
  const int64_t w = expert_weight_elems(H_, F_);
  if (cfg_.pool) {
    pool_ = cfg_.pool;
    FEPLB_REQUIRE_INPUT(pool_->shape().hidden == H_ && pool_->shape().ffn == F_,
                        "layer: slot pool holds {}x{} experts, the layer's are {}x{}", pool_->shape().hidden,
                        pool_->shape().ffn, H_, F_);
    FEPLB_REQUIRE_INPUT(pool_->slots() >= cfg_.knobs.max_num_dyn, "layer: slot pool has {} slots, max_num_dyn is {}",
                        pool_->slots(), cfg_.knobs.max_num_dyn);
    FEPLB_REQUIRE_INPUT(!cfg_.training || pool_->training(), "layer: a training layer needs a training slot pool");
  } else {
    own_pool_ = std::make_unique<ExpertSlotPool>(transport_, cfg_.shape, static_cast<int>(cfg_.knobs.max_num_dyn),
                                                 cfg_.training ? default_staging_slots(cfg_.knobs) : 0,
                                                 cfg_.name + ".pool");
    pool_ = own_pool_.get();
  }
  layer_id_ = pool_->next_layer_id();
  weights_ = DeviceBuffer<bf16>(static_cast<size_t>(experts_per_rank_ * w));
  if (cfg_.training) main_grad_ = DeviceBuffer<float>(static_cast<size_t>(experts_per_rank_ * w));
  send_ = DeviceBuffer<bf16>(static_cast<size_t>(pairs * H_));
  ybuf_ = DeviceBuffer<bf16>(static_cast<size_t>(pairs * H_));
  recv_ = DeviceBuffer<bf16>(static_cast<size_t>(recv_cap_ * H_));
  yrecv_ = DeviceBuffer<bf16>(static_cast<size_t>(recv_cap_ * H_));
  guest_in_ = DeviceBuffer<bf16>(static_cast<size_t>(guest_cap_ * H_));
  if (cfg_.training) {
    dyrecv_ = DeviceBuffer<bf16>(static_cast<size_t>(recv_cap_ * H_));
    guest_dy_ = DeviceBuffer<bf16>(static_cast<size_t>(guest_cap_ * H_));
  }
  guest_out_ = DeviceBuffer<bf16>(static_cast<size_t>(guest_cap_ * H_));
  gu_ = DeviceBuffer<bf16>(static_cast<size_t>((recv_cap_ + guest_cap_) * 2 * F_));
  act_ = DeviceBuffer<bf16>(static_cast<size_t>((recv_cap_ + guest_cap_) * F_));
  counts_ = DeviceBuffer<int32_t>(static_cast<size_t>(E_));
  cursor_ = DeviceBuffer<int32_t>(static_cast<size_t>(E_));
  offsets_ = DeviceBuffer<int32_t>(static_cast<size_t>(E_));
  order_ = DeviceBuffer<int32_t>(static_cast<size_t>(E_));
  counts_all_ = DeviceBuffer<int32_t>(static_cast<size_t>(world_ * E_));
  pair_pos_ = DeviceBuffer<int32_t>(static_cast<size_t>(std::max<int64_t>(pairs, 1)));
  counts_host_ = PinnedBuffer<int32_t>(static_cast<size_t>(world_ * E_));

  // Send order: experts grouped by home rank, each rank's experts in its local order.
  std::vector<int32_t> order;
  local_index_.assign(static_cast<size_t>(E_), 0);
  for (int d = 0; d < world_; ++d) {
    int i = 0;
    for (int e : topo.local_experts(d)) {
      order.push_back(e);
      local_index_[e] = i++;
    }
  }
  FEPLB_CUDA_CHECK(cudaMemcpy(order_.get(), order.data(), order.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

  const std::string prefix = "feplb." + cfg_.name + ".";
  transport_.register_buffer(prefix + "guest_in", guest_in_.get(), guest_in_.bytes());
  if (cfg_.training) transport_.register_buffer(prefix + "guest_dy", guest_dy_.get(), guest_dy_.bytes());
  transport_.register_buffer(prefix + "yrecv", yrecv_.get(), yrecv_.bytes());
  signals_ = transport_.make_signals(prefix + "signals", 3 * world_);
  if (transport_.supports_peer_copies()) {
    for (int p = 0; p < world_; ++p) {
      peers_.push_back({static_cast<bf16*>(transport_.peer_buffer(prefix + "guest_in", p)),
                        cfg_.training ? static_cast<bf16*>(transport_.peer_buffer(prefix + "guest_dy", p)) : nullptr,
                        static_cast<bf16*>(transport_.peer_buffer(prefix + "yrecv", p))});
    }
  }
  taken_.assign(static_cast<size_t>(E_), 0);
  slot_count_.assign(static_cast<size_t>(world_), 0);
  row_count_.assign(static_cast<size_t>(world_), 0);
  export_count_.assign(static_cast<size_t>(world_), 0);
  scheduler_ = std::thread([this] { scheduler_loop(); });
}

MoeLayer::~MoeLayer() {
  stop_.store(true, std::memory_order_release);
  if (scheduler_.joinable()) scheduler_.join();
}

void MoeLayer::set_weights(const bf16* local_weights, cudaStream_t stream) {
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(weights_.get(), local_weights, weights_.bytes(), cudaMemcpyDeviceToDevice, stream));
}

const ForwardStats& MoeLayer::last_stats() const {
  if (cfg_.timing) {
    auto& s = const_cast<ForwardStats&>(stats_);
    s.forward_ms = elapsed_ms(t_start_, t_end_);
    s.static_ms = elapsed_ms(t_dispatched_, t_static_);
    s.wait_ms = elapsed_ms(t_static_, t_waited_);
    s.guest_ms = elapsed_ms(t_waited_, t_guest_);
  }
  return stats_;
}

const BackwardStats& MoeLayer::last_backward_stats() const {
  if (cfg_.timing) {
    auto& s = const_cast<BackwardStats&>(bstats_);
    s.backward_ms = elapsed_ms(tb_start_, tb_end_);
    s.static_ms = elapsed_ms(tb_dispatched_, tb_static_);
    s.wait_ms = elapsed_ms(tb_static_, tb_waited_);
    s.guest_ms = elapsed_ms(tb_waited_, tb_guest_);
    s.results_wait_ms = elapsed_ms(tb_guest_, tb_results_);
  }
  return bstats_;
}

size_t MoeLayer::device_bytes() const {
  return weights_.bytes() + main_grad_.bytes() + send_.bytes() + ybuf_.bytes() + recv_.bytes() + yrecv_.bytes() +
         dyrecv_.bytes() + guest_in_.bytes() + guest_dy_.bytes() + guest_out_.bytes() + gu_.bytes() + act_.bytes();
}

void MoeLayer::zero_grad(cudaStream_t stream) {
  sync_gradients(stream);
  FEPLB_CUDA_CHECK(cudaMemsetAsync(main_grad_.get(), 0, main_grad_.bytes(), stream));
}

void MoeLayer::sync_gradients(cudaStream_t stream) {
  FEPLB_REQUIRE_INPUT(cfg_.training, "layer: gradients of a layer built without training");
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, ev_grads_done_.get(), 0));
}

void MoeLayer::wait_seq(const std::atomic<uint32_t>& seq, uint32_t target, const char* what) const {
  const auto deadline = Clock::now() + std::chrono::duration<double>(cfg_.timeout_s);
  for (uint64_t spins = 0; seq.load(std::memory_order_acquire) < target; ++spins) {
    if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(error_);
    if (stop_.load(std::memory_order_acquire)) throw Error("layer: stopping");
    if ((spins & 1023) == 0 && Clock::now() > deadline) {
      throw Error(fmt::format("layer rank {}: waited {:.0f} s for the scheduler ({})", rank_, cfg_.timeout_s, what));
    }
    spin_pause(spins);
  }
}

// ---------------------------------------------------------------------------------------------
// Scheduler thread: counts on the host -> plan -> phase-2 input copies (forward); phase-2 input
// copies only (backward: the forward's plan).

void MoeLayer::scheduler_loop() {
  uint32_t handled = 0;
  uint64_t idle = 0;
  try {
    while (!stop_.load(std::memory_order_acquire)) {
      if (request_seq_.load(std::memory_order_acquire) == handled) {
        spin_pause(idle++);
        continue;
      }
      handled = request_seq_.load(std::memory_order_acquire);
      if (!backward_job_) plan_step();
      plan_seq_.store(handled, std::memory_order_release);
      issue_phase2_inputs(backward_job_);
      copies_seq_.store(handled, std::memory_order_release);
    }
  } catch (...) {
    error_ = std::current_exception();
    failed_.store(true, std::memory_order_release);
  }
}

void MoeLayer::plan_step() {
  // Counts of every rank: wait for the D2H copy (spin: this thread exists to react at once).
  const auto deadline = Clock::now() + std::chrono::duration<double>(cfg_.timeout_s);
  for (uint64_t spins = 0;; ++spins) {
    const cudaError_t q = cudaEventQuery(ev_counts_.get());
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) FEPLB_CUDA_CHECK(q);
    if ((spins & 1023) == 0 && Clock::now() > deadline) {
      throw Error(fmt::format("layer rank {}: counts never reached the host in {:.0f} s", rank_, cfg_.timeout_s));
    }
    if (stop_.load(std::memory_order_acquire)) return;
    spin_pause(spins);
  }
  const auto t_seen = Clock::now();
  const int R = world_;
  const int E = static_cast<int>(E_);
  if (routing_.num_ranks != R || routing_.num_experts != E) routing_ = RoutingStep(0, 0, R, E);
  routing_.step = seq_;
  std::copy(counts_host_.get(), counts_host_.get() + R * E, routing_.counts.begin());
  routing_.sum_experts();
  const auto t0 = Clock::now();
  planner_->plan(routing_, plan_);
  const auto t1 = Clock::now();
  planner_->observe(routing_);
  stats_ = ForwardStats{};
  stats_.counts_to_host_us = us_between(t_counts_issued_, t_seen);
  stats_.plan_us = us_between(t0, t1);
  layout_from_counts(num_tokens_);
  stats_.counts_to_first_copy_us = us_between(t_counts_issued_, t1);  // refined when a copy is issued
}

// Host-side layout of this step, identical on every rank: where each expert's rows sit on its
// home, which rows each slice takes, each guest's slot and rows on its helper, and (training)
// each exported slice's gradient staging slot on its owner. Records what the slots now hold.
void MoeLayer::layout_from_counts(int64_t num_tokens) {
  const Topology& topo = cfg_.topo;
  const int R = world_;
  layout_error_.clear();
  expert_base_.assign(static_cast<size_t>(E_), 0);
  for (int d = 0; d < R; ++d) {
    int64_t base = 0;
    for (int e : topo.local_experts(d)) {
      expert_base_[e] = base;
      base += routing_.expert_counts[e];
    }
    if (base > recv_cap_) {
      layout_error_ = fmt::format("rank {} receives {} rows in phase 1, over its capacity {} (raise "
                                  "recv_capacity_rows)", d, base, recv_cap_);
    }
  }
  for (int src = 0; src < R; ++src) {
    int64_t sent = 0;
    for (int e = 0; e < E_; ++e) sent += routing_.at(src, e);
    FEPLB_CHECK(src != rank_ || sent == num_tokens * K_, "rank {} counted {} rows, expected tokens * top_k = {}",
                src, sent, num_tokens * K_);
  }
  const size_t n = plan_.slices.size();
  slice_offset_.assign(n, 0);
  guest_slot_.assign(n, -1);
  guest_off_.assign(n, -1);
  export_slot_.assign(n, -1);
  recopy_.assign(n, 0);
  std::fill(taken_.begin(), taken_.end(), 0);
  std::fill(slot_count_.begin(), slot_count_.end(), 0);
  std::fill(row_count_.begin(), row_count_.end(), 0);
  std::fill(export_count_.begin(), export_count_.end(), 0);
  for (size_t i = 0; i < n; ++i) {
    const Slice& s = plan_.slices[i];
    if (s.source != RowSource::kHome) {
      layout_error_ = "the GPU layer runs plans whose rows are dispatched to the experts' homes only";
      continue;
    }
    slice_offset_[i] = taken_[s.expert];
    taken_[s.expert] += s.rows;
    const int home = topo.home(s.expert);
    if (s.gpu != home) {
      guest_slot_[i] = slot_count_[s.gpu]++;
      guest_off_[i] = row_count_[s.gpu];
      row_count_[s.gpu] += s.rows;
      export_slot_[i] = export_count_[home]++;
    }
  }
  for (int g = 0; g < R; ++g) {
    if (slot_count_[g] > cfg_.knobs.max_num_dyn) {
      layout_error_ = fmt::format("plan gives GPU {} {} guest experts, over max_num_dyn {}", g, slot_count_[g],
                                  cfg_.knobs.max_num_dyn);
    }
    if (row_count_[g] > guest_cap_) {
      layout_error_ = fmt::format("plan gives GPU {} {} guest rows, over its capacity {} (raise "
                                  "guest_capacity_rows)", g, row_count_[g], guest_cap_);
    }
    if (cfg_.training && export_count_[g] > pool_->staging_slots()) {
      layout_error_ = fmt::format("plan exports {} expert slices from GPU {}, over its {} gradient staging slots "
                                  "(raise the pool's staging slots)", export_count_[g], g, pool_->staging_slots());
    }
  }
  if (!layout_error_.empty()) return;
  for (size_t i = 0; i < n; ++i) {
    if (guest_slot_[i] >= 0) {
      pool_->holder(plan_.slices[i].gpu, static_cast<int>(guest_slot_[i])) =
          ExpertSlotPool::tag(layer_id_, plan_.slices[i].expert, seq_);
    }
  }
}

bool MoeLayer::exports_to(int helper) const {
  for (size_t i = 0; i < plan_.slices.size(); ++i) {
    if (plan_.slices[i].gpu == helper && guest_slot_[i] >= 0 && cfg_.topo.home(plan_.slices[i].expert) == rank_) {
      return true;
    }
  }
  return false;
}

bool MoeLayer::guests_from(int owner) const {
  for (size_t i = 0; i < plan_.slices.size(); ++i) {
    if (plan_.slices[i].gpu == rank_ && guest_slot_[i] >= 0 && cfg_.topo.home(plan_.slices[i].expert) == owner) {
      return true;
    }
  }
  return false;
}

// Phase-2 inputs, helper by helper (each helper's signal goes up as soon as its own copies
// land): the weights (forward; backward only where the slot was reused) and the slice's rows
// (forward: X from recv_; backward: dY from dyrecv_).
void MoeLayer::issue_phase2_inputs(bool backward) {
  const cudaStream_t cs = copy_in_.get();
  const uint32_t seq = seq_;
  if (layout_error_.empty()) {
    // Phase-1 rows must have landed before they are copied on: wait (on the GPU) for the event
    // the caller's stream records after the all-to-all; on the host, for it to be recorded.
    wait_seq(dispatched_seq_, seq, "phase-1 dispatch");
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(cs, ev_dispatched_.get(), 0));
    const int64_t w = expert_weight_elems(H_, F_);
    const size_t row_bytes = static_cast<size_t>(H_) * sizeof(bf16);
    const bf16* rows_base = backward ? dyrecv_.get() : recv_.get();
    int64_t issued = 0;
    for (int h = 0; h < world_; ++h) {
      ce_batch_.clear();
      for (size_t i = 0; i < plan_.slices.size(); ++i) {
        const Slice& s = plan_.slices[i];
        if (s.gpu != h || guest_slot_[i] < 0 || cfg_.topo.home(s.expert) != rank_) continue;
        if (!backward || recopy_[i]) {
          ce_batch_.push_back({pool_->peer_slot(h, static_cast<int>(guest_slot_[i])),
                               weights_.get() + local_index_[s.expert] * w, static_cast<size_t>(w) * sizeof(bf16)});
        }
        ce_batch_.push_back({(backward ? peers_[h].guest_dy : peers_[h].guest_in) + guest_off_[i] * H_,
                             rows_base + (expert_base_[s.expert] + slice_offset_[i]) * H_,
                             static_cast<size_t>(s.rows) * row_bytes});
        if (!backward) stats_.exported_rows += s.rows;
      }
      if (ce_batch_.empty()) continue;
      if (!backward && issued == 0) {
        stats_.counts_to_first_copy_us = us_between(t_counts_issued_, Clock::now());
        stats_.plan_to_first_copy_us = stats_.counts_to_first_copy_us - stats_.counts_to_host_us - stats_.plan_us;
      }
      ce_copy_and_signal(cs, ce_batch_, nullptr, 0);
      signals_->signal(h, rank_, seq, cs);
      issued += static_cast<int64_t>(ce_batch_.size());
    }
    (backward ? bstats_.copies : stats_.copies) += issued;
  }
  ev_copy_in_done_.record(cs);
}

// Phase-1 chunk lists of this step (sends in send order, receives grouped by peer, each peer's
// in local-expert order: the order its sender lists them in) over the given base buffers.
void MoeLayer::dispatch_chunks(bf16* send_base, bf16* recv_base) {
  const Topology& topo = cfg_.topo;
  const size_t row_bytes = static_cast<size_t>(H_) * sizeof(bf16);
  sends_.clear();
  recvs_.clear();
  int64_t send_off = 0;
  for (int d = 0; d < world_; ++d) {
    for (int e : topo.local_experts(d)) {
      const int64_t rows = routing_.at(rank_, e);
      sends_.push_back({d, send_base + send_off * H_, static_cast<size_t>(rows) * row_bytes});
      send_off += rows;
    }
  }
  for (int src = 0; src < world_; ++src) {
    for (int e : topo.local_experts(rank_)) {
      int64_t off = expert_base_[e];
      for (int before = 0; before < src; ++before) off += routing_.at(before, e);
      recvs_.push_back({src, recv_base + off * H_, static_cast<size_t>(routing_.at(src, e)) * row_bytes});
    }
  }
}

// Phase 1 over this step's chunks (send_ -> `recv_base`), then the event the copy stream waits for.
void MoeLayer::phase1(bf16* recv_base, cudaStream_t s) {
  dispatch_chunks(send_.get(), recv_base);
  transport_.exchange(sends_, recvs_, s);
  ev_dispatched_.record(s);
  dispatched_seq_.store(seq_, std::memory_order_release);
}

// This rank's own experts' slices that stay home, static experts first: f(slice, first recv row).
void MoeLayer::for_each_home_slice(const std::function<void(const Slice&, int64_t)>& f) const {
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < plan_.slices.size(); ++i) {
      const Slice& sl = plan_.slices[i];
      if (sl.gpu != rank_ || cfg_.topo.home(sl.expert) != rank_ || plan_.dynamic[sl.expert] != pass) continue;
      f(sl, expert_base_[sl.expert] + slice_offset_[i]);
    }
  }
}

// Results of this rank's guest slices back into their owners' yrecv_ rows (forward: outputs;
// backward: dX), owner by owner, each batch ended by signal R + rank. Returns the copies issued.
int64_t MoeLayer::send_rows_back(cudaStream_t co) {
  const size_t row_bytes = static_cast<size_t>(H_) * sizeof(bf16);
  int64_t copies = 0;
  for (int d = 0; d < world_; ++d) {
    out_batch_.clear();
    for (size_t i = 0; i < plan_.slices.size(); ++i) {
      const Slice& sl = plan_.slices[i];
      if (sl.gpu != rank_ || guest_slot_[i] < 0 || cfg_.topo.home(sl.expert) != d) continue;
      out_batch_.push_back({peers_[d].yrecv + (expert_base_[sl.expert] + slice_offset_[i]) * H_,
                            guest_out_.get() + guest_off_[i] * H_, static_cast<size_t>(sl.rows) * row_bytes});
    }
    if (out_batch_.empty()) continue;
    ce_copy_and_signal(co, out_batch_, nullptr, 0);
    signals_->signal(d, world_ + rank_, seq_, co);
    copies += static_cast<int64_t>(out_batch_.size());
  }
  return copies;
}

// The reverse all-to-all-v: yrecv_ rows (laid out like the phase-1 receives, which point into
// `recv_base`) back to the tokens' ranks, into ybuf_ in send order.
void MoeLayer::reverse_exchange(const bf16* recv_base, cudaStream_t s) {
  back_sends_.clear();
  back_recvs_.clear();
  for (const Chunk& c : recvs_) {
    back_sends_.push_back({c.peer, yrecv_.get() + (static_cast<const bf16*>(c.ptr) - recv_base), c.bytes});
  }
  for (const Chunk& c : sends_) {
    back_recvs_.push_back({c.peer, ybuf_.get() + (static_cast<const bf16*>(c.ptr) - send_.get()), c.bytes});
  }
  transport_.exchange(back_sends_, back_recvs_, s);
}

// ---------------------------------------------------------------------------------------------
// The caller's thread.

void MoeLayer::forward(const bf16* hidden, const int32_t* topk_idx, const float* topk_weight, int64_t num_tokens,
                       bf16* out, cudaStream_t stream) {
  if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(error_);
  FEPLB_REQUIRE_INPUT(num_tokens >= 0 && num_tokens <= cfg_.max_tokens, "layer: {} tokens, max_tokens is {}",
                      num_tokens, cfg_.max_tokens);
  const int R = world_;
  const cudaStream_t s = stream;
  ++seq_;
  forward_seq_ = seq_;
  saved_for_backward_ = false;
  backward_job_ = false;
  num_tokens_ = num_tokens;
  if (cfg_.timing) t_start_.record(s);

  // 1. Permute rows into send order and count rows per expert.
  FEPLB_CUDA_CHECK(cudaMemsetAsync(counts_.get(), 0, counts_.bytes(), s));
  FEPLB_CUDA_CHECK(cudaMemsetAsync(cursor_.get(), 0, cursor_.bytes(), s));
  FEPLB_CUDA_CHECK(kernels::count_experts(topk_idx, num_tokens * K_, counts_.get(), s));
  FEPLB_CUDA_CHECK(kernels::send_offsets(counts_.get(), order_.get(), static_cast<int>(E_), offsets_.get(), s));
  FEPLB_CUDA_CHECK(kernels::scatter_rows(hidden, topk_idx, num_tokens, static_cast<int>(K_), H_, offsets_.get(),
                                         cursor_.get(), send_.get(), pair_pos_.get(), s));
  // 2. Every rank's counts, to every rank and to the host; the scheduler thread plans from them.
  transport_.all_gather_i32(counts_.get(), counts_all_.get(), static_cast<size_t>(E_), s);
  if (cfg_.sync_before_counts) sync_with_timeout(s, cfg_.timeout_s, "counts");
  t_counts_issued_ = Clock::now();
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(counts_host_.get(), counts_all_.get(), counts_all_.bytes(), cudaMemcpyDeviceToHost, s));
  ev_counts_.record(s);
  request_seq_.store(seq_, std::memory_order_release);
  wait_seq(plan_seq_, seq_, "plan");
  if (!layout_error_.empty()) {
    // Every rank sees the same counts and plan, so every rank stops here; the scheduler issued
    // nothing for this step, so the layer stays usable.
    wait_seq(copies_seq_, seq_, "phase-2 copies");
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_copy_in_done_.get(), 0));
    throw InputError("layer: " + layout_error_);
  }

  // 3. Phase 1: rows to their experts' homes, expert-major on the receiver.
  phase1(recv_.get(), s);
  if (cfg_.timing) t_dispatched_.record(s);

  // 4. Own experts: static ones first, then the dynamic ones' rows that stay home.
  const int64_t w = expert_weight_elems(H_, F_);
  for_each_home_slice([&](const Slice& sl, int64_t row) {
    expert_ffn(gemm_, s, recv_.get() + row * H_, sl.rows, weights_.get() + local_index_[sl.expert] * w,
               gu_.get() + row * 2 * F_, act_.get() + row * F_, yrecv_.get() + row * H_, H_, F_);
  });
  if (cfg_.timing) t_static_.record(s);

  // 5. Guests: wait (no SM) for each owner's signal, then compute.
  for (int d = 0; d < R; ++d) {
    if (guests_from(d)) signals_->wait(d, seq_, s);
  }
  if (cfg_.timing) t_waited_.record(s);
  int64_t guests = 0;
  for (size_t i = 0; i < plan_.slices.size(); ++i) {
    const Slice& sl = plan_.slices[i];
    if (sl.gpu != rank_ || guest_slot_[i] < 0) continue;
    const int64_t row = recv_cap_ + guest_off_[i];
    expert_ffn(gemm_, s, guest_in_.get() + guest_off_[i] * H_, sl.rows,
               pool_->slot(static_cast<int>(guest_slot_[i])), gu_.get() + row * 2 * F_, act_.get() + row * F_,
               guest_out_.get() + guest_off_[i] * H_, H_, F_);
    guests += sl.rows;
  }
  if (cfg_.timing) t_guest_.record(s);
  stats_.guest_rows = guests;

  // 6. Guest outputs back to their owners (copy engine), owner by owner, each ended by a signal.
  ev_guest_done_.record(s);
  const cudaStream_t co = copy_out_.get();
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(co, ev_guest_done_.get(), 0));
  send_rows_back(co);
  ev_copy_out_done_.record(co);
  // My exported rows' outputs: wait for each helper's signal.
  for (int h = 0; h < R; ++h) {
    if (exports_to(h)) signals_->wait(R + h, seq_, s);
  }

  // 7. Reverse all-to-all-v (outputs back to the tokens' ranks) and the weighted combine.
  reverse_exchange(recv_.get(), s);
  FEPLB_CUDA_CHECK(kernels::combine(ybuf_.get(), pair_pos_.get(), topk_weight, num_tokens, static_cast<int>(K_), H_,
                                    out, s));

  // Buffers the copy streams read or write are reused next forward: order them before it.
  wait_seq(copies_seq_, seq_, "phase-2 copies");
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_copy_in_done_.get(), 0));
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_copy_out_done_.get(), 0));
  if (cfg_.timing) t_end_.record(s);
  saved_for_backward_ = cfg_.training;
  gemm_.refine(kGemmRefineBudgetMs);
}

void MoeLayer::backward(const bf16* grad_out, const float* topk_weight, bf16* grad_hidden, float* grad_topk_weight,
                        cudaStream_t stream) {
  if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(error_);
  FEPLB_REQUIRE_INPUT(cfg_.training, "layer: backward on a layer built without training (LayerConfig::training)");
  FEPLB_REQUIRE_INPUT(saved_for_backward_, "layer: backward needs the forward of the same micro-batch first (once)");
  saved_for_backward_ = false;
  const Topology& topo = cfg_.topo;
  const int R = world_;
  const cudaStream_t s = stream;
  ++seq_;
  bstats_ = BackwardStats{};
  if (cfg_.timing) tb_start_.record(s);
  // The helpers write this rank's staging slots after this backward's dispatch, and the main
  // gradient gets this backward's own dW: the previous backward's adds must be done.
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, pool_->staging_free(), 0));
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_grads_done_.get(), 0));

  // Guest weights to copy again: slots another layer (or micro-batch) has filled since.
  for (size_t i = 0; i < plan_.slices.size(); ++i) {
    if (guest_slot_[i] < 0) continue;
    const Slice& sl = plan_.slices[i];
    uint64_t& held = pool_->holder(sl.gpu, static_cast<int>(guest_slot_[i]));
    const uint64_t want = ExpertSlotPool::tag(layer_id_, sl.expert, forward_seq_);
    recopy_[i] = held != want;
    if (recopy_[i] && topo.home(sl.expert) == rank_) ++bstats_.weight_recopies;
    held = want;
  }
  // The scheduler thread issues the phase-2 inputs once phase 1 is posted (no plan: the forward's).
  backward_job_ = true;
  request_seq_.store(seq_, std::memory_order_release);

  // 1. dY in send order (weighted by the router) and the router weights' gradient.
  FEPLB_CUDA_CHECK(kernels::scatter_grad(grad_out, pair_pos_.get(), topk_weight, ybuf_.get(), num_tokens_,
                                         static_cast<int>(K_), H_, send_.get(), grad_topk_weight, s));
  // 2. Phase 1: dY rows to the experts' homes (the forward's all-to-all, same sizes). First a
  // one-int all-gather, the collective that orders this rank's phase-2 copies into its peers'
  // slots after the peers' last use of them (the forward's counts all-gather does this there; an
  // all-to-all alone does not, as zero-byte chunks are never sent).
  transport_.all_gather_i32(counts_.get(), counts_all_.get(), 1, s);
  phase1(dyrecv_.get(), s);
  if (cfg_.timing) tb_dispatched_.record(s);

  // 3. Own experts' backward, static first; dX into yrecv_, dW straight into the main gradient.
  const int64_t w = expert_weight_elems(H_, F_);
  for_each_home_slice([&](const Slice& sl, int64_t row) {
    const int64_t li = local_index_[sl.expert];
    bf16* gu = gu_.get() + row * 2 * F_;
    bf16* act = act_.get() + row * F_;
    expert_ffn_backward(gemm_, s, recv_.get() + row * H_, sl.rows, weights_.get() + li * w, gu, act,
                        dyrecv_.get() + row * H_, main_grad_.get() + li * w, 1.0f, yrecv_.get() + row * H_, gu, act,
                        H_, F_);
  });
  if (cfg_.timing) tb_static_.record(s);

  // 4. Guests: wait for each owner's dY (and weights), then dX and dW (into the pool's grad slots,
  // once the previous layer's copies out of them are done).
  for (int d = 0; d < R; ++d) {
    if (guests_from(d)) signals_->wait(d, seq_, s);
  }
  if (cfg_.timing) tb_waited_.record(s);
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, pool_->grads_free(), 0));
  for (size_t i = 0; i < plan_.slices.size(); ++i) {
    const Slice& sl = plan_.slices[i];
    if (sl.gpu != rank_ || guest_slot_[i] < 0) continue;
    const int64_t row = recv_cap_ + guest_off_[i];
    const int slot = static_cast<int>(guest_slot_[i]);
    bf16* gu = gu_.get() + row * 2 * F_;
    bf16* act = act_.get() + row * F_;
    expert_ffn_backward(gemm_, s, guest_in_.get() + guest_off_[i] * H_, sl.rows, pool_->slot(slot), gu, act,
                        guest_dy_.get() + guest_off_[i] * H_, pool_->grad_slot(slot), 0.0f,
                        guest_out_.get() + guest_off_[i] * H_, gu, act, H_, F_);
    bstats_.guest_rows += sl.rows;
  }
  if (cfg_.timing) tb_guest_.record(s);

  // 5. Results to their owners by copy engine, owner by owner: dX rows into the owner's yrecv_
  // (signal R + h: the owner's reverse all-to-all waits for it), then dW into its staging slots
  // (signal 2R + h: only the owner's gradient accumulation waits for it, off the critical path).
  int64_t result_copies = 0;
  ev_guest_done_.record(s);
  const cudaStream_t co = copy_out_.get();
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(co, ev_guest_done_.get(), 0));
  result_copies += send_rows_back(co);
  for (int d = 0; d < R; ++d) {
    if (d == rank_ || !guests_from(d)) continue;
    out_batch_.clear();
    for (size_t i = 0; i < plan_.slices.size(); ++i) {
      const Slice& sl = plan_.slices[i];
      if (sl.gpu != rank_ || guest_slot_[i] < 0 || topo.home(sl.expert) != d) continue;
      out_batch_.push_back({pool_->peer_staging_slot(d, static_cast<int>(export_slot_[i])),
                            pool_->grad_slot(static_cast<int>(guest_slot_[i])), static_cast<size_t>(w) * sizeof(float)});
    }
    ce_copy_and_signal(co, out_batch_, nullptr, 0);
    signals_->signal(d, 2 * R + rank_, seq_, co);
    result_copies += static_cast<int64_t>(out_batch_.size());
  }
  FEPLB_CUDA_CHECK(cudaEventRecord(pool_->grads_free(), co));
  ev_copy_out_done_.record(co);
  // 6. My exported slices: the compute stream waits for their dX; the copy stream, for their dW,
  // which it then adds into the main gradient (zero_grad, sync_gradients and the next backward
  // wait for that).
  for (int h = 0; h < R; ++h) {
    if (exports_to(h)) signals_->wait(R + h, seq_, s);
  }
  if (cfg_.timing) tb_results_.record(s);
  for (int h = 0; h < R; ++h) {
    if (exports_to(h)) signals_->wait(2 * R + h, seq_, co);
  }
  for (size_t i = 0; i < plan_.slices.size(); ++i) {
    const Slice& sl = plan_.slices[i];
    if (guest_slot_[i] < 0 || topo.home(sl.expert) != rank_) continue;
    FEPLB_CUDA_CHECK(kernels::add_f32(main_grad_.get() + local_index_[sl.expert] * w,
                                      pool_->staging_slot(static_cast<int>(export_slot_[i])), w, co));
  }
  FEPLB_CUDA_CHECK(cudaEventRecord(pool_->staging_free(), co));
  ev_grads_done_.record(co);

  // 7. dX back to the tokens' ranks (reverse all-to-all into ybuf_, free since step 1) and summed
  // over each token's k choices (the router weights are already in dY).
  reverse_exchange(dyrecv_.get(), s);
  FEPLB_CUDA_CHECK(kernels::combine(ybuf_.get(), pair_pos_.get(), nullptr, num_tokens_, static_cast<int>(K_), H_,
                                    grad_hidden, s));

  wait_seq(copies_seq_, seq_, "phase-2 copies");
  bstats_.copies += result_copies;
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_copy_in_done_.get(), 0));
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_copy_out_done_.get(), 0));  // dX and dW sent (not the adds)
  if (cfg_.timing) tb_end_.record(s);
  gemm_.refine(kGemmRefineBudgetMs);
}

}  // namespace feplb::cuda
