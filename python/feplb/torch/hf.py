"""feplb.torch.hf: FEPLB's layer inside Hugging Face `transformers` MoE models.

In transformers 5.x every sparse-MoE block (Qwen3-MoE, OLMoE, Mixtral, ...) is a router (`gate`)
followed by an experts module called as `experts(hidden_states [T, H], top_k_index [T, K],
top_k_weights [T, K]) -> [T, H]` (the weighted sum of each token's experts) whose weights are
`gate_up_proj` [E, 2F, H] (gate's F rows, then up's) and `down_proj` [E, H, F]. `swap_experts`
replaces each block's experts module by `HFExperts`, which holds the same weights as feplb
parameters and runs them through `feplb.torch.MoE`; the router, its top-k normalisation, the
block's return value and the rest of the model stay the model's own.

    import feplb.torch.hf as fh
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda()
    swapped = fh.swap_experts(model, max_tokens=batch * seq_len)   # names of the blocks swapped

Also accepted: an experts module that is a ModuleList of SwiGLU MLPs (`gate_proj`, `up_proj`,
`down_proj`, or Mixtral's `w1`, `w3`, `w2`) with the same call. Experts with biases or an
activation other than SiLU are refused (ValueError), and each swap is checked against the
module it replaces on random tokens first (a layout this adapter misreads is a ValueError).
The model must be bf16. One GPU holds every expert (ft.Runtime(virtual_ranks=1)): this runs
feplb's layer, nothing is balanced; with a `runtime` over a process group, each rank keeps its
own experts' weights and every rank must run every layer (a collective).

The swapped parameters are feplb's, one per weight kind as the model's own (`...experts.moe.gate_up`
[E, H, 2F] and `...experts.moe.down` [E, F, H]: transposed from the model's, so the model's
state_dict names and layout change); `hf_layout(experts)` gives the weights back in the model's
layout.
"""

from __future__ import annotations

import torch

from ._modules import MoE
from ._runtime import Runtime

__all__ = ["HFExperts", "find_moe_blocks", "hf_layout", "read_experts", "swap_experts"]

_MLP_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


def _is_silu(experts, first_mlp=None):
    """True / False when the module says what its activation is, None when it does not."""
    for holder in (experts, first_mlp):
        if holder is None:
            continue
        act = getattr(holder, "act_fn", None)
        if act is not None:
            return act is torch.nn.functional.silu or isinstance(act, torch.nn.SiLU) or \
                type(act).__name__ in ("SiLU", "SiLUActivation")
        cfg = getattr(holder, "config", None)
        if cfg is not None and getattr(cfg, "hidden_act", None) is not None:
            return cfg.hidden_act in ("silu", "swish")
    return None


