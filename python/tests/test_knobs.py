"""feplb.knobs() is knobs.def: every knob, its type, default, minimum and unit."""

import ctypes
import os
import re
import subprocess

import numpy as np
import pytest

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


# --- One knob parser: the same bad value, the same one-line message from the Python module, the
# CLI and the C API (feplb/core/knobs.h set_knob). ---------------------------------------------

# (knob, the value as Python, as a command-line argument, as JSON (None: JSON has no such
# number), the message).
BAD_KNOBS = [
    ("dyn", 2.5, "2.5", "2.5", "knob dyn (--dyn): 2.5 is not an integer"),
    ("max_num_dyn", -1, "-1", "-1", "knob max_num_dyn (--max-num-dyn): -1 is outside [0, 65536] experts"),
    ("balance_tolerance", 2, "2", "2",
     "knob balance_tolerance (--balance-tolerance): 2 is outside [0, 1] x mean load"),
    ("balance_tolerance", float("inf"), "inf", None,
     "knob balance_tolerance (--balance-tolerance): inf is not a finite number"),
    # Above int64, within JSON's unsigned integers (larger ones JSON parsers read as doubles).
    ("tau", 2**64 - 1, str(2**64 - 1), str(2**64 - 1),
     f"knob tau (--tau): {2**64 - 1} is outside [0, 2^32] rows"),
]


@pytest.mark.parametrize("name, value, text, json_text, message", BAD_KNOBS)
def test_python_and_cli_give_the_same_message(name, value, text, json_text, message):
    counts = np.full((4, 16), 64, dtype=np.int64)
    with pytest.raises(ValueError) as e:
        feplb.plan(counts, shape="glm5-128e", **{name: value})
    assert str(e.value) == message
    flag = "--" + name.replace("_", "-")
    cli = subprocess.run([os.environ["FEPLB_CLI"], "simulate", "--quiet", flag, text],
                         capture_output=True, text=True)
    assert cli.returncode == 2
    assert cli.stderr == f"feplb: error: {message}\n"


def c_api_library():
    """libfeplb_c (built with CUDA), or None: $FEPLB_LIBRARY, else beside the CLI's build."""
    path = os.environ.get("FEPLB_LIBRARY") or os.path.join(
        os.path.dirname(os.environ["FEPLB_CLI"]), "..", "lib", "libfeplb_c.so")
    return path if os.path.isfile(path) else None


@pytest.mark.skipif(c_api_library() is None, reason="libfeplb_c is not built (no nvcc)")
@pytest.mark.parametrize("name, value, text, json_text, message",
                         [k for k in BAD_KNOBS if k[3] is not None])
def test_the_c_api_gives_the_same_message(name, value, text, json_text, message):
    # The config is parsed before any CUDA or NCCL call: a bad knob fails there, so no GPU and
    # no communicator is needed (the pointer is never used).
    lib = ctypes.CDLL(c_api_library())
    lib.feplb_last_error.restype = ctypes.c_char_p
    config = f'{{"ranks": 1, "experts": 8, "hidden": 64, "ffn": 32, "knobs": {{"{name}": {json_text}}}}}'
    out = ctypes.c_void_p()
    rc = lib.feplb_runtime_create_nccl(config.encode(), ctypes.c_void_p(1), 0, None,
                                       ctypes.byref(out))
    assert rc == 1  # FEPLB_INPUT_ERROR
    assert lib.feplb_last_error().decode() == message
    assert not out.value
