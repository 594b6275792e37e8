"""The causal conv1d's decoding step (causal_conv1d_update) beyond the table of
tests/op_db.py: out and the updated state against a step loop written from
causal-conv1d's definition (shift register and circular buffer), every dtype and width,
a float32 weight; mamba_ssm's own fallback step (roll, multiply, sum); a prefill through
causal_conv1d followed by single steps against one conv over the whole sequence; the
state pool (padding rows, an index past the pool); NaN kept in its channel; the
inference-only autograd; the signature; explain; and on CUDA: CPU agreement, the width
limit, graph capture and replay."""
import inspect

import pytest
import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import reference as ref
from baracuda_torch.causal_conv1d import causal_conv1d_update
from helpers import DEVICES, FLOAT_DTYPES, assert_close_to_reference, capture_graph, randn, requires_cuda

ops = torch.ops.baracuda


def loop_truth(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, indices=None):
    """(out, new pool) channel by channel and step by step, float64: the window of
    W − 1 state values, the outputs, then the state shifted (or written circularly)."""
    x3 = x.double()[..., None] if x.dim() == 2 else x.double()
    state = conv_state.double().clone()
    Bsz, D, L = x3.shape
    W, M = weight.shape[1], state.shape[2]
    out = torch.zeros(Bsz, D, L, dtype=torch.float64)
    for b in range(Bsz):
        i = b if indices is None else int(indices[b])
        if i < 0:
            continue
        for d in range(D):
            st = state[i, d]
            if cache_seqlens is None:
                window = [st[M - (W - 1) + j] for j in range(W - 1)]
            else:
                c = int(cache_seqlens[b]) % M
                window = [st[(c - (W - 1) + j) % M] for j in range(W - 1)]
            xt = window + [x3[b, d, t] for t in range(L)]
            for t in range(L):
                acc = bias[d].double() if bias is not None else torch.zeros((), dtype=torch.float64)
                for k in range(W):
                    acc = acc + weight[d, k].double() * xt[t + k]
                out[b, d, t] = F.silu(acc) if activation in ("silu", "swish") else acc
            if cache_seqlens is None:
                hist = torch.cat([st, x3[b, d]])
                state[i, d] = hist[hist.numel() - M:]
            else:
                for t in range(L):
                    st[(c + t) % M] = x3[b, d, t]
    return (out[..., 0] if x.dim() == 2 else out), state


def check(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, indices=None):
    """out and the updated state against reference.py in float64 (the 2x rule against the
    reference in the inputs' dtype; the state is x's values, exactly). Runs the op."""
    args64 = [t.double().cpu() if t is not None else None for t in (x, conv_state, weight, bias)]
    ints = [t.cpu() if t is not None else None for t in (cache_seqlens, indices)]
    exp_out, exp_state = ref.causal_conv1d_update(*args64, activation, *ints)
    base_out, _ = ref.causal_conv1d_update(x, conv_state, weight.to(x.dtype), bias.to(x.dtype) if bias is not None
                                           else None, activation, cache_seqlens, indices)
    out = causal_conv1d_update(x, conv_state, weight, bias, activation, cache_seqlens, indices)
    assert_close_to_reference(out, exp_out, base_out, "out")
    assert torch.equal(conv_state.double().cpu(), exp_state)
    return out


