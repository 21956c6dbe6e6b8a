#include "feplb/sim/workload.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "feplb/core/error.h"
#include "feplb/core/limits.h"
#include "feplb/core/rng.h"

namespace feplb {
namespace {

// Draws `top_k` distinct experts per token from a fixed distribution, fast: binary search on
// the CDF with rejection of repeats, and an exact scan when one expert holds most of the mass.
class TopKSampler {
 public:
  explicit TopKSampler(const std::vector<double>& weights)
      : weights_(weights), cdf_(weights.size()) {
    double acc = 0.0;
    for (size_t e = 0; e < weights.size(); ++e) cdf_[e] = acc += weights[e];
    total_ = acc;
    taken_.assign(weights.size(), 0);
  }

  // Adds one token's top_k experts into `out_row`.
  void draw_token(Rng& rng, int top_k, int64_t* out_row) {
    ++epoch_;
    for (int k = 0; k < top_k; ++k) {
      int e = -1;
      for (int attempt = 0; attempt < 32 && e < 0; ++attempt) {
        const double u = rng.uniform() * total_;
        auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
        const int cand = static_cast<int>(std::min<ptrdiff_t>(it - cdf_.begin(), cdf_.size() - 1));
        if (taken_[cand] != epoch_ && weights_[cand] > 0) e = cand;
      }
      if (e < 0) e = exact_draw(rng);
      taken_[e] = epoch_;
      ++out_row[e];
    }
  }

 private:
  // Exact draw from the experts not taken yet (uniform among them if none has weight left).
  int exact_draw(Rng& rng) {
    double rest = 0.0;
    int64_t free_count = 0;
    for (size_t e = 0; e < weights_.size(); ++e) {
      if (taken_[e] != epoch_) {
        rest += weights_[e];
        ++free_count;
      }
    }
    FEPLB_CHECK(free_count > 0, "top_k exceeds the number of experts");
    if (rest > 0) {
      double u = rng.uniform() * rest;
      int last = -1;
      for (size_t e = 0; e < weights_.size(); ++e) {
        if (taken_[e] == epoch_ || weights_[e] <= 0) continue;
        last = static_cast<int>(e);
        if ((u -= weights_[e]) < 0) return last;
      }
      return last;
    }
    int64_t pick = static_cast<int64_t>(rng.uniform() * static_cast<double>(free_count));
    for (size_t e = 0; e < weights_.size(); ++e) {
      if (taken_[e] != epoch_ && pick-- == 0) return static_cast<int>(e);
    }
    FEPLB_CHECK(false, "unreachable");
    return -1;
  }

