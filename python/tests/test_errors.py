"""Bad input is a ValueError naming the argument (or the file's field); never a crash."""

import numpy as np
import pytest

import feplb
from feplb import _feplb

SHAPE = feplb.ExpertShape(1024, 512)


@pytest.fixture
def counts():
    return np.full((4, 16), 64, dtype=np.int64)


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.full((4, 16), 64.0), "counts: expected integers, got dtype float64"),
        (np.full((4, 16), True), "counts: expected integers, got dtype bool"),
        ([["a"] * 16] * 4, "counts: expected integers"),
        ([[1, 2], [3]], "counts: not an array of integers"),
        (np.full(16, 64), r"counts: expected 2 axes \[num_ranks, num_experts\], got shape \(16,\)"),
        (np.full((2, 4, 16), 64), "counts: expected 2 axes"),
        (np.full((4, 15), 64), r"counts: shape \(4, 15\).*not divisible"),
        (np.full((0, 16), 64), r"counts: shape \(0, 16\).*num_ranks: 0 must be at least 1"),
        (np.array([[2**63 + 1] * 16] * 4, dtype=np.uint64), "counts: .* does not fit in int64"),
    ],
)
def test_counts(bad, message):
    with pytest.raises(ValueError, match=message):
        feplb.plan(bad, shape=SHAPE)


def test_negative_counts_name_the_entry(counts):
    counts[2, 5] = -3
    with pytest.raises(ValueError, match=r"counts\[2\]\[5\]: -3 is negative"):
        feplb.plan(counts, shape=SHAPE)


def test_counts_must_match_the_topology(counts):
    topo = feplb.Topology(8, 16)
    expected = r"counts: shape \(4, 16\), expected \(num_ranks, num_experts\) = \(8, 16\)"
    with pytest.raises(ValueError, match=expected):
        feplb.plan(counts, topology=topo, shape=SHAPE)
    with pytest.raises(ValueError, match="gpus_per_node"):
        feplb.plan(counts, topology=feplb.Topology(4, 16), gpus_per_node=4, shape=SHAPE)


def test_policy_knobs_and_shape(counts):
    with pytest.raises(ValueError, match="policy: unknown 'balanced' \\(known: static, "):
        feplb.plan(counts, "balanced", shape=SHAPE)
    with pytest.raises(ValueError, match="policy: expected a name"):
        feplb.plan(counts, 3, shape=SHAPE)
    with pytest.raises(ValueError, match="max_num_dynn: unknown knob"):
        feplb.plan(counts, shape=SHAPE, max_num_dynn=4)
    with pytest.raises(ValueError, match="max_num_dyn: -1 is below its minimum 0 experts"):
        feplb.plan(counts, shape=SHAPE, max_num_dyn=-1)
    with pytest.raises(ValueError, match="copy_gbps: 0 is below its minimum 0.001 GB/s"):
        feplb.plan(counts, shape=SHAPE, copy_gbps=0)
    with pytest.raises(ValueError, match="dyn: expected an integer, got 2.5"):
        feplb.plan(counts, shape=SHAPE, dyn=2.5)
    with pytest.raises(ValueError, match="dyn: expected an integer, got a bool"):
        feplb.plan(counts, shape=SHAPE, dyn=True)
    with pytest.raises(ValueError, match="balance_tolerance: expected a number, got str"):
        feplb.plan(counts, shape=SHAPE, balance_tolerance="0.1")
    with pytest.raises(ValueError, match="balance_tolerance: nan is not a finite number"):
        feplb.plan(counts, shape=SHAPE, balance_tolerance=float("nan"))
    with pytest.raises(TypeError, match="shape"):
        feplb.plan(counts)  # shape is required: it sets the bytes and the cost model
    with pytest.raises(ValueError, match="model: no expert shape is known for 'gpt-oss'"):
        feplb.plan(counts, shape="gpt-oss")
    with pytest.raises(ValueError, match="shape: expected feplb.ExpertShape"):
        feplb.plan(counts, shape=(1024, 512))
    with pytest.raises(ValueError, match="dtype: 'int8' is not one of bf16, fp16, fp8, fp32"):
        feplb.ExpertShape(1024, 512, "int8")
    with pytest.raises(ValueError, match="hidden: 0 must be at least 1"):
        feplb.ExpertShape(0, 512)
    with pytest.raises(ValueError, match="^/nonexistent/table.json: no such file$"):
        feplb.plan(counts, shape=SHAPE, cost_model="/nonexistent/table.json")
    with pytest.raises(ValueError, match=r"cost_model: .*h200-glm5.json is for"):
        path = feplb.data_dir() + "/cost/h200-glm5.json"
        feplb.plan(counts, shape=SHAPE, cost_model=path)


def test_topology_and_dynamic(counts):
    with pytest.raises(ValueError, match="num_experts: 10 is not divisible by num_ranks 4"):
        feplb.Topology(4, 10)
    with pytest.raises(ValueError, match="num_ranks: 12 is not divisible by gpus_per_node 8"):
        feplb.Topology(12, 24)
    with pytest.raises(ValueError, match="placement: has 3 entries, expected num_experts = 16"):
        feplb.Topology(4, 16, placement=[0, 1, 2])
    with pytest.raises(ValueError, match="placement: GPU 0 holds more than 4 experts"):
        feplb.Topology(4, 16, placement=[0] * 16)
    with pytest.raises(ValueError, match=r"placement: expert 0 has home GPU 7 outside \[0, 4\)"):
        feplb.Topology(4, 16, placement=[7] + [0] * 15)
    with pytest.raises(ValueError, match=r"gpu: 4 is outside \[0, 4\)"):
        feplb.Topology(4, 16).local_experts(4)
    with pytest.raises(ValueError, match="dynamic: has 3 entries, expected num_experts = 16"):
        feplb.plan(counts, shape=SHAPE, dynamic=[0, 1, 0])
    with pytest.raises(ValueError, match=r"dynamic\[1\]: 2 is not 0 or 1"):
        feplb.plan(counts, shape=SHAPE, dynamic=[0, 2] + [0] * 14)
    with pytest.raises(ValueError, match="feplb_dyn_set: 1 needs the dynamic sets"):
        feplb.plan(counts, shape=SHAPE, feplb_dyn_set=1)
    with pytest.raises(ValueError, match="layer: -1 must be at least 0"):
        feplb.Planner(topology=feplb.Topology(4, 16), shape=SHAPE).plan(counts, layer=-1)
    with pytest.raises(ValueError, match="topology: expected feplb.Topology"):
        feplb.Planner(topology=(4, 16), shape=SHAPE)


def test_error_mapping():
    # feplb::InputError -> ValueError, any other feplb::Error -> RuntimeError, message kept.
    with pytest.raises(ValueError, match="^bad input$"):
        _feplb._raise_for_test("input", "bad input")
    with pytest.raises(RuntimeError, match="^broken invariant$") as e:
        _feplb._raise_for_test("internal", "broken invariant")
    assert not isinstance(e.value, ValueError)
