"""Issue 25's fourth and fifth hostile passes: the tests that run JAX (tests/test_hostile_s9.py has the
rest). Apart so that the mutation runs of modules without JAX (scripts/mutation.sh) never start JAX's
threads in a process that then forks: a forked test process deadlocked."""

from __future__ import annotations

import array

import numpy as np
import pytest

import kvlayout as K
from kvlayout.table import Segment, SegmentTable


def test_pallas_apply_narrows_host_ids_of_every_kind_without_wrapping() -> None:
    jnp = pytest.importorskip("jax.numpy")
    torch = pytest.importorskip("torch")
    kp = pytest.importorskip("kvlayout.backends.pallas")

    def zeroed(ids: object) -> tuple[int, list[int]]:
        cz = kp.CacheZeroer([jnp.ones((8, 4, 128), jnp.float32)], "g")
        out, bad = cz.apply([jnp.ones((8, 4, 128), jnp.float32)], ids)
        return int(bad), [i for i in range(8) if float(out[0][i].sum()) == 0]

    big = 2**32 + 3  # block 3 once narrowed
    for ids in ([big], [np.int64(big)], np.array([big]), np.array([2**63], np.uint64)):
        assert zeroed(ids) == (1, []), ids
    assert zeroed(np.array([big, 5])) == (1, [5])
    # torch tensors, array.array and 0-d arrays in a list are no ids (as in __call__; hostile pass 16, L1):
    # refused by name, so none is narrowed either
    for ids in (torch.tensor([big]), [np.array(big)], [torch.tensor(big)], array.array("q", [big])):
        with pytest.raises(K.BlockIdError) as e:
            zeroed(ids)
        assert e.value.field in ("block_ids", "block_ids[0]"), ids


def test_pallas_step_ids_in_a_traced_list_with_host_ids() -> None:
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    kp = pytest.importorskip("kvlayout.backends.pallas")

    @jax.jit
    def step(x: object, i: object) -> object:
        return kp.CacheZeroer([x], "g").apply([x], [i, np.int64(2**32 + 3), 4])

    out, bad = step(jnp.ones((8, 4, 128), jnp.float32), jnp.int32(1))
    assert int(bad) == 1 and [i for i in range(8) if float(out[0][i].sum()) == 0] == [1, 4]
    with pytest.raises(K.BlockIdError) as e:
        kp.zeroer.step_ids([jnp.asarray(1, jnp.int32), "x"])
    assert e.value.field == "block_ids[1]"


def test_pallas_takes_a_narrow_offset() -> None:
    kp = pytest.importorskip("kvlayout.backends.pallas")
    table = SegmentTable(16, 2, (Segment(4, 8, 4),))
    assert kp.PallasZeroer(table, offset=np.int64(0)).offset == 0
