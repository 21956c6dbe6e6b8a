"""feplb.Trace: load/save round trips, steps as numpy, and traces built from routing counts."""

import json

import numpy as np
import pytest

import feplb
from conftest import routed_counts


def test_load_the_bundled_trace(default_trace_path):
    t = feplb.Trace.load(default_trace_path)
    assert (t.num_ranks, t.num_experts, t.top_k, t.tokens_per_rank) == (8, 128, 8, 4096)
    assert t.model == "glm5-128e" and len(t) == 48 and t.path == default_trace_path
    c = t.counts
    assert c.shape == (48, 8, 128) and c.dtype == np.int64
    assert (c.sum(axis=2) == 4096 * 8).all()
    np.testing.assert_array_equal(t.step_ids, np.repeat(np.arange(16), 3))
    np.testing.assert_array_equal(t.layer_ids, np.tile([0, 7, 15], 16))  # 3 of OLMoE's layers
    step = t[4]
    assert (step.step, step.layer) == (1, 7)
    np.testing.assert_array_equal(step.counts, c[4])
    np.testing.assert_array_equal(t[-1].counts, c[47])
    assert [s.layer for s in t][:4] == [0, 7, 15, 0]
    assert t.generator["tool"] == "feplb trace gen"
    with pytest.raises(IndexError):
        t[48]


def test_save_and_load_back(default_trace_path, tmp_path):
    t = feplb.Trace.load(default_trace_path)
    out = tmp_path / "copy.json"
    t.save(out)
    u = feplb.Trace.load(out)
    for field in ("model", "num_ranks", "num_experts", "top_k", "tokens_per_rank",
                  "expert_shape", "generator"):
        assert getattr(u, field) == getattr(t, field), field
    np.testing.assert_array_equal(u.counts, t.counts)
    np.testing.assert_array_equal(u.step_ids, t.step_ids)
    np.testing.assert_array_equal(u.layer_ids, t.layer_ids)
    assert u.to_json() == t.to_json() == out.read_text()
    with pytest.raises(ValueError, match="exists; pass overwrite=True"):
        t.save(out)
    t.save(out, overwrite=True)
    assert feplb.Trace.from_json(t.to_json()).to_json() == t.to_json()


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        feplb.Trace.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format":"feplb-trace-v1","num_experts":4,"top_k":1,"num_ranks":2,'
                   '"tokens_per_rank":2,'
                   '"steps":[{"step":0,"layer":0,"counts":[[1,1,0,0],[2,0,0]]}]}')
    with pytest.raises(ValueError, match=r"bad.json: steps\[0\].counts\[1\]: has 3 entries"):
        feplb.Trace.load(bad)


def test_from_counts_round_trip(rng, tmp_path):
    counts = np.stack([routed_counts(rng, 4, 16, 256, 2) for _ in range(6)])  # [6, 4, 16]
    t = feplb.Trace.from_counts(counts, top_k=2, model="my-moe",
                                expert_shape=feplb.ExpertShape(1024, 512),
                                generator={"job": "test", "run": 3})
    assert (t.num_ranks, t.num_experts, t.top_k, t.tokens_per_rank) == (4, 16, 2, 256)
    np.testing.assert_array_equal(t.step_ids, np.arange(6))
    np.testing.assert_array_equal(t.layer_ids, np.zeros(6))
    t.save(tmp_path / "t.json")
    u = feplb.Trace.load(tmp_path / "t.json")  # the file reader accepts what from_counts built
    np.testing.assert_array_equal(u.counts, counts)
    assert u.model == "my-moe" and u.expert_shape == feplb.ExpertShape(1024, 512)
    assert u.generator == {"job": "test", "run": 3}
    assert u.to_json() == t.to_json()


