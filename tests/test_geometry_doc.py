"""docs/GEOMETRY.md is pinned to the code: its JSON examples and worked numbers are recomputed here."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeGuard

import pytest

import kvlayout
from kvlayout import registry
from kvlayout.cli import main
from kvlayout.spec import MLASpec

DOC = Path(__file__).resolve().parent.parent / "docs" / "GEOMETRY.md"
TEXT = DOC.read_text()
SECTIONS = re.findall(r"^## (\d+)\. ", TEXT, flags=re.M)
#: the text of sections 1 to 9, by number
PARTS = dict(zip(map(int, SECTIONS), re.split(r"^## \d+\. ", TEXT, flags=re.M)[1:]))
JSON_BLOCK = re.compile(r"^```json\n(.*?)^```", flags=re.M | re.S)
BLOCKS = JSON_BLOCK.findall(TEXT)
#: the doc with line breaks folded, for phrases that wrap
FLAT = " ".join(TEXT.split())


def flat(section: int) -> str:
    """One section's text with line breaks folded."""
    return " ".join(PARTS[section].split())


def num(s: str) -> int:
    """``"14,976,000"`` -> 14976000."""
    return int(s.replace(",", ""))


def find(pattern: str) -> tuple[int, ...]:
    """The numbers captured by ``pattern`` (whitespace-tolerant) in the doc; fails if it is absent."""
    m = re.search(pattern.replace(" ", r"\s+"), TEXT)
    assert m, f"docs/GEOMETRY.md no longer says: {pattern}"
    return tuple(num(g) for g in m.groups())


def examples(section: int) -> list[dict[str, Any]]:
    """The JSON examples of one section, parsed."""
    return [json.loads(b) for b in JSON_BLOCK.findall(PARTS[section])]


def example(key: str) -> dict[str, Any]:
    """The JSON example of section 4 that has ``key`` (spec: groups, table: segments, report: zeroed)."""
    found = [d for d in examples(4) if key in d]
    assert len(found) == 1, key
    return found[0]


def test_nine_sections_and_their_json_examples() -> None:
    assert list(map(int, SECTIONS)) == list(range(1, 10))
    assert [len(examples(i)) for i in range(1, 10)] == [0, 0, 0, 3, 0, 1, 0, 0, 1]
    assert len(BLOCKS) == 5
    assert "../shared" not in TEXT


def test_sections_6_to_9_say_they_are_implemented() -> None:
    """Every section of the contract is implemented now; none may still say otherwise."""
    for i in range(1, 10):
        assert "Not implemented yet" not in PARTS[i], f"section {i}"
    for i in (6, 7, 9):
        assert "**Implemented" in PARTS[i], f"section {i}"
    assert "all four are implemented" in FLAT
    # the modules each section names exist
    for i in (6, 7, 8, 9):
        for path in re.findall(r"`((?:kvlayout|backends|tests)/[\w/]+\.py)`", PARTS[i]):
            assert (DOC.parent.parent / path).is_file(), (i, path)


def test_spec_example_plans_to_the_table_example() -> None:
    spec = kvlayout.KVCacheSpec.from_json(json.dumps(example("groups")))
    assert spec.to_dict() == example("groups")  # every field of the example is a real field
    (row,) = kvlayout.plan(spec).segments
    table = example("segments")
    (doc_row,) = table["segments"]
    for k in ("base", "span", "group", "layer", "part", "virtual_index"):
        assert row.to_dict()[k] == doc_row[k], k
    # the table example is the first row of the same spec with four such layers (dsv4-test)
    group = spec.groups[0]
    layers = tuple(replace(group.layers[0], name=f"model.layers.{i}.self_attn") for i in range(4))
    four_group = kvlayout.GroupSpec(group.name, layers, group.kernel_block_size)
    four = kvlayout.KVCacheSpec(spec.num_blocks, spec.layout, (four_group,))
    assert four == kvlayout.preset("dsv4-test")
    planned = kvlayout.plan(four).to_dict()
    for k in ("version", "total_bytes", "num_blocks"):
        assert planned[k] == table[k], k
    assert planned["segments"][0] == doc_row
    assert kvlayout.SegmentTable.from_json(json.dumps(table)).to_dict() == table


