"""Native caches (GEOMETRY.md section 9): a list of typed arrays, page (block) axis first.

TPU serving stacks (tpu-inference, sglang-jax, JetStream) keep the KV cache as one array
per layer or overlaid slot, e.g. ``(pages, page_size, heads_x2 // packing, packing,
head_dim)``, never as one flat buffer. Zeroing block ``b`` sets ``leaf[b]`` to zero in
every zeroed leaf. In the contract's terms each leaf is a buffer of its own with a single
row: base 0, stride = span = the logical bytes of one page. So the verifier, the reference
and the conformance suite apply to every leaf unchanged.

NumPy only, like the rest of the core: no JAX import. The JSON form::

    {"version": 1, "layout": "native",
     "leaves": [{"name": "layer.0", "shape": [1024, 16, 4, 2, 128], "dtype": "bfloat16",
                 "group": "full"}]}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import KVLayoutError, LayoutBufferError, SpecError, bad_value, spec_error
from .ranges import MAX_BLOCKS, MAX_BYTES
from .reference import expected_zeroed, normalize_block_ids, zero_blocks_numpy
from .spec import DTYPE_SIZES, SPEC_VERSION
from .table import Segment, SegmentTable
from .validate import check_int, check_name, is_int, parse_json, plain_fields, plain_str
from .verify import VerifyReport, verify

#: The ``layout`` of a native spec's JSON.
NATIVE_LAYOUT = "native"

#: Bytes per element of every dtype a native leaf may have (the layer dtypes plus the
#: integer and fp8 variants TPU stacks hold caches in).
NATIVE_DTYPE_SIZES: Mapping[str, int] = {
    **DTYPE_SIZES,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e4m3b11fnuz": 1,
    "float8_e8m0fnu": 1,
}

_LEAF_KEYS = ("name", "shape", "dtype", "group", "zeroed")

#: Most leaves a native spec may have: as many as a model config may have layers
#: (``kvlayout.models.config.MAX_CONFIG_LAYERS``), one array per layer at most.
MAX_NATIVE_LEAVES = 100_000

#: Highest rank of a leaf (NumPy's limit on dimensions): a 60,000-dimension shape took 9 s to multiply
#: out before its size was refused (issue 25).
MAX_LEAF_RANK = 32

#: Fields (shape, dtype, group, zeroed) of leaves already checked, of exact built-in types: a
#: model's arrays repeat a few of them, and checking 100,000 leaves one by one took 3 s (issue 25).
_CHECKED_FIELDS: set[tuple[Any, ...]] = set()


def _exact_fields(leaf: NativeLeaf) -> tuple[Any, ...] | None:
    """The leaf's fields as a memo key, or ``None`` unless each is of its exact type (``True == 1``)."""
    shape, group = leaf.shape, leaf.group
    if (
        type(shape) is not tuple
        or set(map(type, shape)) != {int}
        or type(leaf.dtype) is not str
        or type(leaf.zeroed) is not bool
        or not (type(group) is str or (type(group) is tuple and set(map(type, group)) <= {str}))
    ):
        return None
    return (shape, leaf.dtype, group, leaf.zeroed)


def dtype_name(dtype: Any) -> str:
    """The canonical name of a dtype given as a string, a NumPy/JAX dtype or a scalar type."""
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


