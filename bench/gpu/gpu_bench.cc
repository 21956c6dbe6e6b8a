// feplb_gpu_bench: the H200 measurements behind bench/results/h200.json (docs/gpu-results.md).
// CUDA events, warm-up, medians of many runs; A/B pairs interleaved. Usage:
//   feplb_gpu_bench --out h200.json --table-out gemm_table.json [--trace data/traces/default.json]
//                   [--prior data/priors/mixtral-8x7b__olmoe-repo__c4.json] [--quick]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/harness/expert_bench.h"
#include "bench/harness/kernels/kernels.h"
#include "bench/harness/local_experts.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/trace_runner.h"
#include "bench/harness/trainer.h"
#include "feplb/core/cost_model.h"
#include "feplb/core/file_io.h"
#include "feplb/core/metrics.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/stats.h"
#include "feplb/core/trace_io.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/device.h"
#include "feplb/cuda/gemm/expert_ffn.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/transport/ce_copy.h"
#include "feplb/cuda/transport/stream_ops.h"
#include "feplb/sim/cost_choice.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"

namespace feplb::cuda {
namespace {

using json = nlohmann::ordered_json;
using bf16 = __nv_bfloat16;

const ExpertShape kGlm5{6144, 2048, Dtype::kBf16};
// The Qwen3 expert shapes (H, F): sections shape_tables, paths and training use them.
const ExpertShape kQwen3_235b{4096, 1536, Dtype::kBf16}, kQwen3_30b{2048, 768, Dtype::kBf16};
const ExpertShape kOlmoe{2048, 1024, Dtype::kBf16};
double flops_of(const ExpertShape& s, int64_t rows) {
  return s.flops_per_row() * static_cast<double>(rows);
}

void log(const char* fmt_str, auto&&... args) {
  std::fputs(fmt::format(fmt::runtime(fmt_str), args...).c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

json spread(std::vector<double> v) {
  return json{{"median", quantile_of(v, 0.5)}, {"p10", quantile_of(v, 0.1)},
              {"p90", quantile_of(v, 0.9)},    {"min", quantile_of(v, 0.0)},
              {"max", quantile_of(v, 1.0)},    {"n", v.size()}};
}

// ---- cuBLAS peak -------------------------------------------------------------------------------
double gemm_tflops(int64_t m, int64_t n, int64_t k, int reps) {
  DeviceBuffer<bf16> a(m * k), b(k * n), c(m * n);
  Stream s;
  GemmEngine h;
  FEPLB_CUDA_CHECK(kernels::fill_random(a.get(), a.size(), 11, 1.0f, s.get()));
  FEPLB_CUDA_CHECK(kernels::fill_random(b.get(), b.size(), 12, 1.0f, s.get()));
  Event e0(true), e1(true);
  for (int i = 0; i < 3; ++i) gemm_bf16(h, s.get(), a.get(), b.get(), c.get(), m, n, k);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    e0.record(s.get());
    gemm_bf16(h, s.get(), a.get(), b.get(), c.get(), m, n, k);
    e1.record(s.get());
    FEPLB_CUDA_CHECK(cudaEventSynchronize(e1.get()));
    ms.push_back(elapsed_ms(e0, e1));
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
         (quantile_of(ms, 0.5) * 1e-3) / 1e12;
}

// ---- copy-engine bandwidth ---------------------------------------------------------------------
json copy_bandwidth(int reps) {
  const size_t bytes = size_t{256} << 20;
  DeviceBuffer<char> a(bytes), b(bytes);
  PinnedBuffer<char> host(bytes / 4);
  Stream s;
  Event e0(true), e1(true);
  auto time = [&](auto&& op) {
    op();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      e0.record(s.get());
      op();
      e1.record(s.get());
      FEPLB_CUDA_CHECK(cudaEventSynchronize(e1.get()));
      ms.push_back(elapsed_ms(e0, e1));
    }
    return quantile_of(ms, 0.5);
  };
  const double d2d = time([&] {
    ce_copy_and_signal(s.get(), std::vector<CeCopy>{{b.get(), a.get(), bytes}}, nullptr, 0);
  });
  const double batch = time([&] {
    void* dst[1] = {b.get()};
    const void* src[1] = {a.get()};
    size_t sz[1] = {bytes}, idx = 0;
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    FEPLB_CUDA_CHECK(cudaMemcpyBatchAsync(dst, src, sz, 1, &attr, &idx, 1, s.get()));
  });
  const double d2h = time([&] {
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(host.get(), a.get(), bytes / 4, cudaMemcpyDeviceToHost, s.get()));
  });
  const double sm24 =
      time([&] { FEPLB_CUDA_CHECK(kernels::sm_copy(a.get(), b.get(), bytes, 24, 0.0, s.get())); });
  const double sm132 =
      time([&] { FEPLB_CUDA_CHECK(kernels::sm_copy(a.get(), b.get(), bytes, 132, 0.0, s.get())); });
  auto gbps = [&](double ms, size_t n) { return static_cast<double>(n) / (ms * 1e-3) / 1e9; };
  return json{{"bytes", bytes},
              {"ce_d2d_gbps", gbps(d2d, bytes)},
              {"ce_batch_d2d_gbps", gbps(batch, bytes)},
              {"d2h_pinned_gbps", gbps(d2h, bytes / 4)},
              {"sm_copy_24_blocks_gbps", gbps(sm24, bytes)},
              {"sm_copy_132_blocks_gbps", gbps(sm132, bytes)},
              {"definition", "bytes copied / time (each byte is read once and written once)"}};
}

// ---- GEMM slowdown under concurrent data movement --------------------------------------------
json gemm_slowdown(ExpertBench& eb, double gbps, int pairs) {
  const std::vector<int64_t> rows(16, 2048);  // 16 experts x 2048 rows, GLM-5 shape
  const double alone_ms = eb.run_ms(rows, 1, 5);
  const size_t bytes = static_cast<size_t>(gbps * 1e9 * alone_ms * 1e-3) & ~size_t{15};
  DeviceBuffer<char> src(bytes), dst(bytes);
  Stream side;
  // CE paced to the rate from the host, as the scheduler thread issues phase-2 copies: one 8 MiB
  // cudaMemcpyAsync every chunk / rate (no kernel on the side stream at all).
  const size_t chunk = size_t{8} << 20;
  const auto period = std::chrono::duration<double>(static_cast<double>(chunk) / (gbps * 1e9));
  auto paced_ce = [&](cudaStream_t st) {
    return std::thread([&, st] {
      const auto t0 = std::chrono::steady_clock::now();
      size_t i = 0;
      for (size_t off = 0; off < bytes; off += chunk, ++i) {
        while (std::chrono::steady_clock::now() < t0 + i * period) {
        }
        const CeCopy c{dst.get() + off, src.get() + off, std::min(chunk, bytes - off)};
        ce_copy_and_signal(st, {&c, 1}, nullptr, 0);
      }
    });
  };
  Event start(true), stop(true), side_stop(true);
  auto timed = [&](int mode) {  // 0 alone, 1 CE copies, 2 SM copy 24 blocks, 3 SM copy 32 blocks
    FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
    start.record(eb.stream());
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(side.get(), start.get(), 0));
    std::thread pacer;
    if (mode == 1) pacer = paced_ce(side.get());
    if (mode == 2)
      FEPLB_CUDA_CHECK(kernels::sm_copy(src.get(), dst.get(), bytes, 24, gbps, side.get()));
    if (mode == 3)
      FEPLB_CUDA_CHECK(kernels::sm_copy(src.get(), dst.get(), bytes, 32, gbps, side.get()));
    side_stop.record(side.get());
    eb.enqueue(rows, 1);
    stop.record(eb.stream());
    if (pacer.joinable()) pacer.join();
    FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
    return static_cast<double>(elapsed_ms(start, stop));
  };
  // Interleave A/B per pair: alone, then with side traffic.
  std::vector<double> ce, sm24, sm32, base;
  for (int i = 0; i < pairs; ++i) {
    const double a1 = timed(0), c = timed(1), a2 = timed(0), s24 = timed(2), a3 = timed(0),
                 s32 = timed(3);
    base.push_back(a1);
    ce.push_back((c / a1 - 1) * 100);
    sm24.push_back((s24 / a2 - 1) * 100);
    sm32.push_back((s32 / a3 - 1) * 100);
  }
  return json{
      {"workload", "16 experts x 2048 rows, GLM-5 FFN, per-expert cublasGemmEx loop"},
      {"gemm_alone_ms", spread(base)},
      {"side_bytes", bytes},
      {"side_rate_gbps", gbps},
      {"ce_pct", spread(ce)},
      {"sm24_pct", spread(sm24)},
      {"sm32_pct", spread(sm32)},
      {"method",
       "pairs interleaved (alone, with side traffic); side traffic = rate x GEMM time alone, "
       "from the GEMM's start; CE: 8 MiB cudaMemcpyAsync calls issued by a host thread "
       "paced to the rate (nothing on the SMs); SM: a copy kernel holding 24 or 32 SMs, "
       "paced to the rate"}};
}

// ---- GEMM-time table ---------------------------------------------------------------------------
TableCostModel gemm_table(ExpertBench& eb, bool quick) {
  std::vector<int64_t> rows = {1,    8,    16,   32,   64,   96,   128,   160,   192,  256,  320,
                               384,  512,  640,  768,  896,  1024, 1280,  1536,  1792, 2048, 2560,
                               3072, 3584, 4096, 5120, 6144, 8192, 10240, 12288, 16384};
  if (quick) rows = {1, 64, 256, 1024, 4096, 16384};
  std::vector<double> ms;
  for (int64_t r : rows) {
    // 8 experts of r rows back to back (distinct weights), per-expert time = total / 8.
    const std::vector<int64_t> batch(8, r);
    ms.push_back(eb.run_ms(batch, 1, 7) / 8.0);
  }
  DeviceInfo dev = list_devices().at(0);
  return TableCostModel(rows, ms, eb.shape(), dev.name);
}

// ---- plans of a trace ------------------------------------------------------------------------
struct PlannedStep {
  std::string policy;
  size_t step;
  Plan plan;
};

std::vector<PlannedStep> plan_trace(const Trace& t, const std::vector<std::string>& policies,
                                    const Knobs& knobs, const GemmCostModel& cost,
                                    const std::vector<size_t>& steps) {
  const Topology topo = Topology::contiguous(t.num_ranks, 8, t.num_experts);
  std::vector<PlannedStep> out;
  for (const std::string& p : policies) {
    auto planner = make_planner(p, PlannerContext{topo, kGlm5, knobs, &cost});
    Plan plan;
    for (size_t i = 0; i < t.steps.size(); ++i) {
      if (std::find(steps.begin(), steps.end(), i) != steps.end()) {
        planner->plan(t.steps[i], plan);
        out.push_back({p, i, plan});
      }
      planner->observe(t.steps[i]);
    }
  }
  return out;
}

// Measured vs predicted GEMM straggler: each rank's experts timed alone on the GPU.
json measured_straggler(ExpertBench& eb, const Trace& t, const std::string& label,
                        const Knobs& knobs, const TableCostModel& table,
                        const RooflineCostModel& roofline, int nsteps) {
  std::vector<size_t> steps;
  for (int i = 0; i < nsteps; ++i)
    steps.push_back(t.steps.size() * static_cast<size_t>(i) / static_cast<size_t>(nsteps));
  const Topology topo = Topology::contiguous(t.num_ranks, 8, t.num_experts);
  json out = json::object();
  for (const std::string policy : {"static", "feplb-paper", "feplb"}) {
    std::vector<double> meas, pred_table, pred_roof;
    for (const PlannedStep& ps : plan_trace(t, {policy}, knobs, table, steps)) {
      const std::vector<double> g = rank_gemm_ms(eb, ps.plan, t.num_ranks, 5);
      meas.push_back(*std::max_element(g.begin(), g.end()) - mean_of(g));
      pred_table.push_back(measure_plan(ps.plan, topo, table, 0).gemm_straggler_ms);
      pred_roof.push_back(measure_plan(ps.plan, topo, roofline, 0).gemm_straggler_ms);
    }
    const double m = mean_of(meas), pt = mean_of(pred_table), pr = mean_of(pred_roof);
    out[policy] = {{"measured_ms", m},
                   {"predicted_table_ms", pt},
                   {"predicted_roofline_ms", pr},
                   {"table_error_pct", (pt / m - 1) * 100},
                   {"roofline_error_pct", (pr / m - 1) * 100},
                   {"steps", steps.size()}};
    log("  {:<28} {:<12} measured S_G {:.3f} ms, predicted {:.3f} (table) {:.3f} (roofline)", label,
        policy, m, pt, pr);
  }
  return out;
}

// The straggler timing alone produces: the same rank's work timed as 8 "ranks" (max - mean of 8
// runs of identical work), for the steps' busiest static rank and for feplb's busiest rank.
json straggler_noise_floor(ExpertBench& eb, const Trace& t, const Knobs& knobs,
                           const GemmCostModel& cost, int nsteps) {
  std::vector<size_t> steps;
  for (int i = 0; i < nsteps; ++i)
    steps.push_back(t.steps.size() * static_cast<size_t>(i) / static_cast<size_t>(nsteps));
  std::vector<double> floor_ms, rank_spread_pct;
  for (const PlannedStep& ps : plan_trace(t, {"feplb"}, knobs, cost, steps)) {
    const auto per_gpu = ExpertBench::rows_per_gpu(ps.plan, t.num_ranks);
    std::vector<double> g;
    for (int rep = 0; rep < t.num_ranks; ++rep) g.push_back(eb.run_ms(per_gpu[0], 1, 5));
    floor_ms.push_back(*std::max_element(g.begin(), g.end()) - mean_of(g));
    rank_spread_pct.push_back(
        100.0 * (*std::max_element(g.begin(), g.end()) - *std::min_element(g.begin(), g.end())) /
        mean_of(g));
  }
  return json{
      {"null_straggler_ms", spread(floor_ms)},
      {"same_work_max_min_pct", spread(rank_spread_pct)},
      {"method",
       "rank 0's work of a feplb plan timed num_ranks times (median of 5 each), as if each were a "
       "rank; max - mean of identical work is the timing noise floor of a measured straggler"}};
}

// The rows one GPU computes after feplb balances a real-prior trace step: the busiest GPU's slices.
std::vector<int64_t> skewed_rows(const Trace& t, const Knobs& knobs, const GemmCostModel& cost) {
  size_t worst = 0;
  int64_t worst_max = -1;
  for (size_t i = 0; i < t.steps.size(); ++i) {
    std::vector<int64_t> load(static_cast<size_t>(t.num_ranks), 0);
    for (int e = 0; e < t.num_experts; ++e)
      load[e / (t.num_experts / t.num_ranks)] += t.steps[i].expert_counts[e];
    const int64_t mx = *std::max_element(load.begin(), load.end());
    if (mx > worst_max) worst_max = mx, worst = i;
  }
  const auto planned = plan_trace(t, {"feplb"}, knobs, cost, {worst});
  const auto per_gpu = ExpertBench::rows_per_gpu(planned[0].plan, t.num_ranks);
  size_t busiest = 0;
  int64_t best = -1;
  for (size_t g = 0; g < per_gpu.size(); ++g) {
    int64_t s = 0;
    for (int64_t r : per_gpu[g]) s += r;
    if (s > best) best = s, busiest = g;
  }
  return per_gpu[busiest];
}

// The copies of a helper's incoming weights and rows, `w_bytes` and `r_bytes` in all (inflated to
// emulate a slower link), as copy-engine copies of at most one source block each, 16-byte sized.
std::vector<CeCopy> inflated_copies(double w_bytes, bf16* wdst, const bf16* wsrc, int64_t w_block,
                                    double r_bytes, bf16* rdst, const bf16* rsrc, size_t r_block) {
  std::vector<CeCopy> copies;
  const auto block = static_cast<double>(w_block), rows = static_cast<double>(r_block);
  for (double left = w_bytes; left > 0; left -= block)
    copies.push_back({wdst, wsrc, static_cast<size_t>(std::min(left, block)) & ~size_t{15}});
  for (double left = r_bytes; left > 0; left -= rows)
    copies.push_back({rdst, rsrc, static_cast<size_t>(std::min(left, rows)) & ~size_t{15}});
  return copies;
}

// ---- exposure, one helper at a time, copies at an emulated NVLink rate -----------------------
// Backward (pass kBackward): the helper's own experts' backward while its guests' dY rows arrive,
// with their weights again when `recopy` (the slot was reused by another layer since forward).
json isolated_exposure(ExpertBench& eb, const Trace& t, const Knobs& knobs,
                       const GemmCostModel& cost, double ce_gbps, double link_gbps, int nsteps,
                       double lead_us, ExpertBench::Pass pass = ExpertBench::Pass::kForward,
                       bool recopy = true) {
  std::vector<size_t> steps;
  for (int i = 0; i < nsteps; ++i)
    steps.push_back(t.steps.size() * static_cast<size_t>(i) / static_cast<size_t>(nsteps));
  const Topology topo = Topology::contiguous(t.num_ranks, 8, t.num_experts);
  const double inflate = std::max(1.0, ce_gbps / link_gbps);  // copy each byte this many times
  const int64_t H = kGlm5.hidden, we = expert_weight_elems(H, kGlm5.ffn);
  // Sources of the copies: 8 expert-sized weight blocks and a row block.
  DeviceBuffer<bf16> wsrc(static_cast<size_t>(8 * we)), wdst(static_cast<size_t>(8 * we));
  DeviceBuffer<bf16> rsrc(static_cast<size_t>(32768 * H)), rdst(static_cast<size_t>(32768 * H));
  DeviceBuffer<uint32_t> flag(1);
  FEPLB_CUDA_CHECK(cudaMemset(flag.get(), 0, 4));
  Stream copy;
  Event own_done(true), waited(true), start(true);
  uint32_t seq = 0;
  std::vector<double> exposed_pct, exposed_ms;
  for (const PlannedStep& ps : plan_trace(t, {"feplb"}, knobs, cost, steps)) {
    const auto per_gpu = ExpertBench::rows_per_gpu(ps.plan, t.num_ranks);
    double gmax = 0;
    for (const auto& rows : per_gpu) gmax = std::max(gmax, eb.run_ms(rows, 1, 3, pass));
    double worst = 0;
    for (int h = 0; h < t.num_ranks; ++h) {
      std::vector<int64_t> own, guest;
      int64_t in_weights = 0, in_rows = 0;
      for (const Slice& s : ps.plan.slices) {
        if (s.gpu != h) continue;
        if (topo.home(s.expert) == h) {
          own.push_back(s.rows);
        } else {
          guest.push_back(s.rows);
          in_weights += (pass == ExpertBench::Pass::kForward || recopy) ? 1 : 0;
          in_rows += s.rows;
        }
      }
      if (guest.empty()) continue;
      const std::vector<CeCopy> copies = inflated_copies(
          static_cast<double>(in_weights * we * 2) * inflate, wdst.get(), wsrc.get(), we * 2,
          static_cast<double>(in_rows * H * 2) * inflate, rdst.get(), rsrc.get(), rsrc.bytes());
      ++seq;
      FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
      const cudaStream_t s = eb.stream();
      start.record(s);
      FEPLB_CUDA_CHECK(cudaStreamWaitEvent(copy.get(), start.get(), 0));
      // The counts round trip and the planner come before the first copy.
      FEPLB_CUDA_CHECK(kernels::gpu_delay(static_cast<int64_t>(lead_us * 1e3), copy.get()));
      ce_copy_and_signal(copy.get(), copies, flag.get(), seq);
      eb.enqueue(own, 1, pass);
      own_done.record(s);
      stream_wait_u32_geq(s, flag.get(), seq);
      waited.record(s);
      FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
      worst = std::max(worst, static_cast<double>(elapsed_ms(own_done, waited)));
    }
    exposed_ms.push_back(worst);
    exposed_pct.push_back(100.0 * worst / gmax);
  }
  return json{
      {"exposed_ms", spread(exposed_ms)},
      {"exposed_pct", spread(exposed_pct)},
      {"inflate", inflate},
      {"link_gbps", link_gbps},
      {"lead_us", lead_us},
      {"method",
       "per step (feplb plan) and helper: the helper's own experts on one stream while its "
       "incoming weights and rows are copied (copy engine, bytes x inflate to emulate the link "
       "rate, after a lead for counts + plan) and a flag set; exposed = time the stream then "
       "waits on the flag; pct of the slowest rank's GEMM time; worst helper per step"}};
}

// ---- layer time per policy, forward and backward, each rank timed alone ---------------------
// The mean over steps of the GPU-level max/mean load of a trace (rows per GPU, contiguous homes).
double gpu_max_over_mean(const Trace& t) {
  std::vector<double> v;
  const int per = t.num_experts / t.num_ranks;
  for (const RoutingStep& st : t.steps) {
    std::vector<double> load(static_cast<size_t>(t.num_ranks), 0.0);
    for (int e = 0; e < t.num_experts; ++e)
      load[e / per] += static_cast<double>(st.expert_counts[e]);
    v.push_back(*std::max_element(load.begin(), load.end()) / mean_of(load));
  }
  return mean_of(v);
}

// A lognormal-popularity trace whose GPU-level max/mean is closest to `target` (the expert-level
// skew is searched over a grid; routing drawn like every bundled trace).
Trace trace_with_gpu_skew(double target, int steps, double* got) {
  Trace best;
  double best_err = 1e9;
  for (double expert_skew : {1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0}) {
    WorkloadSpec spec;
    spec.num_ranks = 8;
    spec.num_steps = steps;
    spec.seed = 7;
    Trace t = generate_trace(lognormal_prior(128, expert_skew, 1, 7), spec);
    const double m = gpu_max_over_mean(t);
    if (std::abs(m - target) < best_err) best_err = std::abs(m - target), best = t, *got = m;
  }
  return best;
}

// layer_fwd_ms / layer_bwd_ms per policy: per step, each rank's experts (own and guests) timed
// alone on this GPU, forward and backward; the step's layer time is the slowest rank's.
// "balanced": the step's rows split evenly over the GPUs (and over each GPU's experts), each
// GPU's share timed separately and the slowest taken, exactly like the policies' times (a max of
// R noisy timings sits above their mean by the timing noise floor, so comparing a max with a mean
// would flatter the floor). "static_mean": the mean over GPUs of the static plan's per-GPU times
// (the same work with its own GEMM shapes, without the max's noise).
json layer_times(ExpertBench& eb, const Trace& t, const Knobs& knobs, const GemmCostModel& cost,
                 int nsteps, int reps) {
  std::vector<size_t> steps;
  for (int i = 0; i < nsteps; ++i)
    steps.push_back(t.steps.size() * static_cast<size_t>(i) / static_cast<size_t>(nsteps));
  const int R = t.num_ranks, per = t.num_experts / t.num_ranks;
  std::map<std::string, std::vector<double>> fwd, bwd;
  for (const std::string policy : {"static", "feplb-paper", "feplb"}) {
    for (const PlannedStep& ps : plan_trace(t, {policy}, knobs, cost, steps)) {
      std::vector<double> f, b;
      for (const auto& rows : ExpertBench::rows_per_gpu(ps.plan, R)) {
        f.push_back(eb.run_ms(rows, 1, reps, ExpertBench::Pass::kForward));
        b.push_back(eb.run_ms(rows, 1, reps, ExpertBench::Pass::kBackward));
      }
      fwd[policy].push_back(*std::max_element(f.begin(), f.end()));
      bwd[policy].push_back(*std::max_element(b.begin(), b.end()));
      if (policy == "static") {
        fwd["static_mean"].push_back(mean_of(f));
        bwd["static_mean"].push_back(mean_of(b));
      }
    }
  }
  for (size_t i : steps) {
    const int64_t total = t.steps[i].total_rows();
    std::vector<int64_t> rows(static_cast<size_t>(per), total / (static_cast<int64_t>(R) * per));
    double f = 0, b = 0;
    for (int g = 0; g < R; ++g) {
      f = std::max(f, eb.run_ms(rows, 1, reps, ExpertBench::Pass::kForward));
      b = std::max(b, eb.run_ms(rows, 1, reps, ExpertBench::Pass::kBackward));
    }
    fwd["balanced"].push_back(f);
    bwd["balanced"].push_back(b);
  }
  json out{{"gpu_max_over_mean", gpu_max_over_mean(t)}, {"steps", steps.size()}};
  json lf = json::object(), lb = json::object(), total = json::object();
  const double st_total = mean_of(fwd["static"]) + mean_of(bwd["static"]);
  const double bal_total = mean_of(fwd["balanced"]) + mean_of(bwd["balanced"]);
  for (const std::string p : {"static", "feplb-paper", "feplb", "balanced", "static_mean"}) {
    lf[p] = quantile_of(fwd[p], 0.5);
    lb[p] = quantile_of(bwd[p], 0.5);
    const double tot = mean_of(fwd[p]) + mean_of(bwd[p]);
    total[p] = {{"fwd_bwd_ms_mean", tot},
                {"speedup_vs_static", st_total / tot},
                {"above_balanced_pct", 100.0 * (tot / bal_total - 1.0)},
                {"fwd_ms", spread(fwd[p])},
                {"bwd_ms", spread(bwd[p])}};
    log("  {:<12} fwd {:.3f} ms  bwd {:.3f} ms  fwd+bwd {:.3f} ms  x{:.3f} vs static  {:+.1f}% vs "
        "balanced",
        p, quantile_of(fwd[p], 0.5), quantile_of(bwd[p], 0.5), tot, st_total / tot,
        100.0 * (tot / bal_total - 1.0));
  }
  out["layer_fwd_ms"] = lf;
  out["layer_bwd_ms"] = lb;
  out["fwd_bwd"] = total;
  out["method"] =
      "per step: each GPU's expert work of the plan (own + guest slices, cuBLAS per-expert loop + "
      "SwiGLU; "
      "backward = dW into fp32 + dX from saved activations) timed alone on this H200, median of "
      "reps; the "
      "step's layer time is the slowest GPU's; the table holds the median over steps. Phase-1 "
      "dispatch "
      "and combine (the same for every policy) are not included; exposed copy time is measured "
      "separately (exposed_pct, backward_exposed_pct).";
  return out;
}

// Training steps on 8 virtual ranks sharing this GPU: balancing on vs off. The ranks' work is
// serialised on one GPU, so the step time is the sum of all ranks' work: the difference between
// policies is the cost of balancing (copies, planner), not its gain (layer_times shows that).
json training_steps(const Trace& t, int layers, int steps, double timeout_s) {
  json out = json::object();
  const ExpertShape shape = kQwen3_30b;  // 8 ranks x layers of these experts fit
  for (const std::string policy : {"static", "feplb"}) {
    TrainConfig c;
    c.runtime.topo = Topology::contiguous(t.num_ranks, 8, t.num_experts);
    c.runtime.shape = shape;
    c.runtime.max_top_k = t.top_k;
    c.runtime.max_tokens = t.tokens_per_rank;
    c.runtime.timing = true;
    c.runtime.timeout_s = timeout_s;
    c.runtime.guest_capacity_rows = t.tokens_per_rank * t.top_k;
    c.runtime.recv_capacity_rows = worst_receiver_rows(t, c.runtime.topo);
    c.policy = policy;
    c.top_k = t.top_k;
    c.layers = layers;
    c.steps = steps;
    c.micro_batches = 2;
    c.lr = 1e-3f;
    const TrainResult r = run_virtual_training(c, routing_from_trace(t, c.micro_batches, layers));
    std::vector<double> warm(r.step_ms.begin() + 1, r.step_ms.end());
    out[policy] = {
        {"loss", r.loss},
        {"step_ms", spread(warm)},
        {"fwd_wait_ms", spread(r.fwd_wait_ms)},
        {"bwd_wait_ms", spread(r.bwd_wait_ms)},
        {"weight_recopies", r.weight_recopies},
        {"runtime_workspace_gib_per_rank", static_cast<double>(r.workspace_bytes) / (1 << 30)},
        {"saved_gib_per_rank_per_micro_batch", static_cast<double>(r.saved_bytes) / (1 << 30)}};
    log("  training {:<7} step {:.1f} ms (median of {}), loss {:.5f} -> {:.5f}, weight re-copies "
        "{}, runtime "
        "{:.2f} GiB/rank",
        policy, quantile_of(warm, 0.5), warm.size(), r.loss.front(), r.loss.back(),
        r.weight_recopies, static_cast<double>(r.workspace_bytes) / (1 << 30));
  }
  double max_rel = 0;
  for (size_t i = 0; i < out["static"]["loss"].size(); ++i) {
    const double a = out["static"]["loss"][i].get<double>(),
                 b = out["feplb"]["loss"][i].get<double>();
    max_rel = std::max(max_rel, std::abs(a - b) / std::abs(a));
  }
  out["loss_max_rel_diff_on_vs_off"] = max_rel;
  out["shape"] = {{"hidden", shape.hidden},
                  {"ffn", shape.ffn},
                  {"layers", layers},
                  {"micro_batches", 2},
                  {"tokens_per_rank", t.tokens_per_rank},
                  {"top_k", t.top_k},
                  {"experts", t.num_experts}};
  out["note"] =
      "8 virtual ranks share one GPU: step time = all ranks' work serialised; on - off = "
      "balancing's cost";
  return out;
}

// ---- the layer's paths on a many-donor trace ---------------------------------------------------
// Two phases balancing rows, rows in one hop, weights before routing, both, both with late copies
// (copy_timing = 3), both planning GEMM time within a 5% token-straggler budget, one hop planned
// from the previous micro-batch and refined on this one's counts (one_hop_refine = 1), and the
// default (feplb chooses its mode, "auto"): eight layers
// (one feplb planner each, the mode's knobs) on one runtime per virtual rank, sharing its slot
// pool, over the same routing. Interleaved: every step runs each mode once, in an order rotated
// every step; each forward comes after an emulated attention block (a GPU delay as long as the
// prefetch window, in every mode) that the prefetch copies can hide behind, and prefetch() is
// called before it.
struct PathMode {
  const char* name;
  int64_t one_hop, prefetch, copy_timing;
  double time_balance_budget;
  int64_t one_hop_refine = 0;
  // prefetch() before each forward: the prefetch modes' (the default's too: prefetch = -1 lets it
  // choose, and it can only prefetch when called), and the refined one-hop's predicted helpers'.
  bool prefetch_call() const { return prefetch != 0 || one_hop_refine == 1; }
};
constexpr PathMode kPathModes[] = {{"two_phase", 0, 0, 1, 0},
                                   {"one_hop", 1, 0, 1, 0},
                                   {"prefetch", 0, 1, 1, 0},
                                   {"one_hop_prefetch", 1, 1, 1, 0},
                                   {"one_hop_prefetch_late", 1, 1, 3, 0},
                                   {"one_hop_prefetch_time", 1, 1, 1, 0.05},
                                   {"one_hop_refined", 1, 0, -1, 0, 1},
                                   {"auto", -1, -1, -1, -1}};

// What the paths benchmark measured: per mode, step and rank the forward's stats; rank 0's plan
// modes; the runtime's planner times measured at start (rank 0).
struct PathsMeasured {
  std::vector<std::vector<std::vector<ForwardStats>>> stats;  // [mode][step][rank]
  std::vector<std::vector<std::string>> plan_modes;           // [mode][step]
  std::vector<ModeTime> start_times;
};

// One mode's series over the measured steps (each step's max or sum over ranks); `base_wait` and
// `base_fwd` (per step) are two-phase's, filled by the first mode.
struct PathSeries {
  std::vector<double> wait, fwd, wait_pct, weights, pairs, hits, dispatched, guests, d_wait,
      fwd_ratio, plan_us, prime_us;
  int overtaken = 0;
  std::map<std::string, int> mode_steps;  // rank 0's plans by the mode they were planned in
  double pair_sum = 0, hit_sum = 0;
};

PathSeries path_series(int mi, const PathsMeasured& m, int steps, std::vector<double>& base_wait,
                       std::vector<double>& base_fwd) {
  PathSeries p;
  for (int i = 0; i < steps; ++i) {
    const auto& per_rank = m.stats[static_cast<size_t>(mi)][static_cast<size_t>(i)];
    ++p.mode_steps[m.plan_modes[static_cast<size_t>(mi)][static_cast<size_t>(i)]];
    double w = 0, f = 0, pu = 0;
    int64_t wc = 0, dr = 0, gr = 0;
    for (const ForwardStats& st : per_rank) {
      w = std::max(w, static_cast<double>(st.wait_ms));
      f = std::max(f, static_cast<double>(st.forward_ms));
      wc += st.weight_copies;
      dr += st.dispatched_rows;
      gr += st.guest_rows;
      pu = std::max(pu, st.plan_us);
      if (st.prime_us > 0) p.prime_us.push_back(st.prime_us);
      p.overtaken += st.prime_overtaken ? 1 : 0;
    }
    p.plan_us.push_back(pu);
    p.wait.push_back(w);
    p.fwd.push_back(f);
    p.wait_pct.push_back(f > 0 ? 100.0 * w / f : 0.0);
    p.weights.push_back(static_cast<double>(wc));
    p.dispatched.push_back(static_cast<double>(dr));
    p.guests.push_back(static_cast<double>(gr));
    p.pairs.push_back(static_cast<double>(per_rank[0].prefetched_pairs));
    p.hits.push_back(static_cast<double>(per_rank[0].prefetch_hits));
    p.pair_sum += static_cast<double>(per_rank[0].prefetched_pairs);
    p.hit_sum += static_cast<double>(per_rank[0].prefetch_hits);
    if (mi == 0) {
      base_wait.push_back(w);
      base_fwd.push_back(f);
    }
    p.d_wait.push_back(w - base_wait[static_cast<size_t>(i)]);
    p.fwd_ratio.push_back(
        base_fwd[static_cast<size_t>(i)] > 0 ? f / base_fwd[static_cast<size_t>(i)] : 0.0);
  }
  return p;
}

// One mode's JSON and log lines (path_series: `base_wait`, `base_fwd`).
json path_mode_json(int mi, const PathsMeasured& m, int steps, int R, const ExpertShape& shape,
                    std::vector<double>& base_wait, std::vector<double>& base_fwd) {
  const PathSeries p = path_series(mi, m, steps, base_wait, base_fwd);
  const auto& [wait, fwd, wait_pct, weights, pairs, hits, dispatched, guests, d_wait, fwd_ratio,
               plan_us, prime_us, overtaken, mode_steps, pair_sum, hit_sum] = p;
  const PathMode& mode = kPathModes[mi];
  json j = {{"one_hop", mode.one_hop},
            {"prefetch", mode.prefetch},
            {"copy_timing", mode.copy_timing},
            {"time_balance_budget", mode.time_balance_budget},
            {"one_hop_refine", mode.one_hop_refine},
            {"copy_wait_ms", spread(wait)},
            {"forward_ms", spread(fwd)},
            {"copy_wait_pct_of_forward", spread(wait_pct)},
            {"copy_wait_minus_two_phase_ms", spread(d_wait)},
            {"forward_over_two_phase", spread(fwd_ratio)},
            {"weight_copies_per_step", spread(weights)},
            {"weight_gib_per_step",
             mean_of(weights) * static_cast<double>(shape.weight_bytes()) / (1 << 30)},
            {"prefetched_pairs_per_step", spread(pairs)},
            {"prefetch_hits_per_step", spread(hits)},
            {"prefetch_hit_rate", pair_sum > 0 ? hit_sum / pair_sum : 0.0},
            {"dispatched_rows_per_step", spread(dispatched)},
            {"guest_rows_per_step", spread(guests)},
            {"plan_us_slowest_rank", spread(plan_us)},
            {"prime_us", spread(prime_us)},
            {"primes", static_cast<int64_t>(prime_us.size())},
            {"primes_overtaken", overtaken},
            {"rank0_plans_by_mode", mode_steps}};
  log("  {:<17} copy wait {:.3f} ms [p10 {:.3f}, p90 {:.3f}] ({:.1f}% of forward), forward "
      "{:.3f} ms "
      "[{:.3f}, {:.3f}], x{:.3f} vs two-phase; weights {:.1f}/step, prefetch hits {:.0f}/{:.0f}",
      mode.name, quantile_of(wait, 0.5), quantile_of(wait, 0.1), quantile_of(wait, 0.9),
      quantile_of(wait_pct, 0.5), quantile_of(fwd, 0.5), quantile_of(fwd, 0.1),
      quantile_of(fwd, 0.9), quantile_of(fwd_ratio, 0.5), mean_of(weights), hit_sum, pair_sum);
  log("  {:<17} plans: median {:.1f} us [p90 {:.1f}] on the slowest rank; primed {} of {} "
      "(median {:.1f} us), the counts overtook {}",
      "", quantile_of(plan_us, 0.5), quantile_of(plan_us, 0.9), prime_us.size(), steps * R,
      quantile_of(prime_us, 0.5), overtaken);
  if (mode.one_hop < 0 || mode.prefetch < 0)  // a mode feplb chooses: what it chose
    for (const auto& [label, n] : mode_steps)
      log("  {:<17} rank 0 planned {} of {} steps as \"{}\" (plans: median {:.1f} us on the "
          "slowest rank)",
          "", n, steps, label, quantile_of(plan_us, 0.5));
  return j;
}

// The paths section's workload: 8 GPUs in one domain, 128 experts, `kPathsWarmup` steps first.
constexpr int kPathsRanks = 8, kPathsExperts = 128, kPathsWarmup = 2;
constexpr int kPathsModes = static_cast<int>(std::size(kPathModes));

// Every mode's forward per step on 8 virtual ranks (one runtime each, one layer per mode; order
// rotated per step), after a GPU delay of `window_us` (the attention block), each rank's stats.
PathsMeasured measure_paths(const Trace& t, const RuntimeConfig& c, const Knobs& knobs,
                            const GemmCostModel& model, double window_us, int steps,
                            double timeout_s) {
  constexpr int R = kPathsRanks, kWarmup = kPathsWarmup, M = kPathsModes;
  const ExpertShape& shape = c.shape;
  const int64_t S = t.tokens_per_rank, K = t.top_k, H = shape.hidden, F = shape.ffn;
  PathsMeasured m;
  m.stats.assign(M, std::vector<std::vector<ForwardStats>>(static_cast<size_t>(steps),
                                                           std::vector<ForwardStats>(R)));
  m.plan_modes.assign(M, std::vector<std::string>(steps));
  InProcessGroup group(R, timeout_s);
  run_rank_threads(R, [&](int r) {
    EpRuntime runtime(c, group.endpoint(r));
    if (r == 0) {
      const std::span<const ModeTime> st = runtime.planner_times();
      m.start_times.assign(st.begin(), st.end());
    }
    std::vector<std::unique_ptr<MoeLayer>> layers;
    for (const PathMode& mode : kPathModes) {
      Knobs k = knobs;
      k.one_hop = mode.one_hop;
      k.prefetch = mode.prefetch;
      k.copy_timing = mode.copy_timing;
      k.time_balance_budget = mode.time_balance_budget;
      k.one_hop_refine = mode.one_hop_refine;
      k.prefetch_window_us = window_us;
      layers.push_back(std::make_unique<MoeLayer>(
          runtime, LayerConfig{static_cast<int>(K), mode.name},
          make_planner("feplb", PlannerContext{c.topo, shape, k, &model})));
    }
    Stream s;
    LocalExperts experts(c.topo.experts_per_rank(), H, F, /*grads=*/false);
    DeviceBuffer<bf16> x(static_cast<size_t>(S * H)), out(static_cast<size_t>(S * H));
    DeviceBuffer<int32_t> idx(static_cast<size_t>(S * K));
    DeviceBuffer<float> wt(static_cast<size_t>(S * K));
    FEPLB_CUDA_CHECK(kernels::fill_random(experts.weights(),
                                          static_cast<size_t>(experts.weight_elems()), 300 + r,
                                          1.0f / 64, s.get()));
    FEPLB_CUDA_CHECK(kernels::fill_random(x.get(), x.size(), 400 + r, 1.0f, s.get()));
    const std::vector<float> wts(static_cast<size_t>(S * K), 1.0f / static_cast<float>(K));
    FEPLB_CUDA_CHECK(
        cudaMemcpyAsync(wt.get(), wts.data(), wt.bytes(), cudaMemcpyHostToDevice, s.get()));
    for (int i = 0; i < steps + kWarmup; ++i) {
      const auto topk =
          topk_from_counts(t.steps[static_cast<size_t>(i)].row(r), S, static_cast<int>(K));
      FEPLB_CUDA_CHECK(
          cudaMemcpyAsync(idx.get(), topk.data(), idx.bytes(), cudaMemcpyHostToDevice, s.get()));
      sync_with_timeout(s.get(), timeout_s, "routing upload");
      for (int j = 0; j < M; ++j) {
        const int mi = (i + j) % M;
        MoeLayer& layer = *layers[static_cast<size_t>(mi)];
        if (kPathModes[mi].prefetch_call()) layer.prefetch(experts.params(), s.get());
        FEPLB_CUDA_CHECK(kernels::gpu_delay(static_cast<int64_t>(window_us * 1e3),
                                            s.get()));  // the attention block
        layer.forward(experts.params(), x.get(), idx.get(), wt.get(), S, out.get(), s.get());
        sync_with_timeout(s.get(), timeout_s, "paths forward");
        if (i >= kWarmup) {
          m.stats[static_cast<size_t>(mi)][static_cast<size_t>(i - kWarmup)][r] =
              layer.last_forward_stats();
          if (r == 0)
            m.plan_modes[static_cast<size_t>(mi)][static_cast<size_t>(i - kWarmup)] =
                layer.last_plan().mode;
        }
      }
    }
  });
  return m;
}

// The paths section's document: the shape, the trace, each mode's JSON (path_mode_json), the
// method.
json paths_document(const PathsMeasured& m, const Trace& t, const ExpertShape& shape,
                    const std::string& shape_name, const std::string& cost_label, double window_us,
                    bool prime, int steps) {
  constexpr int R = kPathsRanks, E = kPathsExperts, kWarmup = kPathsWarmup, M = kPathsModes;
  const int64_t S = t.tokens_per_rank, K = t.top_k, H = shape.hidden, F = shape.ffn;
  json modes = json::object();
  std::vector<double> base_wait, base_fwd;
  for (int mi = 0; mi < M; ++mi)
    modes[kPathModes[mi].name] = path_mode_json(mi, m, steps, R, shape, base_wait, base_fwd);
  json start = json::array();
  for (const ModeTime& mt : m.start_times)
    start.push_back({{"mode", mt.mode}, {"p90_us", mt.us}, {"p99_us", mt.p99_us}});
  return json{
      {"shape",
       {{"name", shape_name},
        {"hidden", H},
        {"ffn", F},
        {"weight_mib", static_cast<double>(shape.weight_bytes()) / (1 << 20)}}},
      {"trace",
       {{"generator",
         "many_donor_prior (feplb trace gen --hot-gpus 1.87,1.65,1.21 --cold-min 0.2 --skew 2 "
         "--seed 11)"},
        {"ranks", R},
        {"experts", E},
        {"tokens_per_rank", S},
        {"top_k", K},
        {"steps", steps},
        {"warmup_steps", kWarmup},
        {"gpu_max_over_mean", gpu_max_over_mean(t)}}},
      {"cost_model", cost_label},
      {"prefetch_window_us", window_us},
      {"prime_planner", prime},
      {"planner_times_at_start", start},
      {"modes", modes},
      {"method",
       "8 virtual ranks on this GPU, one runtime each with eight feplb layers (two_phase, "
       "one_hop, prefetch, one_hop_prefetch, one_hop_prefetch_late: copy_timing 3, "
       "one_hop_prefetch_time: time_balance_budget 0.05, one_hop_refined: one_hop_refine 1, "
       "auto: the default, feplb chooses) sharing its slot pool; per step each mode's forward "
       "once, order rotated per step, after a GPU delay of prefetch_window_us (the attention "
       "block; prefetch() is called before it); per step the max over ranks of the layer's own "
       "timing (copy_wait = wait_ms: own experts done -> phase-2 inputs here; forward = "
       "forward_ms; plan_us = the planner call); spreads over steps; ratios paired per step; "
       "rank0_plans_by_mode counts rank 0's plans by the mode they were planned in; "
       "planner_times_at_start: the runtime's planner times measured at start (rank 0), the "
       "times the default compares its modes at until its own plans are clocked"},
      {"note",
       "virtual ranks share one GPU: their GEMMs run concurrently (the window copies hide behind "
       "is longer "
       "than on 8 GPUs) and copies are same-device (faster than NVLink), so exposure is a lower "
       "bound and "
       "forward time is all ranks' work, not the balanced layer time 8 GPUs would see"}};
}

json paths_bench(const ExpertShape& shape, const std::string& shape_name, const Knobs& knobs,
                 int steps, bool prime, const std::string& data_dir, double timeout_s) {
  const std::vector<double> hot = {1.87, 1.65, 1.21};
  const double cold_min = 0.2, expert_skew = 2.0;
  WorkloadSpec spec;  // 4096 tokens per rank, top-8
  spec.num_ranks = kPathsRanks;
  spec.num_steps = steps + kPathsWarmup;
  spec.seed = 11;
  const Trace t = generate_trace(
      many_donor_prior(kPathsExperts, kPathsRanks, 8, hot, cold_min, expert_skew, 1, spec.seed),
      spec);
  const int64_t S = t.tokens_per_rank, K = t.top_k;
  RuntimeConfig c;
  c.topo = Topology::contiguous(kPathsRanks, 8, kPathsExperts);
  c.shape = shape;
  c.max_top_k = static_cast<int>(K);
  c.max_tokens = S;
  c.knobs = knobs;
  c.recv_capacity_rows = worst_receiver_rows(t, c.topo);
  c.guest_capacity_rows = S * K;
  c.training = false;
  c.timing = true;
  c.timeout_s = timeout_s;
  c.name = "paths";
  c.prime_planner = prime;
  const CostChoice cost = choose_cost_model("auto", shape, knobs, data_dir, "paths");
  const RooflineCostModel roofline(shape, knobs);
  const GemmCostModel& model =
      cost.model ? *cost.model : static_cast<const GemmCostModel&>(roofline);
  const double window_us = prefetch_window_us(shape, S, knobs);
  const PathsMeasured m = measure_paths(t, c, knobs, model, window_us, steps, timeout_s);
  return paths_document(m, t, shape, shape_name, cost.label, window_us, prime, steps);
}

// Where small experts are launch-bound: the per-expert loop as the layer ran it (paced by the
// host where the host is slower), the same loop with everything enqueued before the GPU starts
// (its own time) and the host's enqueue time per GEMM, cuBLAS's grouped GEMM, and the grouped
// GEMMs whose sizes the GPU reads (GroupedFfn, where the GPU has them), forward and backward (dW
// into fp32, dX).
json small_experts(int reps) {
  struct Case {
    const char* name;
    ExpertShape shape;
    int experts;
    int64_t rows;  // per expert, uniform
  };
  const bool grouped_here = GroupedFfn::available();
  using Gemms = ExpertBench::Gemms;
  using Pass = ExpertBench::Pass;
  json cases = json::array();
  for (const Case& c :
       {Case{"qwen3-30b", kQwen3_30b, 32, 1024}, Case{"qwen3-30b", kQwen3_30b, 32, 2048},
        Case{"qwen3-235b", kQwen3_235b, 16, 2048}, Case{"olmoe", kOlmoe, 64, 512},
        Case{"qwen3-30b", kQwen3_30b, 128, 512}, Case{"qwen3-30b", kQwen3_30b, 128, 256},
        Case{"glm5", kGlm5, 8, 4096}}) {
    const int64_t total = c.rows * c.experts;
    ExpertBench sb(c.shape, total + 8192, c.experts, 1);
    double harmonic = 0;
    for (int e = 0; e < c.experts; ++e) harmonic += 1.0 / (e + 1);
    std::vector<int64_t> zipf(static_cast<size_t>(c.experts));
    for (int e = 0; e < c.experts; ++e)
      zipf[static_cast<size_t>(e)] = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(total) / (e + 1) / harmonic));
    const std::vector<int64_t> uniform(static_cast<size_t>(c.experts), c.rows);
    for (const auto& [routing, rows] :
         {std::pair<const char*, const std::vector<int64_t>&>{"uniform", uniform},
          std::pair<const char*, const std::vector<int64_t>&>{"zipf1.0", zipf}}) {
      const double paced = sb.run_ms(rows, 1, reps);
      const ExpertBench::Queued q = sb.run_queued(rows, reps);
      const double paced_bwd = sb.run_ms(rows, 1, reps, Pass::kBackward);
      const double cublas_grouped = sb.run_grouped_ms(rows, reps);
      const double gemms = 2.0 * c.experts;
      json j = {{"shape", c.name},
                {"hidden", c.shape.hidden},
                {"ffn", c.shape.ffn},
                {"experts", c.experts},
                {"rows_per_expert_mean", c.rows},
                {"routing", routing},
                {"loop_ms", paced},
                {"loop_gpu_only_ms", q.gpu_ms},
                {"loop_host_enqueue_ms", q.host_ms},
                {"host_us_per_gemm", q.host_ms * 1e3 / gemms},
                {"loop_backward_ms", paced_bwd},
                {"cublas_grouped_ms", cublas_grouped}};
      std::string grouped_note = "no grouped GEMMs on this GPU";
      if (grouped_here) {
        const double g = sb.run_ms(rows, 1, reps, Pass::kForward, Gemms::kGrouped);
        const ExpertBench::Queued gq = sb.run_queued(rows, reps, Pass::kForward, Gemms::kGrouped);
        const double gb = sb.run_ms(rows, 1, reps, Pass::kBackward, Gemms::kGrouped);
        const ExpertBench::Queued gbq = sb.run_queued(rows, reps, Pass::kBackward, Gemms::kGrouped);
        j["grouped_ms"] = g;
        j["grouped_gpu_only_ms"] = gq.gpu_ms;
        j["grouped_host_enqueue_ms"] = gq.host_ms;
        j["grouped_backward_ms"] = gb;
        j["grouped_backward_gpu_only_ms"] = gbq.gpu_ms;
        j["grouped_backward_host_enqueue_ms"] = gbq.host_ms;
        j["grouped_over_loop"] = g / paced;
        j["grouped_backward_over_loop"] = gb / paced_bwd;
        grouped_note = fmt::format(
            "grouped {:.3f} ms (GPU alone {:.3f}, host {:.3f}; {:.2f}x the loop), backward "
            "{:.3f} ms against the loop's {:.3f} ({:.2f}x; host {:.3f})",
            g, gq.gpu_ms, gq.host_ms, g / paced, gb, paced_bwd, gb / paced_bwd, gbq.host_ms);
      }
      cases.push_back(j);
      log("small experts {} E={} {} rows {}: loop {:.3f} ms (GPU alone {:.3f}; host enqueue "
          "{:.3f} ms = {:.1f} us per GEMM), cublasGemmGroupedBatchedEx {:.3f} ms; {}",
          c.name, c.experts, c.rows, routing, paced, q.gpu_ms, q.host_ms, q.host_ms * 1e3 / gemms,
          cublas_grouped, grouped_note);
    }
  }
  return {{"what",
           "forward SwiGLU FFN of every local expert (gate|up GEMM, SwiGLU, down GEMM per expert; "
           "cuBLAS grouped: two cublasGemmGroupedBatchedEx calls and one SwiGLU; grouped: "
           "GroupedFfn, the layer's grouped GEMMs with sizes read on the GPU), and its backward "
           "(dW added into fp32, dX)"},
          {"cases", cases}};
}

