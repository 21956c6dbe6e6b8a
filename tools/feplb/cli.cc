#include "cli.h"

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "feplb/core/error.h"
#include "feplb/sim/data_dir.h"
#include "feplb/sim/gemm_tables.h"

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

std::string data_path(std::string_view relative) { return find_data(relative); }

void add_cost_flag(CLI::App& cmd, std::string& choice) {
  cmd.add_option(
      "--cost-model", choice,
      "GEMM cost model: auto (measured H200 table from data/cost/ when the shape matches, else "
      "roofline), roofline, or a feplb-gemm-table-v1 file (default auto)");
}

CostChoice resolve_cost(const std::string& choice, const ExpertShape& shape, const Knobs& knobs) {
  const bool table_from_data = choice == "auto" || choice.empty();
  return choose_cost_model(choice, shape, knobs, table_from_data ? find_data_dir("cost") : "",
                           "--cost-model");
}

std::string default_trace_path() { return data_path("traces/default.json"); }

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
