// feplb_dist_layer_bench: the FEPLB MoE layer, forward and backward, on N GPUs (one process per
// GPU, torchrun-style environment; scripts/gpu-dist starts them), per policy (static, feplb-paper,
// feplb) over the steps of a routing trace, against the simulator's prediction for the same steps.
//
// Every policy's layer is built up front on the rank's one EpRuntime (the weights are the same
// caller-owned tensors for all) and the policies are interleaved per step: step i runs each policy
// once, in an order rotated every step (policy k at position (k - i) mod n), so A/B comparisons
// come from the same moments and no policy is always first (--interleave off: one policy after
// another, each after its own GPU warm-up). `balanced` is the floor: the same steps' rows spread
// evenly over every expert (so over every GPU), run through the same layer with no balancing;
// each policy's share of the static-to-balanced gain is `gain_captured`. Before the first step
// (each policy's, when sequential) a cuBLAS GEMM burn of the layer's expert FFN runs >=
// --gpu-warmup s (2) and until its per-iteration time is stable, so clocks ramping up from idle do
// not land on one policy.
//
// Per measured step (2 warm-up steps first), every rank times its forward and its backward with
// CUDA events (a barrier before each step) and keeps the layer's own ForwardStats/BackwardStats;
// the ranks all-gather them, so a step's layer time is the max over ranks. The plan the layer ran
// (the same on every rank) gives the token straggler and the cost model's GEMM straggler; the
// stats give the measured one (max - mean over ranks of own + guest GEMM time). Then, the layers
// freed, the phase-1 all-to-all-v and the reverse one alone, with the layer's exact chunk sizes,
// and the counts all-gather (the one exchange round FEPLB adds), through the same transport.
// FasterMoE does not run on the GPU layer (it moves weights to the tokens' sources, a dispatch
// this layer does not do): the JSON says so and carries its simulated numbers.
//
// Usage: scripts/gpu-dist 2 build/bin/feplb_dist_layer_bench --out h200-x2-layer.json
// WORLD_SIZE 1 runs too (a plumbing check: every expert is local, nothing moves between GPUs).
// Exit status: 0 done, 1 a rank failed (a silent peer is an error after --timeout), 2 bad input,
// 3 the --deadline watchdog fired (partial JSON written).
#include <cuda_bf16.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/harness/kernels/kernels.h"
#include "bench/harness/local_experts.h"
#include "feplb/core/cost_model.h"
#include "feplb/core/error.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/file_io.h"
#include "feplb/core/knobs.h"
#include "feplb/core/metrics.h"
#include "feplb/core/stats.h"
#include "feplb/core/trace_io.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/device.h"
#include "feplb/cuda/gemm/expert_ffn.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/cuda/runtime.h"
#include "feplb/dist/launch.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/simulate.h"
#include "feplb/sim/workload.h"

namespace feplb::cuda {
namespace {

using json = nlohmann::ordered_json;
using bf16 = __nv_bfloat16;

const std::vector<std::string> kGpuPolicies = {"static", "feplb-paper", "feplb", "balanced"};

// `balanced` runs the static planner on evenly spread routing.
std::string planner_of(const std::string& policy) {
  return policy == "balanced" ? "static" : policy;
}

// This rank's rows of a step spread evenly over the experts: the same S*K rows, E-way even.
std::vector<int64_t> balanced_row(int64_t rows, int num_experts, int rank) {
  std::vector<int64_t> row(static_cast<size_t>(num_experts), rows / num_experts);
  for (int64_t i = 0; i < rows % num_experts; ++i)
    row[static_cast<size_t>((rank + i) % num_experts)] += 1;
  return row;
}

struct Options {
  std::string out;
  std::string trace_path = "data/traces/default.json";
  std::string prior_path = "data/priors/mixtral-8x7b__olmoe-repo__c4.json";
  std::string table_path = "data/cost/h200-glm5.json";
  std::string shape = "glm5";
  std::vector<std::string> knobs;  // NAME=VALUE
  int steps = 16, warmup = 2, exchange_reps = 10;
  double deadline_s = 480, timeout_s = 60;
  double gpu_warmup_s = 2;        // GEMM burn before the first step (0: none)
  std::string interleave = "on";  // on, off (auto: on)
  uint64_t seed = 1;
};

// ---- the results document, shared with the watchdog -----------------------------------------
std::mutex g_doc_mu;
json g_doc;
std::string g_out;
int g_rank = 0;

// Rank 0 writes the document (under g_doc_mu).
void save_locked() {
  if (g_rank != 0 || g_out.empty()) return;
  write_file(g_out, g_doc.dump(2) + "\n", /*overwrite=*/true);
}

void save() {
  std::lock_guard<std::mutex> lock(g_doc_mu);
  save_locked();
}

template <typename... A>
void log0(fmt::format_string<A...> f, A&&... a) {
  if (g_rank != 0) return;
  const std::string s = fmt::format(f, std::forward<A>(a)...);
  std::fprintf(stderr, "%s\n", s.c_str());
  std::fflush(stderr);
}

json spread(const std::vector<double>& v) {
  return json{{"median", quantile_of(v, 0.5)},
              {"p10", quantile_of(v, 0.1)},
              {"p90", quantile_of(v, 0.9)},
              {"mean", mean_of(v)},
              {"n", v.size()}};
}

double max_minus_mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()) - mean_of(v);
}

double max_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

// Every rank's small float vector, all-gathered through the transport (an NCCL all-gather),
// synchronously with a bounded wait. Doubles as the barrier.
class Gather {
 public:
  static constexpr size_t kMax = 32;
  Gather(Transport& t, cudaStream_t s, double timeout_s)
      : t_(t),
        s_(s),
        timeout_s_(timeout_s),
        mine_(kMax),
        all_(kMax * static_cast<size_t>(t.world_size())),
        host_(kMax * static_cast<size_t>(t.world_size())) {}

  // [world][values.size()]
  std::vector<std::vector<double>> all(const std::vector<double>& values) {
    FEPLB_CHECK(values.size() <= kMax, "gather: {} values", values.size());
    std::vector<float> f(kMax, 0.0f);
    for (size_t i = 0; i < values.size(); ++i) f[i] = static_cast<float>(values[i]);
    std::vector<int32_t> bits(kMax);
    std::memcpy(bits.data(), f.data(), kMax * sizeof(float));
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(mine_.get(), bits.data(), mine_.bytes(), cudaMemcpyHostToDevice, s_));
    t_.all_gather_i32(mine_.get(), all_.get(), kMax, s_);
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(host_.data(), all_.get(), all_.bytes(), cudaMemcpyDeviceToHost, s_));
    sync_with_timeout(s_, timeout_s_, "dist layer bench: all-gather of measurements");
    std::vector<std::vector<double>> out(static_cast<size_t>(t_.world_size()));
    for (size_t r = 0; r < out.size(); ++r) {
      for (size_t i = 0; i < values.size(); ++i) {
        float x = 0;
        std::memcpy(&x, &host_[r * kMax + i], sizeof(x));
        out[r].push_back(static_cast<double>(x));
      }
    }
    return out;
  }
  // Column `i` of all(): every rank's value.
  static std::vector<double> column(const std::vector<std::vector<double>>& a, size_t i) {
    std::vector<double> c;
    for (const auto& r : a) c.push_back(r.at(i));
    return c;
  }
  void barrier() { all({0.0}); }

 private:
  Transport& t_;
  cudaStream_t s_;
  double timeout_s_;
  DeviceBuffer<int32_t> mine_, all_;
  std::vector<int32_t> host_;
};

// Per-rank values gathered after each measured step, in this order.
enum Field : size_t {
  kFwdMs,
  kBwdMs,
  kStFwdMs,
  kStDispatchMs,
  kStStaticMs,
  kStWaitMs,
  kStGuestMs,
  kStReturnMs,
  kStCombineMs,
  kBwBwdMs,
  kBwDispatchMs,
  kBwStaticMs,
  kBwWaitMs,
  kBwGuestMs,
  kBwResultsWaitMs,
  kBwCombineMs,
  kPlanUs,
  kCountsToCopyUs,
  kCopies,
  kGuestRows,
  kRecopies,
  kCountsToPlanUs,
  kPlanToCopyUs,
  kGpuCountsToCopyMs,
  kNumFields
};

