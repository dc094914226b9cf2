"""Hostile input, second pass (issue 25): every input answered within about a second and
100 MB, as exit 2 with one line naming the field and value (or a clear kvlayout error from
the Python API); and the rules that hand-written mutants showed unpinned.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.errors import SpecError, TableError
from kvlayout.reference import expected_zeroed, poison_pattern, zero_blocks_numpy
from kvlayout.sharding import MAX_MESH_AXES, MAX_MESH_DEVICES, ShardedLayout, shard_spec, split_heads
from tests.test_hostile import expect_exit_2, write

LONG = "7" * 5000  # past Python's 4,300-digit int(str) limit


def small_spec(layout: str = "packed", num_blocks: int = 8, layers: int = 1) -> dict:
    layer = {"kind": "full", "block_size": 16, "num_kv_heads": 2, "head_size": 8, "dtype": "bfloat16"}
    return {
        "version": 1,
        "num_blocks": num_blocks,
        "layout": layout,
        "groups": [{"name": "g", "layers": [{"name": f"l{i}", **layer} for i in range(layers)]}],
    }


# --------------------------------------------------------------------------- long integer literals
@pytest.mark.parametrize("where", ["spec", "table", "config", "compare"])
def test_json_integer_over_4300_digits_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    text = '{"num_blocks": ' + LONG + "}"
    path = write(tmp_path, "big.json", text)
    ok = write(tmp_path, "ok.json", json.dumps(small_spec()))
    argv = {
        "spec": ["plan", path],
        "table": ["check", "--table", path],
        "config": ["plan", "--config", path],
        "compare": ["plot", ok, "--out", str(tmp_path / "x.png"), "--compare", f"spec={path}"],
    }[where]
    expect_exit_2(capsys, argv, "5000 digits", "7777")


def test_python_loaders_refuse_long_integers_with_kvlayout_errors() -> None:
    with pytest.raises(SpecError, match="5000 digits"):
        K.KVCacheSpec.from_json('{"num_blocks": ' + LONG + "}")
    with pytest.raises(TableError, match="5001 digits"):
        K.SegmentTable.from_json('{"total_bytes": -' + LONG + "7}")


@pytest.mark.parametrize("mesh", [f"dp={LONG}", "dp=99999999999", f"dp={MAX_MESH_DEVICES + 1}"])
def test_mesh_axis_sizes_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str], mesh: str) -> None:
    spec = write(tmp_path, "s.json", json.dumps(small_spec()))
    err = expect_exit_2(capsys, ["shard", spec, "--mesh", mesh, "--blocks", "0"], "--mesh", mesh[:12])
    assert str(MAX_MESH_DEVICES) in err
    assert len(err) < 300


def test_mesh_axes_and_devices_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "s.json", json.dumps(small_spec()))
    many = ",".join(f"a{i}=1" for i in range(14_000))
    expect_exit_2(capsys, ["shard", spec, "--mesh", many], "mesh", str(MAX_MESH_AXES))
    expect_exit_2(capsys, ["shard", spec, "--mesh", "dp=256,tp=257"], "mesh_axes['tp'] = 257", "devices")
    with pytest.raises(SpecError, match="more than 65536 devices"):
        ShardedLayout.from_local(K.KVCacheSpec.from_dict(small_spec()), {"dp": 10**7})
    with pytest.raises(SpecError, match="axes"):
        ShardedLayout.from_local(K.KVCacheSpec.from_dict(small_spec()), [(f"a{i}", 1) for i in range(17)])


# --------------------------------------------------------------------------- sharding
def test_route_and_reference_over_the_largest_mesh_are_bounded() -> None:
    """65,536 shards, block-sharded and replicated: route, contract and reference in well under a
    second each (10**7 shards took 115 s when routing looped over shards)."""
    tiny = K.KVCacheSpec.from_dict(
        {
            "num_blocks": 2 * MAX_MESH_DEVICES,
            "layout": "packed",
            "groups": [{"name": "g", "layers": _layers(1)}],
        }
    )
    t0 = time.process_time()
    for block_axes in ((), ("dp",)):
        lay = ShardedLayout.from_local(
            tiny.with_num_blocks(1 if block_axes else MAX_MESH_DEVICES),
            {"dp": MAX_MESH_DEVICES},
            block_axes=block_axes,
        )
        ids = np.arange(0, lay.num_blocks, 7)
        routes = lay.route(ids)
        assert len(routes) == MAX_MESH_DEVICES
        if block_axes:
            assert [r.tolist() for r in routes[:3]] == [[0], [], []]
        else:
            assert routes[5].tolist() == ids.tolist()
    lay = shard_spec(tiny, {"dp": MAX_MESH_DEVICES}, block_axes=("dp",))  # 512 B shards, 32 MiB
    ids = np.arange(1, lay.num_blocks, 3)
    buf = poison_pattern(lay.gathered_bytes)
    before = buf.copy()
    tracemalloc.start()
    try:
        exp = lay.expected_zeroed(ids)
        lay.zero_reference(buf, ids)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB"
    check = lay.compare(before, buf, ids)
    assert check.matches and check.expected.tolist() == exp.tolist() and len(exp) == len(ids)
    dt = time.process_time() - t0
    assert dt < 5.0, f"{dt:.1f} s"


def test_shard_of_rank_honours_replica_axes() -> None:
    local = K.KVCacheSpec.from_dict(small_spec())
    lay = ShardedLayout.from_local(local, {"tp": 4, "r": 2}, shard_axes=("tp",))
    assert [lay.shard_of_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    lay = ShardedLayout.from_local(local, {"r": 2, "tp": 4}, shard_axes=("tp",))
    assert [lay.shard_of_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_split_heads_splits_sliding_window_layers_too() -> None:
    """A sliding-window layer is attention with KV heads: tensor parallelism splits them as it
    splits a full layer's (vLLM's SlidingWindowSpec is an AttentionSpec); MLA and Mamba stay whole."""
    d = small_spec()
    d["groups"][0]["layers"] = [
        {
            "name": "full",
            "kind": "full",
            "block_size": 16,
            "num_kv_heads": 8,
            "head_size": 8,
            "dtype": "bfloat16",
        },
        {
            "name": "swa",
            "kind": "sliding_window",
            "window": 128,
            "block_size": 16,
            "num_kv_heads": 8,
            "head_size": 8,
            "dtype": "bfloat16",
        },
        {"name": "mla", "kind": "mla", "block_size": 16, "head_size": 576, "dtype": "bfloat16"},
    ]
    local = split_heads(K.KVCacheSpec.from_dict(d), 4)
    heads = {layer.name: getattr(layer, "num_kv_heads", None) for _, layer in local.layers}
    assert heads == {"full": 2, "swa": 2, "mla": None}
    assert [layer.kind for _, layer in local.layers] == ["full", "sliding_window", "mla"]
    d["groups"][0]["layers"][1]["num_kv_heads"] = 6
    with pytest.raises(SpecError, match="swa"):
        split_heads(K.KVCacheSpec.from_dict(d), 4)


# --------------------------------------------------------------------------- zero: rows x ids
def test_contract_memory_does_not_grow_with_rows_times_ids() -> None:
    """1,000 layer regions x 20,000 ids: 2 * 10**7 (row, id) ranges, merged into one."""
    spec = K.KVCacheSpec.from_dict(
        {
            "num_blocks": 20_000,
            "layout": "layer_major",
            "groups": [
                {
                    "name": "g",
                    "layers": [
                        {
                            "name": f"l{i}",
                            "kind": "full",
                            "block_size": 1,
                            "num_kv_heads": 1,
                            "head_size": 2,
                            "dtype": "int8",
                        }
                        for i in range(1000)
                    ],
                }
            ],
        }
    )
    table = K.plan(spec)
    ids = np.arange(20_000)
    tracemalloc.start()
    try:
        exp = expected_zeroed(table, ids)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exp.tolist() == [[0, table.total_bytes]]
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB"
    buf = np.zeros(table.total_bytes, np.uint8) + 1
    zero_blocks_numpy(buf, table, ids[::2])
    assert int(np.count_nonzero(buf == 0)) == table.total_bytes // 2


def test_zero_report_ranges_bounded_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1,000 padded rows x 2,000 scattered ids: 2 * 10**6 separate ranges, refused before any buffer."""
    d = small_spec(num_blocks=4000)
    d["groups"][0]["layers"] = [
        {
            "name": f"l{i}",
            "kind": "full",
            "block_size": 1,
            "num_kv_heads": 1,
            "head_size": 2,
            "dtype": "int8",
            "alignment": 8,
        }
        for i in range(1000)
    ]
    spec = write(tmp_path, "s.json", json.dumps(d))
    expect_exit_2(
        capsys, ["zero", spec, "--blocks", ",".join(map(str, range(0, 4000, 2)))], "blocks", "ranges"
    )


