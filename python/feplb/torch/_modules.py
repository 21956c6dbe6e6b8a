"""feplb.torch.MoE (the experts of one MoE layer: dispatch, balancing, GEMMs, combine) and
feplb.torch.Balancer (for a framework that dispatched the tokens itself: balancing and GEMMs)."""

from __future__ import annotations

import math

import torch

from . import _checks, _ops
from ._runtime import Runtime


class _Experts(torch.nn.Module):
    """This rank's experts over a feplb Runtime (one C layer per local rank): the parameters,
    the layer's registration and its statistics."""

    def __init__(self, runtime: Runtime, top_k: int, policy: str, name: str | None, init_std: float | None,
                 stacked: bool = False):
        super().__init__()
        if not isinstance(runtime, Runtime):
            raise ValueError(f"{type(self).__name__}: runtime must be a feplb.torch.Runtime")
        self.runtime = runtime
        self.top_k = top_k
        self.policy = policy
        name = name or f"moe{runtime._layers}"
        self._key = _ops.register(runtime, runtime.make_layers(top_k, policy, name))
        H, F, n = runtime.hidden, runtime.ffn, runtime.local_ranks * runtime.experts_per_rank
        dev = torch.device("cuda", runtime.device)
        std_in = init_std or 1.0 / math.sqrt(H)
        std_down = init_std or 1.0 / math.sqrt(F)
        self.stacked = bool(stacked)
        if self.stacked:  # one parameter per weight kind, experts along dim 0 (TorchTitan's layout)
            self.gate_up = torch.nn.Parameter((torch.randn(n, H, 2 * F, device=dev) * std_in).to(torch.bfloat16))
            self.down = torch.nn.Parameter((torch.randn(n, F, H, device=dev) * std_down).to(torch.bfloat16))
            return
        self.gate_up = torch.nn.ParameterList(
            torch.nn.Parameter((torch.randn(H, 2 * F, device=dev) * std_in).to(torch.bfloat16)) for _ in range(n))
        self.down = torch.nn.ParameterList(
            torch.nn.Parameter((torch.randn(F, H, device=dev) * std_down).to(torch.bfloat16)) for _ in range(n))

    def _weights(self):
        """The parameters as two lists (gate_up's, down's): one stacked parameter each, or, per
        expert, read from the ParameterLists' own dicts, which is much cheaper per call than
        iterating them (64 parameters a layer, every call)."""
        if self.stacked:
            return [self.gate_up], [self.down]
        out = []
        for plist in (self.gate_up, self.down):
            params = list(plist._parameters.values())
            out.append(params if len(params) == len(plist) else list(plist))
        return out

    def __del__(self):
        try:
            _ops.unregister(self._key)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _keep(self, *inputs):
        return torch.is_grad_enabled() and self.runtime.training and (
            any(t.requires_grad for t in inputs) or any(p.requires_grad for p in self.parameters()))

    def stats(self):
        """The last forward and backward, per local rank (a list with virtual ranks): rows per GPU
        before and after balancing, experts and rows moved, weight and token bytes, planner and
        copy latencies, copy waits."""
        s = _ops.layer_stats(self._key)
        return s if self.runtime.local_ranks > 1 else s[0]


class MoE(_Experts):
    """The experts of one MoE layer over a feplb Runtime, balanced every call.

    forward(hidden, topk_idx, topk_weight) -> out:
      hidden [S, H] bf16, topk_idx [S, K] global expert ids (int32 or int64), topk_weight [S, K]
      (floating; used as float32) -> out [S, H] bf16: sum_k topk_weight[t, k] * FFN_{e}(hidden[t])
      with e = topk_idx[t, k] and SwiGLU experts. With a Runtime of R virtual ranks every tensor
      has a leading [R] dimension (one slice per rank).
    Every rank calls it for the same micro-batch (a collective). Inputs on the runtime's device;
    non-contiguous ones are made contiguous (a copy). S <= the runtime's max_tokens.

    Parameters: this rank's experts, ordinary nn.Parameters, bf16: gate_up[i] [H, 2F] (gate's F
    columns, then up's) and down[i] [F, H], i over the rank's experts (virtual ranks: rank r's
    expert i at r * experts_per_rank + i). With `stacked=True` two parameters instead, gate_up
    [n, H, 2F] and down [n, F, H] (n experts along dim 0, as TorchTitan's and transformers' MoE
    layers hold them): autograd then handles two gradients per layer, not two per expert, which
    is host time saved per step where a layer has many experts. Backward writes their .grad, or
    adds into an fp32 `main_grad` when every parameter has one (Megatron's convention).
    """

    def __init__(self, runtime: Runtime, top_k: int, *, policy: str = "feplb", name: str | None = None,
                 init_std: float | None = None, stacked: bool = False):
        super().__init__(runtime, top_k, policy, name, init_std, stacked)

    def _check(self, hidden, topk_idx, topk_weight):
        rt = self.runtime
        lead = (rt.local_ranks,) if rt.local_ranks > 1 else ()
        dev = torch.device("cuda", rt.device)
        for name, t in (("hidden", hidden), ("topk_idx", topk_idx), ("topk_weight", topk_weight)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"MoE: {name} must be a tensor")
            if t.device != dev:
                raise ValueError(f"MoE: {name} is on {t.device}, the runtime on {dev}")
        if hidden.dtype != torch.bfloat16:
            raise ValueError(f"MoE: hidden must be bfloat16, not {hidden.dtype}")
        if hidden.dim() != len(lead) + 2 or tuple(hidden.shape[:len(lead)]) != lead or hidden.shape[-1] != rt.hidden:
            raise ValueError(f"MoE: hidden has shape {tuple(hidden.shape)}, expected {lead + ('S', rt.hidden)}")
        S = hidden.shape[-2]
        if S > rt.max_tokens:
            raise ValueError(f"MoE: hidden has {S} tokens, the runtime's max_tokens is {rt.max_tokens}")
        if topk_idx.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"MoE: topk_idx must be int32 or int64, not {topk_idx.dtype}")
        if not topk_weight.is_floating_point():
            raise ValueError(f"MoE: topk_weight must be floating point, not {topk_weight.dtype}")
        want = lead + (S, self.top_k)
        for name, t in (("topk_idx", topk_idx), ("topk_weight", topk_weight)):
            if tuple(t.shape) != want:
                raise ValueError(f"MoE: {name} has shape {tuple(t.shape)}, expected {want}")

    def forward(self, hidden: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor) -> torch.Tensor:
        self._check(hidden, topk_idx, topk_weight)
        return self._forward_checked(hidden, topk_idx, topk_weight)

    def _forward_checked(self, hidden, topk_idx, topk_weight):
        """forward() after _check's conditions hold (an adapter that checked them itself)."""
        keep = self._keep(hidden, topk_weight)
        gate_up, down = self._weights()
        return _ops.apply(hidden.contiguous(), topk_idx.to(torch.int32).contiguous(),
                          topk_weight.to(torch.float32).contiguous(), gate_up, down, self._key, keep)


