"""Hostile pass 34, viz (findings 2 and 3): the plotting API's own size bounds and argument checks.

Before: only the CLI bounded plots (the Python API drew 8,000 layers in 23 s), and wrong-type
arguments of the Python API raised raw AttributeError / TypeError / IndexError / traitlets errors.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import KVLayoutError, SpecError, TableError
from kvlayout.table import Segment, SegmentTable

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from kvlayout import viz  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures() -> Any:
    yield
    plt.close("all")


def _layers(n: int, prefix: str = "l") -> list[dict[str, Any]]:
    base = {"kind": "full", "block_size": 1, "num_kv_heads": 1, "head_size": 2, "dtype": "int8"}
    return [{"name": f"{prefix}{i}", **base} for i in range(n)]


def _spec(layers: int = 0, groups: int = 0) -> dict[str, Any]:
    if groups:
        gs = [{"name": f"g{j}", "layers": _layers(1, f"g{j}.l")} for j in range(groups)]
    else:
        gs = [{"name": "g", "layers": _layers(layers)}]
    return {"num_blocks": 4, "layout": "packed", "groups": gs}


def _refused(cls: type[KVLayoutError], field: str, call: Any, *args: Any, **kw: Any) -> KVLayoutError:
    """``call(*args, **kw)`` raises ``cls`` naming ``field``, in one line."""
    with pytest.raises(cls) as info:
        call(*args, **kw)
    assert info.value.field == field, (info.value.field, str(info.value))
    assert "\n" not in str(info.value)
    return info.value


# --------------------------------------------------------------------------- finding 2: size bounds
def test_byte_map_and_compare_maps_refuse_too_many_layers_quickly() -> None:
    """Before: byte_map / compare_maps drew any number of layers (8,000: 23 s, 368 MB); the CLI refused."""
    big = K.KVCacheSpec.from_dict(_spec(1100))
    small = K.preset("dsv4-test")
    t = time.perf_counter()
    e = _refused(SpecError, "layers", lambda: viz.byte_map(big))
    assert time.perf_counter() - t < 1.0
    assert e.value == 1100 and str(e) == "layers = 1100: a byte map draws at most 1024 layers"
    _refused(SpecError, "layers", lambda: viz.compare_maps(small, big))
    _refused(SpecError, "layers", lambda: viz.compare_maps(big, small))
    many = K.KVCacheSpec.from_dict(_spec(groups=65))
    assert _refused(SpecError, "groups", lambda: viz.byte_map(K.plan_layout(many))).value == 65
    assert time.perf_counter() - t < 2.0


def test_table_map_refuses_too_many_rows() -> None:
    """Before: table_map drew every row that did not coalesce (each against every other: slow past 2,000)."""
    n = 2049
    rows = [Segment(i * 64, n * 64, 32, "g", f"l{i}", "kv") for i in range(n)]  # never coalesce
    table = SegmentTable(total_bytes=4 * n * 64, num_blocks=4, segments=tuple(rows))
    assert len(table.coalesced()) == n
    t = time.perf_counter()
    e = _refused(TableError, "rows", lambda: viz.table_map(table))
    assert e.value == n and "at most 2048 rows" in str(e)
    assert time.perf_counter() - t < 2.0


def test_cli_plot_limits_are_viz_limits() -> None:
    """Before: the limits lived only in kvlayout.cli; the CLI now imports viz's own (and not matplotlib)."""
    from kvlayout import cli

    for name in ("MAX_PLOT_ROWS", "MAX_PLOT_LAYERS", "MAX_PLOT_GROUPS"):
        assert getattr(cli, name) is getattr(viz.common, name), name
    code = "import sys, kvlayout.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_explorer_reports_a_spec_too_large_to_draw(tmp_path: Path) -> None:
    """Before: the explorer's rebuild drew a spec file of any size."""
    pytest.importorskip("ipywidgets")
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_spec(1025)))
    ex = viz.Explorer("spec file", str(path))
    assert "layers = 1025: a byte map draws at most 1024 layers" in ex.status.value
    assert ex.layout_obj is None


# --------------------------------------------------------------------------- finding 3: argument checks
def test_wrong_sources_are_kvlayout_errors_naming_the_type() -> None:
    """Before: byte_map('dsv4'), byte_map(table), describe_at(None, 0), ... raised raw AttributeError."""
    spec = K.preset("dsv4-test")
    table = K.plan(spec)
    e = _refused(SpecError, "spec_or_layout type", lambda: viz.byte_map("dsv4"))
    assert str(e).startswith("spec_or_layout type = str: must be a KVCacheSpec or Layout (a preset by name")
    e = _refused(SpecError, "spec_or_layout type", lambda: viz.byte_map(table))
    assert "SegmentTable" in str(e) and "table_map" in str(e)
    _refused(SpecError, "a type", lambda: viz.compare_maps(None, spec))
    _refused(SpecError, "b type", lambda: viz.compare_maps(spec, 5))
    e = _refused(SpecError, "source type", lambda: viz.describe_at(None, 0))
    assert str(e) == "source type = NoneType: must be a KVCacheSpec, Layout or SegmentTable"
    _refused(SpecError, "source type", lambda: viz.bytes_per_step("dsv4"))
    _refused(TableError, "table type", lambda: viz.table_map([1, 2]))
    _refused(TableError, "table type", lambda: viz.table_view({"segments": []}))
    _refused(SpecError, "spec type", lambda: viz.variant("dsv4", {}))


