"""feplb.knobs() is knobs.def: every knob, its type, default, minimum and unit."""

import re

import numpy as np

import feplb
from conftest import REPO


def parse_knobs_def():
    text = (REPO / "feplb" / "core" / "knobs.def").read_text()
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
    number = r"\s*([-\d.e]+)\s*,"
    maximum = r"\s*[^,]+,"  # a number or a limits:: constant
    pattern = (
        r"FEPLB_KNOB\(\s*(int64_t|double)\s*,\s*(\w+)\s*,"
        + number * 2
        + maximum
        + r'\s*"([^"]*)"'
    )
    return [
        (name, "int" if t == "int64_t" else "float", float(d), float(m), unit)
        for t, name, d, m, unit in re.findall(pattern, text)
    ]


def test_knobs_are_the_declared_ones():
    declared = parse_knobs_def()
    assert len(declared) > 30
    knobs = feplb.knobs()
    assert list(knobs) == [d[0] for d in declared]
    for name, type_, default, minimum, unit in declared:
        k = knobs[name]
        got = (k.name, k.type, k.default, k.minimum, k.unit)
        assert got == (name, type_, default, minimum, unit)
        assert isinstance(k.default, int if type_ == "int" else float)
        assert k.help


def test_overrides_are_applied_and_typed():
    values = feplb._feplb.knobs_with({"dyn": np.int64(6), "copy_gbps": 300, "tau": 64.0})
    assert values["dyn"] == 6 and values["copy_gbps"] == 300.0 and values["tau"] == 64
    assert isinstance(values["copy_gbps"], float) and isinstance(values["tau"], int)
    defaults = feplb._feplb.knobs_with({})
    assert {k: v.default for k, v in feplb.knobs().items()} == defaults


def test_policies():
    assert feplb.policies() == [
        "static", "feplb-paper", "feplb", "fastermoe", "oracle", "eplb", "llep", "moonep"
    ]
