#include "feplb/cuda/gemm/gemm.h"

#include <bit>
#include <chrono>
#include <mutex>

#include "feplb/cuda/base/check.h"

namespace feplb::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Largest power of two (<= 256) dividing every operand's address: cuBLASLt's algorithms differ
// in the alignment they need, and the rows of a slice start anywhere a row does.
uint32_t alignment(const void* a, const void* b, const void* c) {
  const auto bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                    reinterpret_cast<uintptr_t>(c) | uintptr_t{256};
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// Row counts rounded up to 1/8 of their power of two (multiples of 128 in (1024, 2048], ...), at
// least 64: about 8 algorithms per doubling, each picked for at most 1/8 more rows than it runs.
// (Whole powers of two measured 16% slower on skewed expert sizes: an algorithm tuned for 2048
// rows running 1100.)
int64_t bucket_of(int64_t m) {
  if (m <= 64) return 64;
  const int64_t step = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(m))) / 8;
  return (m + step - 1) / step * step;
}

using Key = GemmEngine::Key;

Key key_of(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, bool c_f32, uint32_t align,
           int device) {
  return {m, n, k,
          static_cast<uint32_t>((trans_a << 0) | (trans_b << 1) | (c_f32 << 2)) | (align << 8) |
              (static_cast<uint32_t>(device) << 20)};
}

void set_layout(cublasLtMatrixLayout_t l, cudaDataType_t type, uint64_t rows, uint64_t cols,
                int64_t ld) {
  FEPLB_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof(type)));
  FEPLB_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows)));
  FEPLB_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols)));
  FEPLB_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld)));
}

}  // namespace

GemmEngine::Shared& GemmEngine::shared() {
  static Shared s;
  return s;
}

bool GemmEngine::find(const std::unordered_map<Key, cublasLtMatmulAlgo_t, KeyHash>& map,
                      const Key& key, cublasLtMatmulAlgo_t* algo) {
  std::shared_lock<std::shared_mutex> lock(shared().mu);
  const auto it = map.find(key);
  if (it == map.end()) return false;
  *algo = it->second;
  return true;
}

GemmEngine::GemmEngine(bool workspace) : workspace_(workspace ? kWorkspaceBytes : 0) {
  FEPLB_CUDA_CHECK(cudaGetDevice(&device_));
  FEPLB_CUBLAS_CHECK(cublasLtCreate(&lt_));
  FEPLB_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  FEPLB_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_));
  const uint64_t ws = kWorkspaceBytes;
  FEPLB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  FEPLB_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, 1, 1, 1));
  FEPLB_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, 1, 1, 1));
  FEPLB_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_, CUDA_R_16BF, 1, 1, 1));
}

GemmEngine::~GemmEngine() {
  if (a_) cublasLtMatrixLayoutDestroy(a_);
  if (b_) cublasLtMatrixLayoutDestroy(b_);
  if (c_) cublasLtMatrixLayoutDestroy(c_);
  if (pref_) cublasLtMatmulPreferenceDestroy(pref_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  if (lt_) cublasLtDestroy(lt_);
}

// Column-major view of the row-major problem: C^T [n, m] = op(B)^T [n, k] * op(A)^T [k, m]; so
// cuBLASLt's first operand is our B (stored [n, k] col-major, or [k, n] transposed) and its
// second our A (stored [k, m], or [m, k] transposed).
void GemmEngine::set_shape(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                           bool c_f32) {
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  FEPLB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                    sizeof(op_first)));
  FEPLB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                    sizeof(op_second)));
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  if (trans_b)
    set_layout(a_, CUDA_R_16BF, u(k), u(n), k);
  else
    set_layout(a_, CUDA_R_16BF, u(n), u(k), n);
  if (trans_a)
    set_layout(b_, CUDA_R_16BF, u(m), u(k), m);
  else
    set_layout(b_, CUDA_R_16BF, u(k), u(m), k);
  set_layout(c_, c_f32 ? CUDA_R_32F : CUDA_R_16BF, u(n), u(m), n);
}

