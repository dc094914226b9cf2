"""torch path of sharded zeroing: one CudaZeroer per shard buffer.

Under Triton's interpreter on the CPU, natively on a GPU: every test runs in both modes.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K
from kvlayout.sharding import ShardedLayout, shard_spec

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")

GUARD = 512
DEV = kc.DEVICE_TYPE


def shard_buffers(lay: ShardedLayout, seed: int = 7) -> tuple[np.ndarray, list[torch.Tensor]]:
    """A poisoned gathered image and one guarded tensor per shard holding its slice at offset GUARD."""
    data = K.poison_pattern(lay.gathered_bytes + 2 * GUARD * lay.num_shards, seed=seed)
    bufs = []
    for k in range(lay.num_shards):
        n = lay.shard_bytes + 2 * GUARD
        bufs.append(torch.from_numpy(data[k * n : (k + 1) * n].copy()).to(DEV))
    return data, bufs


def check_equal_reference(
    lay: ShardedLayout, bufs: list[torch.Tensor], before: list[np.ndarray], ids: object
) -> None:
    """Shard by shard: what changed is the local contract of the ids routed there, and nothing else."""
    for k, local in enumerate(lay.route(ids)):
        after = bufs[k].cpu().numpy()
        chk = K.reference.compare_to_contract(before[k], after, lay.local_table, local, origin=GUARD)
        assert chk.matches, (k, chk.describe())


LAYOUTS = {
    "block_1d": lambda: shard_spec(K.preset("dsv4-test").with_num_blocks(16), {"dp": 4}, block_axes=("dp",)),
    "replicated_1d": lambda: shard_spec(
        K.preset("llama-8b").with_num_blocks(6), {"tp": 4}, head_axes=("tp",)
    ),
    "block_2d": lambda: shard_spec(
        K.preset("dsv4").with_num_blocks(8), {"dp": 2, "tp": 2}, block_axes=("dp",), head_axes=("tp",)
    ),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("kind", ["host", "device"])
def test_both_modes_equal_reference_shard_by_shard(name: str, kind: str) -> None:
    lay = LAYOUTS[name]()
    _, bufs = shard_buffers(lay)
    z = kc.ShardedCudaZeroer(lay, bufs, offset=GUARD)
    n = lay.num_blocks
    before = [b.cpu().numpy().copy() for b in bufs]
    seen: list[int] = []
    for ids in ([0], [n - 1, 0, n // 2, n // 2], list(range(1, n, 3)), [n // 3]):
        z.zero(torch.tensor(ids, device=DEV) if kind == "device" else ids)
        seen += ids
        check_equal_reference(lay, bufs, before, seen)  # everything changed so far: the union of the batches
    z.check()


def test_ids_owned_by_one_shard_only() -> None:
    lay = LAYOUTS["block_1d"]()
    _, bufs = shard_buffers(lay)
    z = kc.ShardedCudaZeroer(lay, bufs, offset=GUARD)
    before = [b.cpu().numpy().copy() for b in bufs]
    z.zero(torch.tensor([8, 9, 11, 8], dtype=torch.int32, device=DEV))  # all on shard 2 (blocks 8..11)
    z.check()
    changed = [bool((b.cpu().numpy() != before[k]).any()) for k, b in enumerate(bufs)]
    assert changed == [False, False, True, False]
    check_equal_reference(lay, bufs, before, [8, 9, 11])


@pytest.mark.parametrize("bad", [[3, 16], [-1, 2], [True]])
def test_bad_host_ids_write_nothing_anywhere(bad: list) -> None:
    lay = LAYOUTS["block_1d"]()
    _, bufs = shard_buffers(lay)
    before = [b.cpu().numpy().copy() for b in bufs]
    z = kc.ShardedCudaZeroer(lay, bufs, offset=GUARD)
    with pytest.raises(K.BlockIdError):
        z.zero(bad)
    assert all(np.array_equal(b.cpu().numpy(), before[k]) for k, b in enumerate(bufs))


def test_bad_device_ids_write_nothing_on_any_shard_then_check_raises() -> None:
    lay = LAYOUTS["block_1d"]()
    _, bufs = shard_buffers(lay)
    before = [b.cpu().numpy().copy() for b in bufs]
    z = kc.ShardedCudaZeroer(lay, bufs, offset=GUARD)
    # the device path: what zero() does with a CUDA tensor natively (under the interpreter
    # zero() validates CPU tensors on the host first: tests/test_backend_hardening.py)
    launch = z.zero if kc.MODE == "native" else z._zero_device
    launch(torch.tensor([1, 5, 16, -3], device=DEV))
    check_equal_reference(lay, bufs, before, [1, 5])  # 16 and -3 wrote nothing on any shard
    with pytest.raises(
        K.BlockIdError, match=r"outside \[0, 16\) \(e\.g\. (16|-3)\); they wrote nothing on any shard"
    ):
        z.check()
    z.check()  # every shard's flag was reset
    launch(torch.tensor([99], dtype=torch.int32, device=DEV))
    check_equal_reference(lay, bufs, before, [1, 5])
    with pytest.raises(K.BlockIdError, match=r"e\.g\. 99"):
        z.check()


def test_one_rank_holds_one_shard() -> None:
    lay = shard_spec(
        K.preset("dsv4-test").with_num_blocks(8), {"dp": 2, "tp": 2}, block_axes=("dp",), head_axes=("tp",)
    )
    _, bufs = shard_buffers(lay)
    before = [b.cpu().numpy().copy() for b in bufs]
    z = kc.ShardedCudaZeroer.for_rank(lay, bufs[3], rank=3, offset=GUARD)  # dp=1, tp=1: blocks 4..7
    assert z.shards == (3,)
    z.zero([0, 5, 7])
    for k in range(3):
        assert np.array_equal(bufs[k].cpu().numpy(), before[k])
    after = bufs[3].cpu().numpy()
    chk = K.reference.compare_to_contract(before[3], after, lay.local_table, [1, 3], origin=GUARD)
    assert chk.matches, chk.describe()


def test_buffer_errors() -> None:
    lay = LAYOUTS["block_1d"]()
    _, bufs = shard_buffers(lay)
    with pytest.raises(K.LayoutBufferError, match="buffers: 3 given for 4 shards"):
        kc.ShardedCudaZeroer(lay, bufs[:3])
    with pytest.raises(K.LayoutBufferError, match="shard = 4"):
        kc.ShardedCudaZeroer(lay, {4: bufs[0]})
    with pytest.raises(K.LayoutBufferError, match="smaller than offset 0"):
        kc.ShardedCudaZeroer(lay, {0: bufs[0][:100]})
    with pytest.raises(K.LayoutBufferError, match="rank = None: torch.distributed is not initialised"):
        kc.ShardedCudaZeroer.for_rank(lay, bufs[0])
    z = kc.ShardedCudaZeroer(lay, {1: bufs[1]}, offset=GUARD)
    with pytest.raises(K.BlockIdError, match="dtype = torch.float32"):
        z.zero(torch.tensor([1.0], device=DEV))


def _rank_main(rank: int, world: int, init: str, out_dir: str) -> None:
    """One torch.distributed rank: builds its zeroer from the process group's rank, zeroes its shard."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": world}, block_axes=("dp",))
    data = K.poison_pattern(lay.shard_bytes, seed=rank)
    buf = torch.from_numpy(data.copy()).to(DEV)
    z = kc.ShardedCudaZeroer.for_rank(lay, buf)  # rank from torch.distributed; no collective below
    z.zero([0, 3, 5, 6])
    z.zero(torch.tensor([7], device=DEV))
    z.check()
    np.save(f"{out_dir}/rank{rank}.npy", buf.cpu().numpy())
    dist.destroy_process_group()


