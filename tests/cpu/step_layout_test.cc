// The GPU runtime's host-side step layout (feplb/cuda/host/step_layout.h) and its scheduler thread
// (job_thread.h), without a GPU: where every row sits on every rank, that the ranks' views agree
// (what one rank sends is what another expects), capacity errors, and an idle thread's CPU use.
#include "feplb/cuda/host/step_layout.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <span>
#include <thread>
#include <tuple>

#include "feplb/core/errors.h"
#include "feplb/cuda/host/job_thread.h"
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
    testing::write_schedule(plan, topo);
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
  EXPECT_EQ(std::make_tuple(l0.sends()[2].peer, l0.sends()[2].row, l0.sends()[2].rows),
            std::make_tuple(1, 60L, 5L));
  // Rank 0 receives expert 0's rows from rank 0 at row 0 and from rank 1 at row 50.
  EXPECT_EQ(std::make_tuple(l0.recvs()[2].peer, l0.recvs()[2].row, l0.recvs()[2].rows),
            std::make_tuple(1, 50L, 30L));
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
  testing::write_schedule(plan, topo);
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

TEST(StepLayout, RowsKeptAtTheirSourceAreRefused) {
  TwoRanks t;
  t.plan.slices[0].source = RowSource::kSource;
  StepLayout l;
  l.build(t.topo, t.routing, t.plan, 0, roomy());
  EXPECT_FALSE(l.fits());
  EXPECT_NE(l.error().find("not kept at their source"), std::string::npos) << l.error();
  // A "dispatched" slice on the expert's home, and resident replicas, are refused too.
  TwoRanks h;
  h.plan.slices.back().source = RowSource::kDispatched;  // expert 3's home slice
  l.build(h.topo, h.routing, h.plan, 0, roomy());
  EXPECT_FALSE(l.fits());
  TwoRanks r;
  r.plan.resident.push_back({0, 1});
  l.build(r.topo, r.routing, r.plan, 0, roomy());
  EXPECT_NE(l.error().find("resident replicas"), std::string::npos) << l.error();
}

