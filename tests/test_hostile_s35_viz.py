"""Hostile pass 35, viz (findings 1-3): block ids, lanes and zero_diff's arguments bounded and checked.

Before: a ``range`` of block ids was listed before any check (range(10**9): raw MemoryError), lists of
ids and step_bytes' rows x ids work were unbounded, ``max_lanes`` had no upper bound (2,000 lanes:
155 s), and zero_diff checked none of its own arguments (raw ValueError / IndexError / AttributeError).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import BlockIdError, KVLayoutError, LayoutBufferError, SpecError
from kvlayout.table import Segment, SegmentTable

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from kvlayout import viz  # noqa: E402
from kvlayout.viz import common  # noqa: E402

#: The bounds this pass adds (their values here, so that the tests run, and fail, on the code before it).
MAX_PLOT_IDS = getattr(common, "MAX_PLOT_IDS", 1 << 20)
MAX_PLOT_LANES = getattr(common, "MAX_PLOT_LANES", 128)
BIG = 2**31 - 1


@pytest.fixture(autouse=True)
def _close_figures() -> Any:
    yield
    plt.close("all")


def _refused(cls: type[KVLayoutError], field: str, call: Any, *args: Any, **kw: Any) -> KVLayoutError:
    """``call(*args, **kw)`` raises ``cls`` naming ``field``, in one line."""
    with pytest.raises(cls) as info:
        call(*args, **kw)
    assert info.value.field == field, (info.value.field, str(info.value))
    assert "\n" not in str(info.value)
    return info.value


# --------------------------------------------------------------------------- finding 1: block ids
#: Run in a child under a 4 GB address-space cap and a 5 s alarm per case: the code before this pass
#: listed each range (a MemoryError there, not GBs here).
_CHILD = r"""
import json, os, resource, signal, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import kvlayout as K
from kvlayout import viz

class Slow(Exception):
    pass

def _alarm(*_):
    raise Slow()

signal.signal(signal.SIGALRM, _alarm)
BIG = 2**31 - 1
small = K.preset("llama-8b")  # 64 blocks
big = small.with_num_blocks(BIG)
dsv4_big = K.preset("dsv4").with_num_blocks(BIG)
cases = {
    "byte_map_far": lambda: viz.byte_map(small, blocks=range(10**9), insets=False),
    "table_map_far": lambda: viz.table_map(K.plan(small), blocks=range(10**9)),
    "step_bytes_far": lambda: viz.step_bytes(K.plan(small), {"attn": range(10**9)}),
    "byte_map_huge_ints": lambda: viz.byte_map(small, blocks=range(2**100, 2**100 + 3), insets=False),
    "byte_map_all": lambda: viz.byte_map(big, blocks=range(BIG - 1, -1, -1), insets=False),
    "table_map_all": lambda: viz.table_map(big, blocks=range(5, BIG), inset=False),
    "step_bytes_all": lambda: viz.step_bytes(K.plan(big), {"attn": range(BIG)}),
    "step_bytes_many": lambda: viz.step_bytes(  # every group of dsv4 (a name of no group is refused first)
        K.plan(dsv4_big), {g.name: range(10**6) for g in dsv4_big.groups}),
    "bytes_per_step_many": lambda: viz.bytes_per_step(dsv4_big, 2**20),
}
for name, call in cases.items():
    out = {"case": name}
    signal.alarm(5)
    try:
        fig = call()
        out["kind"] = "ok"
        if hasattr(fig, "axes") and hasattr(fig.axes[0], "kvlayout"):
            out["shown"] = sorted({b for _, b, _ in fig.axes[0].kvlayout.lanes})
    except K.KVLayoutError as e:
        out.update(kind=type(e).__name__, field=e.field, msg=str(e))
    except BaseException as e:
        out.update(kind="raw " + type(e).__name__, msg=str(e)[:200])
    signal.alarm(0)
    plt.close("all")
    print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def ranges_run() -> dict[str, dict[str, Any]]:
    root = str(Path(K.__file__).resolve().parents[1])
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, env=env, cwd=root
    )
    got = {}
    for line in out.stdout.splitlines():
        d = json.loads(line)
        got[d.pop("case")] = d
    assert len(got) == 9, out.stderr[-2000:]
    return got


def test_a_range_of_block_ids_outside_the_pool_is_refused_by_its_ends(
    ranges_run: dict[str, dict[str, Any]],
) -> None:
    """Before: check_blocks listed range(10**9) first: raw MemoryError (byte_map: 4.5 s, 1.7 GB for 3e7)."""
    for case, field in (
        ("byte_map_far", "blocks"),
        ("table_map_far", "blocks"),
        ("step_bytes_far", "allocations['attn']"),
        ("byte_map_huge_ints", "blocks"),
    ):
        got = ranges_run[case]
        assert (got["kind"], got.get("field")) == ("BlockIdError", field), (case, got)
    assert ranges_run["byte_map_far"]["msg"] == (
        "blocks = range(0, 1000000000): holds 999999999, outside [0, 64)"
    )
    assert "an integer of 101 bits" in ranges_run["byte_map_huge_ints"]["msg"]


