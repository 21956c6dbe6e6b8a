// A trainer's planning step with the installed feplb (feplb::core only): routing counts of one
// micro-batch's layer -> the feplb planner's plan, validated, and how much it balanced against no
// balancing. Usage: plan_step [TRACE]   (without TRACE: skewed counts made here; with it: the
// trace's first step). Exit status 0 when the plan is valid and no worse than static, 2 on error.
#include <cstdio>

#include "feplb/planning.h"

int main(int argc, char** argv) {
  try {
    feplb::RoutingStep routing(/*step_idx=*/0, /*layer_idx=*/0, /*ranks=*/8, /*experts=*/64);
    if (argc > 1) {
      routing = feplb::read_trace(argv[1]).steps.at(0);
    } else {  // every rank sends 512 rows to each of its experts, 4x that to the first four
      for (int src = 0; src < routing.num_ranks; ++src) {
        for (int e = 0; e < routing.num_experts; ++e) routing.at(src, e) = e < 4 ? 2048 : 512;
      }
    }
    routing.sum_experts();

    // The README's C++ quick start is the part between the two [plan_step] lines.
    // [plan_step]
    const feplb::ExpertShape shape{.hidden = 4096, .ffn = 1536};
    feplb::PlannerContext ctx{
        feplb::Topology::contiguous(routing.num_ranks, /*gpus_per_node=*/8, routing.num_experts),
        shape, feplb::Knobs{}};
    const feplb::RooflineCostModel cost(shape, ctx.knobs);  // GEMM time; or a measured table
    ctx.cost = &cost;
    const auto planner = feplb::make_planner("feplb", ctx);  // feplb::planner_names() lists them
    feplb::Plan plan;
    planner->plan(routing, plan);  // routing.counts [ranks, experts], then routing.sum_experts()
    feplb::validate(plan, ctx.topo, routing, shape, planner->limits());  // InputError if not
    // [plan_step]
    const auto no_balancing = feplb::make_planner("static", ctx);
    feplb::Plan base;
    no_balancing->plan(routing, base);

    const feplb::StepMetrics before = feplb::measure_plan(base, ctx.topo, cost, 0);
    const feplb::StepMetrics after = feplb::measure_plan(plan, ctx.topo, cost, 0);
    std::printf(
        "%d ranks, %d experts, %lld rows: token straggler %.0f rows (static) -> %.0f (feplb), %zu "
        "copies\n",
        routing.num_ranks, routing.num_experts, static_cast<long long>(routing.total_rows()),
        before.token_straggler, after.token_straggler, plan.copies.size());
    return after.token_straggler <= before.token_straggler ? 0 : 1;
  } catch (const feplb::Error& e) {
    std::fprintf(stderr, "plan_step: %s\n", e.what());
    return 2;
  }
}
