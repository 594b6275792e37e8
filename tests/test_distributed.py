"""Context parallelism (baracuda_torch.distributed; Mamba2(cp_group=...)) on gloo, CPU:
world sizes 2 and 4 in worker processes (distributed_harness.run: forked from a server
that imported torch once, a file store, no ports; every worker killed on failure or
timeout, every rank's traceback reported). Each rank compares its outputs and
gradients with one float64 process over the whole sequence (distributed_cases.py):
every gradient of the scan (x, dt, A, B, C, D, z, dt_bias, initial_states) and of the
layer (its input and every parameter), the shared ones summed over the group, within
the chunked tolerance of the dtype (test_ssd_chunk_scan.rtol_for); with and without
seq_idx (resets inside shards, exactly at shard boundaries, after an empty shard) and
initial_states, with uneven shard lengths (0, and shorter than the conv's halo,
included); under DistributedDataParallel and FSDP2 (fully_shard). The bytes through
the collectives per layer and rank are counted and do not change with L.
tests/test_distributed_nccl.py runs the same specs over NCCL, one GPU per rank.
"""
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distributed_cases as cases
import distributed_harness as harness

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()
         and "forkserver" in mp.get_all_start_methods()),
    reason="needs torch.distributed with gloo and the forkserver start method")

TIMEOUT = 180  # seconds for one run of workers (each takes a few seconds here)

ALL_OPTIONS = dict(D="hdim", z=True, dt_bias=True, init=True, softplus=True)

SCAN_2 = [
    # resets inside both shards and exactly at the boundary (13 = rank 1's first token)
    dict(name="all options, seq_idx", seed=1, b=2, H=4, P=3, N=5, G=2, chunk=8,
         lengths=[13, 20], dtype=torch.float32, starts=[[5, 13, 20], [13]], **ALL_OPTIONS),
    dict(name="initial_states, D [H], dt_limit", seed=2, b=2, H=4, P=4, N=3, G=1, chunk=8,
         lengths=[31, 17], dtype=torch.float32, D="h", init=True, limit=True),
    dict(name="no options", seed=3, b=1, H=2, P=4, N=4, G=2, chunk=16, lengths=[16, 16],
         dtype=torch.float32),
    # exact up to rounding: float64 against float64 at 1e-10
    dict(name="float64", seed=4, b=2, H=4, P=3, N=5, G=2, chunk=8, lengths=[10, 26],
         dtype=torch.float64, starts=[[3, 10], [30]], idx_dtype=torch.int32, **ALL_OPTIONS),
    dict(name="bfloat16", seed=5, b=2, H=4, P=8, N=8, G=2, chunk=16, lengths=[24, 40],
         dtype=torch.bfloat16, starts=[[24, 50]], **ALL_OPTIONS),
]

SCAN_4 = [
    # uneven, an empty shard (rank 1); resets at rank 2's first token (after the empty
    # shard), inside rank 2, at rank 3's first token and inside it; one row a single
    # sequence over every shard
    dict(name="uneven, empty shard, seq_idx", seed=11, b=2, H=4, P=3, N=5, G=2, chunk=4,
         lengths=[7, 0, 19, 5], dtype=torch.float32, starts=[[7, 12, 26, 28], [2]],
         **ALL_OPTIONS),
    dict(name="uneven, initial_states, no seq_idx", seed=12, b=2, H=3, P=4, N=3, G=3, chunk=8,
         lengths=[1, 30, 2, 11], dtype=torch.float32, init=True, z=True, limit=True),
]

LAYER_2 = [
    dict(name="Mamba2, seq_idx", seed=21, b=2, lengths=[9, 14], starts=[[4, 9, 15], [9]]),
    dict(name="Mamba2, D per channel, norm before gate", seed=22, b=1, lengths=[20, 5],
         D_has_hdim=True, norm_before_gate=True, ngroups=1, dt_limit=(0.01, 0.5)),
    dict(name="Mamba2 under DDP", seed=23, b=2, lengths=[12, 11], wrap="ddp",
         starts=[[6, 12], []]),
    dict(name="Mamba2 under FSDP2", seed=24, b=1, lengths=[8, 13], wrap="fsdp"),
    # a conv of width 1 has no halo: the layout exchange still gives the scan its carry
    dict(name="Mamba2, d_conv 1, seq_idx", seed=25, b=2, lengths=[11, 6], d_conv=1,
         starts=[[11], [4]]),
]

LAYER_4 = [
    # shards shorter than the halo (d_conv - 1 = 3) and an empty one: rank 3's halo comes
    # from ranks 0 and 1 across the empty rank 2
    dict(name="Mamba2, tiny and empty shards, seq_idx", seed=31, b=2, lengths=[2, 1, 0, 21],
         starts=[[1, 3, 10], [2]]),
    dict(name="Mamba2 under DDP, uneven", seed=32, b=1, lengths=[10, 7, 9, 6], wrap="ddp",
         starts=[[10, 20]]),
]


