"""feplb.torch.MoE against the MoE layer a PyTorch user would otherwise write: the TorchTitan-style
layer over torch._grouped_mm (sort the (token, k) rows by expert, gather them, gate|up in one
grouped GEMM, SwiGLU, down in a second grouped GEMM, add each row back to its token), written as
a careful user would (see GroupedMMMoE), padded to TorchTitan's 8-row groups and unpadded.

    PYTHONPATH=python FEPLB_LIBRARY=build/lib/libfeplb_c.so \
        python3 bench/gpu/torch_vs_grouped_mm.py --out torch-vs-grouped-mm.json

One rank (ft.Runtime(virtual_ranks=1)): nothing is balanced, so this is each layer's own cost.
Same process, same bf16 weights and inputs, forward + backward (gradients of the hidden states,
the routing weights and every expert weight). Before timing, each (shape, routing) checks that
the layers agree: relative L2 error <= 2e-2 for the output and every gradient (bf16 inputs,
weights and outputs; both accumulate in fp32). Timing: warm-up, then every repetition runs each
case once, in rotated order (interleaved A/B), between CUDA events on the current stream after a
synchronize; median, p10/p90, min/max.

Cases per (shape, routing):
  grouped_mm           the layer, every expert's rows padded to a multiple of --align rows (8:
                       TorchTitan's token group alignment for bf16); bf16 .grad parameters
  grouped_mm_unpadded  the same without padding (torch._grouped_mm takes any bf16 group sizes on
                       sm90 since torch 2.8); left out with --no-unpadded
  grouped_mm_main_grad, grouped_mm_unpadded_main_grad
                       the same layers with Megatron's convention: after the backward each weight's
                       bf16 .grad is added into its fp32 main_grad (what Megatron's DDP does for a
                       parameter without a fused wgrad: main_grad.add_(grad)) and .grad dropped
  feplb_grad_bf16      feplb.torch.MoE with ordinary bf16 .grad parameters
  feplb_main_grad_fp32 feplb.torch.MoE adding into fp32 main_grad (its dW GEMMs accumulate there)
Each gradient convention is compared with the grouped_mm layer in the same convention. The main_grad
cells also keep the stricter ratio against the bf16 .grad layer (`ratio_vs_bf16_grad_layer`),
which is not charged for any fp32 accumulation.

Output: --out JSON with a list `cells` (shape, routing, gradient convention, feplb's median and
the grouped_mm layer's, their spreads, and `ratio` = feplb / the FASTER grouped_mm variant of that
(shape, routing), named in `grouped_mm_variant`; both variants' statistics and ratios are kept:
`grouped_mm_padded`, `grouped_mm_unpadded`, `ratio_vs_padded`, `ratio_vs_unpadded`) and a printed
table. Target: ratio <= 0.87 in every cell. Exit status 1 if any (shape, routing) disagreed beyond
the tolerance (its cells are still timed and written).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_common import (  # noqa: E402
    ROUTINGS, fastest, grid_shapes, padded_capacity, padded_layout, rotated, shapes_by_name, summary,
    zipf_popularity)

import feplb.torch as ft  # noqa: E402

REL_TOL = 2e-2
TARGET = 0.87
BASELINES = ("grouped_mm", "grouped_mm_unpadded")


class WeightedSwiGLU(torch.autograd.Function):
    """act = silu(gate) * up * w[:, None] on the grouped GEMM's [M, 2F] gate|up output h (gate's F
    columns, then up's), read through views (no copy); the routing weight scales the F-wide
    activation before the down GEMM (as Megatron's experts do: down is linear, so this is the
    weighted output) instead of an H-wide pass after it. Backward writes d gate and d up straight
    into the two halves of one [M, 2F] gradient (autograd's chunk/slice backward would allocate
    and fill two zero [M, 2F] tensors and add them), and gives w's gradient, sum_f dact * s * up,
    accumulated in fp32. Saves h and silu(gate), as autograd would for the unfused expression."""

    @staticmethod
    def forward(ctx, h, w):
        gate, up = h.chunk(2, dim=-1)
        s = F.silu(gate)
        ctx.save_for_backward(h, s, w)
        return s * up * w.to(h.dtype).unsqueeze(-1)

    @staticmethod
    def backward(ctx, dact):
        h, s, w = ctx.saved_tensors
        gate, up = h.chunk(2, dim=-1)
        f = gate.shape[-1]
        dw = (dact * (s * up)).sum(-1, dtype=torch.float32).to(w.dtype)
        da = dact * w.to(dact.dtype).unsqueeze(-1)
        dh = torch.empty_like(h)
        torch.mul(da, s, out=dh[:, f:])  # d up = da * silu(gate)
        torch.ops.aten.silu_backward.grad_input(da * up, gate, grad_input=dh[:, :f])  # d gate
        return dh, dw


class GroupedMMMoE(torch.nn.Module):
    """The TorchTitan-style MoE experts layer over torch._grouped_mm, with the weights of a feplb
    layer (copied): w13 [E, 2F, H] (gate's F rows, then up's) and w2 [E, H, F], used transposed
    (the layout TorchTitan's GroupedExperts keeps). forward(x [S, H] bf16, topk_idx [S, K],
    topk_weight [S, K] fp32) -> [S, H] bf16 = sum_k w[t, k] * FFN_e(x[t]).

    Written as a careful user would, with no host sync and no pass a fused kernel would not need:
    one stable argsort of the (token, k) pairs by expert and torch.histc counts (TorchTitan's; the
    bincount it replaces reads its maximum back to the host); the rows gathered once (padded: one
    gather from x with a zero row appended, the padding slots pointing at it, instead of zeros +
    index_copy and an un-padding gather after); gate|up in one grouped GEMM; WeightedSwiGLU (the
    routing weight on the F-wide activation, no fp32 [M, H] temporaries, no slice-backward
    copies); down in a second grouped GEMM; every row added back to its token with one in-place
    index_add_ (one read of the rows, atomics into [S, H]; scatter_add would need an [M, H] index).
    Padded, the last group also takes the slots after the last real one (zero rows: defined
    outputs, nothing read back)."""

    def __init__(self, gate_up, down, align: int):
        super().__init__()
        with torch.no_grad():
            self.w13 = torch.nn.Parameter(torch.stack([g.t() for g in gate_up]).contiguous())
            self.w2 = torch.nn.Parameter(torch.stack([d.t() for d in down]).contiguous())
        self.align = align

    def forward(self, x, topk_idx, topk_weight):
        S, H = x.shape
        K = topk_idx.shape[1]
        E = self.w13.shape[0]
        flat = topk_idx.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the (token, k) pairs grouped by expert
        counts = torch.histc(flat.float(), bins=E, min=0, max=E).to(torch.int64)  # no host sync
        tok = order // K
        w_sorted = topk_weight.reshape(-1).index_select(0, order)
        n = flat.numel()
        if self.align > 1:
            cap = padded_capacity(n, E, self.align)
            dest, ends = padded_layout(counts, flat.index_select(0, order).long(),
                                       torch.arange(n, device=x.device), self.align, lambda t: torch.cumsum(t, 0))
            src = torch.full((cap,), S, dtype=torch.int64, device=x.device).index_copy_(0, dest, tok)
            w_slot = w_sorted.new_zeros(cap).index_copy(0, dest, w_sorted)
            rows = torch.cat([x, x.new_zeros(1, H)]).index_select(0, src)  # padding slots read the zero row
            offs = ends.to(torch.int32)
            offs[-1:].fill_(cap)  # the last group takes the trailing slots too (zero rows); no host copy
        else:
            src, w_slot = tok, w_sorted
            rows = x.index_select(0, tok)
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
        h = torch._grouped_mm(rows, self.w13.transpose(-2, -1), offs=offs)  # [M, 2F]
        act = WeightedSwiGLU.apply(h, w_slot)  # [M, F], weighted
        y = torch._grouped_mm(act, self.w2.transpose(-2, -1), offs=offs)  # [M, H]
        out = x.new_zeros(S + (1 if self.align > 1 else 0), H).index_add_(0, src, y)
        return out[:S] if self.align > 1 else out


def make_routing(tokens, experts, top_k, kind, gen):
    """[S, K] distinct expert ids per token (int32) and weights summing to 1 (fp32). uniform: every
    K-subset alike; zipf1.0: drawn without replacement in proportion to 1/(e+1) (Gumbel top-k)."""
    u = torch.rand(tokens, experts, generator=gen, device="cuda")
    if kind == "uniform":
        scores = u
    elif kind == "zipf1.0":
        logp = torch.log(torch.tensor(zipf_popularity(experts, 1.0), device="cuda"))
        scores = logp - torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
    else:
        raise ValueError(f"unknown routing {kind!r}")
    idx = scores.topk(top_k, dim=1).indices.to(torch.int32)
    w = torch.rand(tokens, top_k, generator=gen, device="cuda") + 0.1
    return idx.contiguous(), (w / w.sum(-1, keepdim=True)).contiguous()


def rel_l2(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_agreement(moe, base, x, idx, w, g, main_grad: bool) -> dict:
    """One forward + backward of each layer from the same inputs: relative L2 errors of the output
    and of every gradient (feplb's against the grouped_mm layer's)."""
    params = list(moe.parameters())
    for p in params:
        p.grad = None
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device) if main_grad else None
    base.w13.grad = base.w2.grad = None
    xa, wa = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    xb, wb = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out_a = moe(xa, idx, wa)
    out_a.backward(g)
    out_b = base(xb, idx, wb)
    out_b.backward(g)
    torch.cuda.synchronize()

    def grads(ps):  # [E, H, 2F] or [E, F, H]: one stacked parameter, or one per expert
        if isinstance(ps, torch.nn.Parameter):
            return (ps.main_grad if main_grad else ps.grad).float()
        return torch.stack([(p.main_grad if main_grad else p.grad).float() for p in ps])

    errs = {"out": rel_l2(out_a, out_b), "grad_hidden": rel_l2(xa.grad, xb.grad),
            "grad_topk_weight": rel_l2(wa.grad, wb.grad),
            "grad_gate_up": rel_l2(grads(moe.gate_up), base.w13.grad.transpose(1, 2)),
            "grad_down": rel_l2(grads(moe.down), base.w2.grad.transpose(1, 2))}
    for p in params:
        p.grad = None
        p.main_grad = None
    base.w13.grad = base.w2.grad = None
    return errs


def time_cases(cases: dict, reps: int, warmup: int) -> dict:
    """cases: name -> (prepare, run); prepare is untimed. Interleaved, rotated order."""
    names = list(cases)
    times = {n: [] for n in names}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(warmup + reps):
        for name in rotated(names, i):
            prepare, run = cases[name]
            prepare()
            torch.cuda.synchronize()
            e0.record()
            run()
            e1.record()
            torch.cuda.synchronize()
            if i >= warmup:
                times[name].append(e0.elapsed_time(e1))
    return {n: summary(t) for n, t in times.items()}


def bench_shape(shape, routings, a, cells, failures):
    """One shape's cells; its runtime is closed once the layers made from it are gone."""
    t0 = time.time()
    # One rank: nothing is balanced, so no guest rows (the smallest guest arena).
    rt = ft.Runtime(virtual_ranks=1, num_experts=shape["experts"], hidden=shape["hidden"], ffn=shape["ffn"],
                    max_tokens=shape["tokens"], max_top_k=shape["top_k"], guest_capacity_rows=8,
                    expert_gemm=a.expert_gemm)
    shape["expert_gemm"] = rt.info()[0]["expert_gemm"]
    run_shape(rt, shape, routings, a, cells, failures, t0)
    gc.collect()
    rt.close()
    torch.cuda.empty_cache()


