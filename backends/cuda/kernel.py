"""Triton zeroer: kernel, launch geometry and its NumPy model, side by side.

The table is cut on the host into *work units*: each row's span is split into pieces of at
most ``chunk_words`` int32 words, so a block id expands into ``W`` units whatever mix of
spans the table has (no program ever runs for a chunk past a row's span, vLLM #52058).
Work item ``u`` of a batch is (id ``u // W``, unit ``u % W``). Up to CUDA's grid limit a
batch launches one program per work item on a ``(W, num_ids)`` grid (``ONE_SHOT``): its loads
issued together, then one masked vector store when every unit fits one vector (``SINGLE``)
or whole vectors and a masked tail. Beyond it (or when asked), a capped, persistent grid
strides over the ``num_ids * W`` items, so the grid never exceeds hardware limits.

Kernels are defined through :func:`._mode.jit`, which picks native Triton or its
interpreter for these kernels only. They therefore call no ``@triton.jit`` function of
``triton.language.standard`` (``tl.zeros``, ``tl.sum``, ``tl.cumsum``, ``tl.max``): those are
plain ``JITFunction`` objects unless ``TRITON_INTERPRET`` was set when Triton was imported,
and cannot run inside an interpreted kernel. ``tl.full``, and ``tl.reduce`` /
``tl.associative_scan`` with Triton's own combine functions, give the same IR natively.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton.language as tl

from kvlayout.errors import BackendError
from kvlayout.table import SegmentTable
from kvlayout.validate import is_int

from ._mode import jit

#: CUDA's limit on grid dimension x.
MAX_GRID_X = 2**31 - 1
#: CUDA's limit on grid dimension y (ids of a one-shot launch).
MAX_GRID_Y = 65535
#: Unit lengths are int32 words.
MAX_CHUNK_WORDS = 2**30


@dataclass(frozen=True)
class UnitPlan:
    """Per-block work units derived from a (verified, coalesced) table, in int32 words."""

    base_words: np.ndarray  # int64 [W] word offset of the unit in block 0
    stride_words: np.ndarray  # int64 [W] words between consecutive block ids
    words: np.ndarray  # int32 [W] words the unit clears (<= chunk_words)
    chunk_words: int
    num_blocks: int
    aligned16: bool  # every base, stride and length is a multiple of 4 words: 16 B vector stores

    @property
    def units_per_block(self) -> int:
        return int(self.words.size)


def plan_units(table: SegmentTable, chunk_words: int = 8192) -> UnitPlan:
    """Cut every row into units of at most ``chunk_words`` words (host side, once).

    A table without rows (only ``mamba`` layers) gets one empty unit, so device ids are
    still bounds-checked by the kernel while nothing is written.
    """
    if (
        not is_int(chunk_words)  # a lying int subclass passed on its value, then int() gave 0 (pass 23)
        or not 0 < chunk_words <= MAX_CHUNK_WORDS
        or chunk_words % 4
    ):
        raise BackendError(
            f"chunk_words = {chunk_words!r}: must be a positive multiple of 4, at most {MAX_CHUNK_WORDS}",
            field="chunk_words",
            value=chunk_words,
        )
    chunk_words = int(chunk_words)
    if len(table) == 0:
        empty = np.zeros(1, np.int64)
        return UnitPlan(empty, empty.copy(), np.zeros(1, np.int32), chunk_words, table.num_blocks, True)
    base = table.bases // 4
    stride = table.strides // 4
    span = table.spans // 4
    n_chunks = -(-span // chunk_words)
    row = np.repeat(np.arange(span.size), n_chunks)
    first = np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
    k = np.arange(row.size) - first  # chunk index within its row
    off = k * chunk_words
    words = np.minimum(span[row] - off, chunk_words).astype(np.int32)
    ub = (base[row] + off).astype(np.int64)
    us = stride[row].astype(np.int64)
    aligned = bool(np.all(ub % 4 == 0) and np.all(us % 4 == 0) and np.all(words % 4 == 0))
    return UnitPlan(ub, us, words, chunk_words, table.num_blocks, aligned)


def launch_grid(plan: UnitPlan, num_ids: int, max_programs: int) -> tuple[int, int]:
    """(programs, work items) for a batch: never more programs than items, limit or ``MAX_GRID_X``."""
    items = num_ids * plan.units_per_block
    programs = max(1, min(items, max_programs, MAX_GRID_X))
    return programs, items


def zero_units_numpy(words: np.ndarray, plan: UnitPlan, ids: np.ndarray) -> None:
    """NumPy model of the kernel: the same work items, one at a time per unit column."""
    for b, s, n in zip(plan.base_words.tolist(), plan.stride_words.tolist(), plan.words.tolist()):
        for i in ids.tolist():
            if 0 <= i < plan.num_blocks:  # anything else writes nothing
                start = b + i * s
                words[start : start + n] = 0


@jit()
def _add(a, b):  # combine function: sums and prefix sums (tl.sum / tl.cumsum without calling them)
    return a + b


@jit()
def _maximum(a, b):  # combine function: tl.max without calling it
    return tl.maximum(a, b)


# Triton's own combine functions where it has them: the ones tl.sum / tl.max use natively, and
# the interpreter reduces them with NumPy instead of one element at a time (1,024-id programs).
_SUM = getattr(tl.standard, "_sum_combine", _add)
_MAX = getattr(tl.standard, "_elementwise_max", _maximum)


@jit(do_not_specialize=["num_units", "id_lo", "num_blocks", "id_limit", "total_items"])
def zero_units_kernel(
    buf_ptr,  # int32 [total_bytes / 4] the layout's words
    ids_ptr,  # int32/int64 [num_ids] block ids (device)
    ubase_ptr,  # int64 [W] unit word offsets in block 0
    ustride_ptr,  # int64 [W] unit word strides
    uwords_ptr,  # int32 [W] unit lengths in words
    err_ptr,  # int64 [2] (count of bad work items, last bad id)
    count_ptr,  # int32 [1] with COUNTED: how many leading ids are live (written by route_ids_kernel)
    num_units,  # W
    id_lo,  # first id this buffer owns (0; a shard's first global id when routing)
    num_blocks,  # ids [id_lo, id_lo + num_blocks) are zeroed, as local id - id_lo
    id_limit,  # ids outside [0, id_limit) are errors; the rest belong to other shards (skipped)
    total_items,  # num_ids * W
    SUB: tl.constexpr,  # words per vector store
    ALIGNED: tl.constexpr,  # bases, strides and lengths are multiples of 4 words
    CACHE: tl.constexpr,  # store cache modifier ("" or e.g. ".cs" streaming)
    EVICT: tl.constexpr,  # store eviction policy ("" or "evict_first")
    COUNTED: tl.constexpr,  # items = count_ptr[0] * W (a device-side bound) instead of total_items
    ONE_SHOT: tl.constexpr,  # grid (W, ids): program (w, i) clears unit w of id i (small batches)
    SINGLE: tl.constexpr = False,  # every unit fits one SUB-wide vector: one masked store, no loop
):
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, SUB)
    zeros = tl.full([SUB], 0, tl.int32)
    if ONE_SHOT:  # straight-line: one item per program, its loads issued together (one latency)
        i = tl.program_id(1).to(tl.int64)
        live = i * num_units < total_items  # the grid is (W, ids): every program is an item
        if COUNTED:
            live = i < tl.load(count_ptr).to(tl.int64)
        gid = tl.load(ids_ptr + i).to(tl.int64)
        ubase = tl.load(ubase_ptr + pid)
        ustride = tl.load(ustride_ptr + pid)
        n = tl.load(uwords_ptr + pid)
        bid = gid - id_lo
        if live & (bid >= 0) & (bid < num_blocks):
            start = ubase + bid * ustride
            if ALIGNED:
                start = tl.multiple_of(start, 4)
                n = tl.multiple_of(n, 4)
            if SINGLE:
                tl.store(
                    buf_ptr + start + offs, zeros, mask=offs < n, cache_modifier=CACHE, eviction_policy=EVICT
                )
            else:
                full = n - n % SUB
                for s in range(0, full, SUB):  # whole vectors: no mask
                    tl.store(buf_ptr + start + s + offs, zeros, cache_modifier=CACHE, eviction_policy=EVICT)
                if full < n:  # the tail: masked
                    idx = full + offs
                    dst = buf_ptr + start + idx
                    tl.store(dst, zeros, mask=idx < n, cache_modifier=CACHE, eviction_policy=EVICT)
        elif live & ((gid < 0) | (gid >= id_limit)):
            tl.atomic_add(err_ptr, 1)
            tl.atomic_xchg(err_ptr + 1, gid)
    else:  # a capped, persistent grid strides over the items
        nprog = tl.num_programs(0).to(tl.int64)
        if COUNTED:  # noqa: SIM108 (a constexpr branch: Triton specialises it away)
            total = tl.load(count_ptr).to(tl.int64) * num_units
        else:
            total = total_items
        for u in range(pid, total, nprog):
            i = u // num_units
            w = u - i * num_units
            # the unit's loads do not depend on the id: issued together with it, one memory latency
            gid = tl.load(ids_ptr + i).to(tl.int64)
            ubase = tl.load(ubase_ptr + w)
            ustride = tl.load(ustride_ptr + w)
            n = tl.load(uwords_ptr + w)
            bid = gid - id_lo
            if (bid >= 0) & (bid < num_blocks):
                start = ubase + bid * ustride
                if ALIGNED:
                    start = tl.multiple_of(start, 4)
                    n = tl.multiple_of(n, 4)
                full = n - n % SUB
                for s in range(0, full, SUB):  # whole vectors: no mask
                    tl.store(buf_ptr + start + s + offs, zeros, cache_modifier=CACHE, eviction_policy=EVICT)
                if full < n:  # the tail: masked
                    idx = full + offs
                    dst = buf_ptr + start + idx
                    tl.store(dst, zeros, mask=idx < n, cache_modifier=CACHE, eviction_policy=EVICT)
            elif (gid < 0) | (gid >= id_limit):
                tl.atomic_add(err_ptr, 1)
                tl.atomic_xchg(err_ptr + 1, gid)


@jit(do_not_specialize=["n", "id_lo", "num_blocks", "id_limit"])
def route_ids_kernel(
    ids_ptr,  # int32/int64 [n] global block ids (device)
    out_ptr,  # int64 [>= n] out: this buffer's local ids, packed at the front (any order)
    count_ptr,  # int32 [1] in: 0 (reset before the launch); out: how many were packed
    err_ptr,  # int64 [2] (count of bad ids, last bad id), as zero_units_kernel's
    n,
    id_lo,  # ids [id_lo, id_lo + num_blocks) are this buffer's, as id - id_lo
    num_blocks,
    id_limit,  # ids outside [0, id_limit) are errors; the rest belong to other shards
    BLOCK: tl.constexpr,
):
    """One program per ``BLOCK`` ids: pack the ids this shard owns (as local ids) and count them.

    The zero kernel then walks ``count * W`` items, so ids owned by other shards cost one
    read here instead of ``W`` work items there (G-way block sharding sees G x the ids).
    """
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    gid = tl.load(ids_ptr + offs, mask=m, other=0).to(tl.int64)
    local = gid - id_lo
    own = m & (local >= 0) & (local < num_blocks)
    own_i = own.to(tl.int32)
    base = tl.atomic_add(count_ptr, tl.reduce(own_i, 0, _SUM))
    tl.store(out_ptr + base + tl.associative_scan(own_i, 0, _SUM) - 1, local, mask=own)
    bad = m & ((gid < 0) | (gid >= id_limit))
    nbad = tl.reduce(bad.to(tl.int64), 0, _SUM)
    if nbad > 0:
        tl.atomic_add(err_ptr, nbad)
        tl.atomic_xchg(err_ptr + 1, tl.reduce(tl.where(bad, gid, -(2**62)), 0, _MAX))
