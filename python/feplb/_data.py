"""Where the bundled data is: the measured GEMM table (cost_model="auto") and the default trace."""

from __future__ import annotations

import os

from . import _feplb


def data_dir() -> str:
    """The folder holding cost/h200-glm5.json and traces/default.json: the package's own copy
    when installed with pip, else the repository's data/ folder the module was built from."""
    packaged = os.path.join(os.path.dirname(__file__), "data")
    if os.path.isdir(packaged):
        return packaged
    return _feplb.BUILD_DATA_DIR


def default_trace_path() -> str:
    """The bundled trace `feplb simulate` replays by default (GLM-5 shape, EP=8, 128 experts)."""
    return os.path.join(data_dir(), "traces", "default.json")
