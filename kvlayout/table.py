"""The segment table (GEOMETRY.md section 3): what zeroing a block clears.

One row per (layer part, virtual sub-block): zeroing block ``b`` clears
``[base + b*stride, base + b*stride + span)`` for every row. Tables come from the planner
(:func:`kvlayout.plan`) or from JSON (``kvlayout check --table``); they are never derived
from tensor strides.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from .errors import TableError, bad_value, short
from .ranges import MAX_BLOCKS, MAX_BYTES, extent
from .validate import MAX_NAME_CHARS, check_int, check_name, parse_json, plain_fields, plain_str

TABLE_VERSION = 1
#: Most rows a table holds (GEOMETRY.md section 8): the verifier answers 100,000 rows within about a
#: second; a 1,000,000-row table JSON (43 MB, under the file cap) took 30 s and 571 MB (issue 25).
MAX_TABLE_ROWS = 100_000


def _kind(v: object) -> str:
    """A value that is not a str, for a message about a name: a builtin's bounded repr, another object's
    type (its own ``repr`` may pose as a str)."""
    return short(v) if type(v).__module__ == "builtins" else f"<a {type(v).__name__}>"


@dataclass(frozen=True)
class Segment:
    """One row: ``span`` bytes at ``base + b*stride`` for every block id ``b``."""

    base: int
    stride: int
    span: int
    group: str = ""
    layer: str = ""
    part: str = "page"
    virtual_index: int = 0

    def __post_init__(self) -> None:
        ints = (self.base, self.stride, self.span, self.virtual_index)
        names = (self.group, self.layer, self.part)
        if not all(type(v) is int for v in ints) or not all(type(v) is str for v in names):
            plain_fields(self)  # NumPy integers as Python ints, which never wrap; str subclasses as plain str
            for key in ("group", "layer", "part"):  # an object whose __eq__ says it is every group chose
                # every group's rows for one group's ids (issue 25, pass 28)
                v = getattr(self, key)
                if type(v) is not str:
                    raise bad_value(TableError, f"segment.{key}", v, "must be a string", shown=_kind(v))

    @property
    def label(self) -> str:
        """Short provenance for messages: ``group/layer/part[v]``."""
        v = f"[{self.virtual_index}]" if self.virtual_index else ""
        return f"{self.group}/{self.layer}/{self.part}{v}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "stride": self.stride,
            "span": self.span,
            "group": self.group,
            "layer": self.layer,
            "part": self.part,
            "virtual_index": self.virtual_index,
        }


@dataclass(frozen=True)
class SegmentTable:
    """Rows plus the buffer size they were planned for.

    ``padding`` holds periodic ranges (same form as rows) that are alignment gaps and belong
    to no layer's data; the verifier proves no row touches them. Tables loaded from JSON
    carry none and ``planned=False`` (the JSON form has no layout information).
    """

    total_bytes: int
    num_blocks: int
    segments: tuple[Segment, ...]
    padding: tuple[Segment, ...] = field(default=(), compare=False)
    #: True when the planner made this table (so ``padding`` is known, possibly empty).
    planned: bool = field(default=False, compare=False)
    #: True when :meth:`coalesced` merged rows of different groups into one: such a table cannot be
    #: zeroed per group (:meth:`for_group` refuses it). Kept in the JSON form as ``"groups_joined"``.
    groups_joined: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        plain_fields(self)
        check_int(TableError, "table.total_bytes", self.total_bytes, lo=0)
        n = check_int(TableError, "table.num_blocks", self.num_blocks, lo=0, hi=MAX_BLOCKS)
        # plain tuples, iterated once here: a tuple subclass's own __iter__ gave the verifier its rows and
        # the cuda kernel others (8 B zeroed 2 KiB past a 2 KiB view: issue 25, pass 25)
        for what in ("segments", "padding"):
            if type(getattr(self, what)) is not tuple:
                object.__setattr__(self, what, tuple(getattr(self, what)))
        _check_rows(len(self.segments))
        for what, rows in (("segments", self.segments), ("padding", self.padding)):
            for i, r in enumerate(rows):
                if not isinstance(r, Segment):
                    raise bad_value(TableError, f"table.{what}[{i}]", r, "must be a Segment")
                for k in ("base", "stride", "span"):
                    check_int(TableError, f"table.{what}[{i}].{k}", getattr(r, k), lo=-(MAX_BYTES - 1))
                # as from_dict reads it (a Python-made row the JSON form refused; issue 25, fifth pass)
                check_int(TableError, f"table.{what}[{i}].virtual_index", r.virtual_index, lo=0)
                lo, hi = extent(r.base, r.stride, r.span, max(n, 1))
                if lo <= -MAX_BYTES or hi >= MAX_BYTES:
                    raise bad_value(
                        TableError,
                        f"table.{what}[{i}]",
                        (r.base, r.stride, r.span),
                        f"reaches bytes [{lo}, {hi}) over {n} blocks: extents must stay within "
                        "(-2**62, 2**62) (GEOMETRY.md section 8)",
                    )

    def __len__(self) -> int:
        return len(self.segments)

    # ---- kernel-facing columns --------------------------------------------------------
    @cached_property
    def bases(self) -> np.ndarray:
        """int64 ``[rows]`` base byte offsets."""
        return np.array([s.base for s in self.segments], dtype=np.int64)

    @cached_property
    def strides(self) -> np.ndarray:
        """int64 ``[rows]`` bytes between consecutive block ids."""
        return np.array([s.stride for s in self.segments], dtype=np.int64)

    @cached_property
    def spans(self) -> np.ndarray:
        """int64 ``[rows]`` bytes cleared per block."""
        return np.array([s.span for s in self.segments], dtype=np.int64)

    def columns(self) -> np.ndarray:
        """int64 ``[rows, 3]`` of (base, stride, span), the form kernels consume."""
        return (
            np.stack([self.bases, self.strides, self.spans], axis=1)
            if self.segments
            else np.zeros((0, 3), np.int64)
        )

    @property
    def bytes_per_block(self) -> int:
        """Bytes cleared per block id: the union of block 0's ranges (overlaid groups share bytes)."""
        total, end = 0, None
        for a, b in sorted(zip(self.bases.tolist(), (self.bases + self.spans).tolist())):
            if end is None or a > end:
                total, end = total + b - a, b
            elif b > end:
                total, end = total + b - end, b
        return total

    # ---- groups (GEOMETRY.md section 7) -------------------------------------------------
    @property
    def groups(self) -> tuple[str, ...]:
        """Group names of the rows, in first-seen order."""
        return tuple(dict.fromkeys(s.group for s in self.segments))

    def for_group(self, group: str | None) -> SegmentTable:
        """The rows of one cache group (``None``: the whole table): what zeroing ids of that group clears.

        A block id belongs to one group at a time, so zeroing it for its group must leave every
        other group's bytes alone (vLLM #52187). Padding is kept: no group may clear it.
        """
        if group is None:
            return self
        group = plain_str(group)  # its own __eq__ chose the rows (pass 25)
        if type(group) is not str:  # nor may another object's (pass 28): the reference cleared every group
            raise bad_value(TableError, "group", group, "must be a string or None", shown=_kind(group))
        if self.groups_joined:  # a merged row clears bytes of several groups: per group it would
            # clear part of one group and nothing of another (issue 25, ninth pass)
            why = (
                "this table was coalesced across groups (SegmentTable.coalesced(), plan --coalesce): "
                "zero per group from the planned table (GEOMETRY.md section 7)"
            )
            raise bad_value(TableError, "group", group, why)
        rows = tuple(s for s in self.segments if s.group == group)
        if not rows:
            valid = ", ".join(repr(g) for g in self.groups) or "none"
            raise bad_value(TableError, "group", group, f"unknown group; valid groups: {valid}")
        return SegmentTable(self.total_bytes, self.num_blocks, rows, self.padding, self.planned)

    # ---- coalescing --------------------------------------------------------------------
    def coalesced(self) -> SegmentTable:
        """Merge rows without changing the union of cleared bytes.

        Rows with the same stride whose per-block ranges touch or overlap (adjacent spans of
        one block, virtual sub-blocks, same-base rows) become one row spanning their union.
        Rows with different strides are never merged.
        """
        by_stride: dict[int, list[Segment]] = {}
        for s in self.segments:
            by_stride.setdefault(s.stride, []).append(s)
        merged: list[Segment] = []
        joined = self.groups_joined
        for stride, rows in by_stride.items():
            rows.sort(key=lambda r: (r.base, -r.span))
            cur = rows[0]
            names = [cur]
            for r in rows[1:]:
                if r.base <= cur.base + cur.span:
                    end = max(cur.base + cur.span, r.base + r.span)
                    cur = Segment(
                        cur.base, stride, end - cur.base, cur.group, cur.layer, cur.part, cur.virtual_index
                    )
                    names.append(r)
                else:
                    merged.append(_provenance(cur, names))
                    joined = joined or len({n.group for n in names}) > 1
                    cur, names = r, [r]
            merged.append(_provenance(cur, names))
            joined = joined or len({n.group for n in names}) > 1
        merged.sort(key=lambda r: (r.base, r.stride))
        return SegmentTable(
            self.total_bytes, self.num_blocks, tuple(merged), self.padding, self.planned, joined
        )

    # ---- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": TABLE_VERSION,
            "total_bytes": self.total_bytes,
            "num_blocks": self.num_blocks,
            "segments": [s.to_dict() for s in self.segments],
            **({"groups_joined": True} if self.groups_joined else {}),
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: object) -> SegmentTable:
        """Parse the table JSON of GEOMETRY.md section 4 (types and limits checked; safety: see verify)."""
        if not isinstance(data, Mapping):
            raise bad_value(TableError, "table", data, "must be a JSON object")
        for k in ("total_bytes", "num_blocks", "segments"):
            if k not in data:
                raise bad_value(TableError, f"table.{k}", None, "missing required field")
        unknown = sorted(set(data) - {"version", "total_bytes", "num_blocks", "segments", "groups_joined"})
        if unknown:
            raise bad_value(TableError, f"table.{unknown[0]}", data[unknown[0]], "unknown field")
        if data.get("version", TABLE_VERSION) != TABLE_VERSION:
            raise bad_value(TableError, "table.version", data["version"], "only version 1 is supported")
        total = check_int(TableError, "table.total_bytes", data["total_bytes"], lo=0)
        nb = check_int(TableError, "table.num_blocks", data["num_blocks"], lo=0, hi=MAX_BLOCKS)
        joined = data.get("groups_joined", False)
        if not isinstance(joined, bool):
            raise bad_value(TableError, "table.groups_joined", joined, "must be true or false")
        raw = data["segments"]
        if not isinstance(raw, list):
            raise bad_value(TableError, "table.segments", raw, "must be a list")
        _check_rows(len(raw))  # before a row is read
        segs = []
        for i, r in enumerate(raw):
            path = f"table.segments[{i}]"
            if not isinstance(r, Mapping):
                raise bad_value(TableError, path, r, "must be an object")
            extra = sorted(set(r) - {"base", "stride", "span", "group", "layer", "part", "virtual_index"})
            if extra:
                raise bad_value(TableError, f"{path}.{extra[0]}", r[extra[0]], "unknown field")
            nums = {}
            for k in ("base", "stride", "span"):
                if k not in r:
                    raise bad_value(TableError, f"{path}.{k}", None, "missing required field")
                nums[k] = check_int(TableError, f"{path}.{k}", r[k], lo=-(MAX_BYTES - 1))
            names = {
                k: check_name(TableError, f"{path}.{k}", r.get(k, d), empty=True)
                for k, d in (("group", ""), ("layer", ""), ("part", "page"))
            }
            vi = check_int(TableError, f"{path}.virtual_index", r.get("virtual_index", 0), lo=0)
            segs.append(
                Segment(
                    nums["base"],
                    nums["stride"],
                    nums["span"],
                    names["group"],
                    names["layer"],
                    names["part"],
                    vi,
                )
            )
        return cls(total_bytes=total, num_blocks=nb, segments=tuple(segs), groups_joined=joined)

    @classmethod
    def from_json(cls, text: str | bytes) -> SegmentTable:
        return cls.from_dict(parse_json(TableError, "table", text))