def _drawn_specs(n, seed, world, layer=False):
    """n problems drawn at random (seeded) for `world` ranks: uneven shard lengths (0, 1
    and shorter than a chunk or the conv's halo included), sequence starts anywhere
    (shard boundaries, a shard's last token, after an empty shard), each option of the
    scan (or the layer) on or off, float32 and float64."""
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        lengths = [rng.choice([0, 1, 2, 3, 5, 8, 13]) for _ in range(world)]
        if not sum(lengths):
            lengths[-1] = 4
        L, b = sum(lengths), rng.choice([1, 2])
        bounds = [sum(lengths[:j]) for j in range(1, world)]
        starts = None
        if rng.random() < 0.6:  # per row: boundaries, random places and the last token
            starts = [sorted({p for p in rng.sample(bounds + [rng.randrange(L), L - 1], k=rng.randint(1, 3))
                              if 0 < p < L}) for _ in range(b)]
        spec = dict(name=f"drawn {i}", seed=1000 * seed + i, b=b, lengths=lengths, starts=starts)
        if layer:
            spec.update(d_conv=rng.choice([1, 2, 3, 4]), ngroups=rng.choice([1, 2]), chunk=rng.choice([1, 4, 16]),
                        D_has_hdim=rng.random() < 0.5, rmsnorm=rng.random() < 0.7,
                        norm_before_gate=rng.random() < 0.5,
                        dt_limit=rng.choice([(0.0, float("inf")), (0.01, 0.5)]))
        else:
            G = rng.choice([1, 2])
            spec.update(H=G * rng.choice([1, 2]), P=rng.choice([1, 3, 4]), N=rng.choice([1, 3, 5]), G=G,
                        chunk=rng.choice([1, 2, 4, 8, 16]), dtype=rng.choice([torch.float32, torch.float64]),
                        idx_dtype=rng.choice([torch.int32, torch.int64]),
                        D=rng.choice([None, "h", "hdim"]), z=rng.random() < 0.5, dt_bias=rng.random() < 0.5,
                        init=rng.random() < 0.5, softplus=rng.random() < 0.5, limit=rng.random() < 0.3)
        specs.append(spec)
    return specs


@pytest.mark.parametrize("world", [2, 3])
def test_scan_matches_one_process_over_drawn_problems(world):
    """Twelve random problems a world size (3 ranks: an odd group), in one run of workers."""
    _run(world, cases.scan_cases, _drawn_specs(12, 50 + world, world))


@pytest.mark.parametrize("world", [3])
def test_mamba2_matches_one_process_over_drawn_problems(world):
    _run(world, cases.layer_cases, _drawn_specs(8, 60 + world, world, layer=True))


VOLUME_2 = [dict(name="seq_idx", seed=41, b=2, shard_lengths=[8, 64], with_seq_idx=True),
            dict(name="no seq_idx", seed=42, b=1, shard_lengths=[5, 80])]


def _run(world, fn, specs):
    harness.run(world, fn, specs, timeout=TIMEOUT)
    assert harness.alive(harness.LAST_PIDS) == []


@pytest.mark.parametrize("world,specs", [(2, SCAN_2), (4, SCAN_4)], ids=["world2", "world4"])
def test_scan_matches_one_process(world, specs):
    _run(world, cases.scan_cases, specs)


@pytest.mark.parametrize("world,specs", [(2, LAYER_2), (4, LAYER_4)], ids=["world2", "world4"])
def test_mamba2_matches_one_process(world, specs):
    _run(world, cases.layer_cases, specs)


@pytest.mark.parametrize("b,L,H,P,G,N", [(2, 7, 4, 3, 2, 5), (1, 9, 6, 2, 1, 4), (2, 5, 6, 3, 3, 2)])
def test_shard_state_is_the_weighted_outer_product_sum(b, L, H, P, G, N):
    """The shard's own final state (every rank but the last computes it before the
    exchange): Σ_t w[t, h] · x_t[h] ⊗ B_t[g(h)] against an einsum, in float64, and its
    gradients by gradcheck (x contiguous and strided; several heads a group)."""
    from baracuda_torch.distributed import _ShardState
    g = torch.Generator().manual_seed(b * 100 + L)
    x = torch.randn(b, L, H, P, generator=g, dtype=torch.float64, requires_grad=True)
    xs = torch.randn(b, L, 2 * H, P, generator=g, dtype=torch.float64)[:, :, ::2].requires_grad_()
    w = torch.rand(b, L, H, generator=g, dtype=torch.float64, requires_grad=True)
    B = torch.randn(b, L, G, N, generator=g, dtype=torch.float64, requires_grad=True)
    for xx in (x, xs):
        ref = torch.einsum("blh,blhp,blhn->bhpn", w, xx, B.repeat_interleave(H // G, dim=2))
        torch.testing.assert_close(_ShardState.apply(xx, w, B), ref, rtol=1e-12, atol=1e-12)
        assert torch.autograd.gradcheck(_ShardState.apply, (xx, w, B))


def test_bytes_per_layer_do_not_grow_with_L():
    _run(2, cases.volume_cases, VOLUME_2)


def test_harness_reports_a_failure_and_leaves_no_process():
    with pytest.raises(Exception, match="deliberate failure on rank 1"):
        harness.run(2, cases.fail_on_rank, 1, timeout=TIMEOUT)
    assert harness.LAST_PIDS and harness.alive(harness.LAST_PIDS) == []


def test_harness_timeout_kills_every_worker():
    with pytest.raises(TimeoutError):
        harness.run(2, cases.hang, timeout=1.0)
    assert harness.LAST_PIDS and harness.alive(harness.LAST_PIDS) == []
