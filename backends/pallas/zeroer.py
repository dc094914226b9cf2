"""JAX-style wrapper: ``zero_blocks(buf, block_ids) -> buf``, jitted with donation.

The buffer is ``int32[rows, 128]`` (one row = 512 B, the TPU DMA granularity) holding the
layout at byte ``offset``; :meth:`PallasZeroer.buffer_shape` gives the rows needed. The
kernel is chosen from JAX's default device: the Mosaic TPU kernel on TPUs, the Triton
lowering on NVIDIA GPUs, and on the CPU the TPU kernel in Pallas's TPU interpret mode
(race detection on, NaN-initialised scratch) so the TPU code path is what runs.

Both kernels work with ``jax_enable_x64`` on or off: ids are int32 inside the kernels,
and ids of wider dtypes are range-checked before they are narrowed, so none wraps into
``[0, num_blocks)``.
"""

from __future__ import annotations

import operator
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kvlayout.errors import BackendError, BlockIdError, LayoutBufferError, TableError, bad_value
from kvlayout.hardware import jax_platform
from kvlayout.ranges import INT32_MAX
from kvlayout.reference import normalize_block_ids
from kvlayout.table import SegmentTable, check_table
from kvlayout.validate import MAX_IDS, check_int, check_option, id_element_why, is_int, plain_str
from kvlayout.verify import require_safe

from .kernels import (
    check_triton_int32,
    check_triton_rows,
    effective_chunk_rows,
    tpu_zero_call,
    triton_units,
    triton_vector_width,
    triton_zero_call,
)
from .plan import LANES, ROW_BYTES, RowPlan, check_rows_disjoint_per_block, plan_rows

KERNELS = ("tpu", "triton")
INT32_MIN = -(2**31)


def default_kernel() -> tuple[str, bool]:
    """(kernel, interpret) for JAX's default device."""
    plat = jax_platform()
    if plat == "tpu":
        return "tpu", False
    if plat in ("gpu", "cuda"):
        return "triton", False
    return "tpu", True


def kernel_mode(kernel: str, interpret: bool) -> str:
    """The mode a Pallas zeroer reports: its kernel, native or interpreted."""
    if kernel == "tpu":
        return "tpu-interpret" if interpret else "native"
    return "triton-interpret" if interpret else "native-gpu"


def ids_in_range(ids: jax.Array, limit: int) -> tuple[jax.Array, jax.Array]:
    """Traceable: ``(int32 ids, ids in [0, limit))`` for integer ids of any dtype.

    The range is checked in the ids' own dtype before narrowing (out-of-range slots become
    0 and are masked off), so an int64 id such as ``2**32 + 3`` is counted bad instead of
    wrapping to block 3.
    """
    if jnp.iinfo(ids.dtype).max <= INT32_MAX:  # exact in int32; also keeps ``limit`` representable
        ids = ids.astype(jnp.int32)
    ok = (ids >= 0) & (ids < limit)
    return jnp.where(ok, ids, 0).astype(jnp.int32), ok


#: What a traced step takes as block ids (the contract of ``__call__``, :func:`kvlayout.validate.block_ids`,
#: plus JAX values): anything else is refused by name, never converted.
IDS_WHY = "must be a list, tuple or integer NumPy array of block ids, or a jax.Array (nothing was written)"


