// The MoE layer forward and backward on the GPU against the float64 host reference, for R
// virtual ranks on one GPU and every planner the GPU layer runs, with balancing on and off, and
// edge cases. Forward tolerance (bf16 inputs/weights, fp32 accumulation, bf16 intermediates and
// output): relative L2 error <= 1e-2 and max abs error <= 3% of the largest |reference| value.
// Backward (bf16 dY, d act and d gate|up on top of that; dW accumulated in fp32): every gradient
// within relative L2 <= 2e-2 and max abs <= 5% of the largest |reference| value. No NaN anywhere
// (outputs and gradients are poisoned with NaN first, so an unwritten row fails).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include "bench/harness/local_experts.h"
#include "bench/harness/rank_threads.h"
#include "bench/harness/trainer.h"
#include "feplb/cuda/base/check.h"
#include "feplb/cuda/gemm/grouped_ffn.h"
#include "feplb/cuda/nccl_comm.h"
#include "feplb/dist/launch.h"
#include "feplb/sim/prior.h"
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

testing::LayerSetup config_for(int ranks, int experts, int top_k, int64_t max_tokens,
                               const std::string& policy) {
  testing::LayerSetup setup;
  cuda::RuntimeConfig& c = setup.runtime;
  c.topo = Topology::contiguous(ranks, 8, experts);
  c.shape = ExpertShape{kHidden, kFfn, Dtype::kBf16};
  c.max_top_k = top_k;
  c.max_tokens = max_tokens;
  // Tiny experts make every copy "slow" next to its GEMM; test the mechanics, not the timing.
  c.knobs.copy_timing = 0;
  // feplb's two-phase path balancing rows, unless a test sets the mode (the chooser's: "auto").
  c.knobs.one_hop = 0;
  c.knobs.prefetch = 0;
  c.knobs.time_balance_budget = 0;
  c.knobs.min_slice_rows = 8;
  c.knobs.slice_align_rows = 8;
  c.knobs.tau = 0;
  c.knobs.balance_tolerance = 0;
  c.knobs.max_num_dyn = experts;  // the oracle may use many helpers
  c.timeout_s = 30;
  // The knobs' time: the same plans on every run (modes compared at the time measured on the host
  // move with its speed; TheDefaultMeasuresItsPlannerOnThisHost tests it).
  c.measure_planner = false;
  setup.policy = policy;
  setup.top_k = top_k;
  return setup;
}

void expect_matches_reference(const std::vector<testing::RankResult>& got,
                              const ReferenceMoe& experts, const std::vector<RankInputs>& in,
                              int top_k, const std::string& what) {
  for (size_t r = 0; r < in.size(); ++r) {
    const auto ref =
        experts.forward(in[r].hidden, in[r].topk_idx, in[r].topk_weight, in[r].tokens, top_k);
    const auto e = compare(got[r].out, ref);
    EXPECT_FALSE(e.has_nan) << what << " rank " << r << ": unwritten (NaN) outputs";
    EXPECT_LE(e.rel_l2, kRelL2) << what << " rank " << r;
    EXPECT_LE(e.max_abs, kMaxAbsFrac * std::max(e.ref_max, 1e-6)) << what << " rank " << r;
  }
}

std::vector<RankInputs> skewed_inputs(uint64_t seed, int ranks, int experts, int top_k,
                                      int64_t tokens, double skew, int hot_expert = -1) {
  Rng rng(seed);
  const Prior p = lognormal_prior(experts, skew, 1, seed);
  std::vector<RankInputs> in;
  for (int r = 0; r < ranks; ++r) {
    in.push_back(
        random_rank_inputs(rng, tokens, kHidden, experts, top_k, p.popularity[0], hot_expert));
  }
  return in;
}

// `experts` random experts of the test's shape, from `seed`.
ReferenceMoe experts_for(uint64_t seed, int experts) {
  Rng rng(seed);
  return random_experts(rng, kHidden, kFfn, experts);
}

// A parameterised test that needs a GPU.
template <typename Param>
class GpuTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override { FEPLB_SKIP_WITHOUT_GPU(); }
};

// One rank's device buffers for a forward of `tokens` tokens: hidden rows, outputs, expert ids
// (every token to expert 0) and router weights.
struct TokenBuffers {
  explicit TokenBuffers(int64_t n) : tokens(n), x(n * kHidden), out(n * kHidden), idx(n), wt(n) {
    FEPLB_CUDA_CHECK(cudaMemset(idx.get(), 0, idx.bytes()));
  }
  cuda::MicroBatch forward(cuda::MoeLayer& layer, const cuda::LocalExperts& w, cudaStream_t s) {
    return layer.forward(w.params(), x.get(), idx.get(), wt.get(), tokens, out.get(), s);
  }
  int64_t tokens;
  cuda::DeviceBuffer<__nv_bfloat16> x, out;
  cuda::DeviceBuffer<int32_t> idx;
  cuda::DeviceBuffer<float> wt;
};