def test_from_counts_layouts(rng):
    steps, layers = 3, 2
    grid = np.stack([np.stack([routed_counts(rng, 2, 8, 64, 2) for _ in range(layers)])
                     for _ in range(steps)])  # [steps, layers, ranks, experts]
    t = feplb.Trace.from_counts(grid, top_k=2, layer_ids=[1, 3])
    np.testing.assert_array_equal(t.step_ids, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(t.layer_ids, [1, 3, 1, 3, 1, 3])
    np.testing.assert_array_equal(t.counts, grid.reshape(6, 2, 8))
    # A list of per-(step, layer) arrays (int32, as a framework might log them), labelled.
    parts = [grid[s, l].astype(np.int32) for s in range(steps) for l in range(layers)]
    u = feplb.Trace.from_counts(parts, top_k=2, step_ids=[0, 0, 1, 1, 2, 2],
                                layer_ids=[1, 3, 1, 3, 1, 3])
    assert u.to_json() == t.to_json()
    one = feplb.Trace.from_counts(grid[0, 0].tolist(), top_k=2, tokens_per_rank=64)
    assert len(one) == 1 and one.tokens_per_rank == 64


def test_from_counts_replays_in_the_simulator(rng):
    # A "training job": 8 EP ranks, 64 experts, top-4, 10 micro-batches x 2 layers, replayed.
    grid = np.stack([[routed_counts(rng, 8, 64, 512, 4) for _ in range(2)] for _ in range(10)])
    t = feplb.Trace.from_counts(grid, top_k=4, expert_shape=feplb.ExpertShape(2048, 768))
    r = feplb.simulate(t, ["feplb"], copy_timing=0)
    # static's token straggler recomputed here from the counts: max minus mean GPU load.
    loads = grid.sum(axis=2).reshape(20, 8, 8).sum(axis=2)  # [steps, GPU]: 8 experts per GPU
    expected = (loads.max(axis=1) - loads.mean(axis=1)).mean()
    assert r["policies"]["static"]["token_straggler"] == pytest.approx(expected, rel=1e-12)
    assert r["config"]["steps"] == 20 and r["config"]["trace"] == "(in memory)"
    assert r["policies"]["feplb"]["token_straggler"] < 0.3 * expected


def test_from_counts_uneven_tokens_and_dropped_rows(rng, tmp_path):
    c = routed_counts(rng, 4, 16, 256, 2)
    uneven = c.copy()
    uneven[3, :] = routed_counts(rng, 1, 16, 200, 2)[0]  # rank 3 routed fewer tokens
    t = feplb.Trace.from_counts(uneven, top_k=2)
    assert t.tokens_per_rank == 256  # the most any rank had
    step = json.loads(t.to_json())["steps"][0]
    assert step["tokens"] == [256, 256, 256, 200] and "dropped" not in step
    t.save(tmp_path / "uneven.json")
    back = feplb.Trace.load(tmp_path / "uneven.json")  # the file reader accepts it
    np.testing.assert_array_equal(back.counts[0], uneven)
    assert json.loads(back.to_json())["steps"][0]["tokens"] == [256, 256, 256, 200]

    dropped = c.copy()
    dropped[1, np.argmax(dropped[1])] -= 1  # one token-expert row dropped (capacity factor)
    # Without a token count, a dropped row cannot be told from a missing token.
    with pytest.raises(ValueError, match=r"counts\[0\]\[1\]: sums to 511, not a multiple of "
                                         r"top_k = 2; give tokens"):
        feplb.Trace.from_counts(dropped, top_k=2)
    d = feplb.Trace.from_counts(dropped, top_k=2, tokens_per_rank=256)
    step = json.loads(d.to_json())["steps"][0]
    assert step["tokens"] == [256] * 4 and step["dropped"] == [0, 1, 0, 0]
    e = feplb.Trace.from_counts(dropped, top_k=2, tokens=[256, 256, 256, 256])
    assert json.loads(e.to_json())["steps"][0]["dropped"] == [0, 1, 0, 0]
    # A uniform trace stores no per-rank fields.
    assert "tokens" not in json.loads(feplb.Trace.from_counts(c, top_k=2).to_json())["steps"][0]
    with pytest.raises(ValueError, match=r"counts\[0\]\[0\]: sums to 512, more than "
                                         r"tokens_per_rank \* top_k = 500"):
        feplb.Trace.from_counts(c, top_k=2, tokens_per_rank=250)
    with pytest.raises(ValueError, match=r"counts\[0\]\[2\]: sums to 512, more than "
                                         r"tokens\[0\]\[2\] \* top_k = 400"):
        feplb.Trace.from_counts(c, top_k=2, tokens=[256, 256, 200, 256])
    with pytest.raises(ValueError, match=r"tokens\[0\]\[0\]: 300 is above tokens_per_rank = 256"):
        feplb.Trace.from_counts(c, top_k=2, tokens=[300, 256, 256, 256], tokens_per_rank=256)
    with pytest.raises(ValueError, match=r"tokens: shape \(3,\)"):
        feplb.Trace.from_counts(c, top_k=2, tokens=[256, 256, 256])
    hot = np.array([[20, 0, 0, 0], [10, 10, 0, 0]])  # 10 tokens, top-2: 20 rows on one expert
    with pytest.raises(ValueError, match=r"counts\[0\]\[0\]\[0\]: 20 rows exceed the rank's 10"):
        feplb.Trace.from_counts(hot, top_k=2)
    with pytest.raises(ValueError, match="step 0 layer 0 appears twice"):
        feplb.Trace.from_counts([c, c], top_k=2, step_ids=[0, 0])
    with pytest.raises(ValueError, match="counts: 15 experts are not divisible by 4 ranks"):
        feplb.Trace.from_counts(np.zeros((4, 15), dtype=np.int64), top_k=1)
    with pytest.raises(ValueError, match="top_k: 17 must be in 1..num_experts = 16"):
        feplb.Trace.from_counts(c, top_k=17)
    with pytest.raises(ValueError, match="top_k: 0 must be at least 1"):
        feplb.Trace.from_counts(c, top_k=0)
    with pytest.raises(ValueError, match="counts: expected integers, got dtype float64"):
        feplb.Trace.from_counts(c.astype(float), top_k=2)
    with pytest.raises(ValueError, match=r"counts\[1\]: shape \(4, 8\), expected \(4, 16\)"):
        feplb.Trace.from_counts([c, c[:, :8]], top_k=2)
    neg = c.copy()
    neg[2, 3] = -1
    with pytest.raises(ValueError, match=r"counts\[0\]\[2\]\[3\]: -1 is negative"):
        feplb.Trace.from_counts(neg, top_k=2)
    with pytest.raises(ValueError, match="step_ids: has 2 entries, expected 1"):
        feplb.Trace.from_counts(c, top_k=2, step_ids=[0, 1])
    with pytest.raises(ValueError, match=r"layer_ids\[0\]: -2 is negative"):
        feplb.Trace.from_counts(c, top_k=2, layer_ids=[-2])
    with pytest.raises(ValueError, match="counts: empty"):
        feplb.Trace.from_counts([], top_k=2)
    with pytest.raises(ValueError, match="counts: expected \\[ranks, experts\\]"):
        feplb.Trace.from_counts(np.zeros(5, dtype=np.int64), top_k=1)
    with pytest.raises(ValueError, match="generator: not JSON"):
        feplb.Trace.from_counts(c, top_k=2, generator={"x": object()})
