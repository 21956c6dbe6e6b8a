// The MoE layer forward and backward on the GPU against the float64 host reference, for R
// virtual ranks on one GPU and every planner the GPU layer runs, with balancing on and off, and
// edge cases. Forward tolerance (bf16 inputs/weights, fp32 accumulation, bf16 intermediates and
// output): relative L2 error <= 1e-2 and max abs error <= 3% of the largest |reference| value.
// Backward (bf16 dY, d act and d gate|up on top of that; dW accumulated in fp32): every gradient
// within relative L2 <= 2e-2 and max abs <= 5% of the largest |reference| value. No NaN anywhere
// (outputs and gradients are poisoned with NaN first, so an unwritten row fails).
#include <gtest/gtest.h>

#include <numeric>

#include "feplb/sim/prior.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/cuda/trainer.h"
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

// R in {1, 2, 4, 8} x every policy the GPU layer runs; test names like ep4_feplb_paper.
auto RanksAndPolicies() {
  return ::testing::Combine(::testing::Values(1, 2, 4, 8),
                            ::testing::Values("static", "feplb-paper", "feplb", "oracle"));
}
std::string RankPolicyName(const ::testing::TestParamInfo<std::tuple<int, std::string>>& info) {
  std::string p = std::get<1>(info.param);
  std::replace(p.begin(), p.end(), '-', '_');
  return "ep" + std::to_string(std::get<0>(info.param)) + "_" + p;
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
                         RanksAndPolicies(), RankPolicyName);

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

// Edge cases of forward and backward: top_k, tokens per rank, skew, and a hot expert (-1: none).
struct EdgeCase {
  const char* name;
  int top_k;
  int64_t tokens;
  double skew;
  int hot;
};
const EdgeCase kEdgeCases[] = {{"zero tokens", 2, 0, 2.0, -1},
                               {"one token", 2, 1, 2.0, -1},
                               {"77 tokens (no tile multiple)", 3, 77, 4.0, -1},
                               {"every token to expert 5", 1, 64, 2.0, 5},
                               {"most experts empty", 2, 50, 15.0, -1}};

TEST(Layer, EdgeCases) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16;
  Rng rng(9);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  for (const EdgeCase& c : kEdgeCases) {
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


// ---- backward ---------------------------------------------------------------------------------

constexpr double kGradRelL2 = 2e-2, kGradMaxAbsFrac = 0.05;

std::vector<std::vector<float>> random_grad_out(uint64_t seed, const std::vector<RankInputs>& in) {
  Rng rng(seed);
  std::vector<std::vector<float>> g;
  for (const RankInputs& r : in) {
    std::vector<float> v(static_cast<size_t>(r.tokens * kHidden));
    for (float& x : v) x = round_to_bf16(static_cast<float>(rng.normal()));
    g.push_back(std::move(v));
  }
  return g;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& ref, const std::string& what) {
  const auto e = compare(got, ref);
  EXPECT_FALSE(e.has_nan) << what << ": unwritten (NaN) values";
  EXPECT_LE(e.rel_l2, kGradRelL2) << what;
  EXPECT_LE(e.max_abs, kGradMaxAbsFrac * std::max(e.ref_max, 1e-9)) << what;
}

// Every gradient of every layer and rank against the float64 reference backward: dL/dhidden and
// dL/dtopk_weight per rank; each expert's dL/dW summed over all ranks' tokens, on its home rank.
void expect_gradients_match(const std::vector<std::vector<testing::BackwardResult>>& got, const cuda::LayerConfig& c,
                            const ReferenceMoe& m, const std::vector<RankInputs>& in,
                            const std::vector<std::vector<float>>& grad_out, const std::string& what) {
  const int R = c.topo.num_ranks();
  std::vector<double> dw_total(m.weights.size(), 0.0);
  std::vector<ReferenceMoe::Grads> ref;
  for (int r = 0; r < R; ++r) {
    std::vector<double> go(grad_out[r].begin(), grad_out[r].end());
    ref.push_back(m.backward(in[r].hidden, in[r].topk_idx, in[r].topk_weight, go, in[r].tokens, c.top_k));
    for (size_t i = 0; i < dw_total.size(); ++i) dw_total[i] += ref[r].weights[i];
  }
  const size_t per_expert = static_cast<size_t>(3 * kHidden * kFfn);
  for (size_t l = 0; l < got.size(); ++l) {
    for (int r = 0; r < R; ++r) {
      const std::string at = what + " layer " + std::to_string(l) + " rank " + std::to_string(r);
      const auto fwd = m.forward(in[r].hidden, in[r].topk_idx, in[r].topk_weight, in[r].tokens, c.top_k);
      expect_close(got[l][r].out, fwd, at + " out");
      if (in[r].tokens > 0) {
        expect_close(got[l][r].grad_hidden, ref[r].hidden, at + " d hidden");
        expect_close(got[l][r].grad_topk_weight, ref[r].topk_weight, at + " d topk_weight");
      }
      std::vector<double> dw_ref;
      for (int e : c.topo.local_experts(r)) {
        dw_ref.insert(dw_ref.end(), dw_total.begin() + e * per_expert, dw_total.begin() + (e + 1) * per_expert);
      }
      bool any = false;
      for (double v : dw_ref) any = any || v != 0.0;
      if (any) expect_close(got[l][r].main_grad, dw_ref, at + " dW (gate|up and down)");
    }
  }
}

class LayerBackwardTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  void SetUp() override { FEPLB_SKIP_WITHOUT_GPU(); }
};

