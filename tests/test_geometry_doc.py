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
BLOCKS = re.findall(r"^```json\n(.*?)^```", TEXT, flags=re.M | re.S)
#: the doc with line breaks folded, for phrases that wrap
FLAT = " ".join(TEXT.split())


def num(s: str) -> int:
    """``"14,976,000"`` -> 14976000."""
    return int(s.replace(",", ""))


def find(pattern: str) -> tuple[int, ...]:
    """The numbers captured by ``pattern`` (whitespace-tolerant) in the doc; fails if it is absent."""
    m = re.search(pattern.replace(" ", r"\s+"), TEXT)
    assert m, f"docs/GEOMETRY.md no longer says: {pattern}"
    return tuple(num(g) for g in m.groups())


def example(key: str) -> dict[str, Any]:
    """The JSON example of section 4 that has ``key`` (spec: groups, table: segments, report: zeroed)."""
    found = [d for d in map(json.loads, BLOCKS) if key in d]
    assert len(found) == 1, key
    return found[0]


def test_nine_sections_and_three_json_examples() -> None:
    assert list(map(int, SECTIONS)) == list(range(1, 10))
    assert len(BLOCKS) == 3
    assert "../shared" not in TEXT


def test_unimplemented_sections_are_marked() -> None:
    parts = re.split(r"^## \d+\. ", TEXT, flags=re.M)[1:]
    for i in (6, 7, 9):
        assert "Not implemented yet" in parts[i - 1], f"section {i}"
    assert "Not implemented yet" not in "".join(parts[:5])


def test_layouts_of_section_6_are_the_implemented_ones() -> None:
    from kvlayout.spec import LAYOUTS

    assert "`packed` (= `BLHNC`) and `layer_major` (= `LBHNC`)" in FLAT
    assert set(LAYOUTS) == {"packed", "layer_major"}


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
    ranges = pytest.importorskip("kvlayout.ranges")
    assert "`num_blocks` lies in `[0, 2**31 - 1]`" in FLAT and ranges.MAX_BLOCKS == 2**31 - 1
    assert "less than `2**62`" in FLAT and ranges.MAX_BYTES == 2**62
