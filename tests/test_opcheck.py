"""torch.library.opcheck on representative samples of every op: schema, autograd
registration, fake (meta) kernels, and AOT dispatch with dynamic shapes."""
import pytest
import torch

from helpers import DEVICES

ops = torch.ops.baracuda


def gated_samples(device):
    x = torch.randn(4, 6, 16, device=device)
    xs = torch.randn(16, 12, device=device).t()  # strided
    dy = torch.randn(4, 6, 8, device=device)
    return [
        (ops.gated_activation.default, (x.clone().requires_grad_(), "swiglu", -1, False)),
        (ops.gated_activation.default, (xs.clone().requires_grad_(), "geglu", 0, True)),
        (ops.gated_activation.default, (x.double(), "glu", 1, False)),
        (ops.gated_activation_backward.default, (dy, x, "geglu_tanh", -1, True)),
        (ops.gated_activation_backward.default, (dy.half(), x.half(), "reglu", -1, False)),
    ]


SAMPLES = {"gated": gated_samples}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", sorted(SAMPLES))
def test_opcheck(device, family):
    for op, args in SAMPLES[family](device):
        torch.library.opcheck(op, args)
