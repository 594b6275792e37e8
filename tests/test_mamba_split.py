"""mamba.mamba_split_conv1d_scan_combined's fused path (mamba._SplitConv1dScan: the causal
conv1d, SSD, gated RMSNorm and SwiGLU ops in one autograd Function) in float64: the output,
final_states and every gradient (zxbcdt, the conv's weight and bias, dt_bias, A, D,
initial_states, the norm's and out_proj's weights and bias, from out and from final_states)
against the same ops composed through autograd (to float64 rounding) and against a
pure-PyTorch reference (reference.causal_conv1d, reference.ssd_chunk_scan_combined,
reference.gated_rms_norm, F.linear); options: seq_idx (int32 and int64, padding steps),
initial states, a d_mlp part, no out_proj, no norm (the scan gated by z), no activation,
one group and several, D [H] and [H, P]. Then what it keeps between the passes (mamba_ssm's
set: not the conv's output), final_states alone, torch.func's grad and vjp, the second derivative's error, autocast, the Mamba2 module on it,
mamba_ssm's signature, and on CUDA its agreement with the float64 reference."""
import inspect

import pytest
import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import mamba
from baracuda_torch import reference as ref
from helpers import requires_cuda
from test_ssd_chunk_scan import check, rtol_for

INF = float("inf")


