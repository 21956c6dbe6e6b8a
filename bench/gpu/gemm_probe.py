"""Which way of running an MoE layer's expert GEMMs is fastest on this GPU, for the shapes of
bench/gpu/torch_vs_grouped_mm.py: a loop of one torch.mm per expert (one cuBLAS GEMM each, what
feplb's layer does) on one stream, the same loop spread over 2 and 4 CUDA streams, and one
torch._grouped_mm per pattern.

    python3 bench/gpu/gemm_probe.py --out gemm-probe.json

The six GEMM patterns of a SwiGLU expert layer, for M_e rows of expert e (sum over experts):
  fwd_gate_up     [M_e, H] x [H, 2F]        fwd_down        [M_e, F] x [F, H]
  bwd_down_dx     [M_e, H] x [H, F]         bwd_down_dw     [F, M_e] x [M_e, H]
  bwd_gate_up_dx  [M_e, 2F] x [2F, H]       bwd_gate_up_dw  [H, M_e] x [M_e, 2F]
bf16 in, bf16 out (torch.mm and torch._grouped_mm both write their input dtype; feplb's weight
gradients are fp32, which this probe does not model). Row counts per expert: uniform (S*K/E
each) and Zipf 1.0 (the expected counts of top-K routing drawn without replacement in proportion
to 1/(e+1), as in the benchmark).

Each (pattern, strategy) is timed two ways: `eager` (launched from Python each repetition, as a
framework would; small experts show launch costs) and `graph` (the same calls captured once in a
CUDA graph and replayed: the GPU's own time, what launches from C++ could reach at best).
Median, p10 and p90 of the repetitions after a warm-up, CUDA events, no synchronize between
repetitions (steady state). TFLOP/s = 2 * sum_e(M_e) * N * K / time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_common import ROUTINGS, gemm_flops, shapes_by_name, summary, zipf_popularity  # noqa: E402

PATTERNS = ("fwd_gate_up", "fwd_down", "bwd_down_dx", "bwd_down_dw", "bwd_gate_up_dx", "bwd_gate_up_dw")
STRATEGIES = ("loop_1_stream", "loop_2_streams", "loop_4_streams", "grouped_mm")


def expected_counts(tokens, experts, top_k, routing, gen):
    """Rows per expert: uniform (equal split) or the counts of one Zipf-1.0 top-K routing draw."""
    if routing == "uniform":
        base = tokens * top_k // experts
        counts = [base] * experts
        for e in range(tokens * top_k - base * experts):
            counts[e] += 1
        return counts
    logp = torch.log(torch.tensor(zipf_popularity(experts, 1.0), device="cuda"))
    u = torch.rand(tokens, experts, generator=gen, device="cuda").clamp(1e-20, 1.0 - 1e-7)
    idx = (logp - torch.log(-torch.log(u))).topk(top_k, dim=1).indices
    return torch.bincount(idx.reshape(-1), minlength=experts).tolist()


class Problem:
    """The tensors of one (shape, routing): activations, weights in feplb's layout for the loops
    and TorchTitan's for grouped_mm, and the outputs each call writes."""

    def __init__(self, shape, counts):
        E, H, F = shape["experts"], shape["hidden"], shape["ffn"]
        self.E, self.H, self.F, self.counts = E, H, F, counts
        n = sum(counts)
        self.bounds = []
        s = 0
        for c in counts:
            self.bounds.append((s, s + c))
            s += c
        bf = dict(device="cuda", dtype=torch.bfloat16)
        r = lambda *sh: torch.randn(*sh, **bf) * 0.1  # noqa: E731
        self.x, self.a, self.dy, self.dgu = r(n, H), r(n, F), r(n, H), r(n, 2 * F)
        self.gu_out, self.y, self.da, self.dx = (torch.empty(n, 2 * F, **bf), torch.empty(n, H, **bf),
                                                 torch.empty(n, F, **bf), torch.empty(n, H, **bf))
        self.wgu, self.wd = r(E, H, 2 * F), r(E, F, H)  # feplb: gate_up [H, 2F], down [F, H]
        self.dwgu, self.dwd = torch.empty(E, H, 2 * F, **bf), torch.empty(E, F, H, **bf)
        self.w13, self.w2 = self.wgu.transpose(1, 2).contiguous(), self.wd.transpose(1, 2).contiguous()
        self.offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        self.rows = n

    def flops(self, pattern):
        H, F, n = self.H, self.F, self.rows
        return {"fwd_gate_up": gemm_flops(n, 2 * F, H), "fwd_down": gemm_flops(n, H, F),
                "bwd_down_dx": gemm_flops(n, F, H), "bwd_down_dw": gemm_flops(n, H, F),
                "bwd_gate_up_dx": gemm_flops(n, H, 2 * F), "bwd_gate_up_dw": gemm_flops(n, 2 * F, H)}[pattern]

    def expert_call(self, pattern):
        """fn(e): expert e's GEMM of the pattern, one torch.mm into its slice of the output."""
        b = self.bounds
        calls = {
            "fwd_gate_up": lambda e: torch.mm(self.x[b[e][0]:b[e][1]], self.wgu[e], out=self.gu_out[b[e][0]:b[e][1]]),
            "fwd_down": lambda e: torch.mm(self.a[b[e][0]:b[e][1]], self.wd[e], out=self.y[b[e][0]:b[e][1]]),
            "bwd_down_dx": lambda e: torch.mm(self.dy[b[e][0]:b[e][1]], self.wd[e].t(), out=self.da[b[e][0]:b[e][1]]),
            "bwd_down_dw": lambda e: torch.mm(self.a[b[e][0]:b[e][1]].t(), self.dy[b[e][0]:b[e][1]], out=self.dwd[e]),
            "bwd_gate_up_dx": lambda e: torch.mm(self.dgu[b[e][0]:b[e][1]], self.wgu[e].t(),
                                                 out=self.dx[b[e][0]:b[e][1]]),
            "bwd_gate_up_dw": lambda e: torch.mm(self.x[b[e][0]:b[e][1]].t(), self.dgu[b[e][0]:b[e][1]],
                                                 out=self.dwgu[e]),
        }
        return calls[pattern]

    def grouped_call(self, pattern):
        """One torch._grouped_mm for the pattern (the calls autograd makes for the grouped layer)."""
        o = self.offs
        calls = {
            "fwd_gate_up": lambda: torch._grouped_mm(self.x, self.w13.transpose(-2, -1), offs=o),
            "fwd_down": lambda: torch._grouped_mm(self.a, self.w2.transpose(-2, -1), offs=o),
            "bwd_down_dx": lambda: torch._grouped_mm(self.dy, self.w2, offs=o),
            "bwd_down_dw": lambda: torch._grouped_mm(self.a.t(), self.dy, offs=o),
            "bwd_gate_up_dx": lambda: torch._grouped_mm(self.dgu, self.w13, offs=o),
            "bwd_gate_up_dw": lambda: torch._grouped_mm(self.x.t(), self.dgu, offs=o),
        }
        return calls[pattern]


