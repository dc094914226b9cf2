"""Seeded random specs, shared by the hypothesis strategies and the conformance battery.

``random_spec(seed)`` always returns a spec the planner accepts (it retries on the rare
invalid draw), small enough for interpreters: a few groups, a few layers, tiny pages.
"""

from __future__ import annotations

import random
from typing import Any

from .errors import SpecError
from .planner import plan_layout
from .spec import FullAttentionSpec, GroupSpec, KVCacheSpec, LayerSpec, MambaSpec, MLASpec, SlidingWindowSpec
from .table import Segment, SegmentTable

_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "uint8")
_ALIGNS = (None, None, 64, 96, 128, 512, 576)


def _layer(rng: random.Random, name: str, layout: str) -> LayerSpec:
    kind = rng.choice(("full", "full", "sliding_window", "mla", "mla", "mamba"))
    align = rng.choice(_ALIGNS)
    if kind == "mamba":
        return MambaSpec(name=name, state_bytes=4 * rng.randint(1, 96), alignment=align)
    bs = rng.choice((4, 8, 16))
    if kind == "mla":
        ratio = rng.choice((1, 1, 2, 4))
        if rng.random() < 0.3:
            return MLASpec(
                name=name,
                block_size=bs,
                head_size=8,
                cache_dtype="fp8_ds_mla",
                compress_ratio=ratio,
                alignment=align,
            )
        if rng.random() < 0.3:
            return MLASpec(
                name=name,
                block_size=bs,
                head_size=8,
                dtype="uint8",
                compress_ratio=ratio,
                token_bytes=4 * rng.randint(1, 40),
                alignment=align,
            )
        return MLASpec(
            name=name,
            block_size=bs,
            head_size=4 * rng.randint(1, 33),
            dtype=rng.choice(_DTYPES),
            compress_ratio=ratio,
            alignment=align,
        )
    kw = dict(
        name=name,
        block_size=bs,
        num_kv_heads=rng.randint(1, 2),
        head_size=rng.choice((4, 8, 12, 16)),
        dtype=rng.choice(_DTYPES),
        alignment=align,
        kv_split=True if (layout == "layer_major" and rng.random() < 0.4) else None,
    )
    if kind == "sliding_window":
        return SlidingWindowSpec(window=rng.randint(1, 64), **kw)  # type: ignore[arg-type]
    return FullAttentionSpec(**kw)  # type: ignore[arg-type]


def random_spec(seed: int, *, layout: str | None = None, max_blocks: int = 12) -> KVCacheSpec:
    """A valid random spec of ``layout`` (random if ``None``), determined by ``seed``."""
    rng = random.Random(seed)
    for _ in range(1000):
        lay = layout or rng.choice(("packed", "layer_major"))
        groups = []
        li = 0
        for g in range(rng.randint(1, 3)):
            layers = []
            for _ in range(rng.randint(1, 4)):
                layers.append(_layer(rng, f"L{li}", lay))
                li += 1
            kbs = None
            if rng.random() < 0.25:
                bss = {lyr.logical_block_size for lyr in layers if lyr.logical_block_size}
                if bss:
                    kbs = min(bss) // rng.choice((1, 2, 4))
            groups.append(GroupSpec(f"g{g}", tuple(layers), kernel_block_size=kbs))
        try:
            spec = KVCacheSpec(num_blocks=rng.randint(1, max_blocks), layout=lay, groups=tuple(groups))
            plan_layout(spec).table()
        except SpecError:
            continue
        return spec
    raise RuntimeError(f"no valid spec found for seed {seed}")  # pragma: no cover


# --------------------------------------------------------------------------- issue 19 generators
# Unlike ``random_spec`` these never consult the planner or the verifier: a generator that keeps
# only what the library accepts cannot show the library rejecting something it should accept.

_ALL_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8")


