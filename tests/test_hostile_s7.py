"""Issue 25's fresh hostile pass of 2026-12-04 (a reviewer who did not write the fixes): one
regression test per defect it found.

- The Pallas ``CacheZeroer`` wrote 0xff (NaN) into ``float8_e8m0fnu`` arrays: that dtype has no zero,
  so the kernels' value 0 rounds to NaN, where the contract is zero bytes. Refused by name now.
- A layer's head slots (LHBNC, BHLNC) and virtual sub-blocks made one row each with no bound:
  2**30 heads or 2**30-token blocks split into 1-token kernel blocks ran out of memory. A table holds
  at most 100,000 rows, counted before any row is built; a table JSON of more rows is refused before
  one is read (1,000,000 rows took 30 s).
- ``--backend kvlayout.backend:Backend`` (the abstract class) was taken: a traceback, exit 1.
- ``CudaZeroer.zero`` of a ragged list (an id that is a list) raised ``ValueError``, of a group that
  is a list ``TypeError``.
- A FIFO nobody writes to, given as a spec, config or table, hung in ``open`` forever.
- ``KVLAYOUT_BACKEND=""`` was refused as an unknown backend (set but empty is unset).
- ``plot`` of a pool of 0 blocks named an id the user never gave; ``--compare spec=`` of a native
  spec said ``spec.num_blocks`` was missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvlayout as K
from kvlayout import registry
from kvlayout.cli import main
from kvlayout.planner import plan_layout
from kvlayout.table import MAX_TABLE_ROWS, Segment, SegmentTable

ROOT = Path(__file__).resolve().parents[1]


def test_cache_zeroer_refuses_a_dtype_without_zero() -> None:
    jnp = pytest.importorskip("jax.numpy")
    native = pytest.importorskip("kvlayout.backends.pallas.native")
    from kvlayout.conformance import run_case
    from kvlayout.errors import LayoutBufferError
    from kvlayout.native import NativeLeaf

    caches = {"k": jnp.zeros((4, 2, 8), "float8_e8m0fnu"), "v": jnp.zeros((4, 16, 2), "bfloat16")}
    with pytest.raises(LayoutBufferError) as e:
        native.CacheZeroer(caches)
    assert (e.value.field, e.value.value) == ("leaf 'k'.dtype", "float8_e8m0fnu")
    assert "has no zero" in str(e.value) and "0xff (NaN)" in str(e.value)
    # the set the kernel zeroers refuse is every native dtype whose 0 is not zero bytes
    from kvlayout.native import NATIVE_DTYPE_SIZES, NO_ZERO_DTYPES

    zero_not_0 = {d for d in NATIVE_DTYPE_SIZES
                  if np.array([0], np.float32).astype(jnp.dtype(d)).view(np.uint8).any()}
    assert zero_not_0 == NO_ZERO_DTYPES
    leaf = NativeLeaf("k", (4, 2, 8), "float8_e8m0fnu")
    with pytest.raises(LayoutBufferError):
        run_case(native.leaf_backend(leaf), leaf.table(), [1])
    # a state leaf zeroing never touches may be of that dtype; every other dtype zeroes to zero bytes
    spec = K.NativeCacheSpec((NativeLeaf("s", (4, 8), "float8_e8m0fnu", zeroed=False),
                              NativeLeaf("v", (4, 16, 2), "bfloat16")))
    leaves = [jnp.zeros((4, 8), "float8_e8m0fnu"), jnp.zeros((4, 16, 2), "bfloat16")]
    z = native.CacheZeroer(leaves, spec=spec)
    assert z.spec.leaves[0].zeroed is False
    for dtype in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "int8"):
        leaf = NativeLeaf("k", (4, 2, 16), dtype)
        assert run_case(native.leaf_backend(leaf), leaf.table(), [1, 3]).ok, dtype


def test_rows_per_head_and_per_virtual_sub_block_are_bounded_before_they_exist() -> None:
    def spec(layout: str, heads: int, block: int, kbs: int | None) -> K.KVCacheSpec:
        group: dict[str, object] = {"name": "a", "layers": [
            {"name": "x", "kind": "full", "block_size": block, "num_kv_heads": heads, "head_size": 2,
             "dtype": "float32"}]}
        if kbs is not None:
            group["kernel_block_size"] = kbs
        return K.KVCacheSpec.from_dict({"version": 1, "num_blocks": 1, "layout": layout, "groups": [group]})

    for layout, heads, block, kbs, per in (("BHLNC", 2**30, 1, None, (2**30, 1)),
                                           ("LHBNC", 2**30, 1, None, (2**30, 1)),
                                           ("packed", 1, 2**30, 1, (1, 2**30))):
        with pytest.raises(K.SpecError) as e:
            plan_layout(spec(layout, heads, block, kbs))
        assert (e.value.field, e.value.value) == ("spec", f"{2**30} rows or more")
        assert str(e.value).endswith(
            f"its table would pass 100,000 rows at layer 'x' ({per[0]} rows a block, {per[1]} virtual "
            "sub-blocks each; GEOMETRY.md section 8)"
        )
    assert MAX_TABLE_ROWS == 100_000
    assert len(plan_layout(spec("packed", 1, MAX_TABLE_ROWS, 1)).placements) == 1  # the bound itself
    with pytest.raises(K.SpecError):
        plan_layout(spec("packed", 1, MAX_TABLE_ROWS + 1, 1))
    assert len(plan_layout(spec("BHLNC", 1000, 1, None)).table()) == 1000


def test_a_table_of_more_than_100000_rows_is_refused_before_a_row_is_read() -> None:
    row = {"base": 0, "stride": 4, "span": 4}
    with pytest.raises(K.TableError) as e:
        SegmentTable.from_dict({"total_bytes": 4, "num_blocks": 1, "segments": [row] * (MAX_TABLE_ROWS + 1)})
    assert str(e.value) == "table.segments = '100001 rows': at most 100,000 rows (GEOMETRY.md section 8)"
    with pytest.raises(K.TableError):
        SegmentTable(4, 1, (Segment(0, 4, 4),) * (MAX_TABLE_ROWS + 1))
    assert len(SegmentTable(4, 1, (Segment(0, 4, 4),) * MAX_TABLE_ROWS)) == MAX_TABLE_ROWS


def test_the_abstract_backend_class_is_not_a_backend(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(K.BackendError) as e:
        registry.load("kvlayout.backend:Backend")
    assert str(e.value).startswith(
        "backend 'kvlayout.backend:Backend': 'kvlayout.backend:Backend' is abstract (it does not implement "
    )
    argv = ["zero", "--preset", "dsv4-test", "--blocks", "1", "--backend", "kvlayout.backend:Backend"]
    assert main(argv) == 2
    assert "is abstract" in capsys.readouterr().err


def test_cuda_zeroer_refuses_ragged_lists_and_list_groups() -> None:
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    t = K.plan(K.preset("dsv4-test"))
    buf = torch.from_numpy(K.poison_pattern(t.total_bytes))
    before = buf.clone()
    z = kc.CudaZeroer(t, buf, graphs=False)
    with pytest.raises(K.BlockIdError) as e:
        z.zero(list(range(2, 70)) + [[5]])
    assert e.value.field == "block_ids[68]"
    with pytest.raises(K.TableError) as e2:
        z.zero([1], ["mla"])  # type: ignore[arg-type]
    assert str(e2.value) == "group = ['mla']: must be a group name (str) or None"
    assert torch.equal(buf, before)


def test_a_fifo_without_a_writer_is_read_as_empty_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv in (["plan", str(fifo)], ["plan", "--config", str(fifo)], ["check", "--table", str(fifo)]):
        res = subprocess.run([sys.executable, "-m", "kvlayout", *argv], capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
        assert res.returncode == 2 and "is not valid JSON" in res.stderr, (argv, res.stderr)
    with pytest.raises(K.SpecError) as e:
        K.validate.read_json_file(K.SpecError, "spec file", str(tmp_path))
    assert str(e.value) == f"spec file = {str(tmp_path)!r}: Is a directory"


def test_an_empty_kvlayout_backend_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("", "  "):
        monkeypatch.setenv(registry.ENV_VAR, value)
        assert registry.requested_name() == ("auto", "default")
    monkeypatch.setenv(registry.ENV_VAR, " reference ")
    assert registry.requested_name() == ("reference", registry.ENV_VAR)


def test_plot_compare_of_a_native_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--compare spec=`` of a native spec said ``spec.num_blocks`` was missing (the 0-block pool's
    messages are pinned in tests/test_mutants_cli.py::test_plot_of_a_pool_without_blocks)."""
    out = str(tmp_path / "x.png")
    base = ["plot", "--preset", "dsv4-test", "--out", out]
    native = tmp_path / "native.json"
    native.write_text(json.dumps({"version": 1, "layout": "native",
                                  "leaves": [{"name": "a", "shape": [4, 8], "dtype": "float32"}]}))
    assert main(base + ["--compare", f"spec={native}"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "is a native spec (layout 'native'): plot compares flat specs' byte maps only"
    )
    assert not Path(out).exists()


# --------------------------------------------------------------------- the second fresh pass
def test_pallas_backend_refuses_a_group_that_is_not_a_name() -> None:
    """``zero(ids, group=['mla'])`` raised a raw TypeError (a list is unhashable) in the backend's
    per-group lookup; now the TableError the other backends give; nothing written."""
    pytest.importorskip("jax")
    t = K.plan(K.preset("dsv4-test").with_num_blocks(8))
    buf = K.poison_pattern(t.total_bytes)
    be = registry.load("pallas").from_host(t, buf)
    for group in (["mla"], {"mla": 1}):
        with pytest.raises(K.TableError) as e:
            be.zero([1, 2], group=group)  # type: ignore[arg-type]
        assert str(e.value).endswith("must be a group name (str) or None")
    assert np.array_equal(be.to_host(), K.poison_pattern(t.total_bytes))
