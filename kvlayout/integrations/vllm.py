"""vLLM 0.33 adapter: a ``KVCacheConfig`` and its resolved ``KVCacheLayout`` as a kvlayout spec.

:func:`spec_from_kv_cache_config` reads vLLM's own objects (cache groups, layer names, per-layer
specs, ``KVCacheTensor`` placements) and returns the :class:`~kvlayout.spec.KVCacheSpec` whose
plan places every layer where vLLM does. It then plans that spec and checks it against vLLM's
tensors (offset of every layer's block 0, block stride, head stride, backing size): a config
kvlayout cannot represent is refused with an error naming the group, the layer and the field,
never approximated. vLLM is imported lazily, inside the functions; ``import kvlayout`` and
``import kvlayout.integrations.vllm`` never import it.

:class:`KVBlockZeroer` is a drop-in for vLLM's class of that name, built on kvlayout's cuda backend
from the same ``KVCacheConfig``: the table comes from kvlayout's planner and is proven safe,
ids are bounds-checked (vLLM's kernel writes past the buffer for id ``num_blocks``), and one
cache group's ids can be zeroed without touching the other groups (vLLM #52187).

:func:`table_from_block_zeroer` reads a ``KVBlockZeroer``'s ``_meta`` (absolute addresses, block
strides and page sizes in int32 words) as a segment table, so kvlayout's verifier can judge the
table vLLM itself zeroes with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any, ParamSpec, TypeVar

import numpy as np

from ..errors import BlockIdError, LayoutBufferError, SpecError, TableError, bad_value, spec_error
from ..planner import Layout, plan, plan_layout
from ..ranges import MAX_BYTES, merge_ranges, round_up
from ..reference import normalize_block_ids
from ..spec import (
    DTYPE_SIZES,
    FP8_DS_MLA,
    KV_CACHE_LAYOUTS,
    FullAttentionSpec,
    GroupSpec,
    KVCacheSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
)
from ..table import MAX_TABLE_ROWS, Segment, SegmentTable
from ..validate import is_int, plain_str

#: The vLLM release whose objects this adapter reads.
VLLM_VERSION = "0.33.0"
#: vLLM's own compatibility names for two orders (``vllm/config/cache.py``).
VLLM_LAYOUT_ALIASES: Mapping[str, str] = {"NHD": "LBNHC", "HND": "LBHNC"}
#: The vLLM spec classes kvlayout represents, by exact type, and the kvlayout kind of each.
SUPPORTED_SPECS: Mapping[str, str] = {
    "FullAttentionSpec": "full",
    "SlidingWindowSpec": "sliding_window",
    "MLAAttentionSpec": "mla",
    "SlidingWindowMLASpec": "mla",
    "MambaSpec": "mamba",
}
#: Orders that keep each page one contiguous run inside its block (vLLM's ``is_block_compact``).
_BLOCK_COMPACT = ("LBHNC", "LBNHC", "BLHNC", "BLNHC")
_LAYER_COMPACT = ("LBHNC", "LBNHC", "LHBNC")


def _iface() -> Any:
    from vllm.v1 import kv_cache_interface

    return kv_cache_interface


def layout_name(kv_cache_layout: Any) -> str:
    """The order name (``"BLHNC"``, ...) of a ``KVCacheLayout`` member or a layout name."""
    name = getattr(kv_cache_layout, "name", kv_cache_layout)
    if isinstance(name, str):
        name = VLLM_LAYOUT_ALIASES.get(name, name)
    if not isinstance(name, str) or name not in KV_CACHE_LAYOUTS:
        raise spec_error(
            "kv_cache_layout", kv_cache_layout, f"unknown vLLM layout; valid: {', '.join(KV_CACHE_LAYOUTS)}"
        )
    return name


def _resolve_layout(kv_cache_config: Any, kv_cache_layout: Any) -> str:
    resolved = getattr(kv_cache_config, "kv_cache_layout", None)
    if kv_cache_layout is None and resolved is None:
        raise spec_error("kv_cache_layout", None, "not given and not resolved in the KVCacheConfig")
    name = layout_name(kv_cache_layout if kv_cache_layout is not None else resolved)
    if kv_cache_layout is not None and resolved is not None and layout_name(resolved) != name:
        raise spec_error(
            "kv_cache_layout",
            kv_cache_layout,
            f"differs from the layout the KVCacheConfig resolved ({resolved!r})",
        )
    return name


def _dtype(where: str, dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_SIZES:
        raise spec_error(f"{where}.dtype", dtype, f"no kvlayout dtype; valid: {', '.join(DTYPE_SIZES)}")
    return name


def _states(where: str, tokens_per_state: Any) -> tuple[int | None, int | None]:
    """vLLM's ``tokens_per_state`` (int or Fraction) as (tokens_per_state, states_per_token)."""
    try:
        f = Fraction(tokens_per_state)
    except (TypeError, ValueError):
        raise spec_error(
            f"{where}.tokens_per_state", tokens_per_state, "must be a whole number or 1/k"
        ) from None
    if f <= 0 or (f.denominator != 1 and f.numerator != 1):
        raise spec_error(f"{where}.tokens_per_state", tokens_per_state, "must be a whole number >= 1 or 1/k")
    if f.denominator == 1:
        return (int(f) if f > 1 else None), None
    return None, f.denominator


def _stride_alignment(where: str, vspec: Any) -> int | None:
    try:
        a = int(vspec.get_block_stride_alignment())
    except (AssertionError, ValueError, ZeroDivisionError) as e:
        raise spec_error(
            f"{where}.block_stride_alignment", vspec.block_stride_alignment, f"vLLM cannot resolve it: {e}"
        ) from None
    return a if a != 1 else None


def _padding(vspec: Any, real: int) -> dict[str, int]:
    """``alignment`` where vLLM's MLA alignment explains the padded page, else ``padded_page``."""
    padded, align = getattr(vspec, "page_size_padded", None), getattr(vspec, "alignment", None)
    if align is not None and round_up(real, align) == (padded if padded is not None else real):
        return {"alignment": align}
    return {"padded_page": padded} if padded is not None else {}


