// libFuzzer target for the feplb-placement-v1 reader (scripts/fuzz): parse_placement may only
// accept a placement that keeps every rule of docs/placement.md, or throw InputError; what it
// accepts must write back into an identical placement.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "feplb/core/placement.h"
#include "fuzz_util.h"

namespace {

constexpr const char* kTarget = "placement_fuzzer";
using feplb::fuzz::finding;

void check_accepted(const feplb::Placement& p) {
  if (p.layers.empty()) finding(kTarget, "accepted a placement without layers");
  if (p.num_experts < 1 || p.num_ranks < 1 || p.num_experts % p.num_ranks != 0 ||
      p.gpus_per_node < 1) {
    finding(kTarget, "accepted an impossible header");
  }
  const int per_gpu = p.num_experts / p.num_ranks;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const feplb::LayerPlacement& l = p.layers[i];
    if (i > 0 && l.layer <= p.layers[i - 1].layer) finding(kTarget, "layers not ascending, once");
    if (l.home.size() != static_cast<size_t>(p.num_experts) ||
        l.dynamic.size() != static_cast<size_t>(p.num_experts)) {
      finding(kTarget, "home/dynamic of the wrong size");
    }
    std::vector<int> per(static_cast<size_t>(p.num_ranks), 0);
    for (int e = 0; e < p.num_experts; ++e) {
      if (l.home[e] < 0 || l.home[e] >= p.num_ranks) finding(kTarget, "a home outside [0, R)");
      ++per[static_cast<size_t>(l.home[e])];
      if (l.dynamic[e] > 1) finding(kTarget, "a dynamic flag other than 0/1");
    }
    for (int n : per) {
      if (n != per_gpu) finding(kTarget, "a GPU without E / R experts");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto p =
      feplb::fuzz::accept_or_refuse(kTarget, [&] { return feplb::parse_placement(text); });
  if (!p) return 0;
  check_accepted(*p);
  feplb::fuzz::must_not_throw(kTarget, [&] {
    const std::string out = feplb::format_placement(*p);
    const feplb::Placement back = feplb::parse_placement(out);
    if (back.num_experts != p->num_experts || back.num_ranks != p->num_ranks ||
        back.gpus_per_node != p->gpus_per_node || back.layers.size() != p->layers.size()) {
      finding(kTarget, "format_placement/parse_placement round trip changed the header");
    }
    for (size_t i = 0; i < p->layers.size(); ++i) {
      if (back.layers[i].layer != p->layers[i].layer || back.layers[i].home != p->layers[i].home ||
          back.layers[i].dynamic != p->layers[i].dynamic) {
        finding(kTarget, "format_placement/parse_placement round trip changed a layer");
      }
    }
  });
  return 0;
}
