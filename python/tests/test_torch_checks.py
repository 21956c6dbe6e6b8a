"""What feplb.torch and its benchmarks compute without torch, on the CPU: the argument checks the
adapters share (feplb/torch/_checks.py; bad input is a ValueError naming the argument) and the
benchmarks' helpers (bench/gpu/_bench_common.py: padded grouped-GEMM layout, shapes, statistics, the
faster baseline, and hf_swap.py's profile analysis: host/GPU marks, a trace's GPU busy and idle time).
Both files are loaded by path: importing feplb.torch itself needs torch with CUDA."""

import importlib.util
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks = load("python/feplb/torch/_checks.py", "feplb_torch_checks")
common = load("bench/gpu/_bench_common.py", "bench_common")


def test_counts_accept_ints_and_integer_arrays():
    assert checks.integer_counts("X", "tokens_per_expert", [3, 0, 2], 3, 5) == [3, 0, 2]
    assert checks.integer_counts("X", "tokens_per_expert", (1, 1), 2) == [1, 1]
    assert checks.integer_counts("X", "tokens_per_expert", np.array([4, 1], dtype=np.int64), 2, 5) == [4, 1]
    assert checks.integer_counts("X", "tokens_per_expert", [np.int32(2)], 1, 2) == [2]


@pytest.mark.parametrize("value,match", [
    ([3, 2], r"tokens_per_expert = \[3, 2\] must be 2 non-negative counts summing to 6"),  # wrong sum
    ([3, 2, 1], "must be 2 non-negative counts"),  # wrong length
    ([7, -1], "non-negative"),
    ([1.0, 5.0], "must hold integers"),
    ([True, 5], "must hold integers"),
    (np.array([1.0, 5.0]), "must hold integers, not float64"),
    (np.array([[1, 5]]), "must be 1-D"),
    (np.array([True, False]), "must hold integers, not bool"),
    ("15", "must be a sequence"),
    (6, "must be a sequence"),
])
def test_bad_counts_name_the_argument(value, match):
    with pytest.raises(ValueError, match="X: tokens_per_expert"):
        checks.integer_counts("X", "tokens_per_expert", value, 2, 6)
    with pytest.raises(ValueError, match=match):
        checks.integer_counts("X", "tokens_per_expert", value, 2, 6)


def test_require():
    checks.require(True, "X", "never")
    with pytest.raises(ValueError, match="^X: rows must be bfloat16$"):
        checks.require(False, "X", "rows must be bfloat16")


def test_padded_layout_puts_every_group_at_a_multiple_of_the_alignment():
    rng = np.random.default_rng(3)
    for align in (1, 8, 16):
        for _ in range(20):
            E = int(rng.integers(1, 12))
            ids = rng.integers(0, E, size=int(rng.integers(0, 200)))
            order = np.argsort(ids, kind="stable")
            counts = np.bincount(ids, minlength=E)
            dest, ends = common.padded_layout(counts, ids[order], np.arange(len(ids)), align, np.cumsum)
            starts = ends - (counts + align - 1) // align * align
            assert (starts % align == 0).all() and (ends % align == 0).all()
            assert len(set(dest.tolist())) == len(ids), "two rows in one place"
            assert (len(ids) == 0) or dest.max() < common.padded_capacity(len(ids), E, align)
            # Expert e's rows land, in order, in [starts[e], starts[e] + counts[e]).
            for e in range(E):
                got = dest[ids[order] == e]
                assert (got == starts[e] + np.arange(counts[e])).all()
            if align == 1:
                assert (dest == np.arange(len(ids))).all() and (ends == np.cumsum(counts)).all()


def test_shapes_statistics_and_rotation():
    names = [s["name"] for s in common.SHAPES]
    assert len(set(names)) == len(names) == 4
    dims = {(s["experts"], s["hidden"], s["ffn"], s["tokens"]) for s in common.SHAPES}
    assert len(dims) == 4, "a shape listed twice"
    assert [s["name"] for s in common.shapes_by_name("glm5,qwen3-30b")] == ["glm5", "qwen3-30b"]
    with pytest.raises(ValueError, match="unknown shape 'nope'"):
        common.shapes_by_name("nope")
    p = common.zipf_popularity(4)
    assert abs(sum(p) - 1) < 1e-12 and p[0] == pytest.approx(2 * p[1]) and p[0] == pytest.approx(4 * p[3])
    s = common.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median_ms"], s["min_ms"], s["max_ms"], s["n"]) == (3.0, 1.0, 5.0, 5)
    assert s["p10_ms"] == pytest.approx(1.4) and s["p90_ms"] == pytest.approx(4.6)
    assert common.percentile(list(np.arange(11.0)), 90) == pytest.approx(np.percentile(np.arange(11.0), 90))
    assert [common.rotated(["a", "b", "c"], i)[0] for i in range(4)] == ["a", "b", "c", "a"]


def test_padded_capacity_fits_any_counts_and_is_aligned():
    for align in (1, 8, 16):
        for rows, experts in ((0, 1), (5, 3), (65536, 32), (32768, 16), (7, 7)):
            cap = common.padded_capacity(rows, experts, align)
            assert cap % align == 0 and cap >= rows + experts * (align - 1)
            assert cap < rows + experts * (align - 1) + align
    assert common.padded_capacity(65536, 32, 8) == 65760 and common.padded_capacity(100, 4, 1) == 100