// Rank 0 of a one-rank runtime: the reference's weights of its experts and `in`'s tokens on the
// device, and the forward's outputs read back (result()).
struct RankZeroForward {
  RankZeroForward(const ReferenceMoe& m, const Topology& topo, const RankInputs& in, int experts,
                  bool grads = false)
      : w(experts, kHidden, kFfn, grads),
        x(in.hidden.size()),
        out(in.hidden.size()),
        idx(in.topk_idx.size()),
        wt(in.topk_weight.size()) {
    const auto x16 = testing::to_bf16(in.hidden);
    const auto w16 = testing::to_bf16(testing::local_weights(m, topo, 0));
    FEPLB_CUDA_CHECK(cudaMemcpy(w.weights(), w16.data(), w16.size() * 2, cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(cudaMemcpy(x.get(), x16.data(), x16.size() * 2, cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(
        cudaMemcpy(idx.get(), in.topk_idx.data(), idx.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(
        cudaMemcpy(wt.get(), in.topk_weight.data(), wt.bytes(), cudaMemcpyHostToDevice));
  }
  void forward(cuda::MoeLayer& layer, int64_t tokens, cudaStream_t s) {
    layer.forward(w.params(), x.get(), idx.get(), wt.get(), tokens, out.get(), s);
  }
  std::vector<testing::RankResult> result() const {
    std::vector<uint16_t> o16(out.size());
    FEPLB_CUDA_CHECK(cudaMemcpy(o16.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
    std::vector<testing::RankResult> got(1);
    for (uint16_t v : o16) got[0].out.push_back(bf16_to_float(v));
    return got;
  }
  cuda::LocalExperts w;
  cuda::DeviceBuffer<__nv_bfloat16> x, out;
  cuda::DeviceBuffer<int32_t> idx;
  cuda::DeviceBuffer<float> wt;
};

// The float64 reference's weight gradient (`dw_total`, every expert's) of rank r's experts.
std::vector<double> local_dw(const Topology& topo, int r, const std::vector<double>& dw_total) {
  const size_t per_expert = static_cast<size_t>(3 * kHidden * kFfn);
  std::vector<double> dw_ref;
  for (int e : topo.local_experts(r)) {
    dw_ref.insert(dw_ref.end(), dw_total.begin() + e * per_expert,
                  dw_total.begin() + (e + 1) * per_expert);
  }
  return dw_ref;
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

class LayerTest : public GpuTest<std::tuple<int, std::string>> {};

TEST_P(LayerTest, ForwardMatchesFloat64Reference) {
  const auto [ranks, policy] = GetParam();
  const int experts = 32, top_k = 4;
  const ReferenceMoe m = experts_for(100 + ranks, experts);
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

INSTANTIATE_TEST_SUITE_P(RanksAndPolicies, LayerTest, RanksAndPolicies(), RankPolicyName);

TEST(Layer, BalancingOnAndOffAgree) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(5, experts);
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
  const ReferenceMoe m = experts_for(9, experts);
  for (const EdgeCase& c : kEdgeCases) {
    for (const char* policy : {"static", "feplb", "oracle"}) {
      const auto in = skewed_inputs(3, ranks, experts, c.top_k, c.tokens, c.skew, c.hot);
      const auto got = run_layer(
          config_for(ranks, experts, c.top_k, std::max<int64_t>(c.tokens, 1), policy), m, in, 2);
      expect_matches_reference(got, m, in, c.top_k, std::string(c.name) + " / " + policy);
    }
  }
}

TEST(Layer, APeerThatNeverArrivesIsAnErrorNotAHang) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::RuntimeConfig c = config_for(2, 4, 1, 8, "feplb").runtime;
  c.timeout_s = 1.0;
  c.training = false;
  cuda::InProcessGroup group(2, c.timeout_s);
  std::string error;
  std::thread rank1([&] { cuda::EpRuntime rt(c, group.endpoint(1)); });  // registers, then leaves
  {
    cuda::EpRuntime rt(c, group.endpoint(0));
    cuda::MoeLayer layer(rt, {1, "alone"}, cuda::make_gpu_planner(rt, "feplb"));
    rank1.join();
    cuda::LocalExperts w(2, kHidden, kFfn, false);
    cuda::Stream s;
    TokenBuffers b(8);
    try {
      b.forward(layer, w, s.get());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  EXPECT_NE(error.find("never arrived"), std::string::npos) << error;
}

TEST(Layer, RejectsBadConfigurationClearly) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::InProcessGroup group(1);
  cuda::RuntimeConfig c = config_for(1, 4, 1, 8, "feplb").runtime;
  c.training = false;
  {
    cuda::EpRuntime rt(c, group.endpoint(0));
    EXPECT_THROW(cuda::make_gpu_planner(rt, "fastermoe"), InputError);
    EXPECT_THROW(cuda::make_gpu_planner(rt, "no-such-policy"), InputError);
    EXPECT_THROW(cuda::MoeLayer(rt, {2, "k"}, cuda::make_gpu_planner(rt, "feplb")),
                 InputError);  // top_k > max_top_k
    EXPECT_THROW(cuda::MoeLayer(rt, {1, "null"}, nullptr), InputError);
  }
  c.shape.hidden = 100;  // not a multiple of 8
  EXPECT_THROW(cuda::EpRuntime(c, group.endpoint(0)), InputError);
  c = config_for(1, 4, 1, 8, "feplb").runtime;
  c.max_in_flight = 0;
  EXPECT_THROW(cuda::EpRuntime(c, group.endpoint(0)), InputError);
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

void expect_close(const std::vector<float>& got, const std::vector<double>& ref,
                  const std::string& what) {
  const auto e = compare(got, ref);
  EXPECT_FALSE(e.has_nan) << what << ": unwritten (NaN) values";
  EXPECT_LE(e.rel_l2, kGradRelL2) << what;
  EXPECT_LE(e.max_abs, kGradMaxAbsFrac * std::max(e.ref_max, 1e-9)) << what;
}

// Every gradient of every layer and rank against the float64 reference backward: dL/dhidden and
// dL/dtopk_weight per rank; each expert's dL/dW summed over all ranks' tokens, on its home rank.
void expect_gradients_match(const std::vector<std::vector<testing::BackwardResult>>& got,
                            const testing::LayerSetup& setup, const ReferenceMoe& m,
                            const std::vector<RankInputs>& in,
                            const std::vector<std::vector<float>>& grad_out,
                            const std::string& what) {
  const cuda::RuntimeConfig& c = setup.runtime;
  const int R = c.topo.num_ranks();
  std::vector<double> dw_total(m.weights.size(), 0.0);
  std::vector<ReferenceMoe::Grads> ref;
  for (int r = 0; r < R; ++r) {
    std::vector<double> go(grad_out[r].begin(), grad_out[r].end());
    ref.push_back(
        m.backward(in[r].hidden, in[r].topk_idx, in[r].topk_weight, go, in[r].tokens, setup.top_k));
    for (size_t i = 0; i < dw_total.size(); ++i) dw_total[i] += ref[r].weights[i];
  }
  for (size_t l = 0; l < got.size(); ++l) {
    for (int r = 0; r < R; ++r) {
      const std::string at = what + " layer " + std::to_string(l) + " rank " + std::to_string(r);
      const auto fwd =
          m.forward(in[r].hidden, in[r].topk_idx, in[r].topk_weight, in[r].tokens, setup.top_k);
      expect_close(got[l][r].out, fwd, at + " out");
      if (in[r].tokens > 0) {
        expect_close(got[l][r].grad_hidden, ref[r].hidden, at + " d hidden");
        expect_close(got[l][r].grad_topk_weight, ref[r].topk_weight, at + " d topk_weight");
      }
      const std::vector<double> dw_ref = local_dw(c.topo, r, dw_total);
      bool any = false;
      for (double v : dw_ref) any = any || v != 0.0;
      if (any) expect_close(got[l][r].main_grad, dw_ref, at + " dW (gate|up and down)");
    }
  }
}

// Whether two results are the same bits.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The backward of `in` under `c` with random dL/dout (from `go_seed`), every gradient checked
// against the float64 reference; returns the results ([layer][rank]).
std::vector<std::vector<testing::BackwardResult>> expect_backward_matches(
    const testing::LayerSetup& c, const ReferenceMoe& m, const std::vector<RankInputs>& in,
    uint64_t go_seed, const std::string& what, int layers = 1,
    cuda::GradMode mode = cuda::GradMode::kAccumulate) {
  const auto go = random_grad_out(go_seed, in);
  auto got = testing::run_layer_backward(c, m, in, go, layers, mode);
  expect_gradients_match(got, c, m, in, go, what);
  return got;
}

class LayerBackwardTest : public GpuTest<std::tuple<int, std::string>> {};

TEST_P(LayerBackwardTest, GradientsMatchFloat64Reference) {
  const auto [ranks, policy] = GetParam();
  const int experts = 32, top_k = 4;
  const ReferenceMoe m = experts_for(300 + ranks, experts);
  const auto in =
      skewed_inputs(7 + ranks, ranks, experts, top_k, 96, 8.0);  // the forward test's inputs
  const auto got = expect_backward_matches(config_for(ranks, experts, top_k, 96, policy), m, in,
                                           41 + ranks, policy);
  int64_t guest_rows = 0;
  for (const auto& g : got[0]) guest_rows += g.stats.guest_rows;
  if (ranks > 1 && policy != "static") {
    EXPECT_GT(guest_rows, 0) << policy << ": skewed input but no guest backward";
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndPolicies, LayerBackwardTest, RanksAndPolicies(), RankPolicyName);

// The layer is deterministic: the same inputs twice (fresh runtimes) give the same plan and every
// output and gradient bit for bit (an expert's rows keep token order in the dispatch; the GEMMs
// and reductions run in a fixed order), with and without rows moved to helpers.
TEST(LayerBackward, BitForBitFromRunToRun) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int experts = 16, top_k = 4;
  const int64_t tokens = 600;  // 2400 pairs: the dispatch counts them in 10 chunks
  for (const auto& [ranks, policy] :
       std::vector<std::pair<int, std::string>>{{1, "static"}, {4, "static"}, {4, "feplb-paper"}}) {
    const std::string what = std::to_string(ranks) + " ranks, " + policy;
    const ReferenceMoe m = experts_for(91, experts);
    const auto in = skewed_inputs(92, ranks, experts, top_k, tokens, 6.0);
    const auto go = random_grad_out(93, in);
    const testing::LayerSetup c = config_for(ranks, experts, top_k, tokens, policy);
    const auto a = testing::run_layer_backward(c, m, in, go);
    const auto b = testing::run_layer_backward(c, m, in, go);
    expect_gradients_match(a, c, m, in, go, what);
    for (int r = 0; r < ranks; ++r) {
      const testing::BackwardResult &x = a[0][r], &y = b[0][r];
      ASSERT_EQ(serialize(x.plan), serialize(y.plan)) << what << " rank " << r << ": plans differ";
      EXPECT_TRUE(same_bits(x.out, y.out)) << what << " rank " << r << ": out";
      EXPECT_TRUE(same_bits(x.grad_hidden, y.grad_hidden)) << what << " rank " << r << ": dX";
      EXPECT_TRUE(same_bits(x.grad_topk_weight, y.grad_topk_weight)) << what << " rank " << r;
      EXPECT_TRUE(same_bits(x.main_grad, y.main_grad)) << what << " rank " << r << ": dW";
    }
    if (policy != "static") {
      int64_t guest_rows = 0;
      for (const auto& g : a[0]) guest_rows += g.stats.guest_rows;
      EXPECT_GT(guest_rows, 0) << what << ": no rows moved, so the helpers' part went unchecked";
    }
  }
}

// Two layers share one slot pool: the second layer's forward refills the slots the first one's
// guests used, so the first layer's backward must copy those weights again (and still be exact);
// the second layer's backward finds its weights in place.
TEST(LayerBackward, ReusedSlotsAreCopiedAgain) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(77, experts);
  const auto in = skewed_inputs(78, ranks, experts, top_k, 128, 8.0);
  const auto got = expect_backward_matches(config_for(ranks, experts, top_k, 128, "feplb"), m, in,
                                           79, "two layers, one pool", /*layers=*/2);
  int64_t recopies0 = 0, recopies1 = 0, guests = 0;
  for (int r = 0; r < ranks; ++r) {
    recopies0 += got[0][r].stats.weight_recopies;
    recopies1 += got[1][r].stats.weight_recopies;
    guests += got[0][r].stats.guest_rows;
  }
  ASSERT_GT(guests, 0) << "skewed input but nothing migrated: the test would prove nothing";
  EXPECT_GT(recopies0, 0)
      << "layer 0's slots were refilled by layer 1, yet nothing was copied again";
  EXPECT_EQ(recopies1, 0) << "layer 1's weights were still in its slots";
}

TEST(LayerBackward, BalancingOnAndOffAgree) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(55, experts);
  const auto in = skewed_inputs(56, ranks, experts, top_k, 200, 6.0);
  const auto go = random_grad_out(57, in);
  const auto off =
      testing::run_layer_backward(config_for(ranks, experts, top_k, 200, "static"), m, in, go);
  const auto on =
      testing::run_layer_backward(config_for(ranks, experts, top_k, 200, "feplb"), m, in, go);
  for (int r = 0; r < ranks; ++r) {
    auto as_ref = [](const std::vector<float>& v) {
      return std::vector<double>(v.begin(), v.end());
    };
    EXPECT_LE(compare(on[0][r].grad_hidden, as_ref(off[0][r].grad_hidden)).rel_l2, 5e-3)
        << "rank " << r;
    EXPECT_LE(compare(on[0][r].grad_topk_weight, as_ref(off[0][r].grad_topk_weight)).rel_l2, 5e-3)
        << "rank " << r;
    EXPECT_LE(compare(on[0][r].main_grad, as_ref(off[0][r].main_grad)).rel_l2, 5e-3)
        << "rank " << r;
  }
}

TEST(LayerBackward, EdgeCases) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16;
  const ReferenceMoe m = experts_for(19, experts);
  for (const EdgeCase& k : kEdgeCases) {
    for (const char* policy : {"static", "feplb", "oracle"}) {
      const auto in = skewed_inputs(23, ranks, experts, k.top_k, k.tokens, k.skew, k.hot);
      expect_backward_matches(
          config_for(ranks, experts, k.top_k, std::max<int64_t>(k.tokens, 1), policy), m, in, 24,
          std::string(k.name) + " / " + policy);
    }
  }
}

// Misuse of the runtime API is an InputError naming the problem, never a crash or a hang.
TEST(LayerBackward, MisuseIsAClearError) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::InProcessGroup group(1);
  const int experts = 4;
  cuda::RuntimeConfig c = config_for(1, experts, 1, 8, "feplb").runtime;
  c.max_in_flight = 2;
  cuda::Stream s;
  cuda::LocalExperts w(experts, kHidden, kFfn, true);
  FEPLB_CUDA_CHECK(cudaMemset(w.weights(), 0, static_cast<size_t>(w.weight_elems()) * 2));
  cuda::DeviceBuffer<__nv_bfloat16> x(8 * kHidden), out(8 * kHidden), g(8 * kHidden),
      gx(8 * kHidden);
  cuda::DeviceBuffer<int32_t> idx(8);
  cuda::DeviceBuffer<float> wt(8), gw(8);
  FEPLB_CUDA_CHECK(cudaMemset(x.get(), 0, x.bytes()));
  FEPLB_CUDA_CHECK(cudaMemset(g.get(), 0, g.bytes()));
  FEPLB_CUDA_CHECK(cudaMemset(idx.get(), 0, idx.bytes()));
  FEPLB_CUDA_CHECK(cudaMemset(wt.get(), 0, wt.bytes()));
  const auto expect_input_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one about '" << needle << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    cuda::RuntimeConfig inference = c;
    inference.training = false;
    inference.name = "inference";
    cuda::EpRuntime rt(inference, group.endpoint(0));
    cuda::MoeLayer layer(rt, {1, "inference"}, cuda::make_gpu_planner(rt, "feplb"));
    cuda::MicroBatch mb =
        layer.forward(w.params(), x.get(), idx.get(), wt.get(), 8, out.get(), s.get());
    EXPECT_FALSE(mb.valid()) << "a forward-only runtime keeps nothing";
    expect_input_error(
        [&] {
          layer.backward(std::move(mb), w.params(), g.get(), wt.get(), gx.get(), gw.get(),
                         w.grad_views(), cuda::GradMode::kAccumulate, s.get());
        },
        "without training");
  }
  cuda::EpRuntime rt(c, group.endpoint(0));
  cuda::MoeLayer a(rt, {1, "a"}, cuda::make_gpu_planner(rt, "feplb"));
  cuda::MoeLayer b(rt, {1, "b"}, cuda::make_gpu_planner(rt, "static"));
  auto forward = [&](cuda::MoeLayer& l) {
    return l.forward(w.params(), x.get(), idx.get(), wt.get(), 8, out.get(), s.get());
  };
  auto backward = [&](cuda::MoeLayer& l, cuda::MicroBatch&& mb) {
    l.backward(std::move(mb), w.params(), g.get(), wt.get(), gx.get(), gw.get(), w.grad_views(),
               cuda::GradMode::kAccumulate, s.get());
  };
  // Wrong sizes and null pointers.
  expect_input_error(
      [&] {
        a.forward(w.params().first(experts - 1), x.get(), idx.get(), wt.get(), 8, out.get(),
                  s.get());
      },
      "weights of 3 experts");
  expect_input_error(
      [&] { a.forward(w.params(), x.get(), idx.get(), wt.get(), 9, out.get(), s.get()); },
      "max_tokens");
  expect_input_error(
      [&] { a.forward(w.params(), nullptr, idx.get(), wt.get(), 8, out.get(), s.get()); }, "null");
  std::vector<cuda::ExpertParams> bad(w.params().begin(), w.params().end());
  bad[1].down = nullptr;
  expect_input_error([&] { a.forward(bad, x.get(), idx.get(), wt.get(), 8, out.get(), s.get()); },
                     "null weight");
  // An expert id out of range, on every rank; the runtime stays usable. On one rank the layer
  // counts on the GPU and reports it at its next call (here: the plan's reader).
  FEPLB_CUDA_CHECK(cudaMemset(idx.get(), 0x7f, 4));
  expect_input_error(
      [&] {
        forward(a);
        (void)a.last_plan();
      },
      "outside [0, 4)");
  FEPLB_CUDA_CHECK(cudaMemset(idx.get(), 0, idx.bytes()));
  // Handles: consumed twice, another layer's, more in flight than the runtime holds.
  cuda::MicroBatch m1 = forward(a);
  EXPECT_TRUE(m1.valid());
  expect_input_error([&] { backward(b, std::move(m1)); }, "layer 0's");
  EXPECT_TRUE(m1.valid()) << "a rejected backward must not consume the handle";
  cuda::MicroBatch m2 = forward(a);
  expect_input_error([&] { forward(a); }, "max_in_flight");
  backward(a, std::move(m1));
  EXPECT_FALSE(m1.valid());
  expect_input_error([&] { backward(a, std::move(m1)); }, "consumed");
  expect_input_error(
      [&] {
        a.backward(std::move(m2), w.params(), g.get(), wt.get(), gx.get(), gw.get(),
                   w.grad_views().first(1), cuda::GradMode::kAccumulate, s.get());
      },
      "gradients of 1 experts");
  m2 = cuda::MicroBatch();  // dropped unused: its memory goes back
  EXPECT_EQ(rt.micro_batches_in_flight(), 0);
  cuda::sync_with_timeout(s.get(), 30, "misuse");
}

// A runtime destroyed while a layer still uses it: the layer's calls are InputErrors.
TEST(LayerBackward, ARuntimeDestroyedUnderALayerIsAClearError) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::InProcessGroup group(1);
  cuda::RuntimeConfig c = config_for(1, 4, 1, 8, "feplb").runtime;
  auto rt = std::make_unique<cuda::EpRuntime>(c, group.endpoint(0));
  cuda::MoeLayer layer(*rt, {1, "orphan"}, cuda::make_gpu_planner(*rt, "feplb"));
  rt.reset();
  cuda::LocalExperts w(4, kHidden, kFfn, false);
  cuda::Stream s;
  TokenBuffers b(8);
  try {
    b.forward(layer, w, s.get());
    ADD_FAILURE() << "forward on a destroyed runtime did not fail";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("runtime (rank 0) was destroyed"), std::string::npos)
        << e.what();
  }
}

// Each micro-batch's outputs and gradients of a schedule's run (run_schedule) against the float64
// reference (`what`: the messages' prefix); returns the weight gradient summed over them.
std::vector<double> expect_micro_batches_match(
    const std::vector<std::vector<testing::BackwardResult>>& got, const ReferenceMoe& m,
    const std::vector<std::vector<RankInputs>>& in,
    const std::vector<std::vector<std::vector<float>>>& go, int top_k, const std::string& what) {
  std::vector<double> dw_total(m.weights.size(), 0.0);
  for (size_t mb = 0; mb < in.size(); ++mb) {
    for (size_t r = 0; r < in[mb].size(); ++r) {
      const RankInputs& x = in[mb][r];
      const std::string at =
          what + "micro-batch " + std::to_string(mb) + " rank " + std::to_string(r);
      expect_close(got[mb][r].out, m.forward(x.hidden, x.topk_idx, x.topk_weight, x.tokens, top_k),
                   at + " out");
      const std::vector<double> g(go[mb][r].begin(), go[mb][r].end());
      const auto ref = m.backward(x.hidden, x.topk_idx, x.topk_weight, g, x.tokens, top_k);
      expect_close(got[mb][r].grad_hidden, ref.hidden, at + " d hidden");
      expect_close(got[mb][r].grad_topk_weight, ref.topk_weight, at + " d topk_weight");
      for (size_t i = 0; i < dw_total.size(); ++i) dw_total[i] += ref.weights[i];
    }
  }
  return dw_total;
}

// Each rank's weight gradient (one layer's results, `got`) against the reference's `dw_total`.
void expect_dw_matches(const std::vector<testing::BackwardResult>& got, const Topology& topo,
                       const std::vector<double>& dw_total, const std::string& what) {
  for (int r = 0; r < static_cast<int>(got.size()); ++r) {
    expect_close(got[r].main_grad, local_dw(topo, r, dw_total),
                 what + "rank " + std::to_string(r) + " dW");
  }
}

// Three micro-batches' inputs [m][rank] (96, 112 and 128 tokens; the third sends every token's
// first choice to expert 3) from seeds in_seed + m, and their output gradients from go_seed + m.
void three_micro_batches(uint64_t in_seed, uint64_t go_seed, int ranks, int experts, int top_k,
                         std::vector<std::vector<RankInputs>>& in,
                         std::vector<std::vector<std::vector<float>>>& go) {
  for (int mb = 0; mb < 3; ++mb) {
    in.push_back(
        skewed_inputs(in_seed + mb, ranks, experts, top_k, 96 + 16 * mb, 8.0, mb == 2 ? 3 : -1));
    go.push_back(random_grad_out(go_seed + mb, in.back()));
  }
}

// Pipeline schedules keep several micro-batches in flight: F0 F1 B0 F2 B1 B2 with different
// inputs per micro-batch gives each micro-batch's outputs and gradients, and the weight gradient
// summed over the three, as the float64 reference does.
TEST(LayerBackward, SeveralMicroBatchesInFlightMatchTheReference) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(88, experts);
  std::vector<std::vector<RankInputs>> in;
  std::vector<std::vector<std::vector<float>>> go;
  three_micro_batches(90, 95, ranks, experts, top_k, in, go);
  const testing::LayerSetup c = config_for(ranks, experts, top_k, 128, "feplb");
  const auto got = testing::run_schedule(c, m, in, go, "F0 F1 B0 F2 B1 B2");
  const std::vector<double> dw_total = expect_micro_batches_match(got, m, in, go, top_k, "");
  int64_t guests = 0;
  for (int mb = 0; mb < 3; ++mb) {
    for (int r = 0; r < ranks; ++r) guests += got[mb][r].stats.guest_rows;
  }
  ASSERT_GT(guests, 0) << "skewed input but no guest backward: the test would prove little";
  expect_dw_matches(got[0], c.runtime.topo, dw_total, "summed over 3 micro-batches: ");
}

// Weight gradients written (not accumulated) into caller buffers that held garbage (NaN).
TEST(LayerBackward, OverwriteModeWritesEveryGradient) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(66, experts);
  const auto in = skewed_inputs(67, ranks, experts, top_k, 64, 8.0);
  const auto got = expect_backward_matches(config_for(ranks, experts, top_k, 64, "feplb"), m, in,
                                           68, "overwrite", 1, cuda::GradMode::kOverwrite);
  for (const auto& r : got[0]) {
    for (float v : r.main_grad)
      ASSERT_FALSE(std::isnan(v)) << "a weight gradient was left unwritten";
  }
}

// Weight gradients in the parameters' dtype (bf16), written by the dW GEMMs themselves, with
// experts split onto helpers (their fp32 partials added into bf16 at home) and without; added
// into zeroed buffers and written over NaN ones (experts with no rows at home included).
TEST(LayerBackward, Bf16GradientsFromTheGemmsMatchTheReference) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(76, experts);
  const auto in = skewed_inputs(77, ranks, experts, top_k, 64, 8.0);
  for (const char* policy : {"feplb", "static"}) {
    for (cuda::GradMode mode : {cuda::GradMode::kAccumulate, cuda::GradMode::kOverwrite}) {
      testing::LayerSetup c = config_for(ranks, experts, top_k, 64, policy);
      c.bf16_grads = true;
      const std::string what = std::string(policy) + " bf16 " +
                               (mode == cuda::GradMode::kOverwrite ? "overwrite" : "accumulate");
      const auto got = expect_backward_matches(c, m, in, 78, what, 1, mode);
      int64_t guest_rows = 0;
      for (const auto& r : got[0]) {
        guest_rows += r.stats.guest_rows;
        for (float v : r.main_grad) ASSERT_FALSE(std::isnan(v)) << what << ": a gradient unwritten";
      }
      if (std::string(policy) == "feplb") {
        EXPECT_GT(guest_rows, 0) << what << ": nothing split";
      }
    }
  }
}

