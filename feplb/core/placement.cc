// feplb-placement-v1: reading (every rule checked, one-line errors naming the field), writing,
// contiguous placements and the migration between two placements.
#include "feplb/core/placement.h"

#include <algorithm>
#include <limits>
#include <set>

#include "feplb/core/error.h"
#include "feplb/core/file_input.h"
#include "feplb/core/internal/json_stream.h"
#include "feplb/core/limits.h"

namespace feplb {
namespace {

using json_stream::int_in;
using json_stream::json;
using json_stream::Take;
using json_stream::type_of;

// One GPU of a layer as read: integers type-checked, not yet checked against the header.
struct GpuText {
  int64_t gpu = 0;
  std::vector<int64_t> experts, dynamic;
};
struct LayerText {
  size_t index = 0;  // in the file's "layers"
  int64_t layer = 0;
  std::vector<GpuText> gpus;
};

// An array member of `v` as integers; `where` names it ("layers[0].gpus[3].experts").
std::vector<int64_t> ints_at(const json& v, const char* key, const std::string& where,
                             bool required) {
  const auto it = v.find(key);
  const std::string field = fmt::format("{}.{}", where, key);
  if (it == v.end()) {
    FEPLB_REQUIRE_INPUT(!required, "{}: missing", field);
    return {};
  }
  FEPLB_REQUIRE_INPUT(it->is_array(), "{}: expected an array, got {}", field, type_of(*it));
  std::vector<int64_t> out;
  out.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    out.push_back(int_in((*it)[i], fmt::format("{}[{}]", field, i),
                         std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  }
  return out;
}

// The typed content of one "layers" entry (every rule that needs no header).
LayerText layer_text(const json& v, size_t index) {
  const std::string where = fmt::format("layers[{}]", index);
  FEPLB_REQUIRE_INPUT(v.is_object(), "{}: expected an object, got {}", where, type_of(v));
  LayerText out;
  out.index = index;
  const auto layer = v.find("layer");
  FEPLB_REQUIRE_INPUT(layer != v.end(), "{}.layer: missing", where);
  out.layer = int_in(*layer, where + ".layer", 0, limits::kMaxStepId);
  const auto gpus = v.find("gpus");
  FEPLB_REQUIRE_INPUT(gpus != v.end(), "{}.gpus: missing", where);
  FEPLB_REQUIRE_INPUT(gpus->is_array(), "{}.gpus: expected an array, got {}", where,
                      type_of(*gpus));
  for (size_t g = 0; g < gpus->size(); ++g) {
    const json& gv = (*gpus)[g];
    const std::string gw = fmt::format("{}.gpus[{}]", where, g);
    FEPLB_REQUIRE_INPUT(gv.is_object(), "{}: expected an object, got {}", gw, type_of(gv));
    GpuText t;
    const auto gpu = gv.find("gpu");
    FEPLB_REQUIRE_INPUT(gpu != gv.end(), "{}.gpu: missing", gw);
    t.gpu = int_in(*gpu, gw + ".gpu", std::numeric_limits<int64_t>::min(),
                   std::numeric_limits<int64_t>::max());
    t.experts = ints_at(gv, "experts", gw, true);
    t.dynamic = ints_at(gv, "dynamic", gw, false);
    out.gpus.push_back(std::move(t));
  }
  return out;
}

void require_in(int64_t x, const std::string& field, int64_t lo, int64_t hi) {
  FEPLB_REQUIRE_INPUT(x >= lo && x <= hi, "{}: {} is outside [{}, {}]", field, x, lo, hi);
}

// Checks one layer against the header and every rule that involves it: R GPUs, each once, with
// E / R distinct experts, every expert on exactly one GPU, dynamic experts local to their GPU.
LayerPlacement check_layer(const LayerText& text, const Placement& p) {
  const std::string where = fmt::format("layers[{}]", text.index);
  LayerPlacement out;
  out.layer = text.layer;
  out.home.assign(static_cast<size_t>(p.num_experts), -1);
  out.dynamic.assign(static_cast<size_t>(p.num_experts), 0);
  FEPLB_REQUIRE_INPUT(text.gpus.size() == static_cast<size_t>(p.num_ranks),
                      "{}.gpus: has {} entries, expected num_ranks = {}", where, text.gpus.size(),
                      p.num_ranks);
  std::vector<int> owner(static_cast<size_t>(p.num_experts), -1);
  std::vector<uint8_t> gpu_seen(static_cast<size_t>(p.num_ranks), 0);
  const int per_gpu = p.num_experts / p.num_ranks;
  for (size_t g = 0; g < text.gpus.size(); ++g) {
    const GpuText& t = text.gpus[g];
    const std::string gw = fmt::format("{}.gpus[{}]", where, g);
    require_in(t.gpu, gw + ".gpu", 0, p.num_ranks - 1);
    const int gpu = static_cast<int>(t.gpu);
    FEPLB_REQUIRE_INPUT(!gpu_seen[gpu], "{}.gpu: GPU {} appears twice", gw, gpu);
    gpu_seen[gpu] = 1;
    FEPLB_REQUIRE_INPUT(t.experts.size() == static_cast<size_t>(per_gpu),
                        "{}.experts: has {} experts, expected num_experts / num_ranks = {}", gw,
                        t.experts.size(), per_gpu);
    for (size_t i = 0; i < t.experts.size(); ++i) {
      const std::string field = fmt::format("{}.experts[{}]", gw, i);
      require_in(t.experts[i], field, 0, p.num_experts - 1);
      const auto e = static_cast<size_t>(t.experts[i]);
      FEPLB_REQUIRE_INPUT(owner[e] < 0, "{}: expert {} appears twice (also on GPU {})", field, e,
                          owner[e]);
      owner[e] = gpu;
      out.home[e] = gpu;
    }
    for (size_t i = 0; i < t.dynamic.size(); ++i) {
      const std::string field = fmt::format("{}.dynamic[{}]", gw, i);
      require_in(t.dynamic[i], field, 0, p.num_experts - 1);
      const auto e = static_cast<size_t>(t.dynamic[i]);
      FEPLB_REQUIRE_INPUT(owner[e] == gpu, "{}: expert {} is not one of GPU {}'s experts", field, e,
                          gpu);
      FEPLB_REQUIRE_INPUT(!out.dynamic[e], "{}: expert {} is listed twice", field, e);
      out.dynamic[e] = 1;
    }
  }
  // R GPUs, each seen once with E / R distinct experts: every expert is placed exactly once.
  return out;
}

// The document, streamed: each "layers" entry captured (a layer is at most a few MiB) and kept in
// typed form until the header's shape is known; the rest captured.
class PlacementReader : public json_stream::Reader<PlacementReader> {
 public:
  explicit PlacementReader(const ByteSource& source) : Reader(source) {}

  Take take(bool object) {
    if (depth() == 0) {
      FEPLB_REQUIRE_INPUT(object, "expected a JSON object at the top, got array");
      return Take::stream();
    }
    if (depth() == 1 && key_at(0) == "layers" && !object) return Take::stream();
    // A layer: its experts and dynamic sets, one GPU object each.
    if (depth() == 2) {
      return Take::whole(limits::kMaxExperts * 2 * limits::kBytesPerCount + limits::kMaxRanks * 64);
    }
    return Take::whole();
  }
  void opened(bool /*object*/) {
    if (depth() == 2) saw_layers_ = true;
  }
  void closed(bool /*object*/) {}

  void value(json&& v) {
    if (depth() == 0) {
      throw InputError(fmt::format("expected a JSON object at the top, got {}", type_of(v)));
    }
    if (depth() == 2) {
      LayerText t = layer_text(v, index_at(1));
      entries_ += static_cast<int64_t>(t.gpus.size());
      for (const GpuText& g : t.gpus) {
        entries_ += static_cast<int64_t>(g.experts.size() + g.dynamic.size());
      }
      FEPLB_REQUIRE_INPUT(entries_ <= limits::kMaxPlacementEntries,
                          "layers[{}]: more than {} entries, the limit of a placement", t.index,
                          limits::kMaxPlacementEntries);
      if (header_ok_) {
        add(t);
      } else {
        pending_.push_back(std::move(t));
      }
      return;
    }
    const std::string& key = key_at(0);
    if (key == "format") {
      seen_format_ = true;
      FEPLB_REQUIRE_INPUT(v.is_string() && v.get_ref<const std::string&>() == kPlacementFormat,
                          "format: expected \"{}\", got {}", kPlacementFormat, v.dump());
    } else if (key == "num_experts") {
      p_.num_experts = static_cast<int>(int_in(v, "num_experts", 1, limits::kMaxExperts));
    } else if (key == "num_ranks") {
      p_.num_ranks = static_cast<int>(int_in(v, "num_ranks", 1, limits::kMaxRanks));
    } else if (key == "gpus_per_node") {
      p_.gpus_per_node = static_cast<int>(int_in(v, "gpus_per_node", 1, limits::kMaxRanks));
    } else if (key == "history") {
      FEPLB_REQUIRE_INPUT(v.is_object(), "history: expected an object, got {}", type_of(v));
    } else if (key == "layers") {
      throw InputError(fmt::format("layers: expected an array, got {}", type_of(v)));
    } else {
      return;  // unknown members are ignored
    }
    seen_.insert(key);
    if (!header_ok_ && seen_.count("num_experts") && seen_.count("num_ranks") &&
        seen_.count("gpus_per_node")) {
      check_header();
    }
  }

  Placement finish() {
    FEPLB_REQUIRE_INPUT(seen_format_, "format: missing");
    for (const char* key : {"num_experts", "num_ranks", "gpus_per_node"}) {
      FEPLB_REQUIRE_INPUT(seen_.count(key), "{}: missing", key);
    }
    FEPLB_REQUIRE_INPUT(saw_layers_, "layers: missing");
    FEPLB_REQUIRE_INPUT(!p_.layers.empty(), "layers: empty; a placement needs at least one layer");
    std::sort(p_.layers.begin(), p_.layers.end(),
              [](const LayerPlacement& a, const LayerPlacement& b) { return a.layer < b.layer; });
    return std::move(p_);
  }

 private:
  void check_header() {
    header_ok_ = true;
    FEPLB_REQUIRE_INPUT(p_.num_experts % p_.num_ranks == 0,
                        "num_experts: {} is not divisible by num_ranks {}", p_.num_experts,
                        p_.num_ranks);
    FEPLB_REQUIRE_INPUT(p_.num_ranks <= p_.gpus_per_node || p_.num_ranks % p_.gpus_per_node == 0,
                        "gpus_per_node: {} does not divide num_ranks {}", p_.gpus_per_node,
                        p_.num_ranks);
    for (const LayerText& t : pending_) add(t);
    pending_.clear();
  }

  void add(const LayerText& t) {
    LayerPlacement l = check_layer(t, p_);
    FEPLB_REQUIRE_INPUT(layer_ids_.insert(l.layer).second,
                        "layers[{}].layer: layer {} appears twice", t.index, l.layer);
    p_.layers.push_back(std::move(l));
  }

  Placement p_;
  std::set<std::string> seen_;
  std::set<int64_t> layer_ids_;
  std::vector<LayerText> pending_;
  bool seen_format_ = false, header_ok_ = false, saw_layers_ = false;
  int64_t entries_ = 0;
};

Placement read_placement_from(ByteSource& source) {
  PlacementReader reader(source);
  json_stream::parse(source, reader);
  return reader.finish();
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
  ByteSource source(text, kPlacementFormat, limits::kMaxPlacementBytes);
  return read_placement_from(source);
}

Placement read_placement(const std::string& path) {
  return parse_input(path, kPlacementFormat, limits::kMaxPlacementBytes, read_placement_from);
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
