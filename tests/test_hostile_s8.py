"""Issue 25's third fresh hostile pass (2026-12-04, a reviewer who did not write the fixes): one
regression test per defect it found.

- High: the Pallas zeroers' ``apply`` took a list mixing bools and ints (``[True, 5]``, ``(False, 3)``)
  through ``jnp.asarray``, which made it int32: block 1 or 0 was zeroed and no bad id counted.
- A backend module failing as it ran (SyntaxError, RuntimeError) gave a traceback and exit 1.
- A value nested 100,000 deep made ``errors.short``'s ``repr`` raise RecursionError in most APIs.
- ``apply`` with NumPy string, bytes, record or complex ids raised JAX's TypeError; a 0-d int64 id past
  int32 was refused as ``int32()``.
- ``zero_native_numpy`` wrote the first arrays before refusing a later read-only or strided one.
- ``ShardedLayout.expected_zeroed`` expanded every (shard, id) pair: ``shard --mesh tp=65536`` of 2,048
  ids took 52 s and 6.6 GB; the CLI's range bound took ``np.unique`` per shard, and printed each one.
- 64 MB of ``{},`` became 22 million dicts (1.7 GB) before a refusal; ``--blocks`` of 10,000,000 ids ran
  39 s; ``plot --kind diff`` held an int64 per byte (12x the pool); ``viz.bytes_per_step`` built
  rows x ids ranges (2.1 GB at 5,000 ids).
- A coalesced table of 140 layers wrote a layer label past 4,096 characters, so its own JSON was
  refused; names could hold U+2028 / U+2029, which ``splitlines`` breaks (a forged row).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout import errors, registry
from kvlayout.cli import main
from kvlayout.errors import BackendError, BlockIdError, LayoutBufferError, SpecError, TableError

ROOT = Path(__file__).resolve().parents[1]
_SMALL = {
    "version": 1,
    "num_blocks": 8,
    "layout": "packed",
    "groups": [
        {
            "name": "g",
            "layers": [
                {
                    "name": "l",
                    "kind": "full",
                    "block_size": 1,
                    "num_kv_heads": 1,
                    "head_size": 128,
                    "dtype": "float32",
                }
            ],
        }
    ],
}

#: one MLA layer of 8 B a block: a spec every head-split shard replicates
_MLA = {
    **_SMALL,
    "groups": [
        {
            "name": "g",
            "layers": [{"name": "l0", "kind": "mla", "block_size": 1, "head_size": 2, "dtype": "float32"}],
        }
    ],
}


def _deep(n: int = 100_000) -> list[Any]:
    deep: list[Any] = []
    x = deep
    for _ in range(n):
        y: list[Any] = []
        x.append(y)
        x = y
    return deep


@pytest.mark.parametrize("ids", [[True, 5], [np.True_, 5], (False, 3), [5, "bool"]])
def test_pallas_apply_refuses_bools_beside_ints(ids: list[Any]) -> None:
    jnp = pytest.importorskip("jax.numpy")
    from kvlayout.backends.pallas import CacheZeroer, PallasZeroer

    if ids[1] == "bool":
        ids = [5, jnp.array(True)]
    z = PallasZeroer(K.plan(K.KVCacheSpec.from_dict(_SMALL)))
    with pytest.raises(BlockIdError) as e:
        z.apply(jnp.full(z.buffer_shape, -1, jnp.int32), ids)
    assert e.value.field in ("block_ids[0]", "block_ids[1]") and "bool" in str(e.value)
    c = CacheZeroer([jnp.ones((8, 4, 128), jnp.float32)], "g")
    with pytest.raises(BlockIdError):
        c.apply([jnp.ones((8, 4, 128), jnp.float32)], ids)


@pytest.mark.parametrize(
    "ids", [np.array(["1"]), np.array([b"1"]), np.zeros(2, dtype=[("a", "i4")]), np.str_("1"), np.array([1j])]
)
def test_pallas_apply_refuses_non_integer_host_arrays(ids: Any) -> None:
    jnp = pytest.importorskip("jax.numpy")
    from kvlayout.backends.pallas import CacheZeroer

    c = CacheZeroer([jnp.ones((8, 4, 128), jnp.float32)], "g")
    with pytest.raises(BlockIdError) as e:
        c.apply([jnp.ones((8, 4, 128), jnp.float32)], ids)
    assert e.value.field == "block_ids.dtype"


def test_pallas_apply_names_the_dtype_given_for_a_0d_id() -> None:
    jnp = pytest.importorskip("jax.numpy")
    from kvlayout.backends.pallas import CacheZeroer

    c = CacheZeroer([jnp.ones((8, 4, 128), jnp.float32)], "g")
    with pytest.raises(BlockIdError, match=r"got int64\(\)"):
        c.apply([jnp.ones((8, 4, 128), jnp.float32)], np.int64(2**40))


@pytest.mark.parametrize("body", ["x = (\n", "raise RuntimeError('no device')\n"])
def test_a_backend_module_failing_as_it_runs_is_a_backend_error(
    body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = f"kvl_failing_{abs(hash(body))}"
    (tmp_path / f"{mod}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendError) as e:
        registry.load(f"{mod}:B")
    assert e.value.field == "backend" and ("SyntaxError" in str(e.value) or "RuntimeError" in str(e.value))
    assert main(["zero", "--preset", "dsv4-test", "--blocks", "0", "--backend", f"{mod}:B"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "importing module" in err


def test_values_nested_deep_are_named_not_recursed() -> None:
    deep = _deep()
    assert errors.short(deep) == "[[[[[...]]]]]"
    assert errors.short({"a": 10**5000}) == "{'a': <an integer of 16,610 bits>}"
    assert errors.short("x" * 10**6).endswith("...") and len(errors.short("x" * 10**6)) == 80

    class Loop:
        def __repr__(self) -> str:
            return repr(self)

    assert errors.short(Loop()) == "<Loop>"
    from kvlayout.native import NativeLeaf
    from kvlayout.sharding import shard_spec, split_heads

    spec = K.preset("dsv4-test")
    calls = [
        lambda: K.normalize_block_ids([deep], 10),
        lambda: K.expected_zeroed(K.plan(spec), [0], group=deep),
        lambda: K.KVCacheSpec.from_dict({**_SMALL, "num_blocks": deep}),
        lambda: K.KVCacheSpec.from_dict({**_SMALL, "layout": deep}),
        lambda: K.SegmentTable.from_dict(deep),
        lambda: shard_spec(spec, deep),
        lambda: shard_spec(spec, [deep]),
        lambda: shard_spec(spec, {"tp": deep}),
        lambda: split_heads(spec, deep),
        lambda: NativeLeaf("a", deep, "float32"),
        lambda: NativeLeaf("a", (4, 8), "float32", group=deep),
    ]
    for call in calls:
        with pytest.raises(K.KVLayoutError) as e:
            call()
        assert "[[[" in str(e.value) and len(str(e.value)) < 400


def test_zero_native_numpy_checks_every_array_before_writing_any() -> None:
    from kvlayout.native import NativeCacheSpec, NativeLeaf, zero_native_numpy

    spec = NativeCacheSpec((NativeLeaf("a", (4, 8), "float32", "g"), NativeLeaf("b", (4, 8), "float32", "g")))
    for spoil, got in ((lambda b: b.setflags(write=False), "read-only"), (None, "non-contiguous")):
        a = np.ones((4, 8), np.float32)
        b = np.ones((4, 8), np.float32) if spoil else np.asfortranarray(np.ones((4, 8), np.float32))
        if spoil:
            spoil(b)
        with pytest.raises(LayoutBufferError) as e:
            zero_native_numpy([a, b], spec, [1])
        assert e.value.field == "arrays[1]" and e.value.value == got
        assert (a == 1).all()  # nothing written


def test_sharded_contract_is_made_once_and_shifted() -> None:
    from kvlayout.reference import union_of_rows
    from kvlayout.sharding import shard_spec

    spec = K.KVCacheSpec.from_dict({**_MLA, "num_blocks": 2048})
    lay = shard_spec(spec, {"tp": 65536}, head_axes=["tp"])
    tracemalloc.start()
    try:  # 65,536 shards x 2,048 ids expanded first: two int64 arrays of 134 million points, 2 GB
        got = lay.expected_zeroed(list(range(2048)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.tolist() == [[0, lay.gathered_bytes]] and peak < 64 * 2**20, peak  # one run, merged
    # scattered ids on a head-split spec: the shifted contract equals the expanded one
    for layout in ("packed", "LBHNC"):
        spec = K.KVCacheSpec.from_dict(
            {
                **_SMALL,
                "num_blocks": 16,
                "layout": layout,
                "groups": [
                    {
                        "name": "g",
                        "layers": [
                            {
                                "name": f"l{i}",
                                "kind": "full",
                                "block_size": 2,
                                "num_kv_heads": 4,
                                "head_size": 4,
                                "dtype": "float32",
                            }
                            for i in range(3)
                        ],
                    }
                ],
            }
        )
        lay = shard_spec(spec, {"tp": 4}, head_axes=["tp"])
        ids = [1, 2, 3, 7, 15]
        t = lay.local_table
        shards = np.repeat(np.arange(4), len(ids))
        old = union_of_rows(t.bases, t.strides, t.spans, np.tile(ids, 4), shards * lay.shard_bytes)
        assert np.array_equal(lay.expected_zeroed(ids), old), layout


def test_shard_lists_at_most_64_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "s.json"
    p.write_text(json.dumps({**_MLA, "num_blocks": 4}))
    assert main(["shard", str(p), "--mesh", "tp=100", "--head-axes", "tp", "--blocks", "0-3"]) == 0
    out = capsys.readouterr().out
    assert out.count("  shard ") == 64 and "... 36 more shards" in out
    assert main(["shard", str(p), "--mesh", "tp=100", "--head-axes", "tp", "--blocks", "0-3", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["local_ids"]) == 100


def test_json_inputs_are_bounded_in_values_before_parsing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvlayout.validate import MAX_JSON_CONTAINERS, MAX_JSON_VALUES, parse_json

    with pytest.raises(SpecError, match="too many values"):
        parse_json(SpecError, "spec", "[" + ",".join(["{}"] * (MAX_JSON_CONTAINERS + 1)) + "]")
    with pytest.raises(TableError, match="too many values"):
        parse_json(TableError, "table", b"[" + b",".join([b"0"] * (MAX_JSON_VALUES + 2)) + b"]")
    assert len(parse_json(SpecError, "spec", "[" + ",".join(["0"] * (MAX_JSON_VALUES + 1)) + "]")) == (
        MAX_JSON_VALUES + 1
    )
    p = tmp_path / "dicts.json"
    p.write_text('{"groups": [' + ",".join(["{}"] * 1_100_000) + "]}")
    assert main(["plan", str(p)]) == 2 and "too many values" in capsys.readouterr().err


def test_cli_ids_diff_plots_and_step_charts_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvlayout import cli

    assert cli.MAX_CLI_IDS == 100_000
    assert main(["zero", "--preset", "dsv4-test", "--blocks", "0-100000", "--num-blocks", "200000"]) == 2
    assert "more than 100000 ids" in capsys.readouterr().err
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**_SMALL, "num_blocks": cli.MAX_HOST_BYTES // 4 // 512 + 1}))
    assert main(["plot", str(big), "--kind", "diff", "--blocks", "0", "--out", str(tmp_path / "d.png")]) == 2
    assert f"above the {cli.MAX_HOST_BYTES // 4} B" in capsys.readouterr().err
    from kvlayout.ranges import merge_ranges
    from kvlayout.viz.charts import step_bytes

    table = K.plan(K.preset("dsv4").with_num_blocks(2**31 - 1))

    def brute(rows: list[K.Segment], ids: list[int]) -> int:  # every (row, id) range, merged
        starts = np.array([r.base + i * r.stride for r in rows for i in ids], np.int64)
        spans = np.array([r.span for r in rows for _ in ids], np.int64)
        m = merge_ranges(starts, starts + spans)
        return int((m[:, 1] - m[:, 0]).sum())

    few = [3, 4, 5, 9, 2**31 - 2]
    per, every = step_bytes(table, {g: few for g in table.groups})
    assert every == brute(list(table.segments), few) == len(few) * 149_504
    assert per == sum(
        brute([r for r in table.segments if g in r.group.split("+")], few) for g in table.groups
    )
    per, every = step_bytes(table, {g: list(range(0, 40_000, 2)) for g in table.groups})  # was rows x ids
    assert every == 20_000 * 149_504


def test_coalesced_labels_stay_names_and_line_separators_are_refused() -> None:
    from kvlayout.validate import MAX_NAME_CHARS

    cfg = json.loads((ROOT / "tests/fixtures/models/llama/config.json").read_text())
    import kvlayout.models as M

    ms = M.from_config({**cfg, "num_hidden_layers": 140})
    assert isinstance(ms, M.ModelSpec)
    t = K.plan(ms.spec).coalesced()
    assert len(t) == 1 and len(t.segments[0].layer) <= MAX_NAME_CHARS
    assert t.segments[0].layer.endswith("...(140 in all)") and t.segments[0].layer.startswith(
        "model.layers.0."
    )
    assert K.SegmentTable.from_dict(json.loads(t.to_json())).segments == t.segments
    for sep in ("\u2028", "\u2029", "\x85"):
        with pytest.raises(SpecError, match="line separators"):
            K.KVCacheSpec.from_dict({**_SMALL, "groups": [{**_SMALL["groups"][0], "name": f"x{sep}y"}]})
    K.KVCacheSpec.from_dict({**_SMALL, "groups": [{**_SMALL["groups"][0], "name": "x\u00a0y"}]})  # a space


def test_the_reported_commands_exit_within_bounds(tmp_path: Path) -> None:
    """The CLI repros of the report, each in a fresh process: exit 2 or 0, one line on error."""
    p = tmp_path / "dicts.json"
    p.write_text(
        '{"version":1,"num_blocks":1,"layout":"packed","groups":[' + ",".join(["{}"] * 3_000_000) + "]}"
    )
    res = subprocess.run(
        [sys.executable, "-m", "kvlayout", "plan", str(p)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "too many values" in res.stderr


def test_label_cut_boundaries() -> None:
    from kvlayout.table import _label
    from kvlayout.validate import MAX_NAME_CHARS

    assert MAX_NAME_CHARS == 4096
    whole = ["a" * 2047, "b" * 2048]  # joined: exactly 4,096 characters, kept whole
    assert _label(whole) == "+".join(whole)
    # 2,000 + 1 + 2,081 + 1 + len("...(3 in all)") = 4,096: both fit exactly, the third does not
    names = ["a" * 2000, "b" * 2081, "c" * 100]
    assert _label(names) == f"{names[0]}+{names[1]}+...(3 in all)" and len(_label(names)) == 4096
    assert _label(["a" * 2000, "b" * 2082, "c" * 100]) == f"{'a' * 2000}+...(3 in all)"  # one more: b is cut
    assert _label(["x" * 4096, "y"]) == "...(2 in all)"


def test_zero_native_numpy_refusal_message() -> None:
    from kvlayout.native import NativeCacheSpec, NativeLeaf, zero_native_numpy

    spec = NativeCacheSpec((NativeLeaf("a", (4, 8), "float32", "g"), NativeLeaf("b", (4, 8), "float32", "g")))
    b = np.ones((4, 8), np.float32)
    b.setflags(write=False)
    with pytest.raises(LayoutBufferError) as e:
        zero_native_numpy([np.ones((4, 8), np.float32), b], spec, [1])
    why = "must be C-contiguous and writeable ('b'); nothing was written"
    assert str(e.value) == f"arrays[1] = 'read-only': {why}"


def test_json_value_caps_count_each_bracket_and_comma_in_text_and_bytes() -> None:
    from kvlayout.validate import MAX_JSON_CONTAINERS, MAX_JSON_VALUES, parse_json

    lists = "[" + ",".join(["[]"] * MAX_JSON_CONTAINERS) + "]"  # one more array than allowed
    for text in (lists, lists.encode()):
        with pytest.raises(SpecError) as e:
            parse_json(SpecError, "spec 's.json'", text)
        assert str(e.value) == (
            f"spec 's.json' = 'too many values': holds up to {MAX_JSON_CONTAINERS + 1:,} arrays/objects and "
            f"{MAX_JSON_CONTAINERS:,} values: at most 1,000,000 and 2,000,000 are read"
        )
        assert (e.value.field, e.value.value) == ("spec 's.json'", "too many values")
    exact = "[" + ",".join(["[]"] * (MAX_JSON_CONTAINERS - 1)) + "]"  # exactly the bound: read
    assert len(parse_json(SpecError, "spec", exact)) == MAX_JSON_CONTAINERS - 1
    zeros = "[" + ",".join(["0"] * (MAX_JSON_VALUES + 2)) + "]"
    with pytest.raises(SpecError, match="too many values"):
        parse_json(SpecError, "spec", zeros)


def test_shard_range_bound_per_distinct_route_and_the_listing_boundary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvlayout.cli import _shard_ranges
    from kvlayout.reference import range_count_bound

    local = K.plan(K.preset("dsv4-test"))
    shared = np.array([0, 1, 2])
    routes = [np.array([0, 2]), np.array([5]), shared, shared, np.array([], np.int64)]
    assert _shard_ranges(local, routes) == sum(range_count_bound(local, r) for r in routes)
    p = tmp_path / "s.json"
    p.write_text(json.dumps({**_MLA, "num_blocks": 4}))
    assert main(["shard", str(p), "--mesh", "tp=64", "--head-axes", "tp", "--blocks", "0-3"]) == 0
    out = capsys.readouterr().out
    assert out.count("  shard ") == 64 and "more shards" not in out
