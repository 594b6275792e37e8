"""baracuda_torch.integrations.huggingface.apply_baracuda on tiny transformers models
(2 layers, hidden 64): patched vs unpatched logits and every parameter's gradient against
a float64 run of the same weights (FlashAttention's rule: the patched model's error is at
most twice the unpatched model's own error, plus a few float32 ulps), every RoPE scaling
type, proof that our ops run, state_dict keys, and errors."""
import copy
import importlib.util

import pytest
import torch

transformers = pytest.importorskip("transformers")

from baracuda_torch.integrations import huggingface as hf  # noqa: E402
from helpers import DEVICES, assert_close_to_reference, requires_cuda  # noqa: E402

HAS_MAMBA = importlib.util.find_spec("baracuda_torch.mamba") is not None
HAS_PAIR = hasattr(torch.ops.baracuda, "gated_activation_pair")

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              attn_implementation="eager")


def make_config(arch, **over):
    kw = dict(COMMON)
    if arch == "llama":
        cls = transformers.LlamaConfig
    elif arch == "mistral":
        cls = transformers.MistralConfig
        kw["sliding_window"] = 8
    elif arch == "qwen2":
        cls = transformers.Qwen2Config
    elif arch == "qwen3":
        cls = transformers.Qwen3Config
        kw["head_dim"] = 16
    elif arch == "gemma":
        cls = transformers.GemmaConfig
        kw["head_dim"] = 16
    else:
        raise AssertionError(arch)
    kw.update(over)
    attn = kw.pop("attn_implementation")
    cfg = cls(**kw)
    cfg._attn_implementation = attn
    return cfg


MODEL_CLS = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
}


def build(arch, **over):
    torch.manual_seed(0)
    model = getattr(transformers, MODEL_CLS[arch])(make_config(arch, **over))
    # non-trivial norms and biases, so their gradients are exercised
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.double()


def run(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def compare(model64, device, dtype, seq=12, what="", record=None):
    """Patched vs unpatched in `dtype` on `device`, against the float64 model."""
    ids = torch.randint(0, COMMON["vocab_size"], (2, seq))
    logits64, loss64, grads64 = run(model64, ids)
    base = copy.deepcopy(model64).to(device=device, dtype=dtype)
    patched = copy.deepcopy(model64).to(device=device, dtype=dtype)
    desc = hf.apply_baracuda(patched)
    assert desc and "rope_qk_cos_sin" in desc
    assert list(patched.state_dict()) == list(model64.state_dict())
    lb, _, gb = run(base, ids.to(device))
    lp, _, gp = run(patched, ids.to(device))
    assert_close_to_reference(lp, logits64, lb, f"{what} logits")
    assert set(gp) == set(grads64)
    worst = {"logits": (lp.double().cpu() - logits64).abs().max().item()}
    for n in grads64:
        assert_close_to_reference(gp[n], grads64[n], gb[n], f"{what} grad {n}")
        worst[n] = (gp[n].double().cpu() - grads64[n]).abs().max().item()
    if record is not None:
        record(what, worst)
    return desc


ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ARCHS)
def test_patched_matches_float64(device, dtype, arch):
    desc = compare(build(arch), device, dtype, what=f"{arch} {dtype} {device}")
    kind = "geglu_tanh" if arch == "gemma" else "swiglu"
    assert kind in desc
    assert ("gated_activation_pair" in desc) == HAS_PAIR


ROPE_PARAMETERS = {
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
                 "short_factor": [1.0 + 0.1 * i for i in range(8)],
                 "long_factor": [2.0 + 0.3 * i for i in range(8)]},
}


@pytest.mark.parametrize("rope_type", sorted(ROPE_PARAMETERS))
def test_rope_scaling_types(rope_type):
    # max_position_embeddings 20 < seq 24: dynamic and longrope switch to their long form
    model = build("llama", rope_parameters=dict(ROPE_PARAMETERS[rope_type]), max_position_embeddings=20)
    compare(model, "cpu", torch.float32, seq=24, what=f"rope {rope_type}")


