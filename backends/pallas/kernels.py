"""Pallas kernels: the TPU DMA/RMW zeroer and the GPU (Triton lowering) zeroer.

Both take the buffer as ``int32[rows, 128]`` in place (aliased to the output), the block
ids as int32 with a ``take`` flag (0 for duplicates and padding) and the count of live
slots (invalid slots are sorted last and never visited by the TPU kernel). Ids outside
``[0, num_blocks)`` write nothing.

TPU (:func:`tpu_zero_call`): ids and the host row plan are scalar-prefetched into SMEM,
the buffer stays in HBM (``memory_space=ANY``). Each grid step takes ``ids_per_step`` ids:
it starts every whole-row DMA of those ids from one zeroed VMEM tile (all in flight on one
semaphore), then clears partial rows one at a time by read-modify-write (row to VMEM,
``where(mask, 0, row)``, row back, each DMA waited), and finally waits for the whole-row
DMAs. Partial rows are strictly sequential, and whole rows never share a row with any
other item, so no two writes to one row ever race. A table without partial rows compiles
without the RMW loop (the DMA-only fast path).

GPU (:func:`triton_zero_call`): grid (ids, units); a unit is ``chunk_rows`` rows of one
segment, stored with a lane mask computed from the word offsets (per 4-lane group with
``vector``: 16-byte stores). Its direct mode takes the ids as they come (no sort, no
``take``, no ``count``): zeroing a block twice writes the same zeros, and the kernel
itself counts the out-of-range ids, so a step is one kernel launch.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kvlayout.errors import BlockIdError, LayoutBufferError, TableError
from kvlayout.ranges import INT32_MAX
from kvlayout.table import SegmentTable

from .plan import LANES, RowPlan


def _all_lanes() -> Any:
    """Every lane of a row, from an int32 start: a bare ``:`` starts at an int64 0 under
    ``jax_enable_x64``, which dynamic_slice refuses beside the int32 row index."""
    return pl.ds(jnp.int32(0), LANES)


# --------------------------------------------------------------------------- TPU kernel
def _tpu_kernel(
    ids_ref,  # SMEM int32 [n_pad] block ids (sorted, live slots first)
    take_ref,  # SMEM int32 [n_pad] 1 = first occurrence of a valid slot
    count_ref,  # SMEM int32 [1] live slots: later ones are never visited
    fstart_ref,  # SMEM int32 [P+1] CSR of full items per phase class
    frow_ref,  # SMEM int32 [F] first row for q = 0
    fq_ref,  # SMEM int32 [F] rows per q
    fn_ref,  # SMEM int32 [F] rows in the run
    rstart_ref,  # SMEM int32 [P+1] CSR of partial-row items
    rrow_ref,  # SMEM int32 [R]
    rq_ref,  # SMEM int32 [R]
    rmask_ref,  # SMEM int32 [R] mask index
    masks_ref,  # VMEM int32 [M, 128] lane masks
    buf_in_ref,  # HBM int32 [rows, 128] (aliased to buf_ref)
    buf_ref,  # HBM int32 [rows, 128] output
    zeros_ref,  # VMEM int32 [tile_rows, 128] scratch
    row_ref,  # VMEM int32 [1, 128] scratch for read-modify-write
    sem_ref,  # DMA semaphores [2]: 0 whole rows, 1 partial rows
    *,
    period: int,
    num_blocks: int,
    ids_per_step: int,
    has_rmw: bool,
) -> None:
    del buf_in_ref
    zeros_ref[...] = jnp.zeros_like(zeros_ref)
    first = pl.program_id(0) * ids_per_step
    # slots past the live count (ids routed to other shards, padding) cost nothing
    n_here = jnp.clip(count_ref[0] - first, 0, ids_per_step)

    def each_id(fn: Any) -> None:
        def body(i: jax.Array, carry: int) -> int:
            b = ids_ref[first + i]
            ok = (take_ref[first + i] != 0) & (b >= 0) & (b < num_blocks)

            @pl.when(ok)
            def _() -> None:
                c = jax.lax.rem(b, jnp.int32(period))  # int32 constants: x64 mode would make them int64
                q = jax.lax.div(b, jnp.int32(period))
                fn(c, q)

            return carry

        jax.lax.fori_loop(0, n_here, body, 0)

    def full_copy(k: jax.Array, q: jax.Array) -> Any:
        r = frow_ref[k] + q * fq_ref[k]
        n = fn_ref[k]
        return pltpu.make_async_copy(zeros_ref.at[pl.ds(0, n)], buf_ref.at[pl.ds(r, n)], sem_ref.at[0])

    def start_full(c: jax.Array, q: jax.Array) -> None:
        def body(k: jax.Array, carry: int) -> int:
            full_copy(k, q).start()
            return carry

        jax.lax.fori_loop(fstart_ref[c], fstart_ref[c + 1], body, 0)

    def wait_full(c: jax.Array, q: jax.Array) -> None:
        def body(k: jax.Array, carry: int) -> int:
            full_copy(k, q).wait()
            return carry

        jax.lax.fori_loop(fstart_ref[c], fstart_ref[c + 1], body, 0)

    def rmw(c: jax.Array, q: jax.Array) -> None:
        def body(k: jax.Array, carry: int) -> int:
            r = rrow_ref[k] + q * rq_ref[k]
            down = pltpu.make_async_copy(buf_ref.at[pl.ds(r, 1)], row_ref, sem_ref.at[1])
            down.start()
            down.wait()
            mask = masks_ref[pl.ds(rmask_ref[k], 1), :]
            row_ref[...] = jnp.where(mask != 0, 0, row_ref[...])
            up = pltpu.make_async_copy(row_ref, buf_ref.at[pl.ds(r, 1)], sem_ref.at[1])
            up.start()
            up.wait()
            return carry

        jax.lax.fori_loop(rstart_ref[c], rstart_ref[c + 1], body, 0)

    each_id(start_full)
    if has_rmw:
        each_id(rmw)
    each_id(wait_full)


def tpu_zero_call(plan: RowPlan, n_pad: int, ids_per_step: int, interpret: Any = False) -> Any:
    """``f(ids, take, count, buf) -> buf``: the TPU kernel as a pallas_call for ``n_pad`` ids."""
    kernel = partial(
        _tpu_kernel,
        period=plan.period,
        num_blocks=plan.num_blocks,
        ids_per_step=ids_per_step,
        has_rmw=not plan.aligned,
    )
    # SMEM operands are never empty (Mosaic rejects s32[0]); padding entries are never read.
    tables = [
        np.pad(a, (0, 1)) if a.size == 0 else a
        for a in (
            plan.full_start,
            plan.full_row,
            plan.full_qstride,
            plan.full_rows,
            plan.rmw_start,
            plan.rmw_row,
            plan.rmw_qstride,
            plan.rmw_mask,
        )
    ]
    m = plan.masks.shape[0]
    # operands: the scalar-prefetched (ids, take, count, *tables), then masks and the buffer
    num_scalars = 3 + len(tables)
    buf_index = num_scalars + 1
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=num_scalars,
        grid=(n_pad // ids_per_step,),
        in_specs=[
            pl.BlockSpec((m, LANES), lambda i, *_: (0, 0)),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[
            pltpu.VMEM((plan.tile_rows, LANES), jnp.int32),
            pltpu.VMEM((1, LANES), jnp.int32),
            pltpu.SemaphoreType.DMA((2,)),
        ],
    )
    masks = plan.masks  # NumPy: turned into constants inside each trace (no leaked tracers)

    def f(ids: jax.Array, take: jax.Array, count: jax.Array, buf: jax.Array) -> jax.Array:
        call = pl.pallas_call(
            kernel,
            grid_spec=grid_spec,
            out_shape=jax.ShapeDtypeStruct(buf.shape, buf.dtype),
            input_output_aliases={buf_index: 0},
            compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
            interpret=interpret,
        )
        operands = (ids, take, count, *[jnp.asarray(t) for t in tables], jnp.asarray(masks), buf)
        return call(*operands)

    return f


# --------------------------------------------------------------------------- GPU kernel
class TritonUnits(NamedTuple):
    """The GPU kernel's work units, one entry per (segment, chunk of ``chunk_rows`` rows).

    Each field is a ``[U]`` array (host: int64 NumPy; kernel operands: int32; inside the
    kernel: refs): where the unit's segment starts (row, lane of that row), how far it moves
    per block id (rows, lanes), its span in words, and which chunk of the span the unit is.
    """

    base_row: Any
    base_lane: Any
    stride_rows: Any
    stride_lanes: Any
    span_words: Any
    chunk: Any

    @property
    def num_units(self) -> int:
        return len(self.chunk)


def _store_unit(
    buf_ref: Any,
    units: TritonUnits,
    u: jax.Array,
    b: jax.Array,
    ok: jax.Array,
    *,
    chunk_rows: int,
    total_rows: int,
    vec: int,
    evict_first: bool,
) -> None:
    """Zero unit ``u`` of block ``b`` (nothing unless ``ok``): one masked ``(chunk_rows, 128)`` store.

    ``vec = 4``: the lane mask is computed on groups of 4 lanes (``lanes // 4``), which
    Triton's axis analysis sees as constant over 4 lanes, so it emits 16-byte stores instead
    of 4-byte ones. Exact only when every unit's base lane, stride lanes and span are
    multiples of 4 words (:func:`triton_vector_width` checks): a span then starts and ends on
    a 4-lane group boundary.
    """
    from jax.experimental.pallas import triton as pltriton

    bb = jnp.where(ok, b, 0)
    span, chunk = units.span_words[u], units.chunk[u]
    lane0 = units.base_lane[u] + bb * units.stride_lanes[u]  # < 2**31 for ids below 2**24
    r0 = units.base_row[u] + bb * units.stride_rows[u] + lane0 // LANES
    a0 = lane0 % LANES
    start = jnp.clip(r0 + chunk * chunk_rows, 0, total_rows - chunk_rows)  # never slice past the buffer
    rows = start + jax.lax.broadcasted_iota(jnp.int32, (chunk_rows, LANES), 0)
    lanes = jax.lax.broadcasted_iota(jnp.int32, (chunk_rows, LANES), 1)
    if vec == 1:
        w = (rows - r0) * LANES + lanes - a0
        mask = ok & (w >= 0) & (w < span)
    else:  # in groups of vec words; lax.div (truncating, lanes >= 0) keeps the analysis simple
        g = jax.lax.div(lanes, jnp.int32(vec))
        w = (rows - r0) * (LANES // vec) + g - jax.lax.div(a0, jnp.int32(vec))
        mask = ok & (w >= 0) & (w < jax.lax.div(span, jnp.int32(vec)))
    zeros = jnp.zeros((chunk_rows, LANES), jnp.int32)
    policy = "evict_first" if evict_first else None  # zeros nobody reads soon: leave L2 to others
    pltriton.store(
        buf_ref.at[pl.ds(start, chunk_rows), _all_lanes()], zeros, mask=mask, eviction_policy=policy
    )


def _store_args(chunk_rows: int, total_rows: int, vec: int, evict_first: bool) -> dict[str, Any]:
    return {"chunk_rows": chunk_rows, "total_rows": total_rows, "vec": vec, "evict_first": evict_first}


#: ids read per step when a GPU program counts the out-of-range ids of a batch
COUNT_BLOCK = 4096


def _count_bad(ids_ref: Any, bad_ref: Any, n: int, num_blocks: int) -> None:
    """``bad_ref[0]`` = number of ``ids_ref[:n]`` outside ``[0, num_blocks)`` (one program)."""
    from jax.experimental.pallas import triton as pltriton

    blk = min(COUNT_BLOCK, 1 << max(n - 1, 0).bit_length())
    iota = jax.lax.broadcasted_iota(jnp.int32, (blk,), 0)

    def body(j: jax.Array, acc: jax.Array) -> jax.Array:
        first = j * blk
        live = first + iota < n
        v = pltriton.load(ids_ref.at[pl.ds(first, blk)], mask=live, other=0)
        bad = live & ((v < 0) | (v >= num_blocks))
        return acc + jnp.sum(bad, dtype=jnp.int32)  # int32 with jax_enable_x64 too

    total = jax.lax.fori_loop(jnp.int32(0), jnp.int32(-(-n // blk)), body, jnp.int32(0))
    bad_ref[0] = total


def _unpack(refs: tuple[Any, ...], direct: bool) -> tuple[Any, Any, Any, TritonUnits, Any, Any]:
    """``(ids, take, count, units, buffer out, bad)`` from a GPU kernel's refs (take and count
    are None in direct mode, bad in sorted mode)."""
    n = len(TritonUnits._fields)
    if direct:
        ids_ref, *unit_refs, _, buf_ref, bad_ref = refs
        take_ref = count_ref = None
    else:
        ids_ref, take_ref, count_ref, *unit_refs, _, buf_ref = refs
        bad_ref = None
    if len(unit_refs) != n:
        raise TypeError(f"GPU kernel refs: {len(unit_refs)} unit arrays, expected {n}")
    return ids_ref, take_ref, count_ref, TritonUnits(*unit_refs), buf_ref, bad_ref


def _triton_kernel(
    *refs: Any,
    num_blocks: int,
    chunk_rows: int,
    total_rows: int,
    vec: int,
    evict_first: bool,
    direct: bool,
    unit_major: bool,
    n_ids: int,
) -> None:
    """Program (id slot, unit): one unit of one id.

    Sorted mode (``direct=False``) refs: ids (live slots first), take (1 = first occurrence),
    count ``[1]`` (live slots), the six :class:`TritonUnits` arrays, buffer in (aliased),
    buffer out. Direct mode refs: ids (any order, duplicates and out-of-range ids allowed),
    the units, buffer in, buffer out, bad ``[1]`` (out-of-range slots, counted by program
    (0, 0)).
    """
    ids_ref, take_ref, count_ref, units, buf_ref, bad_ref = _unpack(refs, direct)
    first, second = pl.program_id(0), pl.program_id(1)
    i, u = (second, first) if unit_major else (first, second)
    b = ids_ref[i]
    ok = (b >= 0) & (b < num_blocks)
    if not direct:
        ok = ok & (i < count_ref[0]) & (take_ref[i] != 0)
    _store_unit(buf_ref, units, u, b, ok, **_store_args(chunk_rows, total_rows, vec, evict_first))
    if direct:

        @pl.when((i == 0) & (u == 0))
        def _() -> None:
            _count_bad(ids_ref, bad_ref, n_ids, num_blocks)


def _triton_persistent_kernel(
    *refs: Any,
    num_blocks: int,
    chunk_rows: int,
    total_rows: int,
    num_units: int,
    vec: int,
    evict_first: bool,
    direct: bool,
    n_ids: int,
) -> None:
    """A fixed grid of programs striding over (id, unit) items; refs as :func:`_triton_kernel`'s.

    Sorted mode walks ``count * U`` items, so slots past the live count (ids of other
    shards, padding) launch nothing, unlike the (ids, units) grid; direct mode walks all
    ``n * U`` items and program 0 counts the out-of-range ids.
    """
    ids_ref, take_ref, count_ref, units, buf_ref, bad_ref = _unpack(refs, direct)
    pid = pl.program_id(0)
    nprog = pl.num_programs(0)
    total = n_ids * num_units if direct else count_ref[0] * num_units
    trips = jnp.maximum(total - pid + nprog - 1, 0) // nprog

    def body(k: jax.Array, carry: jax.Array) -> jax.Array:
        item = pid + k * nprog
        i = item // num_units
        u = item - i * num_units
        b = ids_ref[i]
        ok = (b >= 0) & (b < num_blocks)
        if not direct:
            ok = ok & (take_ref[i] != 0)
        _store_unit(buf_ref, units, u, b, ok, **_store_args(chunk_rows, total_rows, vec, evict_first))
        return carry

    jax.lax.fori_loop(0, trips, body, jnp.int32(0))
    if direct:

        @pl.when(pid == 0)
        def _() -> None:
            _count_bad(ids_ref, bad_ref, n_ids, num_blocks)


def triton_units(table: SegmentTable, offset: int, chunk_rows: int) -> TritonUnits:
    """int64 units for the GPU kernel: each segment cut into ``chunk_rows`` chunks.

    The kernel holds them as int32: :func:`check_triton_int32` proves that they and every
    intermediate of the kernel's arithmetic fit first.
    """
    out = []
    for s in table.segments:
        bw, sw, spw = (s.base + offset) // 4, s.stride // 4, s.span // 4
        rows_touched = (LANES - 1 + spw) // LANES + 1
        for k in range(-(-rows_touched // chunk_rows)):
            out.append((bw // LANES, bw % LANES, sw // LANES, sw % LANES, spw, k))
    cols = np.array(out, np.int64).reshape(-1, len(TritonUnits._fields))
    return TritonUnits(*(cols[:, c].copy() for c in range(cols.shape[1])))


def effective_chunk_rows(total_rows: int, chunk_rows: int) -> int:
    """Rows per store: ``chunk_rows``, or the largest power of two that fits a smaller buffer."""
    if total_rows < chunk_rows:
        return max(1, 1 << (total_rows.bit_length() - 1))
    return chunk_rows


def check_triton_rows(total_rows: int, chunk_rows: int) -> None:
    """Refuse a buffer of more rows than the Pallas-Triton kernel's int32 row indices reach."""
    if total_rows > INT32_MAX - chunk_rows:
        raise LayoutBufferError(
            f"buffer rows = {total_rows}: the Pallas-Triton kernel indexes rows in int32 (at most "
            f"{INT32_MAX - chunk_rows} rows with chunk_rows {chunk_rows})",
            field="buffer.shape",
            value=total_rows,
        )


