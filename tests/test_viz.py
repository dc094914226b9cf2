"""Pictures (kvlayout/viz/, `kvlayout plot`): each test checks what a picture shows (lanes, colours,
annotations, insets, red only where unsafe), and describe_at / the explorer against the layout."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.cli import main

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from kvlayout import viz  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RED = (1.0, 0.0, 0.0)


@pytest.fixture(autouse=True)
def _close_figures() -> Any:
    yield
    plt.close("all")


def _has_color(img: np.ndarray, rgb: tuple[float, ...] | str, tol: float = 0.02) -> bool:
    c = to_rgb(rgb) if isinstance(rgb, str) else rgb
    return bool((np.abs(img[..., :3] - np.array(c[:3])) < tol).all(axis=-1).any())


def _png(fig: Any, path: Path, dpi: int = 80) -> np.ndarray:
    fig.savefig(path, dpi=dpi)
    return mpl.image.imread(path)


def _texts(ax: Any) -> str:
    return "\n".join(t.get_text() for t in ax.texts) + "\n" + ax.get_title(loc="left")


def _legend(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _patches(ax: Any, prefix: str) -> list[Any]:
    return [p for p in ax.patches if (p.get_gid() or "").startswith(prefix)]


def _mamba_spec() -> K.KVCacheSpec:
    return K.KVCacheSpec(
        num_blocks=8,
        layout="packed",
        groups=(
            K.GroupSpec(
                "attn",
                (
                    K.FullAttentionSpec("L0", 16, 2, 64, "bfloat16", alignment=4096),
                    K.MambaSpec("mamba0", 6000, alignment=512),
                ),
            ),
            K.GroupSpec("swa", (K.SlidingWindowSpec("S0", 16, 2, 64, "bfloat16", window=128),)),
        ),
    )


# --------------------------------------------------------------------------- kinds, lanes, colours
def test_layer_kinds_from_class_and_name() -> None:
    kinds = {viz.layer_kind(layer) for _, layer in K.preset("dsv4").layers}
    assert kinds == {"compressed", "indexer", "sliding window"}
    assert {viz.layer_kind(layer) for _, layer in K.preset("llama-8b").layers} == {"attention"}
    spec = _mamba_spec()
    assert [viz.layer_kind(layer) for _, layer in spec.layers] == ["attention", "mamba", "sliding window"]
    assert viz.layer_kind(K.MLASpec("m", 16, 576, dtype="bfloat16")) == "attention"


def test_group_pattern() -> None:
    assert viz.group_pattern(["c4.0", "c4.1", "c4.10"]) == "c4.*"
    assert viz.group_pattern(["swa.3"]) == "swa.3"
    assert viz.group_pattern(["a", "b"]) == "a..."


def test_dsv4_collapses_to_four_lanes_per_block_and_fits_one_screen(tmp_path: Path) -> None:
    lanes = viz.group_lanes(K.plan_layout(K.preset("dsv4")))
    assert [lane.label for lane in lanes] == [
        "\u00d7 11 groups like c4.*",
        "\u00d7 10 groups like c128.*",
        "\u00d7 24 groups like swa.*",
        "swa.24",
    ]
    assert sum(len(lane.groups) for lane in lanes) == 46
    fig = viz.byte_map(K.preset("dsv4"))
    ax = fig.axes[0]
    info = ax.kvlayout
    assert len(info.lanes) <= 24 and len(info.lanes) % 4 == 0
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "block 0 \u00b7 \u00d7 11 groups like c4.*" in labels and "block 99 \u00b7 swa.24" in labels
    assert fig.get_size_inches()[1] * 110 <= 1200, "one screen at the CLI's 110 dpi"
    legend = _legend(ax)
    assert legend[:3] == ["compressed", "indexer", "sliding window"]  # kinds, not 181 layers
    assert "alignment gap (never zeroed)" in legend and len(legend) <= 8
    # kind colours on the page; every drawn layer box has one of them
    img = _png(fig, tmp_path / "dsv4.png")
    for kind in ("compressed", "indexer", "sliding window"):
        assert _has_color(img, viz.KIND_COLORS[kind][0]), kind
    colors = {p.get_facecolor()[:3] for p in _patches(ax, "layer:")}
    allowed = {to_rgb(c) for pair in viz.KIND_COLORS.values() for c in pair}
    assert {tuple(round(x, 4) for x in c) for c in colors} <= {tuple(round(x, 4) for x in c) for c in allowed}


def test_collapse_off_gives_a_lane_per_group() -> None:
    fig = viz.byte_map(K.preset("dsv4"), blocks=[0], collapse=False, insets=False, max_lanes=100)
    assert len(fig.axes[0].kvlayout.lanes) == 46


def test_few_layers_get_one_colour_each() -> None:
    layout = K.plan_layout(K.preset("dsv4-test"))
    colors = viz.layer_colors(layout)
    assert len(set(colors.values())) == 4
    fig = viz.byte_map(layout)
    ax = fig.axes[0]
    assert [t for t in _legend(ax) if "self_attn" in t] == [
        f"layers.{i}.self_attn (compressed)" for i in range(4)
    ]
    for p in _patches(ax, "layer:"):
        assert to_rgb(p.get_facecolor()) == to_rgb(colors[p.get_gid()[6:]])
    assert not any(to_rgb(c) == RED for c in colors.values())


def test_collapsed_groups_share_their_lane_colours() -> None:
    colors = viz.layer_colors(K.plan_layout(K.preset("dsv4")))
    assert len(colors) == 181
    assert colors["model.layers.0.attn"] == colors["model.layers.4.attn"]  # c4.0 and c4.1, layer 0


def test_span_arrow_names_a_zeroed_layer() -> None:
    # the first gap of the row is a Mamba state's, which zeroing never clears: the span arrow skips it
    spec = K.KVCacheSpec(
        num_blocks=4,
        layout="packed",
        groups=(
            K.GroupSpec(
                "g",
                (
                    K.MambaSpec("m0", 6000, alignment=512),
                    K.FullAttentionSpec("a0", 16, 2, 64, "bfloat16", alignment=12288),
                ),
            ),
        ),
    )
    text = _texts(viz.byte_map(spec, insets=False).axes[0])
    assert "page 12,288 B = span + 4,096 B gap (a0)" in text and "span 8,192 B: what zeroing clears" in text


def test_padding_is_drawn() -> None:
    fig = viz.byte_map(K.preset("dsv4-test").with_num_blocks(2), blocks=[0, 1], insets=False)
    gaps = _patches(fig.axes[0], "gap:")
    assert len(gaps) == 4 * 2  # one alignment gap per layer per block
    assert all(p.get_width() == 64 and p.get_hatch() == "///" for p in gaps)


def test_mamba_state_is_drawn_as_never_zeroed() -> None:
    fig = viz.byte_map(_mamba_spec(), insets=False)
    boxes = _patches(fig.axes[0], "layer:mamba0")
    assert boxes and all(p.get_hatch() == "...." for p in boxes)
    assert "Mamba" not in " ".join(_legend(fig.axes[0]))  # 3 layers: coloured one by one
    fig = viz.byte_map(_mamba_spec(), insets=False, color_by="kind")
    assert "Mamba state (never zeroed)" in _legend(fig.axes[0])


# --------------------------------------------------------------------------- annotations and insets
def test_stride_page_span_arrows_and_marks() -> None:
    fig = viz.byte_map(K.preset("dsv4-test"))
    ax = fig.axes[0]
    text = _texts(ax)
    assert "stride 149,760 B" in text
    assert "page 37,440 B = span + 64 B gap" in text
    assert "span 37,376 B: what zeroing clears" in text
    ends = [line for line in ax.lines if line.get_gid() == "end"]
    bounds = [line for line in ax.lines if line.get_gid() == "boundary"]
    assert len(ends) == 1 and list(ends[0].get_xdata()) == [149_760, 149_760]
    assert len(bounds) == 3  # blocks 0, 1 and 50; block 99 ends the buffer
    assert "end of buffer\n 14,976,000 B" in text
    assert ax.get_xlim()[1] > 149_760  # the marks are inside the picture


def test_insets_zoom_on_the_gap_the_boundary_and_the_end() -> None:
    fig = viz.byte_map(K.preset("dsv4-test"))
    main_ax, *insets = fig.axes
    assert main_ax.kvlayout.insets == ["A", "B", "C"] and len(insets) == 3
    a, b, c = ("\n".join(t.get_text() for t in ax.texts) for ax in insets)
    assert "37,376\nspan ends" in a and "37,440\npage ends" in a and "64 B" in a
    assert "149,696" in b and "149,760\nblock 1 starts" in b
    assert "14,975,936" in c and "14,976,000\n= total_bytes" in c
    for ax in insets:
        lo, hi = ax.get_xlim()
        assert hi - lo < 1000, "byte scale"
        assert len(_patches(ax, "gap:")) >= 1  # the 64 B gap is a visible share of the inset
        gap = _patches(ax, "gap:")[0]
        assert gap.get_width() / (hi - lo) > 0.1
    assert _patches(insets[2], "outside")  # past the end of the buffer, hatched (not red)
    for letter in "ABC":
        assert any(t.get_text() == letter for t in main_ax.texts)


def test_inset_offsets_follow_the_block(tmp_path: Path) -> None:
    fig = viz.byte_map(K.preset("dsv4-test"), blocks=[5, 99])
    a = "\n".join(t.get_text() for t in fig.axes[1].texts)
    assert f"{5 * 149_760 + 37_376:,}" in a  # buffer offsets of block 5's gap


def test_no_gap_no_inset() -> None:
    fig = viz.byte_map(K.preset("llama-8b"))
    assert len(fig.axes) == 1 and fig.axes[0].kvlayout.insets == []
    text = _texts(fig.axes[0])
    assert "K half: span = page 32,768 B, no gap" in text
    assert "one block: 32 slot pages, 2,097,152 B" in text


def test_dsv4_insets_show_every_lane_at_the_gap() -> None:
    fig = viz.byte_map(K.preset("dsv4"))
    a = fig.axes[1]
    assert [t.get_text() for t in a.get_yticklabels()] == ["c4.*", "c128.*", "swa.*", "swa.24"]
    assert "37,376\nspan ends" in "\n".join(t.get_text() for t in a.texts)


# --------------------------------------------------------------------------- red only where unsafe
def _prefix_table() -> K.SegmentTable:
    from tests.test_verify import prefix_table

    return prefix_table()


@pytest.mark.parametrize("name", ["dsv4-test", "dsv4", "llama-8b"])
def test_safe_pictures_have_no_red(tmp_path: Path, name: str) -> None:
    spec = K.preset(name)
    for i, fig in enumerate([viz.byte_map(spec), viz.table_map(K.plan(spec)), viz.bytes_per_step(spec)]):
        assert not _has_color(_png(fig, tmp_path / f"{i}.png"), RED), (name, i)
        assert not any(_patches(ax, "unsafe") for ax in fig.axes)


def test_unsafe_table_red_exactly_where_blocks_share_bytes(tmp_path: Path) -> None:
    bad = _prefix_table()
    fig = viz.table_map(bad, blocks=[0, 1, 99])
    ax = fig.axes[0]
    assert _has_color(_png(fig, tmp_path / "bad.png"), RED)
    assert "UNSAFE" in ax.get_title(loc="left")
    red = sorted((round(p.get_x()), round(p.get_x() + p.get_width())) for p in _patches(ax, "unsafe"))
    # block 0: rows 1-3 spill into block 1 from 149,760; block 1: block 0's spill covers [0, 112,320)
    assert (149_760, 187_200) in red and (149_760, 262_080) in red
    assert (0, 112_320) in red and (37_440, 112_320) in red  # block 1's rows 0 and 1, written by block 0 too
    assert all(a >= 37_440 or b <= 112_320 for a, b in red)
    outside = _patches(ax, "outside")
    assert outside and all(p.get_x() >= 149_760 for p in outside)  # block 99 past 14,976,000 = x 149,760


def test_unsafe_inset_draws_the_first_spill_at_byte_scale() -> None:
    fig = viz.table_map(_prefix_table())
    assert len(fig.axes) == 2
    inset = fig.axes[1]
    lo, hi = inset.get_xlim()
    assert hi - lo == 512 and lo < 149_760 < hi
    assert "149,760\nblock 1 starts" in [t.get_text() for t in inset.texts]
    assert "first spill" in inset.get_title(loc="left") and "invariant 3" in inset.get_title(loc="left")
    assert _patches(inset, "unsafe")
    labels = [t.get_text() for t in inset.get_yticklabels()]
    assert "block 1, row 0 (layers.0.self_attn)" in labels


def test_safe_table_has_no_inset() -> None:
    assert len(viz.table_map(K.plan(K.preset("dsv4-test"))).axes) == 1


def _brute_conflicts(table: K.SegmentTable, block: int, lo: int, hi: int) -> set[int]:
    out = set()
    for x in range(lo, hi):
        if x < 0 or x >= table.total_bytes:
            out.add(x)
        for s in table.segments:
            for b in range(table.num_blocks):
                if b != block and s.base + b * s.stride <= x < s.base + b * s.stride + s.span:
                    out.add(x)
        for s in table.padding:
            for b in range(table.num_blocks):
                if s.base + b * s.stride <= x < s.base + b * s.stride + s.span:
                    out.add(x)
    return out


def test_conflicts_against_brute_force() -> None:
    rng = random.Random(18)
    for _ in range(150):
        n = rng.randint(1, 5)
        rows = tuple(
            K.Segment(
                rng.randrange(-8, 40, 4), rng.choice([-12, -8, 0, 4, 8, 12, 16, 24]), rng.randrange(4, 28, 4)
            )
            for _ in range(rng.randint(1, 3))
        )
        pad = tuple(
            K.Segment(rng.randrange(0, 40, 4), rng.choice([8, 16]), 4) for _ in range(rng.randint(0, 1))
        )
        t = K.SegmentTable(rng.randrange(40, 120, 4), n, rows, pad)
        for r in rows:
            for b in range(n):
                a = r.base + b * r.stride
                shared, outside = viz.maps._conflicts(t, b, a, a + r.span)
                got = {x for c0, c1 in [*shared.tolist(), *outside.tolist()] for x in range(c0, c1)}
                assert got == _brute_conflicts(t, b, a, a + r.span), (t, r, b)


def test_layer_major_table_is_drawn_in_each_rows_frame() -> None:
    fig = viz.table_map(K.plan(K.preset("llama-8b")))
    ax = fig.axes[0]
    assert ax.get_xlim()[1] < 40_000  # 32,768 B per row, not the 134 MB buffer
    assert len([line for line in ax.lines if line.get_gid() == "boundary"]) >= 64


# --------------------------------------------------------------------------- describe_at and hover
def test_describe_at_dsv4_test() -> None:
    spec = K.preset("dsv4-test")
    gap = viz.describe_at(spec, 37_400)
    assert "block 0, byte 37,400 of its 149,760 B row" in gap
    assert "byte 24 of a 64 B alignment gap" in gap and "never zeroed" in gap
    first = viz.describe_at(spec, 149_760 + 5)
    assert "block 1, byte 5 of its 149,760 B row" in first
    assert (
        "group mla, layers.0.self_attn [compressed] page: byte 5 of its 37,376 B span, zeroed with block 1"
        in first
    )
    assert "outside the buffer" in viz.describe_at(spec, 14_976_000)
    assert "group mla" in viz.describe_at(K.plan(spec), 10)


def test_describe_at_collapses_overlaid_groups() -> None:
    text = viz.describe_at(K.preset("dsv4"), 0)
    assert "11 groups like c4.*" in text and "[compressed]" in text
    assert "24 groups like swa.*" not in text and "25 groups like swa.*" in text  # swa.24 has a layer 0 too
    assert "10 groups like c128.*" in text
    tail = viz.describe_at(K.preset("dsv4"), 149_700 + 149_760 * 3)
    assert "block 3, byte 149,700" in tail and "24 groups like swa.*" in tail and "alignment gap" in tail
    # a table JSON carries no padding: the gap is a byte no row clears
    table = K.SegmentTable.from_json(K.plan(K.preset("dsv4-test")).to_json())
    assert "no row clears it" in viz.describe_at(table, 37_400)


def test_describe_at_unsafe_table_names_both_blocks() -> None:
    text = viz.describe_at(_prefix_table(), 149_860)
    assert "row 0" in text and "zeroed with block 1" in text and "zeroed with block 0" in text
    assert "UNSAFE: blocks 0 and 1 both clear this byte (invariant 3)" in text
    past = viz.describe_at(_prefix_table(), 14_976_000 + 8)
    assert "outside the buffer" in past and "invariant 2" in past


def test_describe_at_layer_major_halves_and_mamba() -> None:
    lay = K.plan_layout(K.preset("llama-8b"))
    half = 32_768 * 64
    text = viz.describe_at(lay, half + 5)
    assert "slot 0, block 0, byte 32,773" in text and "layers.0.self_attn [attention] v: byte 5" in text
    text = viz.describe_at(_mamba_spec(), 8192 + 10)
    assert "mamba0" in text and "state" in text and "never zeroed" in text


def test_geometry_round_trip() -> None:
    for spec in (K.preset("llama-8b"), viz.with_layout(K.preset("dsv4"), "layer_major"), K.preset("dsv4")):
        lay = K.plan_layout(spec)
        geo = viz.Geometry(lay)
        rng = random.Random(1)
        for _ in range(200):
            b, x = rng.randrange(lay.num_blocks), rng.randrange(geo.width)
            off = geo.to_buffer(b, x)
            assert 0 <= off < lay.total_bytes
            assert geo.to_row(off)[:2] == (b, x)


def test_hover_reads_the_byte_under_the_mouse() -> None:
    from matplotlib.backend_bases import MouseEvent

    fig = viz.byte_map(K.preset("dsv4-test"), insets=False)
    ax = fig.axes[0]
    viz.attach_hover(fig)
    fig.canvas.draw()
    top = ax.kvlayout.lanes[0][0]
    px, py = ax.transData.transform((37_420, top + 0.4))
    event = MouseEvent("motion_notify_event", fig.canvas, px, py)
    fig.canvas.callbacks.process("motion_notify_event", event)
    note = ax.kvlayout_note
    assert note.get_visible() and "alignment gap" in note.get_text() and "block 0" in note.get_text()
    assert viz.hover_text(ax.kvlayout, 10, -2.0) is None  # the header is not a lane
    with pytest.raises(ValueError, match="byte_map"):
        viz.attach_hover(plt.figure())


# --------------------------------------------------------------------------- comparisons and steps
def test_variants() -> None:
    llama = K.preset("llama-8b")
    assert K.plan(viz.variant(llama, {"dtype": "float32"})).total_bytes == 2 * K.plan(llama).total_bytes
    assert K.plan(viz.variant(llama, [("tp", "2")])).total_bytes == K.plan(llama).total_bytes // 2
    packed = viz.variant(llama, {"layout": "packed"})
    assert packed.layout == "packed" and not any(layer.split_kv for _, layer in packed.layers)
    assert K.verify(K.plan(packed)).ok
    dsv4 = K.preset("dsv4")
    assert viz.variant(dsv4, {"tp": 2}) == dsv4  # MLA latents are kept whole on every tp shard
    bf16 = K.plan(viz.variant(dsv4, {"dtype": "bfloat16"}))
    assert bf16.segments[0].span == 64 * 512 * 2
    assert viz.variant(dsv4, {"preset": "dsv4-test", "num_blocks": "7"}).num_blocks == 7
    with pytest.raises(K.SpecError, match="fp8_ds_mla applies to mla layers"):
        viz.with_dtype(llama, "fp8_ds_mla")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("tp=x", "decimal integer"),
        ("frob=1", "KEY=VALUE"),
        ("layout=rows", "valid: packed"),
        ("tp=0", "[1, 4096]"),
        ("dtype=int4", "valid:"),
        ("preset=nope", "valid:"),
        ("tp=2,tp=4", "given twice"),
        ("", "KEY=VALUE"),
        ("preset=dsv4,spec=x.json", "not both"),
    ],
)
def test_parse_compare_refuses(text: str, needle: str) -> None:
    with pytest.raises(K.SpecError) as e:
        viz.parse_compare(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_compare_maps_share_one_byte_scale() -> None:
    llama = K.preset("llama-8b")
    fig = viz.compare_maps(llama, viz.variant(llama, {"tp": 2}), ("llama-8b", "tp=2"))
    top, bottom = fig.axes
    assert top.get_xlim() == bottom.get_xlim()
    sup = fig._suptitle.get_text()
    assert "tp=2 against llama-8b: buffer 0.50x" in sup and "bytes zeroed per block 0.50x" in sup
    assert "2,097,152 B zeroed per block: SAFE" in top.get_title(loc="left")
    assert "1,048,576 B zeroed per block: SAFE" in bottom.get_title(loc="left")
    assert [b for _, b, _ in top.kvlayout.lanes] == [0, 63]


def _brute_step(table: K.SegmentTable, alloc: dict[str, list[int]]) -> tuple[int, int]:
    def union(rows: list[K.Segment], ids: list[int]) -> int:
        covered: set[int] = set()
        for s in rows:
            for b in ids:
                covered.update(range(s.base + b * s.stride, s.base + b * s.stride + s.span))
        return len(covered)

    per = sum(union([s for s in table.segments if s.group == g], ids) for g, ids in alloc.items())
    return per, union(list(table.segments), [i for ids in alloc.values() for i in ids])


def test_step_bytes_per_group_against_all_groups() -> None:
    table = K.plan(K.preset("dsv4").with_num_blocks(8))
    for alloc in ({"c128.0": [0]}, {"c4.3": [1, 2]}, {"swa.24": [3], "c128.9": [4, 5]}):
        assert viz.step_bytes(table, alloc) == _brute_step(table, alloc)
    per, every = viz.step_bytes(table, {"c128.0": [0]})
    assert per == 4 * 1168 and every == table.bytes_per_block


def test_bytes_per_step_chart() -> None:
    fig = viz.bytes_per_step(K.preset("dsv4"))
    ax = fig.axes[0]
    data = ax.kvlayout_steps
    assert [d[0] for d in data][:4] == [
        "11 groups like c4.*: 16 new blocks",
        "10 groups like c128.*: 16 new blocks",
        "24 groups like swa.*: 16 new blocks",
        "swa.24: 16 new blocks",
    ]
    assert data[-1][0] == "mixed: 2 new blocks for each of 46 groups"
    assert all(p <= e for _, p, e in data)
    assert data[1][1] == 16 * 4 * 1168  # c128: four 1,168 B spans per block
    assert len(ax.patches) == 2 * len(data)
    assert any("(3.1 %)" in t.get_text() for t in ax.texts)
    # a table JSON (no layout) groups rows by their provenance
    t = K.SegmentTable.from_json(K.plan(K.preset("dsv4")).to_json())
    assert [d[1:] for d in viz.bytes_per_step(t).axes[0].kvlayout_steps] == [d[1:] for d in data]


# --------------------------------------------------------------------------- the command line
def test_plot_cli_dsv4_is_one_screen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dsv4.png"
    assert main(["plot", "--preset", "dsv4", "--out", str(out)]) == 0
    img = mpl.image.imread(out)
    assert img.shape[0] <= 1200 and img.shape[1] <= 1500
    assert _has_color(img, viz.KIND_COLORS["indexer"][0]) and not _has_color(img, RED)


@pytest.mark.parametrize("kind", ["table", "diff", "steps"])
def test_plot_kinds(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"{kind}.png"
    assert main(["plot", "--preset", "dsv4-test", "--kind", kind, "--blocks", "0,99", "--out", str(out)]) == 0
    img = mpl.image.imread(out)
    assert img.shape[1] > 500 and not _has_color(img, RED)  # a safe table: nothing red


def test_plot_table_json_draws_the_spill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(_prefix_table().to_json())
    out = tmp_path / "bad.png"
    assert main(["plot", "--table", str(path), "--out", str(out)]) == 0
    assert _has_color(mpl.image.imread(out), RED)


def test_plot_compare_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp.png"
    assert main(["plot", "--preset", "llama-8b", "--compare", "tp=2,dtype=float32", "--out", str(out)]) == 0
    img = mpl.image.imread(out)
    assert img.shape[0] > 600 and _has_color(img, viz.KIND_COLORS["attention"][0])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--compare", "tp=x"], "decimal integer"),
        (["--compare", "layout=layer_major", "--kind", "table"], "--compare draws two byte maps"),
        (["--compare", "spec=/no/such.json"], "No such file"),
        (["--compare", "dtype=fp8_ds_mla", "--preset", "llama-8b"], "fp8_ds_mla applies to mla layers"),
        (["--table", "t.json", "--kind", "map"], "--table draws --kind table or steps"),
        (["--table", "t.json", "--preset", "dsv4"], "not both"),
    ],
)
def test_plot_misuse_is_exit_2_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    (tmp_path / "t.json").write_text(K.plan(K.preset("dsv4-test")).to_json())
    argv = [str(tmp_path / a) if a == "t.json" else a for a in argv]
    if "--preset" not in argv and "--table" not in argv:
        argv += ["--preset", "dsv4"]
    assert main(["plot", *argv, "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def test_bad_compare_is_refused_before_matplotlib_is_imported(tmp_path: Path) -> None:
    argv = ["plot", "--preset", "dsv4", "--compare", "tp=0", "--out", str(tmp_path / "x.png")]
    code = f"import sys; from kvlayout.cli import main; print(main({argv!r}), 'matplotlib' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.stdout.split() == ["2", "False"], res.stderr


def test_plot_model_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = ROOT / "tests" / "fixtures" / "models" / "deepseek_v4" / "config.json"
    if not config.exists() or viz.interactive._models() is None:
        pytest.skip("kvlayout.models and its fixtures are not here")
    out = tmp_path / "cfg.png"
    assert main(["plot", "--config", str(config), "--out", str(out)]) == 0
    img = mpl.image.imread(out)
    assert (
        img.shape[0] <= 1200 and _has_color(img, viz.KIND_COLORS["indexer"][0]) and not _has_color(img, RED)
    )
    assert main(["plot", "--config", str(config), "--table", str(out), "--out", str(out)]) == 2
    assert "not both" in capsys.readouterr().err


# --------------------------------------------------------------------------- the committed pictures
def test_readme_picture_shows_the_gap_and_the_stride() -> None:
    img = mpl.image.imread(ROOT / "docs" / "byte_map_dsv4_test.png")
    for c in viz.layer_colors(K.plan_layout(K.preset("dsv4-test"))).values():
        assert _has_color(img, c)
    assert _has_color(img, viz.PAD_COLOR, tol=0.03)  # the gap, visible only in the insets
    assert not _has_color(img, RED)
    assert img.shape[0] <= 1200


def test_dsv4_picture_is_readable() -> None:
    img = mpl.image.imread(ROOT / "docs" / "byte_map_dsv4.png")
    assert img.shape[0] <= 1200 and img.shape[1] <= 1500
    for kind in ("compressed", "indexer", "sliding window"):
        assert _has_color(img, viz.KIND_COLORS[kind][0]), kind


# --------------------------------------------------------------------------- the explorer
def test_explorer_updates_on_every_control(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    ex = viz.Explorer("dsv4-test")
    first = ex.image.value
    assert first[:4] == b"\x89PNG" and "SAFE" in ex.proof.value and "segment" not in ex.status.value
    ex.offset.value = 37_400
    assert "alignment gap" in ex.info.value and ex.image.value != first
    ex.block.value = 99
    assert "block 99" in ex.info.value
    ex.source.value = "llama-8b"
    assert "134,217,728 B buffer" in ex.status.value and ex.block.max == 63
    ex.tp.value = 2
    assert "67,108,864 B buffer" in ex.status.value
    ex.dtype.value = "float32"
    assert "134,217,728 B buffer" in ex.status.value
    ex.layout.value = "packed"
    assert ex.spec is not None and ex.spec.layout == "packed" and "<table>" in ex.table.value
    ex.num_blocks.value = 8
    assert ex.spec.num_blocks == 8 and ex.block.max == 7
    ex.source.value = "spec file"
    assert "color:red" in ex.status.value  # no path yet: the error is shown, the last picture kept
    spec_path = tmp_path / "s.json"
    spec_path.write_text(json.dumps(K.preset("dsv4-test").with_num_blocks(3).to_dict()))
    ex.path.value = str(spec_path)
    assert ex.spec.num_blocks == 3 and "color:red" not in ex.status.value
    assert ex.describe().startswith("byte ")


def test_explorer_reads_a_model_config_per_tp_rank() -> None:
    pytest.importorskip("ipywidgets")
    config = ROOT / "tests" / "fixtures" / "models" / "llama" / "config.json"
    if not config.exists() or viz.interactive._models() is None:
        pytest.skip("kvlayout.models and its fixtures are not here")
    from kvlayout.models import spec_from_config

    ex = viz.Explorer("model config", str(config))
    assert "model config" in ex.source.options and ex.spec == spec_from_config(str(config))
    ex.tp.value = 2
    assert ex.spec == spec_from_config(str(config), tp=2)  # the config's own tp rule, not split_heads again
