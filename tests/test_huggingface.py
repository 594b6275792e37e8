"""baracuda_torch.integrations.huggingface.apply_baracuda on tiny transformers models.

Two kinds of checks: (1) patched vs unpatched logits and every parameter's gradient
against a float64 run of the same weights (FlashAttention's rule: the patched model's
error is at most twice the unpatched model's own error, plus a few float32 ulps), every
RoPE scaling type, proof that our ops run, state_dict keys, and errors; (2) equivalence
with the unpatched model itself for every family the patch touches (Llama, Mistral,
Qwen2, Qwen3, Gemma, Gemma2/3, Mamba2, Bamba, FalconH1) in training with and without left
padding and with activation checkpointing, evaluation, generation (greedy with a cache,
a static cache, beam search, sampling), sdpa attention, torch.compile, and after
deepcopy, torch.save/torch.load and save_pretrained/from_pretrained, with the RMSNorm
modules patched (checked: every plain one runs baracuda::rms_norm, bit for bit equal to
the module where the sums of squares are exact) and the ones the patch must leave alone
left alone. Written for every transformers of the supported range (scripts/compat.sh
TORCH TRANSFORMERS runs them on one)."""
import copy
import importlib.util
import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from baracuda_torch.integrations import huggingface as hf  # noqa: E402
from helpers import DEVICES, CountOps, assert_close_to_reference, requires_cuda  # noqa: E402

HAS_MAMBA = importlib.util.find_spec("baracuda_torch.mamba") is not None
TF_VERSION = transformers.__version__
_M2 = importlib.import_module("transformers.models.mamba2.modeling_mamba2")


def _mixer_calls_chunk_scan() -> bool:
    """Whether this transformers' Mamba2Mixer.forward (through functools.wraps wrappers)
    calls a module-level mamba2_chunk_scan, itself or in the mamba2_scan_forward it calls:
    5.16 through 5.25 of the releases tried (5.16.1, 5.17.0, 5.20.2, 5.22.2, 5.23.0, 5.24.0
    itself; 5.25.0 through mamba2_scan_forward, a ``kernels`` function layer). 5.0.0, 5.1.0,
    5.3.0, 5.8.1 and 5.12.1 compute the scan inline; 5.15.1 defines mamba2_chunk_scan but
    wraps the forward in an accelerate-hooks decorator without __wrapped__, which hides the
    call (the mixer is then left alone, with a note)."""
    return hf._scan_site(_M2.Mamba2Mixer.forward) is not None


# transformers' Mamba-2 mixers that call a replaceable mamba2_chunk_scan are patched; the
# others are left alone.
MAMBA_PATCHABLE = HAS_MAMBA and _mixer_calls_chunk_scan()
# ... and their decoding step calls replaceable causal_conv1d_update and
# mamba2_selective_state_update whose fallback decorators record causal-conv1d's and
# mamba_ssm's contracts (5.20, 5.22, 5.23, 5.24 and 5.25 of the releases tried; 5.16's do not).
MAMBA_DECODE_PATCHABLE = MAMBA_PATCHABLE and hf._decode_replaceable(
    _M2.Mamba2Mixer.forward, hf._scan_site(_M2.Mamba2Mixer.forward))
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
    # R = head_dim / 2 where this transformers' Bamba has partial rotary (5.17 and 5.24);
    # 5.0 and 5.10 rotate all 16 features
    assert cos.shape[-1] in (8, 16)
    desc = compare(model, "cpu", torch.float32, what="bamba")
    assert "BambaAttention" in desc and "BambaMLP" in desc
    assert ("BambaMixer" in desc) and (("mamba_chunk_scan_combined" in desc) == MAMBA_PATCHABLE)


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
    assert "baracuda::rms_norm" in ours and "baracuda::rms_norm_backward" in ours
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
    assert "2 x LlamaAttention" in desc and "2 x LlamaMLP" in desc and "5 x LlamaRMSNorm" in desc
    # the other instance (same class, same process) is untouched
    with torch.profiler.profile() as prof:
        torch.testing.assert_close(b(input_ids=ids).logits, ref_logits)
    assert not any(e.name.startswith("baracuda::") for e in prof.events())
    assert "already patched" in hf.apply_baracuda(a)
    torch.testing.assert_close(a(input_ids=ids).logits, ref_logits)
    assert hf.remove_baracuda(a) == 9  # 2 attention, 2 MLP, 5 RMSNorm
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
    assert "ReLUSquaredActivation() computes none of the gated kinds" in desc and "rope_qk_cos_sin" in desc
    assert not any(getattr(m, "_baracuda_patch", None) for m in model.modules()
                   if type(m).__name__ == "LlamaMLP")


def test_unsupported_model_raises():
    with pytest.raises(ValueError, match=rf"cannot patch model class Sequential \(transformers {TF_VERSION}\)"):
        hf.apply_baracuda(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50)
    with pytest.raises(ValueError, match=r"cannot patch model class GPT2LMHeadModel"):
        hf.apply_baracuda(transformers.GPT2LMHeadModel(cfg))


def test_bad_cos_sin_shape_is_a_value_error():
    model = build("llama").float()
    hf.apply_baracuda(model)
    attn = model.model.layers[0].self_attn
    h = torch.randn(2, 5, 64)
    cos = torch.randn(2, 6, 16)  # wrong sequence length
    with pytest.raises(ValueError, match=r"baracuda::rope_qk_cos_sin: cos/sin of rank 3 must be"):
        attn(h, position_embeddings=(cos, cos), attention_mask=None)


