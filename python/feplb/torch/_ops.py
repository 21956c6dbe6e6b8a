"""The layer as torch.library custom ops (with fake implementations, so torch.compile keeps one
graph) and their autograd: feplb::moe_forward returns the output and the micro-batch handles,
feplb::moe_backward consumes them. In eager mode the same implementation runs through a plain
torch.autograd.Function, which costs less host time per call than the custom-op dispatch.

Compute runs on torch's current stream (virtual ranks: on a stream each, fenced with events);
the copy engine's copies run on the runtime's own streams, ordered by events inside the library.
"""

from __future__ import annotations

import inspect
import threading
import weakref

import ctypes

import torch

from . import _capi
from ._capi import check, lib

# The ops' tags: cudagraph_unsafe where torch has it, so torch.compile's CUDA graphs
# (mode="reduce-overhead") leave the layer out of their capture (only a one-rank layer on the
# grouped GEMMs can be captured, which an op's tag cannot tell).
_UNSAFE = getattr(getattr(torch, "Tag", None), "cudagraph_unsafe", None)
_TAGS = ({"tags": (_UNSAFE,)}
         if _UNSAFE is not None and "tags" in inspect.signature(torch.library.custom_op).parameters else {})

# Layers by key (custom ops take ints, not Python objects).
_layers: dict[int, "LayerEntry"] = {}
_next_key = [1]
_lock = threading.Lock()
# Micro-batch handles a forward kept and no backward has consumed yet.
_live: set[int] = set()
ctypes_int64 = ctypes.c_int64


class LayerEntry:
    def __init__(self, runtime, c_layers):
        self.runtime = runtime
        self.c_layers = c_layers
        self.local_ranks = runtime.local_ranks
        self.experts = runtime.experts_per_rank
        self._arrays = {}  # pointer arrays of the parameters, by their addresses

    def streams(self):
        return self.runtime.streams or [torch.cuda.current_stream()]

    def arrays(self, tensors, r):
        """rank r's slice of `tensors` as a C array of device pointers (cached: parameters and
        main_grad buffers keep their storage). `tensors`: one tensor per expert, or one stacked
        tensor [n, ...] holding every expert along dim 0."""
        E = self.experts
        if len(tensors) == 1 and tensors[0].dim() == 3:
            t = tensors[0]
            step = t.stride(0) * t.element_size()
            base = t.data_ptr() + r * E * step
            ptrs = tuple(base + i * step for i in range(E))
        else:
            ptrs = tuple(t.data_ptr() for t in tensors[r * E:(r + 1) * E])
        arr = self._arrays.get(ptrs)
        if arr is None:
            if len(self._arrays) > 256:
                self._arrays.clear()
            arr = self._arrays[ptrs] = _capi.pointer_array(ptrs)
        return arr


def register(runtime, c_layers) -> int:
    with _lock:
        key = _next_key[0]
        _next_key[0] += 1
        _layers[key] = LayerEntry(runtime, c_layers)
    return key


def unregister(key: int) -> None:
    entry = _layers.pop(key, None)
    if entry:
        for layer in entry.c_layers:
            lib.feplb_layer_destroy(layer)


def _drop(ids):
    for i in ids:
        if i in _live:
            _live.discard(i)
            lib.feplb_handle_drop(i)


def _fence_in(entry):
    if entry.runtime.world_size > 1 and torch.cuda.is_current_stream_capturing():
        # Nothing enqueued yet: the capture stays valid, and ends with none of this call in it.
        # (One rank: the C library says whether this call can be captured, before it enqueues.)
        raise RuntimeError("feplb: the current stream is being captured into a CUDA graph; the layer calls of "
                           "several ranks cannot be captured (they wait on the host for the routing counts "
                           "and the plan): call the layer outside the capture")
    cur = torch.cuda.current_stream()
    streams = entry.streams()
    if entry.local_ranks > 1:
        for s in streams:
            s.wait_stream(cur)
    return cur, streams


def _fence_out(entry, cur, streams):
    if entry.local_ranks > 1:
        for s in streams:
            cur.wait_stream(s)


def _set_weights(a, entry, r, gate_up, down):
    """Rank r's layer and weights into its argument struct `a`."""
    a.layer, a.num_experts = entry.c_layers[r], entry.experts
    a.gate_up, a.down = entry.arrays(gate_up, r), entry.arrays(down, r)