def strategy_fn(problem, pattern, strategy, streams):
    if strategy == "grouped_mm":
        return problem.grouped_call(pattern)
    call = problem.expert_call(pattern)
    experts = [e for e in range(problem.E) if problem.counts[e] > 0]
    n = {"loop_1_stream": 1, "loop_2_streams": 2, "loop_4_streams": 4}[strategy]
    if n == 1:
        def run():
            for e in experts:
                call(e)
        return run
    mine = streams[:n]

    def run():
        cur = torch.cuda.current_stream()
        for s in mine:
            s.wait_stream(cur)
        for j, s in enumerate(mine):
            with torch.cuda.stream(s):
                for e in experts[j::n]:
                    call(e)
        for s in mine:
            cur.wait_stream(s)
    return run


def measure(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for e0, e1 in events:
        e0.record()
        fn()
        e1.record()
    torch.cuda.synchronize()
    return summary([e0.elapsed_time(e1) for e0, e1 in events])


def measure_graph(fn, reps, warmup):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        return measure(graph.replay, reps, warmup)
    finally:
        del graph


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gemm-probe.json")
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--routings", default=",".join(ROUTINGS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-graph", action="store_true", help="eager launches only")
    a = ap.parse_args()
    if not hasattr(torch, "_grouped_mm"):
        sys.exit(f"torch {torch.__version__} has no torch._grouped_mm")
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(3)
    streams = [torch.cuda.Stream() for _ in range(4)]
    modes = ("eager",) if a.no_graph else ("eager", "graph")
    results, totals = [], []
    for shape in shapes_by_name(a.shapes):
        for routing in [r.strip() for r in a.routings.split(",") if r.strip()]:
            counts = expected_counts(shape["tokens"], shape["experts"], shape["top_k"], routing, gen)
            prob = Problem(shape, counts)
            layer = {}
            for pattern in PATTERNS:
                flops = prob.flops(pattern)
                for strategy in STRATEGIES:
                    for mode in modes:
                        fn = strategy_fn(prob, pattern, strategy, streams)
                        row = {"shape": shape["name"], "routing": routing, "pattern": pattern, "strategy": strategy,
                               "mode": mode, "rows": prob.rows, "rows_min": min(counts), "rows_max": max(counts)}
                        try:
                            st = measure(fn, a.reps, a.warmup) if mode == "eager" else measure_graph(fn, a.reps,
                                                                                                     a.warmup)
                            row.update(st)
                            row["tflops"] = flops / (st["median_ms"] * 1e-3) / 1e12
                            key = (strategy, mode)
                            layer[key] = layer.get(key, 0.0) + st["median_ms"]
                        except Exception as e:  # noqa: BLE001 - recorded, the probe goes on
                            torch.cuda.synchronize()
                            row["error"] = f"{type(e).__name__}: {e}"[:300]
                            layer[(strategy, mode)] = float("nan")
                        results.append(row)
            for (strategy, mode), ms in layer.items():
                totals.append({"shape": shape["name"], "routing": routing, "strategy": strategy, "mode": mode,
                               "six_gemms_ms": ms})
            best = {m: min(((ms, s) for (s, mm), ms in layer.items() if mm == m and ms == ms), default=(None, None))
                    for m in modes}
            line = "  ".join(f"{s}/{m} {ms:.3f}" for (s, m), ms in sorted(layer.items(), key=lambda kv: kv[0][1]))
            print(f"{shape['name']:<11} {routing:<8} rows {min(counts)}..{max(counts)}: {line}", flush=True)
            for m in modes:
                if best[m][1] is not None:
                    print(f"{'':<20} best {m}: {best[m][1]} ({best[m][0]:.3f} ms for the six GEMMs)", flush=True)
            del prob
            torch.cuda.empty_cache()
    print()
    print(f"{'shape':<11} {'routing':<8} {'pattern':<15} {'strategy':<15} {'mode':<6} {'ms':>8} {'TFLOP/s':>8}")
    for r in results:
        if "error" in r:
            print(f"{r['shape']:<11} {r['routing']:<8} {r['pattern']:<15} {r['strategy']:<15} {r['mode']:<6} "
                  f"error: {r['error'][:60]}")
        else:
            print(f"{r['shape']:<11} {r['routing']:<8} {r['pattern']:<15} {r['strategy']:<15} {r['mode']:<6} "
                  f"{r['median_ms']:8.3f} {r['tflops']:8.1f}")
    doc = {"benchmark": "expert GEMM strategies: per-expert torch.mm loops (1/2/4 streams) vs torch._grouped_mm",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": a.reps, "warmup": a.warmup,
           "method": "bf16 in/out; eager = launched from Python each repetition (no synchronize between "
                     "repetitions), graph = one CUDA graph replayed; CUDA events per repetition; median/p10/p90",
           "seconds": time.time() - t0, "patterns": results, "layer_totals": totals}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"\n{time.time() - t0:.0f} s; wrote {a.out}")


if __name__ == "__main__":
    main()
