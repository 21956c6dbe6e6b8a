// Grouped GEMMs D [m, n] = A [m, k] B [k, n], A and B stored row-major, bf16 D: the expert FFN's
// forward (gate|up and down). grouped_gemm.h says what they compute.
#include "feplb/cuda/kernels/grouped_gemm_impl.cuh"

namespace feplb::cuda::kernels {
namespace g = grouped;
using GroupedNnLarge = g::Kernel<g::RowMajor, g::RowMajor, cutlass::bfloat16_t, g::LargeTile>;
using GroupedNnSmallM = g::Kernel<g::RowMajor, g::RowMajor, cutlass::bfloat16_t, g::SmallMTile>;

cudaError_t grouped_gemm_nn(const GroupedGemmArgs& args, cudaStream_t s) {
  return g::run_tiles<GroupedNnLarge, GroupedNnSmallM>(args, s);
}

size_t grouped_gemm_nn_workspace_bytes(int sm_count) {
  return g::tiles_workspace_bytes<GroupedNnLarge, GroupedNnSmallM>(sm_count);
}

cudaError_t load_grouped_gemm_nn_kernels() {
  return load_kernels({g::kernel_of<GroupedNnLarge>(), g::kernel_of<GroupedNnSmallM>()});
}

}  // namespace feplb::cuda::kernels
