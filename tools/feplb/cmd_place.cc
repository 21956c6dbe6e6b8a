// feplb place: the macro timescale's Router Predictor (docs/placement.md). A feplb-placement-v1
// file (homes and dynamic sets per layer) from a history trace, and the migration it implies.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "feplb/core/error.h"
#include "feplb/core/file_output.h"
#include "feplb/core/limits.h"
#include "feplb/core/placement.h"
#include "feplb/core/placer.h"
#include "feplb/core/text.h"
#include "feplb/core/trace_io.h"

namespace feplb::cli {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = kMiB * 1024.0;

struct PlaceCommandOptions : ModelFlags {
  std::string trace, current, out;
  int64_t window = 0;  // 0: not given (all of the trace)
  bool force = false;
};

std::string pct(double rows, double mean) {
  return fmt::format("{:.0f} ({:.2f}%)", rows, mean > 0 ? rows / mean * 100.0 : 0.0);
}

const char* homes_name(HomesMode m) {
  switch (m) {
    case HomesMode::kImprove:
      return "improve the current homes by swaps";
    case HomesMode::kFresh:
      return "from scratch (EPLB packing, swaps, relabelled)";
    case HomesMode::kKeep:
      return "keep the current homes";
  }
  return "";
}

const char* score_name(DynScore s) {
  switch (s) {
    case DynScore::kDonorRows:
      return "rows in the steps where their GPU is above its node's mean";
    case DynScore::kMeanRows:
      return "mean rows";
    case DynScore::kMeanPlusStd:
      return "mean + standard deviation of rows";
  }
  return "";
}

// The placement in force: --current (checked against the trace) or contiguous homes.
Placement current_placement(const PlaceCommandOptions& o, const Trace& trace) {
  if (o.current.empty()) {
    return contiguous_placement(trace.num_ranks, o.gpus_per_node, trace.num_experts,
                                trace_layers(trace), o.knobs.dyn);
  }
  Placement current = read_placement(o.current);
  try {
    check_placement_matches(current, trace, o.gpus_per_node);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", o.current, e.what()));
  }
  return current;
}

// Per layer, on the history: between nodes, above the node mean, static's straggler, swaps and
// experts re-homed, current -> new.
void print_layer_table(const std::vector<LayerPlaceStats>& stats) {
  const char* row = "%-6s  %-30s  %-26s  %-32s  %-11s  %s\n";
  std::fprintf(human_out(), row, "layer", "between nodes, per GPU", "above node mean, all GPUs",
               "static straggler", "swaps", "re-homed");
  std::fprintf(human_out(), row, "", "(% of the mean load)", "(rows to move in-node)",
               "(% of the mean load)", "node / GPU", "experts");
  for (const LayerPlaceStats& s : stats) {
    const double mean = s.before.mean_rows;
    std::fprintf(
        human_out(), row, fmt::format("{}", s.layer).c_str(),
        fmt::format("{} -> {}", pct(s.before.node_floor, mean), pct(s.after.node_floor, mean))
            .c_str(),
        fmt::format("{:.0f} -> {:.0f}", s.before.gpu_excess, s.after.gpu_excess).c_str(),
        fmt::format("{} -> {}", pct(s.before.gpu_straggler, mean), pct(s.after.gpu_straggler, mean))
            .c_str(),
        fmt::format("{} / {}", s.node_swaps, s.gpu_swaps).c_str(),
        fmt::format("{}", s.rehomed).c_str());
  }
}

void run_place(const PlaceCommandOptions& o) {
  FEPLB_REQUIRE_INPUT(!o.trace.empty(), "--trace: required (the history)");
  validate_knobs(o.knobs);
  const PlaceOptions options = place_options(o.knobs);
  FileSet files(o.force);
  files.input("the input trace", o.trace);
  files.input("the --current placement", o.current);
  files.output("--out", o.out);
  files.check();
  route_human_output(files);
  const Trace trace = read_trace(o.trace);
  FEPLB_REQUIRE_INPUT(trace.num_ranks <= o.gpus_per_node || trace.num_ranks % o.gpus_per_node == 0,
                      "--gpus-per-node: {} does not divide the trace's num_ranks {}",
                      o.gpus_per_node, trace.num_ranks);
  const ExpertShape shape = resolve_shape(o.shape, &trace, trace.model);
  FEPLB_REQUIRE_INPUT(shape.hidden > 0 && shape.ffn > 0,
                      "expert shape: unknown for model '{}'; pass --hidden and --ffn", trace.model);
  const Placement current = current_placement(o, trace);

  // The history: the trace's last `window` micro-batches (all by default).
  std::vector<size_t> starts;  // trace index where each micro-batch begins
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    if (i == 0 || trace.steps[i].step != trace.steps[i - 1].step) starts.push_back(i);
  }
  const auto num_mb = static_cast<int64_t>(starts.size());
  const int64_t used = o.window > 0 ? std::min(o.window, num_mb) : num_mb;
  const size_t first = starts[static_cast<size_t>(num_mb - used)];

