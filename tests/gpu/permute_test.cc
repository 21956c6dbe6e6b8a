// The dispatch layout kernels (count_experts, send_offsets, scatter_rows) against a host model:
// every pair's send row is its expert's first row in send order plus the number of earlier pairs
// routed to that expert (token order within an expert), rows copied there, out-of-range ids
// counted apart and not copied. Exact integer and bit comparisons, on fresh random routings.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "feplb/core/rng.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/kernels/kernels.h"
#include "gpu_test_util.h"

namespace feplb {
namespace {

struct Case {
  int64_t tokens;
  int top_k, experts;
  int hot;           // >= 0: every token's first choice
  int out_of_range;  // pairs given an id outside [0, E)
};

// Runs the three kernels on a routing from `seed` and compares them with the host model.
void check_layout(const Case& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << ", top-" << c.top_k << ", "
                                    << c.experts << " experts, hot " << c.hot << ", "
                                    << c.out_of_range << " out of range, seed " << seed);
  constexpr int64_t kHidden = 16;  // 2 words of 16 bytes per row
  const int E = c.experts;
  const int64_t P = c.tokens * c.top_k;
  Rng rng(seed);
  const auto below = [&](int64_t n) {
    return static_cast<int32_t>(
        std::min<int64_t>(static_cast<int64_t>(rng.uniform() * static_cast<double>(n)), n - 1));
  };
  std::vector<int32_t> idx(static_cast<size_t>(P));
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int k = 0; k < c.top_k; ++k) {
      idx[t * c.top_k + k] = k == 0 && c.hot >= 0 ? c.hot : below(E);
    }
  }
  for (int i = 0; i < c.out_of_range && P > 0; ++i) {
    idx[below(P)] = i % 2 ? -1 - i : E + i;
  }
  std::vector<int32_t> order(static_cast<size_t>(E));  // a send order other than the ids'
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  std::vector<uint16_t> hidden(static_cast<size_t>(c.tokens * kHidden));
  for (uint16_t& h : hidden) h = static_cast<uint16_t>(below(65536));

  // The host model.
  std::vector<int32_t> counts(static_cast<size_t>(E + 1), 0), first(static_cast<size_t>(E), 0);
  for (int32_t e : idx) ++counts[e >= 0 && e < E ? e : E];
  for (int p = 0, row = 0; p < E; ++p) {
    first[order[p]] = row;
    row += counts[order[p]];
  }
  std::vector<int32_t> want_pos(static_cast<size_t>(P)), seen(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < P; ++i) {
    const int32_t e = idx[i];
    want_pos[i] = e >= 0 && e < E ? first[e] + seen[e]++ : -1;
  }

  cuda::DeviceBuffer<int32_t> d_idx(std::max<size_t>(idx.size(), 1)),
      d_counts(static_cast<size_t>(E + 1)), d_order(order.size()), d_offsets(order.size()),
      d_chunks(static_cast<size_t>(cuda::kernels::kMaxChunks * E)),
      d_pos(std::max<size_t>(idx.size(), 1));
  cuda::DeviceBuffer<__nv_bfloat16> d_hidden(std::max<size_t>(hidden.size(), 1)),
      d_send(std::max<size_t>(static_cast<size_t>(P * kHidden), 1));
  FEPLB_CUDA_CHECK(cudaMemcpy(d_idx.get(), idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(
      cudaMemcpy(d_order.get(), order.data(), order.size() * 4, cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(
      cudaMemcpy(d_hidden.get(), hidden.data(), hidden.size() * 2, cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(cudaMemset(d_counts.get(), 0, d_counts.bytes()));
  FEPLB_CUDA_CHECK(cudaMemset(d_send.get(), 0xff, d_send.bytes()));
  cuda::Stream s;
  FEPLB_CUDA_CHECK(cuda::kernels::count_experts(d_idx.get(), P, E, d_counts.get(), d_chunks.get(),
                                                d_pos.get(), s.get()));
  FEPLB_CUDA_CHECK(cuda::kernels::send_offsets(d_counts.get(), d_order.get(), E, P, d_offsets.get(),
                                               d_chunks.get(), s.get()));
  FEPLB_CUDA_CHECK(cuda::kernels::scatter_rows(d_hidden.get(), d_idx.get(), c.tokens, c.top_k, E,
                                               kHidden, d_chunks.get(), d_send.get(), d_pos.get(),
                                               s.get()));
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  std::vector<int32_t> got_counts(counts.size()), got_first(first.size()), got_pos(idx.size());
  std::vector<uint16_t> send(static_cast<size_t>(P * kHidden));
  FEPLB_CUDA_CHECK(
      cudaMemcpy(got_counts.data(), d_counts.get(), got_counts.size() * 4, cudaMemcpyDeviceToHost));
  FEPLB_CUDA_CHECK(
      cudaMemcpy(got_first.data(), d_offsets.get(), got_first.size() * 4, cudaMemcpyDeviceToHost));
  FEPLB_CUDA_CHECK(
      cudaMemcpy(got_pos.data(), d_pos.get(), got_pos.size() * 4, cudaMemcpyDeviceToHost));
  FEPLB_CUDA_CHECK(cudaMemcpy(send.data(), d_send.get(), send.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got_counts, counts);
  EXPECT_EQ(got_first, first);
  int64_t wrong_pos = 0, wrong_rows = 0;
  for (int64_t i = 0; i < P; ++i) {
    wrong_pos += got_pos[i] != want_pos[i];
    if (want_pos[i] < 0) continue;
    const uint16_t* from = hidden.data() + (i / c.top_k) * kHidden;
    wrong_rows += !std::equal(from, from + kHidden, send.data() + want_pos[i] * kHidden);
  }
  EXPECT_EQ(wrong_pos, 0) << "pairs whose send row is not token order within their expert";
  EXPECT_EQ(wrong_rows, 0) << "rows not copied to their send row";
}

TEST(DispatchLayout, RowsKeepTokenOrderWithinEachExpert) {
  FEPLB_SKIP_WITHOUT_GPU();
  const Case cases[] = {
      {0, 8, 64, -1, 0},        // no tokens
      {1, 1, 4, -1, 0},         // one pair
      {33, 2, 8, 3, 0},         // a partial warp, one hot expert
      {4096, 8, 128, 5, 0},     // 32768 pairs: 128 chunks of 256
      {1000, 8, 256, -1, 17},   // ids outside [0, E): counted apart, not copied
      {12000, 8, 64, 0, 3},     // 96000 pairs: more than 256 chunks of 256 (longer chunks)
      {40000, 8, 8192, -1, 0},  // the most experts the GPU layer takes
      {2048, 6, 1, -1, 0},      // one expert
  };
  uint64_t seed = std::random_device{}();  // fresh inputs each run; the trace names the seed
  for (const Case& c : cases) check_layout(c, seed++);
}

}  // namespace
}  // namespace feplb