def test_fastest_picks_the_lowest_median_among_the_named():
    stats = {"grouped_mm": {"median_ms": 11.8}, "grouped_mm_unpadded": {"median_ms": 9.6},
             "feplb_grad_bf16": {"median_ms": 7.9}}
    assert common.fastest(stats, ("grouped_mm", "grouped_mm_unpadded")) == "grouped_mm_unpadded"
    assert common.fastest(stats, ("grouped_mm", "nope")) == "grouped_mm"
    with pytest.raises(ValueError, match="was timed"):
        common.fastest(stats, ("nope",))


def test_interval_union_and_overlap():
    m = common.merge_intervals([(5, 7), (0, 2), (1, 3), (6, 9), (4, 4)])
    assert m == [(0.0, 3.0), (5.0, 9.0)] and common.covered(m) == 7.0
    assert common.overlap(m, common.merge_intervals([(2, 6), (8, 20)])) == 1.0 + 1.0 + 1.0
    assert common.overlap(m, []) == 0.0


def test_trace_summary_splits_busy_and_idle_inside_and_outside_the_experts():
    def ev(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    events = [
        ev("kernel", "attn", 0, 100), ev("kernel", "gemm", 150, 100), ev("gpu_memset", "Memset", 240, 20),
        ev("kernel", "gemm", 400, 100), ev("gpu_memcpy", "Memcpy DtoD", 550, 50),
        ev("gpu_user_annotation", "experts_fwd", 120, 280),  # 120..400: busy 150..260 = 110
        ev("gpu_user_annotation", "other", 0, 600),
        ev("cuda_runtime", "cudaLaunchKernel", 10, 5), ev("cuda_driver", "cuLaunchKernel", 20, 3),
        ev("cpu_op", "aten::mm", 0, 50), {"ph": "f", "cat": "ac2g"}, "not an event",
    ]
    t = common.trace_summary(events)
    assert t["kernels"] == 3 and t["gpu_activities"] == 5 and t["api_calls"] == 2
    assert t["api_host_ms"] == pytest.approx(0.008)
    # busy: 0-100, 150-260 (a gemm and an overlapping memset), 400-500, 550-600
    assert t["span_ms"] == pytest.approx(0.6) and t["busy_ms"] == pytest.approx(0.36)
    assert t["idle_ms"] == pytest.approx(0.24)
    assert t["annotated"]["span_ms"] == pytest.approx(0.28) and t["annotated"]["busy_ms"] == pytest.approx(0.11)
    assert t["annotated"]["idle_ms"] == pytest.approx(0.17) and t["outside"]["idle_ms"] == pytest.approx(0.07)
    assert t["top_kernels"][0] == {"name": "gemm", "ms": pytest.approx(0.2), "count": 2}
    assert common.trace_summary([])["busy_ms"] == 0.0
    assert common.trace_summary([ev("kernel", "k", 0, 10)])["annotated"] is None


def test_mark_summary_attributes_host_and_gpu_time():
    # (name, host ms, GPU ms) from the step's start: a host that runs ahead until block 0's forward
    # waits for the GPU (its counts), then stays just ahead of the GPU.
    marks = [("step_start", 0.0, 0.0),
             ("experts_fwd_start:0", 1.0, 6.0), ("experts_fwd_end:0", 8.0, 8.5),
             ("experts_fwd_start:1", 9.0, 9.5), ("experts_fwd_end:1", 12.0, 12.2),
             ("fwd_end", 13.0, 13.5),
             ("experts_bwd_start:1", 14.0, 20.0), ("experts_bwd_end:1", 16.0, 24.0),
             ("experts_bwd_start:0", 17.0, 26.0), ("experts_bwd_end:0", 19.0, 30.0),
             ("bwd_end", 20.0, 31.0), ("opt_end", 22.0, 40.0)]
    s = common.mark_summary(marks, 2)
    assert s["step"] == {"host_ms": 22.0, "gpu_ms": 40.0}
    assert s["forward"] == {"host_ms": 13.0, "gpu_ms": 13.5}
    assert s["backward"] == {"host_ms": 7.0, "gpu_ms": 17.5}
    assert s["optimizer"] == {"host_ms": 2.0, "gpu_ms": 9.0}
    assert s["experts_fwd"] == {"host_ms": 10.0, "gpu_ms": pytest.approx(5.2), "blocks": 2}
    assert s["experts_bwd"] == {"host_ms": 4.0, "gpu_ms": 8.0, "blocks": 2}
    assert s["rest"] == {"host_ms": 22.0 - 14.0, "gpu_ms": pytest.approx(40.0 - 13.2)}
    assert s["lag_ms"]["experts_fwd_start"] == pytest.approx((5.0 + 0.5) / 2)
    assert s["lag_ms"]["experts_fwd_end"] == pytest.approx((0.5 + 0.2) / 2)
    assert s["lag_ms"]["opt_end"] == 18.0
    no_experts = common.mark_summary([m for m in marks if not m[0].startswith("experts")], 2)
    assert no_experts["experts_fwd"]["blocks"] == 0 and no_experts["lag_ms"]["experts_fwd_start"] is None
    with pytest.raises(ValueError, match="marks missing"):
        common.mark_summary(marks[:3], 2)
    med = common.median_of([s, no_experts, s])
    assert med["step"]["host_ms"] == 22.0 and med["experts_fwd"]["blocks"] == 2.0
    assert med["lag_ms"]["experts_fwd_start"] is None and med["lag_ms"]["opt_end"] == 18.0
