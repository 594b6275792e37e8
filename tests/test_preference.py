"""Plan preferences: the global setting, the context manager, PyTorch's deterministic
mode, and the errors for an unknown preference or op."""
import pytest
import torch

import baracuda_torch as bt


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


def test_preference_errors():
    with pytest.raises(ValueError, match="preference must be 'fastest', 'deterministic' or 'precise', got 'quick'"):
        bt.set_preference("quick")
    with pytest.raises(ValueError, match="unknown op 'not_an_op'"):
        bt.explain("not_an_op")
