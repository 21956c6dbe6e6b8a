// The macro timescale: placement files (round trips, bad input naming the field), the placer,
// planners on a placement's dynamic sets, walk-forward simulation (no look-ahead, same plans).
#include "feplb/core/placement.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "feplb/core/error.h"
#include "feplb/core/placer.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/simulate.h"
#include "feplb/sim/workload.h"
#include "test_util.h"

namespace feplb {
namespace {

using json = nlohmann::json;

// E=8 experts on R=4 GPUs (2 per GPU), 2 GPUs per node, one layer: GPU g holds 2g and 2g+1, the
// first of them dynamic.
json valid_doc() {
  json gpus = json::array();
  for (int g = 0; g < 4; ++g) {
    gpus.push_back({{"gpu", g}, {"experts", {2 * g, 2 * g + 1}}, {"dynamic", {2 * g}}});
  }
  return {{"format", "feplb-placement-v1"},
          {"num_experts", 8},
          {"num_ranks", 4},
          {"gpus_per_node", 2},
          {"layers", {{{"layer", 0}, {"gpus", gpus}}}}};
}

std::string parse_error_of(const std::string& text) {
  try {
    parse_placement(text);
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InputError, but parse_placement accepted:\n" << text;
  return "";
}

void expect_error(const json& doc, std::initializer_list<std::string> parts) {
  const std::string msg = parse_error_of(doc.dump());
  if (msg.empty()) return;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

TEST(PlacementFile, RoundTrip) {
  const Placement p = parse_placement(valid_doc().dump());
  ASSERT_EQ(p.layers.size(), 1u);
  EXPECT_EQ(p.layers[0].home, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(p.layers[0].dynamic, (std::vector<uint8_t>{1, 0, 1, 0, 1, 0, 1, 0}));
  const Placement q = parse_placement(format_placement(p, R"({"tool":"test"})"));
  EXPECT_EQ(q.layers[0].home, p.layers[0].home);
  EXPECT_EQ(q.layers[0].dynamic, p.layers[0].dynamic);
  EXPECT_EQ(q.gpus_per_node, 2);
  // GPUs may be listed in any order; "dynamic" may be left out.
  json doc = valid_doc();
  std::swap(doc["layers"][0]["gpus"][0], doc["layers"][0]["gpus"][3]);
  doc["layers"][0]["gpus"][1].erase("dynamic");
  const Placement r = parse_placement(doc.dump());
  EXPECT_EQ(r.layers[0].home, p.layers[0].home);
  EXPECT_EQ(r.layers[0].dynamic[2], 0);
}

TEST(PlacementFile, ContiguousRoundTrip) {
  const Placement p = contiguous_placement(16, 8, 128, {0, 7, 15}, 4);
  const Placement q = parse_placement(format_placement(p));
  ASSERT_EQ(q.layers.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(q.layers[i].home, p.layers[i].home);
    EXPECT_EQ(q.layers[i].dynamic, p.layers[i].dynamic);
  }
  int dynamic = 0;
  for (uint8_t d : p.layers[0].dynamic) dynamic += d;
  EXPECT_EQ(dynamic, 16 * 4);
}

TEST(PlacementFile, BadInputNamesTheField) {
  expect_error(json::array(), {"object"});
  EXPECT_NE(parse_error_of("{\"format\":").find("malformed JSON"), std::string::npos);
  json d = valid_doc();
  d["format"] = "feplb-placement-v2";
  expect_error(d, {"format"});
  d = valid_doc();
  d.erase("gpus_per_node");
  expect_error(d, {"gpus_per_node", "missing"});
  d = valid_doc();
  d["num_experts"] = 9;
  expect_error(d, {"num_experts", "divisible"});
  d = valid_doc();  // wrong expert count: the GPUs hold 8 experts, the header says 12
  d["num_experts"] = 12;
  expect_error(d, {"layers[0].gpus[0].experts", "expected num_experts / num_ranks = 3"});
  d = valid_doc();  // wrong per-GPU count
  d["layers"][0]["gpus"][1]["experts"] = {2, 3, 4};
  expect_error(d, {"layers[0].gpus[1].experts", "has 3 experts"});
  d = valid_doc();  // an expert twice
  d["layers"][0]["gpus"][2]["experts"] = {4, 1};
  expect_error(d, {"layers[0].gpus[2].experts[1]", "expert 1 appears twice", "GPU 0"});
  d = valid_doc();  // expert id out of range
  d["layers"][0]["gpus"][2]["experts"] = {4, 8};
  expect_error(d, {"layers[0].gpus[2].experts[1]", "outside [0, 7]"});
  d = valid_doc();  // GPU id out of range
  d["layers"][0]["gpus"][3]["gpu"] = 4;
  expect_error(d, {"layers[0].gpus[3].gpu", "outside [0, 3]"});
  d = valid_doc();  // GPU id twice
  d["layers"][0]["gpus"][3]["gpu"] = 0;
  expect_error(d, {"layers[0].gpus[3].gpu", "GPU 0 appears twice"});
  d = valid_doc();  // too few GPUs
  d["layers"][0]["gpus"].erase(3);
  expect_error(d, {"layers[0].gpus", "expected num_ranks = 4"});
  d = valid_doc();  // a dynamic expert that lives elsewhere
  d["layers"][0]["gpus"][1]["dynamic"] = {0};
  expect_error(d, {"layers[0].gpus[1].dynamic[0]", "not one of GPU 1's experts"});
  d = valid_doc();
  d["layers"][0]["gpus"][1]["dynamic"] = {2, 2};
  expect_error(d, {"layers[0].gpus[1].dynamic[1]", "listed twice"});
  d = valid_doc();
  d["layers"][0]["gpus"][1]["dynamic"] = "2";
  expect_error(d, {"layers[0].gpus[1].dynamic", "array"});
  d = valid_doc();
  d["layers"].push_back(d["layers"][0]);
  expect_error(d, {"layers[1].layer", "layer 0 appears twice"});
  d = valid_doc();
  d["layers"] = json::array();
  expect_error(d, {"layers", "empty"});
}

Trace small_trace(int ranks, int experts, int64_t micro_batches, double skew, uint64_t seed,
                  int layers = 1) {
  const Prior prior = lognormal_prior(experts, skew, layers, seed);
  WorkloadSpec spec;
  spec.num_ranks = ranks;
  spec.top_k = 4;
  spec.tokens_per_rank = 256;
  spec.seq_len = 64;
  spec.concentration = 300;
  spec.num_steps = micro_batches;
  spec.seed = seed;
  Trace t = generate_trace(prior, spec);
  t.model = "glm5-128e";
  t.expert_shape = testing::glm5();
  return t;
}

TEST(PlacementFile, MatchesTrace) {
  const Trace t = small_trace(8, 32, 2, 3.0, 1, 2);  // layers 0 and 1
  Placement p = contiguous_placement(8, 8, 32, {0, 1}, 2);
  EXPECT_NO_THROW(check_placement_matches(p, t, 8));
  auto message = [&](const Placement& q, int gpn) {
    try {
      check_placement_matches(q, t, gpn);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(p, 4).find("gpus_per_node"), std::string::npos);
  EXPECT_NE(message(contiguous_placement(8, 8, 64, {0, 1}, 2), 8).find("num_experts"),
            std::string::npos);
  EXPECT_NE(message(contiguous_placement(4, 8, 32, {0, 1}, 2), 8).find("num_ranks"),
            std::string::npos);
  EXPECT_NE(message(contiguous_placement(8, 8, 32, {0}, 2), 8).find("no entry for layer 1"),
            std::string::npos);
}

TEST(PlacementFile, MigrationCountsWeightsAndOptimizerState) {
  const Placement from = contiguous_placement(4, 2, 8, {0}, 1);
  Placement to = from;
  // Swap expert 0 (GPU 0, node 0) with expert 6 (GPU 3, node 1), and 2 (GPU 1) with 3 (GPU 1).
  std::swap(to.layers[0].home[0], to.layers[0].home[6]);
  std::swap(to.layers[0].home[2], to.layers[0].home[3]);  // same GPU: no move
  const ExpertShape shape = testing::glm5();
  const Migration m = migration_between(from, to, shape, 12.0);
  EXPECT_EQ(m.rehomed_experts, 2);
  EXPECT_EQ(m.across_nodes, 2);
  const int64_t params = 3 * 6144 * 2048;
  EXPECT_EQ(m.weight_bytes, 2 * shape.weight_bytes());
  EXPECT_EQ(m.optimizer_bytes, 2 * 12 * params);
  EXPECT_EQ(m.network_bytes, m.total_bytes());
  EXPECT_EQ(migration_between(from, from, shape, 12.0).total_bytes(), 0);
}

// Every GPU holds E / R experts and dyn of them are dynamic.
void expect_valid(const Placement& p, int64_t dyn) {
  for (const LayerPlacement& l : p.layers) {
    const Topology topo = layer_topology(p, l);  // throws unless E / R per GPU
    for (int g = 0; g < p.num_ranks; ++g) {
      int dynamic = 0;
      for (int e : topo.local_experts(g)) dynamic += l.dynamic[e];
      EXPECT_EQ(dynamic, std::min<int64_t>(dyn, topo.experts_per_rank())) << "GPU " << g;
    }
    EXPECT_NO_THROW(parse_placement(format_placement(p)));
  }
}

// A history where node 0 (GPUs 0-3 of 8, contiguous homes) holds every hot expert.
LayerHistory hot_node_history(int experts, int64_t steps) {
  LayerHistory h;
  h.num_steps = steps;
  for (int64_t t = 0; t < steps; ++t) {
    for (int e = 0; e < experts; ++e) {
      int64_t rows = e < experts / 4 ? 400 : 100;
      rows += (e * 7 + t * 13) % 17;  // noise
      h.rows.push_back(rows);
    }
  }
  return h;
}

TEST(Placer, ImprovesBalanceBetweenNodesAndStaysValid) {
  const int R = 8, gpn = 4, E = 32;
  const LayerHistory h = hot_node_history(E, 20);
  const Placement current = contiguous_placement(R, gpn, E, {0}, 2);
  for (HomesMode mode : {HomesMode::kImprove, HomesMode::kFresh}) {
    PlaceOptions o;
    o.homes = mode;
    o.dyn = 2;
    Placer placer(R, gpn, E, o);
    std::vector<LayerPlaceStats> stats;
    const Placement p = placer.place({&h, 1}, current, &stats);
    expect_valid(p, 2);
    ASSERT_EQ(stats.size(), 1u);
    EXPECT_GT(stats[0].before.node_floor, 250);  // node 0: 1000 rows per GPU, mean 700
    EXPECT_LT(stats[0].after.node_floor, 0.05 * stats[0].before.node_floor);
    EXPECT_LE(stats[0].after.gpu_excess, stats[0].before.gpu_excess);
    const PlacementQuality q = evaluate_homes(h, p.layers[0].home, R, gpn);
    EXPECT_DOUBLE_EQ(q.node_floor, stats[0].after.node_floor);
    // Deterministic.
    Placer again(R, gpn, E, o);
    const Placement p2 = again.place({&h, 1}, current);
    EXPECT_EQ(p2.layers[0].home, p.layers[0].home);
    EXPECT_EQ(p2.layers[0].dynamic, p.layers[0].dynamic);
  }
}

TEST(Placer, MovesLittleOnceBalancedAndKeepsHomesWhenAsked) {
  const int R = 8, gpn = 4, E = 32;
  const LayerHistory h = hot_node_history(E, 20);
  const Placement current = contiguous_placement(R, gpn, E, {0}, 2);
  PlaceOptions o;
  o.dyn = 2;
  Placer placer(R, gpn, E, o);
  const Placement first = placer.place({&h, 1}, current);
  std::vector<LayerPlaceStats> stats;
  placer.place({&h, 1}, first, &stats);  // the same history again: nothing left to gain
  EXPECT_EQ(stats[0].rehomed, 0);
  // From scratch, relabelled: the same history gives the same layout under the same names.
  o.homes = HomesMode::kFresh;
  Placer fresh(R, gpn, E, o);
  const Placement f1 = fresh.place({&h, 1}, current);
  stats.clear();
  fresh.place({&h, 1}, f1, &stats);
  EXPECT_EQ(stats[0].rehomed, 0);
  // Keep: homes unchanged, dynamic sets chosen.
  o.homes = HomesMode::kKeep;
  Placer keep(R, gpn, E, o);
  const Placement k = keep.place({&h, 1}, current);
  EXPECT_EQ(k.layers[0].home, current.layers[0].home);
  expect_valid(k, 2);
  // A huge minimum gain: no swap is worth it.
  o.homes = HomesMode::kImprove;
  o.min_gain = 10;
  Placer lazy(R, gpn, E, o);
  EXPECT_EQ(lazy.place({&h, 1}, current).layers[0].home, current.layers[0].home);
}

TEST(Placer, DynamicSetsFavourExpertsBusyWhenTheirGpuIsOverloaded) {
  // One node of 2 GPUs, 4 experts each. Expert 1 is busy exactly when GPU 0 is overloaded;
  // expert 0 carries more rows on average (305 against 250) but only when GPU 0 is not.
  const int R = 2, E = 8;
  LayerHistory h;
  h.num_steps = 4;
  for (int64_t t = 0; t < 4; ++t) {
    const bool spike = t % 2 == 1;  // GPU 0: 610 rows against 400; otherwise 700 against 800
    const int64_t other = spike ? 100 : 200;
    const std::vector<int64_t> rows = {
        spike ? 10 : 600, spike ? 500 : 0, 50, 50, other, other, other, other};
    h.rows.insert(h.rows.end(), rows.begin(), rows.end());
  }
  const Placement current = contiguous_placement(R, 8, E, {0}, 1);
  PlaceOptions o;
  o.homes = HomesMode::kKeep;
  o.dyn = 1;
  o.dyn_score = DynScore::kDonorRows;
  const Placement donor = Placer(R, 8, E, o).place({&h, 1}, current);
  EXPECT_EQ(donor.layers[0].dynamic[1], 1);
  EXPECT_EQ(donor.layers[0].dynamic[0], 0);
  o.dyn_score = DynScore::kMeanRows;
  const Placement mean = Placer(R, 8, E, o).place({&h, 1}, current);
  EXPECT_EQ(mean.layers[0].dynamic[0], 1);
}

TEST(Placer, OptionsFromKnobsAreChecked) {
  Knobs k;
  k.place_homes = 3;
  EXPECT_THROW(place_options(k), InputError);
  k.place_homes = 0;
  k.place_dyn_score = 3;
  EXPECT_THROW(place_options(k), InputError);
}

TEST(PlacementPlanners, FeplbUsesThePlacementsDynamicSets) {
  // One hot expert (3, home GPU 0): it can only move when it is in GPU 0's dynamic set.
  testing::Bench b(4, 8, 16);
  std::vector<std::vector<int64_t>> counts(4, std::vector<int64_t>(16, 10));
  for (auto& row : counts) row[3] = 400;
  const RoutingStep s = testing::step_from(counts);
  Knobs k = b.knobs;
  k.feplb_dyn_set = 1;
  k.copy_timing = 0;
  k.dyn_cover = 0;  // the set alone
  for (bool hot_dynamic : {false, true}) {
    std::vector<uint8_t> dynamic(16, 0);
    for (int e = 0; e < 16; e += 4) dynamic[e] = 1;  // each GPU's first expert
    dynamic[3] = hot_dynamic ? 1 : 0;
    auto planner = make_planner("feplb", PlannerContext{b.topo, b.shape, k, b.cost.get(), dynamic});
    Plan plan;
    planner->plan(s, plan);
    validate(plan, b.topo, s, b.shape, planner->limits());
    int64_t moved = 0;
    for (const Slice& sl : plan.slices) {
      if (sl.expert == 3 && sl.gpu != 0) moved += sl.rows;
      if (sl.gpu != b.topo.home(sl.expert)) {
        EXPECT_EQ(dynamic[sl.expert], 1) << sl.expert;
      }
    }
    EXPECT_EQ(moved > 0, hot_dynamic);
    EXPECT_EQ(plan.dynamic, dynamic);
  }
  // With dyn_cover, GPU 0's set (expert 0: 40 rows against an excess of 1170) takes its busiest
  // others, expert 3 first, and the hot expert moves.
  k.dyn_cover = 1.5;
  std::vector<uint8_t> set_only(16, 0);
  for (int e = 0; e < 16; e += 4) set_only[e] = 1;
  {
    auto planner =
        make_planner("feplb", PlannerContext{b.topo, b.shape, k, b.cost.get(), set_only});
    Plan plan;
    planner->plan(s, plan);
    validate(plan, b.topo, s, b.shape, planner->limits());
    EXPECT_EQ(plan.dynamic[3], 1);
    int64_t moved = 0;
    for (const Slice& sl : plan.slices) moved += sl.expert == 3 && sl.gpu != 0 ? sl.rows : 0;
    EXPECT_GT(moved, 0);
  }
  // feplb-paper with paper_dyn_set = 2 marks exactly the placement's set dynamic.
  Knobs kp = b.knobs;
  kp.paper_dyn_set = 2;
  std::vector<uint8_t> dynamic(16, 0);
  dynamic[3] = dynamic[5] = 1;
  auto paper =
      make_planner("feplb-paper", PlannerContext{b.topo, b.shape, kp, b.cost.get(), dynamic});
  Plan plan;
  paper->plan(s, plan);
  EXPECT_EQ(plan.dynamic, dynamic);
  // Out-of-range settings are refused.
  k.feplb_dyn_set = 2;
  EXPECT_THROW(make_planner("feplb", PlannerContext{b.topo, b.shape, k, b.cost.get()}), InputError);
  kp.paper_dyn_set = 3;
  EXPECT_THROW(make_planner("feplb-paper", PlannerContext{b.topo, b.shape, kp, b.cost.get()}),
               InputError);
}

SimulationConfig sim_config(int gpn) {
  SimulationConfig c;
  c.policies = planner_names();
  c.gpus_per_node = gpn;
  c.shape = testing::glm5();
  c.knobs.planner_reps = 1;
  return c;
}

TEST(PlacementSimulation, ContiguousPlacementGivesTheSamePlans) {
  const Trace t = small_trace(16, 64, 6, 4.0, 3, 2);
  SimulationConfig c = sim_config(8);
  c.warmup_steps = 2;
  const SimulationResult a = simulate(t, c);
  c.placement = contiguous_placement(16, 8, 64, trace_layers(t), c.knobs.dyn);
  const SimulationResult b = simulate(t, c);
  ASSERT_EQ(a.policies.size(), b.policies.size());
  for (size_t p = 0; p < a.policies.size(); ++p) {
    ASSERT_EQ(a.policies[p].steps.size(), b.policies[p].steps.size());
    for (size_t i = 0; i < a.policies[p].steps.size(); ++i) {
      const StepMetrics& x = a.policies[p].steps[i];
      const StepMetrics& y = b.policies[p].steps[i];
      EXPECT_EQ(x.token_straggler, y.token_straggler) << a.policies[p].name << " step " << i;
      EXPECT_EQ(x.weight_bytes, y.weight_bytes) << a.policies[p].name << " step " << i;
      EXPECT_EQ(x.token_bytes, y.token_bytes) << a.policies[p].name << " step " << i;
      EXPECT_EQ(x.network_bytes, y.network_bytes) << a.policies[p].name << " step " << i;
    }
  }
}

TEST(PlacementSimulation, WalkForwardNeverLooksAhead) {
  // Two traces equal for their first 10 micro-batches, different after.
  Trace a = small_trace(16, 64, 16, 4.0, 5, 2);
  const Trace other = small_trace(16, 64, 16, 8.0, 9, 2);
  Trace b = a;
  for (size_t i = 0; i < b.steps.size(); ++i) {
    if (b.steps[i].step >= 10) b.steps[i] = other.steps[i];
  }
  SimulationConfig c = sim_config(8);
  c.policies = {"static", "feplb"};
  c.warmup_steps = 4;
  c.replan_interval = 3;
  c.replan_window = 5;
  const SimulationResult ra = simulate(a, c);
  const SimulationResult rb = simulate(b, c);
  // Replans before micro-batches 4, 7, 10, 13, each from at most 5 earlier micro-batches.
  ASSERT_EQ(ra.replans.size(), 4u);
  for (size_t i = 0; i < ra.replans.size(); ++i) {
    EXPECT_EQ(ra.replans[i].micro_batch, 4 + 3 * static_cast<int64_t>(i));
    EXPECT_EQ(ra.replans[i].history_micro_batches, std::min<int64_t>(5, ra.replans[i].micro_batch));
    EXPECT_EQ(ra.replans[i].layers.size(), 2u);
  }
  // Placements made before micro-batch 10 only saw micro-batches < 10: identical in both runs.
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ra.replans[i].migration.rehomed_experts, rb.replans[i].migration.rehomed_experts);
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_EQ(ra.replans[i].layers[l].after.node_floor, rb.replans[i].layers[l].after.node_floor);
    }
  }
  // And so are the measured steps planned on them (micro-batches 4..9).
  const PolicyResult& fa = *ra.find("feplb");
  const PolicyResult& fb = *rb.find("feplb");
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(fa.steps[i].token_straggler, fb.steps[i].token_straggler) << i;
    EXPECT_EQ(fa.steps[i].weight_bytes, fb.steps[i].weight_bytes) << i;
  }
  // The migration is charged over the measured steps.
  double bytes = 0;
  for (const Replan& r : ra.replans) bytes += static_cast<double>(r.migration.total_bytes());
  EXPECT_GT(bytes, 0);
  EXPECT_DOUBLE_EQ(ra.migration_bytes_per_step(), bytes / static_cast<double>(ra.step_ids.size()));
  EXPECT_EQ(ra.final_placement.layers.size(), 2u);
}

TEST(PlacementSimulation, WalkForwardCutsTheImbalanceBetweenNodes) {
  // The first quarter of the experts (all on node 0 with contiguous homes) is 4x as popular.
  Prior prior;
  prior.model = "unit-test";
  prior.layer_ids = {0};
  prior.popularity.assign(1, std::vector<double>(64, 1.0 / 112));
  for (int e = 0; e < 16; ++e) prior.popularity[0][e] = 4.0 / 112;
  WorkloadSpec spec;
  spec.num_ranks = 16;
  spec.top_k = 4;
  spec.tokens_per_rank = 1024;
  spec.num_steps = 12;
  Trace t = generate_trace(prior, spec);
  SimulationConfig c = sim_config(8);
  c.policies = {"static", "feplb"};
  c.warmup_steps = 4;
  const SimulationResult contiguous = simulate(t, c);
  c.replan_interval = 4;
  const SimulationResult placed = simulate(t, c);
  const double before = contiguous.find("static")->summary.inter_node_floor;
  const double after = placed.find("static")->summary.inter_node_floor;
  EXPECT_GT(before, 0.2 * contiguous.policies[0].steps[0].mean_rows);
  EXPECT_LT(after, 0.1 * before);
  EXPECT_LT(placed.find("feplb")->summary.token_straggler,
            contiguous.find("feplb")->summary.token_straggler);
  // The first replan moves hot experts to node 1, over the network: weights + 12 B/param.
  ASSERT_FALSE(placed.replans.empty());
  const Migration& m = placed.replans.front().migration;
  EXPECT_GT(m.across_nodes, 0);
  EXPECT_EQ(m.weight_bytes, m.rehomed_experts * c.shape.weight_bytes());
  EXPECT_EQ(m.optimizer_bytes, m.rehomed_experts * 12 * 3 * c.shape.hidden * c.shape.ffn);
}

TEST(PlacementSimulation, DynamicSetKnobsNeedAPlacement) {
  const Trace t = small_trace(8, 32, 2, 3.0, 1);
  SimulationConfig c = sim_config(8);
  c.policies = {"feplb"};
  c.knobs.feplb_dyn_set = 1;
  EXPECT_THROW(simulate(t, c), InputError);
  c.replan_interval = 1;
  EXPECT_NO_THROW(simulate(t, c));
  c = sim_config(8);
  c.policies = {"feplb-paper"};
  c.knobs.paper_dyn_set = 2;
  EXPECT_THROW(simulate(t, c), InputError);
  c.placement = contiguous_placement(8, 8, 32, {0}, 4);
  EXPECT_NO_THROW(simulate(t, c));
  c.placement = contiguous_placement(8, 4, 32, {0}, 4);  // made for 4 GPUs per node
  EXPECT_THROW(simulate(t, c), InputError);
}

}  // namespace
}  // namespace feplb
