// feplb's planning API in one header (feplb::core, no CUDA, no fmt): the EP group's topology and
// expert shapes, routing counts and traces (read/write), plans and their validation, the planners
// by name, the knobs, the GEMM cost models, per-plan metrics, expert placement, and the exception
// types (Error, InputError). A trainer plans each micro-batch's layer from its routing counts:
//
//   feplb::PlannerContext ctx{feplb::Topology::contiguous(8, 8, 128), shape, feplb::Knobs{}};
//   const feplb::RooflineCostModel cost(shape, ctx.knobs);   // GEMM time (or TableCostModel)
//   ctx.cost = &cost;                                         // make_planner needs one
//   auto planner = feplb::make_planner("feplb", ctx);   // planner_names() lists them
//   planner->plan(routing, plan);       // routing.counts [R, E], then routing.sum_experts()
//   feplb::validate(plan, ctx.topo, routing, ctx.shape, planner->limits());   // InputError if not
#pragma once

#include "feplb/core/cost_model.h"
#include "feplb/core/errors.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/core/metrics.h"
#include "feplb/core/placement.h"
#include "feplb/core/placer.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"
#include "feplb/core/trace_io.h"
