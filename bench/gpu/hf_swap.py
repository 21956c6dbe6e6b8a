"""The time per training step of a whole Hugging Face transformers MoE model before and after
feplb.torch.hf.swap_experts, on one GPU (nothing is balanced: every expert is local).

    PYTHONPATH=python FEPLB_LIBRARY=build/lib/libfeplb_c.so python3 bench/gpu/hf_swap.py --out hf-swap.json

The model is built from a config with random weights (nothing downloaded), bf16: by default
Qwen3-MoE with Qwen3-30B-A3B's expert shape (H=2048, F=768, top-8) and 32 experts per layer (128
experts at EP=4), 4 layers, batch 1 x 4096 tokens. A training step is forward (with labels) +
backward + AdamW step. Variants, in the same process, interleaved in rotated order, CUDA events
around each step after a synchronize: the model with transformers' "eager" and "grouped_mm"
experts backends (model.set_experts_implementation, where this transformers has it; otherwise
its default only), and a copy with feplb's experts. Before timing: the copy's logits against the
original's (relative L2, reported). Median, p10/p90, min/max of --reps steps after --warmup.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_common import rotated, summary  # noqa: E402

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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="hf-swap.json")
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
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    a = ap.parse_args()
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
        for impl in ("eager", "grouped_mm"):
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

    cases = {}
    for impl in impls or [None]:
        def prep(impl=impl):
            if impl is not None and current["impl"] != impl:
                base.set_experts_implementation(impl)
                current["impl"] = impl
        cases[f"transformers_{impl or 'default'}"] = (prep, lambda: step(base, opts["base"]))
    cases["feplb"] = (lambda: None, lambda: step(ours, opts["ours"]))
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
           "seconds": time.time() - t0}
    with open(a.out, "w") as fo:
        json.dump(doc, fo, indent=2)
    print(f"{time.time() - t0:.0f} s; wrote {a.out}")


if __name__ == "__main__":
    main()
