"""Argument checks shared by the feplb API: every bad argument is a ValueError naming it."""

from __future__ import annotations

import numbers
import os

import numpy as np

from . import _feplb


def integer(value, name: str, minimum: int | None = None) -> int:
    """`value` as an int (Python or numpy integers; not bools); ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: {value} must be at least {minimum}")
    return value


def int_array(value, name: str, axes: str) -> np.ndarray:
    """`value` (array-like of integers: numpy, lists, CPU tensors) as a C-contiguous int64 array
    with len(axes.split(",")) axes; ValueError naming `name` for another dtype or axis count.
    Shapes and negative entries are checked by the C++ side, which names the entry."""
    ndim = len(axes.split(","))
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise ValueError(f"{name}: not an array of integers ({e})") from None
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integers, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} axes [{axes}], got shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.uint64(np.iinfo(np.int64).max):
        raise ValueError(f"{name}: {arr.max()} does not fit in int64")
    return np.ascontiguousarray(arr, dtype=np.int64)


def shape(value, name: str = "shape") -> _feplb.ExpertShape:
    """An ExpertShape, or a known model's name ('glm5-128e', 'qwen3-235b', 'olmoe', 'mixtral')."""
    if isinstance(value, _feplb.ExpertShape):
        return value
    if isinstance(value, str):
        return _feplb.ExpertShape.for_model(value)
    raise ValueError(
        f"{name}: expected feplb.ExpertShape(hidden, ffn, dtype) or a model name such as "
        f"'glm5-128e', got {type(value).__name__}"
    )


def path(value, name: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name}: expected a path, got {type(value).__name__}")
    return os.fspath(value)
