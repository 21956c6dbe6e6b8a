// Placer microbenchmark: one Placer::place() call, 128 experts from a 1,000-micro-batch history,
// EP=16 over 2 nodes and EP=8, improve and from scratch (scripts/bench-cpu, filter "place").
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "feplb/core/placement.h"
#include "feplb/core/placer.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"

namespace feplb {
namespace {

constexpr char kOlmoePrior[] = FEPLB_DATA_DIR "/priors/olmoe-1b-7b__olmoe-repo__arxiv.json";
constexpr int kExperts = 128;
constexpr int64_t kHistorySteps = 1000;
constexpr int kGpusPerNode = 8;

// One layer's history (the OLMoE arxiv prior widened to 128 experts, its first layer, routed by
// 16 ranks of 4096 tokens, top-8), generated once on first use, outside any timed region.
const LayerHistory& history() {
  static const std::unique_ptr<LayerHistory> h = [] {
    const Prior prior = expand_prior(read_prior(kOlmoePrior), kExperts, 1);
    WorkloadSpec spec;
    spec.num_ranks = 16;
    auto out = std::make_unique<LayerHistory>();
    out->layer = prior.layer_ids.front();
    out->num_steps = kHistorySteps;
    for (int64_t t = 0; t < kHistorySteps; ++t) {
      const RoutingStep s = generate_step(prior.popularity.front(), spec, t, out->layer);
      out->rows.insert(out->rows.end(), s.expert_counts.begin(), s.expert_counts.end());
    }
    return out;
  }();
  return *h;
}

void BM_Place(benchmark::State& state, int ranks, HomesMode mode) {
  const LayerHistory& h = history();
  const Placement current =
      contiguous_placement(ranks, kGpusPerNode, kExperts, {h.layer}, Knobs{}.dyn);
  PlaceOptions options = place_options(Knobs{});
  options.homes = mode;
  int64_t rehomed = 0;
  for (auto _ : state) {
    Placer placer(ranks, kGpusPerNode, kExperts, options);
    std::vector<LayerPlaceStats> stats;
    const Placement p = placer.place({&h, 1}, current, &stats);
    benchmark::DoNotOptimize(p.layers.data());
    rehomed = stats.front().rehomed;
  }
  state.counters["ranks"] = ranks;
  state.counters["experts"] = kExperts;
  state.counters["history_steps"] = static_cast<double>(kHistorySteps);
  state.counters["rehomed"] = static_cast<double>(rehomed);
}

int register_benchmarks() {
  for (int ranks : {16, 8}) {
    for (const auto& [mode, label] :
         {std::pair{HomesMode::kImprove, "improve"}, std::pair{HomesMode::kFresh, "fresh"}}) {
      const std::string name =
          "place/" + std::string(label) + "/ep" + std::to_string(ranks) + "_e128_h1000";
      benchmark::RegisterBenchmark(name.c_str(), BM_Place, ranks, mode)
          ->Unit(benchmark::kMillisecond)
          ->Repetitions(5)
          ->ReportAggregatesOnly(true);
    }
  }
  return 0;
}

[[maybe_unused]] const int kRegistered = register_benchmarks();

}  // namespace
}  // namespace feplb
