"""Context parallelism (baracuda_torch.distributed; Mamba2(cp_group=...)) over NCCL, one
process per GPU: the specs of tests/test_distributed.py and the same per-rank bodies
(distributed_cases.py), each rank's shard on its own GPU (rank r on cuda:r;
distributed_harness.run(..., backend="nccl"): spawned workers, NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, no TF32). The reference stays one float64 process
over the whole sequence on the CPU, and the tolerances are gloo's (rtol_for: float32
1e-4, float64 1e-10, bfloat16 2 eps, of the largest reference value). World size 2
needs 2 GPUs, world size 4 needs 4; every test skips (does not fail) without NCCL or
enough GPUs, as on a CPU-only machine and in CI.

DistributedDataParallel runs with ``device_ids=[the rank's GPU]`` and FSDP2 on a CUDA
mesh. The byte count of the collectives and the harness's failure path (a rank raises
while its peer waits in an NCCL barrier: reported, no process left) run over NCCL too;
the hang test stays gloo-only (it tests the harness's timeout, not the backend).
"""
import pytest

import distributed_cases as cases
import distributed_harness as harness
from test_distributed import LAYER_2, LAYER_4, SCAN_2, SCAN_4, TIMEOUT, VOLUME_2

# causal_conv1d's CUDA kernels take widths 2 to 4 (as causal-conv1d's do; the CPU kernel takes any
# width): the d_conv = 1 case runs under gloo only.
_CUDA_CONV_WIDTHS = range(2, 5)


def _on_cuda(specs: list) -> list:
    return [s for s in specs if s.get("d_conv", 4) in _CUDA_CONV_WIDTHS]


def needs_gpus(world: int):
    """Skips unless NCCL and ``world`` GPUs are there."""
    why = harness.nccl_unavailable(world)
    return pytest.mark.skipif(bool(why), reason=why)


def _world(world: int, specs: list):
    return pytest.param(world, specs, id=f"world{world}", marks=needs_gpus(world))


def _run(world, fn, specs):
    harness.run(world, fn, specs, timeout=TIMEOUT, backend="nccl")
    assert harness.alive(harness.LAST_PIDS) == []


@pytest.mark.parametrize("world,specs", [_world(2, SCAN_2), _world(4, SCAN_4)])
def test_scan_matches_one_process_nccl(world, specs):
    _run(world, cases.scan_cases, specs)


@pytest.mark.parametrize("world,specs", [_world(2, _on_cuda(LAYER_2)), _world(4, _on_cuda(LAYER_4))])
def test_mamba2_matches_one_process_nccl(world, specs):
    _run(world, cases.layer_cases, specs)


@needs_gpus(2)
def test_bytes_per_layer_do_not_grow_with_L_nccl():
    _run(2, cases.volume_cases, VOLUME_2)


@needs_gpus(2)
def test_harness_reports_a_failure_and_leaves_no_process_nccl():
    with pytest.raises(Exception, match="deliberate failure on rank 1"):
        harness.run(2, cases.fail_on_rank, 1, timeout=TIMEOUT, backend="nccl")
    assert harness.LAST_PIDS and harness.alive(harness.LAST_PIDS) == []