def check_triton_int32(units: TritonUnits, table: SegmentTable, total_rows: int, chunk_rows: int) -> None:
    """Refuse a table or buffer whose Pallas-Triton lane and row arithmetic would overflow int32.

    For the largest block id ``b = num_blocks - 1`` (every term grows with ``b``) the kernel
    computes ``lane0 = base_lane + b * stride_lanes``, ``r0 = base_row + b * stride_rows +
    lane0 // 128``, the chunk's first row ``r0 + chunk * chunk_rows``, rows up to
    ``total_rows`` and word offsets up to ``(chunk + 1) * chunk_rows * 128`` inside a span.
    ``lane0`` is what bounds ``num_blocks``: up to 127 lanes per block, so about 2**24 blocks.
    """
    check_triton_rows(total_rows, chunk_rows)
    if units.num_units == 0:
        return
    num_blocks = table.num_blocks
    b = max(num_blocks - 1, 0)
    br, bl, sr, sl, spw, k = (col.astype(object) for col in units)  # Python ints: exact
    lane0 = bl + b * sl
    worst = int(np.argmax(lane0))
    if lane0[worst] > INT32_MAX:
        most = min((INT32_MAX - int(x)) // int(y) + 1 for x, y in zip(bl, sl) if y)
        raise TableError(
            f"table.num_blocks = {num_blocks}: the Pallas-Triton kernel computes lane offsets in int32; "
            f"block {b} needs {lane0[worst]} > 2**31 - 1 (this table allows at most {most} blocks)",
            field="table.num_blocks",
            value=num_blocks,
        )
    row_end = br + b * sr + lane0 // LANES + (k + 1) * chunk_rows
    words = (k + 2) * chunk_rows * LANES
    for name, arr in (("row", row_end), ("word offset in a span", words), ("span in words", spw)):
        if max(arr) > INT32_MAX:
            raise TableError(
                f"table.total_bytes = {table.total_bytes}: a {name} of {max(arr)} is beyond the "
                "Pallas-Triton kernel's int32 arithmetic",
                field="table.total_bytes",
                value=table.total_bytes,
            )


def triton_vector_width(units: TritonUnits) -> int:
    """4 when every unit's base lane, stride lanes and span are multiples of 4 words (spans
    start and end on 16-byte lane groups, so masks may be computed per group); else 1."""
    if units.num_units == 0:
        return 1
    aligned = (units.base_lane % 4 == 0) & (units.stride_lanes % 4 == 0) & (units.span_words % 4 == 0)
    return 4 if bool(np.all(aligned)) else 1


def triton_zero_call(
    table: SegmentTable,
    offset: int,
    total_rows: int,
    chunk_rows: int,
    num_warps: int,
    interpret: bool = False,
    programs: int | None = None,
    *,
    direct: bool = False,
    vector: bool = False,
    unit_major: bool = False,
    evict_first: bool = False,
) -> Any:
    """The Pallas-Triton kernel (GPU, or interpret on CPU) as a function of its operands.

    Sorted mode: ``f(ids, take, count, buf) -> buf``. Direct mode (``direct=True``):
    ``f(ids, buf) -> (buf, bad int32[1])``, ids in any order with duplicates (a block zeroed
    twice gets the same zeros) and out-of-range ids (skipped, counted in ``bad``), so no
    sort or dedup runs around the kernel.

    ``programs=None``: one program per (id slot, unit), ids on grid x (``unit_major``:
    units on x, so neighbouring programs write neighbouring memory); else that many
    persistent programs striding over the items. ``vector``: 16-byte stores where the table
    allows (:func:`triton_vector_width`), else the per-lane mask (always exact).
    ``evict_first``: stores with Triton's ``evict_first`` policy.
    """
    chunk_rows = effective_chunk_rows(total_rows, chunk_rows)
    units64 = triton_units(table, offset, chunk_rows)
    check_triton_int32(units64, table, total_rows, chunk_rows)
    units = TritonUnits(*(col.astype(np.int32) for col in units64))
    vec = triton_vector_width(units64) if vector else 1
    common = dict(num_blocks=table.num_blocks, **_store_args(chunk_rows, total_rows, vec, evict_first))

    def build(n: int, buf: jax.Array, n_operands: int) -> Any:
        from jax.experimental.pallas import triton as pltriton

        items = n * units.num_units
        if programs is None:
            kernel = partial(_triton_kernel, direct=direct, unit_major=unit_major, n_ids=n, **common)
            grid: tuple[int, ...] = (units.num_units, n) if unit_major else (n, units.num_units)
        else:
            if items > INT32_MAX - programs:  # the persistent kernel's int32 item index
                raise BlockIdError(
                    f"block_ids: {n} ids x {units.num_units} units = {items} work items, beyond int32",
                    field="block_ids",
                    value=n,
                )
            kernel = partial(
                _triton_persistent_kernel, num_units=units.num_units, direct=direct, n_ids=n, **common
            )
            grid = (max(1, min(programs, items)),)
        buf_shape = jax.ShapeDtypeStruct(buf.shape, buf.dtype)
        out_shape: Any = (buf_shape, jax.ShapeDtypeStruct((1,), jnp.int32)) if direct else buf_shape
        any_spec = pl.BlockSpec(memory_space=pl.ANY)
        return pl.pallas_call(
            kernel,
            grid=grid,
            in_specs=[any_spec] * n_operands,
            out_specs=(any_spec, any_spec) if direct else any_spec,
            out_shape=out_shape,
            input_output_aliases={n_operands - 1: 0},  # the buffer is the last operand
            compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
            interpret=interpret,
        )

    if direct:

        def fd(ids: jax.Array, buf: jax.Array) -> tuple[jax.Array, jax.Array]:
            if units.num_units == 0:  # a table without rows (only mamba layers): nothing to write
                bad = jnp.sum(((ids < 0) | (ids >= table.num_blocks)).astype(jnp.int32)).reshape(1)
                return buf, bad
            operands = (ids, *(jnp.asarray(col) for col in units), buf)
            out, bad = build(ids.shape[0], buf, len(operands))(*operands)
            return out, bad

        return fd

    def f(ids: jax.Array, take: jax.Array, count: jax.Array, buf: jax.Array) -> jax.Array:
        if units.num_units == 0:  # a table without rows (only mamba layers): nothing to write
            return buf
        operands = (ids, take, count, *(jnp.asarray(col) for col in units), buf)
        return build(ids.shape[0], buf, len(operands))(*operands)

    return f
