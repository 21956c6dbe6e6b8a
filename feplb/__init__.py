"""Not the Python package: this folder holds feplb's C++ sources. Python imports it when it runs in
the repository's root (or a copy of its entries), where this folder is named like the package. It
hands the import over to the real package (python/feplb, built into build/python by
scripts/build) wherever that is on the path, or says how to put it there."""

import importlib.util
import os
import sys

_here = os.path.dirname(os.path.realpath(__file__))


def _real_package():
    for entry in sys.path:
        folder = os.path.join(os.path.abspath(entry or os.curdir), "feplb")
        init = os.path.join(folder, "__init__.py")
        if os.path.realpath(folder) != _here and os.path.isfile(init):
            return folder, init
    return None


_found = _real_package()
if _found is None:
    raise ImportError(
        "feplb: Python found the C++ source folder feplb/ (this directory is the repository's root), "
        "not the Python package: run scripts/python (or PYTHONPATH=build/python python3) from here, "
        "or scripts/install-python once for any directory")
_spec = importlib.util.spec_from_file_location("feplb", _found[1], submodule_search_locations=[_found[0]])
_module = importlib.util.module_from_spec(_spec)
sys.modules["feplb"] = _module  # the import statement returns what sys.modules holds by then
_spec.loader.exec_module(_module)