// Both expert GEMM paths (RuntimeConfig::expert_gemm) against the float64 reference, forward and
// backward, fp32 and bf16 gradients, accumulated and written, balanced (experts split onto
// helpers) and not; the runtime says which path it runs. The other tests run the default: the
// grouped GEMMs where the GPU has them (compute capability 9.0), else per expert.
TEST(LayerBackward, BothExpertGemmPathsMatchTheReference) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(86, experts);
  const auto in = skewed_inputs(87, ranks, experts, top_k, 64, 8.0);
  const bool grouped_here = cuda::GroupedFfn::available();
  for (cuda::ExpertGemm gemm : {cuda::ExpertGemm::kPerExpert, cuda::ExpertGemm::kGrouped}) {
    if (gemm == cuda::ExpertGemm::kGrouped && !grouped_here) continue;
    for (const char* policy : {"feplb", "static"}) {
      for (bool bf16 : {false, true}) {
        for (cuda::GradMode mode : {cuda::GradMode::kAccumulate, cuda::GradMode::kOverwrite}) {
          testing::LayerSetup c = config_for(ranks, experts, top_k, 64, policy);
          c.runtime.expert_gemm = gemm;
          c.bf16_grads = bf16;
          const std::string what =
              std::string(gemm == cuda::ExpertGemm::kGrouped ? "grouped " : "per-expert ") +
              policy + (bf16 ? " bf16" : " fp32") +
              (mode == cuda::GradMode::kOverwrite ? " overwrite" : " accumulate");
          const auto got = expect_backward_matches(c, m, in, 88, what, 1, mode);
          for (const auto& r : got[0]) {
            for (float v : r.main_grad) ASSERT_FALSE(std::isnan(v)) << what << ": unwritten dW";
          }
        }
      }
    }
  }
  cuda::InProcessGroup group(1);
  cuda::RuntimeConfig c = config_for(1, 4, 1, 8, "static").runtime;
  c.training = false;
  cuda::EpRuntime rt(c, group.endpoint(0));
  EXPECT_EQ(rt.expert_gemm(),
            grouped_here ? cuda::ExpertGemm::kAuto : cuda::ExpertGemm::kPerExpert);
  c.expert_gemm = cuda::ExpertGemm::kGrouped;
  c.name = "grouped-required";
  if (!grouped_here) {
    EXPECT_THROW(cuda::EpRuntime(c, group.endpoint(0)), InputError);
  }
}

// A call's host time is split by what it went to, and its parts add up to no more than the call.
TEST(Layer, HostTimesSayWhereTheCallWent) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::InProcessGroup group(1);
  cuda::RuntimeConfig c = config_for(1, 4, 1, 8, "static").runtime;
  c.training = false;
  cuda::EpRuntime rt(c, group.endpoint(0));
  cuda::MoeLayer layer(rt, {1, "host"}, cuda::make_gpu_planner(rt, "static"));
  cuda::LocalExperts w(4, kHidden, kFfn, false);
  cuda::Stream s;
  TokenBuffers b(8);  // every token to expert 0
  for (int call = 0; call < 3; ++call) {
    b.forward(layer, w, s.get());
    cuda::sync_with_timeout(s.get(), 30, "forward");
    const cuda::HostTimes& t = layer.last_forward_stats().host;
    EXPECT_EQ(t.gemms, 2) << "one expert with rows: gate|up and down";
    EXPECT_GT(t.call_us, 0);
    EXPECT_GT(t.gemm_us, 0);
    const double parts = t.await_us + t.gemm_us + t.kernel_us + t.exchange_us + t.sync_us +
                         t.hooks_us + t.build_us + t.refine_us;
    EXPECT_LE(parts, t.call_us + 1.0) << "call " << call;
    for (double v :
         {t.await_us, t.kernel_us, t.exchange_us, t.sync_us, t.hooks_us, t.build_us, t.refine_us})
      EXPECT_GE(v, 0);
  }
}

// One rank with many small experts (fine-grained MoE), rows counted on the GPU (the grouped
// GEMMs, chosen for such batches) and per expert with host row counts: both against the float64
// reference, forward and backward, fp32 and bf16 gradients, added and written, skewed routing
// (most experts with a few rows, many with none). The grouped one launches a fixed number of GEMMs
// whatever the number of experts.
TEST(LayerOneRank, ManySmallExpertsMatchTheReferenceOnBothPaths) {
  FEPLB_SKIP_WITHOUT_GPU();
  const bool grouped_here = cuda::GroupedFfn::available();
  for (int experts : {64, 256}) {
    const int top_k = 8;
    const ReferenceMoe m = experts_for(900 + experts, experts);
    const auto in = skewed_inputs(901 + experts, 1, experts, top_k, 48, 4.0);
    for (cuda::ExpertGemm gemm : {cuda::ExpertGemm::kPerExpert, cuda::ExpertGemm::kGrouped}) {
      if (gemm == cuda::ExpertGemm::kGrouped && !grouped_here) continue;
      for (bool bf16 : {false, true}) {
        for (cuda::GradMode mode : {cuda::GradMode::kAccumulate, cuda::GradMode::kOverwrite}) {
          testing::LayerSetup c = config_for(1, experts, top_k, 48, "feplb");
          c.runtime.expert_gemm = gemm;
          c.bf16_grads = bf16;
          const std::string what =
              fmt::format("{} experts, {}{}{}", experts,
                          gemm == cuda::ExpertGemm::kGrouped ? "counted on the GPU" : "per expert",
                          bf16 ? ", bf16" : ", fp32",
                          mode == cuda::GradMode::kOverwrite ? ", overwrite" : ", accumulate");
          const auto got = expect_backward_matches(c, m, in, 902 + experts, what, 1, mode);
          const cuda::BackwardStats& st = got[0][0].stats;
          if (gemm == cuda::ExpertGemm::kGrouped) {
            EXPECT_LE(st.host.gemms, 4) << what << ": dW down, dact, dW gate|up, dX";
            EXPECT_EQ(st.host.await_us, 0.0) << what;
          } else {
            EXPECT_GT(st.host.gemms, 8) << what;
          }
          int64_t rows = 0;
          for (const Slice& sl : got[0][0].plan.slices) rows += sl.rows;
          EXPECT_EQ(rows, 48 * top_k) << what << ": the plan of the settled counts";
        }
      }
    }
  }
}

// The edge cases on one rank, counted on the GPU: no tokens, one token, a tile's remainder, every
// token to one expert, most experts empty; forward and backward in both gradient modes.
TEST(LayerOneRank, EdgeCases) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "no grouped GEMMs on this GPU";
  const int experts = 16;
  const ReferenceMoe m = experts_for(911, experts);
  for (const EdgeCase& k : kEdgeCases) {
    for (cuda::GradMode mode : {cuda::GradMode::kAccumulate, cuda::GradMode::kOverwrite}) {
      const auto in = skewed_inputs(912, 1, experts, k.top_k, k.tokens, k.skew, k.hot);
      testing::LayerSetup c =
          config_for(1, experts, k.top_k, std::max<int64_t>(k.tokens, 1), "feplb");
      c.runtime.expert_gemm = cuda::ExpertGemm::kGrouped;
      const std::string what = fmt::format(
          "{} / {}", k.name, mode == cuda::GradMode::kOverwrite ? "overwrite" : "accumulate");
      const auto got = expect_backward_matches(c, m, in, 913, what, 1, mode);
      for (float v : got[0][0].main_grad) ASSERT_FALSE(std::isnan(v)) << what << ": unwritten dW";
    }
  }
}