def make_problem(config, dtype=torch.float64, device="cpu", seed=5):
    """The tensors of one call (leaves that take gradients) and its other arguments."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(device=device, dtype=dtype)

    b, L, H, P, N, W = 2, config.get("L", 19), 4, 3, 5, 4
    G, d_mlp = config["ngroups"], config["d_mlp"]
    dim = H * P
    t = {"zxbcdt": r(b, L, 2 * d_mlp + 2 * dim + 2 * G * N + H),
         "conv1d_weight": r(dim + 2 * G * N, W, scale=0.5),
         "conv1d_bias": r(dim + 2 * G * N, scale=0.1) if config.get("conv_bias", True) else None,
         "dt_bias": r(H, scale=0.3) - 1,
         "A": -torch.exp(r(H, scale=0.5)),
         "D": r(H, P) if config["D_hdim"] else r(H),
         "initial_states": r(b, H, P, N) if config["init"] else None,
         "rmsnorm_weight": 1 + r(dim, scale=0.1) if config["rms"] else None,
         "outproj_weight": r(7, d_mlp + dim, scale=0.25) if config.get("outproj", True) else None,
         "outproj_bias": r(7) if config.get("outproj", True) and config.get("out_bias", True) else None}
    seq = config.get("seq")
    seq_idx = None
    if seq:
        seq_idx = (torch.rand(b, L, generator=g) < 0.2).cumsum(1).to(torch.int32 if seq == "int32" else torch.int64)
        if config.get("padding"):
            seq_idx[:, :3] = -1
        seq_idx = seq_idx.to(device)
    kw = dict(seq_idx=seq_idx, headdim=None if config["D_hdim"] else P, ngroups=G,
              norm_before_gate=config["nbg"], activation=config.get("act", "silu"), rmsnorm_eps=1e-5,
              dt_limit=config.get("dt_limit", (0.0, INF)))
    return t, kw


ARGS = ("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D")
KWARGS = ("initial_states", "rmsnorm_weight", "outproj_weight", "outproj_bias")


def fused(t, kw, chunk):
    return mamba.mamba_split_conv1d_scan_combined(*(t[k] for k in ARGS), chunk, return_final_states=True,
                                                  **{k: t[k] for k in KWARGS}, **kw)


def dims(t, kw):
    D = t["D"]
    H = D.size(0)
    P = kw["headdim"] if D.dim() == 1 else D.size(1)
    G = kw["ngroups"]
    dim = H * P
    N = (t["conv1d_weight"].size(0) - dim) // G // 2
    d_mlp = (t["zxbcdt"].size(-1) - 2 * dim - 2 * G * N - H) // 2
    return H, P, G, N, dim, d_mlp


def unfused(t, kw, chunk):
    """The same computation composed from the public ops through autograd (the conv on
    the channel-last slice, the scan, the gated norm, SwiGLU, a concatenation, F.linear)."""
    H, P, G, N, dim, d_mlp = dims(t, kw)
    zx0, z, xBC, dt = torch.split(t["zxbcdt"], [2 * d_mlp, dim, dim + 2 * G * N, H], -1)
    seq_idx = kw["seq_idx"]
    xBC = bt.causal_depthwise_conv1d(xBC.transpose(1, 2), t["conv1d_weight"], t["conv1d_bias"],
                                     seq_idx=seq_idx.int() if seq_idx is not None else None,
                                     activation=kw["activation"]).transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, G * N, G * N], -1)
    rms = t["rmsnorm_weight"] is not None
    y, final = mamba.mamba_chunk_scan_combined(
        x.unflatten(-1, (H, P)), dt, t["A"], B.unflatten(-1, (G, N)), C.unflatten(-1, (G, N)), chunk,
        D=t["D"], z=None if rms else z.unflatten(-1, (H, P)), dt_bias=t["dt_bias"],
        initial_states=t["initial_states"], seq_idx=seq_idx, dt_softplus=True, dt_limit=kw["dt_limit"],
        return_final_states=True)
    y = y.flatten(-2)
    if rms:
        y = bt.gated_rms_norm(y, t["rmsnorm_weight"], z, kw["rmsnorm_eps"], dim // G, kw["norm_before_gate"])
    if d_mlp:
        y = torch.cat([bt.gated_activation(zx0, "swiglu", gate_first=True), y], -1)
    if t["outproj_weight"] is not None:
        y = F.linear(y, t["outproj_weight"], t["outproj_bias"])
    return y, final


def pure_reference(t, kw, chunk):
    """The computation in plain PyTorch from reference.py's float64 statements."""
    H, P, G, N, dim, d_mlp = dims(t, kw)
    zx0, z, xBC, dt = torch.split(t["zxbcdt"], [2 * d_mlp, dim, dim + 2 * G * N, H], -1)
    seq_idx = kw["seq_idx"]
    xBC = ref.causal_conv1d(xBC.transpose(1, 2), t["conv1d_weight"], t["conv1d_bias"], seq_idx, None,
                            kw["activation"])[0].transpose(1, 2)
    x, B, C = torch.split(xBC, [dim, G * N, G * N], -1)
    rms = t["rmsnorm_weight"] is not None
    y, final = ref.ssd_chunk_scan_combined(
        x.unflatten(-1, (H, P)), dt, t["A"], B.unflatten(-1, (G, N)), C.unflatten(-1, (G, N)), chunk,
        D=t["D"], z=None if rms else z.unflatten(-1, (H, P)), dt_bias=t["dt_bias"],
        initial_states=t["initial_states"], seq_idx=seq_idx, dt_softplus=True, dt_limit=kw["dt_limit"],
        return_final_states=True)
    y = y.flatten(-2)
    if rms:
        y = ref.gated_rms_norm(y, t["rmsnorm_weight"], None, z, kw["rmsnorm_eps"], dim // G,
                               kw["norm_before_gate"])[0]
    if d_mlp:
        y = torch.cat([F.silu(zx0[..., :d_mlp]) * zx0[..., d_mlp:], y], -1)
    if t["outproj_weight"] is not None:
        y = F.linear(y, t["outproj_weight"], t["outproj_bias"])
    return y, final


def outputs_and_grads(fn, t, kw, chunk, dout, dfinal):
    leaves = {k: v.detach().requires_grad_() for k, v in t.items() if v is not None}
    args = {k: leaves.get(k) for k in t}
    out, final = fn(args, kw, chunk)
    grads = torch.autograd.grad([out, final], list(leaves.values()), [dout, dfinal])
    return out, final, dict(zip(leaves, grads))