class Balancer(_Experts):
    """For a framework that dispatched the tokens itself (its own all-to-all, DeepEP; in
    Megatron-Core: as the experts module after the token dispatcher): FEPLB's phase 2 and the
    expert GEMMs on rows already at their experts' homes; the outputs come back per row, before
    any combine.

    forward(rows, tokens_per_expert, probs=None) -> out:
      rows [N, H] bf16, grouped by this rank's experts in local order; tokens_per_expert
      [experts_per_rank] integers summing to N (host values: a CUDA tensor is read back, a sync);
      out [N, H] bf16 = FFN_e(row) of each row's expert, times probs[row] when probs [N] is given
      (Megatron's permuted_probs). With virtual ranks: lists of R such tensors, and
      tokens_per_expert [R, experts_per_rank].
    Every rank calls it for the same micro-batch (a collective). Parameters and gradients as MoE's.
    """

    def __init__(self, runtime: Runtime, *, policy: str = "feplb", name: str | None = None,
                 init_std: float | None = None):
        super().__init__(runtime, 1, policy, name, init_std)

    def forward(self, rows, tokens_per_expert, probs=None):
        rt = self.runtime
        R = rt.local_ranks
        dev = torch.device("cuda", rt.device)
        if R > 1:
            if not isinstance(rows, (list, tuple)) or len(rows) != R:
                raise ValueError(f"Balancer: rows must be a list of {R} tensors (one per virtual rank)")
            per_rank = tokens_per_expert.tolist() if isinstance(tokens_per_expert, torch.Tensor) \
                else list(tokens_per_expert)
            if len(per_rank) != R:
                raise ValueError(f"Balancer: tokens_per_expert must have {R} rows (one per virtual rank), "
                                 f"not {len(per_rank)}")
            rows_list = list(rows)
        else:
            rows_list, per_rank = [rows], [tokens_per_expert]
        counts = []
        for r, (x, c) in enumerate(zip(rows_list, per_rank)):
            sfx = f"[{r}]" if R > 1 else ""
            at = "rows" + sfx
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"Balancer: {at} must be a tensor, not {type(x).__name__}")
            if x.device != dev:
                raise ValueError(f"Balancer: {at} is on {x.device}, the runtime on {dev}")
            if x.dtype != torch.bfloat16:
                raise ValueError(f"Balancer: {at} must be bfloat16, not {x.dtype}")
            if x.dim() != 2 or x.shape[1] != rt.hidden:
                raise ValueError(f"Balancer: {at} has shape {tuple(x.shape)}, expected (N, {rt.hidden})")
            counts.append(_checks.integer_counts("Balancer", "tokens_per_expert" + sfx, c, rt.experts_per_rank,
                                                 x.shape[0]))
        probs_list = None
        if probs is not None:
            probs_list = list(probs) if R > 1 else [probs]
            if len(probs_list) != R:
                raise ValueError(f"Balancer: probs must be a list of {R} tensors (one per virtual rank)")
            for r, (p, x) in enumerate(zip(probs_list, rows_list)):
                at = "probs" + (f"[{r}]" if R > 1 else "")
                if not isinstance(p, torch.Tensor):
                    raise ValueError(f"Balancer: {at} must be a tensor, not {type(p).__name__}")
                if p.device != dev:
                    raise ValueError(f"Balancer: {at} is on {p.device}, the runtime on {dev}")
                if not p.is_floating_point():
                    raise ValueError(f"Balancer: {at} must be floating point, not {p.dtype}")
                if tuple(p.shape) != (x.shape[0],):
                    raise ValueError(f"Balancer: {at} has shape {tuple(p.shape)}, expected ({x.shape[0]},)")
        keep = self._keep(*rows_list)
        gate_up, down = self._weights()
        outs = _ops.apply_dispatched([x.contiguous() for x in rows_list], counts, gate_up, down, self._key, keep)
        if probs_list is not None:
            outs = [o * p.to(o.dtype).unsqueeze(-1) for o, p in zip(outs, probs_list)]
        return outs if R > 1 else outs[0]