@pytest.mark.skipif(not MAMBA_PATCHABLE, reason="no patchable Mamba-2 mixer in this transformers")
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
    """Its RMSNorms are patched; the mixers are left alone, with a note."""
    cfg = transformers.Mamba2Config(vocab_size=96, hidden_size=64, num_hidden_layers=1, state_size=16, num_heads=8,
                                    expand=2, head_dim=16, n_groups=1, chunk_size=8)
    desc = hf.apply_baracuda(transformers.Mamba2ForCausalLM(cfg))
    assert "Mamba2RMSNorm" in desc
    assert ("baracuda_torch.mamba is not in this build" in desc) == MAMBA_PATCHABLE, desc


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


# ---- equivalence: the patched model computes what the unpatched model computes ------
#
# Tiny float32 models, patched copy vs the unpatched model itself (transformers' own
# PyTorch paths), in every mode the patch could change: training without a cache (loss,
# logits, every parameter's gradient; Mamba-2 mixers take their fused path there), the
# same with a left-padded batch, evaluation without and with a cache (generate's logits
# at every step). Float32 rounding between the two stays near 1e-6 of the values'
# scale; every case of issue 20 differed by more than 1e-3.

def _mamba2(n_groups=1, **over):
    kw = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, state_size=8, num_heads=4, expand=2,
              head_dim=16, n_groups=n_groups, chunk_size=8, pad_token_id=0, tie_word_embeddings=False)
    kw.update(over)
    return transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**kw))


def _bamba(n_groups=1):
    cfg = transformers.BambaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
                                   mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=n_groups, mamba_d_state=8,
                                   mamba_chunk_size=8, max_position_embeddings=64, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.BambaForCausalLM(cfg)


try:  # what huggingface_hub's strict dataclasses raise for a config field of the wrong type
    from huggingface_hub.errors import StrictDataclassError
    _STRICT_CONFIG_ERRORS: tuple = (StrictDataclassError,)
except ImportError:  # an older huggingface_hub does not validate the fields
    _STRICT_CONFIG_ERRORS = ()


def _config_or_skip(make, *args, **kw):
    """``make(*args, **kw)`` (a config), or a skip where the installed transformers cannot
    build that config: 5.4.0 annotates some fields with the wrong type
    (FalconH1Config.use_cache and Olmo2Config.tie_word_embeddings as ints, with bool
    defaults), which huggingface_hub's strict dataclasses reject, so not even the defaults
    build there: no model to patch."""
    try:
        return make(*args, **kw)
    except _STRICT_CONFIG_ERRORS as e:
        pytest.skip(f"transformers {TF_VERSION} cannot build this config: {type(e).__name__}: {e}")


def _falcon_h1(rms=True, nbg=True):
    cfg = _config_or_skip(transformers.FalconH1Config, vocab_size=96, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=4,
                          mamba_d_ssm=64, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=8,
                          mamba_rms_norm=rms, mamba_norm_before_gate=nbg, max_position_embeddings=64,
                          pad_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.FalconH1ForCausalLM(cfg)


def _gemma_both_acts(version):
    """A Gemma2/Gemma3 config carrying both hidden_activation (what the MLP runs) and a
    conflicting hidden_act."""
    cls = transformers.Gemma2Config if version == 2 else transformers.Gemma3TextConfig
    cfg = cls(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0,
              hidden_activation="gelu_pytorch_tanh", hidden_act="silu")
    cfg._attn_implementation = "eager"
    return (transformers.Gemma2ForCausalLM if version == 2 else transformers.Gemma3ForCausalLM)(cfg)


def _tiny(arch):
    over = dict(hidden_size=32, intermediate_size=64, pad_token_id=0)
    if arch in ("qwen3", "gemma"):
        over["head_dim"] = 8
    return getattr(transformers, MODEL_CLS[arch])(make_config(arch, **over))


ZOO = {
    **{arch: (lambda arch=arch: _tiny(arch)) for arch in ARCHS},
    "gemma2-both-acts": lambda: _gemma_both_acts(2),
    "gemma3-both-acts": lambda: _gemma_both_acts(3),
    "mamba2-g1": lambda: _mamba2(1),
    "mamba2-g2": lambda: _mamba2(2),
    "bamba-g2": lambda: _bamba(2),
    "falconh1-rms-nbg": lambda: _falcon_h1(True, True),
    "falconh1-rms-gate-first": lambda: _falcon_h1(True, False),
    "falconh1-no-rms": lambda: _falcon_h1(False, True),
}
MAMBA_FAMILIES = ("mamba2", "bamba", "falconh1")
#: one tiny model of each family (for the modes that cost more: compile, save/load)
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2-both-acts", "gemma3-both-acts",
            "mamba2-g1", "bamba-g2", "falconh1-rms-nbg"]


def _zoo(name):
    torch.manual_seed(0)
    model = ZOO[name]()
    with torch.no_grad():  # non-trivial norm weights and biases
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model.float()


def _patched_pair(name, device="cpu"):
    base = _zoo(name).to(device)
    patched = copy.deepcopy(base)
    desc = hf.apply_baracuda(patched)
    if name.startswith(MAMBA_FAMILIES) and HAS_MAMBA and not MAMBA_PATCHABLE:
        assert f"transformers {TF_VERSION}'s Mamba-2 mixer has no mamba2_chunk_scan call to replace" in desc, desc
    return base, patched, desc


def _plain_norms(model):
    """The model's RMSNorm modules without a gate (class names, for the test only)."""
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("RMSNorm")]


def _assert_norms_patched(model, desc):
    norms = _plain_norms(model)
    assert norms, "the test model has no RMSNorm"
    for n, m in norms:
        assert getattr(m, "_baracuda_patch", "").endswith("-> baracuda::rms_norm"), (n, desc)
    assert f"{len(norms)} x {type(norms[0][1]).__name__}: RMSNorm" in desc, desc


def _close(got, want, what, tol=1e-4):
    scale = max(want.abs().max().item(), 1e-3)
    err = (got.double().cpu() - want.double().cpu()).abs().max().item()
    assert err <= tol * scale, f"{what}: max error {err:.3g} over scale {scale:.3g}"


