import zlib

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # A different seed per test (stable across runs, so failures reproduce).
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture(autouse=True)
def _restore_global_state():
    import baracuda_torch

    pref = baracuda_torch.get_preference()
    det = torch.are_deterministic_algorithms_enabled()
    yield
    baracuda_torch.set_preference(pref)
    torch.use_deterministic_algorithms(det)