def step_ids(block_ids: Any) -> Any:
    """``block_ids`` as an array for a traced step, host ids narrowed to int32 without wrapping.

    A ``jax.Array`` (or tracer) is returned as is: its values are checked in the traced
    code (:func:`ids_in_range`). Host ids are what ``__call__`` takes: a list or tuple of
    integers (Python or NumPy; JAX scalars may stand beside them) or an integer NumPy array;
    anything else (a torch tensor, ``array.array``, ``range``, bytes-like objects, floats,
    bools, int subclasses whose ``int()`` and ``__index__()`` disagree) is refused naming the
    field. Host ids are checked in NumPy first, because ``jnp.asarray`` narrows 64-bit ids to
    int32 with x64 off, at trace time too (``2**32 + 3`` would become block 3): every id outside
    int32 becomes ``-1``, a bad id the step counts and never writes.
    """
    if isinstance(block_ids, jax.Array):
        return block_ids
    if isinstance(block_ids, (list, tuple)):
        return _list_ids(block_ids)
    if not isinstance(block_ids, (np.ndarray, np.generic)):  # torch, array.array, range, bytes, ...
        kind = type(block_ids).__name__
        raise bad_value(BlockIdError, "block_ids", block_ids, f"{IDS_WHY}; got a {kind}")
    arr = np.asarray(block_ids)  # a subclass (masked, matrix) as its data, as __call__ reads it
    if arr.dtype.kind not in "iu":  # object, timedelta64 (an np.integer subdtype), datetime64, strings,
        # bytes, records, complex (issue 25), floats, bools: named by the dtype given, before JAX narrows it
        why = f"must be an integer array, got dtype {arr.dtype}"
        raise bad_value(BlockIdError, "block_ids.dtype", str(arr.dtype), why, shown=str(arr.dtype))
    if arr.ndim != 1:  # before narrowing, so the message shows the dtype given
        raise BlockIdError(
            f"block_ids: must be a 1-D integer array, got {arr.dtype}{tuple(arr.shape)}",
            field="block_ids",
            value=str(arr.dtype),
        )
    if arr.size > MAX_IDS:  # a broadcast view of 2**40 ids: the mask below raised NumPy's 1 TiB MemoryError
        # (pass 33; __call__ refuses them through validate.block_ids)
        raise bad_value(BlockIdError, "block_ids.size", arr.size, f"at most {MAX_IDS} ids in one call")
    if np.iinfo(arr.dtype).max > INT32_MAX:
        fits = arr <= INT32_MAX if arr.dtype.kind == "u" else (arr >= INT32_MIN) & (arr <= INT32_MAX)
        out = np.full(arr.shape, -1, np.int32)  # not np.where(fits, arr, -1): NumPy 2 refuses -1 as uint64
        out[fits] = arr[fits]
        return jnp.asarray(out)
    return jnp.asarray(arr)


def _plain(v: Any) -> int:
    """An integer element (checked by :func:`is_int`) as a plain ``int``: its comparisons are Python's own,
    not those of an ``int`` subclass that may override them."""
    return int.__int__(operator.index(v))


def _fit32(v: int) -> int:
    """A plain int id, or ``-1`` (a bad id) where it does not fit int32."""
    return v if INT32_MIN <= v <= INT32_MAX else -1


def _list_ids(block_ids: list[Any] | tuple[Any, ...]) -> Any:
    """A list or tuple of host integers (JAX values may stand beside them) as ids; ids outside int32
    become ``-1``. An element that is neither is refused by its index, before anything is converted."""
    if not block_ids:
        return jnp.zeros((0,), jnp.int32)
    if all(type(v) is int or is_int(v) for v in block_ids):  # no bools, no tracers, no timedeltas
        return jnp.asarray(np.array([_fit32(_plain(v)) for v in block_ids], np.int32))
    for i, v in enumerate(block_ids):
        if isinstance(v, jax.Array):
            if v.dtype == jnp.bool_:  # a bool beside ints would become block 0 or 1 (issue 25)
                raise bad_value(BlockIdError, f"block_ids[{i}]", v, "must be an integer block id, not a bool")
            if _integer_dtype(v.dtype):
                refuse_narrowed(v.dtype, f"block_ids[{i}].dtype")
        elif not is_int(v):  # 0-d arrays, torch tensors, floats, strings, None, lying int subclasses
            raise bad_value(BlockIdError, f"block_ids[{i}]", v, id_element_why(v))
    if not all(v.ndim == 0 and _integer_dtype(v.dtype) for v in block_ids if isinstance(v, jax.Array)):
        why = "must be a 1-D integer array of block ids (nothing was written)"  # e.g. a 1-D JAX value beside
        raise bad_value(BlockIdError, "block_ids", block_ids, why)
    # each element narrowed to int32 on its own, never by JAX's promotion of the list: an int4 scalar beside
    # 19 made the list int4 and 19 block 3 (issue 25, eighteenth pass); a JAX id outside int32 becomes -1
    return jnp.stack(
        [_fit32_jax(v) if isinstance(v, jax.Array) else np.int32(_fit32(_plain(v))) for v in block_ids]
    )