// The command line.
struct Options {
  std::string out = "h200.json", table_out = "gemm_table.json",
              trace_path = "data/traces/default.json";
  std::string prior_path = "data/priors/mixtral-8x7b__olmoe-repo__c4.json";
  std::string table_in = "data/cost/h200-glm5.json";
  std::string table_dir = ".";
  bool quick = false;
  double deadline_s = 420;
  std::string sections =
      "peak,grouped,table,shape_tables,skewed,copy,slowdown,straggler,noise,exposure,layertime,"
      "bwdexposure,layer,training,paths";
  std::string paths_shape = "qwen3-235b";
  int paths_steps = 12;
  int paths_prime = 1;
  std::vector<std::string> knob_args;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--out", o.out);
  app.add_option("--table-out", o.table_out);
  app.add_option("--trace", o.trace_path);
  app.add_option("--prior", o.prior_path);
  app.add_option("--table-in", o.table_in, "GEMM table to use when the table section is not run");
  app.add_option("--table-dir", o.table_dir,
                 "where section shape_tables writes h200-<shape>.json (Qwen3 shapes)");
  app.add_option("--sections", o.sections, "comma-separated sections to run (default all)");
  app.add_flag("--quick", o.quick);
  app.add_option("--knob", o.knob_args,
                 "NAME=VALUE: a knob for the planners (repeatable; feplb knobs lists them)");
  app.add_option("--deadline", o.deadline_s,
                 "write what is measured and exit after this many seconds");
  app.add_option(
         "--paths-shape", o.paths_shape,
         "section paths: expert shape, qwen3-235b (H=4096 F=1536), qwen3-30b (H=2048 F=768) "
         "or glm5")
      ->check(CLI::IsMember({"qwen3-235b", "qwen3-30b", "glm5"}));
  app.add_option("--paths-steps", o.paths_steps, "section paths: measured steps per mode")
      ->check(CLI::Range(1, 1000));
  app.add_option("--paths-prime", o.paths_prime,
                 "section paths: 1 (default) the layers prime their planners while the counts "
                 "travel (RuntimeConfig::prime_planner), 0 not")
      ->check(CLI::Range(0, 1));
}