TEST_P(LayerBackwardTest, GradientsMatchFloat64Reference) {
  const auto [ranks, policy] = GetParam();
  const int experts = 32, top_k = 4;
  Rng rng(300 + ranks);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  const auto in = skewed_inputs(7 + ranks, ranks, experts, top_k, 96, 8.0);  // the forward test's inputs
  const auto go = random_grad_out(41 + ranks, in);
  const cuda::LayerConfig c = config_for(ranks, experts, top_k, 96, policy);
  const auto got = testing::run_layer_backward(c, m, in, go);
  expect_gradients_match(got, c, m, in, go, policy);
  int64_t guest_rows = 0;
  for (const auto& g : got[0]) guest_rows += g.stats.guest_rows;
  if (ranks > 1 && policy != "static") {
    EXPECT_GT(guest_rows, 0) << policy << ": skewed input but no guest backward";
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndPolicies, LayerBackwardTest,
                         RanksAndPolicies(), RankPolicyName);

// Two layers share one slot pool: the second layer's forward refills the slots the first one's
// guests used, so the first layer's backward must copy those weights again (and still be exact);
// the second layer's backward finds its weights in place.
TEST(LayerBackward, ReusedSlotsAreCopiedAgain) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  Rng rng(77);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  const auto in = skewed_inputs(78, ranks, experts, top_k, 128, 8.0);
  const auto go = random_grad_out(79, in);
  const cuda::LayerConfig c = config_for(ranks, experts, top_k, 128, "feplb");
  const auto got = testing::run_layer_backward(c, m, in, go, /*layers=*/2);
  expect_gradients_match(got, c, m, in, go, "two layers, one pool");
  int64_t recopies0 = 0, recopies1 = 0, guests = 0;
  for (int r = 0; r < ranks; ++r) {
    recopies0 += got[0][r].stats.weight_recopies;
    recopies1 += got[1][r].stats.weight_recopies;
    guests += got[0][r].stats.guest_rows;
  }
  ASSERT_GT(guests, 0) << "skewed input but nothing migrated: the test would prove nothing";
  EXPECT_GT(recopies0, 0) << "layer 0's slots were refilled by layer 1, yet nothing was copied again";
  EXPECT_EQ(recopies1, 0) << "layer 1's weights were still in its slots";
}