def test_a_range_of_block_ids_in_the_pool_is_drawn_without_listing_it(
    ranges_run: dict[str, dict[str, Any]],
) -> None:
    """Before: byte_map / table_map listed range(2**31 - 1) (16 GB) to draw its first few blocks."""
    assert ranges_run["byte_map_all"] == {"kind": "ok", "shown": list(range(24))}
    assert ranges_run["table_map_all"]["kind"] == "ok", ranges_run["table_map_all"]


def test_step_bytes_bounds_the_ids_it_takes(ranges_run: dict[str, dict[str, Any]]) -> None:
    """Before: step_bytes listed every range of every group (range(2**31 - 1): raw MemoryError)."""
    got = ranges_run["step_bytes_all"]
    assert (got["kind"], got.get("field")) == ("BlockIdError", "allocations['attn'].size"), got
    assert f"at most {MAX_PLOT_IDS:,} block ids" in got["msg"]
    got = ranges_run["step_bytes_many"]
    assert (got["kind"], got.get("field")) == ("BlockIdError", "allocations"), got
    got = ranges_run["bytes_per_step_many"]
    assert (got["kind"], got.get("field")) == ("BlockIdError", "new_blocks"), got


def test_lists_of_block_ids_are_bounded_before_they_are_read() -> None:
    """Before: a list or array of any length was read whole (then all but a few ids dropped)."""
    spec = K.preset("dsv4-test")  # 100 blocks
    many = [0] * (MAX_PLOT_IDS + 1)
    t = time.perf_counter()
    e = _refused(BlockIdError, "blocks.size", viz.byte_map, spec, many)
    assert e.value == MAX_PLOT_IDS + 1 and f"at most {MAX_PLOT_IDS:,} block ids" in str(e)
    _refused(BlockIdError, "blocks.size", viz.table_map, spec, np.zeros(MAX_PLOT_IDS + 1, np.int64))
    _refused(BlockIdError, "blocks.size", viz.compare_maps, spec, spec, blocks=tuple(many))
    _refused(BlockIdError, "allocations['mla'].size", viz.step_bytes, K.plan(spec), {"mla": many})
    assert time.perf_counter() - t < 1.0
    e = _refused(BlockIdError, "new_blocks", viz.bytes_per_step, spec, MAX_PLOT_IDS + 1)
    assert f"at most {MAX_PLOT_IDS:,}" in str(e)


def test_step_bytes_refuses_rows_times_ids_past_its_bound_before_merging() -> None:
    """Before: 64 rows of llama-8b times 1,000,000 scattered ids merged for 59 s (here 131,072: 3.5 s)."""
    table = K.plan(K.preset("llama-8b").with_num_blocks(BIG))
    per_block = table.bytes_per_block
    assert viz.step_bytes(table, {"attn": range(10**6)}) == (10**6 * per_block, 10**6 * per_block)
    t = time.perf_counter()
    e = _refused(BlockIdError, "allocations", viz.step_bytes, table, {"attn": range(0, 2**18, 2)})
    assert "16,777,216 (row, block) ranges to merge" in str(e)
    assert time.perf_counter() - t < 1.0


# --------------------------------------------------------------------------- finding 2: lanes
def test_max_lanes_is_bounded_before_matplotlib() -> None:
    """Before: max_lanes had no upper bound (400 lanes: 22 s, 540 MB; 2,000: 155 s)."""
    spec = K.preset("dsv4-test")
    t = time.perf_counter()
    for bad in (MAX_PLOT_LANES + 1, 10**9):
        e = _refused(SpecError, "max_lanes", viz.byte_map, spec, max_lanes=bad)
        assert f"at most {MAX_PLOT_LANES}" in str(e)
        _refused(SpecError, "max_lanes", viz.compare_maps, spec, spec, max_lanes=bad)
    assert time.perf_counter() - t < 1.0
    assert MAX_PLOT_LANES <= 128
    fig = viz.byte_map(spec, blocks=range(100), insets=False, max_lanes=MAX_PLOT_LANES)
    assert len(fig.axes[0].kvlayout.lanes) <= MAX_PLOT_LANES