def test_table_map_and_table_view_take_a_spec_or_layout() -> None:
    """Before: table_map(spec) and table_view(spec) raised AttributeError ('no attribute total_bytes')."""
    spec = K.preset("dsv4-test")
    rows = viz.table_view(spec).rows
    assert rows == viz.table_view(K.plan_layout(spec)).rows == viz.table_view(K.plan(spec)).rows
    assert viz.table_map(spec).axes[0].get_title(loc="left").startswith("4 rows, 100 blocks: SAFE")
    assert viz.table_map(K.plan_layout(spec)).axes


def test_numeric_knobs_and_labels_are_checked() -> None:
    """Before: max_rows='a' (TypeError), xmax=nan (matplotlib ValueError), labels=() (IndexError) were raw;
    max_lanes=0 and xmax=True were taken."""
    spec = K.preset("dsv4-test")
    table = K.plan(spec)
    for bad in ("a", 0, True, 2.0):
        _refused(TableError, "max_rows", viz.table_map, table, max_rows=bad)
    for bad in (0, "2", -1):
        _refused(SpecError, "max_lanes", viz.byte_map, spec, max_lanes=bad)
        _refused(SpecError, "max_lanes", viz.compare_maps, spec, spec, max_lanes=bad)
    for bad in (math.nan, math.inf, -1.0, 0, True, "100", 10**400, np.bool_(True)):
        _refused(SpecError, "xmax", viz.byte_map, spec, xmax=bad)
    ax = viz.byte_map(spec, xmax=np.float64(5000.0)).axes[0]
    assert ax.get_xlim() == (0.0, 5000.0)
    for bad in ((), ("a",), ("a", 2), "ab", ("a", "b", "c"), None):
        _refused(SpecError, "labels", viz.compare_maps, spec, spec, labels=bad)
    assert viz.compare_maps(spec, spec, labels=["x", "y"])._suptitle.get_text().startswith("y against x")


def test_variant_changes_are_checked() -> None:
    """Before: variant(spec, 5) TypeError, [('tp',)] ValueError, {'tp': 'x'} int() ValueError, {1: 'x'} in
    sorted() TypeError; a key given twice in a list took the last."""
    llama = K.preset("llama-8b")
    _refused(SpecError, "changes", lambda: viz.variant(llama, 5))
    _refused(SpecError, "changes", lambda: viz.variant(llama, "tp=2"))
    _refused(SpecError, "changes item", lambda: viz.variant(llama, [("tp",)]))
    _refused(SpecError, "changes item", lambda: viz.variant(llama, ["tp"]))
    _refused(SpecError, "changes key", lambda: viz.variant(llama, {1: "x", "tp": 2}))
    for bad in ("x", 2.5, True, None, "-2"):
        e = _refused(SpecError, "--compare tp", viz.variant, llama, {"tp": bad})
        assert "must be an integer" in str(e)
    _refused(SpecError, "--compare num_blocks", lambda: viz.variant(llama, {"num_blocks": "1e3"}))
    _refused(SpecError, "--compare tp", lambda: viz.variant(llama, [("tp", 2), ("tp", 4)]))
    _refused(SpecError, "--compare layout", lambda: viz.variant(llama, {"layout": 5}))
    half = viz.variant(llama, {"tp": 2, "num_blocks": np.int64(8)})
    assert half == viz.variant(llama, [("tp", "2"), ("num_blocks", "8")]) and half.num_blocks == 8
    assert K.plan(half).total_bytes == K.plan(llama.with_num_blocks(8)).total_bytes // 2


def test_explorer_source_and_path_are_checked() -> None:
    """Before: explorer('my_spec.json') raised ipywidgets' TraitError ('Invalid selection: value not found');
    a path not a string, another TraitError."""
    e = _refused(SpecError, "source", lambda: viz.explorer("my_spec.json"))
    assert "source='spec file', path=" in str(e) and "dsv4-test" in str(e)
    _refused(SpecError, "source", lambda: viz.Explorer(None))  # type: ignore[arg-type]
    _refused(SpecError, "path", lambda: viz.explorer("spec file", Path("x.json")))  # type: ignore[arg-type]
