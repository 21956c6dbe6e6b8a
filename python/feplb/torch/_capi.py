"""The runtime's C API (feplb/cuda/c_api.h) through ctypes: libfeplb_c, loaded once.

Nothing here compiles against torch or a Python's headers, so one build of the library serves
every torch version; tensors cross as device pointers, streams as cudaStream_t handles.
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib

OK, INPUT_ERROR, ERROR = 0, 1, 2

_c_void_p_p = ctypes.POINTER(ctypes.c_void_p)
_c_float_p_p = ctypes.POINTER(ctypes.POINTER(ctypes.c_float))


# The argument structs' fields in c_api.h's order: a forward's are the layer, its weights, the
# call's own fields, the stream and the micro-batch handle (out); a backward's the layer, the
# handle, the weights, its own fields, then the gradients, the mode and the stream.
_WEIGHTS = [("gate_up", _c_void_p_p), ("down", _c_void_p_p), ("num_experts", ctypes.c_int)]


def _forward_fields(*own):
    return [("layer", ctypes.c_void_p), *_WEIGHTS, *own, ("stream", ctypes.c_void_p), ("handle", ctypes.c_int64)]


def _backward_fields(*own):
    return [
        ("layer", ctypes.c_void_p),
        ("handle", ctypes.c_int64),
        *_WEIGHTS,
        *own,
        ("grad_gate_up", _c_void_p_p),
        ("grad_down", _c_void_p_p),
        ("accumulate", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("grad_dtype", ctypes.c_int),  # GRAD_F32 or GRAD_BF16
    ]


GRAD_F32, GRAD_BF16 = 0, 1  # feplb_backward_args.grad_dtype


class ForwardArgs(ctypes.Structure):
    _fields_ = _forward_fields(
        ("hidden", ctypes.c_void_p),
        ("topk_idx", ctypes.c_void_p),
        ("topk_weight", ctypes.c_void_p),
        ("num_tokens", ctypes.c_int64),
        ("out", ctypes.c_void_p),
    )


class BackwardArgs(ctypes.Structure):
    _fields_ = _backward_fields(
        ("grad_out", ctypes.c_void_p),
        ("topk_weight", ctypes.c_void_p),
        ("grad_hidden", ctypes.c_void_p),
        ("grad_topk_weight", ctypes.c_void_p),
    )


class DispatchedForwardArgs(ctypes.Structure):
    _fields_ = _forward_fields(
        ("rows", ctypes.c_void_p),
        ("rows_per_expert", ctypes.POINTER(ctypes.c_int64)),
        ("out_rows", ctypes.c_void_p),
    )


class DispatchedBackwardArgs(ctypes.Structure):
    _fields_ = _backward_fields(("grad_out_rows", ctypes.c_void_p), ("grad_rows", ctypes.c_void_p))


ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p)
DEALLOCATE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p)


class Allocator(ctypes.Structure):
    _fields_ = [("allocate", ALLOCATE), ("deallocate", DEALLOCATE), ("ctx", ctypes.c_void_p)]


def _candidates():
    env = os.environ.get("FEPLB_LIBRARY")
    if env:
        yield pathlib.Path(env)
        return
    here = pathlib.Path(__file__).absolute().parent  # .../feplb/torch (not resolved: build tree links)
    yield here.parent / "lib" / "libfeplb_c.so"      # installed beside the package
    for root in (here.parents[2], here.parents[2] / "build"):  # build/python/..., python/...
        yield root / "lib" / "libfeplb_c.so"


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            return ctypes.CDLL(str(path))
    raise ImportError(
        "feplb.torch: libfeplb_c.so not found (build with CUDA: scripts/build; or set FEPLB_LIBRARY); "
        "looked at " + ", ".join(tried)
    )


lib = _load()

# Signatures several functions share.
_CREATE_RUNTIME = (
    ctypes.c_int,
    [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(Allocator), ctypes.POINTER(ctypes.c_void_p)],
)
_JSON_OUT = (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)])
_SIGNATURES = {
    "feplb_last_error": (ctypes.c_char_p, []),
    "feplb_group_create": (ctypes.c_int, [ctypes.c_int, ctypes.c_double, ctypes.POINTER(ctypes.c_void_p)]),
    "feplb_group_destroy": (None, [ctypes.c_void_p]),
    "feplb_nccl_unique_id": (ctypes.c_int, [ctypes.c_char_p]),
    "feplb_nccl_comm_init": (
        ctypes.c_int,
        [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.POINTER(ctypes.c_void_p)],
    ),
    "feplb_nccl_comm_destroy": (ctypes.c_int, [ctypes.c_void_p]),
    "feplb_runtime_create_inproc": _CREATE_RUNTIME,
    "feplb_runtime_create_nccl": _CREATE_RUNTIME,
    "feplb_runtime_destroy": (None, [ctypes.c_void_p]),
    "feplb_runtime_info_json": _JSON_OUT,
    "feplb_layer_create": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)],
    ),
    "feplb_layer_destroy": (None, [ctypes.c_void_p]),
    "feplb_forward": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ForwardArgs)]),
    "feplb_backward": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(BackwardArgs)]),
    "feplb_forward_dispatched": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(DispatchedForwardArgs)]),
    "feplb_backward_dispatched": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(DispatchedBackwardArgs)]),
    "feplb_handle_drop": (ctypes.c_int, [ctypes.c_int64]),
    "feplb_layer_sync_gradients": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "feplb_layer_stats_json": _JSON_OUT,
}
for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args


def check(code: int) -> None:
    """Raises the Python exception for a C API return code: ValueError for bad input or misuse,
    RuntimeError for a failure of CUDA, NCCL or a peer; the message is the library's."""
    if code == OK:
        return
    message = (lib.feplb_last_error() or b"").decode(errors="replace")
    raise (ValueError if code == INPUT_ERROR else RuntimeError)(message)


def get_json(fn, obj) -> dict:
    """A JSON answer of the library; the buffer grows until it holds the whole text (numbers such
    as a thread's CPU time may lengthen it between two calls)."""
    cap = 4096
    while True:
        buf = ctypes.create_string_buffer(cap)
        need = ctypes.c_size_t(0)
        check(fn(obj, buf, cap, ctypes.byref(need)))
        if need.value <= cap:
            return json.loads(buf.value.decode())
        cap = 2 * need.value


def pointer_array(pointers) -> ctypes.Array:
    return (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