def test_bamba_partial_rotary():
    """Bamba: the partial-rotary apply_rotary_pos_emb (cos/sin cover half the head; the
    rest passes through) and its gated MLP; its Mamba-2 mixers are patched only with
    baracuda_torch.mamba."""
    cfg = transformers.BambaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
                                   mamba_n_heads=8, mamba_d_state=16, mamba_chunk_size=8,
                                   max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.BambaForCausalLM(cfg).double()
    rot = model.model.rotary_emb
    cos, _ = rot(torch.zeros(1, 3, 64, dtype=torch.float64), torch.arange(3)[None])
    assert cos.shape[-1] == 8 < 16  # R = head_dim / 2
    desc = compare(model, "cpu", torch.float32, what="bamba")
    assert "BambaAttention" in desc and "BambaMLP" in desc
    assert ("BambaMixer" in desc) and (("mamba_chunk_scan_combined" in desc) == HAS_MAMBA)


@pytest.mark.parametrize("device", DEVICES)
def test_profiler_shows_our_ops(device):
    model = build("qwen3").float().to(device)
    hf.apply_baracuda(model)
    ids = torch.randint(0, 96, (2, 8), device=device)
    with torch.profiler.profile() as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    names = {e.name for e in prof.events()}
    ours = {n for n in names if n.startswith("baracuda::")}
    assert "baracuda::rope_qk_cos_sin" in ours and "baracuda::rope_qk_cos_sin_backward" in ours
    assert any(n.startswith("baracuda::gated_activation") for n in ours)
    # ... and the unpatched model runs none
    base = build("qwen3").float().to(device)
    with torch.profiler.profile() as prof:
        base(input_ids=ids).logits.sum()
    assert not any(e.name.startswith("baracuda::") for e in prof.events())


def test_per_instance_and_idempotent_and_remove():
    a, b = build("llama"), build("llama")
    ids = torch.randint(0, 96, (1, 6))
    ref_logits = b(input_ids=ids).logits
    desc = hf.apply_baracuda(a)
    assert "LlamaAttention" in desc and "LlamaMLP" in desc and " 2 x " in desc
    # the other instance (same class, same process) is untouched
    with torch.profiler.profile() as prof:
        torch.testing.assert_close(b(input_ids=ids).logits, ref_logits)
    assert not any(e.name.startswith("baracuda::") for e in prof.events())
    assert "already patched" in hf.apply_baracuda(a)
    torch.testing.assert_close(a(input_ids=ids).logits, ref_logits)
    assert hf.remove_baracuda(a) == 4
    with torch.profiler.profile() as prof:
        a(input_ids=ids)
    assert not any(e.name.startswith("baracuda::") for e in prof.events())


