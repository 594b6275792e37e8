"""The causal depthwise conv1d (causal_conv1d, causal_conv1d_backward and its _into form,
which writes dx into the caller's tensor) beyond the table of
tests/op_db.py: every option against a float64 step-by-step loop (seq_idx with padding
steps, initial_states, final states and their gradient) in every dtype, widths 2 to 4 on
both devices and 1, 5, 6 on the CPU, the channel-last slice a Mamba layer passes and other
strides, L < W − 1 and L = 0, the output layouts (torch.empty_like's, causal-conv1d's
states), NaN-poisoned outputs, NaN kept inside its sequence, bitwise reproducible dweight
and dbias, causal_conv1d_fn's signature and return convention, explain, torch.compile,
torch.func, and on CUDA: the variant per layout, CPU agreement, graph capture, the Mamba-2
2.7B shape and more than 2^31 elements."""
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, jacfwd, jacrev, vmap

import baracuda_torch as bt
from baracuda_torch import mamba
from baracuda_torch import reference as ref
from baracuda_torch.causal_conv1d import causal_conv1d_fn
from helpers import (DEVICES, FLOAT_DTYPES, assert_close_to_reference, check_compiled,
                     check_graph_replay, poison_fresh_outputs, randn, requires_cuda)
from op_db import channel_last, conv_seq_idx

ops = torch.ops.baracuda
HALF = (torch.float16, torch.bfloat16)


def stepwise(x, weight, bias=None, seq_idx=None, initial_states=None, activation=None):
    """(out, final_states) step by step (a Python loop over t), in the inputs' dtype:
    out[t] = act(bias + Σ_k weight[:, k]·x̃[t − (W−1) + k]) over the taps of t's sequence,
    0 at a padding step; x̃ before time 0 from initial_states (or 0)."""
    B, D, L = x.shape
    W = weight.shape[1]
    pad = initial_states if initial_states is not None else x.new_zeros(B, D, W - 1)
    xt = torch.cat([pad, x], dim=-1)
    steps = []
    for t in range(L):
        acc = bias.expand(B, D) if bias is not None else x.new_zeros(B, D)
        for k in range(W):
            tau = t - (W - 1) + k
            term = weight[:, k] * xt[:, :, tau + W - 1]
            if seq_idx is not None:
                same = (seq_idx[:, tau] == seq_idx[:, t]) if tau >= 0 else torch.zeros(B, dtype=torch.bool)
                term = torch.where(same.to(x.device)[:, None], term, 0)
            acc = acc + term
        if activation is not None:
            acc = F.silu(acc)
        if seq_idx is not None:
            acc = torch.where((seq_idx[:, t] < 0)[:, None], 0, acc)
        steps.append(acc)
    out = torch.stack(steps, -1) if steps else x.new_zeros(B, D, 0)
    return out, xt[..., L:]


def run_and_check(x, weight, bias=None, seq_idx=None, initial_states=None, activation=None,
                  dout=None, dfinal=None, truth=stepwise):
    """Our out, final_states and every gradient (x, weight, bias, initial_states, with
    gradients into out and final_states) on these tensors (any layout) against `truth` in
    float64 and reference.py in the tensors' own dtypes (the 2x rule). Returns ours."""
    floats = (x, weight, bias, initial_states)

    def leaves(cast=None):
        return [t.detach().to(cast if cast else t.dtype).requires_grad_() if t is not None else None
                for t in floats]

    def run(fn, ts, cast=None):
        out, final = fn(ts[0], ts[1], ts[2], seq_idx, ts[3], activation)
        g_out = dout if dout is not None else randn(out.shape, x.dtype, x.device)
        g_fin = dfinal if dfinal is not None else randn(final.shape, x.dtype, x.device)
        given = [t for t in ts if t is not None]
        # (A reference's outputs need not require grad: empty, or zeros without initial states.)
        pairs = [(o, g.to(cast or o.dtype)) for o, g in ((out, g_out), (final, g_fin)) if o.requires_grad]
        grads = (torch.autograd.grad([o for o, _ in pairs], given, [g for _, g in pairs], allow_unused=True)
                 if pairs else [None] * len(given))
        return (out, final), [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, given)]

    torch.manual_seed(1)
    ours = run(lambda *a: bt.causal_depthwise_conv1d(a[0], a[1], a[2], seq_idx=a[3], initial_states=a[4],
                                                     activation=a[5], return_final_states=True), leaves())
    torch.manual_seed(1)
    truth64 = run(truth, leaves(torch.float64), torch.float64)
    torch.manual_seed(1)
    base = run(ref.causal_conv1d, leaves())
    what = (f"{x.dtype} x{tuple(x.shape)} strides {x.stride()} W={weight.shape[1]} weight {weight.dtype} "
            f"bias={bias is not None} seq_idx={seq_idx is not None} init={initial_states is not None} {activation}")
    names = ["out", "final_states"]
    for name, a, e, b in zip(names, ours[0], truth64[0], base[0]):
        assert a.dtype == x.dtype and a.device == x.device, (name, what)
        assert_close_to_reference(a, e, b, f"{name} of {what}")
    names = ["dx", "dweight"] + (["dbias"] if bias is not None else []) + (["dinitial_states"] if initial_states
                                                                           is not None else [])
    for name, a, e, b in zip(names, ours[1], truth64[1], base[1]):
        assert a.dtype == b.dtype, (name, what)
        assert_close_to_reference(a, e, b, f"{name} of {what}")
    return ours