// The phases of a forward and of a backward, in timeline order (ForwardStats / BackwardStats).
const std::vector<std::pair<const char*, Field>> kForwardPhases = {
    {"dispatch", kStDispatchMs}, {"static_gemms", kStStaticMs}, {"copy_wait", kStWaitMs},
    {"guest_gemms", kStGuestMs}, {"return", kStReturnMs},       {"combine", kStCombineMs}};
const std::vector<std::pair<const char*, Field>> kBackwardPhases = {
    {"dispatch", kBwDispatchMs}, {"static_gemms", kBwStaticMs}, {"copy_wait", kBwWaitMs},
    {"guest_gemms", kBwGuestMs}, {"return", kBwResultsWaitMs},  {"combine", kBwCombineMs}};

// One policy's per-step series (max over ranks unless named otherwise).
struct PolicySeries {
  std::vector<double> fwd_ms, bwd_ms, total_ms;  // max over ranks; total: of each rank's fwd + bwd
  std::vector<double> token_straggler, token_max_over_mean, gemm_pred_ms;  // the plan's
  std::vector<double> gemm_meas_fwd_ms,
      gemm_meas_bwd_ms;                          // max - mean over ranks of static + guest
  std::vector<double> wait_fwd_ms, wait_bwd_ms;  // max over ranks
  std::vector<double> wait_fwd_mean_ms, wait_bwd_mean_ms;  // mean over ranks
  std::vector<double> plan_us, counts_to_first_copy_us;  // every rank (copies only for the latter)
  // Plan latency, every rank: counts seen on the host -> plan ready, plan ready -> first phase-2
  // copy issued (host clock; ranks that copied), counts all-gather done -> first copy starts (GPU).
  std::vector<double> counts_to_plan_us, plan_to_first_copy_us, gpu_counts_to_first_copy_us;
  double guest_rows = 0, copies = 0, weight_recopies = 0;  // totals over steps and ranks
  std::vector<std::vector<std::vector<double>>>
      phases;  // [rank][field][step] timeline, CUDA events
};

class Bench {
 public:
  Bench(const Options& o, const dist::LaunchEnv& env) : o_(o), env_(env) {}

  int run();

  // After an error: say so, keep what was measured, abort the communicator (pending NCCL work
  // returns) and leave without running destructors that could wait on a dead peer's work.
  [[noreturn]] void fail(int code, const std::string& what) {
    std::fprintf(stderr, "feplb_dist_layer_bench: rank %d: %s\n", env_.rank, what.c_str());
    {
      std::lock_guard<std::mutex> lock(g_doc_mu);
      g_doc["incomplete"] = fmt::format("rank {} failed: {}", env_.rank, what);
      try {
        save_locked();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "feplb_dist_layer_bench: could not save: %s\n", e.what());
      }
    }
    if (comm_) comm_->abort();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }

 private:
  // run()'s sections, in order.
  void connect();
  std::vector<std::string> describe();
  void make_inputs();
  json run_policies(const std::vector<std::string>& policies, std::vector<PolicySeries>& series);
  void record_memory();
  json summarise(const std::vector<std::string>& policies, const std::vector<PolicySeries>& series,
                 json& pol);
  void finish_document(const json& pol, const json& ex);
  void load_workload();
  std::unique_ptr<MoeLayer> make_layer(const std::string& policy);
  void run_step(MoeLayer& layer, const std::string& policy, size_t i, PolicySeries& ps);
  json timeline_json(const PolicySeries& ps) const;
  json policy_json(const PolicySeries& ps) const;
  json warm_gpu(const std::string& label);
  json time_exchanges();
  // Step `st`'s phase-1 chunks as the layer sends and receives them (one per (peer, expert),
  // expert-major on the home), on the exchange buffers.
  void exchange_chunks(const RoutingStep& st, std::vector<Chunk>& sends,
                       std::vector<Chunk>& recvs) const;
  json simulate_steps();
  void upload_routing(size_t i, bool balanced);
  const RoutingStep& step_at(size_t i) const { return trace_.steps[i % trace_.steps.size()]; }

  Options o_;
  dist::LaunchEnv env_;
  int rank_ = 0, world_ = 1;
  Knobs knobs_;
  Trace trace_;
  std::string trace_source_;
  ExpertShape shape_;
  std::unique_ptr<Topology> topo_;
  std::unique_ptr<TableCostModel> table_;
  std::unique_ptr<RooflineCostModel> roofline_;
  const GemmCostModel* cost_ = nullptr;
  std::string cost_label_;
  int64_t S_ = 0, K_ = 0, H_ = 0, recv_cap_ = 0;
  std::vector<std::vector<int32_t>> topk_;           // [warmup + steps][S K] this rank's routing
  std::vector<std::vector<int32_t>> topk_balanced_;  // the same rows spread evenly over the experts
  std::vector<RoutingStep> balanced_steps_;          // every rank's balanced counts, per step

  // Declared in teardown order (last destroyed first): the communicator outlives everything.
  std::unique_ptr<NcclCommunicator> comm_;
  std::unique_ptr<Transport> t_;
  std::unique_ptr<Stream> s_;
  std::unique_ptr<Gather> g_;
  std::unique_ptr<EpRuntime> runtime_;
  std::unique_ptr<LocalExperts> experts_;  // this rank's weights and fp32 gradients: every policy's
  size_t saved_bytes_ = 0;                 // the most one micro-batch kept from forward to backward
  DeviceBuffer<bf16> x_, out_, gout_, gx_;
  DeviceBuffer<int32_t> idx_;
  DeviceBuffer<float> wt_, gw_;
  DeviceBuffer<bf16> a2a_send_, a2a_recv_, a2a_back_;
  DeviceBuffer<int32_t> counts_, counts_all_;
  std::unique_ptr<Event> e0_, e1_, e2_;
  std::vector<std::unique_ptr<MoeLayer>>
      layers_;  // one per policy (interleaved) or the current one
};

