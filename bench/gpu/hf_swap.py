"""The time per training step of a whole Hugging Face transformers MoE model before and after
feplb.torch.hf.swap_experts, on one GPU (nothing is balanced: every expert is local), and where
that time goes.

    PYTHONPATH=python FEPLB_LIBRARY=build/lib/libfeplb_c.so python3 bench/gpu/hf_swap.py --out hf-swap.json
    ... --profile 5                   # and a profile of 5 more steps per variant (see below)
    ... --profile 5 --trace-dir DIR   # and keep the torch.profiler chrome traces

The model is built from a config with random weights (nothing downloaded), bf16: by default
Qwen3-MoE with Qwen3-30B-A3B's expert shape (H=2048, F=768, top-8) and 32 experts per layer (128
experts at EP=4), 4 layers, batch 1 x 4096 tokens. A training step is forward (with labels) +
backward + AdamW step. Variants, in the same process, interleaved in rotated order, CUDA events
around each step after a synchronize: the model with transformers' "eager" and "grouped_mm"
experts backends (model.set_experts_implementation, where this transformers has it; otherwise
its default only), and a copy with feplb's experts. Before timing: the copy's logits against the
original's (relative L2, reported). Median, p10/p90, min/max of --reps steps after --warmup.

Graphed (--graphed): two more variants in the same rotation, each on a model of its own (a copy
of the original): its forward (with labels) + backward captured once with torch.cuda.graph after
three warm-up steps on a side stream (gradients set to None before the capture, so the graph owns
them), then per step the replay and the AdamW step (outside the graph); feplb's copy on a one-rank
runtime with expert_gemm "grouped" (a captured layer counts its rows on the GPU), transformers'
with its "grouped_mm" backend. Before timing, the first replay's loss against the same model's
eager loss (relative error, reported). A capture that fails is recorded with its error.
`graphed_feplb_over_graphed_grouped_mm`: the ratio of their median step times. Attention in the
graphs (--graphed-attention): by default `as_is`, with the explicit causal mask transformers builds
when a stream is being captured (eagerly it passes is_causal=True and no mask), which rules out the
flash kernels: the memory-efficient ones took 11 ms more per step at the default shape on an H100
(bench/gpu/graph_step_profile.py); `causal` captures attention as the eager step runs it
(CausalInCapture checks the mask after the first replay and does not use it; not yet run on a GPU).

Profile (--profile N; after the timing, so it does not disturb it). Per variant, N more steps
with marks: host time (perf_counter) and a CUDA event on the current stream at the step's start
(after a synchronize, so one clock for both), the end of the forward, of the backward and of the
optimizer step, and around every MoE block's experts module: forward start/end (forward pre-hook
and hook) and backward start/end (a hook on the experts' output gradient; an identity autograd
function on their input). From them, per step (median over the N):
  - host and GPU time of the step, the forward, the backward and the optimizer step;
  - host and GPU time inside the experts modules (all blocks, forward and backward) and outside;
  - the GPU's lag behind the host at each mark: near 0 means the GPU had caught up with the host
    there and was waiting for its next launch (host-bound); large means the host was ahead.
  For feplb also: host time inside the C library's forward and backward calls (the rest of the
  experts' host time is Python: checks, casts, autograd, pointer arrays), and the layer's
  counts_to_host_us summed over the blocks: how long each forward waited on the host for its
  routing counts, i.e. for the GPU to drain everything queued before them.
Then one step per variant (after one warm-up step) under torch.profiler with CUDA activity: the
GPU's busy time (union of kernels, copies and memsets) and idle time within the step's span,
inside the experts modules' ranges (record_function on the same marks) and outside, the kernel
count, the top kernels, and the host time in CUDA runtime/driver calls. The profiler adds host
overhead of its own to every op, so its idle times are upper bounds; the marks are not profiled.

How to read it for feplb's extra time over the grouped_mm backend:
  (a) the forward's wait for the counts: large counts_to_host_us and experts_fwd lag ~0 with a
      large lag for grouped_mm at the same point, GPU idle outside the experts in the forward;
  (b) Python overhead of the adapter: experts host time minus the C calls' host time;
  (c) the fp32 -> bf16 gradient casts: cast/copy kernels among the top kernels (now one per layer
      and weight kind), experts_bwd GPU time;
  (d) the benchmark: the optimizer phase (AdamW over 64 expert tensors a layer instead of 2),
      a synchronize in the step (the lags);
  and the C layer's own host time (launches, its cuBLASLt heuristic refinement, up to 1 ms per
  call while new row counts keep appearing: layer/calls.cc kGemmRefineBudgetMs): the C calls' host
  time against the experts' GPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_common import mark_summary, median_of, rotated, summary, trace_summary  # noqa: E402

import feplb.torch._ops as feplb_ops  # noqa: E402
import feplb.torch.hf as fh  # noqa: E402

MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  lambda a: dict(intermediate_size=4 * a.ffn, moe_intermediate_size=a.ffn, num_experts=a.experts,
                                 num_experts_per_tok=a.top_k, norm_topk_prob=True, decoder_sparse_step=1,
                                 mlp_only_layers=[])),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              lambda a: dict(intermediate_size=a.ffn, num_experts=a.experts, num_experts_per_tok=a.top_k,
                             norm_topk_prob=False)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                lambda a: dict(intermediate_size=a.ffn, num_local_experts=a.experts, num_experts_per_tok=a.top_k)),
}


# The parts of a C call's host time that the layer's stats report (feplb/cuda/stats.h, HostTimes).
HOST_PARTS = ("call", "await", "gemm", "kernel", "exchange", "sync", "hooks", "build", "refine")

def build(a):
    import transformers

    config_name, model_name, extra = MODELS[a.model]
    config_cls, model_cls = getattr(transformers, config_name, None), getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        sys.exit(f"transformers {transformers.__version__} has no {model_name}")
    config = config_cls(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                        max_position_embeddings=max(4096, a.seq), tie_word_embeddings=False, hidden_act="silu",
                        **extra(a))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_cls(config)
    model = model.to(torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():  # unit-scale activations: 1/sqrt(fan_in) matrices, ones for norms
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1] if "embed" not in name else 1
                p.copy_(torch.randn(p.shape, device="cuda", generator=gen) / fan_in ** 0.5)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()
    return model, transformers.__version__


# ---- profile ----------------------------------------------------------------------------------


class Probe:
    """Marks of one step: (name, host perf_counter seconds, CUDA event on the current stream), and
    optionally record_function ranges around the experts (for a torch.profiler trace)."""

    def __init__(self):
        self.marks = []
        self.annotate = False
        self.ranges = {}

    def reset(self):
        self.marks = []
        self.ranges = {}

    def mark(self, name):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.marks.append((name, time.perf_counter(), ev))

    def open(self, key, name):
        if self.annotate:
            rf = torch.autograd.profiler.record_function(name)
            rf.__enter__()
            self.ranges[key] = rf

    def close(self, key):
        rf = self.ranges.pop(key, None)
        if rf is not None:
            rf.__exit__(None, None, None)

    def relative(self):
        """[(name, host_ms, gpu_ms)] relative to the first mark (call after a synchronize)."""
        name0, t0, e0 = self.marks[0]
        return [(n, (t - t0) * 1e3, e0.elapsed_time(e)) for n, t, e in self.marks]


class _BackwardEnd(torch.autograd.Function):
    """Identity on an experts module's input; its backward runs once the experts' backward has
    produced that input's gradient: the end of the experts' backward."""

    @staticmethod
    def forward(ctx, x, probe, index):
        ctx.probe, ctx.index = probe, index
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.probe.mark(f"experts_bwd_end:{ctx.index}")
        ctx.probe.close(("bwd", ctx.index))
        return grad, None, None


def install_probe(model, block_names, probe):
    """Hooks on each MoE block's experts module (block i of block_names); returns the handles."""
    handles = []
    mods = dict(model.named_modules())
    for i, name in enumerate(block_names):
        experts = mods[name].experts

        def pre(module, args, kwargs, i=i):
            probe.mark(f"experts_fwd_start:{i}")
            probe.open(("fwd", i), "experts_fwd")
            if args and isinstance(args[0], torch.Tensor) and args[0].requires_grad and torch.is_grad_enabled():
                args = (_BackwardEnd.apply(args[0], probe, i), *args[1:])
            elif isinstance(kwargs.get("hidden_states"), torch.Tensor) and kwargs["hidden_states"].requires_grad \
                    and torch.is_grad_enabled():
                kwargs = {**kwargs, "hidden_states": _BackwardEnd.apply(kwargs["hidden_states"], probe, i)}
            return args, kwargs

        def post(module, args, output, i=i):
            probe.close(("fwd", i))
            probe.mark(f"experts_fwd_end:{i}")
            if isinstance(output, torch.Tensor) and output.requires_grad:
                def bwd_start(grad, i=i):
                    probe.mark(f"experts_bwd_start:{i}")
                    probe.open(("bwd", i), "experts_bwd")
                output.register_hook(bwd_start)

        handles.append(experts.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(experts.register_forward_hook(post))
    return handles


class _TimedLib:
    """feplb.torch._ops' view of the C library, with its forward and backward calls timed on the
    host (seconds into `sink` as (name, seconds)); everything else passes through."""

    TIMED = ("feplb_forward", "feplb_backward")

    def __init__(self, real, sink):
        self._real, self._sink = real, sink

    def __getattr__(self, name):
        fn = getattr(self._real, name)
        if name not in self.TIMED:
            return fn
        sink = self._sink

        def timed(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                sink.append((name, time.perf_counter() - t))
        return timed


def profile_variants(variants, block_names, ids, a, trace_dir):
    """variants: name -> (prepare, model, optimizer, is_feplb). Returns the profile section."""
    probes = {}
    handles = []
    for name, (_, model, _, _) in variants.items():
        key = id(model)
        if key not in probes:  # the transformers backends share one model
            probes[key] = Probe()
            handles += install_probe(model, block_names, probes[key])
    sink = []
    real_lib = feplb_ops.lib
    feplb_ops.lib = _TimedLib(real_lib, sink)
    out = {"steps": a.profile, "variants": {}}
    try:
        per = {n: [] for n in variants}
        names = list(variants)
        for i in range(a.profile):
            for name in rotated(names, i):
                prepare, model, opt, is_feplb = variants[name]
                probe = probes[id(model)]
                prepare()
                torch.cuda.synchronize()
                probe.reset()
                sink.clear()
                probe.mark("step_start")
                opt.zero_grad(set_to_none=True)
                loss = model(input_ids=ids, labels=ids).loss
                probe.mark("fwd_end")
                loss.backward()
                probe.mark("bwd_end")
                opt.step()
                probe.mark("opt_end")
                torch.cuda.synchronize()
                s = mark_summary(probe.relative(), len(block_names))
                if is_feplb:
                    mods = dict(model.named_modules())
                    stats = [mods[n].experts.stats() for n in block_names]
                    s["feplb"] = {
                        "c_forward_host_ms": 1e3 * sum(t for n, t in sink if n == "feplb_forward"),
                        "c_backward_host_ms": 1e3 * sum(t for n, t in sink if n == "feplb_backward"),
                        "c_calls": len(sink),
                        "counts_to_host_ms": 1e-3 * sum(float(st.get("forward", {}).get("counts_to_host_us", 0.0))
                                                        for st in stats),
                    }
                    # Where the C calls' host time went, summed over the blocks (stats.h HostTimes).
                    for call in ("forward", "backward"):
                        for part in HOST_PARTS:
                            s["feplb"][f"c_{call}_{part}_ms"] = 1e-3 * sum(
                                float(st.get(call, {}).get("host", {}).get(f"{part}_us", 0.0)) for st in stats)
                        s["feplb"][f"c_{call}_gemms"] = sum(
                            int(st.get(call, {}).get("host", {}).get("gemms", 0)) for st in stats)
                    s["feplb"]["python_fwd_host_ms"] = s["experts_fwd"]["host_ms"] - s["feplb"]["c_forward_host_ms"]
                    s["feplb"]["python_bwd_host_ms"] = s["experts_bwd"]["host_ms"] - s["feplb"]["c_backward_host_ms"]
                per[name].append(s)
        for name in names:
            out["variants"][name] = {"marks": median_of(per[name])}

        # One step per variant under torch.profiler (after one warm-up step).
        for name in names:
            prepare, model, opt, _ = variants[name]
            probe = probes[id(model)]
            fd, path = tempfile.mkstemp(prefix=f"hf-{name}-", suffix=".json", dir=trace_dir)
            os.close(fd)
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            sched = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
            try:
                with torch.profiler.profile(activities=acts, schedule=sched,
                                            on_trace_ready=lambda p, path=path: p.export_chrome_trace(path)) as prof:
                    for _ in range(2):
                        prepare()
                        torch.cuda.synchronize()
                        probe.reset()
                        probe.annotate = True
                        opt.zero_grad(set_to_none=True)
                        model(input_ids=ids, labels=ids).loss.backward()
                        opt.step()
                        torch.cuda.synchronize()
                        probe.annotate = False
                        prof.step()
                with open(path) as f:
                    events = json.load(f).get("traceEvents", [])
                out["variants"][name]["trace"] = trace_summary(events)
                if trace_dir:
                    out["variants"][name]["trace_file"] = os.path.basename(path)
            finally:
                probe.annotate = False
                if not trace_dir and os.path.exists(path):
                    os.remove(path)
    finally:
        feplb_ops.lib = real_lib
        for h in handles:
            h.remove()
    return out


def print_profile(prof):
    names = list(prof["variants"])
    rows = []

    def get(d, *keys):
        for k in keys:
            if not isinstance(d, dict) or d.get(k) is None:
                return None
            d = d[k]
        return d

    def pair(name, *keys):
        m = prof["variants"][name]["marks"]
        h, g = get(m, *keys, "host_ms"), get(m, *keys, "gpu_ms")
        return "-" if h is None else f"{h:8.2f} / {g:8.2f}"

    for label, keys in (("step host / GPU ms", ("step",)), ("forward", ("forward",)), ("backward", ("backward",)),
                        ("optimizer", ("optimizer",)), ("experts forward (all blocks)", ("experts_fwd",)),
                        ("experts backward (all blocks)", ("experts_bwd",)), ("rest (step - experts)", ("rest",))):
        rows.append((label, [pair(n, *keys) for n in names]))
    for label, key in (("GPU lag at experts fwd start", "experts_fwd_start"),
                       ("GPU lag at experts fwd end", "experts_fwd_end"),
                       ("GPU lag at experts bwd start", "experts_bwd_start"), ("GPU lag at forward end", "fwd_end"),
                       ("GPU lag at backward end", "bwd_end"), ("GPU lag at step end", "opt_end")):
        vals = [get(prof["variants"][n]["marks"], "lag_ms", key) for n in names]
        rows.append((label, ["-" if v is None else f"{v:8.2f}" for v in vals]))
    for label, key in (("feplb C forward calls, host ms", "c_forward_host_ms"),
                       ("feplb C backward calls, host ms", "c_backward_host_ms"),
                       ("feplb Python around them fwd", "python_fwd_host_ms"),
                       ("feplb Python around them bwd", "python_bwd_host_ms"),
                       ("feplb forward waits for counts", "counts_to_host_ms"),
                       *((f"feplb C {call}: {part}", f"c_{call}_{part}_ms")
                         for call in ("forward", "backward") for part in HOST_PARTS),
                       ("feplb C forward: GEMMs enqueued", "c_forward_gemms"),
                       ("feplb C backward: GEMMs enqueued", "c_backward_gemms")):
        vals = [get(prof["variants"][n]["marks"], "feplb", key) for n in names]
        if any(v is not None for v in vals):
            rows.append((label, ["-" if v is None else f"{v:8.2f}" for v in vals]))
    for label, keys in (("trace: GPU busy ms", ("busy_ms",)), ("trace: GPU idle ms", ("idle_ms",)),
                        ("trace: idle inside experts", ("annotated", "idle_ms")),
                        ("trace: idle outside experts", ("outside", "idle_ms")),
                        ("trace: kernels", ("kernels",)), ("trace: CUDA API host ms", ("api_host_ms",))):
        vals = [get(prof["variants"][n].get("trace"), *keys) for n in names]
        rows.append((label, ["-" if v is None else f"{v:8.2f}" for v in vals]))
    width = max(len(n) for n in names) + 2
    print(f"\nprofile: median of {prof['steps']} steps (ms; host / GPU where two)", flush=True)
    print(f"{'':<34}" + "".join(f"{n:>{max(width, 21)}}" for n in names))
    for label, vals in rows:
        print(f"{label:<34}" + "".join(f"{v:>{max(width, 21)}}" for v in vals))
    for n in names:
        top = get(prof["variants"][n], "trace", "top_kernels") or []
        print(f"top kernels, {n}: " + "; ".join(f"{k['name'][:60]} {k['ms']:.2f} ms x{k['count']}" for k in top[:5]))


# --configs: each model family with its own expert shape and top-k (H, F, top_k), at the expert
# counts given. Qwen3-MoE: Qwen3-30B-A3B's experts; OLMoE: OLMoE-1B-7B's; Mixtral: the Mixtral
# architecture (top-2) with OLMoE-sized fine-grained experts.
CONFIG_SHAPES = {"qwen3_moe": (2048, 768, 8), "olmoe": (2048, 1024, 8), "mixtral": (2048, 1024, 2)}
DEFAULT_CONFIGS = ",".join(f"{m}:{e}" for m in CONFIG_SHAPES for e in (32, 64, 128))


def parse_configs(text: str) -> list[tuple[str, int]]:
    out = []
    for item in text.split(","):
        model, _, experts = item.strip().partition(":")
        if model not in CONFIG_SHAPES or not experts.isdigit() or int(experts) < 1:
            sys.exit(f"--configs: {item!r} is not MODEL:EXPERTS with MODEL in {', '.join(CONFIG_SHAPES)}")
        out.append((model, int(experts)))
    return out


def add_model_args(ap):
    """The model's options (build() reads them): its kind, shape, vocabulary and tokens per step."""
    ap.add_argument("--model", default="qwen3_moe", choices=list(MODELS))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=768, help="per-expert intermediate size")
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=4096)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="hf-swap.json")
    add_model_args(ap)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--profile", type=int, default=0, help="profiled steps per variant after the timing (0: none)")
    ap.add_argument("--trace-dir", default=None, help="keep the torch.profiler chrome traces here")
    ap.add_argument("--configs", default=None,
                    help=f"several models, MODEL:EXPERTS,... ('default': {DEFAULT_CONFIGS}), each with its family's "
                         "H, F and top-k (CONFIG_SHAPES); writes a list `configs`")
    ap.add_argument("--impls", default="eager,grouped_mm", help="transformers experts backends to time")
    ap.add_argument("--graphed", action="store_true",
                    help="also time feplb's and transformers' grouped_mm model with forward + backward in a CUDA graph")
    ap.add_argument("--graphed-attention", choices=("as_is", "causal"), default="as_is",
                    help="graphed variants: as_is = with the explicit causal mask transformers builds under capture "
                         "(memory-efficient kernels), causal = attention as in the eager step (is_causal, flash "
                         "kernels; that mask is checked, not used; not yet run on a GPU)")
    a = ap.parse_args()
    if a.configs is None:
        doc = run_one(a)
    else:
        t0 = time.time()
        doc = {"benchmark": "transformers MoE models, time per training step before/after "
                            "feplb.torch.hf.swap_experts", "configs": []}
        for model, experts in parse_configs(DEFAULT_CONFIGS if a.configs == "default" else a.configs):
            c = copy.copy(a)
            c.model, c.experts = model, experts
            c.hidden, c.ffn, c.top_k = CONFIG_SHAPES[model]
            one = run_one(c)
            entry = {k: one[k] for k in ("model", "experts", "hidden", "ffn", "top_k", "layers", "batch", "seq",
                                         "logits_rel_l2", "steps", "feplb_over", "expert_gemm")}
            entry["shape"] = {"hidden": c.hidden, "ffn": c.ffn, "top_k": c.top_k}
            entry["feplb_over_grouped_mm"] = one["feplb_over"].get("transformers_grouped_mm")
            if a.graphed:
                entry["graphed_feplb_over_graphed_grouped_mm"] = one.get("graphed_feplb_over_graphed_grouped_mm")
                entry["graphed_errors"] = one.get("graphed_errors", {})
                entry["graphed_attention"] = a.graphed_attention
            for k in ("device", "torch", "transformers", "method", "reps", "warmup"):
                doc[k] = one[k]
            doc["configs"].append(entry)
            doc["seconds"] = time.time() - t0
            with open(a.out + ".tmp", "w") as fo:  # a cut-off run keeps the configs done
                json.dump(doc, fo, indent=2)
            os.replace(a.out + ".tmp", a.out)
            torch.cuda.empty_cache()
        print("\nmodel       experts  H     F     top-k  feplb / grouped_mm (median step)")
        for e in doc["configs"]:
            r = e["feplb_over_grouped_mm"]
            print(f"{e['model']:<11} {e['experts']:>7}  {e['hidden']:<5} {e['ffn']:<5} {e['top_k']:>5}  "
                  f"{'-' if r is None else f'{r:.3f}'}")
    with open(a.out + ".tmp", "w") as fo:
        json.dump(doc, fo, indent=2)
    os.replace(a.out + ".tmp", a.out)
    print(f"wrote {a.out}")


