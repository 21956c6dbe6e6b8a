// The placer: best-improvement swaps of homes between nodes, then between the GPUs of each node, on
// the history's per-micro-batch loads; dynamic sets by score; EPLB's packing for a fresh start.
#include "feplb/core/placer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "feplb/core/error.h"
#include "feplb/core/planners/eplb_rebalance.h"
#include "feplb/core/topology.h"

namespace feplb {
namespace {

// Steps per block of the swap search: after each block a candidate swap is dropped as soon as it
// cannot beat the best one even if it gained the most it can on the remaining steps.
constexpr int64_t kBlock = 64;

double pos(double x) { return x > 0 ? x : 0; }

// Greedy maximum-overlap matching of n new labels onto n old labels: pairs by overlap, largest
// first (ties: lower new label, then lower old label). overlap[i * n + j]; returns map[new] = old.
std::vector<int> match_labels(const std::vector<int64_t>& overlap, int n) {
  std::vector<int> pairs(static_cast<size_t>(n) * n);
  for (int i = 0; i < n * n; ++i) pairs[i] = i;
  std::stable_sort(pairs.begin(), pairs.end(),
                   [&](int a, int b) { return overlap[a] > overlap[b]; });
  std::vector<int> map(static_cast<size_t>(n), -1);
  std::vector<uint8_t> used(static_cast<size_t>(n), 0);
  for (int p : pairs) {
    const int i = p / n, j = p % n;
    if (map[i] >= 0 || used[j]) continue;
    map[i] = j;
    used[j] = 1;
  }
  return map;
}

}  // namespace

PlaceOptions place_options(const Knobs& k) {
  FEPLB_REQUIRE_INPUT(k.place_homes <= 2, "--place-homes: {} must be 0, 1 or 2", k.place_homes);
  FEPLB_REQUIRE_INPUT(k.place_dyn_score <= 2, "--place-dyn-score: {} must be 0, 1 or 2",
                      k.place_dyn_score);
  PlaceOptions o;
  o.homes = static_cast<HomesMode>(k.place_homes);
  o.dyn_score = static_cast<DynScore>(k.place_dyn_score);
  o.dyn = k.dyn;
  o.min_gain = k.place_min_gain;
  return o;
}

std::vector<LayerHistory> layer_histories(const Trace& trace, size_t first, size_t end) {
  std::map<int64_t, LayerHistory> by_layer;
  for (size_t i = first; i < end && i < trace.steps.size(); ++i) {
    const RoutingStep& s = trace.steps[i];
    LayerHistory& h = by_layer[s.layer];
    h.layer = s.layer;
    h.rows.insert(h.rows.end(), s.expert_counts.begin(), s.expert_counts.end());
    ++h.num_steps;
  }
  std::vector<LayerHistory> out;
  for (auto& [layer, h] : by_layer) out.push_back(std::move(h));
  return out;
}

PlacementQuality evaluate_homes(const LayerHistory& h, std::span<const int> home, int num_ranks,
                                int gpus_per_node) {
  const int E = static_cast<int>(home.size());
  const int D = std::min(num_ranks, gpus_per_node), N = num_ranks / D;
  PlacementQuality q;
  if (h.num_steps == 0) return q;
  std::vector<double> gpu(static_cast<size_t>(num_ranks)), node(static_cast<size_t>(N));
  for (int64_t t = 0; t < h.num_steps; ++t) {
    std::fill(gpu.begin(), gpu.end(), 0.0);
    std::fill(node.begin(), node.end(), 0.0);
    double total = 0;
    for (int e = 0; e < E; ++e) {
      const auto r = static_cast<double>(h.rows[static_cast<size_t>(t) * E + e]);
      gpu[home[e]] += r;
      node[home[e] / D] += r;
      total += r;
    }
    const double mean = total / num_ranks;
    double excess = 0;
    for (int g = 0; g < num_ranks; ++g) excess += pos(gpu[g] - node[g / D] / D);
    q.mean_rows += mean;
    q.node_floor += *std::max_element(node.begin(), node.end()) / D - mean;
    q.gpu_excess += excess;
    q.gpu_straggler += *std::max_element(gpu.begin(), gpu.end()) - mean;
  }
  const auto steps = static_cast<double>(h.num_steps);
  q.mean_rows /= steps;
  q.node_floor /= steps;
  q.gpu_excess /= steps;
  q.gpu_straggler /= steps;
  return q;
}

std::vector<int> pack_homes(std::span<const double> load, int num_ranks, int num_domains) {
  eplb::Params p;
  p.num_experts = static_cast<int>(load.size());
  p.num_replicas = p.num_experts;
  p.num_groups = p.num_experts;
  p.num_nodes = num_domains;
  p.num_gpus = num_ranks;
  p.policy = eplb::Policy::kHierarchical;
  eplb::check_params(p);
  eplb::Layout out;
  eplb::Workspace ws;
  eplb::rebalance(load, p, out, ws);
  std::vector<int> home(load.size());
  const int per_gpu = p.num_experts / num_ranks;
  for (int s = 0; s < p.num_replicas; ++s) home[out.phy2log[s]] = s / per_gpu;
  return home;
}

Placer::Placer(int num_ranks, int gpus_per_node, int num_experts, const PlaceOptions& options)
    : num_ranks_(num_ranks), num_experts_(num_experts), options_(options) {
  const Topology topo = Topology::contiguous(num_ranks, gpus_per_node, num_experts);  // checks
  domain_size_ = topo.domain_size();
  num_domains_ = topo.num_domains();
  FEPLB_REQUIRE_INPUT(options.min_gain >= 0, "--place-min-gain: {} must be at least 0",
                      options.min_gain);
}

Placement Placer::place(std::span<const LayerHistory> histories, const Placement& current,
                        std::vector<LayerPlaceStats>* stats) {
  FEPLB_CHECK(current.num_experts == num_experts_ && current.num_ranks == num_ranks_,
              "placer: the current placement has another shape");
  Placement out = current;
  for (const LayerHistory& h : histories) {
    const LayerPlacement* cur = current.find(h.layer);
    FEPLB_REQUIRE_INPUT(cur != nullptr, "placement: layers: no entry for layer {} of the history",
                        h.layer);
    FEPLB_CHECK(h.rows.size() == static_cast<size_t>(h.num_steps) * num_experts_,
                "placer: history of layer {} has {} counts", h.layer, h.rows.size());
    if (h.num_steps == 0) continue;
    LayerPlacement& l = out.layers[static_cast<size_t>(cur - current.layers.data())];
    LayerPlaceStats s;
    place_layer(h, *cur, l, s);
    if (stats) stats->push_back(s);
  }
  return out;
}

void Placer::place_layer(const LayerHistory& h, const LayerPlacement& current, LayerPlacement& out,
                         LayerPlaceStats& stats) {
  load_history(h);
  stats.layer = h.layer;
  stats.before = evaluate_homes(h, current.home, num_ranks_, num_ranks_ / num_domains_);
  std::vector<int> home = current.home;
  if (options_.homes == HomesMode::kFresh) {
    std::vector<double> load(static_cast<size_t>(num_experts_), 0.0);
    for (int e = 0; e < num_experts_; ++e) {
      const double* r = &rows_[static_cast<size_t>(e) * steps_];
      for (int64_t t = 0; t < steps_; ++t) load[e] += r[t];
    }
    home = pack_homes(load, num_ranks_, num_domains_);
  }
  if (options_.homes != HomesMode::kKeep) {
    stats.node_swaps = improve_nodes(home);
    stats.gpu_swaps = improve_gpus(home);
  }
  if (options_.homes == HomesMode::kFresh) relabel(current.home, home);
  choose_dynamic(home, out.dynamic);
  out.home = home;
  stats.after = evaluate_homes(h, out.home, num_ranks_, num_ranks_ / num_domains_);
  stats.rehomed = 0;
  for (int e = 0; e < num_experts_; ++e) stats.rehomed += out.home[e] != current.home[e] ? 1 : 0;
}

void Placer::load_history(const LayerHistory& h) {
  steps_ = h.num_steps;
  rows_.assign(static_cast<size_t>(num_experts_) * steps_, 0.0);
  double total = 0;
  for (int64_t t = 0; t < steps_; ++t) {
    for (int e = 0; e < num_experts_; ++e) {
      const auto r = static_cast<double>(h.rows[static_cast<size_t>(t) * num_experts_ + e]);
      rows_[static_cast<size_t>(e) * steps_ + t] = r;
      total += r;
    }
  }
  mean_rows_ = total / static_cast<double>(steps_) / num_ranks_;
  other_.assign(static_cast<size_t>(steps_), 0.0);
  base_.assign(static_cast<size_t>(steps_), 0.0);
}

// Nodes: the objective is the sum over the history's steps of the most loaded node's rows (the
// floor that in-node balancing leaves, times GPUs per node). Best-improvement swaps of two experts
// on different nodes, while the best one lowers the floor by more than min_gain x mean rows per GPU
// per step. Swapped experts take each other's GPU.
int64_t Placer::improve_nodes(std::vector<int>& home) {
  if (num_domains_ == 1) return 0;
  const int D = domain_size_, N = num_domains_;
  const int64_t T = steps_;
  const size_t blocks = static_cast<size_t>((T + kBlock - 1) / kBlock);
  load_.assign(static_cast<size_t>(N) * T, 0.0);
  for (int e = 0; e < num_experts_; ++e) {
    double* l = &load_[static_cast<size_t>(home[e] / D) * T];
    const double* r = &rows_[static_cast<size_t>(e) * T];
    for (int64_t t = 0; t < T; ++t) l[t] += r[t];
  }
  const double threshold = options_.min_gain * mean_rows_ * static_cast<double>(T) * D;
  std::vector<std::vector<int>> members(static_cast<size_t>(N));
  std::vector<double> bound(blocks + 1);  // bound[b]: most the steps of blocks >= b can gain
  int64_t swaps = 0;
  for (; swaps < num_experts_; ++swaps) {
    for (auto& m : members) m.clear();
    for (int e = 0; e < num_experts_; ++e) members[home[e] / D].push_back(e);
    double best = threshold;
    int best_a = -1, best_b = -1;
    for (int A = 0; A < N; ++A) {
      for (int B = A + 1; B < N; ++B) {
        const double* la = &load_[static_cast<size_t>(A) * T];
        const double* lb = &load_[static_cast<size_t>(B) * T];
        std::fill(bound.begin(), bound.end(), 0.0);
        for (int64_t t = 0; t < T; ++t) {
          double other = -std::numeric_limits<double>::infinity();
          for (int n = 0; n < N; ++n) {
            if (n != A && n != B) other = std::max(other, load_[static_cast<size_t>(n) * T + t]);
          }
          other_[t] = other;
          base_[t] = std::max({other, la[t], lb[t]});
          // After any swap the pair's larger load is at least their mean.
          bound[static_cast<size_t>(t / kBlock)] +=
              base_[t] - std::max(other, 0.5 * (la[t] + lb[t]));
        }
        for (size_t b = blocks; b-- > 0;) bound[b] += bound[b + 1];
        for (int a : members[A]) {
          const double* ra = &rows_[static_cast<size_t>(a) * T];
          for (int b : members[B]) {
            const double* rb = &rows_[static_cast<size_t>(b) * T];
            double gain = 0;
            bool pruned = false;
            for (size_t blk = 0; blk < blocks; ++blk) {
              const int64_t t0 = static_cast<int64_t>(blk) * kBlock;
              const int64_t t1 = std::min(T, t0 + kBlock);
              for (int64_t t = t0; t < t1; ++t) {
                const double d = rb[t] - ra[t];
                gain += base_[t] - std::max({other_[t], la[t] + d, lb[t] - d});
              }
              if (gain + bound[blk + 1] <= best) {
                pruned = true;
                break;
              }
            }
            if (!pruned && gain > best) {
              best = gain;
              best_a = a;
              best_b = b;
            }
          }
        }
      }
    }
    if (best_a < 0) break;
    double* la = &load_[static_cast<size_t>(home[best_a] / D) * T];
    double* lb = &load_[static_cast<size_t>(home[best_b] / D) * T];
    const double* ra = &rows_[static_cast<size_t>(best_a) * T];
    const double* rb = &rows_[static_cast<size_t>(best_b) * T];
    for (int64_t t = 0; t < T; ++t) {
      la[t] += rb[t] - ra[t];
      lb[t] += ra[t] - rb[t];
    }
    std::swap(home[best_a], home[best_b]);
  }
  return swaps;
}

// GPUs of each node: the objective is the sum over the history's steps of the rows above the
// node's mean on each GPU (what the per-micro-batch planner has to move). Best-improvement swaps
// of two experts on different GPUs of one node, while the best one lowers it, averaged over the
// node's GPUs, by more than min_gain x mean rows per GPU per step (the node stage's unit).
int64_t Placer::improve_gpus(std::vector<int>& home) {
  if (domain_size_ == 1) return 0;
  const int D = domain_size_, R = num_ranks_;
  const int64_t T = steps_;
  const size_t blocks = static_cast<size_t>((T + kBlock - 1) / kBlock);
  load_.assign(static_cast<size_t>(R) * T, 0.0);
  for (int e = 0; e < num_experts_; ++e) {
    double* l = &load_[static_cast<size_t>(home[e]) * T];
    const double* r = &rows_[static_cast<size_t>(e) * T];
    for (int64_t t = 0; t < T; ++t) l[t] += r[t];
  }
  const double threshold = options_.min_gain * mean_rows_ * static_cast<double>(T) * D;
  std::vector<std::vector<int>> members(static_cast<size_t>(R));
  bound_.resize(blocks + 1);
  int64_t swaps = 0;
  for (int node = 0; node < num_domains_; ++node) {
    const int first = node * D;
    // other_[t]: the node's mean rows per GPU (swaps inside the node do not change it).
    std::fill(other_.begin(), other_.end(), 0.0);
    for (int g = first; g < first + D; ++g) {
      const double* l = &load_[static_cast<size_t>(g) * T];
      for (int64_t t = 0; t < T; ++t) other_[t] += l[t] / D;
    }
    const int per_node = num_experts_ / num_domains_;
    for (int node_swaps = 0; node_swaps < per_node; ++node_swaps) {
      for (int g = first; g < first + D; ++g) members[g].clear();
      for (int e = 0; e < num_experts_; ++e) {
        if (home[e] / D == node) members[home[e]].push_back(e);
      }
      double best = threshold;
      int best_a = -1, best_b = -1;
      for (int x = first; x < first + D; ++x) {
        for (int y = x + 1; y < first + D; ++y)
          best_gpu_swap(x, y, members[x], members[y], best, best_a, best_b);
      }
      if (best_a < 0) break;
      double* lx = &load_[static_cast<size_t>(home[best_a]) * T];
      double* ly = &load_[static_cast<size_t>(home[best_b]) * T];
      const double* ra = &rows_[static_cast<size_t>(best_a) * T];
      const double* rb = &rows_[static_cast<size_t>(best_b) * T];
      for (int64_t t = 0; t < T; ++t) {
        lx[t] += rb[t] - ra[t];
        ly[t] += ra[t] - rb[t];
      }
      std::swap(home[best_a], home[best_b]);
      ++swaps;
    }
  }
  return swaps;
}

// improve_gpus' search over one pair of GPUs of a node: with x's and y's loads, a lower bound per
// block of steps on what is left to gain prunes a candidate swap early.
void Placer::best_gpu_swap(int x, int y, const std::vector<int>& on_x, const std::vector<int>& on_y,
                           double& best, int& best_a, int& best_b) {
  const int64_t T = steps_;
  const size_t blocks = bound_.size() - 1;
  const double* lx = &load_[static_cast<size_t>(x) * T];
  const double* ly = &load_[static_cast<size_t>(y) * T];
  std::fill(bound_.begin(), bound_.end(), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    base_[t] = pos(lx[t] - other_[t]) + pos(ly[t] - other_[t]);
    // pos is convex: the pair's excess after a swap is at least twice that of their mean.
    bound_[static_cast<size_t>(t / kBlock)] +=
        base_[t] - 2 * pos(0.5 * (lx[t] + ly[t]) - other_[t]);
  }
  for (size_t b = blocks; b-- > 0;) bound_[b] += bound_[b + 1];
  for (int a : on_x) {
    const double* ra = &rows_[static_cast<size_t>(a) * T];
    for (int b : on_y) {
      const double* rb = &rows_[static_cast<size_t>(b) * T];
      double gain = 0;
      bool pruned = false;
      for (size_t blk = 0; blk < blocks; ++blk) {
        const int64_t t0 = static_cast<int64_t>(blk) * kBlock;
        const int64_t t1 = std::min(T, t0 + kBlock);
        for (int64_t t = t0; t < t1; ++t) {
          const double d = rb[t] - ra[t];
          gain += base_[t] - pos(lx[t] + d - other_[t]) - pos(ly[t] - d - other_[t]);
        }
        if (gain + bound_[blk + 1] <= best) {
          pruned = true;
          break;
        }
      }
      if (!pruned && gain > best) {
        best = gain;
        best_a = a;
        best_b = b;
      }
    }
  }
}

// Renames nodes, then the GPUs inside each node, so that as many experts as possible keep their
// current home (the layout is the same up to these names; only the moves differ).
void Placer::relabel(const std::vector<int>& current, std::vector<int>& home) const {
  const int D = domain_size_, N = num_domains_;
  std::vector<int64_t> overlap(static_cast<size_t>(N) * N, 0);
  for (int e = 0; e < num_experts_; ++e)
    ++overlap[static_cast<size_t>(home[e] / D) * N + current[e] / D];
  const std::vector<int> node_map = match_labels(overlap, N);
  std::vector<int> gpu_map(static_cast<size_t>(num_ranks_), -1);
  for (int n = 0; n < N; ++n) {
    const int old = node_map[n];
    std::vector<int64_t> o(static_cast<size_t>(D) * D, 0);
    for (int e = 0; e < num_experts_; ++e) {
      if (home[e] / D == n && current[e] / D == old)
        ++o[static_cast<size_t>(home[e] % D) * D + current[e] % D];
    }
    const std::vector<int> m = match_labels(o, D);
    for (int i = 0; i < D; ++i) gpu_map[static_cast<size_t>(n) * D + i] = old * D + m[i];
  }
  for (int e = 0; e < num_experts_; ++e) home[e] = gpu_map[home[e]];
}

// Each GPU's dyn experts with the highest score (ties: more rows, then the lower index).
void Placer::choose_dynamic(const std::vector<int>& home, std::vector<uint8_t>& dynamic) {
  const int D = domain_size_, R = num_ranks_;
  const int64_t T = steps_;
  load_.assign(static_cast<size_t>(R) * T, 0.0);
  for (int e = 0; e < num_experts_; ++e) {
    double* l = &load_[static_cast<size_t>(home[e]) * T];
    const double* r = &rows_[static_cast<size_t>(e) * T];
    for (int64_t t = 0; t < T; ++t) l[t] += r[t];
  }
  std::vector<double> score(static_cast<size_t>(num_experts_), 0.0);
  std::vector<double> total(static_cast<size_t>(num_experts_), 0.0);
  for (int e = 0; e < num_experts_; ++e) {
    const double* r = &rows_[static_cast<size_t>(e) * T];
    const int g = home[e], first = g / D * D;
    double sum = 0, sq = 0, donor = 0;
    for (int64_t t = 0; t < T; ++t) {
      double node_mean = 0;
      for (int h = first; h < first + D; ++h) node_mean += load_[static_cast<size_t>(h) * T + t];
      node_mean /= D;
      sum += r[t];
      sq += r[t] * r[t];
      if (load_[static_cast<size_t>(g) * T + t] > node_mean) donor += r[t];
    }
    const double mean = sum / static_cast<double>(T);
    total[e] = sum;
    switch (options_.dyn_score) {
      case DynScore::kDonorRows:
        score[e] = donor;
        break;
      case DynScore::kMeanRows:
        score[e] = sum;
        break;
      case DynScore::kMeanPlusStd:
        score[e] = mean + std::sqrt(std::max(0.0, sq / static_cast<double>(T) - mean * mean));
        break;
    }
  }
  const Topology topo = Topology::with_placement(R, D, home);
  const int64_t dyn = std::clamp<int64_t>(options_.dyn, 0, topo.experts_per_rank());
  dynamic.assign(static_cast<size_t>(num_experts_), 0);
  std::vector<int> order;
  for (int g = 0; g < R; ++g) {
    order.assign(topo.local_experts(g).begin(), topo.local_experts(g).end());
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      if (score[a] != score[b]) return score[a] > score[b];
      if (total[a] != total[b]) return total[a] > total[b];
      return a < b;
    });
    for (int64_t i = 0; i < dyn; ++i) dynamic[order[i]] = 1;
  }
}

}  // namespace feplb