def test_expected_zeroed_matches_brute_force_on_random_tables() -> None:
    rng = np.random.default_rng(25)
    for _ in range(300):
        rows = int(rng.integers(1, 6))
        nb = int(rng.integers(1, 30))
        segs = [
            K.Segment(int(rng.integers(0, 40)) * 4, int(rng.integers(-6, 7)) * 4, int(rng.integers(1, 9)) * 4)
            for _ in range(rows)
        ]
        table = K.SegmentTable(10**6, nb, tuple(segs))
        ids = np.unique(rng.integers(0, nb, int(rng.integers(1, 12))))
        starts = np.array([s.base + b * s.stride for s in segs for b in ids.tolist()])
        ends = starts + np.array([s.span for s in segs for _ in ids.tolist()])
        mask = np.zeros(2 * 10**4, bool)
        for a, e in zip((starts + 10**4).tolist(), (ends + 10**4).tolist()):
            mask[a:e] = True
        from kvlayout.reference import mask_to_ranges

        assert expected_zeroed(table, ids).tolist() == mask_to_ranges(mask, 10**4).tolist()


# --------------------------------------------------------------------------- planner padding
def _padding_brute_force(layout: Any) -> tuple[K.Segment, ...]:
    """The padding pass as it was before issue 25: every real range subtracted from every gap."""
    by_stride: dict[int, tuple[list[tuple[int, int, str]], list[tuple[int, int]]]] = {}
    for p in layout.placements:
        for part in p.parts:
            gaps, reals = by_stride.setdefault(part.stride, ([], []))
            reals.append((part.base, part.base + part.span))
            if part.padded > part.span:
                gaps.append((part.base + part.span, part.base + part.padded, p.layer.name))
    stride = layout.block_stride
    if stride is not None and layout.placements:
        widest = max(sum(layer.page for layer in g.layers) for g in layout.spec.groups)
        if stride > widest:
            by_stride.setdefault(stride, ([], []))[0].append((widest, stride, ""))
    out: list[K.Segment] = []
    for stride, (gaps, reals) in by_stride.items():
        for g0, g1, name in gaps:
            pieces = [(g0, g1)]
            for r0, r1 in sorted(reals):
                nxt = []
                for a, b in pieces:
                    if r1 <= a or r0 >= b:
                        nxt.append((a, b))
                        continue
                    if a < r0:
                        nxt.append((a, r0))
                    if r1 < b:
                        nxt.append((r1, b))
                pieces = nxt
            out.extend(K.Segment(a, stride, b - a, "", name, "padding", 0) for a, b in pieces)
    return tuple(out)


