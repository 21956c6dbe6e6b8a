"""What the PyTorch benchmarks in bench/gpu share: the expert shapes, routing popularity, the
padded layout of grouped GEMM rows, summary statistics, and the analysis of bench/gpu/hf_swap.py's
profile (its host/GPU marks, a torch.profiler trace's GPU busy and idle time). No torch here (the
functions take the array module's cumsum where they need one), so python/tests/test_torch_checks.py
checks them on the CPU with numpy.
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

# The grid of torch_vs_grouped_mm.py --grid: local experts x mean rows per expert, each expert count
# with one model's expert shape (top-8; tokens = experts x rows / 8). 256 experts take Qwen3-30B's
# shape: GLM-5's (H 6144) would need ~13 GB per [rows, H] buffer at 4096 rows per expert.
GRID_EXPERTS = (8, 32, 64, 128, 256)
GRID_ROWS = (256, 512, 1024, 4096)
GRID_MODELS = {8: ("glm5", 6144, 2048), 32: ("qwen3-235b", 4096, 1536), 64: ("olmoe", 2048, 1024),
               128: ("qwen3-30b", 2048, 768), 256: ("qwen3-30b", 2048, 768)}


def grid_shapes(experts: str | None = None, rows: str | None = None) -> list[dict]:
    """The --grid shapes (comma-separated subsets of GRID_EXPERTS and GRID_ROWS, None: all), named
    '<model>-e<experts>-r<rows>'."""
    def pick(text, allowed, what):
        if text is None or text == "all":
            return list(allowed)
        out = [int(x) for x in text.split(",") if x.strip()]
        bad = [x for x in out if x not in allowed]
        if bad:
            raise ValueError(f"--grid-{what}: {bad} not in {list(allowed)}")
        return out
    shapes = []
    for e in pick(experts, GRID_EXPERTS, "experts"):
        model, h, f = GRID_MODELS[e]
        for r in pick(rows, GRID_ROWS, "rows"):
            shapes.append({"name": f"{model}-e{e}-r{r}", "model": model, "experts": e, "hidden": h, "ffn": f,
                           "tokens": e * r // 8, "top_k": 8, "rows_per_expert": r})
    return shapes


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
    """Rows a padded buffer needs for any counts of num_rows rows over num_experts experts, rounded
    up to a multiple of the alignment."""
    need = num_rows + num_experts * (align - 1)
    return (need + align - 1) // align * align


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


def fastest(stats: dict, names) -> str:
    """The name among `names` present in `stats` (name -> summary()) with the lowest median."""
    present = [n for n in names if n in stats]
    if not present:
        raise ValueError(f"none of {list(names)} was timed")
    return min(present, key=lambda n: stats[n]["median_ms"])


# ---- bench/gpu/hf_swap.py's profile -----------------------------------------------------------


def merge_intervals(intervals) -> list:
    """[(start, end)] -> the sorted union as disjoint intervals (empty ones dropped)."""
    out = []
    for a, b in sorted((float(a), float(b)) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(merged) -> float:
    return sum(b - a for a, b in merged)


def overlap(merged_a, merged_b) -> float:
    """Length of the intersection of two merged (disjoint, sorted) interval lists."""
    i = j = 0
    total = 0.0
    while i < len(merged_a) and j < len(merged_b):
        a0, a1 = merged_a[i]
        b0, b1 = merged_b[j]
        total += max(0.0, min(a1, b1) - max(a0, b0))
        if a1 < b1:
            i += 1
        else:
            j += 1
    return total


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATEGORIES = ("cuda_runtime", "cuda_driver")


def trace_summary(events, annotation_prefix: str = "experts_", top: int = 8) -> dict:
    """A torch.profiler (Kineto) chrome trace's events -> GPU activity of the traced window (ms):
    span (first GPU activity's start to the last one's end), busy (the union of kernels, memcpys
    and memsets), idle = span - busy; the same split inside and outside the GPU-side ranges of
    the annotations whose names start with `annotation_prefix` (gpu_user_annotation events;
    absent: None); kernel count, the `top` kernels by total time; host time and count of CUDA
    runtime/driver API calls (launches and the like, every thread)."""
    gpu, ann, kernels, api_us, api_n, n_kernels = [], [], {}, 0.0, 0, 0
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "dur" not in e or "ts" not in e:
            continue
        cat = str(e.get("cat", "")).lower()
        ts, dur = float(e["ts"]), float(e["dur"])
        if cat in GPU_CATEGORIES:
            gpu.append((ts, ts + dur))
            if cat == "kernel":
                n_kernels += 1
                k = kernels.setdefault(str(e.get("name", "?"))[:100], [0.0, 0])
                k[0] += dur
                k[1] += 1
        elif cat == "gpu_user_annotation" and str(e.get("name", "")).startswith(annotation_prefix):
            ann.append((ts, ts + dur))
        elif cat in API_CATEGORIES:
            api_us += dur
            api_n += 1
    busy_iv = merge_intervals(gpu)
    out = {"gpu_activities": len(gpu), "kernels": n_kernels, "api_calls": api_n, "api_host_ms": api_us / 1e3}
    if not busy_iv:
        return {**out, "span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "top_kernels": []}
    span = busy_iv[-1][1] - busy_iv[0][0]
    busy = covered(busy_iv)
    out.update(span_ms=span / 1e3, busy_ms=busy / 1e3, idle_ms=(span - busy) / 1e3)
    ann_iv = merge_intervals((max(a, busy_iv[0][0]), min(b, busy_iv[-1][1])) for a, b in ann)
    if ann_iv:
        in_span, in_busy = covered(ann_iv), overlap(ann_iv, busy_iv)
        out["annotated"] = {"span_ms": in_span / 1e3, "busy_ms": in_busy / 1e3, "idle_ms": (in_span - in_busy) / 1e3}
        out["outside"] = {"span_ms": (span - in_span) / 1e3, "busy_ms": (busy - in_busy) / 1e3,
                          "idle_ms": (span - in_span - busy + in_busy) / 1e3}
    else:
        out["annotated"] = out["outside"] = None
    out["top_kernels"] = [{"name": n, "ms": t / 1e3, "count": c}
                          for n, (t, c) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]]
    return out


def mark_summary(marks, layers: int) -> dict:
    """One profiled training step's marks -> where its host and GPU time went (ms).

    marks: [(name, host_ms, gpu_ms)], each time relative to the step's start mark ("step_start",
    recorded after a synchronize, so its GPU time is the host's too, give or take a launch).
    Names: step_start, fwd_end, bwd_end, opt_end, and per MoE block i experts_fwd_start:i,
    experts_fwd_end:i, experts_bwd_start:i, experts_bwd_end:i. A mark's lag (gpu - host) is how
    long after the host reached that point the GPU did: near 0, the GPU was waiting for the host;
    large, the host was ahead (the GPU-bound case)."""
    at = {}
    for name, host, gpu in marks:
        at.setdefault(name, (float(host), float(gpu)))
    need = ("step_start", "fwd_end", "bwd_end", "opt_end")
    missing = [n for n in need if n not in at]
    if missing:
        raise ValueError(f"marks missing: {missing}")

    def span(a, b):
        return {"host_ms": at[b][0] - at[a][0], "gpu_ms": at[b][1] - at[a][1]}

    out = {"step": span("step_start", "opt_end"), "forward": span("step_start", "fwd_end"),
           "backward": span("fwd_end", "bwd_end"), "optimizer": span("bwd_end", "opt_end")}
    for kind in ("fwd", "bwd"):
        host = gpu = 0.0
        blocks = 0
        for i in range(layers):
            a, b = f"experts_{kind}_start:{i}", f"experts_{kind}_end:{i}"
            if a in at and b in at:
                host += at[b][0] - at[a][0]
                gpu += at[b][1] - at[a][1]
                blocks += 1
        out[f"experts_{kind}"] = {"host_ms": host, "gpu_ms": gpu, "blocks": blocks}
    ex_host = out["experts_fwd"]["host_ms"] + out["experts_bwd"]["host_ms"]
    ex_gpu = out["experts_fwd"]["gpu_ms"] + out["experts_bwd"]["gpu_ms"]
    out["rest"] = {"host_ms": out["step"]["host_ms"] - ex_host, "gpu_ms": out["step"]["gpu_ms"] - ex_gpu}

    def mean_lag(prefix):
        lags = [at[n][1] - at[n][0] for n in at if n.startswith(prefix)]
        return sum(lags) / len(lags) if lags else None

    out["lag_ms"] = {k: mean_lag(k + ":") for k in ("experts_fwd_start", "experts_fwd_end", "experts_bwd_start",
                                                     "experts_bwd_end")}
    out["lag_ms"].update({k: at[k][1] - at[k][0] for k in ("fwd_end", "bwd_end", "opt_end")})
    return out


def median_of(dicts):
    """Element-wise median of equally shaped nested dicts of numbers (None where any is None)."""
    first = dicts[0]
    if isinstance(first, dict):
        return {k: median_of([d[k] for d in dicts]) for k in first}
    if any(v is None for v in dicts):
        return None
    if isinstance(first, (int, float)):
        return percentile(sorted(float(v) for v in dicts), 50)
    return first