def _is_torch_dtype(value: Any) -> bool:
    return type(value).__name__ == "dtype" and type(value).__module__ == "torch"


def _check_dtypes(where: str, vspec: Any, kind: str) -> None:
    """A ``torch.dtype`` wherever vLLM's page arithmetic reads one (a string makes torch raise a raw
    ``TypeError`` there), checked before any of vLLM's properties run."""
    if kind == "mamba":
        dtypes = getattr(vspec, "dtypes", None)
        if not isinstance(dtypes, (list, tuple)) or not all(_is_torch_dtype(d) for d in dtypes):
            raise spec_error(f"{where}.dtypes", dtypes, "must be a tuple of torch.dtype")
    elif not _is_torch_dtype(getattr(vspec, "dtype", None)):
        raise spec_error(
            f"{where}.dtype", getattr(vspec, "dtype", None), "must be a torch.dtype (e.g. torch.bfloat16)"
        )


def _layer(where: str, name: str, vspec: Any) -> LayerSpec:
    """The kvlayout layer of one vLLM per-layer spec, checked against vLLM's page arithmetic."""
    kind = SUPPORTED_SPECS.get(type(vspec).__name__)
    if kind is None or type(vspec).__module__ != "vllm.v1.kv_cache_interface":
        raise spec_error(
            f"{where}.kv_cache_spec",
            type(vspec).__name__,
            f"kvlayout does not represent this spec kind; supported: {', '.join(SUPPORTED_SPECS)}",
        )
    _check_dtypes(where, vspec, kind)
    if kind == "mamba":
        if vspec.num_heads != 1:
            raise spec_error(
                f"{where}.num_heads", vspec.num_heads, "a Mamba state page has one head slot in kvlayout"
            )
        layer: LayerSpec = MambaSpec(
            name=name,
            state_bytes=vspec.state_content_size_bytes,
            padded_page=vspec.page_size_padded,
            block_stride_alignment=_stride_alignment(where, vspec),
        )
    else:
        tps, spt = _states(where, vspec.tokens_per_state)
        real = vspec.unpadded_page_size_bytes
        common: dict[str, Any] = dict(
            name=name,
            block_size=vspec.block_size,
            head_size=vspec.head_size,
            dtype=_dtype(where, vspec.dtype),
            states_per_token=spt,
            block_stride_alignment=_stride_alignment(where, vspec),
            **_padding(vspec, real),
        )
        if kind == "mla":
            fp8_ds = getattr(vspec, "cache_dtype_str", None) == FP8_DS_MLA
            explicit = vspec.state_content_bytes is not None or vspec.head_size_v != 0 or fp8_ds
            heads = vspec.num_heads
            layer = MLASpec(
                **common,
                cache_dtype=FP8_DS_MLA if fp8_ds else None,
                compress_ratio=tps,
                token_bytes=vspec.state_content_size_bytes if explicit else None,
                num_head_slots=heads if heads != 1 else None,
                window=getattr(vspec, "sliding_window", None),
            )
        else:
            extra: dict[str, Any] = dict(
                num_kv_heads=vspec.num_kv_heads,
                num_head_slots=vspec.num_head_slots,
                state_content_bytes=vspec.state_content_bytes,
                tokens_per_state=tps,
                head_size_v=vspec.head_size_v if vspec.head_size_v != vspec.head_size else None,
            )
            if kind == "sliding_window":
                layer = SlidingWindowSpec(**common, **extra, window=vspec.sliding_window)
            else:
                layer = FullAttentionSpec(**common, **extra)
        geometry = (vspec.num_heads, vspec.num_states, vspec.state_content_size_bytes)
        if (layer.heads, layer.states, layer.content_bytes) != geometry:
            raise spec_error(
                f"{where}.num_states",
                geometry,
                f"vLLM's (H, N, C) differ from kvlayout's {(layer.heads, layer.states, layer.content_bytes)}",
            )
    real_v = getattr(vspec, "real_page_size_bytes", None)
    if layer.page != vspec.page_size_bytes or (real_v is not None and layer.real_page != real_v):
        raise spec_error(
            f"{where}.page_size_bytes",
            vspec.page_size_bytes,
            f"kvlayout computes a page of {layer.page} B (real {layer.real_page} B) for this spec",
        )
    return layer


def _group_specs(gi: int, group: Any, iface: Any) -> dict[str, Any]:
    """Per-layer vLLM specs of one cache group, refusing mixes vLLM itself would not group."""
    gspec = group.kv_cache_spec
    if isinstance(gspec, iface.UniformTypeKVCacheSpecs):
        per = dict(gspec.kv_cache_specs)
        for name in group.layer_names:
            if name not in per:
                raise spec_error(
                    f"kv_cache_groups[{gi}][{name!r}].kv_cache_spec", None, "the group has no spec for it"
                )
        if not iface.UniformTypeKVCacheSpecs.is_uniform_type(per):
            first_name, first = next(iter(per.items()))
            for name, s in per.items():
                if s.block_size != first.block_size:
                    raise spec_error(
                        f"kv_cache_groups[{gi}][{name!r}].block_size",
                        s.block_size,
                        f"differs from {first_name!r}'s {first.block_size}: "
                        "vLLM groups layers of one block size",
                    )
            bad = next(n for n, s in per.items() if type(s) is not type(first))
            raise spec_error(
                f"kv_cache_groups[{gi}][{bad!r}].kv_cache_spec",
                type(per[bad]).__name__,
                f"not of the uniform type of {first_name!r} ({type(first).__name__}): "
                "vLLM requires one spec type per group",
            )
        return per
    return {name: gspec for name in group.layer_names}


