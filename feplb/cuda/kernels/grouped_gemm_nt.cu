// Grouped GEMMs D [m, n] = A [m, k] B^T with A stored [m, k] and B stored [n, k], bf16 D: the
// expert FFN's data gradients (dact = dY W_down^T, dX = dgu W_gate_up^T). grouped_gemm.h says
// what they compute.
#include "feplb/cuda/kernels/grouped_gemm_impl.cuh"

namespace feplb::cuda::kernels {
namespace g = grouped;
using GroupedNtLarge = g::Kernel<g::RowMajor, g::ColumnMajor, cutlass::bfloat16_t, g::LargeTile>;
using GroupedNtSmallM = g::Kernel<g::RowMajor, g::ColumnMajor, cutlass::bfloat16_t, g::SmallMTile>;

cudaError_t grouped_gemm_nt(const GroupedGemmArgs& args, cudaStream_t s) {
  return g::run_tiles<GroupedNtLarge, GroupedNtSmallM>(args, s);
}

size_t grouped_gemm_nt_workspace_bytes(int sm_count) {
  return g::tiles_workspace_bytes<GroupedNtLarge, GroupedNtSmallM>(sm_count);
}

cudaError_t load_grouped_gemm_nt_kernels() {
  return load_kernels({g::kernel_of<GroupedNtLarge>(), g::kernel_of<GroupedNtSmallM>()});
}

}  // namespace feplb::cuda::kernels
