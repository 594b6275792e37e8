"""Run a function on every rank of a fresh process group in spawned processes
(``torch.multiprocessing``), for tests/test_distributed.py (gloo) and
tests/test_distributed_nccl.py (NCCL). Not a test module.

``run(world_size, fn, *args, timeout=..., backend="gloo")`` starts ``world_size``
processes, each ``fn(rank, world_size, *args)`` after ``init_process_group(backend)``
through a file store in a temporary directory (no ports), and returns when all exit
cleanly. A worker that raises fails the call with every failed rank's traceback (the
others are terminated); a run longer than ``timeout`` seconds kills every worker and
raises ``TimeoutError``. Either way, no process is left behind. Collectives inside the
workers time out after ``collective_timeout`` seconds (a mismatched collective raises
instead of hanging).

Backends:

* ``"gloo"``: CPU tensors; the workers are forked from a forkserver that has imported
  torch once, one thread each.
* ``"nccl"``: one GPU per rank, rank r on ``cuda:r`` (``torch.cuda.set_device``, and
  ``device_id`` to ``init_process_group``, which binds the communicator to it); the
  workers are started with ``spawn`` (a forked CUDA runtime is unusable, and the
  forkserver's imports query CUDA), with :data:`NCCL_ENV` in their environment (no NVLink
  SHARP / multicast), float32 matrix products in full precision (no TF32, so that float32
  results meet the float32 tolerances) and the machine's cores shared out. A failed
  worker does not tear its communicator down (that may wait on the peers it failed);
  the harness kills it. :func:`nccl_unavailable` says why a world size cannot run.
"""
from __future__ import annotations

import datetime
import os
import pickle
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# Workers are forked from one server process that has imported these once (started on
# the first run and ending with this process): a fresh interpreter importing torch costs
# seconds per worker, and a forked worker also exits without the interpreter's teardown.
# The server has run no torch computation (no thread pool to break by forking).
mp.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "baracuda_torch",
                           "distributed_cases"])

#: The pids of the last run's workers (tests check that none outlives the run).
LAST_PIDS: list = []

#: The environment of every NCCL worker: NVLink SHARP (NVLS) and symmetric-memory
#: multicast off, as the multi-GPU machines this project runs on need.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

BACKENDS = ("gloo", "nccl")


def nccl_unavailable(world_size: int) -> str:
    """Why ``run(world_size, ..., backend="nccl")`` cannot run here ("" when it can)."""
    if not (dist.is_available() and dist.is_nccl_available()):
        return "needs torch.distributed with NCCL"
    if not torch.cuda.is_available():
        return "needs CUDA GPUs"
    if torch.cuda.device_count() < world_size:
        return f"needs {world_size} GPUs, found {torch.cuda.device_count()}"
    return ""


def _entry(rank, world_size, store_file, collective_timeout, backend, fn, args):
    if _TESTS_DIR not in sys.path:
        sys.path.insert(0, _TESTS_DIR)
    device_id = None
    if backend == "nccl":
        os.environ.update(NCCL_ENV)    # read when the communicator is created
        torch.cuda.set_device(rank)
        device_id = torch.device("cuda", rank)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    else:
        torch.set_num_threads(1)       # world_size processes share the machine's cores
    dist.init_process_group(backend, init_method=f"file://{store_file}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout),
                            device_id=device_id)
    if backend == "gloo":
        try:
            fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
    else:
        fn(rank, world_size, *args)    # on failure: no teardown (see the module docstring)
        dist.destroy_process_group()


def run(world_size, fn, *args, timeout: float = 120.0, collective_timeout: float = 60.0,
        backend: str = "gloo"):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks of a
    ``backend`` process group ("gloo" on the CPU, or "nccl": rank r on ``cuda:r``)."""
    if backend not in BACKENDS:
        raise ValueError(f"run: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl" and nccl_unavailable(world_size):
        raise RuntimeError(f"run: {nccl_unavailable(world_size)}")
    with tempfile.TemporaryDirectory(prefix="baracuda_cp_") as tmp:
        ctx = mp.start_processes(_entry, args=(world_size, os.path.join(tmp, "store"),
                                               collective_timeout, backend, fn, args),
                                 nprocs=world_size, join=False,
                                 start_method="forkserver" if backend == "gloo" else "spawn")
        LAST_PIDS[:] = ctx.pids()
        name = getattr(fn, "__name__", repr(fn))
        deadline = time.monotonic() + timeout
        try:
            # On a failure, join gives the others `grace_period` s to fail too (a peer's
            # error usually makes them raise), then terminates and kills them.
            while not ctx.join(timeout=max(0.05, min(1.0, deadline - time.monotonic())),
                               grace_period=2.0):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{name} on {world_size} {backend} ranks did not finish in "
                                       f"{timeout} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            # Every rank's traceback, in the order they failed: the one join saw may be a
            # consequence (a closed connection) of another rank's failure.
            failed = sorted((os.path.getmtime(path), rank, path)
                            for rank, path in enumerate(ctx.error_files)
                            if os.access(path, os.R_OK))
            traces = []
            for _, rank, path in failed:
                with open(path, "rb") as fh:
                    traces.append(f"-- rank {rank}:\n{pickle.load(fh)}")
            raise RuntimeError(f"{name} on {world_size} {backend} ranks failed:\n"
                               + ("\n".join(traces) or str(e))) from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            for p in ctx.processes:
                p.join(10)
            for path in ctx.error_files:
                if os.path.exists(path):
                    os.unlink(path)


def alive(pids) -> list:
    """The pids of ``pids`` that still exist."""
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            out.append(pid)
        except ProcessLookupError:
            pass
    return out
