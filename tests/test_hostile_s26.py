"""Hostile pass 26 (/tmp/h26): the core and cuda findings, each test failing on the code before its fix.

F4: pass 25 read the *group argument* of per-group zeroing as a plain str, but not the rows' own group
names: a row (or a planned group) named by a str subclass whose ``__eq__`` said it was every group passed
``verify`` and was zeroed with group ``a``'s rows, by the contract, the reference, cuda and Pallas alike
(conformance could not see it: the contract was wrong the same way). F10: nested-tensor ids raised torch's
raw error while the refusal was being written. F6: a buffer whose storage was shrunk behind the tensor
raised torch's raw error (no bytes written: torch's own check)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, LayoutBufferError
from kvlayout.native import NativeCacheSpec, NativeLeaf
from kvlayout.spec import FullAttentionSpec, GroupSpec, KVCacheSpec
from kvlayout.table import Segment, SegmentTable


class Liar(str):
    """A group name equal to every string (its hash is the plain one's)."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return str.__hash__(self)


def _table() -> SegmentTable:
    """Group ``a`` owns [0, 64) of each 256 B block, group ``b`` (named by a Liar) [128, 192)."""
    rows = (Segment(0, 256, 64, "a", "la"), Segment(128, 256, 64, Liar("b"), "lb"))
    return SegmentTable(256 * 4, 4, rows)


def test_f4_row_group_names_are_plain_strings() -> None:
    t = _table()
    assert [type(s.group) for s in t.segments] == [str, str]
    assert [s.group for s in t.for_group("a").segments] == ["a"]
    assert K.expected_zeroed(t, [1], group="a").tolist() == [[256, 320]]
    assert K.expected_zeroed(t, [1], group="b").tolist() == [[384, 448]]
    buf = K.poison_pattern(t.total_bytes)
    before = buf.copy()
    K.ReferenceBackend(t, buf).zero([1], group="a")
    assert K.changed_ranges(before, buf).tolist() == [[256, 320]]
    # the layer and part names too (they label rows in messages and JSON)
    s = Segment(0, 256, 64, "a", Liar("la"), Liar("page"))
    assert (type(s.layer), type(s.part)) == (str, str)


def test_f4_cuda_zeroes_only_the_groups_rows() -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    t = _table()
    host = K.poison_pattern(t.total_bytes)
    buf = torch.from_numpy(host.copy())
    kc.CudaZeroer(t, buf, graphs=False).zero([1], group="a")
    assert K.changed_ranges(host, buf.numpy()).tolist() == [[256, 320]]


def test_f4_pallas_zeroes_only_the_groups_rows() -> None:
    pytest.importorskip("jax")
    kp = pytest.importorskip("kvlayout.backends.pallas")
    import jax.numpy as jnp

    t = _table()
    host = K.poison_pattern(t.total_bytes)
    out = kp.PallasZeroer(t, group="a")(jnp.asarray(host.view(np.int32).reshape(-1, 128)), [1])
    assert K.changed_ranges(host, np.asarray(out).view(np.uint8).reshape(-1)).tolist() == [[256, 320]]


def test_f4b_a_planned_group_named_by_a_subclass() -> None:
    """Through the planner: groups a (one layer) and b (two) share the first tensor under layer_major."""

    def layer(name: str) -> FullAttentionSpec:
        return FullAttentionSpec(name=name, block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")

    groups = (GroupSpec("a", (layer("a.0"),)), GroupSpec(Liar("b"), (layer("b.0"), layer("b.1"))))
    spec = KVCacheSpec(num_blocks=4, layout="layer_major", groups=groups)
    assert type(spec.groups[1].name) is str
    t = K.plan(spec)
    assert {type(s.group) for s in t.segments} == {str}
    assert K.expected_zeroed(t, [1], group="a").tolist() == [[512, 1024]]
    assert K.expected_zeroed(t, [1], group="b").tolist() == [[512, 1024], [2560, 3072]]
    buf = K.poison_pattern(t.total_bytes)
    before = buf.copy()
    K.ReferenceBackend(t, buf).zero([1], group="a")
    assert K.changed_ranges(before, buf).tolist() == [[512, 1024]]


def test_f4_native_leaf_groups_are_plain_strings() -> None:
    """A native leaf's group (alone or in a tuple) and its name: plain str, so its group's selection is
    made by the plain name's equality."""
    leaf = NativeLeaf(Liar("k"), (4, 8), "int32", Liar("b"))
    assert (type(leaf.name), type(leaf.group)) == (str, str)
    both = NativeLeaf("s", (4, 8), "int32", (Liar("a"), "b"))
    assert [type(g) for g in both.group] == [str, str]
    spec = NativeCacheSpec((NativeLeaf("a0", (4, 8), "int32", "a"), leaf))
    assert [x.name for x in spec.leaves if x.group == "a"] == ["a0"]


def test_f10_nested_ids_refused_by_name() -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    t = K.plan(K.preset("dsv4-test"))
    buf = torch.zeros(t.total_bytes, dtype=torch.uint8)
    z = kc.CudaZeroer(t, buf, graphs=False)
    with warnings.catch_warnings():  # torch's prototype warning for nested tensors (once a process)
        warnings.simplefilter("ignore", UserWarning)
        ids = torch.nested.nested_tensor([torch.tensor([1, 2])])
    for call in (lambda: z.zero(ids), lambda: z.zero_into(z.buffer, ids)):
        with pytest.raises(BlockIdError) as e:
            call()
        assert (e.value.field, e.value.value) == ("block_ids", "nested")
    assert not buf.any()


def test_f6_a_shrunk_storage_is_refused_by_name() -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    t = K.plan(K.preset("dsv4-test"))
    z = kc.CudaZeroer(t, torch.zeros(t.total_bytes, dtype=torch.uint8), graphs=False)
    victim = torch.full((t.total_bytes,), 7, dtype=torch.uint8)
    victim.untyped_storage().resize_(64)
    calls: list[Any] = [
        lambda: kc.CudaZeroer(t, victim, graphs=False),
        lambda: z.zero_into(victim, torch.tensor([t.num_blocks - 1])),
    ]
    for call in calls:
        with pytest.raises(LayoutBufferError) as e:
            call()
        assert (e.value.field, e.value.value) == ("buffer", 64)
    # a view at a storage offset: the bytes before it count (the storage holds offset + size)
    base = torch.zeros(t.total_bytes + 4096, dtype=torch.uint8)
    view = base[4096:]
    base.untyped_storage().resize_(t.total_bytes)
    with pytest.raises(LayoutBufferError) as e:
        kc.CudaZeroer(t, view, graphs=False)
    assert e.value.value == t.total_bytes
