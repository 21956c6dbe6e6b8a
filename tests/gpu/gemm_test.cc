// GemmEngine (cuBLASLt, one algorithm per bucket of row counts) against a float64 host product,
// for every transpose combination, bf16 and fp32 outputs, beta 0 and 1, and row counts across
// bucket boundaries (odd ones included); and the heuristic is asked once per bucket, not per row
// count; a GemmRefiner chooses exact algorithms on its own thread. Tolerance: bf16 inputs are
// exact in double; fp32 accumulation -> relative error of the product <= 1e-2 for bf16 outputs
// (rounding of the result), <= 1e-4 for fp32 outputs.
#include "feplb/cuda/gemm/gemm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "feplb/core/bf16.h"
#include "feplb/core/rng.h"
#include "feplb/cuda/gemm/refiner.h"
#include "gpu_test_util.h"

namespace feplb {
namespace {

struct Case {
  bool ta, tb, f32;
  float beta;
};

TEST(GemmEngine, MatchesFloat64AcrossBucketsAndTransposes) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::GemmEngine gemm;
  cuda::Stream stream;
  Rng rng(3);
  const int64_t n = 72, k = 40;
  for (const Case c :
       {Case{false, false, false, 0.f}, Case{false, true, false, 0.f}, Case{true, false, true, 1.f},
        Case{true, true, true, 0.f}, Case{false, false, true, 1.f}}) {
    for (int64_t m : {1, 7, 63, 64, 65, 100, 127, 128, 129, 257}) {
      // For weight-gradient-like calls the row count is k: vary it too.
      const bool rows_in_k = c.ta && !c.tb;
      const int64_t M = rows_in_k ? 48 : m, K = rows_in_k ? m : k;
      std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * n)),
          c0(static_cast<size_t>(M * n));
      for (float& x : a) x = round_to_bf16(static_cast<float>(rng.normal()));
      for (float& x : b) x = round_to_bf16(static_cast<float>(rng.normal()));
      for (float& x : c0) x = c.f32 ? static_cast<float>(rng.normal()) : 0.f;
      // Stored layouts: A [M, K] or, transposed, [K, M]; B [K, n] or [n, K].
      auto at = [&](int64_t i, int64_t l) { return c.ta ? a[l * M + i] : a[i * K + l]; };
      auto bt = [&](int64_t l, int64_t j) { return c.tb ? b[j * K + l] : b[l * n + j]; };
      std::vector<double> ref(static_cast<size_t>(M * n));
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = c.beta * c0[i * n + j];
          for (int64_t l = 0; l < K; ++l) s += static_cast<double>(at(i, l)) * bt(l, j);
          ref[i * n + j] = s;
        }
      }
      const auto a16 = testing::to_bf16(a), b16 = testing::to_bf16(b);
      cuda::DeviceBuffer<__nv_bfloat16> da(a16.size()), db(b16.size()), dc16(c0.size());
      cuda::DeviceBuffer<float> dc32(c0.size());
      FEPLB_CUDA_CHECK(cudaMemcpy(da.get(), a16.data(), da.bytes(), cudaMemcpyHostToDevice));
      FEPLB_CUDA_CHECK(cudaMemcpy(db.get(), b16.data(), db.bytes(), cudaMemcpyHostToDevice));
      void* out = c.f32 ? static_cast<void*>(dc32.get()) : static_cast<void*>(dc16.get());
      // The bucket's algorithm the first time (odd row counts), the exact one after refine().
      for (const char* algo : {"bucket's", "exact"}) {
        FEPLB_CUDA_CHECK(cudaMemcpy(dc32.get(), c0.data(), dc32.bytes(), cudaMemcpyHostToDevice));
        gemm.run(stream.get(), c.ta, c.tb, M, n, K, da.get(), db.get(), out, c.f32, c.beta,
                 rows_in_k);
        cuda::sync_with_timeout(stream.get(), 30, "gemm");
        gemm.refine(-1);
        std::vector<float> got(c0.size());
        if (c.f32) {
          FEPLB_CUDA_CHECK(
              cudaMemcpy(got.data(), dc32.get(), dc32.bytes(), cudaMemcpyDeviceToHost));
        } else {
          std::vector<uint16_t> g16(c0.size());
          FEPLB_CUDA_CHECK(
              cudaMemcpy(g16.data(), dc16.get(), dc16.bytes(), cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < g16.size(); ++i) got[i] = bf16_to_float(g16[i]);
        }
        const auto e = testing::compare(got, ref);
        EXPECT_LE(e.rel_l2, c.f32 ? 1e-4 : 1e-2) << algo << " algorithm: ta " << c.ta << " tb "
                                                 << c.tb << " f32 " << c.f32 << " rows " << m;
      }
    }
  }
}

