// Shared pieces of the feplb command line: range-checked flags, the flag groups simulate, report,
// place and run share (knobs, expert shape, cost model, topology), progress lines, data paths.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/file_output.h"
#include "feplb/core/gpu_class.h"
#include "feplb/core/knobs.h"
#include "feplb/core/routing.h"
#include "feplb/sim/cost_choice.h"

namespace feplb::cli {

// A numeric flag whose value must parse whole (9223372036854775808 does not clamp to the largest
// integer), be finite (no inf, nan, 1e400) and lie in [lo, hi]; errors name the flag and range.
CLI::Option* add_int(CLI::App& cmd, const std::string& flag, int& value, int64_t lo, int64_t hi,
                     const std::string& help);
CLI::Option* add_int(CLI::App& cmd, const std::string& flag, int64_t& value, int64_t lo, int64_t hi,
                     const std::string& help);
CLI::Option* add_int(CLI::App& cmd, const std::string& flag, uint64_t& value,
                     const std::string& help);
CLI::Option* add_real(CLI::App& cmd, const std::string& flag, double& value, double lo, double hi,
                      const std::string& help);
// A flag whose value is one of `allowed` (listed in --help).
CLI::Option* add_choice(CLI::App& cmd, const std::string& flag, std::string& value,
                        const std::vector<std::string>& allowed, const std::string& help);
// --policies: a comma-separated list of planner names (each checked; --help lists them).
CLI::Option* add_policies(CLI::App& cmd, std::string& value, const std::string& help);
std::vector<std::string> split_policies(const std::string& list);

// --hidden/--ffn/--dtype; resolve_shape() then picks flags > trace > model preset.
struct ShapeFlags {
  int64_t hidden = 0, ffn = 0;  // 0: not given
  std::string dtype;
};
void add_shape_flags(CLI::App& cmd, ShapeFlags& flags);
ExpertShape resolve_shape(const ShapeFlags& flags, const Trace* trace, const std::string& model);
// --model: a model name; --help lists the known ones (they set the expert shape).
CLI::Option* add_model_flag(CLI::App& cmd, std::string& model, const std::string& help);

// The flags every planning command shares, declared once: one --flag per knob (knobs.def), the
// expert shape, the GEMM cost model (--cost-model auto|roofline|FILE) and --gpus-per-node.
// --gpu CLASS (gpu_classes.def) sets the knobs its link rates and GEMM ceilings determine.
struct ModelFlags {
  Knobs knobs;                         // after apply_knob_flags: the defaults and the knob flags
  std::vector<std::string> knob_text;  // [list_knobs order]: each knob flag's text as given
  ShapeFlags shape;
  std::string cost_model = "auto";
  int gpus_per_node = 8;
  std::string gpu;                      // --gpu; empty: the default class (h200)
  const GpuClass* gpu_class = nullptr;  // set by apply_model_flags
};
// `cost`: add --cost-model too (place models no GEMM time).
void add_model_flags(CLI::App& cmd, ModelFlags& flags, bool cost = true);
// --gpu CLASS: the GPU class (gpu_classes.def) whose link rates and GEMM ceilings the knobs take.
void add_gpu_flag(CLI::App& cmd, std::string& gpu);
// Sets the knobs the class determines, except those whose flags were given to `cmd` (a knob flag
// wins over the class). Returns the class; InputError naming --gpu for an unknown one.
const GpuClass& apply_gpu_flag(const CLI::App& cmd, const std::string& gpu, Knobs& knobs);
// After parsing: sets each knob flag given to `cmd` with set_knob (InputError in its format).
void apply_knob_flags(const CLI::App& cmd, ModelFlags& flags);
// After parsing: apply_knob_flags, then applies --gpu to the knobs, except those whose flags were
// given to `cmd` (a knob flag wins over the class), and sets gpu_class; InputError naming --gpu for
// an unknown class.
void apply_model_flags(const CLI::App& cmd, ModelFlags& flags);

// The GEMM cost model --cost-model names. auto = the measured table in data/cost/ whose shape
// matches and whose device is the GPU class's (h200: NVIDIA H200), else the roofline from the
// knobs.
CostChoice resolve_cost(const std::string& choice, const ExpertShape& shape, const Knobs& knobs,
                        const GpuClass& gpu = gpu_class_list().front());
// The file --cost-model reads ("" for roofline, or auto with no bundled table).
std::string cost_model_path(const std::string& choice);

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

// Where a command's tables, notes and "wrote" lines go: standard output, unless the command writes
// data there (--json -, --plot -, --out -, report's default Markdown): then standard error, so
// that standard output carries the data alone (`feplb simulate --json - | jq .`).
std::FILE* human_out();
// Sets human_out() from the command's outputs (after FileSet::check, before printing anything).
void route_human_output(const FileSet& files);

// "wrote PATH" on human_out() for a file (nothing for a stream: the output itself went there).
void say_wrote(const std::string& path);

// A trace whose ranks have different token counts, or dropped rows: "tokens per rank and step
// LO..HI; P% of token-expert rows dropped" after `indent` on human_out().
void say_token_range(const Trace& trace, const char* indent = "");

// An option that takes a path or a name: an empty value (a script's unset variable) is an error
// naming the option, never "not given".
CLI::Option* non_empty(CLI::Option* option);

// The directory of the running binary (from /proc/self/exe; "" if unknown).
std::string self_directory();
// Parses argv with `app` and runs the chosen command: an unknown (sub)command is named with the
// known ones; errors are one line on stderr (user text escaped, printable()) and exit 2 (bad
// input, including a failed write to standard output) or 1 (internal). Returns the exit status.
int run_app(CLI::App& app, int argc, char** argv);

void add_simulate_command(CLI::App& app);
void add_trace_commands(CLI::App& app);
void add_knobs_command(CLI::App& app);
void add_planner_time_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_place_command(CLI::App& app);
// feplb-gpu's commands (cmd_devices.cc, cmd_run.cc).
void add_devices_command(CLI::App& app);
void add_run_command(CLI::App& app);

}  // namespace feplb::cli
