// The MoE layer forward on the GPU against the float64 host reference, for R virtual ranks on
// one GPU and every planner the GPU layer runs, with balancing on and off, and edge cases.
// Tolerance (bf16 inputs/weights, fp32 accumulation, bf16 intermediates and output): relative L2
// error <= 1e-2 and max abs error <= 3% of the largest |reference| value; no NaN (outputs are
// poisoned with NaN before every forward, so an unwritten row fails).
#include <gtest/gtest.h>

#include <numeric>

#include "feplb/core/prior.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/dist/launch.h"
#include "gpu_test_util.h"

namespace feplb {
namespace {

using testing::compare;
using testing::random_experts;
using testing::random_rank_inputs;
using testing::RankInputs;
using testing::run_layer;

constexpr int64_t kHidden = 256, kFfn = 128;
constexpr double kRelL2 = 1e-2, kMaxAbsFrac = 0.03;

cuda::LayerConfig config_for(int ranks, int experts, int top_k, int64_t max_tokens, const std::string& policy) {
  cuda::LayerConfig c;
  c.topo = Topology::contiguous(ranks, 8, experts);
  c.shape = ExpertShape{kHidden, kFfn, Dtype::kBf16};
  c.top_k = top_k;
  c.max_tokens = max_tokens;
  c.policy = policy;
  // Tiny experts make every copy "slow" next to its GEMM; test the mechanics, not the timing.
  c.knobs.copy_timing = 0;
  c.knobs.min_slice_rows = 8;
  c.knobs.slice_align_rows = 8;
  c.knobs.tau = 0;
  c.knobs.balance_tolerance = 0;
  c.knobs.max_num_dyn = experts;  // the oracle may use many helpers
  c.timeout_s = 30;
  return c;
}

void expect_matches_reference(const std::vector<testing::RankResult>& got, const ReferenceMoe& experts,
                              const std::vector<RankInputs>& in, int top_k, const std::string& what) {
  for (size_t r = 0; r < in.size(); ++r) {
    const auto ref = experts.forward(in[r].hidden, in[r].topk_idx, in[r].topk_weight, in[r].tokens, top_k);
    const auto e = compare(got[r].out, ref);
    EXPECT_FALSE(e.has_nan) << what << " rank " << r << ": unwritten (NaN) outputs";
    EXPECT_LE(e.rel_l2, kRelL2) << what << " rank " << r;
    EXPECT_LE(e.max_abs, kMaxAbsFrac * std::max(e.ref_max, 1e-6)) << what << " rank " << r;
  }
}

std::vector<RankInputs> skewed_inputs(uint64_t seed, int ranks, int experts, int top_k, int64_t tokens,
                                      double skew, int hot_expert = -1) {
  Rng rng(seed);
  const Prior p = lognormal_prior(experts, skew, 1, seed);
  std::vector<RankInputs> in;
  for (int r = 0; r < ranks; ++r) {
    in.push_back(random_rank_inputs(rng, tokens, kHidden, experts, top_k, p.popularity[0], hot_expert));
  }
  return in;
}

class LayerTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  void SetUp() override { FEPLB_SKIP_WITHOUT_GPU(); }
};

TEST_P(LayerTest, ForwardMatchesFloat64Reference) {
  const auto [ranks, policy] = GetParam();
  const int experts = 32, top_k = 4;
  Rng rng(100 + ranks);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  const auto in = skewed_inputs(7 + ranks, ranks, experts, top_k, 96, 8.0);
  const auto got = run_layer(config_for(ranks, experts, top_k, 96, policy), m, in, /*forwards=*/2);
  expect_matches_reference(got, m, in, top_k, policy);
  int64_t copies = 0;
  for (const auto& g : got) copies += g.stats.copies;
  if (ranks > 1 && policy != "static") {
    EXPECT_GT(copies, 0) << policy << ": skewed input but nothing moved";
  }
  if (policy == "static") {
    EXPECT_EQ(copies, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndPolicies, LayerTest,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8),
                                            ::testing::Values("static", "feplb-paper", "feplb", "oracle")),
                         [](const auto& param_info) {
                           std::string p = std::get<1>(param_info.param);
                           std::replace(p.begin(), p.end(), '-', '_');
                           return "ep" + std::to_string(std::get<0>(param_info.param)) + "_" + p;
                         });

TEST(Layer, BalancingOnAndOffAgree) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  Rng rng(5);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  const auto in = skewed_inputs(11, ranks, experts, top_k, 200, 6.0);
  const auto off = run_layer(config_for(ranks, experts, top_k, 200, "static"), m, in);
  const auto on = run_layer(config_for(ranks, experts, top_k, 200, "feplb"), m, in);
  for (int r = 0; r < ranks; ++r) {
    std::vector<double> ref(off[r].out.begin(), off[r].out.end());
    const auto e = compare(on[r].out, ref);
    EXPECT_LE(e.rel_l2, 5e-3) << "rank " << r;
  }
}

