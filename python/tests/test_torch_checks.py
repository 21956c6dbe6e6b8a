"""What feplb.torch and its benchmarks compute without torch, on the CPU: the argument checks the
adapters share (feplb/torch/_checks.py; bad input is a ValueError naming the argument) and the
benchmarks' helpers (bench/gpu/_bench_common.py: padded grouped-GEMM layout, shapes, statistics).
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