// The two-rank case in one hop: expert 0's 80 rows (50 from rank 0, then 30 from rank 1) go to
// GPU 0 (its home, 40 rows: ordinals 0-39) and GPU 1 (ordinals 40-79) in ascending GPU order, so
// rank 0 sends 40 to itself and 10 to rank 1, rank 1 its 30 to itself; no row or output copies.
TEST(StepLayout, OneHopSplitsEachSourcesRowsByTheOrdinalRule) {
  const Topology topo = Topology::contiguous(2, 8, 4);
  const RoutingStep routing = testing::step_from({{50, 10, 5, 3}, {30, 6, 2, 4}});
  Plan plan;
  plan.clear(4);
  plan.dynamic[0] = 1;
  plan.add_migration(0, 0, 1, 40, testing::glm5(), /*weights_prefetched=*/false, /*one_hop=*/true);
  plan.add_home_slices(topo, routing, {40, 0, 0, 0});
  testing::write_schedule(plan, topo);
  StepLayout l0, l1;
  l0.build(topo, routing, plan, 0, roomy());
  l1.build(topo, routing, plan, 1, roomy());
  ASSERT_TRUE(l0.fits()) << l0.error();
  ASSERT_TRUE(l1.fits()) << l1.error();
  EXPECT_TRUE(l0.has_dispatched());
  using C = std::tuple<int, int64_t, int64_t, bool>;
  const auto chunks = [](std::span<const cuda::RowChunk> cs) {
    std::vector<C> v;
    for (const cuda::RowChunk& c : cs) v.emplace_back(c.peer, c.row, c.rows, c.guest);
    return v;
  };
  // Rank 0 sends expert 0 as two sub-chunks (home first: GPU 0 < GPU 1), then experts 1, 2, 3.
  EXPECT_EQ(chunks(l0.sends()), (std::vector<C>{{0, 0, 40, false},
                                                {1, 40, 10, false},
                                                {0, 50, 10, false},
                                                {1, 60, 5, false},
                                                {1, 65, 3, false}}));
  // Rank 1's rows of expert 0 are ordinals 50-79: none to the home (a zero-row chunk, listed), 30
  // to itself.
  EXPECT_EQ(chunks(l1.sends()), (std::vector<C>{{0, 0, 0, false},
                                                {1, 0, 30, false},
                                                {0, 30, 6, false},
                                                {1, 36, 2, false},
                                                {1, 38, 4, false}}));
  // Rank 0 receives only the rows its experts keep: expert 0's 40, expert 1's 16 at row 40.
  EXPECT_EQ(l0.recv_rows(0), 56);
  EXPECT_EQ(l0.expert_base(1), 40);
  EXPECT_EQ(chunks(l0.recvs()),
            (std::vector<C>{
                {0, 0, 40, false}, {0, 40, 10, false}, {1, 40, 0, false}, {1, 50, 6, false}}));
  // Rank 1 receives expert 0's rows straight into its guest rows: 10 from rank 0, then 30 from
  // itself.
  EXPECT_EQ(chunks(l1.recvs()), (std::vector<C>{{0, 0, 10, true},
                                                {0, 0, 5, false},
                                                {0, 7, 3, false},
                                                {1, 10, 30, true},
                                                {1, 5, 2, false},
                                                {1, 10, 4, false}}));
  ASSERT_EQ(l1.guest_work().size(), 1u);
  const cuda::GuestWork& g = l1.guest_work()[0];
  EXPECT_TRUE(g.dispatched);
  EXPECT_EQ(g.row, 0);
  EXPECT_EQ(g.rows, 40);
  EXPECT_EQ(g.owner_row, -1);
  ASSERT_EQ(l0.exports().size(), 1u);
  EXPECT_TRUE(l0.exports()[0].dispatched);
  EXPECT_EQ(l0.exports()[0].src_row, -1);
  // The helper still needs the weights (and sends dW back), but no rows move by copy.
  EXPECT_TRUE(l0.exports_to(1));
  EXPECT_TRUE(l1.guests_from(0));
  EXPECT_FALSE(l0.rows_copied_to(1));
  EXPECT_FALSE(l1.rows_copied_from(0));
  ASSERT_EQ(l0.home_work().size(), 2u);
  EXPECT_EQ(l0.home_work()[0].expert, 1);  // static first
  EXPECT_EQ(l0.home_work()[1].expert, 0);
  EXPECT_EQ(l0.home_work()[1].row, 0);
  EXPECT_EQ(l0.home_work()[1].rows, 40);
}

// Prefetched weights: per helper, the plan's prefetches in order take slots 0, 1, ...; a slice on
// a prefetched pair uses its slot (no weight copy), other guests come after; an unused prefetch
// keeps its slot (it counts against the guest slots).
TEST(StepLayout, PrefetchedPairsKeepTheSlotsTheyWereCopiedInto) {
  const Topology topo = Topology::contiguous(3, 8, 6);  // experts 0,1 | 2,3 | 4,5
  const RoutingStep routing =
      testing::step_from({{40, 1, 1, 30, 1, 1}, {40, 1, 1, 30, 1, 1}, {1, 1, 1, 1, 1, 1}});
  Plan plan;
  plan.clear(6);
  plan.add_prefetch(0, 0, 2, testing::glm5());  // used: slot 0 on GPU 2
  plan.add_prefetch(2, 1, 2, testing::glm5());  // unused: slot 1 on GPU 2, idle
  plan.add_migration(0, 0, 2, 50, testing::glm5(), /*weights_prefetched=*/true, /*one_hop=*/false);
  plan.add_migration(3, 1, 2, 40, testing::glm5(), /*weights_prefetched=*/false, /*one_hop=*/true);
  plan.add_home_slices(topo, routing, {50, 0, 0, 40, 0, 0});
  testing::write_schedule(plan, topo);
  std::vector<int> slot, next;
  cuda::prefetch_slots(plan.copies, 3, slot, next);
  ASSERT_EQ(slot.size(), plan.copies.size());
  EXPECT_EQ(slot[0], 0);
  EXPECT_EQ(slot[1], 1);
  for (size_t i = 2; i < slot.size(); ++i)
    EXPECT_EQ(slot[i], -1) << "copy " << i << " is not a prefetch";
  StepLayout l2;
  l2.build(topo, routing, plan, 2, roomy());
  ASSERT_TRUE(l2.fits()) << l2.error();
  EXPECT_EQ(l2.guest_experts(2), 3) << "two prefetched slots (one idle) and one copied guest";
  ASSERT_EQ(l2.guest_work().size(), 2u);
  const cuda::GuestWork& a = l2.guest_work()[0];  // grouped by owner: expert 0 (owner 0) first
  const cuda::GuestWork& b = l2.guest_work()[1];
  EXPECT_EQ(std::make_tuple(a.expert, a.slot, a.prefetched, a.dispatched),
            std::make_tuple(0, 0, true, false));
  EXPECT_EQ(std::make_tuple(b.expert, b.slot, b.prefetched, b.dispatched),
            std::make_tuple(3, 2, false, true));
  EXPECT_TRUE(l2.rows_copied_from(0));
  EXPECT_FALSE(l2.rows_copied_from(1));
  ASSERT_EQ(l2.slot_uses().size(), 2u) << "the idle prefetched slot is no slot use";
  // Three slots in use on GPU 2: two are too few.
  StepLayout small;
  small.build(topo, routing, plan, 0, {1 << 20, 1 << 20, 2, 8});
  EXPECT_NE(small.error().find("3 guest experts, over its 2 guest weight slots"), std::string::npos)
      << small.error();
  // A prefetch not from the expert's home is refused.
  Plan bad = plan;
  bad.copies[1].src_gpu = 0;
  small.build(topo, routing, bad, 0, roomy());
  EXPECT_NE(small.error().find("prefetches expert 2 from GPU 0"), std::string::npos)
      << small.error();
}

