#include "feplb/sim/prior.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "feplb/core/error.h"
#include "feplb/core/file_input.h"
#include "feplb/core/internal/json_stream.h"
#include "feplb/core/limits.h"
#include "feplb/core/rng.h"

namespace feplb {
namespace {

std::vector<double> normalised(std::vector<double> w, std::string_view what) {
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  FEPLB_REQUIRE_INPUT(total > 0.0 && std::isfinite(total), "{}: total load must be positive", what);
  for (double& x : w) x /= total;
  return w;
}

}  // namespace

double max_over_mean(const std::vector<double>& p) {
  if (p.empty()) return 0.0;
  const double mean = std::accumulate(p.begin(), p.end(), 0.0) / static_cast<double>(p.size());
  return mean > 0 ? *std::max_element(p.begin(), p.end()) / mean : 0.0;
}

namespace {

using json_stream::int_in;
using json_stream::Take;
using json_stream::type_of;
using sjson = json_stream::json;

// The prior document, streamed: each row of "counts" is captured (E numbers) and kept as doubles;
// the other members are captured. Members may come in any order; the rows are checked against
// "experts" and "layers" at the end.
class PriorReader : public json_stream::Reader<PriorReader> {
 public:
  explicit PriorReader(const ByteSource& source) : Reader(source) {}

  Take take(bool object) {
    if (depth() == 0) {
      FEPLB_REQUIRE_INPUT(object, "expected a JSON object at the top");
      return Take::stream();
    }
    if (depth() == 1 && key_at(0) == "counts" && !object) return Take::stream();
    if (depth() == 2) return Take::whole(limits::kMaxExperts * limits::kBytesPerFloat);
    return Take::whole();
  }
  void opened(bool /*object*/) {
    if (depth() == 2) saw_counts_ = true;
  }
  void closed(bool /*object*/) {}

  void value(sjson&& v) {
    if (depth() == 0) throw InputError("expected a JSON object at the top");
    if (depth() == 2) {
      row(v, index_at(1));
      return;
    }
    const std::string& key = key_at(0);
    if (key == "model" && v.is_string()) {
      p_.model = v.get<std::string>();
    } else if (key == "source" && v.is_string()) {
      p_.source = v.get<std::string>();
    } else if (key == "experts") {
      experts_ = int_in(v, "experts", 1, limits::kMaxExperts);
    } else if (key == "top_k") {
      top_k_ = int_in(v, "top_k", 1, limits::kMaxExperts);
    } else if (key == "layers") {
      FEPLB_REQUIRE_INPUT(v.is_array(), "layers: expected an array of layer ids, got {}",
                          type_of(v));
      has_layers_ = true;
      for (size_t l = 0; l < v.size(); ++l) {
        p_.layer_ids.push_back(int_in(v[l], fmt::format("layers[{}]", l), 0, limits::kMaxStepId));
      }
    } else if (key == "counts") {
      throw InputError(fmt::format("counts: expected a non-empty array, got {}", type_of(v)));
    }
  }

  Prior finish() {
    FEPLB_REQUIRE_INPUT(experts_ > 0, "experts: missing");
    FEPLB_REQUIRE_INPUT(top_k_ > 0, "top_k: missing");
    FEPLB_REQUIRE_INPUT(top_k_ <= experts_, "top_k: {} is outside [1, experts = {}]", top_k_,
                        experts_);
    FEPLB_REQUIRE_INPUT(saw_counts_, "counts: missing");
    FEPLB_REQUIRE_INPUT(!rows_.empty(), "counts: expected a non-empty array");
    FEPLB_REQUIRE_INPUT(has_layers_, "layers: missing");
    FEPLB_REQUIRE_INPUT(p_.layer_ids.size() == rows_.size(),
                        "layers: expected an array with one id per counts row ({}), got {}",
                        rows_.size(), p_.layer_ids.size());
    p_.top_k = static_cast<int>(top_k_);
    for (size_t l = 0; l < rows_.size(); ++l) {
      FEPLB_REQUIRE_INPUT(rows_[l].size() == static_cast<size_t>(experts_),
                          "counts[{}]: expected {} entries, got {}", l, experts_, rows_[l].size());
      p_.popularity.push_back(normalised(std::move(rows_[l]), fmt::format("counts[{}]", l)));
    }
    return std::move(p_);
  }

 private:
  void row(const sjson& v, size_t l) {
    FEPLB_REQUIRE_INPUT(v.is_array(), "counts[{}]: expected an array, got {}", l, type_of(v));
    entries_ += static_cast<int64_t>(v.size());
    FEPLB_REQUIRE_INPUT(entries_ <= limits::kMaxPriorEntries,
                        "counts[{}]: more than {} counts, the limit of a prior", l,
                        limits::kMaxPriorEntries);
    std::vector<double> w(v.size());
    for (size_t e = 0; e < v.size(); ++e) {
      const sjson& c = v[e];
      FEPLB_REQUIRE_INPUT(c.is_number() && c.get<double>() >= 0 && std::isfinite(c.get<double>()),
                          "counts[{}][{}]: expected a non-negative number, got {}", l, e,
                          c.is_number() ? c.dump() : type_of(c));
      w[e] = c.get<double>();
    }
    rows_.push_back(std::move(w));
  }