@dataclass(frozen=True)
class NativeLeaf:
    """One typed cache array: ``shape[0]`` pages of ``shape[1:]`` elements of ``dtype``.

    ``group`` is the cache group the leaf belongs to (per-group zeroing, section 7), or a
    tuple of groups for a slot array overlaid by layers of several groups (zeroing any of
    them clears it);
    ``zeroed=False`` marks a leaf zeroing never touches (state addressed by request slot).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    group: str | tuple[str, ...] = ""
    zeroed: bool = True

    def __post_init__(self) -> None:
        # lists (the JSON form) and tuple subclasses as plain tuples first, so that plain_fields sees their
        # names: a str subclass in a list kept its own __eq__ and zeroing group a cleared b's leaf (pass 28)
        for attr in ("shape", "group"):
            v = getattr(self, attr)
            if isinstance(v, (list, tuple)) and type(v) is not tuple:
                object.__setattr__(self, attr, tuple(v))
        plain_fields(self)  # a str subclass's own __eq__ / __hash__ may lie (pass 26)
        check_name(SpecError, "leaf.name", self.name)
        where = f"leaf {self.name!r}"
        key = _exact_fields(self)
        if key is not None and key in _CHECKED_FIELDS:
            return
        if not isinstance(self.shape, tuple):
            raise spec_error(f"{where}.shape", self.shape, "must be a list or tuple of integers")
        if not 2 <= len(self.shape) <= MAX_LEAF_RANK:
            why = f"needs rank 2 to {MAX_LEAF_RANK}: the page axis first, then the page"
            raise spec_error(f"{where}.shape", self.shape, why)
        for i, d in enumerate(self.shape):
            if not is_int(d):
                raise spec_error(f"{where}.shape[{i}]", d, "must be an integer")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        check_int(SpecError, f"{where}.shape[0]", self.shape[0], lo=0, hi=MAX_BLOCKS)
        for i, d in enumerate(self.shape[1:], start=1):
            check_int(SpecError, f"{where}.shape[{i}]", d, lo=1)
        if not isinstance(self.dtype, str) or self.dtype not in NATIVE_DTYPE_SIZES:
            why = f"unknown dtype; valid: {', '.join(NATIVE_DTYPE_SIZES)}"
            raise spec_error(f"{where}.dtype", self.dtype, why)
        if isinstance(self.group, tuple):
            if not self.group:
                raise spec_error(f"{where}.group", self.group, "a tuple of groups must not be empty")
            for i, g in enumerate(self.group):
                check_name(SpecError, f"{where}.group[{i}]", g)
            if len(set(self.group)) != len(self.group):
                raise spec_error(f"{where}.group", self.group, "names a group twice")
        else:
            check_name(SpecError, f"{where}.group", self.group, empty=True)
        if not isinstance(self.zeroed, bool):
            raise spec_error(f"{where}.zeroed", self.zeroed, "must be true or false")
        page = self.page_bytes
        if page >= MAX_BYTES or self.total_bytes >= MAX_BYTES:
            why = "page and array bytes must be below 2**62 (section 8)"
            raise spec_error(f"{where}.shape", self.shape, why)
        if page % 4:
            why = f"one page is {page} B: must be a multiple of 4 (invariant 1)"
            raise spec_error(f"{where}.shape", self.shape, why)
        if key is not None:
            if len(_CHECKED_FIELDS) >= 4096:
                _CHECKED_FIELDS.clear()
            _CHECKED_FIELDS.add(key)

    @property
    def group_names(self) -> tuple[str, ...]:
        """Every group the leaf belongs to (one, unless it is an overlaid slot)."""
        return self.group if isinstance(self.group, tuple) else (self.group,)

    @property
    def group_label(self) -> str:
        """The groups as one string (``a+b`` for an overlaid slot), as table provenance writes them."""
        return "+".join(self.group_names)

    # ---- page arithmetic (bytes) ------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """Pages in the array: its leading dimension."""
        return self.shape[0]

    @property
    def page_shape(self) -> tuple[int, ...]:
        """Shape of one page, ``leaf[b]``."""
        return self.shape[1:]

    @property
    def itemsize(self) -> int:
        return NATIVE_DTYPE_SIZES[self.dtype]

    @property
    def page_bytes(self) -> int:
        """Logical bytes of one page: ``prod(shape[1:]) * itemsize`` (stride and span of its row)."""
        return math.prod(self.shape[1:]) * self.itemsize

    @property
    def total_bytes(self) -> int:
        """Logical bytes of the whole array."""
        return self.num_blocks * self.page_bytes

    def table(self, zeroed: bool | None = None) -> SegmentTable:
        """The leaf as a buffer of its own: one row (base 0, stride = span = page bytes), or none."""
        rows: tuple[Segment, ...] = ()
        if self.zeroed if zeroed is None else zeroed:
            rows = (Segment(0, self.page_bytes, self.page_bytes, self.group_label, self.name, "page"),)
        return SegmentTable(self.total_bytes, self.num_blocks, rows, planned=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``name``, ``shape``, ``dtype``, then ``group`` and ``zeroed`` when not the default."""
        out: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.group:
            out["group"] = list(self.group) if isinstance(self.group, tuple) else self.group
        if not self.zeroed:
            out["zeroed"] = False
        return out

    @classmethod
    def from_dict(cls, data: object, path: str = "leaf") -> NativeLeaf:
        if not isinstance(data, Mapping):
            raise spec_error(path, data, "must be a JSON object")
        for k in ("name", "shape", "dtype"):
            if k not in data:
                raise spec_error(f"{path}.{k}", None, "missing required field")
        for k in data:
            if k not in _LEAF_KEYS:
                raise spec_error(f"{path}.{k}", data[k], f"unknown field; allowed: {', '.join(_LEAF_KEYS)}")
        shape = data["shape"]
        if not isinstance(shape, list):
            raise spec_error(f"{path}.shape", shape, "must be a JSON list of integers")
        try:
            return cls(
                name=data["name"], shape=tuple(shape), dtype=data["dtype"], group=data.get("group", ""),
                zeroed=data.get("zeroed", True),
            )
        except SpecError as e:
            raise SpecError(f"{path}: {e}", field=e.field, value=e.value) from None


