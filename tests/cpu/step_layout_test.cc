// The GPU runtime's host-side step layout (feplb/cuda/host/step_layout.h) and its scheduler thread
// (job_thread.h), without a GPU: where every row sits on every rank, that the ranks' views agree
// (what one rank sends is what another expects), capacity errors, and an idle thread's CPU use.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <tuple>

#include "feplb/core/errors.h"
#include "feplb/cuda/host/job_thread.h"
#include "feplb/cuda/host/step_layout.h"
#include "test_util.h"

namespace feplb {
namespace {

using cuda::LayoutCapacity;
using cuda::StepLayout;

LayoutCapacity roomy() { return LayoutCapacity{1 << 30, 1 << 30, 64, 64}; }

// 2 ranks, 4 experts (0, 1 on rank 0; 2, 3 on rank 1); expert 0 is hot and 40 of its rows go to
// rank 1. Experts 0 and 1 are rank 0's dynamic ones; 2 and 3 are static.
struct TwoRanks {
  Topology topo = Topology::contiguous(2, 8, 4);
  RoutingStep routing = testing::step_from({{50, 10, 5, 3}, {30, 6, 2, 4}});
  Plan plan;
  TwoRanks() {
    plan.clear(4);
    plan.dynamic[0] = 1;
    plan.dynamic[1] = 1;
    plan.add_migration(0, 0, 1, 40, testing::glm5());
    std::vector<int64_t> moved = {40, 0, 0, 0};
    plan.add_home_slices(topo, routing, moved);
  }
};

TEST(StepLayout, RowsLandExpertMajorAndTheMigratedSliceIsOneGuest) {
  TwoRanks t;
  StepLayout l0, l1;
  l0.build(t.topo, t.routing, t.plan, 0, roomy());
  l1.build(t.topo, t.routing, t.plan, 1, roomy());
  ASSERT_TRUE(l0.fits()) << l0.error();
  // Expert-major on each home: expert 0's 80 rows then expert 1's 16; expert 2's 7 then 3's 7.
  EXPECT_EQ(l0.expert_base(0), 0);
  EXPECT_EQ(l0.expert_base(1), 80);
  EXPECT_EQ(l0.expert_base(2), 0);
  EXPECT_EQ(l0.expert_base(3), 7);
  EXPECT_EQ(l0.recv_rows(0), 96);
  EXPECT_EQ(l0.recv_rows(1), 14);
  // Rank 0 sends in send order: experts 0, 1 (home 0), then 2, 3 (home 1).
  ASSERT_EQ(l0.sends().size(), 4u);
  EXPECT_EQ(std::make_tuple(l0.sends()[2].peer, l0.sends()[2].row, l0.sends()[2].rows), std::make_tuple(1, 60L, 5L));
  // Rank 0 receives expert 0's rows from rank 0 at row 0 and from rank 1 at row 50.
  EXPECT_EQ(std::make_tuple(l0.recvs()[2].peer, l0.recvs()[2].row, l0.recvs()[2].rows), std::make_tuple(1, 50L, 30L));
  // The migrated slice of expert 0 takes its first 40 rows (the plan lists it first), the home
  // slice the other 40.
  ASSERT_EQ(l0.exports().size(), 1u);
  const cuda::Export& x = l0.exports()[0];
  EXPECT_EQ(x.helper, 1);
  EXPECT_EQ(x.src_row, 0);
  EXPECT_EQ(x.rows, 40);
  EXPECT_EQ(x.dst_row, 0);
  EXPECT_EQ(x.slot, 0);
  EXPECT_EQ(x.staging_slot, 0);
  ASSERT_EQ(l1.guest_work().size(), 1u);
  const cuda::GuestWork& g = l1.guest_work()[0];
  EXPECT_EQ(g.owner, 0);
  EXPECT_EQ(g.owner_row, 0);
  EXPECT_EQ(g.rows, 40);
  EXPECT_TRUE(l0.exports_to(1));
  EXPECT_FALSE(l0.exports_to(0));
  EXPECT_TRUE(l1.guests_from(0));
  EXPECT_EQ(l0.exported_rows(), 40);
  EXPECT_EQ(l1.guest_rows_here(), 40);
  // Rank 0 computes expert 0's other 40 rows (at row 40) and expert 1; rank 1 its static experts
  // 2 and 3 (static first).
  ASSERT_EQ(l0.home_work().size(), 2u);
  EXPECT_EQ(l0.home_work()[0].expert, 0);
  EXPECT_EQ(l0.home_work()[0].row, 40);
  EXPECT_EQ(l0.home_work()[0].rows, 40);
  ASSERT_EQ(l1.home_work().size(), 2u);
  EXPECT_EQ(l1.home_work()[0].expert, 2);
  EXPECT_EQ(l1.home_work()[0].local_index, 0);
  // Every rank records the same slot use.
  ASSERT_EQ(l0.slot_uses().size(), 1u);
  EXPECT_EQ(l0.slot_uses()[0].rank, 1);
  EXPECT_EQ(l0.slot_uses()[0].expert, 0);
  EXPECT_EQ(l1.slot_uses()[0].slice, l0.slot_uses()[0].slice);
}

TEST(StepLayout, StaticExpertsComeFirst) {
  const Topology topo = Topology::contiguous(1, 8, 3);
  const RoutingStep routing = testing::step_from({{4, 5, 6}});
  Plan plan;
  plan.clear(3);
  plan.dynamic[0] = 1;
  plan.add_home_slices(topo, routing, {0, 0, 0});
  StepLayout l;
  l.build(topo, routing, plan, 0, roomy());
  ASSERT_EQ(l.home_work().size(), 3u);
  EXPECT_EQ(l.home_work()[0].expert, 1);
  EXPECT_EQ(l.home_work()[1].expert, 2);
  EXPECT_EQ(l.home_work()[2].expert, 0);
}

// Every capacity, exceeded, is the same one-line error on every rank, naming the capacity.
TEST(StepLayout, CapacityErrorsNameTheCapacityOnEveryRank) {
  TwoRanks t;
  const std::vector<std::pair<LayoutCapacity, std::string>> cases = {
      {{95, 1 << 20, 8, 8}, "over its capacity 95 (raise recv_capacity_rows)"},
      {{1 << 20, 39, 8, 8}, "40 guest rows, over its capacity 39"},
      {{1 << 20, 1 << 20, 0, 8}, "over its 0 guest weight slots"},
      {{1 << 20, 1 << 20, 8, 0}, "over its 0 gradient staging slots"},
  };
  for (const auto& [cap, needle] : cases) {
    StepLayout l0, l1;
    l0.build(t.topo, t.routing, t.plan, 0, cap);
    l1.build(t.topo, t.routing, t.plan, 1, cap);
    EXPECT_FALSE(l0.fits()) << needle;
    EXPECT_NE(l0.error().find(needle), std::string::npos) << l0.error();
    EXPECT_EQ(l0.error(), l1.error());
  }
  // Forward only: staging is not checked.
  StepLayout l;
  l.build(t.topo, t.routing, t.plan, 0, {1 << 20, 1 << 20, 8, -1});
  EXPECT_TRUE(l.fits()) << l.error();
}

TEST(StepLayout, RowsDispatchedElsewhereThanHomeAreRefused) {
  TwoRanks t;
  t.plan.slices[0].source = RowSource::kDispatched;
  StepLayout l;
  l.build(t.topo, t.routing, t.plan, 0, roomy());
  EXPECT_FALSE(l.fits());
  EXPECT_NE(l.error().find("homes only"), std::string::npos) << l.error();
}

TEST(StepLayout, InconsistentInputsAreInputErrors) {
  TwoRanks t;
  StepLayout l;
  EXPECT_THROW(l.build(t.topo, testing::step_from({{1, 2, 3}}), t.plan, 0, roomy()), InputError);
  EXPECT_THROW(l.build(t.topo, t.routing, t.plan, 2, roomy()), InputError);
  Plan bad = t.plan;
  bad.slices[0].gpu = 7;
  EXPECT_THROW(l.build(t.topo, t.routing, bad, 0, roomy()), InputError);
}

// On real plans of every GPU policy at R = 8: the ranks' views agree. What a rank sends a peer
// for an expert is what the peer expects from it; every export is its helper's guest with the
// same rows; home and guest work cover every routed row exactly once.
TEST(StepLayout, RanksAgreeOnRealPlans) {
  const int R = 8, E = 64;
  Knobs k;
  k.max_num_dyn = 8;
  testing::Bench b(R, 8, E, k);
  for (const std::string policy : {"static", "feplb-paper", "feplb", "oracle"}) {
    auto planner = b.make(policy);
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const RoutingStep step = testing::random_step(R, E, 8, 2048, 6.0, seed);
      Plan plan;
      planner->plan(step, plan);
      planner->observe(step);
      std::vector<StepLayout> l(R);
      for (int r = 0; r < R; ++r) l[r].build(b.topo, step, plan, r, {1 << 30, 1 << 30, E, E});
      for (int r = 0; r < R; ++r) ASSERT_TRUE(l[r].fits()) << policy << ": " << l[r].error();
      int64_t computed = 0;
      std::map<int, cuda::GuestWork> guest_by_slice;
      for (int r = 0; r < R; ++r) {
        for (const cuda::HomeWork& w : l[r].home_work()) computed += w.rows;
        for (const cuda::GuestWork& g : l[r].guest_work()) {
          computed += g.rows;
          guest_by_slice[g.slice] = g;
        }
        // Chunks: rank r's i-th send to d is d's receive from r for the same expert.
        int64_t recv = 0;
        for (const cuda::RowChunk& c : l[r].recvs()) recv += c.rows;
        EXPECT_EQ(recv, l[r].recv_rows(r));
      }
      EXPECT_EQ(computed, step.total_rows()) << policy << ": every row computed exactly once";
      for (int r = 0; r < R; ++r) {
        for (const cuda::Export& x : l[r].exports()) {
          ASSERT_TRUE(guest_by_slice.count(x.slice)) << policy;
          const cuda::GuestWork& g = guest_by_slice[x.slice];
          EXPECT_EQ(g.owner, r);
          EXPECT_EQ(g.rows, x.rows);
          EXPECT_EQ(g.row, x.dst_row);
          EXPECT_EQ(g.owner_row, x.src_row);
          EXPECT_EQ(g.slot, x.slot);
          EXPECT_EQ(g.staging_slot, x.staging_slot);
        }
        for (int d = 0; d < R; ++d) {
          std::vector<int64_t> to_d, from_r;
          for (const cuda::RowChunk& c : l[r].sends()) {
            if (c.peer == d) to_d.push_back(c.rows);
          }
          for (const cuda::RowChunk& c : l[d].recvs()) {
            if (c.peer == r) from_r.push_back(c.rows);
          }
          EXPECT_EQ(to_d, from_r) << policy << " " << r << " -> " << d;
        }
      }
    }
  }
}

TEST(JobThread, RunsJobsInOrder) {
  cuda::JobThread t;
  std::vector<int> seen;
  std::atomic<int> done{0};
  struct Ctx {
    std::vector<int>* seen;
    std::atomic<int>* done;
    int id;
  };
  std::vector<Ctx> ctx;
  for (int i = 0; i < 5; ++i) ctx.push_back({&seen, &done, i});
  for (Ctx& c : ctx) {
    t.post(
        [](void* p) {
          auto* c = static_cast<Ctx*>(p);
          c->seen->push_back(c->id);
          c->done->fetch_add(1);
        },
        &c);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (done.load() < 5 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
}

// The runtime's scheduler thread sleeps when there is nothing to plan: < 1% of a core while idle.
TEST(JobThread, AnIdleThreadUsesNoCpu) {
  cuda::JobThread t;
  std::atomic<int> done{0};
  for (int i = 0; i < 3; ++i) {
    t.post([](void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }, &done);
  }
  while (done.load() < 3) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double before = t.cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double used = t.cpu_seconds() - before;
  EXPECT_LT(used, 0.01) << "idle for 1 s, the thread used " << used << " s of CPU";
}

TEST(JobThread, AFullQueueIsAnError) {
  cuda::JobThread t;
  std::atomic<bool> release{false};
  auto block = [](void* p) {
    while (!static_cast<std::atomic<bool>*>(p)->load()) std::this_thread::yield();
  };
  t.post(block, &release);  // running
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (int i = 0; i < cuda::JobThread::kMaxQueued; ++i) t.post(block, &release);
  EXPECT_THROW(t.post(block, &release), Error);
  release.store(true);
}

}  // namespace
}  // namespace feplb