// One run's state, shared by its sections in order: the results document (saved after each
// section), the GLM-5 expert bench, the GEMM table, the knobs and the trace, and what earlier
// sections measured for later ones (cuBLAS peak, copy-engine rate).
struct Run {
  const Options& o;
  json doc;
  std::mutex doc_mu;
  int reps = 20;
  double peak = 0;
  double ce_gbps = 2000.0;  // same-device copy-engine rate measured in earlier runs, if not now
  std::unique_ptr<ExpertBench> eb;
  std::unique_ptr<TableCostModel> table;
  Knobs knobs;
  std::unique_ptr<RooflineCostModel> roofline;
  Trace trace;

  explicit Run(const Options& options) : o(options), reps(options.quick ? 5 : 20) {}
  bool want(const char* name) const {
    return ("," + o.sections + ",").find("," + std::string(name) + ",") != std::string::npos;
  }
  void save() {
    std::lock_guard<std::mutex> lock(doc_mu);
    write_file(o.out, doc.dump(2) + "\n", true);
  }
  double pct(double t) const { return peak > 0 ? t / peak * 100 : 0.0; }
  static double tf(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }
  int quick_or(int fast, int full) const { return o.quick ? fast : full; }
};

// Watchdog: a hung GPU (or a section far slower than planned) must not eat the whole lease.
void start_watchdog(Run& run) {
  std::thread([&run, deadline_s = run.o.deadline_s] {
    std::this_thread::sleep_for(std::chrono::duration<double>(deadline_s));
    std::fprintf(stderr, "feplb_gpu_bench: deadline of %.0f s reached; saving partial results\n",
                 deadline_s);
    {
      std::lock_guard<std::mutex> lock(run.doc_mu);
      run.doc["incomplete"] = "deadline reached";
      write_file(run.o.out, run.doc.dump(2) + "\n", true);
    }
    std::fflush(stdout);
    std::_Exit(3);
  }).detach();
}