def _left_padded_batch(seq=16, pad=5):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 96, (2, seq), generator=g)
    mask = torch.ones(2, seq, dtype=torch.long)
    ids[0, :pad] = 0
    mask[0, :pad] = 0
    return ids, mask


def _train_step(model, ids, mask):
    model.train()
    model.zero_grad(set_to_none=True)
    labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_training_matches_unpatched(name, padded, device, monkeypatch):
    """Issue 20 cases 1-4: Mamba2/Bamba with n_groups = 2 (the norm's groups as the
    installed transformers computes them), left padding on the fused path, FalconH1's
    norm_before_gate, Gemma2/3 with conflicting activation keys. On CUDA the reference is
    the unpatched model on CUDA (with mamba_ssm installed, its fused kernel in training)."""
    base, patched, desc = _patched_pair(name, device)
    if name.startswith(MAMBA_FAMILIES) and MAMBA_PATCHABLE:
        assert "mamba_chunk_scan_combined" in desc, desc
    _assert_norms_patched(patched, desc)
    ids, mask = (t.to(device) for t in _left_padded_batch())
    if not padded:
        mask = None
    lb, gb = _train_step(base, ids, mask)
    calls = []

    def spy(x, *a, _orig=hf.bf.rms_norm, **k):
        calls.append(tuple(x.shape))
        return _orig(x, *a, **k)
    monkeypatch.setattr(hf.bf, "rms_norm", spy)
    lp, gp = _train_step(patched, ids, mask)
    # every plain RMSNorm of the model ran baracuda's op, once
    assert len(calls) == len(_plain_norms(patched)), (name, calls)
    keep = slice(None) if mask is None else mask.bool()
    _close(lp[keep], lb[keep], f"{name} logits")
    assert set(gp) == set(gb)
    for n in gb:
        _close(gp[n], gb[n], f"{name} grad {n}", tol=1e-3)


#: Other causal LMs whose code differs from the zoo's where the patch decides (per module
#: instance, from what the module computes): a fused gate_up MLP, mixtures of experts,
#: partial and interleaved rotary, LayerNorm, q/k norms over whole projections, NoPE
#: layers, scaled residuals, multi-head latent attention, differential attention and
#: hybrids with linear attention or Mamba-2 mixers. Built from transformers' own
#: registries with a tiny config (the overrides where the defaults do not fit).
OTHER_FAMILIES = {
    "phi3": {}, "mixtral": {}, "qwen2_moe": {}, "qwen3_moe": {}, "olmo2": {}, "cohere": {},
    "granite": {}, "phi": {}, "stablelm": {}, "gpt_neox": {}, "smollm3": {}, "glm4": {},
    "starcoder2": {}, "diffllama": {}, "exaone4": {}, "helium": {},
    "deepseek_v3": dict(qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, kv_lora_rank=16,
                        q_lora_rank=32, num_key_value_heads=4, head_dim=None),
    "qwen3_next": dict(num_hidden_layers=4),
    # (older releases, 5.0 for one, name its layer types "mamba" and "attention"; the
    # default mixer, 128 heads of 64 × 256 states, would take gigabytes in chunks of 256)
    "granitemoehybrid": [dict(layer_types=layers, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8,
                              mamba_n_groups=2, mamba_chunk_size=8)
                         for layers in (["linear_attention", "full_attention"], ["mamba", "attention"])],
}


# scripts/hf_sweep.py builds the same tiny models for every causal LM transformers registers
_spec = importlib.util.spec_from_file_location(
    "hf_sweep", Path(__file__).resolve().parents[1] / "scripts" / "hf_sweep.py")
hf_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_sweep)


def _other_family(model_type):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if model_type not in CONFIG_MAPPING or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        pytest.skip(f"transformers {TF_VERSION} has no {model_type}")
    variants = OTHER_FAMILIES[model_type]
    variants = variants if isinstance(variants, list) else [variants]
    for extra in variants[:-1]:  # the first variant the installed config takes
        try:
            cfg = hf_sweep.tiny_config(model_type, extra)
            break
        except (ValueError, *_STRICT_CONFIG_ERRORS):
            continue
    else:
        cfg = _config_or_skip(hf_sweep.tiny_config, model_type, variants[-1])
    return hf_sweep.tiny_model(model_type, cfg)


@pytest.mark.parametrize("model_type", sorted(OTHER_FAMILIES))
def test_other_families_match_unpatched(model_type):
    """apply_baracuda on causal LMs outside the zoo: whatever it patches, the training
    step (left-padded, labels) and evaluation compute what the unpatched model computes;
    where it finds nothing to patch it says so and changes nothing."""
    base = _other_family(model_type)
    patched = copy.deepcopy(base)
    try:
        desc = hf.apply_baracuda(patched)
    except ValueError as e:
        assert f"cannot patch model class {type(base).__name__}" in str(e), e
        desc = None
    ids, mask = _left_padded_batch()
    keep = mask.bool()
    lb, gb = _train_step(base, ids, mask)
    lp, gp = _train_step(patched, ids, mask)
    _close(lp[keep], lb[keep], f"{model_type} logits")
    assert set(gp) == set(gb)
    for n in gb:
        _close(gp[n], gb[n], f"{model_type} grad {n}", tol=1e-3)
    base.eval(), patched.eval()
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask, use_cache=False).logits
        got, ours = _ours(patched, ids, attention_mask=mask, use_cache=False)
    _close(got[keep], want[keep], f"{model_type} eval logits")
    assert bool(ours) == (desc is not None), (ours, desc)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("name", FAMILIES)