def _check_layout_expresses(order: str, pages: dict[tuple[int, str], int], num_groups: int) -> None:
    """vLLM's ``validate_kv_cache_layout``: mixed page sizes need block-compact orders."""
    if len(set(pages.values())) <= 1:
        return
    if order in _BLOCK_COMPACT and not (num_groups > 1 and order in _LAYER_COMPACT):
        return
    first = next(iter(pages.values()))
    (gi, name), page = next((k, v) for k, v in pages.items() if v != first)
    raise spec_error(
        f"kv_cache_groups[{gi}][{name!r}].page_size_bytes",
        page,
        f"{order} cannot express mixed page sizes {sorted(set(pages.values()))} "
        f"({'several groups' if num_groups > 1 else 'heads outside the page'}); vLLM refuses it too",
    )


def _check_names(field: str, names: Any) -> None:
    """A collection of layer names, never one ``str``: ``name in "layer.10"`` matched ``"layer.1"``."""
    if isinstance(names, (str, bytes)) or not isinstance(names, Collection):
        why = "must be a collection of layer names (a set, list or tuple), not a single name"
        raise bad_value(SpecError, field, names, why)
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise bad_value(SpecError, f"{field}[{i}]", name, "must be a layer name (str)")


def _check_views_mapping(where: str, views: Any) -> None:
    """Views by layer name: vLLM's ``kv_caches`` dict, not the runner's list of bound tensors."""
    if not isinstance(views, Mapping):
        why = "must map layer names to their tensors (the dict vLLM's allocate_kv_cache returns)"
        raise bad_value(SpecError, where, type(views).__name__, why, shown=type(views).__name__)


def _check_config_fields(config: Any, kernel_block_sizes: Any) -> None:
    """The fields of a ``KVCacheConfig`` that are read, of the types vLLM gives them: a None config, a None
    list of tensors or groups, a str tensor size and a generator of kernel block sizes raised raw errors
    (pass 40)."""
    for name in ("num_blocks", "kv_cache_tensors", "kv_cache_groups"):
        if not hasattr(config, name):
            kind = type(config).__name__
            why = f"a {kind} is no vLLM KVCacheConfig"
            raise bad_value(SpecError, f"kv_cache_config.{name}", kind, why, shown="missing")
    for name in ("kv_cache_tensors", "kv_cache_groups"):
        if not isinstance(getattr(config, name), (list, tuple)):
            raise spec_error(f"kv_cache_config.{name}", getattr(config, name), "must be a list, as vLLM's is")
    for ti, t in enumerate(config.kv_cache_tensors):
        for field in ("size", "offset", "layer_stride"):
            v = getattr(t, field, 0)
            if not is_int(v):
                raise spec_error(f"kv_cache_tensors[{ti}].{field}", v, "must be an integer (bytes)")
        if not isinstance(getattr(t, "layers", None), (list, tuple)):
            why = "must be a list of layer names"
            raise spec_error(f"kv_cache_tensors[{ti}].layers", getattr(t, "layers", None), why)
    for gi, g in enumerate(config.kv_cache_groups):
        if not isinstance(getattr(g, "layer_names", None), (list, tuple)):
            why = "must be a list of layer names"
            raise spec_error(f"kv_cache_groups[{gi}].layer_names", getattr(g, "layer_names", None), why)
    if kernel_block_sizes is not None and not isinstance(kernel_block_sizes, (list, tuple)):
        kind = type(kernel_block_sizes).__name__
        raise spec_error("kernel_block_sizes", kind, "must be a list, as vLLM's is")