def _check_leaf_count(n: int) -> None:
    """Refuse more than :data:`MAX_NATIVE_LEAVES` leaves, naming the field, the count and the cap."""
    if n > MAX_NATIVE_LEAVES:
        why = f"{n:,} leaves: a native spec has at most {MAX_NATIVE_LEAVES:,} (one array per layer)"
        raise spec_error("leaves", n, why)


@dataclass(frozen=True)
class NativeCacheSpec:
    """A native cache: its leaves in pytree order. Every leaf has the same number of pages,
    so a block id names page ``b`` of every leaf."""

    leaves: tuple[NativeLeaf, ...]
    version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        plain_fields(self)  # a NumPy version made to_json fail
        if self.version != SPEC_VERSION:
            raise spec_error("version", self.version, f"only version {SPEC_VERSION} is supported")
        if isinstance(self.leaves, list):
            object.__setattr__(self, "leaves", tuple(self.leaves))
        if not isinstance(self.leaves, tuple) or not self.leaves:
            raise spec_error("leaves", self.leaves, "must be a non-empty list or tuple of NativeLeaf")
        _check_leaf_count(len(self.leaves))
        seen: set[str] = set()
        for i, leaf in enumerate(self.leaves):
            if type(leaf) is not NativeLeaf:  # a subclass's own group_names / table() chose the bytes
                # zeroed: another group's leaf cleared (pass 32, as pass 24 found for table rows)
                if isinstance(leaf, NativeLeaf):
                    why = "must be a NativeLeaf itself (a subclass's methods pick the bytes written)"
                    raise spec_error(f"leaves[{i}]", type(leaf).__name__, why)
                raise spec_error(f"leaves[{i}]", leaf, "must be a NativeLeaf")
            if leaf.name in seen:
                raise spec_error(f"leaves[{i}].name", leaf.name, "duplicate leaf name")
            seen.add(leaf.name)
            if leaf.num_blocks != self.leaves[0].num_blocks:
                raise spec_error(
                    f"leaves[{i}].shape[0]", leaf.num_blocks,
                    f"every leaf needs the same number of pages "
                    f"({self.leaves[0].name!r} has {self.leaves[0].num_blocks})",
                )

    @property
    def layout(self) -> str:
        return NATIVE_LAYOUT

    @property
    def num_blocks(self) -> int:
        """Pages of every leaf: block ids lie in ``[0, num_blocks)``."""
        return self.leaves[0].num_blocks

    @property
    def groups(self) -> tuple[str, ...]:
        """Group names in first-seen order."""
        return tuple(dict.fromkeys(g for leaf in self.leaves for g in leaf.group_names))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(leaf.name for leaf in self.leaves)

    @property
    def bytes_per_block(self) -> int:
        """Bytes zeroing one block clears over every zeroed leaf."""
        return sum(leaf.page_bytes for leaf in self.leaves if leaf.zeroed)

    def leaf(self, name: str) -> NativeLeaf:
        for leaf in self.leaves:
            if leaf.name == name:
                return leaf
        raise spec_error("leaf", name, f"no such leaf; leaves: {', '.join(self.names)}")

    def check_group(self, group: str | None) -> str | None:
        """``group`` if it names a group of this spec (or is ``None``: every group). Groups are named by
        str: another type (``np.int64(0)``) is refused naming its type, not as a group that is missing.
        A str subclass is read as the plain str it holds (its own ``__eq__`` may lie: pass 25)."""
        group = plain_str(group)
        if group is None:
            return None
        valid = ", ".join(repr(g) for g in self.groups)
        if type(group) is not str:  # before the membership test, which ran the object's own __eq__ (pass 29)
            why = f"must be a group name (a str) or None, not {type(group).__name__}; valid groups: "
            raise spec_error("group", group, why + valid)
        if group not in self.groups:
            raise spec_error("group", group, f"no such group; valid groups: {valid}")
        return group

    def zeroed_mask(self, group: str | None = None) -> tuple[bool, ...]:
        """Per leaf: does zeroing (of ``group``, or of every group) clear it?"""
        group = self.check_group(group)
        return tuple(leaf.zeroed and (group is None or group in leaf.group_names) for leaf in self.leaves)

    def with_num_blocks(self, num_blocks: int) -> NativeCacheSpec:
        """The same leaves with another number of pages."""
        return NativeCacheSpec(
            tuple(NativeLeaf(x.name, (num_blocks, *x.page_shape), x.dtype, x.group, x.zeroed)
                  for x in self.leaves),
            self.version,
        )

    # ---- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        leaves = [leaf.to_dict() for leaf in self.leaves]
        return {"version": self.version, "layout": NATIVE_LAYOUT, "leaves": leaves}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: object) -> NativeCacheSpec:
        """Parse and validate the JSON form (``layout`` must be ``"native"``)."""
        if not isinstance(data, Mapping):
            raise spec_error("spec", data, "must be a JSON object")
        for k in ("layout", "leaves"):
            if k not in data:
                raise spec_error(f"spec.{k}", None, "missing required field")
        for k in data:
            if k not in ("version", "layout", "leaves"):
                raise spec_error(f"spec.{k}", data[k], "unknown field; allowed: layout, leaves, version")
        if data["layout"] != NATIVE_LAYOUT:
            raise spec_error("layout", data["layout"], f"a native spec has layout {NATIVE_LAYOUT!r}")
        version = data.get("version", SPEC_VERSION)
        if not is_int(version):
            raise spec_error("version", version, "must be a JSON integer")
        raw = data["leaves"]
        if not isinstance(raw, list) or not raw:
            raise spec_error("leaves", raw, "must be a non-empty list")
        _check_leaf_count(len(raw))  # before any leaf is read
        return cls(tuple(NativeLeaf.from_dict(r, f"leaves[{i}]") for i, r in enumerate(raw)), version)

    @classmethod
    def from_json(cls, text: str | bytes) -> NativeCacheSpec:
        return cls.from_dict(parse_json(SpecError, "spec", text))


