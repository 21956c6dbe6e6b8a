"""Argument checks feplb.torch's modules and adapters share that need no torch (duck-typed, so
python/tests/test_torch_checks.py runs them on a machine without torch). Every failure is a
ValueError that names the argument."""

from __future__ import annotations

import numbers


def integer_counts(who: str, name: str, value, length: int, total: int | None = None) -> list[int]:
    """`value` (a sequence of ints, or a 1-D integer tensor/array, read on the host) as a list of
    `length` non-negative ints summing to `total` (when given); else ValueError naming `name`."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        kind = str(dtype)
        if "int" not in kind or "bool" in kind:
            raise ValueError(f"{who}: {name} must hold integers, not {kind}")
        shape = tuple(getattr(value, "shape", ()))
        if len(shape) != 1:
            raise ValueError(f"{who}: {name} must be 1-D ({length} counts), not of shape {shape}")
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise ValueError(f"{who}: {name} must be a sequence of {length} counts, not {type(value).__name__}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"{who}: {name} must hold integers, got {v!r}")
        out.append(int(v))
    if len(out) != length or any(v < 0 for v in out) or (total is not None and sum(out) != total):
        want = f" summing to {total}" if total is not None else ""
        raise ValueError(f"{who}: {name} = {out} must be {length} non-negative counts{want}")
    return out


def require(cond: bool, who: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{who}: {message}")
