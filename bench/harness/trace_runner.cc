#include "bench/harness/trace_runner.h"

#include <cstdlib>
#include <exception>
#include <thread>

#include "bench/harness/kernels/kernels.h"
#include "bench/harness/local_experts.h"
#include "bench/harness/rank_threads.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/gemm/expert_ffn.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/runtime.h"
#include "feplb/sim/workload.h"

namespace feplb::cuda {

void request_stream_connections() { setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0); }

int64_t worst_receiver_rows(const Trace& t, const Topology& topo) {
  int64_t worst = 0;
  for (const RoutingStep& s : t.steps) {
    for (int d = 0; d < topo.num_ranks(); ++d) {
      int64_t rows = 0;
      for (int e : topo.local_experts(d)) rows += s.expert_counts[e];
      worst = std::max(worst, rows);
    }
  }
  return worst;
}

namespace {

// One measured forward's statistics into a rank's series (`mode`: rank 0's plan mode, else null).
void record(const ForwardStats& st, const std::string* mode, VirtualLayerStats& p) {
  p.counts_to_host_us.push_back(st.counts_to_host_us);
  p.plan_us.push_back(st.plan_us);
  if (st.prime_us > 0) p.prime_us.push_back(st.prime_us);
  p.primes_overtaken += st.prime_overtaken ? 1 : 0;
  if (mode) p.plan_modes.push_back(*mode);
  if (st.plan_reserve_us > 0) {
    p.plan_reserve_us.push_back(st.plan_reserve_us);
    p.reserved_plan_us.push_back(st.plan_us);
  }
  p.counts_to_plan_us.push_back(st.counts_to_host_us + st.plan_us);
  if (st.copies > 0) p.counts_to_first_copy_us.push_back(st.counts_to_first_copy_us);
  p.wait_ms.push_back(st.wait_ms);
  p.wait_pct.push_back(st.forward_ms > 0 ? 100.0 * st.wait_ms / st.forward_ms : 0.0);
  p.forward_ms.push_back(st.forward_ms);
}

// Every rank's series, one after another.
VirtualLayerStats merge(const std::vector<VirtualLayerStats>& per, int steps) {
  VirtualLayerStats all;
  all.forwards = steps;
  all.start_times = per.front().start_times;
  auto cat = [](std::vector<double>& a, const std::vector<double>& b) {
    a.insert(a.end(), b.begin(), b.end());
  };
  for (const VirtualLayerStats& p : per) {
    cat(all.counts_to_first_copy_us, p.counts_to_first_copy_us);
    cat(all.counts_to_host_us, p.counts_to_host_us);
    cat(all.plan_us, p.plan_us);
    cat(all.prime_us, p.prime_us);
    all.primes_overtaken += p.primes_overtaken;
    cat(all.plan_reserve_us, p.plan_reserve_us);
    cat(all.reserved_plan_us, p.reserved_plan_us);
    all.plan_modes.insert(all.plan_modes.end(), p.plan_modes.begin(), p.plan_modes.end());
    cat(all.counts_to_plan_us, p.counts_to_plan_us);
    cat(all.wait_ms, p.wait_ms);
    cat(all.wait_pct, p.wait_pct);
    cat(all.forward_ms, p.forward_ms);
  }
  return all;
}

}  // namespace

VirtualLayerStats run_virtual_layer(const Trace& t, const ExpertShape& shape,
                                    const std::string& policy, const Knobs& knobs, int steps,
                                    int gpus_per_node, double timeout_s, bool measure_planner,
                                    bool prime_planner, ExpertGemm expert_gemm) {
  const int R = t.num_ranks;
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  FEPLB_REQUIRE_INPUT(
      R == 1 || (conn && std::atoi(conn) >= 3 * R + 2),
      "{} virtual ranks need CUDA_DEVICE_MAX_CONNECTIONS >= {} (set before the process starts)", R,
      3 * R + 2);
  const int64_t S = t.tokens_per_rank, K = t.top_k, H = shape.hidden, F = shape.ffn;
  RuntimeConfig c;
  c.topo = Topology::contiguous(R, gpus_per_node, t.num_experts);
  c.shape = shape;
  c.max_top_k = static_cast<int>(K);
  c.max_tokens = S;
  c.knobs = knobs;
  c.recv_capacity_rows =
      worst_receiver_rows(t, c.topo);  // not the dropless worst case (R x memory)
  c.guest_capacity_rows = S * K;
  c.training = false;
  c.timing = true;
  c.sync_before_counts = true;
  c.timeout_s = timeout_s;
  c.name = "run." + policy;
  c.measure_planner = measure_planner;
  c.expert_gemm = expert_gemm;
  c.prime_planner = prime_planner;
  InProcessGroup group(R, timeout_s);
  std::vector<VirtualLayerStats> per(static_cast<size_t>(R));
  run_rank_threads(R, [&](int r) {
    EpRuntime runtime(c, group.endpoint(r));
    const std::span<const ModeTime> start = runtime.planner_times();
    per[static_cast<size_t>(r)].start_times.assign(start.begin(), start.end());
    MoeLayer layer(runtime, LayerConfig{static_cast<int>(K), "run"},
                   make_gpu_planner(runtime, policy));
    Stream s;
    LocalExperts experts(c.topo.experts_per_rank(), H, F, /*grads=*/false);
    DeviceBuffer<__nv_bfloat16> x(static_cast<size_t>(S * H)), out(static_cast<size_t>(S * H));
    DeviceBuffer<int32_t> idx(static_cast<size_t>(S * K));
    DeviceBuffer<float> wt(static_cast<size_t>(S * K));
    FEPLB_CUDA_CHECK(kernels::fill_random(experts.weights(),
                                          static_cast<size_t>(experts.weight_elems()), 100 + r,
                                          1.0f / 64, s.get()));
    FEPLB_CUDA_CHECK(kernels::fill_random(x.get(), x.size(), 200 + r, 1.0f, s.get()));
    const std::vector<float> wts(static_cast<size_t>(S * K), 1.0f / static_cast<float>(K));
    if (S > 0)
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(wt.get(), wts.data(), wt.bytes(), cudaMemcpyHostToDevice, s.get()));
    for (int i = 0; i < steps + 2; ++i) {
      const RoutingStep& step = t.steps[static_cast<size_t>(i) % t.steps.size()];
      const auto topk = topk_from_counts(step.row(r), S, static_cast<int>(K));
      if (S > 0)
        FEPLB_CUDA_CHECK(
            cudaMemcpyAsync(idx.get(), topk.data(), idx.bytes(), cudaMemcpyHostToDevice, s.get()));
      sync_with_timeout(s.get(), timeout_s, "routing upload");
      layer.forward(experts.params(), x.get(), idx.get(), wt.get(), S, out.get(), s.get());
      sync_with_timeout(s.get(), timeout_s, "layer forward");
      if (i < 2) continue;  // warm-up
      record(layer.last_forward_stats(), r == 0 ? &layer.last_plan().mode : nullptr, per[r]);
    }
  });
  return merge(per, steps);
}

std::vector<double> rank_gemm_ms(ExpertBench& bench, const Plan& plan, int num_ranks, int reps,
                                 ExpertBench::Gemms gemms) {
  std::vector<double> ms;
  for (const auto& rows : ExpertBench::rows_per_gpu(plan, num_ranks))
    ms.push_back(bench.run_ms(rows, 1, reps, ExpertBench::Pass::kForward, gemms));
  return ms;
}

}  // namespace feplb::cuda