CONFIGS = [
    dict(rms=True, nbg=False, D_hdim=False, d_mlp=0, ngroups=1, seq=None, init=False),  # Mamba2's
    dict(rms=True, nbg=True, D_hdim=True, d_mlp=3, ngroups=2, seq="int32", init=True),
    dict(rms=True, nbg=False, D_hdim=False, d_mlp=2, ngroups=2, seq="int64", init=False, outproj=False),
    dict(rms=False, nbg=True, D_hdim=False, d_mlp=0, ngroups=2, seq="int32", init=True),
    dict(rms=False, nbg=True, D_hdim=True, d_mlp=2, ngroups=1, seq=None, init=True, out_bias=False),
    dict(rms=False, nbg=True, D_hdim=False, d_mlp=0, ngroups=1, seq=None, init=False, outproj=False,
         act=None, conv_bias=False, dt_limit=(0.05, 0.9)),
    dict(rms=True, nbg=True, D_hdim=False, d_mlp=0, ngroups=4, seq="int32", padding=True, init=False, L=33),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_fused_matches_unfused_and_reference(config):
    """float64, CPU: out, final_states and every gradient of the fused Function equal the
    composition of the same ops to float64 rounding (1e-12 of each output's scale), and
    the pure-PyTorch reference to 1e-10 (the SSD scan's float64 bound)."""
    t, kw = make_problem(config)
    chunk = 6
    out_ref, final_ref = pure_reference(t, kw, chunk)
    g = torch.Generator().manual_seed(9)
    dout = torch.randn(out_ref.shape, generator=g, dtype=torch.float64)
    dfinal = torch.randn(final_ref.shape, generator=g, dtype=torch.float64)
    ours = outputs_and_grads(fused, t, kw, chunk, dout, dfinal)
    comp = outputs_and_grads(unfused, t, kw, chunk, dout, dfinal)
    expect = outputs_and_grads(pure_reference, t, kw, chunk, dout, dfinal)
    assert ours[0].dtype == torch.float64 and ours[1].dtype == torch.float64
    for name, a, c, e in (("out", ours[0], comp[0], expect[0]), ("final_states", ours[1], comp[1], expect[1])):
        check(a, c, 1e-12, f"{name} vs the composition")
        check(a, e, 1e-10, f"{name} vs the reference")
    assert set(ours[2]) == set(expect[2])
    for k in ours[2]:
        a = ours[2][k]
        assert a.shape == t[k].shape and a.dtype == t[k].dtype, k
        check(a, comp[2][k], 1e-12, f"d{k} vs the composition")
        check(a, expect[2][k], 1e-10, f"d{k} vs the reference")


def test_gradient_from_final_states_alone():
    """Only final_states used: the gradients are those of the reference through the
    state alone (dout is zero), no error from the unused output."""
    t, kw = make_problem(CONFIGS[1])
    leaves = {k: v.detach().requires_grad_() for k, v in t.items() if v is not None}
    _, final = fused({k: leaves.get(k) for k in t}, kw, 6)
    got = torch.autograd.grad(final.sum(), list(leaves.values()), allow_unused=True)
    ref_leaves = {k: v.detach().requires_grad_() for k, v in t.items() if v is not None}
    _, final_r = pure_reference({k: ref_leaves.get(k) for k in t}, kw, 6)
    expected = torch.autograd.grad(final_r.sum(), list(ref_leaves.values()), allow_unused=True)
    for k, a, e in zip(leaves, got, expected):
        e = torch.zeros_like(leaves[k]) if e is None else e
        a = torch.zeros_like(leaves[k]) if a is None else a
        check(a, e, 1e-10, f"d{k} from final_states")


def saved_by(fn, t, kw):
    """The tensors autograd keeps from the forward of fn (its saved_tensors_hooks)."""
    saved = []
    leaves = {k: (v.detach().requires_grad_() if v is not None else None) for k, v in t.items()}
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s) or s, lambda s: s):
        fn(leaves, kw, 8)
    return leaves, saved


def test_keeps_what_mamba_ssm_keeps():
    """Between the passes the fused Function keeps zxbcdt and one [B, L, H, P] tensor (the
    scan's output) of the per-token tensors, as mamba_ssm's does, and not the conv's
    output [B, L, dim + 2GN], which the backward recomputes; the composition of the same
    ops does keep the conv's output (what the Function saves)."""
    t, kw = make_problem(dict(rms=True, nbg=False, D_hdim=False, d_mlp=0, ngroups=1, seq="int32",
                              init=False, L=64))
    H, P, G, N, dim, _ = dims(t, kw)
    b, L, _ = t["zxbcdt"].shape
    conv_out = b * L * (dim + 2 * G * N)

    def per_token(saved):
        return [s for s in saved if s.numel() >= b * L * min(dim, G * N)]

    leaves, saved = saved_by(fused, t, kw)
    big = per_token(saved)
    kinds = sorted(tuple(s.shape) for s in big)
    assert kinds == sorted([tuple(t["zxbcdt"].shape), (b, L, H, P)]), kinds
    assert any(s.data_ptr() == leaves["zxbcdt"].data_ptr() for s in big)
    assert sum(s.numel() for s in saved) < t["zxbcdt"].numel() + b * L * dim + conv_out // 4
    _, saved_unfused = saved_by(unfused, t, kw)
    # the composition's SSD op keeps x, B and C: views of the conv's output
    assert any(s.untyped_storage().nbytes() >= conv_out * 8 and s.data_ptr() != leaves["zxbcdt"].data_ptr()
               and s.shape[-1] != t["zxbcdt"].shape[-1] for s in per_token(saved_unfused))


