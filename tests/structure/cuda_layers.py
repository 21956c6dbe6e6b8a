#!/usr/bin/env python3
"""feplb/cuda as a one-way graph of folders: fails on an include that goes up (or sideways into an
unknown folder), on an installed header that includes an internal one or names a type an
internal header defines (a forward declaration included), and on CUDA in the host-only folder. Run by ctest as structure.cuda_layers; `python3 tests/structure/cuda_layers.py [ROOT]`.

The folders, lowest first: each may include its own headers, the installed headers at the top of
feplb/cuda/, feplb/core/, and the folders below it, never one above it.
"""

import pathlib
import re
import sys

LAYERS = [
    "base",  # checks of CUDA/cuBLAS/NCCL return codes, RAII resources, bounded spin waits
    "kernels",  # the device code (CUTLASS only in grouped_gemm*)
    "host",  # host-only logic of the runtime (no CUDA type): step layout, job thread, signal families
    "transport",  # in-process and NCCL transports, peer memory, IPC signals, copy engine, stream ops
    "gemm",  # the expert FFN: grouped GEMMs, per-expert cuBLASLt, the refiner
    "runtime",  # EpRuntime's state and its parts, the signal board, the slot pool
    "program",  # step programs, their builders, the executor that runs them
    "layer",  # MoeLayer: the calls, the scheduler's job
    "capi",  # the C API
]
HOST_ONLY = {"host"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
CUDA_HEADER = re.compile(r"^(cuda|cublas|cudnn|nccl|cutlass|cute)|^(cuda_|cu[A-Z])")
# A type defined at namespace level (not `struct A::B`, a nested type's out-of-line definition).
TYPE_DEFINITION = re.compile(r"^(?:struct|class)\s+(\w+)\s*(?:final\s*)?(?:\{|:(?!:))", re.M)


def internal_types(cuda: pathlib.Path) -> dict:
    """The types internal headers define, each with the header that defines it."""
    types = {}
    for path in sorted(cuda.rglob("*")):
        if path.suffix in {".h", ".cuh"} and path.parent != cuda:
            for name in TYPE_DEFINITION.findall(path.read_text()):
                types.setdefault(name, path.relative_to(cuda))
    return types


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[2])
    cuda = root / "feplb" / "cuda"
    rank = {name: i for i, name in enumerate(LAYERS)}
    errors = []
    hidden = internal_types(cuda)
    for path in sorted(cuda.glob("*.h")):
        code = re.sub(r"//[^\n]*", "", path.read_text())  # names in comments are fine
        for name, where in hidden.items():
            if re.search(rf"\b{name}\b", code):
                errors.append(f"feplb/cuda/{path.name}: an installed header names {name}, "
                              f"internal to feplb/cuda/{where}")
    for path in sorted(cuda.rglob("*")):
        if path.suffix not in {".h", ".cc", ".cu", ".cuh"}:
            continue
        rel = path.relative_to(cuda)
        folder = rel.parts[0] if len(rel.parts) > 1 else None
        if folder is not None and folder not in rank:
            errors.append(f"feplb/cuda/{rel}: folder '{folder}' is not in the layer list")
            continue
        for inc in INCLUDE.findall(path.read_text()):
            parts = inc.split("/")
            if folder in HOST_ONLY and CUDA_HEADER.search(parts[-1]):
                errors.append(f"feplb/cuda/{rel}: includes <{inc}> in a host-only folder")
            if len(parts) < 4 or parts[:2] != ["feplb", "cuda"]:
                continue  # an installed header (feplb/cuda/X.h), feplb/core, or a system header
            target = parts[2]
            if target not in rank:
                errors.append(f"feplb/cuda/{rel}: includes {inc} from an unknown folder")
            elif folder is None:
                errors.append(f"feplb/cuda/{rel}: an installed header includes internal {inc}")
            elif rank[target] > rank[folder]:
                errors.append(f"feplb/cuda/{rel}: {folder}/ includes {inc}, a layer above it")
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} violation(s) of the layers " + " < ".join(LAYERS))
        return 1
    print("feplb/cuda layers: " + " < ".join(LAYERS) + ": every include goes down, "
          "no installed header names an internal type")
    return 0


if __name__ == "__main__":
    sys.exit(main())