def _renamed(t: SegmentTable, name: str) -> SegmentTable:
    """``t`` with ``name`` as the layer of its rows, without checking it again (frozen copies)."""
    rows = []
    for r in t.segments:
        row = object.__new__(Segment)
        row.__dict__.update(r.__dict__, layer=name)
        rows.append(row)
    out = object.__new__(SegmentTable)
    out.__dict__.update(t.__dict__, segments=tuple(rows))
    return out


#: Native dtypes whose value 0 is not zero bytes: ``float8_e8m0fnu`` (a power-of-two scale) has no zero
#: and rounds 0 to 0xff, NaN. The contract clears bytes to 0x00 (the reference does); a kernel that
#: writes the value 0 cannot, so the kernel zeroers refuse such a zeroed leaf (issue 25).
NO_ZERO_DTYPES = frozenset({"float8_e8m0fnu"})


def refuse_dtypes_without_zero(spec: NativeCacheSpec) -> None:
    """Raise :class:`LayoutBufferError` naming the first zeroed leaf of a dtype in :data:`NO_ZERO_DTYPES`
    (for zeroers whose kernels write the value 0, as the Pallas ``CacheZeroer`` does)."""
    for name, leaf in zip(spec.names, spec.leaves):
        if leaf.zeroed and leaf.dtype in NO_ZERO_DTYPES:
            why = (
                "has no zero: the kernels write the value 0, which this dtype rounds to 0xff (NaN), not zero "
                "bytes; zero a uint8 view of the array"
            )
            raise bad_value(LayoutBufferError, f"leaf {name!r}.dtype", leaf.dtype, why)


