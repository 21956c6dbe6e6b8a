// The CUTLASS side of grouped_gemm.h: one kernel type per (operand layout, tile family, output
// type), and its launch with parameters made once and reused. Included only by
// grouped_gemm_{nn,nt,tn}.cu (compiled for sm_90a).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "feplb/cuda/kernels/grouped_gemm.h"
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda::kernels::grouped {

using cute::_1;
using cute::_128;
using cute::_2;
using cute::_256;
using cute::_64;
using cute::Shape;

// Our row-major words in CUTLASS's: A is m x k, B is n x k (CUTLASS's B is stored transposed in
// its own terms), D is m x n. RowMajor A: k contiguous; ColumnMajor A: m contiguous. RowMajor B:
// n contiguous (our B stored [k, n]); ColumnMajor B: k contiguous (our B stored [n, k]).
using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;

struct LargeTile {  // two consumer warp groups share a 128 x 256 tile; clusters of 2 along m
  using Tile = Shape<_128, _256, _64>;
  using Cluster = Shape<_2, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct SmallMTile {  // two warp groups alternate 64 x 128 tiles (one computes, one stores)
  using Tile = Shape<_64, _128, _128>;
  using Cluster = Shape<_2, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

template <class LayoutA, class LayoutB, class ElementD, class TileConfig>
struct Kernel {
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // m, n, k
  using Bf16 = cutlass::bfloat16_t;
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ElementD));
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename TileConfig::Tile,
      typename TileConfig::Cluster, cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      ElementD, RowMajor*, kAlignD, ElementD, RowMajor*, kAlignD, typename TileConfig::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA*, 8, Bf16, LayoutB*, 8,
      float, typename TileConfig::Tile, typename TileConfig::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      typename TileConfig::Kernel>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Params = typename Gemm::Params;

  // GroupedTables holds each stride as its one dynamic value (the leading dimension) and each
  // problem shape as three ints: what CUTLASS's types hold, checked here and at run time.
  static_assert(sizeof(StrideA) == sizeof(int64_t) && sizeof(StrideB) == sizeof(int64_t) &&
                sizeof(StrideD) == sizeof(int64_t));
  static_assert(sizeof(typename ProblemShape::UnderlyingProblemShape) == 3 * sizeof(int32_t));

  static typename Gemm::Arguments arguments(const GroupedGemmArgs& g, int device) {
    using Shapes = typename ProblemShape::UnderlyingProblemShape;
    const GroupedTables& t = g.tables;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {g.num_groups, reinterpret_cast<Shapes*>(t.sizes), nullptr},  // sizes on the device only
        {reinterpret_cast<const Bf16**>(t.a), reinterpret_cast<StrideA*>(t.lda),
         reinterpret_cast<const Bf16**>(t.b), reinterpret_cast<StrideB*>(t.ldb)},
        {{},
         const_cast<const ElementD**>(reinterpret_cast<ElementD**>(t.d)),
         reinterpret_cast<StrideD*>(t.ldd),
         reinterpret_cast<ElementD**>(t.d),
         reinterpret_cast<StrideD*>(t.ldd)}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = g.beta;
    args.epilogue.thread.alpha_ptr = nullptr;
    args.epilogue.thread.beta_ptr = nullptr;
    args.epilogue.thread.dAlpha = {cute::_0{}, cute::_0{}, 0};
    args.epilogue.thread.dBeta = {cute::_0{}, cute::_0{}, 0};
    args.hw_info.device_id = device;
    args.hw_info.sm_count = g.sm_count;
    return args;
  }

  static size_t workspace_bytes(int sm_count) {
    GroupedGemmArgs g;
    g.num_groups = 1;
    g.sm_count = sm_count;
    return Gemm::get_workspace_size(arguments(g, 0));
  }
};

// The one dynamic value of a CUTLASS stride and the three ints of a shape, where GroupedTables
// keeps them (checked once per kernel type: a CUTLASS release that stored them differently would
// make every kernel read wrong strides).
template <class Stride>
void set_dynamic(Stride& stride, int64_t ld) {
  if constexpr (cute::is_static_v<std::remove_cvref_t<decltype(cute::get<0>(stride))>>)
    cute::get<1>(stride) = ld;
  else
    cute::get<0>(stride) = ld;
}

template <class K>
bool tables_match_cutlass_types() {
  const int64_t ld = 0x1234567;
  typename K::StrideA sa{};
  typename K::StrideB sb{};
  typename K::StrideD sd{};
  set_dynamic(sa, ld);
  set_dynamic(sb, ld);
  set_dynamic(sd, ld);
  typename K::ProblemShape::UnderlyingProblemShape shape{3, 5, 7};
  const int32_t ints[3] = {3, 5, 7};
  return std::memcmp(&sa, &ld, 8) == 0 && std::memcmp(&sb, &ld, 8) == 0 &&
         std::memcmp(&sd, &ld, 8) == 0 && std::memcmp(&shape, ints, sizeof ints) == 0;
}

// Launch parameters by everything they are made from.
struct Key {
  const void* tables[7];
  void* workspace;
  int num_groups, sm_count, device;
  float beta;
  bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    const auto* p = reinterpret_cast<const unsigned char*>(&k);
    for (size_t i = 0; i < sizeof(Key); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

inline cudaError_t status_error(cutlass::Status st) {
  if (st == cutlass::Status::kSuccess) return cudaSuccess;
  const cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? e : cudaErrorLaunchFailure;
}

template <class K>
cudaError_t run(const GroupedGemmArgs& g, cudaStream_t s) {
  if (g.num_groups <= 0) return cudaSuccess;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  Key key{};
  const GroupedTables& t = g.tables;
  const void* ptrs[7] = {t.sizes, t.a, t.b, t.d, t.lda, t.ldb, t.ldd};
  std::memcpy(key.tables, ptrs, sizeof ptrs);
  key.workspace = g.workspace;
  key.num_groups = g.num_groups;
  key.sm_count = g.sm_count;
  key.device = device;
  key.beta = g.beta;
  static std::mutex mu;
  static std::unordered_map<Key, typename K::Params, KeyHash> made;
  static const bool layout_ok = tables_match_cutlass_types<K>();
  if (!layout_ok) return cudaErrorNotSupported;
  typename K::Params params;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = made.find(key);
    if (it == made.end()) {
      typename K::Gemm gemm;
      const auto args = K::arguments(g, device);
      if (K::Gemm::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
      // Sets the kernel's shared-memory limit (per device) and makes the TMA descriptors that
      // the kernel rewrites for each group.
      if (cudaError_t e = status_error(gemm.initialize(args, g.workspace, s)); e != cudaSuccess)
        return e;
      if (made.size() > 4096) made.clear();  // bounded: runtimes made and dropped in one process
      it = made.emplace(key, gemm.params()).first;
    }
    params = it->second;
  }
  return status_error(K::Gemm::run(params, s));
}

// The __global__ function CUTLASS launches for kernel type K (kernels.h, load_kernels).
template <class K>
const void* kernel_of() {
  return reinterpret_cast<const void*>(cutlass::device_kernel<typename K::GemmKernel>);
}

// A layout's two tile families (grouped_gemm_nn.cu, grouped_gemm_nt.cu): bf16 D only.
template <class Large, class SmallM>
cudaError_t run_tiles(const GroupedGemmArgs& g, cudaStream_t s) {
  if (g.d_f32) return cudaErrorNotSupported;
  return g.tile == GroupedTile::kSmallM ? run<SmallM>(g, s) : run<Large>(g, s);
}
template <class Large, class SmallM>
size_t tiles_workspace_bytes(int sm_count) {
  return std::max(Large::workspace_bytes(sm_count), SmallM::workspace_bytes(sm_count));
}

}  // namespace feplb::cuda::kernels::grouped