def run_one(a) -> dict:
    """One model: build, swap, check the logits, time the variants (and profile); the result doc."""
    import gc

    t0 = time.time()
    base, tf_version = build(a)
    ours = copy.deepcopy(base)
    swapped = fh.swap_experts(ours, max_tokens=a.batch * a.seq)
    print(f"{a.model}: {a.layers} layers, {a.experts} experts H={a.hidden} F={a.ffn} top-{a.top_k}, "
          f"{a.batch}x{a.seq} tokens; swapped {len(swapped)} blocks ({time.time() - t0:.1f} s)", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(2)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda", generator=gen)
    with torch.no_grad():
        lb, lo = base(input_ids=ids).logits.float(), ours(input_ids=ids).logits.float()
        logits_err = ((lo - lb).norm() / lb.norm()).item()
        del lb, lo
    print(f"logits relative L2, feplb vs original: {logits_err:.3e}", flush=True)

    impls = []
    if hasattr(base, "set_experts_implementation"):
        for impl in [x.strip() for x in a.impls.split(",") if x.strip()]:
            try:
                base.set_experts_implementation(impl)
                impls.append(impl)
            except Exception as e:  # noqa: BLE001 - recorded
                print(f"set_experts_implementation({impl!r}) failed: {e}", flush=True)
    current = {"impl": None}
    opts = {"base": torch.optim.AdamW(base.parameters(), lr=1e-5),
            "ours": torch.optim.AdamW(ours.parameters(), lr=1e-5)}

    def step(model, opt):
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    cases, variants = {}, {}
    for impl in impls or [None]:
        def prep(impl=impl):
            if impl is not None and current["impl"] != impl:
                base.set_experts_implementation(impl)
                current["impl"] = impl
        cases[f"transformers_{impl or 'default'}"] = (prep, lambda: step(base, opts["base"]))
        variants[f"transformers_{impl or 'default'}"] = (prep, base, opts["base"], False)
    cases["feplb"] = (lambda: None, lambda: step(ours, opts["ours"]))
    variants["feplb"] = (lambda: None, ours, opts["ours"], True)
    graphed_errors, graphed_loss_err = {}, {}
    if a.graphed:
        for name, make in (("graphed_feplb", lambda: graphed_feplb_model(base, a)),
                           ("graphed_transformers_grouped_mm", lambda: graphed_grouped_mm_model(base))):
            try:
                run, err = capture_step(make(), ids, a.graphed_attention)
                cases[name] = (lambda: None, run)
                graphed_loss_err[name] = err
                print(f"{name}: captured; first replay's loss vs eager, relative error {err:.2e}", flush=True)
            except Exception as e:  # noqa: BLE001 - recorded: a model that cannot be captured is a result
                graphed_errors[name] = f"{type(e).__name__}: {e}"
                print(f"{name}: capture failed: {graphed_errors[name]}", flush=True)
    names = list(cases)
    times = {n: [] for n in names}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(a.warmup + a.reps):
        for n in rotated(names, i):
            cases[n][0]()
            torch.cuda.synchronize()
            e0.record()
            cases[n][1]()
            e1.record()
            torch.cuda.synchronize()
            if i >= a.warmup:
                times[n].append(e0.elapsed_time(e1))
    stats = {n: summary(t) for n, t in times.items()}
    f = stats["feplb"]["median_ms"]
    for n, s in stats.items():
        ratio = f / s["median_ms"]
        print(f"{n:<26} median {s['median_ms']:9.3f} ms  p10 {s['p10_ms']:9.3f}  p90 {s['p90_ms']:9.3f}  "
              f"feplb / this {ratio:.3f}", flush=True)
    doc = {"benchmark": "transformers MoE model, time per training step before/after feplb.torch.hf.swap_experts",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": tf_version,
           "model": a.model, "layers": a.layers, "hidden": a.hidden, "ffn": a.ffn, "experts": a.experts,
           "top_k": a.top_k, "vocab": a.vocab, "batch": a.batch, "seq": a.seq, "reps": a.reps, "warmup": a.warmup,
           "swapped_blocks": swapped, "logits_rel_l2": logits_err,
           "method": "forward (labels) + backward + AdamW step per repetition, CUDA events after a synchronize, "
                     "variants interleaved in rotated order; one GPU, every expert local (no balancing)",
           "steps": stats, "feplb_over": {n: f / s["median_ms"] for n, s in stats.items() if n != "feplb"},
           "expert_gemm": fh_expert_gemm(ours)}
    if a.graphed:
        doc["graphed_errors"] = graphed_errors
        doc["graphed_loss_rel_err"] = graphed_loss_err
        doc["graphed_attention"] = a.graphed_attention
        g, t = stats.get("graphed_feplb"), stats.get("graphed_transformers_grouped_mm")
        doc["graphed_feplb_over_graphed_grouped_mm"] = g["median_ms"] / t["median_ms"] if g and t else None
    if a.profile > 0:
        if a.trace_dir:
            os.makedirs(a.trace_dir, exist_ok=True)
        try:
            doc["profile"] = profile_variants(variants, swapped, ids, a, a.trace_dir)
            print_profile(doc["profile"])
        except Exception as e:  # noqa: BLE001 - the timings above stand; the failure is recorded
            doc["profile_error"] = f"{type(e).__name__}: {e}"
            print(f"profile failed: {doc['profile_error']}", flush=True)
    doc["seconds"] = time.time() - t0
    print(f"{a.model} E={a.experts}: {time.time() - t0:.0f} s", flush=True)
    del base, ours, opts, cases, variants
    gc.collect()
    return doc


def graphed_feplb_model(base, a):
    """A copy of `base` with feplb's experts on a one-rank runtime of its own, grouped GEMMs."""
    model = copy.deepcopy(base)
    fh.swap_experts(model, max_tokens=a.batch * a.seq, expert_gemm="grouped")
    return model


def graphed_grouped_mm_model(base):
    model = copy.deepcopy(base)
    if not hasattr(model, "set_experts_implementation"):
        raise RuntimeError("this transformers has no set_experts_implementation (no grouped_mm backend)")
    model.set_experts_implementation("grouped_mm")
    return model


class CausalInCapture:
    """Attention inside a capture as in the eager step. Eagerly, transformers calls
    scaled_dot_product_attention with is_causal=True and no mask (the flash kernels); while a stream
    is being captured it builds an explicit causal mask and passes that instead, which rules out
    the flash kernels: the memory-efficient ones took 11 ms more per step than flash at Qwen3-MoE's
    attention shape, 4 layers x 4096 tokens on an H100 (bench/gpu/graph_step_profile.py). Inside
    this context a call under capture with a mask, is_causal False and queries as long as keys is
    made with is_causal=True and no mask; the masks are kept, and check() (after a replay has
    computed them) raises unless each is the causal mask: True (or 0) on and below the diagonal,
    False (or a large negative value) above."""

    def __init__(self):
        self.masks = []

    def __enter__(self):
        import torch.nn.functional as F

        self._inner = inner = F.scaled_dot_product_attention

        def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *args, **kwargs):
            if (attn_mask is not None and not is_causal and torch.cuda.is_current_stream_capturing()
                    and query.shape[-2] == key.shape[-2]):
                self.masks.append(attn_mask)
                return inner(query, key, value, None, dropout_p, True, *args, **kwargs)
            return inner(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)

        F.scaled_dot_product_attention = sdpa
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self._inner
        return False

    def check(self):
        for m in self.masks:
            n = m.shape[-1]
            causal = torch.ones(n, n, dtype=torch.bool, device=m.device).tril()
            allowed = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
            if not bool((allowed == causal).all()):
                raise RuntimeError("the attention mask built under capture is not the causal mask: "
                                   "--graphed-attention causal does not apply to this model")
        return len(self.masks)