def test_torch_distributed_ranks_each_zero_their_own_shard(tmp_path: object) -> None:
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(_rank_main, args=(world, f"{tmp_path}/init", str(tmp_path)), nprocs=world, join=True)
    lay = shard_spec(K.preset("dsv4-test").with_num_blocks(8), {"dp": world}, block_axes=("dp",))
    for rank, local in enumerate(lay.route([0, 3, 5, 6, 7])):
        got = np.load(f"{tmp_path}/rank{rank}.npy")
        chk = K.reference.compare_to_contract(
            K.poison_pattern(lay.shard_bytes, seed=rank), got, lay.local_table, local
        )
        assert chk.matches, (rank, chk.describe())


def test_route_kernel_packs_owned_ids_across_chunks() -> None:
    """launch_routed over 2,600 ids (3 chunks of 1,024): owned ids packed and counted, others skipped."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    data = K.poison_pattern(t.total_bytes)
    buf = torch.from_numpy(data.copy()).to(DEV)
    z = kc.CudaZeroer(t, buf)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 64, 2600)  # a 64-block global pool; this buffer owns [16, 24)
    ids[[5, 1500]] = [64, -2]  # two bad ids
    z.launch_routed(torch.from_numpy(ids).to(DEV), id_lo=16, id_limit=64)
    own = ids[(ids >= 16) & (ids < 24)]
    slot = z._slots[0]  # one thread, one call: the first per-call slot was used
    assert len(z._slots) == 1 and not slot.busy
    assert int(slot.count[0]) == own.size
    assert sorted(slot.routed[: own.size].tolist()) == sorted((own - 16).tolist())
    chk = K.reference.compare_to_contract(data, buf.cpu().numpy(), t, np.unique(own - 16))
    assert chk.matches, chk.describe()
    with pytest.raises(K.BlockIdError):
        z.check()
