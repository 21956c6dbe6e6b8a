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

`feplb.torch` (docs/torch.md) is the GPU layer for PyTorch training loops: it loads the runtime's
C library (libfeplb_c) and needs torch with CUDA, not this package's planning extension.
"""

try:
    from ._feplb import ExpertShape, Topology
    from ._data import data_dir, default_trace_path
    from ._plan import Copies, Knob, Plan, Planner, Slices, knobs, plan, policies
    from ._simulate import DEFAULT_POLICIES, simulate
    from ._trace import Trace, TraceStep
except ImportError as _error:  # the planning extension is not built for this interpreter
    _planning_error = _error

    def __getattr__(name):
        raise ImportError(
            f"feplb.{name} needs the _feplb extension, which did not load for this Python "
            f"({_planning_error}); build it with FEPLB_PYTHON=ON for this interpreter. "
            "feplb.torch does not need it."
        )

__version__ = "0.1.0"

__all__ = [
    "Copies",
    "DEFAULT_POLICIES",
    "ExpertShape",
    "Knob",
    "Plan",
    "Planner",
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
