"""Variants of a spec (layout, tp, dtype: ``kvlayout plot --compare``) and :func:`compare_maps`."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import SpecError, spec_error
from ..planner import Layout
from ..presets import PRESETS, preset
from ..spec import (
    ALL_LAYOUTS,
    DTYPE_SIZES,
    FP8_DS_MLA,
    FullAttentionSpec,
    GroupSpec,
    KVCacheSpec,
    LayerSpec,
    MLASpec,
    layout_order,
)
from ..validate import check_int, is_int, plain_str, read_json_file
from .common import (
    BLOCK_GAP,
    HEADER,
    LANE_IN,
    MAX_PLOT_LANES,
    Geometry,
    _as_layout,
    _fmt,
    _shown_blocks,
    _wrong_type,
    check_count,
    group_lanes,
)
from .maps import (
    byte_map,
)

# --------------------------------------------------------------------------- variants: layout, tp, dtype
#: Keys of ``kvlayout plot --compare KEY=VALUE[,KEY=VALUE]``.
COMPARE_KEYS = ("layout", "tp", "dtype", "num_blocks", "preset", "spec")
#: Cache dtypes a variant may set (``fp8_ds_mla`` only on ``mla`` layers).
VARIANT_DTYPES = (*DTYPE_SIZES, FP8_DS_MLA)


def _bad(key: str, value: object, why: str) -> SpecError:
    return spec_error(f"--compare {key}", value, why)


def parse_compare(text: str) -> list[tuple[str, str]]:
    """``"layout=layer_major,tp=2"`` -> ``[("layout", "layer_major"), ("tp", "2")]``, every value checked.

    Raises :class:`~kvlayout.SpecError` (one line) before anything is planned or drawn.
    """
    out: list[tuple[str, str]] = []
    if len(text) > 4096:
        raise _bad("", text, "longer than 4096 characters")
    for tok in (t.strip() for t in text.split(",")):
        m = re.fullmatch(r"([a-z_]+)=(.+)", tok)
        if not m or m[1] not in COMPARE_KEYS:
            raise _bad(
                "item",
                tok,
                f"must be KEY=VALUE with KEY one of {', '.join(COMPARE_KEYS)} "
                "(e.g. layout=layer_major, tp=2, dtype=bfloat16)",
            )
        key, value = m[1], m[2].strip()
        if any(k == key for k, _ in out):
            raise _bad(key, value, "given twice")
        if key == "layout" and value not in ALL_LAYOUTS:
            raise _bad(key, value, f"valid: {', '.join(ALL_LAYOUTS)}")
        if key in ("tp", "num_blocks") and not re.fullmatch(r"[0-9]{1,10}", value):
            raise _bad(key, value, "must be a decimal integer")
        if key == "tp" and not 1 <= int(value) <= 4096:
            raise _bad(key, value, "must lie in [1, 4096]")
        if key == "dtype" and value not in VARIANT_DTYPES:
            raise _bad(key, value, f"valid: {', '.join(VARIANT_DTYPES)}")
        if key == "preset" and value not in PRESETS:
            raise _bad(key, value, f"valid: {', '.join(PRESETS)}")
        out.append((key, value))
    if any(k in ("preset", "spec") for k, _ in out) and sum(k in ("preset", "spec") for k, _ in out) > 1:
        raise _bad("preset", text, "give preset= or spec=, not both")
    return out


def with_layout(spec: KVCacheSpec, layout: str) -> KVCacheSpec:
    """The same layers in another layout (any of GEOMETRY.md section 6's names; ``kv_split`` halves
    exist under ``layer_major``/``LBHNC`` only, so every other layout keeps K and V together)."""
    if layout not in ALL_LAYOUTS:
        raise spec_error("layout", layout, f"valid layouts: {', '.join(ALL_LAYOUTS)}")
    groups = spec.groups
    if layout_order(layout) != "LBHNC":
        groups = tuple(
            GroupSpec(
                g.name,
                tuple(replace(x, kv_split=None) if isinstance(x, FullAttentionSpec) else x for x in g.layers),
                g.kernel_block_size,
            )
            for g in spec.groups
        )
    return KVCacheSpec(num_blocks=spec.num_blocks, layout=layout, groups=groups, version=spec.version)


def with_dtype(spec: KVCacheSpec, dtype: str) -> KVCacheSpec:
    """Every attention and MLA layer stored as ``dtype`` (MLA: its cache dtype; Mamba state unchanged)."""
    if dtype not in VARIANT_DTYPES:
        raise spec_error("dtype", dtype, f"valid: {', '.join(VARIANT_DTYPES)}")
    groups = []
    for g in spec.groups:
        layers: list[LayerSpec] = []
        for x in g.layers:
            if isinstance(x, FullAttentionSpec):
                if dtype == FP8_DS_MLA:
                    raise spec_error(f"{x.where}.dtype", dtype, "fp8_ds_mla applies to mla layers only")
                x = replace(x, dtype=dtype)
            elif isinstance(x, MLASpec):
                x = (
                    replace(x, cache_dtype=dtype, token_bytes=None)
                    if dtype == FP8_DS_MLA or x.cache_dtype
                    else replace(x, dtype=dtype, token_bytes=None)
                )
            layers.append(x)
        groups.append(GroupSpec(g.name, tuple(layers), g.kernel_block_size))
    return KVCacheSpec(
        num_blocks=spec.num_blocks, layout=spec.layout, groups=tuple(groups), version=spec.version
    )


def variant(spec: KVCacheSpec, changes: Sequence[tuple[str, str]] | Mapping[str, Any]) -> KVCacheSpec:
    """``spec`` changed by ``changes`` (the keys of :data:`COMPARE_KEYS`): preset/spec replace it,
    then layout, dtype, tp (:func:`~kvlayout.split_heads`) and num_blocks apply in that order."""
    from ..sharding import split_heads

    if not isinstance(spec, KVCacheSpec):
        raise _wrong_type(SpecError, "spec", spec, "must be a KVCacheSpec")
    ch = _changes(changes)
    if "preset" in ch:
        spec = preset(ch["preset"])
    if "spec" in ch:
        data = read_json_file(SpecError, "--compare spec", ch["spec"])
        if isinstance(data, Mapping) and data.get("layout") == "native":  # GEOMETRY.md section 9
            why = "is a native spec (layout 'native'): plot compares flat specs' byte maps only"
            raise spec_error("--compare spec", ch["spec"], why)
        spec = KVCacheSpec.from_dict(data)
    if "layout" in ch:
        spec = with_layout(spec, ch["layout"])
    if "dtype" in ch:
        spec = with_dtype(spec, ch["dtype"])
    if "tp" in ch:
        spec = split_heads(spec, ch["tp"], axis="tp")
    if "num_blocks" in ch:
        spec = spec.with_num_blocks(ch["num_blocks"])
    return spec


def _changes(changes: Any) -> dict[str, Any]:
    """:func:`variant`'s ``changes`` as a dict, every key known and given once; tp and num_blocks as ints
    (an int or a decimal string), the others as strings (``spec``: a path)."""
    if isinstance(changes, Mapping):
        items: Any = changes.items()
    elif isinstance(changes, (list, tuple)):
        items = changes
    else:
        raise spec_error("changes", changes, "must be a mapping or a sequence of (key, value) pairs")
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise spec_error("changes item", item, "must be a (key, value) pair")
        key, value = plain_str(item[0]), item[1]
        if not isinstance(key, str) or key not in COMPARE_KEYS:
            raise spec_error("changes key", key, f"valid keys: {', '.join(COMPARE_KEYS)}")
        if key in out:
            raise _bad(key, value, "given twice")
        if key == "spec" and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if key in ("tp", "num_blocks"):
            if isinstance(value, str) and re.fullmatch(r"[0-9]{1,10}", plain_str(value)):
                value = int(plain_str(value))
            elif is_int(value):
                value = check_int(SpecError, f"--compare {key}", value, lo=0)
            else:
                raise _bad(key, value, "must be an integer (or a decimal string)")
        elif not isinstance(value, str):
            raise _bad(key, value, "must be a string" + (" (a path)" if key == "spec" else ""))
        else:
            value = plain_str(value)
        out[key] = value
    return out


def describe_changes(changes: Sequence[tuple[str, str]] | Mapping[str, Any]) -> str:
    """``layout=layer_major, tp=2``."""
    items = changes.items() if isinstance(changes, Mapping) else changes
    return ", ".join(f"{k}={os.path.basename(str(v)) if k == 'spec' else v}" for k, v in items)


# --------------------------------------------------------------------------- comparisons
def _summary(layout: Layout) -> str:
    from ..verify import verify

    table = layout.table()
    geo = Geometry(layout)
    row = (
        f"stride {_fmt(geo.width)} B"
        if geo.packed
        else f"{len(geo.slot_x)} slots, {_fmt(geo.width)} B per block"
    )
    safe = "SAFE" if verify(table).ok else "UNSAFE"
    return (
        f"{layout.spec.layout}, {row}, {_fmt(layout.total_bytes)} B buffer, {len(table)} rows, "
        f"{_fmt(table.bytes_per_block)} B zeroed per block: {safe}"
    )


def _ratio(a: int, b: int) -> str:
    return f"{b / a:.2f}x" if a else "-"


def _labels(labels: Any) -> tuple[str, str]:
    """:func:`compare_maps`' two names, as plain strings."""
    if isinstance(labels, (list, tuple)) and len(labels) == 2 and all(isinstance(x, str) for x in labels):
        return plain_str(labels[0]), plain_str(labels[1])
    raise spec_error("labels", labels, "must be two strings (the names of the two maps)")


