"""Mamba2 decoding (mamba_ssm's protocol): a prefill of L tokens through the chunked scan
with ``inference_params``, then one-token steps, gives the forward over L + k tokens —
every layer option (groups, D per channel, no RMSNorm, the MLP part, biases,
norm_before_gate, dt_limit), prompts shorter than the conv, the flattened input, a
packed (varlen) prefill, a float32 state under 16-bit weights; allocate_inference_cache's
layout; the decoding step runs baracuda's ops; the errors. CUDA variants skip without
a GPU."""
import pytest
import torch

from baracuda_torch import mamba
from helpers import DEVICES, CountOps, requires_cuda

CONFIGS = {
    "ngroups 2": dict(ngroups=2),
    "D per channel, no rmsnorm (z gate)": dict(D_has_hdim=True, rmsnorm=False),
    "d_ssm < d_inner (MLP part), biases, norm_before_gate": dict(d_ssm=16, bias=True, norm_before_gate=True),
    "dt_limit": dict(dt_limit=(0.02, 0.08)),
}


def make(device, dtype, **kw):
    torch.manual_seed(0)
    args = dict(d_model=16, d_state=8, headdim=4, chunk_size=4, layer_idx=3)
    args.update(kw)
    m = mamba.Mamba2(**args, dtype=dtype).to(device)
    with torch.no_grad():  # livelier parameters than the init (dt_bias near its floor)
        m.dt_bias.add_(torch.randn_like(m.dt_bias))
        m.D.add_(torch.randn_like(m.D))
        if m.rmsnorm:
            m.norm.weight.add_(0.5 * torch.randn_like(m.norm.weight))
    return m


