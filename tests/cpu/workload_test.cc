// The workload generator and priors: reproducible bytes, valid counts, the skew knob, widening.
#include "feplb/sim/workload.h"

#include <gtest/gtest.h>

#include <numeric>

#include "feplb/core/error.h"
#include "feplb/core/topology.h"
#include "feplb/core/trace_io.h"
#include "feplb/sim/prior.h"

namespace feplb {
namespace {

std::string prior_path(const char* name) { return std::string(FEPLB_DATA_DIR) + "/priors/" + name; }

WorkloadSpec small_spec(uint64_t seed) {
  WorkloadSpec s;
  s.num_ranks = 4;
  s.tokens_per_rank = 512;
  s.top_k = 8;
  s.seq_len = 128;
  s.concentration = 300;
  s.num_steps = 3;
  s.seed = seed;
  return s;
}

TEST(Workload, SameSeedSameBytesOtherSeedOtherBytes) {
  const Prior p = expand_prior(read_prior(prior_path("olmoe-1b-7b__olmoe-repo__c4.json")), 128, 7);
  const std::string a = format_trace(generate_trace(p, small_spec(1)));
  const std::string b = format_trace(generate_trace(p, small_spec(1)));
  const std::string c = format_trace(generate_trace(p, small_spec(2)));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Round trip through the reader.
  EXPECT_EQ(format_trace(parse_trace(a)), a);
}

TEST(Workload, CountsAreValidTopKRouting) {
  const Prior p = lognormal_prior(64, 6.0, 2, 3);
  const Trace t = generate_trace(p, small_spec(5));
  ASSERT_EQ(t.steps.size(), 6u);  // 3 micro-batches x 2 layers
  for (const RoutingStep& s : t.steps) {
    for (int r = 0; r < s.num_ranks; ++r) {
      const auto row = s.row(r);
      EXPECT_EQ(std::accumulate(row.begin(), row.end(), int64_t{0}), 512 * 8);
      for (int64_t c : row) {
        EXPECT_GE(c, 0);
        EXPECT_LE(c, 512) << "a token picks distinct experts";
      }
    }
  }
}

TEST(Workload, ZeroTokensAndOneExpertDominating) {
  WorkloadSpec spec = small_spec(1);
  spec.tokens_per_rank = 0;
  const Prior p = lognormal_prior(16, 2.0, 1, 1);
  const Trace t = generate_trace(p, spec);
  for (const RoutingStep& s : t.steps) EXPECT_EQ(s.total_rows(), 0);
  // A prior with all mass on one expert: every token takes it, plus top_k - 1 others.
  Prior hot = p;
  hot.popularity[0].assign(16, 0.0);
  hot.popularity[0][3] = 1.0;
  spec.tokens_per_rank = 100;
  spec.top_k = 4;
  const Trace h = generate_trace(hot, spec);
  for (const RoutingStep& s : h.steps) {
    for (int r = 0; r < s.num_ranks; ++r) EXPECT_EQ(s.at(r, 3), 100);
  }
}

TEST(Prior, LognormalHitsTheTargetSkew) {
  for (double target : {1.2, 2.0, 4.0, 10.0}) {
    const Prior p = lognormal_prior(128, target, 3, 11);
    for (const auto& layer : p.popularity) {
      EXPECT_NEAR(max_over_mean(layer), target, 1e-6 * target);
      EXPECT_NEAR(std::accumulate(layer.begin(), layer.end(), 0.0), 1.0, 1e-12);
    }
  }
  EXPECT_THROW(lognormal_prior(128, 0.5, 1, 1), InputError);
  EXPECT_THROW(lognormal_prior(128, 200.0, 1, 1), InputError);
}

TEST(Prior, WideningKeepsEachGpusShareExactly) {
  const Prior p = read_prior(prior_path("olmoe-1b-7b__olmoe-repo__arxiv.json"));
  ASSERT_EQ(p.num_experts(), 64);
  const Prior w = expand_prior(p, 128, 9);
  ASSERT_EQ(w.num_experts(), 128);
  for (int l = 0; l < p.num_layers(); ++l) {
    for (int e = 0; e < 64; ++e) {
      EXPECT_NEAR(w.popularity[l][2 * e] + w.popularity[l][2 * e + 1], p.popularity[l][e], 1e-12);
    }
    EXPECT_NE(w.popularity[l][0], w.popularity[l][1]) << "split experts differ";
  }
  EXPECT_THROW(expand_prior(p, 96, 1), InputError);
}

TEST(Prior, ManyDonorLoadsPerGpu) {
  for (int ranks : {8, 16}) {
    const Prior p = many_donor_prior(128, ranks, 8, {1.87, 1.65, 1.21}, 0.2, 2.0, 2, 1);
    ASSERT_EQ(p.num_layers(), 2);
    const int per_gpu = 128 / ranks;
    for (const auto& pop : p.popularity) {
      for (int first = 0; first < ranks; first += 8) {
        std::vector<double> load;
        for (int g = first; g < first + 8; ++g) {
          double share = 0;
          for (int j = 0; j < per_gpu; ++j) share += pop[g * per_gpu + j];
          load.push_back(share * ranks);  // x the mean
        }
        std::sort(load.rbegin(), load.rend());
        EXPECT_NEAR(load[0], 1.87, 1e-9);
        EXPECT_NEAR(load[1], 1.65, 1e-9);
        EXPECT_NEAR(load[2], 1.21, 1e-9);
        EXPECT_NEAR(load[7], 0.2, 1e-9);
        EXPECT_NEAR(std::accumulate(load.begin(), load.end(), 0.0), 8.0, 1e-9);
      }
    }
  }
  // The two layers put the hot GPUs in different places.
  const Prior p = many_donor_prior(128, 8, 8, {1.87, 1.65, 1.21}, 0.2, 2.0, 2, 1);
  EXPECT_NE(p.popularity[0], p.popularity[1]);
  EXPECT_THROW(many_donor_prior(128, 8, 8, {3, 3, 2}, 0.2, 2.0, 1, 1), InputError);  // sums to 8
  EXPECT_THROW(many_donor_prior(128, 8, 8, {1.5, 1.5, 1.5}, 0.9, 2.0, 1, 1), InputError);
  EXPECT_THROW(many_donor_prior(128, 4, 8, {1.2, 1.2, 1.2, 1.2}, 0.2, 2.0, 1, 1), InputError);
  EXPECT_THROW(many_donor_prior(128, 8, 8, {1.5}, 0.2, 40.0, 1, 1), InputError);  // 16 per GPU
}

TEST(Workload, ImpossibleSpecsAreInputErrors) {
  const Prior p = lognormal_prior(16, 2.0, 1, 1);
  WorkloadSpec spec = small_spec(1);
  spec.num_ranks = 3;  // 16 % 3 != 0
  EXPECT_THROW(generate_trace(p, spec), InputError);
  spec = small_spec(1);
  spec.top_k = 17;
  EXPECT_THROW(generate_trace(p, spec), InputError);
  spec = small_spec(1);
  spec.seq_len = 0;
  EXPECT_THROW(generate_trace(p, spec), InputError);
}

TEST(Topology, DomainsAndPlacement) {
  const Topology t = Topology::contiguous(16, 8, 128);
  EXPECT_EQ(t.num_domains(), 2);
  EXPECT_EQ(t.domain_of(7), 0);
  EXPECT_EQ(t.domain_of(8), 1);
  EXPECT_EQ(t.home(127), 15);
  EXPECT_EQ(t.local_experts(1)[0], 8);
  const Topology small = Topology::contiguous(2, 8, 128);  // an EP group inside one node
  EXPECT_EQ(small.num_domains(), 1);
  EXPECT_EQ(small.domain_size(), 2);
  EXPECT_THROW(Topology::contiguous(12, 8, 120), InputError);              // 12 % 8 != 0
  EXPECT_THROW(Topology::contiguous(8, 8, 100), InputError);               // 100 % 8 != 0
  EXPECT_THROW(Topology::with_placement(2, 8, {0, 0, 0, 1}), InputError);  // GPU 0 holds 3
}

}  // namespace
}  // namespace feplb

namespace feplb {
namespace {

TEST(TopKFromCounts, ReproducesCountsWithDistinctExperts) {
  const RoutingStep s = generate_step(lognormal_prior(32, 8.0, 1, 4).popularity[0],
                                      WorkloadSpec{2, 300, 4, 100, 50, 1, 9}, 0, 0);
  for (int r = 0; r < 2; ++r) {
    const auto idx = topk_from_counts(s.row(r), 300, 4);
    std::vector<int64_t> again(32, 0);
    for (int64_t t = 0; t < 300; ++t) {
      for (int k = 0; k < 4; ++k) {
        ++again[idx[t * 4 + k]];
        for (int j = 0; j < k; ++j) EXPECT_NE(idx[t * 4 + k], idx[t * 4 + j]) << "token " << t;
      }
    }
    EXPECT_EQ(std::vector<int64_t>(s.row(r).begin(), s.row(r).end()), again);
  }
  const std::vector<int64_t> bad = {5, 0};
  EXPECT_THROW(topk_from_counts(bad, 4, 1), InputError);  // 5 > 4 tokens
}

}  // namespace
}  // namespace feplb