def _integer_dtype(dtype: Any) -> bool:
    """An integer dtype of ids: not bool, not NumPy's timedelta64 (a subclass of its signed integers)."""
    return bool(jnp.issubdtype(dtype, jnp.integer)) and np.dtype(dtype).kind != "m"  # int4 is kind "V"


def _fit32_jax(v: jax.Array) -> jax.Array:
    """Traceable: a 0-d integer JAX id as int32, ``-1`` where it does not fit (checked in its own dtype)."""
    ids32, ok = ids_in_range(v.reshape(1), INT32_MAX)  # [0, 2**31 - 1): the largest valid id is below it
    return jnp.where(ok, ids32, -1)[0]


def check_num_ids(num_ids: Any) -> int:
    """``lower``'s batch size: an integer in ``[0, 2**31 - 1]`` (a negative, float or huge value
    raised JAX's TypeError / OverflowError; issue 25)."""
    return check_int(BlockIdError, "num_ids", num_ids, lo=0, hi=INT32_MAX)


def check_id_array(ids: Any, field: str = "block_ids") -> None:
    """Device ids must be a 1-D integer array (values are checked in the kernel)."""
    if ids.ndim != 1 or not _integer_dtype(ids.dtype):
        raise BlockIdError(
            f"{field}: must be a 1-D integer array, got {ids.dtype}{tuple(ids.shape)}",
            field=field,
            value=str(ids.dtype),
        )
    if isinstance(ids, jax.Array):  # (NumPy ids keep their values: narrowed on the host, step_ids)
        refuse_narrowed(ids.dtype, f"{field}.dtype")


def refuse_narrowed(dtype: Any, field: str) -> None:
    """64-bit ids JAX would narrow to 32 bits (made while x64 was on, used with it off): every jit and jnp op
    canonicalises them first, so 2**32 + 3 became block 3 with no bad id counted (pass 33)."""
    if np.dtype(dtype).itemsize > 4 and jax.dtypes.canonicalize_dtype(dtype) != np.dtype(dtype):
        why = "64-bit ids with jax_enable_x64 off, which JAX narrows: pass int32 ids (nothing written)"
        raise bad_value(BlockIdError, field, str(dtype), why, shown=str(dtype))


def masked_ids(ids: Any, valid: Any, limit: int) -> tuple[jax.Array, jax.Array]:
    """Traceable: ``(int32 ids, slots to write)`` for ``ids`` masked by ``valid``, as the public
    masked entries take them. ``ids``: a 1-D integer array of any integer dtype (else refused at trace
    time, naming ``ids``); ``valid``: bool (or integer, nonzero = valid) of the same shape. A slot is
    written only where valid and its id is in ``[0, limit)``, checked in the ids' own dtype before
    narrowing, so no wide id wraps into the pool."""
    for name, x in (("ids", ids), ("valid", valid)):
        if not isinstance(x, (jax.Array, np.ndarray)):
            raise bad_value(BlockIdError, name, type(x).__name__, "must be a jax.Array")
    check_id_array(ids, "ids")
    if isinstance(ids, np.ndarray):  # int32 on the host, -1 where an id does not fit: JAX's own narrowing
        ids = step_ids(ids)  # of 64-bit ids with x64 off wraps 2**32 + 3 to 3 (pass 33)
    if valid.dtype != jnp.bool_ and not jnp.issubdtype(valid.dtype, jnp.integer):
        shown = f"{valid.dtype}{tuple(valid.shape)}"
        raise bad_value(BlockIdError, "valid", shown, "must be a bool array", shown=shown)
    if tuple(valid.shape) != tuple(ids.shape):
        why = f"must have the shape of ids {tuple(ids.shape)} (a mask is never broadcast)"
        raise bad_value(BlockIdError, "valid.shape", tuple(valid.shape), why)
    ids32, ok = ids_in_range(ids, limit)
    return ids32, ok & (valid if valid.dtype == jnp.bool_ else valid != 0)


