"""feplb.simulate(): every policy over a trace, the numbers `feplb simulate --json` writes."""

from __future__ import annotations

import json
import os

from . import _args, _data, _feplb
from ._trace import Trace

# `feplb simulate`'s default --policies (tools/feplb/cmd_simulate.cc); a test holds them equal.
DEFAULT_POLICIES = ("static", "feplb-paper", "feplb", "fastermoe", "oracle")


def simulate(
    trace,
    policies=None,
    *,
    gpus_per_node: int = 8,
    warmup: int = 0,
    placement=None,
    walk_forward: int = 0,
    window: int = 0,
    cost_model: str = "auto",
    hidden: int | None = None,
    ffn: int | None = None,
    dtype: str | None = None,
    **knobs,
) -> dict:
    """Plans every step of `trace` (a Trace or a path) with each policy, validates and measures
    the plans, and returns the document `feplb simulate --json` writes for the same options, as
    dicts: {"config": {...}, "policies": {name: {...}}} (fields: docs/metrics.md).

    policies: names from feplb.policies() (default: the CLI's: static, feplb-paper, feplb,
    fastermoe, oracle; static is always added). Keyword arguments are the CLI's flags:
    gpus_per_node, warmup, placement (a feplb-placement-v1 path), walk_forward, window,
    cost_model ("auto", "roofline" or a feplb-gemm-table-v1 path), hidden/ffn/dtype (override
    the trace's expert shape), and any knob of feplb.knobs() by name. Planner timings
    (planner_us_*) and what depends on them (fits_static_window, window_slack_ms_p5,
    copy_exposed_ms*) are measured, so they differ slightly from run to run.
    """
    if not isinstance(trace, Trace):
        trace = Trace.load(_args.path(trace, "trace"))
    if policies is None:
        policies = list(DEFAULT_POLICIES)
    elif isinstance(policies, str):
        policies = policies.split(",")
    else:
        policies = list(policies)
    for p in policies:
        if not isinstance(p, str) or not p:
            raise ValueError(f"policies: {p!r} is not a policy name")
        _args.text(p, "policies")
    cost_model = _args.path(cost_model, "cost_model")
    if dtype is not None:
        _args.text(dtype, "dtype")
    limits = _feplb.LIMITS
    text = _feplb.simulate_json(
        trace._impl,
        policies,
        _args.integer(gpus_per_node, "gpus_per_node", 1, limits["ranks"]),
        _args.integer(warmup, "warmup", 0, limits["step_id"]),
        b"" if placement is None else _args.path(placement, "placement"),
        _args.integer(walk_forward, "walk_forward", 0, limits["step_id"]),
        _args.integer(window, "window", 0, limits["step_id"]),
        cost_model,
        _data.data_dir(),
        0 if hidden is None else _args.integer(hidden, "hidden", 1, limits["expert_dim"]),
        0 if ffn is None else _args.integer(ffn, "ffn", 1, limits["expert_dim"]),
        dtype or "",
        _args.knobs(knobs),
        trace.path or "(in memory)",
    )
    return json.loads(text)