void section_peak(Run& r) {
  r.peak = gemm_tflops(8192, 8192, 8192, r.reps);
  const double peak2 = gemm_tflops(16384, 4096, 6144, r.reps);
  r.doc["cublas_peak_tflops"] = r.peak;
  r.doc["cublas_16384x4096x6144_tflops"] = peak2;
  log("cuBLAS bf16 8192^3: {:.0f} TFLOP/s; 16384x4096x6144: {:.0f}", r.peak, peak2);
}

// The expert FFN of 16 even experts: one stream, four streams, cuBLAS's grouped batched GEMM.
void section_grouped(Run& r) {
  const std::vector<int64_t> even(16, 4096);
  const double loop1 = r.eb->run_ms(even, 1, r.reps), loop4 = r.eb->run_ms(even, 4, r.reps),
               grouped = r.eb->run_grouped_ms(even, r.reps);
  const double f16 = flops_of(kGlm5, 16 * 4096);
  const double best = std::max({Run::tf(f16, loop1), Run::tf(f16, loop4), Run::tf(f16, grouped)});
  r.doc["grouped_gemm_tflops"] = best;
  r.doc["grouped_gemm"] = {
      {"workload", "16 experts x 4096 rows, H=6144 F=2048 SwiGLU (gate, up, down + SwiGLU kernel)"},
      {"loop_1_stream_tflops", Run::tf(f16, loop1)},
      {"loop_4_streams_tflops", Run::tf(f16, loop4)},
      {"cublas_grouped_batched_tflops", Run::tf(f16, grouped)},
      {"pct_of_peak", r.pct(best)}};
  log("grouped GEMM 16x4096: loop {:.0f}, loop x4 streams {:.0f}, cublasGemmGroupedBatchedEx "
      "{:.0f} TFLOP/s ({:.0f}% of peak)",
      Run::tf(f16, loop1), Run::tf(f16, loop4), Run::tf(f16, grouped), r.pct(best));
}

