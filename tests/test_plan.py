"""Plan introspection and preferences."""
import pytest
import torch

import baracuda_torch as bt
from helpers import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_explain_gated(device):
    x = torch.randn(4, 32, dtype=torch.bfloat16, device=device)
    info = bt.explain("gated_activation", x, "swiglu")
    assert isinstance(info, bt.PlanInfo)
    assert info.family == "gated_activation"
    assert info.op == "swiglu"
    assert info.dtype == "bfloat16"
    assert info.index_dtype is None
    assert info.backend == device
    assert (info.arch >= 50) if device == "cuda" else (info.arch == 0)
    assert info.math_precision == "float32" and info.accumulator == "float32"
    assert info.deterministic and info.bit_stable
    assert info.workspace_bytes == 0
    assert info.name.startswith("gated_activation.swiglu/bfloat16/")
    assert "PlanInfo(gated_activation.swiglu" in repr(info)
    # The op object and keyword arguments work too; nothing runs.
    info2 = bt.explain(torch.ops.baracuda.gated_activation, x, kind="geglu_tanh", dim=0, gate_first=True)
    assert info2.op == "geglu_tanh"
    x64 = x.double()
    info3 = bt.explain(torch.ops.baracuda.gated_activation_backward.default, x64[:, :16], x64, "glu")
    assert info3.op == "glu_backward" and info3.math_precision == "float64"


def test_explain_raises_what_the_op_raises():
    with pytest.raises(ValueError, match="must be even"):
        bt.explain("gated_activation", torch.randn(3, 5), "swiglu")


def test_preference_round_trip():
    assert bt.get_preference() == "fastest"
    with bt.preference("deterministic"):
        assert bt.get_preference() == "deterministic"
        assert bt._C.effective_preference() == "deterministic"
        assert bt.explain("gated_activation", torch.randn(2, 4), "glu").preference == "deterministic"
    assert bt.get_preference() == "fastest"
    assert bt.explain("gated_activation", torch.randn(2, 4), "glu",
                      preference="deterministic").preference == "deterministic"


def test_torch_deterministic_mode_sets_effective_preference():
    assert bt._C.effective_preference() == "fastest"
    torch.use_deterministic_algorithms(True)
    assert bt._C.effective_preference() == "deterministic"
    torch.use_deterministic_algorithms(False)
    assert bt._C.effective_preference() == "fastest"