def _check_rows(n: int) -> None:
    if n > MAX_TABLE_ROWS:
        why = f"at most {MAX_TABLE_ROWS:,} rows (GEOMETRY.md section 8)"
        raise bad_value(TableError, "table.segments", f"{n} rows", why)


def check_table(table: Any) -> SegmentTable:
    """The first argument of every zeroer: a :class:`SegmentTable` (checked before anything else).

    Here, not in validate.py: validate.py sits below table.py and imports nothing of it.
    """
    if not isinstance(table, SegmentTable):
        kind = type(table).__name__
        raise TableError(f"table type = {kind}: must be a kvlayout.SegmentTable", field="table", value=kind)
    if type(table) is not SegmentTable or not all(type(s) is Segment for s in table.segments):
        # a subclass's own for_group() / coalesced() chose the rows a zeroer or the reference wrote, never
        # verified (issue 25, pass 24: 8 B past a 2 KiB buffer by cuda, another block's bytes by Pallas)
        kind = type(table).__name__
        if kind == "SegmentTable":
            kind = "SegmentTable of Segment subclasses"
        why = "must be a kvlayout.SegmentTable itself (a subclass's methods pick the rows written)"
        raise TableError(f"table type = {kind}: {why}", field="table", value=kind)
    return table


def _provenance(row: Segment, sources: Iterable[Segment]) -> Segment:
    """Name a merged row after all the rows it came from."""
    src = list(sources)
    if len(src) == 1:
        return row
    layers = list(dict.fromkeys(s.layer for s in src))
    groups = list(dict.fromkeys(s.group for s in src))
    parts = list(dict.fromkeys(s.part for s in src))
    return Segment(row.base, row.stride, row.span, _label(groups), _label(layers), _label(parts), 0)


def _label(names: list[str]) -> str:
    """``names`` joined by ``+``, cut to a name's :data:`~kvlayout.validate.MAX_NAME_CHARS`: a coalesced
    140-layer table's label passed it, and its own JSON was refused (issue 25)."""
    text = "+".join(names)
    if len(text) <= MAX_NAME_CHARS:
        return text
    tail = f"...({len(names)} in all)"
    kept: list[str] = []
    size = len(tail)
    for n in names:
        if size + len(n) + 1 > MAX_NAME_CHARS:
            break
        kept.append(n)
        size += len(n) + 1
    return "".join(f"{n}+" for n in kept) + tail
