// Grouped bf16 GEMMs whose problem sizes live in device memory: G row-major products
//   D_g [m_g, n_g] = beta D_g + A_g [m_g, k_g] B_g [k_g, n_g]   (fp32 accumulation)
// in one launch, every group's sizes, pointers and leading dimensions read on the GPU from
// GroupedTables, so a kernel may write them and the host needs no count. Built on CUTLASS's
// Hopper grouped GEMM (TMA + WGMMA, persistent, sm_90a only; third_party/cutlass): the one door
// to it. The instantiations live in grouped_gemm_{nn,nt,tn}.cu, one translation unit per operand
// layout; nothing else includes CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace feplb::cuda::kernels {

// How A and B are stored (row-major) for D [m, n] = A [m, k] B [k, n].
enum class GroupedLayout : uint8_t {
  kNN,  // A [m, k], B [k, n]: the forward (x W)
  kNT,  // A [m, k], B stored [n, k]: data gradients (dY W^T)
  kTN,  // A stored [k, m], B [k, n]: weight gradients (X^T dY), the rows are k
};

// The kernel's tile family: kLarge (128 x 256 x 64, two cooperative warp groups) for groups of
// hundreds of rows and more; kSmallM (64 x 128 x 128, ping-pong) where the groups' m is about 128
// or less. kTN has kLarge only (its m and n are the expert's weight dimensions).
enum class GroupedTile : uint8_t { kLarge, kSmallM };

// The per-group tables a grouped GEMM reads, in device memory, G entries each. A group with m,
// n or k equal to 0 computes nothing and leaves its D as it is (with k = 0 and beta = 0 the
// caller clears D itself: ffn_clear_empty_weight_grads). A, B and D: 16-byte aligned; every
// leading dimension a multiple of 8 elements (bf16) or 4 (fp32 D).
struct GroupedTables {
  int32_t* sizes;  // [G, 3]: m, n, k
  const void** a;  // [G] bf16
  const void** b;  // [G] bf16
  void** d;        // [G] bf16 or fp32; also the C of beta D
  int64_t* lda;    // [G] elements between consecutive rows of A as stored
  int64_t* ldb;    // [G]
  int64_t* ldd;    // [G]
};

// Device bytes of one GroupedTables of `max_groups` entries (carve_grouped_tables lays them out).
size_t grouped_tables_bytes(int max_groups);
GroupedTables carve_grouped_tables(void* base, int max_groups);

struct GroupedGemmArgs {
  GroupedLayout layout = GroupedLayout::kNN;
  GroupedTile tile = GroupedTile::kLarge;
  bool d_f32 = false;  // D fp32 (kTN only), else bf16
  float beta = 0.0f;   // 0: D is written, never read; 1: D += A B
  int num_groups = 0;  // entries of `tables` used (<= its max_groups)
  GroupedTables tables{};
  void* workspace = nullptr;  // grouped_gemm_workspace_bytes(sm_count); one stream at a time
  int sm_count = 0;           // the device's SMs (the kernel is persistent: one CTA per SM)
};

// True where this build has the kernels and `device` runs them (compute capability 9.0).
bool grouped_gemm_available(int device);
// Workspace bytes any grouped GEMM of this file needs on a device of `sm_count` SMs (per-SM
// TMA descriptors that the kernel rewrites for each group).
size_t grouped_gemm_workspace_bytes(int sm_count);

// Enqueues one grouped GEMM on `s`. The host reads no size: the kernel's launch parameters are
// made once per (layout, tile, output, beta, group count, tables, workspace, device) and reused.
// cudaErrorNotSupported for a combination without a kernel (kNT/kNN with an fp32 D) or where
// grouped_gemm_available() is false.
cudaError_t grouped_gemm(const GroupedGemmArgs& args, cudaStream_t s);

// The per-layout entry points behind grouped_gemm (one translation unit each).
cudaError_t grouped_gemm_nn(const GroupedGemmArgs& args, cudaStream_t s);
cudaError_t grouped_gemm_nt(const GroupedGemmArgs& args, cudaStream_t s);
cudaError_t grouped_gemm_tn(const GroupedGemmArgs& args, cudaStream_t s);
size_t grouped_gemm_nn_workspace_bytes(int sm_count);
size_t grouped_gemm_nt_workspace_bytes(int sm_count);
size_t grouped_gemm_tn_workspace_bytes(int sm_count);

}  // namespace feplb::cuda::kernels