def device_order(sharding: Any) -> tuple[Any, ...] | None:
    """The devices of a single-device or named sharding, in order (``None``: another kind, left to JAX)."""
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return tuple(sharding.device_set)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return tuple(sharding.mesh.devices.flat)
    return None


def check_ids_devices(ids: Any, want: tuple[Any, ...] | None, where: str, field: str = "block_ids") -> None:
    """Concrete device ids committed to other devices than ``want`` (those of ``where``) are refused by
    name before dispatch: JAX's own refusal was a raw ``ValueError`` ("incompatible devices"). Uncommitted
    ids, tracers and shardings of other kinds are left to JAX (it moves uncommitted ids)."""
    if want is None or not isinstance(ids, jax.Array) or isinstance(ids, jax.core.Tracer):
        return
    if not ids.committed:
        return
    got = device_order(ids.sharding)
    if got is None or got == want:
        return
    shown = ", ".join(str(d) for d in got)
    if set(got) == set(want):
        why = f"are committed to the devices of {where} in another order ({shown})"
    else:
        why = f"are committed to {shown}, not the devices of {where} ({', '.join(str(d) for d in want)})"
    why += ": jax.device_put them there, or pass host ids (nothing was written)"
    raise bad_value(BlockIdError, field, shown, why, shown=f"<{shown}>")


def bucket_ids(host: np.ndarray) -> np.ndarray:
    """Validated unique host ids padded (with duplicates of the first) to a power of two >= 8.

    Few distinct shapes, so steps with different batch sizes do not retrace; duplicates are
    taken once by the kernel. Ids are checked to fit int32 before the cast.
    """
    if host.size and (int(host.min()) < 0 or int(host.max()) > INT32_MAX):
        bad = int(host.max()) if int(host.max()) > INT32_MAX else int(host.min())
        raise BlockIdError(f"block_ids: id {bad} does not fit int32", field="block_ids", value=bad)
    bucket = max(8, 1 << int(host.size - 1).bit_length())
    padded = np.full(bucket, host[0], np.int32)
    padded[: host.size] = host
    return padded


class BadIdCount:
    """The device-side count of out-of-range ids, summed over steps without a host sync.

    Thread safe: steps in several threads may add while another thread checks; every bad id
    is reported by exactly one :meth:`check`.
    """

    def __init__(self) -> None:
        self._err: jax.Array | None = None
        self._lock = threading.Lock()

    def add(self, err: jax.Array) -> None:
        with self._lock:
            self._err = err if self._err is None else self._err + err

    def step(self, fn: Any) -> Any:
        """``out, count = fn(count)`` under the lock, keeping ``count``: a step's own jitted call
        adds its batch's bad ids to the running count, so no extra dispatch and no host read."""
        with self._lock:
            acc = jnp.zeros((), jnp.int32) if self._err is None else self._err
            out, self._err = fn(acc)
        return out

    def check(self, num_blocks: int, consequence: str) -> None:
        """Raise if any step counted bad ids (synchronises; resets)."""
        with self._lock:
            err, self._err = self._err, None
        if err is None:
            return
        count = int(err)
        if count:
            raise BlockIdError(
                f"device block_ids: {count} ids outside [0, {num_blocks}); {consequence}",
                field="block_ids",
                value=count,
            )


