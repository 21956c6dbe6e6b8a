#include "cli.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "feplb/core/error.h"
#include "feplb/sim/gemm_tables.h"

#ifndef FEPLB_DATA_DIR
#define FEPLB_DATA_DIR "data"
#endif

namespace feplb::cli {

void add_knob_flags(CLI::App& cmd, Knobs& knobs) {
  for (const KnobInfo& k : list_knobs(knobs)) {
    const std::string help = fmt::format("{} [{}; default {}]", k.help, k.unit, k.default_value);
    std::visit([&](auto* p) { cmd.add_option(k.flag, *p, help)->group("Knobs (docs/knobs.md)"); },
               k.value);
  }
}

void add_shape_flags(CLI::App& cmd, ShapeFlags& f) {
  cmd.add_option("--hidden", f.hidden, "expert hidden size H (default: from the trace or model)")
      ->group("Expert shape");
  cmd.add_option("--ffn", f.ffn, "expert FFN size F (default: from the trace or model)")
      ->group("Expert shape");
  cmd.add_option("--dtype", f.dtype,
                 "weight/activation dtype: bf16, fp16, fp8, fp32 (default bf16)")
      ->group("Expert shape");
}

ExpertShape resolve_shape(const ShapeFlags& f, const Trace* trace, const std::string& model) {
  ExpertShape shape;
  if (trace && trace->expert_shape) {
    shape = *trace->expert_shape;
  } else if (auto preset = shape_for_model(model)) {
    shape = *preset;
  }
  if (f.hidden) shape.hidden = f.hidden;
  if (f.ffn) shape.ffn = f.ffn;
  if (!f.dtype.empty()) shape.dtype = parse_dtype(f.dtype, "--dtype");
  FEPLB_REQUIRE_INPUT(f.hidden >= 0 && f.ffn >= 0, "--hidden/--ffn: must be positive");
  return shape;
}

std::string data_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(FEPLB_DATA_DIR, ec)) return FEPLB_DATA_DIR;
  // A moved build: look next to the binary (build/bin/feplb -> ../../data).
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path guess = exe.parent_path().parent_path().parent_path() / "data";
    if (fs::is_directory(guess, ec)) return guess.string();
  }
  return FEPLB_DATA_DIR;
}

void add_gpu_flag(CLI::App& cmd, std::string& gpu) {
  std::vector<std::string> names;
  for (const GpuClass& g : gpu_class_list()) {
    names.push_back(fmt::format("{} ({})", g.name, g.measured ? "measured" : "specifications"));
  }
  cmd.add_option("--gpu", gpu,
                 fmt::format("GPU class: copy-engine rates inside and between NVLink domains and "
                             "the GEMM model (docs/knobs.md): {}; knob flags override (default {})",
                             fmt::join(names, ", "), gpu_class_list().front().name));
}

const GpuClass& apply_gpu_flag(const CLI::App& cmd, const std::string& gpu, Knobs& knobs) {
  const GpuClass& g = find_gpu_class(gpu.empty() ? gpu_class_list().front().name : gpu);
  Knobs given = knobs;
  apply_gpu_class(g, knobs);
  std::vector<KnobInfo> from = list_knobs(given), to = list_knobs(knobs);
  for (size_t i = 0; i < to.size(); ++i) {
    if (cmd.count(to[i].flag) == 0) continue;  // not on the command line: the class's value
    std::visit([&](auto* dst) { *dst = *std::get<decltype(dst)>(from[i].value); }, to[i].value);
  }
  return g;
}

void add_cost_flag(CLI::App& cmd, std::string& choice) {
  cmd.add_option("--cost-model", choice,
                 "GEMM cost model: auto (the GPU class's measured table from data/cost/ when the "
                 "expert shape matches, else roofline), roofline, or a feplb-gemm-table-v1 file "
                 "(default auto)");
}

CostChoice resolve_cost(const std::string& choice, const ExpertShape& shape, const Knobs& knobs,
                        const GpuClass& gpu) {
  return choose_cost_model(choice, shape, knobs, data_dir(), "--cost-model", gpu);
}

std::string default_trace_path() { return data_dir() + "/traces/default.json"; }

ProgressLine::~ProgressLine() {
  if (printed_) std::fprintf(stderr, "\n");
}

void ProgressLine::operator()(int64_t done, int64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool finished = done >= total;
  if (now - start_ < std::chrono::seconds(1) ||
      (!finished && now - last_ < std::chrono::seconds(1)))
    return;
  if (finished && !printed_) return;
  last_ = now;
  const bool tty = isatty(STDERR_FILENO);
  std::fprintf(stderr, "%s%s: %lld/%lld (%.0f%%)%s", tty && printed_ ? "\r" : "", label_.c_str(),
               static_cast<long long>(done), static_cast<long long>(total),
               100.0 * static_cast<double>(done) / static_cast<double>(total), tty ? "" : "\n");
  std::fflush(stderr);
  printed_ = tty;
}

}  // namespace feplb::cli
