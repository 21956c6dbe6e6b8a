"""Bad input is a ValueError naming the argument (or the file's field); never a crash."""

import os
import re
import subprocess
import time
import tracemalloc

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
    with pytest.raises(ValueError, match=r"^knob max_num_dynn: unknown \(`feplb knobs` lists"):
        feplb.plan(counts, shape=SHAPE, max_num_dynn=4)
    with pytest.raises(ValueError, match=r"max-num-dyn\): -1 is outside \[0, 65536\] experts$"):
        feplb.plan(counts, shape=SHAPE, max_num_dyn=-1)
    with pytest.raises(ValueError, match=r"copy_gbps \(--copy-gbps\): 0 is outside \[0.001, "):
        feplb.plan(counts, shape=SHAPE, copy_gbps=0)
    with pytest.raises(ValueError, match=r"^knob dyn \(--dyn\): 2.5 is not an integer$"):
        feplb.plan(counts, shape=SHAPE, dyn=2.5)
    with pytest.raises(ValueError, match="knob dyn: expected a number, got bool"):
        feplb.plan(counts, shape=SHAPE, dyn=True)
    with pytest.raises(ValueError, match="knob balance_tolerance: expected a number, got str"):
        feplb.plan(counts, shape=SHAPE, balance_tolerance="0.1")
    with pytest.raises(ValueError, match=r"balance-tolerance\): nan is not a finite number"):
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


# --- Classes of bad input a fuzzer would try: every one a ValueError naming the argument, raised
# before any large allocation. ------------------------------------------------------------------

I64_MAX = int(np.iinfo(np.int64).max)
HUGE = 2**70


