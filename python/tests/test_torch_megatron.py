"""feplb.torch.megatron inside Megatron-Core: an MoELayer built with FEPLB's experts module
against the same MoELayer with Megatron's own SequentialMLP (local spec, no TransformerEngine),
same router and expert weights, at world size 1 (torch.distributed over NCCL, one rank;
parallel_state.initialize_model_parallel()).

Checks: the layer's output and the gradients of its input, router weight and every expert weight
(bf16 .grad); the same with the default builder, whose runtime is made over Megatron's expert
parallel group (NCCL); 20 training steps under Megatron's DistributedDataParallel (fp32
main_grad, overlap_grad_reduce: FEPLB adds the expert gradients into main_grad and gives the
grad hook its placeholder, as Megatron's own layers do) with the same loss curve; bad input.

Tolerances (bf16 weights and activations; Megatron scales the SwiGLU activation by the prob
before fc2 (in fp32, rounded to bf16), FEPLB scales the expert output (the prob rounded to bf16);
both accumulate GEMMs in fp32): relative L2 <= 2e-2 for outputs and gradients, <= 5e-2 for the
router weight's gradient (the softmax's backward subtracts nearly equal terms); losses within
2e-2 relative at every step. The measured errors go to $FEPLB_TORCH_NOTES when it is set.

Megatron's Router makes its weight on the CPU and moves it at its first forward, its experts'
weights are made on the GPU: build_pair moves both layers to the GPU before drawing weights (run
29 failed there: a CUDA generator drawing for a CPU parameter).

Needs Megatron-Core importable (PYTHONPATH=.megatron-lm: NVIDIA/Megatron-LM's megatron/ package,
docs/torch.md pins the commit), torch with CUDA and the CUDA build of libfeplb_c; skipped
with the reason otherwise.
"""

import math
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
try:
    import feplb.torch as ft
    import feplb.torch.megatron as fm
except ImportError as e:  # no CUDA build of the library here
    pytest.skip(f"feplb.torch unavailable: {e}", allow_module_level=True)
pytest.importorskip("megatron.core", reason="Megatron-Core is not importable (put NVIDIA/Megatron-LM's megatron/ "
                                            "package on PYTHONPATH, e.g. PYTHONPATH=.megatron-lm)")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.models.backends import LocalSpecProvider  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

H, F_, E, K = 256, 192, 8, 2  # 2F != H: a transposed weight copy is a shape error, not a silent one
SEQ, BATCH = 64, 2
TOKENS = SEQ * BATCH
REL, REL_ROUTER, REL_LOSS = 2e-2, 5e-2, 2e-2


def note(line):
    """A measured number for the record: printed, and appended to $FEPLB_TORCH_NOTES when set
    (scripts/gpu-torch collects them into its summary)."""
    print(line)
    path = os.environ.get("FEPLB_TORCH_NOTES")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-12)).item()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    torch.cuda.set_device(0)
    created = False
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("pg") / "store"
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        created = True
    parallel_state.initialize_model_parallel()  # tensor, pipeline and expert parallel sizes 1
    model_parallel_cuda_manual_seed(123)
    yield
    torch.cuda.synchronize()
    parallel_state.destroy_model_parallel()
    if created:
        dist.destroy_process_group()


def make_config(**kw):
    base = dict(num_layers=1, hidden_size=H, ffn_hidden_size=F_, moe_ffn_hidden_size=F_, num_attention_heads=4,
                num_moe_experts=E, moe_router_topk=K, moe_token_dispatcher_type="alltoall",
                moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_grouped_gemm=False,
                gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, bias_activation_fusion=False,
                bf16=True, params_dtype=torch.bfloat16, moe_router_dtype="fp32", hidden_dropout=0.0,
                attention_dropout=0.0)
    base.update(kw)
    return TransformerConfig(**base)


def make_runtime():
    return ft.Runtime(virtual_ranks=1, num_experts=E, hidden=H, ffn=F_, max_tokens=TOKENS, max_top_k=K, timeout_s=30)