TEST(GemmEngine, AsksTheHeuristicOncePerBucketNotPerRowCount) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::GemmEngine gemm;
  cuda::Stream stream;
  const int64_t n = 136, k = 72,
                max_m = 256;  // a shape no other test uses (the cache is process-wide)
  cuda::DeviceBuffer<__nv_bfloat16> a(static_cast<size_t>(max_m * k)),
      b(static_cast<size_t>(k * n)), c(static_cast<size_t>(max_m * n));
  FEPLB_CUDA_CHECK(cudaMemset(a.get(), 0, a.bytes()));
  FEPLB_CUDA_CHECK(cudaMemset(b.get(), 0, b.bytes()));
  for (int64_t m = 129; m <= 256; ++m)
    gemm.run(stream.get(), false, false, m, n, k, a.get(), b.get(), c.get(), false, 0.f);
  cuda::sync_with_timeout(stream.get(), 30, "gemm");
  // (128, 256] is 4 buckets of 32 rows: 128 row counts, 4 algorithms (a refused shape adds one).
  EXPECT_LE(gemm.heuristic_queries(), 6) << "128 row counts should share the 4 buckets' algorithms";
  EXPECT_EQ(gemm.pending(), 128) << "every new row count is queued for its exact algorithm";
  gemm.refine(-1);
  EXPECT_EQ(gemm.pending(), 0);
  const int64_t after_refine = gemm.heuristic_queries();
  for (int64_t m = 129; m <= 256; ++m)
    gemm.run(stream.get(), false, false, m, n, k, a.get(), b.get(), c.get(), false, 0.f);
  cuda::sync_with_timeout(stream.get(), 30, "gemm");
  EXPECT_EQ(gemm.heuristic_queries(), after_refine) << "known shapes must not query again";
  EXPECT_EQ(gemm.pending(), 0);
}

}  // namespace
// A GemmRefiner takes an engine's new shapes and chooses their exact algorithms on its own
// thread: the engine then runs them without asking the heuristic, and the results are right.
TEST(GemmRefiner, ChoosesExactAlgorithmsInTheBackground) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::GemmEngine gemm;
  cuda::GemmRefiner refiner;
  cuda::Stream stream;
  const int64_t n = 152, k = 88, max_m = 96;  // a shape no other test uses
  std::vector<float> a(static_cast<size_t>(max_m * k)), b(static_cast<size_t>(k * n));
  Rng rng(11);
  for (float& x : a) x = round_to_bf16(static_cast<float>(rng.normal()));
  for (float& x : b) x = round_to_bf16(static_cast<float>(rng.normal()));
  const auto a16 = testing::to_bf16(a), b16 = testing::to_bf16(b);
  cuda::DeviceBuffer<__nv_bfloat16> da(a16.size()), db(b16.size()),
      dc(static_cast<size_t>(max_m * n));
  FEPLB_CUDA_CHECK(cudaMemcpy(da.get(), a16.data(), da.bytes(), cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(cudaMemcpy(db.get(), b16.data(), db.bytes(), cudaMemcpyHostToDevice));
  for (int64_t m = 65; m <= 72; ++m)
    gemm.run(stream.get(), false, false, m, n, k, da.get(), db.get(), dc.get(), false, 0.f);
  ASSERT_EQ(gemm.pending(), 8);
  refiner.take(gemm);
  EXPECT_EQ(gemm.pending(), 0) << "the refiner took the queued shapes";
  refiner.drain();
  // Each new row count needs one query unless the engine asked for it already (a bucket algorithm
  // that refused the shape).
  EXPECT_GT(refiner.queries(), 0);
  EXPECT_LE(refiner.queries(), 8);
  const int64_t queries = gemm.heuristic_queries();
  for (int64_t m = 65; m <= 72; ++m) {
    gemm.run(stream.get(), false, false, m, n, k, da.get(), db.get(), dc.get(), false, 0.f);
    std::vector<uint16_t> c16(static_cast<size_t>(m * n));
    FEPLB_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    FEPLB_CUDA_CHECK(cudaMemcpy(c16.data(), dc.get(), c16.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> got(c16.size());
    std::vector<double> ref(c16.size());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < k; ++l) acc += static_cast<double>(a[i * k + l]) * b[l * n + j];
        ref[i * n + j] = acc;
        got[i * n + j] = bf16_to_float(c16[i * n + j]);
      }
    }
    EXPECT_LE(testing::compare(got, ref).rel_l2, 1e-2) << "rows " << m;
  }
  EXPECT_EQ(gemm.heuristic_queries(), queries) << "exact algorithms known: no query";
  EXPECT_EQ(gemm.pending(), 0);
}

}  // namespace feplb
