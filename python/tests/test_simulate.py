"""feplb.simulate returns what `feplb simulate --json` writes for the same trace and options."""

import json
import subprocess

import pytest

import feplb

# Measured wall-clock numbers, different in every run (planner timings, and what they delay: the
# copies' start, hence the window and the exposed time; the placer's time). Everything else must
# be equal, float for float.
MEASURED = {
    "planner_us_median", "planner_us_p99", "fits_static_window", "window_slack_ms_p5",
    "copy_exposed_ms", "copy_exposed_ms_p95", "exposed_ms", "exposed_ms_p95", "plan_exposed_ms",
    "delayed_steps", "place_ms", "planner_us",  # (the last: each step's, in "steps")
}


def strip_measured(doc):
    if isinstance(doc, dict):
        return {k: strip_measured(v) for k, v in doc.items() if k not in MEASURED}
    if isinstance(doc, list):
        return [strip_measured(v) for v in doc]
    return doc


def cli_json(cli, out, args):
    subprocess.run([cli, "simulate", "--quiet", "--json", str(out), *args], check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def assert_same(cli_doc, py_doc):
    assert set(cli_doc["policies"]) == set(py_doc["policies"])
    for doc in (cli_doc, py_doc):  # the measured fields are there, as numbers
        for p in doc["policies"].values():
            assert all(isinstance(p[k], (int, float)) for k in MEASURED - {"place_ms", "planner_us"})
    assert strip_measured(py_doc) == strip_measured(cli_doc)


def test_default_run_equals_the_cli(cli, tmp_path, default_trace_path):
    cli_doc = cli_json(cli, tmp_path / "cli.json", ["--trace", default_trace_path])
    py_doc = feplb.simulate(feplb.Trace.load(default_trace_path))
    assert py_doc["config"]["policies"] == list(feplb.DEFAULT_POLICIES)
    assert_same(cli_doc, py_doc)
    assert py_doc["config"]["cost_model"].startswith("measured per-expert table")
    # The README's numbers for this trace (token straggler mean, rows).
    assert round(py_doc["policies"]["static"]["token_straggler"]) == 19265
    assert round(py_doc["policies"]["feplb"]["token_straggler"]) == 540


def test_options_equal_the_cli_flags(cli, tmp_path, default_trace_path):
    cli_doc = cli_json(cli, tmp_path / "cli.json", [
        "--trace", default_trace_path, "--policies", "feplb,eplb,llep,moonep",
        "--gpus-per-node", "4", "--warmup", "2", "--cost-model", "roofline",
        "--hidden", "4096", "--ffn", "1536", "--dtype", "fp16",
        "--dyn", "6", "--copy-gbps", "300", "--balance-tolerance", "0.01", "--eplb-window", "4",
    ])
    py_doc = feplb.simulate(
        default_trace_path, ["feplb", "eplb", "llep", "moonep"], gpus_per_node=4, warmup=2,
        cost_model="roofline", hidden=4096, ffn=1536, dtype="fp16",
        dyn=6, copy_gbps=300, balance_tolerance=0.01, eplb_window=4,
    )
    assert py_doc["config"]["knobs"]["dyn"] == 6
    assert py_doc["config"]["nvlink_domains"] == 2
    assert_same(cli_doc, py_doc)


def test_walk_forward_and_placement_equal_the_cli(cli, tmp_path, default_trace_path):
    # Every plan charged 20 us: the chooser's modes follow its planner time, which a loaded host
    # (the tests run two at a time) would make differ between the two runs.
    cli_doc = cli_json(cli, tmp_path / "cli.json", ["--trace", default_trace_path,
                                                    "--walk-forward", "4", "--window", "8",
                                                    "--policies", "feplb",
                                                    "--planner-time-us", "20"])
    py_doc = feplb.simulate(default_trace_path, ["feplb"], walk_forward=4, window=8,
                            planner_time_us=20)
    assert len(py_doc["config"]["placement"]["replans"]) == 3
    assert_same(cli_doc, py_doc)

    placement = tmp_path / "placement.json"
    subprocess.run([cli, "place", "--trace", default_trace_path, "--out", str(placement)],
                   check=True, stdout=subprocess.DEVNULL)
    cli_doc = cli_json(cli, tmp_path / "placed.json", ["--trace", default_trace_path,
                                                     "--placement", str(placement),
                                                     "--feplb-dyn-set", "1"])
    py_doc = feplb.simulate(default_trace_path, placement=placement, feplb_dyn_set=1)
    assert py_doc["config"]["placement"]["source"] == "file"
    assert_same(cli_doc, py_doc)


def test_bad_options(default_trace_path, tmp_path):
    t = feplb.Trace.load(default_trace_path)
    with pytest.raises(ValueError, match="policies: unknown policy 'fast'"):
        feplb.simulate(t, ["fast"])
    with pytest.raises(ValueError, match="policies: 'feplb' is listed twice"):
        feplb.simulate(t, ["feplb", "feplb"])
    with pytest.raises(ValueError, match="policies: '' is not a policy name"):
        feplb.simulate(t, "feplb,")
    with pytest.raises(ValueError, match="gpus_per_node: 3 does not divide the trace's num_ranks"):
        feplb.simulate(t, gpus_per_node=3)
    with pytest.raises(ValueError, match="window: only with walk_forward"):
        feplb.simulate(t, window=4)
    with pytest.raises(ValueError, match="--warmup: 16 leaves no step of the trace to measure"):
        feplb.simulate(t, warmup=16)
    with pytest.raises(ValueError, match="warmup: -1 must be at least 0"):
        feplb.simulate(t, warmup=-1)
    with pytest.raises(ValueError, match=r"knob dyn \(--dyn\): -2 is outside \[0, 65536\]"):
        feplb.simulate(t, dyn=-2)
    with pytest.raises(ValueError, match="missing.json: no such file"):
        feplb.simulate(t, placement=tmp_path / "missing.json")
    with pytest.raises(ValueError, match="trace: expected a path"):
        feplb.simulate(42)
    no_shape = feplb.Trace.from_counts([[4, 4], [4, 4]], top_k=1)
    with pytest.raises(ValueError, match="hidden/ffn: the expert shape is unknown"):
        feplb.simulate(no_shape)
