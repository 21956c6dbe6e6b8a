// The expert FFN's grouped-GEMM tables: one small kernel turns a batch of experts (or slices of
// an expert's rows) into the GroupedTables of every GEMM stage of the batch, forward or backward,
// so that each stage is one grouped GEMM however many experts the batch has (grouped_gemm.h).
// The batch travels as the kernel's parameter (no host-to-device copy, nothing the host must keep
// alive after the launch). Raw pointers and a stream in, the launch's cudaError_t out.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "feplb/cuda/kernels/grouped_gemm.h"

namespace feplb::cuda::kernels {

using bf16 = __nv_bfloat16;

// One expert (or one slice of an expert's rows) of a batch: its rows' operands, row-major.
struct FfnItem {
  const bf16* x;          // [rows, H]: the input (backward: the forward's input)
  const bf16* w_gate_up;  // [H, 2F]: gate | up
  const bf16* w_down;     // [F, H]
  bf16* gu;               // [rows, 2F]: x W_gate_up (backward: overwritten by d gate|up)
  bf16* act;              // [rows, F]: silu(gate) * up (backward: overwritten by d act)
  bf16* y;                // [rows, H]: forward out; backward dX
  const bf16* dy;         // [rows, H]: backward only
  void* g_gate_up;        // [H, 2F]: backward dW (fp32 or bf16: the item's weight-gradient class)
  void* g_down;           // [F, H]
  int32_t rows;
  uint8_t grad_class;  // backward: which weight-gradient tables (kWeightGradClasses)
  uint8_t pad_[3];
};

// Items of one launch of ffn_tables (the batch is the kernel's parameter: 20 KiB of 32).
constexpr int kFfnItemsPerLaunch = 256;
// Weight-gradient classes: one grouped GEMM per class and stage, each with one output type and
// one beta (fp32 or bf16 gradients, written or added to).
constexpr int kWeightGradClasses = 4;
inline constexpr int weight_grad_class(bool f32, bool accumulate) {
  return (f32 ? 2 : 0) + (accumulate ? 1 : 0);
}

// Rows counted on the GPU: with `rows_dev` set, item i has rows_dev[i] rows starting at row
// row0_dev[i] of its buffers (x, gu, act, y, dy point at row 0 of packed buffers), and its `rows`
// field is not read. Nothing of the batch's sizes is then known on the host.
struct FfnBatch {
  int32_t count = 0;  // items used, <= kFfnItemsPerLaunch
  int32_t hidden = 0, ffn = 0;
  const int32_t* rows_dev = nullptr;  // [count] device
  const int32_t* row0_dev = nullptr;  // [count] device
  FfnItem items[kFfnItemsPerLaunch];
};

// The tables of a batch's stages. Forward: gate_up (gu = x W_gate_up, kNN) and down
// (y = act W_down, kNN). Backward: weight_down[c] (g_down (+)= act^T dY, kTN), data_down
// (dact = dY W_down^T, kNT), weight_gate_up[c] (g_gate_up (+)= x^T dgu, kTN) and data_gate_up
// (dX = dgu W_gate_up^T, kNT). Entries follow the batch's item order; a weight-gradient class
// lists its items in order, and an item with 0 rows gets m = 0 there (nothing computed).
struct FfnTables {
  GroupedTables gate_up, down;
  GroupedTables data_down, data_gate_up;
  GroupedTables weight_down[kWeightGradClasses], weight_gate_up[kWeightGradClasses];
};

// Writes `t`'s forward (or backward) tables for `batch`. grid: one block.
cudaError_t ffn_tables(const FfnBatch& batch, bool backward, const FfnTables& t, cudaStream_t s);

// Zeroes g_gate_up and g_down of the items of weight-gradient class `grad_class` that have no
// rows (a grouped GEMM with k = 0 writes nothing; with beta 0 the gradient must read 0).
// grid: (chunks, items); blocks of other items return at once.
cudaError_t ffn_clear_empty_weight_grads(const FfnBatch& batch, int grad_class, cudaStream_t s);

}  // namespace feplb::cuda::kernels