  Prior p_;
  int64_t experts_ = 0, top_k_ = 0, entries_ = 0;
  bool saw_counts_ = false, has_layers_ = false;
  std::vector<std::vector<double>> rows_;
};

Prior read_prior_from(ByteSource& source) {
  PriorReader reader(source);
  json_stream::parse(source, reader);
  return reader.finish();
}

constexpr std::string_view kPriorFormat = "prior";

}  // namespace

Prior parse_prior(const std::string& text) {
  ByteSource source(std::string_view(text), kPriorFormat, limits::kMaxPriorBytes);
  return read_prior_from(source);
}

Prior read_prior(const std::string& path) {
  Prior p = parse_input(path, kPriorFormat, limits::kMaxPriorBytes, read_prior_from);
  if (p.source.empty()) p.source = path;
  return p;
}

namespace {

// Lognormal weights exp(sigma * (z_e - max z)) with sigma found by bisection so that their
// max/mean is `target` (1: all equal).
std::vector<double> lognormal_weights(Rng& rng, int n, double target) {
  std::vector<double> z(static_cast<size_t>(n));
  for (double& x : z) x = rng.normal();
  const double zmax = *std::max_element(z.begin(), z.end());
  auto popularity = [&](double sigma) {
    std::vector<double> w(z.size());
    for (size_t e = 0; e < z.size(); ++e) w[e] = std::exp(sigma * (z[e] - zmax));
    return w;
  };
  // max/mean grows monotonically with sigma (every z_e - zmax <= 0).
  double lo = 0.0, hi = 1.0;
  while (max_over_mean(popularity(hi)) < target && hi < 64.0) hi *= 2.0;
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    (max_over_mean(popularity(mid)) < target ? lo : hi) = mid;
  }
  return popularity(0.5 * (lo + hi));
}

}  // namespace

Prior many_donor_prior(int num_experts, int num_ranks, int gpus_per_node,
                       const std::vector<double>& hot_loads, double cold_min, double expert_skew,
                       int num_layers, uint64_t seed) {
  FEPLB_REQUIRE_INPUT(num_ranks >= 2, "ranks: many-donor skew needs at least 2 GPUs, got {}",
                      num_ranks);
  FEPLB_REQUIRE_INPUT(gpus_per_node >= 2, "gpus-per-node: {} must be at least 2", gpus_per_node);
  FEPLB_REQUIRE_INPUT(num_experts >= num_ranks && num_experts % num_ranks == 0,
                      "experts: {} is not a positive multiple of ranks {}", num_experts, num_ranks);
  FEPLB_REQUIRE_INPUT(num_layers >= 1, "layers: {} must be at least 1", num_layers);
  FEPLB_REQUIRE_INPUT(!hot_loads.empty(), "hot-gpus: none given");
  for (double h : hot_loads) {
    FEPLB_REQUIRE_INPUT(h > 0 && std::isfinite(h), "hot-gpus: load {} must be positive", h);
  }
  FEPLB_REQUIRE_INPUT(cold_min >= 0 && std::isfinite(cold_min), "cold-min: {} must be >= 0",
                      cold_min);
  const int per_gpu = num_experts / num_ranks;
  FEPLB_REQUIRE_INPUT(expert_skew >= 1.0 && (per_gpu == 1 || expert_skew < per_gpu),
                      "skew: max/mean {} over a GPU's {} experts must be in [1, {})", expert_skew,
                      per_gpu, per_gpu);
  const double sum_hot = std::accumulate(hot_loads.begin(), hot_loads.end(), 0.0);
  Prior p;
  p.model = "many-donor";
  std::string loads;
  for (double h : hot_loads) loads += fmt::format("{}{}", loads.empty() ? "" : ",", h);
  p.source = fmt::format("many-donor(hot={}, cold_min={}, expert max/mean={}, seed={})", loads,
                         cold_min, expert_skew, seed);
  for (int l = 0; l < num_layers; ++l) {
    Rng rng(Rng::derive(seed, 0xd0a0, static_cast<uint64_t>(l)));
    std::vector<double> gpu_load(static_cast<size_t>(num_ranks), 0.0);
    for (int first = 0; first < num_ranks; first += gpus_per_node) {
      const int n = std::min(gpus_per_node, num_ranks - first);
      const int hot = static_cast<int>(hot_loads.size());
      FEPLB_REQUIRE_INPUT(hot < n, "hot-gpus: {} loads for a domain of {} GPUs (leave one cold)",
                          hot, n);
      const double cold_mean = (static_cast<double>(n) - sum_hot) / (n - hot);
      FEPLB_REQUIRE_INPUT(cold_mean > 0 && cold_min <= cold_mean,
                          "hot-gpus: loads sum to {} in a domain of {} GPUs, leaving the cold ones "
                          "{:.3f} x the mean, below cold-min {}",
                          sum_hot, n, cold_mean, cold_min);
      std::vector<int> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), first);
      for (int i = n - 1; i > 0; --i) {  // Fisher-Yates, seeded
        std::swap(order[i], order[static_cast<int>(rng.uniform() * (i + 1))]);
      }
      const int cold = n - hot;
      for (int i = 0; i < n; ++i) {
        double load = 0;
        if (i < hot) {
          load = hot_loads[i];
        } else {
          const int j = i - hot;  // 0 = coldest
          load = cold == 1 ? cold_mean : cold_min + 2.0 * (cold_mean - cold_min) * j / (cold - 1);
        }
        FEPLB_REQUIRE_INPUT(load > 0, "cold-min: 0 with one cold GPU leaves it no load");
        gpu_load[order[i]] = load;
      }
    }
    std::vector<double> w(static_cast<size_t>(num_experts));
    for (int g = 0; g < num_ranks; ++g) {
      std::vector<double> inside =
          lognormal_weights(rng, per_gpu, per_gpu == 1 ? 1.0 : expert_skew);
      const double sum = std::accumulate(inside.begin(), inside.end(), 0.0);
      for (int j = 0; j < per_gpu; ++j) w[g * per_gpu + j] = gpu_load[g] * inside[j] / sum;
    }
    p.layer_ids.push_back(l);
    p.popularity.push_back(normalised(std::move(w), "many-donor"));
  }
  return p;
}

