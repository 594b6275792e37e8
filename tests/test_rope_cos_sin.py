"""baracuda::rope_cos_sin / rope_qk_cos_sin (+ backwards): RoPE from caller-given cos/sin
tables in Hugging Face's [Bc, S, R] and flash-attention's [S, R/2] layouts. Float64
reference, every dtype and table dtype, both pair layouts, partial rotary, GQA, strided
and [B, S, H, D] inputs, poisoned outputs, gradcheck (cos/sin included), Hugging Face's
signature. (Opcheck, torch.compile, meta and the bad-input table: tests/op_db.py, run by
tests/test_ops.py.)"""
import pytest
import torch

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import DEVICES, FLOAT_DTYPES, assert_close_to_reference, randn

ops = torch.ops.baracuda


def angles(B, S, R, per_batch, device, base=10000.0):
    """θ [B or 1, S, R/2] in float64 from random positions."""
    pos = torch.randint(0, 4096, (B if per_batch else 1, S), dtype=torch.float64)
    inv = base ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    return (pos[..., None] * inv).to(device)


def table(theta, layout, interleaved, dtype):
    """(cos, sin) in the op's layouts: "full" [Bc, S, R] (HF), "half" [S, R/2]."""
    c, s = theta.cos(), theta.sin()
    if layout == "half":
        return c[0].to(dtype), s[0].to(dtype)
    if interleaved:
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
    else:
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
    return c.to(dtype), s.to(dtype)


