"""Routing traces (feplb-trace-v1): load, save, steps as numpy, and traces built from a training
job's routing counts (Trace.from_counts) so the simulator can replay them."""

from __future__ import annotations

import json
import os
import typing

import numpy as np

from . import _args, _feplb


class TraceStep(typing.NamedTuple):
    step: int  # micro-batch id
    layer: int  # MoE layer id
    counts: np.ndarray  # [num_ranks, num_experts] rows rank src routes to expert e


class Trace:
    """A routing trace: for each (micro-batch, layer), how many token-expert rows each EP rank
    routes to each expert (docs/trace-format.md). Immutable; arrays it returns are copies."""

    __slots__ = ("_impl",)

    def __init__(self, impl: _feplb.Trace):
        if not isinstance(impl, _feplb.Trace):
            raise ValueError(
                "Trace: build one with Trace.load(path), Trace.from_counts(...) or "
                "Trace.from_json(text)"
            )
        self._impl = impl

    # Construction.
    @staticmethod
    def load(path) -> "Trace":
        """Reads a feplb-trace-v1 file: FileNotFoundError or PermissionError where it cannot be
        opened (as open() raises them), ValueError naming the field (and the step) for its content."""
        raw = _args.path(path, "path")
        _args.readable(raw)
        return Trace(_feplb.Trace.load(raw))

    @staticmethod
    def from_json(text: str) -> "Trace":
        return Trace(_feplb.Trace.from_json(_args.text(text, "text")))

    @staticmethod
    def from_counts(
        counts,
        *,
        top_k: int,
        tokens_per_rank: int | None = None,
        tokens=None,
        model: str = "",
        expert_shape=None,
        step_ids=None,
        layer_ids=None,
        generator: dict | None = None,
    ) -> "Trace":
        """A trace from routing counts: counts[..., src, e] = token-expert rows EP rank src
        routed to expert e (all ranks of the EP group, e.g. each rank's tokens_per_expert
        all-gathered). counts is one of:

        * [ranks, experts]: one step;
        * [steps, ranks, experts], or a list of [ranks, experts] arrays: one entry per
          (micro-batch, layer); step_ids (default 0, 1, ...) and layer_ids (default 0) label them;
        * [steps, layers, ranks, experts]: step_ids label axis 0 (default 0, 1, ...), layer_ids
          axis 1 (default 0, 1, ...).

        top_k: experts per token. tokens: the tokens each rank had, shaped like counts without
        the experts axis ([ranks], [steps, ranks] or [steps, layers, ranks]); a rank that routed
        fewer than tokens * top_k rows dropped the rest (a capacity factor). tokens_per_rank:
        the trace's tokens per rank per micro-batch (at least every entry of tokens); without
        tokens, every rank had that many. With neither, each rank had its row's sum / top_k
        tokens (which must divide: dropped rows need a token count) and tokens_per_rank is the
        largest. Ranks and steps with other token counts, or with dropped rows, are stored with
        their own "tokens" and "dropped" (docs/trace-format.md). model: free text (a known
        prefix such as 'glm5' gives the expert shape); expert_shape: feplb.ExpertShape or a model
        name, stored in the trace. generator: a JSON object kept as provenance.

        No expert may get more rows than its rank's tokens (a token picks top_k distinct
        experts); a ValueError names the entry otherwise.
        """
        limits = _feplb.LIMITS
        top_k = _args.integer(top_k, "top_k", 1, limits["experts"])
        if tokens_per_rank is not None:
            tokens_per_rank = _args.integer(
                tokens_per_rank, "tokens_per_rank", 0, limits["tokens_per_rank"]
            )
        _args.text(model, "model")
        if expert_shape is not None:
            expert_shape = _args.shape(expert_shape, "expert_shape")
        if generator is None:
            generator = {"tool": "feplb.Trace.from_counts"}
        if not isinstance(generator, dict):
            raise ValueError(f"generator: expected a dict, got {type(generator).__name__}")
        try:
            generator_json = json.dumps(generator, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"generator: not JSON ({e})") from None

        entries, steps, layers = _entries(counts, step_ids, layer_ids)
        if tokens is not None:
            tok = np.asarray(tokens)
            axes = {1: "ranks", 2: "steps, ranks", 3: "steps, layers, ranks"}.get(tok.ndim)
            if axes is None:
                raise ValueError(
                    "tokens: expected [ranks], [steps, ranks] or [steps, layers, ranks], got "
                    f"shape {tok.shape}"
                )
            tokens = _args.int_array(tok, "tokens", axes)
            want = (entries.shape[0], entries.shape[1])
            if tokens.shape[-1] != want[1] or tokens.size != want[0] * want[1]:
                raise ValueError(
                    f"tokens: shape {tokens.shape}, expected counts' shape without the experts "
                    f"axis ({want[0]} entries x {want[1]} ranks in all)"
                )
            tokens = np.ascontiguousarray(tokens.reshape(want))
        return Trace(
            _feplb.Trace.from_arrays(
                entries,
                steps,
                layers,
                top_k,
                tokens_per_rank,
                tokens,
                model,
                expert_shape,
                generator_json,
            )
        )

    # Output.
    def save(self, path, *, overwrite: bool = False) -> None:
        """Writes the trace as feplb-trace-v1 (one step per line), atomically; an existing file
        only with overwrite=True."""
        self._impl.save(_args.path(path, "path"), bool(overwrite))

    def to_json(self) -> str:
        return self._impl.to_json()

    # Contents.
    @property
    def path(self) -> str | None:
        """The file it was loaded from, or None."""
        return self._impl.path or None

    @property
    def model(self) -> str:
        return self._impl.model

    @property
    def num_ranks(self) -> int:
        return self._impl.num_ranks

    @property
    def num_experts(self) -> int:
        return self._impl.num_experts

    @property
    def top_k(self) -> int:
        return self._impl.top_k

    @property
    def tokens_per_rank(self) -> int:
        return self._impl.tokens_per_rank

    @property
    def expert_shape(self) -> _feplb.ExpertShape | None:
        """The shape stored in the trace (None: the model preset's applies, if any)."""
        return self._impl.expert_shape

    @property
    def generator(self) -> dict | None:
        text = self._impl.generator_json
        return json.loads(text) if text else None

    @property
    def counts(self) -> np.ndarray:
        """[steps, num_ranks, num_experts] int64, in trace order."""
        return self._impl.counts

    @property
    def step_ids(self) -> np.ndarray:
        """[steps] micro-batch id of each entry."""
        return self._impl.step_ids

    @property
    def layer_ids(self) -> np.ndarray:
        """[steps] layer id of each entry."""
        return self._impl.layer_ids

    def __len__(self) -> int:
        return len(self._impl)

    def __getitem__(self, index: int) -> TraceStep:
        index = _args.integer(index, "index", -len(self))
        step, layer = self._impl.step_id(index)
        return TraceStep(step, layer, self._impl.step_counts(index))

    def __iter__(self) -> typing.Iterator[TraceStep]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        where = f", path={self.path!r}" if self.path else ""
        return (
            f"Trace(model={self.model!r}, {len(self)} steps, num_ranks={self.num_ranks}, "
            f"num_experts={self.num_experts}, top_k={self.top_k}, "
            f"tokens_per_rank={self.tokens_per_rank}{where})"
        )


