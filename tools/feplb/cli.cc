#include "cli.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "feplb/core/error.h"
#include "feplb/core/file_output.h"
#include "feplb/core/limits.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/text.h"
#include "feplb/sim/data_dir.h"
#include "feplb/sim/gemm_tables.h"

namespace feplb::cli {
namespace {

CLI::Validator int_validator(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        const char* end = s.data() + s.size();
        const auto [p, ec] = std::from_chars(s.data(), end, v);
        if (ec == std::errc::result_out_of_range) {
          return fmt::format("{} is outside {}", printable(s),
                             range_text(static_cast<double>(lo), static_cast<double>(hi)));
        }
        if (ec != std::errc() || p != end) {
          return fmt::format("'{}' is not an integer", printable(s));
        }
        if (v < lo || v > hi) {
          return fmt::format("{} is outside {}", v,
                             range_text(static_cast<double>(lo), static_cast<double>(hi)));
        }
        return std::string();
      },
      range_text(static_cast<double>(lo), static_cast<double>(hi)), "int_range");
}

template <typename Int>
CLI::Option* add_int_impl(CLI::App& cmd, const std::string& flag, Int& value, int64_t lo,
                          int64_t hi, const std::string& help) {
  return cmd.add_option(flag, value, help)->check(int_validator(lo, hi));
}

}  // namespace

CLI::Option* add_int(CLI::App& cmd, const std::string& flag, int& value, int64_t lo, int64_t hi,
                     const std::string& help) {
  return add_int_impl(cmd, flag, value, lo, hi, help);
}

CLI::Option* add_int(CLI::App& cmd, const std::string& flag, int64_t& value, int64_t lo, int64_t hi,
                     const std::string& help) {
  return add_int_impl(cmd, flag, value, lo, hi, help);
}

CLI::Option* add_int(CLI::App& cmd, const std::string& flag, uint64_t& value,
                     const std::string& help) {
  return cmd.add_option(flag, value, help)
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            uint64_t v = 0;
            const char* end = s.data() + s.size();
            const auto [p, ec] = std::from_chars(s.data(), end, v);
            if (ec == std::errc::result_out_of_range) {
              return fmt::format("{} is outside [0, 2^64-1]", printable(s));
            }
            if (ec != std::errc() || p != end) {
              return fmt::format("'{}' is not a non-negative integer", printable(s));
            }
            return std::string();
          },
          "", "uint64"));
}

CLI::Option* add_real(CLI::App& cmd, const std::string& flag, double& value, double lo, double hi,
                      const std::string& help) {
  return cmd.add_option(flag, value, help)
      ->check(CLI::Validator(
          [lo, hi](std::string& s) -> std::string {
            double v = 0;
            const char* end = s.data() + s.size();
            const auto [p, ec] = std::from_chars(s.data(), end, v);
            if (ec == std::errc::result_out_of_range ||
                (ec == std::errc() && p == end && std::isfinite(v) && (v < lo || v > hi))) {
              return fmt::format("{} is outside {}", printable(s), range_text(lo, hi));
            }
            if (ec != std::errc() || p != end || !std::isfinite(v)) {
              return fmt::format("'{}' is not a finite number", printable(s));
            }
            return std::string();
          },
          range_text(lo, hi), "real_range"));
}

CLI::Option* add_choice(CLI::App& cmd, const std::string& flag, std::string& value,
                        const std::vector<std::string>& allowed, const std::string& help) {
  return cmd
      .add_option(flag, value, fmt::format("{} (one of: {})", help, fmt::join(allowed, ", ")))
      ->check(CLI::Validator(
          [allowed](std::string& s) -> std::string {
            for (const std::string& a : allowed) {
              if (s == a) return std::string();
            }
            return fmt::format("'{}' is not one of {}", printable(s), fmt::join(allowed, ", "));
          },
          "", "choice"));
}

std::vector<std::string> split_policies(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  if (!list.empty() && list.back() == ',') out.emplace_back();
  return out;
}

CLI::Option* add_policies(CLI::App& cmd, std::string& value, const std::string& help) {
  return cmd
      .add_option("--policies", value,
                  fmt::format("{}; known: {}", help, fmt::join(planner_names(), ", ")))
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            for (const std::string& p : split_policies(s)) {
              if (p.empty()) return fmt::format("empty name in '{}'", printable(s));
              bool known = false;
              for (const std::string& n : planner_names()) known |= n == p;
              if (!known) {
                return fmt::format("unknown policy '{}' (known: {})", printable(p),
                                   fmt::join(planner_names(), ", "));
              }
            }
            return std::string();
          },
          "", "policies"));
}

