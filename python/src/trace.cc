// Trace for Python: load/save feplb-trace-v1 files, the steps as numpy arrays, and traces built
// from a framework's routing counts (from_arrays, behind feplb.Trace.from_counts).
#include <pybind11/stl.h>

#include <filesystem>
#include <limits>
#include <optional>
#include <set>

#include "feplb/core/error.h"
#include "feplb/core/file_io.h"
#include "feplb/core/routing.h"
#include "feplb/core/trace_io.h"
#include "python/src/bindings.h"

namespace feplb::python {
namespace {

// The trace reader's limits (feplb/core/trace_io.cc), so that what from_arrays builds loads back.
constexpr int64_t kMaxRanks = 1 << 14;
constexpr int64_t kMaxExperts = 1 << 16;
constexpr int64_t kMaxTokensPerRank = int64_t{1} << 32;
constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();

// Tokens each rank routed in each entry, [N, R]: tokens_per_rank when given, else each row's sum
// over top_k (InputError when a row sum is not a multiple of top_k).
std::vector<int64_t> rank_tokens(const Int64Array& counts, int top_k,
                                 std::optional<int64_t> tokens_per_rank) {
  const auto N = counts.shape(0), R = counts.shape(1), E = counts.shape(2);
  std::vector<int64_t> tokens(static_cast<size_t>(N * R));
  const int64_t* c = counts.data();
  for (py::ssize_t i = 0; i < N; ++i) {
    for (py::ssize_t r = 0; r < R; ++r) {
      int64_t sum = 0;
      for (py::ssize_t e = 0; e < E; ++e) {
        const int64_t v = c[(i * R + r) * E + e];
        FEPLB_REQUIRE_INPUT(v <= kMaxTokensPerRank,
                            "counts[{}][{}][{}]: {} rows, more than a rank's {} tokens can route",
                            i, r, e, v, kMaxTokensPerRank);
        sum += v;
      }
      if (tokens_per_rank) {
        FEPLB_REQUIRE_INPUT(sum == *tokens_per_rank * top_k,
                            "counts[{}][{}]: sums to {}, expected tokens_per_rank * top_k = {}; "
                            "feplb-trace-v1 holds every rank's full top_k rows per token (no "
                            "dropped tokens)",
                            i, r, sum, *tokens_per_rank * top_k);
      } else {
        FEPLB_REQUIRE_INPUT(sum % top_k == 0,
                            "counts[{}][{}]: sums to {}, not a multiple of top_k = {} (dropped "
                            "tokens are not representable in feplb-trace-v1)",
                            i, r, sum, top_k);
      }
      tokens[static_cast<size_t>(i * R + r)] = tokens_per_rank ? *tokens_per_rank : sum / top_k;
    }
  }
  return tokens;
}

// What feplb-trace-v1 can hold of the per-rank token counts: one count for every rank of every
// step. Returns it; InputError naming the first rank that differs. (A format with per-rank token
// counts would store `tokens` instead of collapsing it here.)
int64_t uniform_tokens(const std::vector<int64_t>& tokens, py::ssize_t R) {
  for (size_t k = 1; k < tokens.size(); ++k) {
    const auto i = static_cast<py::ssize_t>(k) / R, r = static_cast<py::ssize_t>(k) % R;
    FEPLB_REQUIRE_INPUT(tokens[k] == tokens[0],
                        "counts[{}][{}]: routes {} tokens (its sum over top_k), counts[0][0] "
                        "routes {}; feplb-trace-v1 needs the same tokens_per_rank on every rank "
                        "of every step (ranks with different token counts are not representable)",
                        i, r, tokens[k], tokens[0]);
  }
  return tokens.empty() ? 0 : tokens[0];
}

PyTrace from_arrays(const Int64Array& counts, const Int64Array& step_ids,
                    const Int64Array& layer_ids, int64_t top_k,
                    std::optional<int64_t> tokens_per_rank, const std::string& model,
                    std::optional<ExpertShape> shape, const std::string& generator_json) {
  FEPLB_REQUIRE_INPUT(counts.ndim() == 3, "counts: expected [steps, ranks, experts], got {} axes",
                      counts.ndim());
  const auto N = counts.shape(0), R = counts.shape(1), E = counts.shape(2);
  FEPLB_REQUIRE_INPUT(N >= 1, "counts: no steps; a trace needs at least one");
  FEPLB_REQUIRE_INPUT(R >= 1 && R <= kMaxRanks, "counts: {} ranks, expected 1..{}", R, kMaxRanks);
  FEPLB_REQUIRE_INPUT(E >= 1 && E <= kMaxExperts, "counts: {} experts, expected 1..{}", E,
                      kMaxExperts);
  FEPLB_REQUIRE_INPUT(E % R == 0, "counts: {} experts are not divisible by {} ranks", E, R);
  FEPLB_REQUIRE_INPUT(top_k >= 1 && top_k <= E, "top_k: {} must be in 1..num_experts = {}", top_k,
                      E);
  FEPLB_REQUIRE_INPUT(
      !tokens_per_rank || (*tokens_per_rank >= 0 && *tokens_per_rank <= kMaxTokensPerRank),
      "tokens_per_rank: {} must be in 0..{}", tokens_per_rank.value_or(0), kMaxTokensPerRank);
  require_counts(counts, "counts", {N, R, E}, "(steps, ranks, experts)");
  require_counts(step_ids, "step_ids", {N}, "(steps,)");
  require_counts(layer_ids, "layer_ids", {N}, "(steps,)");
  if (shape) {
    FEPLB_REQUIRE_INPUT(shape->hidden >= 1 && shape->hidden <= (1 << 20) && shape->ffn >= 1 &&
                            shape->ffn <= (1 << 20),
                        "expert_shape: hidden and ffn must be in 1..{}", 1 << 20);
  }
  const std::vector<int64_t> tokens = rank_tokens(counts, static_cast<int>(top_k), tokens_per_rank);

  PyTrace out;
  Trace& t = out.trace;
  t.model = model;
  t.num_experts = static_cast<int>(E);
  t.num_ranks = static_cast<int>(R);
  t.top_k = static_cast<int>(top_k);
  t.tokens_per_rank = uniform_tokens(tokens, R);
  FEPLB_REQUIRE_INPUT(t.tokens_per_rank <= kMaxTokensPerRank,
                      "counts: {} tokens per rank, at most {}", t.tokens_per_rank,
                      kMaxTokensPerRank);
  t.expert_shape = shape;
  t.generator_json = generator_json;
  std::set<std::pair<int64_t, int64_t>> seen;
  const int64_t* c = counts.data();
  for (py::ssize_t i = 0; i < N; ++i) {
    const int64_t step = step_ids.data()[i], layer = layer_ids.data()[i];
    FEPLB_REQUIRE_INPUT(step <= kMaxId, "step_ids[{}]: {} is above {}", i, step, kMaxId);
    FEPLB_REQUIRE_INPUT(layer <= kMaxId, "layer_ids[{}]: {} is above {}", i, layer, kMaxId);
    FEPLB_REQUIRE_INPUT(seen.emplace(step, layer).second,
                        "step_ids/layer_ids[{}]: step {} layer {} appears twice", i, step, layer);
    RoutingStep s(step, layer, static_cast<int>(R), static_cast<int>(E));
    for (py::ssize_t r = 0; r < R; ++r) {
      for (py::ssize_t e = 0; e < E; ++e) {
        const int64_t v = c[(i * R + r) * E + e];
        // A token picks top_k distinct experts: no expert gets more rows than the rank's tokens.
        FEPLB_REQUIRE_INPUT(v <= t.tokens_per_rank,
                            "counts[{}][{}][{}]: {} rows exceed the rank's {} tokens (a token "
                            "picks top_k distinct experts)",
                            i, r, e, v, t.tokens_per_rank);
        s.at(static_cast<int>(r), static_cast<int>(e)) = v;
      }
    }
    s.sum_experts();
    t.steps.push_back(std::move(s));
  }
  return out;
}

const RoutingStep& step_at(const PyTrace& t, py::ssize_t i) {
  const auto n = static_cast<py::ssize_t>(t.trace.steps.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw py::index_error(fmt::format("step index {} outside [0, {})", i, n));
  return t.trace.steps[static_cast<size_t>(i)];
}

py::array_t<int64_t> step_counts(const RoutingStep& s) {
  py::array_t<int64_t> out(std::vector<py::ssize_t>{s.num_ranks, s.num_experts});
  std::copy(s.counts.begin(), s.counts.end(), out.mutable_data());
  return out;
}

}  // namespace

void bind_trace(py::module_& m) {
  py::class_<PyTrace>(m, "Trace")
      .def_static(
          "load",
          [](const std::string& path) {
            PyTrace t{read_trace(path), path};
            return t;
          },
          py::arg("path"))
      .def_static(
          "from_json",
          [](const std::string& text) {
            return PyTrace{parse_trace(text), ""};
          },
          py::arg("text"))
      .def_static("from_arrays", &from_arrays, py::arg("counts"), py::arg("step_ids"),
                  py::arg("layer_ids"), py::arg("top_k"), py::arg("tokens_per_rank"),
                  py::arg("model"), py::arg("expert_shape"), py::arg("generator_json"))
      .def(
          "save",
          [](const PyTrace& t, const std::string& path, bool overwrite) {
            std::error_code ec;
            FEPLB_REQUIRE_INPUT(overwrite || !std::filesystem::exists(path, ec),
                                "path: {} exists; pass overwrite=True to replace it", path);
            write_file(path, format_trace(t.trace), overwrite);
          },
          py::arg("path"), py::arg("overwrite"))
      .def("to_json", [](const PyTrace& t) { return format_trace(t.trace); })
      .def_property_readonly("path", [](const PyTrace& t) { return t.path; })
      .def_property_readonly("model", [](const PyTrace& t) { return t.trace.model; })
      .def_property_readonly("num_experts", [](const PyTrace& t) { return t.trace.num_experts; })
      .def_property_readonly("num_ranks", [](const PyTrace& t) { return t.trace.num_ranks; })
      .def_property_readonly("top_k", [](const PyTrace& t) { return t.trace.top_k; })
      .def_property_readonly("tokens_per_rank",
                             [](const PyTrace& t) { return t.trace.tokens_per_rank; })
      .def_property_readonly("expert_shape", [](const PyTrace& t) { return t.trace.expert_shape; })
      .def_property_readonly("generator_json",
                             [](const PyTrace& t) { return t.trace.generator_json; })
      .def("__len__", [](const PyTrace& t) { return t.trace.steps.size(); })
      .def_property_readonly("step_ids",
                             [](const PyTrace& t) {
                               std::vector<int64_t> ids;
                               for (const RoutingStep& s : t.trace.steps) ids.push_back(s.step);
                               return to_numpy(ids);
                             })
      .def_property_readonly("layer_ids",
                             [](const PyTrace& t) {
                               std::vector<int64_t> ids;
                               for (const RoutingStep& s : t.trace.steps) ids.push_back(s.layer);
                               return to_numpy(ids);
                             })
      .def_property_readonly(
          "counts",
          [](const PyTrace& t) {
            const Trace& tr = t.trace;
            py::array_t<int64_t> out(std::vector<py::ssize_t>{
                static_cast<py::ssize_t>(tr.steps.size()), tr.num_ranks, tr.num_experts});
            int64_t* dst = out.mutable_data();
            for (const RoutingStep& s : tr.steps)
              dst = std::copy(s.counts.begin(), s.counts.end(), dst);
            return out;
          })
      .def(
          "step_counts", [](const PyTrace& t, py::ssize_t i) { return step_counts(step_at(t, i)); },
          py::arg("index"))
      .def(
          "step_id",
          [](const PyTrace& t, py::ssize_t i) {
            const RoutingStep& s = step_at(t, i);
            return py::make_tuple(s.step, s.layer);
          },
          py::arg("index"));
}

}  // namespace feplb::python
