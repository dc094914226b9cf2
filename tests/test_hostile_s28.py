"""Hostile pass 28 (/tmp/h28): the core and cuda findings, each test failing on the code before its fix.

H1: a row's group that was not a str at all (an object equal to every name) stayed the row's group, and
zeroing group ``a`` cleared group ``b``'s rows (contract, reference and cuda alike); the reference took such
an object as its group argument too. H2: a native leaf's group written as a list (the JSON form) was made a
tuple after the str subclasses were cleaned. H3: ``launch_routed`` read a strided ids tensor as dense. H4:
an ids tensor subclass whose ``contiguous()`` returned itself. H5: a buffer re-pointed after the zeroer was
made was never written, and ``zero()`` returned. M1: an unhashable group in ``zero_into`` and negative-view
ids raised raw errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, LayoutBufferError, TableError
from kvlayout.native import NativeCacheSpec, NativeLeaf, expected_zeroed_native, zero_native_numpy
from kvlayout.table import Segment, SegmentTable
from tests.hostile_cases import cuda, device, eight, to_dev, to_host, zeroed_blocks


class AnyGroup:
    """Not a str: equal to every name, with the hash of ``"b"`` and a repr that poses as one."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("b")

    def __repr__(self) -> str:
        return "'b'"


class Liar(str):
    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return str.__hash__(self)


def _two_groups() -> SegmentTable:
    return SegmentTable(1024, 4, (Segment(0, 256, 64, "a", "la"), Segment(128, 256, 64, "b", "lb")))


@pytest.mark.parametrize("key", ["group", "layer", "part"])
@pytest.mark.parametrize("value", [AnyGroup(), ["x"], 3, None])
def test_a_rows_names_are_strings(key: str, value: Any) -> None:
    fields: dict[str, Any] = {"group": "a", "layer": "la", "part": "page", key: value}
    with pytest.raises(TableError, match="must be a string") as e:
        Segment(0, 256, 64, **fields)
    assert e.value.field == f"segment.{key}" and "'b'" not in str(e.value)  # its type, not its own repr


@pytest.mark.parametrize("group", [AnyGroup(), ["a"], 3])
def test_the_group_argument_is_a_string(group: Any) -> None:
    t = _two_groups()
    buf = K.poison_pattern(t.total_bytes)
    before = buf.copy()
    for call in (
        lambda: K.expected_zeroed(t, [1], group=group),
        lambda: t.for_group(group),
        lambda: K.ReferenceBackend(t, buf).zero([1], group=group),
    ):
        with pytest.raises(TableError, match="must be a string or None") as e:
            call()
        assert e.value.field == "group"
    assert np.array_equal(buf, before)
    assert K.expected_zeroed(t, [1], group="a").tolist() == [[256, 320]]


@pytest.mark.parametrize("group", [[Liar("b")], (Liar("b"),)])
def test_a_leafs_group_list_is_cleaned(group: Any) -> None:
    class Tup(tuple):  # type: ignore[type-arg]
        def __contains__(self, item: object) -> bool:
            return True

    for g in (group, Tup(group)):
        a = NativeLeaf("ka", (4, 64), "int32", "a")
        b = NativeLeaf("kb", (4, 64), "int32", g)
        assert type(b.group) is tuple and all(type(x) is str for x in b.group)
        spec = NativeCacheSpec([a, b])
        assert spec.zeroed_mask("a") == (True, False)
        arrs = [np.ones((4, 64), np.int32), np.ones((4, 64), np.int32)]
        zero_native_numpy(arrs, spec, [1], group="a")
        assert (arrs[1] == 1).all() and (arrs[0][1] == 0).all()
        assert expected_zeroed_native(spec, [1], group="a")["kb"].tolist() == []


