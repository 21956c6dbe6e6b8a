"""One MoE layer's forward + backward, eager and replayed from a CUDA graph: feplb.torch.MoE (one
rank, grouped GEMMs) and the TorchTitan-style torch._grouped_mm layer (GroupedMMMoE of
torch_vs_grouped_mm.py, padded to 8-row groups), same weights and inputs.

    PYTHONPATH=python FEPLB_LIBRARY=build/lib/libfeplb_c.so \
        python3 bench/gpu/graph_layer_time.py --out graph-layer-time.json

Per shape (the grid of torch_vs_grouped_mm.py: --experts x --rows) and routing, four cases, each
on a layer of its own: `feplb` and `grouped_mm` run eagerly (gradients set to None, untimed, then
forward + backward), `feplb_graphed` and `grouped_mm_graphed` captured once with torch.cuda.graph
after two warm-up steps on a side stream (gradients None before the capture: the graph owns them)
and replayed. Before timing, each graphed layer's replay is checked against its eager twin on the
same inputs: bit for bit for feplb (a deterministic layer), relative L2 <= 2e-2 for grouped_mm
(its index_add_ sums a token's rows with atomics). Timing: warm-up, then every repetition runs
each case once in rotated order, CUDA events on the current stream after a synchronize; median,
p10/p90. Output: --out JSON with `cells` (shape, routing, each case's statistics, and the ratios
graphed / eager per layer and graphed feplb / graphed grouped_mm) and a printed table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_common import ROUTINGS, grid_shapes  # noqa: E402
from torch_vs_grouped_mm import GroupedMMMoE, make_routing, rel_l2, time_cases  # noqa: E402

import feplb.torch as ft  # noqa: E402


class Layer:
    """A layer with its own copy of the inputs (x and the routing weights are leaves)."""

    def __init__(self, module, params, x, idx, w, g):
        self.module, self.params = module, params
        self.x = x.detach().clone().requires_grad_()
        self.w = w.detach().clone().requires_grad_()
        self.idx, self.g = idx, g
        self.out = None

    def clear(self):
        for p in self.params:
            p.grad = None
        self.x.grad = self.w.grad = None

    def step(self):
        self.out = self.module(self.x, self.idx, self.w)
        self.out.backward(self.g)

    def results(self):
        return [self.out, self.x.grad, self.w.grad] + [p.grad for p in self.params]


def graphed(layer: Layer):
    """Captures layer.step() after two warm-up steps on a side stream; returns the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            layer.clear()
            layer.step()
    torch.cuda.current_stream().wait_stream(side)
    layer.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.step()
    return graph