  const std::vector<double>& weights_;
  std::vector<double> cdf_;
  double total_ = 0.0;
  std::vector<uint64_t> taken_;
  uint64_t epoch_ = 0;
};

void check_spec(const WorkloadSpec& spec, int num_experts) {
  FEPLB_REQUIRE_INPUT(spec.num_ranks >= 1, "ranks: {} must be at least 1", spec.num_ranks);
  FEPLB_REQUIRE_INPUT(num_experts % spec.num_ranks == 0, "experts: {} is not divisible by ranks {}",
                      num_experts, spec.num_ranks);
  FEPLB_REQUIRE_INPUT(spec.top_k >= 1 && spec.top_k <= num_experts, "top-k: {} must be in [1, {}]",
                      spec.top_k, num_experts);
  FEPLB_REQUIRE_INPUT(spec.tokens_per_rank >= 0 && spec.tokens_per_rank <= (int64_t{1} << 24),
                      "tokens-per-rank: {} must be in [0, 16777216]", spec.tokens_per_rank);
  FEPLB_REQUIRE_INPUT(spec.seq_len >= 1, "seq-len: {} must be at least 1", spec.seq_len);
  FEPLB_REQUIRE_INPUT(spec.num_steps >= 1, "steps: {} must be at least 1", spec.num_steps);
}

}  // namespace

RoutingStep generate_step(const std::vector<double>& popularity, const WorkloadSpec& spec,
                          int64_t step, int64_t layer) {
  const int num_experts = static_cast<int>(popularity.size());
  check_spec(spec, num_experts);
  RoutingStep s(step, layer, spec.num_ranks, num_experts);
  std::vector<double> seq_popularity(popularity.size());
  for (int src = 0; src < spec.num_ranks; ++src) {
    Rng rng(Rng::derive(spec.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(layer),
                        static_cast<uint64_t>(src)));
    int64_t* row = &s.at(src, 0);
    for (int64_t first = 0; first < spec.tokens_per_rank; first += spec.seq_len) {
      const int64_t len = std::min(spec.seq_len, spec.tokens_per_rank - first);
      if (spec.concentration > 0) {
        double total = 0.0;
        for (int e = 0; e < num_experts; ++e) {
          // A tiny floor keeps every Gamma shape valid for experts with zero prior mass.
          const double shape = std::max(spec.concentration * popularity[e], 1e-6);
          total += seq_popularity[e] = rng.gamma(shape);
        }
        if (!(total > 0)) seq_popularity = popularity;
      } else {
        seq_popularity = popularity;
      }
      TopKSampler sampler(seq_popularity);
      for (int64_t t = 0; t < len; ++t) sampler.draw_token(rng, spec.top_k, row);
    }
  }
  s.sum_experts();
  return s;
}

Trace generate_trace(const Prior& prior, const WorkloadSpec& spec, const Progress& progress) {
  FEPLB_REQUIRE_INPUT(prior.num_layers() >= 1, "prior: has no layers");
  check_spec(spec, prior.num_experts());
  // The trace format's limits (limits.h), checked before anything is allocated.
  FEPLB_REQUIRE_INPUT(
      spec.num_ranks <= limits::kMaxRanks && prior.num_experts() <= limits::kMaxExperts,
      "ranks, experts: {} and {} are above the trace limits {} and {}", spec.num_ranks,
      prior.num_experts(), limits::kMaxRanks, limits::kMaxExperts);
  const double counts = static_cast<double>(spec.num_steps) * prior.num_layers() * spec.num_ranks *
                        prior.num_experts();
  FEPLB_REQUIRE_INPUT(
      counts <= static_cast<double>(limits::kMaxTraceCounts),
      "steps: {} micro-batches x {} layers x {} ranks x {} experts = {:.0f} counts, "
      "above the limit of {} counts in a trace",
      spec.num_steps, prior.num_layers(), spec.num_ranks, prior.num_experts(), counts,
      limits::kMaxTraceCounts);
  Trace t;
  t.model = prior.model;
  t.num_experts = prior.num_experts();
  t.top_k = spec.top_k;
  t.num_ranks = spec.num_ranks;
  t.tokens_per_rank = spec.tokens_per_rank;
  nlohmann::ordered_json gen = {{"tool", "feplb trace gen"},
                                {"prior", prior.source},
                                {"seq_len", spec.seq_len},
                                {"concentration", spec.concentration},
                                {"seed", spec.seed}};
  t.generator_json = gen.dump();
  const int64_t total = spec.num_steps * prior.num_layers();
  t.steps.reserve(static_cast<size_t>(total));
  for (int64_t step = 0; step < spec.num_steps; ++step) {
    for (int l = 0; l < prior.num_layers(); ++l) {
      t.steps.push_back(generate_step(prior.popularity[l], spec, step, prior.layer_ids[l]));
      if (progress) progress(static_cast<int64_t>(t.steps.size()), total);
    }
  }
  return t;
}

std::vector<int32_t> topk_from_counts(std::span<const int64_t> counts, int64_t tokens, int top_k) {
  int64_t total = 0;
  for (int64_t c : counts) {
    FEPLB_REQUIRE_INPUT(c >= 0 && c <= tokens, "counts: {} rows for one expert from {} tokens", c,
                        tokens);
    total += c;
  }
  FEPLB_REQUIRE_INPUT(total == tokens * top_k, "counts: sum {} != tokens * top_k = {}", total,
                      tokens * top_k);
  std::vector<int32_t> slots;
  slots.reserve(static_cast<size_t>(total));
  for (size_t e = 0; e < counts.size(); ++e)
    slots.insert(slots.end(), static_cast<size_t>(counts[e]), static_cast<int32_t>(e));
  std::vector<int32_t> idx(static_cast<size_t>(total));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int k = 0; k < top_k; ++k)
      idx[static_cast<size_t>(t * top_k + k)] = slots[static_cast<size_t>(t + k * tokens)];
  }
  return idx;
}

}  // namespace feplb
