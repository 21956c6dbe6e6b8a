"""What the Python/torch path adds to the C++ layer: forward + backward of one feplb layer through
feplb.torch.MoE (custom ops + autograd) against the same layer driven directly through the C API
(ctypes, no autograd), same tensors and shapes, interleaved A/B, CUDA events, median of many.

    python3 bench/gpu/torch_overhead.py --out torch-overhead.json

One rank (the GPU's whole time is the layer's). Two ways of getting weight gradients, each
against the C API doing the same: added into an fp32 main_grad (Megatron's convention) and
written into .grad of bf16 parameters (bf16 gradients straight from the dW GEMMs; the C API case
writes bf16 buffers of its own).
"""

import argparse
import ctypes
import json
import statistics

import torch

import feplb.torch as ft
from feplb.torch import _capi, _ops


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="torch-overhead.json")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    E, H, F, S, K = a.experts, a.hidden, a.ffn, a.tokens, a.top_k
    rt = ft.Runtime(virtual_ranks=1, num_experts=E, hidden=H, ffn=F, max_tokens=S, max_top_k=K)
    moe = ft.MoE(rt, K, policy="feplb")
    layer = _ops._layers[moe._key].c_layers[0]
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(S, H, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.randn(S, H, device="cuda", generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, device="cuda", generator=gen)[:K] for _ in range(S)]).to(torch.int32)
    w = torch.rand(S, K, device="cuda", generator=gen)
    w = w / w.sum(-1, keepdim=True)
    params = list(moe.gate_up) + list(moe.down)
    main = [torch.zeros(p.shape, dtype=torch.float32, device="cuda") for p in params]
    grad16 = [torch.empty(p.shape, dtype=torch.bfloat16, device="cuda") for p in params]
    gx = torch.empty_like(x)
    gw = torch.empty_like(w)
    stream = torch.cuda.current_stream()

    def direct(bf16):
        fa = _capi.ForwardArgs()
        gu, dn = _capi.pointer_array([p.data_ptr() for p in moe.gate_up]), _capi.pointer_array(
            [p.data_ptr() for p in moe.down])
        out = torch.empty_like(x)
        fa.layer, fa.gate_up, fa.down, fa.num_experts = layer, gu, dn, E
        fa.hidden, fa.topk_idx, fa.topk_weight, fa.num_tokens = x.data_ptr(), idx.data_ptr(), w.data_ptr(), S
        fa.out, fa.stream = out.data_ptr(), stream.cuda_stream
        _capi.check(_capi.lib.feplb_forward(1, ctypes.byref(fa)))
        ba = _capi.BackwardArgs()
        grads = grad16 if bf16 else main
        ggu = _capi.pointer_array([t.data_ptr() for t in grads[:E]])
        gdn = _capi.pointer_array([t.data_ptr() for t in grads[E:]])
        ba.layer, ba.handle, ba.gate_up, ba.down, ba.num_experts = layer, fa.handle, gu, dn, E
        ba.grad_out, ba.topk_weight, ba.grad_hidden, ba.grad_topk_weight = g.data_ptr(), w.data_ptr(), gx.data_ptr(), gw.data_ptr()
        ba.grad_gate_up, ba.grad_down, ba.stream = ggu, gdn, stream.cuda_stream
        ba.accumulate = 0 if bf16 else 1  # .grad is written, main_grad added into
        ba.grad_dtype = _capi.GRAD_BF16 if bf16 else _capi.GRAD_F32
        _capi.check(_capi.lib.feplb_backward(1, ctypes.byref(ba)))
        _capi.check(_capi.lib.feplb_layer_sync_gradients(layer, stream.cuda_stream))

    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()

    def prepare(use_main):  # untimed: what the caller's training loop does between steps
        for p, m in zip(params, main):
            p.main_grad = m if use_main else None
            p.grad = None
        xr.grad = wr.grad = None

    def via_torch():
        moe(xr, idx, wr).backward(g)

    cases = {"direct_c_api": (lambda: None, lambda: direct(False)),
             "direct_c_api_bf16": (lambda: None, lambda: direct(True)),
             "torch_main_grad": (lambda: prepare(True), via_torch),
             "torch_grad_bf16": (lambda: prepare(False), via_torch)}
    # Each torch case against the C API case with the same gradient convention.
    baseline = {"direct_c_api": "direct_c_api", "direct_c_api_bf16": "direct_c_api_bf16",
                "torch_main_grad": "direct_c_api", "torch_grad_bf16": "direct_c_api_bf16"}
    times = {k: [] for k in cases}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(a.warmup + a.reps):
        n = len(cases)
        for name in (list(cases)[i % n:] + list(cases)[:i % n]):  # rotated order
            cases[name][0]()
            torch.cuda.synchronize()
            e0.record()
            cases[name][1]()
            e1.record()
            torch.cuda.synchronize()
            if i >= a.warmup:
                times[name].append(e0.elapsed_time(e1))
    doc = {"benchmark": "feplb.torch overhead", "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "shape": {"experts": E, "hidden": H, "ffn": F, "tokens": S, "top_k": K},
           "reps": a.reps, "warmup": a.warmup,
           "method": "forward + backward (+ gradient sync) per repetition, CUDA events around each on the "
                     "current stream after a synchronize (so host time before the first kernel counts: the layer "
                     "waits for its counts on the host, so the host never runs ahead of it), the three cases "
                     "interleaved in rotated order; resetting .grad / main_grad between steps is untimed; "
                     "overhead_pct_vs_direct: against the C API case with the same gradient convention "
                     "(fp32 main_grad added into: direct_c_api; bf16 written: direct_c_api_bf16)",
           "cases": {}}
    for name, t in times.items():
        t = sorted(t)
        med = statistics.median(t)
        base = statistics.median(times[baseline[name]])
        doc["cases"][name] = {"median_ms": med, "p10_ms": t[len(t) // 10], "p90_ms": t[(9 * len(t)) // 10],
                              "baseline": baseline[name], "overhead_pct_vs_direct": 100.0 * (med / base - 1.0)}
        print(f"{name:<18} median {med:8.3f} ms  p10 {t[len(t) // 10]:8.3f}  p90 {t[(9 * len(t)) // 10]:8.3f}  "
              f"{100.0 * (med / base - 1.0):+6.2f}% vs {baseline[name]}", flush=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