def check_native_spec(spec: Any, cls: type[KVLayoutError] = SpecError, field: str = "spec") -> None:
    """``spec`` must be a :class:`NativeCacheSpec` itself: a subclass's own ``zeroed_mask`` or leaves chose
    which leaves were zeroed, and the contract (built by the same methods) agreed with the wrong write
    (pass 32, as pass 24 found for tables)."""
    if type(spec) is not NativeCacheSpec:
        why = "a subclass's methods pick the leaves written" if isinstance(spec, NativeCacheSpec) else ""
        msg = "must be a kvlayout.native.NativeCacheSpec" + (f" itself ({why})" if why else "")
        raise bad_value(cls, field, type(spec).__name__, msg)


def native_tables(spec: NativeCacheSpec, group: str | None = None) -> dict[str, SegmentTable]:
    """One table per leaf, by name: a single row (base 0, stride = span = page bytes) for
    every leaf zeroing clears (of ``group``, when given), no rows for the others."""
    check_native_spec(spec)
    mask = spec.zeroed_mask(group)
    out: dict[str, SegmentTable] = {}
    first: dict[tuple[int, int, str, bool], SegmentTable] = {}  # leaves of one page: one checked table
    for leaf, z in zip(spec.leaves, mask):
        key = (leaf.page_bytes, leaf.num_blocks, leaf.group_label, z)
        t = first.get(key)
        if t is None:
            out[leaf.name] = first[key] = leaf.table(zeroed=z)
        else:  # the same table but for the leaf's name in its (only) row
            out[leaf.name] = _renamed(t, leaf.name)
    return out


def verify_native(spec: NativeCacheSpec, group: str | None = None) -> dict[str, VerifyReport]:
    """The verifier's report for every leaf's table (section 3 invariants, per leaf).

    Leaves of one page size have equal tables but for the names in their row, so a safe
    report is shared between them (a model's per-layer arrays: 100,000 leaves verify once,
    not 100,000 times); an unsafe one is recomputed so its violations name the leaf.
    """
    check_native_spec(spec)
    seen: dict[tuple[int, int, bool], VerifyReport] = {}  # (page bytes, pages, zeroed): the table's rows
    out: dict[str, VerifyReport] = {}
    for leaf, z in zip(spec.leaves, spec.zeroed_mask(group)):
        key = (leaf.page_bytes, leaf.num_blocks, z)
        report = seen.get(key)
        if report is None or not report.ok:  # a table is built only to verify it
            report = seen[key] = verify(leaf.table(zeroed=z))
        out[leaf.name] = report
    return out


def expected_zeroed_native(
    spec: NativeCacheSpec, block_ids: Any, group: str | None = None
) -> dict[str, np.ndarray]:
    """The contract per leaf: merged ``[k, 2]`` byte ranges of its logical bytes that zeroing clears."""
    ids = normalize_block_ids(block_ids, spec.num_blocks)
    return {name: expected_zeroed(t, ids) for name, t in native_tables(spec, group).items()}


def zero_native_numpy(
    arrays: Sequence[np.ndarray], spec: NativeCacheSpec, block_ids: Any, group: str | None = None
) -> None:
    """NumPy reference: zero ``block_ids`` in place in host arrays (one per leaf, spec order),
    through each leaf's table, so it is the contract's byte set by construction.

    Ids are validated first: a bad id writes nothing in any array.
    """
    ids = normalize_block_ids(block_ids, spec.num_blocks)
    # plain ndarrays: a subclass's own nbytes or flags may lie, and every array is checked before any is
    # written (a lying second array was refused after the first was zeroed: issue 25, pass 24)
    arrays = [np.ndarray.view(a, np.ndarray) if isinstance(a, np.ndarray) else a for a in arrays]
    if len(arrays) != len(spec.leaves):
        raise spec_error("arrays", len(arrays), f"needs one array per leaf ({len(spec.leaves)})")
    for i, (a, leaf) in enumerate(zip(arrays, spec.leaves)):
        if not isinstance(a, np.ndarray) or a.nbytes != leaf.total_bytes:
            got = getattr(a, "nbytes", type(a).__name__)
            why = f"must be a NumPy array of {leaf.total_bytes} B ({leaf.name!r})"
            raise spec_error(f"arrays[{i}]", got, why)
        if a.dtype.hasobject:  # references, not bytes: refused before any array is written (issue 25)
            why = f"must hold plain data ({leaf.name!r}: its dtype holds object references); nothing written"
            raise bad_value(LayoutBufferError, f"arrays[{i}].dtype", str(a.dtype), why, shown=str(a.dtype))
        if not (a.flags.c_contiguous and a.flags.writeable):  # every array before any write (issue 25)
            got = "read-only" if a.flags.c_contiguous else "non-contiguous"
            why = f"must be C-contiguous and writeable ({leaf.name!r}); nothing was written"
            raise bad_value(LayoutBufferError, f"arrays[{i}]", got, why)
    for a, t in zip(arrays, native_tables(spec, group).values()):
        if len(t):
            zero_blocks_numpy(a, t, ids)


