"""Pallas kernels for native caches: zero page ``b`` of every leaf, in the leaf's own shape.

A native cache is a list of typed arrays ``[pages, *page]`` (GEOMETRY.md section 9). On a
TPU they are tiled in HBM, so a flat ``int32[rows, 128]`` view would be a relayout copy of
the whole cache; these kernels never reshape or bitcast a leaf. Each module-level kernel
sits beside its launch plan and its NumPy model.

TPU (:func:`tpu_native_call`): ids are scalar-prefetched into SMEM, every leaf stays in
HBM (``memory_space=ANY``) and is aliased to its output. Per leaf, by its rank and dtype:

- ``page`` (rank >= 3: the page axis is untiled): DMA a zeroed VMEM tile of the leaf's
  dtype into ``leaf.at[b]`` (or into chunks of its first page axis when a page is large);
- ``row`` (rank 2, 32-bit): the same DMA into ``leaf.at[pl.ds(b, 1)]``;
- ``rmw`` (rank 2, 8/16-bit): rows ``b`` and ``b ^ 1`` share 32-bit words in HBM, so the
  tile-aligned group of rows holding ``b`` goes to VMEM, row ``b`` is cleared there and the
  group goes back (each id in turn, so no two writes to a group race).

One call covers every leaf: each grid step starts the DMAs of ``ids_per_step`` ids on all
leaves (one semaphore per leaf, all in flight), runs the read-modify-writes, then waits.

GPU (:func:`triton_native_call`, the Pallas Triton lowering): grid (id slots, units); a
unit is a power-of-two box of one leaf's page, stored with the id's validity as the mask.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kvlayout.errors import LayoutBufferError, bad_value
from kvlayout.ranges import INT32_MAX, cdiv, round_up

from .kernels import _count_bad

LANES = 128
#: HBM tile rows of 8/16-bit arrays: a DMA's row offset and size must be multiples of it.
TILE_ROWS = 8
#: Padded VMEM bytes one zero tile may take before a page is split into chunks.
DEFAULT_TILE_BYTES = 2 * 2**20
#: DMAs one grid step keeps in flight (ids_per_step is derived from it).
DEFAULT_MAX_INFLIGHT = 64
#: Elements one GPU program stores (a power of two).
DEFAULT_BOX_ELEMENTS = 8192

Shape = tuple[int, ...]
#: Same-width unsigned integer type per item size (the rmw path selects bits, not floats).
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def itemsize(dtype: Any) -> int:
    return int(np.dtype(dtype).itemsize)


def vmem_bytes(shape: Shape, dtype: Any) -> int:
    """VMEM a buffer takes: the minor axis padded to 128 lanes, the second-minor to whole
    32-bit words (Mosaic packs 16/8-bit rows in pairs/quads, as the leaves are in HBM)."""
    size = itemsize(dtype)
    lead = math.prod(shape[:-2])
    return lead * round_up(shape[-2], max(1, 4 // size)) * round_up(shape[-1], LANES) * size


# --------------------------------------------------------------------------- TPU plan
@dataclass(frozen=True)
class LeafPlan:
    """How the TPU kernel zeroes one leaf ``[pages, *page]``."""

    shape: Shape
    dtype: str
    kind: str  # "page", "row" or "rmw" (module docstring)
    chunk: int  # page: entries of the first page axis per DMA; rmw: rows per group; row: 1
    scratch: int  # its VMEM buffer: index into NativePlan.tiles (page, row) or .groups (rmw)

    @property
    def page_bytes(self) -> int:
        """Logical bytes of one page (one row of the rmw kind)."""
        return math.prod(self.shape[1:]) * itemsize(self.dtype)

    @property
    def chunks(self) -> tuple[tuple[int, int], ...]:
        """``(start, size)`` along the first page axis of each DMA of one page (page kind)."""
        if self.kind != "page":
            return ((0, 1),)
        d0 = self.shape[1]
        return tuple((s, min(self.chunk, d0 - s)) for s in range(0, d0, self.chunk))

    @property
    def groups(self) -> tuple[int, int]:
        """rmw kind: ``(first row of the tail group, rows in it)``; the tail may be empty."""
        n = self.shape[0]
        return n - n % self.chunk, n % self.chunk


@dataclass(frozen=True)
class NativePlan:
    """Per-leaf plans plus the VMEM buffers they share: zero tiles and rmw row groups."""

    leaves: tuple[LeafPlan, ...]
    tiles: tuple[tuple[Shape, str], ...]
    groups: tuple[tuple[Shape, str], ...]
    num_blocks: int

    @property
    def dmas_per_id(self) -> int:
        """DMAs started per id (rmw leaves excluded: their copies are waited one at a time)."""
        return sum(len(lp.chunks) for lp in self.leaves if lp.kind != "rmw")

    @property
    def vmem_bytes(self) -> int:
        return sum(vmem_bytes(s, d) for s, d in (*self.tiles, *self.groups))


def _page_chunk(shape: Shape, dtype: str, tile_bytes: int) -> int:
    """Entries of the first page axis per DMA so a tile stays within ``tile_bytes``."""
    d0 = shape[1]
    per_entry = vmem_bytes((1, *shape[2:]), dtype) if len(shape) > 3 else vmem_bytes((1, shape[2]), dtype)
    c = max(1, min(d0, tile_bytes // max(per_entry, 1)))
    if len(shape) == 3 and c < d0:
        # the first page axis is the tiled second-minor one: chunks of whole HBM tiles only
        if d0 % TILE_ROWS:
            return d0
        c = max(TILE_ROWS * 4, c // (TILE_ROWS * 4) * (TILE_ROWS * 4))
        c = min(c, d0)
    return c


def plan_tpu(leaves: Sequence[tuple[Shape, Any]], *, tile_bytes: int = DEFAULT_TILE_BYTES,
             names: Sequence[str] | None = None) -> NativePlan:
    """The TPU kernel's plan for leaves ``(shape, dtype)`` with the same number of pages."""
    names = list(names) if names is not None else [f"leaf{i}" for i in range(len(leaves))]
    tiles: dict[tuple[Shape, str], int] = {}
    groups: dict[tuple[Shape, str], int] = {}
    out = []
    for name, (shape, dt) in zip(names, leaves):
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(dt).name
        size = itemsize(dtype)
        if len(shape) >= 3:
            c = _page_chunk(shape, dtype, tile_bytes)
            key = ((c, *shape[2:]), dtype)
            out.append(LeafPlan(shape, dtype, "page", c, tiles.setdefault(key, len(tiles))))
        elif size >= 4:
            key = ((1, shape[1]), dtype)
            out.append(LeafPlan(shape, dtype, "row", 1, tiles.setdefault(key, len(tiles))))
        else:
            if shape[0] % TILE_ROWS:
                raise bad_value(
                    LayoutBufferError, f"leaf {name!r}.shape", shape,
                    f"a rank-2 {dtype} cache packs {4 // size} pages per 32-bit word; the TPU kernel needs "
                    f"the page count to be a multiple of {TILE_ROWS} (or give each page a trailing axis)",
                )
            rows = TILE_ROWS * (4 // size)  # whole VMEM tiles of the dtype
            key = ((rows, shape[1]), dtype)
            out.append(LeafPlan(shape, dtype, "rmw", rows, groups.setdefault(key, len(groups))))
    num_blocks = out[0].shape[0] if out else 0
    return NativePlan(tuple(out), tuple(tiles), tuple(groups), num_blocks)


def zero_pages_numpy(arrays: Sequence[np.ndarray], ids: Any, num_blocks: int) -> None:
    """The kernels' contract in NumPy: ``a[b] = 0`` for every array and every valid id
    (ids outside ``[0, num_blocks)`` write nothing; duplicates are fine)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    ok = np.unique(ids[(ids >= 0) & (ids < num_blocks)])
    for a in arrays:
        a[ok] = 0


def run_plan_numpy(arrays: Sequence[np.ndarray], plan: NativePlan, ids: Any) -> None:
    """NumPy model of the TPU kernel: the same DMAs and read-modify-writes, on host arrays."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    for b in np.unique(ids[(ids >= 0) & (ids < plan.num_blocks)]).tolist():
        for a, lp in zip(arrays, plan.leaves):
            if lp.kind == "page":
                for start, size in lp.chunks:
                    a[b, start : start + size] = np.zeros((size, *lp.shape[2:]), a.dtype)
            elif lp.kind == "row":
                a[b : b + 1] = np.zeros((1, lp.shape[1]), a.dtype)
            else:
                gt, tail = lp.groups
                start = b // lp.chunk * lp.chunk
                rows = lp.chunk if start < gt else tail
                grp = a[start : start + rows].copy()
                grp[b - start] = 0
                a[start : start + rows] = grp


# --------------------------------------------------------------------------- TPU kernel
def _tpu_kernel(
    ids_ref,  # SMEM int32 [n_pad] block ids, sorted, live slots first
    take_ref,  # SMEM int32 [n_pad] 1 = first occurrence of a live id
    count_ref,  # SMEM int32 [1] live slots: later ones are never visited
    *refs: Any,  # L leaves in (HBM [pages, *page], aliased), L out, T zero tiles, G row groups, DMA sems [L]
    plan: NativePlan,
    ids_per_step: int,
) -> None:
    n_leaves, n_tiles, n_groups = len(plan.leaves), len(plan.tiles), len(plan.groups)
    outs = refs[n_leaves : 2 * n_leaves]  # HBM [pages, *page] each
    tiles = refs[2 * n_leaves : 2 * n_leaves + n_tiles]  # VMEM [chunk, *page[1:]] zeros
    groups = refs[2 * n_leaves + n_tiles : 2 * n_leaves + n_tiles + n_groups]  # VMEM [rows, page]
    sems = refs[2 * n_leaves + n_tiles + n_groups]  # DMA semaphores [L]

    @pl.when(pl.program_id(0) == 0)  # "arbitrary" grid: one core walks every step in order
    def _zero_tiles() -> None:
        for t in tiles:
            t[...] = jnp.zeros(t.shape, t.dtype)

    first = pl.program_id(0) * ids_per_step
    n_here = jnp.clip(count_ref[0] - first, 0, ids_per_step)

    def each_live(fn: Any) -> None:
        def body(i: jax.Array, carry: int) -> int:
            b = ids_ref[first + i]
            ok = (take_ref[first + i] != 0) & (b >= 0) & (b < plan.num_blocks)
            pl.when(ok)(lambda: fn(b))
            return carry

        jax.lax.fori_loop(0, n_here, body, 0)

    def page_copies(b: jax.Array) -> Iterator[Any]:
        """Every DMA of page ``b`` of the page and row leaves (rebuilt identically to wait)."""
        for k, (out, lp) in enumerate(zip(outs, plan.leaves)):
            if lp.kind == "row":
                yield pltpu.make_async_copy(tiles[lp.scratch], out.at[pl.ds(b, 1)], sems.at[k])
            elif lp.kind == "page":
                tile = tiles[lp.scratch]
                for start, size in lp.chunks:
                    dst = out.at[b] if size == lp.shape[1] else out.at[b, pl.ds(start, size)]
                    src = tile if size == lp.chunk else tile.at[pl.ds(0, size)]
                    yield pltpu.make_async_copy(src, dst, sems.at[k])

    def start(b: jax.Array) -> None:
        for cp in page_copies(b):
            cp.start()

    def wait(b: jax.Array) -> None:
        for cp in page_copies(b):
            cp.wait()

    def rmw(b: jax.Array) -> None:
        for sem, (out, lp) in enumerate(zip(outs, plan.leaves)):
            if lp.kind != "rmw":
                continue
            grp = groups[lp.scratch]
            gt, tail = lp.groups
            g = jax.lax.div(b, jnp.int32(lp.chunk)) * lp.chunk

            def one(rows: int, at: Any, out: Any = out, grp: Any = grp, sem: int = sem) -> None:
                hbm = out.at[pl.ds(at, rows)]
                buf = grp if rows == grp.shape[0] else grp.at[pl.ds(0, rows)]
                down = pltpu.make_async_copy(hbm, buf, sems.at[sem])
                down.start()
                down.wait()
                # select in the same-width integer type: bits move, no float op touches them
                bits = jax.lax.bitcast_convert_type(buf[...], _UINT[buf.dtype.itemsize])
                row = jax.lax.broadcasted_iota(jnp.int32, buf.shape, 0)
                cleared = jnp.where(row == b - at, jnp.zeros_like(bits), bits)
                buf[...] = jax.lax.bitcast_convert_type(cleared, buf.dtype)
                up = pltpu.make_async_copy(buf, hbm, sems.at[sem])
                up.start()
                up.wait()

            pl.when(g < gt)(partial(one, lp.chunk, pl.multiple_of(g, lp.chunk)))
            if tail:
                pl.when(g >= gt)(partial(one, tail, gt))

    each_live(start)
    if plan.groups:
        each_live(rmw)
    each_live(wait)


def ids_per_step_for(plan: NativePlan, max_inflight: int = DEFAULT_MAX_INFLIGHT) -> int:
    """Ids per grid step: as many as keep at most ``max_inflight`` DMAs in flight (a power of two)."""
    fit = max(1, max_inflight // max(plan.dmas_per_id, 1))
    return min(1 << (fit.bit_length() - 1), 64)


def tpu_native_call(plan: NativePlan, n_pad: int, ids_per_step: int, interpret: Any = False) -> Any:
    """``f(ids, take, count, *leaves) -> leaves``: the TPU kernel as one pallas_call for ``n_pad`` ids."""
    kernel = partial(_tpu_kernel, plan=plan, ids_per_step=ids_per_step)
    n_leaves = len(plan.leaves)
    scratch = [
        *(pltpu.VMEM(s, jnp.dtype(d)) for s, d in plan.tiles),
        *(pltpu.VMEM(s, jnp.dtype(d)) for s, d in plan.groups),
        pltpu.SemaphoreType.DMA((max(n_leaves, 1),)),
    ]
    vmem = plan.vmem_bytes
    limit = None if vmem <= 8 * 2**20 else round_up(2 * vmem + 4 * 2**20, 2**20)

    def f(ids: jax.Array, take: jax.Array, count: jax.Array, *leaves: jax.Array) -> list[jax.Array]:
        prefetch = (ids, take, count)
        call = pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=len(prefetch),
                grid=(n_pad // ids_per_step,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * len(leaves),
                out_specs=[pl.BlockSpec(memory_space=pl.ANY)] * len(leaves),
                scratch_shapes=scratch,
            ),
            out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves],
            input_output_aliases={len(prefetch) + i: i for i in range(len(leaves))},
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",), vmem_limit_bytes=limit),
            interpret=interpret,
        )
        return list(call(*prefetch, *leaves))

    return f


