"""One entry per op overload of ``torch.ops.baracuda``: its sample inputs, float64
reference, dtypes, autograd support and bad-input table (in the style of PyTorch's
OpInfo). ``tests/test_ops.py`` runs the generic checks over every entry; the deep
per-family tests (layouts, options, properties, CUDA-only hazards) stay in
``tests/test_<family>.py``.

A new op (or overload) needs an :class:`OpInfo` here; ``test_every_op_has_an_entry``
fails until it has one.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F

import baracuda_torch as bt
from baracuda_torch import reference as ref
from helpers import FLOAT_DTYPES, randn

ops = torch.ops.baracuda


class SampleInput(NamedTuple):
    """One call of the op: ``op(*args, **kwargs)``."""
    desc: str
    args: tuple
    kwargs: dict = {}


class BadInput(NamedTuple):
    """A call that must raise ``exc`` with a message matching ``match``. ``args`` builds
    the call's ``(args, kwargs)`` (tensors on the device the table was built for);
    ``call`` replaces the op for a rule that a Python wrapper checks."""
    name: str
    args: Callable[[], tuple]
    exc: type
    match: str
    call: Callable | None = None


def args(*a: Any, **k: Any) -> tuple:
    """The ``(args, kwargs)`` of a call, for :attr:`BadInput.args`."""
    return a, k


@dataclasses.dataclass
class OpInfo:
    name: str                                    # "lerp.Tensor": packet[.overload]
    sample_inputs: Callable[[str, torch.dtype, bool], list]  # (device, dtype, requires_grad)
    bad_inputs: Callable[[str], list]            # device -> [BadInput]
    ref: Callable | None = None                  # float64 reference (of a backward op: by autograd of the forward's)
    dtypes: tuple = tuple(FLOAT_DTYPES)
    supports_autograd: bool = True               # differentiable (gradcheck in float64)
    supports_gradgrad: bool = False              # twice differentiable (gradgradcheck)
    floor_ulps: float = 32                       # assert_close_to_reference's floor
    rtol: Callable | None = None                 # (dtype, device) -> relative bound, instead of the 2x rule
    # Positions of the arguments the op updates in place (Tensor(a!)): after the call they
    # are compared as extra outputs, against the reference's outputs after the op's own
    # (the reference returns the updated values and modifies nothing).
    mutates: tuple = ()

    @property
    def op(self) -> torch._ops.OpOverload:
        packet, _, overload = self.name.partition(".")
        return getattr(getattr(ops, packet), overload or "default")

    def samples(self, device: str, dtype: torch.dtype, requires_grad: bool = False) -> list:
        """The samples, with every floating tensor a leaf that requires grad if asked."""
        def leaf(a):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                return a.detach().requires_grad_(requires_grad)
            return a
        return [SampleInput(s.desc, tuple(leaf(a) for a in s.args), {k: leaf(v) for k, v in s.kwargs.items()})
                for s in self.sample_inputs(device, dtype, requires_grad)]


def _rand(device, dtype):
    """randn(*shape) in `dtype` on `device`, from float64 draws."""
    return lambda *shape: randn(shape, dtype, device)


def _positions(device, *shape):
    return torch.randint(0, 1000, shape, device=device)


# ---- gated activations ---------------------------------------------------------------------


def gated_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    return [SampleInput("swiglu", (r(4, 6, 16), "swiglu", -1, False)),
            SampleInput("geglu transposed dim 0 gate_first", (r(16, 12).t(), "geglu", 0, True)),
            SampleInput("glu dim 1", (r(4, 6, 16), "glu", 1, False)),
            SampleInput("geglu_tanh odd half", (r(3, 5, 14), "geglu_tanh", -1, True)),
            SampleInput("reglu 4-d dim 2", (r(2, 3, 4, 10), "reglu", 2, False)),
            SampleInput("empty", (r(0, 8), "swiglu", -1, False))]


def gated_backward_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    return [SampleInput("geglu_tanh gate_first", (r(4, 6, 8), r(4, 6, 16), "geglu_tanh", -1, True)),
            SampleInput("reglu", (r(4, 6, 8), r(4, 6, 16), "reglu", -1, False)),
            SampleInput("glu transposed dim 0", (r(6, 16), r(16, 12).t(), "glu", 0, False)),
            SampleInput("empty", (r(0, 4), r(0, 8), "swiglu", -1, False))]


def gated_bad(device):
    x = torch.randn(3, 8, device=device)
    dy = torch.randn(3, 4, device=device)
    return {
        "gated_activation": [
            BadInput("odd split", lambda: args(torch.randn(3, 7, device=device), "swiglu"), ValueError,
                     r"baracuda::gated_activation: x.size\(-1\) must be even, got 7"),
            BadInput("odd split dim 0", lambda: args(torch.randn(5, 4, device=device), "glu", 0), ValueError,
                     r"x.size\(0\) must be even, got 5"),
            BadInput("dim too large", lambda: args(x, "swiglu", 2), IndexError,
                     r"baracuda::gated_activation: dim must be in \[-2, 1\] for a 2-d tensor, got 2"),
            BadInput("dim too small", lambda: args(x, "swiglu", -3), IndexError, r"got -3"),
            BadInput("unknown kind", lambda: args(x, "gelu"), ValueError,
                     r"baracuda::gated_activation: kind must be one of .* got 'gelu'"),
            BadInput("integer input", lambda: args(torch.ones(3, 8, dtype=torch.int32, device=device), "swiglu"),
                     TypeError,
                     r"baracuda::gated_activation: x must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("bool input", lambda: args(torch.ones(3, 8, dtype=torch.bool, device=device), "swiglu"),
                     TypeError, r"baracuda::gated_activation: x has dtype Bool"),
            BadInput("complex input", lambda: args(torch.ones(3, 8, dtype=torch.complex64, device=device), "swiglu"),
                     TypeError, r"baracuda::gated_activation: x has dtype ComplexFloat"),
            BadInput("0-dim input", lambda: args(torch.tensor(1.0, device=device), "swiglu"), ValueError,
                     r"baracuda::gated_activation: x must have at least one dimension"),
            BadInput("rank 9", lambda: args(torch.randn([1] * 8 + [4], device=device), "swiglu"), NotImplementedError,
                     r"baracuda::gated_activation: x has 9 dims, at most 8"),
        ],
        "gated_activation_backward": [
            BadInput("dy wrong shape", lambda: args(torch.randn(3, 5, device=device), x, "swiglu"), ValueError,
                     r"baracuda::gated_activation_backward: dy must have x's sizes with size\(dim\) halved, "
                     r"\[3, 4\], got \[3, 5\]"),
            BadInput("dy wrong rank", lambda: args(torch.randn(12, device=device), x, "swiglu"), ValueError,
                     r"dy must have x's sizes"),
            BadInput("dy wrong dtype", lambda: args(dy.double(), x, "swiglu"), TypeError,
                     r"baracuda::gated_activation_backward: dy must have x's dtype float32, got float64"),
            BadInput("backward odd split", lambda: args(dy, torch.randn(3, 9, device=device), "swiglu"), ValueError,
                     r"baracuda::gated_activation_backward: x.size\(-1\) must be even, got 9"),
            BadInput("backward unknown kind", lambda: args(dy, x, "nope"), ValueError,
                     r"baracuda::gated_activation_backward: kind must be one of"),
        ],
    }


def pair_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    return [SampleInput("swiglu", (r(4, 6, 8), r(4, 6, 8), "swiglu")),
            SampleInput("geglu transposed and expanded", (r(8, 5).t(), r(1, 8).expand(5, 8), "geglu")),
            SampleInput("glu", (r(3, 5, 14), r(3, 5, 14), "glu")),
            SampleInput("reglu 1-d", (r(7), r(7), "reglu")),
            SampleInput("geglu_tanh 0-d", (r(), r(), "geglu_tanh")),
            SampleInput("empty", (r(0, 4), r(0, 4), "swiglu"))]


def pair_backward_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    return [SampleInput("geglu_tanh", (r(4, 6, 8), r(4, 6, 8), r(4, 6, 8), "geglu_tanh")),
            SampleInput("reglu transposed", (r(5, 8), r(8, 5).t(), r(5, 8), "reglu")),
            SampleInput("swiglu 1-d", (r(7), r(7), r(7), "swiglu"))]


def pair_in_place_samples(device, dtype, requires_grad):
    """gate and up contiguous and apart (they receive dgate and dup); dy any layout."""
    r = _rand(device, dtype)
    return [SampleInput("swiglu", (r(4, 6, 8), r(4, 6, 8), r(4, 6, 8), "swiglu")),
            SampleInput("geglu, transposed dy", (r(8, 5).t(), r(5, 8), r(5, 8), "geglu")),
            SampleInput("glu 1-d", (r(7), r(7), r(7), "glu")),
            SampleInput("empty", (r(0, 4), r(0, 4), r(0, 4), "swiglu")),
            SampleInput("empty last dim", (r(4, 0), r(4, 0), r(4, 0), "reglu"))]


def pair_bad(device):
    g = torch.randn(3, 8, device=device)
    dy = torch.randn(3, 8, device=device)
    return {
        "gated_activation_pair": [
            BadInput("shape mismatch", lambda: args(g, torch.randn(3, 7, device=device), "swiglu"), ValueError,
                     r"baracuda::gated_activation_pair: gate and up must have the same sizes, "
                     r"got gate \[3, 8\] and up \[3, 7\]"),
            BadInput("rank mismatch", lambda: args(g, torch.randn(8, device=device), "swiglu"), ValueError,
                     r"gate and up must have the same sizes"),
            BadInput("dtype mismatch", lambda: args(g, g.double(), "swiglu"), TypeError,
                     r"baracuda::gated_activation_pair: up must have gate's dtype float32, got float64"),
            BadInput("integer gate", lambda: args(g.int(), g.int(), "swiglu"), TypeError,
                     r"baracuda::gated_activation_pair: gate must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("bool gate", lambda: args(g.bool(), g.bool(), "swiglu"), TypeError,
                     r"baracuda::gated_activation_pair: gate has dtype Bool"),
            BadInput("unknown kind", lambda: args(g, g, "gelu"), ValueError,
                     r"baracuda::gated_activation_pair: kind must be one of .* got 'gelu'"),
            BadInput("rank 9", lambda: args(torch.randn([1] * 9, device=device), torch.randn([1] * 9, device=device),
                                            "swiglu"),
                     NotImplementedError, r"baracuda::gated_activation_pair: gate has 9 dims, at most 8"),
        ],
        "gated_activation_pair_backward": [
            BadInput("dy wrong shape", lambda: args(torch.randn(3, 4, device=device), g, g, "swiglu"), ValueError,
                     r"baracuda::gated_activation_pair_backward: dy must have gate's sizes \[3, 8\], got \[3, 4\]"),
            BadInput("dy wrong dtype", lambda: args(dy.double(), g, g, "swiglu"), TypeError,
                     r"baracuda::gated_activation_pair_backward: dy must have gate's dtype float32, got float64"),
            BadInput("backward unknown kind", lambda: args(dy, g, g, "silu"), ValueError,
                     r"baracuda::gated_activation_pair_backward: kind must be one of"),
        ],
        "gated_activation_pair_backward_": [
            BadInput("dy wrong shape", lambda: args(torch.randn(3, 4, device=device), g.clone(), g.clone(), "swiglu"),
                     ValueError, r"baracuda::gated_activation_pair_backward_: dy must have gate's sizes \[3, 8\], "
                                 r"got \[3, 4\]"),
            BadInput("transposed gate", lambda: args(dy, torch.randn(8, 3, device=device).t(), g.clone(), "swiglu"),
                     ValueError, r"baracuda::gated_activation_pair_backward_: gate must be contiguous \(its gradient "
                                 r"is written over it\), got strides \[1, 3\]"),
            BadInput("gate and up chunks of one row", lambda: args(dy, *torch.randn(3, 16, device=device).chunk(2, -1),
                                                             "swiglu"),
                     ValueError, r"baracuda::gated_activation_pair_backward_: gate must be contiguous"),
            BadInput("gate is up", lambda: (lambda t: args(dy, t, t, "swiglu"))(g.clone()), ValueError,
                     r"baracuda::gated_activation_pair_backward_: gate and up must not share a storage"),
            BadInput("dy is gate", lambda: (lambda t: args(t, t, g.clone(), "swiglu"))(g.clone()), ValueError,
                     r"baracuda::gated_activation_pair_backward_: dy and gate must not share a storage"),
        ],
    }


# ---- RoPE ----------------------------------------------------------------------------------


def rope_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    x = r(2, 3, 5, 8)
    return [SampleInput("interleaved [S] positions", (x, _positions(device, 5), 10000.0, True, -1)),
            SampleInput("BSHD view, partial", (r(2, 5, 3, 8).transpose(1, 2), None, 500.0, False, 4)),
            SampleInput("[B, S] positions, partial", (x, _positions(device, 2, 5), 10000.0, False, 6)),
            SampleInput("sliced features", (x[..., :6], None, 10000.0, True, 4)),
            SampleInput("empty S", (r(2, 3, 0, 8), None, 10000.0, False, -1))]


def rope_backward_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    x = r(2, 3, 5, 8)
    return [SampleInput("interleaved [B, S] positions", (x, _positions(device, 2, 5), 10000.0, True, -1)),
            SampleInput("BSHD view, rotary_dim 2", (r(2, 5, 3, 8).transpose(1, 2), _positions(device, 5), 10.0,
                                                    False, 2)),
            SampleInput("stride-2 features", (r(2, 3, 5, 16)[..., ::2], None, 10000.0, True, -1))]


def rope_bad(device):
    x = torch.randn(2, 3, 4, 8, device=device)
    pos = torch.arange(4, device=device)
    return {
        "rope": [
            BadInput("3-d x", lambda: args(torch.randn(2, 3, 4, device=device)), ValueError,
                     r"baracuda::rope: x must be 4-D \[B, H, S, D\], got a 3-d tensor of sizes \[2, 3, 4\]"),
            BadInput("5-d x", lambda: args(torch.randn(1, 2, 3, 4, 8, device=device)), ValueError,
                     r"baracuda::rope: x must be 4-D .* got a 5-d tensor"),
            BadInput("9-d x", lambda: args(torch.randn([1] * 8 + [2], device=device)), ValueError,
                     r"got a 9-d tensor"),
            BadInput("0-d x", lambda: args(torch.tensor(1.0, device=device)), ValueError,
                     r"got a 0-d tensor of sizes \[\]"),
            BadInput("integer x", lambda: args(torch.ones(2, 3, 4, 8, dtype=torch.int32, device=device)), TypeError,
                     r"baracuda::rope: x must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("bool x", lambda: args(torch.ones(2, 3, 4, 8, dtype=torch.bool, device=device)), TypeError,
                     r"baracuda::rope: x has dtype Bool"),
            BadInput("complex x", lambda: args(torch.ones(2, 3, 4, 8, dtype=torch.complex64, device=device)),
                     TypeError, r"baracuda::rope: x has dtype ComplexFloat"),
            BadInput("odd D", lambda: args(torch.randn(2, 3, 4, 7, device=device)), ValueError,
                     r"baracuda::rope: x.size\(-1\) must be even when rotary_dim is -1 \(all features rotate\), "
                     r"got 7"),
            BadInput("odd rotary_dim", lambda: args(x, rotary_dim=3), ValueError,
                     r"baracuda::rope: rotary_dim must be -1 or even with 0 < rotary_dim <= x.size\(-1\) = 8, "
                     r"got 3"),
            BadInput("rotary_dim 0", lambda: args(x, rotary_dim=0), ValueError, r"rotary_dim must be .* got 0"),
            BadInput("rotary_dim > D", lambda: args(x, rotary_dim=10), ValueError, r"<= x.size\(-1\) = 8, got 10"),
            BadInput("rotary_dim -2", lambda: args(x, None, 10000.0, True, -2), ValueError,
                     r"rotary_dim must be .* got -2"),
            BadInput("rotary_dim == odd D", lambda: args(torch.randn(1, 1, 2, 7, device=device), rotary_dim=7),
                     ValueError, r"got 7"),
            BadInput("base 0", lambda: args(x, base=0.0), ValueError,
                     r"baracuda::rope: base must be finite and > 0, got 0"),
            BadInput("base < 0", lambda: args(x, base=-10.0), ValueError, r"base must be finite and > 0, got -10"),
            BadInput("base nan", lambda: args(x, base=float("nan")), ValueError,
                     r"base must be finite and > 0, got nan"),
            BadInput("base inf", lambda: args(x, base=float("inf")), ValueError,
                     r"base must be finite and > 0, got inf"),
            BadInput("int32 positions", lambda: args(x, pos.int()), TypeError,
                     r"baracuda::rope: positions must be int64, got int32"),
            BadInput("float positions", lambda: args(x, pos.float()), TypeError,
                     r"positions must be int64, got float32"),
            BadInput("bool positions", lambda: args(x, pos > 0), TypeError,
                     r"baracuda::rope: positions has dtype Bool"),
            BadInput("positions too long", lambda: args(x, torch.arange(5, device=device)), ValueError,
                     r"baracuda::rope: positions must have shape \[S\] = \[4\] or \[B, S\] = \[2, 4\], got \[5\]"),
            BadInput("positions wrong B", lambda: args(x, torch.zeros(3, 4, dtype=torch.long, device=device)),
                     ValueError, r"positions must have shape .* got \[3, 4\]"),
            BadInput("positions [S, B]", lambda: args(x, torch.zeros(4, 2, dtype=torch.long, device=device)),
                     ValueError, r"got \[4, 2\]"),
            BadInput("positions 3-d", lambda: args(x, torch.zeros(2, 1, 4, dtype=torch.long, device=device)),
                     ValueError, r"got \[2, 1, 4\]"),
            BadInput("positions 0-d", lambda: args(x, torch.tensor(3, device=device)), ValueError, r"got \[\]"),
        ],
        "rope_backward": [
            BadInput("backward 3-d dy", lambda: args(torch.randn(2, 3, 4, device=device)), ValueError,
                     r"baracuda::rope_backward: dy must be 4-D \[B, H, S, D\]"),
            BadInput("backward odd D", lambda: args(torch.randn(2, 3, 4, 5, device=device)), ValueError,
                     r"baracuda::rope_backward: dy.size\(-1\) must be even"),
            BadInput("backward bad rotary_dim", lambda: args(x, None, 10000.0, True, 12), ValueError,
                     r"baracuda::rope_backward: rotary_dim must be .* dy.size\(-1\) = 8, got 12"),
            BadInput("backward base", lambda: args(x, None, -1.0), ValueError,
                     r"baracuda::rope_backward: base must be finite and > 0"),
            BadInput("backward positions dtype", lambda: args(x, pos.int()), TypeError,
                     r"baracuda::rope_backward: positions must be int64, got int32"),
            BadInput("backward positions shape", lambda: args(x, pos[:3]), ValueError,
                     r"baracuda::rope_backward: positions must have shape"),
            BadInput("backward integer dy", lambda: args(torch.ones(2, 3, 4, 8, dtype=torch.int64, device=device)),
                     TypeError,
                     r"baracuda::rope_backward: dy must be float32, float16, bfloat16 or float64, got int64"),
        ],
    }


# ---- RoPE from cos/sin ---------------------------------------------------------------------


def cos_sin_table(B, S, R, layout, interleaved, device, dtype):
    """(cos, sin) of random positions: "full" [B, S, R] (one entry per feature, Hugging
    Face) or "half" [S, R/2] (one per pair, flash-attention)."""
    pos = torch.randint(0, 4096, (B, S), dtype=torch.float64)
    theta = pos[..., None] * 10000.0 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    c, s = theta.cos(), theta.sin()
    if layout == "half":
        c, s = c[0], s[0]
    elif interleaved:
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
    else:
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
    return c.to(device=device, dtype=dtype), s.to(device=device, dtype=dtype)


def _tables(device, dtype):
    """Tables in float32 (the usual case for half activations) and in x's dtype."""
    t32 = dtype if dtype == torch.float64 else torch.float32
    return (cos_sin_table(2, 5, 4, "full", False, device, t32), cos_sin_table(1, 5, 8, "half", True, device, dtype),
            cos_sin_table(1, 5, 8, "full", True, device, dtype))