def capture_step(model, ids, attention="as_is"):
    """`model`'s forward (labels) + backward captured in a CUDA graph; returns a step (replay, then
    the AdamW step outside the graph) and the first replay's loss against an eager forward's.
    attention: "causal" captures attention as the eager step runs it (CausalInCapture), "as_is"
    with the explicit mask transformers builds under capture."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)  # the graph allocates the gradients and owns them from here on
    graph = torch.cuda.CUDAGraph()
    causal = CausalInCapture() if attention == "causal" else None
    with causal or contextlib.nullcontext():
        with torch.cuda.graph(graph):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
    graph.replay()
    if causal is not None:
        causal.check()
    with torch.no_grad():
        eager = model(input_ids=ids, labels=ids).loss
    err = abs(loss.item() - eager.item()) / max(abs(eager.item()), 1e-12)

    def run():
        graph.replay()
        opt.step()

    run.keep = (graph, loss, opt, model, causal)  # alive as long as the step
    return run, err


def fh_expert_gemm(model) -> str | None:
    """Which expert GEMMs the swapped model's feplb runtime runs ('auto', 'grouped' or 'per_expert')."""
    for m in model.modules():
        rt = getattr(getattr(m, "moe", None), "runtime", None) or getattr(m, "runtime", None)
        if rt is not None and hasattr(rt, "info"):
            try:
                return rt.info()[0].get("expert_gemm")
            except Exception:  # noqa: BLE001 - informational only
                return None
    return None


if __name__ == "__main__":
    main()
