"""Spec arithmetic and the planner against formulas re-typed from GEOMETRY.md (tests/oracles.py).

Specs come from ``rich_spec_dict``, which never asks the planner what it accepts: the oracle
predicts acceptance, every page and every row, and the library must agree on each seed.
"""

from __future__ import annotations

import json

import pytest

import kvlayout as K
from kvlayout.errors import SpecError
from kvlayout.testing import random_spec, rich_spec_dict

from . import oracles as O

SEEDS = O.seeds(400)


def _load(d: dict) -> K.KVCacheSpec | None:
    try:
        return K.KVCacheSpec.from_dict(d)
    except SpecError:
        return None


def loadable_specs(layout: str, seeds: range = SEEDS) -> list[K.KVCacheSpec]:
    """The specs of ``seeds`` that the contract says must load (checked against the library)."""
    out = []
    for seed in seeds:
        d = rich_spec_dict(seed, layout=layout)
        spec = _load(d)
        assert (spec is None) == (O.spec_problem(d) is not None), (O.spec_problem(d), json.dumps(d))
        if spec is not None:
            out.append(spec)
    return out


@pytest.mark.parametrize("layout", ["packed", "layer_major"])
def test_spec_loading_and_pages_match_contract(layout: str) -> None:
    loaded = already_aligned = 0
    for seed in SEEDS:
        d = rich_spec_dict(seed, layout=layout)
        problem = O.spec_problem(d)
        spec = _load(d)
        assert (spec is None) == (problem is not None), (
            f"seed {seed}: contract says {problem}: {json.dumps(d)}"
        )
        if spec is None:
            continue
        loaded += 1
        assert spec.to_dict() == d, f"seed {seed}: JSON round trip"
        raw_layers = [layer for g in d["groups"] for layer in g["layers"]]  # type: ignore[attr-defined]
        for (_, layer), raw in zip(spec.layers, raw_layers, strict=True):
            assert layer.real_page == O.real_page(raw), (seed, raw)
            assert layer.page == O.page(raw), (seed, raw)
            assert layer.gap == O.page(raw) - O.real_page(raw), (seed, raw)
            assert layer.zeroed == (raw["kind"] != "mamba")
            already_aligned += bool(raw.get("alignment")) and O.real_page(raw) % raw["alignment"] == 0
    assert loaded > 0.35 * len(SEEDS) and already_aligned > 0.25 * len(SEEDS)  # valid, many already aligned


@pytest.mark.parametrize("layout", ["packed", "layer_major"])
def test_planner_matches_contract_on_rich_specs(layout: str) -> None:
    specs = loadable_specs(layout)
    assert O.check_planner(K.plan, specs) == []
    errors = sum(O.expected_plan(s.to_dict()).error is not None for s in specs)
    assert 0 < errors < len(specs)  # both outcomes are exercised


@pytest.mark.parametrize("layout", ["packed", "layer_major"])
def test_layout_fields_match_contract(layout: str) -> None:
    for spec in loadable_specs(layout, O.seeds(200)):
        ex = O.expected_plan(spec.to_dict())
        if ex.error is not None:
            continue
        lay = K.plan_layout(spec)
        assert lay.total_bytes == ex.total
        assert lay.block_stride == ex.block_stride
        assert lay.slot_pages == ex.slot_pages
        assert {p.layer.name: p.offset for p in lay.placements} == ex.offsets
        assert lay.num_blocks == spec.num_blocks
        # the planned table's bytes per block: the union of block 0's ranges
        assert lay.table().bytes_per_block == len(O.block_bytes(lay.table(), 0))


def test_planner_matches_contract_on_conformance_specs() -> None:
    specs = [random_spec(seed) for seed in O.seeds(150)]
    assert O.check_planner(K.plan, specs) == []


@pytest.mark.parametrize("name", sorted(K.PRESETS))
def test_presets_match_contract(name: str) -> None:
    spec = K.preset(name).with_num_blocks(3)
    assert O.check_planner(K.plan, [spec]) == []


def test_oracle_itself_on_the_contracts_worked_examples() -> None:
    """The oracle reproduces the numbers printed in GEOMETRY.md sections 1, 2 and 5."""
    c4 = {
        "name": "x",
        "kind": "mla",
        "block_size": 256,
        "head_size": 512,
        "cache_dtype": "fp8_ds_mla",
        "compress_ratio": 4,
        "alignment": 576,
    }
    assert (O.real_page(c4), O.page(c4)) == (37_376, 37_440)
    c128 = dict(c4, compress_ratio=128)
    idx = {
        "name": "i",
        "kind": "mla",
        "block_size": 256,
        "head_size": 132,
        "dtype": "uint8",
        "compress_ratio": 4,
        "alignment": 576,
    }
    assert (O.real_page(c128), O.page(c128), O.real_page(idx), O.page(idx)) == (1_168, 1_728, 8_448, 8_640)
    spec = {
        "num_blocks": 100,
        "layout": "packed",
        "groups": [{"name": "mla", "layers": [dict(c4, name=f"l{i}") for i in range(4)]}],
    }
    ex = O.expected_plan(spec)
    assert [r[4] for r in ex.rows] == [0, 37_440, 74_880, 112_320]
    assert (ex.block_stride, ex.total) == (149_760, 14_976_000)
    assert ex.rows[-1][4] + 99 * ex.rows[-1][5] + ex.rows[-1][6] == 14_975_936
