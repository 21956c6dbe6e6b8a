// GEMM cost model: modelled time of one expert's forward (gate+up GEMM, SwiGLU, down GEMM) for a
// given number of rows. Roofline with wave quantisation on measured H200 ceilings (knobs), until
// the GPU benchmarks supply a measured table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"

namespace feplb {

class GemmCostModel {
 public:
  virtual ~GemmCostModel() = default;
  // Milliseconds to run one expert's FFN over `rows` rows on one GPU (0 rows -> 0).
  virtual double expert_ms(int64_t rows) const = 0;
  // A copy another thread may use meanwhile (expert_ms fills caches), or null where the model
  // cannot be copied (a planner then makes its side plans in series: feplb's chooser).
  virtual std::unique_ptr<GemmCostModel> clone() const { return nullptr; }
};

class RooflineCostModel final : public GemmCostModel {
 public:
  RooflineCostModel(const ExpertShape& shape, const Knobs& knobs);
  double expert_ms(int64_t rows) const override;
  std::unique_ptr<GemmCostModel> clone() const override {
    return std::make_unique<RooflineCostModel>(*this);
  }
  // One GEMM [m, k] x [k, n] in bf16, in ms: max(wave-quantised compute, memory) + launch.
  double gemm_ms(int64_t m, int64_t n, int64_t k) const;

 private:
  ExpertShape shape_;
  double peak_flops_;  // FLOP/s
  double hbm_bytes_per_s_;
  int64_t num_sms_;
  double launch_ms_;
  mutable std::vector<double> cache_;  // expert_ms by rows, for rows < cache size
};

// Measured per-expert FFN times (rows -> ms, from bench/gpu on a real GPU), interpolated linearly
// between measured row counts and extrapolated with the last segment's slope. JSON file:
// {"format":"feplb-gemm-table-v1","device":"...","shape":{"hidden":H,"ffn":F,"dtype":"bf16"},
//  "rows":[increasing ints > 0],"ms":[same length]}.
class TableCostModel final : public GemmCostModel {
 public:
  TableCostModel(std::vector<int64_t> rows, std::vector<double> ms, ExpertShape shape,
                 std::string device);
  double expert_ms(int64_t rows) const override;
  std::unique_ptr<GemmCostModel> clone() const override {
    return std::make_unique<TableCostModel>(*this);
  }
  const ExpertShape& shape() const { return shape_; }
  const std::string& device() const { return device_; }
  const std::vector<int64_t>& rows() const { return rows_; }
  const std::vector<double>& ms() const { return ms_; }

 private:
  std::vector<int64_t> rows_;
  std::vector<double> ms_;
  ExpertShape shape_;
  std::string device_;
  mutable std::vector<double> cache_;  // expert_ms by rows, filled on demand (< 0: not yet)
  double interpolate(int64_t rows) const;
};

// The earlier work weight prefetches hide behind when the prefetch_window_us knob is 0: the
// attention block's Q and O projections alone, [S, H] x [H, H] twice, i.e. 4 S H^2 FLOPs at
// gemm_peak_tflops for S = tokens_per_rank (a lower bound: K, V, the attention itself and the
// previous layer's tail add more). Returns knobs.prefetch_window_us when it is set.
double prefetch_window_us(const ExpertShape& shape, int64_t tokens_per_rank, const Knobs& knobs);

// Reads a feplb-gemm-table-v1 file; throws InputError naming the field.
TableCostModel read_gemm_table(const std::string& path);
TableCostModel parse_gemm_table(std::string_view text);
std::string format_gemm_table(const TableCostModel& table);

}  // namespace feplb
