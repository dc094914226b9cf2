"""Layer, group and cache specs (GEOMETRY.md sections 1, 2 and 4).

Frozen dataclasses in the style of vLLM's v1 KV-cache specs: the fields are what a user
writes in JSON, and the page arithmetic is derived properties, so there is one place where
``real_page`` and ``page`` are computed. Optional fields default to ``None`` so that a spec
loaded from JSON dumps back to exactly the same JSON.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from .errors import SpecError, spec_error
from .ranges import MAX_BLOCKS, MAX_BYTES, round_up
from .validate import check_int, check_name, parse_json, plain_fields

SPEC_VERSION = 1

#: Bytes per element of every dtype a layer may name.
DTYPE_SIZES: Mapping[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

#: DeepSeek-V4's packed MLA cache dtype: 448 fp8 NoPE + 128 B bf16 RoPE + 7 scales + 1 pad.
FP8_DS_MLA = "fp8_ds_mla"
FP8_DS_MLA_TOKEN_BYTES = 584

#: kvlayout's own layout names (GEOMETRY.md section 2); aliases of two of vLLM's orders.
LAYOUTS = ("packed", "layer_major")
#: vLLM 0.33's physical orders of the logical axes ``[L, B, H, N, C]`` (``KVCacheLayout``).
KV_CACHE_LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
#: ``packed`` is ``BLHNC`` and ``layer_major`` is ``LBHNC`` (GEOMETRY.md section 6).
LAYOUT_ALIASES: Mapping[str, str] = {"packed": "BLHNC", "layer_major": "LBHNC"}
#: Every name a spec's ``layout`` may take.
ALL_LAYOUTS = LAYOUTS + KV_CACHE_LAYOUTS


def layout_order(name: str) -> str:
    """The ``[L, B, H, N, C]`` order a layout name stands for (``packed`` -> ``BLHNC``)."""
    if not isinstance(name, str) or name not in ALL_LAYOUTS:
        raise spec_error("layout", name, f"valid layouts: {', '.join(ALL_LAYOUTS)}")
    return LAYOUT_ALIASES.get(name, name)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_pos_int(where: str, name: str, v: object) -> None:
    check_int(SpecError, f"{where}.{name}", v, lo=1)


def _check_opt_int(where: str, name: str, v: object, lo: int = 1) -> None:
    if v is not None:
        check_int(SpecError, f"{where}.{name}", v, lo=lo)


def _check_dtype(where: str, name: str, v: object) -> None:
    if not isinstance(v, str) or v not in DTYPE_SIZES:
        raise spec_error(f"{where}.{name}", v, f"unknown dtype; valid: {', '.join(DTYPE_SIZES)}")


@dataclass(frozen=True)
class LayerSpec:
    """Common base: a named layer whose page may be padded to ``alignment`` bytes."""

    kind: ClassVar[str] = ""
    #: Whether zeroing a block clears this layer (``mamba`` state is never zeroed).
    zeroed: ClassVar[bool] = True

    name: str

    @property
    def where(self) -> str:
        """How error messages name this layer."""
        check_name(SpecError, "layer.name", self.name)
        return f"layer {self.name!r}"

    @property
    def heads(self) -> int:
        """``H``: head slots per block (1 for ``mla`` and ``mamba`` unless set)."""
        return 1

    @property
    def states(self) -> int:
        """``N``: stored states (tokens after compression) per block."""
        return 1

    @property
    def content_bytes(self) -> int:
        """``C``: bytes of one (head slot, state) cell; K and V together for attention."""
        raise NotImplementedError

    @property
    def real_page(self) -> int:
        """Bytes of real data per block, ``H * N * C``: what zeroing clears."""
        return self.heads * self.states * self.content_bytes

    @property
    def alignment_bytes(self) -> int | None:
        return getattr(self, "alignment", None)

    @property
    def padded_page_bytes(self) -> int | None:
        """An explicit padded page (vLLM's ``page_size_padded``), or ``None``."""
        return getattr(self, "padded_page", None)

    @property
    def stride_alignment(self) -> int:
        """Bytes a block stride holding this layer must be a multiple of (1 unless set)."""
        return getattr(self, "block_stride_alignment", None) or 1

    @property
    def page(self) -> int:
        """Padded page: the unit the planner lays out."""
        pp = self.padded_page_bytes
        if pp is not None:
            return pp
        a = self.alignment_bytes
        return round_up(self.real_page, a) if a else self.real_page

    @property
    def geometry_key(self) -> tuple[tuple[str, Any], ...]:
        """Every JSON field but the name: layers with equal keys have equal geometry."""
        return tuple(sorted((k, v) for k, v in self.to_dict().items() if k != "name"))

    @property
    def gap(self) -> int:
        """Alignment padding per block, never written by zeroing."""
        return self.page - self.real_page

    @property
    def split_kv(self) -> bool:
        """K and V stored as two outer halves (``kv_split``)."""
        return bool(getattr(self, "kv_split", None))

    @property
    def logical_block_size(self) -> int | None:
        """Tokens per block, or ``None`` for layers without tokens (``mamba``)."""
        return getattr(self, "block_size", None)

    def _validate_common(self) -> None:
        a = self.alignment_bytes
        if a is not None:
            _check_pos_int(self.where, "alignment", a)
        pp = self.padded_page_bytes
        _check_opt_int(self.where, "padded_page", pp)
        _check_opt_int(self.where, "block_stride_alignment", getattr(self, "block_stride_alignment", None))
        if pp is not None and a is not None:
            raise spec_error(f"{self.where}.padded_page", pp, "give alignment or padded_page, not both")
        if self.real_page >= MAX_BYTES:
            raise spec_error(
                f"{self.where}.real_page", self.real_page, "page bytes must be below 2**62 (section 8)"
            )
        if pp is not None and pp < self.real_page:
            raise spec_error(
                f"{self.where}.padded_page", pp, f"smaller than the real page of {self.real_page} B"
            )
        if self.page >= MAX_BYTES:
            raise spec_error(
                f"{self.where}.real_page", self.real_page, "page bytes must be below 2**62 (section 8)"
            )
        if self.real_page % 4:
            raise spec_error(f"{self.where}.real_page", self.real_page, "page bytes must be a multiple of 4")
        if self.page % 4:
            field, value = ("padded_page", pp) if pp is not None else ("alignment", a)
            raise spec_error(
                f"{self.where}.{field}", value, f"padded page {self.page} B is not a multiple of 4"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``name``, ``kind``, then every field that was set."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "name" and v is not None:
                out[f.name] = v
        return out


def _check_states(layer: LayerSpec, tokens_per_state: int | None, states_per_token: int | None) -> None:
    """``tokens_per_state`` divides ``block_size``; it and ``states_per_token`` are not both above 1."""
    where = layer.where
    _check_opt_int(where, "states_per_token", states_per_token)
    if tokens_per_state is None:
        return
    _check_pos_int(where, "tokens_per_state", tokens_per_state)
    bs = getattr(layer, "block_size", 1)
    if bs % tokens_per_state:
        raise spec_error(
            f"{where}.tokens_per_state", tokens_per_state, f"block_size {bs} is not a multiple of it"
        )
    if tokens_per_state > 1 and (states_per_token or 1) > 1:
        raise spec_error(
            f"{where}.states_per_token",
            states_per_token,
            "a state covers several tokens or a token several states",
        )


@dataclass(frozen=True)
class FullAttentionSpec(LayerSpec):
    """Full attention: K and V of ``block_size`` tokens per block.

    The optional fields are vLLM 0.33's richer attention specs: ``head_size_v`` (V heads of
    another size), ``num_head_slots`` (``H`` when packing diverges from one slot per KV head),
    ``state_content_bytes`` (``C`` of packed formats), ``tokens_per_state`` (several tokens per
    stored state), ``states_per_token`` (several states per token), ``padded_page``
    (``page_size_padded``) and ``block_stride_alignment`` (bytes a block stride is a multiple of).
    """

    kind: ClassVar[str] = "full"

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str
    alignment: int | None = None
    kv_split: bool | None = None
    head_size_v: int | None = None
    num_head_slots: int | None = None
    state_content_bytes: int | None = None
    tokens_per_state: int | None = None
    states_per_token: int | None = None
    padded_page: int | None = None
    block_stride_alignment: int | None = None

    def __post_init__(self) -> None:
        plain_fields(self)
        for n in ("block_size", "num_kv_heads", "head_size"):
            _check_pos_int(self.where, n, getattr(self, n))
        _check_dtype(self.where, "dtype", self.dtype)
        if self.kv_split is not None and not isinstance(self.kv_split, bool):
            raise spec_error(f"{self.where}.kv_split", self.kv_split, "must be true or false")
        _check_opt_int(self.where, "head_size_v", self.head_size_v, lo=0)
        _check_opt_int(self.where, "num_head_slots", self.num_head_slots)
        _check_opt_int(self.where, "state_content_bytes", self.state_content_bytes)
        _check_states(self, self.tokens_per_state, self.states_per_token)
        if self.kv_split:
            for n in ("head_size_v", "state_content_bytes"):
                v = getattr(self, n)
                if v is not None and (n != "head_size_v" or v != self.head_size):
                    raise spec_error(f"{self.where}.{n}", v, "kv_split needs K and V halves of one size")
        self._validate_common()

    @property
    def heads(self) -> int:
        return self.num_head_slots or self.num_kv_heads

    @property
    def states(self) -> int:
        return self.block_size // (self.tokens_per_state or 1) * (self.states_per_token or 1)

    @property
    def content_bytes(self) -> int:
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        v = self.head_size if self.head_size_v is None else self.head_size_v
        return (self.head_size + v) * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Sliding-window attention: the page of full attention; ``window`` does not change it."""

    kind: ClassVar[str] = "sliding_window"

    window: int = 0

    def __post_init__(self) -> None:
        _check_pos_int(self.where, "window", self.window)  # check_int takes NumPy integers as they are
        super().__post_init__()  # makes every integer field a Python int, the window included


@dataclass(frozen=True)
class MLASpec(LayerSpec):
    """Multi-head latent attention, optionally compressed by ``compress_ratio``."""

    kind: ClassVar[str] = "mla"

    block_size: int
    head_size: int
    dtype: str | None = None
    cache_dtype: str | None = None
    compress_ratio: int | None = None
    token_bytes: int | None = None
    alignment: int | None = None
    num_head_slots: int | None = None
    states_per_token: int | None = None
    window: int | None = None
    padded_page: int | None = None
    block_stride_alignment: int | None = None

    def __post_init__(self) -> None:
        plain_fields(self)
        _check_pos_int(self.where, "block_size", self.block_size)
        _check_opt_int(self.where, "num_head_slots", self.num_head_slots)
        _check_opt_int(self.where, "window", self.window)
        _check_pos_int(self.where, "head_size", self.head_size)
        if self.dtype is not None:
            _check_dtype(self.where, "dtype", self.dtype)
        if (
            self.cache_dtype is not None
            and self.cache_dtype != FP8_DS_MLA
            and (not isinstance(self.cache_dtype, str) or self.cache_dtype not in DTYPE_SIZES)
        ):
            raise spec_error(
                f"{self.where}.cache_dtype",
                self.cache_dtype,
                f"unknown cache dtype; valid: {FP8_DS_MLA}, {', '.join(DTYPE_SIZES)}",
            )
        if self.dtype is None and self.cache_dtype is None:
            raise spec_error(f"{self.where}.dtype", None, "an mla layer needs dtype or cache_dtype")
        if self.compress_ratio is not None:
            _check_pos_int(self.where, "compress_ratio", self.compress_ratio)
            if self.block_size % self.compress_ratio:
                raise spec_error(
                    f"{self.where}.compress_ratio",
                    self.compress_ratio,
                    f"block_size {self.block_size} is not a multiple of it",
                )
        if self.token_bytes is not None:
            _check_pos_int(self.where, "token_bytes", self.token_bytes)
        _check_states(self, self.compress_ratio, self.states_per_token)
        self._validate_common()

    @property
    def heads(self) -> int:
        return self.num_head_slots or 1

    @property
    def states(self) -> int:
        return self.stored_tokens * (self.states_per_token or 1)

    @property
    def content_bytes(self) -> int:
        return self.bytes_per_token

    @property
    def ratio(self) -> int:
        return self.compress_ratio or 1

    @property
    def stored_tokens(self) -> int:
        """Tokens stored per block after compression."""
        return self.block_size // self.ratio

    @property
    def bytes_per_token(self) -> int:
        if self.token_bytes is not None:
            return self.token_bytes
        if self.cache_dtype == FP8_DS_MLA:
            return FP8_DS_MLA_TOKEN_BYTES
        dt = self.cache_dtype if self.cache_dtype is not None else self.dtype
        return self.head_size * DTYPE_SIZES[dt or ""]


@dataclass(frozen=True)
class MambaSpec(LayerSpec):
    """Mamba/SSM state: occupies its page in every block but is never zeroed."""

    kind: ClassVar[str] = "mamba"
    zeroed: ClassVar[bool] = False

    state_bytes: int
    alignment: int | None = None
    padded_page: int | None = None
    block_stride_alignment: int | None = None

    def __post_init__(self) -> None:
        plain_fields(self)
        _check_pos_int(self.where, "state_bytes", self.state_bytes)
        self._validate_common()

    @property
    def content_bytes(self) -> int:
        return self.state_bytes


LAYER_KINDS: Mapping[str, type[LayerSpec]] = {
    cls.kind: cls for cls in (FullAttentionSpec, SlidingWindowSpec, MLASpec, MambaSpec)
}


@dataclass(frozen=True)
class GroupSpec:
    """A KV-cache group: ordered layers sharing block ids, optionally split into kernel blocks."""

    name: str
    layers: tuple[LayerSpec, ...]
    kernel_block_size: int | None = None

    def __post_init__(self) -> None:
        plain_fields(self)
        check_name(SpecError, "group.name", self.name)
        if isinstance(self.layers, list):
            object.__setattr__(self, "layers", tuple(self.layers))
        if not isinstance(self.layers, tuple) or not self.layers:
            raise spec_error(f"group {self.name!r}.layers", self.layers, "must be a non-empty list or tuple")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LayerSpec):
                raise spec_error(f"group {self.name!r}.layers[{i}]", layer, "must be a layer spec")
            if type(layer).content_bytes is LayerSpec.content_bytes:  # a bare LayerSpec: no bytes to plan
                why = "must be a layer spec of a kind (FullAttentionSpec, MLASpec, MambaSpec, ...)"
                raise spec_error(f"group {self.name!r}.layers[{i}]", type(layer).__name__, why)
        if self.kernel_block_size is not None:
            _check_pos_int(f"group {self.name!r}", "kernel_block_size", self.kernel_block_size)

    def split_ratio(self, layer: LayerSpec) -> int:
        """``block_size // kernel_block_size`` for ``layer`` (1 without virtual splitting)."""
        bs = layer.logical_block_size
        kbs = self.kernel_block_size
        if kbs is None or bs is None:
            return 1
        if bs % kbs:
            raise spec_error(
                f"group {self.name!r}.kernel_block_size",
                kbs,
                f"does not divide block_size {bs} of {layer.where}",
            )
        return bs // kbs

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.kernel_block_size is not None:
            out["kernel_block_size"] = self.kernel_block_size
        out["layers"] = [layer.to_dict() for layer in self.layers]
        return out


@dataclass(frozen=True)
class KVCacheSpec:
    """A whole KV cache: ``num_blocks`` blocks of every group, laid out as ``layout``."""

    num_blocks: int
    layout: str
    groups: tuple[GroupSpec, ...]
    version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        plain_fields(self)
        if self.version != SPEC_VERSION:
            raise spec_error("version", self.version, f"only version {SPEC_VERSION} is supported")
        check_int(SpecError, "num_blocks", self.num_blocks, lo=0, hi=MAX_BLOCKS)
        layout_order(self.layout)
        if isinstance(self.groups, list):
            object.__setattr__(self, "groups", tuple(self.groups))
        if not isinstance(self.groups, tuple) or not self.groups:
            raise spec_error("groups", self.groups, "must be a non-empty list or tuple")
        for i, g in enumerate(self.groups):
            if not isinstance(g, GroupSpec):
                raise spec_error(f"groups[{i}]", g, "must be a GroupSpec")
        seen_groups: set[str] = set()
        seen_layers: set[str] = set()
        for g in self.groups:
            if g.name in seen_groups:
                raise spec_error("group.name", g.name, "duplicate group name")
            seen_groups.add(g.name)
            for layer in g.layers:
                if layer.name in seen_layers:
                    raise spec_error("layer.name", layer.name, "duplicate layer name")
                seen_layers.add(layer.name)

    @property
    def order(self) -> str:
        """The ``[L, B, H, N, C]`` order of ``layout`` (``packed`` -> ``BLHNC``)."""
        return layout_order(self.layout)

    @property
    def layers(self) -> tuple[tuple[GroupSpec, LayerSpec], ...]:
        """Every (group, layer) pair in spec order."""
        return tuple((g, layer) for g in self.groups for layer in g.layers)

    def with_num_blocks(self, num_blocks: int) -> KVCacheSpec:
        """The same spec for another pool size."""
        return KVCacheSpec(
            num_blocks=num_blocks, layout=self.layout, groups=self.groups, version=self.version
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "num_blocks": self.num_blocks,
            "layout": self.layout,
            "groups": [g.to_dict() for g in self.groups],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: object) -> KVCacheSpec:
        return spec_from_dict(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> KVCacheSpec:
        return spec_from_dict(parse_json(SpecError, "spec", text))


# --------------------------------------------------------------------------- JSON parsing


def _expect_obj(path: str, v: object) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise spec_error(path, v, "must be a JSON object")
    return v


def _check_keys(path: str, obj: Mapping[str, Any], required: Sequence[str], optional: Sequence[str]) -> None:
    for k in required:
        if k not in obj:
            raise spec_error(f"{path}.{k}", None, "missing required field")
    allowed = set(required) | set(optional)
    for k in obj:
        if k not in allowed:
            raise spec_error(f"{path}.{k}", obj[k], f"unknown field; allowed: {', '.join(sorted(allowed))}")


def _typed(path: str, v: object, kind: str) -> None:
    ok = {
        "int": _is_int(v),
        "str": isinstance(v, str),
        "bool": isinstance(v, bool),
    }[kind]
    if not ok:
        raise spec_error(
            path,
            v,
            f"must be a JSON {'integer' if kind == 'int' else 'string' if kind == 'str' else 'boolean'}",
        )


_FIELD_TYPES: Mapping[str, str] = {
    "name": "str",
    "block_size": "int",
    "num_kv_heads": "int",
    "head_size": "int",
    "dtype": "str",
    "cache_dtype": "str",
    "alignment": "int",
    "kv_split": "bool",
    "window": "int",
    "compress_ratio": "int",
    "token_bytes": "int",
    "state_bytes": "int",
    "head_size_v": "int",
    "num_head_slots": "int",
    "state_content_bytes": "int",
    "tokens_per_state": "int",
    "states_per_token": "int",
    "padded_page": "int",
    "block_stride_alignment": "int",
}


def _layer_from_dict(path: str, raw: object) -> LayerSpec:
    obj = _expect_obj(path, raw)
    if "kind" not in obj:
        raise spec_error(f"{path}.kind", None, "missing required field")
    kind = obj["kind"]
    if not isinstance(kind, str) or kind not in LAYER_KINDS:
        raise spec_error(f"{path}.kind", kind, f"unknown layer kind; valid: {', '.join(LAYER_KINDS)}")
    cls = LAYER_KINDS[kind]
    required = [f.name for f in fields(cls) if f.default is not None and f.name != "window"]
    if cls is SlidingWindowSpec:
        required.append("window")
    optional = [f.name for f in fields(cls) if f.name not in required]
    _check_keys(path, obj, ["kind", *required], optional)
    kwargs: dict[str, Any] = {}
    for k, v in obj.items():
        if k == "kind":
            continue
        _typed(f"{path}.{k}", v, _FIELD_TYPES[k])
        kwargs[k] = v
    try:
        return cls(**kwargs)
    except SpecError as e:
        # Re-anchor the message on the JSON path, keep the layer-relative detail.
        raise SpecError(f"{path}: {e}", field=e.field, value=e.value) from None


#: JSON scalar types a layer field may hold; the type is part of a layer's key (``True == 1`` in Python)
_KEY_TYPES = (int, str, bool)


def _layer_key(raw: object) -> tuple[tuple[str, str, object], ...] | None:
    """A layer's fields but its name, each with its exact type, or ``None`` when not a plain record."""
    if type(raw) is not dict or "name" not in raw:
        return None
    key = []
    for k, v in raw.items():
        if k != "name":
            if type(v) not in _KEY_TYPES or type(k) is not str:  # other keys: refused one by one
                return None
            key.append((k, type(v).__name__, v))
    return tuple(sorted(key))


def _layers_from_list(gpath: str, raw_layers: list[object]) -> tuple[LayerSpec, ...]:
    """Parse a group's layers. A layer equal to an earlier one but for its name is that layer renamed.

    Why: every check of a layer reads its fields, never its name (checked on its own here), and a
    100,000-layer spec of a few distinct layers took 7 s to check one by one (issue 25).
    """
    seen: dict[tuple[tuple[str, str, object], ...], LayerSpec] = {}
    layers: list[LayerSpec] = []
    for li, rl in enumerate(raw_layers):
        path = f"{gpath}.layers[{li}]"
        key = _layer_key(rl)
        proto = seen.get(key) if key is not None else None
        if proto is None:
            layer = _layer_from_dict(path, rl)
            if key is not None:
                seen[key] = layer
        else:
            name = rl["name"]  # type: ignore[index]  # a dict: _layer_key checked it
            _typed(f"{path}.name", name, "str")
            try:
                check_name(SpecError, "layer.name", name)
            except SpecError as e:  # worded as _layer_from_dict words it
                raise SpecError(f"{path}: {e}", field=e.field, value=e.value) from None
            layer = copy.copy(proto)
            object.__setattr__(layer, "name", name)
        layers.append(layer)
    return tuple(layers)


def spec_from_dict(data: object) -> KVCacheSpec:
    """Parse and validate a spec in the JSON form of GEOMETRY.md section 4."""
    top = _expect_obj("spec", data)
    _check_keys("spec", top, ["num_blocks", "layout", "groups"], ["version"])
    version = top.get("version", SPEC_VERSION)
    _typed("version", version, "int")
    _typed("num_blocks", top["num_blocks"], "int")
    _typed("layout", top["layout"], "str")
    raw_groups = top["groups"]
    if not isinstance(raw_groups, list) or not raw_groups:
        raise spec_error("groups", raw_groups, "must be a non-empty list")
    groups = []
    for gi, rg in enumerate(raw_groups):
        gpath = f"groups[{gi}]"
        gobj = _expect_obj(gpath, rg)
        _check_keys(gpath, gobj, ["name", "layers"], ["kernel_block_size"])
        _typed(f"{gpath}.name", gobj["name"], "str")
        if "kernel_block_size" in gobj:
            _typed(f"{gpath}.kernel_block_size", gobj["kernel_block_size"], "int")
        raw_layers = gobj["layers"]
        if not isinstance(raw_layers, list) or not raw_layers:
            raise spec_error(f"{gpath}.layers", raw_layers, "must be a non-empty list")
        layers = _layers_from_list(gpath, raw_layers)
        groups.append(
            GroupSpec(name=gobj["name"], layers=layers, kernel_block_size=gobj.get("kernel_block_size"))
        )
    return KVCacheSpec(
        num_blocks=top["num_blocks"], layout=top["layout"], groups=tuple(groups), version=version
    )