// Per-expert FFN time tables of other expert shapes, for the simulator's cost model.
void section_shape_tables(Run& r) {
  const std::vector<std::pair<std::string, ExpertShape>> shapes = {{"qwen3-235b", kQwen3_235b},
                                                                   {"qwen3-30b", kQwen3_30b}};
  json files = json::object();
  for (const auto& [name, shape] : shapes) {
    ExpertBench sb(shape, 16 * 4096 + 8192, 16, 1);
    const TableCostModel t = gemm_table(sb, r.o.quick);
    const std::string path = r.o.table_dir + "/h200-" + name + ".json";
    write_file(path, format_gemm_table(t), true);
    files[name] = {{"file", path}, {"ms_at_4096_rows", t.expert_ms(4096)}};
    log("GEMM table {} ({}): 4096 rows -> {:.3f} ms per expert, wrote {}", name, shape.describe(),
        t.expert_ms(4096), path);
  }
  r.doc["shape_tables"] = files;
}

// The GEMM table (measured by section table, else read), the knobs and the trace.
void load_inputs(Run& r) {
  if (r.want("table")) {
    r.table = std::make_unique<TableCostModel>(gemm_table(*r.eb, r.o.quick));
    write_file(r.o.table_out, format_gemm_table(*r.table), true);
    r.doc["gemm_table_file"] = r.o.table_out;
    log("GEMM table: {} row counts, 4096 rows -> {:.3f} ms per expert", r.table->rows().size(),
        r.table->expert_ms(4096));
  } else {
    r.table = std::make_unique<TableCostModel>(read_gemm_table(r.o.table_in));
    r.doc["gemm_table_file"] = r.o.table_in;
  }
  std::vector<KnobOverride> overrides;
  for (const std::string& kv : r.o.knob_args) overrides.push_back(parse_knob_override(kv));
  apply_knobs(r.knobs, overrides);
  validate_knobs(r.knobs);
  if (!r.o.knob_args.empty()) r.doc["knobs"] = r.o.knob_args;
  r.roofline = std::make_unique<RooflineCostModel>(kGlm5, r.knobs);
  r.trace = read_trace(r.o.trace_path);
}