def test_page_arithmetic_of_section_1() -> None:
    layer = kvlayout.preset("dsv4-test").groups[0].layers[0]
    assert isinstance(layer, MLASpec)
    stored, stored2, token, real, align, page, blocks, align2, gap = find(
        r"alignment (\d+) stores (\d+) tokens per block, so its real page is (\d+) \* (\d+) = ([\d,]+) B; "
        r"rounded up to a multiple of (\d+) it becomes a page of ([\d,]+) B \((\d+) \* (\d+)\), "
        r"which leaves a (\d+) B gap"
    )[1:]
    assert find(r"and alignment (\d+) stores") == (layer.alignment,)
    assert stored == stored2 == layer.stored_tokens and token == layer.bytes_per_token
    assert real == stored * token == layer.real_page
    assert align == align2 == layer.alignment and gap == layer.gap
    assert page == blocks * align == layer.page
    assert find(r"otherwise (\d+) if `cache_dtype` is") == (layer.bytes_per_token,)
    nope, rope_values, rope, scales, pad = find(
        r"packs (\d+) B of fp8 NoPE values, (\d+) bf16 RoPE values \((\d+) B\), "
        r"(\d+) UE8M0 scale bytes and (\d+) byte"
    )
    assert rope == 2 * rope_values and nope + rope + scales + pad == layer.bytes_per_token


def test_dtype_sizes_of_section_1() -> None:
    line = next(ln for ln in TEXT.splitlines() if ln.startswith("- Element sizes"))
    para = TEXT[TEXT.index(line):].split("\n- ")[0]
    doc: dict[str, int] = {}
    for names, size in re.findall(r"((?:`\w+`(?:,| and)?\s*)+)(\d+)", para):
        for name in re.findall(r"`(\w+)`", names):
            doc[name] = int(size)
    assert doc == dict(kvlayout.DTYPE_SIZES)


def test_packed_worked_example_of_section_2() -> None:
    spec = kvlayout.preset("dsv4-test")
    lay = kvlayout.plan_layout(spec)
    offsets = find(r"sit at offsets ([\d,]+), ([\d,]+), ([\d,]+) and ([\d,]+)")
    assert offsets == tuple(p.offset for p in lay.placements)
    assert find(r"the block stride is ([\d,]+) B") == (lay.block_stride,)
    nb, total = find(r"(\d+) blocks take total_bytes = ([\d,]+)")
    assert (nb, total) == (spec.num_blocks, lay.total_bytes)
    last = lay.placements[-1]
    block, end, minus = find(
        r"block (\d+) of the fourth layer ends at byte ([\d,]+), which is total_bytes - (\d+)"
    )
    assert block == spec.num_blocks - 1 and lay.block_stride is not None
    assert end == last.offset + block * lay.block_stride + last.real_page
    assert end == total - minus and minus == last.layer.gap
    for s in ("37,376", "37,440", "74,880", "112,320", "149,760", "14,976,000", "14,975,936"):
        assert s in TEXT


def test_pre_fix_bug_of_section_3_is_caught_with_the_doc_numbers() -> None:
    table = kvlayout.plan(kvlayout.preset("dsv4-test"))
    (stride,) = find(r"the stride of ([\d,]+) B was\s+used as the span")
    (past,) = find(r"block 99 wrote ([\d,]+) B beyond the end")
    rows = tuple(kvlayout.Segment(s.base, stride, stride, s.group, s.layer) for s in table.segments)
    bad = kvlayout.SegmentTable(table.total_bytes, table.num_blocks, rows)
    rep = kvlayout.verify(bad)
    assert {v.rows[0] for v in rep.by_invariant(3)} == {1, 2, 3}  # the first three layers of block b + 1
    last = bad.segments[-1]
    assert last.base + (bad.num_blocks - 1) * last.stride + last.span - bad.total_bytes == past
    assert rep.by_invariant(2)


def test_check_table_cannot_check_invariant_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "table.json"
    path.write_text(kvlayout.plan(kvlayout.preset("dsv4-test")).to_json())
    assert main(["check", "--table", str(path)]) == 0
    assert "invariant 4 (padding untouched): not checked" in capsys.readouterr().out
    assert "only invariants 1 to 3 are proved" in FLAT


def _full(layer: kvlayout.LayerSpec) -> TypeGuard[kvlayout.FullAttentionSpec]:
    return isinstance(layer, kvlayout.FullAttentionSpec)


def _pages(spec: kvlayout.KVCacheSpec, pick: Any) -> set[tuple[int, int]]:
    return {(layer.real_page, layer.page) for _, layer in spec.layers if pick(layer)}