// The caller's thread never waits for the counts on one rank: with the stream held up by a host
// function for 300 ms, forward and backward are enqueued and return at once (nothing of theirs
// has run); their results, once the stream runs, match the per-expert path's, and the layer's
// statistics then hold the forward's routing.
TEST(LayerOneRank, TheCallerNeverWaitsForTheCounts) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "no grouped GEMMs on this GPU";
  const int experts = 128, top_k = 8;
  const int64_t tokens = 64;
  const ReferenceMoe m = experts_for(921, experts);
  const auto in = skewed_inputs(922, 1, experts, top_k, tokens, 3.0);
  cuda::InProcessGroup group(1);
  cuda::RuntimeConfig c = config_for(1, experts, top_k, tokens, "feplb").runtime;
  cuda::EpRuntime rt(c, group.endpoint(0));
  cuda::MoeLayer layer(rt, {top_k, "no-wait"}, cuda::make_gpu_planner(rt, "feplb"));
  cuda::Stream s;
  RankZeroForward f(m, c.topo, in[0], experts, /*grads=*/true);
  cuda::DeviceBuffer<__nv_bfloat16> go(static_cast<size_t>(tokens * kHidden)),
      gx(static_cast<size_t>(tokens * kHidden));
  cuda::DeviceBuffer<float> gw(static_cast<size_t>(tokens * top_k));
  FEPLB_CUDA_CHECK(cudaMemset(go.get(), 0, go.bytes()));
  // A warm forward and backward (first launches set up the kernels), then the held-up stream.
  for (int call = 0; call < 2; ++call) {
    if (call == 1) {
      FEPLB_CUDA_CHECK(cudaLaunchHostFunc(
          s.get(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
          nullptr));
    }
    const auto t0 = std::chrono::steady_clock::now();
    cuda::MicroBatch mb = layer.forward(f.w.params(), f.x.get(), f.idx.get(), f.wt.get(), tokens,
                                        f.out.get(), s.get());
    layer.backward(std::move(mb), f.w.params(), go.get(), f.wt.get(), gx.get(), gw.get(),
                   f.w.grad_views(), cuda::GradMode::kAccumulate, s.get());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (call == 1) {
      EXPECT_EQ(cudaStreamQuery(s.get()), cudaErrorNotReady) << "the stream ran already";
      EXPECT_LT(ms, 100.0) << "forward + backward waited for the held-up stream";
    }
    cuda::sync_with_timeout(s.get(), 30, "one-rank forward");
  }
  expect_matches_reference(f.result(), m, in, top_k, "one rank, counted on the GPU");
  EXPECT_EQ(layer.last_routing().num_ranks, 1);
  EXPECT_EQ(std::accumulate(layer.last_routing().counts.begin(), layer.last_routing().counts.end(),
                            int64_t{0}),
            tokens * top_k);
}

// An idle runtime sleeps: its scheduler thread uses < 1% of a core over a second.
TEST(Runtime, AnIdleRuntimeUsesNoCpu) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::InProcessGroup group(1);
  cuda::RuntimeConfig c = config_for(1, 4, 1, 8, "feplb").runtime;
  c.training = false;
  cuda::EpRuntime rt(c, group.endpoint(0));
  cuda::MoeLayer layer(rt, {1, "idle"}, cuda::make_gpu_planner(rt, "feplb"));
  cuda::LocalExperts w(4, kHidden, kFfn, false);
  cuda::Stream s;
  TokenBuffers b(8);
  b.forward(layer, w, s.get());  // one job, then idle
  cuda::sync_with_timeout(s.get(), 30, "forward");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double before = rt.scheduler_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double used = rt.scheduler_cpu_seconds() - before;
  EXPECT_LT(used, 0.01) << "the idle scheduler thread used " << used << " s of CPU in 1 s";
}

// Two micro-batches' skewed routing for `layers` layers (inputs from seed + 10 * micro-batch +
// layer).
cuda::TrainRouting skewed_routing(uint64_t seed, int ranks, int experts, int top_k, int64_t tokens,
                                  int layers) {
  cuda::TrainRouting routing(2);
  for (int mb = 0; mb < 2; ++mb) {
    for (int l = 0; l < layers; ++l) {
      const auto li = skewed_inputs(seed + 10 * mb + l, ranks, experts, top_k, tokens, 6.0);
      std::vector<std::vector<int32_t>> per_rank;
      for (const auto& r : li) per_rank.push_back(r.topk_idx);
      routing[mb].push_back(per_rank);
    }
  }
  return routing;
}

// Four Adam steps of two micro-batches over `layers` layers with `setup`'s runtime.
cuda::TrainConfig train_config(const testing::LayerSetup& setup, const std::string& policy,
                               int top_k, int layers) {
  cuda::TrainConfig t;
  t.runtime = setup.runtime;
  t.policy = policy;
  t.top_k = top_k;
  t.layers = layers;
  t.steps = 4;
  t.micro_batches = 2;
  t.lr = 2e-3f;
  return t;
}

// A few Adam steps of a 2-layer residual MoE model: the loss falls, and balancing on gives the
// same loss curve as off (the same arithmetic on other GPUs, up to rounding).
TEST(Training, LossCurvesAgreeWithBalancingOnAndOff) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2, layers = 2;
  const int64_t tokens = 128;
  const auto in = skewed_inputs(61, ranks, experts, top_k, tokens, 6.0);
  const cuda::TrainRouting routing = skewed_routing(62, ranks, experts, top_k, tokens, layers);
  auto run = [&](const std::string& policy) {
    return cuda::run_virtual_training(
        train_config(config_for(ranks, experts, top_k, tokens, policy), policy, top_k, layers),
        routing);
  };
  const auto off = run("static"), on = run("feplb");
  ASSERT_EQ(off.loss.size(), on.loss.size());
  EXPECT_GT(on.migrated_slices, 0) << "skewed routing but nothing migrated";
  for (size_t i = 0; i < off.loss.size(); ++i) {
    EXPECT_TRUE(std::isfinite(on.loss[i]) && std::isfinite(off.loss[i])) << "step " << i;
    EXPECT_NEAR(on.loss[i], off.loss[i], 1e-2 * off.loss[i]) << "step " << i;
  }
  EXPECT_LT(off.loss.back(), 0.98 * off.loss.front())
      << "the loss did not fall: the gradients do not train";
  EXPECT_LT(on.loss.back(), 0.98 * on.loss.front());
}

// ---- rows in one hop and weights before routing --------------------------------------------

// The feplb planner in the layer's opt-in paths: rows in one hop; weights before routing
// (prefetch() before every forward, after one warm-up forward that gives the planner its history);
// both; and the prefetch knob without any prefetch() call (the plans list prefetched weights that
// were never copied: the layer copies what it needs, as without prefetch); and both with late
// copies allowed (copy_timing = 3: a helper may wait for weights that land after its own work;
// the others keep config_for's 0: copy time ignored, so that the tiny test experts migrate); and
// both balancing modelled GEMM time within a 5% token-straggler budget (time_balance_budget);
// one hop with only copies that land in time (copy_timing = 1); two phases with late copies
// (copy_timing = 3: the chooser's candidate over several small domains); the chooser with the path,
// prefetch and balance left to it, then with the copy rule too (copy_timing = -1); and one hop
// planned from the previous micro-batch and refined on this one's counts (one_hop_refine = 1:
// its predicted helpers' weights go before routing, after one warm-up forward).
struct PathMode {
  const char* name;
  bool one_hop, prefetch_knob, prefetch_call;
  int64_t copy_timing = 0;
  double time_budget = 0;  // time_balance_budget
  bool chooser = false;    // path, prefetch and balance left to feplb (-1): its first mode here
  bool refine = false;     // one_hop_refine = 1
};
const PathMode kPathModes[] = {{"one_hop", true, false, false},
                               {"prefetch", false, true, true},
                               {"one_hop_prefetch", true, true, true},
                               {"prefetch_knob_only", false, true, false},
                               {"one_hop_prefetch_late", true, true, true, 3},
                               {"one_hop_prefetch_time", true, true, true, 0, 0.05},
                               {"auto", false, true, true, 0, 0, true},
                               {"one_hop_hidden", true, false, false, 1},
                               {"auto_every_switch", false, true, true, -1, 0, true},
                               {"one_hop_refined", true, false, true, 0, 0, false, true},
                               {"two_phase_late", false, false, false, 3}};

testing::LayerSetup path_config(int ranks, int experts, int top_k, int64_t max_tokens,
                                const PathMode& mode) {
  testing::LayerSetup setup = config_for(ranks, experts, top_k, max_tokens, "feplb");
  Knobs& k = setup.runtime.knobs;
  k.one_hop = mode.one_hop ? 1 : 0;
  k.prefetch = mode.prefetch_knob ? 1 : 0;
  k.copy_timing = mode.copy_timing;
  k.time_balance_budget = mode.time_budget;
  if (mode.chooser) {
    k.one_hop = -1;
    k.prefetch = -1;
    k.time_balance_budget = -1;
  }
  k.prefetch_window_us =
      1e6;  // tiny test experts: every predicted pair fits; the guest slots limit them
  k.one_hop_refine = mode.refine ? 1 : 0;
  setup.prefetch = mode.prefetch_call;
  setup.warmup_forwards = mode.prefetch_knob || mode.refine ? 1 : 0;
  return setup;
}

// Sums over ranks of a forward's path statistics (the prefetch counts are every rank's already).
struct PathStats {
  int64_t dispatched_rows = 0, weight_copies = 0, prefetched_pairs = 0, prefetch_hits = 0,
          guest_rows = 0;
  void add(const cuda::ForwardStats& s) {
    dispatched_rows += s.dispatched_rows;
    weight_copies += s.weight_copies;
    guest_rows += s.guest_rows;
    prefetched_pairs = s.prefetched_pairs;
    prefetch_hits = s.prefetch_hits;
  }
};

// Whether `plan` was made in one hop: the mode's, or for the chooser the plan's own path (a
// one-hop plan is made before the dispatch).
bool one_hop_of(const Plan& plan, const PathMode& mode) {
  return mode.chooser ? plan.planned_before_dispatch : mode.one_hop;
}

// Every migration of a plan is one-hop (kDispatched) exactly when the mode asks for it.
void expect_row_sources(const Plan& plan, const Topology& topo, const PathMode& mode) {
  for (const Slice& sl : plan.slices) {
    if (sl.gpu == topo.home(sl.expert)) continue;
    EXPECT_EQ(sl.source == RowSource::kDispatched, one_hop_of(plan, mode))
        << mode.name << ": expert " << sl.expert;
  }
}

auto RanksAndPaths() {
  return ::testing::Combine(::testing::Values(2, 4, 8),
                            ::testing::Range(0, static_cast<int>(std::size(kPathModes))));
}
std::string RankPathName(const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
  return "ep" + std::to_string(std::get<0>(info.param)) + "_" +
         kPathModes[std::get<1>(info.param)].name;
}

class LayerPathTest : public GpuTest<std::tuple<int, int>> {};