// The busiest GPU's slices after feplb balances the trace's worst step, three ways.
void section_skewed(Run& r) {
  const auto skew_rows = skewed_rows(r.trace, r.knobs, *r.table);
  int64_t skew_total = 0;
  for (int64_t x : skew_rows) skew_total += x;
  const double s1 = r.eb->run_ms(skew_rows, 1, r.reps), s4 = r.eb->run_ms(skew_rows, 4, r.reps),
               sg = r.eb->run_grouped_ms(skew_rows, r.reps);
  const double fs = flops_of(kGlm5, skew_total);
  const double best_skew = std::max({Run::tf(fs, s1), Run::tf(fs, s4), Run::tf(fs, sg)});
  r.doc["grouped_gemm_skewed_tflops"] = best_skew;
  r.doc["grouped_gemm_skewed"] = {
      {"rows", skew_rows},
      {"loop_1_stream_tflops", Run::tf(fs, s1)},
      {"loop_4_streams_tflops", Run::tf(fs, s4)},
      {"cublas_grouped_batched_tflops", Run::tf(fs, sg)},
      {"pct_of_peak", r.pct(best_skew)},
      {"source", "busiest GPU after feplb balances the worst step of " + r.o.trace_path}};
  log("skewed ({} slices, {} rows): loop {:.0f}, x4 {:.0f}, grouped {:.0f} TFLOP/s ({:.0f}% of "
      "peak)",
      skew_rows.size(), skew_total, Run::tf(fs, s1), Run::tf(fs, s4), Run::tf(fs, sg),
      r.pct(best_skew));
}

