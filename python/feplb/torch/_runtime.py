"""feplb.torch.Runtime: one rank's feplb runtime (or R virtual ranks' runtimes in this process),
and the layers made from it. The C objects live here; the modules and ops only use them."""

from __future__ import annotations

import ctypes
import json
import threading

import torch

from . import _capi
from ._capi import check, lib


def _run_on_threads(n, fn):
    """fn(r) for r in range(n) on n threads (collective C calls block until every rank arrives);
    the first failure is raised."""
    if n == 1:
        return [fn(0)]
    results, errors = [None] * n, [None] * n

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results


class _TorchAllocator:
    """Saved activations from torch's caching allocator, so torch accounts for them."""

    def __init__(self, device: int):
        self.device = device

        def allocate(nbytes, stream, _ctx):
            try:
                return torch.cuda.caching_allocator_alloc(int(nbytes), self.device, int(stream or 0))
            except Exception:  # noqa: BLE001 - the runtime reports the null as out of memory
                return None

        def deallocate(ptr, _nbytes, _stream, _ctx):
            torch.cuda.caching_allocator_delete(int(ptr))

        self._allocate = _capi.ALLOCATE(allocate)  # kept alive as long as the runtime
        self._deallocate = _capi.DEALLOCATE(deallocate)
        self.c = _capi.Allocator(self._allocate, self._deallocate, None)


