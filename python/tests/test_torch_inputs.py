"""Bad input through feplb.torch's modules is a ValueError naming the argument (the Megatron and
Hugging Face adapters have theirs in test_torch_megatron.py and test_torch_hf.py): wrong dtypes,
devices and shapes, expert ids out of range, tokens_per_expert that do not sum to the rows, a
wrong main_grad. Each case also checks the layer still works afterwards. Skipped where torch
with CUDA or the CUDA build (libfeplb_c) is absent."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
try:
    import feplb.torch as ft
except ImportError as e:  # no CUDA build of the library here
    pytest.skip(f"feplb.torch unavailable: {e}", allow_module_level=True)

H, F, E = 256, 128, 4


def runtime(ranks=1, tokens=16, top_k=2):
    return ft.Runtime(virtual_ranks=ranks, num_experts=E, hidden=H, ffn=F, max_tokens=tokens, max_top_k=top_k,
                      timeout_s=30)


def moe_inputs(tokens=8):
    x = torch.randn(tokens, H, device="cuda").to(torch.bfloat16)
    idx = torch.stack([torch.arange(tokens) % E, (torch.arange(tokens) + 1) % E], 1).to(torch.int32).cuda()
    w = torch.full((tokens, 2), 0.5, device="cuda")
    return x, idx, w


@pytest.fixture(scope="module")
def moe():
    return ft.MoE(runtime(), 2)


@pytest.mark.parametrize("case,match", [
    ("hidden_fp32", "MoE: hidden must be bfloat16"),
    ("hidden_cpu", "MoE: hidden is on cpu"),
    ("hidden_3d", "MoE: hidden has shape"),
    ("hidden_wrong_h", "MoE: hidden has shape"),
    ("idx_float", "MoE: topk_idx must be int32 or int64"),
    ("idx_cpu", "MoE: topk_idx is on cpu"),
    ("idx_shape", "MoE: topk_idx has shape"),
    ("idx_out_of_range", r"topk_idx out of range"),
    ("idx_negative", r"topk_idx out of range"),
    ("weight_int", "MoE: topk_weight must be floating point"),
    ("weight_shape", "MoE: topk_weight has shape"),
    ("weight_cpu", "MoE: topk_weight is on cpu"),
    ("too_many_tokens", "max_tokens"),
    ("not_a_tensor", "MoE: hidden must be a tensor"),
])
def test_moe_bad_input(moe, case, match):
    x, idx, w = moe_inputs()
    bad = {
        "hidden_fp32": lambda: moe(x.float(), idx, w),
        "hidden_cpu": lambda: moe(x.cpu(), idx, w),
        "hidden_3d": lambda: moe(x.unsqueeze(0), idx, w),
        "hidden_wrong_h": lambda: moe(x[:, :128].contiguous(), idx, w),
        "idx_float": lambda: moe(x, idx.float(), w),
        "idx_cpu": lambda: moe(x, idx.cpu(), w),
        "idx_shape": lambda: moe(x, idx[:, :1], w),
        "idx_out_of_range": lambda: moe(x, torch.where(idx == 1, E, idx), w),
        "idx_negative": lambda: moe(x, torch.where(idx == 1, -1, idx), w),
        "weight_int": lambda: moe(x, idx, w.to(torch.int32)),
        "weight_shape": lambda: moe(x, idx, w[:4]),
        "weight_cpu": lambda: moe(x, idx, w.cpu()),
        "too_many_tokens": lambda: moe(*moe_inputs(17)),
        "not_a_tensor": lambda: moe(x.tolist(), idx, w),
    }[case]
    with pytest.raises(ValueError, match=match):
        bad()
        # On one rank the layer counts its rows on the GPU: ids out of range are reported by its
        # next call (here the statistics), never silently.
        moe.stats()
    out = moe(x, idx, w)  # still usable
    assert out.shape == x.shape and torch.isfinite(out.float()).all()


@pytest.fixture(scope="module")
def balancer():
    return ft.Balancer(runtime(tokens=32, top_k=1))


@pytest.mark.parametrize("case,match", [
    ("rows_fp32", "Balancer: rows must be bfloat16"),
    ("rows_cpu", "Balancer: rows is on cpu"),
    ("rows_shape", "Balancer: rows has shape"),
    ("counts_sum", "Balancer: tokens_per_expert = .* summing to 10"),
    ("counts_len", "Balancer: tokens_per_expert = .* must be 4 non-negative counts"),
    ("counts_negative", "Balancer: tokens_per_expert = .* non-negative"),
    ("counts_float", "Balancer: tokens_per_expert must hold integers"),
    ("counts_2d", "Balancer: tokens_per_expert must be 1-D"),
    ("probs_shape", "Balancer: probs has shape"),
    ("probs_int", "Balancer: probs must be floating point"),
    ("probs_cpu", "Balancer: probs is on cpu"),
])
def test_balancer_bad_input(balancer, case, match):
    rows = torch.randn(10, H, device="cuda").to(torch.bfloat16)
    counts = torch.tensor([4, 3, 2, 1])
    probs = torch.rand(10, device="cuda")
    bad = {
        "rows_fp32": lambda: balancer(rows.float(), counts),
        "rows_cpu": lambda: balancer(rows.cpu(), counts),
        "rows_shape": lambda: balancer(rows[:, :64], counts),
        "counts_sum": lambda: balancer(rows, counts + 1),
        "counts_len": lambda: balancer(rows, torch.tensor([4, 3, 3])),
        "counts_negative": lambda: balancer(rows, torch.tensor([12, -1, -1, 0])),
        "counts_float": lambda: balancer(rows, counts.float()),
        "counts_2d": lambda: balancer(rows, counts.view(2, 2)),
        "probs_shape": lambda: balancer(rows, counts, probs[:5]),
        "probs_int": lambda: balancer(rows, counts, (probs * 10).to(torch.int64)),
        "probs_cpu": lambda: balancer(rows, counts, probs.cpu()),
    }[case]
    with pytest.raises(ValueError, match=match):
        bad()
    out = balancer(rows, counts.tolist(), probs)
    assert out.shape == rows.shape and torch.isfinite(out.float()).all()


def test_main_grad_of_the_wrong_shape_is_named_and_bf16_main_grad_takes_the_grad_path():
    moe = ft.MoE(runtime(), 2)
    x, idx, w = moe_inputs()
    params = list(moe.parameters())
    for p in params:
        p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
    params[0].main_grad = torch.zeros(3, device="cuda")
    with pytest.raises(ValueError, match=r"main_grad of gate_up\[0\] must be a contiguous tensor of shape"):
        moe(x, idx, w).float().sum().backward()
    # A bf16 main_grad (Megatron's DDP without grad_reduce_in_fp32): .grad gets the gradient and
    # main_grad is left to the framework's hook.
    for p in params:
        p.main_grad = torch.zeros(p.shape, dtype=torch.bfloat16, device="cuda")
        p.grad = None
    moe(x, idx, w).float().sum().backward()
    torch.cuda.synchronize()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in params)
    assert all(float(p.main_grad.abs().max()) == 0.0 for p in params)