def small_counts():
    return np.full((4, 16), 64, dtype=np.int64)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t: feplb.plan(np.full((8, 64), I64_MAX), "feplb", shape=SHAPE),
         r"^counts\[0\]\[0\]: 9223372036854775807 is above 4294967296$"),
        (lambda t: feplb.Trace.from_counts(small_counts(), top_k=HUGE),
         f"^top_k: {HUGE} is above 65536$"),
        (lambda t: feplb.Trace.from_counts(small_counts(), top_k=4, tokens_per_rank=2**64),
         "^tokens_per_rank: 18446744073709551616 is above 4294967296$"),
        (lambda t: feplb.Trace.from_counts(small_counts(), top_k=4, step_ids=[HUGE]),
         "^step_ids: expected integers, got dtype object$"),
        (lambda t: feplb.Topology(HUGE, 8), f"^num_ranks: {HUGE} is outside"),
        (lambda t: feplb.Topology(4, 16, placement=[HUGE] + [0] * 15),
         rf"^placement\[0\]: {HUGE} is outside"),
        (lambda t: feplb.Topology(4, 16).local_experts(HUGE), f"^gpu: {HUGE} is outside"),
        (lambda t: feplb.ExpertShape(HUGE, 512), f"^hidden: {HUGE} is outside"),
        (lambda t: feplb.plan(small_counts(), shape=SHAPE, gpus_per_node=2**65),
         "^gpus_per_node: 36893488147419103232 is above 16384$"),
        (lambda t: feplb.plan(small_counts(), shape=SHAPE, dyn=HUGE),
         rf"^knob dyn \(--dyn\): {HUGE} is outside \[0, 65536\] experts$"),
        (lambda t: feplb.Planner(topology=feplb.Topology(4, 16), shape=SHAPE).plan(
            small_counts(), layer=2**64), "^layer: 18446744073709551616 is above 2147483647$"),
        (lambda t: feplb.simulate(t, warmup=HUGE), f"^warmup: {HUGE} is above 2147483647$"),
        (lambda t: feplb.simulate(t, hidden=HUGE), f"^hidden: {HUGE} is above 1048576$"),
        (lambda t: t[HUGE], f"^index: {HUGE} is above"),
    ],
)
def test_huge_integers(default_trace_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(feplb.Trace.load(default_trace_path))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: feplb.Trace.from_json("\udcff\x00garbage"),
         r"^text: not valid Unicode text \(surrogates not allowed at index 0\)$"),
        (lambda: feplb.Trace.from_json("\x00garbage"), "malformed JSON"),
        (lambda: feplb.Trace.from_counts(small_counts(), top_k=4, model="\udcff"),
         "^model: not valid Unicode text"),
        (lambda: feplb.plan(small_counts(), "\udcff", shape=SHAPE), "^policy: not valid Unicode"),
        (lambda: feplb.plan(small_counts(), shape="\udcff"), "^shape: not valid Unicode"),
        (lambda: feplb.ExpertShape(1024, 512, "\udcff"), "^dtype: not valid Unicode"),
        (lambda: feplb.plan(small_counts(), shape=SHAPE, **{"\udcff": 1}),
         "^knob name: not valid Unicode"),
        (lambda: feplb.simulate(feplb.default_trace_path(), ["feplb", "\udcff"]),
         "^policies: not valid Unicode"),
    ],
)
def test_non_utf8_text(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_file_that_cannot_be_opened_is_an_oserror(tmp_path):
    """Trace.load raises what open() would: FileNotFoundError (a file name that is not UTF-8
    included, named as os.fsdecode gives it), and PermissionError for a file it may not read."""
    with pytest.raises(FileNotFoundError) as e:
        feplb.Trace.load(b"/nonexistent/\xff\xfe.json")
    assert e.value.filename == os.fsdecode(b"/nonexistent/\xff\xfe.json")
    with pytest.raises(FileNotFoundError):
        feplb.Trace.load(tmp_path / "missing.json")
    locked = tmp_path / "locked.json"
    locked.write_text("{}")
    locked.chmod(0)
    if os.access(locked, os.R_OK):  # root reads it anyway
        pytest.skip("this user can read a file of mode 000 (root): no PermissionError to see")
    with pytest.raises(PermissionError):
        feplb.Trace.load(locked)


def test_a_non_utf8_file_name_round_trips(tmp_path, default_trace_path):
    t = feplb.Trace.load(default_trace_path)
    path = os.path.join(os.fsencode(tmp_path), b"\xff\xfe.json")
    t.save(path)
    back = feplb.Trace.load(path)
    assert back.path == os.fsdecode(path)
    np.testing.assert_array_equal(back.counts, t.counts)


def test_nul_in_paths(tmp_path, default_trace_path):
    t = feplb.Trace.load(default_trace_path)
    # Truncated at the NUL, this name would be the bundled trace: it must not load silently.
    for call in (
        lambda: feplb.Trace.load(default_trace_path + "\0x"),
        lambda: feplb.Trace.load(os.fsencode(default_trace_path) + b"\0x"),
        lambda: t.save(str(tmp_path / "out.json") + "\0x"),
        lambda: feplb.simulate(default_trace_path + "\0x"),
        lambda: feplb.plan(small_counts(), shape=SHAPE, cost_model="table.json\0x"),
    ):
        with pytest.raises(ValueError, match="holds a NUL byte"):
            call()
    assert list(tmp_path.iterdir()) == []


def peak_mib(call):
    """Runs call() (which must raise ValueError) and returns the peak of numpy's and Python's
    allocations meanwhile, in MiB (numpy reports its buffers to tracemalloc)."""
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as e:
            call()
        return tracemalloc.get_traced_memory()[1] / 2**20, str(e.value)
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: feplb.plan(np.broadcast_to(np.int64(8), (16384, 65536)), "feplb", shape=SHAPE),
         r"^counts: shape \(16384, 65536\) holds 1073741824 entries, more than the 134217728"),
        (lambda: feplb.Trace.from_counts(np.broadcast_to(np.int64(64), (2, 16384, 8192)),
                                         top_k=8),
         r"^counts: shape \(2, 16384, 8192\) holds 268435456 entries, more than the 134217728"),
        (lambda: feplb.Trace.from_counts([np.broadcast_to(np.int64(64), (4096, 8192))] * 5,
                                         top_k=8),
         r"^counts\[4\]: counts\[0..4\] hold 167772160 entries, more than the 134217728"),
        (lambda: feplb.Trace.from_counts(np.broadcast_to(np.int64(64), (64, 4, 4096, 8192)),
                                         top_k=8),
         r"^counts: shape \(64, 4, 4096, 8192\) holds"),
    ],
)
def test_broadcast_arrays_are_refused_before_they_are_copied(call, message):
    t0 = time.monotonic()
    peak, text = peak_mib(call)
    assert re.search(message, text), text
    assert peak < 64, f"{peak:.0f} MiB allocated before the error"
    assert time.monotonic() - t0 < 5


def test_oversized_metadata_is_refused_and_what_save_writes_load_reads(tmp_path):
    limit = feplb.LIMITS["free_form_bytes"]
    c = small_counts()
    with pytest.raises(ValueError, match=rf"^generator: \d+ bytes of JSON, more than the {limit}"):
        feplb.Trace.from_counts(c, top_k=4, generator={"x": "a" * (2 << 20)})
    with pytest.raises(ValueError, match=rf"^model: \d+ bytes, more than the {limit}"):
        feplb.Trace.from_counts(c, top_k=4, model="m" * (limit + 1))
    with pytest.raises(ValueError, match="^generator: not JSON that a trace can hold"):
        feplb.Trace.from_counts(c, top_k=4, generator={"\udcff": 1})
    # Just within the limits: saved, loaded back, also by the CLI.
    t = feplb.Trace.from_counts(c, top_k=4, model="m" * (limit - 16),
                                generator={"x": "é" * ((limit - 64) // 2)})
    out = tmp_path / "edge.json"
    t.save(out)
    back = feplb.Trace.load(out)
    assert back.model == t.model and back.generator == t.generator
    cli = subprocess.run([os.environ["FEPLB_CLI"], "trace", "info", str(out)],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