def read_experts(experts):
    """The weights of a transformers experts module in feplb's layout: (gate_up [E, H, 2F],
    down [E, F, H]) as tensors (views where the layout allows). ValueError if it is not a
    bias-free SwiGLU experts module."""
    gu = getattr(experts, "gate_up_proj", None)
    dn = getattr(experts, "down_proj", None)
    if isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor):
        if gu.dim() != 3 or dn.dim() != 3 or gu.shape[0] != dn.shape[0]:
            raise ValueError(f"experts: gate_up_proj {tuple(gu.shape)} and down_proj {tuple(dn.shape)} are not "
                             "[E, 2F, H] and [E, H, F]")
        for b in ("gate_up_proj_bias", "down_proj_bias"):
            if getattr(experts, b, None) is not None:
                raise ValueError(f"experts: {b} is set; feplb's experts have no biases")
        if _is_silu(experts) is False:
            raise ValueError(f"experts: the activation must be SiLU (SwiGLU), not {getattr(experts, 'act_fn', None)!r}")
        transposed = bool(getattr(experts, "is_transposed", False) or getattr(experts, "experts_are_transposed", False))
        if transposed:  # [E, H, 2F] and [E, F, H]
            H, F2 = gu.shape[1], gu.shape[2]
            gate_up, down = gu, dn
        else:
            F2, H = gu.shape[1], gu.shape[2]
            gate_up, down = gu.transpose(1, 2), dn.transpose(1, 2)
        if F2 % 2 or tuple(down.shape[1:]) != (F2 // 2, H):
            raise ValueError(f"experts: gate_up_proj {tuple(gu.shape)} and down_proj {tuple(dn.shape)} do not fit "
                             "one SwiGLU expert shape")
        return gate_up, down
    if isinstance(experts, torch.nn.ModuleList) and len(experts) > 0:
        for g_name, u_name, d_name in _MLP_NAMES:
            if all(hasattr(m, g_name) and hasattr(m, u_name) and hasattr(m, d_name) for m in experts):
                if _is_silu(experts, experts[0]) is False:
                    raise ValueError("experts: the activation must be SiLU (SwiGLU)")
                mods = [(getattr(m, g_name), getattr(m, u_name), getattr(m, d_name)) for m in experts]
                if any(getattr(x, "bias", None) is not None for t in mods for x in t):
                    raise ValueError("experts: the expert projections have biases; feplb's experts have none")
                gate_up = torch.stack([torch.cat([g.weight.t(), u.weight.t()], dim=1) for g, u, _ in mods])
                down = torch.stack([d.weight.t() for _, _, d in mods])
                return gate_up, down
    raise ValueError(f"experts: {type(experts).__name__} is not a transformers MoE experts module (gate_up_proj / "
                     "down_proj, or a ModuleList of SwiGLU MLPs)")


def _looks_like_experts(module) -> bool:
    if isinstance(module, HFExperts):
        return False
    if isinstance(getattr(module, "gate_up_proj", None), torch.Tensor) and \
            isinstance(getattr(module, "down_proj", None), torch.Tensor):
        return True
    if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
        return any(all(hasattr(m, n) for m in module for n in names) for names in _MLP_NAMES)
    return False


def find_moe_blocks(model) -> list[tuple[str, torch.nn.Module]]:
    """(name, block) of every module whose `experts` child is a transformers experts module."""
    return [(name, m) for name, m in model.named_modules()
            if _looks_like_experts(getattr(m, "experts", None))]


def _top_k(block, model) -> int | None:
    for holder in (block, getattr(block, "gate", None), getattr(block, "router", None)):
        k = getattr(holder, "top_k", None) if holder is not None else None
        if isinstance(k, int):
            return k
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    k = getattr(config, "num_experts_per_tok", None)
    return k if isinstance(k, int) else None


class HFExperts(torch.nn.Module):
    """In place of a transformers experts module: forward(hidden_states [T, H] bf16, top_k_index
    [T, K] integer expert ids, top_k_weights [T, K] floating, or [T, E] per-expert weights) ->
    [T, H] bf16 = sum_k top_k_weights[t, k] * SwiGLU_e(hidden_states[t]), e = top_k_index[t, k].
    Its weights: `moe.gate_up` [E_local, H, 2F] and `moe.down` [E_local, F, H], this rank's experts
    along dim 0 (MoE(stacked=True): two parameters, whatever the number of experts)."""

    def __init__(self, runtime: Runtime, source, top_k: int, *, policy: str = "feplb", name: str | None = None):
        super().__init__()
        gate_up, down = read_experts(source)
        E, H, F2 = gate_up.shape
        for what, got, want in (("experts", E, runtime.num_experts), ("hidden size", H, runtime.hidden),
                                ("ffn size", F2 // 2, runtime.ffn)):
            if got != want:
                raise ValueError(f"HFExperts: the module's {what} is {got}, the runtime's {want}")
        if runtime.local_ranks != 1:
            raise ValueError("HFExperts: the runtime must be one rank of this process (virtual_ranks=1 or a process "
                             "group)")
        self.num_experts, self.hidden_dim, self.intermediate_dim, self.top_k = E, H, F2 // 2, top_k
        self.moe = MoE(runtime, top_k, policy=policy, name=name, stacked=True)
        first, n = runtime.ranks[0] * runtime.experts_per_rank, runtime.experts_per_rank
        with torch.no_grad():
            self.moe.gate_up.copy_(gate_up[first:first + n])
            self.moe.down.copy_(down[first:first + n])

    def stats(self):
        return self.moe.stats()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        rt = self.moe.runtime
        dev = torch.device("cuda", rt.device)
        for name, t in (("hidden_states", hidden_states), ("top_k_index", top_k_index),
                        ("top_k_weights", top_k_weights)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"HFExperts: {name} must be a tensor, not {type(t).__name__}")
            if t.device != dev:
                raise ValueError(f"HFExperts: {name} is on {t.device}, the runtime on {dev}")
        if hidden_states.dtype != torch.bfloat16:
            raise ValueError(f"HFExperts: hidden_states must be bfloat16 (build the model in bfloat16), not "
                             f"{hidden_states.dtype}")
        if hidden_states.dim() != 2 or hidden_states.shape[1] != self.hidden_dim:
            raise ValueError(f"HFExperts: hidden_states has shape {tuple(hidden_states.shape)}, expected "
                             f"(T, {self.hidden_dim})")
        T = hidden_states.shape[0]
        if T > rt.max_tokens:
            raise ValueError(f"HFExperts: hidden_states has {T} tokens, over the runtime's max_tokens {rt.max_tokens} "
                             "(swap_experts(max_tokens=...))")
        if top_k_index.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"HFExperts: top_k_index must be int32 or int64, not {top_k_index.dtype}")
        if tuple(top_k_index.shape) != (T, self.top_k):
            raise ValueError(f"HFExperts: top_k_index has shape {tuple(top_k_index.shape)}, expected "
                             f"({T}, {self.top_k})")
        if not top_k_weights.is_floating_point():
            raise ValueError(f"HFExperts: top_k_weights must be floating point, not {top_k_weights.dtype}")
        if tuple(top_k_weights.shape) == (T, self.num_experts) and self.num_experts != self.top_k:
            top_k_weights = top_k_weights.gather(1, top_k_index.long())  # DeepSeek-style [T, E] weights
        if tuple(top_k_weights.shape) != (T, self.top_k):
            raise ValueError(f"HFExperts: top_k_weights has shape {tuple(top_k_weights.shape)}, expected "
                             f"({T}, {self.top_k})")
        try:  # everything MoE.forward checks was checked above: straight to the layer
            return self.moe._forward_checked(hidden_states, top_k_index, top_k_weights)
        except ValueError as e:
            if "topk_idx" in str(e):  # ids outside [0, E), found by the layer
                raise ValueError(f"HFExperts: top_k_index: {e}") from e
            raise


def hf_layout(experts: HFExperts):
    """This rank's expert weights in the transformers layout: (gate_up_proj [E_local, 2F, H],
    down_proj [E_local, H, F]), copies."""
    with torch.no_grad():
        return (experts.moe.gate_up.transpose(1, 2).contiguous(),
                experts.moe.down.transpose(1, 2).contiguous())


def _verify(name, old, new, tokens, top_k, num_experts, hidden, device):
    """The new module's output against the old one's on random tokens and routing."""
    gen = torch.Generator(device=device).manual_seed(1234)
    x = torch.randn(tokens, hidden, device=device, generator=gen).to(torch.bfloat16)
    idx = torch.rand(tokens, num_experts, device=device, generator=gen).topk(top_k, dim=1).indices
    w = torch.rand(tokens, top_k, device=device, generator=gen) + 0.1
    w = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)
    with torch.no_grad():
        ref = old(x, idx, w).double()
        got = new(x, idx, w).double()
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    if not err <= VERIFY_REL_L2:
        raise ValueError(f"swap_experts: block {name}: feplb's experts differ from the model's on random tokens "
                         f"(relative L2 {err:.3g} > {VERIFY_REL_L2}); its experts module is not the bias-free SwiGLU "
                         "layout this adapter reads")
    return err


VERIFY_REL_L2 = 2e-2


def swap_experts(model, *, max_tokens: int, runtime: Runtime | None = None, policy: str = "feplb",
                 knobs: dict | None = None, verify_tokens: int = 64, **runtime_kwargs) -> list[str]:
    """Replaces the experts module of every sparse-MoE block of `model` by an HFExperts (same
    weights, copied; the old module is dropped). All blocks share one Runtime: `runtime`, or a
    one-rank runtime made here (virtual_ranks=1) for max_tokens tokens per forward (batch x
    sequence length) with `knobs` and the other keyword arguments of feplb.torch.Runtime.
    Each new module is first checked against the module it replaces on `verify_tokens` random
    tokens (relative L2 <= 2e-2; 0: no check), so a layout this adapter misreads is a ValueError,
    not a silently different model. Returns the names of the blocks swapped, in order.
    ValueError if there is none, or their shapes differ."""
    blocks = find_moe_blocks(model)
    if not blocks:
        raise ValueError("swap_experts: the model has no transformers sparse-MoE block (a module with an `experts` "
                         "child holding gate_up_proj/down_proj or a ModuleList of SwiGLU MLPs)")
    shapes = []
    for name, block in blocks:
        gu, _ = read_experts(block.experts)
        k = _top_k(block, model)
        if k is None:
            raise ValueError(f"swap_experts: cannot tell the top-k of block {name} (no top_k on it or its gate, and "
                             "no config.num_experts_per_tok)")
        shapes.append((gu.shape[0], gu.shape[1], gu.shape[2] // 2, k))
    if len(set(shapes)) != 1:
        raise ValueError(f"swap_experts: the blocks' (experts, hidden, ffn, top_k) differ: {sorted(set(shapes))}")
    E, H, F, K = shapes[0]
    if runtime is None:
        runtime = Runtime(virtual_ranks=1, num_experts=E, hidden=H, ffn=F, max_tokens=max_tokens, max_top_k=K,
                          knobs=knobs, **runtime_kwargs)
    device = torch.device("cuda", runtime.device)
    for name, block in blocks:
        new = HFExperts(runtime, block.experts, K, policy=policy, name=name or "moe")
        if verify_tokens:
            _verify(name, block.experts, new, min(verify_tokens, runtime.max_tokens), K, E, H, device)
        block.experts = new
    return [name for name, _ in blocks]