def rope_cos_sin_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    full, half, full1 = _tables(device, dtype)
    return [SampleInput("per-batch table, partial", (r(2, 3, 5, 8), *full, False)),
            SampleInput("[S, R/2] table, BSHD view", (r(2, 5, 2, 8).transpose(1, 2), *half, True)),
            SampleInput("[1, S, D] table", (r(1, 3, 5, 8), *full1, True))]


def rope_qk_cos_sin_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    full, half, full1 = _tables(device, dtype)
    return [SampleInput("GQA per-batch table", (r(2, 2, 5, 8), r(2, 1, 5, 8), *full, False)),
            SampleInput("[S, R/2] table, BSHD q", (r(2, 5, 2, 8).transpose(1, 2), r(2, 1, 5, 8), *half, True)),
            SampleInput("[1, S, D] table", (r(1, 3, 5, 8), r(1, 1, 5, 8), *full1, True))]


def rope_cos_sin_bad(device):
    q, k = torch.randn(2, 4, 5, 16, device=device), torch.randn(2, 2, 5, 16, device=device)
    c = torch.randn(1, 5, 16, device=device)
    op = r"baracuda::rope_qk_cos_sin: "
    return {
        "rope_qk_cos_sin": [
            BadInput("table S mismatch", lambda: args(q, k, c[:, :4], c[:, :4]), ValueError,
                     op + r"cos/sin of rank 3 must be \[1 or B, S, R\] = \[1 or 2, 5, R\]"),
            BadInput("table R > D", lambda: args(q, k, torch.randn(1, 5, 18, device=device),
                                                 torch.randn(1, 5, 18, device=device)), ValueError,
                     op + r".*2 <= R <= D = 16"),
            BadInput("table R odd", lambda: args(q, k, c[..., :7], c[..., :7]), ValueError, op + r".*R even"),
            BadInput("table B mismatch", lambda: args(q, k, torch.randn(3, 5, 16, device=device),
                                                      torch.randn(3, 5, 16, device=device)), ValueError,
                     op + r".*got \[3, 5, 16\]"),
            BadInput("cos and sin shapes differ", lambda: args(q, k, c, c[..., :8]), ValueError,
                     op + r"cos and sin must have the same shape"),
            BadInput("half table R > D", lambda: args(q, k, c[0, :, :9], c[0, :, :9]), ValueError,
                     op + r".*R <= D = 16, got \[5, 9\]"),
            BadInput("half table S mismatch", lambda: args(q, k, c[0, :4, :8], c[0, :4, :8]), ValueError,
                     op + r".*rank 2 must be \[S, R/2\]"),
            BadInput("q and k disagree", lambda: args(q, k[:, :, :4], c, c), ValueError,
                     op + r".*must agree in B, S and D"),
            BadInput("k dtype", lambda: args(q, k.double(), c, c), TypeError, op + r".*k must have q's dtype"),
            BadInput("half table for bfloat16", lambda: args(q.bfloat16(), k.bfloat16(), c.half(), c.half()),
                     TypeError, op + r".*cos/sin must be float32 or q's dtype bfloat16"),
            BadInput("cos and sin dtypes differ", lambda: args(q, k, c, c.double()), TypeError,
                     op + r".*same dtype"),
            BadInput("hf table rank 1", lambda: args(q, k, c[0, 0], c[0, 0]), ValueError,
                     r"cos and sin must both be", call=bt.apply_rotary_pos_emb),
        ],
        "rope_cos_sin": [
            BadInput("3-d x", lambda: args(q[0], c, c), ValueError, r"baracuda::rope_cos_sin: x must be 4-D"),
            BadInput("integer x", lambda: args(q.int(), c, c), TypeError,
                     r"baracuda::rope_cos_sin: x must be float32"),
            BadInput("table rank 5", lambda: args(q, c[None, None], c[None, None]), ValueError,
                     r"baracuda_torch.rope_cos_sin: cos must be \[S, R/2\]", call=bt.rope_cos_sin),
        ],
        "rope_cos_sin_backward": [
            BadInput("backward 3-d dy", lambda: args(q[0], c, c), ValueError,
                     r"baracuda::rope_cos_sin_backward: dy must be 4-D \[B, H, S, D\], got a 3-d tensor"),
            BadInput("backward integer dy", lambda: args(q.int(), c, c), TypeError,
                     r"baracuda::rope_cos_sin_backward: dy must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("backward table S mismatch", lambda: args(q, c[:, :4], c[:, :4]), ValueError,
                     r"baracuda::rope_cos_sin_backward: cos/sin of rank 3 must be \[1 or B, S, R\] = \[1 or 2, 5, R\]"),
        ],
        "rope_qk_cos_sin_backward": [
            BadInput("backward dk dtype", lambda: args(q, k.double(), c, c), TypeError,
                     r"baracuda::rope_qk_cos_sin_backward: dk must have dq's dtype float32, got float64"),
            BadInput("backward dq and dk disagree", lambda: args(q, k[:, :, :4], c, c), ValueError,
                     r"baracuda::rope_qk_cos_sin_backward: dq \[B, Hq, S, D\] and dk \[B, Hk, S, D\] must agree"),
            BadInput("backward table R odd", lambda: args(q, k, c[..., :7], c[..., :7]), ValueError,
                     r"baracuda::rope_qk_cos_sin_backward: cos/sin of rank 3 .* with R even"),
        ],
    }


# ---- lerp ----------------------------------------------------------------------------------


def lerp_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    at = r(8, 6).t()
    return [SampleInput("b broadcast", (r(4, 6, 8), r(6, 8), 0.3)),
            SampleInput("transposed", (at, r(6, 8), 1.5)),
            SampleInput("a broadcast, negative weight", (r(5, 7), r(3, 5, 7), -0.5)),
            SampleInput("empty", (r(0, 4), r(4), 0.7))]


def lerp_tensor_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    w = lambda *s: torch.rand(s, dtype=torch.float64).to(device=device, dtype=dtype)  # noqa: E731
    return [SampleInput("weight broadcast", (r(4, 6, 8), r(6, 8), w(4, 1, 8))),
            SampleInput("transposed, 0-d weight", (r(8, 6).t(), r(8, 6).t(), w())),
            SampleInput("column weight", (r(4, 16), r(4, 16), w(4, 1))),
            SampleInput("empty", (r(0, 4), r(0, 4), w(4)))]


def lerp_backward_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    return [SampleInput("3-d", (r(4, 6, 8), 0.7)), SampleInput("transposed", (r(8, 6).t(), 0.25)),
            SampleInput("empty", (r(0, 3), -0.5))]


def lerp_backward_tensor_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    w = lambda *s: torch.rand(s, dtype=torch.float64).to(device=device, dtype=dtype)  # noqa: E731
    return [SampleInput("broadcast operands", (r(4, 6, 8), r(4, 6, 8), r(6, 8), w(4, 1, 8))),
            SampleInput("transposed dy", (r(4, 6, 8).transpose(0, 2), r(6, 8).t().unsqueeze(-1), r(6, 1), w(8, 1, 1)))]