def _random_spec(rng: np.random.Generator, layout: str) -> K.KVCacheSpec:
    groups = []
    for gi in range(int(rng.integers(1, 4))):
        layers = []
        for li in range(int(rng.integers(1, 6))):
            name = f"g{gi}.l{li}"
            kind = rng.choice(["full", "mla", "mamba"], p=[0.6, 0.3, 0.1])
            if kind == "full":
                layer: dict[str, Any] = {
                    "kind": "full",
                    "block_size": int(rng.choice([1, 2, 4])),
                    "num_kv_heads": 1 if layout in ("LHBNC", "BHLNC") else int(rng.integers(1, 3)),
                    "head_size": int(rng.choice([2, 4, 8])),
                    "dtype": "bfloat16",
                }
            elif kind == "mla":
                layer = {
                    "kind": "mla",
                    "block_size": 4,
                    "head_size": int(rng.choice([2, 6, 10])),
                    "dtype": "bfloat16",
                }
            else:
                layer = {"kind": "mamba", "state_bytes": int(rng.integers(1, 20)) * 4}
            if rng.random() < 0.6:
                layer["alignment"] = int(rng.choice([8, 12, 32, 48, 100]))
            if rng.random() < 0.15 and layout not in ("LHBNC",):
                layer["block_stride_alignment"] = int(rng.choice([16, 64]))
            layers.append({"name": name, **layer})
        groups.append({"name": f"g{gi}", "layers": layers})
    return K.KVCacheSpec.from_dict({"num_blocks": 3, "layout": layout, "groups": groups})