def test_gated_pair_fallback_matches_formula():
    """Both MLP paths (the two-input op when present, the cat fallback) give act(g)*u."""
    g, u = torch.randn(3, 5, 16, dtype=torch.float64), torch.randn(3, 5, 16, dtype=torch.float64)
    acts = {"swiglu": torch.nn.functional.silu, "reglu": torch.relu, "glu": torch.sigmoid,
            "geglu": torch.nn.functional.gelu,
            "geglu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}
    fallback = torch.ops.baracuda.gated_activation
    for kind, act in acts.items():
        torch.testing.assert_close(hf.gated_pair(g, u, kind), act(g) * u)
        torch.testing.assert_close(fallback(torch.cat([g, u], -1), kind, -1, True), act(g) * u)


def test_unknown_activation_left_unpatched():
    model = build("llama", hidden_act="relu2")
    desc = hf.apply_baracuda(model)
    assert "'relu2' has no gated kind" in desc and "rope_qk_cos_sin" in desc
    assert not any(getattr(m, "_baracuda_patch", None) for m in model.modules()
                   if type(m).__name__ == "LlamaMLP")


def test_unsupported_model_raises():
    with pytest.raises(ValueError, match=r"unsupported model class Sequential"):
        hf.apply_baracuda(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50)
    with pytest.raises(ValueError, match=r"unsupported model class GPT2LMHeadModel"):
        hf.apply_baracuda(transformers.GPT2LMHeadModel(cfg))


def test_bad_cos_sin_shape_is_a_value_error():
    model = build("llama").float()
    hf.apply_baracuda(model)
    attn = model.model.layers[0].self_attn
    h = torch.randn(2, 5, 64)
    cos = torch.randn(2, 6, 16)  # wrong sequence length
    with pytest.raises(ValueError, match=r"baracuda::rope_qk_cos_sin: cos/sin of rank 3 must be"):
        attn(h, position_embeddings=(cos, cos), attention_mask=None)


@pytest.mark.skipif(not HAS_MAMBA, reason="baracuda_torch.mamba is not in this build")
def test_mamba2_patched_matches_unpatched():
    cfg = transformers.Mamba2Config(vocab_size=96, hidden_size=64, num_hidden_layers=2, state_size=16, num_heads=8,
                                    expand=2, head_dim=16, n_groups=1, chunk_size=8)
    torch.manual_seed(0)
    m64 = transformers.Mamba2ForCausalLM(cfg).double()
    ids = torch.randint(0, 96, (2, 20))
    l64, _, g64 = run(m64, ids)
    base, patched = copy.deepcopy(m64).float(), copy.deepcopy(m64).float()
    desc = hf.apply_baracuda(patched)
    assert "mamba_chunk_scan_combined" in desc
    lb, _, gb = run(base, ids)
    with torch.profiler.profile() as prof:
        lp, _, gp = run(patched, ids)
    assert any(e.name.startswith("baracuda::") for e in prof.events())
    assert_close_to_reference(lp, l64, lb, "mamba2 logits")
    for n in g64:
        assert_close_to_reference(gp[n], g64[n], gb[n], f"mamba2 grad {n}")


@pytest.mark.skipif(HAS_MAMBA, reason="baracuda_torch.mamba is present")
def test_mamba2_without_mamba_module_is_described():
    cfg = transformers.Mamba2Config(vocab_size=96, hidden_size=64, num_hidden_layers=1, state_size=16, num_heads=8,
                                    expand=2, head_dim=16, n_groups=1, chunk_size=8)
    with pytest.raises(ValueError, match=r"Mamba2ForCausalLM.*baracuda_torch.mamba is not in this build"):
        hf.apply_baracuda(transformers.Mamba2ForCausalLM(cfg))


@requires_cuda
def test_cuda_bf16_training_step_runs():
    model = build("llama").to("cuda", torch.bfloat16)
    hf.apply_baracuda(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 96, (4, 32), device="cuda")
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert torch.isfinite(loss)


def test_mamba2_patch_routes_to_baracuda_mamba(monkeypatch):
    """The Mamba-2 wiring, without baracuda_torch.mamba's kernels: a stand-in module whose
    functions record their calls and compute with transformers' own PyTorch reference
    shows that the patched mixer calls mamba_split_conv1d_scan_combined (training, no
    cache) and then mamba_chunk_scan_combined with mamba_ssm's keyword arguments, on the
    CPU, and gives the unpatched model's logits."""
    import importlib.machinery
    import sys
    import types

    from transformers.models.mamba2 import modeling_mamba2 as m2

    calls = []
    fake = types.ModuleType("baracuda_torch.mamba")
    fake.__spec__ = importlib.machinery.ModuleSpec("baracuda_torch.mamba", None)

    def chunk(x, dt, A, B, C, chunk_size, **kw):
        calls.append(("chunk", sorted(kw)))
        assert kw["dt_softplus"] is True and kw["z"] is None and kw["seq_idx"] is None
        return m2.mamba2_chunk_scan(x, dt, A, B, C, chunk_size, D=kw["D"], dt_bias=kw["dt_bias"],
                                    initial_states=kw["initial_states"], dt_softplus=True,
                                    dt_limit=kw["dt_limit"], return_final_states=kw["return_final_states"])

    def split(zxbcdt, w, b, dt_bias, A, D, chunk_size, **kw):
        calls.append(("split", sorted(kw)))
        assert kw["norm_before_gate"] is False and kw["headdim"] == 16
        return None  # (transformers then takes the unfused path, as with its own fallback)

    fake.mamba_chunk_scan_combined = chunk
    fake.mamba_split_conv1d_scan_combined = split
    monkeypatch.setitem(sys.modules, "baracuda_torch.mamba", fake)
    cfg = transformers.Mamba2Config(vocab_size=96, hidden_size=64, num_hidden_layers=2, state_size=16, num_heads=8,
                                    expand=2, head_dim=16, n_groups=1, chunk_size=8)
    torch.manual_seed(0)
    base = transformers.Mamba2ForCausalLM(cfg)
    patched = copy.deepcopy(base)
    desc = hf.apply_baracuda(patched)
    assert "2 x Mamba2Mixer" in desc and "mamba_chunk_scan_combined" in desc
    assert list(patched.state_dict()) == list(base.state_dict())
    ids = torch.randint(0, 96, (2, 12))
    torch.testing.assert_close(patched(input_ids=ids).logits, base(input_ids=ids).logits)
    assert [c[0] for c in calls] == ["split", "chunk", "split", "chunk"]
    assert "initial_states" in calls[1][1] and "return_final_states" in calls[1][1]