def test_gradient_checkpointing_matches_unpatched(name, reentrant):
    """Activation checkpointing (transformers' gradient_checkpointing_enable, both of
    torch.utils.checkpoint's kinds; turned on after the patch in one copy and before it in
    another): the decoder layers' forwards run again in the backward, and the left-padded
    training step computes what the unpatched, checkpointed model computes."""
    kw = dict(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    base, after, _ = _patched_pair(name)
    before = _zoo(name)
    for m in (base, after, before):
        m.gradient_checkpointing_enable(**kw)
    hf.apply_baracuda(before)
    ids, mask = _left_padded_batch()
    keep = mask.bool()
    lb, gb = _train_step(base, ids, mask)
    for order, model in (("patched, then checkpointed", after), ("checkpointed, then patched", before)):
        lp, gp = _train_step(model, ids, mask)
        _close(lp[keep], lb[keep], f"{name} {order}: logits")
        assert set(gp) == set(gb)
        for n in gb:
            _close(gp[n], gb[n], f"{name} {order}: grad {n}", tol=1e-3)


@pytest.mark.parametrize("name", [n for n in FAMILIES if not n.startswith("mamba2")])
def test_sdpa_attention_matches_unpatched(name):
    """The zoo builds its models with eager attention; transformers' default is sdpa
    (torch's scaled_dot_product_attention), whose attention forward calls the same
    apply_rotary_pos_emb: the left-padded training step and greedy generation with a
    cache match the unpatched model under it."""
    base = _zoo(name)
    try:
        base.set_attn_implementation("sdpa")
    except ValueError as e:  # (Gemma2: no sdpa in transformers)
        pytest.skip(f"{type(base).__name__} on transformers {TF_VERSION}: {e}")
    patched = copy.deepcopy(base)
    hf.apply_baracuda(patched)
    assert patched.config._attn_implementation == "sdpa"
    ids, mask = _left_padded_batch()
    keep = mask.bool()
    lb, gb = _train_step(base, ids, mask)
    lp, gp = _train_step(patched, ids, mask)
    _close(lp[keep], lb[keep], f"{name} sdpa logits")
    for n in gb:
        _close(gp[n], gb[n], f"{name} sdpa grad {n}", tol=1e-3)
    base.eval(), patched.eval()
    with torch.no_grad():  # (the unpadded row, as test_eval_and_generate_match_unpatched: a
        # padded batch breaks FalconH1's own generate on transformers 5.0)
        want = base.generate(input_ids=ids[1:], max_new_tokens=5, do_sample=False, pad_token_id=0)
        got = patched.generate(input_ids=ids[1:], max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("mode", ["static cache", "beam search", "sampling"])
@pytest.mark.parametrize("name", FAMILIES)
def test_generation_modes_match_unpatched(name, mode):
    """generate beyond greedy with the dynamic cache: a static cache, beam search (3 beams)
    and sampling (top-k, the same seed) give the unpatched model's tokens, or fail as the
    unpatched model does (FalconH1's own beam search raises on transformers 5.0, and
    Bamba's and FalconH1's static cache on 5.5: a KeyError in transformers' masks)."""
    base, patched, _ = _patched_pair(name)
    base.eval(), patched.eval()
    kw = {"static cache": dict(cache_implementation="static"), "beam search": dict(num_beams=3),
          "sampling": dict(do_sample=True, top_k=5)}[mode]
    ids = _left_padded_batch()[0][1:]  # (the unpadded row: see test_sdpa_attention_matches_unpatched)
    with torch.no_grad():
        torch.manual_seed(3)
        try:
            want = base.generate(input_ids=ids, max_new_tokens=6, pad_token_id=0, **kw)
        except Exception as e:  # noqa: BLE001 (whatever transformers' own model raises)
            with pytest.raises(type(e), match=re.escape(str(e))):
                patched.generate(input_ids=ids, max_new_tokens=6, pad_token_id=0, **kw)
            return
        torch.manual_seed(3)
        got = patched.generate(input_ids=ids, max_new_tokens=6, pad_token_id=0, **kw)
    assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(ZOO))
def test_eval_and_generate_match_unpatched(name, device):
    """Evaluation without a cache (padded batch) and generation with a cache (logits of
    every step: the cached prefill and the single-token steps)."""
    base, patched, _ = _patched_pair(name, device)
    base.eval(), patched.eval()
    ids, mask = (t.to(device) for t in _left_padded_batch(seq=12, pad=3))
    with torch.no_grad():
        keep = mask.bool()
        _close(patched(input_ids=ids, attention_mask=mask, use_cache=False).logits[keep],
               base(input_ids=ids, attention_mask=mask, use_cache=False).logits[keep], f"{name} eval logits")
        kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=0)
        gb = base.generate(input_ids=ids[1:], **kw)
        gp = patched.generate(input_ids=ids[1:], **kw)
    assert torch.equal(gp.sequences, gb.sequences)
    for step, (a, b) in enumerate(zip(gp.logits, gb.logits)):
        _close(a, b, f"{name} generate step {step}")


def _mamba_layers(model):
    return sum(1 for m in model.modules() if type(m).__name__.endswith("Mixer"))


@pytest.mark.skipif(not MAMBA_DECODE_PATCHABLE, reason="this transformers' Mamba-2 decoding is not replaceable")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["mamba2-g1", "mamba2-g2", "bamba-g2", "falconh1-rms-nbg"])
def test_generate_decodes_on_our_ops(name, device):
    """Greedy generation with a cache: the patched model gives the unpatched model's
    tokens, and every decoding step runs one baracuda::causal_conv1d_update and one
    baracuda::selective_state_update per Mamba-2 layer (counted at the dispatcher), the
    prefill one chunked scan per layer."""
    base, patched, desc = _patched_pair(name, device)
    assert ("decoding (one token with a cache): causal_conv1d_update -> baracuda::causal_conv1d_update, "
            "mamba2_selective_state_update -> baracuda::selective_state_update") in desc, desc
    base.eval(), patched.eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 96, (2, 9), generator=g).to(device)
    new = 12
    with torch.no_grad():
        try:
            want = base.generate(input_ids=ids, max_new_tokens=new, do_sample=False, pad_token_id=0)
        except RuntimeError as e:  # transformers 5.17's FalconH1: its attention cache outgrows the mask
            # the patched model must fail the same way; there are no tokens to compare
            with pytest.raises(type(e), match=re.escape(str(e))):
                patched.generate(input_ids=ids, max_new_tokens=new, do_sample=False, pad_token_id=0)
            pytest.skip(f"transformers {TF_VERSION}'s unpatched {type(base).__name__} cannot generate: {e}")
        with CountOps() as ops:
            got = patched.generate(input_ids=ids, max_new_tokens=new, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)
    layers = _mamba_layers(patched)
    steps = new - 1  # the first new token comes from the prefill
    assert ops.counts["causal_conv1d_update"] == steps * layers, ops.counts
    assert ops.counts["selective_state_update"] == steps * layers, ops.counts
    assert ops.counts["ssd_chunk_scan_combined"] == layers, ops.counts


