"""The selective state update (selective_state_update, selective_state_update_tokens)
beyond the table of tests/op_db.py: out and the updated state against a float64 loop
written from mamba_ssm's definition, in every dtype with a float32 or same-dtype state and
on both devices; the heads/groups dims left out (as mamba_ssm allows) and the output
rank; strided states; the state pool (indices, padding rows, an index past the pool);
T tokens at once against T single steps (bitwise on a float32 state) and against the
chunked scan; NaN kept in its row; the op's inference-only autograd (a gradient raises,
a state that requires grad raises, the version counter moves); vmap; explain; and on
CUDA: the variant per layout, CPU agreement, the largest d_state, graph capture and
replay, and the Mamba-2 2.7B shape at batch 1 and 64."""
import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

import baracuda_torch as bt
from baracuda_torch import mamba
from baracuda_torch import reference as ref
from helpers import (DEVICES, FLOAT_DTYPES, assert_close_to_reference, capture_graph, cuda_kernel_names, randn,
                     requires_cuda)

ops = torch.ops.baracuda


def loop_truth(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, indices=None):
    """out [B, T, H, P] and the new pool, element by element from mamba_ssm's kernel
    (Python loops over b, t; every operand in its full form with a T dim), float64."""
    state = state.double().clone()
    Bsz, T, H, P = x.shape
    G = B.size(2)
    outs = torch.zeros(Bsz, T, H, P, dtype=torch.float64)
    for b in range(Bsz):
        i = b if indices is None else int(indices[b])
        if i < 0:
            continue
        s = state[i]
        for t in range(T):
            for h in range(H):
                g = h // (H // G)
                d = dt[b, t, h].double() + (dt_bias[h].double() if dt_bias is not None else 0)
                if dt_softplus:
                    d = torch.where(d <= 20, torch.log1p(torch.exp(d)), d)
                s[h] = torch.exp(A[h].double() * d[:, None]) * s[h] + \
                    B[b, t, g].double()[None, :] * (d * x[b, t, h].double())[:, None]
                y = (s[h] * C[b, t, g].double()[None, :]).sum(-1)
                if D is not None:
                    y = y + D[h].double() * x[b, t, h].double()
                if z is not None:
                    y = y * F.silu(z[b, t, h].double())
                outs[b, t, h] = y
    return outs, state


def problem(device, dtype, batch=3, tokens=None, heads=4, dim=5, dstate=6, groups=2, state_dtype=None,
            pool=None):
    """Inputs of one problem (x, dt, z, B, C with a T dim when `tokens` is given)."""
    t = () if tokens is None else (tokens,)
    w = torch.float64 if dtype == torch.float64 else torch.float32
    sd = state_dtype or dtype
    return dict(state=randn((pool if pool is not None else batch, heads, dim, dstate), sd, device),
                x=randn((batch, *t, heads, dim), dtype, device),
                dt=randn((batch, *t, heads, dim), dtype, device),
                A=-(randn((heads, dim, dstate), w, device).abs() + 0.1),
                B=randn((batch, *t, groups, dstate), dtype, device),
                C=randn((batch, *t, groups, dstate), dtype, device),
                D=randn((heads, dim), w, device), z=randn((batch, *t, heads, dim), dtype, device),
                dt_bias=randn((heads, dim), w, device))


def as_decode_step(p):
    """p (one token, no T dim) with Mamba2.step's operands: A, D and dt_bias per head and dt
    per (batch, head), expanded over head_dim (and d_state) with stride 0, and no z: the
    lean kernel's problem."""
    batch, H, P = p["x"].shape
    p["A"] = p["A"][:, :1, :1].expand(p["A"].shape)
    p["D"] = p["D"][:, :1].expand(H, P)
    p["dt_bias"] = p["dt_bias"][:, :1].expand(H, P)
    p["dt"] = p["dt"][..., :1].expand(batch, H, P)
    p["z"] = None
    return p


def call(p, tokens, **kw):
    args = dict(D=p["D"], z=p["z"], dt_bias=p["dt_bias"], dt_softplus=True)
    args.update(kw)
    fn = bt.selective_state_update_tokens if tokens else bt.selective_state_update
    return fn(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], **args)


