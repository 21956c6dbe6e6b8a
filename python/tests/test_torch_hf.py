"""feplb.torch.hf inside Hugging Face transformers: Qwen3-MoE, OLMoE and Mixtral causal LMs built
from small configs with random weights (nothing downloaded), in bf16 on one GPU, each copied and
the copy's sparse-MoE experts swapped for feplb's (feplb.torch.hf.swap_experts).

Checks: the swap found every MoE block; each swapped experts module's output and the model's
logits against the original model's (relative L2 <= 3e-2: bf16 everywhere; the original's
experts round each GEMM output and the weighted sum to bf16 where feplb accumulates in fp32, and
a token whose router sees a near tie can pick another expert in a later layer); 5 AdamW steps
with the same loss (<= 1e-2 relative at every step; the router, attention and every expert
train); bad input to a swapped module is a ValueError naming the argument. Skipped with the
reason where transformers, torch with CUDA or the CUDA build of libfeplb_c is absent, and per
model where this transformers lacks it.
"""

import copy

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
try:
    import feplb.torch.hf as fh
except ImportError as e:  # no CUDA build of the library here
    pytest.skip(f"feplb.torch unavailable: {e}", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")

H, FFN, E, K, LAYERS, VOCAB = 256, 128, 8, 2, 2, 512
BATCH, SEQ = 2, 64
REL_OUT, REL_LOSS, STEPS = 3e-2, 1e-2, 5

COMMON = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, hidden_act="silu")
MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=2 * FFN, moe_intermediate_size=FFN, num_experts=E, num_experts_per_tok=K,
                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(intermediate_size=FFN, num_experts=E, num_experts_per_tok=K, norm_topk_prob=False)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=FFN, num_local_experts=E, num_experts_per_tok=K)),
}


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / max(b.norm().item(), 1e-12)).item()


def build(kind, seed=0):
    config_name, model_name, extra = MODELS[kind]
    config_cls, model_cls = getattr(transformers, config_name, None), getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    config = config_cls(**COMMON, **extra)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = model_cls(config)
    model = model.to(torch.bfloat16)
    # Weights with unit-scale activations, so the experts matter to the logits: 1/sqrt(fan_in)
    # for matrices (the last dimension is the input one in these models' layouts), ones for norms.
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1] if "embed" not in name else 1
                p.copy_(torch.randn(p.shape, device="cuda", generator=gen) / fan_in ** 0.5)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()
    return model


@pytest.mark.parametrize("kind", list(MODELS))
def test_swapped_model_matches_the_original(kind):
    ref = build(kind)
    ours = copy.deepcopy(ref)
    swapped = fh.swap_experts(ours, max_tokens=BATCH * SEQ)
    assert len(swapped) == LAYERS, f"{len(swapped)} MoE blocks swapped: {swapped}"
    blocks = dict(ours.named_modules())
    assert all(isinstance(blocks[n].experts, fh.HFExperts) for n in swapped)
    assert not fh.find_moe_blocks(ours), "an MoE block was left unswapped"

    # Each swapped module's output, recorded in both models on the same batch.
    seen = {"ref": {}, "ours": {}}
    hooks = []
    for tag, model in (("ref", ref), ("ours", ours)):
        mods = dict(model.named_modules())
        for n in swapped:
            hooks.append(mods[n].experts.register_forward_hook(
                lambda m, args, out, tag=tag, n=n: seen[tag].__setitem__(n, out.detach().clone())))
    gen = torch.Generator(device="cuda").manual_seed(4)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda", generator=gen)
    with torch.no_grad():
        logits_ref = ref(input_ids=ids).logits
        logits_ours = ours(input_ids=ids).logits
    for h in hooks:
        h.remove()
    for n in swapped:
        assert rel_l2(seen["ours"][n], seen["ref"][n]) <= REL_OUT, f"{kind} {n}: experts output"
    err = rel_l2(logits_ours, logits_ref)
    assert err <= REL_OUT, f"{kind}: logits differ by {err:.3g}"
    for n in swapped:  # feplb's layer ran: every (token, k) pair reached an expert
        s = blocks[n].experts.stats()
        assert sum(s["rows_per_gpu_after"]) == BATCH * SEQ * K

    # A few training steps, same data, same optimizer: same loss.
    losses = {}
    for tag, model in (("ref", ref), ("ours", ours)):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[tag] = []
        for step in range(STEPS):
            opt.zero_grad()
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            losses[tag].append(out.loss.item())
    for i, (a, b) in enumerate(zip(losses["ours"], losses["ref"])):
        assert abs(a - b) <= REL_LOSS * abs(b), f"{kind} step {i}: feplb {a} vs original {b}"
    assert losses["ref"][-1] < losses["ref"][0], f"{kind}: the loss did not fall: {losses['ref']}"
    assert all(p.grad is not None for n, p in ours.named_parameters() if ".experts." in n), \
        "an expert weight got no gradient"