# --------------------------------------------------------------------------- GPU plan
@dataclass(frozen=True)
class BoxPlan:
    """How the GPU kernel covers one page of a leaf: power-of-two boxes, ``counts`` per axis.

    A box starts at ``min(k * box, dim - box)`` along each page axis: boxes of an axis whose
    length is no multiple of the box overlap at its end (zeros written twice, never a byte
    outside the page)."""

    shape: Shape
    dtype: str
    box: Shape
    counts: Shape

    @property
    def units(self) -> int:
        return math.prod(self.counts)

    def starts(self, unit: int) -> Shape:
        """Box origin of ``unit`` inside the page (the kernel's arithmetic, in Python)."""
        out = []
        for dim, b, c in zip(reversed(self.shape[1:]), reversed(self.box), reversed(self.counts)):
            unit, k = divmod(unit, c)
            out.append(min(k * b, dim - b))
        return tuple(reversed(out))


def _pow2_box(dim: int, budget: int) -> int:
    """Box length along an axis: its largest power-of-two divisor within ``budget``, or,
    when that is tiny against the axis, the largest power of two not above it (overlap)."""
    div = dim & -dim
    b = min(div, budget)
    if b < 8 and dim > b:
        b = min(1 << (dim.bit_length() - 1), budget)
    return max(b, 1)