def check_against_reference(p, tokens, **kw):
    """out and the updated state against reference.py in float64 (the 2x rule against the
    reference in the inputs' own dtypes). Runs the op on p (updating p["state"])."""
    args = dict(D=p["D"], z=p["z"], dt_bias=p["dt_bias"], dt_softplus=True)
    args.update(kw)
    names = ("state", "x", "dt", "A", "B", "C")
    to64 = {k: (v.double().cpu() if isinstance(v, torch.Tensor) and v.is_floating_point()
                else v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    exp_out, exp_state = ref.selective_state_update(*(p[n].double().cpu() for n in names), **to64, tokens=tokens)
    dt_ = p["x"].dtype
    cast = {k: (v.to(dt_) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in args.items()}
    base_out, base_state = ref.selective_state_update(*(p[n].to(dt_) for n in names), **cast, tokens=tokens)
    out = call(p, tokens, **kw)
    assert_close_to_reference(out, exp_out, base_out, "out")
    assert_close_to_reference(p["state"], exp_state, base_state.to(p["state"].dtype), "state")
    return out


def test_reference_matches_loop():
    """reference.py against the element loop from mamba_ssm's definition (float64), every
    option, a pool with a padding row, T = 3."""
    p = problem("cpu", torch.float64, tokens=3, pool=5)
    idx = torch.tensor([4, -1, 1])
    args = (p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], p["D"], p["z"], p["dt_bias"], True, idx)
    out, new = ref.selective_state_update(*args, tokens=True)
    exp_out, exp_state = loop_truth(*args)
    torch.testing.assert_close(out, exp_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new, exp_state, rtol=1e-12, atol=1e-12)
    assert torch.equal(new[[0, 2, 3]], p["state"][[0, 2, 3]])  # rows no index names


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("state32", [False, True])
def test_every_dtype(device, dtype, state32):
    """x in each dtype with a state in x's dtype or float32 (mamba_ssm's decoding cache),
    every option, single token and 3 tokens."""
    sd = torch.float32 if state32 and dtype != torch.float64 else dtype
    for tokens in (False, True):
        p = problem(device, dtype, tokens=3 if tokens else None, state_dtype=sd)
        check_against_reference(p, tokens)
        p = problem(device, dtype, tokens=2 if tokens else None, state_dtype=sd, groups=4, dstate=37)
        check_against_reference(p, tokens, D=None, z=None, dt_bias=None, dt_softplus=False)


@pytest.mark.parametrize("device", DEVICES)
def test_mamba2_step_layout(device):
    """What Mamba-2's step passes: per-head A, dt, D and dt_bias expanded with stride 0
    (one exp a row), x, B, C as views of the conv output, a float32 state, bfloat16 data."""
    Bsz, H, P, N = 2, 6, 8, 16
    dtype = torch.bfloat16
    xBC = randn((Bsz, H * P + 2 * N + 3), dtype, device)
    x, B, C = xBC[:, :H * P].view(Bsz, H, P), xBC[:, H * P:H * P + N][:, None], xBC[:, H * P + N:H * P + 2 * N]
    dt = randn((Bsz, H), dtype, device)[..., None].expand(Bsz, H, P)
    A = (-torch.rand(H, device=device))[:, None, None].expand(H, P, N)  # (negated first: stride 0 over P, N)
    D = torch.randn(H, device=device)[:, None].expand(H, P)
    dt_bias = torch.randn(H, device=device)[:, None].expand(H, P)
    p = dict(state=randn((Bsz, H, P, N), torch.float32, device), x=x, dt=dt, A=A, B=B, C=C, D=D, z=None,
             dt_bias=dt_bias)
    check_against_reference(p, False)


@pytest.mark.parametrize("device", DEVICES)
def test_short_forms_and_out_rank(device):
    """mamba_ssm's shapes: an operand may leave out its heads/groups dim of size 1; out is
    [B, H, P] for a 4-d state and [B, P] for a 3-d one, whatever x's rank."""
    p = problem(device, torch.float32, heads=1, groups=1)
    full = call(dict(p, state=p["state"].clone()), False)
    short = dict(state=p["state"][:, 0].clone(), x=p["x"][:, 0], dt=p["dt"][:, 0], A=p["A"][0], B=p["B"][:, 0],
                 C=p["C"][:, 0], D=p["D"][0], z=p["z"][:, 0], dt_bias=p["dt_bias"][0])
    out = call(short, False)
    assert full.shape == (3, 1, 5) and out.shape == (3, 5)
    assert torch.equal(out, full[:, 0])
    # A 3-d state with x in the heads form: out without the heads dim (mamba_ssm squeezes it).
    mixed = dict(short, state=p["state"][:, 0].clone(), x=p["x"])
    assert call(mixed, False).shape == (3, 5)
    # A 4-d state with H = 4 and B, C without their groups dim (G = 1).
    p = problem(device, torch.float32, groups=1)
    a = call(dict(p, state=p["state"].clone()), False)
    b = call(dict(p, state=p["state"].clone(), B=p["B"][:, 0], C=p["C"][:, 0]), False)
    assert torch.equal(a, b)
    # The tokens op: [B, T, P] without heads.
    p = problem(device, torch.float32, tokens=2, heads=1, groups=1)
    out = bt.selective_state_update_tokens(p["state"][:, 0], p["x"][:, :, 0], p["dt"][:, :, 0], p["A"][0],
                                           p["B"][:, :, 0], p["C"][:, :, 0])
    assert out.shape == (3, 2, 5)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_operands(device):
    """A state with N not innermost, a sliced pool, sliced and transposed x/B/C."""
    Bsz, H, P, N = 3, 2, 5, 8
    base = problem(device, torch.float32, batch=Bsz, heads=H, dim=P, dstate=N, groups=1)
    layouts = {
        "N not innermost": randn((Bsz, H, N, P), torch.float32, device).transpose(-1, -2),
        "pool slice": randn((Bsz + 2, H, P, N + 3), torch.float32, device)[1:-1, :, :, 1:-2],
        "heads last": randn((Bsz, P, N, H), torch.float32, device).permute(0, 3, 1, 2),
    }
    for name, st in layouts.items():
        p = dict(base, state=st,
                 x=randn((Bsz, P, H), torch.float32, device).transpose(1, 2),
                 B=randn((Bsz, N + 4, 1), torch.float32, device)[:, 2:-2].transpose(1, 2))
        check_against_reference(p, False)
        check_against_reference(dict(p, x=p["x"][:, None], dt=p["dt"][:, None], z=p["z"][:, None],
                                     B=p["B"][:, None], C=p["C"][:, None]), True)


@pytest.mark.parametrize("device", DEVICES)
def test_state_pool(device):
    """state_batch_indices into a larger pool: only the named rows change; a negative index
    is a padding row (out 0, pool untouched), as in mamba_ssm."""
    for dtype in (torch.int32, torch.int64):
        p = problem(device, torch.float32, batch=4, pool=7)
        before = p["state"].clone()
        idx = torch.tensor([5, -1, 0, 3], dtype=dtype, device=device)
        out = check_against_reference(p, False, state_batch_indices=idx)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        untouched = [1, 2, 4, 6]
        assert torch.equal(p["state"][untouched], before[untouched])
        assert not torch.equal(p["state"][[5, 0, 3]], before[[5, 0, 3]])


def test_index_past_the_pool_raises_on_cpu():
    """An index >= the pool size: IndexError naming the op, the row and the pool, before
    anything is written."""
    p = problem("cpu", torch.float32, batch=2, pool=3)
    before = p["state"].clone()
    for op, tokens in (("selective_state_update", False), ("selective_state_update_tokens", True)):
        q = problem("cpu", torch.float32, batch=2, pool=3, tokens=2 if tokens else None)
        q["state"] = p["state"]
        with pytest.raises(IndexError, match=rf"baracuda::{op}: state_batch_indices\[1\] = 3 is out of range for "
                                             r"a state pool of 3 rows \(negative values mark padding rows\)"):
            call(q, tokens, state_batch_indices=torch.tensor([0, 3], dtype=torch.int32))
        assert torch.equal(p["state"], before)


@pytest.mark.parametrize("device", DEVICES)
def test_tokens_equal_single_steps(device):
    """T tokens at once against T calls of the single-token op: bit for bit on a float32
    state (the same arithmetic; the state stays float32 in between), within the 2x rule
    on a bfloat16 state (which single steps round after every token)."""
    for dtype, sd in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                      (torch.float64, torch.float64)):
        p = problem(device, dtype, tokens=5, state_dtype=sd, pool=4)
        idx = torch.tensor([2, -1, 0], device=device)
        st = p["state"].clone()
        out = call(p, True, state_batch_indices=idx)
        steps = []
        for t in range(5):
            q = dict(p, state=st, x=p["x"][:, t], dt=p["dt"][:, t], z=p["z"][:, t], B=p["B"][:, t], C=p["C"][:, t])
            steps.append(call(q, False, state_batch_indices=idx))
        assert torch.equal(out, torch.stack(steps, 1))
        assert torch.equal(p["state"], st)
    p = problem(device, torch.bfloat16, tokens=4)
    check_against_reference(p, True)


@pytest.mark.parametrize("device", DEVICES)
def test_tokens_continue_the_chunked_scan(device):
    """The decoding contract: the chunked scan's final state over L tokens, then T tokens
    through the state update, equals the scan over L + T tokens (outputs and final
    state), float64."""
    Bsz, L, T, H, P, G, N = 2, 9, 4, 4, 3, 2, 5
    r = lambda *s: randn(s, torch.float64, device)  # noqa: E731
    x, dt, z = r(Bsz, L + T, H, P), r(Bsz, L + T, H), r(Bsz, L + T, H, P)
    Bm, Cm = r(Bsz, L + T, G, N), r(Bsz, L + T, G, N)
    A, D, dt_bias = -(r(H).abs() + 0.1), r(H), r(H)
    full, final = mamba.mamba_chunk_scan_combined(x, dt, A, Bm, Cm, 4, D=D, z=z, dt_bias=dt_bias,
                                                  dt_softplus=True, return_final_states=True)
    _, state = mamba.mamba_chunk_scan_combined(x[:, :L], dt[:, :L], A, Bm[:, :L], Cm[:, :L], 4, D=D,
                                               z=z[:, :L], dt_bias=dt_bias, dt_softplus=True,
                                               return_final_states=True)
    out = bt.selective_state_update_tokens(
        state, x[:, L:], dt[:, L:, :, None].expand(-1, -1, -1, P), A[:, None, None].expand(H, P, N),
        Bm[:, L:], Cm[:, L:], D[:, None].expand(H, P), z[:, L:], dt_bias[:, None].expand(H, P), True)
    torch.testing.assert_close(out, full[:, L:], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, final, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_stays_in_its_row(device):
    """A NaN in one x element reaches that (b, h, p) row's out and state only."""
    p = problem(device, torch.float32)
    p["x"][1, 2, 3] = float("nan")
    out = call(p, False)
    nan_out = out.isnan()
    assert nan_out[1, 2, 3] and nan_out.sum() == 1
    nan_state = p["state"].isnan()
    assert nan_state[1, 2, 3].all() and nan_state.sum() == p["state"].size(-1)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    """No batch, no heads, no rows of a head, no tokens: nothing to do; d_state 0:
    out = D·x (gated)."""
    for kw in (dict(batch=0), dict(heads=0, groups=1), dict(dim=0)):
        p = problem(device, torch.float32, **kw)
        assert call(p, False).numel() == 0
    p = problem(device, torch.float32, tokens=0)
    before = p["state"].clone()
    assert call(p, True).shape == (3, 0, 4, 5)
    assert torch.equal(p["state"], before)
    p = problem(device, torch.float64, dstate=0)
    check_against_reference(p, False)


# ---- autograd, vmap, explain ----------------------------------------------------------------------


def test_not_differentiable():
    """Inference only, as mamba_ssm's: a backward through out raises NotImplementedError
    naming the op; so does a state that requires grad with grad mode on (it is updated in
    place); under no_grad nothing is recorded. The state's version counter moves, as for
    ATen's in-place ops."""
    p = problem("cpu", torch.float32)
    A = p["A"].clone().requires_grad_()
    v = p["state"]._version
    out = bt.selective_state_update(p["state"], p["x"], p["dt"], A, p["B"], p["C"])
    assert p["state"]._version > v
    with pytest.raises(NotImplementedError, match=r"baracuda::selective_state_update is not differentiable"):
        out.sum().backward()
    out = bt.selective_state_update_tokens(p["state"], p["x"][:, None], p["dt"][:, None], A, p["B"][:, None],
                                           p["C"][:, None])
    with pytest.raises(NotImplementedError, match=r"baracuda::selective_state_update_tokens is not differentiable"):
        out.sum().backward()
    st = p["state"].clone().requires_grad_()
    with pytest.raises(NotImplementedError, match=r"baracuda::selective_state_update: state is updated in place "
                                                  r"and must not require grad"):
        bt.selective_state_update(st, p["x"], p["dt"], p["A"], p["B"], p["C"])
    with torch.no_grad():
        out = bt.selective_state_update(st, p["x"], p["dt"], A, p["B"], p["C"])
    assert not out.requires_grad


def test_vmap():
    """vmap over a batched state (each sample its own slice): the per-sample calls; an
    unbatched state with a batched x raises (it would be updated by every sample)."""
    p = problem("cpu", torch.float32)
    states = torch.stack([p["state"], p["state"] * 2])
    xs = torch.stack([p["x"], -p["x"]])
    expect_states = states.clone()
    expect = torch.stack([bt.selective_state_update(expect_states[i], xs[i], p["dt"], p["A"], p["B"], p["C"])
                          for i in range(2)])
    out = vmap(lambda s, x: bt.selective_state_update(s, x, p["dt"], p["A"], p["B"], p["C"]))(states, xs)
    assert torch.equal(out, expect) and torch.equal(states, expect_states)
    with pytest.raises(RuntimeError, match=r"baracuda::selective_state_update updates state in place"):
        vmap(lambda x: bt.selective_state_update(p["state"], x, p["dt"], p["A"], p["B"], p["C"]))(xs)


def test_explain_cpu():
    p = problem("cpu", torch.bfloat16, state_dtype=torch.float32, pool=5)
    idx = torch.tensor([0, 1, 2], dtype=torch.int32)
    info = bt.explain("selective_state_update", p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"],
                      state_batch_indices=idx)
    assert (info.family, info.op, info.variant, info.backend) == (
        "selective_state_update", "selective_state_update", "rows", "cpu")
    assert info.dtype == "bfloat16" and info.index_dtype == "int32"
    assert info.deterministic and info.bit_stable and info.workspace_bytes == 0
    assert info.math_precision == "float32"
    p = problem("cpu", torch.float64, tokens=2)
    info = bt.explain(ops.selective_state_update_tokens, p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"])
    assert info.op == "selective_state_update_tokens" and info.math_precision == "float64"


# ---- CUDA ----------------------------------------------------------------------------------------


@requires_cuda
def test_cuda_variants():
    """tile_vec4 where the state's N is innermost with 4-element-aligned strides and data,
    tile_strided otherwise; tile_staged where the layout is tile_vec4's and A is per head
    (Mamba-2's expanded A: the block's rows go through shared memory)."""
    p = problem("cuda", torch.bfloat16, dstate=16)
    cases = {
        "tile_vec4": [randn((3, 4, 5, 16), torch.float32, "cuda"), randn((3, 4, 5, 16), torch.bfloat16, "cuda"),
                      randn((3, 4, 5, 20), torch.float32, "cuda")[..., 4:]],
        "tile_strided": [randn((3, 4, 16, 5), torch.float32, "cuda").transpose(-1, -2),
                         randn((3, 4, 5, 17), torch.float32, "cuda")[..., 1:],
                         randn((3, 4, 5, 18), torch.float32, "cuda")[..., :16]],
    }
    for variant, states in cases.items():
        for st in states:
            info = bt.explain("selective_state_update", st, p["x"], p["dt"], p["A"], p["B"], p["C"])
            assert info.variant == variant and info.backend == "cuda", (variant, st.stride())
    p = problem("cuda", torch.float32, dstate=10)  # N % 4 != 0
    assert bt.explain("selective_state_update", p["state"], p["x"], p["dt"], p["A"], p["B"],
                      p["C"]).variant == "tile_strided"
    for N, variant in ((16, "tile_staged"), (10, "tile_strided")):
        p = problem("cuda", torch.float32, dstate=N)
        head_A = p["A"][:, :1, :1].expand(p["A"].shape)
        assert bt.explain("selective_state_update", p["state"], p["x"], p["dt"], head_A, p["B"],
                          p["C"]).variant == variant


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("head_A", [False, True])
def test_cuda_matches_cpu(dtype, head_A):
    """The same inputs on both devices, every d_state class (lanes and chunks a row), both
    layouts, both ops, a pool with padding, A per element and per head (staged where N % 4
    == 0): within a few units of float32 (the sum over N runs in another order), and the
    CUDA result against the float64 reference."""
    for N in (1, 5, 16, 64, 128, 200, 256, 1024):
        for tokens in (None, 3):
            p = problem("cuda", dtype, tokens=tokens, dstate=N, state_dtype=torch.float32
                        if dtype != torch.float64 else dtype, pool=6, heads=4, dim=9)
            if head_A:
                p["A"] = p["A"][:, :1, :1].expand(p["A"].shape)
            idx = torch.tensor([4, -1, 0], device="cuda")
            cpu = {k: v.cpu() for k, v in p.items()}
            out = call(p, tokens is not None, state_batch_indices=idx)
            out_c = call(cpu, tokens is not None, state_batch_indices=idx.cpu())
            tol = 1e-12 if dtype == torch.float64 else 4e-6 * max(N, 1) ** 0.5
            otol = tol if dtype in (torch.float64, torch.float32) else 2 * torch.finfo(dtype).eps
            torch.testing.assert_close(out.cpu(), out_c, rtol=otol, atol=otol * out_c.abs().max().item())
            torch.testing.assert_close(p["state"].cpu(), cpu["state"], rtol=tol, atol=tol)
    for N in (16, 130):
        for st in ("strided", "vec"):
            p = problem("cuda", torch.float32, dstate=N, groups=1)
            if st == "strided":
                p["state"] = p["state"].transpose(-1, -2).contiguous().transpose(-1, -2)
            check_against_reference(p, False)
            check_against_reference(problem("cuda", torch.float32, tokens=2, dstate=N), True)


@requires_cuda
def test_cuda_index_past_the_pool():
    """A CUDA kernel cannot raise without synchronizing: an index past the pool gives NaN in
    that row's out and leaves the pool alone; the other rows are computed."""
    p = problem("cuda", torch.float32, batch=3, pool=4)
    before = p["state"].clone()
    idx = torch.tensor([1, 9, -1], device="cuda")
    out = call(p, False, state_batch_indices=idx)
    assert out[1].isnan().all() and not out[0].isnan().any() and torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.equal(p["state"][[0, 2, 3]], before[[0, 2, 3]])


@requires_cuda
def test_cuda_dstate_limit():
    p = problem("cuda", torch.float32, dstate=1025, batch=1)
    with pytest.raises(NotImplementedError, match=r"baracuda::selective_state_update: dstate up to 1024 is wired "
                                                  r"on CUDA, got 1025"):
        call(p, False)


@requires_cuda
def test_cuda_mixed_devices():
    p = problem("cuda", torch.float32)
    with pytest.raises(RuntimeError, match=r"baracuda::selective_state_update: expected all tensors on one device"):
        call(dict(p, A=p["A"].cpu()), False)
    with pytest.raises(RuntimeError, match=r"state_batch_indices"):
        call(p, False, state_batch_indices=torch.arange(3))


@requires_cuda
def test_cuda_graph_capture():
    """Both ops captured in a CUDA graph (no allocation or synchronization inside) and
    replayed on new inputs written in place: the outputs and the updated state equal an
    eager run from the same state, bit for bit."""
    p = problem("cuda", torch.bfloat16, batch=4, heads=8, dim=16, dstate=64, groups=1, tokens=3,
                state_dtype=torch.float32, pool=6)
    idx = torch.tensor([5, 0, -1, 2], device="cuda")
    start = p["state"].clone()

    def step():
        out1 = call(dict(p, x=p["x"][:, 0], dt=p["dt"][:, 0], z=p["z"][:, 0], B=p["B"][:, 0], C=p["C"][:, 0]),
                    False, state_batch_indices=idx)
        return out1, call(p, True, state_batch_indices=idx)

    graph, captured = capture_graph(step, before_capture=lambda: p["state"].copy_(start))
    for _ in range(2):
        for k in ("x", "dt", "z", "B", "C"):
            p[k].copy_(torch.randn_like(p[k]))
        p["state"].copy_(start)
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.clone() for t in captured] + [p["state"].clone()]
        p["state"].copy_(start)
        eager = list(step()) + [p["state"]]
        for a, e in zip(replayed, eager):
            assert torch.equal(a, e)


@requires_cuda
@pytest.mark.parametrize("head_A", [False, True])
@pytest.mark.parametrize("tokens", [None, 3])
def test_cuda_several_passes(tokens, head_A):
    """A block walks 2 passes of 32 rows (d_state 16: row groups of 4 lanes, 8 a warp; a
    head_dim of 64, whole in 2 passes, and 64 × 40 blocks: at least 4 an SM up to 640 SMs).
    A per element: one token takes the path where each lane computes one (row, token) pair's
    δ and out (passes · tokens = 2 <= 4 lanes), 3 tokens the path where every lane computes
    them (6 > 4). A per head: the staged path (the block's 2 passes of rows in shared
    memory). Against the float64 reference."""
    p = problem("cuda", torch.bfloat16, batch=64, tokens=tokens, heads=40, dim=64, dstate=16, groups=4,
                state_dtype=torch.float32)
    if head_A:
        p["A"] = p["A"][:, :1, :1].expand(p["A"].shape)
        op = "selective_state_update_tokens" if tokens else "selective_state_update"
        assert bt.explain(op, p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"]).variant == "tile_staged"
    check_against_reference(p, tokens is not None)


@requires_cuda
@pytest.mark.parametrize("head_A", [False, True])
@pytest.mark.parametrize("dstate", [16, 1024])
def test_cuda_tokens_b_c_staging(dstate, head_A):
    """The tokens op copies every token's B and C into shared memory once a block where
    they fit beside the staged state rows (3 tokens), and reads them from global memory
    where they do not (8 tokens of d_state 1024: 64 KiB of them): both against the float64
    reference, with per-group B and C."""
    for tokens in (3, 8):
        p = problem("cuda", torch.bfloat16, batch=64 if dstate == 16 else 4, tokens=tokens, heads=8, dim=64,
                    dstate=dstate, groups=2, state_dtype=torch.float32)
        if head_A:
            p["A"] = p["A"][:, :1, :1].expand(p["A"].shape)
        check_against_reference(p, True)


@requires_cuda
@pytest.mark.parametrize("batch", [1, 64])
def test_cuda_mamba2_2_7b_shape(batch):
    """The Mamba-2 2.7B layer's step (80 heads of 64, d_state 128, 1 group), bfloat16 data,
    float32 state, Mamba-2's expanded A/dt/D/dt_bias, at batch 1 and 64: against the
    reference in float64."""
    H, P, N = 80, 64, 128
    dtype = torch.bfloat16
    dt = randn((batch, H), dtype, "cuda")[..., None].expand(batch, H, P)
    p = dict(state=randn((batch, H, P, N), torch.float32, "cuda"), x=randn((batch, H, P), dtype, "cuda"), dt=dt,
             A=(-torch.rand(H, device="cuda"))[:, None, None].expand(H, P, N),
             B=randn((batch, 1, N), dtype, "cuda"), C=randn((batch, 1, N), dtype, "cuda"),
             D=torch.randn(H, device="cuda")[:, None].expand(H, P), z=None,
             dt_bias=torch.randn(H, device="cuda")[:, None].expand(H, P))
    assert bt.explain("selective_state_update", p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"]).variant == \
        "tile_staged"
    check_against_reference(p, False)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("batch", [1, 3])
def test_cuda_lean_b_c_loads(dtype, batch):
    """Mamba-2's decode step (one token, no z, per-head A: the lean staged kernel) with B and
    C as Mamba2.step passes them, views of the conv output xBC (x's dtype, N stride 1,
    4-element aligned: one vector load of a lane's 4 elements each), and as operands that
    must take the scalar loads: one element off that alignment, N strided, float32 B and C
    beside 16-bit x, and a group stride that is not a multiple of 4. Each against the float64
    reference."""
    H, P, N, G = 8, 16, 32, 2
    d_inner = H * P

    def xbc_split(offset=0, bc_dtype=dtype):
        xbc = randn((batch, offset + d_inner + 2 * G * N), bc_dtype, "cuda")[:, offset:]
        return (xbc[:, d_inner:d_inner + G * N].view(batch, G, N),
                xbc[:, d_inner + G * N:].view(batch, G, N))

    def odd_groups():
        t = randn((batch, G, N + 1), dtype, "cuda")[..., :N]  # group stride N + 1
        return t, t.clone()

    cases = {
        "xbc split": xbc_split(),
        "one element off": xbc_split(offset=1),
        "N strided": tuple(randn((batch, N, G), dtype, "cuda").transpose(-1, -2) for _ in range(2)),
        "float32 B, C": xbc_split(bc_dtype=torch.float32),
        "group stride N + 1": odd_groups(),
    }
    for name, (B, C) in cases.items():
        p = as_decode_step(problem("cuda", dtype, batch=batch, heads=H, dim=P, dstate=N, groups=G,
                                   state_dtype=torch.float32))
        p.update(B=B, C=C)
        assert bt.explain("selective_state_update", p["state"], p["x"], p["dt"], p["A"], p["B"],
                          p["C"]).variant == "tile_staged", name
        check_against_reference(p, False)


@requires_cuda
def test_cuda_lean_passes_past_lanes():
    """Mamba-2's decode step with d_state 16 (row groups of 4 lanes) and head_dim 256 at batch
    64: the plan's rule gives a block 8 passes of 32 rows, more passes than a group has lanes
    to hold their rows' values (the lean kernel's lane scalars), so the launch takes the
    staged kernel that is not lean. Against the float64 reference; the lean kernel there
    gave the rows of passes 4 to 7 the values of passes 0 to 3 and never wrote their out."""
    p = as_decode_step(problem("cuda", torch.bfloat16, batch=64, heads=40, dim=256, dstate=16, groups=4,
                               state_dtype=torch.float32))
    check_against_reference(p, False)


@requires_cuda
def test_cuda_lean_offsets_past_32_bits():
    """The lean kernel (Mamba-2's decode step) computes offsets in 32 bits; the plan sends a
    problem whose elements lie further than that from an operand's start to the 64-bit
    kernel. Here x's batch stride is 2^31 + 64 elements (a 4 GiB bfloat16 buffer), which
    a 32-bit offset would wrap to a negative one; the result must match the reference."""
    batch, H, P, N, G = 2, 8, 16, 32, 1
    stride = 2**31 + 64
    if torch.cuda.mem_get_info()[0] < 6 * 2**30:
        pytest.skip("needs 6 GiB of free device memory")
    p = as_decode_step(problem("cuda", torch.bfloat16, batch=batch, heads=H, dim=P, dstate=N, groups=G,
                               state_dtype=torch.float32))
    buf = torch.empty(stride + H * P, dtype=torch.bfloat16, device="cuda")
    x = buf.as_strided((batch, H, P), (stride, P, 1))
    x.copy_(p["x"])
    p["x"] = x
    assert bt.explain("selective_state_update", p["state"], p["x"], p["dt"], p["A"], p["B"],
                      p["C"]).variant == "tile_staged"
    check_against_reference(p, False)


@requires_cuda
@pytest.mark.parametrize("dtype,state_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16),
                                               (torch.float32, torch.float32)])
def test_cuda_whole_tiles(dtype, state_dtype):
    """Mamba-2's decode step on whole tiles (d_state 64 or 128: 16 or 32 lanes a row with no
    lane past N; head_dim 64, a multiple of every block's rows; B and C views of xBC) runs
    the whole-tiles kernel (the plan's choice, "auto", and "on"), at each of its pass counts
    as the plan's rule picks them from the grid on a 132-SM part (d_state 128: 1, 2, 4 and 8
    for 4 heads at batch 1, then 80 heads at batch 1, 2 and 4; d_state 64: 1, 2 and 4), and
    the generic lean kernel where the switch is "off" and where a tile is not whole:
    head_dim 50 (not a multiple of a pass's 4 rows) and d_state 96 (lanes past N). Each
    against the float64 reference."""
    G = 1
    cases = [(N, batch, H, 64, True) for N in (64, 128) for batch, H in ((1, 4), (1, 80), (2, 80), (4, 80))]
    cases += [(128, 4, 8, 50, False), (96, 2, 8, 64, False)]
    previous = bt._C._state_update_whole_tiles("on")
    try:
        for setting in ("auto", "on", "off"):
            bt._C._state_update_whole_tiles(setting)
            for N, batch, H, P, can in cases:
                d_inner = H * P
                p = as_decode_step(problem("cuda", dtype, batch=batch, heads=H, dim=P, dstate=N, groups=G,
                                           state_dtype=state_dtype))
                xbc = randn((batch, d_inner + 2 * G * N), dtype, "cuda")
                p["B"] = xbc[:, d_inner:d_inner + G * N].view(batch, G, N)
                p["C"] = xbc[:, d_inner + G * N:].view(batch, G, N)
                start = p["state"].clone()
                names = cuda_kernel_names(lambda: call(dict(p, state=start.clone()), False))
                whole = any("state_update_whole_kernel" in n for n in names)
                assert whole == (can and setting != "off"), (setting, N, batch, H, P, names)
                check_against_reference(p, False)
    finally:
        bt._C._state_update_whole_tiles(previous)