def build_pair(config, builder):
    """Megatron's MoELayer with SequentialMLP, and one with FEPLB's experts: same router, same experts."""
    torch.manual_seed(5)
    ref = MoELayer(config, MoESubmodules(experts=LocalSpecProvider().grouped_mlp_modules(False)), layer_number=1)
    ours = MoELayer(config, MoESubmodules(experts=builder), layer_number=1)
    assert type(ref.experts).__name__ == "SequentialMLP"
    assert isinstance(ours.experts, fm.FeplbExperts)
    # Megatron's Router makes its weight on the CPU (gating() moves it to the GPU at the first
    # forward) while ColumnParallelLinear makes the experts' weights on the GPU: both layers go to
    # the GPU first, then every weight is drawn on the GPU and copied in.
    ref.cuda()
    ours.cuda()
    # Unit-scale activations (Megatron's default std 0.02 would make the experts' output a few
    # percent of its input): 1/sqrt(fan_in) for the router and every expert weight.
    gen = torch.Generator(device="cuda").manual_seed(6)
    with torch.no_grad():
        for p in (ref.router.weight, *(w for m in ref.experts.local_experts
                                       for w in (m.linear_fc1.weight, m.linear_fc2.weight))):
            p.copy_(torch.randn(p.shape, device="cuda", generator=gen) / p.shape[1] ** 0.5)
    ours.router.load_state_dict(ref.router.state_dict())
    fm.copy_from_sequential_mlp(ours.experts, ref.experts)
    where = {n: p.device for layer in (ref, ours) for n, p in layer.named_parameters() if not p.is_cuda}
    assert not where, f"parameters left off the GPU: {where}"
    return ref, ours