def plan_triton(
    leaves: Sequence[tuple[Shape, Any]], box_elements: int = DEFAULT_BOX_ELEMENTS
) -> tuple[BoxPlan, ...]:
    """Boxes of at most ``box_elements`` per program, filled from the minor axis outwards."""
    out = []
    for shape, dt in leaves:
        shape = tuple(int(d) for d in shape)
        budget, box = box_elements, []
        for dim in reversed(shape[1:]):
            b = _pow2_box(dim, budget)
            box.append(b)
            budget = max(1, budget // b)
        box.reverse()
        counts = tuple(cdiv(d, b) for d, b in zip(shape[1:], box))
        out.append(BoxPlan(shape, np.dtype(dt).name, tuple(box), counts))
    return tuple(out)


def run_boxes_numpy(arrays: Sequence[np.ndarray], plans: Sequence[BoxPlan], ids: Any) -> None:
    """NumPy model of the GPU kernel: every box of every valid id, on host arrays."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    for a, bp in zip(arrays, plans):
        for b in ids[(ids >= 0) & (ids < bp.shape[0])].tolist():
            for u in range(bp.units):
                idx = tuple(slice(s, s + n) for s, n in zip(bp.starts(u), bp.box))
                a[(b, *idx)] = 0


# --------------------------------------------------------------------------- GPU kernel
def _triton_kernel(
    ids_ref,  # int32 [n] block ids (sorted mode: live slots first)
    *refs: Any,  # sorted: take [n], count [1]; then L leaves in, L leaves out; direct: + bad [1]
    plans: tuple[BoxPlan, ...],
    num_blocks: int,
    direct: bool,
) -> None:
    """Program (id slot, unit): one box of one leaf's page ``ids[i]``.

    Sorted mode: ``take[i]`` (1 = first occurrence) and ``count`` (live slots) select the ids.
    Direct mode: ids as they come (duplicates zero a page twice, which is harmless;
    out-of-range ids write nothing), and program (0, 0) counts the out-of-range ids into
    ``bad[0]``: no sort, no other launch, so a step is this one kernel.
    """
    from jax.experimental.pallas import triton as pltriton

    if direct:
        take_ref = count_ref = None
        outs, bad_ref = refs[len(plans) : 2 * len(plans)], refs[-1]
    else:
        take_ref, count_ref, *rest = refs
        outs, bad_ref = tuple(rest[len(plans) :]), None
    i = pl.program_id(0)
    u = pl.program_id(1)
    b = ids_ref[i]
    ok = (b >= 0) & (b < num_blocks)
    if take_ref is not None and count_ref is not None:
        ok = ok & (i < count_ref[0]) & (take_ref[i] != 0)
    bb = jnp.where(ok, b, 0)

    def store(out: Any, bp: BoxPlan, k: jax.Array) -> None:
        idx = []
        for dim, n, c in zip(reversed(bp.shape[1:]), reversed(bp.box), reversed(bp.counts)):
            q = jax.lax.rem(k, jnp.int32(c))
            k = jax.lax.div(k, jnp.int32(c))
            idx.append(pl.ds(jnp.minimum(q * n, jnp.int32(dim - n)), n))
        # the id's validity is a branch, not a store mask: masked-off lanes are never read
        # back (the interpreter's masked store would pass them through a float select)
        zeros = jnp.zeros(bp.box, jnp.dtype(bp.dtype))
        pl.when(ok)(lambda: pltriton.store(out.at[(bb, *reversed(idx))], zeros))

    first = 0
    for out, bp in zip(outs, plans):
        pl.when((u >= first) & (u < first + bp.units))(partial(store, out, bp, u - first))
        first += bp.units
    if bad_ref is not None:

        @pl.when((i == 0) & (u == 0))
        def _() -> None:
            _count_bad(ids_ref, bad_ref, ids_ref.shape[0], num_blocks)


def _interpret_view(dtype: str) -> Any:
    """The same-width unsigned type interpret mode runs a float leaf as, or ``None``.

    On the CPU, XLA computes in float32 what it has no native support for (bfloat16, fp8),
    so the interpreter's read-modify-write of a ref turned a NaN's payload into the canonical
    NaN in pages no id named; an integer view moves the bits unchanged. Zero bits are +0.0."""
    dt = np.dtype(dtype)
    return _UINT.get(dt.itemsize) if jnp.issubdtype(dt, jnp.floating) else None


def triton_native_call(
    plans: tuple[BoxPlan, ...],
    num_blocks: int,
    num_warps: int = 4,
    interpret: bool = False,
    direct: bool = False,
) -> Any:
    """The Pallas-Triton kernel (GPU, or interpret on CPU). Sorted mode:
    ``f(ids, take, count, *leaves) -> leaves``; direct mode: ``f(ids, *leaves) -> (leaves, bad[1])``."""
    for bp in plans:
        if math.prod(bp.shape) > INT32_MAX:
            raise bad_value(
                LayoutBufferError, "leaf.shape", bp.shape,
                "the Pallas-Triton kernel indexes elements in int32: at most 2**31 - 1 elements per leaf",
            )
    views = tuple(_interpret_view(bp.dtype) if interpret else None for bp in plans)
    kplans = tuple(bp if v is None else replace(bp, dtype=np.dtype(v).name) for bp, v in zip(plans, views))
    kernel = partial(_triton_kernel, plans=kplans, num_blocks=num_blocks, direct=direct)
    units = sum(bp.units for bp in plans)

    def f(ids: jax.Array, *args: jax.Array) -> Any:
        from jax.experimental.pallas import triton as pltriton

        prefetch = (ids,) if direct else (ids, *args[:2])
        given = args if direct else args[2:]
        leaves = [x if v is None else jax.lax.bitcast_convert_type(x, v) for x, v in zip(given, views)]
        out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
        any_spec = pl.BlockSpec(memory_space=pl.ANY)
        if direct:
            out_shape.append(jax.ShapeDtypeStruct((1,), jnp.int32))
        call = pl.pallas_call(
            kernel,
            grid=(ids.shape[0], units),
            in_specs=[any_spec] * (len(prefetch) + len(leaves)),
            out_specs=[any_spec] * len(out_shape),
            out_shape=out_shape,
            input_output_aliases={len(prefetch) + i: i for i in range(len(leaves))},
            compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
            interpret=interpret,
        )
        out = list(call(*prefetch, *leaves))
        for k, (x, v) in enumerate(zip(given, views)):
            if v is not None:
                out[k] = jax.lax.bitcast_convert_type(out[k], x.dtype)
        return (out[:-1], out[-1]) if direct else out

    return f
