// feplb-placement-v1: reading (every rule checked, one-line errors naming the field), writing,
// contiguous placements and the migration between two placements.
#include "feplb/core/placement.h"

#include <algorithm>
#include <limits>
#include <set>

#include "feplb/core/error.h"
#include "feplb/core/file_io.h"
#include "feplb/core/internal/json_input.h"

namespace feplb {
namespace {

using json_input::array_at;
using json_input::int_in;
using json_input::json;
using json_input::member;
using json_input::type_of;

// The trace reader's limits.
constexpr int64_t kMaxRanks = 1 << 14;
constexpr int64_t kMaxExperts = 1 << 16;

// The GPU's experts; `where` is e.g. "layers[0].gpus[3]". Checks every rule that involves
// one GPU; `owner` ([E], -1 = free) catches an expert on two GPUs.
void parse_gpu(const json& v, const std::string& where, const Placement& p, LayerPlacement& out,
               std::vector<int>& owner, std::vector<uint8_t>& gpu_seen) {
  FEPLB_REQUIRE_INPUT(v.is_object(), "{}: expected an object, got {}", where, type_of(v));
  const int gpu =
      static_cast<int>(int_in(member(v, "gpu", where + "."), where + ".gpu", 0, p.num_ranks - 1));
  FEPLB_REQUIRE_INPUT(!gpu_seen[gpu], "{}.gpu: GPU {} appears twice", where, gpu);
  gpu_seen[gpu] = 1;
  const int per_gpu = p.num_experts / p.num_ranks;
  const json& experts = array_at(member(v, "experts", where + "."), where + ".experts");
  FEPLB_REQUIRE_INPUT(experts.size() == static_cast<size_t>(per_gpu),
                      "{}.experts: has {} experts, expected num_experts / num_ranks = {}", where,
                      experts.size(), per_gpu);
  for (size_t i = 0; i < experts.size(); ++i) {
    const std::string field = fmt::format("{}.experts[{}]", where, i);
    const int e = static_cast<int>(int_in(experts[i], field, 0, p.num_experts - 1));
    FEPLB_REQUIRE_INPUT(owner[e] < 0, "{}: expert {} appears twice (also on GPU {})", field, e,
                        owner[e]);
    owner[e] = gpu;
    out.home[e] = gpu;
  }
  if (auto it = v.find("dynamic"); it != v.end()) {
    const json& dynamic = array_at(*it, where + ".dynamic");
    for (size_t i = 0; i < dynamic.size(); ++i) {
      const std::string field = fmt::format("{}.dynamic[{}]", where, i);
      const int e = static_cast<int>(int_in(dynamic[i], field, 0, p.num_experts - 1));
      FEPLB_REQUIRE_INPUT(owner[e] == gpu, "{}: expert {} is not one of GPU {}'s experts", field, e,
                          gpu);
      FEPLB_REQUIRE_INPUT(!out.dynamic[e], "{}: expert {} is listed twice", field, e);
      out.dynamic[e] = 1;
    }
  }
}

LayerPlacement parse_layer(const json& v, size_t index, const Placement& p) {
  const std::string where = fmt::format("layers[{}]", index);
  FEPLB_REQUIRE_INPUT(v.is_object(), "{}: expected an object, got {}", where, type_of(v));
  LayerPlacement out;
  out.layer = int_in(member(v, "layer", where + "."), where + ".layer", 0,
                     std::numeric_limits<int32_t>::max());
  out.home.assign(static_cast<size_t>(p.num_experts), -1);
  out.dynamic.assign(static_cast<size_t>(p.num_experts), 0);
  const json& gpus = array_at(member(v, "gpus", where + "."), where + ".gpus");
  FEPLB_REQUIRE_INPUT(gpus.size() == static_cast<size_t>(p.num_ranks),
                      "{}.gpus: has {} entries, expected num_ranks = {}", where, gpus.size(),
                      p.num_ranks);
  std::vector<int> owner(static_cast<size_t>(p.num_experts), -1);
  std::vector<uint8_t> gpu_seen(static_cast<size_t>(p.num_ranks), 0);
  for (size_t g = 0; g < gpus.size(); ++g) {
    parse_gpu(gpus[g], fmt::format("{}.gpus[{}]", where, g), p, out, owner, gpu_seen);
  }
  // R GPUs, each seen once with E / R distinct experts: every expert is placed exactly once.
  return out;
}

}  // namespace

const LayerPlacement* Placement::find(int64_t layer) const {
  for (const LayerPlacement& l : layers) {
    if (l.layer == layer) return &l;
  }
  return nullptr;
}

Placement contiguous_placement(int num_ranks, int gpus_per_node, int num_experts,
                               const std::vector<int64_t>& layers, int64_t dyn) {
  const Topology topo = Topology::contiguous(num_ranks, gpus_per_node, num_experts);
  Placement p;
  p.num_experts = num_experts;
  p.num_ranks = num_ranks;
  p.gpus_per_node = gpus_per_node;
  for (int64_t layer : layers) {
    LayerPlacement l;
    l.layer = layer;
    l.home.assign(topo.homes().begin(), topo.homes().end());
    set_lowest_dynamic(num_ranks, dyn, l);
    p.layers.push_back(std::move(l));
  }
  return p;
}

void set_lowest_dynamic(int num_ranks, int64_t dyn, LayerPlacement& layer) {
  const int num_experts = static_cast<int>(layer.home.size());
  const int64_t d = std::clamp<int64_t>(dyn, 0, num_experts / num_ranks);
  std::vector<int64_t> taken(static_cast<size_t>(num_ranks), 0);
  layer.dynamic.assign(static_cast<size_t>(num_experts), 0);
  for (int e = 0; e < num_experts; ++e) {
    if (taken[layer.home[e]] < d) {
      layer.dynamic[e] = 1;
      ++taken[layer.home[e]];
    }
  }
}

std::vector<int64_t> trace_layers(const Trace& trace) {
  std::set<int64_t> ids;
  for (const RoutingStep& s : trace.steps) ids.insert(s.layer);
  return {ids.begin(), ids.end()};
}

Topology layer_topology(const Placement& p, const LayerPlacement& layer) {
  return Topology::with_placement(p.num_ranks, p.gpus_per_node, layer.home);
}

void check_placement_matches(const Placement& p, const Trace& trace, int gpus_per_node) {
  FEPLB_REQUIRE_INPUT(p.num_experts == trace.num_experts,
                      "placement: num_experts is {}, the trace has {}", p.num_experts,
                      trace.num_experts);
  FEPLB_REQUIRE_INPUT(p.num_ranks == trace.num_ranks,
                      "placement: num_ranks is {}, the trace has {}", p.num_ranks, trace.num_ranks);
  FEPLB_REQUIRE_INPUT(p.gpus_per_node == gpus_per_node,
                      "placement: gpus_per_node is {}, --gpus-per-node is {}", p.gpus_per_node,
                      gpus_per_node);
  for (int64_t layer : trace_layers(trace)) {
    FEPLB_REQUIRE_INPUT(p.find(layer) != nullptr,
                        "placement: layers: no entry for layer {} of the trace", layer);
  }
}

Placement parse_placement(std::string_view text) {
  const json doc = json_input::parse_document(text);
  FEPLB_REQUIRE_INPUT(doc.is_object(), "expected a JSON object at the top, got {}", type_of(doc));
  const json& format = member(doc, "format", "");
  FEPLB_REQUIRE_INPUT(format.is_string() && format.get<std::string>() == kPlacementFormat,
                      "format: expected \"{}\", got {}", kPlacementFormat, format.dump());
  Placement p;
  p.num_experts =
      static_cast<int>(int_in(member(doc, "num_experts", ""), "num_experts", 1, kMaxExperts));
  p.num_ranks = static_cast<int>(int_in(member(doc, "num_ranks", ""), "num_ranks", 1, kMaxRanks));
  p.gpus_per_node =
      static_cast<int>(int_in(member(doc, "gpus_per_node", ""), "gpus_per_node", 1, kMaxRanks));
  FEPLB_REQUIRE_INPUT(p.num_experts % p.num_ranks == 0,
                      "num_experts: {} is not divisible by num_ranks {}", p.num_experts,
                      p.num_ranks);
  FEPLB_REQUIRE_INPUT(p.num_ranks <= p.gpus_per_node || p.num_ranks % p.gpus_per_node == 0,
                      "gpus_per_node: {} does not divide num_ranks {}", p.gpus_per_node,
                      p.num_ranks);
  if (auto it = doc.find("history"); it != doc.end()) {
    FEPLB_REQUIRE_INPUT(it->is_object(), "history: expected an object, got {}", type_of(*it));
  }
  const json& layers = array_at(member(doc, "layers", ""), "layers");
  FEPLB_REQUIRE_INPUT(!layers.empty(), "layers: empty; a placement needs at least one layer");
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerPlacement l = parse_layer(layers[i], i, p);
    FEPLB_REQUIRE_INPUT(p.find(l.layer) == nullptr, "layers[{}].layer: layer {} appears twice", i,
                        l.layer);
    p.layers.push_back(std::move(l));
  }
  std::sort(p.layers.begin(), p.layers.end(),
            [](const LayerPlacement& a, const LayerPlacement& b) { return a.layer < b.layer; });
  return p;
}

