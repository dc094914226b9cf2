"""NumPy reference backend and oracle on poisoned, guard-banded buffers; block id validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvlayout as K
from kvlayout.errors import BlockIdError, LayoutBufferError
from kvlayout.testing import random_spec

GUARD = 4096


def run_reference(table: K.SegmentTable, ids: object) -> K.reference.ZeroCheck:
    data = K.poison_pattern(GUARD + table.total_bytes + GUARD)
    assert not (data == 0).any()
    be = K.ReferenceBackend.from_host(table, data, offset=GUARD)
    be.zero(ids)
    return K.reference.compare_to_contract(
        data, be.to_host(), table, ids if isinstance(ids, np.ndarray) else list(ids), origin=GUARD
    )  # type: ignore[call-overload]


@pytest.mark.parametrize("name", sorted(K.PRESETS))
def test_presets_exact(name: str) -> None:
    t = K.plan(K.preset(name))
    n = t.num_blocks
    for ids in ([0], [n - 1], list(range(n)), [3, 3, 1, n - 1, 1], []):
        chk = run_reference(t, ids)
        assert chk.matches, chk.describe()
        assert chk.zeroed_bytes == len(set(ids)) * t.bytes_per_block


def test_dsv4_zero_report_numbers() -> None:
    t = K.plan(K.preset("dsv4-test"))
    chk = run_reference(t, [0, 5, 99])
    assert chk.matches
    assert chk.zeroed[:2].tolist() == [[0, 37_376], [37_440, 74_816]]
    assert chk.zeroed_bytes == 448_512
    assert chk.zeroed[-1].tolist() == [112_320 + 99 * 149_760, 14_975_936]


@given(st.integers(0, 2**32 - 1), st.data())
def test_random_specs_exact(seed: int, data: st.DataObject) -> None:
    spec = random_spec(seed)
    t = K.plan(spec)
    ids = data.draw(st.lists(st.integers(0, spec.num_blocks - 1), max_size=8))
    chk = run_reference(t, ids)
    assert chk.matches, chk.describe()
    # coalesced and uncoalesced tables clear the same bytes
    chk2 = run_reference(t.coalesced(), ids)
    assert (chk2.zeroed == chk.zeroed).all() and chk2.zeroed.shape == chk.zeroed.shape


def test_oracle_detects_wrong_writes() -> None:
    t = K.plan(K.preset("dsv4-test"))
    data = K.poison_pattern(GUARD + t.total_bytes + GUARD)
    after = data.copy()
    after[GUARD : GUARD + 37_376 + 4] = 0  # 4-byte overrun into the padding
    after[GUARD - 1] = 0  # guard band hit
    chk = K.reference.compare_to_contract(data, after, t, [0], origin=GUARD)
    assert not chk.matches
    assert chk.extra.tolist() == [[-1, 0], [37_376, 37_380]]
    assert len(chk.missing) == 3


@pytest.mark.parametrize(
    "ids, match",
    [
        ([0, 100], r"block_ids\[1\] = 100: outside \[0, 100\)"),
        ([-1], r"block_ids\[0\] = -1"),
        ([True], r"block_ids\[0\] = True: must be an integer"),
        ([1.0], r"block_ids\[0\] = 1.0"),
        (np.array([1.5]), "dtype = float64"),
        (np.array([True]), "dtype = bool"),
        (np.array([[1]]), "must be 1-D"),
        ("0,1", "must be a list"),
        (3, "must be a list"),
    ],
)
def test_bad_block_ids_rejected_nothing_written(ids: object, match: str) -> None:
    t = K.plan(K.preset("dsv4-test"))
    buf = K.poison_pattern(t.total_bytes)
    before = buf.copy()
    be = K.ReferenceBackend(t, buf)
    with pytest.raises(BlockIdError, match=match):
        be.zero(ids)
    assert (buf == before).all()


def test_accepted_id_forms() -> None:
    assert K.normalize_block_ids((1, np.int32(2)), 4).tolist() == [1, 2]
    assert K.normalize_block_ids(np.array([3, 3], np.uint16), 4).tolist() == [3, 3]
    assert K.normalize_block_ids([], 4).size == 0


def test_buffer_checks() -> None:
    t = K.plan(K.preset("dsv4-test"))
    with pytest.raises(
        LayoutBufferError, match=r"buffer.nbytes = 14975999: smaller than offset 0 \+ total_bytes 14976000"
    ):
        K.ReferenceBackend(t, np.zeros(t.total_bytes - 1, np.uint8))
    with pytest.raises(LayoutBufferError, match="numpy.ndarray"):
        K.ReferenceBackend(t, [0] * 10)
    with pytest.raises(LayoutBufferError, match="offset = 2"):
        K.ReferenceBackend(t, np.zeros(t.total_bytes + 8, np.uint8), offset=2)
    ro = np.zeros(t.total_bytes, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(LayoutBufferError, match="writeable"):
        K.ReferenceBackend(t, ro)


def test_any_dtype_buffer() -> None:
    t = K.plan(K.preset("dsv4-test"))
    buf = K.poison_pattern(t.total_bytes).view(np.float32).copy()
    K.zero_blocks_numpy(buf, t, [7])
    chk = K.reference.compare_to_contract(K.poison_pattern(t.total_bytes), buf, t, [7])
    assert chk.matches


def test_reference_refuses_out_of_bounds_table() -> None:
    bad = K.SegmentTable(1024, 4, (K.Segment(0, 512, 512),))
    with pytest.raises(K.TableError, match="outside the buffer"):
        K.zero_blocks_numpy(np.ones(1024, np.uint8), bad, [0])


def test_reference_clears_exactly_the_oracles_bytes() -> None:
    """expected_zeroed and the in-place zeroer against per-block bytes written from the contract."""
    from kvlayout.testing import random_safe_table

    from . import oracles as O

    rng = np.random.default_rng(19)
    for seed in O.seeds(150):
        t = random_safe_table(seed)
        ids = sorted({int(x) for x in rng.integers(0, t.num_blocks, 3)})
        want = set().union(*(O.block_bytes(t, b) for b in ids))
        assert O.union_bytes([tuple(r) for r in K.expected_zeroed(t, ids).tolist()]) == want
        buf = K.poison_pattern(t.total_bytes + 8)
        before = buf.copy()
        K.zero_blocks_numpy(buf, t, ids + ids[:1])
        changed = set(np.flatnonzero(buf != before).tolist())
        assert changed == want and not buf[sorted(want)].any(), (t, ids)
        ranges = K.expected_zeroed(t, ids)
        assert ranges.dtype == np.int64 and ranges.shape[1:] == (2,)
        assert (ranges[1:, 0] > ranges[:-1, 1]).all()  # merged: sorted, neither touching nor overlapping
    assert K.expected_zeroed(K.SegmentTable(0, 2, ()), [1]).shape == (0, 2)
    assert K.expected_zeroed(K.plan(K.preset("dsv4-test")), []).shape == (0, 2)
