// The GPU layer's step programs (feplb/cuda/program/), without a GPU: golden text dumps of what
// forward, backward, their dispatched-rows forms and prefetch do on every rank at R = 2, 4, 8, for
// the two-phase path, rows in one hop, and weights prefetched before routing
// (tests/cpu/golden/program_*.txt; FEPLB_UPDATE_GOLDEN=1 rewrites them), and the signal layout.
#include "feplb/cuda/program/step_program.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "feplb/core/errors.h"
#include "feplb/cuda/host/signals.h"
#include "feplb/cuda/host/step_layout.h"
#include "feplb/cuda/program/build_program.h"
#include "test_util.h"

namespace feplb {
namespace {

using cuda::Buf;
using cuda::CallFacts;
using cuda::StepLayout;
using cuda::StepProgram;

enum class Mode { kTwoPhase, kOneHop, kPrefetch };

std::string mode_name(Mode m) {
  switch (m) {
    case Mode::kTwoPhase:
      return "two_phase";
    case Mode::kOneHop:
      return "one_hop";
    case Mode::kPrefetch:
      return "prefetch";
  }
  return "?";
}

void PrintTo(Mode m, std::ostream* os) { *os << mode_name(m); }

// R ranks, two experts each (expert e on rank e / 2). Expert 0 (rank 0) is hot: 40 of its rows
// go to rank 1; with R >= 4 also 20 to rank R - 1, and 8 of expert 2's (rank 1) to rank 2, so
// rank 1 is both a helper and a donor. Prefetch: expert 0's weights were predicted for rank 1
// (a hit) and expert 1's for rank 2 (R >= 4; unused); the other migrations were not predicted.
struct Scenario {
  int R;
  Mode mode;
  Topology topo;
  RoutingStep routing;
  Plan plan;
  std::vector<Copy> predicted;  // Mode::kPrefetch: what prefetch() copied, every rank's

  // idle_expert: expert 1 (rank 0) gets no rows at all.
  Scenario(int ranks, Mode m, bool idle_expert = false)
      : R(ranks),
        mode(m),
        topo(Topology::contiguous(ranks, 8, 2 * ranks)),
        routing(make(ranks, idle_expert)) {
    const bool one_hop = m == Mode::kOneHop;
    const bool pre = m == Mode::kPrefetch;
    plan.clear(2 * R);
    plan.dynamic[0] = 1;
    std::vector<int64_t> moved(static_cast<size_t>(2 * R), 0);
    if (pre) {
      plan.add_prefetch(0, 0, 1, testing::glm5());
      if (R >= 4) plan.add_prefetch(1, 0, 2, testing::glm5());
      for (const Copy& c : plan.copies) predicted.push_back(c);
    }
    plan.add_migration(0, 0, 1, 40, testing::glm5(), pre, one_hop);
    moved[0] = 40;
    if (R >= 4) {
      plan.dynamic[2] = 1;
      plan.add_migration(0, 0, R - 1, 20, testing::glm5(), false, one_hop);
      plan.add_migration(2, 1, 2, 8, testing::glm5(), false, one_hop);
      moved[0] += 20;
      moved[2] = 8;
    }
    plan.add_home_slices(topo, routing, moved);
    testing::write_schedule(plan, topo);
  }

