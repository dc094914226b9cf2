"""Planted bugs: backends the conformance harness must reject, and wrong cores the tests must.

The backends write through NumPy on host buffers, clipped to the buffer, so a bug that runs
past the layout lands in the guard bands (where the harness sees it) instead of crashing.
The wrong cores (verifiers, planners, coalescers) are at the end of the module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from .planner import plan
from .reference import ReferenceBackend, normalize_block_ids
from .spec import GroupSpec, KVCacheSpec, LayerSpec
from .table import Segment, SegmentTable

Ranges = list[tuple[int, int]]


def _rows(
    table: SegmentTable,
    ids: np.ndarray,
    *,
    stride_as_span: bool = False,
    extra_base: int = 0,
    span_round: int = 0,
    drop_row: int | None = None,
    overrun: int = 0,
) -> Ranges:
    out: Ranges = []
    for r, s in enumerate(table.segments):
        if r == drop_row:
            continue
        span = s.stride if stride_as_span else s.span
        if span_round:
            span = -(-span // span_round) * span_round
        for b in ids.tolist():
            start = s.base + extra_base + b * s.stride
            out.append((start, start + span + overrun))
    return out


class PlantedBackend(ReferenceBackend):
    """Zeroes the ranges its ``bug`` function returns (relative to the layout start)."""

    name: ClassVar[str] = "planted"
    bug: ClassVar[Callable[[SegmentTable, np.ndarray], Ranges]]
    validates_ids: ClassVar[bool] = True

    def zero(self, block_ids: Any, group: str | None = None) -> None:
        """Zero with the planted bug; with ``group``, only that group's rows (GEOMETRY.md section 7)."""
        t = self.table
        if group is not None:
            rows = tuple(s for s in t.segments if s.group == group)
            t = SegmentTable(t.total_bytes, t.num_blocks, rows, t.padding)
        n = t.num_blocks
        ids = normalize_block_ids(block_ids, n) if self.validates_ids else np.asarray(block_ids, np.int64) % n
        data = self.buffer.reshape(-1).view(np.uint8)
        for a, b in type(self).bug(t, ids):
            a, b = max(0, self.offset + a), min(data.size, self.offset + b)
            if a < b:
                data[a:b] = 0


def _make(
    name: str, bug: Callable[[SegmentTable, np.ndarray], Ranges], validates: bool = True
) -> type[PlantedBackend]:
    return type(
        name,
        (PlantedBackend,),
        {"name": f"planted:{name}", "bug": staticmethod(bug), "validates_ids": validates},
    )


PLANTED: dict[str, type[PlantedBackend]] = {
    "stride-as-span": _make("stride-as-span", lambda t, i: _rows(t, i, stride_as_span=True)),  # vLLM #50276
    "offset-twice": _make(
        "offset-twice", lambda t, i: _rows(t, i, extra_base=4096)
    ),  # #52709: data_ptr offset added again
    "skip-last-id": _make("skip-last-id", lambda t, i: _rows(t, i[:-1])),
    "span-rounded-512": _make(
        "span-rounded-512", lambda t, i: _rows(t, i, span_round=512)
    ),  # padding overwritten
    "drop-one-row": _make("drop-one-row", lambda t, i: _rows(t, i, drop_row=len(t.segments) - 1)),
    "overrun-4": _make("overrun-4", lambda t, i: _rows(t, i, overrun=4)),
    "ids-modulo": _make("ids-modulo", lambda t, i: _rows(t, i), validates=False),
}


# --------------------------------------------------------------------------- planted wrong cores
# Issue 19: the code that decides what is safe gets the same treatment as the backends. Each
# planted core is a plain function with the real one's signature (verify(table) -> report with
# ``.ok`` and ``.by_invariant``; plan(spec) -> SegmentTable; coalesce(table) -> SegmentTable) and
# one realistic bug; the property checks of the test suite must reject every one of them.


