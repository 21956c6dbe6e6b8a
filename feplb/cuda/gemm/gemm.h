// GemmEngine: the bf16 GEMMs of the expert FFNs through cuBLASLt, without a heuristic query on
// the critical path.
//
// An expert's row count changes every micro-batch, and cuBLAS picks an algorithm per exact shape:
// each shape it has not seen costs a heuristic query on the host (tens to hundreds of
// microseconds; a layer meets hundreds of new row counts per step, forward and backward, and the
// layer's host thread then falls behind its GPU: measured 20-60 ms instead of 8 ms per forward).
// The engine keeps every exact shape's algorithm it has ever chosen (no eviction: a model has a
// few GEMM kinds x the row counts it meets). A shape not known yet runs at once with the
// algorithm of its bucket (row counts rounded up to 1/8 of their power of two, at least 64; one
// query per bucket) and is queued; the algorithms are shared by every engine of the process (the
// layers of a rank have the same shapes: the first layer's queries serve all); refine() asks the
// heuristic for queued shapes when the caller has time to spare; the layer hands them to a
// GemmRefiner instead (gemm/refiner.h), which asks on a thread of its own: a query costs
// 100-300 us of host time, and new row counts appear every micro-batch. Bucket algorithms
// measured 5-10% slower than exact ones on skewed expert sizes, so the exact one takes over from
// the next use. The row count is m (activations, dX) or k (weight gradients: rows are the
// reduction); keys also carry the other dimensions, the transposes, the output type and the
// operands' alignment.
//
// One engine per stream at a time (it owns one workspace). Row-major operands throughout.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "feplb/cuda/base/resources.h"

namespace feplb::cuda {

class GemmEngine {
 public:
  // `workspace`: allocate the 32 MiB GEMM workspace (an engine that only chooses algorithms, a
  // GemmRefiner's, needs none).
  explicit GemmEngine(bool workspace = true);
  ~GemmEngine();
  GemmEngine(const GemmEngine&) = delete;
  GemmEngine& operator=(const GemmEngine&) = delete;

  // Row-major C [m, n] = beta C + op(A) [m, k] * op(B) [k, n]; op(A) = A^T when trans_a (A stored
  // [k, m]), likewise B (stored [n, k] when trans_b). A, B bf16; C bf16, or fp32 when c_f32.
  // fp32 accumulation. m == 0 or n == 0: nothing. `rows_in_k`: the row count that changes from
  // call to call is k (else m).
  void run(cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           const __nv_bfloat16* a, const __nv_bfloat16* b, void* c, bool c_f32, float beta,
           bool rows_in_k = false);

  // Chooses exact algorithms for queued shapes for at most `budget_ms` of host time (< 0: all).
  void refine(double budget_ms);
  int64_t pending() const { return static_cast<int64_t>(pending_.size()); }
  // Heuristic queries so far (for tests and benchmarks: it stops growing once warm).
  int64_t heuristic_queries() const { return queries_; }
  // GEMMs enqueued so far.
  int64_t launches() const { return launches_; }

  struct Key {
    int64_t m, n, k;
    uint32_t flags;  // transposes, output type, alignment, device
    bool operator==(const Key&) const = default;
  };
  // A shape queued for its exact algorithm.
  struct Shape {
    Key key;
    bool trans_a, trans_b, c_f32;
    int64_t m, n, k;
  };
  // Moves the queued shapes to the end of `out` (a GemmRefiner takes them); this engine does not
  // queue them again.
  void take_pending(std::vector<Shape>& out);
  // Asks the heuristic for `shape`'s exact algorithm with this engine's descriptors and adds it to
  // the process's table, unless some engine chose it already. False: no query was needed.
  bool refine_shape(const Shape& shape);
  struct KeyHash {
    size_t operator()(const Key& x) const {
      uint64_t h = static_cast<uint64_t>(x.m) * 0x9E3779B97F4A7C15ull;
      h ^= static_cast<uint64_t>(x.n) + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
      h ^= static_cast<uint64_t>(x.k) + 0x85EBCA77C2B2AE63ull + (h << 6) + (h >> 2);
      h ^= static_cast<uint64_t>(x.flags) + 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
      return static_cast<size_t>(h);
    }
  };

 private:
  void set_shape(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, bool c_f32);
  bool query(cublasLtMatmulAlgo_t* algo);
  void set_alignment(uint32_t align);

  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  DeviceBuffer<unsigned char> workspace_;
  // The process's algorithms: buckets' and exact shapes', every engine's (thread-safe).
  struct Shared {
    std::shared_mutex mu;
    std::unordered_map<Key, cublasLtMatmulAlgo_t, KeyHash> bucket, exact;
  };
  static Shared& shared();
  static bool find(const std::unordered_map<Key, cublasLtMatmulAlgo_t, KeyHash>& map,
                   const Key& key, cublasLtMatmulAlgo_t* algo);
  int device_ = 0;
  std::unordered_map<Key, bool, KeyHash> queued_;  // shapes this engine queued for refine()
  std::vector<Shape> pending_;
  int64_t queries_ = 0;
  int64_t launches_ = 0;
};

}  // namespace feplb::cuda
