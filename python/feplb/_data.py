"""Where the bundled data is: the measured GEMM tables (cost_model="auto") and the default trace.

Looked for as the feplb CLI does: $FEPLB_DATA_DIR, then the package's own copy (feplb/data, when
installed with pip), then an installed feplb's share/feplb/data, then the repository's data/ the
module was built from; a ValueError lists every place looked at when none has it.
"""

from __future__ import annotations

import os

from . import _feplb


def _installed() -> list[str]:
    return [os.path.join(os.path.dirname(__file__), "data")]


def data_search_path() -> list[str]:
    """The places looked at, in order."""
    return _feplb.data_search_path(_installed())


def data_dir() -> str:
    """The first place holding the measured GEMM tables (cost/)."""
    return _feplb.find_data_dir("cost", _installed())


def default_trace_path() -> str:
    """The bundled trace `feplb simulate` replays by default (GLM-5 shape, EP=8, 128 experts)."""
    return _feplb.find_data(os.path.join("traces", "default.json"), _installed())
