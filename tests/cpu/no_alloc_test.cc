// planner.h promises no allocation on the hot path: after one warm-up call on the same
// topology, plan() must not touch the heap. This binary counts every operator new.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "feplb/core/planners/feplb/config.h"
#include "feplb/core/planners/feplb/engine.h"
#include "feplb/cuda/host/step_layout.h"
#include "feplb/cuda/program/build_program.h"
#include "test_util.h"

namespace {
std::atomic<int64_t> g_news{0};
}  // namespace

// GCC flags free() of what the replacement operator new below returned once both are inlined
// (-Wmismatched-new-delete); both sides are malloc/free here. The file is left out of unity builds
// (tests/cpu/CMakeLists.txt), so this stays in it.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t bytes) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) { return ::operator new(bytes); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): every new of this binary
// must come from malloc, since every delete below frees (AddressSanitizer: alloc-dealloc-mismatch).
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  g_news.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(bytes == 0 ? 1 : bytes);
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept {
  return ::operator new(bytes, tag);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace feplb {
namespace {

// Plans and observes every step `warm_rounds` times, then expects one more round of plan() and
// observe() calls to allocate nothing (`what` names the case in a failure).
void expect_warm_plans_allocate_nothing(Planner& planner, const std::vector<RoutingStep>& steps,
                                        int warm_rounds, const std::string& what) {
  Plan plan;
  for (int round = 0; round < warm_rounds; ++round) {
    for (const RoutingStep& s : steps) {
      planner.plan(s, plan);
      planner.observe(s);
    }
  }
  for (const RoutingStep& s : steps) {
    const int64_t before = g_news.load();
    planner.plan(s, plan);
    planner.observe(s);
    EXPECT_EQ(g_news.load() - before, 0) << what << ": " << plan.mode;
  }
}

TEST(NoAlloc, PlannersDoNotAllocateOnceWarm) {
  testing::Bench b(16, 8, 128);
  std::vector<RoutingStep> steps;
  for (uint64_t seed = 1; seed <= 6; ++seed)
    steps.push_back(testing::random_step(16, 128, 8, 2048, 4.0, seed));
  for (const std::string& name : planner_names()) {
    auto planner = b.make(name);
    Plan plan;
    for (const RoutingStep& s : steps) {  // warm: history, buffers, plan capacity
      planner->plan(s, plan);
      planner->observe(s);
    }
    planner->plan(steps[0], plan);  // capacity for the largest plan seen
    for (const RoutingStep& s : steps) {
      const int64_t before = g_news.load();
      planner->plan(s, plan);
      EXPECT_EQ(g_news.load() - before, 0) << name;
    }
  }
}

// The default feplb (its chooser): once each candidate mode has planned and been costed on the
// topology (a round of observe() per candidate), neither plan() nor observe() allocates: in a
// domain of 8 (twelve candidates, time balancing among them) and of 72 GPUs.
TEST(NoAlloc, TheChooserDoesNotAllocateOnceWarm) {
  struct Case {
    int ranks, per_domain, experts;
  };
  for (const Case& c : {Case{16, 8, 128}, Case{72, 72, 288}}) {
    testing::Bench b(c.ranks, c.per_domain, c.experts, Knobs{});
    std::vector<RoutingStep> steps;
    for (uint64_t seed = 1; seed <= 4; ++seed)
      steps.push_back(testing::random_step(c.ranks, c.experts, 8, 2048, 4.0, seed));
    // Every candidate costed twice or more.
    expect_warm_plans_allocate_nothing(*b.make("feplb"), steps, 32,
                                       "EP=" + std::to_string(c.ranks));
  }
}

// eplb replans in observe(): once it has seen a layer, neither a replan nor a plan that installs
// the new replicas allocates (the first observe() of a layer sizes its history and layout).
TEST(NoAlloc, EplbReplansDoNotAllocateOnceWarm) {
  Knobs k = testing::explicit_knobs();
  k.eplb_interval = 1;  // a replan after every micro-batch: every plan installs replicas
  k.eplb_window = 3;
  testing::Bench b(16, 8, 128, k);
  std::vector<RoutingStep> steps;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    steps.push_back(testing::random_step(16, 128, 8, 2048, 4.0, seed));
  }
  auto planner = b.make("eplb");
  Plan plan;
  for (const RoutingStep& s : steps) {
    planner->plan(s, plan);
    planner->observe(s);
  }
  for (const RoutingStep& s : steps) {
    const int64_t before = g_news.load();
    planner->plan(s, plan);
    planner->observe(s);
    EXPECT_EQ(g_news.load() - before, 0);
  }
}

// feplb and feplb-paper on a placement's dynamic sets (feplb_dyn_set = 1, paper_dyn_set = 2).
TEST(NoAlloc, PlacementDynamicSetsDoNotAllocateOnceWarm) {
  Knobs k = testing::explicit_knobs();
  k.feplb_dyn_set = 1;
  k.paper_dyn_set = 2;
  testing::Bench b(16, 8, 128, k);
  std::vector<uint8_t> dynamic(128, 0);
  for (int e = 0; e < 128; e += 3) dynamic[e] = 1;  // 2 or 3 per GPU
  std::vector<RoutingStep> steps;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    steps.push_back(testing::random_step(16, 128, 8, 2048, 4.0, seed));
  }
  for (const char* name : {"feplb", "feplb-paper"}) {
    auto planner = make_planner(name, PlannerContext{b.topo, b.shape, k, b.cost.get(), dynamic});
    Plan plan;
    for (const RoutingStep& s : steps) {
      planner->plan(s, plan);
      planner->observe(s);
    }
    planner->plan(steps[0], plan);
    for (const RoutingStep& s : steps) {
      const int64_t before = g_news.load();
      planner->plan(s, plan);
      EXPECT_EQ(g_news.load() - before, 0) << name;
    }
  }
}

// feplb with prefetch and one-hop (plans list the predicted copies), balancing time within a token
// budget (its kept plan), and in one NVLink domain of 256 GPUs (the receivers' heap).
TEST(NoAlloc, FeplbModesAndLargeDomainsDoNotAllocateOnceWarm) {
  struct Case {
    int ranks, gpus_per_node, experts;
    int64_t prefetch, one_hop;
    double time_budget = 0;
  };
  for (const Case& c : {Case{16, 8, 128, 1, 0}, Case{16, 8, 128, 1, 1}, Case{16, 8, 128, 0, 1},
                        Case{256, 256, 1024, 1, 1}, Case{16, 8, 128, 1, 0, 0.05},
                        Case{16, 8, 128, 1, 1, 0.05}, Case{8, 8, 128, 1, 0, 0.05}}) {
    Knobs k = testing::explicit_knobs();
    k.prefetch = c.prefetch;
    k.one_hop = c.one_hop;
    k.time_balance_budget = c.time_budget;
    k.prefetch_window_us = 500;
    testing::Bench b(c.ranks, c.gpus_per_node, c.experts, k);
    std::vector<RoutingStep> steps;
    const uint64_t num_steps = c.time_budget > 0 ? 32 : 4;
    for (uint64_t seed = 1; seed <= num_steps; ++seed) {
      steps.push_back(testing::random_step(c.ranks, c.experts, 8, 2048, 4.0, seed));
    }
    auto planner = b.make("feplb");
    Plan plan;
    for (int round = 0; round < 2; ++round) {
      for (const RoutingStep& s : steps) {
        planner->plan(s, plan);
        planner->observe(s);
      }
    }
    for (const RoutingStep& s : steps) planner->plan(s, plan);  // capacity, with this prediction
    // Every order the steps may come in after that (a plan kept aside between tries must not
    // trade buffers with the caller's, or a step meets a buffer too small for it).
    for (size_t first = 0; first < steps.size(); ++first) {
      for (size_t i = 0; i < steps.size(); ++i) {
        const int64_t before = g_news.load();
        planner->plan(steps[(first + i) % steps.size()], plan);
        EXPECT_EQ(g_news.load() - before, 0) << c.ranks << " " << c.prefetch << c.one_hop << " "
                                             << c.time_budget << " from step " << first;
      }
    }
  }
}

// One hop refined from the previous micro-batch (one_hop_refine): its refinement (plan()) and the
// full plan of the step that predicts the next (observe()), once both have seen the steps.
TEST(NoAlloc, RefinedOneHopDoesNotAllocateOnceWarm) {
  const Knobs k = testing::refined_one_hop_knobs();
  testing::Bench b(16, 8, 128, k);
  std::vector<RoutingStep> steps;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    steps.push_back(testing::random_step(16, 128, 8, 2048, 4.0, seed));
  }
  expect_warm_plans_allocate_nothing(*b.make("feplb"), steps, 2, "refined one hop");
}