void Bench::load_workload() {
  const Trace given = read_trace(o_.trace_path);
  if (given.num_ranks == world_) {
    trace_ = given;
    trace_source_ = o_.trace_path;
  } else {
    // Same experts, top-k and tokens per rank, routing drawn for WORLD_SIZE ranks from a prior.
    const Prior prior = expand_prior(read_prior(o_.prior_path), given.num_experts, o_.seed);
    WorkloadSpec spec;
    spec.num_ranks = world_;
    spec.tokens_per_rank = given.tokens_per_rank;
    spec.top_k = given.top_k;
    spec.seed = o_.seed;
    const int64_t needed = o_.warmup + o_.steps;
    spec.num_steps =
        std::max<int64_t>(1, (needed + prior.num_layers() - 1) / std::max(1, prior.num_layers()));
    trace_ = generate_trace(prior, spec);
    trace_.model = given.model;
    trace_source_ = fmt::format(
        "generated: {} ranks from {} (widened to {} experts, seed {}); {} has {} ranks", world_,
        o_.prior_path, given.num_experts, o_.seed, o_.trace_path, given.num_ranks);
  }
  FEPLB_REQUIRE_INPUT(!trace_.steps.empty(), "{}: no steps", o_.trace_path);
  const auto shape = shape_for_model(o_.shape);
  FEPLB_REQUIRE_INPUT(shape.has_value(),
                      "--shape: unknown model shape '{}' (glm5, qwen3-235b, olmoe, mixtral-8x7b)",
                      o_.shape);
  shape_ = *shape;
  // GPUs of one process group are one NVLink domain (one node); more ranks than local GPUs make
  // several domains, and rows never leave one.
  topo_ = std::make_unique<Topology>(Topology::contiguous(
      world_, std::max(1, std::min(env_.local_world_size, world_)), trace_.num_experts));
  S_ = trace_.tokens_per_rank;
  K_ = trace_.top_k;
  H_ = shape_.hidden;
  roofline_ = std::make_unique<RooflineCostModel>(shape_, knobs_);
  cost_ = roofline_.get();
  cost_label_ = "roofline (from the knobs)";
  std::error_code ec;
  if (!o_.table_path.empty() && std::filesystem::exists(o_.table_path, ec)) {
    table_ = std::make_unique<TableCostModel>(read_gemm_table(o_.table_path));
    if (table_->shape().hidden == shape_.hidden && table_->shape().ffn == shape_.ffn) {
      cost_ = table_.get();
      cost_label_ = fmt::format("measured table {} ({})", o_.table_path, table_->device());
    } else {
      cost_label_ += fmt::format("; {} is for another expert shape", o_.table_path);
    }
  } else {
    cost_label_ += fmt::format("; {} not found", o_.table_path);
  }
  // This rank's routing for every step it runs; receive room for the worst receiver among them.
  const size_t n = static_cast<size_t>(o_.warmup + o_.steps);
  for (size_t i = 0; i < n; ++i) {
    const RoutingStep& st = step_at(i);
    topk_.push_back(topk_from_counts(st.row(rank_), S_, static_cast<int>(K_)));
    RoutingStep even(st.step, st.layer, world_, trace_.num_experts);
    for (int r = 0; r < world_; ++r) {
      const auto row = balanced_row(S_ * K_, trace_.num_experts, r);
      std::copy(row.begin(), row.end(),
                even.counts.begin() + static_cast<std::ptrdiff_t>(r) * trace_.num_experts);
    }
    even.sum_experts();
    topk_balanced_.push_back(topk_from_counts(even.row(rank_), S_, static_cast<int>(K_)));
    for (const RoutingStep* x : std::initializer_list<const RoutingStep*>{&st, &even}) {
      for (int d = 0; d < world_; ++d) {
        int64_t rows = 0;
        for (int e : topo_->local_experts(d)) rows += x->expert_counts[e];
        recv_cap_ = std::max(recv_cap_, rows);
      }
    }
    balanced_steps_.push_back(std::move(even));
  }
  recv_cap_ = std::max<int64_t>(recv_cap_, 1);
}

void Bench::upload_routing(size_t i, bool balanced) {
  const std::vector<int32_t>& topk = balanced ? topk_balanced_[i] : topk_[i];
  if (S_ > 0) {
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(idx_.get(), topk.data(), idx_.bytes(), cudaMemcpyHostToDevice, s_->get()));
  }
  sync_with_timeout(s_->get(), o_.timeout_s, "routing upload");
}

// One policy's layer on the rank's runtime (every rank builds the same layers in the same order).
std::unique_ptr<MoeLayer> Bench::make_layer(const std::string& policy) {
  return std::make_unique<MoeLayer>(*runtime_, LayerConfig{static_cast<int>(K_), "dist." + policy},
                                    make_gpu_planner(*runtime_, planner_of(policy), cost_));
}

// One rank's numbers of a step, indexed by the field enum (the gather's row).
std::vector<double> step_fields(double fwd, double bwd, const ForwardStats& f,
                                const BackwardStats& b) {
  std::vector<double> v(kNumFields, 0.0);
  v[kFwdMs] = fwd;
  v[kBwdMs] = bwd;
  v[kStFwdMs] = f.forward_ms;
  v[kStDispatchMs] = f.dispatch_ms;
  v[kStStaticMs] = f.static_ms;
  v[kStWaitMs] = f.wait_ms;
  v[kStGuestMs] = f.guest_ms;
  v[kStReturnMs] = f.return_ms;
  v[kStCombineMs] = f.combine_ms;
  v[kBwBwdMs] = b.backward_ms;
  v[kBwDispatchMs] = b.dispatch_ms;
  v[kBwStaticMs] = b.static_ms;
  v[kBwWaitMs] = b.wait_ms;
  v[kBwGuestMs] = b.guest_ms;
  v[kBwResultsWaitMs] = b.results_wait_ms;
  v[kBwCombineMs] = b.combine_ms;
  v[kPlanUs] = f.plan_us;
  v[kCountsToCopyUs] = f.copies > 0 ? f.counts_to_first_copy_us : -1.0;
  v[kCountsToPlanUs] = f.counts_to_plan_us;
  v[kPlanToCopyUs] = f.copies > 0 ? f.plan_to_first_copy_us : -1.0;
  v[kGpuCountsToCopyMs] = f.copies > 0 ? f.gpu_counts_to_first_copy_ms : -1.0;
  v[kCopies] = static_cast<double>(f.copies + b.copies);
  v[kGuestRows] = static_cast<double>(f.guest_rows);
  v[kRecopies] = static_cast<double>(b.weight_recopies);
  return v;
}

// A measured step of every rank (`all`, gathered) and its plan's metrics into the policy's series.
void append_step(const std::vector<std::vector<double>>& all, const StepMetrics& m,
                 PolicySeries& ps) {
  std::vector<double> total, gf, gb;
  if (ps.phases.empty()) {
    ps.phases.assign(all.size(), std::vector<std::vector<double>>(kNumFields));
  }
  for (size_t r = 0; r < all.size(); ++r) {
    for (size_t k = 0; k < kNumFields; ++k) ps.phases[r][k].push_back(all[r][k]);
  }
  for (const auto& r : all) {
    total.push_back(r[kFwdMs] + r[kBwdMs]);
    gf.push_back(r[kStStaticMs] + r[kStGuestMs]);
    gb.push_back(r[kBwStaticMs] + r[kBwGuestMs]);
    ps.plan_us.push_back(r[kPlanUs]);
    if (r[kCountsToCopyUs] >= 0) ps.counts_to_first_copy_us.push_back(r[kCountsToCopyUs]);
    ps.counts_to_plan_us.push_back(r[kCountsToPlanUs]);
    if (r[kPlanToCopyUs] >= 0) ps.plan_to_first_copy_us.push_back(r[kPlanToCopyUs]);
    if (r[kGpuCountsToCopyMs] > 0) {
      ps.gpu_counts_to_first_copy_us.push_back(1e3 * r[kGpuCountsToCopyMs]);
    }
    ps.copies += r[kCopies];
    ps.guest_rows += r[kGuestRows];
    ps.weight_recopies += r[kRecopies];
  }
  ps.fwd_ms.push_back(max_of(Gather::column(all, kFwdMs)));
  ps.bwd_ms.push_back(max_of(Gather::column(all, kBwdMs)));
  ps.total_ms.push_back(max_of(total));
  ps.gemm_meas_fwd_ms.push_back(max_minus_mean(gf));
  ps.gemm_meas_bwd_ms.push_back(max_minus_mean(gb));
  const auto wf = Gather::column(all, kStWaitMs), wb = Gather::column(all, kBwWaitMs);
  ps.wait_fwd_ms.push_back(max_of(wf));
  ps.wait_bwd_ms.push_back(max_of(wb));
  ps.wait_fwd_mean_ms.push_back(mean_of(wf));
  ps.wait_bwd_mean_ms.push_back(mean_of(wb));
  ps.token_straggler.push_back(m.token_straggler);
  ps.token_max_over_mean.push_back(m.token_max_over_mean);
  ps.gemm_pred_ms.push_back(m.gemm_straggler_ms);
}

