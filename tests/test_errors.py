"""Bad inputs: each raises the exception type docs/ops.md gives for the rule, with a
message naming the op and the broken rule; none crashes or writes out of bounds."""
import pytest
import torch

import baracuda_torch as bt
from helpers import DEVICES, HAS_CUDA, expect_bad_case, requires_cuda

ops = torch.ops.baracuda


def gated_cases(device):
    x = torch.randn(3, 8, device=device)
    dy = torch.randn(3, 4, device=device)
    return [
        ("odd split", lambda: bt.swiglu(torch.randn(3, 7, device=device)), ValueError,
         r"baracuda::gated_activation: x.size\(-1\) must be even, got 7"),
        ("odd split dim 0", lambda: bt.glu(torch.randn(5, 4, device=device), 0), ValueError,
         r"x.size\(0\) must be even, got 5"),
        ("dim too large", lambda: bt.swiglu(x, 2), IndexError,
         r"baracuda::gated_activation: dim must be in \[-2, 1\] for a 2-d tensor, got 2"),
        ("dim too small", lambda: bt.swiglu(x, -3), IndexError, r"got -3"),
        ("unknown kind", lambda: bt.gated_activation(x, "gelu"), ValueError,
         r"baracuda::gated_activation: kind must be one of .* got 'gelu'"),
        ("integer input", lambda: bt.swiglu(torch.ones(3, 8, dtype=torch.int32, device=device)), TypeError,
         r"baracuda::gated_activation: x must be float32, float16, bfloat16 or float64, got int32"),
        ("bool input", lambda: bt.swiglu(torch.ones(3, 8, dtype=torch.bool, device=device)), TypeError,
         r"baracuda::gated_activation: x has dtype Bool"),
        ("complex input", lambda: bt.swiglu(torch.ones(3, 8, dtype=torch.complex64, device=device)), TypeError,
         r"baracuda::gated_activation: x has dtype ComplexFloat"),
        ("0-dim input", lambda: bt.swiglu(torch.tensor(1.0, device=device)), ValueError,
         r"baracuda::gated_activation: x must have at least one dimension"),
        ("rank 9", lambda: bt.swiglu(torch.randn([1] * 8 + [4], device=device)), NotImplementedError,
         r"baracuda::gated_activation: x has 9 dims, at most 8"),
        ("dy wrong shape", lambda: ops.gated_activation_backward(torch.randn(3, 5, device=device), x, "swiglu"),
         ValueError, r"baracuda::gated_activation_backward: dy must have x's sizes with size\(dim\) halved, \[3, 4\], got \[3, 5\]"),
        ("dy wrong rank", lambda: ops.gated_activation_backward(torch.randn(12, device=device), x, "swiglu"),
         ValueError, r"dy must have x's sizes"),
        ("dy wrong dtype", lambda: ops.gated_activation_backward(dy.double(), x, "swiglu"), TypeError,
         r"baracuda::gated_activation_backward: dy must have x's dtype float32, got float64"),
        ("backward odd split", lambda: ops.gated_activation_backward(dy, torch.randn(3, 9, device=device), "swiglu"),
         ValueError, r"baracuda::gated_activation_backward: x.size\(-1\) must be even, got 9"),
        ("backward unknown kind", lambda: ops.gated_activation_backward(dy, x, "nope"), ValueError,
         r"baracuda::gated_activation_backward: kind must be one of"),
    ]


CASE_NAMES = [c[0] for c in gated_cases("cpu")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_gated_bad_inputs(device, name):
    expect_bad_case(gated_cases(device), name)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_gated_bad_inputs_meta(name):
    """The meta (fake) kernels reject what the real ones reject, so torch.compile does too."""
    expect_bad_case(gated_cases("meta"), name)


@requires_cuda
def test_gated_mixed_devices():
    with pytest.raises(RuntimeError, match=r"baracuda::gated_activation_backward: expected all tensors on one device"):
        ops.gated_activation_backward(torch.randn(3, 4, device="cuda"), torch.randn(3, 8), "swiglu")
    with pytest.raises(RuntimeError, match=r"expected all tensors on one device"):
        ops.gated_activation_backward(torch.randn(3, 4), torch.randn(3, 8, device="cuda"), "swiglu")


def test_preference_errors():
    with pytest.raises(ValueError, match="preference must be 'fastest', 'deterministic' or 'precise', got 'quick'"):
        bt.set_preference("quick")
    with pytest.raises(ValueError, match="unknown op 'not_an_op'"):
        bt.explain("not_an_op")
