"""Independent oracles, written from GEOMETRY.md sections 1-3 and never from kvlayout's code.

Nothing here imports the spec arithmetic, the planner, the coalescer or the verifier: the
formulas are the contract's, re-typed, and the verifier oracle enumerates every block id and
byte. Each ``check_*`` takes the function under test as a parameter and returns a list of
failures, so the same property runs on the real core (must return ``[]``) and on every planted
wrong core of :mod:`kvlayout.planted` (must not).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvlayout.errors import SpecError
from kvlayout.table import SegmentTable

#: Fraction of the usual seed counts (scripts/mutation.sh runs the property tests smaller).
SCALE = float(os.environ.get("KVLAYOUT_TEST_SCALE", "1"))


def seeds(count: int, start: int = 0) -> range:
    """``count`` seeds from ``start``, scaled by :data:`SCALE`."""
    return range(start, start + max(1, int(count * SCALE)))


# ---------------------------------------------------------------- section 1: pages
ITEMSIZE = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}
DS_MLA_TOKEN_BYTES = 448 + 128 + 7 + 1  # fp8 NoPE + bf16 RoPE + UE8M0 scales + pad


def ceil_to(x: int, a: int) -> int:
    """The smallest multiple of ``a`` not below ``x`` (a positive)."""
    q, r = divmod(x, a)
    return x if r == 0 else (q + 1) * a


def heads(layer: Mapping[str, Any]) -> int:
    """``H``, head slots per block (section 6): ``num_head_slots``, else the KV heads of attention, else 1."""
    if layer.get("num_head_slots") is not None:
        return int(layer["num_head_slots"])
    return int(layer["num_kv_heads"]) if layer["kind"] in ("full", "sliding_window") else 1


def real_page(layer: Mapping[str, Any]) -> int:
    """Real page bytes of a layer given as JSON: section 1's table, ``H * N * C`` with section 6's fields."""
    kind = layer["kind"]
    if kind in ("full", "sliding_window"):
        tokens_per_state = layer.get("tokens_per_state") or 1
        states = layer["block_size"] // tokens_per_state * (layer.get("states_per_token") or 1)
        if layer.get("state_content_bytes") is not None:
            cell = layer["state_content_bytes"]
        else:
            v = layer["head_size"] if layer.get("head_size_v") is None else layer["head_size_v"]
            cell = (layer["head_size"] + v) * ITEMSIZE[layer["dtype"]]
        return heads(layer) * states * cell
    if kind == "mla":
        stored = layer["block_size"] // layer.get("compress_ratio", 1) * (layer.get("states_per_token") or 1)
        if "token_bytes" in layer:
            token = layer["token_bytes"]
        elif layer.get("cache_dtype") == "fp8_ds_mla":
            token = DS_MLA_TOKEN_BYTES
        else:
            token = layer["head_size"] * ITEMSIZE[layer.get("cache_dtype") or layer["dtype"]]
        return heads(layer) * stored * token
    assert kind == "mamba", kind
    return layer["state_bytes"]


def page(layer: Mapping[str, Any]) -> int:
    """Padded page: ``padded_page`` if set, else the real page rounded up to ``alignment`` if set."""
    if layer.get("padded_page") is not None:
        return int(layer["padded_page"])
    a = layer.get("alignment")
    return ceil_to(real_page(layer), a) if a else real_page(layer)


def spec_problem(spec: Mapping[str, Any]) -> str | None:
    """Why loading ``spec`` must fail (sections 1, 2, 4), or ``None`` if it must load."""
    if spec["num_blocks"] < 0:
        return "num_blocks"
    names: set[str] = set()
    for g in spec["groups"]:
        kbs = g.get("kernel_block_size")
        if kbs is not None and kbs <= 0:
            return "kernel_block_size"
        for layer in g["layers"]:
            if layer["name"] in names:
                return "duplicate layer"
            names.add(layer["name"])
            why = _layer_problem(layer)
            if why:
                return f"{layer['name']}: {why}"
    return None


def _layer_problem(layer: Mapping[str, Any]) -> str | None:
    ints = [
        k
        for k in (
            "block_size",
            "num_kv_heads",
            "head_size",
            "window",
            "state_bytes",
            "token_bytes",
            "compress_ratio",
            "alignment",
        )
        if k in layer
    ]
    for k in ints:
        if layer[k] <= 0:
            return k
    for k in ("dtype", "cache_dtype"):
        if k in layer and layer[k] not in ITEMSIZE and not (k == "cache_dtype" and layer[k] == "fp8_ds_mla"):
            return k
    if layer["kind"] == "mla" and layer["block_size"] % layer.get("compress_ratio", 1):
        return "compress_ratio"
    if real_page(layer) % 4:
        return "real_page"
    if page(layer) % 4:
        return "alignment"
    return None


# ---------------------------------------------------------------- sections 2-3: the expected table
Row = tuple[str, str, str, int, int, int, int]  # group, layer, part, virtual_index, base, stride, span


@dataclass
class Expected:
    """What planning a spec must give: an error, or rows, sizes and the padding bytes."""

    error: str | None = None
    total: int = 0
    num_blocks: int = 0
    rows: list[Row] = field(default_factory=list)
    block_stride: int | None = None
    slot_pages: tuple[int, ...] = ()
    offsets: dict[str, int] = field(default_factory=dict)
    data: list[tuple[int, int, int]] = field(
        default_factory=list
    )  # (base, stride, bytes) of every layer part
    gaps: list[tuple[int, int, int]] = field(default_factory=list)  # alignment gaps, same form

    def padding_bytes(self) -> set[int]:
        """Bytes inside an alignment gap of some block that no layer's data covers."""
        n = self.num_blocks
        return _periodic_bytes(self.gaps, n) - _periodic_bytes(self.data, n)


