// feplb run: the layer on this GPU over a trace. Per policy: the plan's token straggler, the
// GEMM straggler the cost model predicts and the one measured (each rank's experts timed alone
// on the GPU, as R GPUs would run them), and the real layer's forward with the trace's ranks as
// virtual ranks on this GPU. Without a GPU (or CUDA) it says so and exits 2.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"
#include "feplb/core/error.h"
#include "feplb/core/file_io.h"
#include "feplb/core/limits.h"
#include "feplb/core/metrics.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/stats.h"
#include "feplb/core/trace_io.h"
#ifdef FEPLB_HAVE_CUDA
#include "bench/harness/expert_bench.h"
#include "bench/harness/trace_runner.h"
#include "feplb/cuda/device.h"
#include "feplb/cuda/gemm/grouped_ffn.h"
#endif

namespace feplb::cli {
namespace {

struct RunOptions : ModelFlags {
  std::string trace, policies = "static,feplb-paper,feplb", json_out;
  int steps = 8;
  bool force = false, no_layer = false;
  bool reserve_from_knobs = false;   // the runtime's measure_planner off
  std::string expert_gemm = "auto";  // RuntimeConfig::expert_gemm, and the timed-alone GEMMs'
};

#ifdef FEPLB_HAVE_CUDA
// One policy's plans of the picked steps and what was measured of them.
struct Row {
  std::string policy;
  std::vector<Plan> plans;
  std::vector<double> st, sg_pred, sg_meas, fwd_alone, bwd_alone;
  double fwd_ms = 0, wait_ms = 0;
  std::vector<double> latency_us, plan_us, to_host_us, to_plan_us;
  std::vector<double> reserve_us, reserved_plan_us;  // two-phase plans
  std::vector<double> prime_us;
  int primes_overtaken = 0;
  std::vector<std::string> modes;     // rank 0's plans' modes
  std::vector<ModeTime> start_times;  // measured when the runtime was made
};

// What every part of the run shares.
struct RunSetup {
  const RunOptions& o;
  std::string path;
  const Trace& trace;
  ExpertShape shape;
  Topology topo;
  const GemmCostModel& cost;
  std::vector<size_t> picked;  // the trace steps run, spread over the trace
};

// Plans first (planners see every step in order, as in simulation); `max_rows`: the most rows one
// GPU computes in any of them.
std::vector<Row> plan_rows(const RunSetup& s, const std::vector<std::string>& policies,
                           int64_t& max_rows) {
  std::vector<Row> rows;
  max_rows = 1;
  for (const std::string& p : policies) {
    auto planner = make_planner(p, PlannerContext{s.topo, s.shape, s.o.knobs, &s.cost});
    Row r;
    r.policy = p;
    Plan plan;
    for (size_t i = 0; i < s.trace.steps.size(); ++i) {
      if (std::find(s.picked.begin(), s.picked.end(), i) != s.picked.end()) {
        planner->plan(s.trace.steps[i], plan);
        validate(plan, s.topo, s.trace.steps[i], s.shape, planner->limits());
        r.plans.push_back(plan);
        for (const auto& g : cuda::ExpertBench::rows_per_gpu(plan, s.topo.num_ranks())) {
          for (int64_t x : g) max_rows = std::max(max_rows, x);
        }
      }
      planner->observe(s.trace.steps[i]);
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

// The expert GEMMs, of the layer and of each rank timed alone: as asked (auto: grouped where the
// GPU has them, but for batches of large experts; docs/gpu.md "Expert GEMMs").
cuda::ExpertGemm layer_gemms(const RunOptions& o) {
  const cuda::ExpertGemm expert_gemm = o.expert_gemm == "grouped" ? cuda::ExpertGemm::kGrouped
                                       : o.expert_gemm == "per_expert"
                                           ? cuda::ExpertGemm::kPerExpert
                                           : cuda::ExpertGemm::kAuto;
  FEPLB_REQUIRE_INPUT(expert_gemm != cuda::ExpertGemm::kGrouped || cuda::GroupedFfn::available(),
                      "--expert-gemm grouped: this GPU has no grouped GEMM kernels (compute "
                      "capability 9.0 only); use auto or per_expert");
  return expert_gemm;
}
cuda::ExpertBench::Gemms bench_gemms(cuda::ExpertGemm g) {
  if (!cuda::GroupedFfn::available() || g == cuda::ExpertGemm::kPerExpert)
    return cuda::ExpertBench::Gemms::kPerExpert;
  return g == cuda::ExpertGemm::kGrouped ? cuda::ExpertBench::Gemms::kGrouped
                                         : cuda::ExpertBench::Gemms::kAuto;
}
const char* gemms_name(cuda::ExpertBench::Gemms g) {
  return g == cuda::ExpertBench::Gemms::kPerExpert ? "per_expert"
         : g == cuda::ExpertBench::Gemms::kGrouped ? "grouped"
                                                   : "auto";
}

// Each plan's straggler predicted and measured (each rank's experts timed alone, forward and
// backward), then the real layer with the trace's ranks as virtual ranks.
void measure_row(const RunSetup& s, cuda::ExpertBench& bench, cuda::ExpertGemm expert_gemm,
                 Row& r) {
  const cuda::ExpertBench::Gemms gemms = bench_gemms(expert_gemm);
  for (const Plan& plan : r.plans) {
    const StepMetrics m = measure_plan(plan, s.topo, s.cost, 0.0);
    const std::vector<double> g = cuda::rank_gemm_ms(bench, plan, s.topo.num_ranks(), 5, gemms);
    r.st.push_back(m.token_straggler);
    r.sg_pred.push_back(m.gemm_straggler_ms);
    r.sg_meas.push_back(*std::max_element(g.begin(), g.end()) - mean_of(g));
    r.fwd_alone.push_back(*std::max_element(g.begin(), g.end()));
    double b = 0;
    for (const auto& gpu_rows : cuda::ExpertBench::rows_per_gpu(plan, s.topo.num_ranks())) {
      b = std::max(b, bench.run_ms(gpu_rows, 1, 5, cuda::ExpertBench::Pass::kBackward, gemms));
    }
    r.bwd_alone.push_back(b);
  }
  if (s.o.no_layer) return;
  const cuda::VirtualLayerStats lay = cuda::run_virtual_layer(
      s.trace, s.shape, r.policy, s.o.knobs, static_cast<int>(s.picked.size()), s.o.gpus_per_node,
      60, !s.o.reserve_from_knobs, true, expert_gemm);
  r.fwd_ms = quantile_of(lay.forward_ms, 0.5);
  r.wait_ms = quantile_of(lay.wait_ms, 0.5);
  r.latency_us = lay.counts_to_first_copy_us;
  r.plan_us = lay.plan_us;
  r.to_host_us = lay.counts_to_host_us;
  r.to_plan_us = lay.counts_to_plan_us;
  r.reserve_us = lay.plan_reserve_us;
  r.reserved_plan_us = lay.reserved_plan_us;
  r.prime_us = lay.prime_us;
  r.primes_overtaken = lay.primes_overtaken;
  r.modes = lay.plan_modes;
  r.start_times = lay.start_times;
}

// The table's line of one policy, and its part of the JSON.
void report_row(const Row& r, bool no_layer, nlohmann::ordered_json& doc) {
  const double pred = mean_of(r.sg_pred), meas = mean_of(r.sg_meas);
  std::fprintf(human_out(), "%-12s %16.0f %16.3f %16.3f %7.0f%% %12.3f %12.3f %16s %12s\n",
               r.policy.c_str(), mean_of(r.st), pred, meas,
               meas > 0 ? (pred / meas - 1) * 100 : 0.0, mean_of(r.fwd_alone), mean_of(r.bwd_alone),
               no_layer ? "-" : fmt::format("{:.2f}", r.fwd_ms).c_str(),
               no_layer ? "-" : fmt::format("{:.3f}", r.wait_ms).c_str());
  doc["policies"][r.policy] = {{"token_straggler", mean_of(r.st)},
                               {"gemm_straggler_predicted_ms", pred},
                               {"gemm_straggler_measured_ms", meas},
                               {"experts_forward_slowest_gpu_ms", mean_of(r.fwd_alone)},
                               {"experts_backward_slowest_gpu_ms", mean_of(r.bwd_alone)},
                               {"layer_forward_virtual_ms", r.fwd_ms},
                               {"copy_wait_virtual_ms", r.wait_ms},
                               {"counts_to_first_copy_us", r.latency_us},
                               {"plan_us", r.plan_us},
                               {"counts_to_host_us", r.to_host_us},
                               {"counts_to_plan_us", r.to_plan_us},
                               {"two_phase_plan_reserve_us", r.reserve_us},
                               {"two_phase_plan_us", r.reserved_plan_us},
                               {"plan_modes", r.modes},
                               {"prime_us", r.prime_us},
                               {"primes_overtaken", r.primes_overtaken}};
  nlohmann::ordered_json start = nlohmann::ordered_json::array();
  for (const ModeTime& t : r.start_times)
    start.push_back({{"mode", t.mode}, {"p90_us", t.us}, {"p99_us", t.p99_us}});
  doc["policies"][r.policy]["planner_times_at_start"] = start;
}

// A policy's two-phase plans against their reserve, its modes, its primes and the planner times
// measured at start.
void report_reserve(const Row& r, const RunOptions& o) {
  size_t late = 0;
  for (size_t i = 0; i < r.reserve_us.size(); ++i) late += r.reserved_plan_us[i] > r.reserve_us[i];
  std::fprintf(
      human_out(),
      "%-12s two-phase plans: planner median %.1f us, p99 %.1f us; reserved ahead of the copies "
      "median %.1f us (%s); %zu of %zu plans took longer than their reserve\n",
      r.policy.c_str(), quantile_of(r.reserved_plan_us, 0.5), quantile_of(r.reserved_plan_us, 0.99),
      quantile_of(r.reserve_us, 0.5),
      o.reserve_from_knobs ? "modes compared at the knobs' time"
                           : "modes compared at the time measured on this host",
      late, r.reserve_us.size());
  size_t changes = 0;
  for (size_t i = 1; i < r.modes.size(); ++i) changes += r.modes[i] != r.modes[i - 1];
  if (!r.modes.empty() && !r.modes.front().empty()) {
    std::fprintf(
        human_out(),
        "%-12s modes of rank 0's %zu plans: %zu changes, the first \"%s\", the last \"%s\"\n",
        r.policy.c_str(), r.modes.size(), changes, r.modes.front().c_str(), r.modes.back().c_str());
  }
  if (!o.no_layer) {
    std::fprintf(human_out(),
                 "%-12s planner primed while the counts travelled: %zu of %zu plans (median %.1f "
                 "us), the counts overtook %d of them\n",
                 r.policy.c_str(), r.prime_us.size(), r.plan_us.size(),
                 quantile_of(r.prime_us, 0.5), r.primes_overtaken);
  }
  for (const ModeTime& t : r.start_times) {
    std::fprintf(human_out(),
                 "%-12s planner measured at start: %s: p90 %.0f us (every rank's largest), p99 "
                 "%.0f us (rank 0's)\n",
                 r.policy.c_str(), t.mode.c_str(), t.us, t.p99_us);
  }
}

// The table, the latency and reserve lines, the JSON document.
nlohmann::ordered_json report(const RunSetup& s, const std::vector<Row>& rows,
                              const std::string& gpu, const std::string& cost_label,
                              const char* gemm_name) {
  std::fprintf(human_out(), "\n%-12s %16s %16s %16s %8s %12s %12s %16s %12s\n", "policy",
               "token straggler", "GEMM straggler", "GEMM straggler", "error", "experts fwd",
               "experts bwd", "layer forward", "copy wait");
  std::fprintf(human_out(), "%-12s %16s %16s %16s %8s %12s %12s %16s %12s\n", "", "rows (plan)",
               "predicted ms", "measured ms", "", "ms (slowest)", "ms (slowest)", "ms (virtual)",
               "ms (virtual)");
  nlohmann::ordered_json doc;
  doc["trace"] = s.path;
  doc["gpu"] = gpu;
  doc["cost_model"] = cost_label;
  doc["expert_gemm"] = gemm_name;
  for (const Row& r : rows) report_row(r, s.o.no_layer, doc);
  for (const Row& r : rows) {
    if (r.latency_us.empty()) continue;
    std::fprintf(
        human_out(),
        "%-12s counts ready on the GPU -> plan ready: median %.1f us (counts to host %.1f, plan "
        "%.1f); -> "
        "first phase-2 copy issued: median %.1f us, p99 %.1f us (%zu forwards x ranks with copies; "
        "waits "
        "for the rank's all-to-all to be enqueued)\n",
        r.policy.c_str(), quantile_of(r.to_plan_us, 0.5), quantile_of(r.to_host_us, 0.5),
        quantile_of(r.plan_us, 0.5), quantile_of(r.latency_us, 0.5),
        quantile_of(r.latency_us, 0.99), r.latency_us.size());
  }
  for (const Row& r : rows) {
    if (!r.reserve_us.empty()) report_reserve(r, s.o);
  }
  std::fprintf(
      human_out(),
      "\nmeasured GEMM straggler and experts fwd/bwd: each rank's experts (own + guests) timed "
      "alone (median\n"
      "of 5), the slowest GPU's time; layer forward: the trace's %d ranks as virtual ranks sharing "
      "this\n"
      "GPU (their GEMMs overlap; not an R-GPU time)\n",
      s.topo.num_ranks());
  return doc;
}

void run_gpu(const RunOptions& o) {
  std::string why;
  const auto devs = list_devices(&why);
  FEPLB_REQUIRE_INPUT(!devs.empty(), "no GPU available ({}); `feplb simulate` runs without one",
                      why);
  FEPLB_REQUIRE_INPUT(o.steps >= 1, "--steps: {} must be at least 1", o.steps);
  validate_knobs(o.knobs);
  const std::string path = o.trace.empty() ? default_trace_path() : o.trace;
  FileSet files(o.force);
  files.input("the input trace", path);
  files.input("the --cost-model table", cost_model_path(o.cost_model));
  files.output("--json", o.json_out);
  files.check();
  route_human_output(files);
  const Trace trace = read_trace(path);
  const ExpertShape shape = resolve_shape(o.shape, &trace, trace.model);
  FEPLB_REQUIRE_INPUT(shape.hidden > 0 && shape.ffn > 0,
                      "expert shape unknown; pass --hidden and --ffn");
  const CostChoice cost_choice = resolve_cost(o.cost_model, shape, o.knobs);
  const RooflineCostModel roofline(shape, o.knobs);
  const GemmCostModel& cost = cost_choice.model
                                  ? static_cast<const GemmCostModel&>(*cost_choice.model)
                                  : static_cast<const GemmCostModel&>(roofline);
  RunSetup s{o,
             path,
             trace,
             shape,
             Topology::contiguous(trace.num_ranks, o.gpus_per_node, trace.num_experts),
             cost,
             {}};
  std::vector<std::string> policies;
  std::stringstream ss(o.policies);
  for (std::string p; std::getline(ss, p, ',');) policies.push_back(p);
  const size_t n = std::min<size_t>(static_cast<size_t>(o.steps), trace.steps.size());
  for (size_t i = 0; i < n; ++i) s.picked.push_back(trace.steps.size() * i / n);
  int64_t max_rows = 1;
  std::vector<Row> rows = plan_rows(s, policies, max_rows);
  std::fprintf(human_out(), "%s | %s | %s | %zu of %zu steps | GPU %s\nGEMM model: %s\n",
               path.c_str(), s.topo.describe().c_str(), shape.describe().c_str(), s.picked.size(),
               trace.steps.size(), devs[0].name.c_str(), cost_choice.label.c_str());
  const cuda::ExpertGemm expert_gemm = layer_gemms(o);
  const char* gemm_name = gemms_name(bench_gemms(expert_gemm));
  std::fprintf(human_out(), "expert GEMMs: %s\n", gemm_name);
  cuda::ExpertBench bench(shape, max_rows, 16, 1);
  for (Row& r : rows) measure_row(s, bench, expert_gemm, r);
  const nlohmann::ordered_json doc = report(s, rows, devs[0].name, cost_choice.label, gemm_name);
  if (!o.json_out.empty()) files.stage(o.json_out, doc.dump(2) + "\n");
  for (const std::string& written : files.commit()) say_wrote(written);
}
#endif

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Run the layer on this GPU over a trace: measured vs predicted (needs a GPU)");
  non_empty(cmd->add_option("--trace", o->trace,
                            "feplb-trace-v1 file (default: data/traces/default.json)"));
  add_policies(*cmd, o->policies,
               "comma-separated GPU policies (default static,feplb-paper,feplb)");
  add_int(*cmd, "--steps", o->steps, 1, limits::kMaxStepId,
          "trace steps to run, spread over the trace (default 8)");
  non_empty(cmd->add_option("--json", o->json_out, "write the results as JSON to this file"));
  cmd->add_flag("--force", o->force, "overwrite an existing --json file");
  cmd->add_flag("--no-layer", o->no_layer, "skip the full layer forward (GEMM timing only)");
  cmd->add_option("--expert-gemm", o->expert_gemm,
                  "the expert GEMMs: auto (grouped GEMMs with sizes read on the GPU where the GPU "
                  "has them: compute capability 9.0), grouped, or per_expert (cuBLASLt per "
                  "expert)")
      ->check(CLI::IsMember({"auto", "grouped", "per_expert"}));
  cmd->add_flag("--reserve-from-knobs", o->reserve_from_knobs,
                "feplb compares its modes at the knobs' planner time (their reserve), not at "
                "what its planner takes on this host (RuntimeConfig::measure_planner off)");
  add_model_flags(*cmd, *o);
  cmd->callback([o, cmd] {
    apply_knob_flags(*cmd, *o);
#ifdef FEPLB_HAVE_CUDA
    run_gpu(*o);
#else
    throw InputError(
        "`feplb run` needs a GPU build: this feplb was built without CUDA (no nvcc at build time)");
#endif
  });
}

}  // namespace feplb::cli