def run_shape(rt, shape, routings, a, cells, failures, t0):
    E, H, Fd, S, K = shape["experts"], shape["hidden"], shape["ffn"], shape["tokens"], shape["top_k"]
    torch.manual_seed(1)
    # feplb's parameters as the grouped_mm layer holds its own: one [E, ...] tensor per weight kind
    # (--per-expert-params: one parameter per expert and kind).
    moe = ft.MoE(rt, K, stacked=not a.per_expert_params)
    base = GroupedMMMoE(list(moe.gate_up), list(moe.down), a.align)
    unpadded = not a.no_unpadded and a.align > 1  # the same layer with padding off, as a further case
    params = list(moe.parameters())
    main = [torch.zeros(p.shape, dtype=torch.float32, device="cuda") for p in params]
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(S, H, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.randn(S, H, device="cuda", generator=gen).to(torch.bfloat16)
    print(f"== {shape['name']}: E={E} H={H} F={Fd} tokens={S} top-{K} (setup {time.time() - t0:.1f} s)", flush=True)
    for routing in routings:
        t1 = time.time()
        idx, w = make_routing(S, E, K, routing, gen)
        counts = torch.bincount(idx.reshape(-1).long(), minlength=E)
        errs = {"grad_bf16": check_agreement(moe, base, x, idx, w, g, False),
                "main_grad_fp32": check_agreement(moe, base, x, idx, w, g, True)}
        worst = max(v for e in errs.values() for v in e.values())
        if unpadded:
            with torch.no_grad():
                base.align = 1
                out_unpadded = base(x, idx, w)
                base.align = a.align
                errs["unpadded_vs_padded"] = {"out": rel_l2(out_unpadded, base(x, idx, w))}
            worst = max(worst, errs["unpadded_vs_padded"]["out"])
        agrees = worst <= REL_TOL
        if not agrees:
            failures.append(f"{shape['name']} {routing}: {errs}")
        xr = x.detach().clone().requires_grad_()
        wr = w.detach().clone().requires_grad_()

        def prep_feplb(use_main):
            def f():
                for p, m in zip(params, main):
                    p.grad = None
                    p.main_grad = m if use_main else None
                xr.grad = wr.grad = None
            return f

        def run_feplb():
            moe(xr, idx, wr).backward(g)

        def prep_base(align):
            def f():
                base.w13.grad = base.w2.grad = None
                base.align = align
                xr.grad = wr.grad = None
            return f

        def run_base():
            base(xr, idx, wr).backward(g)

        base_main = [torch.zeros(p.shape, dtype=torch.float32, device="cuda") for p in (base.w13, base.w2)]

        def run_base_main():
            base(xr, idx, wr).backward(g)
            for p, m in zip((base.w13, base.w2), base_main):
                m.add_(p.grad)
                p.grad = None

        cases = {"grouped_mm": (prep_base(a.align), run_base),
                 "grouped_mm_main_grad": (prep_base(a.align), run_base_main),
                 "feplb_grad_bf16": (prep_feplb(False), run_feplb),
                 "feplb_main_grad_fp32": (prep_feplb(True), run_feplb)}
        if unpadded:
            cases["grouped_mm_unpadded"] = (prep_base(1), run_base)
            cases["grouped_mm_unpadded_main_grad"] = (prep_base(1), run_base_main)
        stats = time_cases(cases, a.reps, a.warmup)
        base.align = a.align
        for p in params:
            p.main_grad = None
            p.grad = None
        # The demanding comparison: against the faster grouped_mm variant of this (shape, routing),
        # in the same gradient convention.
        bf16_best = fastest(stats, BASELINES)
        for conv, case in (("grad_bf16", "feplb_grad_bf16"), ("main_grad_fp32", "feplb_main_grad_fp32")):
            suffix = "_main_grad" if conv == "main_grad_fp32" else ""
            best = fastest(stats, [n + suffix for n in BASELINES])
            gm = stats[best]
            variants = {"padded": stats["grouped_mm" + suffix],
                        "unpadded": stats.get("grouped_mm_unpadded" + suffix)}
            fe = stats[case]
            cell = {"shape": dict(shape), "routing": routing, "gradient": conv,
                    "feplb_ms": fe["median_ms"], "grouped_mm_ms": gm["median_ms"],
                    "ratio": fe["median_ms"] / gm["median_ms"],
                    "grouped_mm_gradient": ("bf16 .grad added into fp32 main_grad" if suffix else "bf16 .grad"),
                    "grouped_mm_variant": "unpadded" if "unpadded" in best else "padded",
                    "feplb": fe, "grouped_mm": gm, "grouped_mm_align_rows": a.align,
                    "rows_per_expert": {"min": int(counts.min()), "max": int(counts.max())},
                    "agreement_rel_l2": errs[conv], "agrees": agrees}
            for label, st in variants.items():
                if st is not None:
                    cell[f"grouped_mm_{label}"] = st
                    cell[f"grouped_mm_{label}_ms"] = st["median_ms"]
                    cell[f"ratio_vs_{label}"] = fe["median_ms"] / st["median_ms"]
            if suffix:  # the stricter ratio: against the layer that keeps bf16 .grad
                cell["grouped_mm_bf16_grad_ms"] = stats[bf16_best]["median_ms"]
                cell["ratio_vs_bf16_grad_layer"] = fe["median_ms"] / stats[bf16_best]["median_ms"]
            if unpadded:
                cell["unpadded_vs_padded_rel_l2"] = errs["unpadded_vs_padded"]["out"]
            cells.append(cell)
            others = "  ".join(f"{label} {st['median_ms']:.3f} ms ({cell[f'ratio_vs_{label}']:.3f}x)"
                               for label, st in variants.items() if st is not None)
            print(f"   {routing:<8} {conv:<15} feplb {fe['median_ms']:8.3f} ms [{fe['p10_ms']:.3f}, "
                  f"{fe['p90_ms']:.3f}]  grouped_mm ({cell['grouped_mm_variant']}, the faster) {gm['median_ms']:8.3f} "
                  f"ms [{gm['p10_ms']:.3f}, {gm['p90_ms']:.3f}]  ratio {cell['ratio']:.3f}  [{others}]  "
                  f"{'agree' if agrees else 'DISAGREE'} (max rel L2 {worst:.2e})", flush=True)
        print(f"   ({routing}: {time.time() - t1:.1f} s; rows per expert {int(counts.min())}..{int(counts.max())})",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="torch-vs-grouped-mm.json")
    ap.add_argument("--shapes", default="all", help="comma-separated names (bench/gpu/_bench_common.py SHAPES)")
    ap.add_argument("--routings", default=",".join(ROUTINGS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--align", type=int, default=8, help="rows each expert's group is padded to (1: none)")
    ap.add_argument("--no-unpadded", action="store_true", help="skip the unpadded grouped_mm case")
    ap.add_argument("--grid", action="store_true",
                    help="the grid of local experts x rows per expert (_bench_common.GRID_*) instead of --shapes")
    ap.add_argument("--grid-experts", default=None, help="a subset of the grid's expert counts, e.g. 64,128")
    ap.add_argument("--grid-rows", default=None, help="a subset of the grid's rows per expert, e.g. 256,512")
    ap.add_argument("--per-expert-params", action="store_true",
                    help="feplb's MoE with one parameter per expert (default: stacked, one per weight kind)")
    ap.add_argument("--expert-gemm", default="auto", choices=("auto", "grouped", "per_expert"),
                    help="feplb's expert GEMMs (ft.Runtime(expert_gemm=...))")
    a = ap.parse_args()
    if a.reps < 20:
        print(f"note: --reps {a.reps} is under the 20 the method asks for", flush=True)
    if not hasattr(torch, "_grouped_mm"):
        sys.exit(f"torch {torch.__version__} has no torch._grouped_mm")
    routings = [r.strip() for r in a.routings.split(",") if r.strip()]
    for r in routings:
        if r not in ROUTINGS:
            sys.exit(f"--routings: unknown {r!r}; known: {', '.join(ROUTINGS)}")
    shapes = grid_shapes(a.grid_experts, a.grid_rows) if a.grid else shapes_by_name(a.shapes)
    cells, failures = [], []
    t0 = time.time()
    for shape in shapes:
        bench_shape(shape, routings, a, cells, failures)
        write_doc(a, cells, failures, t0, partial=True)  # what a cut-off run leaves is still data
    write_doc(a, cells, failures, t0, partial=False)
    print_table(a, cells, failures, t0)


def write_doc(a, cells, failures, t0, partial: bool):
    doc = {"benchmark": "feplb.torch.MoE vs a torch._grouped_mm MoE layer (TorchTitan-style)",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "ranks": 1,
           "reps": a.reps, "warmup": a.warmup, "agreement_tolerance_rel_l2": REL_TOL, "target_ratio": TARGET,
           "baseline": "GroupedMMMoE (this file): argsort + histc, one gather, gate|up grouped GEMM, WeightedSwiGLU "
                       "(routing weight on the activation, one-buffer backward), down grouped GEMM, index_add_; "
                       "padded to --align rows per expert and unpadded",
           "ratio": "feplb median / the faster grouped_mm variant's median of the same (shape, routing) in the "
                    "same gradient convention (main_grad: the layer's bf16 .grad added into fp32 main_grad); "
                    "main_grad cells also give ratio_vs_bf16_grad_layer",
           "method": "one rank (no balancing); forward + backward per repetition (gradients of hidden, "
                     "topk_weight and every expert weight), CUDA events around each on the current stream "
                     "after a synchronize, the cases interleaved in rotated order; resetting .grad / main_grad "
                     "is untimed; the grouped_mm layer's main_grad case adds its bf16 .grad into fp32 main_grad "
                     "inside the timed region",
           "feplb_params": "per expert" if a.per_expert_params else "stacked (one [E, ...] tensor per kind)",
           "seconds": time.time() - t0, "partial": partial, "grid": a.grid, "cells": cells,
           "disagreements": failures}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, a.out)


def print_table(a, cells, failures, t0):
    print()
    print("ratio = feplb / the FASTER grouped_mm variant (padded to 8-row groups or unpadded) of each "
          "(shape, routing), in the same gradient convention; target <= 0.87. 'vs .grad layer': main_grad "
          "cells against the grouped_mm layer that keeps bf16 .grad (no fp32 accumulation)")
    print(f"{'shape':<20} {'E':>3} {'H':>5} {'F':>5} {'tok':>5} {'routing':<8} {'gradient':<15} "
          f"{'feplb ms [p10,p90]':<26} {'grouped_mm ms [p10,p90]':<26} {'faster':<9} {'ratio':>6} "
          f"{'vs padded':>9} {'vs unpadded':>11} {'vs .grad layer':>14}")
    for c in cells:
        s, fe, gm = c["shape"], c["feplb"], c["grouped_mm"]
        vp = f"{c['ratio_vs_padded']:.3f}" if "ratio_vs_padded" in c else "-"
        vu = f"{c['ratio_vs_unpadded']:.3f}" if "ratio_vs_unpadded" in c else "-"
        vg = f"{c['ratio_vs_bf16_grad_layer']:.3f}" if "ratio_vs_bf16_grad_layer" in c else "-"
        print(f"{s['name']:<20} {s['experts']:>3} {s['hidden']:>5} {s['ffn']:>5} {s['tokens']:>5} {c['routing']:<8} "
              f"{c['gradient']:<15} {fe['median_ms']:7.3f} [{fe['p10_ms']:.3f},{fe['p90_ms']:.3f}]{'':<4} "
              f"{gm['median_ms']:7.3f} [{gm['p10_ms']:.3f},{gm['p90_ms']:.3f}]{'':<4} {c['grouped_mm_variant']:<9} "
              f"{c['ratio']:6.3f} {vp:>9} {vu:>11} {vg:>14}")
    target = [c for c in cells if c["ratio"] > TARGET]
    print(f"\n{len(cells) - len(target)} of {len(cells)} cells at or under {TARGET}x the faster grouped_mm variant; "
          f"{time.time() - t0:.0f} s; wrote {a.out}")
    if failures:
        print("DISAGREEMENT beyond the tolerance:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