def _per_array(field: str, v: Any) -> list[Any]:
    """``v`` as a list of one entry per array: a sequence, never a string (it would split into characters)."""
    if (
        isinstance(v, (str, bytes))
        or not isinstance(v, (Sequence, np.ndarray))
        or (isinstance(v, np.ndarray) and v.ndim != 1)  # a 0-d array cannot be iterated
    ):
        raise spec_error(field, v, "must be a list with one entry per array")
    return list(v)


def spec_from_arrays(
    arrays: Sequence[Any] | Mapping[str, Any],
    groups: Sequence[str | tuple[str, ...]] | Mapping[str, str | tuple[str, ...]] | str | None = None,
    *,
    names: Sequence[str] | None = None,
    zeroed: Sequence[bool] | None = None,
) -> NativeCacheSpec:
    """A native spec from arrays (anything with ``.shape`` and ``.dtype``: NumPy or JAX
    arrays, ``jax.ShapeDtypeStruct``), already flattened in pytree order.

    Names: the mapping's keys, else ``names``, else ``leaf0``, ``leaf1``, ... ``groups``: one
    name for all, one per leaf, or a mapping from leaf name to group (missing: ``""``); a
    leaf's group may be a tuple of names (an overlaid slot).
    """
    if isinstance(arrays, Mapping):
        keys = [check_name(SpecError, "arrays key", k) for k in arrays]
        items = list(arrays.values())
        if names is not None:
            raise spec_error("names", names, "give names or a mapping of arrays, not both")
        names = keys
    elif isinstance(arrays, Sequence) and not isinstance(arrays, (str, bytes)):
        items = list(arrays)
    else:
        raise spec_error("arrays", type(arrays).__name__, "must be a sequence or a mapping of arrays")
    n = len(items)
    if names is None:
        names = [f"leaf{i}" for i in range(n)]
    names = _per_array("names", names)
    if len(names) != n:
        raise spec_error("names", len(names), f"needs one name per array ({n})")
    group_of: list[str | tuple[str, ...]]
    if groups is None or isinstance(groups, str):
        group_of = [groups or ""] * n
    elif isinstance(groups, Mapping):
        unknown = sorted(set(groups) - set(names))
        if unknown:
            why = f"no such leaf; leaves: {', '.join(names)}"
            raise spec_error(f"groups[{unknown[0]!r}]", groups[unknown[0]], why)
        group_of = [groups.get(x, "") for x in names]
    else:
        group_of = _per_array("groups", groups)
        if len(group_of) != n:
            raise spec_error("groups", len(group_of), f"needs one group per array ({n})")
    zs = [True] * n if zeroed is None else _per_array("zeroed", zeroed)
    if len(zs) != n:
        raise spec_error("zeroed", len(zs), f"needs one flag per array ({n})")
    leaves = []
    for i, a in enumerate(items):
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):
            raise spec_error(f"arrays[{i}]", type(a).__name__, "must have .shape and .dtype")
        leaves.append(NativeLeaf(names[i], tuple(a.shape), dtype_name(a.dtype), group_of[i], zs[i]))
    return NativeCacheSpec(tuple(leaves))


__all__ = [
    "NATIVE_DTYPE_SIZES",
    "NATIVE_LAYOUT",
    "NO_ZERO_DTYPES",
    "NativeCacheSpec",
    "NativeLeaf",
    "dtype_name",
    "expected_zeroed_native",
    "native_tables",
    "refuse_dtypes_without_zero",
    "spec_from_arrays",
    "verify_native",
    "zero_native_numpy",
]
