// Trace for Python: load/save feplb-trace-v1 files, the steps as numpy arrays, and traces built
// from a framework's routing counts (from_arrays, behind feplb.Trace.from_counts).
#include <pybind11/stl.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "feplb/core/error.h"
#include "feplb/core/file_io.h"
#include "feplb/core/limits.h"
#include "feplb/core/routing.h"
#include "feplb/core/text.h"
#include "feplb/core/trace_io.h"
#include "python/src/bindings.h"

namespace feplb::python {
namespace {

using limits::kMaxExperts;
using limits::kMaxFreeFormBytes;
using limits::kMaxRanks;
using limits::kMaxStepId;
using limits::kMaxTokensPerRank;

// The tokens each rank had in each entry, [N, R], and the token-expert rows it dropped: `tokens`
// when given (rows below tokens * top_k were dropped, a capacity factor); else tokens_per_rank for
// every rank (the same); else each row's sum / top_k, which must then divide (without a token
// count, a dropped row cannot be told from a missing token).
struct RankTokens {
  std::vector<int64_t> tokens, dropped;  // [N * R]
};

RankTokens rank_tokens(const Int64Array& counts, int top_k, const std::optional<Int64Array>& given,
                       std::optional<int64_t> tokens_per_rank) {
  const auto N = counts.shape(0), R = counts.shape(1), E = counts.shape(2);
  RankTokens out;
  out.tokens.resize(static_cast<size_t>(N * R));
  out.dropped.resize(static_cast<size_t>(N * R));
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
      const size_t k = static_cast<size_t>(i * R + r);
      if (given) {
        const int64_t t = given->data()[i * R + r];
        FEPLB_REQUIRE_INPUT(t <= kMaxTokensPerRank, "tokens[{}][{}]: {} is above {}", i, r, t,
                            kMaxTokensPerRank);
        FEPLB_REQUIRE_INPUT(sum <= t * top_k,
                            "counts[{}][{}]: sums to {}, more than tokens[{}][{}] * top_k = {}", i,
                            r, sum, i, r, t * top_k);
        out.tokens[k] = t;
      } else if (tokens_per_rank) {
        FEPLB_REQUIRE_INPUT(sum <= *tokens_per_rank * top_k,
                            "counts[{}][{}]: sums to {}, more than tokens_per_rank * top_k = {}", i,
                            r, sum, *tokens_per_rank * top_k);
        out.tokens[k] = *tokens_per_rank;
      } else {
        FEPLB_REQUIRE_INPUT(sum % top_k == 0,
                            "counts[{}][{}]: sums to {}, not a multiple of top_k = {}; give "
                            "tokens (per rank and step) or tokens_per_rank when rows were dropped",
                            i, r, sum, top_k);
        out.tokens[k] = sum / top_k;
      }
      out.dropped[k] = out.tokens[k] * top_k - sum;
    }
  }
  return out;
}

// InputError unless the arrays have the shapes and ranges a trace holds.
void check_arrays(const Int64Array& counts, const Int64Array& step_ids, const Int64Array& layer_ids,
                  int64_t top_k, std::optional<int64_t> tokens_per_rank) {
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
  FEPLB_REQUIRE_INPUT(N * R * E <= limits::kMaxTraceCounts,
                      "counts: {} x {} x {} counts, more than the {} a trace may hold", N, R, E,
                      limits::kMaxTraceCounts);
  require_counts(counts, "counts", {N, R, E}, "(steps, ranks, experts)", kMaxTokensPerRank);
  require_counts(step_ids, "step_ids", {N}, "(steps,)", kMaxStepId);
  require_counts(layer_ids, "layer_ids", {N}, "(steps,)", kMaxStepId);
}

// InputError unless the free-form parts fit what save() writes and load() reads.
void check_free_form(const std::string& model, const std::optional<ExpertShape>& shape,
                     const std::string& generator_json) {
  FEPLB_REQUIRE_INPUT(nlohmann::json(model).dump().size() - 2 <= kMaxFreeFormBytes,
                      "model: {} bytes, more than the {} a trace may hold", model.size(),
                      kMaxFreeFormBytes);
  if (!generator_json.empty()) {
    nlohmann::ordered_json generator;
    try {
      generator = nlohmann::ordered_json::parse(generator_json);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(fmt::format("generator: not JSON that a trace can hold ({})", e.what()));
    }
    const size_t bytes = generator.dump().size();
    FEPLB_REQUIRE_INPUT(bytes <= static_cast<size_t>(kMaxFreeFormBytes),
                        "generator: {} bytes of JSON, more than the {} a trace may hold", bytes,
                        kMaxFreeFormBytes);
  }
  if (shape) {
    FEPLB_REQUIRE_INPUT(shape->hidden >= 1 && shape->hidden <= (1 << 20) && shape->ffn >= 1 &&
                            shape->ffn <= (1 << 20),
                        "expert_shape: hidden and ffn must be in 1..{}", 1 << 20);
  }
}