def test_lanes_of_many_boxes_are_cut_to_the_box_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: 16 lanes of a 1,024-layer group drew 16,384 boxes (9 s); no budget cut them."""
    assert getattr(common, "MAX_PLOT_BOXES", None) == 4096  # 1,024 layers x the 4 blocks sampled
    monkeypatch.setattr(common, "MAX_PLOT_BOXES", 64, raising=False)
    base = {"kind": "full", "block_size": 1, "num_kv_heads": 1, "head_size": 2, "dtype": "int8"}
    layers = [{"name": f"l{i}", **base} for i in range(32)]
    spec = K.KVCacheSpec.from_dict(
        {"num_blocks": 8, "layout": "packed", "groups": [{"name": "g", "layers": layers}]}
    )
    fig = viz.byte_map(spec, blocks=range(8), max_lanes=8, insets=False)
    assert [b for _, b, _ in fig.axes[0].kvlayout.lanes] == [0, 1]
    assert "showing blocks 0, 1 of 8" in fig.axes[0].get_title(loc="left")
    fig = viz.compare_maps(spec, spec, blocks=range(8), max_lanes=8)
    assert [[b for _, b, _ in ax.kvlayout.lanes] for ax in fig.axes[:2]] == [[0, 1], [0, 1]]


# --------------------------------------------------------------------------- finding 3: zero_diff
TABLE = SegmentTable(512, 4, (Segment(0, 128, 64), Segment(64, 128, 64)))
GUARD = 64


def _bufs() -> tuple[np.ndarray, np.ndarray]:
    before = np.full(GUARD + 512 + GUARD, 0xAA, np.uint8)
    after = before.copy()
    after[GUARD : GUARD + 128] = 0  # block 0
    return before, after


_BEFORE, _AFTER = _bufs()
_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("reversed region", {"region": (100, 10)}, "region"),
    ("negative region", {"region": (-100, 10)}, "region[0]"),
    ("region past before", {"region": (0, 512 + GUARD + 1)}, "region"),
    ("empty region", {"region": (10, 10)}, "region"),
    ("region of floats", {"region": (0.5, 10)}, "region[0]"),
    ("region as a string", {"region": "0:10"}, "region"),
    ("region of three", {"region": (0, 1, 2)}, "region"),
    ("no afters", {"afters": {}}, "len(afters)"),
    ("afters as a list", {"afters": [_AFTER]}, "afters type"),
    ("after shorter", {"afters": {"r": _AFTER[:10]}}, "afters['r'].nbytes"),
    ("after longer", {"afters": {"r": np.zeros(4096, np.uint8)}}, "afters['r'].nbytes"),
    ("after ragged", {"afters": {"r": [[1, 2], [3]]}}, "afters['r'] type"),
    ("after name not a string", {"afters": {1: _AFTER}}, "afters key type"),
    ("too many afters", {"afters": {f"r{i}": _AFTER for i in range(65)}}, "len(afters)"),
    ("before smaller than the table", {"before": _BEFORE[:10], "origin": 0}, "origin"),
    ("origin past the table's room", {"origin": 2 * GUARD + 1}, "origin"),
    ("negative origin", {"origin": -1}, "origin"),
    ("before of objects", {"before": np.array([object()] * 1000)}, "before type"),
]


@pytest.mark.parametrize(("what", "change", "field"), _CASES, ids=[c[0] for c in _CASES])
def test_zero_diff_checks_its_arguments(what: str, change: dict[str, Any], field: str) -> None:
    """Before: zero_diff checked none of region, origin, afters or the sizes of before and after: raw
    ValueError / IndexError / AttributeError, or (before smaller than the table) a silent picture."""
    kw: dict[str, Any] = {"before": _BEFORE, "afters": {"ref": _AFTER}, "origin": GUARD, **change}
    before, afters = kw.pop("before"), kw.pop("afters")
    e = _refused(LayoutBufferError, field, viz.zero_diff, before, afters, TABLE, [0], **kw)
    assert len(str(e)) < 300, str(e)


def test_zero_diff_region_reaches_the_guard_bytes_but_not_past_before() -> None:
    """Before: a region past the end of before drew a strip of fewer bytes than its axis said."""
    before, after = _bufs()
    fig = viz.zero_diff(before, {"ref": after}, TABLE, [0], origin=GUARD, region=(0, 512 + GUARD))
    img = fig.axes[0].images[0].get_array()
    assert img.shape[:2] == (1, 512 + GUARD)
    assert np.allclose(img[0, :128], [0.2, 0.7, 0.3])  # block 0: cleared as the contract says
    assert np.allclose(img[0, 128:], [0.85, 0.85, 0.85])  # untouched, guard bytes included
    _refused(LayoutBufferError, "region", viz.zero_diff, before, {"r": after}, TABLE, [0], GUARD, (0, 577))