#: TPU interpret mode keeps its simulated memory in process-wide state set up and torn down
#: by every call, so two interpreted calls must never overlap (threads): see :func:`run_step`.
_TPU_INTERPRET_LOCK = threading.Lock()


def _refuse_interpret_on_cpu0(buf: jax.Array) -> None:
    """TPU interpret mode stages its callbacks on cpu:0: a buffer spread over several host devices including
    cpu:0 hung in XLA's rendezvous, then aborted the process (pass 39), as a mesh holding cpu:0 does."""
    devices = buf.sharding.device_set
    if len(devices) > 1 and jax.local_devices(backend="cpu")[0] in devices:
        raise BackendError(
            "buffer: spread over several devices including cpu:0, which TPU interpret mode deadlocks on: use "
            "ShardedPallasZeroer over a mesh of jax.devices()[1:], or kernel='triton'",
            field="buffer.sharding", value=len(devices),
        )


def run_step(serialise: bool, fn: Any, *args: Any) -> Any:
    """``fn(*args)``; with ``serialise`` (TPU interpret mode) under a process-wide lock and
    waited for, so no other thread's interpreted call runs meanwhile."""
    if not serialise:
        return fn(*args)
    with _TPU_INTERPRET_LOCK:
        return jax.block_until_ready(fn(*args))


def interpret_params() -> Any:
    """TPU interpret mode with race detection and NaN-initialised scratch (every Pallas zeroer)."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan")


def check_not_donated(buf: jax.Array) -> None:
    """A concrete buffer donated to an earlier call (or deleted) is refused by name before anything
    runs: JAX's own refusal was a bare ``RuntimeError`` ("Array has been deleted")."""
    if not isinstance(buf, jax.core.Tracer) and buf.is_deleted():
        why = "was donated to an earlier call (or deleted): pass the buffer that call returned"
        raise bad_value(LayoutBufferError, "buffer", "deleted", why)


def check_int32_array(buf: Any) -> None:
    """A zeroer's buffer is a ``jax.Array`` of int32 (shape and rows are checked by the caller)."""
    if not isinstance(buf, jax.Array):
        kind = type(buf).__name__
        raise LayoutBufferError(f"buffer type = {kind}: must be a jax.Array", field="buffer", value=kind)
    if buf.dtype != jnp.int32:
        raise LayoutBufferError(
            f"buffer dtype = {buf.dtype}: must be int32 (view other dtypes as int32 rows)",
            field="buffer.dtype",
            value=str(buf.dtype),
        )


