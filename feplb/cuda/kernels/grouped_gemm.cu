// grouped_gemm.h's dispatch and table layout (no CUTLASS here: the kernels are instantiated in
// grouped_gemm_{nn,nt,tn}.cu, compiled for sm_90a).
#include <algorithm>

#include "feplb/cuda/kernels/grouped_gemm.h"
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

constexpr size_t kAlign = 256;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

size_t grouped_tables_bytes(int max_groups) {
  const auto g = static_cast<size_t>(max_groups);
  return round_up(3 * g * sizeof(int32_t)) + 3 * round_up(g * sizeof(void*)) +
         3 * round_up(g * sizeof(int64_t));
}

GroupedTables carve_grouped_tables(void* base, int max_groups) {
  const auto g = static_cast<size_t>(max_groups);
  auto* p = static_cast<unsigned char*>(base);
  const auto take = [&](size_t bytes) {
    void* at = p;
    p += round_up(bytes);
    return at;
  };
  GroupedTables t;
  t.sizes = static_cast<int32_t*>(take(3 * g * sizeof(int32_t)));
  t.a = static_cast<const void**>(take(g * sizeof(void*)));
  t.b = static_cast<const void**>(take(g * sizeof(void*)));
  t.d = static_cast<void**>(take(g * sizeof(void*)));
  t.lda = static_cast<int64_t*>(take(g * sizeof(int64_t)));
  t.ldb = static_cast<int64_t*>(take(g * sizeof(int64_t)));
  t.ldd = static_cast<int64_t*>(take(g * sizeof(int64_t)));
  return t;
}

bool grouped_gemm_available(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;  // the sm_90a kernels run on compute capability 9.0 only
}

size_t grouped_gemm_workspace_bytes(int sm_count) {
  return std::max({grouped_gemm_nn_workspace_bytes(sm_count),
                   grouped_gemm_nt_workspace_bytes(sm_count),
                   grouped_gemm_tn_workspace_bytes(sm_count)});
}

cudaError_t grouped_gemm(const GroupedGemmArgs& args, cudaStream_t s) {
  switch (args.layout) {
    case GroupedLayout::kNN:
      return grouped_gemm_nn(args, s);
    case GroupedLayout::kNT:
      return grouped_gemm_nt(args, s);
    case GroupedLayout::kTN:
      return grouped_gemm_tn(args, s);
  }
  return cudaErrorInvalidValue;
}

// kernels.h: the grouped GEMMs only where this GPU runs them (they are built for sm_90a alone).
cudaError_t load_all() {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const bool grouped = grouped_gemm_available(device);
  for (cudaError_t (*load)() : {load_permute_kernels, load_swiglu_combine_kernels,
                                load_backward_kernels, load_ffn_tables_kernels}) {
    if (const cudaError_t e = load(); e != cudaSuccess) return e;
  }
  if (!grouped) return cudaSuccess;
  for (cudaError_t (*load)() :
       {load_grouped_gemm_nn_kernels, load_grouped_gemm_nt_kernels, load_grouped_gemm_tn_kernels}) {
    if (const cudaError_t e = load(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace feplb::cuda::kernels
