// Shared pieces of the feplb command line: knob flags, progress lines, default data paths.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "feplb/core/cost_model.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/core/routing.h"
#include "feplb/sim/cost_choice.h"

namespace feplb::cli {

// Adds one --flag per knob (knobs.def) to `cmd`, bound to `knobs`.
void add_knob_flags(CLI::App& cmd, Knobs& knobs);

// Adds --hidden/--ffn/--dtype; resolve_shape() then picks flags > trace > model preset.
struct ShapeFlags {
  int64_t hidden = 0, ffn = 0;
  std::string dtype;
};
void add_shape_flags(CLI::App& cmd, ShapeFlags& flags);
ExpertShape resolve_shape(const ShapeFlags& flags, const Trace* trace, const std::string& model);

// --cost-model auto|roofline|FILE: the GEMM cost model. auto = the measured table in data/cost/
// whose shape matches (H200, bf16), else the roofline from the knobs.
void add_cost_flag(CLI::App& cmd, std::string& choice);
CostChoice resolve_cost(const std::string& choice, const ExpertShape& shape, const Knobs& knobs);

// A file or folder of the bundled data ("priors", "traces/default.json"), looked for where
// feplb/sim/data_dir.h says; InputError listing the places otherwise.
std::string data_path(std::string_view relative);
std::string default_trace_path();

// Prints "label: done/total (pct%)" to stderr at most once a second, and only once the work has
// run for a second, so short runs stay quiet.
class ProgressLine {
 public:
  ProgressLine(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled) {}
  ~ProgressLine();
  void operator()(int64_t done, int64_t total);

 private:
  std::string label_;
  bool enabled_;
  bool printed_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

void add_simulate_command(CLI::App& app);
void add_trace_commands(CLI::App& app);
void add_knobs_command(CLI::App& app);
void add_devices_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_place_command(CLI::App& app);

}  // namespace feplb::cli
