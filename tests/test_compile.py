"""torch.compile(fullgraph=True): the ops trace without graph breaks, forward and
backward, with static and dynamic shapes, and give the eager results."""
import pytest
import torch

import baracuda_torch as bt
from helpers import DEVICES, check_compiled


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
