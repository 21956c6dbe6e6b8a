#include "feplb/cuda/moe_layer.h"

#include <algorithm>
#include <immintrin.h>

#include "feplb/cuda/ce_copy.h"
#include "feplb/cuda/check.h"
#include "feplb/cuda/expert_ffn.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/stream_ops.h"

namespace feplb::cuda {

using Clock = std::chrono::steady_clock;

struct MoeLayer::Peer {
  bf16* slots = nullptr;     // [max_num_dyn, 3HF]
  bf16* guest_in = nullptr;  // [guest_cap, H]
  bf16* yrecv = nullptr;     // [recv_cap, H]
  uint32_t* flags = nullptr; // [2R]
};

namespace {

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

bool gpu_planner_supported(const std::string& policy) {
  return policy == "static" || policy == "feplb-paper" || policy == "feplb" || policy == "oracle";
}

}  // namespace

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
  weights_ = DeviceBuffer<bf16>(static_cast<size_t>(experts_per_rank_ * w));
  slots_ = DeviceBuffer<bf16>(static_cast<size_t>(cfg_.knobs.max_num_dyn * w));
  send_ = DeviceBuffer<bf16>(static_cast<size_t>(pairs * H_));
  ybuf_ = DeviceBuffer<bf16>(static_cast<size_t>(pairs * H_));
  recv_ = DeviceBuffer<bf16>(static_cast<size_t>(recv_cap_ * H_));
  yrecv_ = DeviceBuffer<bf16>(static_cast<size_t>(recv_cap_ * H_));
  guest_in_ = DeviceBuffer<bf16>(static_cast<size_t>(guest_cap_ * H_));
  guest_out_ = DeviceBuffer<bf16>(static_cast<size_t>(guest_cap_ * H_));
  gu_ = DeviceBuffer<bf16>(static_cast<size_t>((recv_cap_ + guest_cap_) * 2 * F_));
  act_ = DeviceBuffer<bf16>(static_cast<size_t>((recv_cap_ + guest_cap_) * F_));
  counts_ = DeviceBuffer<int32_t>(static_cast<size_t>(E_));
  cursor_ = DeviceBuffer<int32_t>(static_cast<size_t>(E_));
  offsets_ = DeviceBuffer<int32_t>(static_cast<size_t>(E_));
  order_ = DeviceBuffer<int32_t>(static_cast<size_t>(E_));
  counts_all_ = DeviceBuffer<int32_t>(static_cast<size_t>(world_ * E_));
  pair_pos_ = DeviceBuffer<int32_t>(static_cast<size_t>(std::max<int64_t>(pairs, 1)));
  flags_ = DeviceBuffer<uint32_t>(static_cast<size_t>(2 * world_ + 1));
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
  FEPLB_CUDA_CHECK(cudaMemset(flags_.get(), 0, flags_.bytes()));