void section_copy(Run& r) {
  const json copy = copy_bandwidth(r.reps);
  r.ce_gbps = copy["ce_d2d_gbps"].get<double>();
  r.doc["ce_copy_gbps"] = copy["ce_d2d_gbps"];
  r.doc["copy_bandwidth"] = copy;
  log("copy: CE D2D {:.0f} GB/s, batch {:.0f}, D2H {:.0f}, SM copy 24 blocks {:.0f}, 132 "
      "blocks {:.0f}",
      copy["ce_d2d_gbps"].get<double>(), copy["ce_batch_d2d_gbps"].get<double>(),
      copy["d2h_pinned_gbps"].get<double>(), copy["sm_copy_24_blocks_gbps"].get<double>(),
      copy["sm_copy_132_blocks_gbps"].get<double>());
}

void section_slowdown(Run& r) {
  const json slow = gemm_slowdown(*r.eb, 400.0, r.quick_or(4, 24));
  r.doc["gemm_slowdown_ce_pct"] = slow["ce_pct"]["median"];
  r.doc["gemm_slowdown_sm_pct"] = slow["sm24_pct"]["median"];
  r.doc["gemm_slowdown"] = slow;
  log("GEMM slowdown at 400 GB/s: CE {:+.1f}% [{:+.1f}, {:+.1f}], SM24 {:+.1f}%, SM32 {:+.1f}%",
      slow["ce_pct"]["median"].get<double>(), slow["ce_pct"]["p10"].get<double>(),
      slow["ce_pct"]["p90"].get<double>(), slow["sm24_pct"]["median"].get<double>(),
      slow["sm32_pct"]["median"].get<double>());
}

// Measured GEMM straggler on the trace and on a paper-like real-prior trace (Mixtral's routing
// counts widened to 128 experts).
void section_straggler(Run& r) {
  WorkloadSpec spec;
  spec.num_ranks = 8;
  spec.num_steps = r.quick_or(2, 8);
  Prior prior = expand_prior(read_prior(r.o.prior_path), 128, 1);
  Trace paper_like = generate_trace(prior, spec);
  measured_straggler(*r.eb, r.trace, "default trace", r.knobs, *r.table, *r.roofline,
                     1);  // warm-up
  r.doc["measured_gemm_straggler_ms"] = {
      {"default_trace", measured_straggler(*r.eb, r.trace, "default trace", r.knobs, *r.table,
                                           *r.roofline, r.quick_or(2, 8))},
      {"mixtral_c4_trace", measured_straggler(*r.eb, paper_like, "mixtral c4 prior", r.knobs,
                                              *r.table, *r.roofline, r.quick_or(2, 8))}};
}