  const Topology topo = Topology::contiguous(trace.num_ranks, o.gpus_per_node, trace.num_experts);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<LayerHistory> histories = layer_histories(trace, first, trace.steps.size());
  Placer placer(trace.num_ranks, o.gpus_per_node, trace.num_experts, options);
  std::vector<LayerPlaceStats> stats;
  const Placement next = placer.place(histories, current, &stats);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const Migration m = migration_between(current, next, shape, o.knobs.optimizer_bytes_per_param);

  std::fprintf(human_out(), "history: %s, last %lld of %lld micro-batches, %zu layer%s | %s\n",
               printable(o.trace).c_str(), static_cast<long long>(used),
               static_cast<long long>(num_mb), histories.size(), histories.size() == 1 ? "" : "s",
               topo.describe().c_str());
  std::fprintf(
      human_out(),
      "homes: %s (--place-homes %lld), min gain %.2f%% of the mean load; dynamic sets: %lld "
      "per GPU by %s; placed in %.1f ms\n",
      homes_name(options.homes), static_cast<long long>(o.knobs.place_homes),
      options.min_gain * 100.0,
      static_cast<long long>(std::min<int64_t>(o.knobs.dyn, topo.experts_per_rank())),
      score_name(options.dyn_score), ms);
  std::fprintf(human_out(),
               "on the history (in-sample), current -> new, rows per micro-batch:\n\n");
  print_layer_table(stats);
  std::fprintf(
      human_out(),
      "\nmigration against the %s placement: %lld experts re-homed (%lld to another node); "
      "weights %.2f GiB + optimizer state %.2f GiB (%.0f bytes/param) = %.2f GiB, %.2f GiB of it "
      "over the network\n",
      o.current.empty() ? "contiguous" : "--current", static_cast<long long>(m.rehomed_experts),
      static_cast<long long>(m.across_nodes), static_cast<double>(m.weight_bytes) / kGiB,
      static_cast<double>(m.optimizer_bytes) / kGiB, o.knobs.optimizer_bytes_per_param,
      static_cast<double>(m.total_bytes()) / kGiB, static_cast<double>(m.network_bytes) / kGiB);
  if (o.out.empty()) {
    std::fprintf(human_out(), "(no --out: placement not written)\n");
    return;
  }
  const nlohmann::ordered_json history = {{"tool", "feplb place"},
                                          {"trace", o.trace},
                                          {"micro_batches", used},
                                          {"current", o.current.empty() ? "contiguous" : o.current},
                                          {"knobs",
                                           {{"dyn", o.knobs.dyn},
                                            {"place_homes", o.knobs.place_homes},
                                            {"place_min_gain", o.knobs.place_min_gain},
                                            {"place_dyn_score", o.knobs.place_dyn_score}}},
                                          {"migration_bytes", m.total_bytes()},
                                          {"rehomed_experts", m.rehomed_experts}};
  files.stage(o.out, format_placement(next, history.dump()));
  for (const std::string& written : files.commit()) say_wrote(written);
}

}  // namespace

void add_place_command(CLI::App& app) {
  auto o = std::make_shared<PlaceCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "place",
      "Place experts from a routing history: homes balanced across nodes, then GPUs, and dynamic "
      "sets (feplb-placement-v1), with the migration it implies");
  non_empty(cmd->add_option("--trace", o->trace,
                            "the history: a feplb-trace-v1 file, - for standard input (required)"));
  non_empty(
      cmd->add_option("--current", o->current,
                      "the placement in force (feplb-placement-v1; default: contiguous homes)"));
  add_int(*cmd, "--window", o->window, 1, limits::kMaxStepId,
          "use only the trace's last N micro-batches (default: all of them)");
  non_empty(cmd->add_option("--out", o->out,
                            "write the placement here, - for standard output (default: "
                            "report only)"));
  cmd->add_flag("--force", o->force, "overwrite an existing --out file");
  add_model_flags(*cmd, *o, /*cost=*/false);
  cmd->callback([o, cmd] {
    apply_knob_flags(*cmd, *o);
    run_place(*o);
  });
}

}  // namespace feplb::cli
