"""feplb.torch.megatron: FEPLB's layer as the experts module of Megatron-Core's MoELayer.

Megatron-Core's MoE layer runs router -> token dispatcher (all-to-all, all-gather or DeepEP) ->
experts module -> token combine, and builds the experts module from its spec:
`MoESubmodules(experts=BUILDER)` where `BUILDER(num_local_experts, config, pg_collection=...,
name=...)` returns a module with `forward(dispatched_input, tokens_per_expert, permuted_probs)
-> (output, bias)`. `experts_builder()` is such a builder; the module it builds,
`FeplbExperts`, runs the rows the dispatcher delivered through `feplb.torch.Balancer`: FEPLB's
phase 2 (copy-engine moves of hot experts' weights and rows) and the expert GEMMs, with
gradients added into Megatron's fp32 `main_grad`.

    from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
    import feplb.torch.megatron as fm
    experts = fm.experts_builder(max_tokens=seq_len * micro_batch, knobs={"dyn": 4})
    layer = MoELayer(config, MoESubmodules(experts=experts), layer_number=1)

The experts are SwiGLU without biases: `config.gated_linear_unit=True`,
`config.activation_func=torch.nn.functional.silu`, `config.add_bias_linear=False`, bf16
parameters, expert tensor parallelism 1. Expert i's weights are `gate_up[i]` [H, 2F] (gate's F
columns, then up's) and `down[i]` [F, H]: SequentialMLP's `linear_fc1.weight` [2F, H] (gate's F
rows, then up's) and `linear_fc2.weight` [H, F], transposed (`copy_from_sequential_mlp`,
`copy_to_sequential_mlp`). Distributed checkpointing (`sharded_state_dict`) is not implemented.

Importing this module needs no Megatron; building the default runtime reads Megatron's expert
parallel group from the `pg_collection` Megatron passes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _checks
from ._modules import Balancer
from ._runtime import Runtime

__all__ = ["FeplbExperts", "copy_from_sequential_mlp", "copy_to_sequential_mlp", "experts_builder"]


def check_config(config, who: str = "FeplbExperts") -> None:
    """ValueError naming the first field of a Megatron TransformerConfig FEPLB's experts cannot
    run: they are bf16 SwiGLU experts without biases, one expert-tensor-parallel rank."""
    def field(name, default=None):
        return getattr(config, name, default)

    if not field("num_moe_experts"):
        raise ValueError(f"{who}: config.num_moe_experts must be set (an MoE layer)")
    if not field("gated_linear_unit", False):
        raise ValueError(f"{who}: config.gated_linear_unit must be True (SwiGLU experts), not "
                         f"{field('gated_linear_unit')!r}")
    if field("activation_func") is not F.silu:
        raise ValueError(f"{who}: config.activation_func must be torch.nn.functional.silu (SwiGLU), not "
                         f"{field('activation_func')!r}")
    if field("glu_linear_offset", 0.0) not in (0, 0.0, None):
        raise ValueError(f"{who}: config.glu_linear_offset must be 0, not {field('glu_linear_offset')!r}")
    if field("activation_func_clamp_value") is not None:
        raise ValueError(f"{who}: config.activation_func_clamp_value must be None, not "
                         f"{field('activation_func_clamp_value')!r}")
    if field("add_bias_linear", False):
        raise ValueError(f"{who}: config.add_bias_linear must be False (the experts have no biases)")
    if field("moe_latent_size") is not None:
        raise ValueError(f"{who}: config.moe_latent_size must be None, not {field('moe_latent_size')!r}")
    if field("fp8") or field("fp4"):
        raise ValueError(f"{who}: config.fp8 / config.fp4 must be off (bf16 experts)")
    if field("expert_tensor_parallel_size", 1) not in (None, 1):
        raise ValueError(f"{who}: config.expert_tensor_parallel_size must be 1, not "
                         f"{field('expert_tensor_parallel_size')!r}")
    if field("params_dtype", torch.bfloat16) != torch.bfloat16:
        raise ValueError(f"{who}: config.params_dtype must be torch.bfloat16, not {field('params_dtype')!r}")


class FeplbExperts(torch.nn.Module):
    """Megatron-Core's experts module over a feplb Runtime (see the module's docstring).

    forward(dispatched_input [N, H] bf16, tokens_per_expert [num_local_experts] integers summing
    to N (host values; a CUDA tensor is read back), permuted_probs [N] or None) -> (output [N, H]
    bf16, None): each row's expert FFN output times its prob (with
    config.moe_apply_probs_on_input, the prob scales the input row instead). Every rank of the
    expert-parallel group calls it for the same micro-batch (a collective).
    """

    def __init__(self, num_local_experts: int, config, *, runtime: Runtime, pg_collection=None,
                 name: str | None = None, policy: str = "feplb"):
        super().__init__()
        check_config(config)
        if not isinstance(runtime, Runtime):
            raise ValueError("FeplbExperts: runtime must be a feplb.torch.Runtime")
        ffn = getattr(config, "moe_ffn_hidden_size", None) or config.ffn_hidden_size
        checks = (("num_local_experts", num_local_experts, runtime.experts_per_rank),
                  ("config.num_moe_experts", config.num_moe_experts, runtime.num_experts),
                  ("config.hidden_size", config.hidden_size, runtime.hidden),
                  ("config.moe_ffn_hidden_size", ffn, runtime.ffn))
        for what, got, want in checks:
            if got != want:
                raise ValueError(f"FeplbExperts: {what} is {got}, the runtime's is {want}")
        if runtime.local_ranks != 1:
            raise ValueError("FeplbExperts: the runtime must be one rank of this process (a process group, or "
                             "virtual_ranks=1), not virtual ranks")
        self.config = config
        self.num_local_experts = num_local_experts
        self.balancer = Balancer(runtime, policy=policy, name=name)
        # Megatron's DDP puts parameters with allreduce=False in the expert-data-parallel buffers.
        ep = getattr(config, "expert_model_parallel_size", 1) or 1
        etp = getattr(config, "expert_tensor_parallel_size", 1) or 1
        tp = getattr(config, "tensor_model_parallel_size", 1) or 1
        expert_parallel = ep > 1 or etp != tp
        for p in self.balancer.parameters():
            p.allreduce = not expert_parallel
        init_in = getattr(config, "init_method", None)
        init_out = getattr(config, "output_layer_init_method", None)
        if getattr(config, "perform_initialization", True) and init_in is not None and init_out is not None:
            H, Fd = runtime.hidden, runtime.ffn
            with torch.no_grad():
                for gu, dn in zip(self.balancer.gate_up, self.balancer.down):
                    w1 = torch.empty(2 * Fd, H, device=gu.device, dtype=torch.float32)
                    init_in(w1)  # as Megatron's linear_fc1.weight [2F, H]
                    gu.copy_(w1.t())
                    w2 = torch.empty(H, Fd, device=dn.device, dtype=torch.float32)
                    init_out(w2)  # as linear_fc2.weight [H, F]
                    dn.copy_(w2.t())

    @property
    def gate_up(self):
        return self.balancer.gate_up

    @property
    def down(self):
        return self.balancer.down

    @property
    def runtime(self) -> Runtime:
        return self.balancer.runtime

    def stats(self):
        """The last forward and backward: rows per GPU before and after balancing, moves, latencies."""
        return self.balancer.stats()

    def forward(self, dispatched_input, tokens_per_expert, permuted_probs=None, **kwargs):
        for key, value in kwargs.items():  # e.g. NCCL-EP's zero-copy output / grad-input buffers
            if value is not None:
                raise ValueError(f"FeplbExperts: {key} is not supported (got a value; the dispatcher must not "
                                 f"ask for it)")
        rt = self.balancer.runtime
        dev = torch.device("cuda", rt.device)
        x = dispatched_input
        who = "FeplbExperts"
        _checks.require(isinstance(x, torch.Tensor), who, f"dispatched_input must be a tensor, not {type(x).__name__}")
        _checks.require(x.device == dev, who, f"dispatched_input is on {x.device}, the runtime on {dev}")
        _checks.require(x.dtype == torch.bfloat16, who, f"dispatched_input must be bfloat16, not {x.dtype}")
        _checks.require(x.dim() == 2 and x.shape[1] == rt.hidden, who,
                        f"dispatched_input has shape {tuple(x.shape)}, expected (N, {rt.hidden})")
        counts = _checks.integer_counts(who, "tokens_per_expert", tokens_per_expert, self.num_local_experts,
                                        x.shape[0])
        probs = permuted_probs
        if probs is not None:
            _checks.require(isinstance(probs, torch.Tensor), who,
                            f"permuted_probs must be a tensor, not {type(probs).__name__}")
            _checks.require(probs.device == dev, who, f"permuted_probs is on {probs.device}, the runtime on {dev}")
            _checks.require(probs.is_floating_point(), who, f"permuted_probs must be floating point, not {probs.dtype}")
            _checks.require(tuple(probs.shape) == (x.shape[0],), who,
                            f"permuted_probs has shape {tuple(probs.shape)}, expected ({x.shape[0]},)")
            if getattr(self.config, "moe_apply_probs_on_input", False):
                x = (probs.unsqueeze(-1) * x).to(torch.bfloat16)
                probs = None
        return self.balancer(x, counts, probs), None

    def backward_dw(self):
        """Megatron's delayed weight-gradient hook: nothing to do, the backward computed them."""


