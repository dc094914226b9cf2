"""Issue 25's fourth fresh hostile pass (2026-12-05, a reviewer who did not write the fixes): one
regression test per defect it found.

- High: NumPy integers in a table's or a spec's fields were kept as they were given, so extents and
  pages were computed in int64 and wrapped: a row ``(0, -3.7e18, 64)`` over 6 blocks reached
  ``5 * stride`` = +4,096, was proven SAFE, and zeroing block 1 wrote at a wild address (segfault).
- High: the JAX zeroers' ``apply`` passed ids that were neither NumPy nor a list of ints (a torch
  tensor, ``array.array``, a list of 0-d arrays) to ``jnp.asarray``, which narrows 64-bit ids to int32
  with x64 off: ``2**32 + 3`` zeroed block 3 and counted no bad id.
- The verifier took a mask of every row per stride class, and per padding gap: 100,000 rows of
  distinct strides took 13.5 s, a 100,000-layer spec's ``check`` 59 s (the time bounds:
  ``tests/test_hostile_s9_bounds.py``, kept out of the mutation runs' selections).
- ``plot`` of a spec or config whose file name is not UTF-8 gave matplotlib's traceback (the title).
- An object-dtype host buffer raised NumPy's TypeError; ``shard_of_rank`` took a timedelta; an empty
  ``--backend`` was refused without naming the field.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import kvlayout as K
from kvlayout.cli import main
from kvlayout.errors import LayoutBufferError, SpecError, TableError
from kvlayout.sharding import ShardedLayout
from kvlayout.table import Segment, SegmentTable

_WRAP = -3_689_348_814_741_909_504  # 5 * this = 4,096 in int64 (it wraps); -1.8e19 in Python


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint64, int])
def test_numpy_integers_in_a_table_are_python_ints(kind: type) -> None:
    """Stored as Python ints, so the extent check sees the real ``-1.8e19`` and refuses the row."""
    if kind is np.int32 or kind is np.uint64:  # the wrapping stride does not fit: any value converts
        seg = Segment(kind(4), kind(8), kind(4), virtual_index=kind(1))
        assert {type(v) for v in (seg.base, seg.stride, seg.span, seg.virtual_index)} == {int}
        t = SegmentTable(kind(64), kind(4), (seg,))
        assert type(t.total_bytes) is int and type(t.num_blocks) is int
        return
    with pytest.raises(TableError) as e:
        SegmentTable(kind(8192), kind(6), (Segment(kind(0), kind(_WRAP), kind(64)),))
    assert e.value.field == "table.segments[0]" and "extents must stay within (-2**62, 2**62)" in str(e.value)


def test_numpy_integers_in_a_spec_are_python_ints() -> None:
    """A page of 2**65 + 2**35 B wrapped to 2**35 in int64 and was planned SAFE."""
    big = dict(block_size=np.int64(2**30 + 1), num_kv_heads=np.int64(2**33), head_size=np.int64(1))
    with pytest.raises(SpecError) as e:
        K.FullAttentionSpec("l0", dtype="bfloat16", **big)  # type: ignore[arg-type]
    assert "page bytes must be below 2**62" in str(e.value)
    i64, i32, u16 = np.int64, np.int32, np.uint16
    layer = K.FullAttentionSpec("l0", i64(16), i32(2), u16(64), "bfloat16", alignment=i64(256))
    spec = K.KVCacheSpec(num_blocks=np.int64(4), layout="packed", groups=(K.GroupSpec("g", (layer,)),))
    assert type(spec.num_blocks) is int
    fields = ("block_size", "num_kv_heads", "head_size", "alignment")
    assert {type(getattr(layer, f)) for f in fields} == {int}
    mamba = K.MambaSpec("m", state_bytes=np.int64(4096))
    assert type(mamba.state_bytes) is int


def test_gaps_met_by_rows_of_other_strides_are_still_found_and_bounded() -> None:
    """The counted path: a row of another stride over a gap is a violation, and more such (row, gap)
    pairs than the bound is a refusal, as for rows of different strides."""
    gap = Segment(60, 64, 4, "g", "a", "padding")
    rows = (Segment(0, 64, 60, "g", "a"), Segment(56, 128, 8, "h", "b"))
    report = K.verify(SegmentTable(256, 2, rows, (gap,), planned=True))
    assert any(v.invariant == 4 and v.rows == (1,) for v in report.violations), report.violations
    many = tuple(Segment(60 + 64 * j, 64 * 6_000, 4, "g", f"a{j}", "padding") for j in range(6_000))
    wide = (Segment(0, 64 * 6_000 + 8, 64 * 6_000, "h", "b"),)
    with pytest.raises(TableError, match="pairs of rows with different strides"):
        K.verify(SegmentTable(64 * 12_001 + 8, 2, wide, many, planned=True))


def test_plot_titles_a_file_name_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    name = os.fsdecode(bytes(tmp_path) + b"/\xff.json")
    Path(name).write_text(K.preset("dsv4-test").to_json())
    out = tmp_path / "c.png"
    assert main(["plot", name, "--out", str(out)]) == 0 and out.stat().st_size > 0
    assert capsys.readouterr().out == f"wrote {out}\n"


def test_object_buffers_are_refused_by_field() -> None:
    table = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    record = np.zeros(table.total_bytes // 16, [("a", "i8"), ("b", "O")])
    for buf in (np.empty(table.total_bytes // 8, object), record):
        with pytest.raises(LayoutBufferError) as e:
            K.ReferenceBackend(table, buf).zero([1])
        assert e.value.field == "buffer.dtype" and "Python object references" in str(e.value)


def test_shard_of_rank_refuses_a_timedelta() -> None:
    lay = ShardedLayout.from_local(K.preset("dsv4-test"), {"tp": 2})
    for bad in (np.timedelta64(1), True, 1.0):
        with pytest.raises(LayoutBufferError) as e:
            lay.shard_of_rank(bad)  # type: ignore[arg-type]
        assert e.value.field == "rank"
    assert lay.shard_of_rank(np.int64(1)) == 1


def test_an_empty_backend_name_is_refused_by_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zero", "--preset", "dsv4-test", "--blocks", "0", "--backend", ""]) == 2
    err = capsys.readouterr().err
    assert "Invalid value '' for backend. Valid options:" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- the fifth pass (2026-12-05)
# - High: a NumPy int8 offset passed the size check as a value but was sliced raw in CudaZeroer
#   (``offset + 16`` wrapped to -116): the zeroer viewed 0 bytes, and zero() wrote at a wild address.
# - zero_native_numpy wrote earlier arrays before an object-dtype one was refused; ShardedLayout kept
#   NumPy int8 mesh sizes (300 devices counted 44) and a mapping as given; the verifier's fallback
#   counted same-stride pairs against the 5,000 cross-stride bound; ``conformance --backend ""`` ran
#   every backend; a Python-made row's negative virtual_index was kept (its own JSON refused it).


def test_cuda_zeroer_takes_a_narrow_offset_as_an_int() -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    table = SegmentTable(16, 2, (Segment(4, 8, 4),))
    host = np.full(200, 0xAA, np.uint8)
    buf = torch.from_numpy(host.copy()).to(kc.DEVICE_TYPE)
    z = kc.CudaZeroer(table, buf, offset=np.int8(124), graphs=False)
    assert type(z.offset) is int and z.offset == 124 and tuple(z.words.shape) == (4,)
    z.zero([0])
    want = host.copy()
    want[128:132] = 0  # offset 124 + base 4
    assert (buf.cpu().numpy() == want).all()


def test_reference_takes_a_narrow_offset() -> None:
    table = SegmentTable(16, 2, (Segment(4, 8, 4),))
    buf = np.full(300, 0xAA, np.uint8)
    ref = K.ReferenceBackend(table, buf, offset=np.int8(124))
    ref.zero([0])
    assert type(ref.offset) is int and np.flatnonzero(buf != 0xAA).tolist() == [128, 129, 130, 131]


def test_native_numpy_refuses_an_object_array_before_writing() -> None:
    from kvlayout.native import NativeCacheSpec, NativeLeaf, zero_native_numpy

    shapes = (("a", 2, "float32"), ("b", 4, "int32"), ("c", 2, "float32"))
    leaves = tuple(NativeLeaf(n, (4, w), d) for n, w, d in shapes)
    a, b, c = np.ones((4, 2), np.float32), np.empty((4, 2), object), np.ones((4, 2), np.float32)
    with pytest.raises(LayoutBufferError) as e:
        zero_native_numpy([a, b, c], NativeCacheSpec(leaves), [1])
    assert e.value.field == "arrays[1].dtype" and (a == 1).all()


def test_sharded_layout_stores_its_axes_as_checked() -> None:
    spec = K.preset("dsv4-test").with_num_blocks(4)
    axes = (("a", np.int8(3)), ("b", np.int8(100)))
    lay = ShardedLayout(spec, axes, ("a",), ["b", "a"])  # type: ignore[arg-type]
    assert (lay.num_devices, lay.num_shards) == (300, 300) and lay.shard_axes == ("a", "b")
    assert all(type(size) is int for _, size in lay.mesh_axes)
    mapped = ShardedLayout(spec, {"ab": 2}, (), ("ab",))  # type: ignore[arg-type]
    assert mapped.mesh_axes == (("ab", 2),) and mapped.num_devices == 2


def test_the_fallback_counts_only_pairs_across_strides() -> None:
    """2,000 rows of one stride meet one another (2 million pairs: the fallback path) beside one row of
    another stride: 2,000 cross-stride pairs, decided, where all 2,001,000 pairs were counted."""
    rows, n = 2000, 16
    stride = 16 * rows + 64
    segs = [Segment(16 * i, stride, 16) for i in range(rows)]
    segs.append(Segment((n - 1) * stride + 16 * rows, -stride, 16))
    assert K.verify(SegmentTable(n * stride, n, tuple(segs))).ok


def test_conformance_refuses_an_empty_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--backend", ""]) == 2
    err = capsys.readouterr().err
    assert "Invalid value '' for backend" in err and err.count("\n") == 1


def test_a_negative_virtual_index_is_refused_as_the_json_refuses_it() -> None:
    for bad in (-5, "x", 2.5):
        with pytest.raises(TableError) as e:
            SegmentTable(16, 2, (Segment(4, 8, 4, virtual_index=bad),))  # type: ignore[arg-type]
        assert e.value.field == "table.segments[0].virtual_index"


def test_a_step_chart_of_more_group_shapes_than_it_draws_is_refused() -> None:
    pytest.importorskip("matplotlib")
    from kvlayout.viz import charts

    segs = tuple(Segment(16 * i, 16 * 65, 16, f"g{i}") for i in range(65))  # 65 one-row group shapes
    with pytest.raises(TableError) as e:
        charts.bytes_per_step(SegmentTable(16 * 65 * 4, 4, segs))
    assert (e.value.field, e.value.value) == ("groups", 65)


# --------------------------------------------------------------------------- the sixth pass (2026-12-05)
# NumPy integers checked but then used raw: CudaZeroer's chunk_words reached the kernel (Triton's
# constexpr error at zero()), bytes_per_step's new_blocks wrapped in int8 (a group dropped from the
# mixed step), split_heads' ways overflowed on 200 heads, poison_pattern's unsigned nbytes wrapped,
# a uint64 origin made float slice bounds, NativeCacheSpec kept a NumPy version (to_json failed), and
# check_option took a timedelta.


def test_cuda_chunk_words_of_numpy_type_is_an_int() -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    table = SegmentTable(512, 4, (Segment(0, 128, 64), Segment(64, 128, 64)))
    host = np.full(512, 0xAA, np.uint8)
    buf = torch.from_numpy(host.copy()).to(kc.DEVICE_TYPE)
    kc.CudaZeroer(table, buf, graphs=False, chunk_words=np.int64(64)).zero([1])
    want = host.copy()
    want[128:256] = 0
    assert (buf.cpu().numpy() == want).all()


def test_numpy_integers_checked_are_used_as_ints() -> None:
    pytest.importorskip("matplotlib")
    from kvlayout.native import NativeCacheSpec, NativeLeaf
    from kvlayout.reference import compare_to_contract
    from kvlayout.validate import check_option
    from kvlayout.viz import charts

    segs = (Segment(0, 32, 16, "g0"), Segment(16, 32, 32, "g1"))
    table = SegmentTable(32 * 1000 + 64, 1000, segs)
    steps = charts.bytes_per_step(table, np.int8(100)).axes[0].kvlayout_steps
    assert steps[-1] == ("mixed: 100 new blocks for each of 2 groups", 4800, 6416)
    layer = K.FullAttentionSpec("l0", 16, 200, 64, "bfloat16")
    split = K.split_heads(K.KVCacheSpec(4, "packed", (K.GroupSpec("g", (layer,)),)), np.int8(2))
    assert split.groups[0].layers[0].num_kv_heads == 100
    assert (K.poison_pattern(np.uint8(100)) == K.poison_pattern(100)).all()
    small = SegmentTable(16, 2, (Segment(4, 8, 4),))
    before = np.full(216, 0xAA, np.uint8)
    after = before.copy()
    after[104:108] = 0
    assert compare_to_contract(before, after, small, [0], np.uint64(100)).matches
    native = NativeCacheSpec((NativeLeaf("a", (4, 8), "float32"),), version=np.int8(1))
    assert '"version": 1' in native.to_json()
    with pytest.raises(K.BackendError):
        check_option("x", np.timedelta64(8))


def test_object_buffer_refusal_message_and_block_axes_stored_as_checked() -> None:
    """The mutants of the fourth and fifth passes' fixes: the refusal's exact form, and block_axes
    stored as the checked (mesh-order) tuple."""
    table = K.plan(K.preset("dsv4-test").with_num_blocks(4))
    with pytest.raises(LayoutBufferError) as e:
        K.ReferenceBackend(table, np.empty(table.total_bytes // 8, object))
    assert (e.value.field, e.value.value) == ("buffer.dtype", "object")
    why = "must hold plain data (its dtype holds Python object references)"
    assert str(e.value) == f"buffer.dtype = object: {why}"
    two = (("a", 2), ("b", 2))
    lay = ShardedLayout(K.preset("dsv4-test"), two, ["b", "a"], ["b", "a"])  # type: ignore[arg-type]
    assert lay.block_axes == ("a", "b") and lay.shard_axes == ("a", "b")