def test_presets_of_section_5() -> None:
    spec = kvlayout.preset("dsv4")
    mla = [layer for _, layer in spec.layers if isinstance(layer, MLASpec)]
    assert len(mla) == len(spec.layers)
    kinds = {
        "C4 attention": lambda m: m.ratio == 4 and m.cache_dtype == "fp8_ds_mla",
        "C128 attention": lambda m: m.ratio == 128,
        r"C4 indexer \(`mla`, head_size 132, `uint8`\)": lambda m: m.head_size == 132 and m.dtype == "uint8",
        "sliding-window MLA with 64-token blocks": lambda m: m.block_size == 64,
    }
    for name, pick in kinds.items():
        real, page = find(name + r" ([\d,]+)/([\d,]+)")
        assert _pages(spec, pick) == {(real, page)}, name
    assert all(sum(pick(m) for pick in kinds.values()) == 1 for m in mla)  # the doc names every kind of layer
    groups, rows = find(r"`dsv4`: a realistic DeepSeek-V4 mix of (\d+) overlaid groups and (\d+) rows")
    assert (groups, rows) == (len(spec.groups), len(kvlayout.plan(spec)))
    assert find(r"`dsv4-test`: the four-layer example of section 2 \((\d+) blocks\)") == (
        kvlayout.preset("dsv4-test").num_blocks,
    )
    llama = kvlayout.preset("llama-8b")
    n, heads, head, bs = find(
        r"`llama-8b`: (\d+) `full` layers with (\d+) KV heads of head_size (\d+) in `bfloat16`, "
        r"block size (\d+), `layer_major` with `kv_split`"
    )
    layers = [layer for _, layer in llama.layers]
    assert len(layers) == n and llama.layout == "layer_major"
    assert all(_full(x) and x.kind == "full" for x in layers)
    got = {(x.num_kv_heads, x.head_size, x.dtype, x.block_size, x.kv_split) for x in layers if _full(x)}
    assert got == {(heads, head, "bfloat16", bs, True)}


def test_zero_report_example_matches_kvlayout_zero(capsys: pytest.CaptureFixture[str]) -> None:
    doc = example("zeroed")
    ids = ",".join(map(str, doc["block_ids"]))
    assert main(["zero", "--preset", "dsv4-test", "--blocks", ids, "--json", "--backend", "reference"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got) == list(doc)
    for k in ("version", "total_bytes", "block_ids", "matches_contract", "zeroed_bytes"):
        assert got[k] == doc[k], k
    assert got["zeroed"][: len(doc["zeroed"])] == doc["zeroed"]  # the doc's list is cut short
    assert doc["backend"] in registry.registered()
    assert f"`{doc['mode']}`" in TEXT


def test_limits_of_section_8() -> None:
    from kvlayout import ranges
    from kvlayout.verify import MAX_CROSS_PAIRS

    assert "`num_blocks` lies in `[0, 2**31 - 1]`" in FLAT and ranges.MAX_BLOCKS == 2**31 - 1
    assert "less than `2**62`" in FLAT and ranges.MAX_BYTES == 2**62
    (pairs,) = find(r"a table with more than ([\d,]+) such pairs is\s+refused")
    assert pairs == MAX_CROSS_PAIRS


def test_section_8_refuses_too_many_cross_stride_pairs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """More meeting rows of different strides than the verifier decides in its bound: exit 2."""
    from kvlayout.verify import MAX_CROSS_PAIRS

    k = int(MAX_CROSS_PAIRS**0.5) + 2  # k rows of stride 8 and k of stride 12 meet pairwise: k*k pairs
    rows = [{"base": 4 * i, "stride": 8, "span": 4} for i in range(k)]
    rows += [{"base": 4 * i, "stride": 12, "span": 4} for i in range(k)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"total_bytes": 10**6, "num_blocks": 1000, "segments": rows}))
    assert main(["check", "--table", str(path)]) == 2
    assert "such pairs" in capsys.readouterr().err


# ---- section 6: vLLM's six layouts
def _doc_rows() -> dict[str, list[tuple[str, str, int, int, int]]]:
    """The worked example's table: layout -> rows (layer index, part, base, stride, span)."""
    out: dict[str, list[tuple[str, str, int, int, int]]] = {}
    for line in PARTS[6].splitlines():
        m = re.fullmatch(r"\| ((?:`\w+`(?:, )?)+) \| (.*) \|", line)
        if not m:
            continue
        rows = [
            (r[0], r[1], int(r[2]), int(r[3]), int(r[4]))
            for r in re.findall(r"(\d+)\.(\w+): (\d+)/(\d+)/(\d+)", m[2])
        ]
        for name in re.findall(r"`(\w+)`", m[1]):
            out[name] = rows
    return out