class PallasZeroer:
    """Zero block ids of ``int32[rows, 128]`` buffers laid out by ``table``.

    Construct once (the table is verified and planned into row items on the host), then
    call ``zeroer(buf, block_ids) -> buf`` every step: host ids are validated first
    (error, nothing runs); a ``jax.Array`` of ids is used as is and checked in the kernel
    (out-of-range ids write nothing; :meth:`check` raises). Inside a user's own
    ``jax.jit`` use :meth:`apply`, which returns ``(buf, bad_id_count)``.

    Thread safe: several threads may call one zeroer at once, each with its own buffer (the
    kernel cache and the bad-id count are locked; in TPU interpret mode, whose simulator is
    process-wide, calls are serialised and waited for). A buffer is donated, so calls on one
    buffer must be chained by the caller: the result of one is the input of the next.
    Inside a user's jit (:meth:`apply`) in TPU interpret mode, do not run two steps at once.
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
        group: str | None = None,
        dedup: bool = False,  # H200 sweep, bench/results/h200-pallas-sweep: no sort, vector stores,
        vector: bool = True,  # units on grid x: 0.93-1.01x the cuda kernel at 64-16,384 ids
        unit_major: bool = True,
        evict_first: bool = False,
    ) -> None:
        check_table(table)  # a SegmentTable itself: a subclass's methods pick the rows written (pass 24)
        if group is not None and not isinstance(group, str):
            msg = f"group = {group!r}: must be a group name (str) or None"
            raise TableError(msg, field="group", value=repr(group))
        group = plain_str(group)  # a str subclass's own __eq__ may lie (pass 25)
        if not is_int(offset) or offset < 0 or offset % 4:
            msg = f"offset = {offset!r}: must be a non-negative multiple of 4"
            raise LayoutBufferError(msg, field="offset", value=offset)
        offset = int(offset)  # NumPy integers taken as Python ints: the row plan never wraps
        tile_rows = check_option("tile_rows", tile_rows, limit=1 << 16)
        self.ids_per_step = check_option("ids_per_step", ids_per_step, limit=1 << 16)
        self.chunk_rows = check_option("chunk_rows", chunk_rows, power_of_two=True, limit=1 << 16)
        self.num_warps = check_option("num_warps", num_warps, power_of_two=True, limit=32)
        #: GPU kernel: None = a program per (id slot, unit); N = N persistent programs over live items
        self.programs = None if programs is None else check_option("programs", programs)
        flags = {"coalesce": coalesce, "dedup": dedup, "vector": vector, "unit_major": unit_major,
                 "evict_first": evict_first}
        for name, flag in flags.items():
            if not isinstance(flag, bool):
                raise BackendError(f"{name} = {flag!r}: must be True or False", field=name, value=flag)
        #: GPU kernel options (the TPU kernel ignores them; it always sorts and deduplicates):
        #: dedup=False passes ids as they come (no sort; duplicates zeroed twice, bad ids
        #: counted in the kernel); vector: 16-byte stores where the table allows;
        #: unit_major: units on grid x; evict_first: stores with that eviction policy
        self.dedup, self.vector, self.unit_major = dedup, vector, unit_major
        self.evict_first = evict_first
        if interpret is not None and not isinstance(interpret, bool):
            msg = f"interpret = {interpret!r}: must be True, False or None"
            raise BackendError(msg, field="interpret", value=interpret)
        if kernel is not None and kernel not in KERNELS:
            msg = f"kernel = {kernel!r}: valid kernels: {', '.join(KERNELS)}"
            raise LayoutBufferError(msg, field="kernel", value=kernel)
        require_safe(table)
        self.table = table
        #: the cache group whose rows this zeroer clears (None: all; GEOMETRY.md section 7)
        self.group = group
        rows = table.for_group(group)
        self.kernel_table = rows.coalesced() if coalesce else rows
        check_rows_disjoint_per_block(self.kernel_table)
        self.offset = offset
        auto_kernel, auto_interp = default_kernel()
        self.kernel = kernel or auto_kernel
        self.interpret = auto_interp if interpret is None else interpret
        self.plan: RowPlan = plan_rows(self.kernel_table, offset, tile_rows)
        self.rows = self.plan.rows_needed
        if self.kernel == "triton":  # refuse now what the kernel's int32 arithmetic cannot hold
            chunk = effective_chunk_rows(self.rows, self.chunk_rows)
            units = triton_units(self.kernel_table, offset, chunk)
            check_triton_int32(units, self.kernel_table, self.rows, chunk)
        #: lanes per masked store group of the GPU kernel (4: 16-byte stores), 1 elsewhere
        self.vector_width = triton_vector_width(units) if self.kernel == "triton" and vector else 1
        self._lock = threading.Lock()
        self._calls: dict[tuple[int, int, bool], Any] = {}
        self._jitted = jax.jit(self.apply, donate_argnums=0)
        #: the per-call step: (buf, ids, running bad-id count) -> (buf, count), one dispatch
        self._step = jax.jit(self._step_fn, donate_argnums=0)
        self._bad = BadIdCount()
        self._buffer_ok: tuple[int, int] | None = None  # the last buffer shape accepted

    # ---- description --------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return kernel_mode(self.kernel, bool(self.interpret))

    @property
    def buffer_shape(self) -> tuple[int, int]:
        """Smallest ``int32[rows, 128]`` shape that holds the layout at ``offset``."""
        return (self.rows, LANES)

    def _check_buffer(self, buf: Any) -> None:
        check_int32_array(buf)
        check_not_donated(buf)  # apply and apply_masked too (JAX's raw RuntimeError before: issue 25)
        if self.kernel == "tpu" and self.interpret and not isinstance(buf, jax.core.Tracer):
            _refuse_interpret_on_cpu0(buf)
        if buf.shape == self._buffer_ok:
            return
        if buf.ndim != 2 or buf.shape[1] != LANES:
            raise LayoutBufferError(
                f"buffer shape = {tuple(buf.shape)}: must be (rows, 128)",
                field="buffer.shape",
                value=tuple(buf.shape),
            )
        if buf.shape[0] < self.rows:
            raise LayoutBufferError(
                f"buffer rows = {buf.shape[0]}: the layout needs {self.rows} rows "
                f"({self.rows * ROW_BYTES} B for offset "
                f"{self.offset} + total_bytes {self.table.total_bytes})",
                field="buffer.shape",
                value=tuple(buf.shape),
            )
        if self.kernel == "triton":  # before anything is traced or donated
            check_triton_rows(buf.shape[0], effective_chunk_rows(buf.shape[0], self.chunk_rows))
        self._buffer_ok = tuple(buf.shape)

    # ---- the traced step ------------------------------------------------------------------
    @property
    def direct(self) -> bool:
        """Whether steps pass ids to the kernel as they come (GPU kernel, ``dedup=False``)."""
        return self.kernel == "triton" and not self.dedup

    def _call_for(self, n_pad: int, total_rows: int, direct: bool = False) -> Any:
        key = (n_pad, total_rows, direct)
        with self._lock:
            if key not in self._calls:
                if self.kernel == "tpu":
                    interp = interpret_params() if self.interpret else False
                    self._calls[key] = tpu_zero_call(self.plan, n_pad, self.ids_per_step, interp)
                else:
                    self._calls[key] = triton_zero_call(
                        self.kernel_table,
                        self.offset,
                        total_rows,
                        self.chunk_rows,
                        self.num_warps,
                        self.interpret,
                        self.programs,
                        direct=direct,
                        vector=self.vector,
                        unit_major=self.unit_major,
                        evict_first=self.evict_first,
                    )
            return self._calls[key]

    def apply(self, buf: jax.Array, block_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Traceable step: ``(buf, ids int32[n]) -> (buf, number of out-of-range ids)``."""
        self._check_buffer(buf)
        ids = step_ids(block_ids)
        check_id_array(ids)
        self._check_ids_devices(buf, ids)
        if ids.shape[0] == 0:
            return buf, jnp.zeros((), jnp.int32)
        if self.direct and len(self.kernel_table) and jnp.iinfo(ids.dtype).max <= INT32_MAX:
            # one launch: the kernel skips and counts out-of-range ids itself
            out, bad = self._call_for(ids.shape[0], buf.shape[0], True)(ids.astype(jnp.int32), buf)
            return out, bad[0]
        ids32, ok = ids_in_range(ids, self.table.num_blocks)
        bad = jnp.sum(~ok).astype(jnp.int32)
        return self._zero_masked(buf, ids32, ok), bad

    def apply_masked(self, buf: jax.Array, ids: jax.Array, valid: jax.Array) -> jax.Array:
        """Traceable: zero ``ids[valid]`` (integer ``[n]``, bool ``[n]``); invalid slots are skipped.

        Used by the sharded zeroer, where ids owned by other shards are not errors. The buffer is
        checked as :meth:`apply` checks it (int32, ``(rows >= buffer_shape[0], 128)``; static under trace),
        the ids as :meth:`apply` takes them: an integer dtype (else refused), and an id outside
        ``[0, num_blocks)`` (int32 included) writes nothing, checked before kvlayout narrows it (a NumPy
        int64 array passed through the user's own jit with x64 off is narrowed by JAX at that boundary,
        before kvlayout sees it: pass host ids outside the jit, or run with x64 on throughout; a 64-bit
        ``jax.Array`` made with x64 on and used with it off is refused, since JAX narrows it too).
        """
        self._check_buffer(buf)
        if not isinstance(buf, jax.core.Tracer) and buf.committed:  # eager: JAX's refusal was raw
            for name, x in (("ids", ids), ("valid", valid)):
                check_ids_devices(x, device_order(buf.sharding), "the buffer", name)
        ids32, ok = masked_ids(ids, valid, self.table.num_blocks)
        return self._zero_masked(buf, ids32, ok)

    def _zero_masked(self, buf: jax.Array, ids: jax.Array, valid: jax.Array) -> jax.Array:
        """:meth:`apply_masked` on checked input: int32 ids, bool ``valid`` only where in range."""
        n = ids.shape[0]
        if len(self.kernel_table) == 0 or n == 0:  # only mamba layers (no rows), or no ids: nothing to write
            return buf
        if self.direct and self.programs is None:
            # invalid slots become -1: skipped by the kernel (its bad count is not wanted here).
            # The persistent grid keeps the sorted path below: sorting puts the live slots
            # first, so it walks only those (ids of other shards cost nothing).
            ids = jnp.where(valid, ids, -1).astype(jnp.int32)
            out, _ = self._call_for(n, buf.shape[0], True)(ids, buf)
            return out
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

    @staticmethod
    def _check_ids_devices(buf: Any, ids: Any) -> None:
        """Concrete ids committed to other devices than a concrete committed buffer: refused by name."""
        if isinstance(buf, jax.core.Tracer) or not buf.committed:
            return
        check_ids_devices(ids, device_order(buf.sharding), "the buffer")

    # ---- per step -------------------------------------------------------------------------
    def __call__(self, buf: jax.Array, block_ids: Any) -> jax.Array:
        """Zero ``block_ids`` in ``buf`` (donated) and return the buffer.

        One jitted dispatch per call: host ids are validated and padded to a power-of-two
        bucket (no retrace between batch sizes) and travel as the step's argument; the
        bad-id count stays on the device (no host read until :meth:`check`).
        """
        self._check_buffer(buf)
        if isinstance(block_ids, jax.Array):
            ids: Any = block_ids
            check_id_array(ids)
            self._check_ids_devices(buf, ids)
        else:
            host = np.unique(normalize_block_ids(block_ids, self.table.num_blocks))
            if host.size == 0:
                return buf
            ids = bucket_ids(host)  # the step's call transfers it
        if ids.shape[0] == 0:
            return buf
        return self._bad.step(lambda acc: run_step(self.serialised, self._step, buf, ids, acc))

    def _step_fn(self, buf: jax.Array, ids: jax.Array, acc: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The jitted per-call step: zero, and add the batch's bad ids to the running count."""
        out, bad = self.apply(buf, ids)
        return out, acc + bad

    @property
    def serialised(self) -> bool:
        """Whether calls hold the process-wide TPU-interpret lock (the TPU kernel in interpret mode)."""
        return self.kernel == "tpu" and bool(self.interpret)

    zero_blocks = __call__

    def lower(self, num_ids: int, device: Any = None) -> Any:
        """Lower the jitted step for ``num_ids`` ids on ``device`` (e.g. a TPU topology device).

        ``lower(...).compile()`` runs the real backend compiler (Mosaic for TPUs) without
        running anything, which is how the TPU kernel is compiled in CI without a TPU.
        """
        num_ids = check_num_ids(num_ids)
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
