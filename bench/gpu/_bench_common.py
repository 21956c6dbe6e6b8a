"""What the PyTorch benchmarks in bench/gpu share: the expert shapes, routing popularity, the
padded layout of grouped GEMM rows, and summary statistics. No torch here (the functions take
the array module's cumsum where they need one), so python/tests/test_bench_common.py checks them
on the CPU with numpy.
"""

from __future__ import annotations

import math

# One GPU's share of an MoE layer: E local experts (H, F SwiGLU), tokens per GPU, top-8.
# - qwen3-235b: Qwen3-235B-A22B's experts (H=4096 F=1536, 128 experts) at EP=8.
# - glm5-128e: the project's GLM-5 setting (glm5-128e: 128 experts at EP=8, H=6144 F=2048); the
#   same numbers as the shape the issue lists second.
# - qwen3-30b: Qwen3-30B-A3B's experts (H=2048 F=768, 128 experts) at EP=4, 8192 tokens.
# - glm5: GLM-5 as published (256 routed experts, top-8, H=6144, F=2048) at EP=8: 32 local
#   experts. GLM-5's honest per-GPU shape, since glm5-128e repeats the second row.
SHAPES = [
    {"name": "qwen3-235b", "experts": 16, "hidden": 4096, "ffn": 1536, "tokens": 4096, "top_k": 8},
    {"name": "glm5-128e", "experts": 16, "hidden": 6144, "ffn": 2048, "tokens": 4096, "top_k": 8},
    {"name": "qwen3-30b", "experts": 32, "hidden": 2048, "ffn": 768, "tokens": 8192, "top_k": 8},
    {"name": "glm5", "experts": 32, "hidden": 6144, "ffn": 2048, "tokens": 4096, "top_k": 8},
]

ROUTINGS = ("uniform", "zipf1.0")


def shapes_by_name(names: str | None) -> list[dict]:
    """The shapes whose names a comma-separated list gives (all for None or 'all')."""
    if names is None or names == "all":
        return [dict(s) for s in SHAPES]
    known = {s["name"]: s for s in SHAPES}
    out = []
    for n in names.split(","):
        n = n.strip()
        if n not in known:
            raise ValueError(f"--shapes: unknown shape {n!r}; known: {', '.join(known)}")
        out.append(dict(known[n]))
    return out


def zipf_popularity(num_experts: int, exponent: float = 1.0) -> list[float]:
    """Expert e's share of the routing mass, proportional to 1 / (e + 1)^exponent (expert 0 the
    most popular); sums to 1."""
    if num_experts < 1:
        raise ValueError(f"num_experts must be positive, not {num_experts}")
    raw = [1.0 / (e + 1) ** exponent for e in range(num_experts)]
    total = sum(raw)
    return [r / total for r in raw]


def padded_layout(counts, expert_sorted, positions, align: int, cumsum):
    """Where each routed row goes when every expert's group of rows starts at a multiple of
    `align` rows (the padding torch._grouped_mm layers use, TorchTitan's token group alignment).

    counts [E] rows per expert; expert_sorted [N] the expert of each row, rows sorted by expert;
    positions [N] = 0..N-1; cumsum: the array module's inclusive cumulative sum over the one axis.
    Returns (dest [N], ends [E]): row i's place in the padded buffer, and each padded group's end
    (the grouped GEMM's offsets). Padding rows (dest never points at them) are the caller's zeros.
    """
    padded = (counts + (align - 1)) // align * align
    ends = cumsum(padded)
    starts_padded = ends - padded
    starts = cumsum(counts) - counts
    dest = starts_padded[expert_sorted] + (positions - starts[expert_sorted])
    return dest, ends


def padded_capacity(num_rows: int, num_experts: int, align: int) -> int:
    """Rows a padded buffer needs for any counts of num_rows rows over num_experts experts."""
    return num_rows + num_experts * (align - 1)


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, linear interpolation."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summary(times_ms: list[float]) -> dict:
    """Median, p10, p90, min and max of a list of times (ms), and how many."""
    t = sorted(times_ms)
    return {"median_ms": percentile(t, 50), "p10_ms": percentile(t, 10), "p90_ms": percentile(t, 90),
            "min_ms": t[0] if t else float("nan"), "max_ms": t[-1] if t else float("nan"), "n": len(t)}


def rotated(names: list[str], i: int) -> list[str]:
    """The i-th rotation of the case order (interleaved A/B: each case leads in turn)."""
    k = i % len(names) if names else 0
    return names[k:] + names[:k]


def gemm_flops(rows: int, n: int, k: int) -> float:
    return 2.0 * rows * n * k