Prior lognormal_prior(int num_experts, double target, int num_layers, uint64_t seed) {
  FEPLB_REQUIRE_INPUT(num_experts >= 2, "experts: lognormal popularity needs at least 2 experts");
  FEPLB_REQUIRE_INPUT(num_layers >= 1, "layers: {} must be at least 1", num_layers);
  FEPLB_REQUIRE_INPUT(target >= 1.0 && target < num_experts,
                      "skew: max/mean {} must be in [1, {}) for {} experts", target, num_experts,
                      num_experts);
  Prior p;
  p.model = "lognormal";
  p.source = fmt::format("lognormal(max/mean={}, seed={})", target, seed);
  for (int l = 0; l < num_layers; ++l) {
    Rng rng(Rng::derive(seed, 0x9a1a, static_cast<uint64_t>(l)));
    std::vector<double> z(static_cast<size_t>(num_experts));
    for (double& x : z) x = rng.normal();
    const double zmax = *std::max_element(z.begin(), z.end());
    auto popularity = [&](double sigma) {
      std::vector<double> w(z.size());
      for (size_t e = 0; e < z.size(); ++e) w[e] = std::exp(sigma * (z[e] - zmax));
      return w;
    };
    // max/mean grows monotonically with sigma (every z_e - zmax <= 0).
    double lo = 0.0, hi = 1.0;
    while (max_over_mean(popularity(hi)) < target && hi < 64.0) hi *= 2.0;
    for (int it = 0; it < 100; ++it) {
      const double mid = 0.5 * (lo + hi);
      (max_over_mean(popularity(mid)) < target ? lo : hi) = mid;
    }
    p.layer_ids.push_back(l);
    p.popularity.push_back(normalised(popularity(0.5 * (lo + hi)), "lognormal"));
  }
  return p;
}

Prior expand_prior(const Prior& prior, int num_experts, uint64_t seed) {
  const int base = prior.num_experts();
  FEPLB_REQUIRE_INPUT(num_experts >= base && num_experts % base == 0,
                      "experts: {} must be a multiple of the prior's {} experts", num_experts,
                      base);
  if (num_experts == base) return prior;
  const int copies = num_experts / base;
  Prior out = prior;
  out.source += fmt::format(" (each expert split in {}, seed {})", copies, seed);
  for (size_t l = 0; l < out.popularity.size(); ++l) {
    Rng rng(Rng::derive(seed, 0xe8a9, l));
    const auto& row = out.popularity[l];
    std::vector<double> wide(static_cast<size_t>(num_experts));
    for (int i = 0; i < base; ++i) {
      double sum = 0.0;
      for (int j = 0; j < copies; ++j) sum += wide[i * copies + j] = rng.gamma(4.0);
      for (int j = 0; j < copies; ++j) wide[i * copies + j] *= row[i] / sum;
    }
    out.popularity[l] = std::move(wide);
  }
  return out;
}

}  // namespace feplb