def experts_builder(runtime: Runtime | None = None, *, max_tokens: int | None = None, policy: str = "feplb",
                    knobs: dict | None = None, **runtime_kwargs):
    """A Megatron-Core ExpertsBuilder: `MoESubmodules(experts=experts_builder(...))`.

    Every MoE layer built with it shares one feplb Runtime: `runtime`, or one made at the first
    layer over Megatron's expert-parallel process group (pg_collection.ep; NCCL), sized from the
    config (num_moe_experts, hidden_size, moe_ffn_hidden_size, moe_router_topk) and `max_tokens`
    (tokens per rank per micro-batch: sequence length x micro-batch size, divided by the tensor
    and context parallel sizes when they split the sequence); `knobs` and the other keyword
    arguments go to feplb.torch.Runtime. `builder.runtime()` returns it.
    """
    state = {"runtime": runtime}

    def build(num_local_experts, config, /, *, pg_collection=None, name=None):
        rt = state["runtime"]
        if rt is None:
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise ValueError("experts_builder: give max_tokens (tokens per rank per micro-batch) or a runtime")
            check_config(config, "experts_builder")
            group = getattr(pg_collection, "ep", None) if pg_collection is not None else None
            if group is None:
                from megatron.core import parallel_state

                group = parallel_state.get_expert_model_parallel_group()
            ffn = getattr(config, "moe_ffn_hidden_size", None) or config.ffn_hidden_size
            rt = state["runtime"] = Runtime(process_group=group, num_experts=config.num_moe_experts,
                                            hidden=config.hidden_size, ffn=ffn, max_tokens=max_tokens,
                                            max_top_k=config.moe_router_topk, knobs=knobs, **runtime_kwargs)
        return FeplbExperts(num_local_experts, config, runtime=rt, pg_collection=pg_collection, name=name,
                            policy=policy)

    build.runtime = lambda: state["runtime"]
    return build