TEST(Layer, EdgeCases) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16;
  Rng rng(9);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  struct Case {
    const char* name;
    int top_k;
    int64_t tokens;
    double skew;
    int hot;
  };
  for (const Case& c : {Case{"zero tokens", 2, 0, 2.0, -1}, Case{"one token", 2, 1, 2.0, -1},
                        Case{"77 tokens (no tile multiple)", 3, 77, 4.0, -1},
                        Case{"every token to expert 5", 1, 64, 2.0, 5},
                        Case{"most experts empty", 2, 50, 15.0, -1}}) {
    for (const char* policy : {"static", "feplb", "oracle"}) {
      const auto in = skewed_inputs(3, ranks, experts, c.top_k, c.tokens, c.skew, c.hot);
      const auto got = run_layer(config_for(ranks, experts, c.top_k, std::max<int64_t>(c.tokens, 1), policy), m, in, 2);
      expect_matches_reference(got, m, in, c.top_k, std::string(c.name) + " / " + policy);
    }
  }
}

TEST(Layer, APeerThatNeverArrivesIsAnErrorNotAHang) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::LayerConfig c = config_for(2, 4, 1, 8, "feplb");
  c.timeout_s = 1.0;
  cuda::InProcessGroup group(2, c.timeout_s);
  std::string error;
  std::thread rank1([&] { cuda::MoeLayer layer(c, group.endpoint(1)); });  // registers, then leaves
  {
    cuda::MoeLayer layer(c, group.endpoint(0));
    rank1.join();
    cuda::Stream s;
    cuda::DeviceBuffer<__nv_bfloat16> x(8 * kHidden), out(8 * kHidden);
    cuda::DeviceBuffer<int32_t> idx(8);
    cuda::DeviceBuffer<float> w(8);
    FEPLB_CUDA_CHECK(cudaMemset(idx.get(), 0, idx.bytes()));
    try {
      layer.forward(x.get(), idx.get(), w.get(), 8, out.get(), s.get());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  EXPECT_NE(error.find("never arrived"), std::string::npos) << error;
}

TEST(Layer, RejectsBadConfigurationClearly) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::InProcessGroup group(1);
  cuda::LayerConfig c = config_for(1, 4, 1, 8, "fastermoe");
  EXPECT_THROW(cuda::MoeLayer(c, group.endpoint(0)), InputError);
  c = config_for(1, 4, 1, 8, "feplb");
  c.shape.hidden = 100;  // not a multiple of 8
  EXPECT_THROW(cuda::MoeLayer(c, group.endpoint(0)), InputError);
}

}  // namespace
}  // namespace feplb

namespace feplb {
namespace {

// The NCCL path with one process (world 1, no launcher environment): bootstrap through the
// rendezvous, then the layer with the NCCL transport against the reference.
TEST(Layer, NcclTransportWithOneRankMatchesReference) {
  FEPLB_SKIP_WITHOUT_GPU();
  dist::LaunchEnv env;  // single process
  cuda::NcclCommunicator comm(env, 30);
  auto transport = comm.transport();
  const int experts = 8, top_k = 2;
  Rng rng(21);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  const auto in = skewed_inputs(4, 1, experts, top_k, 64, 3.0);
  cuda::LayerConfig c = config_for(1, experts, top_k, 64, "feplb");
  cuda::MoeLayer layer(c, *transport);
  cuda::Stream s;
  const auto x16 = testing::to_bf16(in[0].hidden);
  std::vector<float> local;
  for (int e = 0; e < experts; ++e) local.insert(local.end(), m.expert_weights(e), m.expert_weights(e) + 3 * kHidden * kFfn);
  const auto w16 = testing::to_bf16(local);
  cuda::DeviceBuffer<__nv_bfloat16> w(w16.size()), x(x16.size()), out(x16.size());
  cuda::DeviceBuffer<int32_t> idx(in[0].topk_idx.size());
  cuda::DeviceBuffer<float> wt(in[0].topk_weight.size());
  FEPLB_CUDA_CHECK(cudaMemcpy(w.get(), w16.data(), w16.size() * 2, cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(cudaMemcpy(x.get(), x16.data(), x16.size() * 2, cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(cudaMemcpy(idx.get(), in[0].topk_idx.data(), idx.bytes(), cudaMemcpyHostToDevice));
  FEPLB_CUDA_CHECK(cudaMemcpy(wt.get(), in[0].topk_weight.data(), wt.bytes(), cudaMemcpyHostToDevice));
  layer.set_weights(w.get(), s.get());
  FEPLB_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out.bytes(), s.get()));
  layer.forward(x.get(), idx.get(), wt.get(), 64, out.get(), s.get());
  cuda::sync_with_timeout(s.get(), 30, "nccl forward");
  std::vector<uint16_t> o16(x16.size());
  FEPLB_CUDA_CHECK(cudaMemcpy(o16.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> o(o16.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = bf16_to_float(o16[i]);
  std::vector<testing::RankResult> got(1);
  got[0].out = o;
  expect_matches_reference(got, m, in, top_k, "nccl world 1");
}

}  // namespace
}  // namespace feplb