def weight_for(D, W, dtype, device, wdtype=None):
    return randn((D, W), wdtype or dtype, device, 0.5)


# ---- the float64 truth --------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 2, 4, 5])
def test_reference_matches_stepwise(width):
    """reference.py's tap-vectorized formula (the op table's truth) equals the step loop."""
    B, D, L = 2, 5, 17
    x, w, b = torch.randn(B, D, L, dtype=torch.float64), torch.randn(D, width, dtype=torch.float64), \
        torch.randn(D, dtype=torch.float64)
    init = torch.randn(B, D, width - 1, dtype=torch.float64)
    seq = conv_seq_idx("cpu", B, L, padding=2)
    for args in ((x, w, b, None, init, "silu"), (x, w, None, seq, None, None), (x, w, b, seq, None, "swish"),
                 (x[..., :1], w, b, None, init, None)):
        for a, e in zip(ref.causal_conv1d(*args), stepwise(*args)):
            torch.testing.assert_close(a, e, rtol=1e-14, atol=1e-14)


# ---- results ------------------------------------------------------------------------------------

OPTIONS = [dict(), dict(bias=True), dict(activation="silu"), dict(bias=True, activation="swish"),
           dict(init=True), dict(init=True, bias=True, activation="silu"), dict(seq=True),
           dict(seq=True, bias=True, activation="silu")]


