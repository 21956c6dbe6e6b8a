// The 2026 anchors reproduce their own published behaviour: EPLB's README example exactly (and its
// planner's history, replan and install rules), MoonEP's exact S*K rows per GPU with at most E/R
// remote experts, LLEP's cap and minimum chunk. The generic invariants (validate, determinism,
// no allocation) run for them in planners_test.cc and no_alloc_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "feplb/core/error.h"
#include "feplb/core/metrics.h"
#include "feplb/core/planners/eplb_rebalance.h"
#include "test_util.h"

namespace feplb {
namespace {

using testing::Bench;
using testing::random_step;
using testing::rows_per_gpu;
using testing::step_from;

// deepseek-ai/EPLB README: 2 layers, 12 logical experts, 16 physical slots, 4 groups, 2 nodes,
// 8 GPUs; the README prints phy2log for both layers.
TEST(EplbRebalance, ReproducesTheReadmeExample) {
  const std::vector<std::vector<double>> weight = {
      {90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
      {20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27}};
  const std::vector<std::vector<int32_t>> expected = {
      {5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1},
      {7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}};
  eplb::Params p;
  p.num_experts = 12;
  p.num_replicas = 16;
  p.num_groups = 4;
  p.num_nodes = 2;
  p.num_gpus = 8;
  eplb::check_params(p);
  EXPECT_EQ(eplb::resolve_policy(p), eplb::Policy::kHierarchical);
  eplb::Workspace ws;
  for (size_t l = 0; l < weight.size(); ++l) {
    eplb::Layout out;
    eplb::rebalance(weight[l], p, out, ws);
    EXPECT_EQ(out.phy2log, expected[l]) << "layer " << l;
    // logcnt and replica ranks agree with phy2log.
    std::vector<int32_t> cnt(12, 0);
    for (size_t s = 0; s < out.phy2log.size(); ++s) {
      EXPECT_EQ(out.replica_rank[s] < out.logcnt[out.phy2log[s]], true);
      ++cnt[out.phy2log[s]];
    }
    EXPECT_EQ(cnt, out.logcnt);
  }
}

TEST(EplbRebalance, PrimitivesFollowEplbSemantics) {
  eplb::Workspace ws;
  // balanced_packing: 6 items into 2 packs of 3: LPT with the cardinality limit.
  const std::vector<double> w = {10, 9, 8, 1, 1, 1};
  std::vector<int32_t> pack(6), rank(6);
  eplb::balanced_packing(w, 2, pack, rank, ws);
  // 10 -> p0, 9 -> p1, 8 -> p1 (9 < 10), 1 (item 3) -> p0, item 4 -> p0 (11 < 17), p0 is full,
  // item 5 -> p1.
  EXPECT_EQ(pack, (std::vector<int32_t>{0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(rank, (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
  // replicate_experts: each extra slot to the largest load per replica, ties to the lower index.
  const std::vector<double> loads = {8, 4, 4};
  std::vector<int32_t> phy2log(6), rrank(6), cnt(3);
  eplb::replicate_experts(loads, 6, phy2log, rrank, cnt);
  // 8/1 -> 0 (8/2 = 4); 4, 4, 4: expert 0 (first) -> 8/3; 4, 4 -> 1 (4/2); then 2.
  EXPECT_EQ(phy2log, (std::vector<int32_t>{0, 1, 2, 0, 0, 1}));
  EXPECT_EQ(rrank, (std::vector<int32_t>{0, 0, 0, 1, 2, 1}));
  EXPECT_EQ(cnt, (std::vector<int32_t>{3, 2, 1}));
}

// EPLB issue #22: one very hot expert gets more replicas than a node has GPUs, so some GPU holds
// two of them. The forbid option caps its replicas and keeps them on distinct GPUs.
TEST(EplbRebalance, ForbidDuplicatesKeepsReplicasOnDistinctGpus) {
  eplb::Params p;
  p.num_experts = 8;
  p.num_gpus = 2;
  p.num_replicas = 14;  // 7 slots per GPU
  p.policy = eplb::Policy::kGlobal;
  const std::vector<double> w = {1000, 1, 2, 3, 4, 5, 6, 7};
  auto duplicates = [&](const eplb::Layout& out) {
    int dup = 0;
    for (int g = 0; g < 2; ++g) {
      std::set<int32_t> seen;
      for (int s = g * 7; s < (g + 1) * 7; ++s) dup += seen.insert(out.phy2log[s]).second ? 0 : 1;
    }
    return dup;
  };
  eplb::Workspace ws;
  eplb::Layout upstream, forbid;
  eplb::rebalance(w, p, upstream, ws);
  EXPECT_EQ(upstream.logcnt[0], 7);
  EXPECT_GT(duplicates(upstream), 0);
  p.forbid_duplicates = true;
  eplb::rebalance(w, p, forbid, ws);
  EXPECT_EQ(forbid.logcnt[0], 2);
  EXPECT_EQ(duplicates(forbid), 0);
  // On a realistic step the option never leaves a duplicate either.
  const RoutingStep s = random_step(8, 128, 8, 4096, 12.0, 3);
  eplb::Params q;
  q.num_experts = 128;
  q.num_gpus = 8;
  q.num_replicas = 128 + 8 * 4;
  q.forbid_duplicates = true;
  std::vector<double> load(s.expert_counts.begin(), s.expert_counts.end());
  eplb::Layout out;
  eplb::rebalance(load, q, out, ws);
  for (int g = 0; g < 8; ++g) {
    std::set<int32_t> seen(out.phy2log.begin() + g * 20, out.phy2log.begin() + (g + 1) * 20);
    EXPECT_EQ(seen.size(), 20u) << "GPU " << g;
  }
}

TEST(EplbRebalance, RejectsInconsistentShapes) {
  eplb::Params p;
  p.num_experts = 12;
  p.num_gpus = 8;
  p.num_replicas = 12;  // not a multiple of 8
  EXPECT_THROW(eplb::check_params(p), InputError);
  p.num_replicas = 16;
  p.num_nodes = 2;
  p.num_groups = 3;
  p.policy = eplb::Policy::kHierarchical;  // 3 groups on 2 nodes
  EXPECT_THROW(eplb::check_params(p), InputError);
  p.policy = eplb::Policy::kAuto;  // falls back to global, as upstream
  EXPECT_NO_THROW(eplb::check_params(p));
  EXPECT_EQ(eplb::resolve_policy(p), eplb::Policy::kGlobal);
}

// The planner: layouts come from history only, replans every eplb_interval micro-batches, and a
// replan installs exactly the replicas the previous layout lacked.
TEST(EplbPlanner, PlansFromHistoryAndInstallsOnlyNewReplicas) {
  Knobs k;
  k.eplb_window = 2;
  k.eplb_interval = 2;
  k.eplb_redundant_per_gpu = 1;
  Bench b(4, 8, 8, k);  // 2 experts per GPU, 3 slots per GPU
  auto planner = b.make("eplb");
  // Expert 0 is hot in the history; expert 7 in the step being planned.
  const std::vector<int64_t> row0 = {400, 5, 10, 15, 20, 25, 30, 35};
  const std::vector<int64_t> row7 = {5, 10, 15, 20, 25, 30, 35, 400};
  const RoutingStep hot0 = step_from({row0, row0, row0, row0});
  const RoutingStep hot7 = step_from({row7, row7, row7, row7});
  Plan plan;
  planner->plan(hot7, plan);
  EXPECT_TRUE(plan.resident.empty()) << "no history yet: the experts stay at home";
  EXPECT_TRUE(plan.copies.empty());
  planner->observe(hot0);
  planner->plan(hot7, plan);
  EXPECT_TRUE(plan.resident.empty()) << "one micro-batch observed, interval 2: no replan yet";
  planner->observe(hot0);
  planner->plan(hot7, plan);  // replanned from the two hot-0 micro-batches, not from hot7
  validate(plan, b.topo, hot7, b.shape, planner->limits());
  // GPUs that compute each expert = its replicas (every holder gets a share of its rows).
  std::vector<int> holders(8, 0);
  int64_t rows0 = 0;
  for (const Slice& sl : plan.slices) {
    ++holders[sl.expert];
    EXPECT_EQ(sl.source,
              sl.gpu == b.topo.home(sl.expert) ? RowSource::kHome : RowSource::kDispatched);
    if (sl.expert == 0) {
      rows0 += sl.rows;
      // 5 replicas of 4 rows each; two on one GPU (EPLB issue #22) compute as one slice of 8.
      EXPECT_EQ(sl.rows % 4, 0) << "rows split evenly over replicas";
    }
  }
  EXPECT_EQ(rows0, 20);  // hot7 routes 20 rows to expert 0
  EXPECT_GE(holders[0], 3) << "the 4 redundant slots go to the hot expert of the history";
  EXPECT_EQ(holders[7], 1) << "the hot expert of the planned step was not hot in the history";
  int64_t installs = 0;
  for (const Copy& c : plan.copies) {
    EXPECT_EQ(c.kind, CopyKind::kReplicaWeights);
    EXPECT_EQ(c.src_gpu, b.topo.home(c.expert));
    ++installs;
  }
  EXPECT_EQ(installs, static_cast<int64_t>(plan.resident.size())) << "the first layout is all new";
  // The next micro-batch, without a replan, keeps the layout and installs nothing.
  const std::vector<ResidentReplica> layout = plan.resident;
  planner->observe(hot7);
  planner->plan(hot0, plan);
  EXPECT_TRUE(plan.copies.empty());
  ASSERT_EQ(plan.resident.size(), layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(plan.resident[i].expert, layout[i].expert);
    EXPECT_EQ(plan.resident[i].gpu, layout[i].gpu);
  }
  // Replan from the window {hot0, hot7}; residents kept need no install.
  planner->observe(hot0);
  planner->plan(hot0, plan);
  validate(plan, b.topo, hot0, b.shape, planner->limits());
  for (const Copy& c : plan.copies) {
    const bool was_there = std::any_of(layout.begin(), layout.end(), [&](const ResidentReplica& r) {
      return r.expert == c.expert && r.gpu == c.dst_gpu;
    });
    EXPECT_FALSE(was_there) << "expert " << c.expert << " was already resident on GPU "
                            << c.dst_gpu;
  }
}

TEST(EplbPlanner, ReplicasOnTheSteadyStateBalanceTheLoad) {
  Knobs k;
  k.eplb_window = 4;
  k.eplb_interval = 4;
  Bench b(8, 8, 128, k);
  auto planner = b.make("eplb");
  // A steady state: the same routing in the history and now.
  const RoutingStep s0 = random_step(8, 128, 8, 4096, 4.0, 7, 1e9);
  for (int i = 0; i < 4; ++i) planner->observe(s0);
  Plan plan, none;
  planner->plan(s0, plan);
  b.make("static")->plan(s0, none);
  validate(plan, b.topo, s0, b.shape, planner->limits());
  const StepMetrics m = measure_plan(plan, b.topo, *b.cost, 0.0);
  const StepMetrics s = measure_plan(none, b.topo, *b.cost, 0.0);
  EXPECT_LT(m.token_straggler, 0.2 * s.token_straggler);
  EXPECT_EQ(m.weight_bytes, plan.weight_bytes());
  EXPECT_TRUE(m.fits_static_window) << "installs happen between micro-batches";
  EXPECT_LE(m.max_guest_slots, 16 + 1);
}

// MoonEP: every GPU receives exactly S*K rows; a receiver hosts remote experts of one home group
// only, so at most E/R of them.
TEST(MoonEp, ExactlySKRowsPerGpuAndAtMostEOverRRemoteExperts) {
  struct Case {
    int ranks, gpus_per_node, experts, top_k;
    int64_t tokens;
    double skew;
  };
  for (const Case& cs :
       {Case{8, 8, 128, 8, 4096, 4.0}, Case{4, 8, 64, 8, 777, 8.0}, Case{16, 8, 128, 8, 2048, 6.0},
        Case{8, 8, 8, 2, 1000, 3.0}, Case{2, 8, 128, 8, 4096, 12.0}}) {
    Bench b(cs.ranks, cs.gpus_per_node, cs.experts);
    auto planner = b.make("moonep");
    for (uint64_t seed = 1; seed <= 8; ++seed) {
      const RoutingStep s = random_step(cs.ranks, cs.experts, cs.top_k, cs.tokens, cs.skew, seed);
      Plan plan;
      planner->plan(s, plan);
      validate(plan, b.topo, s, b.shape, planner->limits());  // <= E/R guests per GPU
      const std::vector<int64_t> loads = rows_per_gpu(plan, cs.ranks);
      for (int64_t rows : loads) EXPECT_EQ(rows, cs.tokens * cs.top_k);
      std::vector<std::set<int>> groups(static_cast<size_t>(cs.ranks));
      std::vector<int> remote(static_cast<size_t>(cs.ranks), 0);
      for (const Slice& sl : plan.slices) {
        if (sl.gpu == b.topo.home(sl.expert)) continue;
        groups[sl.gpu].insert(b.topo.home(sl.expert));
        ++remote[sl.gpu];
        EXPECT_EQ(sl.source, RowSource::kDispatched);
      }
      for (int g = 0; g < cs.ranks; ++g) {
        EXPECT_LE(groups[g].size(), 1u) << "GPU " << g << " hosts experts of several home groups";
        EXPECT_LE(remote[g], b.topo.experts_per_rank());
      }
      EXPECT_EQ(plan.token_bytes(), 0) << "tokens travel in the dispatch";
    }
  }
}

// The reference's steps on a hand example: EP=4, 2 experts per GPU, S*K = 100 rows per rank.
TEST(MoonEp, HandExampleFollowsTheReference) {
  Bench b(4, 8, 8);
  // Home loads: GPU 0: 250 (200 + 50), GPU 1: 90, GPU 2: 40, GPU 3: 20. CAP = 100.
  const RoutingStep s = step_from({{50, 12, 20, 3, 5, 5, 3, 2},
                                   {50, 13, 20, 2, 5, 5, 3, 2},
                                   {50, 12, 20, 3, 5, 5, 2, 3},
                                   {50, 13, 20, 2, 5, 5, 2, 3}});
  Plan plan;
  b.make("moonep")->plan(s, plan);
  // balance = {150, -10, -60, -80}: 0 fills 3 (80), then 0 (70 left) fills 2 (60), then 0 (10)
  // fills 1 (10). Inside group 0: the largest quota first gets the largest expert.
  EXPECT_EQ(rows_per_gpu(plan, 4), (std::vector<int64_t>{100, 100, 100, 100}));
  std::vector<int64_t> expert0(4, 0);
  for (const Slice& sl : plan.slices) {
    if (sl.expert == 0) expert0[sl.gpu] = sl.rows;
  }
  // Quota 80 (GPU 3) takes 80 of expert 0 (200); quota 60 (GPU 2): expert 0 (120 left) gives 60;
  // quota 10 (GPU 1): expert 0 (60 left) gives 10; expert 0 keeps 50 at home with expert 1's 50.
  EXPECT_EQ(expert0, (std::vector<int64_t>{50, 10, 60, 80}));
  EXPECT_EQ(plan.weight_bytes(), 3 * b.shape.weight_bytes());
}

// LLEP: no GPU above the cap (when helpers have room), spilled chunks at least the minimum unless
// they carry the rest of an expert.
TEST(Llep, CapAndMinimumChunkAreRespected) {
  for (int ranks : {4, 8, 16}) {
    Bench b(ranks, 8, 128);
    auto planner = b.make("llep");
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      const RoutingStep s = random_step(ranks, 128, 8, 4096, 6.0, seed);
      Plan plan;
      planner->plan(s, plan);
      validate(plan, b.topo, s, b.shape, planner->limits());
      const int64_t total = s.total_rows();
      const int64_t cap =
          static_cast<int64_t>(b.knobs.llep_cap_factor * static_cast<double>(total / ranks));
      const std::vector<int64_t> loads = rows_per_gpu(plan, ranks);
      for (int64_t rows : loads) EXPECT_LE(rows, cap) << "EP=" << ranks << " seed " << seed;
      // A helper's slice is a chunk of >= llep_min_chunk rows, or the expert's last rows.
      std::vector<int64_t> spilled(128, 0);
      for (const Slice& sl : plan.slices) {
        if (sl.gpu != b.topo.home(sl.expert)) spilled[sl.expert] += sl.rows;
      }
      for (const Slice& sl : plan.slices) {
        if (sl.gpu == b.topo.home(sl.expert)) continue;
        EXPECT_EQ(sl.source, RowSource::kDispatched);
        int small = 0;
        for (const Slice& o : plan.slices) {
          small += o.expert == sl.expert && o.gpu != b.topo.home(o.expert) &&
                   o.rows < b.knobs.llep_min_chunk;
        }
        EXPECT_LE(small, 1) << "at most one short chunk (the rest) per expert";
      }
    }
  }
}

TEST(Llep, HandExample) {
  Knobs k;
  k.llep_min_chunk = 10;
  Bench b(2, 8, 4, k);
  // Experts 0, 1 on GPU 0 (300, 100); 2, 3 on GPU 1 (60, 40). Total 500, cap = int(1.1 * 250) =
  // 275.
  const RoutingStep s = step_from({{150, 50, 30, 20}, {150, 50, 30, 20}});
  Plan plan;
  b.make("llep")->plan(s, plan);
  // Expert 0 first: GPU 0's pending is 100 (expert 1), room 175: 175 at home, 125 spill to GPU 1
  // (effective 100, room 175). Then expert 1 (100): GPU 0 room 100 -> home. GPU 1: 125 + 100.
  EXPECT_EQ(rows_per_gpu(plan, 2), (std::vector<int64_t>{275, 225}));
  ASSERT_EQ(plan.copies.size(), 1u);
  EXPECT_EQ(plan.copies[0].kind, CopyKind::kWeights);
  EXPECT_EQ(plan.copies[0].expert, 0);
  EXPECT_EQ(plan.copies[0].dst_gpu, 1);
}

// Data movement: what each policy's data movement holds, as the knobs say.
TEST(DataMovement, EachPolicyNamesItsSms) {
  Bench b(8, 8, 128);
  EXPECT_EQ(b.make("feplb")->data_movement().balance_sms, 0);
  EXPECT_EQ(b.make("feplb")->data_movement().dispatch_sms, b.knobs.deepep_sms);
  EXPECT_EQ(b.make("moonep")->data_movement().balance_sms, b.knobs.moonep_sms);
  EXPECT_EQ(b.make("llep")->data_movement().balance_sms, b.knobs.nccl_sms);
  EXPECT_FALSE(b.make("eplb")->data_movement().balance_every_micro_batch);
}

}  // namespace
}  // namespace feplb