def lerp_bad(device):
    x = torch.randn(3, 4, device=device)
    f64 = x.double()
    i32 = torch.ones(3, 4, dtype=torch.int32, device=device)
    return {
        "lerp": [
            BadInput("no broadcast", lambda: args(x, torch.randn(5, device=device), 0.5), ValueError,
                     r"baracuda::lerp: a and b must broadcast to one shape, got \[3, 4\] and \[5\]"),
            BadInput("no broadcast inner", lambda: args(torch.randn(2, 3, 4, device=device),
                                                        torch.randn(3, 1, 2, device=device), 0.5),
                     ValueError, r"a and b must broadcast to one shape, got \[2, 3, 4\] and \[3, 1, 2\]"),
            BadInput("zero vs three", lambda: args(torch.randn(0, device=device), torch.randn(3, device=device), 0.5),
                     ValueError, r"got \[0\] and \[3\]"),
            BadInput("b dtype", lambda: args(x, f64, 0.5), TypeError,
                     r"baracuda::lerp: b must have a's dtype float32, got float64"),
            BadInput("integer input", lambda: args(i32, i32, 0.5), TypeError,
                     r"baracuda::lerp: a must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("bool input", lambda: args(x, torch.ones(4, dtype=torch.bool, device=device), 0.5), TypeError,
                     r"baracuda::lerp: b has dtype Bool"),
            BadInput("complex input", lambda: args(x.to(torch.complex64), x.to(torch.complex64), 0.5), TypeError,
                     r"baracuda::lerp: a has dtype ComplexFloat"),
            BadInput("rank 9", lambda: args(torch.randn([1] * 9, device=device), x, 0.5), NotImplementedError,
                     r"baracuda::lerp: a has 9 dims, at most 8"),
        ],
        "lerp.Tensor": [
            BadInput("weight no broadcast", lambda: args(x, x, torch.rand(3, device=device)), ValueError,
                     r"baracuda::lerp: a, b and weight must broadcast to one shape, got \[3, 4\], \[3, 4\] and \[3\]"),
            BadInput("weight dtype", lambda: args(x, x, torch.rand(4, device=device).half()), TypeError,
                     r"baracuda::lerp: weight must have a's dtype float32, got float16"),
            BadInput("weight rank 9", lambda: args(x, x, torch.rand([1] * 9, device=device)), NotImplementedError,
                     r"baracuda::lerp: weight has 9 dims, at most 8"),
        ],
        "lerp_backward": [
            BadInput("backward integer dy", lambda: args(i32, 0.5), TypeError,
                     r"baracuda::lerp_backward: dy must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("backward rank 9", lambda: args(torch.randn([1] * 9, device=device), 0.5), NotImplementedError,
                     r"baracuda::lerp_backward: dy has 9 dims, at most 8"),
        ],
        "lerp_backward.Tensor": [
            BadInput("backward a too big", lambda: args(x, torch.randn(2, 3, 4, device=device), x, x), ValueError,
                     r"baracuda::lerp_backward: a must broadcast to dy's shape \[3, 4\], got \[2, 3, 4\]"),
            BadInput("backward b mismatch", lambda: args(x, x, torch.randn(5, device=device), x), ValueError,
                     r"baracuda::lerp_backward: b must broadcast to dy's shape \[3, 4\], got \[5\]"),
            BadInput("backward weight mismatch", lambda: args(x, x, x, torch.rand(3, device=device)), ValueError,
                     r"baracuda::lerp_backward: weight must broadcast to dy's shape \[3, 4\], got \[3\]"),
            BadInput("backward dtype", lambda: args(x, x, x, f64), TypeError,
                     r"baracuda::lerp_backward: weight must have dy's dtype float32, got float64"),
        ],
    }


# ---- gather --------------------------------------------------------------------------------


def _index(device, high, *shape, dtype=torch.int64):
    return torch.randint(0, high, shape, device=device, dtype=dtype)


def gather_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    return [SampleInput("dim 1", (r(6, 9), 1, _index(device, 9, 6, 5))),
            SampleInput("transposed src and int32 index",
                        (r(9, 6).t(), 0, _index(device, 6, 9, 4, dtype=torch.int32).t())),
            SampleInput("dim -1", (r(6, 9), -1, _index(device, 9, 6, 5))),
            SampleInput("index larger along dim", (r(6, 9), 0, _index(device, 6, 8, 9))),
            SampleInput("3-d", (r(3, 5, 7), 1, _index(device, 5, 2, 9, 4))),
            SampleInput("0-d", (r(), 0, torch.zeros((), dtype=torch.int64, device=device))),
            SampleInput("empty index", (r(6, 9), 1, _index(device, 9, 6, 0)))]


def gather_backward_samples(device, dtype, requires_grad):
    r = _rand(device, dtype)
    return [SampleInput("dim 1", (r(6, 5), 1, _index(device, 9, 6, 5), [6, 9])),
            SampleInput("int32 index", (r(6, 5), 1, _index(device, 9, 6, 5, dtype=torch.int32), [6, 9])),
            SampleInput("transposed index", (r(4, 9), 0, _index(device, 6, 9, 4).t(), [6, 9])),
            SampleInput("empty", (r(6, 0), 1, _index(device, 9, 6, 0), [6, 9]))]


def gather_bad(device):
    src = torch.randn(3, 8, device=device)
    index = torch.zeros(3, 2, dtype=torch.long, device=device)
    dout = torch.randn(3, 2, device=device)
    return {
        "gather": [
            BadInput("float index", lambda: args(src, 1, index.float()), TypeError,
                     r"baracuda::gather: index must be int32 or int64, got float32"),
            BadInput("int16 index", lambda: args(src, 1, index.short()), TypeError,
                     r"baracuda::gather: index has dtype Short, which baracuda does not support"),
            BadInput("bool index", lambda: args(src, 1, index.bool()), TypeError,
                     r"baracuda::gather: index has dtype Bool"),
            BadInput("integer src", lambda: args(src.int(), 1, index), TypeError,
                     r"baracuda::gather: src must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("complex src", lambda: args(src.to(torch.complex64), 1, index), TypeError,
                     r"baracuda::gather: src has dtype ComplexFloat"),
            BadInput("rank mismatch", lambda: args(src, 1, index.view(3, 2, 1)), ValueError,
                     r"baracuda::gather: index must have as many dims as src \(2\), got 3"),
            BadInput("0-dim index on 2-d src", lambda: args(src, 1, index[0, 0]), ValueError,
                     r"index must have as many dims as src \(2\), got 0"),
            BadInput("dim too large", lambda: args(src, 2, index), IndexError,
                     r"baracuda::gather: dim must be in \[-2, 1\] for a 2-d tensor, got 2"),
            BadInput("dim too small", lambda: args(src, -3, index), IndexError, r"got -3"),
            BadInput("index larger than src", lambda: args(src, 1, torch.zeros(5, 2, dtype=torch.long, device=device)),
                     ValueError,
                     r"baracuda::gather: index.size\(0\) must be <= src\[0\] for every dim but 1, got 5 > 3"),
            BadInput("rank 9", lambda: args(torch.randn([1] * 9, device=device), 0,
                                            torch.zeros([1] * 9, dtype=torch.long, device=device)),
                     NotImplementedError, r"baracuda::gather: src has 9 dims, at most 8"),
        ],
        "gather_backward": [
            BadInput("dout wrong shape", lambda: args(torch.randn(3, 3, device=device), 1, index, [3, 8]), ValueError,
                     r"baracuda::gather_backward: dout must have index's shape \[3, 2\], got \[3, 3\]"),
            BadInput("integer dout", lambda: args(dout.long(), 1, index, [3, 8]), TypeError,
                     r"baracuda::gather_backward: dout must be float32, float16, bfloat16 or float64, got int64"),
            BadInput("backward float index", lambda: args(dout, 1, index.double(), [3, 8]), TypeError,
                     r"baracuda::gather_backward: index must be int32 or int64, got float64"),
            BadInput("negative src_sizes", lambda: args(dout, 1, index, [3, -1]), ValueError,
                     r"baracuda::gather_backward: src_sizes must be non-negative, got \[3, -1\]"),
            BadInput("src_sizes rank", lambda: args(dout, 1, index, [3, 8, 2]), ValueError,
                     r"baracuda::gather_backward: index must have as many dims as src_sizes \(3\), got 2"),
            BadInput("src_sizes too small", lambda: args(dout, 1, index, [2, 8]), ValueError,
                     r"index.size\(0\) must be <= src_sizes\[0\] for every dim but 1, got 3 > 2"),
            BadInput("backward dim", lambda: args(dout, 5, index, [3, 8]), IndexError,
                     r"baracuda::gather_backward: dim must be in \[-2, 1\] for a 2-d tensor, got 5"),
        ],
    }


# ---- RMSNorm -------------------------------------------------------------------------------


def _w32(device, dtype):
    """A float32 weight maker (float64 for float64 data): the mixed-precision case."""
    t = dtype if dtype == torch.float64 else torch.float32
    return lambda *shape: randn(shape, t, device)


def rms_rstd(x):
    """rstd of x with eps = 0 in the op's rstd dtype (the backward samples' saved value)."""
    t = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.rsqrt(x.detach().to(t).pow(2).mean(-1))


def rms_norm_samples(device, dtype, requires_grad):
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    return [SampleInput("torch weight", (r(4, 6, 32), r(32), 1e-6, "torch")),
            SampleInput("llama float32 weight", (r(3, 40), w32(40), 1e-5, "llama")),
            SampleInput("gemma transposed x", (r(24, 5).t(), r(24), 1e-6, "gemma")),
            SampleInput("no weight, eps None", (r(2, 3, 17), None, None, "torch")),
            SampleInput("1-d llama", (r(16), r(16), 1e-6, "llama")),
            SampleInput("row slice, stride-0 weight", (r(6, 40)[:, 4:36], r(1).expand(32), 1e-6, "torch")),
            SampleInput("empty", (r(0, 8), r(8), 1e-6, "gemma"))]


def add_rms_norm_samples(device, dtype, requires_grad):
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    return [SampleInput("llama", (r(4, 6, 32), r(4, 6, 32), r(32), 1e-6, "llama")),
            SampleInput("torch float32 weight, transposed residual", (r(3, 40), r(40, 3).t(), w32(40), 1e-5,
                                                                      "torch")),
            SampleInput("gemma, no weight", (r(2, 24), r(2, 24), None, None, "gemma")),
            SampleInput("empty", (r(0, 8), r(0, 8), r(8), 1e-6, "torch"))]


def rms_norm_backward_samples(device, dtype, requires_grad):
    """rstd is x's with eps = 0, which the reference recomputes."""
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    x3, x2, xt, x0, xe = r(4, 6, 32), r(3, 40), r(24, 5).t(), r(2, 3, 17), r(0, 8)
    out = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype  # llama with a float32 weight
    return [SampleInput("torch", (r(4, 6, 32), x3, r(32), rms_rstd(x3), "torch", None)),
            SampleInput("llama float32 weight, dh", (randn((3, 40), out, device), x2, w32(40), rms_rstd(x2), "llama",
                                                     r(3, 40))),
            SampleInput("gemma transposed x", (r(5, 24), xt, r(24), rms_rstd(xt), "gemma", None)),
            SampleInput("no weight, dh", (r(2, 3, 17), x0, None, rms_rstd(x0), "torch", r(2, 3, 17))),
            SampleInput("empty rows: dw zeros", (r(0, 8), xe, r(8), rms_rstd(xe), "llama", None))]


def rms_norm_in_place_samples(device, dtype, requires_grad):
    """rms_norm_backward_samples with dy contiguous, of x's dtype and apart from the rest (dx
    is written over it)."""
    r = _rand(device, dtype)
    x3, x2, xt, x0, xe = r(4, 6, 32), r(3, 40), r(24, 5).t(), r(2, 3, 17), r(0, 8)
    return [SampleInput("torch", (r(4, 6, 32), x3, r(32), rms_rstd(x3), "torch", None)),
            SampleInput("llama, dh", (r(3, 40), x2, r(40), rms_rstd(x2), "llama", r(3, 40))),
            SampleInput("gemma transposed x", (r(5, 24), xt, r(24), rms_rstd(xt), "gemma", None)),
            SampleInput("no weight, dh", (r(2, 3, 17), x0, None, rms_rstd(x0), "torch", r(2, 3, 17))),
            SampleInput("empty rows: dw zeros", (r(0, 8), xe, r(8), rms_rstd(xe), "llama", None))]