def compare_maps(
    a: KVCacheSpec | Layout,
    b: KVCacheSpec | Layout,
    labels: Sequence[str] = ("A", "B"),
    blocks: Sequence[int] | None = None,
    *,
    max_lanes: int = 12,
) -> Any:
    """Two byte maps one above the other on one byte scale (same model, two layouts/tp/dtypes).

    Each panel's title gives its stride, buffer, rows, bytes per block and verdict; the
    figure's title the ratios of B to A.
    """
    la, lb = _as_layout(a, "a", drawn=True), _as_layout(b, "b", drawn=True)  # sized before planned
    labels = _labels(labels)
    max_lanes = check_count(SpecError, "max_lanes", max_lanes, MAX_PLOT_LANES, "lanes a byte map draws")
    import matplotlib.pyplot as plt

    ga, gb = Geometry(la), Geometry(lb)
    xmax = max(ga.width, gb.width) * 1.075
    heights = []
    for lay in (la, lb):
        lanes = group_lanes(lay)
        ends = blocks if blocks is not None else sorted({0, max(0, lay.num_blocks - 1)})
        boxes = sum(len(lane.boxes) for lane in lanes)
        shown, _ = _shown_blocks(lay.num_blocks, ends, len(lanes), max_lanes, boxes)
        heights.append(1.3 + LANE_IN * (len(shown) * len(lanes) + BLOCK_GAP * (len(shown) - 1) + HEADER))
    fig = plt.figure(figsize=(13, sum(heights) + 0.8), layout="constrained")
    axes = fig.subplots(2, 1, height_ratios=heights)
    for ax, lay, label in zip(axes, (la, lb), labels):
        ends = blocks if blocks is not None else sorted({0, max(0, lay.num_blocks - 1)})
        byte_map(
            lay, ends, ax, insets=False, xmax=xmax, max_lanes=max_lanes, title=f"{label}: {_summary(lay)}"
        )
    ta, tb = la.table(), lb.table()
    fig.suptitle(
        f"{labels[1]} against {labels[0]}: buffer {_ratio(la.total_bytes, lb.total_bytes)}, "
        f"block row {_ratio(ga.width, gb.width)}, bytes zeroed per block "
        f"{_ratio(ta.bytes_per_block, tb.bytes_per_block)}, rows {len(ta)} \u2192 {len(tb)}",
        fontsize=10,
    )
    return fig
