"""feplb.torch against a plain PyTorch MoE written here (float64 on the same bf16 parameters):
outputs, gradients of hidden, topk_weight and every expert weight, on one GPU (one rank, and
virtual ranks that balance), a training loop with balancing on and off, torch.compile, and bad
input. Skipped where torch with CUDA or the CUDA build (libfeplb_c) is absent.

Tolerance (bf16 inputs and weights, fp32 accumulation, bf16 intermediates and outputs, as the
C++ tests): relative L2 error <= 2e-2 for every output and gradient."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
try:
    import feplb.torch as ft
except ImportError as e:  # no CUDA build of the library here
    pytest.skip(f"feplb.torch unavailable: {e}", allow_module_level=True)

H, F = 256, 128
REL = 2e-2


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-12)).item()


def routing(gen, ranks, tokens, experts, top_k, skew=3.0, hot=None):
    """[ranks, tokens, top_k] distinct experts per token, lognormal popularity; weights sum to 1."""
    pop = torch.exp(skew * torch.randn(experts, generator=gen))
    if hot is not None:
        pop[hot] = pop.sum() * 4
    idx = torch.stack([torch.multinomial(pop.expand(tokens, -1), top_k, generator=gen) for _ in range(ranks)])
    w = torch.rand(ranks, tokens, top_k, generator=gen) + 0.1
    return idx.to(torch.int32).cuda(), (w / w.sum(-1, keepdim=True)).cuda()


def reference(hidden, idx, w, gate_up, down):
    """The MoE in float64: out[t] = sum_k w[t,k] (silu(x G_e) * (x U_e)) D_e, e = idx[t,k]."""
    x = hidden.double()
    out = torch.zeros_like(x)
    for e in range(len(gate_up)):
        t, k = (idx == e).nonzero(as_tuple=True)
        if t.numel() == 0:
            continue
        gu = x[t] @ gate_up[e].double()
        act = torch.nn.functional.silu(gu[:, :F]) * gu[:, F:]
        out.index_add_(0, t, (act @ down[e].double()) * w.double()[t, k].unsqueeze(1))
    return out


def reference_grads(hidden, idx, w, gate_up, down, grad_out):
    leaves = [t.detach().double().requires_grad_() for t in [hidden, w, *gate_up, *down]]
    n = len(gate_up)
    out = reference(leaves[0], idx, leaves[1], leaves[2:2 + n], leaves[2 + n:])
    out.backward(grad_out.double())
    return out.detach(), [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]


def runtime(ranks, experts, tokens, top_k, **kw):
    knobs = {"copy_timing": 0, "min_slice_rows": 8, "slice_align_rows": 8, "tau": 0, "balance_tolerance": 0,
             "max_num_dyn": experts}
    return ft.Runtime(virtual_ranks=ranks, num_experts=experts, hidden=H, ffn=F, max_tokens=tokens,
                      max_top_k=top_k, knobs=knobs, timeout_s=30, **kw)


@pytest.mark.parametrize("ranks,policy,call_thread", [
    (1, "feplb", "off"), (4, "static", "off"), (4, "feplb", "off"), (4, "oracle", "off"), (8, "feplb", "off"),
    (4, "feplb", "on"), (8, "oracle", "on")])
def test_forward_and_backward_match_the_reference(ranks, policy, call_thread):
    """call_thread "on": the runtime's call thread runs the layer's calls (H100/H200 only)."""
    if call_thread == "on" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the call thread needs the grouped GEMMs (compute capability 9.0)")
    experts, tokens, top_k = 16, 64, 2
    gen = torch.Generator().manual_seed(ranks * 10 + len(policy))
    rt = runtime(ranks, experts, tokens, top_k, call_thread=call_thread)
    assert all(i["call_thread"] == (call_thread == "on") for i in rt.info())
    moe = ft.MoE(rt, top_k, policy=policy)
    idx, w = routing(gen, ranks, tokens, experts, top_k, skew=4.0)
    hidden = torch.randn(ranks, tokens, H, generator=gen).cuda().to(torch.bfloat16).requires_grad_()
    w.requires_grad_()
    grad_out = torch.randn(ranks, tokens, H, generator=gen).cuda().to(torch.bfloat16)
    h_in = hidden if ranks > 1 else hidden[0]
    out = moe(h_in, idx if ranks > 1 else idx[0], w if ranks > 1 else w[0])
    out.backward(grad_out if ranks > 1 else grad_out[0])
    torch.cuda.synchronize()
    gu, dn = list(moe.gate_up), list(moe.down)
    dw_gu = torch.zeros(experts, H, 2 * F, dtype=torch.float64, device="cuda")
    dw_dn = torch.zeros(experts, F, H, dtype=torch.float64, device="cuda")
    for r in range(ranks):
        ref_out, g = reference_grads(hidden[r], idx[r], w[r], gu, dn, grad_out[r])
        got_out = out[r] if ranks > 1 else out
        assert rel_l2(got_out, ref_out) <= REL, f"rank {r} out"
        assert rel_l2(hidden.grad[r], g[0]) <= REL, f"rank {r} d hidden"
        assert rel_l2(w.grad[r], g[1]) <= REL, f"rank {r} d topk_weight"
        dw_gu += torch.stack(g[2:2 + experts])
        dw_dn += torch.stack(g[2 + experts:])
    for e in range(experts):
        if dw_gu[e].abs().max() > 0:
            assert rel_l2(gu[e].grad, dw_gu[e]) <= REL, f"expert {e} d gate_up"
            assert rel_l2(dn[e].grad, dw_dn[e]) <= REL, f"expert {e} d down"
    stats = moe.stats()
    stats = stats if isinstance(stats, list) else [stats]
    moved = sum(s["rows_moved"] for s in stats)
    if ranks > 1 and policy != "static":
        assert moved > 0, f"{policy}: skewed routing but nothing moved ({stats[0]})"
    assert sum(stats[0]["rows_per_gpu_after"]) == sum(stats[0]["rows_per_gpu_before"]) == ranks * tokens * top_k


def test_main_grad_is_accumulated_and_grad_left_alone():
    ranks, experts, tokens, top_k = 4, 8, 32, 2
    gen = torch.Generator().manual_seed(5)
    moe = ft.MoE(runtime(ranks, experts, tokens, top_k), top_k)
    for p in moe.parameters():
        p.main_grad = torch.full(p.shape, 1.0, dtype=torch.float32, device=p.device)
    idx, w = routing(gen, ranks, tokens, experts, top_k, hot=3)
    hidden = torch.randn(ranks, tokens, H, generator=gen).cuda().to(torch.bfloat16)
    grad_out = torch.randn(ranks, tokens, H, generator=gen).cuda().to(torch.bfloat16)
    moe(hidden, idx, w).backward(grad_out)
    torch.cuda.synchronize()
    gu, dn = list(moe.gate_up), list(moe.down)
    total = [torch.zeros_like(p, dtype=torch.float64) for p in gu + dn]
    for r in range(ranks):
        _, g = reference_grads(hidden[r], idx[r], w[r], gu, dn, grad_out[r])
        total = [a + b for a, b in zip(total, g[2:])]
    for p, ref in zip(gu + dn, total):
        assert p.grad is None
        if ref.abs().max() > 0:
            assert rel_l2(p.main_grad - 1.0, ref) <= REL


@pytest.mark.parametrize("ranks,main_grad", [(1, False), (1, True), (4, False), (4, True)])
def test_stacked_parameters_match_the_reference(ranks, main_grad):
    """MoE(stacked=True): two parameters, gate_up [n, H, 2F] and down [n, F, H], the same layer:
    outputs and every gradient against the reference; .grad (bf16) or fp32 main_grad."""
    experts, tokens, top_k = 16, 64, 2
    gen = torch.Generator().manual_seed(40 + ranks + main_grad)
    moe = ft.MoE(runtime(ranks, experts, tokens, top_k), top_k, stacked=True)
    assert [tuple(p.shape) for p in moe.parameters()] == [(experts, H, 2 * F), (experts, F, H)]
    if main_grad:
        for p in moe.parameters():
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
    idx, w = routing(gen, ranks, tokens, experts, top_k, skew=4.0, hot=1)
    hidden = torch.randn(ranks, tokens, H, generator=gen).cuda().to(torch.bfloat16)
    grad_out = torch.randn(ranks, tokens, H, generator=gen).cuda().to(torch.bfloat16)
    one = ranks == 1
    out = moe(hidden[0] if one else hidden, idx[0] if one else idx, w[0] if one else w)
    out.backward(grad_out[0] if one else grad_out)
    torch.cuda.synchronize()
    gu, dn = list(moe.gate_up.detach()), list(moe.down.detach())
    dw_gu = torch.zeros(experts, H, 2 * F, dtype=torch.float64, device="cuda")
    dw_dn = torch.zeros(experts, F, H, dtype=torch.float64, device="cuda")
    for r in range(ranks):
        ref_out, g = reference_grads(hidden[r], idx[r], w[r], gu, dn, grad_out[r])
        assert rel_l2(out if one else out[r], ref_out) <= REL, f"rank {r} out"
        dw_gu += torch.stack(g[2:2 + experts])
        dw_dn += torch.stack(g[2 + experts:])
    got_gu = moe.gate_up.main_grad if main_grad else moe.gate_up.grad
    got_dn = moe.down.main_grad if main_grad else moe.down.grad
    if main_grad:
        assert moe.gate_up.grad is None and moe.down.grad is None
    assert rel_l2(got_gu, dw_gu) <= REL, "d gate_up"
    assert rel_l2(got_dn, dw_dn) <= REL, "d down"


def test_bad_input_is_a_clear_error():
    moe = ft.MoE(runtime(1, 4, 16, 2), 2)
    x = torch.randn(8, H, device="cuda").to(torch.bfloat16)
    idx = torch.zeros(8, 2, dtype=torch.int32, device="cuda")
    idx[:, 1] = 1
    w = torch.full((8, 2), 0.5, device="cuda")
    with pytest.raises(ValueError, match="hidden must be bfloat16"):
        moe(x.float(), idx, w)
    with pytest.raises(ValueError, match="hidden is on cpu"):
        moe(x.cpu(), idx, w)
    with pytest.raises(ValueError, match="topk_idx has shape"):
        moe(x, idx[:, :1], w)
    with pytest.raises(ValueError, match="max_tokens"):
        moe(torch.zeros(17, H, device="cuda", dtype=torch.bfloat16), torch.zeros(17, 2, dtype=torch.int32,
                                                                                   device="cuda"),
            torch.zeros(17, 2, device="cuda"))
    bad = idx.clone()
    bad[3, 0] = 7
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        moe(x, bad, w)
        moe.stats()  # one rank counts on the GPU: the layer's next call reports it
    # Non-contiguous inputs are made contiguous.
    wide = torch.zeros(8, 4, dtype=torch.int32, device="cuda")
    wide[:, 2] = 1
    out = moe(x, wide[:, ::2], w)
    assert out.shape == x.shape and torch.isfinite(out.float()).all()


def test_eval_keeps_nothing():
    rt = runtime(1, 4, 16, 2, max_in_flight=2)
    moe = ft.MoE(rt, 2)
    x = torch.randn(8, H, device="cuda").to(torch.bfloat16)
    idx = torch.zeros(8, 2, dtype=torch.int32, device="cuda")
    idx[:, 1] = 1
    w = torch.full((8, 2), 0.5, device="cuda")
    with torch.no_grad():
        for _ in range(5):
            moe(x, idx, w)
    assert rt.info()[0]["micro_batches_in_flight"] == 0


class TinyMoEModel(torch.nn.Module):
    """Residual MoE layers with a learned top-k router: h = h + MoE(LN(h))."""

    def __init__(self, rt, experts, top_k, layers, policy):
        super().__init__()
        self.top_k = top_k
        self.routers = torch.nn.ModuleList(torch.nn.Linear(H, experts, device="cuda") for _ in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(H, device="cuda") for _ in range(layers))
        self.moes = torch.nn.ModuleList(ft.MoE(rt, top_k, policy=policy) for _ in range(layers))

    def forward(self, h):  # h [R, S, H] fp32
        for router, norm, moe in zip(self.routers, self.norms, self.moes):
            x = norm(h)
            logits = router(x) + self.bias
            w, idx = torch.topk(torch.softmax(logits, -1), self.top_k, dim=-1)
            h = h + moe(x.to(torch.bfloat16), idx, w / w.sum(-1, keepdim=True)).float()
        return h


@pytest.mark.parametrize("ranks", [4])
def test_training_gives_the_same_loss_curve_with_balancing_on_and_off(ranks):
    experts, tokens, top_k, layers, steps = 16, 64, 2, 2, 20
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(ranks, tokens, H, generator=gen).cuda()
    target = torch.randn(ranks, tokens, H, generator=gen).cuda()
    bias = torch.zeros(experts, device="cuda")
    bias[:3] = 3.0  # a skewed router: experts 0-2 (rank 0's) get most tokens

    def train(policy):
        torch.manual_seed(3)
        model = TinyMoEModel(runtime(ranks, experts, tokens, top_k), experts, top_k, layers, policy)
        model.bias = bias
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses, moved = [], 0
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            moved += sum(s["rows_moved"] for m in model.moes for s in m.stats())
        return losses, moved

    off, _ = train("static")
    on, moved = train("feplb")
    assert moved > 0, "skewed routing but feplb moved nothing"
    for i, (a, b) in enumerate(zip(on, off)):
        assert math.isfinite(a) and abs(a - b) <= 1e-2 * abs(b), f"step {i}: {a} vs {b}"
    assert off[-1] < 0.98 * off[0], "the loss did not fall"


def test_torch_compile_keeps_one_graph():
    moe = ft.MoE(runtime(1, 4, 32, 2), 2)
    x = torch.randn(32, H, device="cuda").to(torch.bfloat16).requires_grad_()
    gen = torch.Generator().manual_seed(2)
    idx, w = routing(gen, 1, 32, 4, 2)

    def step(x):
        return moe(x, idx[0], w[0]).float().pow(2).sum()

    eager = step(x)
    eager.backward()
    g_eager = x.grad.clone()
    x.grad = None
    for p in moe.parameters():
        p.grad = None
    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(x)
    loss.backward()
    assert rel_l2(loss, eager) <= 1e-3
    assert rel_l2(x.grad, g_eager) <= 1e-2


@pytest.mark.parametrize("ranks,expert_gemm", [(4, "auto"), (1, "per_expert")])
def test_an_uncapturable_call_is_a_clear_error_and_leaves_the_layer_working(ranks, expert_gemm):
    """torch.cuda.graph around a layer that cannot be captured (several ranks; one rank whose
    per-expert GEMMs take their row counts from the host): an error that says so, raised before
    anything is enqueued; the layer then matches the reference outside the capture."""
    experts, tokens, top_k = 8, 32, 2
    moe = ft.MoE(runtime(ranks, experts, tokens, top_k, expert_gemm=expert_gemm), top_k)
    gen = torch.Generator().manual_seed(5)
    idx, w = routing(gen, ranks, tokens, experts, top_k)
    x = torch.randn(ranks, tokens, H, generator=gen).to(torch.bfloat16).cuda()
    if ranks == 1:
        x, idx, w = x[0], idx[0], w[0]
    with torch.no_grad():
        moe(x, idx, w)  # warm: the capture below is the only thing that differs
        graph = torch.cuda.CUDAGraph()
        with pytest.raises((RuntimeError, ValueError), match="being captured into a CUDA graph"):
            with torch.cuda.graph(graph):
                moe(x, idx, w)
        out = moe(x, idx, w)
    gu, dn = list(moe.gate_up), list(moe.down)
    for r in range(ranks):
        got = out[r] if ranks > 1 else out
        ref = reference(x[r] if ranks > 1 else x, idx[r] if ranks > 1 else idx, w[r] if ranks > 1 else w, gu, dn)
        assert rel_l2(got, ref) <= REL, f"rank {r}"


def test_one_rank_forward_and_backward_replay_from_a_cuda_graph():
    """One rank on the grouped GEMMs: forward + backward captured with torch.cuda.graph, replayed
    over routings the capture never saw (copied into the captured inputs): every replay's output
    and gradients (hidden, routing weights, every expert's weights) match the float64 reference
    and are bit for bit those of eager calls on the same inputs (and two eager calls agree)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("a captured layer needs the grouped GEMMs (compute capability 9.0)")
    experts, tokens, top_k = 8, 64, 2
    moe = ft.MoE(runtime(1, experts, tokens, top_k, expert_gemm="grouped"), top_k)
    gen = torch.Generator().manual_seed(21)
    idx, w = routing(gen, 1, tokens, experts, top_k)
    idx, w = idx[0].clone(), w[0].clone().requires_grad_()
    x = torch.randn(tokens, H, generator=gen).cuda().to(torch.bfloat16).requires_grad_()
    dy = torch.randn(tokens, H, generator=gen).cuda().to(torch.bfloat16)
    params = list(moe.gate_up) + list(moe.down)

    def step():
        moe(x, idx, w).backward(dy)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm, as torch.cuda.graph's users do
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in [x, w] + params:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe(x, idx, w)
        out.backward(dy)
    gu, dn = list(moe.gate_up), list(moe.down)
    for case, (skew, hot) in enumerate([(4.0, None), (0.0, None), (1.0, 0), (3.0, None)]):
        new_idx, new_w = routing(gen, 1, tokens, experts, top_k, skew=skew, hot=hot)
        with torch.no_grad():
            idx.copy_(new_idx[0])
            w.copy_(new_w[0])
            x.copy_(torch.randn(tokens, H, generator=gen).cuda().to(torch.bfloat16))
            dy.copy_(torch.randn(tokens, H, generator=gen).cuda().to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        got = [out.clone(), x.grad.clone(), w.grad.clone()] + [p.grad.clone() for p in params]
        ref_out, g = reference_grads(x.detach(), idx, w.detach(), gu, dn, dy)
        assert rel_l2(got[0], ref_out) <= REL, f"case {case} out"
        assert rel_l2(got[1], g[0]) <= REL, f"case {case} d hidden"
        assert rel_l2(got[2], g[1]) <= REL, f"case {case} d topk_weight"
        for e in range(2 * experts):
            if g[2 + e].abs().max() > 0:
                assert rel_l2(got[3 + e], g[2 + e]) <= REL, f"case {case} d weights {e}"
        # The same micro-batch eagerly, twice, into fresh leaves (the graph's gradients stay its own).
        def eager_step():
            x2 = x.detach().clone().requires_grad_()
            w2 = w.detach().clone().requires_grad_()
            saved = [p.grad for p in params]
            for p in params:
                p.grad = None
            out2 = moe(x2, idx, w2)
            out2.backward(dy)
            torch.cuda.synchronize()
            result = [out2, x2.grad, w2.grad] + [p.grad for p in params]
            for p, s in zip(params, saved):
                p.grad = s
            return result

        eager, again = eager_step(), eager_step()
        for i, (a, b, c) in enumerate(zip(got, eager, again)):
            # deterministic layer (an expert's rows keep token order): eager twice, and the replay
            assert torch.equal(b, c), f"case {case}: tensor {i} differs between two eager runs"
            assert torch.equal(a, b), f"case {case}: tensor {i} differs between the replay and eager"


def test_reduce_overhead_compiles_around_the_layer():
    """torch.compile(mode="reduce-overhead") (CUDA graphs) of a step with the layer: the layer is
    left out of the capture, and three compiled steps match eager."""
    moe = ft.MoE(runtime(1, 4, 32, 2), 2)
    gen = torch.Generator().manual_seed(6)
    idx, w = routing(gen, 1, 32, 4, 2)
    x = torch.randn(32, H, device="cuda").to(torch.bfloat16)

    def step(x):
        return moe(x * 2, idx[0], w[0]).float().pow(2).sum()

    with torch.no_grad():
        eager = step(x)
        compiled = torch.compile(step, mode="reduce-overhead")
        for _ in range(3):
            assert rel_l2(compiled(x), eager) <= 1e-3


def test_balancer_on_dispatched_rows_matches_the_reference():
    """Rows a framework dispatched itself (each rank's, grouped by its experts; one hot expert):
    per-row expert outputs, dL/drows and every expert's dL/dW."""
    ranks, experts = 4, 16
    per = experts // ranks
    gen = torch.Generator().manual_seed(21)
    bal = ft.Balancer(runtime(ranks, experts, 512, 1, recv_capacity_rows=1024))
    counts = [[600 if (r == 0 and i == 0) else 16 + 5 * i + 3 * r for i in range(per)] for r in range(ranks)]
    rows = [torch.randn(sum(c), H, generator=gen).cuda().to(torch.bfloat16).requires_grad_() for c in counts]
    grads = [torch.randn(sum(c), H, generator=gen).cuda().to(torch.bfloat16) for c in counts]
    outs = bal(rows, torch.tensor(counts))
    torch.autograd.backward(outs, grads)
    torch.cuda.synchronize()
    gu, dn = list(bal.gate_up), list(bal.down)
    total = [torch.zeros_like(p, dtype=torch.float64) for p in gu + dn]
    for r in range(ranks):
        idx = torch.repeat_interleave(torch.arange(r * per, (r + 1) * per), torch.tensor(counts[r])).cuda()
        ref_out, g = reference_grads(rows[r], idx.view(-1, 1), torch.ones(len(idx), 1, device="cuda"), gu, dn,
                                     grads[r])
        assert rel_l2(outs[r], ref_out) <= REL, f"rank {r} out rows"
        assert rel_l2(rows[r].grad, g[0]) <= REL, f"rank {r} d rows"
        total = [a + b for a, b in zip(total, g[2:])]
    for p, ref in zip(gu + dn, total):
        if ref.abs().max() > 0:
            assert rel_l2(p.grad, ref) <= REL
    assert sum(s["rows_moved"] for s in bal.stats()) > 0, "a hot expert, yet nothing moved"
    with pytest.raises(ValueError, match="summing to"):
        bal(rows, torch.tensor(counts) + 1)
    # Megatron's permuted_probs scale each row's output.
    probs = [torch.rand(sum(c), generator=gen).cuda() for c in counts]
    with torch.no_grad():
        plain = bal(rows, counts)
        scaled = bal(rows, counts, probs)
    for p, a, b in zip(probs, plain, scaled):
        assert rel_l2(b, a.float() * p.unsqueeze(1)) <= 1e-2


def test_balancer_keeps_the_rows_its_backward_reads():
    """The rows given to the forward may be a temporary the caller drops at once (Megatron's rows
    scaled by their probs, a contiguous copy): the backward's dW GEMMs read them again, so the
    layer keeps them. Here they are non-leaf temporaries, deleted after the forward, their memory
    refilled with NaN before the backward; every weight gradient must still match the reference."""
    ranks, experts = 2, 8
    per = experts // ranks
    gen = torch.Generator().manual_seed(23)
    bal = ft.Balancer(runtime(ranks, experts, 512, 1))
    counts = [[20 + 7 * i + r for i in range(per)] for r in range(ranks)]
    rows = [torch.randn(sum(c), H, generator=gen).cuda().to(torch.bfloat16).requires_grad_() for c in counts]
    grads = [torch.randn(sum(c), H, generator=gen).cuda().to(torch.bfloat16) for c in counts]
    temps = [x * 1.0 for x in rows]  # MulBackward by a scalar keeps nothing: only the layer holds these
    outs = bal(temps, torch.tensor(counts))
    del temps
    refill = [torch.full((sum(c), H), float("nan"), device="cuda", dtype=torch.bfloat16)
              for c in counts for _ in range(4)]
    torch.autograd.backward(outs, grads)
    torch.cuda.synchronize()
    del refill
    gu, dn = list(bal.gate_up), list(bal.down)
    total = [torch.zeros_like(p, dtype=torch.float64) for p in gu + dn]
    for r in range(ranks):
        idx = torch.repeat_interleave(torch.arange(r * per, (r + 1) * per), torch.tensor(counts[r])).cuda()
        _, g = reference_grads(rows[r], idx.view(-1, 1), torch.ones(len(idx), 1, device="cuda"), gu, dn, grads[r])
        assert rel_l2(rows[r].grad, g[0]) <= REL, f"rank {r} d rows"
        total = [a + b for a, b in zip(total, g[2:])]
    for i, (p, ref) in enumerate(zip(gu + dn, total)):
        assert torch.isfinite(p.grad).all(), f"weight {i}: the backward read freed rows"
        assert rel_l2(p.grad, ref) <= REL, f"weight {i}"
