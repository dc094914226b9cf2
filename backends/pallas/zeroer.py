"""JAX-style wrapper: ``zero_blocks(buf, block_ids) -> buf``, jitted with donation.

The buffer is ``int32[rows, 128]`` (one row = 512 B, the TPU DMA granularity) holding the
layout at byte ``offset``; :meth:`PallasZeroer.buffer_shape` gives the rows needed. The
kernel is chosen from JAX's default device: the Mosaic TPU kernel on TPUs, the Triton
lowering on NVIDIA GPUs, and on the CPU the TPU kernel in Pallas's TPU interpret mode
(race detection on, NaN-initialised scratch) so the TPU code path is what runs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kvlayout.errors import BlockIdError, LayoutBufferError
from kvlayout.hardware import jax_platform
from kvlayout.reference import normalize_block_ids
from kvlayout.table import SegmentTable
from kvlayout.verify import require_safe

from .kernels import tpu_zero_call, triton_zero_call
from .plan import LANES, ROW_BYTES, RowPlan, check_rows_disjoint_per_block, plan_rows

KERNELS = ("tpu", "triton")


def default_kernel() -> tuple[str, bool]:
    """(kernel, interpret) for JAX's default device."""
    plat = jax_platform()
    if plat == "tpu":
        return "tpu", False
    if plat in ("gpu", "cuda"):
        return "triton", False
    return "tpu", True


def check_id_array(ids: Any) -> None:
    """Device ids must be a 1-D integer array (values are checked in the kernel)."""
    if ids.ndim != 1 or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise BlockIdError(f"block_ids: must be a 1-D integer array, got {ids.dtype}{tuple(ids.shape)}", field="block_ids", value=str(ids.dtype))


def bucket_ids(host: np.ndarray) -> np.ndarray:
    """Validated unique host ids padded (with duplicates of the first) to a power of two >= 8.

    Few distinct shapes, so steps with different batch sizes do not retrace; duplicates are
    taken once by the kernel.
    """
    bucket = max(8, 1 << int(host.size - 1).bit_length())
    padded = np.full(bucket, host[0], np.int32)
    padded[: host.size] = host
    return padded


class BadIdCount:
    """The device-side count of out-of-range ids, summed over steps without a host sync."""

    def __init__(self) -> None:
        self._err: jax.Array | None = None

    def add(self, err: jax.Array) -> None:
        self._err = err if self._err is None else self._err + err

    def check(self, num_blocks: int, consequence: str) -> None:
        """Raise if any step counted bad ids (synchronises; resets)."""
        if self._err is None:
            return
        count = int(self._err)
        self._err = None
        if count:
            raise BlockIdError(f"device block_ids: {count} ids outside [0, {num_blocks}); {consequence}", field="block_ids", value=count)


def _interpret_params() -> Any:
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan")