def check_qk(q, k, cos, sin, interleaved, what):
    """Forward and both input gradients against the float64 reference; PyTorch's own
    formula in q's dtype (table cast to it) is the baseline."""
    qg = q.detach().clone().requires_grad_()
    kg = k.detach().clone().requires_grad_()
    yq, yk = bt.rope_qk_cos_sin(qg, kg, cos, sin, interleaved)
    assert yq.dtype == q.dtype and yk.dtype == k.dtype
    c64, s64 = cos.double(), sin.double()
    cl, sl = cos.to(q.dtype), sin.to(q.dtype)
    for x, y, name in ((q, yq, "q"), (k, yk, "k")):
        assert_close_to_reference(y, ref.rope_cos_sin(x.double(), c64, s64, interleaved),
                                  ref.rope_cos_sin(x, cl, sl, interleaved), f"{what} {name}")
    gq, gk = torch.randn_like(yq), torch.randn_like(yk)
    torch.autograd.backward((yq, yk), (gq, gk))
    for x, g, name in ((qg, gq, "dq"), (kg, gk, "dk")):
        assert_close_to_reference(x.grad, ref.rope_cos_sin(g.double(), c64, s64, interleaved, True),
                                  ref.rope_cos_sin(g, cl, sl, interleaved, True), f"{what} {name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["full", "half"])
def test_matches_reference(device, dtype, interleaved, layout):
    for B, Hq, Hk, S, D, R, per_batch in ((2, 4, 2, 7, 32, 32, False), (3, 6, 1, 5, 40, 24, True),
                                          (1, 2, 2, 33, 128, 128, False), (2, 3, 3, 4, 10, 2, True),
                                          (2, 8, 2, 16, 64, 32, False)):
        if layout == "half" and per_batch:
            per_batch = False  # the [S, R/2] layout has no batch dim
        theta = angles(B, S, R, per_batch, device)
        for tdtype in {torch.float32, dtype}:
            cos, sin = table(theta, layout, interleaved, tdtype)
            q = randn((B, Hq, S, D), dtype, device, 2.0)
            k = randn((B, Hk, S, D), dtype, device, 2.0)
            check_qk(q, k, cos, sin, interleaved,
                     f"{dtype} table={tdtype} {layout} il={interleaved} {B, Hq, Hk, S, D, R}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_single_tensor_op_and_hf_formula(device, dtype):
    """rope_cos_sin(x) equals HF's x·cos + rotate_half(x)·sin, also for tables whose halves
    differ (the full-width layout applies each entry to its own feature)."""
    B, H, S, D = 2, 3, 9, 64
    x = randn((B, H, S, D), dtype, device)
    cos, sin = randn((1, S, D), torch.float32, device), randn((1, S, D), torch.float32, device)
    y = bt.rope_cos_sin(x, cos, sin)
    y64 = ref.rope_hf(x.double(), cos.double()[:, None], sin.double()[:, None])
    assert_close_to_reference(y, y64, ref.rope_hf(x, cos.to(dtype)[:, None], sin.to(dtype)[:, None]),
                              f"rope_cos_sin {dtype}")
    # an HF table already unsqueezed to [Bc, 1, S, R] is accepted by the wrapper
    torch.testing.assert_close(bt.rope_cos_sin(x, cos[:, None], sin[:, None]), y, rtol=0, atol=0)
    # the one-tensor op and the q/k op agree bitwise
    yq, yk = bt.rope_qk_cos_sin(x, x[:, :1], cos, sin)
    assert torch.equal(yq, y) and torch.equal(yk, y[:, :1])


@pytest.fixture(params=["auto", "off"])
def walk32(request):
    """The CUDA plans' kernel on the vector path: the plan's (the walk on 32-bit offsets
    wherever the offsets fit) or the 64-bit kernel (explain's `_i64` variants)."""
    previous = bt._C._rope_cos_sin_walk32(request.param)
    yield request.param
    bt._C._rope_cos_sin_walk32(previous)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_strided_and_bshd(device, dtype, interleaved, walk32):
    if device == "cpu" and walk32 != "auto":
        pytest.skip("a CUDA kernel's switch")
    B, S, Hq, Hk, D, R = 2, 11, 4, 2, 48, 32
    theta = angles(B, S, R, True, device)
    cos, sin = table(theta, "full", interleaved, torch.float32)
    # [B, S, H, D] storage, seen as [B, H, S, D]: the output keeps the storage order
    q = randn((B, S, Hq, D), dtype, device).transpose(1, 2)
    k = randn((B, S, Hk, D), dtype, device).transpose(1, 2)
    yq, yk = bt.rope_qk_cos_sin(q, k, cos, sin, interleaved)
    assert yq.stride() == q.stride() and yk.stride() == k.stride()
    check_qk(q, k, cos, sin, interleaved, "bshd")
    # feature stride 2, a sliced head dim, a strided table
    q2 = randn((B, Hq, S, 2 * D), dtype, device)[..., ::2]
    k2 = randn((B, Hk, S, D + 8), dtype, device)[..., 4:D + 4]
    cs = torch.stack((cos, cos), -1).flatten(-2)[..., ::2]  # cos's values as a stride-2 view
    ss = torch.stack((sin, sin), -1).flatten(-2)[..., ::2]
    assert cs.stride(-1) == 2 and torch.equal(cs, cos)
    check_qk(q2, k2, cs, ss, interleaved, "strided")
    # a table shared by the batch, expanded (batch stride 0)
    c1, s1 = cos[:1].expand(B, S, R), sin[:1].expand(B, S, R)
    check_qk(q2, k2, c1, s1, interleaved, "expanded table")


@pytest.fixture(params=["auto", "any", "never"])
def table_vectors(request):
    """The CUDA plans' table reads: the plan's rule (16-byte vectors for float32 tables of
    16-bit data), vectors for every table whose runs are whole aligned vectors, or none."""
    previous = bt._C._rope_cos_sin_table_vectors(request.param)
    yield request.param
    bt._C._rope_cos_sin_table_vectors(previous)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernel variants")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["full", "half"])
def test_cuda_table_vectors_and_their_fallbacks(dtype, interleaved, layout, table_vectors, walk32):
    """The CUDA kernel reads the table in 16-byte vectors (vec16_table16) where every run of
    a thread's entries is whole vectors at aligned addresses and the setting allows it (the
    plan's rule: float32 tables of 16-bit data), else entry by entry: a table one entry off
    16 bytes and rows padded off 16 bytes fall back; each against float64, in both kernels
    (the 64-bit one and the walk on 32-bit offsets). A table whose entries are not adjacent
    takes the 64-bit kernel whatever the setting."""
    B, Hq, Hk, S = 2, 4, 2, 9
    for D, R in ((128, 128), (128, 64), (64, 48)):
        theta = angles(B, S, R, layout == "full", "cuda")
        q, k = randn((B, Hq, S, D), dtype, "cuda"), randn((B, Hk, S, D), dtype, "cuda")
        for tdtype in {torch.float32, dtype}:
            cos, sin = table(theta, layout, interleaved, tdtype)
            per = 16 // cos.element_size()
            pairs = (16 // q.element_size()) // (2 if interleaved else 1)
            run = pairs * (2 if interleaved and layout == "full" else 1)
            whole = run % per == 0 and (layout == "half" or interleaved or (R // 2) % per == 0)
            if table_vectors == "auto":
                whole = whole and tdtype == torch.float32 and q.element_size() == 2
            whole = whole and table_vectors != "never"
            cases = {"contiguous": (cos, sin, whole)}
            off = torch.zeros(cos.numel() + 1, dtype=tdtype, device="cuda")  # one entry off
            cases["offset"] = (off[1:].view(cos.shape).copy_(cos), sin.clone(), False)
            pad = torch.zeros(*cos.shape[:-1], cos.shape[-1] + 1, dtype=tdtype, device="cuda")
            pad = pad[..., :cos.shape[-1]].copy_(cos)  # rows one entry longer
            cases["padded rows"] = (pad, sin, False)
            # the same values at every other entry of a buffer twice as long
            spread = torch.stack((cos, cos), -1).flatten(-2)[..., ::2]
            cases["entry stride 2"] = (spread, torch.stack((sin, sin), -1).flatten(-2)[..., ::2], False)
            for name, (c, s, vec) in cases.items():
                what = f"{dtype} table={tdtype} {layout} il={interleaved} D={D} R={R} {name} ({table_vectors}, {walk32})"
                want = "vec16_table16" if vec else "vec16"
                if walk32 == "off" or name == "entry stride 2":
                    want += "_i64"
                assert bt.explain("rope_qk_cos_sin", q, k, c, s, interleaved).variant == want, what
                check_qk(q, k, c, s, interleaved, what)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_output_element_written(device, dtype):
    """Deterministic mode fills fresh outputs with NaN: any element the kernel skips stays NaN."""
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    for B, Hq, Hk, S, D, R in ((2, 3, 1, 5, 40, 16), (1, 8, 8, 17, 128, 64), (3, 1, 2, 2, 6, 2)):
        for layout in ("full", "half"):
            for il in (False, True):
                cos, sin = table(angles(B, S, R, False, device), layout, il, dtype)
                q, k = randn((B, Hq, S, D), dtype, device), randn((B, Hk, S, D), dtype, device)
                for y in (*ops.rope_qk_cos_sin(q, k, cos, sin, il),
                          *ops.rope_qk_cos_sin_backward(q, k, cos, sin, il),
                          ops.rope_cos_sin(q, cos, sin, il), ops.rope_cos_sin_backward(k, cos, sin, il)):
                    assert not y.isnan().any(), f"unwritten output {dtype} {layout} il={il} {B, Hq, Hk, S, D, R}"
                # pass-through features are copied exactly
                yq, _ = ops.rope_qk_cos_sin(q, k, cos, sin, il)
                assert torch.equal(yq[..., R:], q[..., R:])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["full", "half"])
def test_cpu_row_kernel_tails(dtype, interleaved, layout):
    """Every vector step and tail of the CPU row kernel (both pair layouts, unit feature
    stride): head dims and rotated widths off and on the 8- and 16-feature steps, partial
    rotary, per-batch tables, fresh outputs NaN-filled (deterministic mode); forward and
    both gradients against float64, and the strided scalar loop on the same values."""
    torch.use_deterministic_algorithms(True)
    for B, Hq, Hk, S, D, R in ((2, 3, 1, 5, 2, 2), (1, 2, 2, 4, 14, 10), (2, 1, 3, 3, 18, 18),
                               (1, 2, 1, 6, 34, 30), (2, 2, 2, 3, 62, 46), (1, 1, 2, 5, 136, 98)):
        theta = angles(B, S, R, layout == "full", "cpu")
        cos, sin = table(theta, layout, interleaved, torch.float32)
        q, k = randn((B, Hq, S, D), dtype, "cpu", 2.0), randn((B, Hk, S, D), dtype, "cpu", 2.0)
        what = f"{dtype} {layout} il={interleaved} {B, Hq, Hk, S, D, R}"
        check_qk(q, k, cos, sin, interleaved, what)
        yq, yk = ops.rope_qk_cos_sin(q, k, cos, sin, interleaved)
        # the same values at feature stride 2 take the scalar loop
        q2 = torch.zeros((B, Hq, S, 2 * D), dtype=dtype)
        q2[..., ::2] = q
        yq2, yk2 = ops.rope_qk_cos_sin(q2[..., ::2], k, cos, sin, interleaved)
        eps = 2 * torch.finfo(dtype).eps * yq.abs().max().item() + 1e-300
        assert (yq2.double() - yq.double()).abs().max().item() <= eps, what
        assert torch.equal(yk2, yk), what


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["full", "half"])
def test_gradcheck_including_table(device, interleaved, layout):
    B, Hq, Hk, S, D, R = 2, 3, 2, 4, 10, 6
    theta = angles(B, S, R, layout == "full", device)
    cos, sin = table(theta, layout, interleaved, torch.float64)
    # arbitrary table values (not a true cos/sin pair), so every term of the formula shows
    cos = (cos + 0.3 * torch.randn_like(cos)).requires_grad_()
    sin = (sin + 0.3 * torch.randn_like(sin)).requires_grad_()
    q = randn((B, Hq, S, D), torch.float64, device).requires_grad_()
    k = randn((B, Hk, S, D), torch.float64, device).requires_grad_()
    fns = [lambda q, k, c, s: ops.rope_qk_cos_sin(q, k, c, s, interleaved),
           lambda q, k, c, s: ops.rope_qk_cos_sin_backward(q, k, c, s, interleaved),
           lambda q, k, c, s: (ops.rope_cos_sin(q, c, s, interleaved),),
           lambda q, k, c, s: (ops.rope_cos_sin_backward(k, c, s, interleaved),)]
    for fn in fns:
        assert torch.autograd.gradcheck(fn, (q, k, cos, sin))
        assert torch.autograd.gradgradcheck(fn, (q, k, cos, sin))
    # the table gradient matches the float64 reference formula's
    yq, yk = ops.rope_qk_cos_sin(q, k, cos, sin, interleaved)
    gq, gk = torch.randn_like(yq), torch.randn_like(yk)
    got = torch.autograd.grad((yq, yk), (cos, sin), (gq, gk))
    exp_y = (ref.rope_cos_sin(q, cos, sin, interleaved), ref.rope_cos_sin(k, cos, sin, interleaved))
    exp = torch.autograd.grad(exp_y, (cos, sin), (gq, gk))
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_no_table_gradient_unless_required(device):
    q = randn((1, 2, 3, 8), torch.float32, device).requires_grad_()
    cos, sin = table(angles(1, 3, 8, False, device), "full", False, torch.float32)
    y = bt.rope_cos_sin(q, cos, sin)
    y.sum().backward()
    assert cos.grad is None and sin.grad is None and q.grad is not None
    # a gradient for the table alone (q constant) works too
    c, s = cos.clone().requires_grad_(), sin.clone().requires_grad_()
    (dc, ds) = torch.autograd.grad(bt.rope_cos_sin(q.detach(), c, s).square().sum(), (c, s))
    assert dc.shape == c.shape and ds.shape == s.shape


@pytest.mark.parametrize("device", DEVICES)
def test_hf_signature(device):
    """apply_rotary_pos_emb matches transformers' own function for [B, H, S, D] inputs,
    unsqueeze_dim=2 for [B, S, H, D], and the legacy position_ids form."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    B, Hq, Hk, S, D = 2, 4, 2, 6, 16
    q, k = torch.randn(B, Hq, S, D, device=device), torch.randn(B, Hk, S, D, device=device)
    cos, sin = table(angles(B, S, D, True, device), "full", False, torch.float32)
    exp = hf_apply(q, k, cos, sin)
    got = bt.apply_rotary_pos_emb(q, k, cos, sin)
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)
    got2 = bt.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
    for a, b in zip(got2, exp):
        torch.testing.assert_close(a.transpose(1, 2), b)
    table_c, table_s = table(angles(1, 32, D, False, device), "full", False, torch.float32)
    pid = torch.randint(0, 32, (B, S), device=device)
    got3 = bt.apply_rotary_pos_emb(q, k, table_c[0], table_s[0], position_ids=pid)
    exp3 = hf_apply(q, k, table_c[0][pid], table_s[0][pid])
    for a, b in zip(got3, exp3):
        torch.testing.assert_close(a, b)



@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_hf_signature_broadcasts(device, unsqueeze_dim):
    """transformers' broadcasting: a one-position table over a longer sequence (the fused
    op on the expanded table), one query position against a longer table (transformers'
    result shape), a batch-1 q against a batch-2 table. A table whose length fits nothing
    is the op's ValueError where transformers raises a broadcasting RuntimeError."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    def qk(B, S):
        q, k = torch.randn(B, 4, S, 16, device=device), torch.randn(B, 2, S, 16, device=device)
        return (q, k) if unsqueeze_dim == 1 else (q.transpose(1, 2), k.transpose(1, 2))

    for (B, S), (Bc, Sc) in [((2, 5), (2, 1)), ((2, 5), (1, 1)), ((2, 1), (2, 3)), ((1, 3), (2, 3))]:
        q, k = qk(B, S)
        cos, sin = torch.randn(Bc, Sc, 16, device=device), torch.randn(Bc, Sc, 16, device=device)
        exp = hf_apply(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        got = bt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        for a, b in zip(got, exp):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b)
    q, k = qk(2, 5)
    cos = torch.randn(2, 3, 16, device=device)
    with pytest.raises(RuntimeError):
        hf_apply(q, k, cos, cos, unsqueeze_dim=unsqueeze_dim)
    with pytest.raises(ValueError, match=r"baracuda::rope_qk_cos_sin: cos/sin of rank 3 must be"):
        bt.apply_rotary_pos_emb(q, k, cos, cos, unsqueeze_dim=unsqueeze_dim)


def test_explain_and_cpu_variant():
    q = torch.randn(2, 4, 5, 16)
    cos = torch.randn(1, 5, 16)
    info = bt.explain("rope_qk_cos_sin", q, q, cos, cos)
    assert info.family == "rope_cos_sin" and info.variant == "rows_simd" and info.workspace_bytes == 0
    assert bt.explain("rope_cos_sin", q, cos, cos, True).variant == "rows_simd"
    assert bt.explain("rope_cos_sin", q[..., ::2], cos[..., :8], cos[..., :8]).variant == "rows"