def widths(device):
    return [2, 3, 4] + ([1, 5, 6] if device == "cpu" else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_option(device, dtype):
    """Every option and width on the channel-last slice (a Mamba layer's layout) and on
    contiguous [B, D, L]; with seq_idx, packed sequences of random lengths and two padding
    steps; a float32 weight for half types."""
    B, D, L = 2, 12, 23
    for W in widths(device):
        for i, opt in enumerate(OPTIONS):
            xs = channel_last(lambda *s: randn(s, dtype, device), B, D, L) if i % 2 == 0 \
                else randn((B, D, L), dtype, device)
            wd = torch.float32 if dtype in HALF and i % 3 == 0 else dtype
            run_and_check(xs, weight_for(D, W, dtype, device, wd),
                          bias=randn((D,), wd, device) if opt.get("bias") else None,
                          seq_idx=conv_seq_idx(device, B, L, padding=2) if opt.get("seq") else None,
                          initial_states=randn((B, D, W - 1), dtype, device) if opt.get("init") else None,
                          activation=opt.get("activation"))


def layouts(dtype, device, B, D, L):
    """x [B, D, L] in the layouts the plans tell apart, and some they do not."""
    r = lambda *s: randn(s, dtype, device)  # noqa: E731
    return {
        "channel_last_slice": channel_last(r, B, D, L, extra=8),  # 16-byte aligned, as in a Mamba layer
        "channel_last_dense": r(B, L, D).transpose(1, 2),
        "channel_last_offset_1": r(B, L, D + 1)[..., 1:].transpose(1, 2),
        "contiguous": r(B, D, L),
        "rows_sliced": r(B, D, L + 8)[..., 3:L + 3],
        "every_other_step": r(B, D, 2 * L)[..., ::2],
        "channel_stride_2": r(B, 2 * D, L)[:, ::2],
        "batch_last": r(D, L, B).permute(2, 0, 1),
        "batch_expanded": r(1, D, L).expand(B, D, L),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_strided_inputs(device, dtype):
    """x, weight, bias, seq_idx, initial_states and the output gradients in other layouts
    (transposed, sliced, strided, expanded)."""
    B, D, L, W = 3, 8, 21, 4
    w_t = randn((W, D), dtype, device).t()
    b_s = randn((2 * D,), dtype, device)[::2]
    seq_t = conv_seq_idx(device, B, L).t().contiguous().t()
    init_t = randn((B, W - 1, D), dtype, device).transpose(1, 2)
    for name, x in layouts(dtype, device, B, D, L).items():
        run_and_check(x, w_t, b_s, None, init_t, "silu", dout=layouts(dtype, device, B, D, L)["every_other_step"],
                      dfinal=randn((B, D, 2 * (W - 1)), dtype, device)[..., ::2])
        run_and_check(x, weight_for(D, W, dtype, device), None, seq_t, None, None,
                      dout=randn((B, L, D), dtype, device).transpose(1, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_short_sequences(device, dtype):
    """L = 0, 1 and around W − 1: final_states then holds initial states (and their
    gradient flows back to dinitial_states)."""
    B, D = 2, 8
    for W in (2, 3, 4):
        for L in sorted({0, 1, W - 2, W - 1, W, W + 1}):
            x = channel_last(lambda *s: randn(s, dtype, device), B, D, L)
            init = randn((B, D, W - 1), dtype, device)
            run_and_check(x, weight_for(D, W, dtype, device), randn((D,), dtype, device), None, init, "silu")
            run_and_check(x, weight_for(D, W, dtype, device), None, None, None, None)
            if L > 0:
                run_and_check(x, weight_for(D, W, dtype, device), None, conv_seq_idx(device, B, L), None, "silu")


@pytest.mark.parametrize("device", DEVICES)
def test_output_layouts(device):
    """out and dx in x's memory layout (torch.empty_like; contiguous where neither x's
    channel nor time stride is 1, as causal-conv1d copies x then); final_states and
    dinitial_states channel-last as causal-conv1d allocates them; dweight, dbias contiguous."""
    B, D, L, W = 2, 8, 10, 4
    w, b = torch.randn(D, W, device=device), torch.randn(D, device=device)
    init = torch.randn(B, D, W - 1, device=device)
    states = torch.empty(B, W - 1, D).transpose(1, 2).stride()
    for name, x in layouts(torch.float32, device, B, D, L).items():
        out, final = bt.causal_depthwise_conv1d(x, w, b, initial_states=init, return_final_states=True)
        expected = (torch.empty(B, D, L).stride() if x.stride(1) != 1 and x.stride(2) != 1
                    else torch.empty_like(x).stride())
        assert out.stride() == expected, name
        assert final.stride() == states, name
        dx, dw, db, dinit = ops.causal_conv1d_backward(torch.randn_like(out), None, x, w, b, None, init)
        assert dx.stride() == expected and dinit.stride() == states, name
        assert dw.is_contiguous() and db.is_contiguous(), name
    x = layouts(torch.float32, device, B, D, L)["channel_last_slice"]
    assert bt.causal_depthwise_conv1d(x, w).stride(1) == 1  # a Mamba layer's slice: channel-last out


# ---- properties ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_long_sequences(device, dtype):
    """Rows of many chunks, several iterations each: on CUDA the backward completes dx W − 1
    steps behind its loads, carries the next iteration's loads and, on 16-byte rows, stores
    dx a vector at a time across iterations. A contiguous x takes the rows kernel where its
    row length is a multiple of the 16-byte vector (asserted on CUDA; L = 1000 and 8200
    end inside a 16-bit thread's 16-step iteration, L = 1004 inside a float32 one's, and is
    strided for 16-bit data). Against reference.py in float64, each width, with seq_idx or
    with initial and final states; the channel-last slice alike."""
    for B, D, L in ((2, 24, 1000), (2, 24, 1004), (1, 3, 8200)):
        xs = {"contiguous": randn((B, D, L), dtype, device)}
        if D % 4 == 0:
            xs["channel_last_slice"] = channel_last(lambda *s: randn(s, dtype, device), B, D, L, extra=8)
        for W in (2, 3, 4):
            w, b = weight_for(D, W, dtype, device), randn((D,), dtype, device)
            for name, x in xs.items():
                if x.is_cuda and name == "contiguous":
                    rows = L % (16 // x.element_size()) == 0
                    variant = bt.explain("causal_conv1d_backward", torch.empty_like(x), None, x, w).variant
                    assert variant == ("rows_vec16" if rows else "strided"), (L, dtype, variant)
                run_and_check(x, w, b, conv_seq_idx(device, B, L, padding=3), None, "silu",
                              truth=ref.causal_conv1d)
                run_and_check(x, w, None, None, randn((B, D, W - 1), dtype, device), None,
                              truth=ref.causal_conv1d)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_element_written(device, dtype):
    """NaN-poisoned fresh outputs (deterministic mode): every element of out, final_states,
    dx, dweight, dbias and dinitial_states is written, in every layout and option."""
    poison_fresh_outputs()
    B, D, L = 2, 16, 37
    for name, x in layouts(dtype, device, B, D, L).items():
        run_and_check(x, weight_for(D, 4, dtype, device), randn((D,), dtype, device), None,
                      randn((B, D, 3), dtype, device), "silu")
        run_and_check(x, weight_for(D, 3, dtype, device), randn((D,), dtype, device),
                      conv_seq_idx(device, B, L, padding=1), None, None)


def gradient_buffer_slice(dtype, device, B, D, L, offset):
    """A NaN [B, L, D + offset + 8] buffer and its channels [offset, offset + D) as a
    [B, D, L] view: where the Mamba-2 split path's backward wants the conv's dx."""
    buf = torch.full((B, L, D + offset + 8), float("nan"), dtype=dtype, device=device)
    return buf, buf[..., offset:offset + D].transpose(1, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_into(device, dtype):
    """causal_conv1d_backward_into writes the dx of causal_conv1d_backward, bit for bit,
    into a slice of a larger buffer (aligned, and one channel off), and nothing else of the
    buffer; its other outputs are the backward's. Every x layout, with and without the
    options."""
    B, D, L, W = 2, 16, 37, 4
    for name, x in layouts(dtype, device, B, D, L).items():
        w, b = weight_for(D, W, dtype, device), randn((D,), dtype, device)
        dout = randn((B, D, L), dtype, device)
        for opts in ((b, None, randn((B, D, W - 1), dtype, device), "silu"),
                     (None, conv_seq_idx(device, B, L, padding=1), None, None)):
            want = ops.causal_conv1d_backward(dout, None, x, w, *opts)
            for offset in (0, 1):
                buf, dx = gradient_buffer_slice(dtype, device, B, D, L, offset)
                got = ops.causal_conv1d_backward_into(dout, None, x, w, dx, *opts)
                assert torch.equal(dx, want[0]), (name, offset)
                for g, e in zip(got, want[1:]):
                    assert torch.equal(g, e), (name, offset)
                rest = torch.ones_like(buf, dtype=torch.bool)
                rest[..., offset:offset + D] = False
                assert buf[rest].isnan().all(), (name, offset)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_into_memory_checks(device):
    """dx may not share memory with what the kernels read (dout, x, the states), nor
    overlap itself: ValueError naming the op and the operand. Where torch cannot tell
    (strided views of one storage), intersecting byte ranges count as shared."""
    B, D, L, W = 2, 4, 6, 4
    x, w, dout = (torch.randn(B, D, L, device=device), torch.randn(D, W, device=device),
                  torch.randn(B, D, L, device=device))
    op = r"baracuda::causal_conv1d_backward_into: "
    with pytest.raises(ValueError, match=op + r"dx must not share memory with dout"):
        ops.causal_conv1d_backward_into(dout, None, x, w, dout)
    wide = torch.randn(B, D + 2, L, device=device)
    with pytest.raises(ValueError, match=op + r"dx must not share memory with x"):
        ops.causal_conv1d_backward_into(dout, None, wide[:, :D], w, wide[:, 2:])
    init = torch.randn(B, D, L, device=device)
    with pytest.raises(ValueError, match=op + r"dx must not share memory with initial_states"):
        ops.causal_conv1d_backward_into(dout, None, x, w, init, None, None, init[..., :W - 1])
    with pytest.raises(ValueError, match=op + r"dx must not overlap itself"):
        ops.causal_conv1d_backward_into(dout, None, x, w, torch.empty(B, 1, L, device=device).expand(B, D, L))
    # (conservative where torch cannot tell: channels of one buffer interleaved with x's are
    # refused, though no element is shared; a dx in its own buffer is what the rule is for)
    both = torch.randn(B, L, 2 * D, device=device)
    with pytest.raises(ValueError, match=op + r"dx must not share memory with x"):
        ops.causal_conv1d_backward_into(dout, None, both[..., :D].transpose(1, 2), w, both[..., D:].transpose(1, 2))
    got = ops.causal_conv1d_backward_into(dout, None, both[..., :D].transpose(1, 2), w, torch.empty_like(x))
    assert got[0].shape == (D, W)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_stays_in_its_sequence(device):
    """A NaN input reaches the outputs of its own sequence only (and dweight, which sums
    over everything), as the reference says; padding steps stay 0."""
    B, D, L, W = 1, 4, 12, 4
    seq = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3], dtype=torch.int32, device=device)
    x = torch.randn(B, D, L, dtype=torch.float64, device=device)
    x[0, 1, 3] = float("nan")
    x[0, 2, 8] = float("inf")
    ours = run_and_check(x, weight_for(D, W, torch.float64, device), None, seq, None, "silu")
    out = ours[0][0]
    assert out[0, 1, 3:5].isnan().all() and not out[0, 1, 5:].isnan().any()
    assert not out[0, 1, :3].isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_dweight_bitwise_reproducible(device):
    """dweight and dbias are sums in a fixed order: the same bits on every run, and on the
    CPU for every thread count."""
    B, D, L, W = 4, 40, 3000, 4
    x = channel_last(lambda *s: randn(s, torch.float32, device), B, D, L)
    w, b = torch.randn(D, W, device=device), torch.randn(D, device=device)
    dout = torch.randn(B, D, L, device=device)
    first = ops.causal_conv1d_backward(dout, None, x, w, b, None, None, "silu")
    for _ in range(3):
        again = ops.causal_conv1d_backward(dout, None, x, w, b, None, None, "silu")
        for a, e in zip(again, first):
            assert torch.equal(a, e)
    if device == "cpu":
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            single = ops.causal_conv1d_backward(dout, None, x, w, b, None, None, "silu")
        finally:
            torch.set_num_threads(threads)
        for a, e in zip(single, first):
            assert torch.equal(a, e)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_beyond_samples(device):
    """gradcheck in float64 on what the table's samples do not reach: seq_idx with
    initial-state-free packed rows and SiLU on a contiguous x, dfinal_states with L < W − 1,
    and (CPU) widths 1 and 5."""
    d = dict(dtype=torch.float64, device=device)
    seq = conv_seq_idx(device, 2, 9, padding=1)
    cases = [(torch.randn(2, 3, 9, **d), torch.randn(3, 4, **d), torch.randn(3, **d), seq, None, "silu"),
             (torch.randn(1, 3, 1, **d), torch.randn(3, 4, **d), None, None, torch.randn(1, 3, 3, **d), "silu")]
    if device == "cpu":
        cases += [(torch.randn(2, 3, 7, **d), torch.randn(3, 1, **d), torch.randn(3, **d), None, None, "silu"),
                  (torch.randn(2, 3, 7, **d), torch.randn(3, 5, **d), None, None, torch.randn(2, 3, 4, **d), None)]
    for x, w, b, s, init, act in cases:
        tensors = [t.requires_grad_() for t in (x, w, b, init) if t is not None]

        def fn(*ts, b=b, init=init, s=s, act=act):
            it = iter(ts)
            x, w = next(it), next(it)
            bb = next(it) if b is not None else None
            ii = next(it) if init is not None else None
            return ops.causal_conv1d(x, w, bb, s, ii, act)

        assert torch.autograd.gradcheck(fn, tensors)


def test_double_backward_raises():
    x = torch.randn(1, 2, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    out = bt.causal_depthwise_conv1d(x, w, activation="silu")
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match=r"baracuda::causal_conv1d: double backward"):
        torch.autograd.grad(gx.sum(), w)


@requires_cuda
def test_mixed_devices():
    x = torch.randn(1, 4, 6, device="cuda")
    with pytest.raises(RuntimeError, match=r"baracuda::causal_conv1d: expected all tensors on one device"):
        ops.causal_conv1d(x, torch.randn(4, 4))
    with pytest.raises(RuntimeError, match=r"baracuda::causal_conv1d_backward: .*one device"):
        ops.causal_conv1d_backward(x, None, x, torch.randn(4, 4, device="cuda"), torch.randn(4))


# ---- the Python API -----------------------------------------------------------------------------


def test_causal_conv1d_fn_signature():
    """causal-conv1d's causal_conv1d_fn: the same parameters, in order, with the same
    defaults (so that calls written for it run unchanged)."""
    params = inspect.signature(causal_conv1d_fn).parameters
    assert [(n, p.default) for n, p in params.items()] == [
        ("x", inspect.Parameter.empty), ("weight", inspect.Parameter.empty), ("bias", None), ("seq_idx", None),
        ("initial_states", None), ("return_final_states", False), ("final_states_out", None),
        ("activation", None)]


@pytest.mark.parametrize("device", DEVICES)
def test_causal_conv1d_fn_returns(device):
    """out alone, or (out, final_states); final_states_out is written and returned (and
    ignored without return_final_states); the gradient through it reaches x."""
    B, D, L, W = 2, 8, 6, 4
    x = torch.randn(B, D, L, device=device, requires_grad=True)
    w, b = torch.randn(D, W, device=device), torch.randn(D, device=device)
    out = causal_conv1d_fn(x, w, b, activation="silu")
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, ref.causal_conv1d(x, w, b, activation="silu")[0])
    out2, final = causal_conv1d_fn(x, w, b, None, None, True, None, "silu")
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(final, x[..., -3:])
    buf = torch.zeros(B, D, W - 1, device=device)
    out3, final3 = causal_conv1d_fn(x, w, b, return_final_states=True, final_states_out=buf)
    assert final3 is buf
    torch.testing.assert_close(buf, x.detach()[..., -3:])
    (g,) = torch.autograd.grad(final3.sum(), x)
    assert torch.equal(g[..., -3:], torch.ones_like(g[..., -3:])) and not g[..., :-3].any()
    untouched = torch.zeros(B, D, W - 1, device=device)
    assert isinstance(causal_conv1d_fn(x, w, final_states_out=untouched), torch.Tensor)
    assert not untouched.any()


@pytest.mark.parametrize("device", DEVICES)
def test_matches_mamba_conv_path(device):
    """The conv of baracuda_torch.mamba's layer body (F.conv1d, or its tap loop with
    seq_idx) on [B, L, C] activations, as one op on their channel-last view."""
    B, L, C, W = 2, 19, 24, 4
    xBC = torch.randn(B, L, C + 8, device=device)[..., 4:C + 4]
    w, b = torch.randn(C, W, device=device), torch.randn(C, device=device)
    seq = conv_seq_idx(device, B, L)
    for s in (None, seq):
        theirs = mamba._causal_conv1d(xBC, w, b, s, True)
        ours = bt.causal_depthwise_conv1d(xBC.transpose(1, 2), w, b, seq_idx=s, activation="silu").transpose(1, 2)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


# ---- explain, compile, torch.func ---------------------------------------------------------------


def test_explain_cpu():
    B, D, L, W = 2, 8, 3000, 4
    x = channel_last(lambda *s: torch.randn(s), B, D, L)
    w = torch.randn(D, W)
    info = bt.explain("causal_conv1d", x, w, None, None, None, "silu")
    assert (info.family, info.op, info.variant, info.backend) == ("causal_conv1d", "silu", "strided", "cpu")
    assert info.deterministic and info.bit_stable and info.workspace_bytes == 0 and info.index_dtype is None
    seq = torch.zeros(B, L, dtype=torch.int32)
    info = bt.explain(ops.causal_conv1d_backward, torch.randn(B, D, L), None, x, w, torch.randn(D), seq)
    assert (info.op, info.index_dtype, info.math_precision, info.accumulator) == (
        "linear_backward", "int32", "float32", "float32")
    # One float32 partial row per (batch, 1024-step chunk): D·(W + 1) values each.
    assert info.workspace_bytes == B * 3 * D * (W + 1) * 4
    assert info.deterministic


@pytest.mark.parametrize("device", DEVICES)
def test_compile(device):
    """torch.compile(fullgraph=True) of causal_conv1d_fn with final states (static and
    dynamic shapes), forward and gradients, against eager."""
    def fn(x, w, b, init):
        out, final = causal_conv1d_fn(x, w, b, None, init, True, None, "silu")
        return torch.cat([out.flatten(), final.flatten()])

    inputs = []
    for L in (7, 12):
        inputs.append((channel_last(lambda *s: torch.randn(s, device=device), 2, 8, L).requires_grad_(),
                       torch.randn(8, 4, device=device, requires_grad=True),
                       torch.randn(8, device=device, requires_grad=True),
                       torch.randn(2, 8, 3, device=device, requires_grad=True)))
    check_compiled(fn, inputs)
    check_compiled(fn, inputs, dynamic=True)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_func(device):
    """torch.func.grad against autograd, vmap over an extra batch dim (one call per sample)
    of the forward and of the backward, jacrev against the reference's; jacfwd (forward
    mode) raises an error naming the op."""
    d = dict(dtype=torch.float64, device=device)
    x, w, b = torch.randn(2, 4, 9, **d), torch.randn(4, 3, **d), torch.randn(4, **d)

    def loss(x, w, b):
        return (bt.causal_depthwise_conv1d(x, w, b, activation="silu") ** 2).sum()

    gs = grad(loss, argnums=(0, 1, 2))(x, w, b)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    expected = torch.autograd.grad(loss(*leaves), leaves)
    for a, e in zip(gs, expected):
        torch.testing.assert_close(a, e)
    xs = torch.randn(3, 2, 4, 9, **d)
    batched = vmap(lambda t: bt.causal_depthwise_conv1d(t, w, b, activation="silu"))(xs)
    for i in range(3):
        torch.testing.assert_close(batched[i], bt.causal_depthwise_conv1d(xs[i], w, b, activation="silu"))
    gb = vmap(grad(loss), in_dims=(0, None, None))(xs, w, b)
    for i in range(3):
        torch.testing.assert_close(gb[i], grad(loss)(xs[i], w, b))
    jac = jacrev(lambda t: bt.causal_depthwise_conv1d(t, w, b, activation="silu"))(x)
    expected = jacrev(lambda t: ref.causal_conv1d(t, w, b, activation="silu")[0])(x)
    torch.testing.assert_close(jac, expected)
    with pytest.raises(NotImplementedError, match=r"baracuda::causal_conv1d: forward-mode AD"):
        jacfwd(lambda t: bt.causal_depthwise_conv1d(t, w))(x)


# ---- CUDA ---------------------------------------------------------------------------------------


@requires_cuda
def test_cuda_variants_chosen():
    """The plan's CUDA variant per layout: 16-byte vectors along channels where x's channel
    stride is 1 and the channels, strides and addresses allow (8 bytes of 16-bit data),
    along time on contiguous rows, scalar otherwise; forward and backward alike."""
    B, D, L, W = 2, 16, 64, 4
    w = torch.randn(D, W, device="cuda")
    expect = {"channel_last_slice": "channels_last_vec", "channel_last_dense": "channels_last_vec",
              "channel_last_offset_1": "strided", "contiguous": "rows_vec16", "rows_sliced": "strided",
              "every_other_step": "strided", "channel_stride_2": "rows_vec16", "batch_last": "strided",
              "batch_expanded": "rows_vec16"}
    for dtype in FLOAT_DTYPES:
        for name, x in layouts(dtype, "cuda", B, D, L).items():
            wd = w.to(dtype)
            fwd = bt.explain("causal_conv1d", x, wd)
            bwd = bt.explain("causal_conv1d_backward", torch.empty_like(x), None, x, wd)
            # the channel-last backward without seq_idx or dfinal_states: the plain walk
            plain = "_plain" if expect[name] == "channels_last_vec" else ""
            assert fwd.variant == expect[name] and bwd.variant == expect[name] + plain, \
                (dtype, name, fwd.variant, bwd.variant)
            seq = torch.zeros(B, L, device="cuda", dtype=torch.int32)
            assert bt.explain("causal_conv1d_backward", torch.empty_like(x), None, x, wd, None,
                              seq).variant == expect[name]
            assert fwd.backend == "cuda" and fwd.deterministic and bwd.deterministic
    odd = torch.randn(B, D, 61, device="cuda", dtype=torch.bfloat16)  # rows of 61: not 16-byte aligned
    assert bt.explain("causal_conv1d", odd, w.bfloat16()).variant == "strided"
    narrow = torch.randn(B, 61, 6, device="cuda").transpose(1, 2)    # 6 channels: no 4-channel vectors
    assert bt.explain("causal_conv1d", narrow, torch.randn(6, W, device="cuda")).variant == "strided"


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_matches_cpu(dtype):
    """Every layout, width and option on CUDA against the CPU kernel on the same inputs:
    the same formula in the same tap order (the half types' SiLU uses the hardware exp on
    CUDA; dweight/dbias sum in another order), so within a few units of the compute
    precision; each also against the float64 truth."""
    B, D, L = 2, 16, 70
    rtol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2 * torch.finfo(dtype).eps)
    for W in (2, 3, 4):
        for name, x in layouts(dtype, "cuda", B, D, L).items():
            for opt in OPTIONS:
                w = weight_for(D, W, dtype, "cuda")
                b = randn((D,), dtype, "cuda") if opt.get("bias") else None
                seq = conv_seq_idx("cuda", B, L, padding=2) if opt.get("seq") else None
                init = randn((B, D, W - 1), dtype, "cuda") if opt.get("init") else None
                act = opt.get("activation")
                out, fin = ops.causal_conv1d(x, w, b, seq, init, act)
                cpu = [t.cpu() if t is not None else None for t in (x, w, b, seq, init)]
                out_c, fin_c = ops.causal_conv1d(*cpu, act)
                torch.testing.assert_close(out.cpu(), out_c, rtol=rtol, atol=rtol)
                assert torch.equal(fin.cpu(), fin_c)
                dout, dfin = torch.randn_like(out), torch.randn_like(fin)
                grads = ops.causal_conv1d_backward(dout, dfin, x, w, b, seq, init, act)
                grads_c = ops.causal_conv1d_backward(dout.cpu(), dfin.cpu(), *cpu, act)
                for g, gc in zip(grads, grads_c):
                    scale = gc.abs().max().item() if gc.numel() else 1.0
                    torch.testing.assert_close(g.cpu(), gc, rtol=rtol, atol=rtol * max(scale, 1.0) * 4)
        run_and_check(layouts(dtype, "cuda", B, D, L)["channel_last_slice"], weight_for(D, W, dtype, "cuda"),
                      randn((D,), dtype, "cuda"), None, randn((B, D, W - 1), dtype, "cuda"), "silu",
                      truth=ref.causal_conv1d)


@requires_cuda
def test_cuda_width_limit():
    x = torch.randn(1, 4, 6, device="cuda")
    with pytest.raises(NotImplementedError, match=r"baracuda::causal_conv1d: widths 2 to 4 are wired on CUDA, got 5"):
        ops.causal_conv1d(x, torch.randn(4, 5, device="cuda"))
    with pytest.raises(NotImplementedError, match=r"got 1"):
        bt.explain("causal_conv1d_backward", x, None, x, torch.randn(4, 1, device="cuda"))


@requires_cuda
def test_cuda_graph_capture():
    """Forward and backward captured in a CUDA graph and replayed on new inputs (no host
    synchronization inside; the workspace from the caching allocator)."""
    B, D, L, W = 2, 64, 300, 4
    t = torch.randn(B, L, D + 32, device="cuda", dtype=torch.bfloat16)
    x = t[..., 16:16 + D].transpose(1, 2)
    w = torch.randn(D, W, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(D, device="cuda", dtype=torch.bfloat16)
    init = torch.randn(B, D, W - 1, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(B, D, L, device="cuda", dtype=torch.bfloat16)

    def step():
        out, fin = ops.causal_conv1d(x, w, b, None, init, "silu")
        return (out, fin) + tuple(ops.causal_conv1d_backward(dout, fin, x, w, b, None, init, "silu"))

    def refresh():
        t.copy_(torch.randn_like(t))
        dout.copy_(torch.randn_like(dout))

    check_graph_replay(step, refresh)


@requires_cuda
def test_cuda_mamba2_shape():
    """The Mamba-2 2.7B layer's conv: B4 L4096, 5376 channels, W 4, the channel-last slice of
    a [B, L, 10576] projection, bfloat16, bias and SiLU; forward and every gradient against
    the reference in float64 on the GPU (the 2x rule against the reference in bfloat16)."""
    B, L, D, W = 4, 4096, 5376, 4
    zxbcdt = torch.randn(B, L, 10576, device="cuda", dtype=torch.bfloat16)
    x = zxbcdt[..., 5120:5120 + D].transpose(1, 2)
    assert bt.explain("causal_conv1d", x, torch.empty(D, W, device="cuda", dtype=torch.bfloat16)).variant == \
        "channels_last_vec"
    run_and_check(x, weight_for(D, W, torch.bfloat16, "cuda"), randn((D,), torch.bfloat16, "cuda"), None, None,
                  "silu", truth=ref.causal_conv1d)


@requires_cuda
def test_cuda_backward_into_mamba2_shape():
    """The Mamba-2 2.7B layer's conv backward into the xBC slice of a [B, L, 10576]
    gradient buffer (as the split path's backward writes it): the variant of the plain
    backward, its dx bit for bit, and the rest of the buffer untouched."""
    B, L, D, W = 4, 4096, 5376, 4
    dtype = torch.bfloat16
    zxbcdt = torch.randn(B, L, 10576, device="cuda", dtype=dtype)
    x = zxbcdt[..., 5120:5120 + D].transpose(1, 2)
    w, b = weight_for(D, W, dtype, "cuda"), randn((D,), dtype, "cuda")
    dout = randn((B, D, L), dtype, "cuda").transpose(1, 2).contiguous().transpose(1, 2)
    buf = torch.full_like(zxbcdt, float("nan"))
    dx = buf[..., 5120:5120 + D].transpose(1, 2)
    assert bt.explain("causal_conv1d_backward_into", dout, None, x, w, dx).variant == \
        bt.explain("causal_conv1d_backward", dout, None, x, w).variant == "channels_last_vec_plain"
    want = ops.causal_conv1d_backward(dout, None, x, w, b, None, None, "silu")
    got = ops.causal_conv1d_backward_into(dout, None, x, w, dx, b, None, None, "silu")
    assert torch.equal(dx, want[0])
    for g, e in zip(got, want[1:]):
        assert torch.equal(g, e)
    assert buf[..., :5120].isnan().all() and buf[..., 5120 + D:].isnan().all()


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_plain_walk_same_bits(dtype):
    """The channel-last backward's plain walk (no seq_idx, no dfinal_states: its checks
    compiled out, whole iterations without per-step ones) against the checked walk, which
    the same problem takes with a seq_idx of one sequence and zero dfinal_states: the
    same bits for dx, dweight and dbias, over chunks with whole and partial iterations,
    every width, with and without SiLU."""
    B, D = 2, 64
    for L in (1, 45, 1000):
        for W in (2, 3, 4):
            x = randn((B, L, D), dtype, "cuda").transpose(1, 2)
            dout = randn((B, L, D), dtype, "cuda").transpose(1, 2)
            w, b = randn((D, W), dtype, "cuda"), randn((D,), dtype, "cuda")
            one = torch.zeros(B, L, device="cuda", dtype=torch.int32)
            zeros = torch.zeros(B, D, W - 1, device="cuda", dtype=dtype)
            for act in (None, "silu"):
                assert bt.explain("causal_conv1d_backward", dout, None, x, w).variant == "channels_last_vec_plain"
                plain = ops.causal_conv1d_backward(dout, None, x, w, b, None, None, act)
                checked = ops.causal_conv1d_backward(dout, None, x, w, b, one, None, act)
                with_final = ops.causal_conv1d_backward(dout, zeros, x, w, b, None, None, act)
                for got in (checked, with_final):
                    for p, c in zip(plain[:3], got[:3]):
                        assert torch.equal(p, c), (dtype, L, W, act)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_rows_warp(dtype):
    """The backward's warp walk over [B, D, L] rows (no seq_idx, initial or dfinal states;
    enough rows for the device): dx, dweight and dbias against float64 (the 2x rule), every
    width, with and without SiLU, over rows of one step, of part of a tile and of several
    tiles, whole or with a partial last vector (rows of a wider buffer, dx written into
    one by causal_conv1d_backward_into: nothing past a row's end written); fresh outputs
    NaN-poisoned; seq_idx takes the checked walk."""
    poison_fresh_outputs()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    B, D = 2, 16 * sms + 3  # B·D >= 32 rows an SM
    for L in (1, 45, 777, 1024):
        Lp = -(-L // 16) * 16  # rows 16-element aligned (the vectors of every dtype)
        for W in (2, 3, 4):
            x = randn((B, D, Lp), dtype, "cuda")[..., :L]
            dout = randn((B, D, Lp), dtype, "cuda")[..., :L]
            w, b = randn((D, W), dtype, "cuda"), randn((D,), dtype, "cuda")
            buf = torch.full((B, D, Lp), float("nan"), dtype=dtype, device="cuda")
            dx = buf[..., :L]
            assert bt.explain("causal_conv1d_backward_into", dout, None, x, w, dx).variant == "rows_vec16_warp"
            seq = torch.zeros(B, L, device="cuda", dtype=torch.int32)
            assert bt.explain("causal_conv1d_backward_into", dout, None, x, w, dx, None, seq).variant == "rows_vec16"
            for act in (None, "silu"):
                if Lp == L:
                    ours = ops.causal_conv1d_backward(dout, None, x, w, b, None, None, act)[:3]
                else:
                    buf.fill_(float("nan"))
                    ours = (dx, *ops.causal_conv1d_backward_into(dout, None, x, w, dx, b, None, None, act)[:2])
                    assert buf[..., L:].isnan().all(), (dtype, L, W, act)
                leaves = [t.double().requires_grad_() for t in (x, w, b)]
                truth = torch.autograd.grad(ref.causal_conv1d(*leaves, None, None, act)[0], leaves, dout.double())
                base_leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
                base = torch.autograd.grad(ref.causal_conv1d(*base_leaves, None, None, act)[0], base_leaves, dout)
                for name, a, e, bl in zip(("dx", "dweight", "dbias"), ours, truth, base):
                    assert_close_to_reference(a, e, bl, f"{name} {dtype} L={L} W={W} {act}")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_rows_warp_forward(dtype):
    """The forward's warp walk over contiguous [B, D, L] rows (no seq_idx or initial states;
    enough rows for the device): out and final_states against float64 (the 2x rule), every
    width, with and without SiLU, over rows of part of a tile and of several tiles and a
    part; fresh outputs NaN-poisoned; initial states take the other walk."""
    poison_fresh_outputs()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    B, D = 2, 16 * sms + 3  # B·D >= 32 rows an SM
    for L in (16, 1040):
        for W in (2, 3, 4):
            x = randn((B, D, L), dtype, "cuda")
            w, b = randn((D, W), dtype, "cuda"), randn((D,), dtype, "cuda")
            assert bt.explain("causal_conv1d", x, w).variant == "rows_vec16_warp"
            init = randn((B, D, W - 1), dtype, "cuda")
            assert bt.explain("causal_conv1d", x, w, None, None, init).variant == "rows_vec16"
            for act in (None, "silu"):
                ours = ops.causal_conv1d(x, w, b, None, None, act)
                truth = ref.causal_conv1d(x.double(), w.double(), b.double(), None, None, act)
                base = ref.causal_conv1d(x, w, b, None, None, act)
                for name, a, e, bl in zip(("out", "final_states"), ours, truth, base):
                    assert_close_to_reference(a, e, bl, f"{name} {dtype} L={L} W={W} {act}")


@requires_cuda
def test_cuda_over_2_31_elements():
    """A channel-last slice whose offsets exceed 2^31 − 1 (64-bit offsets throughout):
    the last steps of the last batch element, forward and dx, against the reference on
    that window (with its W − 1 halo)."""
    B, L, D, W = 2, 132_000, 8192, 4
    need = 4 * B * L * (D + 64) * 2 + (1 << 30)
    if torch.cuda.get_device_properties(0).total_memory < need:
        pytest.skip("needs more GPU memory")
    t = torch.empty(B, L, D + 64, device="cuda", dtype=torch.bfloat16).normal_()
    x = t[..., 32:32 + D].transpose(1, 2)
    assert x.storage_offset() + (B - 1) * x.stride(0) + (L - 1) * x.stride(2) + D > 2**31
    w, b = torch.randn(D, W, device="cuda", dtype=torch.bfloat16), torch.randn(D, device="cuda", dtype=torch.bfloat16)
    out, _ = ops.causal_conv1d(x, w, b, None, None, "silu")
    n = 64
    win = x[-1:, -n:, L - n - (W - 1):]
    expected = ref.causal_conv1d(win[..., W - 1:].double(), w[-n:].double(), b[-n:].double(), None,
                                 win[..., :W - 1].double(), "silu")[0]
    torch.testing.assert_close(out[-1:, -n:, -n:].double(), expected, rtol=1e-2, atol=1e-2)
    del out
    dout = torch.empty(B, D, L, device="cuda", dtype=torch.bfloat16).normal_()
    dx = ops.causal_conv1d_backward(dout, None, x, w, b, None, None, "silu")[0]
    # dx of the last n + W − 1 steps: every output they feed is in the window.
    xs = x[-1:, -n:, L - n - 2 * (W - 1):].double().requires_grad_()
    o = ref.causal_conv1d(xs[..., W - 1:], w[-n:].double(), b[-n:].double(), None, xs[..., :W - 1], "silu")[0]
    (gx,) = torch.autograd.grad(o, xs, dout[-1:, -n:, L - n - (W - 1):].double())
    torch.testing.assert_close(dx[-1:, -n:, L - n - (W - 1):].double(), gx[..., W - 1:], rtol=2e-2, atol=2e-2)