def test_hf_layout_gives_the_models_weights_back():
    ref = build("qwen3_moe")
    ours = copy.deepcopy(ref)
    name = fh.swap_experts(ours, max_tokens=BATCH * SEQ)[0]
    old = dict(ref.named_modules())[name].experts
    gate_up, down = fh.hf_layout(dict(ours.named_modules())[name].experts)
    want_gu, want_dn = fh.read_experts(old)
    assert torch.equal(gate_up.transpose(1, 2), want_gu) and torch.equal(down.transpose(1, 2), want_dn)


@pytest.fixture(scope="module")
def swapped_block():
    model = build("qwen3_moe")
    name = fh.swap_experts(model, max_tokens=BATCH * SEQ)[0]
    return dict(model.named_modules())[name].experts


@pytest.mark.parametrize("case,match", [
    ("hidden_fp32", "HFExperts: hidden_states must be bfloat16"),
    ("hidden_cpu", "HFExperts: hidden_states is on cpu"),
    ("hidden_3d", "HFExperts: hidden_states has shape"),
    ("too_many_tokens", "HFExperts: hidden_states has 129 tokens"),
    ("index_float", "HFExperts: top_k_index must be int32 or int64"),
    ("index_shape", "HFExperts: top_k_index has shape"),
    ("index_out_of_range", "HFExperts: top_k_index: .*out of range"),
    ("weights_int", "HFExperts: top_k_weights must be floating point"),
    ("weights_shape", "HFExperts: top_k_weights has shape"),
])
def test_bad_input_names_the_argument(swapped_block, case, match):
    T = 16
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    idx = torch.stack([torch.arange(T) % E, (torch.arange(T) + 3) % E], 1).cuda()
    w = torch.full((T, K), 0.5, device="cuda").to(torch.bfloat16)
    m = swapped_block
    bad = {
        "hidden_fp32": lambda: m(x.float(), idx, w),
        "hidden_cpu": lambda: m(x.cpu(), idx, w),
        "hidden_3d": lambda: m(x.view(2, 8, H), idx, w),
        "too_many_tokens": lambda: m(torch.zeros(129, H, device="cuda", dtype=torch.bfloat16),
                                     torch.zeros(129, K, device="cuda", dtype=torch.int64),
                                     torch.zeros(129, K, device="cuda")),
        "index_float": lambda: m(x, idx.float(), w),
        "index_shape": lambda: m(x, idx[:, :1], w),
        "index_out_of_range": lambda: m(x, torch.where(idx == 2, E + 5, idx), w),
        "weights_int": lambda: m(x, idx, w.to(torch.int64)),
        "weights_shape": lambda: m(x, idx, w[:3]),
    }[case]
    with pytest.raises(ValueError, match=match):
        bad()
    out = m(x, idx, w)
    assert out.shape == x.shape and torch.isfinite(out.float()).all()


def test_a_model_without_moe_blocks_is_refused():
    with pytest.raises(ValueError, match="no transformers sparse-MoE block"):
        fh.swap_experts(torch.nn.Sequential(torch.nn.Linear(8, 8)), max_tokens=16)
