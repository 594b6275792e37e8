import os
import zlib

import pytest
import torch

try:  # property-based tests (test_fuzz.py): seeded and bounded, the same examples on every run
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "baracuda", derandomize=True, deadline=None, max_examples=20, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture])
    settings.load_profile("baracuda")
except ImportError:  # test_fuzz.py is skipped without hypothesis
    pass


def pytest_configure(config):
    # pytest-xdist's workers share the machine's cores: torch's CPU thread pool, sized to all
    # of them in every worker, oversubscribes them (the float64 CPU references of 8 workers
    # on a 16-core GPU machine: 24 SSD tests done in 330 s, where with one thread a worker
    # 190 took 117 s). Each worker takes its share unless OMP_NUM_THREADS says otherwise.
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def pytest_collection_modifyitems(config, items):
    # pyproject.toml's `cuda` marker on every test whose skip condition names a CUDA device
    # (helpers.requires_cuda on the test, its class or module, or on its "cuda" parameter),
    # so that a GPU run can select them all with `-m cuda`: a `-k cuda` selection misses the
    # tests whose ids do not name the device.
    for item in items:
        if any("cuda" in str(m.kwargs.get("reason", "")).lower() for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.cuda)


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
