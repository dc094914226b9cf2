"""Cross-backend conformance: run a backend on poisoned, guard-banded buffers and compare.

``run_case`` is the one primitive: fill ``guard + total_bytes + guard`` bytes with a
pattern that has no zero byte, hand them to the backend with the layout at ``offset =
guard``, zero a batch, read the bytes back and compare every byte with the contract.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import Backend
from .reference import ZeroCheck, compare_to_contract, normalize_block_ids, poison_pattern
from .table import SegmentTable

#: Untouched bytes on both sides of the layout; whole 512 B rows for TPU views.
GUARD_BYTES = 4096


@dataclass(frozen=True)
class CaseResult:
    """One backend run: how it ran, the bytes after, and the comparison with the contract."""

    backend: str
    mode: str
    block_ids: np.ndarray
    after: np.ndarray
    check: ZeroCheck

    @property
    def ok(self) -> bool:
        return self.check.matches


def run_case(
    backend: type[Backend],
    table: SegmentTable,
    block_ids: Any,
    *,
    guard: int = GUARD_BYTES,
    seed: int = 0x5EED,
    extra_bytes: int = 0,
    group: str | None = None,
) -> CaseResult:
    """Zero ``block_ids`` with ``backend`` on a poisoned buffer and compare with the contract.

    ``extra_bytes`` makes the buffer larger than the layout (beyond the trailing guard).
    Ids are validated before any buffer is made, so bad ids raise and write nothing.
    """
    ids = normalize_block_ids(block_ids, table.num_blocks)
    table.for_group(group)  # an unknown group is refused before any buffer exists
    data = poison_pattern(guard + table.total_bytes + guard + extra_bytes, seed)
    be = backend.from_host(table, data, offset=guard)
    if group is None:
        be.zero(ids)
    else:
        be.zero(ids, group=group)
    after = be.to_host()
    check = compare_to_contract(data, after, table, ids, origin=guard, group=group)
    return CaseResult(backend.name, be.mode, ids, after, check)


# --------------------------------------------------------------------------- the battery
@dataclass(frozen=True)
class Case:
    """One conformance case: a spec, a batch of ids, and what is expected."""

    name: str
    spec: Any  # KVCacheSpec
    block_ids: tuple[int, ...]
    coalesce: bool = False  # hand the backend the coalesced table instead of the planner's
    extra_bytes: int = 0  # buffer larger than the layout
    expect_error: bool = False  # ids out of range: must raise and write nothing
    group: str | None = None  # zero the ids of this cache group only (GEOMETRY.md section 7)


@dataclass(frozen=True)
class Failure:
    """A failed case, with everything needed to replay it with ``kvlayout zero``."""

    backend: str
    case: str
    spec_json: str
    block_ids: tuple[int, ...]
    detail: str
    group: str | None = None

    def format(self) -> str:
        ids = ",".join(str(i) for i in self.block_ids)
        spec, backend, blocks = shlex.quote(self.spec_json), shlex.quote(self.backend), shlex.quote(ids)
        return (
            f"FAIL backend={self.backend} case={self.case} block_ids=[{ids}]\n  {self.detail}\n"
            f"  replay: printf '%s' {spec} > spec.json && kvlayout zero spec.json --blocks {blocks} "
            f"--backend {backend}" + (f" --group {shlex.quote(self.group)}" if self.group is not None else "")
        )


def battery(quick: bool = False, seeds: int | None = None) -> list[Case]:
    """Presets, seeded random specs of both layouts and edge cases."""
    from .planner import plan
    from .presets import preset
    from .testing import random_spec

    cases: list[Case] = []
    for name in ("dsv4-test", "dsv4", "llama-8b"):
        spec = preset(name)
        if name == "llama-8b":
            spec = spec.with_num_blocks(8)
        n = spec.num_blocks
        cases.append(Case(f"{name}:first-odd-last", spec, (0, 1, n - 1)))
        if not quick:
            cases.append(Case(f"{name}:duplicates", spec, (3, 3, 1, n - 1, 3)))
    small = preset("dsv4-test").with_num_blocks(6)
    cases += [
        Case("one-block-pool", preset("dsv4-test").with_num_blocks(1), (0,)),
        Case("last-block", preset("dsv4-test"), (99,)),
        Case("all-blocks", small, tuple(range(6))),
        Case("empty-batch", small, ()),
        Case("bigger-buffer", small, (2, 5), extra_bytes=3 * 512 + 12),
        Case("coalesced-table", preset("dsv4").with_num_blocks(6), (0, 5), coalesce=True),
        Case("181-rows-uncoalesced", preset("dsv4").with_num_blocks(6), (1, 4)),
        Case("dsv4:one-group", preset("dsv4").with_num_blocks(6), (0, 2, 5), group="c4.3"),
        Case(
            "dsv4:last-group",
            preset("dsv4").with_num_blocks(6),
            (1, 5),
            group=plan(preset("dsv4")).groups[-1],
        ),
        Case("dsv4-test:its-only-group", small, (0, 5), group="mla"),
        Case("bad-ids", small, (0, 6), expect_error=True),
        Case("negative-id", small, (-1,), expect_error=True),
    ]
    for layout in ("packed", "layer_major"):
        for s in range(seeds if seeds is not None else (3 if quick else 10)):
            spec = random_spec(1000 + s, layout=layout, max_blocks=8)
            n = spec.num_blocks
            ids = tuple(sorted({0, n - 1, (7 * s) % n}))
            cases.append(Case(f"random:{layout}:{s}", spec, ids))
    cases += _vllm_cases(quick)
    return cases


def _vllm_cases(quick: bool) -> list[Case]:
    """vLLM 0.33's other four orders (GEOMETRY.md section 6), and vLLM 0.28's overlay bug geometry."""
    from .presets import indexer_first
    from .spec import KV_CACHE_LAYOUTS
    from .testing import random_spec

    cases = [Case("vllm-0.28:indexer-group-first", indexer_first(6), (0, 3, 5))]
    for order in KV_CACHE_LAYOUTS:
        if order in ("BLHNC", "LBHNC"):  # packed and layer_major above
            continue
        for s in range(1 if quick else 3):
            spec = random_spec(2000 + s, layout=order, max_blocks=8)
            n = spec.num_blocks
            cases.append(Case(f"random:{order}:{s}", spec, tuple(sorted({0, n - 1, (5 * s) % n}))))
    return cases


def run_battery(
    backend: type[Backend], cases: list[Case] | None = None, *, label: str | None = None
) -> tuple[list[Failure], dict[str, np.ndarray]]:
    """Run every case on ``backend``; return failures and the byte images (for cross-checks). ``label``:
    the name the backend was loaded by (``module:Class``), which the replay commands then name."""
    from .errors import KVLayoutError
    from .planner import plan

    failures: list[Failure] = []
    images: dict[str, np.ndarray] = {}
    for case in cases if cases is not None else battery():
        table = plan(case.spec, coalesce=case.coalesce)
        name = label or getattr(backend, "name", "") or backend.__name__

        def fail(detail: str, case: Case = case, name: str = name) -> None:
            failures.append(Failure(name, case.name, case.spec.to_json(), case.block_ids, detail, case.group))

        try:
            if case.expect_error:
                data = poison_pattern(GUARD_BYTES + table.total_bytes + GUARD_BYTES)
                be = backend.from_host(table, data, offset=GUARD_BYTES)
                try:
                    be.zero(list(case.block_ids))
                except KVLayoutError:
                    after = be.to_host()
                    if not np.array_equal(after, data):
                        fail("raised on bad ids but bytes changed")
                else:
                    fail("accepted out-of-range block ids (must raise a KVLayoutError and write nothing)")
                continue
            res = run_case(
                backend, table, list(case.block_ids), extra_bytes=case.extra_bytes, group=case.group
            )
            images[case.name] = res.after
            if not res.ok:
                fail(res.check.describe())
        except Exception as e:  # a crash is a failure of that case, not of the harness
            fail(f"raised {type(e).__name__}: {e}")
    return failures, images


def run_conformance(backends: dict[str, type[Backend]], quick: bool = False) -> list[Failure]:
    """Every backend against the contract, then all backends against each other, byte for byte."""
    cases = battery(quick)
    failures: list[Failure] = []
    images: dict[str, dict[str, np.ndarray]] = {}
    for name, cls in backends.items():
        print(f"conformance: {name}: {len(cases)} cases ...", file=sys.stderr, flush=True)
        found, imgs = run_battery(cls, cases, label=name)
        print(
            f"conformance: {name}: {len(cases) - len({f.case for f in found})} passed, {len(found)} failures",
            file=sys.stderr,
            flush=True,
        )
        failures += found
        images[name] = imgs
    names = list(images)
    for other in names[1:]:
        for case, first in images[names[0]].items():
            b = images[other].get(case)
            if b is not None and not np.array_equal(first, b):
                diff = np.flatnonzero(first != b)
                c = next(c for c in cases if c.name == case)
                failures.append(
                    Failure(
                        other,
                        case,
                        c.spec.to_json(),
                        c.block_ids,
                        f"buffer differs from {names[0]}'s at {diff.size} bytes, "
                        f"first at offset {int(diff[0]) - GUARD_BYTES}",
                    )
                )
    return failures