CLI::Option* add_model_flag(CLI::App& cmd, std::string& model, const std::string& help) {
  std::vector<std::string> known;
  for (const auto& [name, shape] : known_model_shapes()) {
    known.push_back(fmt::format("{}* (H={} F={})", name, shape.hidden, shape.ffn));
  }
  return non_empty(cmd.add_option(
      "--model", model,
      fmt::format("{}; known names set the expert shape: {}", help, fmt::join(known, ", "))));
}

void add_model_flags(CLI::App& cmd, ModelFlags& f, bool cost) {
  add_int(cmd, "--gpus-per-node,--domain-size", f.gpus_per_node, 1, limits::kMaxRanks,
          "GPUs per NVLink domain (default 8)");
  add_gpu_flag(cmd, f.gpu);
  if (cost) {
    non_empty(cmd.add_option(
        "--cost-model", f.cost_model,
        "GEMM cost model: auto (the measured H200 table in data/cost/ when the shape "
        "matches, else roofline), roofline, or a feplb-gemm-table-v1 file (default "
        "auto)"));
  }
  add_shape_flags(cmd, f.shape);
  // Each knob flag keeps its text; apply_knob_flags parses it with set_knob, the parser the Python
  // module and the C API use, so a bad value gets the same message from all three.
  const std::vector<KnobInfo> knobs = list_knobs(f.knobs);
  f.knob_text.assign(knobs.size(), std::string());
  for (size_t i = 0; i < knobs.size(); ++i) {
    const KnobInfo& k = knobs[i];
    const bool integer = std::holds_alternative<int64_t*>(k.value);
    cmd.add_option(k.flag, f.knob_text[i],
                   fmt::format("{} [{}; default {}]", k.help, k.unit, k.default_value))
        ->type_name(
            fmt::format("{} {}", integer ? "INT" : "REAL", range_text(k.minimum, k.maximum)))
        ->group("Knobs (docs/knobs.md)");
  }
}

void apply_knob_flags(const CLI::App& cmd, ModelFlags& f) {
  Knobs scratch;
  const std::vector<KnobInfo> knobs = list_knobs(scratch);
  for (size_t i = 0; i < knobs.size(); ++i) {
    if (cmd.count(knobs[i].flag) > 0) set_knob(f.knobs, knobs[i].name, f.knob_text[i]);
  }
}

void add_shape_flags(CLI::App& cmd, ShapeFlags& f) {
  add_int(cmd, "--hidden", f.hidden, 1, limits::kMaxExpertDim,
          "expert hidden size H (default: from the trace or model)")
      ->group("Expert shape");
  add_int(cmd, "--ffn", f.ffn, 1, limits::kMaxExpertDim,
          "expert FFN size F (default: from the trace or model)")
      ->group("Expert shape");
  add_choice(cmd, "--dtype", f.dtype, {"bf16", "fp16", "fp8", "fp32"},
             "weight/activation dtype (default bf16)")
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
  return shape;
}

std::string data_path(std::string_view relative) { return find_data(relative); }