// Step i (warm-up steps first) of one policy's layer: forward + backward, timed, gathered; the
// measured ones appended to ps.
void Bench::run_step(MoeLayer& layer, const std::string& policy, size_t i, PolicySeries& ps) {
  const cudaStream_t s = s_->get();
  upload_routing(i, policy == "balanced");
  g_->barrier();
  e0_->record(s);
  MicroBatch mb =
      layer.forward(experts_->params(), x_.get(), idx_.get(), wt_.get(), S_, out_.get(), s);
  saved_bytes_ = std::max(saved_bytes_, mb.saved_bytes());
  e1_->record(s);
  layer.backward(std::move(mb), experts_->params(), gout_.get(), wt_.get(), gx_.get(), gw_.get(),
                 experts_->grad_views(), GradMode::kAccumulate, s);
  e2_->record(s);
  sync_with_timeout(s, o_.timeout_s, "layer forward + backward");
  const double fwd = elapsed_ms(*e0_, *e1_), bwd = elapsed_ms(*e1_, *e2_);
  const ForwardStats& f = layer.last_forward_stats();
  const BackwardStats& b = layer.last_backward_stats();
  const std::vector<double> v = step_fields(fwd, bwd, f, b);
  const StepMetrics m = measure_plan(layer.last_plan(), *topo_, *cost_, 0.0);
  // Untimed: the helpers' gradient contributions land, the gradient starts again at zero, and
  // every row count met so far gets its exact GEMM algorithm (a training job reaches that steady
  // state after a few steps; a short benchmark would otherwise time the bucket algorithms and the
  // layer's bounded refinement, which favour whichever policy met a row count second).
  layer.sync_gradients(s);
  FEPLB_CUDA_CHECK(cudaMemsetAsync(experts_->grads(), 0, experts_->grad_bytes(), s));
  layer.refine_gemm_algorithms(-1);
  sync_with_timeout(s, o_.timeout_s, "gradients");
  const auto all = g_->all(v);  // every rank's numbers; also keeps the ranks in step
  if (i < static_cast<size_t>(o_.warmup)) return;
  append_step(all, m, ps);
  log0(
      "  {:<12} step {:>3}: fwd {:7.3f} ms  bwd {:7.3f} ms  token straggler {:6.0f} rows  GEMM "
      "straggler "
      "{:.3f} ms (predicted {:.3f})  wait fwd {:.3f} bwd {:.3f} ms",
      policy, i - static_cast<size_t>(o_.warmup), ps.fwd_ms.back(), ps.bwd_ms.back(),
      m.token_straggler, ps.gemm_meas_fwd_ms.back(), m.gemm_straggler_ms, ps.wait_fwd_ms.back(),
      ps.wait_bwd_ms.back());
}

// One policy's results from its measured steps so far (all of them at the end; partial JSON).
json Bench::policy_json(const PolicySeries& ps) const {
  const double steps = static_cast<double>(std::max<size_t>(1, ps.fwd_ms.size()));
  json j;
  j["ran_on_gpu"] = true;
  j["token_straggler_rows"] = spread(ps.token_straggler);
  j["token_max_over_mean"] = spread(ps.token_max_over_mean);
  j["gemm_straggler_ms"] = {{"measured_forward", spread(ps.gemm_meas_fwd_ms)},
                            {"measured_backward", spread(ps.gemm_meas_bwd_ms)},
                            {"predicted_forward", spread(ps.gemm_pred_ms)}};
  j["layer_fwd_ms"] = spread(ps.fwd_ms);
  j["layer_bwd_ms"] = spread(ps.bwd_ms);
  j["layer_fwd_bwd_ms"] = spread(ps.total_ms);
  j["wait_ms"] = {{"forward_max_over_ranks", spread(ps.wait_fwd_ms)},
                  {"backward_max_over_ranks", spread(ps.wait_bwd_ms)},
                  {"forward_mean_over_ranks", spread(ps.wait_fwd_mean_ms)},
                  {"backward_mean_over_ranks", spread(ps.wait_bwd_mean_ms)}};
  j["plan_us"] = spread(ps.plan_us);
  j["counts_to_first_copy_us"] = spread(ps.counts_to_first_copy_us);
  const auto quantile = [](const std::vector<double>& v, double q) {
    return v.empty() ? json(nullptr) : json(quantile_of(v, q));
  };
  j["plan_latency_us"] = {
      {"counts_to_plan_p50", quantile(ps.counts_to_plan_us, 0.5)},
      {"counts_to_plan_p99", quantile(ps.counts_to_plan_us, 0.99)},
      {"plan_to_first_copy_p50", quantile(ps.plan_to_first_copy_us, 0.5)},
      {"plan_to_first_copy_p99", quantile(ps.plan_to_first_copy_us, 0.99)},
      {"gpu_counts_to_first_copy_p50", quantile(ps.gpu_counts_to_first_copy_us, 0.5)},
      {"gpu_counts_to_first_copy_p99", quantile(ps.gpu_counts_to_first_copy_us, 0.99)},
      {"samples",
       {{"counts_to_plan", ps.counts_to_plan_us.size()},
        {"plan_to_first_copy", ps.plan_to_first_copy_us.size()},
        {"gpu_counts_to_first_copy", ps.gpu_counts_to_first_copy_us.size()}}}};
  j["phase2_copies_per_step"] = ps.copies / steps;
  j["guest_rows_per_step"] = ps.guest_rows / steps;
  j["backward_weight_recopies_per_step"] = ps.weight_recopies / steps;
  j["timeline_ms"] = timeline_json(ps);
  return j;
}

// Per rank, the median over the measured steps of each phase of the forward and the backward
// (CUDA events on the rank's compute stream; they add up to the rank's forward / backward time).
json Bench::timeline_json(const PolicySeries& ps) const {
  json ranks = json::array();
  for (const auto& fields : ps.phases) {
    json fwd, bwd;
    for (const auto& [name, f] : kForwardPhases) fwd[name] = quantile_of(fields[f], 0.5);
    for (const auto& [name, f] : kBackwardPhases) bwd[name] = quantile_of(fields[f], 0.5);
    fwd["total"] = quantile_of(fields[kStFwdMs], 0.5);
    bwd["total"] = quantile_of(fields[kBwBwdMs], 0.5);
    ranks.push_back({{"forward", fwd}, {"backward", bwd}});
  }
  return ranks;
}