def _periodic_bytes(rows: Iterable[tuple[int, int, int]], n: int) -> set[int]:
    return {
        x
        for base, stride, size in rows
        for b in range(n)
        for x in range(base + b * stride, base + b * stride + size)
    }


ALIASES = {"packed": "BLHNC", "layer_major": "LBHNC"}
#: Section 8: every size, stride and total is below 2**62.
LIMIT = 2**62


def _stride_alignment(layer: Mapping[str, Any]) -> int:
    return int(layer.get("block_stride_alignment") or 1)


def _geometry(layer: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in layer.items() if k != "name"))


def _by_geometry(layers: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    keys = list(dict.fromkeys(_geometry(layer) for layer in layers))
    return sorted(layers, key=lambda layer: keys.index(_geometry(layer)))  # stable: listed order within


def expected_plan(spec: Mapping[str, Any]) -> Expected:
    """Sections 2 and 6 (and the planner's design note on vLLM's orders) applied to a spec that loads.

    Block-outer orders (``BLHNC`` = packed, ``BLNHC``, ``BHLNC``): the block stride is the widest
    group's pages rounded up to the lcm of every ``block_stride_alignment``; under ``BHLNC``
    consecutive layers of equal geometry form a run and head ``h`` of the ``i``-th of ``k``
    layers sits at ``run + h*k*N*C + i*N*C``. Layer-outer orders (``LBHNC`` = layer_major,
    ``LBNHC``, ``LHBNC``): slot ``j``'s page is the largest of its layers' pages rounded up to
    their ``block_stride_alignment``; under ``LHBNC`` head ``h`` of block ``b`` is at
    ``region + h*n*pitch + b*pitch`` with ``pitch = slot_page // H``.
    """
    n = spec["num_blocks"]
    # vLLM 0.33 places a group's layers by spec: each geometry's layers together, geometries in
    # the order they first appear (heads 8, 2, 8, 4 -> layers 0, 2, 1, 3), in every order
    groups = [{**g, "layers": _by_geometry(g["layers"])} for g in spec["groups"]]
    order = ALIASES.get(spec["layout"], spec["layout"])
    ex = Expected(num_blocks=n)
    # (group, layer, parts): part = (name, base, stride, span, padded)
    parts: list[tuple[Mapping[str, Any], Mapping[str, Any], list[tuple[str, int, int, int, int]]]] = []
    if order in ("BLHNC", "BLNHC", "BHLNC"):
        if any(layer.get("kv_split") for g in groups for layer in g["layers"]):
            return Expected(error="kv_split outside LBHNC")
        widest = max(sum(page(layer) for layer in g["layers"]) for g in groups)
        lcm = 1
        for g in groups:
            for layer in g["layers"]:
                a = _stride_alignment(layer)
                lcm = lcm * a // _gcd(lcm, a)
        if lcm >= LIMIT:
            return Expected(error="lcm of block-stride alignments reaches 2**62 (section 8)")
        ex.block_stride = ceil_to(widest, lcm)
        if ex.block_stride % 4:
            return Expected(error="block stride not a multiple of 4")
        if ex.block_stride * n >= LIMIT or ex.block_stride >= LIMIT:
            return Expected(error="buffer reaches 2**62 (section 8)")
        st = ex.block_stride
        ex.total = st * n
        if st > widest:
            ex.gaps.append((widest, st, st - widest))
        for g in groups:
            if order != "BHLNC":
                offset = 0
                for layer in g["layers"]:
                    ex.offsets[layer["name"]] = offset
                    parts.append((g, layer, [("page", offset, st, real_page(layer), page(layer))]))
                    offset += page(layer)
                continue
            run_off = 0
            layers = list(g["layers"])
            i = 0
            while i < len(layers):
                k = 1
                while i + k < len(layers) and _geometry(layers[i + k]) == _geometry(layers[i]):
                    k += 1
                first = layers[i]
                h = heads(first)
                if h > 1 and page(first) != real_page(first):
                    return Expected(error="padding with head slots outside the page")
                nc = page(first) // h
                for r in range(k):
                    layer = layers[i + r]
                    base = run_off + r * nc
                    ex.offsets[layer["name"]] = base
                    got = _head_rows(layer, base, k * nc, st, page(layer))
                    if got is None:
                        return Expected(error="a head slot is not whole words")
                    parts.append((g, layer, got))
                run_off += k * page(first)
                i += k
    else:
        if order != "LBHNC" and any(layer.get("kv_split") for g in groups for layer in g["layers"]):
            return Expected(error="kv_split outside LBHNC")
        depth = max(len(g["layers"]) for g in groups)
        slots = [[g["layers"][j] for g in groups if j < len(g["layers"])] for j in range(depth)]
        own = {}
        for slot in slots:
            for layer in slot:
                o = ceil_to(page(layer), _stride_alignment(layer))
                if o % 4:
                    return Expected(error="layer stride not a multiple of 4")
                if order == "LHBNC" and o != page(layer):
                    return Expected(error="LHBNC cannot pad a page to a block stride")
                own[layer["name"]] = o
        ex.slot_pages = tuple(max(own[layer["name"]] for layer in slot) for slot in slots)
        if max(ex.slot_pages) >= LIMIT or sum(ex.slot_pages) * n >= LIMIT:
            return Expected(error="buffer reaches 2**62 (section 8)")
        for slot in slots:
            if len({bool(layer.get("kv_split")) for layer in slot}) > 1:
                return Expected(error="kv_split disagrees in a slot")
            if order == "LHBNC":
                if any(heads(layer) > 1 and page(layer) != real_page(layer) for layer in slot):
                    return Expected(error="padding with head slots outside the page")
                shapes = {(heads(layer), page(layer)) for layer in slot}
                if len(shapes) > 1 and any(heads(layer) > 1 for layer in slot):
                    return Expected(error="LHBNC slot disagrees on head slots or page")
        region = [sum(ex.slot_pages[:j]) * n for j in range(depth)]
        ex.total = sum(ex.slot_pages) * n
        for g in groups:
            for j, layer in enumerate(g["layers"]):
                sp, real = ex.slot_pages[j], real_page(layer)
                ex.offsets[layer["name"]] = region[j]
                if order == "LHBNC":
                    pitch = sp // heads(layer)
                    got = _head_rows(layer, region[j], pitch * n, pitch, own[layer["name"]])
                    if got is None:
                        return Expected(error="a head slot is not whole words")
                    parts.append((g, layer, got))
                elif layer.get("kv_split"):
                    if sp % 8 or real % 8:
                        return Expected(error="kv_split halves not multiples of 4")
                    half = sp // 2 * n
                    parts.append(
                        (
                            g,
                            layer,
                            [
                                ("k", region[j], sp // 2, real // 2, page(layer) // 2),
                                ("v", region[j] + half, sp // 2, real // 2, page(layer) // 2),
                            ],
                        )
                    )
                else:
                    parts.append((g, layer, [("page", region[j], sp, real, own[layer["name"]])]))
    for g, layer, layer_parts in parts:
        for name, base, stride, span, padded in layer_parts:
            ex.data.append((base, stride, span))
            if padded > span:
                ex.gaps.append((base + span, stride, padded - span))
            if layer["kind"] == "mamba":
                continue
            ratio = 1
            kbs = g.get("kernel_block_size")
            if kbs is not None:
                if layer["block_size"] % kbs:
                    return Expected(error="kernel_block_size does not divide block_size")
                ratio = layer["block_size"] // kbs
            if ratio > 1 and real_page(layer) != page(layer):
                return Expected(error="virtual splitting of a padded page")
            if span % (4 * ratio):
                return Expected(error="part not a multiple of 4*ratio")
            for v in range(ratio):
                ex.rows.append(
                    (g["name"], layer["name"], name, v, base + v * (span // ratio), stride, span // ratio)
                )
    return ex


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _head_rows(
    layer: Mapping[str, Any], base: int, pitch: int, stride: int, padded: int
) -> list[tuple[str, int, int, int, int]] | None:
    """One part per head slot, ``pitch`` apart (one ``page`` part with one slot); None if not whole words."""
    h = heads(layer)
    span = real_page(layer) // h
    if span % 4:
        return None
    if h == 1:
        return [("page", base, stride, span, padded)]
    return [(f"head{i}", base + i * pitch, stride, span, span) for i in range(h)]


def check_planner(plan: Callable[[Any], SegmentTable], specs: Iterable[Any]) -> list[str]:
    """Failures of ``plan`` (spec -> table) against :func:`expected_plan` on loadable specs."""
    failures: list[str] = []
    for spec in specs:
        d = spec.to_dict()
        ex = expected_plan(d)
        try:
            table = plan(spec)
        except SpecError as e:
            if ex.error is None:
                failures.append(f"{spec.to_json()}: raised {e}, the contract plans it")
            continue
        if ex.error is not None:
            failures.append(f"{spec.to_json()}: planned, the contract says {ex.error}")
            continue
        got = sorted(
            (s.group, s.layer, s.part, s.virtual_index, s.base, s.stride, s.span) for s in table.segments
        )
        if got != sorted(ex.rows):
            failures.append(f"{spec.to_json()}: rows {got} != contract {sorted(ex.rows)}")
        n = ex.num_blocks
        if (table.total_bytes, table.num_blocks) != (ex.total, n):
            failures.append(
                f"{spec.to_json()}: total, blocks {table.total_bytes, table.num_blocks} != {ex.total, n}"
            )
        pad = _periodic_bytes(((p.base, p.stride, p.span) for p in table.padding), n)
        want_pad = ex.padding_bytes()
        if pad != want_pad:
            failures.append(f"{spec.to_json()}: padding {sorted(pad)[:8]} != contract {sorted(want_pad)[:8]}")
    return failures


# ---------------------------------------------------------------- section 3: the verifier by brute force
def block_bytes(table: SegmentTable, b: int) -> set[int]:
    """Every byte zeroing block ``b`` clears."""
    return {x for s in table.segments for x in range(s.base + b * s.stride, s.base + b * s.stride + s.span)}


def brute_invariants(table: SegmentTable) -> dict[int, bool]:
    """Invariants 1-4 decided by enumerating every block id and byte: ``{inv: holds}``."""
    n, total = table.num_blocks, table.total_bytes
    segs = table.segments
    ok1 = all(s.base % 4 == 0 and s.stride % 4 == 0 and s.span % 4 == 0 and s.span > 0 for s in segs)
    ok2 = all(
        s.base + b * s.stride >= 0 and s.base + b * s.stride + s.span <= total for s in segs for b in range(n)
    )
    owner: dict[int, int] = {}
    ok3 = True
    for b in range(n):
        for x in block_bytes(table, b):
            if owner.setdefault(x, b) != b:
                ok3 = False
    pad = _periodic_bytes(((p.base, p.stride, p.span) for p in table.padding), n)
    ok4 = not (pad & owner.keys())
    return {1: ok1, 2: ok2, 3: ok3, 4: ok4}


def check_verifier(verify: Callable[[SegmentTable], Any], tables: Iterable[SegmentTable]) -> list[str]:
    """Failures of ``verify`` against :func:`brute_invariants`, invariant by invariant.

    Invariants 2-4 are compared only where every span is positive (with a zero or negative
    span invariant 1 already fails and the others have no agreed meaning).
    """
    failures: list[str] = []
    for t in tables:
        truth = brute_invariants(t)
        rep = verify(t)
        if rep.ok != all(truth.values()):
            failures.append(f"{_show(t)}: ok={rep.ok}, brute force {truth}")
            continue
        invs = (1, 2, 3, 4) if all(s.span > 0 for s in t.segments) else (1,)
        for inv in invs:
            if (not rep.by_invariant(inv)) != truth[inv]:
                failures.append(f"{_show(t)}: invariant {inv} said {not truth[inv]}, brute force {truth}")
    return failures


def _show(t: SegmentTable) -> str:
    rows = [(s.base, s.stride, s.span, s.group) for s in t.segments]
    pads = [(p.base, p.stride, p.span) for p in t.padding]
    return f"table(total={t.total_bytes}, n={t.num_blocks}, rows={rows}, padding={pads})"


# ---------------------------------------------------------------- coalescing keeps every block's bytes
def check_coalescer(
    coalesce: Callable[[SegmentTable], SegmentTable], tables: Iterable[SegmentTable]
) -> list[str]:
    """Failures of ``coalesce``: per block id, the bytes must equal the input's; never more rows."""
    failures: list[str] = []
    for t in tables:
        c = coalesce(t)
        if (c.total_bytes, c.num_blocks) != (t.total_bytes, t.num_blocks) or len(c) > len(t):
            failures.append(f"{_show(t)}: coalesced to {_show(c)}")
            continue
        for b in range(t.num_blocks):
            want, got = block_bytes(t, b), block_bytes(c, b)
            if want != got:
                failures.append(
                    f"{_show(t)}: block {b} loses {sorted(want - got)[:4]} gains {sorted(got - want)[:4]}"
                )
                break
    return failures


def merged_block_ranges(table: SegmentTable, b: int) -> list[tuple[int, int]]:
    """Block ``b``'s bytes as merged ranges (for tables too large for byte sets)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((s.base + b * s.stride, s.base + b * s.stride + s.span) for s in table.segments):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def union_bytes(ranges: Sequence[tuple[int, int]]) -> set[int]:
    """The bytes of half-open ranges."""
    return {x for a, b in ranges for x in range(a, b)}


class LyingInt(int):
    """An int whose value, int() and __index__ agree (honest to ``is_int``) and whose comparisons all say
    True: a range check must compare its plain int, not ask it (issue 25, seventeenth pass)."""

    def __le__(self, o: object) -> bool:
        return True

    def __ge__(self, o: object) -> bool:
        return True

    def __lt__(self, o: object) -> bool:
        return True

    def __gt__(self, o: object) -> bool:
        return True