def test_section_6_names_the_six_layouts_and_the_aliases() -> None:
    from kvlayout.spec import ALL_LAYOUTS, KV_CACHE_LAYOUTS, LAYOUT_ALIASES

    six = re.search(r"six orders: (.*?) and `(\w+)`", flat(6))
    assert six
    assert tuple(re.findall(r"`(\w+)`", six[1]) + [six[2]]) == KV_CACHE_LAYOUTS
    assert "`packed` is `BLHNC`" in flat(6) and "`layer_major` is `LBHNC`" in flat(6)
    assert dict(LAYOUT_ALIASES) == {"packed": "BLHNC", "layer_major": "LBHNC"}
    assert set(ALL_LAYOUTS) == set(KV_CACHE_LAYOUTS) | {"packed", "layer_major"}
    for name in ALL_LAYOUTS:  # every name plans
        spec = kvlayout.KVCacheSpec.from_dict({**examples(6)[0], "layout": name})
        assert kvlayout.verify(kvlayout.plan(spec)).ok
    valid = r"layout = 'HBLNC'.*valid layouts: packed, layer_major, LBHNC"
    with pytest.raises(kvlayout.SpecError, match=valid):
        kvlayout.KVCacheSpec.from_dict({**examples(6)[0], "layout": "HBLNC"})


def test_section_6_worked_example_rows_under_every_layout() -> None:
    from kvlayout.spec import KV_CACHE_LAYOUTS

    (doc,) = examples(6)
    spec = kvlayout.KVCacheSpec.from_dict(doc)
    assert spec.to_dict() == doc
    c, nc, page, total = find(
        r"`C = 2 \* 8 \* 2 = (\d+)` B, `N\*C = (\d+)` B per head and the page is `H \* N\*C = ([\d,]+)` B; "
        r"every layout needs `total_bytes = ([\d,]+)`"
    )
    layer = spec.groups[0].layers[0]
    assert (layer.content_bytes, layer.states * layer.content_bytes, layer.real_page) == (c, nc, page)
    rows = _doc_rows()
    assert set(rows) == set(KV_CACHE_LAYOUTS)
    for name in KV_CACHE_LAYOUTS:
        table = kvlayout.plan(kvlayout.KVCacheSpec.from_dict({**doc, "layout": name}))
        got = [(s.layer.split(".")[2], s.part, s.base, s.stride, s.span) for s in table.segments]
        assert got == rows[name], name
        assert table.total_bytes == total, name


def test_section_6_bhlnc_and_lhbnc_formulas() -> None:
    """Head h of the i-th of k layers of a BHLNC run at run + h*k*N*C + i*N*C; LHBNC head h of
    block b at region + h*num_blocks*N*C + b*N*C (the doc's formulas, on the worked example)."""
    assert "`run + h * k * N*C + i * N*C`" in flat(6)
    assert "`region + h * num_blocks * N*C + b * N*C`" in flat(6)
    (doc,) = examples(6)
    nc, k, n = 512, 2, doc["num_blocks"]
    bh = kvlayout.plan(kvlayout.KVCacheSpec.from_dict({**doc, "layout": "BHLNC"}))
    for s in bh.segments:
        i, h = int(s.layer.split(".")[2]), int(s.part.removeprefix("head"))
        assert s.base == h * k * nc + i * nc
    lh = kvlayout.plan(kvlayout.KVCacheSpec.from_dict({**doc, "layout": "LHBNC"}))
    for s in lh.segments:
        i, h = int(s.layer.split(".")[2]), int(s.part.removeprefix("head"))
        assert s.base == i * 2 * nc * n + h * n * nc and s.stride == nc


def test_section_6_refusals_name_the_field() -> None:
    (doc,) = examples(6)
    padded = json.loads(json.dumps(doc))
    padded["groups"][0]["layers"][0]["alignment"] = 1536
    for order in ("LHBNC", "BHLNC"):
        with pytest.raises(kvlayout.SpecError, match=r"alignment = 1536: .*cannot pad a page of 2 head"):
            kvlayout.plan(kvlayout.KVCacheSpec.from_dict({**padded, "layout": order}))
    split = json.loads(json.dumps(doc))
    for layer in split["groups"][0]["layers"]:
        layer["kv_split"] = True
    assert "accepted under `layer_major`/`LBHNC` only" in flat(6)
    for order in ("layer_major", "LBHNC"):
        kvlayout.plan(kvlayout.KVCacheSpec.from_dict({**split, "layout": order}))
    with pytest.raises(kvlayout.SpecError, match=r"kv_split = True: kv_split is an error in the BLNHC"):
        kvlayout.plan(kvlayout.KVCacheSpec.from_dict({**split, "layout": "BLNHC"}))


