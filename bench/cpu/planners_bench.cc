// Planner microbenchmarks: the time of one Planner::plan() call for every registered planner, on
// routing from the project's workload generator (scripts/bench-cpu): EP=8/E=128 and EP=64/E=256
// in NVLink domains of 8 GPUs, and rack-scale NVLink domains of 64 to 256 GPUs (the ep*_nvl*
// cases: lognormal skew with 4 experts per GPU, and 2 experts per GPU with hot experts ~10x the
// mean); and feplb's time-balancing modes on the EP=8 workloads (kFeplbModes).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "feplb/core/copy_links.h"
#include "feplb/core/cost_model.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"

// Every heap allocation of this process is counted, so that each benchmark can report how many
// allocations one plan() call makes once the planner and the Plan are warm (planner.h promises
// none). Replacing the global allocation functions is allowed by the standard; these forward to
// malloc/free plus one relaxed atomic increment, so a planner that does not allocate pays nothing.
namespace {

std::atomic<int64_t> g_allocations{0};

void* counted_malloc(std::size_t bytes) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(bytes == 0 ? 1 : bytes);
}

void* counted_new(std::size_t bytes) {
  void* p = counted_malloc(bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t bytes) { return counted_new(bytes); }
void* operator new[](std::size_t bytes) { return counted_new(bytes); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  return counted_malloc(bytes);
}
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept {
  return counted_malloc(bytes);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace feplb {
namespace {

constexpr char kOlmoePrior[] = FEPLB_DATA_DIR "/priors/olmoe-1b-7b__olmoe-repo__arxiv.json";
constexpr uint64_t kSeed = 1;
// Timed steps per workload, cycled through by the benchmark loop so that the planner sees varied
// routing (different micro-batches and, for the OLMoE prior, its three layers).
constexpr int kTimedSteps = 32;
// Micro-batches (each with one step per prior layer) that history-based planners observe before
// the timed steps, as they would have in simulation; the timed steps are the micro-batches after.
constexpr int kWarmupMicroBatches = 4;
constexpr int kRepetitions = 5;
// Calls clocked one by one after the timed loop, for the per-call median and 99th percentile.
constexpr int kClockedCalls = 2000;

enum class PriorKind { kOlmoeArxiv, kLognormal };

struct BenchConfig {
  std::string_view label;  // the last part of the benchmark name
  int ranks;
  int experts;
  int gpus_per_node;  // GPUs per NVLink domain
  PriorKind prior;
  double skew = 4.0;  // kLognormal: max/mean popularity over experts
};

// (a) EP=8, E=128: one NVLink domain. (b) EP=64, E=256: 8 domains of 8 GPUs, with the OLMoE prior
// and with a lognormal prior of max/mean 4. (c) Rack scale, one NVLink domain of all the GPUs:
// the routing of `feplb trace gen --skew 5 --experts E --ranks R` (lognormal max/mean 5, seed 1,
// 4 experts per GPU) at EP=8/E=128, EP=72/E=288 and EP=256/E=1024; and 2 experts per GPU with hot
// experts: the OLMoE arXiv prior widened to 128 experts at EP=64 (busiest expert 6.5-8x the mean
// expert, busiest GPU 5.6-6.5x the mean GPU, by `feplb trace info`), and lognormal max/mean 13 at
// EP=72/E=144 (busiest expert 9.9x the mean after top-8 sampling). All: top-8, 4096 tokens per
// rank, GLM-5 expert shape.
constexpr BenchConfig kConfigs[] = {
    {"ep8_e128", 8, 128, 8, PriorKind::kOlmoeArxiv},
    {"ep64_e256", 64, 256, 8, PriorKind::kOlmoeArxiv},
    {"ep64_e256_lognormal", 64, 256, 8, PriorKind::kLognormal},
    {"ep8_e128_skew5", 8, 128, 8, PriorKind::kLognormal, 5.0},
    {"ep72_e288_skew5_nvl72", 72, 288, 72, PriorKind::kLognormal, 5.0},
    {"ep256_e1024_skew5_nvl256", 256, 1024, 256, PriorKind::kLognormal, 5.0},
    {"ep64_e128_olmoe_nvl64", 64, 128, 64, PriorKind::kOlmoeArxiv},
    {"ep72_e144_hot10_nvl72", 72, 144, 72, PriorKind::kLognormal, 13.0},
};

constexpr int kTopK = 8;
constexpr int64_t kTokensPerRank = 4096;
const ExpertShape kGlm5Shape{.hidden = 6144, .ffn = 2048, .dtype = Dtype::kBf16};

struct Workload {
  Topology topo;
  std::vector<RoutingStep> warmup;  // observed before timing
  std::vector<RoutingStep> timed;   // planned in the timed loop, in turn
};

Workload make_workload(const BenchConfig& cfg) {
  const Prior prior = cfg.prior == PriorKind::kOlmoeArxiv
                          ? expand_prior(read_prior(kOlmoePrior), cfg.experts, kSeed)
                          : lognormal_prior(cfg.experts, cfg.skew, 1, kSeed);
  WorkloadSpec spec;
  spec.num_ranks = cfg.ranks;
  spec.tokens_per_rank = kTokensPerRank;
  spec.top_k = kTopK;
  spec.seed = kSeed;
  const int layers = prior.num_layers();
  auto step_at = [&](int64_t micro_batch, int l) {
    return generate_step(prior.popularity[l], spec, micro_batch, prior.layer_ids[l]);
  };
  Workload w{Topology::contiguous(cfg.ranks, cfg.gpus_per_node, cfg.experts), {}, {}};
  for (int mb = 0; mb < kWarmupMicroBatches; ++mb) {
    for (int l = 0; l < layers; ++l) w.warmup.push_back(step_at(mb, l));
  }
  for (int i = 0; i < kTimedSteps; ++i) {
    w.timed.push_back(step_at(kWarmupMicroBatches + i / layers, i % layers));
  }
  return w;
}

// Workloads are generated on first use (outside any timed region) and shared by every planner
// and repetition of the same configuration.
const Workload& workload_for(const BenchConfig& cfg) {
  static std::map<std::string_view, std::unique_ptr<Workload>> cache;
  std::unique_ptr<Workload>& w = cache[cfg.label];
  if (!w) w = std::make_unique<Workload>(make_workload(cfg));
  return *w;
}

// feplb's explicit modes timed on the EP=8 and the one-domain EP=72 and EP=256 workloads beside
// its default (plan/feplb/..., which chooses its mode): two-phase balancing rows; GEMM time
// balanced within a 5% token-straggler budget with weights prefetched, without and with rows in
// one hop (the many-donor report's time modes, docs/results/balance.md section 8).
struct FeplbMode {
  std::string_view label;  // the planner part of the benchmark name
  std::vector<KnobOverride> knobs;
};
const FeplbMode kFeplbModes[] = {
    {"feplb-rows",
     {{"one_hop", 0}, {"prefetch", 0}, {"copy_timing", 1}, {"time_balance_budget", 0}}},
    {"feplb+prefetch+time",
     {{"one_hop", 0}, {"prefetch", 1}, {"copy_timing", 1}, {"time_balance_budget", 0.05}}},
    {"feplb+prefetch+one-hop+time",
     {{"one_hop", 1}, {"prefetch", 1}, {"copy_timing", 1}, {"time_balance_budget", 0.05}}},
};
constexpr std::string_view kModeConfigs[] = {"ep8_e128", "ep8_e128_skew5", "ep72_e288_skew5_nvl72",
                                             "ep256_e1024_skew5_nvl256"};

// What the machine takes from a busy core: the gaps (above kStallUs) a loop of clock reads on it
// sees over kStallSpinMs, measured once per process on the core the benchmark runs on. On a
// virtual machine these are mostly the hypervisor's timer interrupts (on the 2-core development
// VM 1,300-2,200 per second of 15-23 us each); a planner call of t us is hit by one with a
// probability of about per_s x t x 1e-6, which sets the p99 where that is above 1%.
struct MachineStalls {
  double per_s = 0;   // gaps per second
  double p50_us = 0;  // their median length
};
constexpr double kStallUs = 2.0;
constexpr int kStallSpinMs = 300;

const MachineStalls& machine_stalls() {
  static const MachineStalls stalls = [] {
    using Clock = std::chrono::steady_clock;
    std::vector<double> gaps;
    const auto start = Clock::now();
    auto prev = start;
    for (auto t = start; t - start < std::chrono::milliseconds(kStallSpinMs); prev = t) {
      t = Clock::now();
      const double gap_us = std::chrono::duration<double, std::micro>(t - prev).count();
      if (gap_us > kStallUs) gaps.push_back(gap_us);
    }
    std::sort(gaps.begin(), gaps.end());
    return MachineStalls{static_cast<double>(gaps.size()) * 1e3 / kStallSpinMs,
                         gaps.empty() ? 0.0 : gaps[gaps.size() / 2]};
  }();
  return stalls;
}

// With FEPLB_BENCH_CALLS=DIR set, each benchmark also writes DIR/<name>.csv (the name's '/' as
// '_'): per clocked call, its micro-batch, its time, and that micro-batch's time planned alone
// kWarmRepeats times in a row (median), so that slow calls can be told apart: those of one
// micro-batch, or those the machine's stalls land in (docs/planners.md, "Its planner time").
constexpr int kWarmRepeats = 41;

void write_calls(const std::string& dir, const std::string& bench_name, Planner& planner,
                 const Workload& w, Plan& plan, const std::vector<double>& call_us) {
  std::vector<double> warm_us(w.timed.size());
  std::vector<double> repeat_us(kWarmRepeats);
  for (size_t mb = 0; mb < w.timed.size(); ++mb) {
    for (double& us : repeat_us) {
      const auto t0 = std::chrono::steady_clock::now();
      planner.plan(w.timed[mb], plan);
      const auto t1 = std::chrono::steady_clock::now();
      us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    }
    std::sort(repeat_us.begin(), repeat_us.end());
    warm_us[mb] = repeat_us[repeat_us.size() / 2];
  }
  std::string file = bench_name;
  std::replace(file.begin(), file.end(), '/', '_');
  const std::string path = dir + "/" + file + ".csv";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("FEPLB_BENCH_CALLS: cannot write " + path);
  std::fprintf(f, "call,micro_batch,us,warm_us\n");
  for (size_t c = 0; c < call_us.size(); ++c) {
    const size_t mb = c % w.timed.size();
    std::fprintf(f, "%zu,%zu,%.3f,%.3f\n", c, mb, call_us[c], warm_us[mb]);
  }
  if (std::fclose(f) != 0) throw std::runtime_error("FEPLB_BENCH_CALLS: cannot write " + path);
}

void BM_Plan(benchmark::State& state, const std::string& bench_name,
             const std::string& planner_name, const BenchConfig& cfg,
             const std::vector<KnobOverride>& overrides) {
  const Workload* w = nullptr;
  Knobs knobs;
  apply_knobs(knobs, overrides);
  std::unique_ptr<RooflineCostModel> cost;
  std::unique_ptr<Planner> planner;
  Plan plan;
  double reserve_us = 0;
  try {
    w = &workload_for(cfg);
    cost = std::make_unique<RooflineCostModel>(kGlm5Shape, knobs);
    planner = make_planner(planner_name, PlannerContext{w->topo, kGlm5Shape, knobs, cost.get()});
    // History-based planners (feplb-paper) see the warm-up micro-batches first, as in simulation,
    // so that their dynamic sets come from observed counts, and feplb with prefetch its
    // prediction; for the others observe() is a no-op.
    for (const RoutingStep& s : w->warmup) planner->observe(s);
    // One untimed pass: the planners' "first call" (buffers sized, cost-model cache filled), and
    // every plan is checked, so a broken planner fails here instead of being timed. The reserve
    // is the most any of these plans charges itself (a mode that plans a step five times
    // reserves twice the knobs' reserve: Plan::reserve_us).
    for (const RoutingStep& s : w->timed) {
      planner->plan(s, plan);
      validate(plan, w->topo, s, kGlm5Shape, planner->limits());
      reserve_us = std::max(
          reserve_us, plan.reserve_us >= 0 ? plan.reserve_us : planner_reserve_us(knobs, w->topo));
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }

  size_t i = 0;
  for (auto _ : state) {
    planner->plan(w->timed[i], plan);  // the timed region
    benchmark::DoNotOptimize(plan.slices.data());
    benchmark::ClobberMemory();
    if (++i == w->timed.size()) i = 0;
  }

  // Allocations per plan() call once warm, counted over one more untimed pass.
  const int64_t before = g_allocations.load(std::memory_order_relaxed);
  for (const RoutingStep& s : w->timed) planner->plan(s, plan);
  const int64_t allocations = g_allocations.load(std::memory_order_relaxed) - before;

  // Per-call latency: each of kClockedCalls calls clocked on its own (steady_clock; its ~20 ns
  // read is within the figures' resolution), against the reserve the planner charges itself.
  // A call that an interrupt lands in is that much longer: the machine's stalls are reported
  // beside it (MachineStalls), so that a p99 they set can be told from the planner's.
  std::vector<double> call_us(kClockedCalls);
  for (int c = 0; c < kClockedCalls; ++c) {
    const auto t0 = std::chrono::steady_clock::now();
    planner->plan(w->timed[static_cast<size_t>(c) % w->timed.size()], plan);
    const auto t1 = std::chrono::steady_clock::now();
    call_us[static_cast<size_t>(c)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  if (const char* dir = std::getenv("FEPLB_BENCH_CALLS")) {
    try {
      write_calls(dir, bench_name, *planner, *w, plan, call_us);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
  }
  std::sort(call_us.begin(), call_us.end());
  state.counters["p50_us"] = call_us[call_us.size() / 2];
  state.counters["p95_us"] = call_us[call_us.size() * 95 / 100];
  state.counters["p99_us"] = call_us[call_us.size() * 99 / 100];
  state.counters["reserve_us"] = reserve_us;
  const MachineStalls& stalls = machine_stalls();
  state.counters["stalls_per_s"] = stalls.per_s;
  state.counters["stall_p50_us"] = stalls.p50_us;

  state.counters["ranks"] = cfg.ranks;
  state.counters["experts"] = cfg.experts;
  state.counters["domains"] = w->topo.num_domains();
  state.counters["allocs_per_plan"] =
      static_cast<double>(allocations) / static_cast<double>(w->timed.size());
}

// What the layer sees: between two plans of a layer the host runs the rest of the training step
// (the model's other layers and their planners, the framework), and the layer's planner observes
// the micro-batch it planned (Planner::observe, off the critical path). plan_cold/... times
// kColdCalls plan() calls of the default planner, each after observe() of the micro-batch before
// and after touching kColdCases[i].touch_mib MiB of other memory (one write per 64-byte line: 4 MiB
// flushes the core's own caches, 64 MiB its share of the last-level cache as well), so each call
// starts with its code and data where that much other work left them. Manual time: the plan()
// call alone; counters p50/p90/p99 of the calls. `primed`: Planner::prime() runs between the
// touching and the plan (untimed: the GPU layer primes while the counts travel to the host;
// prime_p50_us is its own time, which that wait must cover for the plan not to start later).
constexpr int kColdCalls = 200;
struct ColdCase {
  int touch_mib;
  bool primed;
};
constexpr ColdCase kColdCases[] = {{4, false}, {64, false}, {64, true}};
constexpr std::string_view kColdConfigs[] = {"ep8_e128_skew5", "ep72_e288_skew5_nvl72",
                                             "ep256_e1024_skew5_nvl256"};

void BM_PlanCold(benchmark::State& state, const BenchConfig& cfg, int touch_mib, bool primed) {
  const Workload* w = nullptr;
  Knobs knobs;
  std::unique_ptr<RooflineCostModel> cost;
  std::unique_ptr<Planner> planner;
  Plan plan;
  try {
    w = &workload_for(cfg);
    cost = std::make_unique<RooflineCostModel>(kGlm5Shape, knobs);
    planner = make_planner("feplb", PlannerContext{w->topo, kGlm5Shape, knobs, cost.get()});
    for (const RoutingStep& s : w->warmup) planner->observe(s);
    for (const RoutingStep& s : w->timed) {  // untimed: tables grown, plans checked
      planner->plan(s, plan);
      validate(plan, w->topo, s, kGlm5Shape, planner->limits());
      planner->observe(s);
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::vector<uint8_t> other(static_cast<size_t>(touch_mib) << 20, 1);
  std::vector<double> call_us, prime_us;
  call_us.reserve(static_cast<size_t>(kColdCalls));
  prime_us.reserve(static_cast<size_t>(kColdCalls));
  size_t i = 0;
  for (auto _ : state) {
    for (size_t b = 0; b < other.size(); b += 64) other[b] = static_cast<uint8_t>(other[b] + 1);
    benchmark::ClobberMemory();
    if (primed) {
      const auto p0 = std::chrono::steady_clock::now();
      planner->prime(w->timed[i].layer, plan);
      prime_us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - p0).count());
    }
    const auto t0 = std::chrono::steady_clock::now();
    planner->plan(w->timed[i], plan);  // the timed region
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(plan.slices.data());
    const double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    state.SetIterationTime(us * 1e-6);
    call_us.push_back(us);
    planner->observe(w->timed[i]);
    if (++i == w->timed.size()) i = 0;
  }
  std::sort(call_us.begin(), call_us.end());
  const auto at = [&](double q) {
    return call_us[std::min(call_us.size() - 1,
                            static_cast<size_t>(q * static_cast<double>(call_us.size())))];
  };
  state.counters["p50_us"] = at(0.50);
  state.counters["p90_us"] = at(0.90);
  state.counters["p99_us"] = at(0.99);
  state.counters["touched_mib"] = touch_mib;
  if (primed) {
    std::sort(prime_us.begin(), prime_us.end());
    state.counters["prime_p50_us"] = prime_us[prime_us.size() / 2];
  }
  state.counters["ranks"] = cfg.ranks;
  state.counters["experts"] = cfg.experts;
}

// Registered in configuration order, so each workload is generated once, before its first run.
int register_benchmarks() {
  for (const BenchConfig& cfg : kConfigs) {
    for (const std::string& name : planner_names()) {
      const std::string bench_name = "plan/" + name + "/" + std::string(cfg.label);
      benchmark::RegisterBenchmark(bench_name.c_str(), BM_Plan, bench_name, name, cfg,
                                   std::vector<KnobOverride>{})
          ->Unit(benchmark::kMicrosecond)
          ->Repetitions(kRepetitions)
          ->ReportAggregatesOnly(true);
    }
    if (std::find(std::begin(kColdConfigs), std::end(kColdConfigs), cfg.label) !=
        std::end(kColdConfigs)) {
      for (const auto& [mib, primed] : kColdCases) {
        const std::string bench_name = std::string(primed ? "plan_primed" : "plan_cold") +
                                       "/feplb/" + std::string(cfg.label) +
                                       "/touched_mib:" + std::to_string(mib);
        benchmark::RegisterBenchmark(bench_name.c_str(), BM_PlanCold, cfg, mib, primed)
            ->Unit(benchmark::kMicrosecond)
            ->UseManualTime()
            ->Iterations(kColdCalls)
            ->Repetitions(3)
            ->ReportAggregatesOnly(true);
      }
    }
    if (std::find(std::begin(kModeConfigs), std::end(kModeConfigs), cfg.label) ==
        std::end(kModeConfigs))
      continue;
    for (const FeplbMode& mode : kFeplbModes) {
      const std::string bench_name =
          "plan/" + std::string(mode.label) + "/" + std::string(cfg.label);
      benchmark::RegisterBenchmark(bench_name.c_str(), BM_Plan, bench_name, "feplb", cfg,
                                   mode.knobs)
          ->Unit(benchmark::kMicrosecond)
          ->Repetitions(kRepetitions)
          ->ReportAggregatesOnly(true);
    }
  }
  return 0;
}

[[maybe_unused]] const int kRegistered = register_benchmarks();

}  // namespace
}  // namespace feplb