// Right predictions: the warm-up forward and the measured ones route the same tokens, so the
// prefetched weights are used (hits), and the results match the float64 reference.
TEST_P(LayerPathTest, ForwardAndBackwardMatchFloat64Reference) {
  const auto [ranks, mi] = GetParam();
  const PathMode& mode = kPathModes[mi];
  const int experts = 32, top_k = 4;
  const ReferenceMoe m = experts_for(400 + ranks, experts);
  const auto in = skewed_inputs(7 + ranks, ranks, experts, top_k, 96, 8.0);
  const testing::LayerSetup c = path_config(ranks, experts, top_k, 96, mode);
  const auto fwd = run_layer(c, m, in, /*forwards=*/2);
  expect_matches_reference(fwd, m, in, top_k, mode.name);
  PathStats st;
  for (const auto& g : fwd) st.add(g.stats);
  expect_row_sources(fwd[0].plan, c.runtime.topo, mode);
  // With copy time ignored (copy_timing 0) the tiny test experts always migrate; where copies
  // must land in time (or the chooser picks the rule) the plan may keep them home.
  bool plan_moves = false;
  for (const Slice& sl : fwd[0].plan.slices) plan_moves |= sl.gpu != c.runtime.topo.home(sl.expert);
  if (mode.copy_timing == 0) {
    ASSERT_GT(st.guest_rows, 0) << mode.name << ": skewed input but nothing migrated";
  } else {
    EXPECT_EQ(st.guest_rows > 0, plan_moves) << mode.name;
  }
  if (mode.chooser) {
    EXPECT_FALSE(fwd[0].plan.mode.empty()) << "the chooser names its mode";
  }
  // The chooser may plan without prefetch (its plan's mode says so).
  const bool prefetched = mode.prefetch_call &&
                          (!mode.chooser || fwd[0].plan.mode.find("prefetch") != std::string::npos);
  if (one_hop_of(fwd[0].plan, mode)) {
    EXPECT_EQ(st.dispatched_rows, st.guest_rows) << "one hop: every guest row arrives in phase 1";
  } else {
    EXPECT_EQ(st.dispatched_rows, 0);
  }
  if (prefetched) {
    EXPECT_GT(st.prefetched_pairs, 0) << mode.name << ": nothing prefetched";
    EXPECT_GT(st.prefetch_hits, 0)
        << mode.name << ": the same routing again, yet no prediction was used";
  } else if (!mode.chooser) {
    EXPECT_EQ(st.prefetched_pairs, 0);
    if (plan_moves) {
      EXPECT_GT(st.weight_copies, 0)
          << mode.name << ": migrations without prefetch copy their weights";
    }
  }
  const auto got = expect_backward_matches(c, m, in, 41 + ranks, mode.name);
  PathStats bst;
  for (const auto& g : got[0]) bst.add(g.forward_stats);
  if (plan_moves) {
    EXPECT_GT(bst.guest_rows, 0) << mode.name << ": no guest backward";
  }
  // (The training forwards run a fresh layer: a chooser may plan them in another mode.)
  if (prefetched && !mode.chooser) {
    EXPECT_GT(bst.prefetch_hits, 0) << mode.name << ": training forward used no prefetch";
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndPaths, LayerPathTest, RanksAndPaths(), RankPathName);

// Wrong predictions: the warm-up forward sends every token's first choice to expert 1 (rank 0's),
// the measured ones to the last expert (the last rank's). The predicted weights are copied and
// mostly unused, the new migrations copy theirs, and every result still matches the reference.
TEST(LayerPaths, WrongPredictionsCostBytesNeverCorrectness) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int experts = 32, top_k = 2;
  for (int ranks : {2, 4, 8}) {
    for (int mi : {1, 2}) {
      const PathMode& mode = kPathModes[mi];
      const std::string what = std::string(mode.name) + " ep" + std::to_string(ranks);
      const ReferenceMoe m = experts_for(500 + ranks, experts);
      testing::LayerSetup c = path_config(ranks, experts, top_k, 96, mode);
      c.warmup_inputs = skewed_inputs(31 + ranks, ranks, experts, top_k, 96, 2.0, /*hot_expert=*/1);
      const auto in =
          skewed_inputs(37 + ranks, ranks, experts, top_k, 96, 2.0, /*hot_expert=*/experts - 1);
      const auto fwd = run_layer(c, m, in, /*forwards=*/1);
      expect_matches_reference(fwd, m, in, top_k, what);
      PathStats st;
      for (const auto& g : fwd) st.add(g.stats);
      EXPECT_GT(st.prefetched_pairs, 0) << what << ": nothing prefetched";
      EXPECT_LT(st.prefetch_hits, st.prefetched_pairs)
          << what << ": a different routing, yet every prediction was used";
      EXPECT_GT(st.weight_copies, 0)
          << what << ": the new hot expert's migrations need their weights copied";
      expect_backward_matches(c, m, in, 43 + ranks, what);
    }
  }
}

TEST(LayerPaths, EdgeCases) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16;
  const ReferenceMoe m = experts_for(29, experts);
  for (const EdgeCase& k : kEdgeCases) {
    for (int mi : {0, 1, 2, 4, 5, 9, 10}) {
      const PathMode& mode = kPathModes[mi];
      const std::string what = std::string(k.name) + " / " + mode.name;
      const auto in = skewed_inputs(33, ranks, experts, k.top_k, k.tokens, k.skew, k.hot);
      const testing::LayerSetup c =
          path_config(ranks, experts, k.top_k, std::max<int64_t>(k.tokens, 1), mode);
      expect_matches_reference(run_layer(c, m, in, 2), m, in, k.top_k, what);
      expect_backward_matches(c, m, in, 34, what);
    }
  }
}

// feplb's default measures its planner when the runtime is made (RuntimeConfig::measure_planner):
// every rank ends with the same times (the largest), and a two-phase plan reserves its mode's
// reserve either way (the times weigh its choice of mode); off, or with the reserve set by the
// knob, nothing is measured. Outputs stay exact.
TEST(LayerPaths, TheDefaultMeasuresItsPlannerOnThisHost) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 2, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(61, experts);
  const auto in = skewed_inputs(62, ranks, experts, top_k, 96, 8.0);
  testing::LayerSetup c = path_config(ranks, experts, top_k, 96, kPathModes[8]);
  for (const bool measure : {true, false}) {
    c.runtime.measure_planner = measure;
    const auto got = run_layer(c, m, in, /*forwards=*/3);
    expect_matches_reference(got, m, in, top_k, measure ? "measured" : "knobs");
    for (const testing::RankResult& g : got) {
      // The last forward's plan: two-phase, at the reserve its mode has in the knobs' rule.
      if (g.plan.planned_before_dispatch) {
        EXPECT_EQ(g.stats.plan_reserve_us, 0.0);
      } else {
        EXPECT_DOUBLE_EQ(g.stats.plan_reserve_us, g.plan.schedule.copy_start_ms * 1e3);
        if (g.plan.reserve_us >= 0) {
          EXPECT_DOUBLE_EQ(g.stats.plan_reserve_us, g.plan.reserve_us) << g.plan.mode;
        }
      }
      if (!measure) {
        EXPECT_TRUE(g.planner_times.empty());
      }
    }
    if (!measure) continue;
    // Every two-phase candidate, positive, the same on both ranks (every rank's largest).
    ASSERT_FALSE(got[0].planner_times.empty());
    for (const ModeTime& t : got[0].planner_times) EXPECT_GT(t.us, 0.0) << t.mode;
    ASSERT_EQ(got[0].planner_times.size(), got[1].planner_times.size());
    for (size_t i = 0; i < got[0].planner_times.size(); ++i) {
      EXPECT_EQ(got[0].planner_times[i].mode, got[1].planner_times[i].mode);
      EXPECT_EQ(got[0].planner_times[i].us, got[1].planner_times[i].us);
    }
  }
  // The reserve set by the knob: nothing to measure.
  c.runtime.measure_planner = true;
  c.runtime.knobs.planner_budget_us = 30;
  for (const testing::RankResult& g : run_layer(c, m, in)) EXPECT_TRUE(g.planner_times.empty());
}

// Three layers share the slot pool: each layer's prefetch and forward refill the slots the one
// before used, so layer 0's and 1's backwards copy their weights again, the last layer's finds
// them in place; every gradient is still exact.
TEST(LayerPaths, LayersSharingThePoolCopyRefilledSlotsAgain) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2, layers = 3;
  const ReferenceMoe m = experts_for(81, experts);
  const auto in = skewed_inputs(82, ranks, experts, top_k, 128, 8.0);
  for (int mi : {1, 2}) {
    const PathMode& mode = kPathModes[mi];
    const auto got =
        expect_backward_matches(path_config(ranks, experts, top_k, 128, mode), m, in, 83,
                                std::string("three layers, one pool, ") + mode.name, layers);
    std::vector<int64_t> recopies(layers, 0), hits(layers, 0);
    for (int l = 0; l < layers; ++l) {
      for (int r = 0; r < ranks; ++r) recopies[l] += got[l][r].stats.weight_recopies;
      hits[l] = got[l][0].forward_stats.prefetch_hits;
    }
    ASSERT_GT(got[0][0].forward_stats.prefetched_pairs, 0) << mode.name << ": nothing prefetched";
    for (int l = 0; l < layers; ++l) EXPECT_GT(hits[l], 0) << mode.name << " layer " << l;
    EXPECT_GT(recopies[0], 0) << mode.name
                              << ": layer 0's slots were refilled, yet nothing was copied again";
    EXPECT_EQ(recopies[layers - 1], 0)
        << mode.name << ": the last layer's weights were still in its slots";
  }
}

// Pipeline order with prefetches: P1 before F1 is used; P2 is dropped by the backward B0 that
// comes before F2 (F2 then copies what it needs); outputs, gradients and the summed dW match.
TEST(LayerPaths, APrefetchDroppedByAnotherCallIsHarmless) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(91, experts);
  for (int mi : {1, 2}) {
    const PathMode& mode = kPathModes[mi];
    std::vector<std::vector<RankInputs>> in;
    std::vector<std::vector<std::vector<float>>> go;
    for (int mb = 0; mb < 3; ++mb) {
      in.push_back(skewed_inputs(92 + mb, ranks, experts, top_k, 96, 8.0, mb == 2 ? 3 : -1));
      go.push_back(random_grad_out(96 + mb, in.back()));
    }
    const testing::LayerSetup c = path_config(ranks, experts, top_k, 128, mode);
    const auto got = testing::run_schedule(c, m, in, go, "F0 P1 F1 P2 B0 F2 B1 B2");
    const std::vector<double> dw_total =
        expect_micro_batches_match(got, m, in, go, top_k, std::string(mode.name) + " ");
    EXPECT_GT(got[1][0].forward_stats.prefetched_pairs, 0)
        << mode.name << ": P1 was not used by F1";
    EXPECT_EQ(got[2][0].forward_stats.prefetched_pairs, 0)
        << mode.name << ": P2 should have been dropped by B0";
    expect_dw_matches(got[0], c.runtime.topo, dw_total, std::string(mode.name) + " ");
  }
}

// prefetch() of a planner that predicts nothing (static, or feplb without the knob) does nothing,
// and bad weights are an InputError.
TEST(LayerPaths, PrefetchWithoutPredictionsIsANoOp) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 2, experts = 8, top_k = 2;
  const ReferenceMoe m = experts_for(61, experts);
  const auto in = skewed_inputs(62, ranks, experts, top_k, 64, 6.0);
  for (const char* policy : {"static", "feplb"}) {
    testing::LayerSetup c = config_for(ranks, experts, top_k, 64, policy);
    c.prefetch = true;
    c.warmup_forwards = 1;
    const auto got = run_layer(c, m, in, 2);
    expect_matches_reference(got, m, in, top_k, std::string("prefetch() with ") + policy);
    for (const auto& g : got) EXPECT_EQ(g.stats.prefetched_pairs, 0) << policy;
  }
  cuda::InProcessGroup group(1);
  cuda::RuntimeConfig c = config_for(1, 4, 1, 8, "feplb").runtime;
  c.training = false;
  cuda::EpRuntime rt(c, group.endpoint(0));
  cuda::MoeLayer layer(rt, {1, "p"}, cuda::make_gpu_planner(rt, "feplb"));
  cuda::LocalExperts w(4, kHidden, kFfn, false);
  cuda::Stream s;
  EXPECT_THROW(layer.prefetch(w.params().first(3), s.get()), InputError);
  layer.prefetch(w.params(), s.get());
  cuda::sync_with_timeout(s.get(), 30, "prefetch");
}

// Training with one hop, with prefetch and with both gives the loss curve of no balancing.
TEST(Training, LossCurvesAgreeWithOneHopAndPrefetch) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, top_k = 2, layers = 2;
  const int64_t tokens = 128;
  const cuda::TrainRouting routing = skewed_routing(162, ranks, experts, top_k, tokens, layers);
  auto run = [&](const std::string& policy, const PathMode* mode) {
    const testing::LayerSetup setup = mode ? path_config(ranks, experts, top_k, tokens, *mode)
                                           : config_for(ranks, experts, top_k, tokens, policy);
    cuda::TrainConfig t = train_config(setup, policy, top_k, layers);
    t.prefetch = mode && mode->prefetch_call;
    return cuda::run_virtual_training(t, routing);
  };
  const auto off = run("static", nullptr);
  EXPECT_LT(off.loss.back(), 0.98 * off.loss.front())
      << "the loss did not fall: the gradients do not train";
  for (int mi : {0, 1, 2, 4, 5}) {
    const PathMode& mode = kPathModes[mi];
    const auto on = run("feplb", &mode);
    ASSERT_EQ(off.loss.size(), on.loss.size());
    EXPECT_GT(on.migrated_slices, 0) << mode.name << ": skewed routing but nothing migrated";
    for (size_t i = 0; i < off.loss.size(); ++i) {
      EXPECT_TRUE(std::isfinite(on.loss[i])) << mode.name << " step " << i;
      EXPECT_NEAR(on.loss[i], off.loss[i], 1e-2 * off.loss[i]) << mode.name << " step " << i;
    }
  }
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
  const ReferenceMoe m = experts_for(21, experts);
  const auto in = skewed_inputs(4, 1, experts, top_k, 64, 3.0);
  cuda::RuntimeConfig c = config_for(1, experts, top_k, 64, "feplb").runtime;
  c.training = false;
  cuda::EpRuntime rt(c, *transport);
  cuda::MoeLayer layer(rt, {top_k, "nccl"}, cuda::make_gpu_planner(rt, "feplb"));
  cuda::Stream s;
  RankZeroForward f(m, c.topo, in[0], experts);
  FEPLB_CUDA_CHECK(cudaMemsetAsync(f.out.get(), 0xff, f.out.bytes(), s.get()));
  f.forward(layer, 64, s.get());
  cuda::sync_with_timeout(s.get(), 30, "nccl forward");
  expect_matches_reference(f.result(), m, in, top_k, "nccl world 1");
}

}  // namespace
}  // namespace feplb

