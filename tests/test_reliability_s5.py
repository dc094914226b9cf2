"""Issue 25, fifth session: defects reported and left open, one regression test each.

- A native spec (``layout: native``) had no bound on its leaves: 200,000 leaves ran 7.8 s. Now at most
  :data:`kvlayout.native.MAX_NATIVE_LEAVES` (as many as a model config's layers), refused naming
  ``leaves`` before any leaf is read; leaves and tables of one shape are checked once.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kvlayout as K
import kvlayout.cli as C
import kvlayout.native as N
from kvlayout.native import MAX_NATIVE_LEAVES, NativeCacheSpec, NativeLeaf, native_tables

LEAF = {"name": "a", "shape": [4, 16, 2, 4, 8], "dtype": "bfloat16", "group": "full"}


def test_native_leaf_count_is_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One leaf over the cap is refused naming ``leaves``, the count and the cap, before any leaf is
    read (every leaf here has the same name: reading them would fail on the second)."""
    n = MAX_NATIVE_LEAVES + 1
    with pytest.raises(K.SpecError, match=r"^leaves = 100001: 100,001 leaves: .* at most 100,000") as e:
        NativeCacheSpec.from_dict({"version": 1, "layout": "native", "leaves": [LEAF] * n})
    assert (e.value.field, e.value.value) == ("leaves", n)
    leaf = NativeLeaf.from_dict(LEAF)
    with pytest.raises(K.SpecError, match="at most 100,000") as e:
        NativeCacheSpec((leaf,) * n)
    assert (e.value.field, e.value.value) == ("leaves", n)
    # the cap itself is accepted; the CLI refuses one more in one line (a smaller cap here, to stay fast)
    monkeypatch.setattr(N, "MAX_NATIVE_LEAVES", 3)
    data = {"layout": "native", "leaves": [dict(LEAF, name=f"l{i}") for i in range(3)]}
    assert len(NativeCacheSpec.from_dict(data).leaves) == 3
    path = tmp_path / "native.json"
    path.write_text(json.dumps({"layout": "native", "leaves": [*data["leaves"], dict(LEAF, name="x")]}))
    for cmd in ("check", "plan", "zero"):
        assert C.main([cmd, str(path), *(["--blocks", "0"] if cmd == "zero" else [])]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert "error: leaves = 4: 4 leaves: a native spec has at most 3 (one array per layer)" in err


def test_native_leaves_checked_once_per_shape_stay_exact() -> None:
    """Leaves whose fields were checked before skip the checks, never when a field's type differs
    (``True == 1``, ``1 == 1.0``) and never the name; the tables they share name each leaf."""
    NativeLeaf("ok", (4, 1, 4), "float32", "g")  # remembered as checked
    bad: list[tuple[str, object]] = [
        ("shape[1]", (4, True, 4)), ("shape[1]", (4, 1.0, 4)), ("zeroed", 1), ("group[0]", (1,)),
    ]
    for field, value in bad:
        kw: dict[str, object] = {"shape": (4, 1, 4), "dtype": "float32", "group": "g", "zeroed": True}
        kw["group" if field.startswith("group") else "zeroed" if field == "zeroed" else "shape"] = value
        with pytest.raises(K.SpecError) as e:
            NativeLeaf("x", **kw)  # type: ignore[arg-type]
        assert e.value.field == f"leaf 'x'.{field}", (field, e.value.field)
    with pytest.raises(K.SpecError) as e:
        NativeLeaf("", (4, 1, 4), "float32", "g")
    assert e.value.field == "leaf.name"
    # NumPy integers and lists are still normalized
    leaf = NativeLeaf("np", [np.int64(4), 1, 4], "float32", ["g"])  # type: ignore[arg-type]
    assert leaf.shape == (4, 1, 4) and all(type(d) is int for d in leaf.shape) and leaf.group == ("g",)
    spec = NativeCacheSpec.from_dict(
        {"layout": "native", "leaves": [dict(LEAF, name=f"l{i}") for i in range(3)]
         + [dict(LEAF, name="off", zeroed=False), dict(LEAF, name="m", group="mla")]}
    )
    tables = native_tables(spec)
    for leaf in spec.leaves:
        t = tables[leaf.name]
        assert t == leaf.table() and [s.label for s in t.segments] == [
            s.label for s in leaf.table().segments
        ]
        assert t.columns().tolist() == leaf.table().columns().tolist()
    assert [s.layer for s in tables["l2"].segments] == ["l2"] and len(tables["off"]) == 0
    assert tables["m"].segments[0].group == "mla"
    assert {n: r.ok for n, r in K.native.verify_native(spec).items()} == dict.fromkeys(tables, True)


def test_shard_with_one_shard_reads_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``kvlayout shard --mesh dp=1`` printed ``buffer split over (-) into 1 shards`` and, with
    ``--blocks``, ``shard 0 (; bytes ...)``: a buffer that is not split says so, one shard is singular,
    and a shard without coordinates prints none."""
    spec = tmp_path / "s.json"
    layer = {"name": "l0", "kind": "full", "block_size": 16, "num_kv_heads": 2, "head_size": 8,
             "dtype": "bfloat16"}
    groups = [{"name": "g", "layers": [layer]}]
    spec.write_text(json.dumps({"num_blocks": 4, "layout": "packed", "groups": groups}))
    assert C.main(["shard", str(spec), "--mesh", "dp=1", "--blocks", "0,3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("mesh dp=1: replicated, buffer not split (1 shard), replicated over dp; 4 glob")
    assert out[2] == "  shard 0 (bytes [0, 4096)): local ids [0, 3]"  # 4 blocks of 1,024 B
    assert C.main(["shard", str(spec), "--mesh", "dp=1", "--block-axes", "dp", "--blocks", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "block_sharded, buffer split over (dp) into 1 shard; 4 global blocks, 4 per shard" in out[0]
    assert out[2] == "  shard 0 (dp=0; bytes [0, 4096)): local ids [1]"


def test_an_empty_path_is_refused_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    """``plan '' --preset llama-8b`` planned the preset and ``check --preset llama-8b --table ''``
    checked it: an empty path read as "not given". Each is one line naming the field, exit 2."""
    for argv, field in (
        (["plan", "", "--preset", "llama-8b"], "spec"),
        (["check", "--preset", "llama-8b", "--table", ""], "table"),
        (["plan", "--preset", "llama-8b", "--config", "", "--tp", "2"], "config"),
        (["plot", "--table", "", "--out", "x.png"], "table"),
    ):
        assert C.main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err == f"kvlayout {argv[0]}: error: {field} = '': an empty path\n", argv


def test_vllm_step_ids_refuse_floats_and_bools() -> None:
    """The plugin's per-step id check built ``torch.tensor(ids, dtype=int64)``, which truncates
    ``[1.5, 2.7]`` to blocks 1 and 2 and takes ``True`` as 1: now a BlockIdError naming the first."""
    pytest.importorskip("torch")
    from kvlayout.integrations.vllm_plugin import checked_step_ids

    for bad, i in (([1.5, 2.7], 0), ([3, 2.0], 1), ([0, True], 1), ([2, np.float64(1.0)], 1),
                   ([np.bool_(False)], 0), ((1, 2, 0.5), 2)):
        with pytest.raises(K.BlockIdError) as e:
            checked_step_ids(bad, 8)  # type: ignore[arg-type]
        assert (e.value.field, e.value.value) == (f"block_ids[{i}]", bad[i])
        assert str(e.value) == f"block_ids[{i}] = {bad[i]!r}: must be an integer (nothing was written)"
    ok = [np.int64(3), np.int32(1), 7, 0]  # integers of any integer type stay ids
    assert checked_step_ids(ok, 8).tolist() == [3, 1, 7, 0] and checked_step_ids([], 8).numel() == 0
