"""The cuda backend's per-step host path (issue 15): C-speed id checks, staging, small-batch units.

Runs under Triton's interpreter in CI and natively on a GPU (where host batches replay CUDA
graphs; ``graphs=False`` launches eagerly): both must give the contract's bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvlayout as K

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")

GRAPHS = [True, False] if kc.MODE == "native" else [False]


def setup(
    num_blocks: int = 40, **kw: object
) -> tuple[K.SegmentTable, np.ndarray, torch.Tensor, kc.CudaZeroer]:
    t = K.plan(K.preset("dsv4-test").with_num_blocks(num_blocks))
    data = K.poison_pattern(t.total_bytes)
    buf = torch.from_numpy(data.copy()).to(kc.DEVICE_TYPE)
    return t, data, buf, kc.CudaZeroer(t, buf, **kw)


def check(t: K.SegmentTable, data: np.ndarray, buf: torch.Tensor, ids: list[int]) -> None:
    chk = K.reference.compare_to_contract(data, buf.cpu().numpy(), t, ids)
    assert chk.matches, chk.describe()


@pytest.mark.parametrize("graphs", GRAPHS)
def test_lists_tuples_arrays_and_numpy_scalars(graphs: bool) -> None:
    t, data, buf, z = setup(max_batch=128, graphs=graphs)
    done: set[int] = set()
    for ids in (
        [3],
        (5, 5, 39),
        np.array([7, 0], np.int32),
        [np.int64(11), 12],
        torch.tensor([13]),
        [14 + (i % 26) for i in range(80)],
        [],
    ):
        z.zero(ids)
        done |= {int(i) for i in ids}
    if kc.MODE == "native":
        torch.cuda.synchronize()
    check(t, data, buf, sorted(done))
    z.check()


@pytest.mark.parametrize("graphs", GRAPHS)
@pytest.mark.parametrize(
    ("ids", "field"),
    [
        ([0, 40], r"block_ids\[1\]"),
        ([-1], r"block_ids\[0\]"),
        ([1, True], r"block_ids\[1\]"),
        ([2, 1.0], r"block_ids\[1\]"),
        ([2**70], r"block_ids\[0\]"),
        ([i % 40 for i in range(65)] + [-3], r"block_ids\[65\]"),
        ([5] * 70 + [True], r"block_ids\[70\]"), ([5] * 5000 + [True], r"block_ids\[5000\]"),
     ([5] * 5000 + [2**64], r"block_ids\[5000\]"), ([5] * 5000 + [40], r"block_ids\[5000\]"),
        ([5] * 70 + [2.0], r"block_ids\[70\]"),
        ([0] * 9, "max_batch"),
    ],
)
def test_bad_lists_name_the_element_and_write_nothing(graphs: bool, ids: list[object], field: str) -> None:
    t, data, buf, z = setup(max_batch=8 if len(ids) == 9 else 8192, graphs=graphs)
    with pytest.raises(K.BlockIdError, match=field):
        z.zero(ids)
    z.zero([4])  # the staging buffers are free again: a good batch still goes through
    if kc.MODE == "native":
        torch.cuda.synchronize()
    check(t, data, buf, [4])


def test_host_ids_of_every_list_path_are_staged_exactly() -> None:
    """Short lists, lists up to 4,096 (NumPy infers the dtype) and longer ones (typed first)."""
    t, _, _, z = setup(max_batch=6000)
    rng = np.random.default_rng(2)
    for k in (1, 64, 65, 4096, 4097, 6000):
        ids = rng.integers(0, t.num_blocks, k).tolist()
        dst = np.full(6000, -7, np.int64)
        assert z._fill(dst, ids) == k
        assert dst[:k].tolist() == ids and (dst[k:] == -7).all()
        ids[-1] = np.int64(3)  # a NumPy scalar among Python ints: the exact path, same result
        assert z._fill(dst, ids) == k and dst[k - 1] == 3


def test_bad_group_raises_before_anything_is_written() -> None:
    t, data, buf, z = setup()
    with pytest.raises(K.TableError):
        z.zero([1], "no-such-group")
    check(t, data, buf, [])


def test_small_batches_use_smaller_units_until_the_grid_fills() -> None:
    t, data, buf, z = setup(max_programs=64)
    want_items = int(kc.zeroer.FILL_WAVES * 64)
    whole = z.plan_for_batch(10_000)
    assert whole.plan.chunk_words == kc.zeroer.DEFAULT_CHUNK_WORDS
    one = z.plan_for_batch(1)
    assert one.plan.chunk_words == min(kc.zeroer.SMALL_CHUNKS)  # no unit size gives 1 id enough items
    assert one.plan.units_per_block > whole.plan.units_per_block
    for k in (1, 2, 3, 5, 16, 17):  # each bucket picks the largest units that give enough items
        dp = z.plan_for_batch(k)
        bucket = 1 << (k - 1).bit_length()
        fits = [
            c
            for c in kc.zeroer.SMALL_CHUNKS
            if bucket * kc.plan_units(t.coalesced(), c).units_per_block >= want_items
        ]
        want = fits[0] if fits else min(kc.zeroer.SMALL_CHUNKS)
        if bucket * whole.plan.units_per_block >= want_items:
            want = whole.plan.chunk_words
        assert dp.plan.chunk_words == want, (k, dp.plan.chunk_words, want)
    off = kc.CudaZeroer(t, buf, small_batch=False)
    assert off.plan_for_batch(1).plan.chunk_words == kc.zeroer.DEFAULT_CHUNK_WORDS
    z.zero([9])  # small units on the one-shot (units, ids) grid: exact bytes
    z.zero(list(range(10, 40)))  # 30 ids: the bigger units, one program per work item
    if kc.MODE == "native":
        torch.cuda.synchronize()
    check(t, data, buf, list(range(9, 40)))


def test_option_types_are_checked() -> None:
    t, _, buf, _ = setup()
    for name in ("graphs", "small_batch"):
        with pytest.raises(K.BackendError, match=name):
            kc.CudaZeroer(t, buf, **{name: 1})
