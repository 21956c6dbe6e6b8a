"""feplb.torch: FEPLB's GPU layer in PyTorch training loops (docs/torch.md).

    import torch, torch.distributed as dist, feplb.torch as ft
    rt = ft.Runtime(process_group=dist.group.WORLD, num_experts=64, hidden=2048, ffn=768,
                    max_tokens=4096, max_top_k=8)
    moe = ft.MoE(rt, top_k=8)                      # this rank's experts, nn.Parameters
    out = moe(hidden, topk_idx, topk_weight)       # [S, H] bf16; balanced every call
    out.sum().backward()                           # gradients of hidden, topk_weight, every expert

The layer is the C++ runtime (libfeplb_c, loaded with ctypes: built with the project's CMake,
never against torch's headers) behind torch.library custom ops with fake implementations
(torch.compile keeps one graph) and autograd. Bad input raises ValueError naming the argument;
a CUDA, NCCL or peer failure raises RuntimeError.

Adapters (imported on their own): feplb.torch.megatron (the experts module of Megatron-Core's
MoELayer) and feplb.torch.hf (swap the experts of Hugging Face transformers MoE models).
"""

import torch as _torch

if not hasattr(_torch.library, "custom_op"):
    raise ImportError(
        f"feplb.torch needs torch >= 2.4 (torch.library.custom_op); this is torch {_torch.__version__}"
    )

from ._modules import Balancer, MoE  # noqa: E402
from ._runtime import Runtime  # noqa: E402

__all__ = ["Balancer", "MoE", "Runtime"]