def spec_from_kv_cache_config(
    kv_cache_config: Any,
    kv_cache_layout: Any = None,
    *,
    kernel_block_sizes: Sequence[int] | None = None,
    runner_only_attn_layers: Collection[str] = (),
) -> KVCacheSpec:
    """The kvlayout spec of a vLLM 0.33 ``KVCacheConfig`` under the layout vLLM resolved.

    ``kv_cache_layout`` is a ``KVCacheLayout`` member or its name (default: the config's own
    ``kv_cache_layout``). ``kernel_block_sizes`` (vLLM's per-group list, as handed to
    ``allocate_kv_cache`` and ``KVBlockZeroer``) makes groups whose views vLLM splits into kernel
    blocks split in kvlayout too; this changes rows, never bytes. Layers in
    ``runner_only_attn_layers`` share another layer's cache and own no tensor (vLLM's KV sharing).
    Groups are named ``group0``, ``group1``, ... in vLLM's order; layers keep vLLM's names. The
    result is planned and checked against vLLM's ``KVCacheTensor`` placements before it is returned.
    """
    _check_names("runner_only_attn_layers", runner_only_attn_layers)
    iface = _iface()
    _check_config_fields(kv_cache_config, kernel_block_sizes)  # named, not raw errors (pass 40)
    order = _resolve_layout(kv_cache_config, kv_cache_layout)
    num_blocks = kv_cache_config.num_blocks
    tensors = list(kv_cache_config.kv_cache_tensors)
    vgroups = list(kv_cache_config.kv_cache_groups)
    if not vgroups or not tensors:
        raise spec_error("kv_cache_groups", len(vgroups), "an attention-free config has no KV cache to plan")
    if kernel_block_sizes is not None and len(kernel_block_sizes) != len(vgroups):
        raise spec_error(
            "kernel_block_sizes",
            list(kernel_block_sizes),
            f"needs one entry per cache group ({len(vgroups)})",
        )
    where_of: dict[str, tuple[int, int]] = {}
    for ti, t in enumerate(tensors):
        if getattr(t, "host_resident", False):
            raise spec_error(
                f"kv_cache_tensors[{ti}].host_resident",
                True,
                "host-resident (HiSparse) pools are not planned",
            )
        if t.size != tensors[0].size:
            raise spec_error(
                f"kv_cache_tensors[{ti}].size",
                t.size,
                f"differs from {tensors[0].size}: vLLM shares one backing allocation",
            )
        for li, name in enumerate(t.layers):
            if name in where_of:
                raise spec_error(f"kv_cache_tensors[{ti}].layers", name, "the layer is placed by two tensors")
            where_of[name] = (ti, li)

    groups: list[GroupSpec] = []
    vspecs: dict[str, tuple[int, Any]] = {}
    pages: dict[tuple[int, str], int] = {}
    for gi, group in enumerate(vgroups):
        if getattr(group, "host_resident", False):
            raise spec_error(
                f"kv_cache_groups[{gi}].host_resident",
                True,
                "host-resident (HiSparse) groups are not planned",
            )
        per = _group_specs(gi, group, iface)
        names = []
        for name in group.layer_names:
            if name in where_of:
                names.append(name)
            elif name not in runner_only_attn_layers:
                raise spec_error(
                    f"kv_cache_groups[{gi}][{name!r}]",
                    name,
                    "no KVCacheTensor holds this layer "
                    "(pass it in runner_only_attn_layers if it shares another's cache)",
                )
        if not names:
            raise spec_error(
                f"kv_cache_groups[{gi}].layer_names", list(group.layer_names), "no layer owns a tensor"
            )

        def first_byte(name: str) -> int:
            ti, li = where_of[name]
            return int(tensors[ti].offset + li * tensors[ti].layer_stride)

        names.sort(key=first_byte)  # vLLM places same-spec layers together: its order, not the group's
        layers = []
        for name in names:
            vspec = per[name]
            where = f"kv_cache_groups[{gi}][{name!r}]"
            try:
                layers.append(_layer(where, name, vspec))
            except SpecError as e:  # kvlayout's own checks name the layer: add the group
                if str(e).startswith(where):
                    raise
                raise SpecError(f"{where}: {e}", field=e.field, value=e.value) from None
            vspecs[name] = (gi, vspec)
            pages[(gi, name)] = vspec.page_size_bytes
        kbs = None
        if kernel_block_sizes is not None:
            bs = layers[0].logical_block_size
            kbs = kernel_block_sizes[gi] if bs is not None and kernel_block_sizes[gi] != bs else None
        groups.append(GroupSpec(f"group{gi}", tuple(layers), kernel_block_size=kbs))
    for name in where_of:
        if name not in vspecs:
            ti, _ = where_of[name]
            raise spec_error(f"kv_cache_tensors[{ti}].layers", name, "the layer belongs to no cache group")
    _check_layout_expresses(order, pages, len(vgroups))
    try:
        spec = KVCacheSpec(num_blocks=num_blocks, layout=order, groups=tuple(groups))
        layout = plan_layout(spec)
        layout.table()  # virtual splitting rules
    except SpecError as e:
        raise SpecError(f"vLLM KVCacheConfig under {order}: {e}", field=e.field, value=e.value) from None
    _check_against_tensors(layout, tensors, where_of, vspecs, iface)
    return spec


def _check_against_tensors(
    layout: Layout,
    tensors: list[Any],
    where_of: dict[str, tuple[int, int]],
    vspecs: dict[str, tuple[int, Any]],
    iface: Any,
) -> None:
    """Every layer's block 0, block stride and head stride where vLLM's tensor puts them."""
    order = layout.order
    for p in layout.placements:
        ti, li = where_of[p.layer.name]
        t = tensors[ti]
        gi, vspec = vspecs[p.layer.name]
        field = f"kv_cache_tensors[{ti}]"
        label = f"kv_cache_groups[{gi}] layer {p.layer.name!r}"
        first = p.parts[0]
        if first.base != t.offset + li * t.layer_stride:
            raise spec_error(
                f"{field}.offset",
                t.offset,
                f"vLLM puts block 0 of {label} at byte {t.offset + li * t.layer_stride}, "
                f"kvlayout's {order} plan at "
                f"{first.base}: kvlayout cannot represent this placement",
            )
        if first.stride != t.block_stride:
            raise spec_error(
                f"{field}.block_stride",
                t.block_stride,
                f"kvlayout's {order} plan strides blocks of {label} by {first.stride} B",
            )
        if len(p.parts) > 1:
            try:
                strides = iface.compute_layout_strides(
                    vspec,
                    layout.num_blocks,
                    len(t.layers),
                    getattr(iface.KVCacheLayout, order),
                    fixed_strides=(t.layer_stride, t.block_stride, None, None, None),
                )
            except AssertionError as e:
                raise spec_error(
                    f"{field}.layer_stride", t.layer_stride, f"vLLM cannot stride {label}: {e}"
                ) from None
            pitch = p.parts[1].base - first.base
            if strides[2] != pitch:
                raise spec_error(
                    f"{field}.layer_stride",
                    t.layer_stride,
                    f"vLLM strides the head slots of {label} by {strides[2]} B, kvlayout by {pitch} B",
                )
    for ti, t in enumerate(tensors):
        if t.size < layout.total_bytes:
            raise spec_error(
                f"kv_cache_tensors[{ti}].size",
                t.size,
                f"smaller than the {layout.total_bytes} B kvlayout's {order} plan needs",
            )


#: The fields of vLLM 0.33's ``KVBlockZeroer._meta``, in order.
META_FIELDS = ("seg_addrs", "seg_block_strides", "seg_page_sizes", "max_chunks", "blk_size", "n_segs")


def _meta_column(meta: Any, i: int) -> list[int]:
    """Column ``i`` of ``_meta`` as Python ints (a 1-D tensor, array, list or tuple of integers)."""
    field = f"zeroer._meta[{i}] ({META_FIELDS[i]})"
    x = meta[i]
    try:  # its length first: 10**6 segments were read (7 s, 829 MB) before the table refused them (pass 40)
        n = int(x.numel()) if hasattr(x, "numel") else len(x)
    except TypeError:
        n = 0  # no length: refused below as no sequence
    if n > MAX_TABLE_ROWS:
        raise bad_value(TableError, field, n, f"at most {MAX_TABLE_ROWS} segments", shown=f"{n} entries")
    values = x.tolist() if hasattr(x, "tolist") else x
    if not isinstance(values, (list, tuple)):
        raise bad_value(TableError, field, x, "must be a 1-D tensor or sequence of integers")
    for j, v in enumerate(values):
        if not is_int(v):
            raise bad_value(TableError, f"{field}[{j}]", v, "must be an integer (no float, bool or nesting)")
    return [int(v) for v in values]


