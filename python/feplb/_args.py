"""Argument checks shared by the feplb API: every bad argument is a ValueError naming it, raised
before anything large is allocated (sizes are checked against the trace format's limits,
feplb.LIMITS, before an array is copied)."""

from __future__ import annotations

import numbers
import os

import numpy as np

from . import _feplb

INT64_MAX = int(np.iinfo(np.int64).max)


def integer(value, name: str, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
    """`value` as an int (Python or numpy integers; not bools) in [minimum, maximum]; ValueError
    naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: {value} must be at least {minimum}")
    if value > maximum:
        raise ValueError(f"{name}: {value} is above {maximum}")
    return value


def text(value, name: str) -> str:
    """`value` as a str that UTF-8 can hold (no lone surrogates); ValueError naming `name`."""
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{name}: not valid Unicode text ({e.reason} at index {e.start})"
        ) from None
    return value


def int_array(value, name: str, axes: str, max_size: int | None = None) -> np.ndarray:
    """`value` (array-like of integers: numpy, lists, CPU tensors) as a C-contiguous int64 array
    with len(axes.split(",")) axes and at most `max_size` entries (default: the counts one trace
    may hold), checked before the array is copied (a broadcast view stays small until then);
    ValueError naming `name` for another dtype, axis count or size. Shapes, negative and too large
    entries are checked by the C++ side, which names the entry."""
    ndim = len(axes.split(","))
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise ValueError(f"{name}: not an array of integers ({e})") from None
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integers, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} axes [{axes}], got shape {arr.shape}")
    require_size(arr.shape, name, max_size)
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.uint64(INT64_MAX):
        raise ValueError(f"{name}: {arr.max()} does not fit in int64")
    return np.ascontiguousarray(arr, dtype=np.int64)


def require_size(shape, name: str, max_size: int | None = None) -> None:
    """ValueError naming `name` when an array of `shape` holds more than `max_size` entries
    (default: the counts one trace may hold)."""
    limit = _feplb.LIMITS["trace_counts"] if max_size is None else max_size
    size = int(np.prod(shape, dtype=object))
    if size > limit:
        raise ValueError(
            f"{name}: shape {tuple(shape)} holds {size} entries, more than the {limit} a trace "
            "may hold (docs/trace-format.md#limits)"
        )


def shape(value, name: str = "shape") -> _feplb.ExpertShape:
    """An ExpertShape, or a known model's name ('glm5-128e', 'qwen3-235b', 'olmoe', 'mixtral')."""
    if isinstance(value, _feplb.ExpertShape):
        return value
    if isinstance(value, str):
        return _feplb.ExpertShape.for_model(text(value, name))
    raise ValueError(
        f"{name}: expected feplb.ExpertShape(hidden, ffn, dtype) or a model name such as "
        f"'glm5-128e', got {type(value).__name__}"
    )


def path(value, name: str) -> bytes:
    """A file path (str, bytes or os.PathLike) as the bytes the OS takes (a str's lone surrogates
    are the bytes os.fsdecode made them from); ValueError naming `name` for a NUL byte."""
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise ValueError(f"{name}: expected a path, got {type(value).__name__}")
    raw = os.fsencode(value)
    if b"\0" in raw:
        raise ValueError(f"{name}: {os.fsdecode(raw)!r} holds a NUL byte")
    return raw


def readable(raw: bytes) -> None:
    """FileNotFoundError or PermissionError (with errno and the path, as open() raises them) where
    the file `raw` cannot be opened for reading; "-" (standard input) passes."""
    if raw == b"-":
        return
    try:
        with open(raw, "rb"):
            pass
    except IsADirectoryError:
        return  # the reader names a directory itself (ValueError, as for any other content error)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
        raise type(e)(e.errno, e.strerror, os.fsdecode(raw)) from None


def knobs(values: dict) -> dict:
    """Knob keyword arguments, their names checked as text (the values by the C++ parser)."""
    for key in values:
        text(key, "knob name")
    return values