void section_noise(Run& r) {
  r.doc["straggler_noise_floor"] =
      straggler_noise_floor(*r.eb, r.trace, r.knobs, *r.table, r.quick_or(2, 8));
  log("straggler noise floor (identical work timed as 8 ranks): median {:.3f} ms",
      r.doc["straggler_noise_floor"]["null_straggler_ms"]["median"].get<double>());
}

void section_exposure(Run& r) {
  const double lead = 30.0;  // us before the first copy: counts round trip + plan
  const json expo = isolated_exposure(*r.eb, r.trace, r.knobs, *r.table, r.ce_gbps,
                                      r.knobs.copy_gbps, r.quick_or(2, 8), lead);
  r.doc["exposed_pct"] = expo["exposed_pct"]["median"];
  r.doc["exposure"] = expo;
  log("exposed (isolated, {:.0f} GB/s emulated): median {:.2f}% max {:.2f}% of the slowest "
      "rank's GEMM time",
      r.knobs.copy_gbps, expo["exposed_pct"]["median"].get<double>(),
      expo["exposed_pct"]["max"].get<double>());
}

void section_layertime(Run& r) {
  double got = 0;
  const Trace paper_like = trace_with_gpu_skew(1.25, r.quick_or(2, 6), &got);
  log("layer time per policy, paper-like skew (GPU max/mean {:.3f}):", got);
  json paper =
      layer_times(*r.eb, paper_like, r.knobs, *r.table, r.quick_or(2, 6), r.quick_or(3, 9));
  log("layer time per policy, heavy skew ({}: GPU max/mean {:.3f}):", r.o.trace_path,
      gpu_max_over_mean(r.trace));
  json heavy = layer_times(*r.eb, r.trace, r.knobs, *r.table, r.quick_or(2, 6), r.quick_or(3, 9));
  r.doc["layer_fwd_ms"] = {{"paper_like", paper["layer_fwd_ms"]}, {"heavy", heavy["layer_fwd_ms"]}};
  r.doc["layer_bwd_ms"] = {{"paper_like", paper["layer_bwd_ms"]}, {"heavy", heavy["layer_bwd_ms"]}};
  r.doc["layer_times"] = {{"paper_like", paper}, {"heavy", heavy}};
}

void section_bwdexposure(Run& r) {
  const double lead = 30.0;
  const json recopy =
      isolated_exposure(*r.eb, r.trace, r.knobs, *r.table, r.ce_gbps, r.knobs.copy_gbps,
                        r.quick_or(2, 8), lead, ExpertBench::Pass::kBackward, true);
  const json kept =
      isolated_exposure(*r.eb, r.trace, r.knobs, *r.table, r.ce_gbps, r.knobs.copy_gbps,
                        r.quick_or(2, 8), lead, ExpertBench::Pass::kBackward, false);
  r.doc["backward_exposed_pct"] = recopy["exposed_pct"]["median"];
  r.doc["backward_exposure"] = {
      {"weights_copied_again", recopy},
      {"weights_still_in_slots", kept},
      {"note",
       "backward_exposed_pct is the worse case: every guest's weights copied "
       "again (its slot was reused by another layer since forward)"}};
  log("backward exposed (isolated): {:.2f}% (weights copied again), {:.2f}% (weights kept) "
      "median; max {:.2f}%",
      recopy["exposed_pct"]["median"].get<double>(), kept["exposed_pct"]["median"].get<double>(),
      recopy["exposed_pct"]["max"].get<double>());
}

// The layer itself with the trace's ranks as virtual ranks: its plan latency.
void section_layer(Run& r) {
  const VirtualLayerStats lay =
      run_virtual_layer(r.trace, kGlm5, "feplb", r.knobs, r.quick_or(4, 16), 8, 60);
  r.doc["plan_latency_us"] = spread(lay.counts_to_first_copy_us);
  r.doc["layer_virtual_ranks"] = {
      {"policy", "feplb"},
      {"virtual_ranks", r.trace.num_ranks},
      {"forwards", lay.forwards},
      {"counts_to_first_copy_us", spread(lay.counts_to_first_copy_us)},
      {"counts_to_host_us", spread(lay.counts_to_host_us)},
      {"plan_us", spread(lay.plan_us)},
      {"counts_to_plan_us", spread(lay.counts_to_plan_us)},
      {"wait_ms", spread(lay.wait_ms)},
      {"wait_pct_of_forward", spread(lay.wait_pct)},
      {"forward_ms", spread(lay.forward_ms)},
      {"note",
       "8 virtual ranks share one GPU (their GEMMs run concurrently, copies are same-device); "
       "latency "
       "is from counts ready on the GPU (stream synchronised) to the first phase-2 copy "
       "issued. The "
       "copies are issued once the plan is ready AND this rank's phase-1 all-to-all is "
       "enqueued (the "
       "copy stream waits for it by event); with virtual ranks that all-to-all enqueue "
       "includes an "
       "in-process barrier of all 8 ranks' threads, so counts_to_plan_us is the scheduler's "
       "own part"}};
  const json& lat = r.doc["plan_latency_us"];
  log("plan latency (counts ready on GPU -> first copy issued): median {:.1f} us, p90 {:.1f}, "
      "max {:.1f}; "
      "counts to host {:.1f} us, plan {:.1f} us, counts to plan ready {:.1f} us",
      lat["median"].get<double>(), lat["p90"].get<double>(), lat["max"].get<double>(),
      quantile_of(lay.counts_to_host_us, 0.5), quantile_of(lay.plan_us, 0.5),
      quantile_of(lay.counts_to_plan_us, 0.5));
}

void section_paths(Run& r) {
  const ExpertShape shape = r.o.paths_shape == "glm5"        ? kGlm5
                            : r.o.paths_shape == "qwen3-30b" ? kQwen3_30b
                                                             : kQwen3_235b;
  log("layer paths on a many-donor trace ({} experts, EP=8, virtual ranks):", r.o.paths_shape);
  r.doc["paths"] = paths_bench(shape, r.o.paths_shape, r.knobs, r.quick_or(3, r.o.paths_steps),
                               r.o.paths_prime == 1, "data", 120);
}

// The sections in their order: each runs when asked, then the document is saved. The expert
// bench lives from after peak to before the layer sections (its streams would share hardware
// queues with the virtual ranks').
void run_sections(Run& r) {
  using Section = void (*)(Run&);
  if (r.want("peak")) {
    section_peak(r);
    r.save();
  }
  r.eb = std::make_unique<ExpertBench>(kGlm5, 16 * 4096 + 8192, 16, 4);
  if (r.want("grouped")) {
    section_grouped(r);
    r.save();
  }
  if (r.want("small_experts")) {
    r.doc["small_experts"] = small_experts(r.reps);
    r.save();
  }
  if (r.want("shape_tables")) {
    section_shape_tables(r);
    r.save();
  }
  load_inputs(r);
  const std::pair<const char*, Section> on_the_bench[] = {
      {"skewed", section_skewed},       {"copy", section_copy},
      {"slowdown", section_slowdown},   {"straggler", section_straggler},
      {"noise", section_noise},         {"exposure", section_exposure},
      {"layertime", section_layertime}, {"bwdexposure", section_bwdexposure}};
  for (const auto& [name, fn] : on_the_bench) {
    if (!r.want(name)) continue;
    fn(r);
    r.save();
  }
  r.eb.reset();
  for (const auto& [name, fn] : std::initializer_list<std::pair<const char*, Section>>{
           {"layer", section_layer}, {"paths", section_paths}}) {
    if (!r.want(name)) continue;
    fn(r);
    r.save();
  }
  if (r.want("training")) {
    r.doc["training"] = training_steps(r.trace, r.quick_or(2, 4), r.quick_or(3, 6), 120);
    log("training loss on vs off: max relative difference {:.2e}",
        r.doc["training"]["loss_max_rel_diff_on_vs_off"].get<double>());
  }
}

}  // namespace
}  // namespace feplb::cuda

int main(int argc, char** argv) {
  using namespace feplb;
  using namespace feplb::cuda;
  request_stream_connections();
  CLI::App app{"feplb GPU benchmarks (H200)"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  Run run(o);
  start_watchdog(run);
  try {
    std::string why;
    const auto devs = list_devices(&why);
    if (devs.empty()) {
      std::fprintf(stderr, "feplb_gpu_bench: no GPU: %s\n", why.c_str());
      return 2;
    }
    run.doc["device"] = {{"name", devs[0].name},
                         {"sms", devs[0].sm_count},
                         {"copy_engines", devs[0].async_engine_count},
                         {"driver", devs[0].driver_version},
                         {"runtime", devs[0].runtime_version}};
    log("device: {}, {} SMs, {} copy engines", devs[0].name, devs[0].sm_count,
        devs[0].async_engine_count);
    run_sections(run);
    run.save();
    log("wrote {} and {}", o.out, o.table_out);
  } catch (const InputError& e) {
    std::fprintf(stderr, "feplb_gpu_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
