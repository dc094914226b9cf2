"""The planner on all six of vLLM's orders against tests/oracles.py's contract formulas (issue 19).

Random specs carry the section-6 fields (head slots, block-stride alignments, explicit padded
pages) so head rows, runs, stride rounding and every refusal are reached; the oracle predicts
rows, padding, offsets and totals, or that planning must fail.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

import kvlayout as K
from kvlayout.errors import SpecError
from kvlayout.testing import rich_spec_dict

from . import oracles as O

ORDERS = ("BLHNC", "BLNHC", "BHLNC", "LBHNC", "LBNHC", "LHBNC")


def _enrich(d: dict[str, Any], seed: int) -> dict[str, Any]:
    """Add section-6 fields to some layers; repeat a layer now and then (BHLNC runs)."""
    rng = random.Random(seed * 7 + 1)
    for g in d["groups"]:
        layers = g["layers"]
        if rng.random() < 0.3:  # a run of equal geometry under a new name
            src = rng.choice(layers)
            layers.insert(layers.index(src) + 1, dict(src, name=src["name"] + "r"))
        for layer in layers:
            if layer["kind"] != "mamba" and rng.random() < 0.3:
                layer["num_head_slots"] = rng.choice((1, 2, 3))
            if rng.random() < 0.25:
                layer["block_stride_alignment"] = rng.choice((4, 8, 12, 64, 96, 6))
            if rng.random() < 0.15 and O._layer_problem(layer) is None:
                layer.pop("alignment", None)
                layer["padded_page"] = O.real_page(layer) + rng.choice((0, 4, 12, 64))
    return d


def _specs(order: str, count: int, enrich: bool) -> list[K.KVCacheSpec]:
    out = []
    for seed in O.seeds(count):
        d = rich_spec_dict(seed, layout=order)
        if enrich:
            d = _enrich(d, seed)
        try:
            out.append(K.KVCacheSpec.from_dict(d))
        except SpecError:
            continue
    return out


@pytest.mark.parametrize("enrich", [False, True])
@pytest.mark.parametrize("order", ORDERS)
def test_every_order_matches_the_contract(order: str, enrich: bool) -> None:
    specs = _specs(order, 300, enrich)
    assert O.check_planner(K.plan, specs) == []
    planned = 0
    for spec in specs:
        ex = O.expected_plan(spec.to_dict())
        if ex.error is not None:
            continue
        planned += 1
        lay = K.plan_layout(spec)
        assert (lay.total_bytes, lay.block_stride, lay.slot_pages) == (
            ex.total,
            ex.block_stride,
            ex.slot_pages,
        )
        assert {p.layer.name: p.offset for p in lay.placements} == ex.offsets, spec.to_json()
        assert lay.order == order and lay.num_blocks == spec.num_blocks
    assert 0 < planned < len(specs)  # both outcomes exercised


def test_enriched_specs_reach_every_branch() -> None:
    """The generator makes head rows, runs, stride rounding and padded pages under every order."""
    heads = runs = rounded = padded = 0
    for order in ORDERS:
        for spec in _specs(order, 300, True):
            ex = O.expected_plan(spec.to_dict())
            if ex.error is not None:
                continue
            heads += any(r[2].startswith("head") for r in ex.rows)
            d = spec.to_dict()
            runs += order == "BHLNC" and any(
                layer["name"].endswith("r") for g in d["groups"] for layer in g["layers"]
            )
            rounded += any(
                O.page(layer) % layer.get("block_stride_alignment", 4)
                for g in d["groups"]
                for layer in g["layers"]
            )
            padded += any("padded_page" in layer for g in d["groups"] for layer in g["layers"])
    assert min(heads, runs, rounded, padded) > 10 * O.SCALE, (heads, runs, rounded, padded)