@dataclass(frozen=True)
class PlantedReport:
    """What a planted verifier says: ``(invariant, message)`` pairs, empty when it calls it safe."""

    violations: tuple[tuple[int, str], ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_invariant(self, inv: int) -> list[tuple[int, str]]:
        return [v for v in self.violations if v[0] == inv]


def brute_verify(
    table: SegmentTable,
    *,
    neighbours_only: bool = False,
    same_group_only: bool = False,
    equal_strides_only: bool = False,
    skip_last_block: bool = False,
    end_exclusive: bool = False,
    padding_same_block_only: bool = False,
    zero_span_ok: bool = False,
) -> PlantedReport:
    """Invariants 1-4 by enumerating block pairs (small tables only); each flag plants one bug.

    With no flag set it is a correct (slow) verifier: the control that shows the property suite
    rejects the planted ones for their bug and nothing else.
    """
    n, total, segs = table.num_blocks, table.total_bytes, table.segments
    out: list[tuple[int, str]] = []
    for r, s in enumerate(segs):
        if s.base % 4 or s.stride % 4 or s.span % 4 or (s.span < 0 if zero_span_ok else s.span <= 0):
            out.append((1, f"row {r}: not 4-byte aligned or empty"))
    for r, s in enumerate(segs):
        for b in range(n - 1 if skip_last_block else n):
            lo, hi = s.base + b * s.stride, s.base + b * s.stride + s.span
            if lo < 0 or (hi >= total if end_exclusive else hi > total):
                out.append((2, f"row {r} block {b}: [{lo}, {hi}) outside [0, {total})"))
                break

    def meet(a: Segment, ba: int, c: Segment, bc: int) -> bool:
        a0, c0 = a.base + ba * a.stride, c.base + bc * c.stride
        return max(a0, c0) < min(a0 + a.span, c0 + c.span)

    for i, a in enumerate(segs):
        for j in range(i, len(segs)):
            c = segs[j]
            if (same_group_only and a.group != c.group) or (equal_strides_only and a.stride != c.stride):
                continue
            pairs = [(b, b2) for b in range(n) for b2 in range(n) if b != b2]
            if neighbours_only:
                pairs = [(b, b2) for b, b2 in pairs if abs(b - b2) == 1]
            hit = next(((b, b2) for b, b2 in pairs if meet(a, b, c, b2)), None)
            if hit:
                out.append((3, f"rows {i}, {j}: blocks {hit} share bytes"))
    for i, a in enumerate(segs):
        for k, p in enumerate(table.padding):
            pairs = (
                [(b, b) for b in range(n)]
                if padding_same_block_only
                else [(b, b2) for b in range(n) for b2 in range(n)]
            )
            if any(meet(a, b, p, b2) for b, b2 in pairs):
                out.append((4, f"row {i} clears padding range {k}"))
    return PlantedReport(tuple(out))


def _verifier(**bug: bool) -> Callable[[SegmentTable], PlantedReport]:
    return lambda table: brute_verify(table, **bug)


PLANTED_VERIFIERS: dict[str, Callable[[SegmentTable], PlantedReport]] = {
    "isolation-neighbours-only": _verifier(neighbours_only=True),  # survivor 3 of issue 19
    "isolation-same-group-only": _verifier(same_group_only=True),  # survivor 4: overlays checked as one group
    "isolation-equal-strides-only": _verifier(equal_strides_only=True),  # hand-written tables' mixed strides
    "bounds-skip-last-block": _verifier(skip_last_block=True),  # off by one: block num_blocks-1 unchecked
    "bounds-end-exclusive": _verifier(end_exclusive=True),  # off by one: a row ending at total_bytes refused
    "padding-same-block-only": _verifier(padding_same_block_only=True),
    "zero-span-accepted": _verifier(zero_span_ok=True),
}


def _with_alignment(spec: KVCacheSpec, align: Callable[[LayerSpec], int | None]) -> KVCacheSpec:
    """``spec`` with each layer's alignment replaced by ``align(layer)``."""

    def realign(layer: LayerSpec) -> LayerSpec:
        return replace(layer, alignment=align(layer))  # type: ignore[call-arg]  # every kind has it

    groups = tuple(GroupSpec(g.name, tuple(map(realign, g.layers)), g.kernel_block_size) for g in spec.groups)
    return KVCacheSpec(num_blocks=spec.num_blocks, layout=spec.layout, groups=groups, version=spec.version)


def _plan_pages_from_real_page(spec: KVCacheSpec) -> SegmentTable:
    """Alignment ignored: offsets and strides from the real page (kvcached #426)."""
    return plan(_with_alignment(spec, lambda layer: None))


def _plan_aligned_rounded_twice(spec: KVCacheSpec) -> SegmentTable:
    """``round_up`` that adds a whole unit to an already aligned page (survivor 1 of issue 19)."""

    def twice(layer: LayerSpec) -> int | None:
        a = layer.alignment_bytes
        return layer.real_page + a if a and layer.real_page % a == 0 else a

    return plan(_with_alignment(spec, twice))


def _plan_first_group_stride(spec: KVCacheSpec) -> SegmentTable:
    """Packed block stride taken from the first group instead of the largest."""
    t = plan(spec)
    if spec.layout != "packed":
        return t
    stride = sum(layer.page for layer in spec.groups[0].layers)

    def restride(rows: tuple[Segment, ...]) -> tuple[Segment, ...]:
        return tuple(replace(s, stride=stride) for s in rows)

    return SegmentTable(
        stride * spec.num_blocks, t.num_blocks, restride(t.segments), restride(t.padding), t.planned
    )


PLANTED_PLANNERS: dict[str, Callable[[KVCacheSpec], SegmentTable]] = {
    "page-from-real-page": _plan_pages_from_real_page,
    "aligned-rounded-twice": _plan_aligned_rounded_twice,
    "first-group-stride": _plan_first_group_stride,
}


def _merge_runs(
    table: SegmentTable, *, by_stride: bool = True, gap: int = 0, keep_max_end: bool = True
) -> SegmentTable:
    """Sort rows by base and merge runs that touch (or lie ``gap`` bytes apart)."""
    classes: dict[int, list[Segment]] = {}
    for s in table.segments:
        classes.setdefault(s.stride if by_stride else 0, []).append(s)
    out: list[Segment] = []
    for rows in classes.values():
        rows = sorted(rows, key=lambda s: (s.base, -s.span))
        cur = rows[0]
        for s in rows[1:]:
            if s.base <= cur.base + cur.span + gap:
                end = max(cur.base + cur.span, s.base + s.span) if keep_max_end else s.base + s.span
                cur = replace(cur, span=end - cur.base)
            else:
                out.append(cur)
                cur = s
        out.append(cur)
    return SegmentTable(table.total_bytes, table.num_blocks, tuple(out), table.padding, table.planned)


def _dedupe_first_span(table: SegmentTable) -> SegmentTable:
    """Rows sharing a base and stride deduplicated keeping the first, not the widest (vLLM 0.28)."""
    first: dict[tuple[int, int], Segment] = {}
    for s in table.segments:
        first.setdefault((s.base, s.stride), s)
    return SegmentTable(
        table.total_bytes, table.num_blocks, tuple(first.values()), table.padding, table.planned
    )


PLANTED_COALESCERS: dict[str, Callable[[SegmentTable], SegmentTable]] = {
    "merge-different-strides": lambda t: _merge_runs(t, by_stride=False),  # survivor 2 of issue 19
    "first-span-kept": _dedupe_first_span,
    "bridge-4-byte-gaps": lambda t: _merge_runs(t, gap=4),
    "last-row-end-kept": lambda t: _merge_runs(t, keep_max_end=False),
}


# --------------------------------------------------------------------------- vLLM's historical zeroers
# Issue 14: vLLM's KVBlockZeroer as each release built it from per-layer views, on kvlayout's rows
# (one segment per row, deduplicated by address as vLLM does). The control, vLLM 0.33, passes
# the conformance battery; each historical bug must fail it.


def vllm_zeroer_ranges(
    table: SegmentTable,
    ids: np.ndarray,
    *,
    span_is_stride: bool = False,
    first_span_kept: bool = False,
    offset_twice: bool = False,
) -> Ranges:
    """The bytes vLLM's zeroer writes for ``ids``; each flag is one release's bug."""
    index: dict[tuple[int, int], int] = {}
    segs: list[list[int]] = []  # [address, block stride, span]
    for s in table.segments:
        addr = 2 * s.base if offset_twice else s.base  # #52709: data_ptr() holds the offset, added again
        span = s.stride if span_is_stride else s.span  # 0.27 (#50276): the page size as stride and span
        i = index.get((addr, s.stride))
        if i is None:
            index[(addr, s.stride)] = len(segs)
            segs.append([addr, s.stride, span])
        elif not first_span_kept:  # 0.33 keeps the widest span per address; 0.28 kept the first
            segs[i][2] = max(segs[i][2], span)
    return [(a + b * st, a + b * st + sp) for a, st, sp in segs for b in ids.tolist()]


def _vllm(**bug: bool) -> Callable[[SegmentTable, np.ndarray], Ranges]:
    return lambda t, i: vllm_zeroer_ranges(t, i, **bug)


#: vLLM 0.33's zeroer on kvlayout's rows: the control that must pass.
VLLM_033 = _make("vllm-0.33", _vllm())

PLANTED_VLLM: dict[str, type[PlantedBackend]] = {
    "vllm-0.27-span-is-stride": _make("vllm-0.27-span-is-stride", _vllm(span_is_stride=True)),
    "vllm-0.28-first-span-kept": _make("vllm-0.28-first-span-kept", _vllm(first_span_kept=True)),
    "vllm-52709-offset-twice": _make("vllm-52709-offset-twice", _vllm(offset_twice=True)),
}
PLANTED.update(PLANTED_VLLM)