TEST(LayerBackward, BalancingOnAndOffAgree) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  Rng rng(55);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  const auto in = skewed_inputs(56, ranks, experts, top_k, 200, 6.0);
  const auto go = random_grad_out(57, in);
  const auto off = testing::run_layer_backward(config_for(ranks, experts, top_k, 200, "static"), m, in, go);
  const auto on = testing::run_layer_backward(config_for(ranks, experts, top_k, 200, "feplb"), m, in, go);
  for (int r = 0; r < ranks; ++r) {
    auto as_ref = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
    EXPECT_LE(compare(on[0][r].grad_hidden, as_ref(off[0][r].grad_hidden)).rel_l2, 5e-3) << "rank " << r;
    EXPECT_LE(compare(on[0][r].grad_topk_weight, as_ref(off[0][r].grad_topk_weight)).rel_l2, 5e-3) << "rank " << r;
    EXPECT_LE(compare(on[0][r].main_grad, as_ref(off[0][r].main_grad)).rel_l2, 5e-3) << "rank " << r;
  }
}

TEST(LayerBackward, EdgeCases) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16;
  Rng rng(19);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  for (const EdgeCase& k : kEdgeCases) {
    for (const char* policy : {"static", "feplb", "oracle"}) {
      const auto in = skewed_inputs(23, ranks, experts, k.top_k, k.tokens, k.skew, k.hot);
      const auto go = random_grad_out(24, in);
      const cuda::LayerConfig c = config_for(ranks, experts, k.top_k, std::max<int64_t>(k.tokens, 1), policy);
      expect_gradients_match(testing::run_layer_backward(c, m, in, go), c, m, in, go,
                             std::string(k.name) + " / " + policy);
    }
  }
}

TEST(LayerBackward, MisuseIsAClearError) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::InProcessGroup group(1);
  cuda::LayerConfig c = config_for(1, 4, 1, 8, "feplb");
  cuda::Stream s;
  cuda::DeviceBuffer<__nv_bfloat16> g(8 * kHidden), gx(8 * kHidden);
  cuda::DeviceBuffer<float> w(8), gw(8);
  {
    cuda::MoeLayer inference(c, group.endpoint(0));
    EXPECT_THROW(inference.backward(g.get(), w.get(), gx.get(), gw.get(), s.get()), InputError);
  }
  c.training = true;
  c.name = "training";
  cuda::MoeLayer layer(c, group.endpoint(0));
  EXPECT_THROW(layer.backward(g.get(), w.get(), gx.get(), gw.get(), s.get()), InputError);  // no forward yet
}

// A few Adam steps of a 2-layer residual MoE model: the loss falls, and balancing on gives the
// same loss curve as off (the same arithmetic on other GPUs, up to rounding).
TEST(Training, LossCurvesAgreeWithBalancingOnAndOff) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2, layers = 2;
  const int64_t tokens = 128;
  const auto in = skewed_inputs(61, ranks, experts, top_k, tokens, 6.0);
  cuda::TrainRouting routing(2);
  for (int mb = 0; mb < 2; ++mb) {
    for (int l = 0; l < layers; ++l) {
      const auto li = skewed_inputs(62 + 10 * mb + l, ranks, experts, top_k, tokens, 6.0);
      std::vector<std::vector<int32_t>> per_rank;
      for (const auto& r : li) per_rank.push_back(r.topk_idx);
      routing[mb].push_back(per_rank);
    }
  }
  auto run = [&](const std::string& policy) {
    cuda::TrainConfig t;
    t.layer = config_for(ranks, experts, top_k, tokens, policy);
    t.layers = layers;
    t.steps = 4;
    t.micro_batches = 2;
    t.lr = 2e-3f;
    return cuda::run_virtual_training(t, routing);
  };
  const auto off = run("static"), on = run("feplb");
  ASSERT_EQ(off.loss.size(), on.loss.size());
  EXPECT_GT(on.migrated_slices, 0) << "skewed routing but nothing migrated";
  for (size_t i = 0; i < off.loss.size(); ++i) {
    EXPECT_TRUE(std::isfinite(on.loss[i]) && std::isfinite(off.loss[i])) << "step " << i;
    EXPECT_NEAR(on.loss[i], off.loss[i], 1e-2 * off.loss[i]) << "step " << i;
  }
  EXPECT_LT(off.loss.back(), 0.98 * off.loss.front()) << "the loss did not fall: the gradients do not train";
  EXPECT_LT(on.loss.back(), 0.98 * on.loss.front());
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