def test_padding_pass_equals_the_brute_force_on_random_specs() -> None:
    from kvlayout.planner import _padding, plan_layout
    from kvlayout.spec import ALL_LAYOUTS

    rng = np.random.default_rng(2025)
    checked = 0
    for i in range(600):
        layout = ALL_LAYOUTS[i % len(ALL_LAYOUTS)]
        try:
            lay = plan_layout(_random_spec(rng, layout))
        except SpecError:
            continue
        assert _padding(lay) == _padding_brute_force(lay), lay.spec.to_json()
        checked += 1
    assert checked > 300


def test_padding_pass_is_not_quadratic() -> None:
    """5,000 aligned layers (12 s before issue 25; 10,000 took 50 s: quadratic): one gap each."""
    from kvlayout.planner import _padding, plan_layout

    layers = tuple(
        K.FullAttentionSpec(
            name=f"l{i}", block_size=1, num_kv_heads=1, head_size=2, dtype="int8", alignment=16
        )
        for i in range(5000)
    )
    for layout in ("packed", "layer_major"):
        lay = plan_layout(K.KVCacheSpec(num_blocks=4, layout=layout, groups=(K.GroupSpec("g", layers),)))
        t0 = time.process_time()
        pad = _padding(lay)
        dt = time.process_time() - t0
        assert dt < 2.0, f"{layout}: {dt:.1f} s"
        assert len(pad) == 5000 and {s.span for s in pad} == {12}


# --------------------------------------------------------------------------- plot --out
@pytest.mark.parametrize("out", ["DIR", "DIR/", "/proc/x.png", "/sys/x.png", "/proc/self/x.png"])
def test_plot_out_must_be_a_writable_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str
) -> None:
    spec = write(tmp_path, "s.json", json.dumps(small_spec()))
    folder = tmp_path / "d.png"
    folder.mkdir()
    out = out.replace("DIR", str(folder))
    expect_exit_2(capsys, ["plot", spec, "--out", out], "--out")
    assert list(folder.iterdir()) == []  # nothing written as d.png/.png


# --------------------------------------------------------------------------- native specs
NATIVE = {
    "version": 1,
    "layout": "native",
    "leaves": [
        {"name": "layer.0", "shape": [8, 16, 2, 2, 128], "dtype": "bfloat16", "group": "full"},
        {"name": "layer.1", "shape": [8, 2, 32, 640], "dtype": "bfloat16", "group": "mla"},
    ],
}