class PallasZeroer:
    """Zero block ids of ``int32[rows, 128]`` buffers laid out by ``table``.

    Construct once (the table is verified and planned into row items on the host), then
    call ``zeroer(buf, block_ids) -> buf`` every step: host ids are validated first
    (error, nothing runs); a ``jax.Array`` of ids is used as is and checked in the kernel
    (out-of-range ids write nothing; :meth:`check` raises). Inside a user's own
    ``jax.jit`` use :meth:`apply`, which returns ``(buf, bad_id_count)``.
    """

    def __init__(
        self,
        table: SegmentTable,
        *,
        offset: int = 0,
        coalesce: bool = True,
        kernel: str | None = None,
        interpret: bool | None = None,
        tile_rows: int = 128,
        ids_per_step: int = 64,
        chunk_rows: int = 16,  # H200 sweep: bench/results/h200-final/pallas_design_*.json
        num_warps: int = 4,
        programs: int | None = None,
    ) -> None:
        require_safe(table)
        self.table = table
        self.kernel_table = table.coalesced() if coalesce else table
        check_rows_disjoint_per_block(self.kernel_table)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset % 4:
            raise LayoutBufferError(f"offset = {offset!r}: must be a non-negative multiple of 4", field="offset", value=offset)
        self.offset = offset
        auto_kernel, auto_interp = default_kernel()
        self.kernel = kernel or auto_kernel
        if self.kernel not in KERNELS:
            raise LayoutBufferError(f"kernel = {self.kernel!r}: valid kernels: {', '.join(KERNELS)}", field="kernel", value=self.kernel)
        self.interpret = auto_interp if interpret is None else interpret
        self.plan: RowPlan = plan_rows(self.kernel_table, offset, tile_rows)
        self.rows = self.plan.rows_needed
        self.ids_per_step = ids_per_step
        self.chunk_rows = chunk_rows
        self.num_warps = num_warps
        #: GPU kernel: None = a program per (id slot, unit); N = N persistent programs over live items
        self.programs = programs
        self.trace_count = 0
        self._calls: dict[tuple[int, int], Any] = {}
        self._jitted = jax.jit(self._apply, donate_argnums=0)
        self._bad = BadIdCount()

    # ---- description --------------------------------------------------------------------
    @property
    def mode(self) -> str:
        if self.kernel == "tpu":
            return "tpu-interpret" if self.interpret else "native"
        return "triton-interpret" if self.interpret else "native-gpu"

    @property
    def buffer_shape(self) -> tuple[int, int]:
        """Smallest ``int32[rows, 128]`` shape that holds the layout at ``offset``."""
        return (self.rows, LANES)

    def _check_buffer(self, buf: Any) -> None:
        if not isinstance(buf, jax.Array):
            raise LayoutBufferError(f"buffer type = {type(buf).__name__}: must be a jax.Array", field="buffer", value=type(buf).__name__)
        if buf.dtype != jnp.int32:
            raise LayoutBufferError(f"buffer dtype = {buf.dtype}: must be int32 (view other dtypes as int32 rows)", field="buffer.dtype", value=str(buf.dtype))
        if buf.ndim != 2 or buf.shape[1] != LANES:
            raise LayoutBufferError(f"buffer shape = {tuple(buf.shape)}: must be (rows, 128)", field="buffer.shape", value=tuple(buf.shape))
        if buf.shape[0] < self.rows:
            raise LayoutBufferError(
                f"buffer rows = {buf.shape[0]}: the layout needs {self.rows} rows ({self.rows * ROW_BYTES} B for offset "
                f"{self.offset} + total_bytes {self.table.total_bytes})",
                field="buffer.shape",
                value=tuple(buf.shape),
            )

    # ---- the traced step ------------------------------------------------------------------
    def _call_for(self, n_pad: int, total_rows: int) -> Any:
        key = (n_pad, total_rows)
        if key not in self._calls:
            if self.kernel == "tpu":
                interp = _interpret_params() if self.interpret else False
                self._calls[key] = tpu_zero_call(self.plan, n_pad, self.ids_per_step, interp)
            else:
                self._calls[key] = triton_zero_call(
                    self.kernel_table, self.offset, total_rows, self.chunk_rows, self.num_warps, self.interpret, self.programs
                )
        return self._calls[key]

    def apply(self, buf: jax.Array, block_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Traceable step: ``(buf, ids int32[n]) -> (buf, number of out-of-range ids)``."""
        self._check_buffer(buf)
        ids = jnp.asarray(block_ids)
        check_id_array(ids)
        n = ids.shape[0]
        if n == 0:
            return buf, jnp.zeros((), jnp.int32)
        ids = ids.astype(jnp.int32)
        bad = jnp.sum((ids < 0) | (ids >= self.table.num_blocks)).astype(jnp.int32)
        return self.apply_masked(buf, ids, jnp.ones((n,), jnp.bool_)), bad

    def apply_masked(self, buf: jax.Array, ids: jax.Array, valid: jax.Array) -> jax.Array:
        """Traceable: zero ``ids[valid]`` (int32 ``[n]``, bool ``[n]``); invalid slots are skipped.

        Used by the sharded zeroer, where ids owned by other shards are not errors.
        """
        n = ids.shape[0]
        # invalid slots become num_blocks (out of range: the kernel skips them); sorting then
        # puts equal ids side by side, so each id is taken once
        s = jnp.sort(jnp.where(valid, ids, self.table.num_blocks))
        take = jnp.concatenate([jnp.ones((1,), jnp.int32), (s[1:] != s[:-1]).astype(jnp.int32)])
        count = jnp.sum(valid.astype(jnp.int32)).reshape(1)  # valid slots sort first (ids < num_blocks)
        step = self.ids_per_step if self.kernel == "tpu" else 1
        n_pad = -(-n // step) * step
        if n_pad != n:
            s = jnp.concatenate([s, jnp.zeros((n_pad - n,), jnp.int32)])
            take = jnp.concatenate([take, jnp.zeros((n_pad - n,), jnp.int32)])
        return self._call_for(n_pad, buf.shape[0])(s, take, count, buf)

    def _apply(self, buf: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        self.trace_count += 1
        return self.apply(buf, ids)

    # ---- per step -------------------------------------------------------------------------
    def __call__(self, buf: jax.Array, block_ids: Any) -> jax.Array:
        """Zero ``block_ids`` in ``buf`` (donated) and return the buffer."""
        self._check_buffer(buf)
        if isinstance(block_ids, jax.Array):
            ids = block_ids
        else:
            host = np.unique(normalize_block_ids(block_ids, self.table.num_blocks))
            if host.size == 0:
                return buf
            ids = jnp.asarray(bucket_ids(host))
        if ids.shape[0] == 0:
            return buf
        out, err = self._jitted(buf, ids)
        self._bad.add(err)
        return out

    zero_blocks = __call__

    def lower(self, num_ids: int, device: Any = None) -> Any:
        """Lower the jitted step for ``num_ids`` ids on ``device`` (e.g. a TPU topology device).

        ``lower(...).compile()`` runs the real backend compiler (Mosaic for TPUs) without
        running anything, which is how the TPU kernel is compiled in CI without a TPU.
        """
        sharding = jax.sharding.SingleDeviceSharding(device) if device is not None else None
        buf = jax.ShapeDtypeStruct(self.buffer_shape, jnp.int32, sharding=sharding)
        ids = jax.ShapeDtypeStruct((num_ids,), jnp.int32, sharding=sharding)
        return self._jitted.lower(buf, ids)

    def check(self) -> None:
        """Raise if any device-side id so far was out of range (synchronises; resets)."""
        self._bad.check(self.table.num_blocks, "they wrote nothing")


def zero_blocks(table: SegmentTable, buf: jax.Array, block_ids: Any, **kwargs: Any) -> jax.Array:
    """One-shot convenience: plan, then zero ``block_ids`` of ``buf`` (donated)."""
    return PallasZeroer(table, **kwargs)(buf, block_ids)