def test_launch_routed_reads_the_ids_a_strided_tensor_holds() -> None:
    torch, kc = cuda()
    t = eight()
    every = torch.arange(8, dtype=torch.int64, device=device())
    for ids, want in ((every[::3], [0, 3, 6]), (every.view(2, 4)[:, 1], [1, 5])):
        host = K.poison_pattern(t.total_bytes)
        buf = to_dev(torch.from_numpy(host.copy()))
        z = kc.CudaZeroer(t, buf, graphs=False)
        z.launch_routed(ids, 0, 8)
        z.check()
        assert zeroed_blocks(host, to_host(buf)) == want
    with pytest.raises(BlockIdError, match="a broadcast view"):  # refused since pass 33
        z.launch_routed(to_dev(torch.tensor([3])).expand(4), 0, 8)


def test_ids_whose_storage_was_shrunk_are_refused() -> None:
    torch, kc = cuda()
    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)
    for call in ("zero", "launch_routed", "zero_into"):
        ids = torch.tensor([1, 2, 3, 4], dtype=torch.int64, device=device())  # device ids
        ids.untyped_storage().resize_(8)
        with pytest.raises(BlockIdError, match="fewer bytes") as e:
            if call == "zero":
                z.zero(ids)
            elif call == "launch_routed":
                z.launch_routed(ids, 0, 8)
            else:
                z.zero_into(to_dev(torch.from_numpy(host.copy())), ids)
        assert e.value.field == "block_ids"
    assert np.array_equal(to_host(buf), host)


def test_an_ids_tensor_subclass_is_refused() -> None:
    torch, kc = cuda()

    class T(torch.Tensor):
        def contiguous(self, *a: Any, **k: Any) -> Any:
            return self

    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)
    ids = torch.tensor([1, 7, 2, 7], dtype=torch.int64, device=device()).as_subclass(T)[::2]
    for call in (lambda: z.zero(ids), lambda: z.launch_routed(ids, 0, 8),
                 lambda: z.zero_into(to_dev(torch.from_numpy(host.copy())), ids)):
        with pytest.raises(BlockIdError, match="plain torch.Tensor") as e:
            call()
        assert e.value.field == "block_ids"
    assert np.array_equal(to_host(buf), host)


def test_a_buffer_re_pointed_after_the_zeroer_was_made_is_refused() -> None:
    torch, kc = cuda()
    t = eight()
    host = K.poison_pattern(t.total_bytes)
    buf = to_dev(torch.from_numpy(host.copy()))
    z = kc.CudaZeroer(t, buf, graphs=False)
    buf.set_(to_dev(torch.from_numpy(host.copy())).untyped_storage(), 0, buf.shape)
    with pytest.raises(LayoutBufferError, match="re-pointed") as e:
        z.zero([1])
    assert e.value.field == "buffer.data_ptr" and np.array_equal(to_host(buf), host)
    p = torch.nn.Parameter(to_dev(torch.from_numpy(host.copy())), requires_grad=False)
    z = kc.CudaZeroer(t, p, graphs=False)
    p.data = to_dev(torch.from_numpy(host.copy()))
    for call in (lambda: z.zero([1]), lambda: z.launch_routed(to_dev(torch.tensor([1])), 0, 8)):
        with pytest.raises(LayoutBufferError, match="re-pointed"):
            call()
    assert np.array_equal(to_host(p), host)
    z = kc.CudaZeroer(t, buf, graphs=False)  # a zeroer of the tensor as it is now writes it
    z.zero([1])
    assert zeroed_blocks(host, to_host(buf)) == [1]


def test_bad_groups_and_negative_views_are_named() -> None:
    torch, kc = cuda()
    t = eight()
    z = kc.CudaZeroer(t, torch.zeros(512, dtype=torch.int32, device=device()), graphs=False)
    other = torch.ones(512, dtype=torch.int32, device=device())
    for g in (["a"], {"a": 1}):
        for call in (lambda g=g: z.zero_into(other, to_dev(torch.tensor([1])), group=g),
                     lambda g=g: z.zero_into(other, to_dev(torch.tensor([], dtype=torch.int64)), group=g),
                     lambda g=g: z.plan_for_batch(4, g)):
            with pytest.raises(TableError, match="must be a group name") as e:
                call()
            assert e.value.field == "group"
    assert bool((other == 1).all())
    with pytest.raises(BlockIdError, match="negative view"):
        z.zero(torch._neg_view(to_dev(torch.tensor([-1, -2]))))  # device ids, as under the interpreter