def test_native_spec_file_is_planned_checked_and_zeroed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvlayout.cli import main

    spec = write(tmp_path, "n.json", json.dumps(NATIVE))
    assert main(["plan", spec]) == 0
    assert (
        "layer.1: [8, 2, 32, 640] bfloat16 group mla: base 0 stride 81920 span 81920"
        in capsys.readouterr().out
    )
    assert main(["check", spec]) == 0
    assert "2 arrays: SAFE" in capsys.readouterr().out
    assert main(["zero", spec, "--blocks", "0,7", "--group", "mla", "--backend", "reference", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [(a["name"], a["zeroed_bytes"]) for a in rep["arrays"]] == [("layer.0", 0), ("layer.1", 2 * 81920)]
    assert rep["matches_contract"] and rep["group"] == "mla"
    expect_exit_2(capsys, ["shard", spec, "--mesh", "dp=2"], "native", "plan, check, zero")


def test_native_zero_of_an_unknown_group_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write(tmp_path, "n.json", json.dumps(NATIVE))
    expect_exit_2(capsys, ["zero", spec, "--blocks", "0", "--group", "nope"], "'nope'", "'full', 'mla'")
    cfg = str(Path(__file__).parent / "fixtures" / "models" / "llama" / "config.json")
    argv = ["zero", "--config", cfg, "--engine", "tpu-inference", "--blocks", "0", "--group", "nope"]
    expect_exit_2(capsys, [*argv, "--backend", "reference"], "'nope'", "valid groups: '")


# --------------------------------------------------------------------------- plot size bounds
def _layers(n: int, prefix: str = "l", **extra: Any) -> list[dict[str, Any]]:
    base = {"kind": "full", "block_size": 1, "num_kv_heads": 1, "head_size": 2, "dtype": "int8", **extra}
    return [{"name": f"{prefix}{i}", **base} for i in range(n)]


def test_plot_of_a_spec_too_large_to_draw_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 3,000-layer byte map took 72 s (10**5 layers: 15 min, 4 GB); refused before planning."""
    from kvlayout.cli import MAX_PLOT_GROUPS, MAX_PLOT_LAYERS, MAX_PLOT_ROWS

    big = {"num_blocks": 4, "layout": "packed", "groups": [{"name": "g", "layers": _layers(2100)}]}
    spec = write(tmp_path, "big.json", json.dumps(big))
    out = str(tmp_path / "x.png")
    expect_exit_2(capsys, ["plot", spec, "--out", out], "2100 layers", str(MAX_PLOT_LAYERS))
    table = write(tmp_path, "t.json", K.plan(K.KVCacheSpec.from_dict(big)).to_json())
    expect_exit_2(capsys, ["plot", "--table", table, "--out", out], "2100 rows", str(MAX_PLOT_ROWS))
    # --kind steps draws a bar per group shape: 100 shapes took 15 s, 2,000 past 120 s
    groups = [{"name": f"g{j}", "layers": _layers(1, f"g{j}.l", head_size=2 * (j + 1))} for j in range(100)]
    spec = write(tmp_path, "g.json", json.dumps({"num_blocks": 4, "layout": "packed", "groups": groups}))
    expect_exit_2(capsys, ["plot", spec, "--kind", "steps", "--out", out], "100 groups", str(MAX_PLOT_GROUPS))
    assert not Path(out).exists()


# --------------------------------------------------------------------------- kvlayout.viz's Python API
@pytest.mark.parametrize("bad", [[True], [1.5], ["1"], [100], [-1], [2**64], []])
def test_viz_block_ids_are_checked(bad: list[Any]) -> None:
    from kvlayout import viz
    from kvlayout.errors import BlockIdError

    spec = K.preset("dsv4-test")  # 100 blocks
    for draw in (
        lambda: viz.byte_map(spec, bad),
        lambda: viz.table_map(K.plan(spec), bad),
        lambda: viz.compare_maps(spec, spec, blocks=bad),
        lambda: (
            viz.step_bytes(K.plan(spec), {"mla": bad})
            if bad
            else viz.step_bytes(K.plan(spec), {"mla": [1.0]})
        ),
    ):
        with pytest.raises(BlockIdError):
            draw()


@pytest.mark.parametrize("bad", [True, 1.5, "5", -1, 2**70, None])
def test_viz_byte_offsets_are_checked(bad: Any) -> None:
    from kvlayout import viz
    from kvlayout.errors import KVLayoutError

    with pytest.raises(KVLayoutError, match="byte_offset"):
        viz.describe_at(K.preset("dsv4-test"), bad)
    with pytest.raises(KVLayoutError, match="new_blocks"):
        viz.bytes_per_step(K.preset("dsv4-test"), new_blocks=bad)


def test_planning_many_groups_is_not_quadratic() -> None:
    """5,000 one-layer groups beside a 5,000-layer group: every placement used to scan every
    group for its own (build_table) and every slot every group (layer-outer orders)."""
    groups = [{"name": f"g{j}", "layers": _layers(1, f"g{j}.l", alignment=16)} for j in range(5000)]
    groups.append({"name": "big", "layers": _layers(5000, "big.l", alignment=16)})
    parsed = K.KVCacheSpec.from_dict({"num_blocks": 4, "layout": "packed", "groups": groups})
    for layout in ("packed", "layer_major"):
        spec = K.KVCacheSpec(num_blocks=4, layout=layout, groups=parsed.groups)
        t0 = time.process_time()
        table = K.plan(spec)
        dt = time.process_time() - t0
        assert dt < 3.0, f"{layout}: {dt:.1f} s"  # 0.3 s here; 23 s when quadratic
        assert len(table) == 10_000 and len(table.padding) == 10_000  # each group's gap [4, 16)