// A chooser's use of FeplbEngine: every step planned in several modes (every copy rule, both
// paths, prefetch, a time blend and a time budget) on one engine allocates nothing once each mode
// has planned every step.
TEST(NoAlloc, FeplbEngineModesDoNotAllocateOnceWarm) {
  testing::Bench b(16, 8, 128);
  std::vector<FeplbConfig> modes;
  for (int64_t timing = 0; timing <= 3; ++timing) {
    for (int64_t one_hop = 0; one_hop <= 1; ++one_hop) {
      Knobs k = testing::explicit_knobs();
      k.copy_timing = timing;
      k.one_hop = one_hop;
      k.prefetch = 1;
      modes.push_back(FeplbConfig::from_knobs(k, true));
    }
  }
  Knobs blend = testing::explicit_knobs(), budget = testing::explicit_knobs();
  blend.balance_time_weight = 0.5;
  budget.time_balance_budget = 0.05;
  modes.push_back(FeplbConfig::from_knobs(blend, true));
  modes.push_back(FeplbConfig::from_knobs(budget, true));
  Knobs k = testing::explicit_knobs();
  k.prefetch_window_us = 500;
  FeplbEngine engine(PlannerContext{b.topo, b.shape, k, b.cost.get()});
  std::vector<RoutingStep> steps;
  for (uint64_t seed = 1; seed <= 8; ++seed)
    steps.push_back(testing::random_step(16, 128, 8, 2048, 4.0, seed));
  Plan plan;
  for (int round = 0; round < 2; ++round) {
    for (const RoutingStep& s : steps) {
      for (const FeplbConfig& mode : modes) engine.plan_with(mode, s, plan);
      engine.record(s.layer, plan);
    }
  }
  for (const RoutingStep& s : steps) {
    for (const FeplbConfig& mode : modes) engine.plan_with(mode, s, plan);  // this prediction
  }
  for (const RoutingStep& s : steps) {
    for (const FeplbConfig& mode : modes) {
      const int64_t before = g_news.load();
      engine.plan_with(mode, s, plan);
      EXPECT_EQ(g_news.load() - before, 0) << mode.label();
    }
  }
}

