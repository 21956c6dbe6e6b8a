// The rack report (feplb/sim/rack.h) on a small configuration: EP points given as NVLink domains,
// the imbalance between domains is a floor no in-domain policy goes below and feplb keeps off the
// network, the few-experts section uses only priors of the report's top-k, GPU classes from
// specifications are marked in the Markdown and the JSON, and the plots are well-formed SVG.
#include "feplb/sim/rack.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "feplb/core/error.h"
#include "feplb/core/gpu_class.h"
#include "feplb/sim/report.h"

namespace feplb {
namespace {

TEST(RackPoints, ParsesDomainsAndRejectsTheRest) {
  const std::vector<RackPoint> p = parse_rack_points("8,72,4x72", "--ranks");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].ranks(), 8);
  EXPECT_EQ(p[0].domains, 1);
  EXPECT_EQ(p[1].domain_size, 72);
  EXPECT_EQ(p[2].domains, 4);
  EXPECT_EQ(p[2].domain_size, 72);
  EXPECT_EQ(p[2].ranks(), 288);
  EXPECT_EQ(p[2].label(), "288 (4x72)");
  EXPECT_EQ(p[1].label(), "72");
  for (const char* bad : {"", "0", "x8", "4x", "4x0", "a", "8,,16", "2x3x4", "-8", "1e3"}) {
    EXPECT_THROW(parse_rack_points(bad, "--ranks"), InputError) << "'" << bad << "'";
  }
}

RackConfig small_config() {
  RackConfig c;
  c.points = {{1, 4}, {2, 4}};
  c.experts_per_gpu = 4;
  c.skew = 5;
  c.prior_paths = {FEPLB_DATA_DIR "/priors/olmoe-1b-7b__olmoe-repo__arxiv.json",
                   FEPLB_DATA_DIR "/priors/mixtral-8x7b__olmoe-repo__arxiv.json"};
  c.prior_ranks = 8;
  c.hot_ranks = 8;
  c.hot_skew = 5;
  c.few_experts_per_gpu = {8};
  c.gpu_point = {1, 4};
  c.workload.tokens_per_rank = 256;
  c.workload.num_steps = 2;
  c.warmup_steps = 1;
  c.sim.policies = {"static", "feplb", "oracle", "llep", "moonep"};
  c.sim.shape = ExpertShape{6144, 2048, Dtype::kBf16};
  for (const GpuClass& g : gpu_class_list()) {
    RackGpu rg;
    rg.name = std::string(g.name);
    apply_gpu_class(g, rg.knobs);
    rg.cost_label = "roofline";
    c.gpus.push_back(rg);
  }
  return c;
}

TEST(Rack, SmallReportHoldsItsInvariants) {
  const RackConfig c = small_config();
  const RackResult r = run_rack(c);
  // 2 points, (real priors + lognormal) x 1 count, one group per GPU class.
  ASSERT_EQ(r.groups.size(), 2 + 2 + gpu_class_list().size());
  EXPECT_EQ(r.priors, std::vector<std::string>{"olmoe-1b-7b__olmoe-repo__arxiv"})
      << "only priors of the report's top-k are used";
  for (const RackGroup& g : r.groups) {
    const BalanceCell* st = g.group.find("static");
    const BalanceCell* oracle = g.group.find("oracle");
    const BalanceCell* fe = g.group.find("feplb");
    ASSERT_TRUE(st && oracle && fe) << g.section;
    for (const BalanceVariant& mode : c.modes) {  // feplb's modes, next to the policies
      const BalanceCell* m = g.group.find(mode.label);
      ASSERT_NE(m, nullptr) << mode.label;
      EXPECT_TRUE(m->variant);
      EXPECT_EQ(m->policy, "feplb");
      EXPECT_EQ(m->max_network_bytes, 0);
    }
    EXPECT_EQ(st->summary.token_straggler_reduction, 0.0);
    EXPECT_EQ(g.experts, g.experts_per_gpu() * g.group.ranks);
    EXPECT_GE(g.busiest_expert, 1.0);
    // Nothing in-domain goes below the floor between domains; feplb never uses the network.
    EXPECT_GE(fe->summary.token_straggler + 1e-9, oracle->oracle_straggler);
    EXPECT_EQ(fe->max_network_bytes, 0);
    if (g.group.domains == 1) {
      EXPECT_EQ(oracle->summary.token_straggler, 0);
    }
  }
  const RackGroup* multi = r.find("ep", 8, 0, "lognormal", "");
  ASSERT_NE(multi, nullptr);
  EXPECT_EQ(multi->group.domains, 2);
  EXPECT_EQ(multi->experts, 32);
  EXPECT_GT(multi->group.find("static")->oracle_straggler, 0)
      << "two domains with a skewed prior leave imbalance between them";

  const std::string md = format_rack_markdown(r, "feplb report --rack (test)", "plots/");
  EXPECT_NE(md.find("(plots/rack-stragglers.svg)"), std::string::npos);
  EXPECT_NE(md.find("## 1. From one node to racks"), std::string::npos);
  EXPECT_NE(md.find("## 2. Few experts per GPU"), std::string::npos);
  EXPECT_NE(md.find("## 3. GPU classes"), std::string::npos);
  EXPECT_NE(md.find("b200 (from specifications, not measured)"), std::string::npos);
  EXPECT_NE(md.find("EP=8 (2x4)"), std::string::npos);

  const nlohmann::json doc = nlohmann::json::parse(format_rack_json(r, "test"));
  EXPECT_EQ(doc["groups"].size(), r.groups.size());
  bool saw_spec = false;
  for (const auto& g : doc["config"]["compared_gpus"]) {
    if (g["class"] == "b200") {
      saw_spec = true;
      EXPECT_FALSE(g["measured"].get<bool>());
      EXPECT_EQ(g["provenance"], "from specifications, not measured");
    }
  }
  EXPECT_TRUE(saw_spec);
  for (const auto& g : doc["groups"]) {
    for (const auto& cell : g["cells"]) {
      EXPECT_NEAR(cell["gemm_straggler_plus_exposed_ms"].get<double>(),
                  cell["gemm_straggler_ms"].get<double>() + cell["exposed_ms"].get<double>(),
                  1e-12);
    }
  }

  const auto plots = rack_plots(r);
  ASSERT_EQ(plots.size(), 2u);
  for (const auto& [name, svg] : plots) {
    EXPECT_EQ(svg.rfind("<svg", 0), 0u) << name;
    EXPECT_NE(svg.find("</svg>"), std::string::npos) << name;
    EXPECT_NE(svg.find("8 (2x4)"), std::string::npos) << name << ": the multi-domain point";
  }
}

TEST(Rack, BadConfigurationsAreInputErrors) {
  RackConfig c = small_config();
  c.experts_per_gpu = 0;
  EXPECT_THROW(run_rack(c), InputError);
  c = small_config();
  c.hot_skew = 64;  // a lognormal max/mean must be below the expert count (8 GPUs x 8)
  EXPECT_THROW(run_rack(c), InputError);
  c = small_config();
  c.few_experts_per_gpu = {1};  // 8 experts cannot widen a 64-expert prior
  EXPECT_THROW(run_rack(c), InputError);
  c = small_config();
  c.points = {};
  EXPECT_THROW(run_rack(c), InputError);
}

}  // namespace
}  // namespace feplb