// GPU warm-up before measuring: clocks ramp up from idle over the first second or so under load,
// which would land on whichever policy runs first. Back-to-back cuBLAS forward passes of one
// expert FFN of the layer's shape (rows sized for ~0.4 TFLOP per pass, 8 passes an iteration,
// CUDA events), for at least --gpu-warmup s and until the last 10 iterations agree within 3% on
// every rank (at most max(2 x, + 5 s) of it). Touches no layer: the planners' history stays the
// trace's steps. Every rank stops at the same iteration (the decision is from gathered values).
json Bench::warm_gpu(const std::string& label) {
  if (o_.gpu_warmup_s <= 0) return json{{"skipped", "--gpu-warmup 0"}};
  const cudaStream_t s = s_->get();
  const int64_t H = shape_.hidden, F = shape_.ffn;
  const int64_t rows = std::clamp<int64_t>(
      (static_cast<int64_t>(4e11 / (6.0 * static_cast<double>(H) * static_cast<double>(F))) + 255) /
          256 * 256,
      256, 16384);
  const int passes = 8, window = 10;
  const double tolerance = 0.03, cap_s = std::max(2 * o_.gpu_warmup_s, o_.gpu_warmup_s + 5);
  DeviceBuffer<bf16> w(static_cast<size_t>(expert_weight_elems(H, F))),
      xb(static_cast<size_t>(rows * H)), gu(static_cast<size_t>(rows * 2 * F)),
      act(static_cast<size_t>(rows * F)), y(static_cast<size_t>(rows * H));
  FEPLB_CUDA_CHECK(kernels::fill_random(w.get(), w.size(),
                                        o_.seed * 1000 + 900 + static_cast<uint64_t>(rank_),
                                        1.0f / std::sqrt(static_cast<float>(H)), s));
  FEPLB_CUDA_CHECK(kernels::fill_random(
      xb.get(), xb.size(), o_.seed * 1000 + 901 + static_cast<uint64_t>(rank_), 1.0f, s));
  sync_with_timeout(s, o_.timeout_s, "GPU warm-up buffers");
  GemmEngine gemm;
  g_->barrier();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> iter_ms;
  bool stable = false;
  double seconds = 0;
  for (;;) {
    e0_->record(s);
    for (int k = 0; k < passes; ++k) {
      expert_ffn(gemm, s, xb.get(), rows, w.get(), w.get() + 2 * H * F, gu.get(), act.get(),
                 y.get(), H, F);
    }
    e1_->record(s);
    sync_with_timeout(s, o_.timeout_s, "GPU warm-up");
    iter_ms.push_back(elapsed_ms(*e0_, *e1_));
    bool mine = false;
    if (iter_ms.size() >= static_cast<size_t>(window)) {
      const std::vector<double> last(iter_ms.end() - window, iter_ms.end());
      const double med = quantile_of(last, 0.5);
      mine = med > 0 && (*std::max_element(last.begin(), last.end()) -
                         *std::min_element(last.begin(), last.end())) <= tolerance * med;
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto all = g_->all({el, mine ? 1.0 : 0.0});
    const std::vector<double> els = Gather::column(all, 0), st = Gather::column(all, 1);
    seconds = max_of(els);
    stable = *std::min_element(st.begin(), st.end()) > 0.5;
    if ((*std::min_element(els.begin(), els.end()) >= o_.gpu_warmup_s && stable) ||
        seconds >= cap_s)
      break;
  }
  const double first = iter_ms.front(), last = iter_ms.back();
  const std::vector<double> tail(iter_ms.end() - std::min<size_t>(iter_ms.size(), window),
                                 iter_ms.end());
  log0(
      "GPU warm-up{}: {} iterations of {} x expert FFN ({} rows) in {:.2f} s: {:.3f} -> {:.3f} ms "
      "per iteration{}",
      label.empty() ? std::string() : " (" + label + ")", iter_ms.size(), passes, rows, seconds,
      first, last, stable ? "" : " (not stable within 3% by the cap)");
  return json{
      {"method",
       fmt::format("cuBLAS forward of one {}x{} expert FFN, {} rows, {} passes per iteration, "
                   ">= {} s and until the last {} iterations agree within {}% on every rank "
                   "(cap {} s)",
                   H, F, rows, passes, o_.gpu_warmup_s, window, tolerance * 100, cap_s)},
      {"seconds", seconds},
      {"iterations", iter_ms.size()},
      {"first_iteration_ms", first},
      {"last_iterations_ms", spread(tail)},
      {"stable", stable}};
}

void Bench::exchange_chunks(const RoutingStep& st, std::vector<Chunk>& sends,
                            std::vector<Chunk>& recvs) const {
  const int E = trace_.num_experts;
  const size_t row_bytes = static_cast<size_t>(H_) * sizeof(bf16);
  int64_t off = 0;
  for (int d = 0; d < world_; ++d) {
    for (int e : topo_->local_experts(d)) {
      const int64_t rows = st.at(rank_, e);
      sends.push_back({d, a2a_send_.get() + off * H_, static_cast<size_t>(rows) * row_bytes});
      off += rows;
    }
  }
  std::vector<int64_t> base(static_cast<size_t>(E), 0);
  int64_t b = 0;
  for (int e : topo_->local_experts(rank_)) {
    base[e] = b;
    b += st.expert_counts[e];
  }
  for (int src = 0; src < world_; ++src) {
    for (int e : topo_->local_experts(rank_)) {
      int64_t o = base[e];
      for (int before = 0; before < src; ++before) o += st.at(before, e);
      recvs.push_back(
          {src, a2a_recv_.get() + o * H_, static_cast<size_t>(st.at(src, e)) * row_bytes});
    }
  }
}

// The phase-1 all-to-all-v and the reverse one alone, chunked as the layer's phase 1
// (exchange_chunks), and the counts all-gather, each step's time the max over ranks, median of the
// repetitions.
json Bench::time_exchanges() {
  const cudaStream_t s = s_->get();
  const int E = trace_.num_experts;
  a2a_send_ = DeviceBuffer<bf16>(static_cast<size_t>(std::max<int64_t>(1, S_ * K_) * H_));
  a2a_back_ = DeviceBuffer<bf16>(a2a_send_.size());
  a2a_recv_ = DeviceBuffer<bf16>(static_cast<size_t>(recv_cap_ * H_));
  counts_ = DeviceBuffer<int32_t>(static_cast<size_t>(E));
  counts_all_ = DeviceBuffer<int32_t>(static_cast<size_t>(E) * static_cast<size_t>(world_));
  FEPLB_CUDA_CHECK(kernels::fill_random(a2a_send_.get(), a2a_send_.size(),
                                        o_.seed * 7 + static_cast<uint64_t>(rank_), 1.0f, s));
  FEPLB_CUDA_CHECK(cudaMemsetAsync(counts_.get(), 0, counts_.bytes(), s));
  sync_with_timeout(s, o_.timeout_s, "exchange buffers");
  const int warm = 2;
  std::vector<double> dispatch_ms, combine_ms, both_ms, gather_ms;
  for (size_t i = static_cast<size_t>(o_.warmup); i < static_cast<size_t>(o_.warmup + o_.steps);
       ++i) {
    const RoutingStep& st = step_at(i);
    std::vector<Chunk> sends, recvs;
    exchange_chunks(st, sends, recvs);
    // Reverse: what arrived goes back to its source, into the send layout (a separate buffer).
    std::vector<Chunk> back_sends = recvs, back_recvs = sends;
    for (Chunk& ch : back_recvs)
      ch.ptr = a2a_back_.get() + (static_cast<bf16*>(ch.ptr) - a2a_send_.get());
    std::vector<double> d_ms, c_ms, t_ms, g_ms;
    for (int r = 0; r < warm + o_.exchange_reps; ++r) {
      g_->barrier();
      e0_->record(s);
      t_->exchange(sends, recvs, s);
      e1_->record(s);
      t_->exchange(back_sends, back_recvs, s);
      e2_->record(s);
      sync_with_timeout(s, o_.timeout_s, "all-to-all-v alone");
      const double dm = elapsed_ms(*e0_, *e1_), cm = elapsed_ms(*e1_, *e2_);
      g_->barrier();
      e0_->record(s);
      t_->all_gather_i32(counts_.get(), counts_all_.get(), static_cast<size_t>(E), s);
      e1_->record(s);
      sync_with_timeout(s, o_.timeout_s, "counts all-gather alone");
      const double gm = elapsed_ms(*e0_, *e1_);
      const auto all = g_->all({dm, cm, dm + cm, gm});
      if (r < warm) continue;
      d_ms.push_back(max_of(Gather::column(all, 0)));
      c_ms.push_back(max_of(Gather::column(all, 1)));
      t_ms.push_back(max_of(Gather::column(all, 2)));
      g_ms.push_back(max_of(Gather::column(all, 3)));
    }
    dispatch_ms.push_back(quantile_of(d_ms, 0.5));
    combine_ms.push_back(quantile_of(c_ms, 0.5));
    both_ms.push_back(quantile_of(t_ms, 0.5));
    gather_ms.push_back(quantile_of(g_ms, 0.5));
  }
  log0(
      "exchanges alone (median over steps): dispatch {:.3f} ms, combine {:.3f} ms, counts "
      "all-gather {:.4f} ms",
      quantile_of(dispatch_ms, 0.5), quantile_of(combine_ms, 0.5), quantile_of(gather_ms, 0.5));
  return json{
      {"dispatch_ms", spread(dispatch_ms)},
      {"combine_ms", spread(combine_ms)},
      {"dispatch_plus_combine_ms", spread(both_ms)},
      {"counts_allgather_ms", spread(gather_ms)},
      {"reps_per_step", o_.exchange_reps},
      {"method",
       "per measured step: the layer's phase-1 all-to-all-v (one chunk per (peer, expert), the "
       "step's "
       "routing) and the reverse one, then an all-gather of [E] int32 counts, alone through the "
       "same "
       "NCCL transport; CUDA events, each repetition's time the max over ranks, the median of the "
       "repetitions per step; the spread is over steps"}};
}

// The simulator on the same steps in the same order (the planners see the same history the layer's
// planner saw): static, feplb-paper, feplb and fastermoe, with the same cost model and knobs.
json Bench::simulate_steps() {
  Trace sub = trace_;
  sub.steps.clear();
  for (size_t i = 0; i < static_cast<size_t>(o_.warmup + o_.steps); ++i) {
    RoutingStep st = step_at(i);
    st.step =
        static_cast<int64_t>(i);  // one micro-batch each, one layer: as the GPU layer ran them
    st.layer = 0;
    sub.steps.push_back(std::move(st));
  }
  SimulationConfig cfg;
  cfg.policies = {"static", "feplb-paper", "feplb", "fastermoe"};
  cfg.gpus_per_node = topo_->domain_size();
  cfg.warmup_steps = o_.warmup;
  cfg.shape = shape_;
  cfg.knobs = knobs_;
  cfg.trace_label = trace_source_;
  cfg.cost = cost_;
  cfg.cost_label = cost_label_;
  const SimulationResult res = simulate(sub, cfg);
  json j;
  for (const PolicyResult& p : res.policies) {
    std::vector<double> st, sg, mom;
    for (const StepMetrics& m : p.steps) {
      st.push_back(m.token_straggler);
      sg.push_back(m.gemm_straggler_ms);
      mom.push_back(m.token_max_over_mean);
    }
    j[p.name] = {{"token_straggler_rows", spread(st)},
                 {"token_max_over_mean", spread(mom)},
                 {"gemm_straggler_ms", spread(sg)},
                 {"copy_exposed_ms", p.summary.copy_exposed_ms},
                 {"fits_static_window", p.summary.fits_static_window},
                 {"weight_mib_per_step", p.summary.weight_bytes_per_step / (1 << 20)},
                 {"token_mib_per_step", p.summary.token_bytes_per_step / (1 << 20)}};
  }
  return j;
}

// One process per GPU: the communicator, the knobs and the workload.
void Bench::connect() {
  comm_ = std::make_unique<NcclCommunicator>(env_, o_.timeout_s);
  t_ = comm_->transport();  // collective (peer reachability probe)
  rank_ = t_->rank();
  world_ = t_->world_size();
  FEPLB_CHECK(rank_ == env_.rank && world_ == env_.world_size,
              "NCCL says rank {} of {}, the environment {} of {}", rank_, world_, env_.rank,
              env_.world_size);
  std::vector<KnobOverride> overrides;
  for (const std::string& kv : o_.knobs) overrides.push_back(parse_knob_override(kv));
  apply_knobs(knobs_, overrides);
  validate_knobs(knobs_);
  load_workload();
}

// The document's header (devices, topology, shape, knobs); the policies that run here (static
// alone where the GPUs cannot address each other's memory).
std::vector<std::string> Bench::describe() {
  const bool peers = t_->supports_peer_copies();
  std::vector<std::string> policies = kGpuPolicies;
  std::string skipped;
  if (!peers) {
    policies = {"static"};
    skipped =
        "the GPUs cannot address each other's memory (CUDA IPC peer access), so only static ran";
  }
  const std::vector<DeviceInfo> devices = list_devices();
  std::vector<std::string> names;
  for (int r = 0; r < world_ && r < static_cast<int>(devices.size()); ++r)
    names.push_back(devices[r].name);
  log0(
      "feplb_dist_layer_bench: {} rank(s), {}; {}; {}; top-{} x {} tokens per rank; trace: {}; "
      "GEMM model: {}",
      world_, names.empty() ? std::string("?") : names[0], topo_->describe(), shape_.describe(), K_,
      S_, trace_source_, cost_label_);
  if (world_ == 1)
    log0("WORLD_SIZE 1: a plumbing check; every expert is local, nothing moves between GPUs");
  {
    std::lock_guard<std::mutex> lock(g_doc_mu);
    json& d = g_doc;
    d["benchmark"] = "feplb_dist_layer_bench";
    d["world_size"] = world_;
    d["devices"] = names;
    if (!devices.empty()) {
      d["driver"] = devices[0].driver_version;
      d["runtime"] = devices[0].runtime_version;
    }
    d["topology"] = topo_->describe();
    d["expert_shape"] = shape_.describe();
    d["num_experts"] = trace_.num_experts;
    d["top_k"] = K_;
    d["tokens_per_rank"] = S_;
    d["trace"] = trace_source_;
    d["steps"] = o_.steps;
    d["warmup_steps"] = o_.warmup;
    d["cost_model"] = cost_label_;
    d["knobs"] = {{"dyn", knobs_.dyn},
                  {"max_num_dyn", knobs_.max_num_dyn},
                  {"tau", knobs_.tau},
                  {"max_helpers_per_expert", knobs_.max_helpers_per_expert},
                  {"overrides", o_.knobs}};
    d["peer_copies"] = peers;
    if (world_ == 1) {
      d["note"] =
          "WORLD_SIZE 1: a plumbing check (NCCL bootstrap, transport, layer forward + backward on "
          "one GPU); "
          "every expert is local, so no policy moves anything";
    }
    if (!skipped.empty()) d["skipped"] = skipped;
  }
  save();

  return policies;
}

// The inputs, the runtime (collective) and the experts' weights, the same for every policy.
void Bench::make_inputs() {
  s_ = std::make_unique<Stream>();
  const cudaStream_t s = s_->get();
  g_ = std::make_unique<Gather>(*t_, s, o_.timeout_s);
  e0_ = std::make_unique<Event>(true);
  e1_ = std::make_unique<Event>(true);
  e2_ = std::make_unique<Event>(true);
  const size_t act = static_cast<size_t>(std::max<int64_t>(1, S_) * H_),
               pairs = static_cast<size_t>(std::max<int64_t>(1, S_ * K_));
  x_ = DeviceBuffer<bf16>(act);
  out_ = DeviceBuffer<bf16>(act);
  gout_ = DeviceBuffer<bf16>(act);
  gx_ = DeviceBuffer<bf16>(act);
  idx_ = DeviceBuffer<int32_t>(pairs);
  wt_ = DeviceBuffer<float>(pairs);
  gw_ = DeviceBuffer<float>(pairs);
  FEPLB_CUDA_CHECK(kernels::fill_random(
      x_.get(), act, o_.seed * 31 + 200 + static_cast<uint64_t>(rank_), 1.0f, s));
  FEPLB_CUDA_CHECK(kernels::fill_random(
      gout_.get(), act, o_.seed * 31 + 300 + static_cast<uint64_t>(rank_), 1.0f, s));
  const std::vector<float> uniform(pairs, 1.0f / static_cast<float>(K_));
  FEPLB_CUDA_CHECK(
      cudaMemcpyAsync(wt_.get(), uniform.data(), wt_.bytes(), cudaMemcpyHostToDevice, s));
  sync_with_timeout(s, o_.timeout_s, "inputs");
  RuntimeConfig rc;
  rc.topo = *topo_;
  rc.shape = shape_;
  rc.max_top_k = static_cast<int>(K_);
  rc.max_tokens = S_;
  rc.knobs = knobs_;
  rc.recv_capacity_rows = recv_cap_;
  rc.timeout_s = o_.timeout_s;
  rc.timing = true;
  rc.training = true;
  rc.name = "dist";
  runtime_ = std::make_unique<EpRuntime>(rc, *t_);  // collective
  experts_ =
      std::make_unique<LocalExperts>(topo_->experts_per_rank(), H_, shape_.ffn, /*grads=*/true);
  // The same weights for every policy (seeded by rank).
  FEPLB_CUDA_CHECK(kernels::fill_random(experts_->weights(),
                                        static_cast<size_t>(experts_->weight_elems()),
                                        o_.seed * 1000 + 100 + static_cast<uint64_t>(rank_),
                                        1.0f / std::sqrt(static_cast<float>(H_)), s));
  FEPLB_CUDA_CHECK(cudaMemsetAsync(experts_->grads(), 0, experts_->grad_bytes(), s));
  sync_with_timeout(s, o_.timeout_s, "weights");
}

// Every policy's steps on the one runtime, interleaved or one policy after another; each policy's
// JSON, as far as measured, saved as it goes.
json Bench::run_policies(const std::vector<std::string>& policies,
                         std::vector<PolicySeries>& series) {
  // Every policy's layer on the one runtime: a layer holds its planner, the runtime the buffers.
  const size_t np = policies.size(), n_steps = static_cast<size_t>(o_.warmup + o_.steps);
  const bool interleaved = o_.interleave != "off";
  const double gib = 1024.0 * 1024.0 * 1024.0;
  log0(
      "memory per rank: runtime workspace {:.2f} GiB, weights {:.2f} GiB + fp32 gradients {:.2f} "
      "GiB; {}",
      static_cast<double>(runtime_->workspace_bytes()) / gib,
      static_cast<double>(experts_->weight_elems()) * 2 / gib,
      static_cast<double>(experts_->grad_bytes()) / gib,
      interleaved ? "interleaved (all layers built up front)" : "sequential (one layer at a time)");
  {
    std::lock_guard<std::mutex> lock(g_doc_mu);
    g_doc["interleaved"] = interleaved;
    g_doc["policy_order"] =
        interleaved
            ? "interleaved: step i runs every policy once, in the order policies[(j + i) mod n] "
              "for "
              "j = 0..n-1 (rotated each step), all layers built up front on one runtime"
            : "sequential: one policy's steps after another's, each after its own GPU warm-up";
    save_locked();
  }

  json pol, warmups;
  if (interleaved) {
    for (size_t p = 0; p < np; ++p) layers_.push_back(make_layer(policies[p]));
    warmups["all"] = warm_gpu("");
    {
      std::lock_guard<std::mutex> lock(g_doc_mu);
      g_doc["gpu_warmup"] = warmups;
      save_locked();
    }
    std::string names_list;
    for (const std::string& name : policies) names_list += (names_list.empty() ? "" : ", ") + name;
    log0("{}: {} steps after {} warm-up, interleaved", names_list, o_.steps, o_.warmup);
    for (size_t i = 0; i < n_steps; ++i) {
      for (size_t j = 0; j < np; ++j) {
        const size_t p = (j + i) % np;
        run_step(*layers_[p], policies[p], i, series[p]);
      }
      if (i < static_cast<size_t>(o_.warmup)) continue;
      for (size_t p = 0; p < np; ++p) pol[policies[p]] = policy_json(series[p]);
      std::lock_guard<std::mutex> lock(g_doc_mu);
      g_doc["policies"] = pol;
      save_locked();
    }
    g_->barrier();  // nobody frees buffers a peer may still address
    layers_.clear();
  } else {
    for (size_t p = 0; p < np; ++p) {
      layers_.push_back(make_layer(policies[p]));
      warmups[policies[p]] = warm_gpu(policies[p]);
      log0("{}: {} steps after {} warm-up", policies[p], o_.steps, o_.warmup);
      for (size_t i = 0; i < n_steps; ++i) run_step(*layers_.back(), policies[p], i, series[p]);
      g_->barrier();  // nobody frees buffers a peer may still address
      layers_.clear();
      pol[policies[p]] = policy_json(series[p]);
      std::lock_guard<std::mutex> lock(g_doc_mu);
      g_doc["gpu_warmup"] = warmups;
      g_doc["policies"] = pol;
      save_locked();
    }
  }
  return pol;
}

void Bench::record_memory() {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  {
    std::lock_guard<std::mutex> lock(g_doc_mu);
    g_doc["memory_gib"] = {
        {"runtime_workspace", static_cast<double>(runtime_->workspace_bytes()) / gib},
        {"saved_per_micro_batch_max", static_cast<double>(saved_bytes_) / gib},
        {"weights", static_cast<double>(experts_->weight_elems()) * 2 / gib},
        {"fp32_gradients", static_cast<double>(experts_->grad_bytes()) / gib}};
  }
}

// The exchanges timed alone and the simulator's prediction beside each policy's measurements:
// the EP overhead, speedups, gain captured, the log lines. Returns the exchanges' JSON.
json Bench::summarise(const std::vector<std::string>& policies,
                      const std::vector<PolicySeries>& series, json& pol) {
  const json ex = time_exchanges();
  const double gather_ms = ex["counts_allgather_ms"]["median"].get<double>();
  const double dc_ms = ex["dispatch_plus_combine_ms"]["median"].get<double>();
  const json sim = simulate_steps();
  const double static_total = quantile_of(series[0].total_ms, 0.5),
               static_fwd = quantile_of(series[0].fwd_ms, 0.5),
               static_bwd = quantile_of(series[0].bwd_ms, 0.5);
  const auto at = std::find(policies.begin(), policies.end(), "balanced");
  const double balanced_total =
      at == policies.end()
          ? 0.0
          : quantile_of(series[static_cast<size_t>(at - policies.begin())].total_ms, 0.5);
  for (size_t p = 0; p < policies.size(); ++p) {
    const PolicySeries& ps = series[p];
    json& j = pol[policies[p]];
    const double total = quantile_of(ps.total_ms, 0.5), fwd = quantile_of(ps.fwd_ms, 0.5),
                 bwd = quantile_of(ps.bwd_ms, 0.5);
    j["ep_overhead_pct"] = total > 0 ? 100.0 * gather_ms / total : 0.0;
    j["ep_overhead_fwd_pct"] = fwd > 0 ? 100.0 * gather_ms / fwd : 0.0;
    // Forward and backward each run one dispatch and one combine of the same sizes.
    j["dispatch_combine_pct"] = total > 0 ? 100.0 * 2 * dc_ms / total : 0.0;
    j["dispatch_combine_fwd_pct"] = fwd > 0 ? 100.0 * dc_ms / fwd : 0.0;
    j["speedup_vs_static"] = {{"fwd_bwd", total > 0 ? static_total / total : 0.0},
                              {"fwd", fwd > 0 ? static_fwd / fwd : 0.0},
                              {"bwd", bwd > 0 ? static_bwd / bwd : 0.0}};
    if (balanced_total > 0) {
      const double gain = static_total - balanced_total;
      j["vs_balanced_pct"] = 100.0 * (total / balanced_total - 1.0);
      j["gain_captured"] = gain > 0 ? (static_total - total) / gain : 0.0;
    }
    if (sim.contains(policies[p])) {
      j["predicted"] = sim[policies[p]];
      j["gemm_straggler_ms"]["predicted_simulator"] = sim[policies[p]]["gemm_straggler_ms"];
    }
    log0(
        "{:<12} fwd {:7.3f} ms  bwd {:7.3f} ms  (x{:.3f} vs static)  token straggler {:6.0f} rows  "
        "GEMM straggler "
        "{:.3f} ms measured, {:.3f} predicted  wait fwd {:.3f} ms  EP overhead {:.2f}%  "
        "dispatch+combine {:.1f}%",
        policies[p], fwd, bwd, total > 0 ? static_total / total : 0.0,
        quantile_of(ps.token_straggler, 0.5), quantile_of(ps.gemm_meas_fwd_ms, 0.5),
        quantile_of(ps.gemm_pred_ms, 0.5), quantile_of(ps.wait_fwd_ms, 0.5),
        j["ep_overhead_pct"].get<double>(), j["dispatch_combine_pct"].get<double>());
    if (!ps.counts_to_plan_us.empty()) {
      const auto q = [](const std::vector<double>& v, double level) {
        return v.empty() ? 0.0 : quantile_of(v, level);
      };
      log0(
          "{:<12} plan latency us: counts -> plan p50 {:.1f} p99 {:.1f}; plan -> first copy p50 "
          "{:.1f} p99 {:.1f} (host); counts -> first copy on the GPU p50 {:.1f} p99 {:.1f}",
          policies[p], q(ps.counts_to_plan_us, 0.5), q(ps.counts_to_plan_us, 0.99),
          q(ps.plan_to_first_copy_us, 0.5), q(ps.plan_to_first_copy_us, 0.99),
          q(ps.gpu_counts_to_first_copy_us, 0.5), q(ps.gpu_counts_to_first_copy_us, 0.99));
    }
  }
  pol["fastermoe"] = {
      {"ran_on_gpu", false},
      {"why",
       "the GPU layer runs static, feplb-paper, feplb and oracle only: FasterMoE shadows hot "
       "experts' "
       "weights to the tokens' source GPUs, a dispatch this layer does not implement"},
      {"predicted", sim.value("fastermoe", json::object())}};
  if (sim.contains("fastermoe")) {
    log0(
        "fastermoe    (simulation only) token straggler {:.0f} rows, GEMM straggler {:.3f} ms "
        "predicted",
        sim["fastermoe"]["token_straggler_rows"]["median"].get<double>(),
        sim["fastermoe"]["gemm_straggler_ms"]["median"].get<double>());
  }
  return ex;
}

// The document's last part: the policies, the exchanges and what every number means.
void Bench::finish_document(const json& pol, const json& ex) {
  {
    std::lock_guard<std::mutex> lock(g_doc_mu);
    g_doc["policies"] = pol;
    g_doc["exchange_alone"] = ex;
    g_doc["definitions"] = {
        {"layer_time",
         "per step, max over ranks of each rank's CUDA-event time around forward() / backward() "
         "(a barrier before each step); spreads are median, p10, p90, mean over the measured "
         "steps"},
        {"token_straggler_rows",
         "max over GPUs - mean of the token-expert rows each GPU computes, from the plan "
         "the layer ran (layer.last_plan())"},
        {"gemm_straggler_ms.measured_forward",
         "max - mean over ranks of ForwardStats static_ms + guest_ms (own "
         "and guest experts' GEMMs, CUDA events)"},
        {"gemm_straggler_ms.measured_backward", "the same from BackwardStats"},
        {"gemm_straggler_ms.predicted_forward",
         "the cost model (cost_model) on the plan the layer ran"},
        {"gemm_straggler_ms.predicted_simulator",
         "feplb simulate's planner on the same steps in the same order"},
        {"wait_ms",
         "idle time on the compute stream waiting for phase-2 inputs after the own experts "
         "(exposed copy "
         "time), ForwardStats / BackwardStats"},
        {"ep_overhead_pct",
         "FEPLB's extra exchange round: 100 x the counts all-gather (timed alone, once per "
         "forward; backward reuses the plan) / layer forward + backward time (median). The paper "
         "claims < 1%. This layer runs the all-gather for static too. _fwd_pct: / forward only"},
        {"dispatch_combine_pct",
         "the plain EP dispatch + combine (phase-1 all-to-all-v and the reverse one, timed "
         "alone with the layer's chunk sizes; forward and backward each run one of each) "
         "as 100 x 2 x (dispatch + combine) / layer forward + backward; _fwd_pct: one of "
         "each / forward only. Not an overhead of FEPLB: phase 1 is the same for every "
         "policy"},
        {"speedup_vs_static", "static's median layer time / this policy's"},
        {"balanced",
         "the floor: every step's rows spread evenly over the experts (each rank's S*K rows, E-way "
         "even), run through the same layer with the static planner"},
        {"gain_captured",
         "(static - policy) / (static - balanced) of the median fwd + bwd layer time"},
        {"vs_balanced_pct", "100 x (policy / balanced - 1) of the median fwd + bwd layer time"},
        {"timeline_ms",
         "per rank, the median over steps of each phase of forward and backward (CUDA events): "
         "dispatch (permute, counts all-gather, plan, all-to-all-v), static_gemms, copy_wait "
         "(idle until phase-2 inputs land), guest_gemms, return (until this rank's exported "
         "rows' results are back), combine (reverse all-to-all-v, combine)"}};
    g_doc["definitions"]["plan_latency_us"] =
        "per forward and rank, one process per GPU, p50 and p99 over every rank's measured "
        "forwards (all ranks pooled): counts_to_plan = host steady clock on the rank's scheduler "
        "thread, from its poll of the CUDA event after the gathered counts' device-to-host copy "
        "first succeeding (counts seen on the host) to the plan ready (routing assembled, planner "
        "run, step layout built and checked); plan_to_first_copy = host clock, plan ready to the "
        "first phase-2 copy call (ranks that issued copies; on the two-phase path it includes "
        "waiting for the caller's thread to post phase 1); gpu_counts_to_first_copy = CUDA events "
        "on the rank's GPU, counts all-gather done on the compute stream to the first phase-2 copy "
        "starting on the copy stream (the whole chain as the GPU sees it), in us";
    g_doc["complete"] = true;
    save_locked();
  }
}

int Bench::run() {
  connect();
  const std::vector<std::string> policies = describe();
  make_inputs();
  std::vector<PolicySeries> series(policies.size());
  json pol = run_policies(policies, series);
  record_memory();
  runtime_.reset();
  g_->barrier();
  const json ex = summarise(policies, series, pol);
  finish_document(pol, ex);
  if (rank_ == 0 && !o_.out.empty()) log0("wrote {}", o_.out);
  g_->barrier();
  return 0;
}

}  // namespace
}  // namespace feplb::cuda