// Rack scale, the Google Benchmark shapes: one NVLink domain of 72 GPUs (288 experts) and of 256
// (1024), lognormal max/mean 5, 4 experts per GPU: feplb in every copy timing and mode, feplb-paper
// and oracle.
TEST(NoAlloc, RackShapesDoNotAllocateOnceWarm) {
  struct Case {
    std::string planner;
    int64_t copy_timing, prefetch, one_hop;
  };
  const Case cases[] = {{"feplb", 1, 0, 0},       {"feplb", 2, 0, 0}, {"feplb", 3, 0, 0},
                        {"feplb", 1, 1, 0},       {"feplb", 1, 1, 1}, {"feplb", 0, 0, 0},
                        {"feplb-paper", 1, 0, 0}, {"oracle", 1, 0, 0}};
  for (const auto& [ranks, experts] : {std::pair{72, 288}, std::pair{256, 1024}}) {
    std::vector<RoutingStep> steps;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      steps.push_back(testing::random_step(ranks, experts, 8, 4096, 5.0, seed));
    }
    for (const Case& c : cases) {
      Knobs k = testing::explicit_knobs();
      k.copy_timing = c.copy_timing;
      k.prefetch = c.prefetch;
      k.one_hop = c.one_hop;
      k.prefetch_window_us = 500;
      testing::Bench b(ranks, ranks, experts, k);
      auto planner = b.make(c.planner);
      Plan plan;
      for (int round = 0; round < 2; ++round) {
        for (const RoutingStep& s : steps) {
          planner->plan(s, plan);
          planner->observe(s);
        }
      }
      for (const RoutingStep& s : steps) planner->plan(s, plan);  // capacity, this prediction
      for (const RoutingStep& s : steps) {
        const int64_t before = g_news.load();
        planner->plan(s, plan);
        EXPECT_EQ(g_news.load() - before, 0)
            << c.planner << " EP=" << ranks << " copy_timing " << c.copy_timing << " prefetch "
            << c.prefetch << " one_hop " << c.one_hop;
      }
    }
  }
}

}  // namespace
}  // namespace feplb

