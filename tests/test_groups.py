"""Per-group zeroing (GEOMETRY.md section 7, vLLM #52187): ids of one group clear that group's rows only."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.cli import main
from kvlayout.conformance import Case, run_battery, run_case


def two_groups() -> K.KVCacheSpec:
    """Group ``a``: two 4,096 B layers; group ``b`` overlaid: one 2,048 B layer (packed, stride 8,192)."""

    def full(name: str, heads: int) -> K.FullAttentionSpec:
        return K.FullAttentionSpec(name, block_size=16, num_kv_heads=heads, head_size=64, dtype="bfloat16")

    # full page = 2 * 16 * heads * 64 * 2 B = 4,096 * heads
    return K.KVCacheSpec(
        6, "packed", (K.GroupSpec("a", (full("a0", 1), full("a1", 1))), K.GroupSpec("b", (full("b0", 1),)))
    )


def test_contract_by_hand() -> None:
    table = K.plan(two_groups())
    assert table.groups == ("a", "b")
    # block b: group a clears [8192b, 8192b + 8192); group b clears [8192b, 8192b + 4096)
    assert K.expected_zeroed(table, [1, 4], group="a").tolist() == [[8192, 16384], [32768, 40960]]
    assert K.expected_zeroed(table, [1, 4], group="b").tolist() == [[8192, 12288], [32768, 36864]]
    assert K.expected_zeroed(table, [1, 4]).tolist() == [[8192, 16384], [32768, 40960]]


def test_dsv4_one_group_clears_a_fraction() -> None:
    table = K.plan(K.preset("dsv4"))
    ids = [0, 17, 99]
    every = K.expected_zeroed(table, ids)
    one = K.expected_zeroed(table, ids, group="c128.0")
    rows = [s for s in table.segments if s.group == "c128.0"]
    by_hand = sorted((s.base + b * s.stride, s.base + b * s.stride + s.span) for s in rows for b in ids)
    assert one.tolist() == [list(r) for r in K.merge_ranges(*np.array(by_hand).T).tolist()]
    assert (one[:, 1] - one[:, 0]).sum() < (every[:, 1] - every[:, 0]).sum()


def test_unknown_group_names_the_valid_ones() -> None:
    table = K.plan(two_groups())
    with pytest.raises(K.TableError, match="unknown group; valid groups: 'a', 'b'"):
        table.for_group("c")
    buf = K.poison_pattern(table.total_bytes)
    before = buf.copy()
    with pytest.raises(K.TableError, match="group"):
        K.ReferenceBackend(table, buf).zero([0], group="c")
    assert np.array_equal(buf, before)


def test_group_tables_verify_and_coalesce_within_the_group() -> None:
    table = K.plan(K.preset("dsv4"))
    for g in table.groups:
        sub = table.for_group(g)
        assert K.verify(sub).ok and {s.group for s in sub.segments} == {g}
        co = sub.coalesced()
        assert "+" not in " ".join(s.group for s in co.segments)  # never mixes groups
        ids = np.arange(sub.num_blocks)
        assert np.array_equal(K.expected_zeroed(co, ids), K.expected_zeroed(sub, ids))


def test_reference_per_group_on_a_poisoned_buffer() -> None:
    table = K.plan(two_groups())
    res = run_case(K.ReferenceBackend, table, [0, 5], group="b")
    assert res.ok and res.check.zeroed.tolist() == [[0, 4096], [40960, 45056]]


class _AllGroups(K.ReferenceBackend):
    """A planted backend that ignores ``group`` (zeroes every group): what vLLM does today."""

    name = "planted:ignores-group"

    def zero(self, block_ids: Any, group: str | None = None) -> None:
        super().zero(block_ids)


def test_conformance_rejects_a_backend_that_ignores_the_group() -> None:
    spec = K.preset("dsv4").with_num_blocks(6)
    failures, _ = run_battery(_AllGroups, [Case("one-group", spec, (0, 5), group="c4.3")])
    assert failures and "written outside the contract" in failures[0].detail
    assert "--group c4.3" in failures[0].format()
    assert not run_battery(K.ReferenceBackend, [Case("one-group", spec, (0, 5), group="c4.3")])[0]


def test_cli_zero_group(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "zero",
            "--preset",
            "dsv4",
            "--blocks",
            "0,5",
            "--group",
            "swa.3",
            "--backend",
            "reference",
            "--json",
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and rep["matches_contract"] and rep["group"] == "swa.3"
    table = K.plan(K.preset("dsv4"))
    assert rep["zeroed"] == K.expected_zeroed(table, [0, 5], group="swa.3").tolist()
    assert (
        main(["zero", "--preset", "dsv4", "--blocks", "0", "--group", "nope", "--backend", "reference"]) == 2
    )
    assert "valid groups: 'c4.0'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["cuda", "pallas"])
def test_kernel_backends_per_group(name: str) -> None:
    """Each kernel backend clears one group's rows only, byte for byte; an unknown group writes nothing."""
    backend = K.load_backend(name)
    table = K.plan(two_groups())
    for group, ids in (("b", [0, 5]), ("a", [3]), (None, [2, 4])):
        res = run_case(backend, table, ids, group=group)
        assert res.ok, (group, res)
    data = K.poison_pattern(table.total_bytes)
    be = backend.from_host(table, data)
    with pytest.raises(K.TableError, match="unknown group"):
        be.zero([0], group="c")
    with pytest.raises(K.TableError, match="group"):
        be.zero([0], group=3)  # type: ignore[arg-type]
    assert np.array_equal(be.to_host()[: table.total_bytes], data[: table.total_bytes])
