"""Run a function on every rank of a fresh gloo process group in spawned processes
(``torch.multiprocessing``), for tests/test_distributed.py. Not a test module.

``run(world_size, fn, *args, timeout=...)`` starts ``world_size`` processes, each
``fn(rank, world_size, *args)`` after ``init_process_group("gloo")`` through a file store
in a temporary directory (no ports), and returns when all exit cleanly. A worker that
raises fails the call with every failed rank's traceback (the others are terminated); a run
longer than ``timeout`` seconds kills every worker and raises ``TimeoutError``. Either
way, no process is left behind. Collectives inside the workers time out after
``collective_timeout`` seconds (a mismatched collective raises instead of hanging).
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


def _entry(rank, world_size, store_file, collective_timeout, fn, args):
    if _TESTS_DIR not in sys.path:
        sys.path.insert(0, _TESTS_DIR)
    torch.set_num_threads(1)           # world_size processes share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout))
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run(world_size, fn, *args, timeout: float = 120.0, collective_timeout: float = 60.0):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks."""
    with tempfile.TemporaryDirectory(prefix="baracuda_cp_") as tmp:
        ctx = mp.start_processes(_entry, args=(world_size, os.path.join(tmp, "store"),
                                               collective_timeout, fn, args),
                                 nprocs=world_size, join=False, start_method="forkserver")
        LAST_PIDS[:] = ctx.pids()
        name = getattr(fn, "__name__", repr(fn))
        deadline = time.monotonic() + timeout
        try:
            # On a failure, join gives the others `grace_period` s to fail too (a peer's
            # error usually makes them raise), then terminates and kills them.
            while not ctx.join(timeout=max(0.05, min(1.0, deadline - time.monotonic())),
                               grace_period=2.0):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{name} on {world_size} ranks did not finish in "
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
            raise RuntimeError(f"{name} on {world_size} ranks failed:\n"
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
