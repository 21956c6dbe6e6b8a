// GroupedFfn: a batch of expert FFNs (experts, or slices of an expert's rows) as grouped GEMMs
// whose sizes and pointers the GPU reads from tables (kernels/grouped_gemm.h, CUTLASS, sm_90a):
// a fixed number of launches per batch however many experts it has, and no cuBLAS heuristic.
//   forward:  tables, gu = x W_gate_up (1 grouped GEMM), SwiGLU (the caller's), y = act W_down (1)
//   backward: tables, g_down (+)= act^T dY (1 per weight-gradient class), dact = dY W_down^T (1),
//             SwiGLU backward (the caller's), g_gate_up (+)= x^T dgu (1 per class),
//             dX = dgu W_gate_up^T (1), and a clearing kernel where an expert with no rows must
//             have its gradient written (beta 0)
// The same products as the per-expert path (expert_ffn.h), item by item; the layer's GEMM batches
// run here where available() (docs/gpu.md, "Expert GEMMs").
//
// One object per stream at a time (its tables and workspace are reused launch after launch, in
// stream order). Row-major operands throughout; hidden and ffn multiples of 8, every pointer
// 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_set>

#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/kernels/ffn_tables.h"

namespace feplb::cuda {

class GroupedFfn {
 public:
  // Whether grouped GEMMs run on the current device (this build's kernels need compute
  // capability 9.0: H100, H200).
  static bool available();
  // Whether a batch of `rows` rows over `items` items with rows runs faster here than as one
  // cuBLASLt GEMM per item and stage: yes unless the items are large (mean rows x hidden x ffn at
  // least that of 2048 rows of Qwen3-235B's experts, H 4096, F 1536). Measured on an H100
  // (docs/gpu-results.md, "Small experts"): grouped 0.22-0.82x the per-expert time up to 2048 rows
  // of Qwen3-30B's experts, 1.04-1.07x (forward) for 2048 rows of Qwen3-235B's and 4096 of
  // GLM-5's, where the per-expert launches hide behind the GEMMs.
  static bool faster_than_per_expert(int64_t hidden, int64_t ffn, int64_t rows, int64_t items);
  // Throws InputError where !available(), or where hidden or ffn is not a positive multiple of 8.
  GroupedFfn(int64_t hidden, int64_t ffn);

  // Enqueues the caller's kernels of items [begin, end) between two GEMM stages.
  using Stage = std::function<void(size_t begin, size_t end)>;

  // `swiglu` enqueues act = silu(gate) * up of the items it is given between the two GEMM stages
  // (batches of more than kFfnItemsPerLaunch items run in chunks). An item may have 0 rows.
  void forward(std::span<const kernels::FfnItem> items, const Stage& swiglu, cudaStream_t stream);
  // Each item's grad_class says its gradients' type and whether dW is added (beta 1) or written
  // (beta 0): kernels::weight_grad_class. Items touching the same gradient run in order (separate
  // rounds), as if one at a time. `swiglu_backward` enqueues dgu (into gu) from dact (in act) of
  // the items it is given. An item with 0 rows leaves its gradients as they are, or zeroes them
  // where it writes them.
  void backward(std::span<const kernels::FfnItem> items, const Stage& swiglu_backward,
                cudaStream_t stream);

  // Rows counted on the GPU (kernels::FfnBatch::rows_dev): item i has rows[i] rows from row
  // row0[i] of the packed buffers its x, gu, act, y (backward: dy) point at; `total` is their
  // sum as far as the host knows it (an upper bound), for the choice of tile.
  struct DeviceRows {
    const int32_t* rows = nullptr;  // [items] device
    const int32_t* row0 = nullptr;  // [items] device
    int64_t total = 0;
  };
  // forward() and backward() with the rows counted on the GPU: the host never reads a size. At
  // most kFfnItemsPerLaunch items, no two with the same gradient; `swiglu` (`swiglu_backward`) is
  // called once, for every row of the batch.
  void forward(std::span<const kernels::FfnItem> items, const DeviceRows& rows,
               const std::function<void()>& swiglu, cudaStream_t stream);
  void backward(std::span<const kernels::FfnItem> items, const DeviceRows& rows,
                const std::function<void()>& swiglu_backward, cudaStream_t stream);

  // Kernels enqueued so far: every kind (tables, grouped GEMMs, clears; not the caller's SwiGLU),
  // and the grouped GEMMs alone.
  int64_t launches() const { return launches_; }
  int64_t gemm_launches() const { return gemm_launches_; }
  // Device memory held (the stages' tables and the kernels' workspace).
  size_t device_bytes() const { return tables_mem_.bytes() + workspace_.bytes(); }

 private:
  // Fills batch_ with items [begin, end) (rows on the GPU: `dev`) and enqueues their tables;
  // returns the average rows of the items that have rows (to pick the tile family).
  double prepare(std::span<const kernels::FfnItem> items, size_t begin, size_t end, bool backward,
                 const DeviceRows* dev, cudaStream_t stream);
  size_t round_end(std::span<const kernels::FfnItem> items, size_t begin);
  // One round of backward() (items [begin, end), none sharing a gradient).
  void backward_round(std::span<const kernels::FfnItem> items, size_t begin, size_t end,
                      const DeviceRows* dev, const std::function<void()>& swiglu_backward,
                      cudaStream_t stream);
  void gemm(kernels::GroupedLayout layout, const kernels::GroupedTables& tables, int groups,
            bool d_f32, float beta, double avg_rows, cudaStream_t stream);

  int64_t hidden_, ffn_;
  int sm_count_ = 0;
  DeviceBuffer<unsigned char> tables_mem_, workspace_;
  kernels::FfnTables tables_{};
  std::unique_ptr<kernels::FfnBatch> batch_;  // 20 KiB: the tables kernel's parameter
  std::unordered_set<const void*> seen_;      // round_end's gradients of the round
  int64_t launches_ = 0, gemm_launches_ = 0;
};

}  // namespace feplb::cuda