def inputs(seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(SEQ, BATCH, H, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.randn(SEQ, BATCH, H, device="cuda", generator=gen).to(torch.bfloat16)
    return x, g


def forward_backward(layer, x, g):
    xi = x.detach().clone().requires_grad_()
    out, bias = layer(xi)
    assert bias is None
    out.backward(g)
    torch.cuda.synchronize()
    return out.detach(), xi.grad


def compare_layers(ref, ours, what):
    x, g = inputs()
    out_r, dx_r = forward_backward(ref, x, g)
    out_o, dx_o = forward_backward(ours, x, g)
    errs = {"output": rel_l2(out_o, out_r), "d input": rel_l2(dx_o, dx_r),
            "d router weight": rel_l2(ours.router.weight.grad, ref.router.weight.grad)}
    for i, mlp in enumerate(ref.experts.local_experts):
        w1, w2 = mlp.linear_fc1.weight, mlp.linear_fc2.weight
        if w1.grad is None or w1.grad.abs().max() == 0:
            continue  # no token routed to expert i
        errs[f"expert {i} d gate_up"] = rel_l2(ours.experts.gate_up[i].grad, w1.grad.t())
        errs[f"expert {i} d down"] = rel_l2(ours.experts.down[i].grad, w2.grad.t())
    worst_expert = max((v for k, v in errs.items() if k.startswith("expert")), default=float("nan"))
    note(f"megatron {what}: relative L2 vs SequentialMLP: output {errs['output']:.2e}, d input "
         f"{errs['d input']:.2e}, d router weight {errs['d router weight']:.2e}, worst expert weight "
         f"gradient {worst_expert:.2e}")
    for key, err in errs.items():
        assert err <= (REL_ROUTER if key == "d router weight" else REL), f"{key}: {err:.3g}"
    routed = sum(int(m.linear_fc1.weight.grad is not None and m.linear_fc1.weight.grad.abs().max() > 0)
                 for m in ref.experts.local_experts)
    assert routed >= E // 2, f"only {routed} of {E} experts got tokens"


def test_weights_copy_both_ways(world):
    ref, ours = build_pair(make_config(), fm.experts_builder(make_runtime()))
    assert tuple(ours.experts.gate_up[0].shape) == (H, 2 * F_) and tuple(ours.experts.down[0].shape) == (F_, H)
    w1 = ref.experts.local_experts[3].linear_fc1.weight.detach().clone()
    # gate rows of linear_fc1 are gate_up's first F columns.
    assert torch.equal(ours.experts.gate_up[3][:, :F_], w1[:F_].t())
    assert torch.equal(ours.experts.gate_up[3][:, F_:], w1[F_:].t())
    with torch.no_grad():
        for p in ref.experts.parameters():
            p.zero_()
    fm.copy_to_sequential_mlp(ours.experts, ref.experts)
    assert torch.equal(ref.experts.local_experts[3].linear_fc1.weight, w1)
    assert torch.equal(ref.experts.local_experts[5].linear_fc2.weight, ours.experts.down[5].t())


def test_moe_layer_with_feplb_experts_matches_sequential_mlp(world):
    ref, ours = build_pair(make_config(), fm.experts_builder(make_runtime()))
    compare_layers(ref, ours, "MoELayer, one virtual rank")
    s = ours.experts.stats()
    assert sum(s["rows_per_gpu_before"]) == TOKENS * K


def test_default_builder_runs_over_megatrons_expert_parallel_group(world):
    """The runtime made from pg_collection.ep (NCCL, world size 1), torch's caching allocator."""
    builder = fm.experts_builder(max_tokens=TOKENS, timeout_s=30)
    ref, ours = build_pair(make_config(), builder)
    rt = builder.runtime()
    assert rt is ours.experts.runtime and rt.world_size == 1 and rt.local_ranks == 1
    compare_layers(ref, ours, "MoELayer, default builder (expert-parallel group, NCCL)")


class Residual(torch.nn.Module):
    def __init__(self, moe):
        super().__init__()
        self.moe = moe

    def forward(self, h):
        out, _ = self.moe(h)
        return h + out


def test_training_under_megatron_ddp_gives_the_same_loss_curve(world):
    config = make_config()
    ref, ours = build_pair(config, fm.experts_builder(make_runtime()))
    gen = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randn(SEQ, BATCH, H, device="cuda", generator=gen).to(torch.bfloat16)
    target = torch.randn(SEQ, BATCH, H, device="cuda", generator=gen)
    models = {}
    for name, layer in (("megatron", ref), ("feplb", ours)):
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True)
        models[name] = DistributedDataParallel(config, ddp_config, Residual(layer))
    expert_params = list(ours.experts.parameters())
    assert all(p.main_grad.dtype == torch.float32 for p in expert_params)

    def step_all(steps):
        curves = {}
        for name, ddp in models.items():
            params = [p for p in ddp.module.parameters() if p.requires_grad]
            masters = [p.detach().float().clone() for p in params]
            opt = torch.optim.Adam(masters, lr=1e-3)
            losses = []
            for step in range(steps):
                ddp.zero_grad_buffer()
                loss = F.mse_loss(ddp(x).float(), target)
                loss.backward()
                ddp.finish_grad_sync()
                if step == 0:
                    first = {id(p): p.main_grad.clone() for p in params}
                    if name == "feplb":
                        # FEPLB wrote main_grad itself and the DDP hook took its placeholder.
                        assert all(p.grad_added_to_main_grad and p.grad is None for p in expert_params)
                    curves[name + "_first_grads"] = (params, first)
                for p, m in zip(params, masters):
                    m.grad = p.main_grad
                opt.step()
                with torch.no_grad():
                    for p, m in zip(params, masters):
                        p.copy_(m)
                losses.append(loss.item())
            curves[name] = losses
        return curves

    curves = step_all(20)
    # The first backward's main_grad: the experts' (FEPLB's fp32 accumulation vs Megatron's hook
    # adding bf16 .grad) and the router's.
    (_, g_ref), (_, g_ours) = curves["megatron_first_grads"], curves["feplb_first_grads"]
    for i, mlp in enumerate(ref.experts.local_experts):
        r1 = g_ref[id(mlp.linear_fc1.weight)]
        if r1.abs().max() == 0:
            continue
        assert rel_l2(g_ours[id(ours.experts.gate_up[i])], r1.t()) <= REL, f"expert {i} main_grad gate_up"
        assert rel_l2(g_ours[id(ours.experts.down[i])], g_ref[id(mlp.linear_fc2.weight)].t()) <= REL
    assert rel_l2(g_ours[id(ours.router.weight)], g_ref[id(ref.router.weight)]) <= REL_ROUTER
    a, b = curves["feplb"], curves["megatron"]
    note(f"megatron DDP training, 20 steps: loss {b[0]:.5f} -> {b[-1]:.5f} (Megatron), {a[0]:.5f} -> {a[-1]:.5f} "
         f"(feplb); largest relative difference {max(abs(x_ - y_) / abs(y_) for x_, y_ in zip(a, b)):.2e}")
    for i, (x_, y_) in enumerate(zip(a, b)):
        assert math.isfinite(x_) and abs(x_ - y_) <= REL_LOSS * abs(y_), f"step {i}: feplb {x_} vs megatron {y_}"
    assert b[-1] < 0.98 * b[0], f"the loss did not fall: {b}"


@pytest.fixture(scope="module")
def experts(world):
    config = make_config()
    return fm.FeplbExperts(E, config, runtime=make_runtime())


@pytest.mark.parametrize("case,match", [
    ("input_fp32", "FeplbExperts: dispatched_input must be bfloat16"),
    ("input_cpu", "FeplbExperts: dispatched_input is on cpu"),
    ("input_shape", "FeplbExperts: dispatched_input has shape"),
    ("counts_sum", "FeplbExperts: tokens_per_expert = .* summing to 24"),
    ("counts_len", "FeplbExperts: tokens_per_expert = .* must be 8 non-negative counts"),
    ("counts_negative", "FeplbExperts: tokens_per_expert = .* non-negative"),
    ("counts_float", "FeplbExperts: tokens_per_expert must hold integers"),
    ("probs_shape", "FeplbExperts: permuted_probs has shape"),
    ("probs_int", "FeplbExperts: permuted_probs must be floating point"),
    ("probs_cpu", "FeplbExperts: permuted_probs is on cpu"),
    ("zero_copy_buffer", "FeplbExperts: output_buffer is not supported"),
])
def test_bad_input_names_the_argument(experts, case, match):
    x = torch.randn(24, H, device="cuda").to(torch.bfloat16)
    counts = torch.tensor([3] * E)
    probs = torch.rand(24, device="cuda")
    bad = {
        "input_fp32": lambda: experts(x.float(), counts, probs),
        "input_cpu": lambda: experts(x.cpu(), counts, probs),
        "input_shape": lambda: experts(x[:, :32], counts, probs),
        "counts_sum": lambda: experts(x, counts + 1, probs),
        "counts_len": lambda: experts(x, torch.tensor([3] * (E - 1) + [0, 3]), probs),
        "counts_negative": lambda: experts(x, torch.tensor([27, -3] + [0] * (E - 2)), probs),
        "counts_float": lambda: experts(x, counts.float(), probs),
        "probs_shape": lambda: experts(x, counts, probs[:, None]),
        "probs_int": lambda: experts(x, counts, torch.ones(24, dtype=torch.int64, device="cuda")),
        "probs_cpu": lambda: experts(x, counts, probs.cpu()),
        "zero_copy_buffer": lambda: experts(x, counts, probs, output_buffer=torch.empty_like(x)),
    }[case]
    with pytest.raises(ValueError, match=match):
        bad()
    out, bias = experts(x, counts, probs)
    assert bias is None and out.shape == x.shape and torch.isfinite(out.float()).all()


@pytest.mark.parametrize("field,value,match", [
    ("gated_linear_unit", False, "config.gated_linear_unit must be True"),
    ("activation_func", F.gelu, "config.activation_func must be torch.nn.functional.silu"),
    ("add_bias_linear", True, "config.add_bias_linear must be False"),
    ("params_dtype", torch.float32, "config.params_dtype must be torch.bfloat16"),
])
def test_configs_feplb_cannot_run_are_refused(world, field, value, match):
    with pytest.raises(ValueError, match=match):
        fm.FeplbExperts(E, make_config(**{field: value}), runtime=make_runtime())


def test_a_runtime_of_another_shape_is_refused(world):
    with pytest.raises(ValueError, match="num_local_experts is 4, the runtime's is 8"):
        fm.FeplbExperts(4, make_config(), runtime=make_runtime())
    with pytest.raises(ValueError, match="give max_tokens"):
        fm.experts_builder()(E, make_config())