def test_reference_matches_loop():
    torch.manual_seed(0)
    for cache in (None, torch.tensor([3, 0, 12])):
        for L in (1, 2, 7):
            x, st = torch.randn(3, 4, L, dtype=torch.float64), torch.randn(5, 4, 5, dtype=torch.float64)
            w, b = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
            idx = torch.tensor([4, -1, 0])
            out, new = ref.causal_conv1d_update(x, st, w, b, "silu", cache, idx)
            exp_out, exp_state = loop_truth(x, st, w, b, "silu", cache, idx)
            torch.testing.assert_close(out, exp_out, rtol=1e-12, atol=1e-12)
            assert torch.equal(new, exp_state)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_option(device, dtype):
    """Widths 1 to 4 (and 5, 8 on the CPU), one and several steps, state_len W − 1 and
    more, shift register and circular buffer, bias, SiLU, a float32 weight."""
    w32 = torch.float64 if dtype == torch.float64 else torch.float32
    for W in (1, 2, 3, 4) + ((5, 8) if device == "cpu" else ()):
        for L in (None, 1, 3):
            for M in (W - 1, W + 2):
                for circular in (False, True):
                    if circular and M == 0:
                        continue
                    Bsz, D = 3, 6
                    x = randn((Bsz, D) if L is None else (Bsz, D, L), dtype, device)
                    st = randn((Bsz, D, M), dtype, device)
                    wd = w32 if W % 2 else dtype
                    cache = torch.tensor([0, 5, -3], dtype=torch.int32, device=device) if circular else None
                    check(x, st, randn((D, W), wd, device), randn((D,), wd, device), "silu", cache)
                    check(x, st, randn((D, W), dtype, device), None, None, cache)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_mamba_ssm_step(device):
    """mamba_ssm's Mamba2.step without causal-conv1d: roll the (B, D, W) state left, put x
    last, sum state·weight, add the bias, SiLU — the same as the op on that state."""
    Bsz, D, W = 2, 10, 4
    st = randn((Bsz, W, D), torch.float32, device).transpose(1, 2)  # mamba_ssm allocates it channel-last
    w, b, x = randn((D, W), torch.float32, device), randn((D,), torch.float32, device), randn((Bsz, D), torch.float32, device)
    theirs = st.clone()
    theirs.copy_(torch.roll(theirs, shifts=-1, dims=-1))
    theirs[:, :, -1] = x
    expect = F.silu((theirs * w).sum(-1) + b)
    out = causal_conv1d_update(x, st, w, b, "silu")
    torch.testing.assert_close(out, expect, rtol=1e-6, atol=1e-6)
    assert torch.equal(st, theirs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_len", ["W - 1", "W"])
def test_prefill_then_steps(device, state_len):
    """Decoding: causal_conv1d over L tokens leaves the conv state (its final_states, or
    mamba_ssm's width-W copy of the last inputs), then k single steps: their outputs are
    the conv over all L + k tokens."""
    Bsz, D, W, L, k = 2, 12, 4, 9, 5
    x = randn((Bsz, D, L + k), torch.float64, device)
    w, b = randn((D, W), torch.float64, device), randn((D,), torch.float64, device)
    full, _ = ops.causal_conv1d(x, w, b, None, None, "silu")
    out, final = ops.causal_conv1d(x[..., :L], w, b, None, None, "silu")
    state = final.clone() if state_len == "W - 1" else F.pad(x[..., :L], (W - L, 0))[..., -W:].clone()
    steps = [causal_conv1d_update(x[..., L + t], state, w, b, "silu") for t in range(k)]
    torch.testing.assert_close(torch.stack(steps, -1), full[..., L:], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state[..., -(W - 1):], x[..., -(W - 1):], rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_circular_buffer_equals_shift_register(device):
    """The same history kept as a circular buffer (written at cache_seqlens mod M) and as a
    shift register: the same outputs, step after step."""
    Bsz, D, W, M = 3, 5, 4, 6
    w = randn((D, W), torch.float32, device)
    shift = torch.zeros(Bsz, D, M, device=device)
    ring = torch.zeros(Bsz, D, M, device=device)
    seqlens = torch.tensor([0, 2, 7], dtype=torch.int32, device=device)
    for step in range(9):
        L = 1 + step % 3
        x = randn((Bsz, D, L), torch.float32, device)
        a = causal_conv1d_update(x, shift, w, None, "silu")
        c = causal_conv1d_update(x, ring, w, None, "silu", cache_seqlens=seqlens)
        torch.testing.assert_close(a, c, rtol=0, atol=0)
        seqlens += L


@pytest.mark.parametrize("device", DEVICES)
def test_state_pool(device):
    """conv_state_indices: only the named rows change; a negative index is a padding row
    (out 0, pool untouched), as in causal-conv1d."""
    for dtype in (torch.int32, torch.int64):
        st = randn((6, 8, 4), torch.float32, device)
        before = st.clone()
        idx = torch.tensor([5, -1, 0], dtype=dtype, device=device)
        out = check(randn((3, 8, 2), torch.float32, device), st, randn((8, 4), torch.float32, device), None,
                    "silu", None, idx)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        assert torch.equal(st[[1, 2, 3, 4]], before[[1, 2, 3, 4]])


def test_index_past_the_pool_raises_on_cpu():
    st = torch.randn(3, 4, 4)
    before = st.clone()
    with pytest.raises(IndexError, match=r"baracuda::causal_conv1d_update: conv_state_indices\[1\] = 3 is out of "
                                         r"range for a state pool of 3 rows \(negative values mark padding rows\)"):
        causal_conv1d_update(torch.randn(2, 4), st, torch.randn(4, 4), conv_state_indices=torch.tensor([0, 3]))
    assert torch.equal(st, before)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_stays_in_its_channel(device):
    st = randn((2, 6, 4), torch.float32, device)
    x = randn((2, 6, 2), torch.float32, device)
    x[1, 3, 0] = float("nan")
    out = causal_conv1d_update(x, st, randn((6, 4), torch.float32, device))
    assert out[1, 3].isnan().all() and out.isnan().sum() == 2
    assert st.isnan().sum() == 1 and st[1, 3].isnan().any()


def test_not_differentiable_and_signature():
    """Inference only (a gradient raises, naming the op); causal-conv1d's parameters, in
    order, with its defaults."""
    x, w = torch.randn(2, 4, requires_grad=True), torch.randn(4, 4)
    out = causal_conv1d_update(x, torch.randn(2, 4, 4), w)
    with pytest.raises(NotImplementedError, match=r"baracuda::causal_conv1d_update is not differentiable"):
        out.sum().backward()
    with pytest.raises(NotImplementedError, match=r"conv_state is updated in place and must not require grad"):
        causal_conv1d_update(x, torch.randn(2, 4, 4, requires_grad=True), w)
    params = inspect.signature(causal_conv1d_update).parameters
    assert [(n, p.default) for n, p in params.items()] == [
        ("x", inspect.Parameter.empty), ("conv_state", inspect.Parameter.empty), ("weight", inspect.Parameter.empty),
        ("bias", None), ("activation", None), ("cache_seqlens", None), ("conv_state_indices", None)]


def test_explain_cpu():
    x, st, w = torch.randn(2, 4, dtype=torch.bfloat16), torch.randn(2, 4, 4, dtype=torch.bfloat16), torch.randn(4, 4)
    info = bt.explain("causal_conv1d_update", x, st, w, None, "silu")
    assert (info.family, info.op, info.variant, info.backend, info.dtype) == (
        "causal_conv1d", "silu_update", "channel", "cpu", "bfloat16")
    assert info.deterministic and info.workspace_bytes == 0
    info = bt.explain(ops.causal_conv1d_update, x, st, w, cache_seqlens=torch.zeros(2, dtype=torch.int32),
                      conv_state_indices=torch.arange(2))
    assert (info.op, info.variant, info.index_dtype) == ("linear_update", "channel_circular", "int64")


# ---- CUDA ----------------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_matches_cpu(dtype):
    """Every width up to 8, both state modes, a pool with padding, channel-last and
    contiguous states: the same taps in the same order on both devices."""
    tol = 1e-12 if dtype == torch.float64 else 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    for W in range(1, 9):
        for circular in (False, True):
            for channel_last in (False, True):
                M = W + 1
                st = (randn((5, M, 70), dtype, "cuda").transpose(1, 2) if channel_last
                      else randn((5, 70, M), dtype, "cuda"))
                x, w, b = randn((3, 70, 2), dtype, "cuda"), randn((70, W), dtype, "cuda"), randn((70,), dtype, "cuda")
                cache = torch.tensor([1, 4, 9], dtype=torch.int32, device="cuda") if circular else None
                idx = torch.tensor([4, -1, 0], device="cuda")
                st_c = st.cpu()
                out = causal_conv1d_update(x, st, w, b, "silu", cache, idx)
                out_c = causal_conv1d_update(x.cpu(), st_c, w.cpu(), b.cpu(), "silu",
                                             cache.cpu() if cache is not None else None, idx.cpu())
                torch.testing.assert_close(out.cpu(), out_c, rtol=tol, atol=tol)
                assert torch.equal(st.cpu(), st_c)
    check(randn((3, 70, 2), dtype, "cuda"), randn((3, 70, 4), dtype, "cuda"), randn((70, 4), torch.float32
          if dtype != torch.float64 else dtype, "cuda"), None, "silu")


@requires_cuda
def test_cuda_width_limit_and_bad_index():
    x = torch.randn(2, 4, device="cuda")
    with pytest.raises(NotImplementedError, match=r"baracuda::causal_conv1d_update: widths up to 8 are wired on "
                                                  r"CUDA, got 9"):
        causal_conv1d_update(x, torch.randn(2, 4, 8, device="cuda"), torch.randn(4, 9, device="cuda"))
    st = torch.randn(3, 4, 4, device="cuda")
    before = st.clone()
    out = causal_conv1d_update(x, st, torch.randn(4, 4, device="cuda"),
                               conv_state_indices=torch.tensor([1, 7], device="cuda"))
    assert out[1].isnan().all() and not out[0].isnan().any()
    assert torch.equal(st[[0, 2]], before[[0, 2]])
    with pytest.raises(RuntimeError, match=r"baracuda::causal_conv1d_update: expected all tensors on one device"):
        causal_conv1d_update(x, st[:2], torch.randn(4, 4))


@requires_cuda
def test_cuda_graph_capture():
    """Captured in a CUDA graph and replayed on new inputs: out and the state equal an
    eager run from the same state, bit for bit."""
    Bsz, D, W = 4, 300, 4
    x = torch.randn(Bsz, D, device="cuda", dtype=torch.bfloat16)
    st = torch.randn(Bsz, W, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    w, b = torch.randn(D, W, device="cuda", dtype=torch.bfloat16), torch.randn(D, device="cuda", dtype=torch.bfloat16)
    start = st.clone()

    def step():
        return causal_conv1d_update(x, st, w, b, "silu")

    graph, captured = capture_graph(step)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        st.copy_(start)
        graph.replay()
        torch.cuda.synchronize()
        replayed, state = captured.clone(), st.clone()
        st.copy_(start)
        assert torch.equal(replayed, step()) and torch.equal(state, st)