def _entries(counts, step_ids, layer_ids):
    """counts in any accepted form -> ([N, R, E] int64, step ids [N], layer ids [N])."""
    if isinstance(counts, (list, tuple)) and not counts:
        raise ValueError("counts: empty; a trace needs at least one step")
    if isinstance(counts, (list, tuple)) and _ndim(counts[0]) == 2:
        # One [ranks, experts] array per entry (numpy arrays, CPU tensors or nested lists).
        total, limit = 0, _feplb.LIMITS["trace_counts"]
        for i, c in enumerate(counts):  # every size before any copy
            total += int(np.prod(np.shape(c), dtype=object))
            if total > limit:
                raise ValueError(
                    f"counts[{i}]: counts[0..{i}] hold {total} entries, more than the {limit} a "
                    "trace may hold (docs/trace-format.md#limits)"
                )
        parts = [_args.int_array(c, f"counts[{i}]", "ranks, experts") for i, c in enumerate(counts)]
        for i, p in enumerate(parts):
            if p.shape != parts[0].shape:
                raise ValueError(
                    f"counts[{i}]: shape {p.shape}, expected {parts[0].shape} like counts[0]"
                )
        arr = np.stack(parts)
    else:
        try:
            arr = np.asarray(counts)
        except (ValueError, TypeError) as e:
            raise ValueError(f"counts: not an array of integers ({e})") from None
        if arr.ndim == 2:
            arr = arr[np.newaxis]
        if arr.ndim not in (3, 4):
            raise ValueError(
                "counts: expected [ranks, experts], [steps, ranks, experts] or "
                f"[steps, layers, ranks, experts], got shape {arr.shape}"
            )
        axes = "steps, ranks, experts" if arr.ndim == 3 else "steps, layers, ranks, experts"
        arr = _args.int_array(arr, "counts", axes)

    if arr.ndim == 4:
        num_steps, num_layers = arr.shape[:2]
        steps = _ids(step_ids, "step_ids", num_steps, np.arange(num_steps))
        layers = _ids(layer_ids, "layer_ids", num_layers, np.arange(num_layers))
        return (
            np.ascontiguousarray(arr.reshape(num_steps * num_layers, *arr.shape[2:])),
            np.repeat(steps, num_layers),
            np.tile(layers, num_steps),
        )
    n = arr.shape[0]
    steps = _ids(step_ids, "step_ids", n, np.arange(n))
    layers = _ids(layer_ids, "layer_ids", n, np.zeros(n, dtype=np.int64))
    return arr, steps, layers


def _ndim(value) -> int:
    try:
        return np.ndim(value)
    except (ValueError, TypeError):  # ragged
        return -1


def _ids(value, name: str, n: int, default: np.ndarray) -> np.ndarray:
    if value is None:
        return default.astype(np.int64)
    ids = _args.int_array(value, name, "n")
    if ids.shape != (n,):
        raise ValueError(f"{name}: has {ids.size} entries, expected {n}")
    if (ids < 0).any():
        i = int(np.argmax(ids < 0))
        raise ValueError(f"{name}[{i}]: {ids[i]} is negative")
    return ids
