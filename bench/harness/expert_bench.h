// ExpertBench: times expert FFNs on this GPU the way a rank runs them (back to back, each expert
// with its own weights, random data), for the GEMM-time table, the grouped-GEMM benchmarks and
// the measured per-rank GEMM time of a plan. CUDA events; median of repetitions.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "feplb/core/expert_shape.h"
#include "feplb/core/plan.h"
#include "feplb/core/topology.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/gemm/gemm.h"
#include "feplb/cuda/gemm/grouped_ffn.h"

namespace feplb::cuda {

class ExpertBench {
 public:
  // Forward: the SwiGLU FFN. Backward: its backward as the layer runs it (dW accumulated in fp32,
  // dX), from saved activations of a forward (kept intact, so every repetition sees real data).
  enum class Pass { kForward, kBackward };
  // The expert GEMMs: one cuBLASLt GEMM per expert and stage (GemmEngine), one grouped GEMM per
  // stage whose sizes the GPU reads (GroupedFfn; compute capability 9.0), or per call as the
  // layer's RuntimeConfig::expert_gemm kAuto chooses (GroupedFfn::faster_than_per_expert).
  enum class Gemms { kPerExpert, kGrouped, kAuto };

  // Room for `max_rows` rows in one call and `num_weight_sets` distinct experts' weights (the
  // experts of a call cycle through them, so weights are not served from L2 unrealistically).
  ExpertBench(const ExpertShape& shape, int64_t max_rows, int num_weight_sets, int max_streams = 4);

  // Milliseconds to run every listed expert (rows > 0) back to back, round-robin over `streams`
  // streams: median of `reps` timed runs after one warm-up.
  double run_ms(std::span<const int64_t> rows_per_expert, int streams = 1, int reps = 5,
                Pass pass = Pass::kForward, Gemms gemms = Gemms::kPerExpert);
  // Enqueues the experts once on stream() (and helper streams), untimed: for callers that put
  // their own events and side traffic around it.
  void enqueue(std::span<const int64_t> rows_per_expert, int streams = 1,
               Pass pass = Pass::kForward, Gemms gemms = Gemms::kPerExpert);
  // The same work through cublasGemmGroupedBatchedEx (one grouped call per GEMM, one SwiGLU).
  double run_grouped_ms(std::span<const int64_t> rows_per_expert, int reps = 5);
  // The experts on one stream held back by a host function while the host enqueues them all: the
  // GPU's own time (nothing paced by the host) and the host's enqueue time, medians of `reps`.
  struct Queued {
    double gpu_ms = 0, host_ms = 0;
  };
  Queued run_queued(std::span<const int64_t> rows_per_expert, int reps = 5,
                    Pass pass = Pass::kForward, Gemms gemms = Gemms::kPerExpert);

  // Per GPU of `plan`: its slices' row counts (own and guest experts), for run_ms.
  static std::vector<std::vector<int64_t>> rows_per_gpu(const Plan& plan, int num_ranks);

  const ExpertShape& shape() const { return shape_; }
  cudaStream_t stream() const { return streams_[0].get(); }
  void* scratch() const { return y_.get(); }
  size_t scratch_bytes() const { return y_.bytes(); }

 private:
  ExpertShape shape_;
  int64_t max_rows_;
  int sets_;
  void ensure_backward_buffers();
  void grow(int64_t rows);  // room for `rows` rows in one call (the grouped GEMMs need it)
  // The experts as one GroupedFfn batch (rows laid out one expert after another; the backward
  // overwrites act and gu with their gradients, as the layer does).
  void enqueue_grouped(std::span<const int64_t> rows_per_expert, Pass pass);
  DeviceBuffer<__nv_bfloat16> w_, x_, gu_, act_, y_;
  DeviceBuffer<__nv_bfloat16> dy_, dx_, dgu_, dact_;  // backward (allocated on first use)
  DeviceBuffer<float> grad_w_;                        // [sets, 3HF] fp32
  std::vector<Stream> streams_;
  std::vector<Event> joins_;
  CublasHandle cublas_;                            // the grouped-GEMM comparison
  std::vector<std::unique_ptr<GemmEngine>> gemm_;  // [max_streams]
  std::unique_ptr<GroupedFfn> grouped_;            // made on first use
  std::vector<kernels::FfnItem> items_;
  Event start_{true}, stop_{true};
};

}  // namespace feplb::cuda
