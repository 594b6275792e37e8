"""The body of a Mamba-2 2.7B layer after in_proj, bf16: mamba_split_conv1d_scan_combined on
zxbcdt [B4, L4096, 10576] (d_inner 5120, headdim 64: H = 80, one group of d_state 128,
d_conv 4, chunk 256, the gated RMSNorm with the gate before the norm, out_proj to
d_model 2560), float32 A, D and dt_bias as the Mamba2 module passes them.
Providers: baracuda (the fused autograd Function, mamba.mamba_split_conv1d_scan_combined);
unfused (the same ops composed through autograd: conv on the channel-last slice, scan,
gated norm, out_proj; it keeps the conv's output for the backward); mamba_ssm (its
mamba_split_conv1d_scan_combined where peers/ has it together with the causal-conv1d
package, after a check that its output agrees with ours).
Modes: forward, backward (the backward pass alone, every gradient), full; peak memory of
full. No byte or FLOP count: out_proj's product and the scan's tensor-core work dominate,
and the point of the comparison is the time and memory around them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import baracuda_torch as bt
import peers
from baracuda_torch import mamba
from harness import Row, backward_fn, format_table, full_fn, measure

FAMILY = "mamba_split"
B, L, D_MODEL, D_INNER, HEADDIM, D_STATE, NGROUPS, D_CONV, CHUNK = 4, 4096, 2560, 5120, 64, 128, 1, 4, 256


def make(dtype=torch.bfloat16, device="cuda", b=B, L_=L, d_model=D_MODEL, d_inner=D_INNER, headdim=HEADDIM,
         d_state=D_STATE):
    H = d_inner // headdim
    conv_dim = d_inner + 2 * NGROUPS * d_state
    g = torch.Generator(device=device).manual_seed(0)

    def r(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, device=device, dtype=dt, generator=g)).requires_grad_()

    zxbcdt = r(b, L_, 2 * d_inner + 2 * NGROUPS * d_state + H)
    args = dict(conv1d_weight=r(conv_dim, D_CONV, scale=0.5), conv1d_bias=r(conv_dim, scale=0.1),
                dt_bias=r(H, scale=0.3, dt=torch.float32),
                A=(-torch.rand(H, device=device, generator=g) * 8 - 1).requires_grad_(),
                D=r(H, dt=torch.float32), rmsnorm_weight=r(d_inner, scale=0.1),
                outproj_weight=r(d_model, d_inner, scale=d_inner ** -0.5))
    return zxbcdt, args


def baracuda_fn(zxbcdt, a, headdim=HEADDIM):
    return mamba.mamba_split_conv1d_scan_combined(
        zxbcdt, a["conv1d_weight"], a["conv1d_bias"], a["dt_bias"], a["A"], a["D"], CHUNK,
        rmsnorm_weight=a["rmsnorm_weight"], rmsnorm_eps=1e-5, outproj_weight=a["outproj_weight"],
        headdim=headdim, ngroups=NGROUPS, norm_before_gate=False)


def unfused_fn(zxbcdt, a, headdim=HEADDIM):
    dim = a["rmsnorm_weight"].numel()
    H = dim // headdim
    gn = (a["conv1d_weight"].size(0) - dim) // 2
    z, xBC, dt = torch.split(zxbcdt, [dim, dim + 2 * gn, H], -1)
    xBC = bt.causal_depthwise_conv1d(xBC.transpose(1, 2), a["conv1d_weight"], a["conv1d_bias"],
                                     activation="silu").transpose(1, 2)
    x, Bm, Cm = torch.split(xBC, [dim, gn, gn], -1)
    y = mamba.mamba_chunk_scan_combined(x.unflatten(-1, (H, headdim)), dt, a["A"], Bm.unflatten(-1, (NGROUPS, -1)),
                                        Cm.unflatten(-1, (NGROUPS, -1)), CHUNK, D=a["D"], dt_bias=a["dt_bias"],
                                        dt_softplus=True)
    y = bt.gated_rms_norm(y.flatten(-2), a["rmsnorm_weight"], z, 1e-5, dim // NGROUPS, False)
    return F.linear(y, a["outproj_weight"])


def mamba_ssm_split():
    """mamba_ssm's mamba_split_conv1d_scan_combined, when it and the causal-conv1d package
    it calls are both importable."""
    def mamba_ssm():
        from mamba_ssm.ops.triton import ssd_combined
        if ssd_combined.causal_conv1d_fwd_function is None:
            raise ImportError("the causal-conv1d package is not installed")
        return ssd_combined.mamba_split_conv1d_scan_combined
    return peers._try(mamba_ssm)


def run(dtype=torch.bfloat16, providers=("baracuda", "unfused", "mamba_ssm")) -> list[Row]:
    rows: list[Row] = []
    zxbcdt, a = make(dtype)
    inputs = [zxbcdt] + list(a.values())
    fns = {"baracuda": lambda: baracuda_fn(zxbcdt, a), "unfused": lambda: unfused_fn(zxbcdt, a)}
    theirs = mamba_ssm_split() if "mamba_ssm" in providers else None
    if theirs is not None:
        def mamba_ssm():
            return theirs(zxbcdt, a["conv1d_weight"], a["conv1d_bias"], a["dt_bias"], a["A"], a["D"], CHUNK,
                          rmsnorm_weight=a["rmsnorm_weight"], rmsnorm_eps=1e-5, outproj_weight=a["outproj_weight"],
                          headdim=HEADDIM, ngroups=NGROUPS, norm_before_gate=False)
        with torch.no_grad():
            note = peers.agree(fns["baracuda"](), mamba_ssm(), "mamba_split_conv1d_scan_combined mamba_ssm", 2e-2)
        fns["mamba_ssm"] = mamba_ssm
        fns["mamba_ssm"].note = note
    case = f"B{B} L{L} d_inner {D_INNER} H{D_INNER // HEADDIM} N{D_STATE} G{NGROUPS}"
    dout = torch.randn(B, L, D_MODEL, device="cuda", dtype=dtype)
    for provider in providers:
        fn = fns.get(provider)
        if fn is None:
            continue
        note = getattr(fn, "note", "")
        with torch.no_grad():
            rows.append(measure(FAMILY, case, dtype, provider, "forward", fn, note=note))
        rows.append(measure(FAMILY, case, dtype, provider, "backward", backward_fn(fn, inputs, dout), note=note))
        rows.append(measure(FAMILY, case, dtype, provider, "full", full_fn(fn, inputs, dout), with_memory=True,
                            note=note))
    return rows


if __name__ == "__main__":
    print(format_table(run()))