def _sequential_weights(seq, n):
    experts = getattr(seq, "local_experts", None)
    if experts is None or len(experts) != n:
        raise ValueError(f"SequentialMLP with {n} local experts expected, got "
                         f"{len(experts) if experts is not None else type(seq).__name__}")
    return [(m.linear_fc1.weight, m.linear_fc2.weight) for m in experts]


@torch.no_grad()
def copy_from_sequential_mlp(experts: FeplbExperts, seq) -> None:
    """Expert weights from Megatron's SequentialMLP (local spec, tensor parallel size 1):
    linear_fc1.weight [2F, H] (gate rows, then up rows) -> gate_up [H, 2F]; linear_fc2.weight [H, F]
    -> down [F, H]."""
    for i, (w1, w2) in enumerate(_sequential_weights(seq, experts.num_local_experts)):
        gu, dn = experts.gate_up[i], experts.down[i]
        if tuple(w1.shape) != (gu.shape[1], gu.shape[0]) or tuple(w2.shape) != (dn.shape[1], dn.shape[0]):
            raise ValueError(f"copy_from_sequential_mlp: expert {i}: linear_fc1 {tuple(w1.shape)} and linear_fc2 "
                             f"{tuple(w2.shape)}, expected {(gu.shape[1], gu.shape[0])} and "
                             f"{(dn.shape[1], dn.shape[0])}")
        gu.copy_(w1.t())
        dn.copy_(w2.t())


@torch.no_grad()
def copy_to_sequential_mlp(experts: FeplbExperts, seq) -> None:
    """The inverse of copy_from_sequential_mlp."""
    for i, (w1, w2) in enumerate(_sequential_weights(seq, experts.num_local_experts)):
        w1.copy_(experts.gate_up[i].t())
        w2.copy_(experts.down[i].t())