  static RoutingStep make(int R, bool idle_expert) {
    std::vector<std::vector<int64_t>> counts(static_cast<size_t>(R));
    for (int d = 0; d < R; ++d) {
      for (int e = 0; e < 2 * R; ++e) {
        counts[d].push_back(e == 0 ? 50 + 10 * d : (e == 1 && idle_expert) ? 0 : 4 + (d + e) % 5);
      }
    }
    return testing::step_from(counts);
  }
};

cuda::LayoutCapacity program_capacity() { return cuda::LayoutCapacity{1 << 30, 1 << 30, 64, 64}; }

CallFacts facts_for(const Scenario& s, int rank, bool dispatched, bool forward,
                    const std::vector<uint8_t>& into_here, const std::vector<uint8_t>& targets) {
  CallFacts f;
  f.rank = rank;
  f.world = s.R;
  f.num_experts = 2 * s.R;
  f.experts_per_rank = 2;
  f.training = true;
  f.dispatched = dispatched;
  f.settle = s.mode == Mode::kPrefetch && forward;
  f.prefetched_here = f.settle;
  f.prefetch_into_here = into_here;
  f.prefetch_targets = targets;
  return f;
}

// Every call of one rank, as text.
std::string rank_programs(const Scenario& s, int rank) {
  StepLayout layout;
  layout.build(s.topo, s.routing, s.plan, rank, program_capacity());
  EXPECT_TRUE(layout.fits()) << layout.error();
  std::vector<uint8_t> into_here(static_cast<size_t>(s.R), 0), targets(into_here);
  std::vector<cuda::PrefetchCopy> mine;
  std::vector<int> slot, next;
  cuda::prefetch_slots(s.predicted, s.R, slot, next);
  for (size_t i = 0; i < s.predicted.size(); ++i) {
    const Copy& c = s.predicted[i];
    targets[static_cast<size_t>(c.dst_gpu)] = 1;
    if (c.dst_gpu == rank) into_here[static_cast<size_t>(c.src_gpu)] = 1;
    if (c.src_gpu == rank) mine.push_back({c.expert % 2, c.dst_gpu, slot[i]});
  }
  std::string out;
  StepProgram p;
  p.rank = rank;
  const std::vector<uint8_t> recopy(s.plan.slices.size(), 0);
  if (s.mode == Mode::kPrefetch) {
    p.clear();
    p.name = "prefetch";
    CallFacts f = facts_for(s, rank, false, false, into_here, targets);
    cuda::build_prefetch(p.caller, mine, !s.predicted.empty(), f);
    out += dump(p) + "\n";
  }
  const std::vector<bool> forms =
      s.mode == Mode::kTwoPhase ? std::vector<bool>{false, true} : std::vector<bool>{false};
  for (const bool dispatched : forms) {
    p.clear();
    p.name = dispatched ? "forward_dispatched" : "forward";
    CallFacts f = facts_for(s, rank, dispatched, true, into_here, targets);
    cuda::StepList prologue, body, inputs;
    cuda::build_forward_prologue(prologue, f);
    cuda::build_forward_body(body, layout, f);
    cuda::InputFacts in;
    in.prefetched_here = f.prefetched_here;
    in.observe = true;
    in.rows = Buf::kXHome;  // forward_dispatched: the caller's rows are x_home
    cuda::build_inputs(inputs, layout, in, rank);
    out += std::string(dispatched ? "forward_dispatched" : "forward") + ", rank " +
           std::to_string(rank) + "\ncaller thread, up to the plan:\n" + cuda::dump(prologue) +
           "caller thread, once the layer checked the plan and carved the micro-batch's memory:\n" +
           cuda::dump(body) + "scheduler thread, once planned:\n" + cuda::dump(inputs) + "\n";

    p.clear();
    p.name = dispatched ? "backward_dispatched" : "backward";
    f = facts_for(s, rank, dispatched, false, into_here, targets);
    cuda::build_backward(p.caller, layout, f);
    in = {};
    in.backward = true;
    in.recopy = recopy;
    in.rows = dispatched ? Buf::kCallerIn : Buf::kDyHome;
    cuda::build_inputs(p.scheduler, layout, in, rank);
    out += dump(p) + "\n";
  }
  return out;
}

std::string golden_path(const std::string& name) {
  return std::string(FEPLB_GOLDEN_DIR) + "/" + name;
}

void check_golden(const std::string& name, const std::string& text) {
  const std::string path = golden_path(name);
  const char* update = std::getenv("FEPLB_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::ofstream(path) << text;
    return;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path << " is missing: run with FEPLB_UPDATE_GOLDEN=1";
  std::stringstream want;
  want << in.rdbuf();
  EXPECT_EQ(want.str(), text) << path << " differs: review, then FEPLB_UPDATE_GOLDEN=1 rewrites it";
}

class ProgramGolden : public ::testing::TestWithParam<std::tuple<int, Mode>> {};

TEST_P(ProgramGolden, MatchesTheCommittedDump) {
  const auto [R, mode] = GetParam();
  const Scenario s(R, mode);
  std::string text = "# Step programs of the GPU layer's calls (tests/cpu/step_program_test.cc), " +
                     mode_name(mode) + ", R = " + std::to_string(R) + ".\n\n";
  for (int r = 0; r < R; ++r) text += rank_programs(s, r);
  check_golden("program_r" + std::to_string(R) + "_" + mode_name(mode) + ".txt", text);
}

INSTANTIATE_TEST_SUITE_P(AllModes, ProgramGolden,
                         ::testing::Combine(::testing::Values(2, 4, 8),
                                            ::testing::Values(Mode::kTwoPhase, Mode::kOneHop,
                                                              Mode::kPrefetch)),
                         [](const auto& param_info) {
                           return "R" + std::to_string(std::get<0>(param_info.param)) + "_" +
                                  mode_name(std::get<1>(param_info.param));
                         });

// One rank: a fixed program whatever the routing (no layout, no scheduler thread, no wait for the
// counts on the host), the backward in both gradient modes.
TEST(ProgramGolden, OneRankMatchesTheCommittedDump) {
  std::string text =
      "# Step programs of the GPU layer's calls on one rank, rows counted on the GPU "
      "(tests/cpu/step_program_test.cc).\n\n";
  cuda::StepProgram p;
  p.name = "forward";
  cuda::build_forward_one_rank(p.caller);
  text += dump(p);
  text += '\n';
  for (bool overwrite : {false, true}) {
    p.clear();
    p.name = overwrite ? "backward (gradients overwritten)" : "backward";
    cuda::build_backward_one_rank(p.caller, overwrite);
    text += dump(p);
    text += '\n';
  }
  for (const cuda::Step& s : p.caller.steps) {
    EXPECT_NE(s.op, cuda::Op::kAwait) << "a one-rank call waits for no other thread";
    EXPECT_NE(s.op, cuda::Op::kGemm) << "a one-rank call reads no row count on the host";
  }
  check_golden("program_r1_one_rank.txt", text);
}

// Every signal a rank's program raises is waited for by its receiver's program of the same call,
// and every wait has its signal (inputs_landed, rows_back, grads_back; prefetch_landed between a
// prefetch and the forward that uses it). slots_quiet is waited for by later prefetches only.
TEST(StepProgram, SignalsAndWaitsPairUpAcrossRanks) {
  using Key = std::tuple<int, int, int>;  // family, from, to
  const auto collect = [](const cuda::StepList& list, int rank, std::multiset<Key>& signals,
                          std::multiset<Key>& waits) {
    for (const cuda::Step& st : list.steps) {
      if (st.family == cuda::SignalFamily::kSlotsQuiet) continue;
      if (st.op == cuda::Op::kSignal) signals.insert({static_cast<int>(st.family), rank, st.peer});
      if (st.op == cuda::Op::kWait) waits.insert({static_cast<int>(st.family), st.peer, rank});
    }
  };
  for (const int R : {2, 4, 8}) {
    for (const Mode mode : {Mode::kTwoPhase, Mode::kOneHop, Mode::kPrefetch}) {
      const Scenario s(R, mode);
      std::vector<int> slot, next;
      cuda::prefetch_slots(s.predicted, R, slot, next);
      std::vector<uint8_t> targets(static_cast<size_t>(R), 0);
      for (const Copy& c : s.predicted) targets[static_cast<size_t>(c.dst_gpu)] = 1;
      std::multiset<Key> fwd_signals, fwd_waits, bwd_signals, bwd_waits;
      for (int r = 0; r < R; ++r) {
        StepLayout layout;
        layout.build(s.topo, s.routing, s.plan, r, program_capacity());
        ASSERT_TRUE(layout.fits()) << layout.error();
        std::vector<uint8_t> into_here(static_cast<size_t>(R), 0);
        std::vector<cuda::PrefetchCopy> mine;
        for (size_t i = 0; i < s.predicted.size(); ++i) {
          const Copy& c = s.predicted[i];
          if (c.dst_gpu == r) into_here[static_cast<size_t>(c.src_gpu)] = 1;
          if (c.src_gpu == r) mine.push_back({c.expert % 2, c.dst_gpu, slot[i]});
        }
        cuda::StepList list;
        CallFacts f = facts_for(s, r, false, true, into_here, targets);
        cuda::build_prefetch(list, mine, !s.predicted.empty(),
                             facts_for(s, r, false, false, into_here, targets));
        collect(list, r, fwd_signals, fwd_waits);
        cuda::build_forward_prologue(list, f);
        collect(list, r, fwd_signals, fwd_waits);
        cuda::build_forward_body(list, layout, f);
        collect(list, r, fwd_signals, fwd_waits);
        cuda::InputFacts in;
        in.prefetched_here = f.prefetched_here;
        cuda::build_inputs(list, layout, in, r);
        collect(list, r, fwd_signals, fwd_waits);
        f = facts_for(s, r, false, false, into_here, targets);
        cuda::build_backward(list, layout, f);
        collect(list, r, bwd_signals, bwd_waits);
        const std::vector<uint8_t> recopy(s.plan.slices.size(), 1);
        in = {};
        in.backward = true;
        in.recopy = recopy;
        in.rows = Buf::kDyHome;
        cuda::build_inputs(list, layout, in, r);
        collect(list, r, bwd_signals, bwd_waits);
      }
      const std::string what = mode_name(mode) + " R " + std::to_string(R);
      EXPECT_FALSE(fwd_signals.empty()) << what;
      EXPECT_EQ(fwd_signals, fwd_waits) << what;
      EXPECT_EQ(bwd_signals, bwd_waits) << what;
    }
  }
}

// Every family's slot of every rank is distinct and inside the set; values grow from 1.
TEST(SignalLayout, SlotsAreDistinctAndValuesGrow) {
  for (const int R : {1, 2, 8}) {
    cuda::SignalLayout l(R);
    EXPECT_EQ(l.slots(), 5 * R);
    std::set<int> seen;
    for (int f = 0; f < cuda::kSignalFamilies; ++f) {
      for (int r = 0; r < R; ++r) {
        const int slot = l.slot(static_cast<cuda::SignalFamily>(f), r);
        EXPECT_GE(slot, 0);
        EXPECT_LT(slot, l.slots());
        EXPECT_TRUE(seen.insert(slot).second);
      }
    }
    EXPECT_EQ(l.next_call(), 1u);
    EXPECT_EQ(l.next_call(), 2u);
    EXPECT_EQ(l.quiet(0), 0u);
    EXPECT_EQ(l.bump_quiet(0), 1u);
    EXPECT_THROW(l.slot(cuda::SignalFamily::kRowsBack, R), Error);
  }
  // Today's layout, which every rank of a job must agree on: family-major, by signalling rank.
  cuda::SignalLayout l4(4);
  EXPECT_EQ(l4.slot(cuda::SignalFamily::kInputsLanded, 3), 3);
  EXPECT_EQ(l4.slot(cuda::SignalFamily::kRowsBack, 1), 5);
  EXPECT_EQ(l4.slot(cuda::SignalFamily::kGradsBack, 2), 10);
  EXPECT_EQ(l4.slot(cuda::SignalFamily::kSlotsQuiet, 0), 12);
  EXPECT_EQ(l4.slot(cuda::SignalFamily::kPrefetchLanded, 3), 19);
}

// A program is the same whether built on a fresh list or a reused one (a warm layer reuses them).
TEST(StepProgram, RebuildingIntoAUsedListGivesTheSameProgram) {
  const Scenario s(4, Mode::kTwoPhase);
  StepLayout layout;
  layout.build(s.topo, s.routing, s.plan, 1, program_capacity());
  const std::vector<uint8_t> none(4, 0);
  const CallFacts f = facts_for(s, 1, false, true, none, none);
  StepProgram a, b;
  cuda::build_backward(b.caller, layout, f);
  cuda::build_forward_body(a.caller, layout, f);
  cuda::build_forward_body(b.caller, layout, f);
  EXPECT_EQ(dump(a), dump(b));
}

// GradMode::kOverwrite: each local expert's gradient is written exactly once before anything is
// added into it: by its first home dW GEMM (beta 0) or, without one, by a zero_grads step; every
// other home GEMM of the expert adds (beta 1). kAccumulate: no zeroing, every home GEMM adds.
TEST(StepProgram, OverwriteWritesEachExpertsGradientOnce) {
  for (int R : {2, 4}) {
    for (bool one_expert_idle : {false, true}) {
      const Scenario s(R, Mode::kTwoPhase, one_expert_idle);
      for (int rank = 0; rank < R; ++rank) {
        StepLayout layout;
        layout.build(s.topo, s.routing, s.plan, rank, program_capacity());
        ASSERT_TRUE(layout.fits()) << layout.error();
        const std::vector<uint8_t> none(static_cast<size_t>(R), 0);
        for (bool overwrite : {true, false}) {
          CallFacts f = facts_for(s, rank, false, false, none, none);
          f.overwrite_grads = overwrite;
          StepProgram p;
          cuda::build_backward(p.caller, layout, f);
          std::vector<int> written(2, 0), added(2, 0);
          for (const cuda::Step& st : p.caller.steps) {
            if (st.op == cuda::Op::kKernel && st.kernel == cuda::KernelId::kZeroGrads) {
              ++written[static_cast<size_t>(st.a.index)];
            }
          }
          for (const cuda::GemmItem& g : p.caller.gemms) {
            if (g.guest || g.g.buf != Buf::kGrads) continue;
            ++(g.beta == 0.0f ? written : added)[static_cast<size_t>(g.g.index)];
          }
          const std::string at = fmt::format("R{}{} rank {} {}", R, one_expert_idle ? " idle" : "",
                                             rank, overwrite ? "overwrite" : "accumulate");
          for (int i = 0; i < 2; ++i) {
            EXPECT_EQ(written[static_cast<size_t>(i)], overwrite ? 1 : 0) << at << " expert " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace feplb
