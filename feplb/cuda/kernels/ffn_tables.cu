// The expert FFN's grouped-GEMM tables (ffn_tables.h) and the clearing of empty experts' weight
// gradients.
#include "feplb/cuda/kernels/ffn_tables.h"
#include "feplb/cuda/kernels/kernels.h"

namespace feplb::cuda::kernels {
namespace {

__device__ void put(const GroupedTables& t, int g, int32_t m, int32_t n, int32_t k, const void* a,
                    int64_t lda, const void* b, int64_t ldb, void* d, int64_t ldd) {
  t.sizes[3 * g + 0] = m;
  t.sizes[3 * g + 1] = n;
  t.sizes[3 * g + 2] = k;
  t.a[g] = a;
  t.b[g] = b;
  t.d[g] = d;
  t.lda[g] = lda;
  t.ldb[g] = ldb;
  t.ldd[g] = ldd;
}

// One thread per item. Sizes are m, n, k of D [m, n] = A [m, k] B [k, n]; leading dimensions in
// elements of the stored matrices (H = hidden, F = ffn; every buffer of an item is packed).
__global__ void ffn_tables_kernel(const FfnBatch batch, bool backward, const FfnTables t) {
  const int i = static_cast<int>(threadIdx.x);
  if (i >= batch.count) return;
  FfnItem it = batch.items[i];
  const int32_t H = batch.hidden, F = batch.ffn;
  if (batch.rows_dev) {  // rows counted on the GPU: this item's rows of the packed buffers
    it.rows = batch.rows_dev[i];
    const int64_t r0 = batch.row0_dev[i];
    it.x += r0 * H;
    it.gu += r0 * 2 * F;
    it.act += r0 * F;
    it.y += r0 * H;
    if (it.dy) it.dy += r0 * H;
  }
  const int32_t rows = it.rows;
  if (!backward) {
    put(t.gate_up, i, rows, 2 * F, H, it.x, H, it.w_gate_up, 2 * F, it.gu, 2 * F);  // [rows, 2F]
    put(t.down, i, rows, H, F, it.act, F, it.w_down, H, it.y, H);                   // [rows, H]
    return;
  }
  // dact [rows, F] = dY [rows, H] W_down^T (W_down stored [F, H]: B as [n, k]).
  put(t.data_down, i, rows, F, H, it.dy, H, it.w_down, H, it.act, F);
  // dX [rows, H] = dgu [rows, 2F] W_gate_up^T (W_gate_up stored [H, 2F]: B as [n, k]).
  put(t.data_gate_up, i, rows, H, 2 * F, it.gu, 2 * F, it.w_gate_up, 2 * F, it.y, H);
  // The weight gradients, in the item's class at its rank among the class's items. k = rows;
  // with no rows the group gets m = 0 (CUTLASS would leave its accumulators unset).
  int pos = 0;
  for (int j = 0; j < i; ++j) pos += batch.items[j].grad_class == it.grad_class;
  const int c = it.grad_class;
  const int32_t m_down = rows > 0 ? F : 0, m_gate_up = rows > 0 ? H : 0;
  // g_down [F, H] (+)= act^T [F, rows] dY [rows, H] (act stored [rows, F]: A as [k, m]).
  put(t.weight_down[c], pos, m_down, H, rows, it.act, F, it.dy, H, it.g_down, H);
  // g_gate_up [H, 2F] (+)= x^T [H, rows] dgu [rows, 2F].
  put(t.weight_gate_up[c], pos, m_gate_up, 2 * F, rows, it.x, H, it.gu, 2 * F, it.g_gate_up, 2 * F);
}

// blockIdx.y: the item; each block clears a strided part of its two gradients (elements of
// `elem` bytes, 16 bytes per store).
__global__ void clear_empty_kernel(const FfnBatch batch, int grad_class, int elem) {
  const FfnItem& it = batch.items[blockIdx.y];
  const int32_t rows = batch.rows_dev ? batch.rows_dev[blockIdx.y] : it.rows;
  if (rows != 0 || it.grad_class != grad_class) return;
  const int64_t H = batch.hidden, F = batch.ffn;
  const int64_t words_gu = 2 * H * F * elem / 16, words_d = H * F * elem / 16;
  uint4* gu = static_cast<uint4*>(it.g_gate_up);
  uint4* d = static_cast<uint4*>(it.g_down);
  const uint4 zero{0, 0, 0, 0};
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < words_gu;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    gu[w] = zero;
    if (w < words_d) d[w] = zero;
  }
}

}  // namespace

cudaError_t ffn_tables(const FfnBatch& batch, bool backward, const FfnTables& t, cudaStream_t s) {
  if (batch.count <= 0) return cudaSuccess;
  if (batch.count > kFfnItemsPerLaunch) return cudaErrorInvalidValue;
  ffn_tables_kernel<<<1, kFfnItemsPerLaunch, 0, s>>>(batch, backward, t);
  return cudaGetLastError();
}

cudaError_t ffn_clear_empty_weight_grads(const FfnBatch& batch, int grad_class, cudaStream_t s) {
  if (batch.count <= 0) return cudaSuccess;
  if (batch.count > kFfnItemsPerLaunch || grad_class < 0 || grad_class >= kWeightGradClasses)
    return cudaErrorInvalidValue;
  const int elem = grad_class >= 2 ? 4 : 2;  // weight_grad_class: fp32 classes are 2 and 3
  const dim3 grid(64, static_cast<unsigned>(batch.count));
  clear_empty_kernel<<<grid, 256, 0, s>>>(batch, grad_class, elem);
  return cudaGetLastError();
}

cudaError_t load_ffn_tables_kernels() {
  return load_kernels({reinterpret_cast<const void*>(ffn_tables_kernel),
                       reinterpret_cast<const void*>(clear_empty_kernel)});
}

}  // namespace feplb::cuda::kernels