TEST(StepLayout, InconsistentInputsAreInputErrors) {
  TwoRanks t;
  StepLayout l;
  EXPECT_THROW(l.build(t.topo, testing::step_from({{1, 2, 3}}), t.plan, 0, roomy()), InputError);
  EXPECT_THROW(l.build(t.topo, t.routing, t.plan, 2, roomy()), InputError);
  Plan bad = t.plan;
  bad.slices[0].gpu = 7;
  EXPECT_THROW(l.build(t.topo, t.routing, bad, 0, roomy()), InputError);
  l.build(t.topo, t.routing, t.plan, 0, roomy());
  EXPECT_TRUE(l.fits()) << l.error();
  Plan unscheduled = t.plan;  // the order of its copies and guests unknown
  unscheduled.schedule.clear();
  EXPECT_THROW(l.build(t.topo, t.routing, unscheduled, 0, roomy()), InputError);
}

// Runs phase 1 of `plan` on the host over every rank's layout: each row is labelled (expert,
// its ordinal among the expert's rows in source-rank order) in its source's send buffer, the i-th
// send chunk to a peer lands in that peer's i-th receive chunk from the sender (as
// Transport::exchange matches them), then the kHome slices' rows are copied on to their helpers.
// Checks: the ranks' chunk lists match pairwise (count and sizes), no row lands twice, every
// work item (home and guest) covers rows of its own expert, every routed row is computed exactly
// once, and each expert's rows reach its GPUs by the ordinal rule (ascending GPU, each receiver a
// contiguous run of ordinals).
void expect_rows_land_once(const Topology& topo, const RoutingStep& step, const Plan& plan,
                           const std::vector<StepLayout>& l, const std::string& what) {
  const int R = topo.num_ranks(), E = topo.num_experts();
  const auto label = [](int e, int64_t ordinal) {
    return (static_cast<int64_t>(e) << 32) | ordinal;
  };
  // Send buffers: experts grouped by home, each home's experts in local order.
  std::vector<std::vector<int64_t>> send(static_cast<size_t>(R)), home(static_cast<size_t>(R)),
      guest(static_cast<size_t>(R));
  std::vector<int64_t> pre(static_cast<size_t>(E), 0);
  for (int s = 0; s < R; ++s) {
    for (int d = 0; d < R; ++d) {
      for (int e : topo.local_experts(d)) {
        for (int64_t k = 0; k < step.at(s, e); ++k) send[s].push_back(label(e, pre[e] + k));
      }
    }
    for (int e = 0; e < E; ++e) pre[e] += step.at(s, e);
  }
  for (int g = 0; g < R; ++g) {
    home[g].assign(static_cast<size_t>(l[0].recv_rows(g)), -1);
    guest[g].assign(static_cast<size_t>(l[0].guest_rows(g)), -1);
  }
  for (int s = 0; s < R; ++s) {
    for (int g = 0; g < R; ++g) {
      std::vector<cuda::RowChunk> out, in;
      for (const cuda::RowChunk& c : l[s].sends()) {
        if (c.peer == g) out.push_back(c);
      }
      for (const cuda::RowChunk& c : l[g].recvs()) {
        if (c.peer == s) in.push_back(c);
      }
      ASSERT_EQ(out.size(), in.size()) << what << ": rank " << s << " sends " << out.size()
                                       << " chunks to " << g << ", which receives " << in.size();
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i].rows, in[i].rows) << what << ": chunk " << i << " of " << s << " -> " << g;
        std::vector<int64_t>& dst = in[i].guest ? guest[g] : home[g];
        for (int64_t k = 0; k < in[i].rows; ++k) {
          ASSERT_LT(static_cast<size_t>(in[i].row + k), dst.size()) << what;
          int64_t& slot = dst[static_cast<size_t>(in[i].row + k)];
          ASSERT_EQ(slot, -1) << what << ": a row landed twice on rank " << g;
          slot = send[s][static_cast<size_t>(out[i].row + k)];
        }
      }
    }
  }
  for (int d = 0; d < R; ++d) {  // phase 2: kHome rows on to their helpers
    for (const cuda::Export& x : l[d].exports()) {
      if (x.dispatched) continue;
      for (int64_t k = 0; k < x.rows; ++k) {
        int64_t& slot = guest[x.helper][static_cast<size_t>(x.dst_row + k)];
        ASSERT_EQ(slot, -1) << what << ": a copied row lands on a dispatched one";
        slot = home[d][static_cast<size_t>(x.src_row + k)];
      }
    }
  }
  // Work: what each rank computes, by expert; every routed row exactly once.
  std::map<int64_t, int> computed;
  std::map<int, std::vector<std::tuple<int, int64_t, int64_t>>>
      runs;  // expert -> (gpu, first ordinal, rows)
  const auto take = [&](const std::vector<int64_t>& buf, int64_t row, int64_t rows, int e,
                        int gpu) {
    for (int64_t k = 0; k < rows; ++k) {
      const int64_t v = buf[static_cast<size_t>(row + k)];
      ASSERT_NE(v, -1) << what << ": rank " << gpu << " computes an unwritten row of expert " << e;
      ASSERT_EQ(static_cast<int>(v >> 32), e)
          << what << ": rank " << gpu << " computes another expert's row";
      ++computed[v];
    }
  };
  for (int g = 0; g < R; ++g) {
    for (const cuda::HomeWork& w : l[g].home_work()) take(home[g], w.row, w.rows, w.expert, g);
    for (const cuda::GuestWork& w : l[g].guest_work()) take(guest[g], w.row, w.rows, w.expert, g);
    // Per expert, what phase 1 brought to g: home rows (from expert_base) and dispatched guests.
    for (int e : topo.local_experts(g)) {
      int64_t rows = 0;
      for (const Slice& sl : plan.slices)
        rows += sl.expert == e && sl.source == RowSource::kHome ? sl.rows : 0;
      if (rows > 0)
        runs[e].emplace_back(g, home[g][static_cast<size_t>(l[g].expert_base(e))] & 0xffffffff,
                             rows);
      for (int64_t k = 1; k < rows; ++k) {
        EXPECT_EQ(home[g][static_cast<size_t>(l[g].expert_base(e) + k)],
                  home[g][static_cast<size_t>(l[g].expert_base(e))] + k)
            << what << ": expert " << e << "'s rows on its home are not one run of ordinals";
      }
    }
    for (const cuda::GuestWork& w : l[g].guest_work()) {
      if (!w.dispatched) continue;
      runs[w.expert].emplace_back(g, guest[g][static_cast<size_t>(w.row)] & 0xffffffff, w.rows);
      for (int64_t k = 1; k < w.rows; ++k) {
        EXPECT_EQ(guest[g][static_cast<size_t>(w.row + k)],
                  guest[g][static_cast<size_t>(w.row)] + k)
            << what;
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(computed.size()), step.total_rows())
      << what << ": every routed row computed";
  for (const auto& [v, times] : computed)
    EXPECT_EQ(times, 1) << what << ": a row computed " << times << " times";
  for (auto& [e, r] : runs) {
    std::sort(r.begin(), r.end());
    int64_t next = 0;
    for (const auto& [gpu, first, rows] : r) {
      EXPECT_EQ(first, next) << what << ": expert " << e << " on GPU " << gpu
                             << " breaks the ordinal rule";
      next = first + rows;
    }
  }
}

// On real plans of every GPU policy at R = 8, and feplb's one-hop and prefetch modes: the ranks'
// views agree (chunk lists, exports and guests), and phase 1 run on the host puts every row where
// the work lists compute it, once. With prefetch, the slots prefetch_slots() gives the planner's
// prediction (what MoeLayer::prefetch copies into) are the slots the layout uses.
TEST(StepLayout, RanksAgreeOnRealPlans) {
  const int R = 8, E = 64;
  struct Mode {
    std::string policy;
    int64_t one_hop, prefetch;
  };
  const std::vector<Mode> modes = {{"static", 0, 0}, {"feplb-paper", 0, 0}, {"feplb", 0, 0},
                                   {"oracle", 0, 0}, {"feplb", 1, 0},       {"feplb", 0, 1},
                                   {"feplb", 1, 1}};
  for (const Mode& mode : modes) {
    Knobs k;
    k.max_num_dyn = 8;
    k.one_hop = mode.one_hop;
    k.prefetch = mode.prefetch;
    k.prefetch_window_us = 1e6;  // every predicted pair fits the window: the slots limit them
    k.prefetch_history = 2;
    testing::Bench b(R, 8, E, k);
    auto planner = b.make(mode.policy);
    const std::string what =
        mode.policy + (mode.one_hop ? " one-hop" : "") + (mode.prefetch ? " prefetch" : "");
    int64_t dispatched = 0, prefetched = 0;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      // Alternating routing: predictions from the previous step are partly wrong.
      const RoutingStep step = testing::random_step(R, E, 8, 2048, 6.0, seed % 2 ? seed : 1);
      std::vector<int> pre_slot, next;
      const std::vector<Copy> predicted(planner->prefetch(0).begin(), planner->prefetch(0).end());
      cuda::prefetch_slots(predicted, R, pre_slot, next);
      Plan plan;
      planner->plan(step, plan);
      planner->observe(step);
      std::vector<StepLayout> l(R);
      for (int r = 0; r < R; ++r) l[r].build(b.topo, step, plan, r, {1 << 30, 1 << 30, 8, E});
      for (int r = 0; r < R; ++r) ASSERT_TRUE(l[r].fits()) << what << ": " << l[r].error();
      std::map<int, cuda::GuestWork> guest_by_slice;
      for (int r = 0; r < R; ++r) {
        for (const cuda::GuestWork& g : l[r].guest_work()) guest_by_slice[g.slice] = g;
        int64_t recv = 0;
        for (const cuda::RowChunk& c : l[r].recvs()) recv += c.guest ? 0 : c.rows;
        EXPECT_EQ(recv, l[r].recv_rows(r)) << what;
      }
      for (int r = 0; r < R; ++r) {
        for (const cuda::Export& x : l[r].exports()) {
          ASSERT_TRUE(guest_by_slice.count(x.slice)) << what;
          const cuda::GuestWork& g = guest_by_slice[x.slice];
          EXPECT_EQ(g.owner, r);
          EXPECT_EQ(g.rows, x.rows);
          EXPECT_EQ(g.row, x.dst_row);
          EXPECT_EQ(g.owner_row, x.src_row);
          EXPECT_EQ(g.slot, x.slot);
          EXPECT_EQ(g.staging_slot, x.staging_slot);
          EXPECT_EQ(g.dispatched, x.dispatched);
          EXPECT_EQ(g.prefetched, x.prefetched);
          EXPECT_EQ(x.dispatched, mode.one_hop == 1) << what;
          dispatched += x.dispatched ? 1 : 0;
          if (!x.prefetched) continue;
          ++prefetched;
          bool found = false;  // the slot prefetch() copied this pair into
          for (size_t i = 0; i < predicted.size(); ++i) {
            if (predicted[i].expert == x.expert && predicted[i].dst_gpu == x.helper) {
              EXPECT_EQ(pre_slot[i], x.slot) << what;
              found = true;
            }
          }
          EXPECT_TRUE(found) << what << ": a prefetched slice whose pair was not predicted";
        }
      }
      expect_rows_land_once(b.topo, step, plan, l, what + " seed " + std::to_string(seed));
    }
    if (mode.one_hop) {
      EXPECT_GT(dispatched, 0) << what << ": nothing went in one hop";
    }
    if (mode.prefetch) {
      EXPECT_GT(prefetched, 0) << what << ": no prediction was ever used";
    }
  }
}

