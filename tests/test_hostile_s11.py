"""Issue 25's ninth hostile pass (2026-12-05, a reviewer who did not write the fixes): one regression test
per finding. Nothing wrote wrong bytes, crashed or ran unbounded; two inputs were taken silently:

- Medium: a table coalesced across groups (``SegmentTable.coalesced()``, ``plan --coalesce --json``) zeroed
  per group cleared part of the group (group "a", block 1: [[6144, 8192]] where the planned table says
  [[4096, 5120], [6144, 8192]]): its merged row "a+b" belongs to no group. Now refused, naming the group.
- Low: a JSON key written twice (``"num_blocks": 4, ..., "num_blocks": 100000``) kept the last one
  without a word, in specs, tables and configs. Now refused, naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kvlayout as K
import kvlayout.models as M
from kvlayout.cli import main, run_zero
from kvlayout.errors import SpecError, TableError
from kvlayout.table import SegmentTable


def _layer(name: str, heads: int = 2, **kw: int) -> K.FullAttentionSpec:
    return K.FullAttentionSpec(name, block_size=16, num_kv_heads=heads, head_size=8, dtype="bfloat16", **kw)


#: the reviewer's spec: group a's aligned first layer, its second, and group b's layer share rows once
#: coalesced (group "a+b"), while a's second layer stays a row of its own
SPEC = K.KVCacheSpec(
    num_blocks=4,
    layout="packed",
    groups=[
        K.GroupSpec("a", [_layer("a0", alignment=2048), _layer("a1", 4)]),
        K.GroupSpec("b", [_layer("b0")]),
    ],
)
_GROUP_REFUSED = (
    r"^group = 'a': this table was coalesced across groups \(SegmentTable\.coalesced\(\), plan --coalesce\): "
    r"zero per group from the planned table \(GEOMETRY\.md section 7\)$"
)


def test_a_table_coalesced_across_groups_is_not_zeroed_per_group() -> None:
    planned = K.plan(SPEC)
    c = planned.coalesced()
    assert c.groups_joined and not planned.groups_joined and "a+b" in c.groups
    # the planned table's contract, which the coalesced one cannot give
    assert K.expected_zeroed(planned, [1], group="a").tolist() == [[4096, 5120], [6144, 8192]]
    buf = K.poison_pattern(c.total_bytes)
    before = buf.copy()
    for call in (
        lambda: K.ReferenceBackend(c, buf).zero([1], group="a"),
        lambda: K.expected_zeroed(c, [1], group="a"),
        lambda: c.for_group("b"),
        lambda: run_zero(c, [1], "reference", "a"),
    ):
        with pytest.raises(TableError, match=_GROUP_REFUSED.replace("'a'", "'[ab]'")) as e:
            call()
        assert e.value.field == "group"
    assert np.array_equal(buf, before)
    # the whole table is still zeroed, and equals the planned table's union
    K.ReferenceBackend(c, buf).zero([1])
    assert K.changed_ranges(before, buf).tolist() == K.expected_zeroed(planned, [1]).tolist()


def test_coalescing_within_groups_keeps_per_group_zeroing() -> None:
    """Rows joined inside one group (a backend coalesces a group's rows itself) leave each group exact."""
    planned = K.plan(SPEC)
    per_group = planned.for_group("a").coalesced()
    assert not per_group.groups_joined
    assert K.expected_zeroed(per_group, [1], group="a").tolist() == [[4096, 5120], [6144, 8192]]
    one = K.plan(
        K.KVCacheSpec(num_blocks=4, layout="packed", groups=[K.GroupSpec("a", [_layer("a0"), _layer("a1")])])
    )
    c = one.coalesced()
    assert not c.groups_joined and len(c) < len(one)
    assert K.expected_zeroed(c, [2], group="a").tolist() == K.expected_zeroed(one, [2], group="a").tolist()


def test_groups_joined_round_trips_through_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = K.plan(SPEC).coalesced()
    d = c.to_dict()
    assert d["groups_joined"] is True and "groups_joined" not in K.plan(SPEC).to_dict()
    back = SegmentTable.from_json(c.to_json())
    assert back == c and back.groups_joined
    with pytest.raises(TableError, match=_GROUP_REFUSED):
        back.for_group("a")
    with pytest.raises(TableError, match=r"^table\.groups_joined = 1: must be true or false$"):
        SegmentTable.from_dict({**d, "groups_joined": 1})
    spec_path, table_path = tmp_path / "spec.json", tmp_path / "table.json"
    spec_path.write_text(SPEC.to_json())
    assert main(["plan", str(spec_path), "--coalesce", "--json"]) == 0
    table_path.write_text(capsys.readouterr().out)
    assert json.loads(table_path.read_text())["groups_joined"] is True
    assert main(["check", "--table", str(table_path)]) == 0  # still a safe table


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            '{"version": 1, "num_blocks": 4, "layout": "packed", "num_blocks": 100000, "groups": []}',
            "num_blocks",
        ),
        (
            '{"version": 1, "num_blocks": 4, "layout": "packed", "groups": [{"name": "g", "layers": '
            '[{"name": "l0", "kind": "full", "block_size": 16, "num_kv_heads": 2, "head_size": 8, '
            '"dtype": "bfloat16", "dtype": "float32"}]}]}',
            "dtype",
        ),
    ],
)
def test_a_repeated_json_key_is_refused_naming_it(text: str, key: str) -> None:
    with pytest.raises(SpecError, match=rf"^spec key = '{key}': appears twice in one object") as e:
        K.KVCacheSpec.from_json(text)
    assert e.value.field == "spec key" and e.value.value == key