  const std::string prefix = "feplb." + cfg_.name + ".";
  transport_.register_buffer(prefix + "slots", slots_.get(), slots_.bytes());
  transport_.register_buffer(prefix + "guest_in", guest_in_.get(), guest_in_.bytes());
  transport_.register_buffer(prefix + "yrecv", yrecv_.get(), yrecv_.bytes());
  transport_.register_buffer(prefix + "flags", flags_.get(), flags_.bytes());
  if (transport_.supports_peer_copies()) {
    for (int p = 0; p < world_; ++p) {
      peers_.push_back({static_cast<bf16*>(transport_.peer_buffer(prefix + "slots", p)),
                        static_cast<bf16*>(transport_.peer_buffer(prefix + "guest_in", p)),
                        static_cast<bf16*>(transport_.peer_buffer(prefix + "yrecv", p)),
                        static_cast<uint32_t*>(transport_.peer_buffer(prefix + "flags", p))});
    }
  }
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

void MoeLayer::wait_seq(const std::atomic<uint32_t>& seq, uint32_t target, const char* what) const {
  const auto deadline = Clock::now() + std::chrono::duration<double>(cfg_.timeout_s);
  for (uint64_t spins = 0; seq.load(std::memory_order_acquire) < target; ++spins) {
    if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(error_);
    if (stop_.load(std::memory_order_acquire)) throw Error("layer: stopping");
    if ((spins & 1023) == 0 && Clock::now() > deadline) {
      throw Error(fmt::format("layer rank {}: waited {:.0f} s for the scheduler ({})", rank_, cfg_.timeout_s, what));
    }
    _mm_pause();
  }
}

// ---------------------------------------------------------------------------------------------
// Scheduler thread: counts on the host -> plan -> phase-2 input copies.

void MoeLayer::scheduler_loop() {
  uint32_t handled = 0;
  try {
    while (!stop_.load(std::memory_order_acquire)) {
      if (request_seq_.load(std::memory_order_acquire) == handled) {
        _mm_pause();
        continue;
      }
      handled = request_seq_.load(std::memory_order_acquire);
      plan_step();
      plan_seq_.store(handled, std::memory_order_release);
      issue_phase2_inputs();  // the copy stream itself waits (on the GPU) for phase 1 to land
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
    _mm_pause();
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
// home, which rows each slice takes, and each guest's slot and rows on its helper.
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
  std::vector<int64_t> taken(static_cast<size_t>(E_), 0), slots(static_cast<size_t>(R), 0),
      rows(static_cast<size_t>(R), 0);
  for (size_t i = 0; i < n; ++i) {
    const Slice& s = plan_.slices[i];
    if (s.source != RowSource::kHome) {
      layout_error_ = "the GPU layer runs plans whose rows are dispatched to the experts' homes only";
      continue;
    }
    slice_offset_[i] = taken[s.expert];
    taken[s.expert] += s.rows;
    if (s.gpu != topo.home(s.expert)) {
      guest_slot_[i] = slots[s.gpu]++;
      guest_off_[i] = rows[s.gpu];
      rows[s.gpu] += s.rows;
    }
  }
  for (int g = 0; g < R; ++g) {
    if (slots[g] > cfg_.knobs.max_num_dyn) {
      layout_error_ = fmt::format("plan gives GPU {} {} guest experts, over max_num_dyn {}", g, slots[g],
                                  cfg_.knobs.max_num_dyn);
    }
    if (rows[g] > guest_cap_) {
      layout_error_ = fmt::format("plan gives GPU {} {} guest rows, over its capacity {} (raise "
                                  "guest_capacity_rows)", g, rows[g], guest_cap_);
    }
  }
}

void MoeLayer::issue_phase2_inputs() {
  const cudaStream_t cs = copy_in_.get();
  if (layout_error_.empty()) {
    // Phase-1 rows must have landed before they are copied on: the caller's stream raises
    // flags_[2R] after the all-to-all. A GPU-side wait, so copies can be issued before the
    // caller's thread has even posted the all-to-all.
    stream_wait_u32_geq(cs, flags_.get() + 2 * world_, seq_);
    const int64_t w = expert_weight_elems(H_, F_);
    const size_t row_bytes = static_cast<size_t>(H_) * sizeof(bf16);
    // Helper by helper, so each helper's flag goes up as soon as its own copies land.
    for (int h = 0; h < world_; ++h) {
      ce_batch_.clear();
      for (size_t i = 0; i < plan_.slices.size(); ++i) {
        const Slice& s = plan_.slices[i];
        if (s.gpu != h || guest_slot_[i] < 0 || cfg_.topo.home(s.expert) != rank_) continue;
        ce_batch_.push_back({peers_[h].slots + guest_slot_[i] * w, weights_.get() + local_index_[s.expert] * w,
                             static_cast<size_t>(w) * sizeof(bf16)});
        ce_batch_.push_back({peers_[h].guest_in + guest_off_[i] * H_,
                             recv_.get() + (expert_base_[s.expert] + slice_offset_[i]) * H_,
                             static_cast<size_t>(s.rows) * row_bytes});
        stats_.exported_rows += s.rows;
      }
      if (ce_batch_.empty()) continue;
      if (stats_.copies == 0) {
        stats_.counts_to_first_copy_us = us_between(t_counts_issued_, Clock::now());
        stats_.plan_to_first_copy_us = stats_.counts_to_first_copy_us - stats_.counts_to_host_us - stats_.plan_us;
      }
      ce_copy_and_signal(cs, ce_batch_, peers_[h].flags + rank_, seq_);
      stats_.copies += static_cast<int64_t>(ce_batch_.size());
    }
  }
  ev_copy_in_done_.record(cs);
}

// ---------------------------------------------------------------------------------------------
// The caller's thread.

void MoeLayer::forward(const bf16* hidden, const int32_t* topk_idx, const float* topk_weight, int64_t num_tokens,
                       bf16* out, cudaStream_t stream) {
  if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(error_);
  FEPLB_REQUIRE_INPUT(num_tokens >= 0 && num_tokens <= cfg_.max_tokens, "layer: {} tokens, max_tokens is {}",
                      num_tokens, cfg_.max_tokens);
  const Topology& topo = cfg_.topo;
  const int R = world_;
  const cudaStream_t s = stream;
  ++seq_;
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
  sends_.clear();
  recvs_.clear();
  const size_t row_bytes = static_cast<size_t>(H_) * sizeof(bf16);
  int64_t send_off = 0;
  for (int d = 0; d < R; ++d) {
    for (int e : topo.local_experts(d)) {
      const int64_t rows = routing_.at(rank_, e);
      sends_.push_back({d, send_.get() + send_off * H_, static_cast<size_t>(rows) * row_bytes});
      send_off += rows;
    }
  }
  for (int e : topo.local_experts(rank_)) {
    int64_t off = expert_base_[e];
    for (int src = 0; src < R; ++src) {
      const int64_t rows = routing_.at(src, e);
      recvs_.push_back({src, recv_.get() + off * H_, static_cast<size_t>(rows) * row_bytes});
      off += rows;
    }
  }
  // recvs_ is expert-major; the transport matches chunks per peer in order, so order it by peer
  // with each peer's chunks in local-expert order (the order its sender lists them in).
  std::stable_sort(recvs_.begin(), recvs_.end(), [](const Chunk& a, const Chunk& b) { return a.peer < b.peer; });
  transport_.exchange(sends_, recvs_, s);
  stream_write_u32(s, flags_.get() + 2 * R, seq_);  // phase 1 landed: the copy stream may start
  if (cfg_.timing) t_dispatched_.record(s);

  // 4. Own experts: static ones first, then the dynamic ones' rows that stay home.
  const int64_t w = expert_weight_elems(H_, F_);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < plan_.slices.size(); ++i) {
      const Slice& sl = plan_.slices[i];
      if (sl.gpu != rank_ || topo.home(sl.expert) != rank_ || plan_.dynamic[sl.expert] != pass) continue;
      const int64_t row = expert_base_[sl.expert] + slice_offset_[i];
      expert_ffn(cublas_.get(), s, recv_.get() + row * H_, sl.rows, weights_.get() + local_index_[sl.expert] * w,
                 gu_.get() + row * 2 * F_, act_.get() + row * F_, yrecv_.get() + row * H_, H_, F_);
    }
  }
  if (cfg_.timing) t_static_.record(s);

  // 5. Guests: wait (on the GPU, no SM) for each owner's flag, then compute.
  int64_t guests = 0;
  for (int d = 0; d < R; ++d) {
    bool from_d = false;
    for (size_t i = 0; i < plan_.slices.size() && !from_d; ++i) {
      from_d = plan_.slices[i].gpu == rank_ && guest_slot_[i] >= 0 && topo.home(plan_.slices[i].expert) == d;
    }
    if (from_d) stream_wait_u32_geq(s, flags_.get() + d, seq_);
  }
  if (cfg_.timing) t_waited_.record(s);
  for (size_t i = 0; i < plan_.slices.size(); ++i) {
    const Slice& sl = plan_.slices[i];
    if (sl.gpu != rank_ || guest_slot_[i] < 0) continue;
    const int64_t row = recv_cap_ + guest_off_[i];
    expert_ffn(cublas_.get(), s, guest_in_.get() + guest_off_[i] * H_, sl.rows, slots_.get() + guest_slot_[i] * w,
               gu_.get() + row * 2 * F_, act_.get() + row * F_, guest_out_.get() + guest_off_[i] * H_, H_, F_);
    guests += sl.rows;
  }
  if (cfg_.timing) t_guest_.record(s);
  stats_.guest_rows = guests;

  // 6. Guest outputs back to their owners (copy engine), owner by owner, each ended by a flag.
  ev_guest_done_.record(s);
  const cudaStream_t co = copy_out_.get();
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(co, ev_guest_done_.get(), 0));
  for (int d = 0; d < R; ++d) {
    out_batch_.clear();
    for (size_t i = 0; i < plan_.slices.size(); ++i) {
      const Slice& sl = plan_.slices[i];
      if (sl.gpu != rank_ || guest_slot_[i] < 0 || topo.home(sl.expert) != d) continue;
      out_batch_.push_back({peers_[d].yrecv + (expert_base_[sl.expert] + slice_offset_[i]) * H_,
                            guest_out_.get() + guest_off_[i] * H_, static_cast<size_t>(sl.rows) * row_bytes});
    }
    if (!out_batch_.empty()) ce_copy_and_signal(co, out_batch_, peers_[d].flags + R + rank_, seq_);
  }
  ev_copy_out_done_.record(co);
  // My exported rows' outputs: wait for each helper's flag.
  for (int h = 0; h < R; ++h) {
    bool to_h = false;
    for (size_t i = 0; i < plan_.slices.size() && !to_h; ++i) {
      to_h = plan_.slices[i].gpu == h && guest_slot_[i] >= 0 && topo.home(plan_.slices[i].expert) == rank_;
    }
    if (to_h) stream_wait_u32_geq(s, flags_.get() + R + h, seq_);
  }

  // 7. Reverse all-to-all-v (outputs back to the tokens' ranks) and the weighted combine.
  back_sends_.clear();
  back_recvs_.clear();
  for (const Chunk& c : recvs_) {
    back_sends_.push_back({c.peer, yrecv_.get() + (static_cast<bf16*>(c.ptr) - recv_.get()), c.bytes});
  }
  for (const Chunk& c : sends_) {
    back_recvs_.push_back({c.peer, ybuf_.get() + (static_cast<bf16*>(c.ptr) - send_.get()), c.bytes});
  }
  transport_.exchange(back_sends_, back_recvs_, s);
  FEPLB_CUDA_CHECK(kernels::combine(ybuf_.get(), pair_pos_.get(), topk_weight, num_tokens, static_cast<int>(K_), H_,
                                    out, s));

  // Buffers the copy streams read or write are reused next forward: order them before it.
  wait_seq(copies_seq_, seq_, "phase-2 copies");
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_copy_in_done_.get(), 0));
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_copy_out_done_.get(), 0));
  if (cfg_.timing) t_end_.record(s);
}

}  // namespace feplb::cuda
