"""The property suite rejects every planted wrong core, and accepts the real one.

The conformance suite does this for backends (tests/test_conformance.py); here the same is
done for the code that decides what is safe: each ``check_*`` of tests/oracles.py runs on the
real verifier, planner and coalescer (no failure) and on each planted one (at least one).
"""

from __future__ import annotations

import contextlib
import functools

import pytest

import kvlayout as K
from kvlayout.errors import SpecError
from kvlayout.planted import PLANTED_COALESCERS, PLANTED_PLANNERS, PLANTED_VERIFIERS, brute_verify
from kvlayout.testing import random_safe_table, random_spec, random_table, rich_spec_dict

from . import oracles as O


@functools.cache
def verifier_cases() -> tuple[K.SegmentTable, ...]:
    """Random hand-written tables: about half safe, every kind of near miss."""
    return tuple(random_table(seed) for seed in range(300))


@functools.cache
def planner_cases() -> tuple[K.KVCacheSpec, ...]:
    """Loadable rich specs of both layouts plus the conformance battery's specs and the presets."""
    out: list[K.KVCacheSpec] = []
    for seed in range(150):
        for layout in ("packed", "layer_major"):
            with contextlib.suppress(SpecError):
                out.append(K.KVCacheSpec.from_dict(rich_spec_dict(seed, layout=layout)))
    out += [random_spec(seed) for seed in range(40)]
    out += [K.preset(name).with_num_blocks(2) for name in sorted(K.PRESETS)]
    return tuple(out)


@functools.cache
def coalescer_cases() -> tuple[K.SegmentTable, ...]:
    """Safe hand-written tables of mixed strides, and planned tables."""
    planned = []
    for seed in range(60):
        with contextlib.suppress(SpecError):
            planned.append(K.plan(K.KVCacheSpec.from_dict(rich_spec_dict(seed))))
    return tuple(random_safe_table(seed) for seed in range(200)) + tuple(planned)


def test_cases_are_rich_enough() -> None:
    """The generators reach what the four issue-19 survivors hid in."""
    tables = verifier_cases()
    truths = [O.brute_invariants(t) for t in tables]
    assert 60 < sum(all(t.values()) for t in truths) < 240  # safe and unsafe both common
    multi_group = [t for t in tables if len({s.group for s in t.segments}) > 1]
    assert len(multi_group) > 100
    strides = {s.stride for t in tables for s in t.segments}
    assert {0, -8, -16, -32} <= strides and len(strides) > 8
    safe = coalescer_cases()
    assert all(all(O.brute_invariants(t).values()) for t in safe)
    assert sum(len({s.stride for s in t.segments}) > 1 for t in safe) > 50


def test_real_verifier_agrees_with_brute_force() -> None:
    assert O.check_verifier(K.verify, verifier_cases()) == []


def test_control_brute_verifier_passes() -> None:
    """kvlayout.planted's verifier with no bug planted passes: planted ones fail for their bug."""
    assert O.check_verifier(brute_verify, verifier_cases()) == []


@pytest.mark.parametrize("bug", sorted(PLANTED_VERIFIERS))
def test_every_planted_verifier_is_rejected(bug: str) -> None:
    failures = O.check_verifier(PLANTED_VERIFIERS[bug], verifier_cases())
    assert failures, f"planted verifier {bug} passed the property suite"


def test_real_planner_passes() -> None:
    assert O.check_planner(K.plan, planner_cases()) == []


@pytest.mark.parametrize("bug", sorted(PLANTED_PLANNERS))
def test_every_planted_planner_is_rejected(bug: str) -> None:
    failures = O.check_planner(PLANTED_PLANNERS[bug], planner_cases())
    assert failures, f"planted planner {bug} passed the property suite"


def test_real_coalescer_passes() -> None:
    assert O.check_coalescer(lambda t: t.coalesced(), coalescer_cases()) == []


@pytest.mark.parametrize("bug", sorted(PLANTED_COALESCERS))
def test_every_planted_coalescer_is_rejected(bug: str) -> None:
    failures = O.check_coalescer(PLANTED_COALESCERS[bug], coalescer_cases())
    assert failures, f"planted coalescer {bug} passed the property suite"