def test_section_6_block_stride_alignment() -> None:
    (doc,) = examples(6)
    aligned = json.loads(json.dumps(doc))
    aligned["groups"][0]["layers"][1]["block_stride_alignment"] = 1536
    lay = kvlayout.plan_layout(kvlayout.KVCacheSpec.from_dict({**aligned, "layout": "BLHNC"}))
    assert lay.block_stride == 3072  # round_up(2 * 1024, lcm(1, 1536))
    lay = kvlayout.plan_layout(kvlayout.KVCacheSpec.from_dict({**aligned, "layout": "LBHNC"}))
    assert lay.slot_pages == (1024, 1536)  # each layer's page rounded to its own alignment


def test_section_6_points_at_the_vllm_ground_truth() -> None:
    from kvlayout.integrations import vllm

    for name in ("spec_from_kv_cache_config", "table_from_block_zeroer"):
        assert f"`{name}`" in flat(6) and name in vllm.__all__
    gt = (DOC.parent.parent / "tests" / "test_vllm_ground_truth.py").read_text()
    assert "def test_difference_ids_outside_the_pool" in gt
    assert "def test_difference_bhlnc_segment_spans_other_layers" in gt
    assert "def test_lhbnc_with_mamba_is_refused_where_vllm_interleaves_blocks" in gt
    assert "two intended differences" in flat(6)


# ---- section 7: per-group zeroing
def test_section_7_per_group_zeroing(capsys: pytest.CaptureFixture[str]) -> None:
    table = kvlayout.plan(kvlayout.preset("dsv4"))
    assert "`SegmentTable.groups`" in flat(7) and "`table.for_group(g)`" in flat(7)
    group = table.for_group("c4.3")
    assert {s.group for s in group.segments} == {"c4.3"} and kvlayout.verify(group).ok
    ours = kvlayout.expected_zeroed(table, [0, 5], group="c4.3")
    assert main(["zero", "--preset", "dsv4", "--blocks", "0,5", "--group", "c4.3", "--json",
                 "--backend", "reference"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["group"] == "c4.3" and rep["matches_contract"]
    assert rep["zeroed"] == ours.tolist()
    assert main(["zero", "--preset", "dsv4", "--blocks", "0", "--group", "nope"]) == 2
    assert "unknown group; valid groups: 'c4.0'" in capsys.readouterr().err
    # coalescing a whole table joins groups, after which they cannot be told apart
    merged = table.coalesced()
    assert any("+" in g for g in merged.groups) and "names them `a+b`" in flat(7)
    assert merged.groups_joined and "`\"groups_joined\": true`" in flat(7)
    for g in ("c4.3", "c4.0"):  # neither a group it lost nor one it still names a row after
        with pytest.raises(kvlayout.TableError, match="coalesced across groups"):
            merged.for_group(g)


def test_section_7_backends_take_a_group() -> None:
    import inspect

    from kvlayout.conformance import battery

    assert "group" in inspect.signature(kvlayout.Backend.zero).parameters
    assert "group" in inspect.signature(kvlayout.ReferenceBackend.zero).parameters
    assert any(c.group is not None for c in battery(quick=True))


# ---- section 9: native arrays
def test_section_9_native_example() -> None:
    from kvlayout.native import NativeCacheSpec, expected_zeroed_native, native_tables

    (doc,) = examples(9)
    spec = NativeCacheSpec.from_dict(doc)
    assert spec.to_dict() == doc
    tables = native_tables(spec)
    p0, t0 = find(r"`layer\.0` has base 0 and stride = span = 16 \* 2 \* 2 \* 128 \* 2 = ([\d,]+) B in a\s+"
                  r"buffer of ([\d,]+) B")
    p1, t1 = find(r"`layer\.1` 2 \* 32 \* 640 \* 2 = ([\d,]+) B in ([\d,]+) B")
    for name, page, total in (("layer.0", p0, t0), ("layer.1", p1, t1)):
        (row,) = tables[name].segments
        assert (row.base, row.stride, row.span, tables[name].total_bytes) == (0, page, page, total)
    got = expected_zeroed_native(spec, [0, 7], group="mla")
    assert got["layer.0"].size == 0
    assert got["layer.1"].tolist() == [[0, p1], [7 * p1, 8 * p1]]
    assert "Zeroing the ids `[0, 7]` for group `mla` clears `layer.1[0]` and `layer.1[7]`" in flat(9)


def test_section_9_names_the_zeroer() -> None:
    import importlib.util

    assert "`kvlayout.backends.pallas.CacheZeroer`" in flat(9)
    native = DOC.parent.parent / "backends" / "pallas" / "native.py"
    assert "class CacheZeroer" in native.read_text() and "def leaf_backend" in native.read_text()
    assert importlib.util.find_spec("kvlayout.native") is not None