def test_dzxbcdt_is_one_buffer():
    """zxbcdt's gradient arrives as one tensor with zxbcdt's layout (every part written
    into its slice), and an unused part (no d_mlp) costs nothing."""
    t, kw = make_problem(CONFIGS[1])
    leaves = {k: v.detach().requires_grad_() for k, v in t.items() if v is not None}
    grads = []
    leaves["zxbcdt"].register_hook(lambda g: grads.append(g))
    out, final = fused({k: leaves.get(k) for k in t}, kw, 6)
    (out.sum() + final.sum()).backward()
    (g,) = grads
    assert g.shape == t["zxbcdt"].shape and g.stride() == leaves["zxbcdt"].stride()
    assert torch.isfinite(g).all()
    assert type(out.grad_fn).__name__ == "_SplitConv1dScanBackward"


def test_mamba2_runs_the_fused_function():
    """Mamba2's forward is the fused Function (its output's grad_fn), forward and
    gradients as the composition of the ops with the module's parameters."""
    torch.manual_seed(3)
    m = mamba.Mamba2(d_model=16, d_state=8, headdim=4, ngroups=2, chunk_size=8, dtype=torch.float64)
    u = torch.randn(2, 13, 16, dtype=torch.float64)
    out = m(u)
    assert type(out.grad_fn).__name__ == "_SplitConv1dScanBackward"
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    zxbcdt = m.in_proj(u)
    t = {"zxbcdt": zxbcdt, "conv1d_weight": m.conv1d.weight.squeeze(1), "conv1d_bias": m.conv1d.bias,
         "dt_bias": m.dt_bias, "A": -torch.exp(m.A_log.float()), "D": m.D, "initial_states": None,
         "rmsnorm_weight": m.norm.weight, "outproj_weight": m.out_proj.weight, "outproj_bias": None}
    kw = dict(seq_idx=None, headdim=4, ngroups=2, norm_before_gate=False, activation="silu",
              rmsnorm_eps=1e-5, dt_limit=(0.0, INF))
    expected, _ = unfused(t, kw, 8)
    check(out, expected.detach(), 1e-12, "Mamba2 out")
    expected.sum().backward()
    for n, p in m.named_parameters():
        check(grads[n], p.grad, 1e-12, f"Mamba2 d{n}")


def test_autocast_cpu_bfloat16():
    """Under CPU autocast (bfloat16) a float32 Mamba2 gives a bfloat16 output, float32
    parameter gradients, and what the composition of the ops gives under the same
    autocast (out_proj in bfloat16 there too)."""
    torch.manual_seed(4)
    m = mamba.Mamba2(d_model=32, d_state=8, headdim=8, chunk_size=8)
    u = torch.randn(2, 20, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(u)
        zxbcdt = m.in_proj(u)
        t = {"zxbcdt": zxbcdt, "conv1d_weight": m.conv1d.weight.squeeze(1), "conv1d_bias": m.conv1d.bias,
             "dt_bias": m.dt_bias, "A": -torch.exp(m.A_log.float()), "D": m.D, "initial_states": None,
             "rmsnorm_weight": m.norm.weight, "outproj_weight": m.out_proj.weight, "outproj_bias": None}
        kw = dict(seq_idx=None, headdim=8, ngroups=1, norm_before_gate=False, activation="silu",
                  rmsnorm_eps=1e-5, dt_limit=(0.0, INF))
        expected, _ = unfused(t, kw, 8)
    assert out.dtype == torch.bfloat16 and expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, list(m.parameters()), dout)
    exp = torch.autograd.grad(expected, list(m.parameters()), dout)
    for (n, p), a, e in zip(m.named_parameters(), got, exp):
        assert a.dtype == p.dtype == torch.float32, n
        torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2 * e.abs().max().item(), msg=n)


