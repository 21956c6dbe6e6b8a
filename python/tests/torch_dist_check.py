"""feplb.torch with one process per GPU over NCCL (run by test_torch_dist.py through torchrun):
forward and backward against the float64 reference on every rank, for static and feplb, and a
short training run whose loss curve is the same with balancing on and off. Exit status 0 when
every check holds; each failure is printed with its rank."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from test_torch import H, REL, TinyMoEModel, reference_grads, rel_l2, routing  # noqa: E402

import feplb.torch as ft  # noqa: E402


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    experts, tokens, top_k = 8 * world, 96, 2
    knobs = {"copy_timing": 0, "min_slice_rows": 8, "slice_align_rows": 8, "tau": 0, "balance_tolerance": 0,
             "max_num_dyn": experts}
    failures = []
    for comm in ("own", "borrow"):
        rt = ft.Runtime(process_group=dist.group.WORLD, num_experts=experts, hidden=H, ffn=128, max_tokens=tokens,
                        max_top_k=top_k, knobs=knobs, comm=comm, timeout_s=60)
        for policy in ("static", "feplb"):
            torch.manual_seed(7)  # the same experts on every rank's copy, then each keeps its own
            full_gu = [(torch.randn(H, 256, device="cuda") / 16).to(torch.bfloat16) for _ in range(experts)]
            full_dn = [(torch.randn(128, H, device="cuda") / 11).to(torch.bfloat16) for _ in range(experts)]
            moe = ft.MoE(rt, top_k, policy=policy)
            mine = range(rank * (experts // world), (rank + 1) * (experts // world))
            with torch.no_grad():
                for i, e in enumerate(mine):
                    moe.gate_up[i].copy_(full_gu[e])
                    moe.down[i].copy_(full_dn[e])
            gen = torch.Generator().manual_seed(3)
            idx, w = routing(gen, world, tokens, experts, top_k, skew=4.0, hot=0)
            hidden = torch.randn(world, tokens, H, generator=gen).cuda().to(torch.bfloat16)
            grad_out = torch.randn(world, tokens, H, generator=gen).cuda().to(torch.bfloat16)
            x = hidden[rank].clone().requires_grad_()
            wr = w[rank].clone().requires_grad_()
            out = moe(x, idx[rank], wr)
            out.backward(grad_out[rank])
            torch.cuda.synchronize()
            ref_out, g = reference_grads(hidden[rank], idx[rank], w[rank], full_gu, full_dn, grad_out[rank])
            checks = {"out": rel_l2(out, ref_out), "d hidden": rel_l2(x.grad, g[0]), "d topk_weight": rel_l2(wr.grad, g[1])}
            total_gu = [torch.zeros(H, 256, dtype=torch.float64, device="cuda") for _ in range(experts)]
            total_dn = [torch.zeros(128, H, dtype=torch.float64, device="cuda") for _ in range(experts)]
            for r in range(world):
                _, gr = reference_grads(hidden[r], idx[r], w[r], full_gu, full_dn, grad_out[r])
                total_gu = [a + b for a, b in zip(total_gu, gr[2:2 + experts])]
                total_dn = [a + b for a, b in zip(total_dn, gr[2 + experts:])]
            for i, e in enumerate(mine):
                if total_gu[e].abs().max() > 0:
                    checks[f"d gate_up {e}"] = rel_l2(moe.gate_up[i].grad, total_gu[e])
                    checks[f"d down {e}"] = rel_l2(moe.down[i].grad, total_dn[e])
            for what, err in checks.items():
                if not err <= REL:
                    failures.append(f"rank {rank} comm={comm} {policy} {what}: rel L2 {err:.3g} > {REL}")
            moved = moe.stats()["rows_moved"]
            print(f"rank {rank} comm={comm} {policy}: {len(checks)} checks, rows moved by this rank {moved}",
                  flush=True)
        # Training: balancing on and off give the same loss curve.
        curves = {}
        for policy in ("static", "feplb"):
            torch.manual_seed(5)
            model = TinyMoEModel(rt, experts, top_k, 2, policy)
            model.bias = torch.zeros(experts, device="cuda")
            model.bias[:3] = 3.0
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            gen = torch.Generator().manual_seed(9 + rank)
            xs = torch.randn(tokens, H, generator=gen).cuda()
            ts = torch.randn(tokens, H, generator=gen).cuda()
            losses = []
            for _ in range(10):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(xs), ts)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            curves[policy] = losses
        for i, (a, b) in enumerate(zip(curves["feplb"], curves["static"])):
            if not abs(a - b) <= 1e-2 * abs(b):
                failures.append(f"rank {rank} comm={comm} training step {i}: {a} vs {b}")
        rt.close()
    for f in failures:
        print("FAILED", f, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