class Runtime:
    """The feplb runtime of this process: one rank of an expert-parallel group (a torch.distributed
    process group with NCCL), or `virtual_ranks` ranks on this GPU for testing.

    Every rank creates its Runtime with the same arguments and then its layers in the same order.
    Expert e lives on rank e // (num_experts / ranks). `knobs` are feplb's planner knobs by name
    (feplb.knobs() lists them). Saved activations come from torch's caching allocator
    (`allocator="torch"`, the default with a process group) or the runtime's own pool
    (`"runtime"`, the default for virtual ranks). `expert_gemm`: "auto" (grouped GEMMs whose sizes
    the GPU reads, on H100/H200; one cuBLAS GEMM per expert elsewhere), "grouped" or "per_expert";
    `info()` says which runs. `call_thread`: "off" (the default), "on" or "auto": the layers' calls
    run on a thread of the runtime's own, so this thread queues them and returns without waiting
    for the routing's counts (several ranks, H100/H200, `allocator="runtime"`: torch's allocator
    would be called from that thread; docs/gpu.md "The call thread").
    """

    def __init__(self, *, num_experts: int, hidden: int, ffn: int, max_tokens: int, max_top_k: int = 8,
                 process_group=None, virtual_ranks: int | None = None, gpus_per_node: int | None = None,
                 knobs: dict | None = None, training: bool = True, timing: bool = False,
                 timeout_s: float = 60.0, max_in_flight: int = 16, recv_capacity_rows: int = 0,
                 guest_capacity_rows: int = 0, comm: str = "own", allocator: str | None = None,
                 name: str = "feplb", expert_gemm: str = "auto", call_thread: str = "off"):
        if not torch.cuda.is_available():
            raise RuntimeError("feplb.torch: torch sees no CUDA device")
        if (process_group is None) == (virtual_ranks is None):
            raise ValueError("Runtime: give process_group (one rank per process) or virtual_ranks (testing), "
                             "not both nor neither")
        self.device = torch.cuda.current_device()
        self._objects = []  # C objects to free, in creation order
        self._comm = None
        if process_group is not None:
            import torch.distributed as dist

            if dist.get_backend(process_group) != "nccl":
                raise ValueError(f"Runtime: process_group must use the NCCL backend, not "
                                 f"'{dist.get_backend(process_group)}'")
            self.world_size = dist.get_world_size(process_group)
            self.local_ranks = 1
            self.ranks = [dist.get_rank(process_group)]
        else:
            if not isinstance(virtual_ranks, int) or virtual_ranks < 1:
                raise ValueError(f"Runtime: virtual_ranks must be a positive int, not {virtual_ranks!r}")
            self.world_size = virtual_ranks
            self.local_ranks = virtual_ranks
            self.ranks = list(range(virtual_ranks))
        if num_experts % self.world_size:
            raise ValueError(f"Runtime: num_experts {num_experts} is not a multiple of the {self.world_size} ranks")
        self.num_experts, self.hidden, self.ffn = num_experts, hidden, ffn
        self.max_tokens, self.max_top_k = max_tokens, max_top_k
        self.experts_per_rank = num_experts // self.world_size
        self.training = training
        config = {
            "ranks": self.world_size, "gpus_per_node": gpus_per_node or self.world_size,
            "experts": num_experts, "hidden": hidden, "ffn": ffn, "max_top_k": max_top_k,
            "max_tokens": max_tokens, "knobs": dict(knobs or {}), "training": training, "timing": timing,
            "timeout_s": timeout_s, "max_in_flight": max_in_flight, "recv_capacity_rows": recv_capacity_rows,
            "guest_capacity_rows": guest_capacity_rows, "name": name, "expert_gemm": expert_gemm,
            "call_thread": call_thread,
        }
        text = json.dumps(config).encode()
        choice = allocator or ("torch" if process_group is not None else "runtime")
        if choice not in ("torch", "runtime"):
            raise ValueError(f"Runtime: allocator must be 'torch' or 'runtime', not {choice!r}")
        if call_thread != "off" and choice == "torch":
            raise ValueError("Runtime: call_thread needs allocator='runtime' (torch's allocator would be "
                             "called from the runtime's call thread)")
        self._allocator = _TorchAllocator(self.device) if choice == "torch" else None
        alloc = ctypes.byref(self._allocator.c) if self._allocator else None
        if process_group is not None:
            comm_ptr = self._communicator(process_group, comm, timeout_s)
            rt = ctypes.c_void_p()
            check(lib.feplb_runtime_create_nccl(text, comm_ptr, self.device, alloc, ctypes.byref(rt)))
            self._runtimes = [rt]
        else:
            group = ctypes.c_void_p()
            check(lib.feplb_group_create(virtual_ranks, timeout_s, ctypes.byref(group)))
            self._group = group

            def create(r):
                torch.cuda.set_device(self.device)
                rt = ctypes.c_void_p()
                check(lib.feplb_runtime_create_inproc(text, group, r, alloc, ctypes.byref(rt)))
                return rt

            self._runtimes = _run_on_threads(virtual_ranks, create)
        self._layers = 0
        # Virtual ranks run on streams of their own (they wait for each other inside the layer).
        self.streams = [torch.cuda.Stream(device=self.device) for _ in range(self.local_ranks)] \
            if self.local_ranks > 1 else None

    def _communicator(self, pg, comm: str, timeout_s: float):
        import torch.distributed as dist

        if comm == "borrow":  # the process group's own NCCL communicator, after a first collective
            dist.barrier(group=pg, device_ids=[self.device])
            return ctypes.c_void_p(pg._get_backend(torch.device("cuda"))._comm_ptr())
        if comm != "own":
            raise ValueError(f"Runtime: comm must be 'own' or 'borrow', not {comm!r}")
        # A communicator of feplb's own, from a unique id rank 0 makes and the group broadcasts.
        uid = ctypes.create_string_buffer(128)
        if dist.get_rank(pg) == 0:
            check(lib.feplb_nccl_unique_id(uid))
        box = [uid.raw]
        dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0), group=pg)
        out = ctypes.c_void_p()
        check(lib.feplb_nccl_comm_init(box[0], self.world_size, dist.get_rank(pg), self.device, timeout_s,
                                       ctypes.byref(out)))
        self._comm = out
        return out

    def make_layers(self, top_k: int, policy: str, name: str):
        """This process's C layers (one per local rank), in creation order on every rank."""
        if not 1 <= top_k <= self.max_top_k:
            raise ValueError(f"top_k {top_k}: the runtime's max_top_k is {self.max_top_k}")
        self._layers += 1

        def create(r):
            out = ctypes.c_void_p()
            check(lib.feplb_layer_create(self._runtimes[r], top_k, name.encode(), policy.encode(),
                                         ctypes.byref(out)))
            return out

        return [create(r) for r in range(self.local_ranks)]

    def info(self) -> list[dict]:
        """Per local rank: workspace and saved bytes, micro-batches in flight, scheduler CPU time."""
        return [_capi.get_json(lib.feplb_runtime_info_json, rt) for rt in self._runtimes]

    def close(self):
        """Frees the runtimes (layers made from them then fail with ValueError) and feplb's own
        communicator. Called when the object is collected."""
        for rt in getattr(self, "_runtimes", []):
            lib.feplb_runtime_destroy(rt)
        self._runtimes = []
        if getattr(self, "_group", None):
            lib.feplb_group_destroy(self._group)
            self._group = None
        if getattr(self, "_comm", None):
            lib.feplb_nccl_comm_destroy(self._comm)
            self._comm = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