namespace feplb {
namespace {

// One rank's inference layer (8 experts, top-2, 48 tokens, feplb), its weights and inputs from
// `seed`: the two tests below run it on unusual streams.
struct OneRankInference {
  static constexpr int kExperts = 8, kTopK = 2;
  static constexpr int64_t kTokens = 48;
  OneRankInference(uint64_t seed, const char* name, cuda::ExpertGemm gemm = cuda::ExpertGemm::kAuto)
      : m(experts_for(seed, kExperts)),
        in(skewed_inputs(seed + 1, 1, kExperts, kTopK, kTokens, 3.0)),
        c(eval_config(gemm)),
        rt(c, group.endpoint(0)),
        layer(rt, {kTopK, name}, cuda::make_gpu_planner(rt, "feplb")),
        f(m, c.topo, in[0], kExperts) {}
  static cuda::RuntimeConfig eval_config(cuda::ExpertGemm gemm) {
    cuda::RuntimeConfig c = config_for(1, kExperts, kTopK, kTokens, "feplb").runtime;
    c.training = false;
    c.expert_gemm = gemm;
    return c;
  }
  void expect_matches(const std::string& what) const {
    expect_matches_reference(f.result(), m, in, kTopK, what);
  }
  ReferenceMoe m;
  std::vector<RankInputs> in;
  cuda::InProcessGroup group{1};
  cuda::RuntimeConfig c;
  cuda::EpRuntime rt;
  cuda::MoeLayer layer;
  RankZeroForward f;
};

// A framework's current stream is often the legacy default stream: the layer runs there too.
TEST(Layer, RunsOnTheLegacyDefaultStream) {
  FEPLB_SKIP_WITHOUT_GPU();
  OneRankInference t(31, "default-stream");
  FEPLB_CUDA_CHECK(cudaMemset(t.f.out.get(), 0xff, t.f.out.bytes()));
  t.f.forward(t.layer, t.kTokens, nullptr);  // the legacy default stream
  FEPLB_CUDA_CHECK(cudaDeviceSynchronize());
  t.expect_matches("default stream");
}

std::string input_error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

size_t graph_nodes(cudaGraph_t graph) {
  size_t nodes = 0;
  FEPLB_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  return nodes;
}

// A call on a stream being captured that cannot be captured (here: one rank whose expert GEMMs are
// cuBLAS calls per expert, which take their row counts from the host; and synchronize, which waits
// on the host) is refused with an error that names the call and why; nothing of it is captured
// (the capture ends with an empty graph), and the layer and its runtime work as before after.
TEST(Layer, AnUncapturableCallOnACapturingStreamIsAClearError) {
  FEPLB_SKIP_WITHOUT_GPU();
  OneRankInference t(33, "captured", cuda::ExpertGemm::kPerExpert);
  cuda::Stream s;
  FEPLB_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  const std::string forward = input_error_of([&] { t.f.forward(t.layer, t.kTokens, s.get()); });
  const std::string sync = input_error_of([&] { t.rt.synchronize(s.get()); });
  cudaGraph_t graph = nullptr;
  FEPLB_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  const size_t nodes = graph_nodes(graph);
  FEPLB_CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_NE(forward.find("forward of layer 'captured': its stream is being captured into a CUDA "
                         "graph, and this call cannot be: its expert GEMMs are cuBLAS calls"),
            std::string::npos)
      << forward;
  EXPECT_NE(sync.find("synchronize: its stream is being captured"), std::string::npos) << sync;
  EXPECT_EQ(nodes, 0u) << "part of a refused call was captured";
  FEPLB_CUDA_CHECK(cudaMemset(t.f.out.get(), 0xff, t.f.out.bytes()));
  t.f.forward(t.layer, t.kTokens, s.get());
  t.rt.synchronize(s.get());
  t.expect_matches("after a refused capture");
}

// One rank training on the grouped GEMMs (rows counted on the GPU): the setting whose forward and
// backward a CUDA graph can hold. Inputs, outputs and gradients live in fixed device buffers, as
// a captured step needs: each micro-batch is copied into them.
struct OneRankCapture {
  static constexpr int kExperts = 8, kTopK = 2;
  static constexpr int64_t kTokens = 96;
  explicit OneRankCapture(const char* name)
      : m(experts_for(41, kExperts)),
        setup(make_setup()),
        rt(setup.runtime, group.endpoint(0)),
        layer(rt, {kTopK, name}, cuda::make_gpu_planner(rt, "feplb")),
        w(kExperts, kHidden, kFfn, /*grads=*/true),
        x(kTokens * kHidden),
        out(kTokens * kHidden),
        dy(kTokens * kHidden),
        dx(kTokens * kHidden),
        idx(kTokens * kTopK),
        wt(kTokens * kTopK),
        dwt(kTokens * kTopK) {
    const auto w16 = testing::to_bf16(testing::local_weights(m, setup.runtime.topo, 0));
    FEPLB_CUDA_CHECK(cudaMemcpy(w.weights(), w16.data(), w16.size() * 2, cudaMemcpyHostToDevice));
  }
  static testing::LayerSetup make_setup() {
    testing::LayerSetup c = config_for(1, kExperts, kTopK, kTokens, "feplb");
    c.runtime.expert_gemm = cuda::ExpertGemm::kGrouped;
    c.top_k = kTopK;
    return c;
  }
  // Micro-batch `in` with dL/dout `go` into the input buffers; every output and gradient NaN.
  void load(const RankInputs& in, const std::vector<float>& go) {
    const auto x16 = testing::to_bf16(in.hidden), dy16 = testing::to_bf16(go);
    FEPLB_CUDA_CHECK(cudaMemcpy(x.get(), x16.data(), x.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(cudaMemcpy(dy.get(), dy16.data(), dy.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(
        cudaMemcpy(idx.get(), in.topk_idx.data(), idx.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(
        cudaMemcpy(wt.get(), in.topk_weight.data(), wt.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(cudaMemset(out.get(), 0xff, out.bytes()));
    FEPLB_CUDA_CHECK(cudaMemset(dx.get(), 0xff, dx.bytes()));
    FEPLB_CUDA_CHECK(cudaMemset(dwt.get(), 0xff, dwt.bytes()));
    FEPLB_CUDA_CHECK(cudaMemset(w.grads(), 0xff, w.grad_bytes()));
  }
  cuda::MicroBatch forward(cudaStream_t s) {
    return layer.forward(w.params(), x.get(), idx.get(), wt.get(), kTokens, out.get(), s);
  }
  void backward(cuda::MicroBatch mb, cudaStream_t s) {
    layer.backward(std::move(mb), w.params(), dy.get(), wt.get(), dx.get(), dwt.get(),
                   w.grad_views(), cuda::GradMode::kOverwrite, s);
  }
  testing::BackwardResult result() const {
    testing::BackwardResult r;
    r.out = testing::download_bf16(out);
    r.grad_hidden = testing::download_bf16(dx);
    r.grad_topk_weight = testing::download_f32(dwt.get(), dwt.size());
    r.main_grad = testing::download_f32(w.grads(), w.grad_bytes() / sizeof(float));
    return r;
  }
  ReferenceMoe m;
  testing::LayerSetup setup;
  cuda::InProcessGroup group{1};
  cuda::EpRuntime rt;
  cuda::MoeLayer layer;
  cuda::LocalExperts w;
  cuda::DeviceBuffer<__nv_bfloat16> x, out, dy, dx;
  cuda::DeviceBuffer<int32_t> idx;
  cuda::DeviceBuffer<float> wt, dwt;
};

std::vector<float> random_grad_out(uint64_t seed, int64_t n) {
  Rng rng(seed);
  std::vector<float> go(static_cast<size_t>(n));
  for (float& v : go) v = round_to_bf16(static_cast<float>(rng.normal()));
  return go;
}

// One rank's forward and backward captured into one CUDA graph (global capture mode, as
// torch.cuda.graph), then replayed over micro-batches the capture never saw (new routing copied
// into the captured inputs: skewed, uniform, every token's first choice on one hot expert so that
// some experts get no rows, and the captured one again): every replay's output and gradients
// match the float64 reference and are bit for bit those of eager calls on the same inputs; the
// layer's routing after each replay is that replay's counts.
TEST(LayerCapture, OneRankForwardAndBackwardReplayNewRoutings) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "grouped GEMMs need an H100 or H200";
  OneRankCapture t("graphed");
  const int E = t.kExperts, K = t.kTopK;
  const int64_t S = t.kTokens;
  const auto captured_in = skewed_inputs(51, 1, E, K, S, 3.0);
  const auto captured_go = random_grad_out(52, S * kHidden);
  cuda::Stream s;
  {  // warm: the layer's first calls, eagerly (as torch.cuda.graph's users warm up)
    t.load(captured_in[0], captured_go);
    t.backward(t.forward(s.get()), s.get());
    FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  }
  t.load(captured_in[0], captured_go);
  FEPLB_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  t.backward(t.forward(s.get()), s.get());
  cudaGraph_t graph = nullptr;
  FEPLB_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  EXPECT_GT(graph_nodes(graph), 0u);
  cudaGraphExec_t exec = nullptr;
  FEPLB_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  struct Case {
    const char* what;
    std::vector<RankInputs> in;
  };
  const std::vector<Case> cases = {
      {"skewed", skewed_inputs(61, 1, E, K, S, 4.0)},
      {"uniform", skewed_inputs(62, 1, E, K, S, 1.0)},
      {"one hot expert", skewed_inputs(63, 1, E, K, S, 1.0, /*hot_expert=*/0)},
      {"the captured micro-batch", captured_in},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::string what = std::string("replay ") + cases[c].what;
    const RankInputs& in = cases[c].in[0];
    const auto go = random_grad_out(70 + c, S * kHidden);
    t.load(in, go);
    FEPLB_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
    FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    const testing::BackwardResult replayed = t.result();
    expect_gradients_match({{replayed}}, t.setup, t.m, cases[c].in, {go}, what);
    std::vector<int64_t> counts(static_cast<size_t>(E), 0);
    for (int32_t e : in.topk_idx) ++counts[static_cast<size_t>(e)];
    const RoutingStep& routing = t.layer.last_routing();
    for (int e = 0; e < E; ++e) EXPECT_EQ(routing.at(0, e), counts[e]) << what << " expert " << e;
    const auto eager_run = [&] {
      t.load(in, go);
      t.backward(t.forward(s.get()), s.get());
      FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
      return t.result();
    };
    const testing::BackwardResult eager = eager_run(), eager_again = eager_run();
    t.load(in, go);
    FEPLB_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
    FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    const testing::BackwardResult replayed_again = t.result();
    EXPECT_TRUE(same_bits(replayed.out, eager.out)) << what << ": out differs from eager";
    EXPECT_TRUE(same_bits(replayed.grad_hidden, eager.grad_hidden)) << what << ": d hidden";
    EXPECT_TRUE(same_bits(replayed.grad_topk_weight, eager.grad_topk_weight))
        << what << ": d topk_weight";
    // The layer is deterministic (an expert's rows keep token order; no split reductions): two
    // eager runs agree bit for bit, and a replay with them.
    EXPECT_TRUE(same_bits(eager.main_grad, eager_again.main_grad)) << what << ": eager dW twice";
    EXPECT_TRUE(same_bits(replayed.main_grad, eager.main_grad)) << what << ": dW";
    EXPECT_TRUE(same_bits(replayed.main_grad, replayed_again.main_grad)) << what << ": dW twice";
  }
  // A replay that routes a pair to an expert id out of range: the layer's next call says so (as
  // for an eager forward, whose counts also reach the host after the call), and works after.
  RankInputs bad = cases[0].in[0];
  bad.topk_idx[5] = E;
  t.load(bad, random_grad_out(80, S * kHidden));
  FEPLB_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  const std::string error = input_error_of([&] { t.forward(s.get()); });
  EXPECT_NE(error.find("to expert ids outside [0, 8) (topk_idx out of range)"), std::string::npos)
      << error;
  FEPLB_CUDA_CHECK(cudaGraphExecDestroy(exec));
  FEPLB_CUDA_CHECK(cudaGraphDestroy(graph));
  const auto go = random_grad_out(81, S * kHidden);
  t.load(cases[0].in[0], go);
  t.backward(t.forward(s.get()), s.get());
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  expect_gradients_match({{t.result()}}, t.setup, t.m, cases[0].in, {go}, "after the graph");
}

// A forward-only runtime (one rank, grouped GEMMs): the forward alone captured (its saved
// activations are released inside the graph), replayed on two micro-batches the capture never saw,
// each against the float64 reference.
TEST(LayerCapture, OneRankInferenceForwardReplays) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "grouped GEMMs need an H100 or H200";
  OneRankInference t(35, "graphed-eval", cuda::ExpertGemm::kGrouped);
  cuda::Stream s;
  t.f.forward(t.layer, t.kTokens, s.get());  // warm, eagerly
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  FEPLB_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  t.f.forward(t.layer, t.kTokens, s.get());
  cudaGraph_t graph = nullptr;
  FEPLB_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  FEPLB_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (const uint64_t seed : {36u, 37u}) {
    const auto in = skewed_inputs(seed, 1, t.kExperts, t.kTopK, t.kTokens, 5.0);
    const auto x16 = testing::to_bf16(in[0].hidden);
    FEPLB_CUDA_CHECK(cudaMemcpy(t.f.x.get(), x16.data(), t.f.x.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(
        cudaMemcpy(t.f.idx.get(), in[0].topk_idx.data(), t.f.idx.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(
        cudaMemcpy(t.f.wt.get(), in[0].topk_weight.data(), t.f.wt.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(cudaMemset(t.f.out.get(), 0xff, t.f.out.bytes()));
    FEPLB_CUDA_CHECK(cudaGraphLaunch(exec, s.get()));
    FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    expect_matches_reference(t.f.result(), t.m, in, t.kTopK,
                             "inference replay " + std::to_string(seed));
  }
  FEPLB_CUDA_CHECK(cudaGraphExecDestroy(exec));
  FEPLB_CUDA_CHECK(cudaGraphDestroy(graph));
}

// A micro-batch's forward and backward are captured both or neither: a captured backward of an
// eager forward is refused before it captures anything, and that backward then runs eagerly.
TEST(LayerCapture, ABackwardIsCapturedOnlyWithItsForward) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "grouped GEMMs need an H100 or H200";
  OneRankCapture t("half-graphed");
  const auto in = skewed_inputs(91, 1, t.kExperts, t.kTopK, t.kTokens, 3.0);
  const auto go = random_grad_out(92, t.kTokens * kHidden);
  cuda::Stream s;
  t.load(in[0], go);
  cuda::MicroBatch mb = t.forward(s.get());
  FEPLB_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal));
  const std::string error = input_error_of([&] {
    t.layer.backward(std::move(mb), t.w.params(), t.dy.get(), t.wt.get(), t.dx.get(), t.dwt.get(),
                     t.w.grad_views(), cuda::GradMode::kOverwrite, s.get());
  });
  cudaGraph_t graph = nullptr;
  FEPLB_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  const size_t nodes = graph_nodes(graph);
  FEPLB_CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_NE(error.find("its stream is being captured into a CUDA graph, but its forward was not"),
            std::string::npos)
      << error;
  EXPECT_EQ(nodes, 0u);
  t.backward(std::move(mb), s.get());
  FEPLB_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  expect_gradients_match({{t.result()}}, t.setup, t.m, in, {go}, "eager after a refused capture");
}

}  // namespace
}  // namespace feplb

namespace feplb {
namespace {

// Rows a framework dispatched itself (forward_dispatched / backward_dispatched): each rank's rows
// grouped by its experts, heavily skewed (rank 0's first expert has most of them), through phase
// 2 and the GEMMs, against the float64 reference (every row a token routed to its expert alone,
// weight 1): the output rows, dL/drows and every expert's dL/dW. "feplb-prefetch": a warm-up
// forward, then prefetch() before the measured one (the same rows: the predictions are used).
// "feplb-auto": the default, feplb choosing its mode (it keeps to two phases here).
TEST(LayerDispatched, RowsAtHomeMatchTheReference) {
  FEPLB_SKIP_WITHOUT_GPU();
  const int ranks = 4, experts = 16, per = experts / ranks;
  Rng rng(71);
  const ReferenceMoe m = random_experts(rng, kHidden, kFfn, experts);
  for (const std::string variant : {"static", "feplb", "feplb-prefetch", "feplb-auto"}) {
    const bool prefetch = variant == "feplb-prefetch";
    const char* policy = variant == "static" ? "static" : "feplb";
    testing::LayerSetup setup = config_for(ranks, experts, 1, 512, policy);
    setup.runtime.recv_capacity_rows = 1024;
    setup.runtime.name = "dispatched." + variant;
    if (prefetch) {
      setup.runtime.knobs.prefetch = 1;
      setup.runtime.knobs.prefetch_window_us = 1e6;
    }
    if (variant == "feplb-auto") {
      setup.runtime.knobs.one_hop = -1;
      setup.runtime.knobs.prefetch = -1;
      setup.runtime.knobs.time_balance_budget = -1;
    }
    // Rows per local expert on each rank: expert 0 (rank 0) is hot.
    std::vector<std::vector<int64_t>> counts(ranks, std::vector<int64_t>(per, 0));
    std::vector<RankInputs> rows(ranks);
    std::vector<std::vector<float>> grad_out(ranks);
    for (int r = 0; r < ranks; ++r) {
      for (int i = 0; i < per; ++i) counts[r][i] = (r == 0 && i == 0) ? 600 : 16 + 7 * i + 3 * r;
      for (int i = 0; i < per; ++i) {
        for (int64_t k = 0; k < counts[r][i]; ++k) {
          rows[r].topk_idx.push_back(r * per + i);
          rows[r].topk_weight.push_back(1.0f);
          for (int64_t c = 0; c < kHidden; ++c) {
            rows[r].hidden.push_back(round_to_bf16(static_cast<float>(rng.normal())));
            grad_out[r].push_back(round_to_bf16(static_cast<float>(rng.normal())));
          }
        }
      }
      rows[r].tokens = static_cast<int64_t>(rows[r].topk_idx.size());
    }
    std::vector<std::vector<float>> out(ranks), grad_rows(ranks), dw(ranks);
    std::atomic<int64_t> guests{0}, hits{0};
    cuda::InProcessGroup group(ranks, 30);
    cuda::run_rank_threads(ranks, [&](int r) {
      cuda::RuntimeConfig c = setup.runtime;
      cuda::EpRuntime rt(c, group.endpoint(r));
      cuda::MoeLayer layer(rt, {1, "dispatched"}, cuda::make_gpu_planner(rt, policy));
      cuda::LocalExperts w(per, kHidden, kFfn, true);
      const auto w16 = testing::to_bf16(testing::local_weights(m, c.topo, r));
      FEPLB_CUDA_CHECK(cudaMemcpy(w.weights(), w16.data(), w16.size() * 2, cudaMemcpyHostToDevice));
      FEPLB_CUDA_CHECK(cudaMemset(w.grads(), 0, w.grad_bytes()));
      const int64_t n = rows[r].tokens;
      const auto x16 = testing::to_bf16(rows[r].hidden), g16 = testing::to_bf16(grad_out[r]);
      cuda::DeviceBuffer<__nv_bfloat16> x(x16.size()), g(g16.size()), y(x16.size()), gx(x16.size());
      FEPLB_CUDA_CHECK(cudaMemcpy(x.get(), x16.data(), x16.size() * 2, cudaMemcpyHostToDevice));
      FEPLB_CUDA_CHECK(cudaMemcpy(g.get(), g16.data(), g16.size() * 2, cudaMemcpyHostToDevice));
      FEPLB_CUDA_CHECK(cudaMemset(y.get(), 0xff, y.bytes()));
      FEPLB_CUDA_CHECK(cudaMemset(gx.get(), 0xff, gx.bytes()));
      cuda::Stream s;
      if (prefetch) {
        cuda::MicroBatch warm =
            layer.forward_dispatched(w.params(), x.get(), counts[r], y.get(), s.get());
        warm = cuda::MicroBatch();
        FEPLB_CUDA_CHECK(cudaMemsetAsync(y.get(), 0xff, y.bytes(), s.get()));
        layer.prefetch(w.params(), s.get());
      }
      cuda::MicroBatch mb =
          layer.forward_dispatched(w.params(), x.get(), counts[r], y.get(), s.get());
      hits += r == 0 ? mb.stats().prefetch_hits : 0;
      layer.backward_dispatched(std::move(mb), w.params(), g.get(), gx.get(), w.grad_views(),
                                cuda::GradMode::kAccumulate, s.get());
      layer.sync_gradients(s.get());
      cuda::sync_with_timeout(s.get(), 30, "dispatched");
      std::vector<uint16_t> h16(static_cast<size_t>(n * kHidden));
      FEPLB_CUDA_CHECK(cudaMemcpy(h16.data(), y.get(), h16.size() * 2, cudaMemcpyDeviceToHost));
      for (uint16_t v : h16) out[r].push_back(bf16_to_float(v));
      FEPLB_CUDA_CHECK(cudaMemcpy(h16.data(), gx.get(), h16.size() * 2, cudaMemcpyDeviceToHost));
      for (uint16_t v : h16) grad_rows[r].push_back(bf16_to_float(v));
      dw[r].resize(static_cast<size_t>(w.weight_elems()));
      FEPLB_CUDA_CHECK(
          cudaMemcpy(dw[r].data(), w.grads(), dw[r].size() * 4, cudaMemcpyDeviceToHost));
      guests += layer.last_backward_stats().guest_rows;
    });
    for (int r = 0; r < ranks; ++r) {
      const std::string at = variant + " rank " + std::to_string(r);
      std::vector<double> go(grad_out[r].begin(), grad_out[r].end());
      const auto fwd =
          m.forward(rows[r].hidden, rows[r].topk_idx, rows[r].topk_weight, rows[r].tokens, 1);
      const auto ref =
          m.backward(rows[r].hidden, rows[r].topk_idx, rows[r].topk_weight, go, rows[r].tokens, 1);
      expect_close(out[r], fwd, at + " out rows");
      expect_close(grad_rows[r], ref.hidden, at + " d rows");
      const size_t per_expert = static_cast<size_t>(3 * kHidden * kFfn);
      std::vector<double> dw_ref(
          ref.weights.begin() + static_cast<std::ptrdiff_t>(r * per * per_expert),
          ref.weights.begin() + static_cast<std::ptrdiff_t>((r + 1) * per * per_expert));
      expect_close(dw[r], dw_ref, at + " dW");
    }
    if (std::string(policy) == "feplb") {
      EXPECT_GT(guests.load(), 0) << "a hot expert, yet no rank computed guest rows";
    }
    if (prefetch) {
      EXPECT_GT(hits.load(), 0) << "the same rows again, yet no prefetched weights were used";
    }
  }
}

// Rows a framework dispatched are at their experts' homes already: a planner that sends rows
// straight to helpers (feplb with one_hop = 1) cannot run there, and says so.
TEST(LayerDispatched, OneHopPlannersAreRefused) {
  FEPLB_SKIP_WITHOUT_GPU();
  cuda::InProcessGroup group(1);
  cuda::RuntimeConfig c = config_for(1, 4, 1, 8, "feplb").runtime;
  c.knobs.one_hop = 1;
  cuda::EpRuntime rt(c, group.endpoint(0));
  cuda::MoeLayer layer(rt, {1, "one-hop"}, cuda::make_gpu_planner(rt, "feplb"));
  cuda::LocalExperts w(4, kHidden, kFfn, true);
  cuda::Stream s;
  const std::vector<int64_t> none(4, 0);
  try {
    layer.forward_dispatched(w.params(), nullptr, none, nullptr, s.get());
    ADD_FAILURE() << "forward_dispatched ran a one-hop planner";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("one hop"), std::string::npos) << e.what();
  }
}

// ---- the runtime's call thread (RuntimeConfig::call_thread) ----------------------------------

// The runtime's call thread runs the same calls: the forward's outputs are the bytes the caller's
// thread computes (both with grouped expert GEMMs), for every policy the GPU layer runs.
TEST(LayerCallThread, ForwardIsTheCallersThreadsBitForBit) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "no grouped GEMMs on this GPU";
  const int ranks = 4, experts = 32, top_k = 4;
  const ReferenceMoe m = experts_for(501, experts);
  const auto in = skewed_inputs(502, ranks, experts, top_k, 96, 8.0);
  for (const char* policy : {"static", "feplb-paper", "feplb", "oracle"}) {
    testing::LayerSetup c = config_for(ranks, experts, top_k, 96, policy);
    c.runtime.expert_gemm = cuda::ExpertGemm::kGrouped;
    const auto off = run_layer(c, m, in, /*forwards=*/2);
    c.runtime.call_thread = cuda::CallThread::kOn;
    const auto on = run_layer(c, m, in, /*forwards=*/2);
    expect_matches_reference(on, m, in, top_k, std::string(policy) + " on the call thread");
    int64_t copies = 0;
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(on[r].out, off[r].out) << policy << " rank " << r << ": not the same bytes";
      EXPECT_EQ(on[r].stats.copies, off[r].stats.copies) << policy << " rank " << r;
      copies += on[r].stats.copies;
    }
    if (std::string(policy) != "static") {
      EXPECT_GT(copies, 0) << policy << ": nothing moved";
    }
  }
}

// Every path of the feplb planner (rows in one hop, weights before routing, time balancing, the
// chooser) on the call thread, forward and backward against the float64 reference.
class LayerCallThreadPathTest : public GpuTest<int> {};

TEST_P(LayerCallThreadPathTest, ForwardAndBackwardMatchFloat64Reference) {
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "no grouped GEMMs on this GPU";
  const PathMode& mode = kPathModes[GetParam()];
  const int ranks = 4, experts = 32, top_k = 4;
  const ReferenceMoe m = experts_for(510, experts);
  const auto in = skewed_inputs(511, ranks, experts, top_k, 96, 8.0);
  testing::LayerSetup c = path_config(ranks, experts, top_k, 96, mode);
  c.runtime.call_thread = cuda::CallThread::kOn;
  expect_matches_reference(run_layer(c, m, in, /*forwards=*/2), m, in, top_k, mode.name);
  expect_backward_matches(c, m, in, 512, std::string(mode.name) + " on the call thread",
                          /*layers=*/2);
}

std::string PathName(const ::testing::TestParamInfo<int>& param) {
  return kPathModes[param.param].name;
}
INSTANTIATE_TEST_SUITE_P(Paths, LayerCallThreadPathTest,
                         ::testing::Range(0, static_cast<int>(std::size(kPathModes))), PathName);

// Micro-batches in flight (a pipeline schedule) on the call thread, their memory given back by
// backwards queued behind forwards.
TEST(LayerCallThread, SeveralMicroBatchesInFlightMatchTheReference) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "no grouped GEMMs on this GPU";
  const int ranks = 4, experts = 16, top_k = 2;
  const ReferenceMoe m = experts_for(520, experts);
  std::vector<std::vector<RankInputs>> in;
  std::vector<std::vector<std::vector<float>>> go;
  three_micro_batches(521, 525, ranks, experts, top_k, in, go);
  testing::LayerSetup c = config_for(ranks, experts, top_k, 128, "feplb");
  c.runtime.call_thread = cuda::CallThread::kOn;
  const auto got = testing::run_schedule(c, m, in, go, "F0 F1 B0 F2 B1 B2");
  const std::vector<double> dw_total = expect_micro_batches_match(got, m, in, go, top_k, "");
  expect_dw_matches(got[0], c.runtime.topo, dw_total, "call thread, 3 micro-batches: ");
}

// The caller's thread never waits for the counts or the plan: with every rank's stream held up
// for 300 ms, forward, backward and sync_gradients return within 100 ms on every rank, and the
// results are right once the stream runs.
TEST(LayerCallThread, TheCallerNeverWaitsForTheCounts) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "no grouped GEMMs on this GPU";
  const int ranks = 4, experts = 64, top_k = 8;
  const int64_t tokens = 64;
  const ReferenceMoe m = experts_for(530, experts);
  const auto in = skewed_inputs(531, ranks, experts, top_k, tokens, 3.0);
  testing::LayerSetup setup = config_for(ranks, experts, top_k, tokens, "feplb");
  setup.runtime.call_thread = cuda::CallThread::kOn;
  const cuda::RuntimeConfig& c = setup.runtime;
  cuda::InProcessGroup group(ranks, c.timeout_s);
  std::vector<testing::RankResult> got(ranks);
  std::vector<double> held_ms(ranks, 0.0);
  std::vector<int> ran_early(ranks, 0);
  cuda::run_rank_threads(ranks, [&](int r) {
    cuda::EpRuntime rt(c, group.endpoint(r));
    ASSERT_TRUE(rt.call_thread());
    cuda::MoeLayer layer(rt, {top_k, "no-wait"}, cuda::make_gpu_planner(rt, "feplb"));
    cuda::LocalExperts w(c.topo.experts_per_rank(), kHidden, kFfn, /*grads=*/true);
    const auto w16 = testing::to_bf16(testing::local_weights(m, c.topo, r));
    FEPLB_CUDA_CHECK(cudaMemcpy(w.weights(), w16.data(), w16.size() * 2, cudaMemcpyHostToDevice));
    const auto x16 = testing::to_bf16(in[r].hidden);
    cuda::DeviceBuffer<__nv_bfloat16> x(x16.size()), out(x16.size());
    cuda::DeviceBuffer<int32_t> idx(in[r].topk_idx.size());
    cuda::DeviceBuffer<float> wt(in[r].topk_weight.size());
    FEPLB_CUDA_CHECK(cudaMemcpy(x.get(), x16.data(), x.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(
        cudaMemcpy(idx.get(), in[r].topk_idx.data(), idx.bytes(), cudaMemcpyHostToDevice));
    FEPLB_CUDA_CHECK(
        cudaMemcpy(wt.get(), in[r].topk_weight.data(), wt.bytes(), cudaMemcpyHostToDevice));
    cuda::DeviceBuffer<__nv_bfloat16> go(static_cast<size_t>(tokens * kHidden)),
        gx(static_cast<size_t>(tokens * kHidden));
    cuda::DeviceBuffer<float> gw(static_cast<size_t>(tokens * top_k));
    FEPLB_CUDA_CHECK(cudaMemset(go.get(), 0, go.bytes()));
    cuda::Stream s;
    for (int call = 0; call < 2; ++call) {  // a warm call, then the held-up stream
      if (call == 1) {
        FEPLB_CUDA_CHECK(cudaLaunchHostFunc(
            s.get(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
            nullptr));
      }
      const auto t0 = std::chrono::steady_clock::now();
      cuda::MicroBatch mb =
          layer.forward(w.params(), x.get(), idx.get(), wt.get(), tokens, out.get(), s.get());
      layer.backward(std::move(mb), w.params(), go.get(), wt.get(), gx.get(), gw.get(),
                     w.grad_views(), cuda::GradMode::kAccumulate, s.get());
      layer.sync_gradients(s.get());
      if (call == 1) {
        held_ms[r] =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        ran_early[r] = cudaStreamQuery(s.get()) != cudaErrorNotReady;
      }
      rt.synchronize(s.get());
    }
    std::vector<uint16_t> o16(out.size());
    FEPLB_CUDA_CHECK(cudaMemcpy(o16.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
    for (uint16_t v : o16) got[r].out.push_back(bf16_to_float(v));
    got[r].stats = layer.last_forward_stats();
  });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_FALSE(ran_early[r]) << "rank " << r << ": the stream ran already";
    EXPECT_LT(held_ms[r], 100.0) << "rank " << r << ": the calls waited for the held-up stream";
  }
  expect_matches_reference(got, m, in, top_k, "call thread, held-up stream");
}

// A queued call that fails: its outputs are NaN, the runtime's next call raises its error (every
// rank alike: the out-of-range ids reach every rank with the counts), synchronize() too.
TEST(LayerCallThread, AQueuedCallsErrorIsRaisedByTheNextCall) {
  FEPLB_SKIP_WITHOUT_GPU();
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "no grouped GEMMs on this GPU";
  const int ranks = 2, experts = 8, top_k = 1;
  const int64_t tokens = 16;
  testing::LayerSetup setup = config_for(ranks, experts, top_k, tokens, "feplb");
  setup.runtime.call_thread = cuda::CallThread::kOn;
  const cuda::RuntimeConfig& c = setup.runtime;
  cuda::InProcessGroup group(ranks, c.timeout_s);
  std::vector<std::string> next_call(ranks), synced(ranks);
  std::vector<int> nan_outputs(ranks, 0);
  // Nobody frees device memory or destroys a stream (which waits for the whole GPU, holding the
  // driver's lock) before every rank's queued calls are enqueued: a rank's call thread blocked on
  // that lock would leave its stream's wait, and so the GPU, stuck (seen on an H100: one rank's
  // cudaFree and the other's cudaStreamDestroy held up its call thread's cudaMemsetAsync).
  std::barrier all_enqueued(ranks);
  struct ArriveAtExit {
    std::barrier<>& b;
    ~ArriveAtExit() { b.arrive_and_wait(); }
  };
  cuda::run_rank_threads(ranks, [&](int r) {
    cuda::EpRuntime rt(c, group.endpoint(r));
    cuda::MoeLayer layer(rt, {top_k, "bad-ids"}, cuda::make_gpu_planner(rt, "feplb"));
    cuda::LocalExperts w(c.topo.experts_per_rank(), kHidden, kFfn, /*grads=*/false);
    TokenBuffers t(tokens);
    const int32_t bad = experts + 3;  // rank 0's first token
    if (r == 0) FEPLB_CUDA_CHECK(cudaMemcpy(t.idx.get(), &bad, 4, cudaMemcpyHostToDevice));
    cuda::Stream s;
    const ArriveAtExit at_exit{all_enqueued};  // after synchronize() drained this rank's calls
    cuda::MicroBatch mb = t.forward(layer, w, s.get());  // queued: returns
    cuda::sync_with_timeout(s.get(), c.timeout_s, "the failed forward's stream");
    std::vector<uint16_t> o16(t.out.size());
    FEPLB_CUDA_CHECK(cudaMemcpy(o16.data(), t.out.get(), t.out.bytes(), cudaMemcpyDeviceToHost));
    for (uint16_t v : o16) nan_outputs[r] += std::isnan(bf16_to_float(v)) ? 1 : 0;
    try {
      cuda::MicroBatch again = t.forward(layer, w, s.get());
    } catch (const InputError& e) {
      next_call[r] = e.what();
    }
    try {
      rt.synchronize(s.get());
    } catch (const InputError& e) {
      synced[r] = e.what();
    }
  });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(nan_outputs[r], tokens * kHidden) << "rank " << r << ": outputs not all NaN";
    EXPECT_NE(next_call[r].find("out of range"), std::string::npos)
        << "rank " << r << ": " << next_call[r];
    EXPECT_EQ(synced[r], next_call[r]) << "rank " << r;
  }
}

// kOn where its needs are not met is a clear error when the runtime is made (before any
// collective); kAuto then runs the calls on the caller's thread.
TEST(LayerCallThread, ItsNeedsAreCheckedWhenTheRuntimeIsMade) {
  FEPLB_SKIP_WITHOUT_GPU();
  const auto made = [](int ranks, cuda::CallThread mode, std::string& error) {
    testing::LayerSetup setup = config_for(ranks, 8, 1, 16, "feplb");
    setup.runtime.call_thread = mode;
    cuda::InProcessGroup group(ranks, setup.runtime.timeout_s);
    std::vector<int> on(ranks, 0);
    std::vector<std::string> errors(ranks);
    cuda::run_rank_threads(ranks, [&](int r) {
      try {
        cuda::EpRuntime rt(setup.runtime, group.endpoint(r));
        on[r] = rt.call_thread();
      } catch (const InputError& e) {
        errors[r] = e.what();
      }
    });
    error = errors[0];
    return on[0] == 1;
  };
  std::string error;
  EXPECT_FALSE(made(1, cuda::CallThread::kOn, error));
  EXPECT_NE(error.find("several ranks"), std::string::npos) << error;
  EXPECT_FALSE(made(1, cuda::CallThread::kAuto, error));
  EXPECT_TRUE(error.empty()) << error;
  if (!cuda::GroupedFfn::available()) GTEST_SKIP() << "no grouped GEMMs on this GPU";
  EXPECT_TRUE(made(2, cuda::CallThread::kAuto, error)) << error;
  const char* before = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::string kept = before ? before : "";
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);  // read when a runtime is made
  EXPECT_FALSE(made(2, cuda::CallThread::kOn, error));
  EXPECT_NE(error.find("CUDA_DEVICE_MAX_CONNECTIONS=1"), std::string::npos) << error;
  EXPECT_FALSE(made(2, cuda::CallThread::kAuto, error));
  EXPECT_TRUE(error.empty()) << error;
  if (before)
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", kept.c_str(), 1);
  else
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
}

}  // namespace
}  // namespace feplb