Placement read_placement(const std::string& path) {
  return parse_file(path, [](const std::string& text) { return parse_placement(text); });
}

std::string format_placement(const Placement& p, const std::string& history) {
  json head = json::object();
  head["format"] = kPlacementFormat;
  head["num_experts"] = p.num_experts;
  head["num_ranks"] = p.num_ranks;
  head["gpus_per_node"] = p.gpus_per_node;
  if (!history.empty()) head["history"] = json::parse(history);
  // The header, then "layers" with one GPU per line (diff-friendly).
  std::string out = head.dump();
  out.pop_back();  // the closing brace; "layers" is appended as the last member
  out += ",\n\"layers\":[\n";
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const LayerPlacement& l = p.layers[i];
    const Topology topo = layer_topology(p, l);
    out += fmt::format("{{\"layer\":{},\"gpus\":[\n", l.layer);
    for (int g = 0; g < p.num_ranks; ++g) {
      std::vector<int> dynamic;
      for (int e : topo.local_experts(g)) {
        if (l.dynamic[e]) dynamic.push_back(e);
      }
      out += fmt::format("  {{\"gpu\":{},\"experts\":[{}],\"dynamic\":[{}]}}{}\n", g,
                         fmt::join(topo.local_experts(g), ","), fmt::join(dynamic, ","),
                         g + 1 < p.num_ranks ? "," : "");
    }
    out += i + 1 < p.layers.size() ? "]},\n" : "]}\n";
  }
  out += "]}\n";
  return out;
}

Migration migration_between(const Placement& from, const Placement& to, const ExpertShape& shape,
                            double optimizer_bytes_per_param) {
  FEPLB_CHECK(from.num_experts == to.num_experts && from.num_ranks == to.num_ranks,
              "migration between placements of different shapes");
  const Topology contiguous = Topology::contiguous(to.num_ranks, to.gpus_per_node, to.num_experts);
  const int64_t params = 3 * shape.hidden * shape.ffn;
  const auto optimizer_bytes =
      static_cast<int64_t>(optimizer_bytes_per_param * static_cast<double>(params));
  Migration m;
  for (const LayerPlacement& l : to.layers) {
    const LayerPlacement* old = from.find(l.layer);
    for (int e = 0; e < to.num_experts; ++e) {
      const int before = old ? old->home[e] : contiguous.home(e);
      if (before == l.home[e]) continue;
      ++m.rehomed_experts;
      m.weight_bytes += shape.weight_bytes();
      m.optimizer_bytes += optimizer_bytes;
      if (!contiguous.same_domain(before, l.home[e])) {
        ++m.across_nodes;
        m.network_bytes += shape.weight_bytes() + optimizer_bytes;
      }
    }
  }
  return m;
}

}  // namespace feplb