int main(int argc, char** argv) {
  using feplb::cuda::Options;
  Options o;
  CLI::App app{
      "feplb_dist_layer_bench: the FEPLB layer (forward + backward) on N GPUs, one process per "
      "GPU"};
  app.add_option("--out", o.out,
                 "JSON results (written by rank 0; partial on a deadline or an error)");
  app.add_option("--trace", o.trace_path,
                 "routing trace; regenerated from --prior when its ranks != WORLD_SIZE");
  app.add_option("--prior", o.prior_path, "expert-popularity prior for the regenerated routing");
  app.add_option("--table", o.table_path,
                 "GEMM cost table (feplb-gemm-table-v1); roofline when missing");
  app.add_option("--shape", o.shape,
                 "expert shape by model name (glm5, qwen3-235b, olmoe, mixtral-8x7b)");
  app.add_option("--steps", o.steps, "measured steps per policy")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::Range(0, 1000));
  app.add_option("--exchange-reps", o.exchange_reps,
                 "timed repetitions of the exchanges alone, per step")
      ->check(CLI::Range(1, 10000));
  app.add_option("--gpu-warmup", o.gpu_warmup_s,
                 "GPU warm-up (s) before the first step: a cuBLAS GEMM burn until its time is "
                 "stable; 0: none")
      ->check(CLI::Range(0.0, 600.0));
  app.add_option(
         "--interleave", o.interleave,
         "auto: interleave the policies per step when all their layers fit in memory; on; off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--seed", o.seed, "weights, activations and regenerated routing");
  app.add_option("--knob", o.knobs,
                 "NAME=VALUE, a planner knob (feplb knobs lists them); repeatable");
  app.add_option("--timeout", o.timeout_s, "a peer silent this long is an error (s)")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--deadline", o.deadline_s,
                 "write what is measured and exit 3 after this many seconds")
      ->check(CLI::Range(1.0, 86400.0));
  CLI11_PARSE(app, argc, argv);
  // The layer's streams wait on stream memory operations; give each its own hardware queue.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  feplb::dist::LaunchEnv env;
  try {
    env = feplb::dist::launch_env_from_process();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb_dist_layer_bench: %s\n", e.what());
    return 2;
  }
  feplb::cuda::g_rank = env.rank;
  feplb::cuda::g_out = o.out;
  // Watchdog: a hung GPU or peer must not eat the whole lease.
  std::thread([deadline_s = o.deadline_s, rank = env.rank] {
    std::this_thread::sleep_for(std::chrono::duration<double>(deadline_s));
    std::fprintf(
        stderr,
        "feplb_dist_layer_bench: rank %d: deadline of %.0f s reached; saving partial results\n",
        rank, deadline_s);
    {
      std::lock_guard<std::mutex> lock(feplb::cuda::g_doc_mu);
      feplb::cuda::g_doc["incomplete"] = "deadline reached";
      try {
        feplb::cuda::save_locked();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "feplb_dist_layer_bench: could not save: %s\n", e.what());
      }
    }
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(3);
  }).detach();
  feplb::cuda::Bench bench(o, env);
  try {
    return bench.run();
  } catch (const feplb::InputError& e) {
    bench.fail(2, e.what());
  } catch (const std::exception& e) {
    bench.fail(1, e.what());
  }
}