def _alignment(rng: random.Random, real: int) -> int | None:
    """An alignment that often leaves the page as it is (already aligned) or is odd-sized."""
    pick = rng.random()
    if pick < 0.3:
        return None
    if pick < 0.55:  # already aligned: the page must not grow
        divisors = [d for d in (4, 8, 16, 32, 64, real // 2, real) if d > 0 and real % d == 0]
        return rng.choice(divisors) if divisors else real
    if pick < 0.6:  # not a multiple of 4 (may give an invalid padded page)
        return rng.choice((2, 6, 10, 36))
    return rng.choice((12, 64, 96, 128, 512, 576, 2 * real + 4))


def _layer_dict(rng: random.Random, name: str, layout: str, invalid: float) -> dict[str, Any]:
    """One layer as JSON: valid most of the time, with ``invalid`` odds of a bad value."""
    kind = rng.choice(("full", "full", "sliding_window", "mla", "mla", "mla", "mamba"))
    bad = rng.random() < invalid
    d: dict[str, Any] = {"name": name, "kind": kind}
    bs = rng.choice((1, 2, 4, 8, 16))
    isz = {"float32": 4, "bfloat16": 2, "float16": 2}
    if kind == "mamba":
        state = 4 * rng.randint(1, 40) if not bad else rng.choice((0, -4, 6, 30))
        d["state_bytes"] = state
        hint = state
    elif kind == "mla":
        head = rng.choice((1, 2, 3, 4, 8, 12, 33, 132))
        d.update(block_size=bs, head_size=head)
        ratio = 1
        if rng.random() < 0.5:
            ratio = rng.choice((1, 2, 4, 8)) if not bad else rng.choice((0, 3, 32))
            d["compress_ratio"] = ratio
        elif bad:
            d["block_size"] = rng.choice((0, -4))
        pick = rng.random()
        if pick < 0.25:
            d["cache_dtype"] = "fp8_ds_mla"
            token = 584
        elif pick < 0.4:
            d["dtype"] = rng.choice(_ALL_DTYPES)
            token = rng.choice((4, 8, 12, 20, 6))
            d["token_bytes"] = token
        elif pick < 0.55:  # both given: the cache dtype is what is stored
            d["dtype"] = rng.choice(_ALL_DTYPES)
            d["cache_dtype"] = rng.choice(_ALL_DTYPES)
            token = head * isz.get(str(d["cache_dtype"]), 1)
        else:
            d["dtype"] = rng.choice(_ALL_DTYPES)
            token = head * isz.get(str(d["dtype"]), 1)
        hint = bs // max(1, ratio) * token
    else:
        heads, head = rng.randint(1, 3), rng.choice((1, 2, 3, 4, 8, 12))
        d.update(block_size=bs, num_kv_heads=heads, head_size=head, dtype=rng.choice(_ALL_DTYPES))
        if kind == "sliding_window":
            d["window"] = rng.randint(1, 64) if not bad else 0
        elif bad:
            d["num_kv_heads"] = 0
        if rng.random() < (0.5 if layout == "layer_major" else 0.05):
            d["kv_split"] = True
        hint = 2 * bs * heads * head * isz.get(str(d["dtype"]), 1)
    a = _alignment(rng, hint)
    if a is not None:
        d["alignment"] = a
    return d


def rich_spec_dict(seed: int, *, layout: str | None = None, invalid: float = 0.03) -> dict[str, object]:
    """A random spec in the JSON form of GEOMETRY.md section 4, *not* filtered by the planner.

    It covers every kind, already-aligned and unaligned pages, odd alignments, overlaid groups
    of different sizes, ``kv_split`` (also where it is an error), kernel block sizes that split,
    do not divide, or meet padded pages. Tests predict acceptance from the contract.
    """
    rng = random.Random(seed)
    lay = layout or rng.choice(("packed", "layer_major"))
    groups = []
    li = 0
    for g in range(rng.randint(1, 3)):
        layers = []
        for _ in range(rng.randint(1, 4)):
            layers.append(_layer_dict(rng, f"L{li}", lay, invalid))
            li += 1
        group: dict[str, object] = {"name": f"g{g}", "layers": layers}
        if rng.random() < 0.3:
            sizes = [x["block_size"] for x in layers if x.get("block_size", 0) > 0]
            base = min(sizes) if sizes else 4
            group["kernel_block_size"] = max(1, rng.choice((base, base // 2, base // 4, 3, 2 * base)))
        groups.append(group)
    n = rng.randint(1, 6) if rng.random() < 0.97 else rng.choice((0, -1))
    return {"version": 1, "num_blocks": n, "layout": lay, "groups": groups}


def _row(rng: random.Random, groups: tuple[str, ...], base: int, stride: int, span: int) -> Segment:
    return Segment(base, stride, span, rng.choice(groups), f"r{rng.randint(0, 999)}")


def random_table(
    seed: int, *, max_rows: int = 5, max_blocks: int = 7, misaligned: float = 0.05
) -> SegmentTable:
    """A random hand-written table for comparing a verifier with a brute force over block ids.

    Rows of several groups; rows placed ``k`` strides after another row for several ``k`` (so
    blocks ``b`` and ``b + k`` meet); equal, different, zero and negative strides; spans that
    touch, overlap or stay apart; ``total_bytes`` at, just under and past the exact extent; and
    sometimes padding ranges. About half the tables are safe.
    """
    rng = random.Random(seed)
    n = rng.randint(1, max_blocks)
    groups = tuple(f"g{i}" for i in range(rng.randint(1, 3)))
    strides = (0, 4, 8, 12, 16, 24, 32, 48, 64, -8, -16, -32)
    rows: list[Segment] = []
    todo = rng.randint(1, max_rows)
    if rng.random() < 0.5:  # a safe table and at most one near miss
        safe = random_safe_table(rng.randrange(2**32), max_rows=max_rows, max_blocks=max_blocks)
        n, rows, todo = safe.num_blocks, list(safe.segments), rng.choice((0, 0, 1))
    for _ in range(todo):
        span = 4 * rng.randint(1, 12)
        mode = rng.random() if rows else 1.0
        if mode < 0.35:  # k strides after another row, shifted by less than, exactly or more than a span
            r = rng.choice(rows)
            k = rng.choice((1, 2, 3, 4, 5, -1, -2))
            delta = rng.choice((0, 4, -4, r.span, -span, r.span - 4, 4 - span))
            rows.append(_row(rng, groups, r.base + k * r.stride + delta, r.stride, span))
        elif mode < 0.5:  # touching or overlapping the same block of another row
            r = rng.choice(rows)
            rows.append(
                _row(rng, groups, r.base + rng.choice((r.span, r.span - 4, 0, -span)), r.stride, span)
            )
        elif mode < 0.6:  # same base, another stride
            r = rng.choice(rows)
            rows.append(_row(rng, groups, r.base, rng.choice(strides), span))
        else:
            stride = rng.choice(strides)
            low = max(0, -(n - 1) * stride)  # negative strides start high enough to stay in bounds
            rows.append(_row(rng, groups, low + 4 * rng.randint(0, 16), stride, span))
    if rng.random() < misaligned:
        i = rng.randrange(len(rows))
        r = rows[i]
        field = rng.choice(("base", "stride", "span", "zero"))
        if field == "zero":
            rows[i] = Segment(r.base, r.stride, 0, r.group, r.layer)
        else:
            vals = {"base": r.base, "stride": r.stride, "span": r.span}
            vals[field] += rng.choice((1, 2, 3))
            rows[i] = Segment(vals["base"], vals["stride"], vals["span"], r.group, r.layer)
    extent = max(max(r.base, r.base + (n - 1) * r.stride) + r.span for r in rows)
    total = max(0, extent + rng.choice((0, 0, 0, 0, 4, 64, -4, -rows[0].span)))
    padding: list[Segment] = []
    if rng.random() < 0.35:
        for _ in range(rng.randint(1, 2)):
            r = rng.choice(rows)
            if r.stride < 0:
                continue
            off = rng.choice((r.span, r.span, r.span + 4, r.span + 8, r.span - 4, -4))
            if r.base + off >= 0:
                padding.append(Segment(r.base + off, r.stride, rng.choice((4, 8)), "", r.layer, "padding"))
    return SegmentTable(total, n, tuple(rows), tuple(padding), bool(padding) or rng.random() < 0.5)


def random_safe_table(seed: int, *, max_rows: int = 8, max_blocks: int = 6) -> SegmentTable:
    """A random table that is safe by construction, checked byte by byte (not by the verifier).

    Rows are drawn like ``random_table``'s (touching, overlapping inside a block, same base with
    other spans, other strides, negative strides) and kept only if every byte still belongs to
    one block id; the input of coalescing tests, which must keep every block's bytes.
    """
    rng = random.Random(seed)
    n = rng.randint(1, max_blocks)
    groups = ("g0", "g1", "g2")
    strides = [s for s in (4, 8, 16, 24, 32, 48, 64, 96, -16, -32) if rng.random() < 0.5] or [32]
    if n == 1:
        strides.append(0)
    owner: dict[int, int] = {}
    rows: list[Segment] = []
    for _ in range(6 * max_rows):
        if len(rows) >= max_rows:
            break
        span = 4 * rng.randint(1, 8)
        if rows and rng.random() < 0.6:
            r = rng.choice(rows)
            how = rng.random()
            if how < 0.3:
                cand = _row(rng, groups, r.base + r.span, r.stride, span)  # touching
            elif how < 0.5:
                cand = _row(rng, groups, r.base, r.stride, span)  # same base, other span
            elif how < 0.7:
                cand = _row(
                    rng, groups, r.base + 4 * rng.randint(0, max(0, r.span // 4 - 1)), r.stride, span
                )  # overlapping
            elif how < 0.85:
                cand = _row(
                    rng, groups, r.base + r.span + 4 * rng.randint(1, 3), r.stride, span
                )  # a gap apart
            else:
                cand = _row(rng, groups, r.base + r.span, rng.choice(strides), span)  # touching, other stride
        else:
            stride = rng.choice(strides)
            cand = _row(rng, groups, max(0, -(n - 1) * stride) + 4 * rng.randint(0, 24), stride, span)
        lo = min(cand.base, cand.base + (n - 1) * cand.stride)
        if lo < 0:
            continue
        mine: dict[int, int] = {}
        clash = False
        for b in range(n):
            for x in range(cand.base + b * cand.stride, cand.base + b * cand.stride + cand.span):
                clash = clash or owner.get(x, b) != b or mine.setdefault(x, b) != b
        if clash:
            continue
        owner.update(mine)
        rows.append(cand)
    if not rows:
        rows.append(Segment(0, 4, 4, "g0", "only"))
    total = max(max(r.base, r.base + (n - 1) * r.stride) + r.span for r in rows) + rng.choice((0, 4, 32))
    return SegmentTable(total, n, tuple(rows))
