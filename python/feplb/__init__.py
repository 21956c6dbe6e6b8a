"""feplb: FEPLB load balancing for Mixture-of-Experts expert parallelism, from Python.

Planning (the C++ planners on numpy counts), routing traces, and the trace-driven simulator;
no GPU and no torch needed. docs/python.md has examples.

    import feplb, numpy as np
    counts = np.random.default_rng(0).multinomial(4096 * 8, np.ones(64) / 64, size=8)
    p = feplb.plan(counts, "feplb", shape="glm5-128e")   # [ranks, experts] -> Plan
    p.slices.expert, p.slices.gpu, p.slices.rows, p.weight_bytes, p.rows_per_gpu
    feplb.simulate(feplb.Trace.load(feplb.default_trace_path()))["policies"]["feplb"]

Errors: bad input raises ValueError naming the argument (or the file's field); a broken
invariant inside feplb raises RuntimeError. Both carry the C++ message.

`import feplb` raises ImportError at once, with the command that works, where the extension does
not load (another Python than the one scripts/build built it for, or one without numpy).
`feplb.torch` (docs/torch.md) is the GPU layer for PyTorch training loops: it loads the runtime's
C library (libfeplb_c) and needs torch with CUDA, not this package's planning extension, so
`import feplb.torch` works without it.
"""

import os as _os
import sys as _sys


def _importing_torch_layer() -> bool:
    """True while `import feplb.torch` imports this package on its way: feplb.torch loads the GPU
    runtime's C library with ctypes and needs neither the planning extension nor numpy."""
    frame = _sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in ("_find_and_load", "_find_and_load_unlocked"):
            name = frame.f_locals.get("name")
            if isinstance(name, str) and (name == "feplb.torch" or name.startswith("feplb.torch.")):
                return True
        frame = frame.f_back
    return False


def _not_loaded(error: ImportError) -> str:
    """Why `import feplb` failed, and the command that works."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    this = _sys.executable or "this Python"
    # The build tree (scripts/build) records the interpreter it built the extension for; the
    # source tree's python/feplb has no extension, so look for the build beside it.
    for package in (here, _os.path.join(here, "..", "..", "build", "python", "feplb")):
        record = _os.path.join(package, "_built_for.txt")
        if _os.path.isfile(record):
            with open(record, encoding="utf-8") as f:
                built_for = f.read().strip()
            path = _os.path.normpath(_os.path.dirname(package))
            return (
                f"feplb did not load in {this} ({error}): its extension was built for "
                f"{built_for}; run `PYTHONPATH={path} {built_for}` (scripts/python in the "
                f"repository does that), or build for this Python with `PYTHON={this} "
                "scripts/build` (it needs pybind11 and numpy there)"
            )
    return (
        f"feplb did not load in {this} ({error}): its extension (_feplb) is not built here "
        f"({here}); run `scripts/build`, then `scripts/python` (the Python it built for, with "
        "PYTHONPATH=build/python)"
    )


try:
    from ._feplb import LIMITS, ExpertShape, Topology
    from ._data import data_dir, default_trace_path
    from ._plan import Copies, Knob, Plan, Planner, Schedule, Slices, knobs, plan, policies
    from ._simulate import DEFAULT_POLICIES, simulate
    from ._trace import Trace, TraceStep
except ImportError as _error:  # the extension is not built for this interpreter, or no numpy
    if not _importing_torch_layer():
        raise ImportError(_not_loaded(_error)) from None
    # On the way to feplb.torch: the planning API is absent, and says why when used.
    _planning_error = _error

    def __getattr__(name):
        raise ImportError(f"feplb.{name}: {_not_loaded(_planning_error)}")

__version__ = "0.1.0"

__all__ = [
    "Copies",
    "DEFAULT_POLICIES",
    "ExpertShape",
    "Knob",
    "LIMITS",
    "Plan",
    "Planner",
    "Schedule",
    "Slices",
    "Topology",
    "Trace",
    "TraceStep",
    "data_dir",
    "default_trace_path",
    "knobs",
    "plan",
    "policies",
    "simulate",
]