// Step i of `counts` ([steps, ranks, experts]) as a routing step; a rank with fewer tokens than
// the trace's, or with dropped rows, carries its own.
RoutingStep step_from_arrays(const Int64Array& counts, py::ssize_t i, int64_t step, int64_t layer,
                             const RankTokens& rt, int64_t tokens_per_rank) {
  const auto R = counts.shape(1), E = counts.shape(2);
  const int64_t* c = counts.data();
  RoutingStep s(step, layer, static_cast<int>(R), static_cast<int>(E));
  bool uniform = true;
  for (py::ssize_t r = 0; r < R; ++r) {
    const size_t k = static_cast<size_t>(i * R + r);
    const int64_t rank_tokens = rt.tokens[k];
    FEPLB_REQUIRE_INPUT(rank_tokens <= tokens_per_rank,
                        "tokens[{}][{}]: {} is above tokens_per_rank = {}", i, r, rank_tokens,
                        tokens_per_rank);
    uniform = uniform && rank_tokens == tokens_per_rank && rt.dropped[k] == 0;
    for (py::ssize_t e = 0; e < E; ++e) {
      const int64_t v = c[(i * R + r) * E + e];
      // A token picks top_k distinct experts: no expert gets more rows than the rank's tokens.
      FEPLB_REQUIRE_INPUT(v <= rank_tokens,
                          "counts[{}][{}][{}]: {} rows exceed the rank's {} tokens (a token "
                          "picks top_k distinct experts)",
                          i, r, e, v, rank_tokens);
      s.at(static_cast<int>(r), static_cast<int>(e)) = v;
    }
  }
  if (!uniform) {
    s.tokens.assign(rt.tokens.begin() + i * R, rt.tokens.begin() + (i + 1) * R);
    s.dropped.assign(rt.dropped.begin() + i * R, rt.dropped.begin() + (i + 1) * R);
    if (std::all_of(s.dropped.begin(), s.dropped.end(), [](int64_t d) { return d == 0; })) {
      s.dropped.clear();
    }
  }
  s.sum_experts();
  return s;
}

PyTrace from_arrays(const Int64Array& counts, const Int64Array& step_ids,
                    const Int64Array& layer_ids, int64_t top_k,
                    std::optional<int64_t> tokens_per_rank, const std::optional<Int64Array>& tokens,
                    const std::string& model, std::optional<ExpertShape> shape,
                    const std::string& generator_json) {
  check_arrays(counts, step_ids, layer_ids, top_k, tokens_per_rank);
  const auto N = counts.shape(0), R = counts.shape(1), E = counts.shape(2);
  check_free_form(model, shape, generator_json);
  if (tokens) require_counts(*tokens, "tokens", {N, R}, "(steps, ranks)", kMaxTokensPerRank);
  const RankTokens rt = rank_tokens(counts, static_cast<int>(top_k), tokens, tokens_per_rank);

  PyTrace out;
  Trace& t = out.trace;
  t.model = model;
  t.num_experts = static_cast<int>(E);
  t.num_ranks = static_cast<int>(R);
  t.top_k = static_cast<int>(top_k);
  // tokens_per_rank as given, else the most any rank had; ranks and steps with fewer tokens, or
  // with dropped rows, carry their own "tokens" and "dropped" (docs/trace-format.md).
  t.tokens_per_rank =
      tokens_per_rank ? *tokens_per_rank : *std::max_element(rt.tokens.begin(), rt.tokens.end());
  t.expert_shape = shape;
  t.generator_json = generator_json;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (py::ssize_t i = 0; i < N; ++i) {
    const int64_t step = step_ids.data()[i], layer = layer_ids.data()[i];
    FEPLB_REQUIRE_INPUT(step <= kMaxStepId, "step_ids[{}]: {} is above {}", i, step, kMaxStepId);
    FEPLB_REQUIRE_INPUT(layer <= kMaxStepId, "layer_ids[{}]: {} is above {}", i, layer, kMaxStepId);
    FEPLB_REQUIRE_INPUT(seen.emplace(step, layer).second,
                        "step_ids/layer_ids[{}]: step {} layer {} appears twice", i, step, layer);
    t.steps.push_back(step_from_arrays(counts, i, step, layer, rt, t.tokens_per_rank));
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

// Reading and writing traces: files, JSON text, a framework's arrays.
void bind_trace_io(py::class_<PyTrace>& cls) {
  cls.def_static(
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
                  py::arg("tokens"), py::arg("model"), py::arg("expert_shape"),
                  py::arg("generator_json"))
      .def(
          "save",
          [](const PyTrace& t, const std::string& path, bool overwrite) {
            std::error_code ec;
            FEPLB_REQUIRE_INPUT(overwrite || !std::filesystem::exists(path, ec),
                                "path: {} exists; pass overwrite=True to replace it",
                                printable(path));
            write_file(path, format_trace(t.trace), overwrite);
          },
          py::arg("path"), py::arg("overwrite"))
      .def("to_json", [](const PyTrace& t) { return format_trace(t.trace); });
}

// What a trace holds: its fields, and its counts as arrays.
void bind_trace_contents(py::class_<PyTrace>& cls) {
  cls.def_property_readonly(
         "path",
         [](const PyTrace& t) {
           // The OS's bytes, decoded as os.fsdecode does.
           return py::reinterpret_steal<py::str>(PyUnicode_DecodeFSDefaultAndSize(
               t.path.data(), static_cast<Py_ssize_t>(t.path.size())));
         })
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

}  // namespace

void bind_trace(py::module_& m) {
  py::class_<PyTrace> cls(m, "Trace");
  bind_trace_io(cls);
  bind_trace_contents(cls);
}

}  // namespace feplb::python