@pytest.mark.skipif(not MAMBA_DECODE_PATCHABLE, reason="this transformers' Mamba-2 decoding is not replaceable")
def test_decoding_falls_back_where_the_ops_compute_otherwise():
    """A mixer whose activation is not SiLU keeps transformers' conv step (the op has no
    other activation) and still decodes its SSM on baracuda's op; the tokens stay the
    unpatched model's."""
    base = _mamba2(1, hidden_act="gelu")
    torch.manual_seed(0)
    patched = copy.deepcopy(base)
    hf.apply_baracuda(patched)
    base.eval(), patched.eval()
    ids = torch.randint(1, 96, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = base.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        with CountOps() as ops:
            got = patched.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)
    assert ops.counts["causal_conv1d_update"] == 0 and ops.counts["selective_state_update"] == 5 * 2


# ---- RMSNorm: replaced bit for bit where the sums allow, left alone where it must be ----

def _dyadic(shape, dtype, seed=2):
    """Multiples of 1/8 in [-2, 2]: their squares and sums are exact in float32."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-16, 17, shape, generator=g, dtype=torch.float64) / 8).to(dtype)


@pytest.mark.parametrize("name", FAMILIES)
def test_norms_bit_for_bit_where_the_sums_are_exact(name):
    """Every patched RMSNorm of the family's tiny model (widths 32 and 8, powers of two)
    on multiples of 1/8: its output is the unpatched module's to the bit, in float32,
    bfloat16 and float16 with the weight in that dtype and in float32 (mixed precision);
    its weight is the model's Parameter, and the gradients of the weight and the input
    are the module's own autograd's (float32; the sums run in another order)."""
    base, patched, _ = _patched_pair(name)
    theirs = dict(_plain_norms(base))
    for n, m in _plain_norms(patched):
        assert m._baracuda_patch.endswith("-> baracuda::rms_norm") and isinstance(m.forward, hf._PatchedForward)
        assert m.weight is patched.get_parameter(n + ".weight")
        width = m.weight.shape[0]
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for wdtype in sorted({dtype, torch.float32}, key=str):
                ours, ref = copy.deepcopy(m).to(wdtype), copy.deepcopy(theirs[n]).to(wdtype)
                x = _dyadic((2, 3, 4, width), dtype)
                y, y0 = ours(x), ref(x)
                assert y.dtype == y0.dtype and torch.equal(y, y0), f"{name} {n} {dtype} weight {wdtype}"
        x = _dyadic((6, 5, width), torch.float32).requires_grad_()
        dy = torch.randn(6, 5, width)
        g = torch.autograd.grad(m(x), (x, m.weight), dy)
        g0 = torch.autograd.grad(theirs[n](x), (x, theirs[n].weight), dy)
        for a, b in zip(g, g0):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_norm_runs_the_module_code_where_the_op_would_compute_otherwise(monkeypatch):
    """Float64 input (the module normalizes in float32, the op would in float64) and
    weights the op does not take with that input (bfloat16 under float32, float16 under
    bfloat16): the patched module runs its class forward, so the result is the module's
    to the bit; baracuda's op runs only where it computes the module's function."""
    base, patched, _ = _patched_pair("qwen3")
    calls = []
    monkeypatch.setattr(hf.bf, "rms_norm", lambda *a, _o=hf.bf.rms_norm, **k: calls.append(1) or _o(*a, **k))
    for n in ("model.layers.0.input_layernorm", "model.layers.1.self_attn.q_norm"):
        m, ref = patched.get_submodule(n), base.get_submodule(n)
        for xd, wd in ((torch.float64, torch.float64), (torch.float32, torch.bfloat16),
                       (torch.bfloat16, torch.float16), (torch.float64, torch.float32)):
            ours, theirs = copy.deepcopy(m).to(wd), copy.deepcopy(ref).to(wd)
            x = torch.randn(2, 3, m.weight.shape[0]).to(xd)
            y, y0 = ours(x), theirs(x)
            assert y.dtype == y0.dtype and torch.equal(y, y0), (n, xd, wd)
        assert calls == []
        x = torch.randn(2, 3, m.weight.shape[0])
        torch.testing.assert_close(m(x), ref(x))
        assert calls == [1]
        calls.clear()


class _PerHeadRMSNorm(transformers.models.llama.modeling_llama.LlamaRMSNorm):
    """LlamaRMSNorm's code with a [heads, head_dim] weight: baracuda's rms_norm would
    normalize over both dims, the module normalizes over the last one."""

    def __init__(self, heads, head_dim):
        super().__init__(head_dim)
        self.weight = torch.nn.Parameter(torch.randn(heads, head_dim))


def test_norms_the_patch_must_leave_alone():
    """RMSNorms whose computation the probe cannot show to be ours are left alone, each
    kind with a note, while the rest of the model is patched and computes what the
    unpatched model computes: an eps held as a tensor, an instance with its own forward,
    a weight of two dims, gated norms (another computation), and a meta-device model."""
    base = _zoo("llama")
    layers = base.model.layers
    layers[0].post_attention_layernorm.variance_epsilon = torch.tensor(1e-6)  # on the path
    inst = layers[1].input_layernorm
    inst.forward = inst.forward  # an instance forward (what Liger-Kernel's instance patch installs)
    base.model.per_head = _PerHeadRMSNorm(4, 8)  # not on the path: a module to decide about
    patched = copy.deepcopy(base)
    desc = hf.apply_baracuda(patched)
    assert "3 x LlamaRMSNorm: RMSNorm (llama convention, evaluated) -> baracuda::rms_norm" in desc, desc
    assert ("note: model.layers.0.post_attention_layernorm (LlamaRMSNorm): baracuda's rms_norm does not "
            "take its weight or eps (x float32, weight float32 on cpu); left unpatched") in desc, desc
    assert "note: model.layers.1.input_layernorm (LlamaRMSNorm): its instance has its own forward" in desc
    assert "note: model.per_head (_PerHeadRMSNorm): its weight is not a 1-d tensor; left unpatched" in desc
    for n in ("layers.0.post_attention_layernorm", "layers.1.input_layernorm", "per_head"):
        assert getattr(patched.model.get_submodule(n), "_baracuda_patch", None) is None
    ids, mask = _left_padded_batch()
    lb, gb = _train_step(base, ids, mask)
    lp, gp = _train_step(patched, ids, mask)
    _close(lp[mask.bool()], lb[mask.bool()], "logits")
    for n in gb:
        _close(gp[n], gb[n], f"grad {n}", tol=1e-3)
    cfg = make_config("llama", hidden_size=32, intermediate_size=64)
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(cfg)
    desc = hf.apply_baracuda(meta)
    assert "LlamaMLP" in desc and "LlamaRMSNorm: RMSNorm" not in desc, desc
    assert ("note: model.layers.0.input_layernorm, ... (5 modules) (LlamaRMSNorm): its weight is on the "
            "meta device (nothing to evaluate); left unpatched") in desc, desc


@pytest.mark.parametrize("wrong", ["eps", "ulp"])
def test_norm_probe_compares_values(wrong, monkeypatch):
    """The probe evaluates: with a rms_norm that is wrong by a larger eps (visible where
    the mean square is near eps) or by one unit in the last place (visible on the exact
    sums), every norm is left alone with a note saying how it differs, and the model is
    patched otherwise."""
    orig = hf.bf.rms_norm

    def bad(x, shape, w, eps, **k):
        if wrong == "eps":
            return orig(x, shape, w, 4 * eps, **k)
        y = orig(x, shape, w, eps, **k)
        return torch.nextafter(y, torch.full_like(y, float("inf")))
    monkeypatch.setattr(hf.bf, "rms_norm", bad)
    desc = hf.apply_baracuda(_zoo("gemma"))
    assert "GemmaMLP" in desc and "-> baracuda::rms_norm" not in desc, desc
    why = ("its output differs from baracuda's rms_norm by up to" if wrong == "eps"
           else "its output differs from baracuda's rms_norm on exact sums of squares (x float32, weight float32")
    assert f"note: model.layers.0.input_layernorm, ... (5 modules) (GemmaRMSNorm): {why}" in desc, desc


def test_autocast_training_matches_unpatched(monkeypatch):
    """torch.autocast (bfloat16 on the CPU): the norms see float32 residual streams and
    bfloat16 q/k heads under float32 weights (Qwen3's q_norm/k_norm); the patched step
    runs our norm on both and matches the unpatched one."""
    base, patched, _ = _patched_pair("qwen3")
    ids, mask = _left_padded_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lb, gb = _train_step(base, ids, mask)
        seen = []
        monkeypatch.setattr(hf.bf, "rms_norm", lambda x, *a, _o=hf.bf.rms_norm, **k: seen.append(x.dtype) or _o(x, *a, **k))
        lp, gp = _train_step(patched, ids, mask)
    assert set(seen) == {torch.float32, torch.bfloat16} and len(seen) == 9, seen
    _close(lp[mask.bool()], lb[mask.bool()], "autocast logits", tol=1e-2)
    for n in gb:
        _close(gp[n], gb[n], f"autocast grad {n}", tol=3e-2)


def test_gemma_reads_the_mlps_activation_not_a_config_key():
    """Issue 20 case 4: the config says hidden_act='silu' but the MLP holds a tanh GELU."""
    _, patched, desc = _patched_pair("gemma2-both-acts")
    mlp = patched.model.layers[0].mlp
    assert patched.config.hidden_act == "silu"
    assert "geglu_tanh" in desc and "swiglu" not in desc
    assert mlp._baracuda_patch.endswith("geglu_tanh")


@pytest.mark.skipif(not MAMBA_PATCHABLE, reason="no patchable Mamba-2 mixer in this transformers")
def test_mamba_paths_taken(monkeypatch):
    """The decisions themselves: the fused training path runs exactly where it computes the
    unpatched function (no attention_mask, a norm over n_groups groups), and the profiler
    sees our scan in every mode."""
    import transformers.models.mamba2.modeling_mamba2 as m2
    norm = getattr(m2, "MambaRMSNormGated", None) or m2.Mamba2RMSNormGated  # (5.25's name)
    grouped_norm = "group_size" in norm.__init__.__code__.co_varnames
    _, patched, desc = _patched_pair("mamba2-g2")
    # n_groups = 2: transformers >= 5.24's norm is per group (fused path allowed), 5.17's over
    # the whole width (fused path not allowed)
    assert ("mamba_split_conv1d_scan_combined" in desc) == grouped_norm, desc
    _, p1, desc1 = _patched_pair("mamba2-g1")
    assert "mamba2_split_conv1d_scan_combined (training, no cache, no attention_mask) -> " in desc1
    ids, mask = _left_padded_batch()
    calls = []
    import baracuda_torch.mamba as bm
    for fn in ("mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined"):
        def spy(*a, _orig=getattr(bm, fn), _fn=fn, **k):
            calls.append(_fn)
            return _orig(*a, **k)
        monkeypatch.setattr(bm, fn, spy)
    p1.train()
    p1(input_ids=ids, use_cache=False)
    assert calls == ["mamba_split_conv1d_scan_combined"] * 2
    calls.clear()
    p1(input_ids=ids, attention_mask=mask, use_cache=False)  # padding: PyTorch path
    assert calls == ["mamba_chunk_scan_combined"] * 2
    calls.clear()
    p1.eval()
    p1(input_ids=ids, use_cache=False)
    assert calls == ["mamba_chunk_scan_combined"] * 2


def test_falconh1_norm_before_gate_taken_from_its_norm():
    """Issue 20 case 3: FalconH1's call site passes norm_before_gate=False whatever its
    norm does; the patch passes what the norm computes (or leaves the path alone)."""
    if not MAMBA_PATCHABLE:
        pytest.skip("no patchable Mamba-2 mixer in this transformers")
    for nbg in (True, False):
        _, _, desc = _patched_pair("falconh1-rms-nbg" if nbg else "falconh1-rms-gate-first")
        assert f"norm_before_gate={nbg}, as its norm computes" in desc, desc


@pytest.mark.skipif(MAMBA_PATCHABLE or not HAS_MAMBA, reason="this transformers' Mamba-2 mixers are patchable")
def test_old_transformers_mamba_is_explained():
    """Issue 20 case 7: before the mixers call mamba2_chunk_scan, their mixers are left
    alone with a note naming the version and the reason (Mamba2's RMSNorms are patched);
    without its RMSNorms too, Mamba2 raises a ValueError saying the same."""
    desc = hf.apply_baracuda(_zoo("mamba2-g1"))
    assert f"note: backbone.layers.0.mixer (Mamba2Mixer): transformers {TF_VERSION}'s Mamba-2 mixer " \
           "has no mamba2_chunk_scan call to replace" in desc and "5.16 through 5.25" in desc and "3 x Mamba2RMSNorm" in desc
    model = _zoo("mamba2-g1")
    for n, m in _plain_norms(model):
        m.forward = m.forward  # an instance forward: the norm is left alone
    with pytest.raises(ValueError, match=rf"Mamba2ForCausalLM \(transformers {TF_VERSION}\).*"
                                         r"has no mamba2_chunk_scan call to replace.*5.16 through 5.25"):
        hf.apply_baracuda(model)
    desc = hf.apply_baracuda(_zoo("bamba-g2"))
    assert f"note: model.layers.0.mamba (BambaMixer): transformers {TF_VERSION}'s Mamba-2 mixer has no " \
           "mamba2_chunk_scan call to replace" in desc and "BambaAttention" in desc


def test_unverified_mamba_mixer_left_alone():
    """A Mamba-2 mixer of a family the patch has not verified is left alone, with a note."""
    if not MAMBA_PATCHABLE or not hasattr(transformers, "Zamba2Config"):
        pytest.skip("needs patchable Mamba-2 mixers and Zamba2")
    from transformers.models.zamba2 import modeling_zamba2 as z2
    if hf._scan_site(z2.Zamba2MambaMixer.forward) is None:
        pytest.skip("Zamba2's mixer does not call mamba2_chunk_scan here")
    cfg = transformers.Zamba2Config(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    mamba_d_state=8, mamba_headdim=16, n_mamba_heads=4, chunk_size=8,
                                    layers_block_type=["mamba", "mamba"])
    try:
        model = transformers.Zamba2ForCausalLM(cfg)
    except Exception as e:  # pragma: no cover - config drift across versions
        pytest.skip(f"tiny Zamba2 not constructible here: {e}")
    desc = hf.apply_baracuda(model)
    assert "note: model.layers.0.mamba (Zamba2MambaMixer): this Mamba-2 mixer is not verified" in desc, desc
    assert not any(getattr(m, "_baracuda_patch", None) for m in model.modules()
                   if type(m).__name__ == "Zamba2MambaMixer")


# ---- the patch survives copies, pickles and compilation -----------------------------

def _ours(model, ids, **kw):
    with torch.profiler.profile() as prof:
        out = model(input_ids=ids, **kw).logits
    return out, {e.name for e in prof.events() if e.name.startswith("baracuda::")}


@pytest.mark.parametrize("name", FAMILIES)
def test_save_load_deepcopy_roundtrip(name, tmp_path):
    """Issue 20 case 5: torch.save/torch.load and deepcopy of a patched model give a
    patched model that runs our ops and the same logits; apply_baracuda on it says
    'already patched'. save_pretrained/from_pretrained gives an unpatched model that can be
    patched again."""
    base, patched, desc = _patched_pair(name)
    ids = torch.randint(1, 96, (2, 10))
    base.eval(), patched.eval()
    want = base(input_ids=ids).logits
    torch.save(patched, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    for copy_ in (loaded, copy.deepcopy(patched)):
        got, ours = _ours(copy_, ids)
        assert "baracuda::rms_norm" in ours, f"{name}: the copy runs no baracuda norm ({ours})"
        _close(got, want, f"{name} copy logits")
        again = hf.apply_baracuda(copy_)
        assert "already patched" in again and again.count(" x ") == desc.count(" x ")
    # the original and its copies do not share modules
    for m, m2 in zip(loaded.modules(), patched.modules()):
        f = m.__dict__.get("forward")
        if f is not None:
            assert f.module is m and f.module is not m2
    patched.save_pretrained(tmp_path / "hf")
    fresh = type(base).from_pretrained(tmp_path / "hf")
    fresh.eval()
    got, ours = _ours(fresh, ids)
    assert not ours
    _close(got, want, f"{name} from_pretrained logits")
    assert "already patched" not in hf.apply_baracuda(fresh)
    got, ours = _ours(fresh, ids)
    assert "baracuda::rms_norm" in ours
    _close(got, want, f"{name} re-patched logits")


@pytest.mark.parametrize("name", FAMILIES)
def test_torch_compile_matches_unpatched(name):
    """torch.compile of a patched model: training step (loss, gradients) and eval logits."""
    base, patched, _ = _patched_pair(name)
    ids = torch.randint(1, 96, (2, 16))
    lb, gb = _train_step(base, ids, None)
    compiled = torch.compile(patched, backend="aot_eager")
    lp, gp = _train_step(compiled, ids, None)
    _close(lp, lb, f"{name} compiled logits")
    for n in gb:
        _close(gp[n.removeprefix("_orig_mod.")] if n in gp else gp["_orig_mod." + n], gb[n],
               f"{name} compiled grad {n}", tol=1e-3)


@pytest.mark.parametrize("name", FAMILIES)
def test_torch_export_matches_unpatched(name, tmp_path):
    """torch.export of a patched model (eval, dynamic batch and length), saved and loaded
    back: the exported program calls the same baracuda ops as the eager patched model,
    and its logits at another shape match the unpatched model's."""
    base, patched, _ = _patched_pair(name)
    base.eval(), patched.eval()

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).logits

    ids = torch.randint(1, 96, (2, 16))
    dims = ({0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("length", min=2, max=64)},)

    def roundtrip(model, path):
        program = torch.export.export(Logits(model), (ids,), dynamic_shapes=dims, strict=False)
        torch.export.save(program, path)
        return torch.export.load(path)

    try:
        loaded = roundtrip(patched, tmp_path / "patched.pt2")
    except Exception as e:  # the patched model must export wherever the unpatched one does
        try:
            roundtrip(base, tmp_path / "base.pt2")
        except Exception:
            # transformers' own Mamba-2 scan before 5.16 (mixers left unpatched) pads the
            # length to whole chunks, which export cannot keep symbolic; Gemma3's
            # set_grad_enabled regions before 5.6 do not serialize
            pytest.skip(f"transformers {TF_VERSION}'s unpatched {type(base).__name__} does not export, "
                        f"save and load either: {type(e).__name__}")
        raise
    exported = {f"baracuda::{n.target._schema.name.split('::')[1]}" for n in loaded.graph.nodes
                if n.op == "call_function" and str(n.target).startswith("baracuda.")}
    other = torch.randint(1, 96, (3, 21))
    with torch.no_grad():
        want = base(input_ids=other, use_cache=False).logits
        eager, ours = _ours(patched, other, use_cache=False)
        got = loaded.module()(other)
    assert ours and exported == ours, (exported, ours)
    _close(got, want, f"{name} exported logits")
    _close(got, eager, f"{name} exported against eager patched logits", tol=1e-6)


def test_loaded_under_another_transformers_runs_unpatched_until_repatched(monkeypatch, tmp_path):
    """A pickle made under one transformers version, loaded under another: every module
    runs its class forward (no decision made for another version is reused), and
    apply_baracuda patches it again."""
    base, patched, _ = _patched_pair("llama")
    torch.save(patched, tmp_path / "m.pt")
    monkeypatch.setattr(hf, "_tf_version", lambda: "0.0.0-other")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    ids = torch.randint(1, 96, (2, 10))
    base.eval(), loaded.eval()
    got, ours = _ours(loaded, ids)
    assert not ours
    _close(got, base(input_ids=ids).logits, "loaded under another version")
    desc = hf.apply_baracuda(loaded)
    assert "already patched" not in desc and "LlamaMLP" in desc and "5 x LlamaRMSNorm: RMSNorm" in desc, desc
    assert _ours(loaded, ids)[1]


@pytest.mark.skipif(not MAMBA_PATCHABLE, reason="no patchable Mamba-2 mixer in this transformers")
@pytest.mark.parametrize("name", ["mamba2-g2", "falconh1-rms-nbg"])
def test_mamba_follows_transformers_fused_kernel_where_it_has_one(name, monkeypatch):
    """Where transformers trains on a fused kernel (mamba_ssm importable: its fallback
    decorator's is_new_implementation), the unpatched model computes that kernel's function
    (no padding mask, the call site's norm_before_gate and n_groups), and so must the
    patched one. A stand-in for the kernel, built like transformers' decorator, runs
    baracuda_torch.mamba's function of the same contract in the unpatched model."""
    import baracuda_torch.mamba as bm
    module = importlib.import_module("transformers.models.mamba2.modeling_mamba2" if name.startswith("mamba2")
                                     else "transformers.models.falcon_h1.modeling_falcon_h1")

    def decorated(implementation, torch_function):
        is_new_implementation = implementation is not torch_function

        def wrapped(*args, **kwargs):
            return implementation(*args, **kwargs) if is_new_implementation else torch_function(*args, **kwargs)
        wrapped.__wrapped__ = torch_function
        assert "is_new_implementation" in wrapped.__code__.co_freevars
        return wrapped

    kernel = decorated(bm.mamba_split_conv1d_scan_combined, module.mamba2_split_conv1d_scan_combined)
    monkeypatch.setattr(module, "mamba2_split_conv1d_scan_combined", kernel)
    base, patched, desc = _patched_pair(name)
    assert "transformers runs mamba_ssm's fused kernel there" in desc, desc
    ids, mask = _left_padded_batch()
    lb, gb = _train_step(base, ids, mask)
    lp, gp = _train_step(patched, ids, mask)
    _close(lp, lb, f"{name} logits (fused kernel, padded)")
    for n in gb:
        _close(gp[n], gb[n], f"{name} grad {n}", tol=1e-3)