def _backward_args(struct, entry, streams, ids, gate_up, down, grad_gate_up, grad_down, accumulate):
    """A backward's argument structs, one per local rank, with the fields every backward has: the
    layer, the micro-batch, the weights, their gradients, the mode and the stream."""
    args = (struct * entry.local_ranks)()
    for r in range(entry.local_ranks):
        a = args[r]
        a.handle = ids[r]
        _set_weights(a, entry, r, gate_up, down)
        a.grad_gate_up, a.grad_down = entry.arrays(grad_gate_up, r), entry.arrays(grad_down, r)
        a.accumulate = 1 if accumulate else 0
        bf16 = bool(grad_gate_up) and grad_gate_up[0].dtype == torch.bfloat16
        a.grad_dtype = _capi.GRAD_BF16 if bf16 else _capi.GRAD_F32
        a.stream = streams[r].cuda_stream
    return args


def _run_forward(fn, entry, cur, streams, args, keep):
    """Runs the batched forward `fn` over `args` and returns the micro-batch handles it kept, as a
    tensor: with `keep`, dropped if that tensor is freed without a backward; else dropped now."""
    R = entry.local_ranks
    code = fn(R, args)
    _fence_out(entry, cur, streams)
    ids = [args[r].handle for r in range(R)]
    _live.update(i for i in ids if i)
    check(code)
    handles = torch.tensor(ids, dtype=torch.int64)
    if keep:
        weakref.finalize(handles, _drop, ids)  # a graph freed without its backward
    else:
        _drop(ids)
    return handles


def _live_ids(handles, hint=""):
    """The micro-batch handles a backward consumes, each still live (ValueError otherwise)."""
    ids = handles.tolist()
    for i in ids:
        if i not in _live:
            raise ValueError(f"feplb backward: micro-batch {i} was consumed already{hint} or dropped")
    return ids


def _run_backward(fn, entry, cur, streams, args, ids):
    """Runs the batched backward `fn` over `args`, consuming the micro-batches `ids`."""
    R = entry.local_ranks
    _live.difference_update(ids)
    code = fn(R, args)
    if code == _capi.OK:
        # The helpers' weight gradients are added on the runtime's copy stream: later work sees them.
        for r in range(R):
            check(lib.feplb_layer_sync_gradients(entry.c_layers[r], streams[r].cuda_stream))
    _fence_out(entry, cur, streams)
    check(code)


def forward_impl(hidden, topk_idx, topk_weight, gate_up, down, key, keep):
    entry = _layers[key]
    R = entry.local_ranks
    out = torch.empty_like(hidden)
    cur, streams = _fence_in(entry)
    args = (_capi.ForwardArgs * R)()
    for r in range(R):
        a = args[r]
        h = hidden[r] if R > 1 else hidden
        _set_weights(a, entry, r, gate_up, down)
        a.hidden = h.data_ptr()
        a.topk_idx = (topk_idx[r] if R > 1 else topk_idx).data_ptr()
        a.topk_weight = (topk_weight[r] if R > 1 else topk_weight).data_ptr()
        a.num_tokens = h.shape[0]
        a.out = (out[r] if R > 1 else out).data_ptr()
        a.stream = streams[r].cuda_stream
    return out, _run_forward(lib.feplb_forward, entry, cur, streams, args, keep)


def backward_impl(grad_out, topk_weight, handles, gate_up, down, grad_gate_up, grad_down, key, accumulate):
    entry = _layers[key]
    R = entry.local_ranks
    grad_hidden = torch.empty_like(grad_out)
    grad_w = torch.empty_like(topk_weight)
    ids = _live_ids(handles, " (backward twice, or retain_graph=True?)")
    cur, streams = _fence_in(entry)
    args = _backward_args(_capi.BackwardArgs, entry, streams, ids, gate_up, down, grad_gate_up, grad_down, accumulate)
    for r in range(R):
        a = args[r]
        a.grad_out = (grad_out[r] if R > 1 else grad_out).data_ptr()
        a.topk_weight = (topk_weight[r] if R > 1 else topk_weight).data_ptr()
        a.grad_hidden = (grad_hidden[r] if R > 1 else grad_hidden).data_ptr()
        a.grad_topk_weight = (grad_w[r] if R > 1 else grad_w).data_ptr()
    _run_backward(lib.feplb_backward, entry, cur, streams, args, ids)
    return grad_hidden, grad_w