namespace feplb {
namespace {

// The GPU runtime's host work per step: the plan, then its layout and the layer's step programs
// on every rank. Once their vectors have grown to the largest step, none touches the heap: the
// two-phase path, rows in one hop, and with weights prefetched (the planner observes each step
// outside the count).
TEST(NoAlloc, StepLayoutDoesNotAllocateOnceWarm) {
  for (int mode = 0; mode < 3; ++mode) {
    Knobs k = testing::explicit_knobs();
    k.one_hop = mode == 1 ? 1 : 0;
    k.prefetch = mode == 2 ? 1 : 0;
    k.prefetch_window_us = 1e6;
    testing::Bench b(8, 8, 128, k);
    std::vector<RoutingStep> steps;
    for (uint64_t seed = 1; seed <= 6; ++seed)
      steps.push_back(testing::random_step(8, 128, 8, 4096, 6.0, seed));
    auto planner = b.make("feplb");
    Plan plan;
    cuda::StepLayout layout;
    const cuda::LayoutCapacity cap{1 << 30, 1 << 30, 64, 64};
    // The layer's step programs too (feplb/cuda/program/build_program.h).
    cuda::StepList prologue, body, backward, inputs;
    const std::vector<uint8_t> none(8, 0), recopy(1 << 16, 1);
    cuda::CallFacts f;
    f.world = 8;
    f.num_experts = 128;
    f.experts_per_rank = 16;
    f.prefetch_into_here = none;
    f.prefetch_targets = none;
    for (int pass = 0; pass < 3; ++pass) {  // passes 1 and 2 see the same history (predictions)
      for (const RoutingStep& s : steps) {
        const int64_t before = g_news.load();
        planner->plan(s, plan);
        for (int r = 0; r < 8; ++r) {
          layout.build(b.topo, s, plan, r, cap);
          f.rank = r;
          cuda::build_forward_prologue(prologue, f);
          cuda::build_forward_body(body, layout, f);
          cuda::build_backward(backward, layout, f);
          cuda::InputFacts in;
          in.backward = true;
          ASSERT_LE(plan.slices.size(), recopy.size());
          in.recopy = std::span<const uint8_t>(recopy).first(plan.slices.size());
          cuda::build_inputs(inputs, layout, in, r);
        }
        if (pass == 2) {
          EXPECT_EQ(g_news.load() - before, 0) << "mode " << mode;
        }
        planner->observe(s);
      }
    }
  }
}

}  // namespace
}  // namespace feplb