bool GemmEngine::query(cublasLtMatmulAlgo_t* algo) {
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ++queries_;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_, b_, c_, c_, pref_, 1, &result, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) return false;
  FEPLB_CUBLAS_CHECK(st);
  *algo = result.algo;
  return true;
}

void GemmEngine::run(cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, const __nv_bfloat16* a, const __nv_bfloat16* b, void* c, bool c_f32,
                     float beta, bool rows_in_k) {
  if (m == 0 || n == 0) return;
  ++launches_;
  const float one = 1.0f;
  const uint32_t align = alignment(a, b, c);
  auto matmul = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(lt_, desc_, &one, b, a_, a, b_, &beta, c, c_, c, c_, &algo,
                          workspace_.get(), workspace_.bytes(), stream);
  };
  Shared& sh = shared();
  const Key ekey = key_of(m, n, k, trans_a, trans_b, c_f32, align, device_);
  cublasLtMatmulAlgo_t algo{};
  if (find(sh.exact, ekey, &algo)) {
    set_shape(trans_a, trans_b, m, n, k, c_f32);
    FEPLB_CUBLAS_CHECK(matmul(algo));
    return;
  }
  if (queued_.emplace(ekey, true).second)
    pending_.push_back({ekey, trans_a, trans_b, c_f32, m, n, k});
  const int64_t bm = rows_in_k ? m : bucket_of(m), bk = rows_in_k ? bucket_of(k) : k;
  const Key bkey = key_of(bm, n, bk, trans_a, trans_b, c_f32, align, device_);
  bool have = find(sh.bucket, bkey, &algo);
  if (!have) {
    set_alignment(align);
    set_shape(trans_a, trans_b, bm, n, bk, c_f32);
    if ((have = query(&algo))) {
      std::unique_lock<std::shared_mutex> lock(sh.mu);
      sh.bucket.emplace(bkey, algo);
    }
  }
  set_shape(trans_a, trans_b, m, n, k, c_f32);
  if (have && matmul(algo) == CUBLAS_STATUS_SUCCESS) return;
  // The bucket's algorithm does not take this shape: the exact shape's own, now.
  set_alignment(align);
  FEPLB_CHECK(query(&algo), "cuBLASLt has no algorithm for a {}x{}x{} bf16 GEMM", m, n, k);
  {
    std::unique_lock<std::shared_mutex> lock(sh.mu);
    sh.exact.emplace(ekey, algo);
  }
  FEPLB_CUBLAS_CHECK(matmul(algo));
}

void GemmEngine::refine(double budget_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!pending_.empty()) {
    if (budget_ms >= 0 &&
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() >=
            budget_ms) {
      return;
    }
    const Shape shape = pending_.back();
    pending_.pop_back();
    refine_shape(shape);
  }
}

void GemmEngine::take_pending(std::vector<Shape>& out) {
  out.insert(out.end(), pending_.begin(), pending_.end());
  pending_.clear();
}

bool GemmEngine::refine_shape(const Shape& shape) {
  Shared& sh = shared();
  cublasLtMatmulAlgo_t algo{};
  if (find(sh.exact, shape.key, &algo)) return false;  // another engine chose it meanwhile
  set_alignment((shape.key.flags >> 8) & 0xfff);
  set_shape(shape.trans_a, shape.trans_b, shape.m, shape.n, shape.k, shape.c_f32);
  if (query(&algo)) {  // else the bucket's stays in use
    std::unique_lock<std::shared_mutex> lock(sh.mu);
    sh.exact.emplace(shape.key, algo);
  }
  return true;
}

void GemmEngine::set_alignment(uint32_t align) {
  for (cublasLtMatmulPreferenceAttributes_t attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    FEPLB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_, attr, &align, sizeof(align)));
  }
}

}  // namespace feplb::cuda
