"""torch.compile(fullgraph=True): the ops trace without graph breaks, forward and
backward, with static and dynamic shapes, and give the eager results."""
import pytest
import torch

import baracuda_torch as bt
from helpers import DEVICES


def check_compiled(fn, inputs, dynamic=False):
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    for args in inputs:
        eager_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        comp_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        out_e = fn(*eager_args)
        out_c = compiled(*comp_args)
        torch.testing.assert_close(out_c, out_e)
        out_e.sum().backward()
        out_c.sum().backward()
        for a, b in zip(comp_args, eager_args):
            if a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_gated(device, dynamic):
    def fn(x, w):
        h = x @ w
        return bt.swiglu(h, gate_first=True) * 2 + bt.geglu(h, approximate="tanh")

    shapes = [(6, 16), (10, 16)]
    inputs = [(torch.randn(s, device=device, requires_grad=True),
               torch.randn(16, 24, device=device, requires_grad=True)) for s in shapes]
    check_compiled(fn, inputs, dynamic)