def run_cell(rt, shape, routing, a):
    E, H, S, K = shape["experts"], shape["hidden"], shape["tokens"], shape["top_k"]
    gen = torch.Generator(device="cuda").manual_seed(11)
    idx, w = make_routing(S, E, K, routing, gen)
    x = torch.randn(S, H, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.randn(S, H, device="cuda", generator=gen).to(torch.bfloat16)
    moe_e, moe_g = ft.MoE(rt, K, stacked=True), ft.MoE(rt, K, stacked=True)  # one [E, ...] tensor per kind
    with torch.no_grad():
        for p, q in zip(moe_g.parameters(), moe_e.parameters()):
            p.copy_(q)
    base_e = GroupedMMMoE(list(moe_e.gate_up), list(moe_e.down), 8)
    base_g = GroupedMMMoE(list(moe_e.gate_up), list(moe_e.down), 8)
    layers = {"feplb": Layer(moe_e, list(moe_e.parameters()), x, idx, w, g),
              "feplb_graphed": Layer(moe_g, list(moe_g.parameters()), x, idx, w, g),
              "grouped_mm": Layer(base_e, [base_e.w13, base_e.w2], x, idx, w, g),
              "grouped_mm_graphed": Layer(base_g, [base_g.w13, base_g.w2], x, idx, w, g)}
    graphs = {n: graphed(layers[n]) for n in ("feplb_graphed", "grouped_mm_graphed")}
    checks = {}
    for eager, gname, exact in (("feplb", "feplb_graphed", True), ("grouped_mm", "grouped_mm_graphed", False)):
        graphs[gname].replay()
        layers[eager].clear()
        layers[eager].step()
        torch.cuda.synchronize()
        pairs = list(zip(layers[gname].results(), layers[eager].results()))
        if exact:
            checks[gname] = {"bit_for_bit": all(torch.equal(p, q) for p, q in pairs)}
        else:
            checks[gname] = {"worst_rel_l2": max(rel_l2(p, q) for p, q in pairs)}
    ok = checks["feplb_graphed"]["bit_for_bit"] and checks["grouped_mm_graphed"]["worst_rel_l2"] <= 2e-2
    cases = {
        "feplb": (layers["feplb"].clear, layers["feplb"].step),
        "grouped_mm": (layers["grouped_mm"].clear, layers["grouped_mm"].step),
        "feplb_graphed": (lambda: None, graphs["feplb_graphed"].replay),
        "grouped_mm_graphed": (lambda: None, graphs["grouped_mm_graphed"].replay),
    }
    stats = time_cases(cases, a.reps, a.warmup)
    med = {n: s["median_ms"] for n, s in stats.items()}
    cell = {"shape": shape, "routing": routing, "cases": stats, "checks": checks, "agrees": ok,
            "feplb_graphed_over_eager": med["feplb_graphed"] / med["feplb"],
            "grouped_mm_graphed_over_eager": med["grouped_mm_graphed"] / med["grouped_mm"],
            "graphed_feplb_over_graphed_grouped_mm": med["feplb_graphed"] / med["grouped_mm_graphed"],
            "feplb_over_grouped_mm": med["feplb"] / med["grouped_mm"]}
    del graphs, layers, moe_e, moe_g, base_e, base_g
    return cell


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="graph-layer-time.json")
    ap.add_argument("--experts", default="8,64,128,256", help="the grid's expert counts to run")
    ap.add_argument("--rows", default="256,1024", help="the grid's rows per expert to run")
    ap.add_argument("--routings", default="zipf1.0")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    cells = []
    for shape in grid_shapes(a.experts, a.rows):
        rt = ft.Runtime(virtual_ranks=1, num_experts=shape["experts"], hidden=shape["hidden"],
                        ffn=shape["ffn"], max_tokens=shape["tokens"], max_top_k=shape["top_k"],
                        guest_capacity_rows=8, expert_gemm="grouped")
        for routing in a.routings.split(","):
            if routing not in ROUTINGS:
                sys.exit(f"graph_layer_time.py: unknown routing {routing!r} ({', '.join(ROUTINGS)})")
            cell = run_cell(rt, shape, routing, a)
            cells.append(cell)
            m = {n: s["median_ms"] for n, s in cell["cases"].items()}
            print(f"{shape['name']:<22} {routing:<8} feplb {m['feplb']:.3f} -> graphed {m['feplb_graphed']:.3f} ms "
                  f"({cell['feplb_graphed_over_eager']:.3f}x); grouped_mm {m['grouped_mm']:.3f} -> graphed "
                  f"{m['grouped_mm_graphed']:.3f} ms ({cell['grouped_mm_graphed_over_eager']:.3f}x); graphed "
                  f"feplb / graphed grouped_mm {cell['graphed_feplb_over_graphed_grouped_mm']:.3f}"
                  f"{'' if cell['agrees'] else '  DISAGREES ' + json.dumps(cell['checks'])}", flush=True)
        rt.close()
        torch.cuda.empty_cache()
    doc = {"benchmark": "one MoE layer's forward + backward, eager and replayed from a CUDA graph",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "ranks": 1,
           "reps": a.reps, "warmup": a.warmup, "seconds": time.time() - t0,
           "method": "CUDA events around each case after a synchronize, cases interleaved in rotated order; "
                     "eager cases set their gradients to None untimed; graphs own their gradients",
           "cells": cells}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    sys.exit(0 if all(c["agrees"] for c in cells) else 1)


if __name__ == "__main__":
    main()
