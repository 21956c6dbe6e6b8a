// GEMM cost model: modelled time of one expert's forward (gate+up GEMM, SwiGLU, down GEMM) for a
// given number of rows. Roofline with wave quantisation on measured H200 ceilings (knobs), until
// the GPU benchmarks supply a measured table.
#pragma once

#include <cstdint>
#include <vector>

#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"

namespace feplb {

class GemmCostModel {
 public:
  virtual ~GemmCostModel() = default;
  // Milliseconds to run one expert's FFN over `rows` rows on one GPU (0 rows -> 0).
  virtual double expert_ms(int64_t rows) const = 0;
};

class RooflineCostModel final : public GemmCostModel {
 public:
  RooflineCostModel(const ExpertShape& shape, const Knobs& knobs);
  double expert_ms(int64_t rows) const override;
  // One GEMM [m, k] x [k, n] in bf16, in ms: max(wave-quantised compute, memory) + launch.
  double gemm_ms(int64_t m, int64_t n, int64_t k) const;

 private:
  ExpertShape shape_;
  double peak_flops_;      // FLOP/s
  double hbm_bytes_per_s_;
  int64_t num_sms_;
  double launch_ms_;
  mutable std::vector<double> cache_;  // expert_ms by rows, for rows < cache size
};

}  // namespace feplb