@pytest.mark.parametrize("config", [CONFIGS[1], CONFIGS[3]], ids=["norm_mlp", "no_norm"])
def test_torch_func_grad_and_vjp(config):
    """torch.func.grad and vjp through the Function give torch.autograd's gradients."""
    from torch.func import grad, vjp
    t, kw = make_problem(config)
    names = [k for k, v in t.items() if v is not None]

    def loss(*ts):
        out, final = fused({**t, **dict(zip(names, ts))}, kw, 6)
        return out.sin().sum() + final.cos().sum()

    inputs = [t[k] for k in names]
    got = grad(loss, argnums=tuple(range(len(names))))(*inputs)
    leaves = [v.detach().requires_grad_() for v in inputs]
    expected = torch.autograd.grad(loss(*leaves), leaves)
    for k, a, e in zip(names, got, expected):
        torch.testing.assert_close(a, e, msg=k)
    (out, final), pullback = vjp(lambda zx: fused({**t, "zxbcdt": zx}, kw, 6), t["zxbcdt"])
    v = (torch.randn_like(out), torch.randn_like(final))
    (dzx,) = pullback(v)
    leaf = t["zxbcdt"].detach().requires_grad_()
    o2, f2 = fused({**t, "zxbcdt": leaf}, kw, 6)
    torch.testing.assert_close(dzx, torch.autograd.grad((o2, f2), leaf, v)[0])


def test_second_derivative_raises():
    """The Function is differentiable once (its ops are): a second derivative raises."""
    t, kw = make_problem(CONFIGS[0])
    leaf = t["zxbcdt"].detach().requires_grad_()
    out, _ = fused({**t, "zxbcdt": leaf}, kw, 6)
    (g,) = torch.autograd.grad(out.pow(2).sum(), leaf, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


def test_signature_is_mamba_ssms():
    """mamba_ssm's parameters, in its order, with its defaults (then state_dtype and the
    keyword cp_group, which it does not have)."""
    params = list(inspect.signature(mamba.mamba_split_conv1d_scan_combined).parameters.values())
    empty = inspect.Parameter.empty
    assert [(p.name, p.default) for p in params] == [
        ("zxbcdt", empty), ("conv1d_weight", empty), ("conv1d_bias", empty), ("dt_bias", empty), ("A", empty),
        ("D", empty), ("chunk_size", empty), ("initial_states", None), ("seq_idx", None),
        ("dt_limit", (0.0, INF)), ("return_final_states", False), ("activation", "silu"),
        ("rmsnorm_weight", None), ("rmsnorm_eps", 1e-6), ("outproj_weight", None), ("outproj_bias", None),
        ("headdim", None), ("ngroups", 1), ("norm_before_gate", True), ("state_dtype", None),
        ("cp_group", None)]
    assert params[-1].kind == inspect.Parameter.KEYWORD_ONLY


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[1], CONFIGS[3], CONFIGS[6]],
                         ids=["mamba2", "mlp", "no_norm", "padding"])
def test_cuda_matches_reference(config, dtype):
    """On CUDA, against the float64 reference on the CPU within the SSD scan's CUDA bound
    for the dtype (rtol_for), every gradient included."""
    t, kw = make_problem(config, dtype, "cuda")
    chunk = 6
    t64 = {k: (v.double().cpu() if v is not None else None) for k, v in t.items()}
    kw64 = {**kw, "seq_idx": kw["seq_idx"].cpu() if kw["seq_idx"] is not None else None}
    out_ref, final_ref = pure_reference(t64, kw64, chunk)
    dout = torch.randn(out_ref.shape, dtype=torch.float64)
    dfinal = torch.randn(final_ref.shape, dtype=torch.float64)
    ours = outputs_and_grads(fused, t, kw, chunk, dout.to("cuda", dtype), dfinal.to("cuda", ours_state(dtype)))
    expect = outputs_and_grads(pure_reference, t64, kw64, chunk, dout, dfinal)
    rtol = rtol_for(dtype, "cuda")
    check(ours[0], expect[0], rtol, "out")
    check(ours[1], expect[1], rtol, "final_states")
    for k in ours[2]:
        assert ours[2][k].dtype == dtype, k
        check(ours[2][k], expect[2][k], rtol, f"d{k}")


def ours_state(dtype):
    """final_states' dtype: float32, float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32
