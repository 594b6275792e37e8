"""Thread safety and memory: every op called from several Python threads at once gives
the bits of a single-threaded call, also while another thread flips the library-wide
plan preference between "fastest" and "deterministic" (an atomic in the extension,
read once per call); a long forward+backward loop does not grow the resident memory.

The bit comparison holds for the plans these calls select: every CPU plan is
deterministic under both preferences (checked with ``explain`` below), and on CUDA the
comparison runs under the "deterministic" preference only, or for ops whose every plan
is deterministic.
"""
from __future__ import annotations

import os
import threading

import pytest
import torch

import baracuda_torch as bt
from helpers import DEVICES, HAS_CUDA


def _cases(device):
    """(name, fn, inputs): fn(*inputs) -> tensor; inputs are float32 leaves, except
    integer index/position tensors, on `device`."""
    g = torch.Generator().manual_seed(1234)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    idx = torch.randint(0, 37, (29, 23), generator=g).to(device)
    pos = torch.randint(-50, 5000, (2, 40), generator=g).to(device)
    return [
        ("swiglu", lambda x: bt.swiglu(x, gate_first=True), [rnd(33, 130)]),
        ("geglu_tanh_dim0", lambda x: bt.geglu(x, 0, "tanh"), [rnd(64, 35)]),
        ("rope", lambda x: bt.rope(x, interleaved=False, rotary_dim=12), [rnd(2, 3, 40, 16)]),
        ("rope_positions", lambda x: bt.rope(x, pos, base=500.0), [rnd(2, 3, 40, 8)]),
        ("lerp_scalar", lambda a, b: bt.lerp(a, b, 0.7), [rnd(31, 45), rnd(45)]),
        ("lerp_tensor", lambda a, b, w: bt.lerp(a, b, w), [rnd(31, 45), rnd(31, 45), rnd(31, 1)]),
        # Duplicate indices: the backward sums several gradients into one source element.
        ("gather", lambda s: bt.gather(s, 1, idx), [rnd(29, 37)]),
        ("ssd_chunk_scan", lambda x, dt, A, B, C: bt.ssd_chunk_scan(x, dt, A, B, C, chunk_size=8),
         [rnd(2, 19, 4, 5), torch.rand(2, 19, 4, generator=g).to(device) * 0.5,
          -torch.rand(4, generator=g).to(device) - 0.1, rnd(2, 19, 2, 3), rnd(2, 19, 2, 3)]),
    ]


def _run(fn, inputs):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    y = fn(*leaves)
    dy = torch.linspace(-1.0, 1.0, y.numel(), device=y.device).reshape(y.shape)
    grads = torch.autograd.grad(y, leaves, dy)
    return [y.detach(), *grads]


def _same_bits(a, b):
    return all(x.shape == y.shape and torch.equal(x.view(torch.int32), y.view(torch.int32))
               for x, y in zip(a, b))


def _hammer(device, preference_flipper: bool, n_threads=4, iters=40):
    cases = _cases(device)
    expected = {name: _run(fn, inputs) for name, fn, inputs in cases}
    errors: list[str] = []
    stop = threading.Event()

    def worker(k):
        try:
            for it in range(iters):
                for name, fn, inputs in cases[k % len(cases):] + cases[:k % len(cases)]:
                    got = _run(fn, inputs)
                    if device == "cuda":
                        torch.cuda.current_stream().synchronize()
                    if not _same_bits(got, expected[name]):
                        errors.append(f"thread {k}, iteration {it}: {name} differs")
                        return
        except Exception as e:  # surfaces in the main thread's assert
            errors.append(f"thread {k}: {type(e).__name__}: {e}")

    def flipper():
        prefs = ["fastest", "deterministic"]
        i = 0
        while not stop.is_set():
            bt.set_preference(prefs[i % 2])
            i += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    flip = threading.Thread(target=flipper) if preference_flipper else None
    if flip:
        flip.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    if flip:
        flip.join()
    assert not errors, errors


@pytest.mark.parametrize("n", [1, 2, 3])
def test_cpu_kernels_run_on_torch_threads(n):
    """The CPU kernels' at::parallel_for runs on torch.get_num_threads() threads. Under
    torch's OpenMP backend it is a pragma, which a build without -fopenmp dropped: every
    CPU kernel then ran on one thread, and two threads were no faster than one."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        assert bt._C._parallel_for_threads() == n
    finally:
        torch.set_num_threads(old)


def test_cpu_plans_are_deterministic_under_both_preferences():
    """The premise of the bit comparison while the preference flips: on the CPU, both
    preferences select deterministic plans for every op of _cases."""
    x = torch.randn(29, 37)
    idx = torch.randint(0, 37, (29, 23))
    for pref in ("fastest", "deterministic"):
        for info in [bt.explain("gather", x, 1, idx, preference=pref),
                     bt.explain("gather_backward", torch.randn(29, 23), 1, idx, [29, 37],
                                preference=pref),
                     bt.explain("lerp_backward.Tensor", x, x, x, x[:, :1], preference=pref),
                     bt.explain("gated_activation_backward", x[:, :18], x[:, :36], "swiglu",
                                preference=pref)]:
            assert info.deterministic, info


@pytest.mark.parametrize("device", DEVICES)
def test_threads_give_single_threaded_bits(device):
    if device == "cuda":
        bt.set_preference("deterministic")
    _hammer(device, preference_flipper=False)


def test_threads_while_preference_flips():
    # CPU only: on CUDA "fastest" selects atomic (nondeterministic) gather backward
    # kernels, so flipping the preference changes the bits by design.
    _hammer("cpu", preference_flipper=True)
    assert bt.get_preference() in ("fastest", "deterministic")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="AddressSanitizer's quarantine keeps freed memory resident (scripts/sanitize.sh)")
def test_forward_backward_loop_does_not_grow_resident_memory():
    """1200 iterations of every op's forward and backward (dozens of tensors of up to
    256 KiB allocated and freed per iteration). A leak of even one 64 KiB tensor per
    iteration would add 75 MiB; the tolerance is 20 MiB (allocator caches and arenas
    settle during the warm-up)."""
    leak_probe_bytes = 16384 * 4
    iters = 1200
    cases = _cases("cpu")
    # Inputs of at least 64 KiB each, so that a leaked output or gradient is one.
    big = [
        ("swiglu", lambda x: bt.swiglu(x), [torch.randn(64, 512)]),
        ("lerp_tensor", lambda a, b, w: bt.lerp(a, b, w),
         [torch.randn(128, 128), torch.randn(128, 128), torch.randn(128, 1)]),
        ("gather", lambda s: bt.gather(s, 0, torch.randint(0, 128, (128, 128))), [torch.randn(128, 128)]),
        ("rope", lambda x: bt.rope(x), [torch.randn(1, 4, 64, 64)]),
    ]
    all_cases = cases + big

    def one_round():
        for _, fn, inputs in all_cases:
            _run(fn, inputs)

    for _ in range(200):  # warm-up: allocator arenas, autograd and dispatcher caches
        one_round()
    before = _rss_bytes()
    for _ in range(iters):
        one_round()
    grown = _rss_bytes() - before
    tolerance = 20 << 20
    assert iters * leak_probe_bytes > 3 * tolerance  # the test could see a one-tensor leak
    assert grown < tolerance, f"resident memory grew by {grown / 2**20:.1f} MiB over {iters} iterations"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_loop_does_not_grow_allocated_memory():
    cases = _cases("cuda")
    for _ in range(20):
        for _, fn, inputs in cases:
            _run(fn, inputs)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(500):
        for _, fn, inputs in cases:
            _run(fn, inputs)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
