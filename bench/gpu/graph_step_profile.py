"""Where a whole HF model's training step loses time when its forward + backward is replayed from a
CUDA graph instead of run eagerly (bench/gpu/hf_swap.py --graphed measured every graphed step 7-10
ms slower than the eager one, for feplb's layer and for transformers' grouped_mm alike, while one
layer alone is faster from a graph).

    PYTHONPATH=python FEPLB_LIBRARY=build/lib/libfeplb_c.so python3 bench/gpu/graph_step_profile.py \
        --model qwen3_moe --experts 32 --out graph-step-profile.json

Per variant (transformers' grouped_mm model and feplb's copy, each eager and graphed, as in
hf_swap.py: the graphed ones captured after three warm-up steps on a side stream, gradients owned
by the graph), interleaved in rotated order:
  1. phases timed with CUDA events after a synchronize, median of --reps: the forward + backward
     (eager: zero_grad + forward + backward; graphed: the replay) and the AdamW step after it;
  2. how the model called scaled_dot_product_attention, eagerly and while a stream was being
     captured: with an explicit attention mask or is_causal (a mask rules out the flash kernels);
  3. one step under torch.profiler (CUDA activity, after a warm-up step): GPU time summed per
     kernel name, the kernel count and the summed time per phase; then, for each pair eager /
     graphed of the same model, the kernels whose summed time differs most.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_common import rotated, summary  # noqa: E402
import hf_swap  # noqa: E402


def phases_eager(model, opt, ids):
    def fwd_bwd():
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
    return fwd_bwd, opt.step


def phases_graphed(model, ids, attention):
    run, err = hf_swap.capture_step(model, ids, attention)
    graph, _loss, opt, _model, _causal = run.keep
    return graph.replay, opt.step, run, err


def timed_phases(fwd_bwd, opt_step):
    torch.cuda.synchronize()
    e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    e[0].record()
    fwd_bwd()
    e[1].record()
    opt_step()
    e[2].record()
    torch.cuda.synchronize()
    return e[0].elapsed_time(e[1]), e[1].elapsed_time(e[2])


def kernel_profile(fwd_bwd, opt_step):
    """GPU time (us) summed per kernel name (memcpy and memset included) over one step, from
    torch.profiler, and the count of such activities."""
    from torch.profiler import ProfilerActivity, profile

    fwd_bwd()
    opt_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fwd_bwd()
        opt_step()
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(float)
    count = 0
    for ev in prof.events():
        # GPU activity only: kernels, copies, memsets (not the GPU-side ranges of annotations such
        # as "Optimizer.step#AdamW.step", which span the kernels they hold)
        if ev.device_type != torch.autograd.DeviceType.CUDA or getattr(ev, "is_user_annotation", False) \
                or "#" in ev.name:
            continue
        per_kernel[ev.name[:120]] += ev.time_range.end - ev.time_range.start
        count += 1
    return dict(per_kernel), count


def probe_sdpa():
    """Counts scaled_dot_product_attention calls by (capturing, mask given, is_causal)."""
    import torch.nn.functional as F

    calls = collections.Counter()
    inner = F.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)  # either way
        key = ("capturing" if torch.cuda.is_current_stream_capturing() else "eager",
               "mask" if mask is not None else "no mask", f"is_causal={bool(causal)}")
        calls[key] += 1
        return inner(*args, **kwargs)

    F.scaled_dot_product_attention = sdpa
    return calls


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="graph-step-profile.json")
    hf_swap.add_model_args(ap)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--graphed-attention", choices=("causal", "as_is"), default="as_is",
                    help="attention in the graphs (hf_swap.py's option): as_is = transformers' mask under capture")
    ap.add_argument("--top", type=int, default=15, help="kernels listed per eager / graphed pair")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("graph_step_profile: no CUDA device")
    t0 = time.time()
    sdpa_calls = probe_sdpa()
    base, tf_version = hf_swap.build(a)
    if not hasattr(base, "set_experts_implementation"):
        sys.exit(f"transformers {tf_version} has no set_experts_implementation (no grouped_mm backend)")
    base.set_experts_implementation("grouped_mm")
    gen = torch.Generator(device="cuda").manual_seed(2)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda", generator=gen)

    ours = hf_swap.graphed_feplb_model(base, a)  # eager feplb with the same (grouped) GEMMs
    variants = {
        "grouped_mm": phases_eager(base, torch.optim.AdamW(base.parameters(), lr=1e-5), ids),
        "feplb": phases_eager(ours, torch.optim.AdamW(ours.parameters(), lr=1e-5), ids),
    }
    keep, loss_err = [], {}
    for name, make in (("graphed_grouped_mm", lambda: hf_swap.graphed_grouped_mm_model(base)),
                       ("graphed_feplb", lambda: hf_swap.graphed_feplb_model(base, a))):
        fwd_bwd, opt_step, run, err = phases_graphed(make(), ids, a.graphed_attention)
        variants[name] = (fwd_bwd, opt_step)
        keep.append(run)
        loss_err[name] = err
        print(f"{name}: captured; first replay's loss vs eager, relative error {err:.2e}", flush=True)

    names = list(variants)
    times = {n: {"fwd_bwd": [], "opt": []} for n in names}
    for i in range(a.warmup + a.reps):
        for n in rotated(names, i):
            fb, op = timed_phases(*variants[n])
            if i >= a.warmup:
                times[n]["fwd_bwd"].append(fb)
                times[n]["opt"].append(op)
    doc = {"benchmark": "whole HF model step, eager against forward + backward replayed from a CUDA graph: "
                        "phases and kernels", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "transformers": tf_version, "model": a.model, "experts": a.experts, "layers": a.layers,
           "hidden": a.hidden, "ffn": a.ffn, "top_k": a.top_k, "tokens": a.batch * a.seq, "reps": a.reps,
           "graphed_attention": a.graphed_attention,
           "loss_rel_err": loss_err, "phases": {}, "kernels": {}, "pairs": {},
           "sdpa_calls": {" / ".join(k): v for k, v in sorted(sdpa_calls.items())}}
    print("scaled_dot_product_attention calls: " + "; ".join(f"{k}: {v}" for k, v in doc["sdpa_calls"].items()))
    print(f"\n{'variant':<20} {'fwd+bwd ms':>11} {'AdamW ms':>9} {'kernels':>8} {'kernel ms':>10}")
    for n in names:
        per_kernel, count = kernel_profile(*variants[n])
        doc["phases"][n] = {k: summary(v) for k, v in times[n].items()}
        doc["kernels"][n] = {"count": count, "sum_ms": sum(per_kernel.values()) / 1e3,
                             "per_name_us": dict(sorted(per_kernel.items(), key=lambda kv: -kv[1])[:60])}
        ph = doc["phases"][n]
        print(f"{n:<20} {ph['fwd_bwd']['median_ms']:>11.3f} {ph['opt']['median_ms']:>9.3f} {count:>8} "
              f"{doc['kernels'][n]['sum_ms']:>10.3f}", flush=True)
        variants[n] = variants[n] + (per_kernel,)
    for eager, graphed in (("grouped_mm", "graphed_grouped_mm"), ("feplb", "graphed_feplb")):
        ke, kg = variants[eager][2], variants[graphed][2]
        diff = {k: kg.get(k, 0.0) - ke.get(k, 0.0) for k in set(ke) | set(kg)}
        top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:a.top]
        doc["pairs"][f"{graphed}-{eager}"] = [{"kernel": k, "eager_us": ke.get(k, 0.0), "graphed_us": kg.get(k, 0.0),
                                               "diff_us": d} for k, d in top]
        print(f"\n{graphed} - {eager}: kernel time {sum(kg.values()) / 1e3:.3f} - {sum(ke.values()) / 1e3:.3f} ms; "
              f"largest differences (us, graphed - eager):")
        for k, d in top:
            print(f"  {d:+10.1f}  eager {ke.get(k, 0.0):9.1f}  graphed {kg.get(k, 0.0):9.1f}  {k[:90]}")
    doc["seconds"] = time.time() - t0
    with open(a.out + ".tmp", "w") as fo:
        json.dump(doc, fo, indent=2)
    os.replace(a.out + ".tmp", a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