// A plan mixing both kinds of migration (rows via the home and in one hop) lands every row once.
TEST(StepLayout, MixedTwoPhaseAndOneHopSlicesLandOnce) {
  const int R = 4, E = 32;
  Knobs k;
  k.max_num_dyn = 8;
  testing::Bench b(R, 8, E, k);
  auto planner = b.make("feplb");
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const RoutingStep step = testing::random_step(R, E, 4, 1024, 8.0, seed);
    Plan plan;
    planner->plan(step, plan);
    int flipped = 0;
    for (Slice& sl : plan.slices) {
      if (sl.gpu != b.topo.home(sl.expert) && flipped++ % 2 == 0)
        sl.source = RowSource::kDispatched;
    }
    ASSERT_GT(flipped, 1) << "too few migrations to mix";
    std::vector<StepLayout> l(R);
    for (int r = 0; r < R; ++r) l[r].build(b.topo, step, plan, r, {1 << 30, 1 << 30, 8, E});
    for (int r = 0; r < R; ++r) ASSERT_TRUE(l[r].fits()) << l[r].error();
    expect_rows_land_once(b.topo, step, plan, l, "mixed seed " + std::to_string(seed));
  }
}

// A schedule holding only what StepLayout reads (Plan::schedule): GPU `gpu`'s helpers in issue
// order and the owners of its turns in order.
void set_orders(Plan& plan, int R, int gpu, const std::vector<int>& helpers,
                const std::vector<int>& owners) {
  Schedule& s = plan.schedule;
  s.clear();
  s.copies.resize(plan.copies.size());
  s.helper_begin.assign(static_cast<size_t>(R) + 1, 0);
  s.turn_begin.assign(static_cast<size_t>(R) + 1, 0);
  for (int g = gpu + 1; g <= R; ++g) {
    s.helper_begin[static_cast<size_t>(g)] = static_cast<int>(helpers.size());
    s.turn_begin[static_cast<size_t>(g)] = static_cast<int>(owners.size());
  }
  s.helpers = helpers;
  for (int o : owners) s.turns.push_back({o, 0.0, 0.0, 0.0});
}