def rms_norm_bad(device):
    x, w = torch.randn(3, 8, device=device), torch.randn(8, device=device)
    xb = x.bfloat16()
    dy = torch.randn(3, 8, device=device)
    rstd = rms_rstd(x)
    op, add, bwd = r"baracuda::rms_norm: ", r"baracuda::add_rms_norm: ", r"baracuda::rms_norm_backward: "
    inp = r"baracuda::rms_norm_backward_: "
    return {
        "rms_norm": [
            BadInput("integer x", lambda: args(x.int(), w), TypeError,
                     op + r"x must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("bool x", lambda: args(x.bool(), w), TypeError, op + r"x has dtype Bool"),
            BadInput("0-d x", lambda: args(x[0, 0], None), ValueError,
                     op + r"x must have at least one dimension \(the normalized one\), got a 0-dim tensor"),
            BadInput("rank 9", lambda: args(torch.randn([1] * 8 + [4], device=device), None), NotImplementedError,
                     op + r"x has 9 dims, at most 8"),
            BadInput("weight size", lambda: args(x, w[:7]), ValueError,
                     op + r"weight must have shape \[N\] = \[8\] \(x.size\(-1\)\), got \[7\]"),
            BadInput("weight 2-d", lambda: args(x, w[None]), ValueError, op + r"weight must have shape .* got \[1, 8\]"),
            BadInput("weight float64", lambda: args(x, w.double()), TypeError,
                     op + r"weight must have x's dtype float32, got float64"),
            BadInput("weight float16 for bfloat16 x", lambda: args(xb, w.half()), TypeError,
                     op + r"weight must have x's dtype bfloat16 or float32, got float16"),
            BadInput("eps negative", lambda: args(x, w, -1.0), ValueError, op + r"eps must be finite and >= 0, got -1"),
            BadInput("eps nan", lambda: args(x, w, float("nan")), ValueError, op + r"eps must be finite .* got nan"),
            BadInput("unknown convention", lambda: args(x, w, 1e-6, "rms"), ValueError,
                     op + r"convention must be 'torch', 'llama' or 'gemma', got 'rms'"),
            BadInput("normalized_shape not trailing", lambda: args(x, (3,), w), ValueError,
                     r"baracuda_torch.rms_norm: normalized_shape \[3\] must be the trailing shape of input",
                     call=bt.rms_norm),
        ],
        "add_rms_norm": [
            BadInput("residual shape", lambda: args(x, x[:, :7], w), ValueError,
                     add + r"residual must have x's sizes \[3, 8\], got \[3, 7\]"),
            BadInput("residual dtype", lambda: args(x, x.double(), w), TypeError,
                     add + r"residual must have x's dtype float32, got float64"),
            BadInput("integer x", lambda: args(x.long(), x.long(), None), TypeError,
                     add + r"x must be float32, float16, bfloat16 or float64, got int64"),
            BadInput("weight size", lambda: args(x, x, w[:4]), ValueError, add + r"weight must have shape"),
            BadInput("unknown convention", lambda: args(x, x, w, 1e-6, "Llama"), ValueError,
                     add + r"convention must be .* got 'Llama'"),
        ],
        "rms_norm_backward": [
            BadInput("dy shape", lambda: args(dy[:, :7], x, w, rstd), ValueError,
                     bwd + r"dy must have x's sizes \[3, 8\], got \[3, 7\]"),
            BadInput("dy dtype", lambda: args(dy.double(), x, w, rstd), TypeError,
                     bwd + r"dy must have the output's dtype float32, got float64"),
            BadInput("dy dtype, llama float32 weight", lambda: args(xb, xb, w, rstd, "llama"), TypeError,
                     bwd + r"dy must have the output's dtype float32, got bfloat16"),
            BadInput("rstd shape", lambda: args(dy, x, w, rstd[:, None]), ValueError,
                     bwd + r"rstd must have x's sizes without the last, \[3\], got \[3, 1\]"),
            BadInput("rstd dtype", lambda: args(dy, x, w, rstd.double()), TypeError,
                     bwd + r"rstd must be float32 for float32 x, got float64"),
            BadInput("dh shape", lambda: args(dy, x, w, rstd, "torch", dy[:2]), ValueError,
                     bwd + r"dh must have x's sizes \[3, 8\], got \[2, 8\]"),
            BadInput("weight size", lambda: args(dy, x, w[:2], rstd), ValueError, bwd + r"weight must have shape"),
            BadInput("unknown convention", lambda: args(dy, x, w, rstd, "t5"), ValueError,
                     bwd + r"convention must be .* got 't5'"),
        ],
        "rms_norm_backward_": [
            BadInput("dy transposed", lambda: args(torch.randn(8, 3, device=device).t(), x, w, rstd), ValueError,
                     inp + r"dy must be contiguous \(dx is written over it\), got strides \[1, 3\]"),
            BadInput("dy of the output's dtype, not x's", lambda: args(dy, xb, w, rms_rstd(xb), "llama"), TypeError,
                     inp + r"dy must have x's dtype \(dx is written over it\), got float32 and bfloat16"),
            BadInput("dy is x", lambda: (lambda t: args(t, t, w, rms_rstd(t)))(x.clone()), ValueError,
                     inp + r"dy and x must not share a storage \(dx is written over dy\)"),
            BadInput("dy is dh", lambda: (lambda t: args(t, x, w, rstd, "torch", t))(dy.clone()), ValueError,
                     inp + r"dy and dh must not share a storage"),
            BadInput("dy shape", lambda: args(dy[:, :7].contiguous(), x, w, rstd), ValueError,
                     inp + r"dy must have x's sizes \[3, 8\], got \[3, 7\]"),
        ],
    }


def gated_rms_norm_samples(device, dtype, requires_grad):
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    return [SampleInput("gate after, one group", (r(4, 6, 32), r(32), None, r(4, 6, 32), 1e-6, None, True)),
            SampleInput("gate before, 4 groups, float32 weight", (r(3, 40), w32(40), None, r(3, 40), 1e-5, 10,
                                                                  False)),
            SampleInput("bias, transposed x, 3 groups", (r(24, 5).t(), r(24), r(24), r(5, 24), 1e-6, 8, True)),
            SampleInput("no z, float32 weight and bias", (r(2, 3, 16), w32(16), w32(16), None, 1e-6, 16, True)),
            SampleInput("gate before, row slices, stride-0 weight",
                        (r(6, 40)[:, 4:36], r(1).expand(32), None, r(6, 40)[:, 2:34], 1e-6, 4, False)),
            SampleInput("1-d, bias", (r(16), r(16), r(16), r(16), 1e-6, 4, True)),
            SampleInput("groups of 1, gate before", (r(3, 6), r(6), r(6), r(3, 6), 1e-2, 1, False)),
            SampleInput("empty", (r(0, 8), r(8), r(8), r(0, 8), 1e-6, 4, True))]


def gated_rstd(x, z, group_size, norm_before_gate):
    """rstd of the gated op's h with eps = 0 in the op's rstd dtype (the backward samples'
    saved value, which the reference recomputes)."""
    ones = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
    return ref.gated_rms_norm(x.detach(), ones, None, None if z is None else z.detach(), 0.0, group_size,
                              norm_before_gate)[1]


def gated_rms_norm_backward_samples(device, dtype, requires_grad):
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    x3, z3, x2, z2, xt, xe, ze = r(4, 6, 32), r(4, 6, 32), r(3, 40), r(3, 40), r(24, 5).t(), r(0, 8), r(0, 8)
    return [SampleInput("gate after", (r(4, 6, 32), x3, r(32), None, z3, gated_rstd(x3, z3, None, True), None,
                                       True)),
            SampleInput("gate before, 4 groups, float32 weight and bias",
                        (r(3, 40), x2, w32(40), w32(40), z2, gated_rstd(x2, z2, 10, False), 10, False)),
            SampleInput("transposed x, no z, bias", (r(5, 24), xt, r(24), r(24), None, gated_rstd(xt, None, 8, True),
                                                     8, True)),
            SampleInput("empty rows: dw and db zeros", (r(0, 8), xe, r(8), r(8), ze, gated_rstd(xe, ze, 4, False), 4,
                                                        False))]


def gated_rms_norm_backward_into_samples(device, dtype, requires_grad):
    """gated_rms_norm_backward_samples with z (the into op needs one) and a NaN-filled dz to
    write into after rstd: a column slice of a wider buffer (the Mamba-2 split path's dzxbcdt)
    or a contiguous tensor; recompute_output on and off."""
    out = []
    for k, s in enumerate(gated_rms_norm_backward_samples(device, dtype, requires_grad)):
        dy, x, w, b, z, rstd, group_size, before = s.args
        if z is None:
            continue
        n = x.shape[-1]

        def dz():
            if k % 2:
                return torch.full(x.shape, float("nan"), dtype=dtype, device=device)
            return torch.full((*x.shape[:-1], n + 12), float("nan"), dtype=dtype, device=device)[..., 4:4 + n]
        desc = s.desc + ("" if k % 2 else ", dz a slice of a wider buffer")
        out.append(SampleInput(desc + ", recomputed y", (dy, x, w, b, z, rstd, dz(), group_size, before, True)))
        out.append(SampleInput(desc, (dy, x, w, b, z, rstd, dz(), group_size, before, False)))
    return out


def gated_rms_norm_bad(device):
    x, w, z = torch.randn(3, 8, device=device), torch.randn(8, device=device), torch.randn(3, 8, device=device)
    rstd = gated_rstd(x, z, 4, True)
    op, bwd = r"baracuda::gated_rms_norm: ", r"baracuda::gated_rms_norm_backward: "
    into = r"baracuda::gated_rms_norm_backward_into: "
    return {
        "gated_rms_norm": [
            BadInput("integer x", lambda: args(x.int(), w), TypeError,
                     op + r"x must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("0-d x", lambda: args(x[0, 0], w[:1]), ValueError,
                     op + r"x must have at least one dimension \(the normalized one\), got a 0-dim tensor"),
            BadInput("rank 9", lambda: args(torch.randn([1] * 8 + [4], device=device), w[:4]), NotImplementedError,
                     op + r"x has 9 dims, at most 8"),
            BadInput("weight size", lambda: args(x, w[:7]), ValueError,
                     op + r"weight must have shape \[N\] = \[8\] \(x.size\(-1\)\), got \[7\]"),
            BadInput("weight float16 for bfloat16 x", lambda: args(x.bfloat16(), w.half()), TypeError,
                     op + r"weight must have x's dtype bfloat16 or float32, got float16"),
            BadInput("z shape", lambda: args(x, w, None, z[:, :7]), ValueError,
                     op + r"z must have x's sizes \[3, 8\], got \[3, 7\]"),
            BadInput("z dtype", lambda: args(x, w, None, z.double()), TypeError,
                     op + r"z must have x's dtype float32, got float64"),
            BadInput("bias size", lambda: args(x, w, w[:4]), ValueError,
                     op + r"bias must have shape \[N\] = \[8\] \(x.size\(-1\)\), got \[4\]"),
            BadInput("bias dtype", lambda: args(x, w, w.double()), TypeError,
                     op + r"bias must have weight's dtype float32, got float64"),
            BadInput("group_size 0", lambda: args(x, w, None, z, 1e-6, 0), ValueError,
                     op + r"group_size must be >= 1, got 0"),
            BadInput("group_size not dividing N", lambda: args(x, w, None, z, 1e-6, 3), ValueError,
                     op + r"group_size must divide x.size\(-1\) = 8, got 3"),
            BadInput("eps negative", lambda: args(x, w, None, z, -1.0), ValueError,
                     op + r"eps must be finite and >= 0, got -1"),
        ],
        "gated_rms_norm_backward": [
            BadInput("dy shape", lambda: args(x[:, :7], x, w, None, z, rstd, 4), ValueError,
                     bwd + r"dy must have x's sizes \[3, 8\], got \[3, 7\]"),
            BadInput("dy dtype", lambda: args(x.double(), x, w, None, z, rstd, 4), TypeError,
                     bwd + r"dy must have the output's dtype float32, got float64"),
            BadInput("rstd without the groups", lambda: args(x, x, w, None, z, rstd[:, 0], 4), ValueError,
                     bwd + r"rstd must have x's sizes without the last, then ngroups, \[3, 2\], got \[3\]"),
            BadInput("rstd dtype", lambda: args(x, x, w, None, z, rstd.double(), 4), TypeError,
                     bwd + r"rstd must be float32 for float32 x, got float64"),
            BadInput("z shape", lambda: args(x, x, w, None, z[:2], rstd, 4), ValueError,
                     bwd + r"z must have x's sizes \[3, 8\], got \[2, 8\]"),
            BadInput("group_size not dividing N", lambda: args(x, x, w, None, z, rstd, 5), ValueError,
                     bwd + r"group_size must divide x.size\(-1\) = 8, got 5"),
            BadInput("bias dtype", lambda: args(x, x, w, w.half(), z, rstd, 4), TypeError,
                     bwd + r"bias must have weight's dtype float32, got float16"),
        ],
        "gated_rms_norm_backward_into": [
            BadInput("dz shape", lambda: args(x, x, w, None, z, rstd, torch.empty_like(x)[:, :7], 4), ValueError,
                     into + r"dz must have x's sizes \[3, 8\], got \[3, 7\]"),
            BadInput("dz dtype", lambda: args(x, x, w, None, z, rstd, torch.empty_like(x).double(), 4), TypeError,
                     into + r"dz must have x's dtype float32, got float64"),
            BadInput("dz overlapping itself", lambda: args(x, x, w, None, z, rstd,
                                                           torch.empty(3, 1, device=device).expand(3, 8), 4),
                     ValueError, into + r"dz must not overlap itself .* got strides \[1, 0\]"),
            BadInput("dz not unit-strided", lambda: args(x, x, w, None, z, rstd,
                                                         torch.empty(3, 16, device=device)[:, ::2], 4),
                     ValueError, into + r"dz must have a unit stride along its last dim, got strides \[16, 2\]"),
            BadInput("dz rows of two strides", lambda: args(x.view(3, 1, 8).expand(3, 2, 8).contiguous(),
                                                            x.view(3, 1, 8).expand(3, 2, 8).contiguous(), w, None,
                                                            z.view(3, 1, 8).expand(3, 2, 8).contiguous(),
                                                            rstd.view(3, 1, 2).expand(3, 2, 2).contiguous(),
                                                            torch.empty(2, 3, 8, device=device).transpose(0, 1), 4),
                     ValueError, into + r"dz's leading dims must have one row stride .* got strides \[8, 24, 1\]"),
            BadInput("dy shape", lambda: args(x[:, :7], x, w, None, z, rstd, torch.empty_like(x), 4), ValueError,
                     into + r"dy must have x's sizes \[3, 8\], got \[3, 7\]"),
        ],
    }


# ---- causal conv1d -------------------------------------------------------------------------


def conv_seq_idx(device, B, L, padding=0):
    """Packed sequences: ids 0, 1, ... in runs of random length (the first `padding` steps
    of each row -1: padding steps)."""
    starts = torch.rand(B, L) < 0.3
    starts[:, 0] = False
    seq = starts.cumsum(1).to(torch.int32)
    seq[:, :padding] = -1
    return seq.to(device)


def channel_last(r, B, D, L, extra=5):
    """x [B, D, L] as causal-conv1d's callers have it: a slice of a [B, L, D'] projection,
    transposed (stride(1) == 1, no copy)."""
    return r(B, L, D + 2 * extra)[..., extra:extra + D].transpose(1, 2)


def conv_samples(device, dtype, requires_grad):
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    return [SampleInput("channel-last slice, bias, silu", (channel_last(r, 2, 16, 11), r(16, 4), r(16), None, None,
                                                           "silu")),
            SampleInput("contiguous, width 3, no bias", (r(2, 5, 13), r(5, 3))),
            SampleInput("initial_states, width 2, swish", (r(1, 6, 9), r(6, 2), r(6), None, r(1, 6, 1), "swish")),
            SampleInput("seq_idx with padding steps", (channel_last(r, 2, 8, 12), r(8, 4), r(8),
                                                       conv_seq_idx(device, 2, 12, padding=2), None, "silu")),
            SampleInput("L < W - 1, transposed initial_states", (r(2, 4, 2), r(4, 4), None, None,
                                                                 r(2, 3, 4).transpose(1, 2))),
            SampleInput("float32 weight and bias, every other step", (r(2, 8, 20)[..., ::2], w32(8, 4), w32(8),
                                                                      None, None, "silu")),
            SampleInput("empty L: final_states = initial_states", (r(2, 4, 0), r(4, 3), r(4), None, r(2, 4, 2)))]


def conv_backward_samples(device, dtype, requires_grad):
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    return [SampleInput("silu, channel-last, dfinal_states", (r(2, 16, 11), r(2, 16, 3), channel_last(r, 2, 16, 11),
                                                              r(16, 4), r(16), None, None, "silu")),
            SampleInput("initial_states, no dfinal_states", (r(1, 6, 9), None, r(1, 6, 9), r(6, 3), r(6), None,
                                                             r(1, 6, 2))),
            SampleInput("seq_idx, transposed dout", (r(2, 12, 8).transpose(1, 2), None, channel_last(r, 2, 8, 12),
                                                     r(8, 4), None, conv_seq_idx(device, 2, 12, padding=1), None,
                                                     "silu")),
            SampleInput("L < W - 1, initial and final states", (r(2, 4, 2), r(2, 4, 3), r(2, 4, 2), w32(4, 4),
                                                                w32(4), None, r(2, 4, 3), "swish")),
            SampleInput("empty batch: dweight, dbias zeros", (r(0, 4, 5), None, r(0, 4, 5), r(4, 2), r(4)))]


def conv_backward_into_samples(device, dtype, requires_grad):
    """conv_backward_samples with a dx to write into (after weight): every other one a slice
    of a wider channel-last buffer (the gradient buffer of the Mamba-2 split path), the
    others a contiguous tensor; both NaN-filled."""
    out = []
    for k, s in enumerate(conv_backward_samples(device, dtype, requires_grad)):
        dout, dfinal, x, w, *rest = s.args
        B, D, L = x.shape
        if k % 2 == 0:
            dx = channel_last(lambda *shape: torch.full(shape, float("nan"), dtype=dtype, device=device), B, D, L,
                              extra=2)
        else:
            dx = torch.full((B, D, L), float("nan"), dtype=dtype, device=device)
        out.append(SampleInput(s.desc + (", dx a channel-last slice" if k % 2 == 0 else ""),
                               (dout, dfinal, x, w, dx, *rest)))
    return out


def conv_bad(device):
    x, w, b = torch.randn(2, 4, 6, device=device), torch.randn(4, 4, device=device), torch.randn(4, device=device)
    seq = torch.zeros(2, 6, dtype=torch.int32, device=device)
    init = torch.randn(2, 4, 3, device=device)
    dout = torch.randn(2, 4, 6, device=device)
    op, bwd = r"baracuda::causal_conv1d: ", r"baracuda::causal_conv1d_backward: "
    into = r"baracuda::causal_conv1d_backward_into: "
    fn = bt.causal_conv1d.causal_conv1d_fn
    return {
        "causal_conv1d": [
            BadInput("integer x", lambda: args(x.int(), w), TypeError,
                     op + r"x must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("x 2-d", lambda: args(x[0], w), ValueError, op + r"x must be 3-d \[batch, dim, seqlen\], got \[4, 6\]"),
            BadInput("x 9-d", lambda: args(torch.randn([1] * 6 + [2, 4, 6], device=device), w), ValueError,
                     op + r"x must be 3-d \[batch, dim, seqlen\], got \[1, 1, 1, 1, 1, 1, 2, 4, 6\]"),
            BadInput("weight dim", lambda: args(x, w[:3]), ValueError,
                     op + r"weight must have shape \[dim, width\] with dim = x.size\(1\) = 4, got \[3, 4\]"),
            BadInput("weight of nn.Conv1d, unsqueezed", lambda: args(x, w[:, None]), ValueError,
                     op + r"weight must have shape \[dim, width\] .* got \[4, 1, 4\]"),
            BadInput("width 0", lambda: args(x, w[:, :0]), ValueError,
                     op + r"weight's width \(weight.size\(1\)\) must be at least 1, got 0"),
            BadInput("weight float64", lambda: args(x, w.double()), TypeError,
                     op + r"weight must have x's dtype float32, got float64"),
            BadInput("weight float16 for bfloat16 x", lambda: args(x.bfloat16(), w.half()), TypeError,
                     op + r"weight must have x's dtype bfloat16 or float32, got float16"),
            BadInput("bias dtype", lambda: args(x, w, b.double()), TypeError,
                     op + r"bias must have weight's dtype float32, got float64"),
            BadInput("bias shape", lambda: args(x, w, b[:3]), ValueError, op + r"bias must have shape \[dim\] = \[4\], got \[3\]"),
            BadInput("seq_idx int64", lambda: args(x, w, b, seq.long()), TypeError, op + r"seq_idx must be int32, got int64"),
            BadInput("seq_idx shape", lambda: args(x, w, b, seq[:, :5]), ValueError,
                     op + r"seq_idx must have shape \[batch, seqlen\] = \[2, 6\], got \[2, 5\]"),
            BadInput("initial_states dtype", lambda: args(x, w, b, None, init.double()), TypeError,
                     op + r"initial_states must have x's dtype float32, got float64"),
            BadInput("initial_states shape", lambda: args(x, w, b, None, init[..., :2]), ValueError,
                     op + r"initial_states must have shape \[batch, dim, width - 1\] = \[2, 4, 3\], got \[2, 4, 2\]"),
            BadInput("initial_states with seq_idx", lambda: args(x, w, b, seq, init), ValueError,
                     op + r"initial_states must be None when seq_idx is given .* got both"),
            BadInput("unknown activation", lambda: args(x, w, b, None, None, "relu"), ValueError,
                     op + r"activation must be None, 'silu' or 'swish', got 'relu'"),
            BadInput("final states with seq_idx", lambda: args(x, w, b, seq, return_final_states=True), ValueError,
                     r"baracuda_torch.causal_conv1d.causal_conv1d_fn: return_final_states must be False when "
                     r"seq_idx is given", call=fn),
            BadInput("final_states_out shape", lambda: args(x, w, b, return_final_states=True,
                                                            final_states_out=init[..., :2]), ValueError,
                     r"causal_conv1d_fn: final_states_out must have shape \[2, 4, 3\] .* got \[2, 4, 2\]", call=fn),
            BadInput("final_states_out dtype", lambda: args(x, w, b, return_final_states=True,
                                                            final_states_out=init.double()), TypeError,
                     r"causal_conv1d_fn: final_states_out must have x's dtype torch.float32, got torch.float64",
                     call=fn),
        ],
        "causal_conv1d_backward": [
            BadInput("dout shape", lambda: args(dout[..., :5], None, x, w), ValueError,
                     bwd + r"dout must have shape x's sizes = \[2, 4, 6\], got \[2, 4, 5\]"),
            BadInput("dout dtype", lambda: args(dout.double(), None, x, w), TypeError,
                     bwd + r"dout must have x's dtype float32, got float64"),
            BadInput("dfinal_states shape", lambda: args(dout, init[:1], x, w), ValueError,
                     bwd + r"dfinal_states must have shape \[batch, dim, width - 1\] = \[2, 4, 3\], got \[1, 4, 3\]"),
            BadInput("dfinal_states dtype", lambda: args(dout, init.half(), x, w), TypeError,
                     bwd + r"dfinal_states must have x's dtype float32, got float16"),
            BadInput("weight dim", lambda: args(dout, None, x, w[:2]), ValueError,
                     bwd + r"weight must have shape \[dim, width\]"),
            BadInput("initial_states with seq_idx", lambda: args(dout, None, x, w, b, seq, init), ValueError,
                     bwd + r"initial_states must be None when seq_idx is given"),
            BadInput("unknown activation", lambda: args(dout, None, x, w, b, None, None, "gelu"), ValueError,
                     bwd + r"activation must be None, 'silu' or 'swish', got 'gelu'"),
        ],
        "causal_conv1d_backward_into": [
            BadInput("dx shape", lambda: args(dout, None, x, w, torch.empty_like(x)[..., :5]), ValueError,
                     into + r"dx must have shape x's sizes = \[2, 4, 6\], got \[2, 4, 5\]"),
            BadInput("dx dtype", lambda: args(dout, None, x, w, torch.empty_like(x).double()), TypeError,
                     into + r"dx must have x's dtype float32, got float64"),
            BadInput("dx overlapping itself", lambda: args(dout, None, x, w, torch.empty(2, 4, 1, device=device).expand(2, 4, 6)),
                     ValueError, into + r"dx must not overlap itself .* got strides \[4, 1, 0\]"),
            BadInput("dout shape", lambda: args(dout[..., :5], None, x, w, torch.empty_like(x)), ValueError,
                     into + r"dout must have shape x's sizes = \[2, 4, 6\], got \[2, 4, 5\]"),
        ],
    }


# ---- SSD chunk scan ------------------------------------------------------------------------


def ssd_rtol(dtype, device):
    """The SSD files' bound on max|error| / max|reference| (tests/test_ssd_chunk_scan.py's
    docstring says why): float32 takes the CUDA bound on both devices."""
    if dtype == torch.float64:
        return 1e-10
    if dtype == torch.float32:
        return 1e-4
    return 2 * torch.finfo(dtype).eps


def ssd_problem(b, L, H, P, N, G, device, dtype, small=None):
    """x, dt > 0, A < 0, B, C (and with `small`: D, z, dt_bias, initial_states, seq_idx,
    with D, dt_bias and initial_states in `small`'s dtype)."""
    f = lambda t, dt=dtype: t.to(device=device, dtype=dt)  # noqa: E731
    t = [f(torch.randn(b, L, H, P, dtype=torch.float64)),
         f(F.softplus(torch.randn(b, L, H, dtype=torch.float64) - 1)),
         f(-torch.exp(0.5 * torch.randn(H, dtype=torch.float64))),
         f(torch.randn(b, L, G, N, dtype=torch.float64)), f(torch.randn(b, L, G, N, dtype=torch.float64))]
    if small is None:
        return t
    return t, dict(D=f(torch.randn(H, P, dtype=torch.float64), small),
                   z=f(torch.randn(b, L, H, P, dtype=torch.float64)),
                   dt_bias=f(0.3 * torch.randn(H, dtype=torch.float64), small),
                   initial_states=f(torch.randn(b, H, P, N, dtype=torch.float64), small),
                   seq_idx=(torch.rand(b, L) < 0.2).cumsum(1).to(device))


def ssd_samples(device, dtype, requires_grad):
    x, dt, A, _, _ = ssd_problem(1, 7, 4, 6, 2, 2, device, dtype)
    wide = randn((1, 7, 2, 4), dtype, device)
    strided = [x[..., ::2], dt.transpose(1, 2).contiguous().transpose(1, 2), A, wide[..., :2], wide[..., 2:]]
    return [SampleInput("chunk 4, 1 < G < H", tuple(ssd_problem(2, 11, 4, 3, 5, 2, device, dtype)) + (4,)),
            SampleInput("strided", tuple(strided) + (3,)),
            SampleInput("L < chunk, G = 1", tuple(ssd_problem(1, 6, 2, 2, 3, 1, device, dtype)) + (256,)),
            SampleInput("chunk 1", tuple(ssd_problem(1, 5, 2, 3, 2, 2, device, dtype)) + (1,)),
            SampleInput("L = 0", tuple(ssd_problem(1, 0, 2, 3, 2, 1, device, dtype)) + (4,))]


def ssd_backward_samples(device, dtype, requires_grad):
    x, dt, A, B, C = ssd_problem(2, 11, 4, 3, 5, 2, device, dtype)
    return [SampleInput("chunk 4", (randn(x.shape, dtype, device), x, dt, A, B, C, 4)),
            SampleInput("chunk 7 transposed dy", (randn((2, 4, 11, 3), dtype, device).transpose(1, 2),
                                                  x, dt, A, B, C, 7))]


def ssd_chunk_scan_ref(x, dt, A, B, C, chunk_size=256):
    return ref.ssd_chunk_scan(x, dt, A, B, C, chunk_size)


def combined_samples(device, dtype, requires_grad):
    small = dtype if dtype == torch.float64 else torch.float32
    (x, dt, A, B, C), o = ssd_problem(2, 11, 4, 3, 5, 2, device, dtype, small)
    D_h = o["D"][:, 0]
    (x1, dt1, A1, B1, C1) = ssd_problem(1, 9, 2, 3, 2, 1, device, dtype)
    return [SampleInput("every option", (x, dt, A, B, C, 4, o["D"], o["z"], o["dt_bias"], o["initial_states"],
                                         o["seq_idx"], True)),
            SampleInput("D [H], seq_idx int32", (x, dt, A, B, C, 4, D_h, None, None, o["initial_states"],
                                                 o["seq_idx"].int(), False)),
            SampleInput("z, dt_bias, softplus", (x, dt, A, B, C, 5, None, o["z"], o["dt_bias"], None, None, True)),
            SampleInput("no options", (x, dt, A, B, C, 4)),
            SampleInput("dt_limit", (x1, dt1, A1, B1, C1, 3), dict(dt_min=0.05, dt_max=0.5)),
            # (the chunk states kept for the backward: with 16-bit inputs, else empty)
            SampleInput("keep_states", (x, dt, A, B, C, 4, o["D"], o["z"], o["dt_bias"], o["initial_states"],
                                        o["seq_idx"], True), dict(keep_states=True))]


def combined_backward_samples(device, dtype, requires_grad):
    out = []
    for s in combined_samples(device, dtype, False)[:4]:
        a = s.args
        fwd = ops.ssd_chunk_scan_combined(*a)
        z = a[7] if len(a) > 7 else None
        y_pre = fwd[2] if z is not None else None
        tail = tuple(a[6:11]) + (None,) * (11 - len(a))
        sp = a[11] if len(a) > 11 else False
        out.append(SampleInput(s.desc, (randn(fwd[0].shape, dtype, device), randn(fwd[1].shape, fwd[1].dtype, device))
                               + a[:6] + tail + (y_pre, sp)))
    return out


def combined_ref(x, dt, A, B, C, chunk_size=256, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 dt_softplus=False, dt_min=0.0, dt_max=None, state_dtype=None, keep_states=False):
    """(out, final_states) of the step-by-step reference (y_pre is an implementation detail)."""
    return ref.ssd_chunk_scan_combined(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                       dt_softplus, (dt_min, float("inf") if dt_max is None else dt_max),
                                       return_final_states=True)


def ssd_bad(device):
    x, dt, A, B, C = ssd_problem(2, 10, 4, 8, 5, 2, "cpu", torch.float32)
    x, dt, A, B, C = [t.to(device) for t in (x, dt, A, B, C)]
    B3 = torch.randn(2, 10, 3, 5, device=device)
    op = r"baracuda::ssd_chunk_scan: "
    return {
        "ssd_chunk_scan": [
            BadInput("x 3-d", lambda: args(x[..., 0], dt, A, B, C, 16), ValueError,
                     op + r"x must have shape \[B, L, H, D\] \(4 dims\), got \[2, 10, 4\]"),
            BadInput("x 0-d", lambda: args(x[0, 0, 0, 0], dt, A, B, C, 16), ValueError,
                     r"x must have shape .*, got \[\]"),
            BadInput("dt wrong length", lambda: args(x, dt[:, :9], A, B, C, 16), ValueError,
                     op + r"dt must have shape \[B, L, H\] = \[2, 10, 4\], got \[2, 9, 4\]"),
            BadInput("dt 4-d", lambda: args(x, dt[..., None], A, B, C, 16), ValueError,
                     r"dt must have shape .* got \[2, 10, 4, 1\]"),
            BadInput("A wrong size", lambda: args(x, dt, A[:3], B, C, 16), ValueError,
                     op + r"A must have shape \[H\] = \[4\], got \[3\]"),
            BadInput("A 2-d", lambda: args(x, dt, A[None], B, C, 16), ValueError,
                     r"A must have shape \[H\] = \[4\], got \[1, 4\]"),
            BadInput("B wrong batch", lambda: args(x, dt, A, B[:1], C, 16), ValueError,
                     op + r"B must have shape \[B, L, G, N\] = \[2, 10, G, N\], got \[1, 10, 2, 5\]"),
            BadInput("B 3-d", lambda: args(x, dt, A, B[..., 0], C, 16), ValueError,
                     r"B must have shape .* got \[2, 10, 2\]"),
            BadInput("C not B's shape", lambda: args(x, dt, A, B, C[..., :4], 16), ValueError,
                     op + r"C must have B's shape \[2, 10, 2, 5\], got \[2, 10, 2, 4\]"),
            BadInput("H % G", lambda: args(x, dt, A, B3, B3, 16), ValueError,
                     op + r"the number of heads H = x.size\(2\) must be a multiple of the number of groups "
                          r"G = B.size\(2\), got H = 4 and G = 3"),
            BadInput("G = 0", lambda: args(x, dt, A, B[:, :, :0], C[:, :, :0], 16), ValueError,
                     r"got H = 4 and G = 0"),
            BadInput("chunk 0", lambda: args(x, dt, A, B, C, 0), ValueError,
                     op + r"chunk_size must be at least 1, got 0"),
            BadInput("chunk -5", lambda: args(x, dt, A, B, C, -5), ValueError,
                     r"chunk_size must be at least 1, got -5"),
            BadInput("integer x", lambda: args(x.long(), dt, A, B, C, 16), TypeError,
                     op + r"x must be float32, float16, bfloat16 or float64, got int64"),
            BadInput("integer C", lambda: args(x, dt, A, B, C.int(), 16), TypeError,
                     r"C must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("bool dt", lambda: args(x, dt.bool(), A, B, C, 16), TypeError, op + r"dt has dtype Bool"),
            BadInput("mixed dtypes dt", lambda: args(x, dt.double(), A, B, C, 16), TypeError,
                     op + r"x and dt must have the same dtype, got float32 and float64"),
            BadInput("mixed dtypes A", lambda: args(x, dt, A.half(), B, C, 16), TypeError,
                     r"x and A must have the same dtype, got float32 and float16"),
        ],
        "ssd_chunk_scan_backward": [
            BadInput("backward dy shape", lambda: args(x[..., :7], x, dt, A, B, C, 16), ValueError,
                     r"baracuda::ssd_chunk_scan_backward: dy must have x's shape \[2, 10, 4, 8\], got \[2, 10, 4, 7\]"),
            BadInput("backward dy dtype", lambda: args(x.double(), x, dt, A, B, C, 16), TypeError,
                     r"baracuda::ssd_chunk_scan_backward: dy must have x's dtype float32, got float64"),
            BadInput("backward H % G", lambda: args(x, x, dt, A, B3, B3, 16), ValueError,
                     r"baracuda::ssd_chunk_scan_backward: the number of heads .* got H = 4 and G = 3"),
            BadInput("backward chunk 0", lambda: args(x, x, dt, A, B, C, 0), ValueError,
                     r"baracuda::ssd_chunk_scan_backward: chunk_size must be at least 1, got 0"),
            BadInput("backward mixed dtypes", lambda: args(x, x, dt, A, B, C.half(), 16), TypeError,
                     r"baracuda::ssd_chunk_scan_backward: x and C must have the same dtype"),
        ],
    }


def combined_bad(device):
    (x, dt, A, B, C), o = ssd_problem(2, 10, 4, 8, 5, 2, "cpu", torch.float32, torch.float32)
    x, dt, A, B, C = [t.to(device) for t in (x, dt, A, B, C)]
    base = {k: v.to(device) for k, v in o.items()}
    base["D"] = base["D"][:, 0].contiguous()

    def f(**over):
        return args(x, dt, A, B, C, 4, **(dict(base, dt_softplus=False) | over))

    def bwd(**over):
        dfinal = over.pop("dfinal", torch.zeros_like(base["initial_states"]))
        return args(x, dfinal, x, dt, A, B, C, 4, **(dict(base, y_pre=x, dt_softplus=False) | over))

    op = r"baracuda::ssd_chunk_scan_combined: "
    bop = r"baracuda::ssd_chunk_scan_combined_backward: "
    init = base["initial_states"]
    return {
        "ssd_chunk_scan_combined": [
            BadInput("D wrong size", lambda: f(D=base["D"][:3]), ValueError,
                     op + r"D must have shape \[H\] = \[4\] or \[H, D\] = \[4, 8\], got \[3\]"),
            BadInput("D 3-d", lambda: f(D=base["D"][:, None, None]), ValueError,
                     r"D must have shape .* got \[4, 1, 1\]"),
            BadInput("D integer", lambda: f(D=base["D"].long()), TypeError,
                     op + r"D must be float32, float16, bfloat16 or float64, got int64"),
            BadInput("D float16 with float32 x", lambda: f(D=base["D"].half()), TypeError,
                     op + r"D must be float32 or x's dtype float32, got float16"),
            BadInput("z wrong shape", lambda: f(z=x[..., :7]), ValueError,
                     op + r"z must have shape \[B, L, H, D\] = \[2, 10, 4, 8\], got \[2, 10, 4, 7\]"),
            BadInput("z dtype", lambda: f(z=x.double()), TypeError, op + r"z must have x's dtype float32, got float64"),
            BadInput("dt_bias wrong size", lambda: f(dt_bias=base["dt_bias"][:2]), ValueError,
                     op + r"dt_bias must have shape \[H\] = \[4\], got \[2\]"),
            BadInput("dt_bias dtype", lambda: f(dt_bias=base["dt_bias"].bfloat16()), TypeError,
                     op + r"dt_bias must be float32 or x's dtype float32, got bfloat16"),
            BadInput("initial_states wrong shape", lambda: f(initial_states=init[..., :4]), ValueError,
                     op + r"initial_states must have shape \[B, H, D, N\] = \[2, 4, 8, 5\], got \[2, 4, 8, 4\]"),
            BadInput("initial_states dtype", lambda: f(initial_states=init.double()), TypeError,
                     op + r"initial_states must be float32 or x's dtype float32, got float64"),
            BadInput("seq_idx wrong shape", lambda: f(seq_idx=base["seq_idx"][:, :9]), ValueError,
                     op + r"seq_idx must have shape \[B, L\] = \[2, 10\], got \[2, 9\]"),
            BadInput("seq_idx float", lambda: f(seq_idx=base["seq_idx"].float()), TypeError,
                     op + r"seq_idx must be int32 or int64, got float32"),
            BadInput("dt_min > dt_max", lambda: f(dt_min=0.5, dt_max=0.1), ValueError,
                     op + r"dt_limit must satisfy dt_min <= dt_max"),
            BadInput("state_dtype integer", lambda: f(state_dtype=torch.int32), TypeError,
                     op + r"state_dtype must be a floating dtype"),
            BadInput("A float16 with float32 x", lambda: args(x, dt, A.half(), B, C, 4), TypeError,
                     op + r"A must be float32 or x's dtype float32, got float16"),
            BadInput("dt shape", lambda: args(x, dt[:, :9], A, B, C, 4), ValueError,
                     op + r"dt must have shape \[B, L, H\]"),
        ],
        "ssd_chunk_scan_combined_backward": [
            BadInput("backward y_pre missing", lambda: bwd(y_pre=None), ValueError,
                     bop + r"y_pre \(the forward's pre-gate output\) is required when z is given"),
            BadInput("backward y_pre without z", lambda: bwd(z=None), ValueError,
                     bop + r"y_pre must be None when z is None"),
            BadInput("backward y_pre shape", lambda: bwd(y_pre=x[:1]), ValueError,
                     bop + r"y_pre must have shape \[B, L, H, D\] = \[2, 10, 4, 8\], got \[1, 10, 4, 8\]"),
            BadInput("backward dfinal_states shape", lambda: bwd(dfinal=init[:1]), ValueError,
                     bop + r"dfinal_states must have shape \[B, H, D, N\] = \[2, 4, 8, 5\], got \[1, 4, 8, 5\]"),
            BadInput("backward dfinal_states integer", lambda: bwd(dfinal=init.int()), TypeError,
                     bop + r"dfinal_states must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("backward states shape", lambda: bwd(states=x.new_zeros(2, 4, 2, 8, 5)), ValueError,
                     bop + r"states must have shape \[B, H, nc, D, N\] = \[2, 4, 3, 8, 5\], got \[2, 4, 2, 8, 5\]"),
            BadInput("backward states dtype", lambda: bwd(states=x.new_zeros(2, 4, 3, 8, 5, dtype=torch.float64)),
                     TypeError, bop + r"states \(the forward's kept chunk states\) must have x's dtype float32, "
                                      r"got float64"),
        ],
    }


def conv_update_samples(device, dtype, requires_grad):
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    i64 = lambda *v: torch.tensor(v, dtype=torch.int64, device=device)  # noqa: E731
    return [SampleInput("one step, mamba_ssm's channel-last state of width W, bias, silu",
                        (r(2, 16), r(2, 4, 16).transpose(1, 2), r(16, 4), r(16), "silu")),
            SampleInput("6 steps, state_len W - 1 (L > state_len), no bias", (r(2, 8, 6), r(2, 8, 3), r(8, 4))),
            SampleInput("channel-last x slice, 3 steps", (channel_last(r, 2, 16, 3), r(2, 16, 5), r(16, 4), r(16))),
            SampleInput("circular buffer, int32 cache_seqlens, swish", (r(3, 6, 2), r(3, 6, 5), r(6, 3), r(6), "swish",
                                                                         i32(0, 4, 11))),
            SampleInput("state pool, int64 indices with a padding row, float32 weight",
                        (r(3, 8), r(5, 8, 4), w32(8, 4), w32(8), "silu", None, i64(3, -1, 0))),
            SampleInput("circular buffer in a pool, more steps than state_len",
                        (r(2, 4, 7), r(3, 4, 5), r(4, 4), None, None, i64(2, 9), i32(2, 0))),
            SampleInput("width 1, state_len 0", (r(2, 4, 2), r(2, 4, 0), r(4, 1), r(4))),
            SampleInput("empty batch", (r(0, 4), r(0, 4, 3), r(4, 4)))]


def conv_update_bad(device):
    x, st, w = torch.randn(2, 4, device=device), torch.randn(2, 4, 4, device=device), torch.randn(4, 4, device=device)
    b = torch.randn(4, device=device)
    idx = torch.tensor([0, 1], dtype=torch.int32, device=device)
    op = r"baracuda::causal_conv1d_update: "
    return {
        "causal_conv1d_update": [
            BadInput("integer x", lambda: args(x.int(), st, w), TypeError,
                     op + r"x must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("x 1-d", lambda: args(x[0], st, w), ValueError,
                     op + r"x must be 2-d \[batch, dim\] or 3-d \[batch, dim, seqlen\], got \[4\]"),
            BadInput("x 4-d", lambda: args(x[..., None, None], st, w), ValueError,
                     op + r"x must be 2-d .* got \[2, 4, 1, 1\]"),
            BadInput("conv_state dtype", lambda: args(x, st.double(), w), TypeError,
                     op + r"conv_state must have x's dtype float32, got float64"),
            BadInput("conv_state dim", lambda: args(x, st[:, :3], w), ValueError,
                     op + r"conv_state must have shape \[batch, dim, state_len\] with dim = x.size\(1\) = 4, got \[2, 3, 4\]"),
            BadInput("conv_state 2-d", lambda: args(x, st[0], w), ValueError,
                     op + r"conv_state must have shape \[batch, dim, state_len\] .* got \[4, 4\]"),
            BadInput("weight float64", lambda: args(x, st, w.double()), TypeError,
                     op + r"weight must have x's dtype float32, got float64"),
            BadInput("weight float16 for bfloat16 x", lambda: args(x.bfloat16(), st.bfloat16(), w.half()), TypeError,
                     op + r"weight must have x's dtype bfloat16 or float32, got float16"),
            BadInput("weight of nn.Conv1d, unsqueezed", lambda: args(x, st, w[:, None]), ValueError,
                     op + r"weight must have shape \[dim, width\] with dim = x.size\(1\) = 4, got \[4, 1, 4\]"),
            BadInput("width 0", lambda: args(x, st, w[:, :0]), ValueError,
                     op + r"weight's width \(weight.size\(1\)\) must be at least 1, got 0"),
            BadInput("state_len < width - 1", lambda: args(x, st[..., :2], w), ValueError,
                     op + r"conv_state's state_len \(conv_state.size\(2\)\) must be at least width - 1 = 3, got 2"),
            BadInput("bias dtype", lambda: args(x, st, w, b.double()), TypeError,
                     op + r"bias must have weight's dtype float32, got float64"),
            BadInput("bias shape", lambda: args(x, st, w, b[:3]), ValueError, op + r"bias must have shape \[dim\] = \[4\], got \[3\]"),
            BadInput("unknown activation", lambda: args(x, st, w, b, "relu"), ValueError,
                     op + r"activation must be None, 'silu' or 'swish', got 'relu'"),
            BadInput("cache_seqlens float", lambda: args(x, st, w, b, None, idx.float()), TypeError,
                     op + r"cache_seqlens must be int32 or int64, got float32"),
            BadInput("cache_seqlens shape", lambda: args(x, st, w, b, None, idx[:1]), ValueError,
                     op + r"cache_seqlens must have shape \[batch\] = \[2\], got \[1\]"),
            BadInput("indices int16", lambda: args(x, st, w, b, None, None, idx.short()), TypeError,
                     op + r"conv_state_indices has dtype Short"),
            BadInput("indices shape", lambda: args(x, st, w, b, None, None, idx[:, None]), ValueError,
                     op + r"conv_state_indices must have shape \[batch\] = \[2\], got \[2, 1\]"),
            BadInput("pool without indices", lambda: args(x, torch.randn(3, 4, 4, device=device), w), ValueError,
                     op + r"conv_state.size\(0\) must be x's batch 2 without conv_state_indices, got 3"),
        ],
    }


# ---- selective state update ---------------------------------------------------------


def _state_update_inputs(device, dtype, batch, heads, dim, dstate, groups, tokens=None, state32=False,
                         pool=None):
    """state, x, dt (raw, for dt_softplus), A (negative), B, C, D, z, dt_bias of one
    problem; the T dim on x, dt, z, B, C when ``tokens`` is given; the state float32 when
    ``state32`` (float64 data: float64), with ``pool`` rows."""
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    t = () if tokens is None else (tokens,)
    st = (w32 if state32 else r)(pool if pool is not None else batch, heads, dim, dstate)
    A = -(w32(heads, dim, dstate).abs() + 0.1)
    return dict(state=st, x=r(batch, *t, heads, dim), dt=r(batch, *t, heads, dim),
                A=A, B=r(batch, *t, groups, dstate), C=r(batch, *t, groups, dstate), D=w32(heads, dim),
                z=r(batch, *t, heads, dim), dt_bias=w32(heads, dim))


def _state_update_call(i, D=True, z=True, dt_bias=True, softplus=True, indices=None):
    return (i["state"], i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"] if D else None, i["z"] if z else None,
            i["dt_bias"] if dt_bias else None, softplus, indices)


def state_update_samples(device, dtype, requires_grad):
    r, w32 = _rand(device, dtype), _w32(device, dtype)
    samples = []
    i = _state_update_inputs(device, dtype, 3, 4, 5, 6, 2, state32=True)
    samples.append(SampleInput("every option, float32 state, 2 groups", _state_update_call(i)))
    # Mamba-2's step: per-head A, dt, D and dt_bias expanded over P (and N) with stride 0.
    B_, H, P, N = 2, 4, 3, 8
    A = -(w32(H).abs() + 0.1)
    samples.append(SampleInput("mamba2 expanded A, dt, D, dt_bias; 1 group", (
        r(B_, H, P, N), r(B_, H, P), r(B_, H)[..., None].expand(B_, H, P),
        A[:, None, None].expand(H, P, N), r(B_, 1, N), r(B_, 1, N), w32(H)[:, None].expand(H, P), None,
        w32(H)[:, None].expand(H, P), True, None)))
    i = _state_update_inputs(device, dtype, 2, 1, 7, 5, 1)
    samples.append(SampleInput("no heads dim (3-d state, 2-d x, mamba-1 layout)", (
        i["state"][:, 0], i["x"][:, 0], i["dt"][:, 0], i["A"][0], i["B"][:, 0], i["C"][:, 0], i["D"][0],
        i["z"][:, 0], i["dt_bias"][0], True, None)))
    i = _state_update_inputs(device, dtype, 3, 2, 3, 4, 1, state32=True, pool=5)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32, device=device)
    samples.append(SampleInput("state pool, int32 indices with a padding row", _state_update_call(i, indices=idx)))
    i = _state_update_inputs(device, dtype, 2, 3, 6, 5, 3)
    st = r(2, 3, 5, 6).transpose(-1, -2)                     # N stride P: not the vector layout
    xs = r(2, 3, 10)[..., 2:8]                               # a slice
    samples.append(SampleInput("transposed state, sliced x, groups = heads, no softplus, no z", (
        st, xs, i["dt"].abs(), i["A"], i["B"], i["C"], i["D"], None, None, False, None)))
    i = _state_update_inputs(device, dtype, 0, 2, 3, 4, 1)
    samples.append(SampleInput("empty batch", _state_update_call(i)))
    return samples


def state_update_tokens_samples(device, dtype, requires_grad):
    samples = []
    i = _state_update_inputs(device, dtype, 3, 4, 3, 6, 2, tokens=3, state32=True, pool=4)
    idx = torch.tensor([2, 0, -1], dtype=torch.int64, device=device)
    samples.append(SampleInput("3 tokens, every option, int64 indices, padding", _state_update_call(i, indices=idx)))
    i = _state_update_inputs(device, dtype, 2, 2, 4, 8, 1, tokens=1)
    samples.append(SampleInput("1 token, no D, no z", _state_update_call(i, D=False, z=False)))
    i = _state_update_inputs(device, dtype, 2, 1, 5, 3, 1, tokens=4)
    samples.append(SampleInput("4 tokens, no heads dim", (
        i["state"][:, 0], i["x"][:, :, 0], i["dt"][:, :, 0], i["A"][0], i["B"][:, :, 0], i["C"][:, :, 0],
        i["D"][0], i["z"][:, :, 0], i["dt_bias"][0], True, None)))
    i = _state_update_inputs(device, dtype, 2, 2, 3, 4, 2, tokens=0)
    samples.append(SampleInput("0 tokens: state unchanged", _state_update_call(i)))
    return samples


def state_update_bad(device):
    st, x, dt = torch.randn(2, 4, 3, 5, device=device), torch.randn(2, 4, 3, device=device), torch.randn(2, 4, 3, device=device)
    A, B, C = -torch.rand(4, 3, 5, device=device), torch.randn(2, 2, 5, device=device), torch.randn(2, 2, 5, device=device)
    D, z, db = torch.randn(4, 3, device=device), torch.randn(2, 4, 3, device=device), torch.randn(4, 3, device=device)
    idx = torch.tensor([0, 1], dtype=torch.int32, device=device)
    op = r"baracuda::selective_state_update: "
    tokens_op = r"baracuda::selective_state_update_tokens: "

    def f(**kw):
        a = dict(state=st, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=db, dt_softplus=True,
                 state_batch_indices=None)
        a.update(kw)
        return tuple(a.values()), {}

    xt = torch.randn(2, 3, 4, 3, device=device)
    Bt = torch.randn(2, 3, 2, 5, device=device)

    def t(**kw):
        a = dict(state=st, x=xt, dt=xt, A=A, B=Bt, C=Bt, D=None, z=None, dt_bias=None, dt_softplus=False,
                 state_batch_indices=None)
        a.update(kw)
        return tuple(a.values()), {}

    return {
        "selective_state_update": [
            BadInput("state integer", lambda: f(state=st.int()), TypeError,
                     op + r"state must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("state 2-d", lambda: f(state=st[0, 0]), ValueError,
                     op + r"state must be 4-d \[batch, nheads, dim, dstate\] or 3-d \[batch, dim, dstate\], got \[3, 5\]"),
            BadInput("state 9-d", lambda: f(state=torch.randn([1] * 5 + [2, 4, 3, 5], device=device)), ValueError,
                     op + r"state must be 4-d .* got \[1, 1, 1, 1, 1, 2, 4, 3, 5\]"),
            BadInput("x integer", lambda: f(x=x.int()), TypeError,
                     op + r"x must be float32, float16, bfloat16 or float64, got int32"),
            BadInput("x 4-d", lambda: f(x=xt), ValueError, op + r"x must be \[batch, nheads, dim\] or \[batch, dim\], got \[2, 3, 4, 3\]"),
            BadInput("x heads", lambda: f(x=x[:, :3]), ValueError,
                     op + r"x must have shape \[batch, nheads, dim\] = \[2, 4, 3\] \(or without nheads when it is 1\), "
                          r"got \[2, 3, 3\]"),
            BadInput("x without heads, nheads 4", lambda: f(x=x[:, 0]), ValueError,
                     op + r"x must have shape \[batch, nheads, dim\] = \[2, 4, 3\] .* got \[2, 3\]"),
            BadInput("state float16 for float32 x", lambda: f(state=st.half()), TypeError,
                     op + r"state must be float32 or x's dtype float32, got float16"),
            BadInput("state float64 for bfloat16 x", lambda: f(state=st.double(), x=x.bfloat16(), z=None), TypeError,
                     op + r"state must be float32 or x's dtype bfloat16, got float64"),
            BadInput("dt shape", lambda: f(dt=dt[..., :2]), ValueError,
                     op + r"dt must have shape \[batch, nheads, dim\] = \[2, 4, 3\] .* got \[2, 4, 2\]"),
            BadInput("A shape", lambda: f(A=A[:, :, :4]), ValueError,
                     op + r"A must have shape \[nheads, dim, dstate\] = \[4, 3, 5\] \(or without nheads when it is 1\), "
                          r"got \[4, 3, 4\]"),
            BadInput("A per head (mamba_ssm wants it expanded)", lambda: f(A=A[:, 0, 0]), ValueError,
                     op + r"A must have shape \[nheads, dim, dstate\] = \[4, 3, 5\] .* got \[4\]"),
            BadInput("B rank", lambda: f(B=B[0, 0]), ValueError,
                     op + r"B must be \[batch, ngroups, dstate\] or \[batch, dstate\], got \[5\]"),
            BadInput("B dstate", lambda: f(B=B[..., :4]), ValueError,
                     op + r"B must have shape \[batch, ngroups, dstate\] = \[2, 2, 5\] .* got \[2, 2, 4\]"),
            BadInput("groups do not divide heads", lambda: f(B=torch.randn(2, 3, 5, device=device)), ValueError,
                     op + r"nheads must be a multiple of ngroups \(B.size\(1\)\), got nheads = 4 and ngroups = 3"),
            BadInput("C groups differ from B's", lambda: f(C=C[:, :1]), ValueError,
                     op + r"C must have shape \[batch, ngroups, dstate\] = \[2, 2, 5\] .* got \[2, 1, 5\]"),
            BadInput("D shape", lambda: f(D=D[:, :2]), ValueError,
                     op + r"D must have shape \[nheads, dim\] = \[4, 3\] \(or without nheads when it is 1\), got \[4, 2\]"),
            BadInput("z shape", lambda: f(z=z[:1]), ValueError,
                     op + r"z must have shape \[batch, nheads, dim\] = \[2, 4, 3\] .* got \[1, 4, 3\]"),
            BadInput("z dtype", lambda: f(z=z.double()), TypeError, op + r"z must have x's dtype float32, got float64"),
            BadInput("dt_bias shape", lambda: f(dt_bias=db[0]), ValueError,
                     op + r"dt_bias must have shape \[nheads, dim\] = \[4, 3\] .* got \[3\]"),
            BadInput("dt float64 for float32 x", lambda: f(dt=dt.double()), TypeError,
                     op + r"dt must be float32 or x's dtype float32, got float64"),
            BadInput("A float16 for bfloat16 x", lambda: f(x=x.bfloat16(), A=A.half(), z=None), TypeError,
                     op + r"A must be float32 or x's dtype bfloat16, got float16"),
            BadInput("B integer", lambda: f(B=B.long()), TypeError, op + r"B must be float32 or x's dtype float32, got int64"),
            BadInput("D float64", lambda: f(D=D.double()), TypeError, op + r"D must be float32 or x's dtype float32, got float64"),
            BadInput("dt_bias float16", lambda: f(dt_bias=db.half()), TypeError,
                     op + r"dt_bias must be float32 or x's dtype float32, got float16"),
            BadInput("indices float", lambda: f(state_batch_indices=idx.float()), TypeError,
                     op + r"state_batch_indices must be int32 or int64, got float32"),
            BadInput("indices shape", lambda: f(state_batch_indices=idx[:1]), ValueError,
                     op + r"state_batch_indices must have shape \[batch\] = \[2\], got \[1\]"),
            BadInput("pool without indices", lambda: f(state=torch.randn(3, 4, 3, 5, device=device)), ValueError,
                     op + r"state.size\(0\) must be x's batch 2 without state_batch_indices, got 3"),
        ],
        "selective_state_update_tokens": [
            BadInput("x without the tokens dim", lambda: t(x=x[0]), ValueError,
                     tokens_op + r"x must be \[batch, tokens, nheads, dim\] or \[batch, tokens, dim\], got \[4, 3\]"),
            BadInput("dt tokens", lambda: t(dt=xt[:, :2]), ValueError,
                     tokens_op + r"dt must have shape \[batch, tokens, nheads, dim\] = \[2, 3, 4, 3\] .* got \[2, 2, 4, 3\]"),
            BadInput("B without tokens", lambda: t(B=B), ValueError,
                     tokens_op + r"B must have shape \[batch, tokens, ngroups, dstate\] = \[2, 3, 1, 5\] .* got \[2, 2, 5\]"),
            BadInput("C tokens", lambda: t(C=Bt[:, :1]), ValueError,
                     tokens_op + r"C must have shape \[batch, tokens, ngroups, dstate\] = \[2, 3, 2, 5\] .* got \[2, 1, 2, 5\]"),
            BadInput("state dstate differs from B's", lambda: t(state=st[..., :4], A=A[..., :4]), ValueError,
                     tokens_op + r"B must have shape \[batch, tokens, ngroups, dstate\] = \[2, 3, 2, 4\] .* got \[2, 3, 2, 5\]"),
            BadInput("tokens indices shape", lambda: t(state_batch_indices=idx[:, None]), ValueError,
                     tokens_op + r"state_batch_indices must have shape \[batch\] = \[2\], got \[2, 1\]"),
        ],
    }


# ---- the table -----------------------------------------------------------------------------


def _family(cases_by_op, name):
    return lambda device: cases_by_op(device)[name]


def _qk_ref(q, k, cos, sin, interleaved=False):
    return ref.rope_cos_sin(q, cos, sin, interleaved), ref.rope_cos_sin(k, cos, sin, interleaved)


def _vjp(fn, dy, *inputs):
    """The gradients of fn(*inputs) (a reference) for the output gradient dy, by autograd."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    return torch.autograd.grad(fn(*leaves), leaves, dy)


def _gated_backward_ref(dy, x, kind, dim=-1, gate_first=False):
    return _vjp(lambda t: ref.gated_activation(t, kind, dim, gate_first), dy, x)[0]


def _pair_backward_ref(dy, gate, up, kind):
    return _vjp(lambda g, u: ref.gated_activation_pair(g, u, kind), dy, gate, up)


def _lerp_backward_ref(dy, weight):
    return dy * (1 - weight), dy * weight


def _lerp_backward_tensor_ref(dy, a, b, weight):
    """(da, db, dw) at dy's shape, before any reduction to the operands' shapes."""
    return dy * (1 - weight), dy * weight, dy * (b - a)


def _gather_backward_ref(dout, dim, index, src_sizes):
    return dout.new_zeros(src_sizes).scatter_add(dim, index.long(), dout)


def _ssd_backward_ref(dy, x, dt, A, B, C, chunk_size=256):
    return _vjp(ref.ssd_chunk_scan, dy, x, dt, A, B, C)


def _combined_backward_ref(dout, dfinal_states, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                           initial_states=None, seq_idx=None, y_pre=None, dt_softplus=False, dt_min=0.0,
                           dt_max=None, states=None):
    """(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states) of the step-by-step
    reference; an empty tensor for an option that is None, as the op returns."""
    options = (D, z, dt_bias, initial_states)
    given = [t for t in (x, dt, A, B, C, *options) if t is not None]

    def forward(*ts):
        it = iter(ts)
        main = [next(it) for _ in range(5)]
        opt = [next(it) if t is not None else None for t in options]
        return combined_ref(*main, chunk_size, *opt, seq_idx, dt_softplus, dt_min, dt_max)

    leaves = [t.detach().requires_grad_() for t in given]
    grads = iter(torch.autograd.grad(forward(*leaves), leaves, (dout, dfinal_states), allow_unused=True))
    grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, given)]
    it = iter(grads)
    return tuple([next(it) for _ in range(5)] + [next(it) if t is not None else x.new_empty(0) for t in options])


def combined_backward_rtol(dtype, device):
    """On the CUDA tensor-core path the gated gradient dy·silu(z) is stored in x's dtype
    before it feeds the products: twice the forward's bound for half types there (the
    bound test_mamba.py uses)."""
    if device == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return 4 * torch.finfo(dtype).eps
    return ssd_rtol(dtype, device)


def _gated_rms_norm_backward_into_ref(dy, x, weight, bias, z, rstd, dz, group_size=None, norm_before_gate=True,
                                      recompute_output=False):
    """(dx, dw, db, y, then dz as written into the given tensor); y is the forward's output
    at eps = 0 (the samples' rstd) with recompute_output, else an empty tensor."""
    dx, dw, db, gz = _gated_rms_norm_backward_ref(dy, x, weight, bias, z, rstd, group_size, norm_before_gate)
    y = ref.gated_rms_norm(x, weight, bias, z, 0.0, group_size, norm_before_gate)[0] if recompute_output \
        else x.new_empty(0)
    return dx, dw, db, y, gz


def _conv_backward_into_ref(dout, dfinal_states, x, weight, dx, bias=None, seq_idx=None, initial_states=None,
                           activation=None):
    """(dweight, dbias, dinitial_states, then dx as written into the given tensor)."""
    gx, gw, gb, gi = _conv_backward_ref(dout, dfinal_states, x, weight, bias, seq_idx, initial_states, activation)
    return gw, gb, gi, gx


def _conv_backward_ref(dout, dfinal_states, x, weight, bias=None, seq_idx=None, initial_states=None,
                      activation=None):
    """(dx, dweight, dbias, dinitial_states) by autograd of the reference; an empty tensor
    for an absent bias or initial_states, as the op returns."""
    options = (bias, initial_states)
    given = [t for t in (x, weight, *options) if t is not None]

    def forward(*ts):
        it = iter(ts)
        x, w = next(it), next(it)
        b, init = (next(it) if t is not None else None for t in options)
        return ref.causal_conv1d(x, w, b, seq_idx, init, activation)

    leaves = [t.detach().requires_grad_() for t in given]
    out, final = forward(*leaves)
    grads = torch.autograd.grad((out, final), leaves, (dout, dfinal_states if dfinal_states is not None
                                                       else torch.zeros_like(final)), allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, given)]
    it = iter(grads)
    return tuple([next(it), next(it)] + [next(it) if t is not None else x.new_empty(0) for t in options])


def _cos_sin_backward_ref(dy, cos, sin, interleaved=False):
    return ref.rope_cos_sin(dy, cos, sin, interleaved, backward=True)


def _qk_backward_ref(dq, dk, cos, sin, interleaved=False):
    return _cos_sin_backward_ref(dq, cos, sin, interleaved), _cos_sin_backward_ref(dk, cos, sin, interleaved)


def _rms_norm_backward_ref(dy, x, weight, rstd, convention="torch", dh=None):
    """(dx (+ dh), dw) by autograd of the reference at eps = 0 (the samples' rstd); dw
    is an empty tensor without a weight, as the op returns."""
    inputs = (x,) if weight is None else (x, weight)
    grads = _vjp(lambda x, *w: ref.rms_norm(x, w[0] if w else None, 0.0, convention)[0], dy, *inputs)
    dx = grads[0] if dh is None else grads[0] + dh
    return dx, (grads[1] if weight is not None else x.new_empty(0))


def _gated_rms_norm_backward_ref(dy, x, weight, bias, z, rstd, group_size=None, norm_before_gate=True):
    """(dx, dw, db, dz) by autograd of the reference at eps = 0 (the samples' rstd); db
    and dz are empty tensors without a bias, a z, as the op returns."""
    inputs = [t for t in (x, weight, bias, z) if t is not None]

    def forward(*ts):
        it = iter(ts)
        x, w = next(it), next(it)
        b = next(it) if bias is not None else None
        zz = next(it) if z is not None else None
        return ref.gated_rms_norm(x, w, b, zz, 0.0, group_size, norm_before_gate)[0]

    it = iter(_vjp(forward, dy, *inputs))
    dx, dw = next(it), next(it)
    db = next(it) if bias is not None else x.new_empty(0)
    dz = next(it) if z is not None else x.new_empty(0)
    return dx, dw, db, dz


OP_DB = [
    OpInfo("gated_activation", gated_samples, _family(gated_bad, "gated_activation"), ref=ref.gated_activation),
    OpInfo("gated_activation_backward", gated_backward_samples, _family(gated_bad, "gated_activation_backward"),
           ref=_gated_backward_ref, supports_autograd=False),
    OpInfo("gated_activation_pair", pair_samples, _family(pair_bad, "gated_activation_pair"),
           ref=ref.gated_activation_pair),
    OpInfo("gated_activation_pair_backward", pair_backward_samples, _family(pair_bad, "gated_activation_pair_backward"),
           ref=_pair_backward_ref, supports_autograd=False),
    OpInfo("gated_activation_pair_backward_", pair_in_place_samples,
           _family(pair_bad, "gated_activation_pair_backward_"), ref=_pair_backward_ref, supports_autograd=False,
           mutates=(1, 2)),
    OpInfo("rope", rope_samples, _family(rope_bad, "rope"), ref=ref.rope, supports_gradgrad=True),
    OpInfo("rope_backward", rope_backward_samples, _family(rope_bad, "rope_backward"), ref=ref.rope_backward,
           supports_gradgrad=True),
    OpInfo("rope_cos_sin", rope_cos_sin_samples, _family(rope_cos_sin_bad, "rope_cos_sin"), ref=ref.rope_cos_sin),
    OpInfo("rope_cos_sin_backward", rope_cos_sin_samples, _family(rope_cos_sin_bad, "rope_cos_sin_backward"),
           ref=_cos_sin_backward_ref),
    OpInfo("rope_qk_cos_sin", rope_qk_cos_sin_samples, _family(rope_cos_sin_bad, "rope_qk_cos_sin"), ref=_qk_ref),
    OpInfo("rope_qk_cos_sin_backward", rope_qk_cos_sin_samples, _family(rope_cos_sin_bad, "rope_qk_cos_sin_backward"),
           ref=_qk_backward_ref),
    OpInfo("lerp", lerp_samples, _family(lerp_bad, "lerp"), ref=ref.lerp, supports_gradgrad=True),
    OpInfo("lerp.Tensor", lerp_tensor_samples, _family(lerp_bad, "lerp.Tensor"), ref=ref.lerp),
    OpInfo("lerp_backward", lerp_backward_samples, _family(lerp_bad, "lerp_backward"), ref=_lerp_backward_ref),
    OpInfo("lerp_backward.Tensor", lerp_backward_tensor_samples, _family(lerp_bad, "lerp_backward.Tensor"),
           ref=_lerp_backward_tensor_ref, supports_autograd=False),
    OpInfo("gather", gather_samples, _family(gather_bad, "gather"), ref=ref.gather, supports_gradgrad=True),
    OpInfo("gather_backward", gather_backward_samples, _family(gather_bad, "gather_backward"),
           ref=_gather_backward_ref, supports_gradgrad=True),
    OpInfo("rms_norm", rms_norm_samples, _family(rms_norm_bad, "rms_norm"), ref=ref.rms_norm),
    OpInfo("add_rms_norm", add_rms_norm_samples, _family(rms_norm_bad, "add_rms_norm"), ref=ref.add_rms_norm),
    OpInfo("rms_norm_backward", rms_norm_backward_samples, _family(rms_norm_bad, "rms_norm_backward"),
           ref=_rms_norm_backward_ref, supports_autograd=False),
    OpInfo("rms_norm_backward_", rms_norm_in_place_samples, _family(rms_norm_bad, "rms_norm_backward_"),
           ref=lambda *a: _rms_norm_backward_ref(*a)[::-1], supports_autograd=False, mutates=(0,)),
    OpInfo("gated_rms_norm", gated_rms_norm_samples, _family(gated_rms_norm_bad, "gated_rms_norm"),
           ref=ref.gated_rms_norm),
    OpInfo("gated_rms_norm_backward", gated_rms_norm_backward_samples,
           _family(gated_rms_norm_bad, "gated_rms_norm_backward"), ref=_gated_rms_norm_backward_ref,
           supports_autograd=False),
    OpInfo("gated_rms_norm_backward_into", gated_rms_norm_backward_into_samples,
           _family(gated_rms_norm_bad, "gated_rms_norm_backward_into"), ref=_gated_rms_norm_backward_into_ref,
           supports_autograd=False, mutates=(6,)),
    OpInfo("causal_conv1d", conv_samples, _family(conv_bad, "causal_conv1d"), ref=ref.causal_conv1d),
    OpInfo("causal_conv1d_backward", conv_backward_samples, _family(conv_bad, "causal_conv1d_backward"),
           ref=_conv_backward_ref, supports_autograd=False),
    OpInfo("causal_conv1d_backward_into", conv_backward_into_samples, _family(conv_bad, "causal_conv1d_backward_into"),
           ref=_conv_backward_into_ref, supports_autograd=False, mutates=(4,)),
    OpInfo("ssd_chunk_scan", ssd_samples, _family(ssd_bad, "ssd_chunk_scan"), ref=ssd_chunk_scan_ref, rtol=ssd_rtol),
    OpInfo("ssd_chunk_scan_backward", ssd_backward_samples, _family(ssd_bad, "ssd_chunk_scan_backward"),
           ref=_ssd_backward_ref, rtol=ssd_rtol, supports_autograd=False),
    OpInfo("ssd_chunk_scan_combined", combined_samples, _family(combined_bad, "ssd_chunk_scan_combined"),
           ref=combined_ref, rtol=ssd_rtol),
    OpInfo("ssd_chunk_scan_combined_backward", combined_backward_samples,
           _family(combined_bad, "ssd_chunk_scan_combined_backward"), ref=_combined_backward_ref,
           rtol=combined_backward_rtol, supports_autograd=False),
    OpInfo("causal_conv1d_update", conv_update_samples, _family(conv_update_bad, "causal_conv1d_update"),
           ref=ref.causal_conv1d_update, supports_autograd=False, mutates=(1,)),
    OpInfo("selective_state_update", state_update_samples, _family(state_update_bad, "selective_state_update"),
           ref=ref.selective_state_update, supports_autograd=False, mutates=(0,)),
    OpInfo("selective_state_update_tokens", state_update_tokens_samples,
           _family(state_update_bad, "selective_state_update_tokens"),
           ref=lambda *a, **k: ref.selective_state_update(*a, **k, tokens=True), supports_autograd=False,
           mutates=(0,)),
]

OPS_BY_NAME = {info.name: info for info in OP_DB}
