// feplb planner-time: what feplb's default planner takes on this host, mode by mode, against the
// planner time its two-phase plans reserve ahead of their copies (the GPU layer compares its modes
// at the measured time: RuntimeConfig::measure_planner; a simulation can charge every plan that
// time with --planner-time-us).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "cli.h"
#include "feplb/core/error.h"
#include "feplb/core/limits.h"
#include "feplb/core/planners/feplb/chooser.h"
#include "feplb/core/planners/planner.h"

namespace feplb::cli {
namespace {

struct PlannerTimeOptions : ModelFlags {
  int ranks = 8;
  int64_t experts = 128;
  int64_t rows_per_rank = 4096 * 8;
  std::string model;  // sets the expert shape (default: default_shape())
};

void run_planner_time(const PlannerTimeOptions& o) {
  FEPLB_REQUIRE_INPUT(o.ranks * o.experts <= limits::kMaxTraceCounts,
                      "--ranks {} x --experts {}: at most {} counts per micro-batch", o.ranks,
                      o.experts, limits::kMaxTraceCounts);
  FEPLB_REQUIRE_INPUT(o.experts % o.ranks == 0,
                      "--experts {} must be a multiple of --ranks {} (experts per GPU)", o.experts,
                      o.ranks);
  FEPLB_REQUIRE_INPUT(o.ranks % o.gpus_per_node == 0 || o.gpus_per_node >= o.ranks,
                      "--ranks {} must be a multiple of --gpus-per-node {} (whole NVLink domains)",
                      o.ranks, o.gpus_per_node);
  const Topology topo = Topology::contiguous(o.ranks, std::min(o.gpus_per_node, o.ranks),
                                             static_cast<int>(o.experts));
  ShapeFlags flags = o.shape;
  if (o.model.empty() && !flags.hidden) flags.hidden = default_shape().hidden;
  if (o.model.empty() && !flags.ffn) flags.ffn = default_shape().ffn;
  const ExpertShape shape = resolve_shape(flags, nullptr, o.model);
  FEPLB_REQUIRE_INPUT(shape.hidden > 0 && shape.ffn > 0,
                      "--model '{}' names no known expert shape; give --hidden and --ffn", o.model);
  const CostChoice cost = resolve_cost(o.cost_model, shape, o.knobs, *o.gpu_class);
  const RooflineCostModel roofline(shape, o.knobs);  // where no measured table was chosen
  const PlannerContext ctx{topo, shape, o.knobs, cost.model ? cost.model.get() : &roofline};
  const auto planner = make_planner("feplb", ctx);
  const auto* chooser = dynamic_cast<const FeplbChooser*>(planner.get());
  FEPLB_REQUIRE_INPUT(chooser != nullptr,
                      "feplb plans in one mode with these knobs (every mode switch set): it keeps "
                      "the knobs' reserve, planner_budget_us; leave a switch at -1 to measure");
  FEPLB_REQUIRE_INPUT(o.knobs.planner_budget_us < 0,
                      "--planner-budget-us {} sets the reserve; leave it at -1 to measure",
                      o.knobs.planner_budget_us);
  std::printf("%s | %s | %lld rows per rank | GEMM model: %s\n", topo.describe().c_str(),
              shape.describe().c_str(), static_cast<long long>(o.rows_per_rank),
              cost.label.c_str());
  std::printf("measuring %d synthetic micro-batches per two-phase mode...\n",
              FeplbChooser::kProbeSteps);
  std::fflush(stdout);
  const std::vector<ModeTime> times = planner->measure_mode_times(o.rows_per_rank);
  std::printf("\n%-64s %10s %10s %11s %9s\n", "two-phase mode", "p90 us", "p99 us", "reserve us",
              "x reserve");
  for (const ModeTime& t : times) {
    double reserve = 0;
    for (const FeplbConfig& m : chooser->candidates()) {
      if (m.label() == t.mode) reserve = m.reserve_us;
    }
    std::printf("%-64s %10.1f %10.1f %11.1f %9.2f\n", t.mode.c_str(), t.us, t.p99_us, reserve,
                reserve > 0 ? std::max(1.0, t.us / reserve) : 1.0);
  }
  std::printf(
      "\n%d plans each (their schedules written), one thread, after the planner's tables cover the "
      "stream;\nreserve: what the plans reserve ahead of their copies in simulation "
      "(planner_budget_us -1);\nx reserve: the p90 over it, at least 1: the speed at which the GPU "
      "layer's feplb compares its modes\nbefore its own plans are timed (copies that much later, "
      "one-hop plans that much longer; the slowest rank's)\n",
      FeplbChooser::kProbeSteps - FeplbChooser::kProbeWarmSteps);
}

}  // namespace

void add_planner_time_command(CLI::App& app) {
  auto o = std::make_shared<PlannerTimeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "planner-time",
      "Time feplb's default planner on this host, mode by mode, against the reserve its plans "
      "keep ahead of their copies");
  add_int(*cmd, "--ranks", o->ranks, 1, limits::kMaxRanks,
          "GPUs (expert-parallel ranks; default 8)");
  add_int(*cmd, "--experts", o->experts, 1, limits::kMaxExperts,
          "experts, a multiple of --ranks (default 128)");
  add_int(*cmd, "--rows-per-rank", o->rows_per_rank, 0, limits::kMaxTokensPerRank,
          "token-expert rows each rank routes per micro-batch: tokens x top_k (default 32768)");
  add_model_flag(*cmd, o->model, "model whose experts to plan (default GLM-5's)");
  add_model_flags(*cmd, *o);
  cmd->callback([o, cmd] {
    apply_model_flags(*cmd, *o);
    run_planner_time(*o);
  });
}

}  // namespace feplb::cli