// Exports go helper by helper in the schedule's issue order (the order the planner modelled), the
// helpers it does not list after them ascending.
TEST(StepLayout, ExportsFollowTheScheduledIssueOrder) {
  const int R = 4, E = 12;
  const Topology topo = Topology::contiguous(R, 8, E);
  const RoutingStep routing = testing::step_from({{3000, 2800, 2600, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                                  {9, 9, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                                  {9, 9, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                                  {9, 9, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1}});
  Plan plan;
  plan.clear(E);
  plan.dynamic[0] = plan.dynamic[1] = plan.dynamic[2] = 1;
  plan.add_migration(0, 0, 3, 40, testing::glm5());
  plan.add_migration(1, 0, 1, 30, testing::glm5());
  plan.add_migration(2, 0, 2, 20, testing::glm5());
  std::vector<int64_t> moved(E, 0);
  moved[0] = 40;
  moved[1] = 30;
  moved[2] = 20;
  plan.add_home_slices(topo, routing, moved);
  const auto helpers = [](const StepLayout& l) {
    std::vector<int> v;
    for (const cuda::Export& x : l.exports()) v.push_back(x.helper);
    return v;
  };
  StepLayout l;
  set_orders(plan, R, 0, {3, 1, 2}, {});
  l.build(topo, routing, plan, 0, roomy());
  ASSERT_TRUE(l.fits()) << l.error();
  EXPECT_EQ(helpers(l), (std::vector<int>{3, 1, 2}));
  set_orders(plan, R, 0, {2}, {});  // helpers 1 and 3 get no phase-2 copy: ascending, after
  l.build(topo, routing, plan, 0, roomy());
  EXPECT_EQ(helpers(l), (std::vector<int>{2, 1, 3}));
  // The planner's own schedule (copies not held to the receivers' short windows).
  Knobs k;
  k.copy_timing = 0;
  const testing::Bench b(R, 8, E, k);
  auto planner = b.make("feplb");
  planner->plan(routing, plan);
  ASSERT_TRUE(plan.schedule.written(plan.copies.size(), R));
  l.build(topo, routing, plan, 0, roomy());
  ASSERT_TRUE(l.fits()) << l.error();
  const auto listed = plan.schedule.helpers_of(0);
  ASSERT_FALSE(listed.empty());
  EXPECT_EQ(helpers(l).front(), listed.front());
}

// A helper lists its guests owner by owner: the owners whose guests wait for no phase-2 copy first
// (ascending), then the schedule's turns in order (when each owner's copies land: the order the
// layer runs them in); every rank's view stays consistent either way.
TEST(StepLayout, GuestsFollowTheScheduledTurns) {
  const int R = 4, E = 8;
  const Topology topo = Topology::contiguous(R, 8, E);
  const RoutingStep routing = testing::step_from({{90, 1, 80, 1, 70, 1, 1, 1},
                                                  {9, 1, 9, 1, 9, 1, 1, 1},
                                                  {9, 1, 9, 1, 9, 1, 1, 1},
                                                  {9, 1, 9, 1, 9, 1, 1, 1}});
  Plan plan;
  plan.clear(E);
  plan.dynamic[0] = plan.dynamic[2] = plan.dynamic[4] = 1;
  // Experts 0, 2 and 4 (homes 0, 1, 2) each send rows to GPU 3.
  plan.add_migration(0, 0, 3, 40, testing::glm5());
  plan.add_migration(2, 1, 3, 30, testing::glm5());
  plan.add_migration(4, 2, 3, 20, testing::glm5());
  plan.add_home_slices(topo, routing, std::vector<int64_t>{40, 0, 30, 0, 20, 0, 0, 0});
  const auto owners = [](const StepLayout& l) {
    std::vector<int> v;
    for (const cuda::GuestWork& g : l.guest_work()) v.push_back(g.owner);
    return v;
  };
  StepLayout l;
  set_orders(plan, R, 3, {}, {1, 2, 0});
  l.build(topo, routing, plan, 3, roomy());
  ASSERT_TRUE(l.fits()) << l.error();
  EXPECT_EQ(owners(l), (std::vector<int>{1, 2, 0}));
  set_orders(plan, R, 3, {}, {2, 1});  // owner 0's guests wait for no copy: first
  l.build(topo, routing, plan, 3, roomy());
  EXPECT_EQ(owners(l), (std::vector<int>{0, 2, 1}));
  std::vector<StepLayout> all(R);
  for (int r = 0; r < R; ++r) all[r].build(topo, routing, plan, r, roomy());
  expect_rows_land_once(topo, routing, plan, all, "scheduled turns");
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
          auto* x = static_cast<Ctx*>(p);
          x->seen->push_back(x->id);
          x->done->fetch_add(1);
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

// The call thread's queue: a poster waits for room (never more than `capacity` jobs wait), and
// drain() returns once every job posted before it has finished.
TEST(JobThread, WaitRoomAndDrain) {
  cuda::JobThread t(/*spin_us=*/200.0, /*capacity=*/2);
  std::atomic<bool> release{false};
  std::atomic<int> done{0};
  struct Ctx {
    std::atomic<bool>* release;
    std::atomic<int>* done;
  } ctx{&release, &done};
  const auto job = [](void* p) {
    auto* c = static_cast<Ctx*>(p);
    while (!c->release->load()) std::this_thread::yield();
    c->done->fetch_add(1);
  };
  t.post(job, &ctx);  // running
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  t.post(job, &ctx);
  t.post(job, &ctx);  // two waiting: full
  EXPECT_THROW(t.post(job, &ctx), Error);
  std::atomic<bool> roomy{false};
  std::thread poster([&] {
    t.wait_room();
    roomy.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(roomy.load()) << "room while two jobs wait";
  release.store(true);
  poster.join();
  EXPECT_TRUE(roomy.load());
  t.post(job, &ctx);
  t.drain();
  EXPECT_EQ(done.load(), 4);
}

}  // namespace
}  // namespace feplb