@torch.library.custom_op("feplb::moe_forward", mutates_args=(), **_TAGS)
def moe_forward(hidden: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor,
                gate_up: list[torch.Tensor], down: list[torch.Tensor], key: int,
                keep: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return forward_impl(hidden, topk_idx, topk_weight, gate_up, down, key, keep)


@moe_forward.register_fake
def _(hidden, topk_idx, topk_weight, gate_up, down, key, keep):
    return torch.empty_like(hidden), torch.empty((_layers[key].local_ranks,), dtype=torch.int64, device="cpu")


@torch.library.custom_op("feplb::moe_backward", mutates_args=("grad_gate_up", "grad_down"), **_TAGS)
def moe_backward(grad_out: torch.Tensor, topk_weight: torch.Tensor, handles: torch.Tensor,
                 gate_up: list[torch.Tensor], down: list[torch.Tensor], grad_gate_up: list[torch.Tensor],
                 grad_down: list[torch.Tensor], key: int, accumulate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return backward_impl(grad_out, topk_weight, handles, gate_up, down, grad_gate_up, grad_down, key, accumulate)


@moe_backward.register_fake
def _(grad_out, topk_weight, handles, gate_up, down, grad_gate_up, grad_down, key, accumulate):
    return torch.empty_like(grad_out), torch.empty_like(topk_weight)


def _stacked(params, dtype):
    """One [len(params), *shape] allocation of `dtype` for tensors shaped like the parameters
    (same shapes and device: feplb's experts always are; unbind(0) gives one view per parameter);
    None where the parameters differ."""
    p0 = params[0]
    if any(p.shape != p0.shape or p.device != p0.device for p in params):
        return None
    return torch.empty((len(params), *p0.shape), dtype=dtype, device=p0.device)


def _weight_grads(gate_up, down, stacked):
    """Where the weight gradients go: every parameter's fp32 `main_grad` (Megatron's convention,
    accumulated into), else new buffers in the parameters' dtype (bf16: the dW GEMMs write them,
    no cast; a bf16 main_grad, Megatron's DDP without grad_reduce_in_fp32, takes this path and its
    hook adds the .grad in). With `stacked` (the eager path) the buffers of all experts are one
    allocation per kind, so the backward allocates twice, not once per expert.
    Returns (gate_up's, down's, accumulated, the stacked buffers or (None, None))."""
    params = (*gate_up, *down)
    if all(getattr(p, "main_grad", None) is not None for p in params):
        for i, p in enumerate(params):
            m = p.main_grad
            what = f"gate_up[{i}]" if i < len(gate_up) else f"down[{i - len(gate_up)}]"
            if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(p.shape) or m.device != p.device \
                    or not m.is_contiguous():
                raise ValueError(f"feplb backward: main_grad of {what} must be a contiguous tensor of shape "
                                 f"{tuple(p.shape)} on {p.device}")
        if all(p.main_grad.dtype == torch.float32 for p in params):
            return [p.main_grad for p in gate_up], [p.main_grad for p in down], True, (None, None)
    # bf16 parameters get bf16 gradients the dW GEMMs write themselves (no fp32 buffer, no cast);
    # others fp32 buffers, cast to the parameters' dtype afterwards.
    dtype = torch.bfloat16 if all(p.dtype == torch.bfloat16 for p in params) else torch.float32
    out, bases = [], []
    for group in (gate_up, down):
        base = _stacked(group, dtype) if stacked else None
        bases.append(base)
        out.append(list(base.unbind(0)) if base is not None else
                   [torch.empty(p.shape, dtype=dtype, device=p.device) for p in group])
    return out[0], out[1], False, tuple(bases)


def _placeholders(params, stacked):
    """The .grad autograd gets for parameters whose gradient went into their main_grad: None, or,
    where Megatron's DDP watches them (they have `grad_added_to_main_grad`), placeholders with the
    flag set, as Megatron's own layers do: its grad hook fires (a bucket learns the parameter is
    ready), skips the add and drops the placeholder. With `stacked`, one allocation for all."""
    watched = [hasattr(p, "grad_added_to_main_grad") for p in params]
    for p, w in zip(params, watched):
        if w:
            p.grad_added_to_main_grad = True
    if not any(watched):
        return [None] * len(params)
    base = _stacked(params, params[0].dtype) if stacked and all(watched) else None
    if base is not None and all(p.dtype == params[0].dtype for p in params):
        return list(base.unbind(0))
    return [torch.empty(p.shape, dtype=p.dtype, device=p.device) if w else None for p, w in zip(params, watched)]


def _cast(grads, params, base):
    """The gradients in the parameters' dtype: one cast of the stacked buffer when there is one,
    else one per parameter; none at all where they already are (bf16 written by the GEMMs)."""
    dtype = params[0].dtype
    if base is not None and all(p.dtype == dtype for p in params):
        return list(base.to(dtype).unbind(0))
    return [g.to(p.dtype) for g, p in zip(grads, params)]


def _param_grads(g_gu, g_dn, gate_up, down, accumulated, bases, stacked):
    if accumulated:  # a list input takes a list of gradients
        return _placeholders(gate_up, stacked), _placeholders(down, stacked)
    return _cast(g_gu, gate_up, bases[0]), _cast(g_dn, down, bases[1])


def _moe_grads(ctx, grad_out, impl):
    """The backward of a forward that saved (topk_weight, handles) and its parameters in `ctx`,
    through `impl` (the custom op, or its implementation): grad_hidden, grad_w, and the parameters'
    gradients (gate_up's, down's). Stacked gradient buffers on the eager path only (the custom op,
    traced by torch.compile, keeps one buffer per parameter)."""
    topk_weight, handles = ctx.saved_tensors
    gate_up, down = ctx.params
    stacked = impl is backward_impl
    g_gu, g_dn, acc, bases = _weight_grads(gate_up, down, stacked)
    grad_hidden, grad_w = impl(grad_out.contiguous(), topk_weight, handles, gate_up, down, g_gu, g_dn, ctx.key, acc)
    return grad_hidden, grad_w, _param_grads(g_gu, g_dn, gate_up, down, acc, bases, stacked)


def _setup_context(ctx, inputs, output):
    hidden, topk_idx, topk_weight, gate_up, down, key, keep = inputs
    _, handles = output
    ctx.save_for_backward(topk_weight, handles)
    ctx.params = (list(gate_up), list(down))
    ctx.key = key


def _backward(ctx, grad_out, _grad_handles):
    grad_hidden, grad_w, param_grads = _moe_grads(ctx, grad_out, moe_backward)
    return (grad_hidden, None, grad_w, *param_grads, None, None)


moe_forward.register_autograd(_backward, setup_context=_setup_context)


class MoEFunction(torch.autograd.Function):
    """The eager path: the same implementation without the custom-op dispatch. Parameters come
    as one flat tail of the arguments (gate_up then down)."""

    @staticmethod
    def forward(ctx, hidden, topk_idx, topk_weight, key, keep, n, *params):
        gate_up, down = list(params[:n]), list(params[n:])
        out, handles = forward_impl(hidden, topk_idx, topk_weight, gate_up, down, key, keep)
        ctx.save_for_backward(topk_weight, handles)
        ctx.params = (gate_up, down)
        ctx.key = key
        ctx.mark_non_differentiable(handles)
        return out, handles

    @staticmethod
    def backward(ctx, grad_out, _grad_handles):
        grad_hidden, grad_w, (p_gu, p_dn) = _moe_grads(ctx, grad_out, backward_impl)
        return (grad_hidden, None, grad_w, None, None, None, *p_gu, *p_dn)


def apply(hidden, topk_idx, topk_weight, gate_up, down, key, keep):
    """The layer's forward: the custom op while torch.compile traces, the autograd.Function in eager."""
    if torch.compiler.is_compiling():
        return moe_forward(hidden, topk_idx, topk_weight, gate_up, down, key, keep)[0]
    return MoEFunction.apply(hidden, topk_idx, topk_weight, key, keep, len(gate_up), *gate_up, *down)[0]


# ---- rows a framework dispatched itself (Balancer) -------------------------------------------


def dispatched_forward_impl(rows, counts, gate_up, down, key, keep):
    """rows: one [N_r, H] tensor per local rank; counts: [R][E_local] rows per local expert."""
    entry = _layers[key]
    R = entry.local_ranks
    outs = [torch.empty_like(x) for x in rows]
    cur, streams = _fence_in(entry)
    args = (_capi.DispatchedForwardArgs * R)()
    alive = []
    for r in range(R):
        a = args[r]
        c = (ctypes_int64 * max(1, entry.experts))(*counts[r])
        alive.append(c)
        _set_weights(a, entry, r, gate_up, down)
        a.rows, a.rows_per_expert, a.out_rows = rows[r].data_ptr(), c, outs[r].data_ptr()
        a.stream = streams[r].cuda_stream
    return outs, _run_forward(lib.feplb_forward_dispatched, entry, cur, streams, args, keep)


def dispatched_backward_impl(grad_outs, handles, gate_up, down, grad_gate_up, grad_down, key, accumulate):
    entry = _layers[key]
    R = entry.local_ranks
    grad_rows = [torch.empty_like(g) for g in grad_outs]
    ids = _live_ids(handles)
    cur, streams = _fence_in(entry)
    args = _backward_args(_capi.DispatchedBackwardArgs, entry, streams, ids, gate_up, down, grad_gate_up, grad_down,
                          accumulate)
    for r in range(R):
        a = args[r]
        a.grad_out_rows, a.grad_rows = grad_outs[r].data_ptr(), grad_rows[r].data_ptr()
    _run_backward(lib.feplb_backward_dispatched, entry, cur, streams, args, ids)
    return grad_rows


# One list out: the R output tensors, then the handles.
@torch.library.custom_op("feplb::dispatched_forward", mutates_args=(), **_TAGS)
def dispatched_forward(rows: list[torch.Tensor], counts: list[int], gate_up: list[torch.Tensor],
                       down: list[torch.Tensor], key: int, keep: bool) -> list[torch.Tensor]:
    E = _layers[key].experts
    outs, handles = dispatched_forward_impl(rows, [counts[r * E:(r + 1) * E] for r in range(len(rows))], gate_up,
                                            down, key, keep)
    return [*outs, handles]


@dispatched_forward.register_fake
def _(rows, counts, gate_up, down, key, keep):
    return [*(torch.empty_like(x) for x in rows), torch.empty((len(rows),), dtype=torch.int64, device="cpu")]


@torch.library.custom_op("feplb::dispatched_backward", mutates_args=("grad_gate_up", "grad_down"),
                         **_TAGS)
def dispatched_backward(grad_outs: list[torch.Tensor], handles: torch.Tensor, gate_up: list[torch.Tensor],
                        down: list[torch.Tensor], grad_gate_up: list[torch.Tensor], grad_down: list[torch.Tensor],
                        key: int, accumulate: bool) -> list[torch.Tensor]:
    return dispatched_backward_impl(grad_outs, handles, gate_up, down, grad_gate_up, grad_down, key, accumulate)


@dispatched_backward.register_fake
def _(grad_outs, handles, gate_up, down, grad_gate_up, grad_down, key, accumulate):
    return [torch.empty_like(g) for g in grad_outs]


def _dispatched_grads(ctx, grads, impl):
    """The backward of a dispatched forward that saved its handles, parameters and R in `ctx`,
    through `impl` (the custom op, or its implementation): the rows' gradients, and the
    parameters' (gate_up's, down's)."""
    handles = ctx.saved_tensors[0]  # then the rows, kept alive for the backward's dW GEMMs
    gate_up, down = ctx.params
    stacked = impl is dispatched_backward_impl
    g_gu, g_dn, acc, bases = _weight_grads(gate_up, down, stacked)
    grad_rows = impl([g.contiguous() for g in grads[:ctx.R]], handles, gate_up, down, g_gu, g_dn, ctx.key, acc)
    return grad_rows, _param_grads(g_gu, g_dn, gate_up, down, acc, bases, stacked)


def _dispatched_setup(ctx, inputs, output):
    rows, counts, gate_up, down, key, keep = inputs
    # The backward reads the forward's rows again (the dW GEMMs; MoeLayer::forward_dispatched: the
    # caller keeps them until the backward): saved, so the caller's tensor outlives its last use.
    ctx.save_for_backward(output[-1], *rows)
    ctx.params = (list(gate_up), list(down))
    ctx.key = key
    ctx.R = len(rows)


def _dispatched_backward(ctx, grads):
    grad_rows, param_grads = _dispatched_grads(ctx, grads, dispatched_backward)
    return (grad_rows, None, *param_grads, None, None)


dispatched_forward.register_autograd(_dispatched_backward, setup_context=_dispatched_setup)


class DispatchedFunction(torch.autograd.Function):
    """The eager path of the Balancer (inputs: R rows tensors, then the parameters)."""

    @staticmethod
    def forward(ctx, key, keep, counts, R, n, *tensors):
        rows, params = list(tensors[:R]), tensors[R:]
        gate_up, down = list(params[:n]), list(params[n:])
        outs, handles = dispatched_forward_impl(rows, counts, gate_up, down, key, keep)
        ctx.save_for_backward(handles, *rows)  # the backward's dW GEMMs read the rows again
        ctx.params, ctx.key, ctx.R = (gate_up, down), key, R
        return (*outs, handles)

    @staticmethod
    def backward(ctx, *grads):
        grad_rows, (p_gu, p_dn) = _dispatched_grads(ctx, grads, dispatched_backward_impl)
        return (None, None, None, None, None, *grad_rows, *p_gu, *p_dn)


def apply_dispatched(rows, counts, gate_up, down, key, keep):
    if torch.compiler.is_compiling():
        flat = [c for per_rank in counts for c in per_rank]
        return dispatched_forward(rows, flat, gate_up, down, key, keep)[:-1]
    R = len(rows)
    return list(DispatchedFunction.apply(key, keep, counts, R, len(gate_up), *rows, *gate_up, *down)[:R])


def layer_stats(key: int) -> list[dict]:
    entry = _layers[key]
    return [_capi.get_json(lib.feplb_layer_stats_json, layer) for layer in entry.c_layers]