void add_gpu_flag(CLI::App& cmd, std::string& gpu) {
  std::vector<std::string> names;
  for (const GpuClass& g : gpu_class_list()) {
    names.push_back(fmt::format("{} ({})", g.name, g.measured ? "measured" : "specifications"));
  }
  non_empty(cmd.add_option(
      "--gpu", gpu,
      fmt::format("GPU class: copy-engine rates inside and between NVLink domains and "
                  "the GEMM model (docs/knobs.md): {}; knob flags override (default {})",
                  fmt::join(names, ", "), gpu_class_list().front().name)));
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

// The file --cost-model reads, for the check that no output overwrites it ("" for roofline, and
// for auto: the bundled tables are not the user's).
std::string cost_model_path(const std::string& choice) {
  return choice == "roofline" || choice == "auto" || choice.empty() ? "" : choice;
}

void apply_model_flags(const CLI::App& cmd, ModelFlags& flags) {
  apply_knob_flags(cmd, flags);
  flags.gpu_class = &apply_gpu_flag(cmd, flags.gpu, flags.knobs);
}

CostChoice resolve_cost(const std::string& choice, const ExpertShape& shape, const Knobs& knobs,
                        const GpuClass& gpu) {
  const bool table_from_data = choice == "auto" || choice.empty();
  return choose_cost_model(choice, shape, knobs, table_from_data ? find_data_dir("cost") : "",
                           "--cost-model", gpu);
}

std::string self_directory() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

namespace {

// "unknown command 'X' (commands: a, b, c)" when argv names no subcommand of `app` where one is
// required; walks nested commands (feplb trace gne).
void check_subcommands(const CLI::App& app, int argc, char** argv, const std::string& prefix) {
  const auto subs = app.get_subcommands([](const CLI::App*) { return true; });
  if (subs.empty()) return;
  std::vector<std::string> names;
  for (const CLI::App* sub : subs) names.push_back(sub->get_name());
  // "feplb trace" -> "trace ": how the command is named inside the messages.
  const std::string inner = prefix.size() > 6 ? prefix.substr(6) + " " : "";
  FEPLB_REQUIRE_INPUT(argc > 1 || app.get_require_subcommand_min() == 0,
                      "{}a command is required ({}; see `{} --help`)", inner,
                      fmt::join(names, ", "), prefix);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') return;  // a flag (--help, --version): CLI11 decides
    for (const CLI::App* sub : subs) {
      if (sub->get_name() == arg) {
        check_subcommands(*sub, argc - i, argv + i, prefix + " " + arg);
        return;
      }
    }
    throw InputError(fmt::format("unknown command '{}{}' (commands: {}; see `{} --help`)", inner,
                                 printable(arg), fmt::join(names, ", "), prefix));
  }
}

}  // namespace

int run_app(CLI::App& app, int argc, char** argv) {
  // A file size limit (ulimit -f) makes writes fail with EFBIG, reported, instead of killing us
  // half-way through a temporary file.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    check_subcommands(app, argc, argv, "feplb");
    app.parse(argc, argv);
    flush_stdout();
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "feplb: error: %s (see --help)\n", printable(e.what()).c_str());
    return 2;
  } catch (const InputError& e) {
    std::fprintf(stderr, "feplb: error: %s\n", printable(e.what()).c_str());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "feplb: internal error: %s\n", printable(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "feplb: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "feplb: error: %s\n", printable(e.what()).c_str());
    return 1;
  }
  return 0;
}

std::string default_trace_path() { return data_path("traces/default.json"); }

namespace {
std::FILE* human_stream = stdout;
}  // namespace

std::FILE* human_out() { return human_stream; }

void route_human_output(const FileSet& files) {
  human_stream = files.writes_stdout() ? stderr : stdout;
}

void say_token_range(const Trace& trace, const char* indent) {
  int64_t lo = trace.tokens_per_rank, hi = 0;
  double rows = 0, dropped = 0;
  for (const RoutingStep& s : trace.steps) {
    for (int src = 0; src < trace.num_ranks; ++src) {
      lo = std::min(lo, trace.tokens_of(s, src));
      hi = std::max(hi, trace.tokens_of(s, src));
      rows += static_cast<double>(trace.tokens_of(s, src) * trace.top_k);
      dropped += static_cast<double>(trace.dropped_of(s, src));
    }
  }
  std::fprintf(human_out(),
               "%stokens per rank and step %lld..%lld; %.2f%% of token-expert rows dropped\n",
               indent, static_cast<long long>(lo), static_cast<long long>(hi),
               rows > 0 ? dropped / rows * 100.0 : 0.0);
}

void say_wrote(const std::string& path) {
  if (path == "-" || path == "/dev/stdout" || path == "/dev/stderr" ||
      path.rfind("/dev/fd/", 0) == 0 || path.rfind("/proc/self/fd/", 0) == 0) {
    return;
  }
  std::fprintf(human_out(), "wrote %s\n", printable(path).c_str());
}

CLI::Option* non_empty(CLI::Option* option) {
  const std::string name = option->get_name();
  return option->check(CLI::Validator(
      [name](std::string& value) -> std::string {
        if (!value.empty()) return {};
        return "an empty value; give " + name + " a value or leave it out";
      },
      "", "non-empty"));
}

ProgressLine::~ProgressLine() {
  if (printed_) std::fprintf(stderr, "\n");
}

void ProgressLine::operator()(int64_t done, int64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool finished = done >= total;
  if (now - start_ < std::chrono::seconds(1) ||
      (!finished && now - last_ < std::chrono::seconds(1))) {
    return;
  }
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
