// The Router Predictor of FEPLB's macro timescale (docs/placement.md): homes and dynamic sets from
// a routing history; homes balanced across nodes first, then across the GPUs of each node.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "feplb/core/knobs.h"
#include "feplb/core/placement.h"
#include "feplb/core/routing.h"

namespace feplb {

enum class HomesMode : uint8_t {
  kImprove,  // start from the current homes; swap pairs while a swap gains enough (few moves)
  kFresh,    // EPLB's hierarchical packing of mean loads, then swaps; relabelled to keep homes
  kKeep,     // keep the current homes; choose the dynamic sets only
};

enum class DynScore : uint8_t {
  kDonorRows,  // rows in the history steps where the expert's GPU is above its node's mean
  kMeanRows,
  kMeanPlusStd,
};

struct PlaceOptions {
  HomesMode homes = HomesMode::kImprove;
  DynScore dyn_score = DynScore::kDonorRows;
  int64_t dyn = 4;           // dynamic experts per GPU (at most E / R)
  double min_gain = 0.0025;  // x mean rows per GPU per micro-batch: the smallest gain of a swap
};

// From knobs place_homes, place_dyn_score, dyn and place_min_gain; InputError naming the flag
// when one is out of range.
PlaceOptions place_options(const Knobs& knobs);

// One layer's history: rows per expert in each of `num_steps` micro-batches.
struct LayerHistory {
  int64_t layer = 0;
  int64_t num_steps = 0;
  std::vector<int64_t> rows;  // [num_steps, num_experts]
};

// The trace steps [first, end) grouped by layer (ascending layer ids; steps in trace order).
std::vector<LayerHistory> layer_histories(const Trace& trace, size_t first, size_t end);

// How one layer's homes do on a history, in rows per GPU per micro-batch (means over its steps).
struct PlacementQuality {
  double mean_rows = 0;      // mean rows per GPU
  double node_floor = 0;     // max over nodes of (node rows / GPUs) - mean: left between nodes
  double gpu_excess = 0;     // sum over GPUs of rows above their node's mean: rows to move
  double gpu_straggler = 0;  // max over GPUs of rows - mean: the static straggler
};
PlacementQuality evaluate_homes(const LayerHistory& history, std::span<const int> home,
                                int num_ranks, int gpus_per_node);

struct LayerPlaceStats {
  int64_t layer = 0;
  PlacementQuality before, after;  // current homes and new homes, on the history
  int64_t node_swaps = 0, gpu_swaps = 0;
  int64_t rehomed = 0;  // experts whose home changed
};

// EPLB's hierarchical rebalance (eplb_rebalance.h) with no redundant slot and one expert per group:
// experts onto nodes by load, then onto the GPUs of each node. home[e] for loads [E].
std::vector<int> pack_homes(std::span<const double> load, int num_ranks, int num_domains);

// Places every layer of `current` that has history; a layer without history keeps its entry.
// Deterministic; allocates per call (it runs between micro-batches, not on the hot path).
class Placer {
 public:
  Placer(int num_ranks, int gpus_per_node, int num_experts, const PlaceOptions& options);

  // The new placement from `histories`, starting from `current` (same shape). `stats`, when not
  // null, gets one entry per placed layer.
  Placement place(std::span<const LayerHistory> histories, const Placement& current,
                  std::vector<LayerPlaceStats>* stats = nullptr);

 private:
  void place_layer(const LayerHistory& h, const LayerPlacement& current, LayerPlacement& out,
                   LayerPlaceStats& stats);
  void load_history(const LayerHistory& h);
  int64_t improve_nodes(std::vector<int>& home);
  int64_t improve_gpus(std::vector<int>& home);
  // improve_gpus' search over the experts on GPUs x and y (`on_x`, `on_y`) of one node: a swap
  // whose gain beats `best` becomes the best (best, best_a, best_b); bound_ is its scratch.
  void best_gpu_swap(int x, int y, const std::vector<int>& on_x, const std::vector<int>& on_y,
                     double& best, int& best_a, int& best_b);
  void relabel(const std::vector<int>& current, std::vector<int>& home) const;
  void choose_dynamic(const std::vector<int>& home, std::vector<uint8_t>& dynamic);

  int num_ranks_, domain_size_, num_domains_, num_experts_;
  PlaceOptions options_;
  int64_t steps_ = 0;
  double mean_rows_ = 0;              // mean rows per GPU per step
  std::vector<double> rows_;          // [num_experts, steps]: the history, expert-major
  std::vector<double> load_;          // [num_ranks or num_domains, steps]
  std::vector<double> other_, base_;  // [steps]
  std::vector<double> bound_;         // [steps / block + 1]
};

}  // namespace feplb