def decode(m, u, L, state_dtype=None):
    """The prefill of u[:, :L], then one step per remaining token; outputs concatenated."""
    ip = mamba.InferenceParams(max_seqlen=u.shape[1], max_batch_size=u.shape[0])
    if state_dtype is not None:  # the cache allocated up front, as generation utilities do
        ip.key_value_memory_dict[m.layer_idx] = m.allocate_inference_cache(u.shape[0], u.shape[1], state_dtype)
    with torch.no_grad():
        outs = [m(u[:, :L], inference_params=ip)]
        ip.seqlen_offset += L
        for t in range(L, u.shape[1]):
            outs.append(m(u[:, t:t + 1], inference_params=ip))
            ip.seqlen_offset += 1
    return torch.cat(outs, 1), ip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_prefill_then_steps_equals_forward(device, dtype, tol, config):
    m = make(device, dtype, **CONFIGS[config])
    u = torch.randn(2, 13, 16, device=device, dtype=dtype)
    with torch.no_grad():
        full = m(u)
    for L in (9, 2):  # (2 < d_conv: the conv state is padded with zeros in front)
        out, ip = decode(m, u, L)
        torch.testing.assert_close(out, full, rtol=tol, atol=tol)
        conv_state, ssm_state = ip.key_value_memory_dict[3]
        assert conv_state.shape == (2, m.conv1d.weight.shape[0], 4) and conv_state.stride(1) == 1
        assert ssm_state.shape == (2, m.nheads, 4, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_then_steps_over_drawn_configs(device):
    """The same property over layer configurations drawn by hypothesis (seeded: the
    "baracuda" profile): conv width 2 to 4 with and without a bias, groups, D per channel,
    the gated norm or the z gate, norm_before_gate, an MLP part, biases, dt_limit, the
    chunk, batch and both lengths (a prompt of 1 token, or shorter than the conv), float64."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=25)
    @hypothesis.given(data=st.data())
    def run(data):
        d = lambda strategy, label: data.draw(strategy, label=label)  # noqa: E731
        headdim, ngroups = d(st.sampled_from([2, 4, 8]), "headdim"), d(st.sampled_from([1, 2]), "ngroups")
        nheads = ngroups * d(st.sampled_from([1, 2, 3]), "heads a group")
        d_ssm, mlp = nheads * headdim, d(st.booleans(), "MLP part")
        d_model = d_ssm // 2 + (4 if mlp else 0)  # (expand 2: d_inner = d_ssm, or 8 more for the MLP)
        cfg = dict(d_model=d_model, d_state=d(st.sampled_from([1, 4, 8]), "d_state"),
                   d_conv=d(st.sampled_from([2, 3, 4]), "d_conv"), headdim=headdim, ngroups=ngroups,
                   d_ssm=d_ssm if mlp else None, D_has_hdim=d(st.booleans(), "D_has_hdim"),
                   rmsnorm=d(st.booleans(), "rmsnorm"), norm_before_gate=d(st.booleans(), "norm_before_gate"),
                   bias=d(st.booleans(), "bias"), conv_bias=d(st.booleans(), "conv_bias"),
                   dt_limit=d(st.sampled_from([(0.0, float("inf")), (0.02, 0.08)]), "dt_limit"),
                   chunk_size=d(st.sampled_from([1, 3, 4, 16]), "chunk_size"))
        batch, L, k = d(st.sampled_from([1, 3]), "batch"), d(st.sampled_from([1, 2, 5, 9]), "prompt"), \
            d(st.sampled_from([1, 4]), "steps")
        m = make(device, torch.float64, **cfg)
        u = torch.randn(batch, L + k, d_model, device=device, dtype=torch.float64,
                        generator=torch.Generator(device).manual_seed(L + 10 * k))
        with torch.no_grad():
            full = m(u)
        out, _ = decode(m, u, L)
        torch.testing.assert_close(out, full, rtol=1e-10, atol=1e-10, msg=lambda e: f"{cfg} L {L} k {k}: {e}")

    run()


@pytest.mark.parametrize("device", DEVICES)
def test_flattened_input(device):
    """u [B·L, d_model] with ``seqlen``, in the prefill and in the steps."""
    m = make(device, torch.float64)
    u = torch.randn(2, 7, 16, device=device, dtype=torch.float64)
    with torch.no_grad():
        full = m(u)
        ip = mamba.InferenceParams(max_seqlen=7, max_batch_size=2)
        outs = [m(u[:, :5].flatten(0, 1), seqlen=5, inference_params=ip).unflatten(0, (2, 5))]
        ip.seqlen_offset = 5
        for t in (5, 6):
            outs.append(m(u[:, t], seqlen=1, inference_params=ip)[:, None])
            ip.seqlen_offset += 1
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_prefill(device):
    """A packed prefill (batch 1, cu_seqlens and seq_idx) leaves one cache row per
    sequence; the steps then continue each sequence as its own forward would."""
    m = make(device, torch.float64, ngroups=2)
    lengths, k = [5, 2, 7], 3
    seqs = [torch.randn(1, n + k, 16, device=device, dtype=torch.float64) for n in lengths]
    packed = torch.cat([s[:, :n] for s, n in zip(seqs, lengths)], 1)
    cu = torch.tensor([0, 5, 7, 14], device=device, dtype=torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(3, device=device, dtype=torch.int32),
                                      torch.tensor(lengths, device=device))[None]
    ip = mamba.InferenceParams(max_seqlen=20, max_batch_size=3)
    with torch.no_grad():
        prefill = m(packed, seq_idx=seq_idx, cu_seqlens=cu, inference_params=ip)
        ip.seqlen_offset = 1
        steps = [m(torch.cat([s[:, n + t:n + t + 1] for s, n in zip(seqs, lengths)]), inference_params=ip)
                 for t in range(k)]
        for i, (s, n) in enumerate(zip(seqs, lengths)):
            full = m(s)
            start = sum(lengths[:i])
            torch.testing.assert_close(prefill[:, start:start + n], full[:, :n], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(torch.cat([st[i:i + 1] for st in steps], 1), full[:, n:], rtol=1e-10,
                                       atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_state_with_bfloat16_weights(device):
    """A bfloat16 layer decoding on a float32 SSM state (the conv state keeps the
    activations' dtype): within bfloat16's error of the forward."""
    m = make(device, torch.bfloat16)
    u = torch.randn(2, 10, 16, device=device, dtype=torch.bfloat16)
    ip = mamba.InferenceParams(max_seqlen=10, max_batch_size=2)
    conv_state, _ = m.allocate_inference_cache(2, 10)
    ip.key_value_memory_dict[3] = (conv_state, torch.zeros(2, m.nheads, 4, 8, device=device))
    with torch.no_grad():
        full = m(u).float()
        outs = [m(u[:, :6], inference_params=ip)]
        ip.seqlen_offset = 6
        for t in range(6, 10):
            outs.append(m(u[:, t:t + 1], inference_params=ip))
            ip.seqlen_offset += 1
    out = torch.cat(outs, 1).float()
    assert (out - full).abs().max() <= 0.05 * full.abs().max()


def test_allocate_inference_cache():
    """mamba_ssm's layout: conv_state [B, conv channels, d_conv] channel-last, in the
    conv weight's dtype (or dtype); ssm_state [B, H, headdim, d_state] in in_proj's."""
    m = make("cpu", torch.float32, ngroups=2)
    conv, ssm = m.allocate_inference_cache(3, 100)
    assert conv.shape == (3, 32 + 2 * 2 * 8, 4) and conv.stride() == (4 * 64, 1, 64) and conv.dtype == torch.float32
    assert ssm.shape == (3, 8, 4, 8) and ssm.dtype == torch.float32
    assert not conv.any() and not ssm.any()
    conv, ssm = m.allocate_inference_cache(1, 100, dtype=torch.float64)
    assert conv.dtype == ssm.dtype == torch.float64


def test_step_runs_baracuda_ops():
    """The decoding step is one causal_conv1d_update and one selective_state_update a
    layer (the prefill runs the chunked scan)."""
    m = make("cpu", torch.float32)
    u = torch.randn(2, 6, 16)
    ip = mamba.InferenceParams(max_seqlen=6, max_batch_size=2)
    with torch.no_grad(), CountOps() as prefill:
        m(u[:, :4], inference_params=ip)
    assert prefill.counts["ssd_chunk_scan_combined"] == 1
    ip.seqlen_offset = 4
    with torch.no_grad(), CountOps() as step:
        m(u[:, 4:5], inference_params=ip)
    assert step.counts["causal_conv1d_update"] == 1 and step.counts["selective_state_update"] == 1
    assert step.counts["ssd_chunk_scan_combined"] == 0


def test_step_errors():
    m = make("cpu", torch.float32)
    conv, ssm = m.allocate_inference_cache(2, 8)
    with pytest.raises(ValueError, match=r"Mamba2.step: hidden_states must have shape \[batch, 1, d_model\]"):
        m.step(torch.randn(2, 2, 16), conv, ssm)
    m.layer_idx = None
    with pytest.raises(ValueError, match=r"needs the layer's layer_idx"):
        m(torch.randn(2, 3, 16), inference_params=mamba.InferenceParams(8, 2))


@requires_cuda
@pytest.mark.parametrize("config", list(CONFIGS))
def test_cuda_prefill_then_steps(config):
    """The same on CUDA: float32 (within float32's error) and bfloat16 with a float32 SSM
    state (within bfloat16's)."""
    m = make("cuda", torch.float32, **CONFIGS[config])
    u = torch.randn(2, 13, 16, device="cuda")
    with torch.no_grad():
        full = m(u)
    out, _ = decode(m, u, 9)
    torch.testing.assert_close(out, full, rtol=2e-5, atol=2e-5)
    test_float32_state_with_bfloat16_weights("cuda")


def test_benchmark_cpu_smoke():
    """benchmarks/bench_mamba2_decode.py's CPU smoke run completes: both providers timed
    for the state update and the conv step, and the tiny patched model generates the stock
    model's tokens (what its note reports)."""
    import os
    import sys
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import bench_mamba2_decode as bench
    rows = bench.run_cpu(repeats=1)
    assert {(r.case.split(" B")[0], r.provider) for r in rows} >= {
        ("state update", "baracuda"), ("state update", "torch"), ("conv step", "baracuda"), ("conv step", "torch"),
        ("generate", "baracuda"), ("generate", "torch")}
    ours = next(r for r in rows if r.mode == "generate" and r.provider == "baracuda")
    assert "same tokens" in ours.note and "tokens/s" in ours.note
