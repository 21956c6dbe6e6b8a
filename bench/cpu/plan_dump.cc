// Plan fingerprints for checking that a change to a planner's speed leaves its plans byte for
// byte the same: plans every step of a set of generated workloads (the planner benchmarks'
// workloads and a few more shapes) under a grid of knob settings and both cost models, and prints
// one line per plan: case, step, and a 64-bit FNV-1a hash and the length of serialize(plan).
// Run it before and after the change and diff the outputs:
//   build/bin/feplb_plan_dump [--policy feplb] > before.txt; (change, rebuild) ...; diff
// With --schedule each line also hashes the plan's schedule (serialize(plan.schedule): every time
// in hex floating point), which serialize(plan) leaves out: a change to the schedule writer or to
// the times a planner models must leave it the same too.
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/feplb/fixed_mode.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/routing.h"
#include "feplb/core/schedule.h"
#include "feplb/core/topology.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"

namespace feplb {
namespace {

constexpr char kOlmoePrior[] = FEPLB_DATA_DIR "/priors/olmoe-1b-7b__olmoe-repo__arxiv.json";
constexpr char kGlm5Table[] = FEPLB_DATA_DIR "/cost/h200-glm5.json";
const ExpertShape kGlm5Shape{.hidden = 6144, .ffn = 2048, .dtype = Dtype::kBf16};

struct Config {
  const char* label;
  int ranks, experts, gpus_per_node;
  bool olmoe;
  double skew;
  int steps;  // micro-batches planned (each with one step per prior layer)
};

// The planner benchmarks' workloads (bench/cpu/planners_bench.cc), then other shapes: several
// domains at rack scale, one and two experts per GPU, a domain size that is not a power of two.
constexpr Config kConfigs[] = {
    {"ep8_e128", 8, 128, 8, true, 0, 12},
    {"ep64_e256", 64, 256, 8, true, 0, 6},
    {"ep64_e256_lognormal", 64, 256, 8, false, 4.0, 16},
    {"ep8_e128_skew5", 8, 128, 8, false, 5.0, 24},
    {"ep72_e288_skew5_nvl72", 72, 288, 72, false, 5.0, 24},
    {"ep256_e1024_skew5_nvl256", 256, 1024, 256, false, 5.0, 12},
    {"ep64_e128_olmoe_nvl64", 64, 128, 64, true, 0, 6},
    {"ep72_e144_hot10_nvl72", 72, 144, 72, false, 13.0, 16},
    {"ep144_e576_skew5_nvl72x2", 144, 576, 72, false, 5.0, 8},
    {"ep48_e48_skew8_nvl48", 48, 48, 48, false, 8.0, 12},
    {"ep100_e400_skew3_nvl100", 100, 400, 100, false, 3.0, 8},
    {"ep16_e128_skew5", 16, 128, 8, false, 5.0, 12},
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

struct KnobCase {
  std::string label;
  Knobs knobs;
  bool placement;  // a placement's dynamic sets in the context
};

// Every switch of feplb's mode set, to the values the knobs' defaults had before feplb chose its
// own mode (one_hop 0, prefetch 0, copy_timing 1, rows, 20 us reserved): the explicit modes'
// fingerprints stay comparable across changes of the default.
Knobs explicit_defaults() { return fixed_mode_knobs(); }

std::vector<KnobCase> knob_cases() {
  std::vector<KnobCase> out;
  for (int timing = 0; timing <= 3; ++timing) {
    for (int one_hop = 0; one_hop <= 1; ++one_hop) {
      for (int prefetch = 0; prefetch <= 1; ++prefetch) {
        for (int dyn_set = 0; dyn_set <= 1; ++dyn_set) {
          Knobs k = explicit_defaults();
          k.copy_timing = timing;
          k.one_hop = one_hop;
          k.prefetch = prefetch;
          k.feplb_dyn_set = dyn_set;
          // fmt, not string concatenation: GCC 12 warns (-Wrestrict, a false positive) on
          // "literal" + std::string at -O2.
          out.push_back(
              {fmt::format("t{}h{}p{}d{}", timing, one_hop, prefetch, dyn_set), k, dyn_set == 1});
        }
      }
    }
  }
  // Settings off the grid, each a list of knob overrides on the defaults.
  const std::vector<std::pair<std::string, std::vector<KnobOverride>>> extra = {
      {"tol0", {{"balance_tolerance", 0}}},
      {"help1_dyn2", {{"max_helpers_per_expert", 1}, {"max_num_dyn", 2}}},
      {"slice128_t2_p1_hist3",
       {{"min_slice_rows", 128},
        {"slice_align_rows", 64},
        {"copy_timing", 2},
        {"prefetch", 1},
        {"prefetch_history", 3}}},
      {"slow_t3", {{"copy_gbps", 50}, {"copy_timing", 3}}},
      {"dyn1_help8", {{"dyn", 1}, {"max_helpers_per_expert", 8}}},
      // No placement: the lowest-numbered local experts.
      {"d1_noplacement", {{"feplb_dyn_set", 1}}},
      // Time balancing: fixed blends, and within a token budget (the blends bisected, the capped
      // plan, both levelled), with the other modes.
      {"w1", {{"balance_time_weight", 1}}},
      {"w05_t2_h1", {{"balance_time_weight", 0.5}, {"copy_timing", 2}, {"one_hop", 1}}},
      {"w025_t0_p1", {{"balance_time_weight", 0.25}, {"copy_timing", 0}, {"prefetch", 1}}},
      {"b005_p1", {{"time_balance_budget", 0.05}, {"prefetch", 1}}},
      {"b005_p1_h1", {{"time_balance_budget", 0.05}, {"prefetch", 1}, {"one_hop", 1}}},
      {"b01_t3_h1_d1",
       {{"time_balance_budget", 0.1}, {"copy_timing", 3}, {"one_hop", 1}, {"feplb_dyn_set", 1}}},
      {"b002_t2_cover0", {{"time_balance_budget", 0.02}, {"copy_timing", 2}, {"dyn_cover", 0}}},
  };
  for (const auto& [label, overrides] : extra) {
    Knobs k = explicit_defaults();
    apply_knobs(k, overrides);
    out.push_back({label, k, false});
  }
  Knobs time_on_placement = explicit_defaults();  // time within a budget over the placement's sets
  apply_knobs(time_on_placement, {{"time_balance_budget", 0.05}, {"feplb_dyn_set", 1}});
  out.push_back({"b005_d1", time_on_placement, true});
  // The default: feplb chooses its mode (chooser.h), and with the path fixed.
  out.push_back({"auto", Knobs{}, false});
  Knobs auto_two_phase;
  auto_two_phase.one_hop = 0;
  out.push_back({"auto_h0", auto_two_phase, false});
  return out;
}

int run(const std::string& policy, bool with_schedule) {
  const TableCostModel table = read_gemm_table(kGlm5Table);
  for (const Config& cfg : kConfigs) {
    const Prior prior = cfg.olmoe ? expand_prior(read_prior(kOlmoePrior), cfg.experts, 1)
                                  : lognormal_prior(cfg.experts, cfg.skew, 1, 1);
    WorkloadSpec spec;
    spec.num_ranks = cfg.ranks;
    spec.tokens_per_rank = 4096;
    spec.top_k = std::min(8, cfg.experts);
    spec.seed = 1;
    const Topology topo = Topology::contiguous(cfg.ranks, cfg.gpus_per_node, cfg.experts);
    std::vector<RoutingStep> steps;
    for (int mb = 0; mb < cfg.steps; ++mb) {
      for (int l = 0; l < prior.num_layers(); ++l)
        steps.push_back(generate_step(prior.popularity[l], spec, mb, prior.layer_ids[l]));
    }
    // A placement's dynamic sets: about half of every GPU's experts, varying by GPU.
    std::vector<uint8_t> dynamic(static_cast<size_t>(cfg.experts));
    for (int e = 0; e < cfg.experts; ++e) dynamic[e] = (e * 7 + e / 3) % 2 == 0;
    for (const KnobCase& kc : knob_cases()) {
      for (int use_table = 0; use_table <= 1; ++use_table) {
        Knobs knobs = kc.knobs;
        knobs.prefetch_window_us = prefetch_window_us(kGlm5Shape, 4096, knobs);
        const RooflineCostModel roofline(kGlm5Shape, knobs);
        const GemmCostModel* cost = use_table ? static_cast<const GemmCostModel*>(&table)
                                              : static_cast<const GemmCostModel*>(&roofline);
        PlannerContext ctx{topo, kGlm5Shape, knobs, cost};
        if (kc.placement) ctx.dynamic = dynamic;
        auto planner = make_planner(policy, ctx);
        Plan plan;
        for (size_t i = 0; i < steps.size(); ++i) {
          planner->plan(steps[i], plan);
          validate(plan, topo, steps[i], kGlm5Shape, planner->limits());
          const std::string bytes = serialize(plan);
          std::printf("%s %s %s %zu %016llx %zu", cfg.label, kc.label.c_str(),
                      use_table ? "table" : "roofline", i,
                      static_cast<unsigned long long>(fnv1a(bytes)), bytes.size());
          if (with_schedule) {
            std::printf(" %016llx %s",
                        static_cast<unsigned long long>(fnv1a(serialize(plan.schedule))),
                        plan.mode.c_str());
          }
          std::printf("\n");
          planner->observe(steps[i]);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace feplb

int main(int argc, char** argv) {
  std::string policy = "feplb";
  bool with_schedule = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--policy") == 0 && i + 1 < argc) {
      policy = argv[++i];
    } else if (std::strcmp(argv[i], "--schedule") == 0) {
      with_schedule = true;
    } else {
      std::fprintf(stderr, "usage: feplb_plan_dump [--policy NAME] [--schedule]\n");
      return 2;
    }
  }
  return feplb::run(policy, with_schedule);
}