def _meta_int(meta: Any, i: int) -> int:
    v = meta[i]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise bad_value(TableError, f"zeroer._meta[{i}] ({META_FIELDS[i]})", v, "must be an integer")
    return int(v)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def plain_torch(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run under the cuda backend's ``plain_ops`` (imported at the call: this module imports no torch):
    vLLM's views and ``_meta`` tensors are read with no caller's mode between. A TorchFunctionMode around
    ``from_kv_caches`` answered the views' ``storage_offset()`` one block further on, the views passed the
    plan on that answer, and block 1 was zeroed for block 0 (pass 32)."""

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        from kvlayout.backends.cuda.zeroer import plain_ops

        with plain_ops():
            return fn(*args, **kwargs)

    return run


@plain_torch
def table_from_block_zeroer(
    zeroer: Any, base_address: int, total_bytes: int, num_blocks: int
) -> SegmentTable:
    """vLLM's ``KVBlockZeroer`` segments as a kvlayout table, bases relative to ``base_address``.

    ``_meta`` holds absolute byte addresses and, in int32 words, block strides and page sizes,
    then the launch's chunk count, chunk words and segment count. Every column must hold the
    same number of integers, the segment count must be that number (vLLM's kernel launches that
    many) and the chunks must cover the widest page, or the table would not be what the kernel
    writes: a ``TableError`` names the field. Rows are named ``vllm/segment<i>``; the table
    carries no padding (``planned`` is false). ``_meta`` of ``None`` (no attention layer): no rows.
    """
    if not is_int(base_address):
        raise bad_value(TableError, "base_address", base_address, "must be an integer byte address")
    base_address = int(base_address)
    meta = getattr(zeroer, "_meta", None)
    rows: list[Segment] = []
    if meta is not None:
        if not isinstance(meta, (tuple, list)) or len(meta) < 3:
            shown = type(meta).__name__ if not isinstance(meta, (tuple, list)) else f"{len(meta)} entries"
            raise bad_value(
                TableError, "zeroer._meta", shown, f"must be a tuple ({', '.join(META_FIELDS)})", shown=shown
            )
        addrs, strides, pages = (_meta_column(meta, i) for i in range(3))
        for i, col in ((1, strides), (2, pages)):
            if len(col) != len(addrs):
                raise bad_value(
                    TableError,
                    f"zeroer._meta[{i}] ({META_FIELDS[i]})",
                    len(col),
                    f"entries: seg_addrs has {len(addrs)}; every segment needs one of each",
                )
        if len(meta) >= 6:
            chunks, blk, n_segs = (_meta_int(meta, i) for i in (3, 4, 5))
            if n_segs != len(addrs):
                why = f"the table has {len(addrs)} segments: the kernel must launch each"
                raise bad_value(TableError, "zeroer._meta[5] (n_segs)", n_segs, why)
            widest = max(pages, default=0)
            if chunks * blk < widest:
                raise bad_value(
                    TableError,
                    "zeroer._meta[3] (max_chunks)",
                    chunks,
                    f"{chunks} chunks of {blk} words do not cover the widest page ({widest} words)",
                )
        for i, (a, st, p) in enumerate(zip(addrs, strides, pages)):
            rows.append(Segment(a - base_address, 4 * st, 4 * p, "vllm", f"segment{i}", "page", 0))
    return SegmentTable(total_bytes, num_blocks, tuple(rows))


#: At most this many contiguous runs per block in one view: more is refused, not enumerated.
MAX_VIEW_RUNS = 1 << 16


def _view_block_ranges(where: str, view: Any, num_blocks: int) -> tuple[int, np.ndarray]:
    """(block stride, block 0's merged byte ranges in its storage) of a ``[B, ...]`` view.

    The view may address kernel blocks (``B = ratio * num_blocks``, vLLM's virtual splitting):
    manager block 0 is then kernel blocks ``0 .. ratio-1``. Bytes, never elements; Python
    ints except for the run starts, which lie inside the view's storage (int64 holds them).
    """
    shape, strides, el = tuple(view.shape), tuple(view.stride()), int(view.element_size())
    if not shape or shape[0] == 0 or shape[0] % num_blocks:
        raise spec_error(
            f"{where}.shape",
            shape,
            f"dim 0 must be a positive multiple of the {num_blocks} blocks (kernel blocks per block)",
        )
    ratio = shape[0] // num_blocks
    if any(d == 0 for d in shape):
        raise spec_error(f"{where}.shape", shape, "an empty view holds no page")
    dims = sorted((st * el, sz) for sz, st in zip(shape[1:], strides[1:]) if sz > 1)
    run, outer = el, list[tuple[int, int]]()
    for st, sz in dims:
        if st == run and not outer:  # contiguous with what is inside it: one longer run
            run *= sz
        else:
            outer.append((st, sz))
    outer.append((strides[0] * el, ratio))  # the kernel blocks of manager block 0
    count = 1
    for _, sz in outer:
        count *= sz
    if count > MAX_VIEW_RUNS:
        raise spec_error(f"{where}.stride", strides, f"{count} runs per block: more than {MAX_VIEW_RUNS}")
    for st, sz in outer:  # int64 below: a stride of 2**62 B on a dim of one block overflowed NumPy (pass 40)
        if sz > 1 and abs(st) * (sz - 1) >= MAX_BYTES:
            raise spec_error(f"{where}.stride", strides, f"reaches {abs(st) * (sz - 1)} B: past any storage")
    starts = np.zeros(1, np.int64)
    for st, sz in outer:
        if sz > 1:
            starts = (starts[:, None] + np.arange(sz, dtype=np.int64)[None, :] * st).ravel()
    starts += view.storage_offset() * el
    return strides[0] * el * ratio, merge_ranges(starts, starts + run)


@plain_torch
def check_views_against_layout(
    layout: Layout,
    views: Mapping[str, Any],
    storage_nbytes: int,
    *,
    where: str = "kv_caches",
    optional: Collection[str] = (),
) -> int:
    """Check every layer's view against kvlayout's plan; return the storage byte of the plan's byte 0.

    Each planned layer needs a view (a tensor, or a list/tuple of state tensors) whose block
    stride is the plan's and whose block 0 covers exactly the plan's bytes of that layer (a
    state tensor: inside them), all at one common offset in the storage (the offset most layers
    agree on; a layer off it is named), the plan inside the storage. vLLM's ``allocate_kv_cache``
    views its buffer from the buffer's own storage offset (``raw.storage_offset() + offset``), so
    a nonzero offset is honoured exactly. Views are only checked: the table stays the planner's.
    Layers in ``optional`` (ones kvlayout plans no rows for, such as Mamba state) may lack a view.
    """
    _check_views_mapping(where, views)
    if layout.num_blocks == 0:
        why = "a cache of no blocks has no views to check or block to zero"
        raise bad_value(SpecError, "num_blocks", layout.num_blocks, why)
    checked: list[tuple[str, Any, np.ndarray, np.ndarray, bool]] = []  # name, tensor, ours, theirs, exact
    offsets: dict[int, int] = {}
    for p in layout.placements:
        name = p.layer.name
        if name not in views:
            if name in optional:
                continue
            raise spec_error(f"{where}[{name!r}]", None, "no view of this planned layer")
        strides = {q.stride for q in p.parts}
        lo = np.array([q.base for q in p.parts], np.int64)
        ours = merge_ranges(lo, lo + np.array([q.span for q in p.parts], np.int64))
        value = views[name]
        exact = not isinstance(value, (list, tuple))
        tensors = [value] if exact else list(_walk_tensors(value, f"{where}[{name!r}]"))
        if not tensors or not all(hasattr(t, "untyped_storage") for t in tensors):
            why = "must be a tensor or a list/tuple of tensors, and holds no tensor"
            raise spec_error(f"{where}[{name!r}]", type(value).__name__, why)
        for t in tensors:
            stride, theirs = _view_block_ranges(f"{where}[{name!r}]", t, layout.num_blocks)
            if strides != {stride}:
                raise spec_error(
                    f"{where}[{name!r}].stride",
                    tuple(t.stride()),
                    f"strides blocks by {stride} B; kvlayout's {layout.order} plan by {sorted(strides)} B",
                )
            checked.append((name, t, ours, theirs, exact))
            if exact:
                at = int(theirs[0, 0]) - int(ours[0, 0])
                offsets[at] = offsets.get(at, 0) + 1
    if not checked:
        raise spec_error(where, len(views), "holds no view of a planned layer")
    if offsets:
        base = max(offsets, key=lambda k: offsets[k])  # the first of the most common
    elif any(not isinstance(p.layer, MambaSpec) for p in layout.placements if p.layer.name in views):
        # only state lists, whose tensors need only lie inside their pages: the cache's start would be
        # a guess (an inner slot as its first tensor shifted every row; issue 25, eighth pass)
        why = (
            "no layer kvlayout zeroes has a single-tensor view, so nothing fixes where the cache starts "
            "in the storage (vLLM gives each attention layer one tensor)"
        )
        raise spec_error(where, "only lists of tensors", why)
    else:  # Mamba states only (no rows to zero): vLLM's first state tensor starts its layer's page
        base = int(checked[0][3][0, 0]) - int(checked[0][2][0, 0])
    for name, t, ours, theirs, exact in checked:
        shifted = theirs - base
        if exact:
            inside = np.array_equal(shifted, ours)
        else:  # a state tensor: every run inside one of the layer's ranges
            idx = np.searchsorted(ours[:, 0], shifted[:, 0], side="right") - 1
            inside = bool(np.all(idx >= 0)) and bool(np.all(shifted[:, 1] <= ours[np.maximum(idx, 0), 1]))
        if not inside:
            got = [(int(a), int(b)) for a, b in theirs[:4].tolist()]
            want = [(int(a) + base, int(b) + base) for a, b in ours[:4].tolist()]
            raise spec_error(
                f"{where}[{name!r}].storage_offset",
                t.storage_offset(),
                f"block 0 covers storage bytes {got}, kvlayout's {layout.order} plan puts this "
                f"layer at {want} (the cache starting at storage byte {base}, where "
                f"{offsets.get(base, 0)} of {len(checked)} views put it)",
            )
    if base < 0 or base + layout.total_bytes > storage_nbytes:
        raise spec_error(
            f"{where}.storage",
            storage_nbytes,
            f"the {layout.total_bytes} B cache starting at storage byte {base} does not fit the storage",
        )
    return base


#: Deepest nesting of lists/tuples a layer's cache may have (vLLM's Mamba states nest one or two).
MAX_VIEW_DEPTH = 16
#: Most tensors and lists/tuples in one layer's cache (vLLM's hold one tensor, or a few Mamba states).
MAX_VIEW_ITEMS = 1024


def _walk_tensors(value: Any, where: str = "kv_caches", strict: bool = False) -> Iterator[Any]:
    """Tensors inside a layer's cache (a tensor, or vLLM's per-state lists/tuples for Mamba), in order.

    Walked without recursion; a value nested deeper than :data:`MAX_VIEW_DEPTH` lists (or holding
    itself) is a :class:`SpecError` naming ``where`` (a ``RecursionError`` before), and so is a tensor
    that is not dense and strided (a sparse one has no storage to check). ``strict``: anything else
    that is not a tensor is refused too (a user's ``kv_caches``; vLLM's forward context may hold none).
    """
    stack: list[Iterator[Any]] = [iter((value,))]
    seen = 0
    while stack:
        v = next(stack[-1], _END)
        if v is _END:
            stack.pop()
            continue
        seen += 1
        if seen > MAX_VIEW_ITEMS:  # 15 lists of 10 shared references stood for 10**15 tensors (pass 40)
            why = f"holds more than {MAX_VIEW_ITEMS} tensors and lists (vLLM's caches hold a few per layer)"
            raise bad_value(SpecError, where, seen, why, shown=f"over {MAX_VIEW_ITEMS} items")
        if isinstance(v, (list, tuple)):
            if len(stack) > MAX_VIEW_DEPTH:
                why = f"nests lists/tuples more than {MAX_VIEW_DEPTH} deep (vLLM's caches nest at most two)"
                raise bad_value(SpecError, where, len(stack), why, shown=f"lists nested {len(stack)} deep")
            stack.append(iter(v))
        elif hasattr(v, "untyped_storage"):
            layout = str(getattr(v, "layout", "torch.strided"))
            if layout != "torch.strided":
                why = "must be a dense, strided tensor, as vLLM's cache views are"
                raise bad_value(SpecError, where, layout, why, shown=f"a {layout} tensor")
            yield v
        elif strict:
            why = "must hold tensors (or lists/tuples of them) only, as vLLM's caches do"
            raise bad_value(SpecError, where, type(v).__name__, why, shown=f"a {type(v).__name__}")


_END = object()


def _read_once(where: str, views: Mapping[str, Any]) -> dict[str, Any]:
    """``views`` read once into a plain dict, its lists and tuples into plain tuples: every later check and
    the zeroer's placement see the same tensors (a mapping whose later reads gave tensor subclasses placed
    the cache by their lies: block 1's bytes zeroed for block 0, issue 25, pass 25)."""

    def plain(v: Any, depth: int, name: str, count: list[int]) -> Any:
        count[0] += 1
        if count[0] > MAX_VIEW_ITEMS:  # as _walk_tensors: shared references stood for 10**15 (pass 40)
            why = f"holds more than {MAX_VIEW_ITEMS} tensors and lists (vLLM's caches hold a few per layer)"
            raise bad_value(SpecError, name, count[0], why, shown=f"over {MAX_VIEW_ITEMS} items")
        if not isinstance(v, (list, tuple)):
            return v
        if depth > MAX_VIEW_DEPTH:  # as _walk_tensors names it
            why = f"nests lists/tuples more than {MAX_VIEW_DEPTH} deep (vLLM's caches nest at most two)"
            raise bad_value(SpecError, name, depth, why, shown=f"lists nested {depth} deep")
        return tuple(plain(x, depth + 1, name, count) for x in v)

    return {k: plain(v, 1, f"{where}[{k!r}]", [0]) for k, v in views.items()}


class KVBlockZeroer:
    """Drop-in for vLLM 0.33's ``KVBlockZeroer``: zero newly allocated blocks every step, exactly.

    Built once from the engine's ``KVCacheConfig`` (and its resolved layout) and the backing
    allocation; :meth:`zero_block_ids` takes the Python list the scheduler hands over each
    step. Unlike vLLM's class, the table comes from kvlayout's planner (never from tensor
    strides) and is verified first, ids outside ``[0, num_blocks)`` are refused with nothing
    written, and ``group`` zeroes one cache group's rows only. Launches go to the current
    CUDA stream (vLLM #50696: zeroing on another stream raced KV-offload loads).
    """

    @plain_torch
    def __init__(
        self,
        kv_cache_config: Any,
        buffer: Any,
        kv_cache_layout: Any = None,
        *,
        kernel_block_sizes: Sequence[int] | None = None,
        runner_only_attn_layers: Collection[str] = (),
        **options: Any,
    ) -> None:
        """``buffer``: the backing allocation vLLM's tensors view (any dtype, contiguous); the cache
        starts at its byte ``offset`` (an option, default 0).

        ``options`` go to :class:`kvlayout.backends.cuda.CudaZeroer` (``max_batch``, launch knobs).
        """
        spec = spec_from_kv_cache_config(
            kv_cache_config,
            kv_cache_layout,
            kernel_block_sizes=kernel_block_sizes,
            runner_only_attn_layers=runner_only_attn_layers,
        )
        self._init_spec(spec, buffer, options)

    def _init_spec(self, spec: KVCacheSpec, buffer: Any, options: Any) -> None:
        """Set up from a spec already read from the config (and checked against the views): a config read a
        second time may say otherwise (a num_blocks of 4 for the views, 8 for the zeroer: bytes past every
        view were zeroed, pass 40)."""
        self.spec = spec
        self._setup(plan(spec), buffer, tuple(g.name for g in spec.groups), options)

    def _setup(self, table: SegmentTable, buffer: Any, group_names: tuple[str, ...], options: Any) -> None:
        from kvlayout.backends.cuda import CudaZeroer

        self.table = table
        self.num_blocks = table.num_blocks
        #: kvlayout's name of each vLLM cache group, by vLLM's group index
        self.group_names = group_names
        self._row_groups = frozenset(s.group for s in table.segments)
        self._zeroer = CudaZeroer(table, buffer, **options)

    @classmethod
    def _from_table(cls, table: SegmentTable, buffer: Any, **options: Any) -> KVBlockZeroer:
        """The same object over a table kvlayout planned, without vLLM's objects (benchmarks on a
        machine without vLLM); its ``spec`` is ``None``."""
        self = cls.__new__(cls)
        self.spec = None  # type: ignore[assignment]
        self._setup(table, buffer, table.groups, options)
        return self

    @classmethod
    @plain_torch
    def from_kv_caches(
        cls, kv_cache_config: Any, kv_caches: Mapping[str, Any], kv_cache_layout: Any = None, **kwargs: Any
    ) -> KVBlockZeroer:
        """Build from the per-layer views vLLM allocated (``allocate_kv_cache``), which share one storage.

        Before anything is written every view is checked against kvlayout's plan (block stride,
        block 0's bytes, one common start inside the storage: :func:`check_views_against_layout`);
        the zeroer then writes at that start, which need not be byte 0 of the storage.
        """
        import torch

        if "offset" in kwargs:
            why = "taken from the views' storage offset; pass the buffer to KVBlockZeroer instead"
            raise bad_value(SpecError, "offset", kwargs["offset"], why)
        _check_views_mapping("kv_caches", kv_caches)
        kv_caches = _read_once("kv_caches", kv_caches)
        tensors = [
            t for k, v in kv_caches.items() for t in _walk_tensors(v, f"kv_caches[{k!r}]", strict=True)
        ]
        if not tensors:
            raise bad_value(SpecError, "kv_caches", len(kv_caches), "holds no tensor")
        odd = next((t for t in tensors if type(t) not in (torch.Tensor, torch.nn.Parameter)), None)
        if odd is not None:  # its own storage_offset() / stride() placed the cache: a subclass saying 2 KiB
            # further on had block 1's bytes zeroed for block 0 (issue 25, pass 24)
            kind = type(odd).__name__
            why = "must be plain torch.Tensor views, as vLLM's are (a subclass may report another placement)"
            raise bad_value(SpecError, "kv_caches", kind, why, shown=f"a {kind}")
        storage = tensors[0].untyped_storage()
        for name, v in kv_caches.items():
            for t in _walk_tensors(v, f"kv_caches[{name!r}]"):
                if t.untyped_storage().data_ptr() != storage.data_ptr() or t.device != tensors[0].device:
                    why = "all layers must view one allocation"
                    raise bad_value(SpecError, f"kv_caches[{name!r}]", "another storage", why)
        spec = spec_from_kv_cache_config(
            kv_cache_config,
            kv_cache_layout,
            kernel_block_sizes=kwargs.get("kernel_block_sizes"),
            runner_only_attn_layers=kwargs.get("runner_only_attn_layers", ()),
        )
        if spec.num_blocks == 0:
            why = "a cache of no blocks has no views to check or block to zero"
            raise bad_value(SpecError, "kv_cache_config.num_blocks", spec.num_blocks, why)
        base = check_views_against_layout(plan_layout(spec), kv_caches, storage.nbytes())
        if base % 4:  # the kernel writes 4-byte words: say where the views start, in bytes
            el = int(tensors[0].element_size())
            why = (
                f"the views put the cache at storage byte {base} (element {base / el:g} of their "
                f"{el}-byte dtype): the zeroer writes 4-byte words, so it must start at a multiple of 4 bytes"
            )
            raise bad_value(LayoutBufferError, "kv_caches.storage_offset", base, why, shown=f"{base} B")
        backing = torch.empty(0, dtype=torch.uint8, device=tensors[0].device).set_(storage)
        spec_keys = ("kernel_block_sizes", "runner_only_attn_layers")
        options = {k: v for k, v in kwargs.items() if k not in spec_keys}
        self = cls.__new__(cls)  # the spec the views were checked against, not the config read again
        self._init_spec(spec, backing, {**options, "offset": base})
        return self

    def group_name(self, group: int | str | None) -> str | None:
        """kvlayout's name of ``group``: vLLM's group index, a kvlayout group name, or ``None`` (all)."""
        if group is None or isinstance(group, str):
            return plain_str(group)  # a str subclass's own __eq__ / __hash__ may lie (pass 25)
        # NumPy integers are indices too (np.int64(0) was refused as outside [0, n))
        # read as a plain int first: an int subclass's own comparisons may lie (issue 25, seventeenth pass)
        index = int.__int__(int(group)) if is_int(group) else None
        if index is None or not 0 <= index < len(self.group_names):
            raise bad_value(
                BlockIdError, "group", group, f"must be a cache group index in [0, {len(self.group_names)})"
            )
        return self.group_names[index]

    def zero_block_ids(self, block_ids: Any, group: int | str | None = None) -> None:
        """Zero ``block_ids`` (a Python list, NumPy array or tensor) of every group, or of one ``group``.

        A group kvlayout plans no rows for (Mamba state, which vLLM's zeroer skips too) writes
        nothing; its host ids are still bounds-checked.
        """
        name = self.group_name(group)
        if name is not None and name in self.group_names and name not in self._row_groups:
            if not hasattr(block_ids, "device") or str(block_ids.device) == "cpu":
                ids = block_ids
                if hasattr(block_ids, "numpy"):  # a CPU tensor; bfloat16 / sparse raised TypeError (issue 25)
                    from kvlayout.backends.cuda.zeroer import host_ids

                    ids = host_ids(block_ids)
                normalize_block_ids(ids, self.num_blocks)
            return
        self._zeroer.zero(block_ids, name)

    def warmup(self) -> None:
        """Compile the kernel for every group now, writing nothing (an id past the pool is skipped)."""
        import torch

        from kvlayout.backends.cuda.zeroer import plain_ops

        with plain_ops():  # plans built under a caller's mode were kept (passes 31, 32)
            skip = torch.full((1,), self.num_blocks, dtype=torch.int64, device=self._zeroer.device)
            for name in (None, *(g for g in self.group_names if g in self._row_groups)):
                self._zeroer._launch(skip, 0, self.num_blocks + 1, dplan=self._zeroer._plan_for(name))

    def check(self) -> None:
        """Raise if device-tensor ids were out of range since the last check (synchronises)."""
        self._zeroer.check()


__all__ = [
    "KVBlockZeroer",
    "MAX_VIEW_RUNS",
    "META_FIELDS",
    "SUPPORTED_SPECS",
    "check_views_against_layout",
    "VLLM_LAYOUT_ALIASES",
    "VLLM_VERSION",
    "layout_name",
    "spec_from_kv_cache_config",
    "table_from_block_zeroer",
]
