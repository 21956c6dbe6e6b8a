// Grouped GEMMs D [m, n] (+)= A^T B with A stored [k, m] and B stored [k, n], D bf16 or fp32:
// the expert FFN's weight gradients (g_down = act^T dY, g_gate_up = X^T dgu; k is the expert's
// rows). grouped_gemm.h says what they compute.
#include "feplb/cuda/kernels/grouped_gemm_impl.cuh"

namespace feplb::cuda::kernels {
namespace g = grouped;
using GroupedTnBf16 = g::Kernel<g::ColumnMajor, g::RowMajor, cutlass::bfloat16_t, g::LargeTile>;
using GroupedTnF32 = g::Kernel<g::ColumnMajor, g::RowMajor, float, g::LargeTile>;

cudaError_t grouped_gemm_tn(const GroupedGemmArgs& args, cudaStream_t s) {
  return args.d_f32 ? g::run<GroupedTnF32>(args, s) : g::run<GroupedTnBf16>(args, s);
}

size_t grouped_gemm_tn_workspace_bytes(int sm_count) {
  return std::max(GroupedTnBf16::workspace_bytes(sm_count),
                  GroupedTnF32::workspace_bytes(sm_count));
}

cudaError_t load_grouped_gemm_tn_kernels() {
  return load_kernels({g::kernel_of<GroupedTnBf16>(), g::kernel_of<GroupedTnF32>()});
}

}  // namespace feplb::cuda::kernels