def test_repeated_keys_in_tables_configs_and_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = (
        '{"total_bytes": 64, "num_blocks": 4, "segments": [{"base": 0, "stride": 16, "span": 8, "span": 16}]}'
    )
    with pytest.raises(TableError, match=r"^table key = 'span': appears twice"):
        SegmentTable.from_json(table)
    SegmentTable.from_json(table.replace(', "span": 16', ""))  # the same text, once: read
    cfg = json.loads(Path("tests/fixtures/models/llama/config.json").read_text())
    text = json.dumps(cfg)[:-1] + ', "num_hidden_layers": 2}'
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=r"key = 'num_hidden_layers': appears twice"):
        M.from_config(str(path))
    for argv in (["plan", "--config", str(path)], ["check", "--table", str(tmp_path / "t.json")]):
        (tmp_path / "t.json").write_text(table)
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert not out and err.count("\n") == 1 and "appears twice in one object" in err, err


def test_groups_joined_wherever_the_join_falls() -> None:
    """A join of two groups is seen whether its row is the last of its stride class or not, a table that
    joins none says False (not a falsy stand-in), and coalescing a joined table again keeps the mark."""
    page = 512
    rows = (  # block stride 4 pages: a and b share page 0 (joined), c sits alone at page 2
        K.Segment(0, 4 * page, page, "a", "a0"),
        K.Segment(0, 4 * page, page, "b", "b0"),
        K.Segment(2 * page, 4 * page, page, "c", "c0"),
    )
    last = (  # the same with the join last in its stride class (rows are taken in base order)
        K.Segment(0, 4 * page, page, "c", "c0"),
        K.Segment(2 * page, 4 * page, page, "a", "a0"),
        K.Segment(2 * page, 4 * page, page, "b", "b0"),
    )
    for segs in (rows, last[1:] + last[:1]):
        t = SegmentTable(16 * page, 4, segs)
        assert t.coalesced().groups_joined is True and t.coalesced().coalesced().groups_joined is True
        assert SegmentTable(16 * page, 4, segs[:1] + segs[2:]).coalesced().groups_joined is False
    with pytest.raises(TableError, match=r"^group = 'c': this table was coalesced across groups"):
        SegmentTable(16 * page, 4, rows).coalesced().for_group("c")
    d = SegmentTable(16 * page, 4, rows[2:]).to_dict()
    assert "groups_joined" not in d and SegmentTable.from_dict(d).groups_joined is False


def test_the_repeated_key_message_whole() -> None:
    with pytest.raises(TableError) as e:
        SegmentTable.from_json('{"total_bytes": 64, "total_bytes": 64, "num_blocks": 4, "segments": []}')
    assert str(e.value) == (
        "table key = 'total_bytes': appears twice in one object: JSON keys must be unique "
        "(which one was meant is not guessed)"
    )
    assert e.value.field == "table key" and e.value.value == "total_bytes"
