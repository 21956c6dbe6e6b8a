// libFuzzer target for the prior reader (data/priors/README.md; scripts/fuzz): parse_prior may only
// accept a prior whose every layer is a probability distribution over its experts, or throw
// InputError.
#include <cmath>
#include <cstdint>
#include <string>

#include "feplb/sim/prior.h"
#include "fuzz_util.h"

namespace {

constexpr const char* kTarget = "prior_fuzzer";
using feplb::fuzz::finding;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto p = feplb::fuzz::accept_or_refuse(kTarget, [&] { return feplb::parse_prior(text); });
  if (!p) return 0;
  if (p->num_layers() < 1 || p->layer_ids.size() != p->popularity.size()) {
    finding(kTarget, "accepted a prior without one id per layer");
  }
  if (p->top_k < 1 || p->top_k > p->num_experts()) finding(kTarget, "accepted an impossible top_k");
  for (const std::vector<double>& row : p->popularity) {
    if (row.size() != static_cast<size_t>(p->num_experts())) {
      finding(kTarget, "layers with different expert counts");
    }
    double sum = 0;
    for (double x : row) {
      if (!(x >= 0) || !std::isfinite(x)) finding(kTarget, "a popularity not in [0, inf)");
      sum += x;
    }
    if (std::fabs(sum - 1.0) > 1e-9) finding(kTarget, "a layer's popularity does not sum to 1");
  }
  return 0;
}
