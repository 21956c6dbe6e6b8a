"""Shared fixtures: routing counts with a known skew, the bundled trace, the feplb CLI binary."""

import os
import pathlib

import numpy as np
import pytest

try:
    import feplb
except ImportError:  # no planning extension for this Python (a GPU machine's torch venv): the
    feplb = None     # feplb.torch tests need none; the planning tests import feplb themselves

REPO = pathlib.Path(__file__).resolve().parents[2]


def routed_counts(rng, num_ranks, num_experts, tokens, top_k, skew=2.0):
    """[num_ranks, num_experts] counts of real routing: every token picks top_k distinct experts,
    the experts' popularity lognormal with the given sigma (so some GPUs are hot)."""
    popularity = rng.lognormal(0.0, skew, num_experts)
    counts = np.zeros((num_ranks, num_experts), dtype=np.int64)
    for r in range(num_ranks):
        # Gumbel top-k: top_k distinct experts per token, drawn in proportion to popularity.
        scores = np.log(popularity) + rng.gumbel(size=(tokens, num_experts))
        picks = np.argpartition(-scores, top_k - 1, axis=1)[:, :top_k]
        counts[r] = np.bincount(picks.ravel(), minlength=num_experts)
    return counts


@pytest.fixture
def rng():
    return np.random.default_rng(12)


@pytest.fixture
def skewed(rng):
    """EP=8, 64 experts, top-4, 1024 tokens per rank, heavily skewed."""
    return routed_counts(rng, 8, 64, 1024, 4)


@pytest.fixture
def default_trace_path():
    return feplb.default_trace_path()


@pytest.fixture
def cli():
    """The feplb binary (ctest passes FEPLB_CLI; else build/bin/feplb)."""
    path = os.environ.get("FEPLB_CLI") or str(REPO / "build" / "bin" / "feplb")
    if not os.access(path, os.X_OK):
        pytest.skip(f"no feplb binary at {path} (set FEPLB_CLI)")
    return path
