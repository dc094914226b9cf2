"""Torch wrapper around the Triton zeroer: plan once per (table, buffer), launch every step.

A step does not synchronise the host. Host block ids (a list, tuple, NumPy array or CPU
tensor) are checked at C speed (``operator.countOf`` over their types, NumPy min/max; no
per-element Python loop) while being written straight into a pinned staging buffer, which
is then copied asynchronously into a device ids buffer. Natively, the copy and the launch
are one CUDA graph per (staging buffer, batch-size bucket, plan), captured at construction
(:meth:`CudaZeroer.capture`) and replayed each step: the live count travels with the ids and
the kernel walks only ``count * W`` work items. Buffers
come from small pools: a call owns its buffers from staging to launch, and a buffer is
reused only when no launch still in flight can read it (same stream for device-only
buffers, or the event recorded after its last use has completed); otherwise the pool grows
by one. In steady state nothing is allocated. Device id tensors are used as they are and
bounds-checked inside the kernel; :meth:`CudaZeroer.check` reports bad ones later.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import operator
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import numpy as np
import torch
import triton

from kvlayout.backend import check_offset_and_size
from kvlayout.errors import BackendError, BlockIdError, LayoutBufferError, TableError, short
from kvlayout.ranges import INT32_MAX
from kvlayout.reference import normalize_block_ids
from kvlayout.table import SegmentTable, check_table
from kvlayout.validate import MAX_IDS, check_option, is_int, plain_str
from kvlayout.verify import require_safe

from ._mode import DEVICE_TYPE, MODE, launch_guard
from .kernel import (
    MAX_GRID_X,
    MAX_GRID_Y,
    UnitPlan,
    launch_grid,
    plan_units,
    route_ids_kernel,
    zero_units_kernel,
)

#: Tuned on an H200 (bench/bench_write_ceiling.py --sweep, bench/results/h200-ceiling/run2-sweep/): one
#: program per work unit of at most 2,048 words (8 KB, one masked 16-byte store per thread of 8 warps)
#: was the fastest launch at 512-16,384 ids; persistent grids, larger units and loading the next item
#: during the stores were slower.
DEFAULT_CHUNK_WORDS = 2048
DEFAULT_SUB_WORDS = 4096
DEFAULT_NUM_WARPS = 8
DEFAULT_PROGRAMS_PER_SM = 2
DEFAULT_CACHE = ""
DEFAULT_EVICT = "evict_first"
#: Small batches: smaller work units (int32 words), largest first, until a batch has at least
#: ``FILL_WAVES * max_programs`` work items (one id in 8 KB units is 20 programs on dsv4).
SMALL_CHUNKS = (1024,)
FILL_WAVES = 0.5
#: Pinned + device id buffers whose replay graphs are captured up front (host batches in flight at once
#: before a call falls back to an eager launch).
GRAPH_RING = 4
#: Most id limits :meth:`CudaZeroer.check` names one by one (more: their range).
NAMED_BOUNDS = 8
#: Ids per program of the routing kernel.
ROUTE_BLOCK = 1024
#: Triton's store cache modifiers and eviction policies.
CACHE_MODIFIERS = ("", ".wb", ".cg", ".cs", ".wt")
EVICTION_POLICIES = ("", "evict_first", "evict_last")


def plain_ops() -> AbstractContextManager[Any]:
    """Torch functions disabled, and torch dispatch too where a mode is on its stack, while kvlayout reads
    tensors and launches: a caller's TorchFunctionMode answered ``numel()``, ``data_ptr()``, ``.to()`` and
    slicing for other ids or memory (passes 30, 31), and a TorchDispatchMode the aten ops under them
    (``aten.slice`` of the staged ids: blocks [0, 1, 2] zeroed for [1, 2]; of the buffer's view at
    construction: later calls wrote past the table, pass 32), inference mode and functorch's transforms
    off (below). Whether any is on is read first (0.1-0.2 us each) since the guards cost about 1.5 us and a
    serving step has none. Subclasses are refused already, so nothing else is given up."""
    if (
        torch._C._len_torch_dispatch_stack()
        or torch.is_inference_mode_enabled()
        or torch._C._are_functorch_transforms_active()
    ):
        return _no_modes()
    return torch._C.DisableTorchFunction()


@contextlib.contextmanager
def _no_modes() -> Iterator[None]:
    # inference mode off too: the zeroer's own tensors (error flags, id slots, plans) made under it were
    # inference tensors, and their in-place updates raised torch's error in every later call outside it;
    # and functorch's transforms: a plan built inside torch.func.functionalize held functional tensors,
    # and every later call raised torch's "invalid python storage" (pass 32)
    with (
        torch._C.DisableTorchFunction(),
        torch._C._DisableTorchDispatch(),
        torch._C._InferenceMode(False),
        torch._C._DisableFuncTorch(),
    ):
        yield


def _as_words(buffer: Any, table: SegmentTable, offset: int) -> torch.Tensor:
    """Validate ``buffer`` and return its layout bytes as an int32 ``[total_bytes/4]`` view, under
    :func:`plain_ops`: a caller's TorchFunctionMode answered ``numel()`` for a larger tensor, and 1 KiB was
    written past a smaller target (pass 30); a TorchDispatchMode's slice viewed the next block (pass 32)."""
    with plain_ops():
        return _buffer_words(buffer, table, offset)


def _buffer_words(buffer: Any, table: SegmentTable, offset: int) -> torch.Tensor:
    if not isinstance(buffer, torch.Tensor):
        raise LayoutBufferError(
            f"buffer type = {type(buffer).__name__}: must be a torch.Tensor",
            field="buffer",
            value=type(buffer).__name__,
        )
    if type(buffer) not in (torch.Tensor, torch.nn.Parameter):
        # a subclass's own numel / element_size / is_contiguous may lie: one whose element_size said 1 MiB
        # over an 8 KiB view passed the size check and the kernel wrote 149,504 B past it (issue 25, pass 24)
        cls_name = type(buffer).__name__
        why = "must be a plain torch.Tensor (a subclass may report sizes its memory does not have)"
        raise LayoutBufferError(f"buffer type = {cls_name}: {why}", field="buffer", value=cls_name)
    if buffer.device.type != DEVICE_TYPE:
        want = (
            "a CUDA device" if DEVICE_TYPE == "cuda" else "the CPU (Triton interpreter: no CUDA device here)"
        )
        raise LayoutBufferError(
            f"buffer device = {buffer.device}: must be on {want}",
            field="buffer.device",
            value=str(buffer.device),
        )
    # tensors whose bytes are not plain memory of their dtype: a quantized one's uint8 view segfaulted in
    # torch, conjugate/negative views and nested or sparse tensors raised torch's errors (issue 25)
    kind = next(
        (
            k
            for k, odd in (
                ("nested", buffer.is_nested),
                ("sparse", buffer.layout != torch.strided),
                ("quantized", buffer.is_quantized),
                ("conjugate view", buffer.is_conj()),
                ("negative view", buffer.is_neg()),
                ("ZeroTensor", buffer._is_zerotensor()),  # no memory behind it (pass 29)
            )
            if odd
        ),
        None,
    )
    if kind is not None:
        why = "must be a plain strided tensor (its bytes are the layout's)"
        raise LayoutBufferError(f"buffer = a {kind} tensor: {why}", field="buffer", value=kind)
    if not buffer.is_contiguous():
        raise LayoutBufferError("buffer: must be contiguous", field="buffer", value="non-contiguous")
    if buffer.data_ptr() % 4:
        raise LayoutBufferError(
            f"buffer data_ptr = {buffer.data_ptr():#x}: must be 4-byte aligned",
            field="buffer.data_ptr",
            value=buffer.data_ptr(),
        )
    nbytes = buffer.numel() * buffer.element_size()
    have = buffer.untyped_storage().nbytes()  # a storage shrunk behind its tensor (resize_): torch's raw
    if have < buffer.storage_offset() * buffer.element_size() + nbytes:  # error, not this one (pass 26)
        why = f"holds fewer bytes than the tensor's {nbytes} B at its storage offset (resized?)"
        raise LayoutBufferError(f"buffer storage = {have} B: {why}", field="buffer", value=have)
    offset = check_offset_and_size(offset, nbytes, table)  # a Python int: slicing never wraps
    if table.total_bytes == 0:  # an empty pool: nothing to view (an empty NumPy array's stride is 0)
        return buffer.new_empty((0,), dtype=torch.int32)
    flat = buffer.reshape(-1).view(torch.uint8)
    words = flat[offset : offset + table.total_bytes].view(torch.int32)
    # what the kernels will write is the buffer's own bytes at the offset (a mode's slice pointed it one
    # block further on and later calls wrote past the table, pass 32: the guard above stops that, this
    # proves it)
    if words.data_ptr() != buffer.data_ptr() + offset or words.numel() * 4 != table.total_bytes:
        why = f"does not view the buffer's {table.total_bytes} B at offset {offset}"
        raise LayoutBufferError(f"buffer view: {why}", field="buffer", value=words.data_ptr())
    return words


_DLPACK_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY of DLManagedTensorVersioned.flags
# own prototypes of the C API (setting restype on ctypes.pythonapi's shared functions would leak)
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _dlpack_read_only(obj: Any) -> bool:
    """Whether ``obj`` (an array or a DLPack capsule) declares its memory read-only.

    NumPy's flag is read directly; otherwise a DLPack 1.x (versioned) export is inspected:
    its ``flags`` word follows the version, manager context and deleter. Producers of
    unversioned capsules cannot say, and are taken as writeable.
    """
    if isinstance(obj, np.ndarray):
        return not obj.flags.writeable
    if hasattr(obj, "__dlpack__"):
        try:
            cap = obj.__dlpack__(max_version=(1, 0))
        except (TypeError, BufferError):
            return False
    else:
        cap = obj
    try:
        name = _capsule_name(cap)
    except (TypeError, ValueError):
        return False
    if name != b"dltensor_versioned":
        return False
    ptr = _capsule_pointer(cap, name)
    return bool(ctypes.c_uint64.from_address(ptr + 24).value & _DLPACK_READ_ONLY)


class _ReadOnlyExport(Exception):
    """The capsule a producer handed torch is flagged read-only."""


class _CheckedExport:
    """``obj`` as torch imports it, the read-only flag checked on the very capsule torch is given: a
    producer asked twice answered writeable (a TypeError) first and a read-only capsule of an immutable
    bytes object second, which torch imported without a word and the zeroer cleared (pass 32)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __dlpack_device__(self) -> Any:
        return self._obj.__dlpack_device__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        cap = self._obj.__dlpack__(*args, **kwargs)
        if _dlpack_read_only(cap):
            raise _ReadOnlyExport
        return cap


_P = ParamSpec("_P")
_R = TypeVar("_R")


def plain_torch(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a public entry under :func:`plain_ops` from end to end: under a caller's TorchFunctionMode, a
    tensor's ``numel()``, ``data_ptr()``, ``.to()`` or slicing answered for other ids or memory, and a plan
    built under it was kept (blocks [1, 2, 5, 6] zeroed for [1, 2], bytes written past a 2 KiB buffer:
    passes 30 and 31); a TorchDispatchMode did the same through the aten ops (pass 32)."""

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if torch.compiler.is_compiling():  # traced by torch.compile: run eagerly (a graph break); Dynamo's
            return torch.compiler.disable(run)(*args, **kwargs)  # fake ids raised Triton's error (pass 32)
        with plain_ops():
            return fn(*args, **kwargs)

    return run



def _group_name(group: Any) -> str | None:
    """A group argument as a plain str (or None), else :class:`TableError` before any dict lookup."""
    if group is None or type(group) is str:
        return group
    if not isinstance(group, str):
        msg = f"group = {short(group)}: must be a group name (str) or None"
        raise TableError(msg, field="group", value=repr(group))
    return str(plain_str(group))  # a str subclass's __hash__ / __eq__ found another group's plan


def check_id_tensor(ids: torch.Tensor) -> None:
    """Device ids must be a plain 1-D int32/int64 tensor whose storage holds them (values are checked in
    the kernel, which reads them from ``ids.contiguous()``'s pointer)."""
    if type(ids) not in (torch.Tensor, torch.nn.Parameter):  # a subclass's own contiguous() returned a
        # strided view, and the kernel read other ids than the host check had seen (pass 28)
        kind = type(ids).__name__
        why = "must be a plain torch.Tensor (a subclass may hand the kernel other memory than its ids)"
        raise BlockIdError(f"block_ids type = {kind}: {why}", field="block_ids", value=kind)
    if ids.is_nested:  # its shape cannot be read: torch's raw error from the message below (pass 26)
        raise BlockIdError("block_ids layout = nested: must be dense", field="block_ids", value="nested")
    if ids.dtype not in (torch.int32, torch.int64):
        raise BlockIdError(
            f"block_ids dtype = {ids.dtype}: must be int32 or int64",
            field="block_ids.dtype",
            value=str(ids.dtype),
        )
    if ids.dim() != 1:
        raise BlockIdError(
            f"block_ids shape = {tuple(ids.shape)}: must be 1-D", field="block_ids", value=tuple(ids.shape)
        )
    if ids.layout != torch.strided:  # a sparse tensor's .contiguous() raised RuntimeError (issue 25)
        kind = str(ids.layout)
        raise BlockIdError(f"block_ids layout = {kind}: must be dense", field="block_ids", value=kind)
    try:
        ids.untyped_storage()
    except (NotImplementedError, RuntimeError):  # functorch's batched tensors (vmap): torch's raw error
        raise BlockIdError(  # (pass 30)
            "block_ids = a tensor without storage (vmap?): must hold its ids in memory",
            field="block_ids", value="no storage",
        ) from None
    if torch._is_functional_tensor(ids):  # a wrapper (torch.func.functionalize): its data_ptr() raised
        msg = "block_ids = a functional tensor (torch.func.functionalize?): must hold its ids in memory"
        raise BlockIdError(msg, field="block_ids", value="functional")  # torch's raw error (pass 32)
    if ids._is_zerotensor():  # no memory behind its storage (data_ptr 0): the kernel read address 0 (pass 29)
        msg = "block_ids = a ZeroTensor: must hold memory"
        raise BlockIdError(msg, field="block_ids", value="ZeroTensor")
    if ids.is_neg():  # its memory holds the ids negated (torch's raw error from .numpy(): pass 28)
        raise BlockIdError("block_ids = a negative view: call resolve_neg() first", field="block_ids",
                           value="negative view")
    n = ids.numel()
    if n > MAX_IDS:  # a stride-0 view of 8 B standing for 2**40 ids: contiguous() / numpy() raised the
        # allocator's raw error (pass 32)
        msg = f"block_ids.size = {n}: at most {MAX_IDS} ids in one call"
        raise BlockIdError(msg, field="block_ids.size", value=n)
    if n > 1 and ids.stride(0) == 0:  # a broadcast view: 8 B standing for 2**31 - 1 ids had contiguous()
        # ask 16 GiB (the allocator's raw error, pass 33); any other view holds its ids in its storage
        msg = "block_ids = a broadcast view (stride 0): pass the ids themselves"
        raise BlockIdError(msg, field="block_ids", value="stride 0")
    if n and ids.device.type != "meta":  # a storage shrunk behind its tensor (resize_): read past its end
        need = (ids.storage_offset() + (n - 1) * ids.stride(0) + 1) * ids.element_size()
        have = ids.untyped_storage().nbytes()
        if have < need:
            why = f"holds fewer bytes than the ids' {need} B reach (resized?)"
            raise BlockIdError(f"block_ids storage = {have} B: {why}", field="block_ids", value=have)


def dense_ids(ids: torch.Tensor, words: torch.Tensor | None = None) -> torch.Tensor:
    """``ids`` checked (:func:`check_id_tensor`) and made dense, with no ``__torch_function__`` between: a
    TorchFunctionMode's ``contiguous()`` handed the kernel a strided view it read as dense (pass 29). The
    result is checked too (a plain, contiguous tensor of the same ids whose storage holds them), and, with
    ``words``, must not share memory with the buffer: ids stored in a block were zeroed by the kernel while
    it read them, and other blocks followed (pass 29); ids in memory torch did not allocate are copied
    (pass 32)."""
    with plain_ops():
        check_id_tensor(ids)
        dense = ids.contiguous()
        if dense is not ids:
            check_id_tensor(dense)
        if not dense.is_contiguous() or dense.shape != ids.shape:
            msg = "block_ids: contiguous() did not give dense ids of the same shape"
            raise BlockIdError(msg, field="block_ids", value=tuple(dense.shape))
        if words is not None:
            check_apart(dense, words)
            dense = private_ids(dense)
    return dense


def private_ids(dense: torch.Tensor) -> torch.Tensor:
    """Dense ids in torch's own private memory, copied where they may be a buffer's bytes mapped again.

    Memory torch did not allocate (NumPy, DLPack, a mapping) or host memory shared with share_memory_()
    may be the buffer's own mapped at another address: ids read through a second mapping of the cache
    were cleared while the kernel read them (blocks [0, 1] zeroed for [1, 2]: passes 32, 33; the sharded
    zeroer's replicated launch, pass 34). A copy is torch's own private memory. (is_shared() is always
    True for CUDA storages: asked of host memory only, so device ids from torch's allocator are not
    copied.) Call it under :func:`plain_ops`."""
    storage = dense.untyped_storage()
    if not storage.resizable() or (storage.device.type == "cpu" and storage.is_shared()):
        return dense.clone()
    return dense


def check_apart(ids: torch.Tensor, words: torch.Tensor) -> None:
    """Dense ``ids`` must not lie in the bytes ``words`` (a buffer's layout) covers (pass 29)."""
    if not (ids.numel() and words.numel() and ids.device == words.device):
        return
    lo, hi = ids.data_ptr(), ids.data_ptr() + ids.numel() * ids.element_size()
    b_lo = words.data_ptr()
    if lo < b_lo + words.numel() * words.element_size() and b_lo < hi:
        why = "they lie in the buffer being zeroed (the kernel would clear them while reading them)"
        raise BlockIdError(f"block_ids at {lo:#x}: {why}", field="block_ids", value=lo)


def host_ids(ids: torch.Tensor) -> np.ndarray:
    """A host tensor's ids as NumPy (checked later as any host ids); a tensor NumPy cannot hold
    (bfloat16, float8, meta, sparse) is a :class:`BlockIdError`, no raw torch error (issue 25)."""
    try:
        return ids.detach().cpu().numpy()
    except (TypeError, RuntimeError, NotImplementedError):
        kind = f"{ids.dtype} {ids.layout} tensor on {ids.device}"
        msg = f"block_ids = {kind}: must be a dense integer tensor holding data"
        raise BlockIdError(msg, field="block_ids", value=kind) from None


@dataclass
class _Slot:
    """Per-call device buffers: host ids staged here, routed ids packed here, their live count."""

    ids: torch.Tensor  # int64 [max_batch]
    count: torch.Tensor  # int32 [1]
    routed: torch.Tensor  # int64 [>= routed batch], grown on demand
    stream: Any = None  # the stream of its last launch (native)
    done: Any = None  # torch.cuda.Event recorded after that launch (native)
    busy: bool = False  # owned by a call (or, captured, by a CUDA graph) now


@dataclass
class _Staging:
    """A pinned host buffer the host ids of one call are written to before their async copy."""

    pinned: torch.Tensor
    view: np.ndarray
    done: Any = None  # torch.cuda.Event recorded after the copy out of it
    busy: bool = False


@dataclass
class _DevicePlan:
    """One table's work units (host plan and its device copies): the whole table or one group's rows."""

    table: SegmentTable
    plan: UnitPlan
    base: torch.Tensor
    stride: torch.Tensor
    words: torch.Tensor
    sub: int  # words per vector store (at most the chunk)
    single: bool = False  # every unit fits one vector store (the one-shot launch needs no loop)


def _device_plan(
    table: SegmentTable, coalesce: bool, chunk_words: int, sub_words: int, device: Any
) -> _DevicePlan:
    kernel_table = table.coalesced() if coalesce else table
    plan = plan_units(kernel_table, chunk_words)
    chunk_words = int(chunk_words)  # checked by plan_units; a NumPy value reached the kernel as SUB
    sub = sub_words
    if chunk_words & (chunk_words - 1) == 0:  # a power-of-two chunk: no vector wider than it
        sub = min(sub_words, chunk_words)
    return _DevicePlan(
        kernel_table,
        plan,
        torch.from_numpy(plan.base_words).to(device),
        torch.from_numpy(plan.stride_words).to(device),
        torch.from_numpy(plan.words).to(device),
        sub,
        int(plan.words.max()) <= sub,
    )


@dataclass
class _Replay:
    """Native host batches: a pinned ``[count, ids...]`` buffer, its device copy, and the CUDA
    graphs (copy + counted launch) captured over them, one per (plan, batch-size bucket)."""

    pinned: torch.Tensor  # int64 [max_batch + 1], pinned host memory
    view: np.ndarray  # its NumPy view (ids are written here)
    dev: torch.Tensor  # int64 [max_batch + 1] on the device
    graphs: dict[tuple[str | None, int, int], Any]
    done: Any = None  # torch.cuda.Event recorded after the last replay
    busy: bool = False
    #: an external event every graph of this entry records after its launch, so a replay needs no
    #: host-side record (about 6 us a step on the H200 host); None: the host records ``done``
    signal: Any = None


#: Zeroers by the int handle the ``kvlayout::zero_blocks`` op names them with (weakly held).
_HANDLES: dict[int, weakref.ref[CudaZeroer]] = {}
_HANDLES_LOCK = threading.Lock()


def zeroer_for_handle(handle: int) -> CudaZeroer:
    """The live zeroer registered under ``handle`` (see :attr:`CudaZeroer.handle`)."""
    ref = _HANDLES.get(handle)
    z = ref() if ref is not None else None
    if z is None:
        raise BackendError(
            f"handle = {handle!r}: no live CudaZeroer has this handle", field="handle", value=handle
        )
    return z


def _capturing() -> bool:
    return MODE == "native" and torch.cuda.is_current_stream_capturing()


def _graph_event() -> Any:
    """An event a CUDA graph can record as a node of its own (``external=True``), or None where
    this torch has no such events."""
    try:
        return torch.cuda.Event(external=True)
    except TypeError:
        return None


def _bucket(k: int, limit: int) -> int:
    """The batch-size bucket of ``k`` ids: the next power of two, at most ``limit``."""
    return min(1 << (k - 1).bit_length(), limit)


class CudaZeroer:
    """Zero block ids of one buffer laid out by ``table``, in one Triton launch per step.

    ``buffer`` is a contiguous tensor of any dtype (CUDA natively, CPU under the
    interpreter) holding at least ``offset + total_bytes`` bytes. ``max_batch`` bounds the
    ids per host batch (the size of each device ids buffer). Memory owned elsewhere comes
    in through :meth:`from_dlpack`. The table is verified first; an unsafe table is refused.
    ``graphs`` (native only): replay host batches as CUDA graphs (copy + launch) instead of
    launching eagerly. ``small_batch``: cut the table into smaller work units for batches too
    small to fill the GPU (``SMALL_CHUNKS``).

    Thread safety: one zeroer may be called from several threads at once (e.g. on
    disjoint ids). Every call stages its ids in buffers it owns until its launch (or graph
    replay) is enqueued, and a buffer is reused only once no launch in flight can read it;
    under the interpreter, launches are serialised by a process-wide lock. Natively,
    launches go to each thread's current stream: ordering writes to the same bytes across
    streams is the caller's business. :meth:`check` reports bad device ids of launches that
    finished before it, once each. Replay graphs are captured only in the constructor and
    :meth:`capture` (set-up time: a capture fails a device-wide sync made meanwhile by another
    thread); a step never captures. A CUDA graph the caller captures around a call owns that
    call's buffers (that call launches eagerly inside the capture).
    """

    @plain_torch
    def __init__(
        self,
        table: SegmentTable,
        buffer: torch.Tensor,
        *,
        offset: int = 0,
        max_batch: int | None = None,
        coalesce: bool = True,
        chunk_words: int = DEFAULT_CHUNK_WORDS,
        sub_words: int = DEFAULT_SUB_WORDS,
        num_warps: int = DEFAULT_NUM_WARPS,
        max_programs: int | None = None,
        cache_modifier: str = DEFAULT_CACHE,
        eviction_policy: str = DEFAULT_EVICT,
        graphs: bool = True,
        small_batch: bool = True,
    ) -> None:
        check_table(table)  # a SegmentTable itself: a subclass's methods pick the rows written (pass 24)
        if max_batch is None:
            max_batch = 1 << 16
        if not (is_int(max_batch) and 0 < max_batch <= INT32_MAX):  # a lying int subclass's int() was
            # taken after its value was checked: 2**27 id slots (issue 25, pass 23)
            msg = f"max_batch = {max_batch!r}: must be a positive integer, at most {INT32_MAX}"
            raise BlockIdError(msg, field="max_batch", value=max_batch)
        self.sub_words = check_option("sub_words", sub_words, power_of_two=True, limit=1 << 16)
        self.num_warps = check_option("num_warps", num_warps, power_of_two=True, limit=32)
        if max_programs is not None:
            max_programs = check_option("max_programs", max_programs)
        for name, value, valid in (
            ("cache_modifier", cache_modifier, CACHE_MODIFIERS),
            ("eviction_policy", eviction_policy, EVICTION_POLICIES),
        ):
            if not isinstance(value, str) or value not in valid:
                raise BackendError(f"{name} = {value!r}: must be one of {valid}", field=name, value=value)
        for name, flag in (("coalesce", coalesce), ("graphs", graphs), ("small_batch", small_batch)):
            if not isinstance(flag, bool):
                raise BackendError(f"{name} = {flag!r}: must be True or False", field=name, value=flag)
        require_safe(table)
        self.table = table
        self.words = _as_words(buffer, table, offset)
        # bytes of the storage the words reach: a storage resized (freed) behind the zeroer is refused
        self._storage_need = (self.words.storage_offset() + self.words.numel()) * self.words.element_size()
        # and where they are: the replay graphs hold this address (a storage grown behind the zeroer moved,
        # and its replays wrote the freed block: issue 25, pass 24)
        self._address = self.words.data_ptr()
        self.buffer = buffer
        # and the user's tensor still there: one re-pointed (set_, Parameter.data = ...) was never written
        # while the zeroer's own view kept the old storage alive and zero() returned (pass 28)
        self._buffer_address = buffer.data_ptr()
        self.offset = int(offset)  # checked by _as_words
        self.device = buffer.device
        self.mode = MODE
        dev = self.device
        self._coalesce = bool(coalesce)
        whole = _device_plan(table, self._coalesce, chunk_words, self.sub_words, dev)
        self._chunk_words = chunk_words = int(chunk_words)  # checked by plan_units: a constexpr is an int
        self.kernel_table = whole.table
        self.plan: UnitPlan = whole.plan
        # plans by (group, chunk words) (group None: every group); made on first use
        self._plans: dict[tuple[str | None, int], _DevicePlan] = {(None, chunk_words): whole}
        # the plan each (group, bucket) of batch sizes launches with (small-batch geometry)
        self._geometry: dict[tuple[str | None, int], _DevicePlan] = {}
        self._err = torch.zeros(2, dtype=torch.int64, device=dev)  # only ever added to by kernels
        self._reported = 0  # bad work items check() has already reported
        # the id bounds ([0, limit)) of launches that can flag ids: num_blocks, a routed batch's id_limit
        self._bounds: set[int] = set()  # the id_limits of launches since the last check
        self._bounds_ranged = False  # whether _bounds holds only their range
        self.max_batch = int(max_batch)
        # the count operand of uncounted launches (never read by them)
        self._no_count = torch.zeros(1, dtype=torch.int32, device=dev)
        self.cache_modifier = cache_modifier
        self.eviction_policy = eviction_policy
        if max_programs is None:
            if MODE == "native":
                sms = torch.cuda.get_device_properties(dev).multi_processor_count
                max_programs = sms * DEFAULT_PROGRAMS_PER_SM
            else:
                max_programs = 64
        self.max_programs = int(max_programs)
        self.graphs = graphs and MODE == "native"
        #: whether the replayed graphs hold the host-to-device copy too (decided at the first capture)
        self.graph_copy: bool | None = None
        self.small_batch = small_batch
        self._lock = threading.Lock()
        self._slots: list[_Slot] = [self._new_slot()]
        self._staging: list[_Staging] = []
        self._replays: list[_Replay] = []
        self._next_replay = 0
        self._captured: set[str | None] = set()  # groups whose replay graphs exist
        if self.graphs and not _capturing():
            self.capture()

    @classmethod
    @plain_torch
    def from_dlpack(cls, obj: Any, table: SegmentTable, **kwargs: Any) -> CudaZeroer:
        """Zero memory owned elsewhere (JAX, CuPy, ...) in place, through DLPack (no copy).

        Memory its owner declares read-only (a NumPy array with ``writeable=False``, one
        made by ``np.frombuffer`` over ``bytes``, a DLPack 1.x export flagged read-only) is
        refused: zeroing would write into it behind its owner's back.
        """
        check_table(table)  # a SegmentTable itself: a subclass's methods pick the rows written (pass 24)
        kind = type(obj).__name__
        if isinstance(obj, np.ndarray):  # as the plain array it is: a subclass's own flags said writeable
            # over np.frombuffer(bytes), and the bytes object was zeroed (issue 25, pass 25)
            obj = np.ndarray.view(obj, np.ndarray)
        if _dlpack_read_only(obj):
            raise LayoutBufferError(
                f"buffer = {kind} (read-only): zeroing writes in place; pass writeable memory",
                field="buffer",
                value="read-only",
            )
        export = _CheckedExport(obj) if hasattr(obj, "__dlpack__") else obj  # (else a capsule: checked above)
        try:
            tensor = torch.utils.dlpack.from_dlpack(export)
        except _ReadOnlyExport:
            raise LayoutBufferError(
                f"buffer = {kind} (its DLPack export is read-only): zeroing writes in place; pass writeable "
                "memory",
                field="buffer",
                value="read-only",
            ) from None
        except (AttributeError, BufferError, RuntimeError, TypeError, ValueError) as e:
            msg = f"buffer type = {kind}: not importable through DLPack ({e})"
            raise LayoutBufferError(msg, field="buffer", value=kind) from None
        return cls(table, tensor, **kwargs)

    def _plan_for(self, group: str | None, chunk_words: int | None = None) -> _DevicePlan:
        """The work units of ``group`` (GEOMETRY.md section 7): its rows only, coalesced on their own."""
        chunk = self._chunk_words if chunk_words is None else chunk_words
        group = _group_name(group)
        found = self._plans.get((group, chunk))
        if found is not None:
            return found
        rows = self.table if group is None else self.table.for_group(group)
        made = _device_plan(rows, self._coalesce, chunk, self.sub_words, self.device)
        with self._lock:
            return self._plans.setdefault((group, chunk), made)

    @plain_torch
    def plan_for_batch(self, num_ids: int, group: str | None = None) -> _DevicePlan:
        """The plan a batch of ``num_ids`` ids launches with: smaller units while the default ones
        give fewer than ``FILL_WAVES * max_programs`` work items (decided once per bucket)."""
        if not (is_int(num_ids) and 0 <= num_ids <= MAX_IDS):  # a float raised AttributeError, -7 and
            why = f"must be an integer in [0, {MAX_IDS}]"  # 2**80 were cached under a bucket (pass 32)
            raise BlockIdError(f"num_ids = {short(num_ids)}: {why}", field="num_ids", value=num_ids)
        return self._plan_for_batch(int(num_ids), _group_name(group))

    def _plan_for_batch(self, num_ids: int, group: str | None) -> _DevicePlan:
        key = (group, (num_ids - 1).bit_length())
        found = self._geometry.get(key)
        if found is not None:
            return found
        chosen = self._plan_for(group)
        want = int(FILL_WAVES * self.max_programs)
        bucket = 1 << key[1]  # decided by the bucket, so the order of calls does not matter
        if self.small_batch and bucket * chosen.plan.units_per_block < want:
            for chunk in SMALL_CHUNKS:
                if chunk >= self._chunk_words:
                    continue
                chosen = self._plan_for(group, chunk)
                if bucket * chosen.plan.units_per_block >= want:
                    break
        self._geometry[key] = chosen
        return chosen

    # ---- the custom op -------------------------------------------------------------------
    @property
    def handle(self) -> int:
        """An int naming this zeroer to the ``kvlayout::zero_blocks`` op (registered on first use)."""
        h = self.__dict__.get("_handle")
        if h is None:
            with _HANDLES_LOCK:
                h = len(_HANDLES) + 1
                while h in _HANDLES:
                    h += 1
                _HANDLES[h] = weakref.ref(self)
                self._handle = h
        return int(h)

    @plain_torch
    def zero_into(self, buffer: torch.Tensor, block_ids: torch.Tensor, group: str | None = None) -> None:
        """Zero ``block_ids`` in ``buffer``: this zeroer's buffer or a same-layout copy of it.

        The body of the ``kvlayout::zero_blocks`` op: under functionalisation the op may be
        handed a copy of the buffer, so the bytes written are always those of ``buffer``.
        """
        if not isinstance(block_ids, torch.Tensor):
            kind = type(block_ids).__name__
            raise BlockIdError(f"block_ids type = {kind}: must be a tensor", field="block_ids", value=kind)
        words = _as_words(buffer, self.table, self.offset)
        group = _group_name(group)  # a plain str from here on: the plans below are cached by it
        self._plan_for(group)  # a bad group raises before anything runs, as zero()'s does (pass 28)
        if words.data_ptr() == self.words.data_ptr():
            self.zero(block_ids, group)
            return
        if MODE == "native" and words.device != self.device:
            raise LayoutBufferError(
                f"buffer device = {words.device}: must be {self.device}",
                field="buffer.device",
                value=str(words.device),
            )
        check_id_tensor(block_ids)
        if block_ids.device.type != DEVICE_TYPE or MODE != "native":  # meta ids: host_ids names them
            normalize_block_ids(host_ids(block_ids), self.table.num_blocks)  # (raw error before: pass 23)
        with plain_ops():
            moved = block_ids.to(self.device)
        dev_ids = dense_ids(moved, words)
        if MODE != "native":  # what the kernel reads is what was checked (a mode's .to: pass 29)
            normalize_block_ids(dev_ids.numpy(), self.table.num_blocks)
        if dev_ids.numel():
            self._launch(dev_ids, dplan=self._plan_for_batch(dev_ids.numel(), group), words=words)

    # ---- per-call buffers ------------------------------------------------------------
    def _new_slot(self) -> _Slot:
        dev = self.device
        return _Slot(
            torch.zeros(self.max_batch, dtype=torch.int64, device=dev),
            torch.zeros(1, dtype=torch.int32, device=dev),
            torch.zeros(0, dtype=torch.int64, device=dev),
        )

    def _acquire(self) -> tuple[_Slot, Any]:
        """A slot no launch in flight reads, owned by the caller until :meth:`_release`; and the stream."""
        stream = torch.cuda.current_stream(self.device) if MODE == "native" else None
        if _capturing():  # a fresh slot the graph keeps (no event queries during a capture)
            slot = self._new_slot()
            slot.busy = True
            return slot, stream
        with self._lock:
            for slot in self._slots:
                if not slot.busy and (slot.done is None or slot.stream == stream or slot.done.query()):
                    slot.busy = True
                    return slot, stream
        slot = self._new_slot()
        slot.busy = True
        with self._lock:
            self._slots.append(slot)
        return slot, stream

    def _release(self, slot: _Slot, stream: Any) -> None:
        if _capturing():
            return  # the captured graph reads this slot on every replay: never reuse it
        if MODE == "native":
            slot.done = slot.done or torch.cuda.Event()
            slot.done.record(stream)
            slot.stream = stream
        with self._lock:
            slot.busy = False

    def _fill(self, dst: np.ndarray, ids: Any) -> int:
        """Write host ids into ``dst[:k]``, checked against ``[0, num_blocks)``; return ``k``.

        Lists and tuples of Python ints take the fast path: their types are counted by
        ``operator.countOf`` (C speed), NumPy converts them straight into ``dst`` and min/max
        bound them. Anything else (NumPy ids in a list, arrays, bad values) goes through
        :func:`kvlayout.reference.normalize_block_ids`, which names the first bad element.
        Raises before anything is launched.
        """
        n = self.table.num_blocks
        if type(ids) is list and 64 < len(ids) <= self.max_batch:
            k = len(ids)
            # exact ints only, counted in one C pass: NumPy's own inference took an int subclass's
            # __index__ (3) where its value was 19 and zeroed block 3 (issue 25, twentieth pass), and 0-d
            # arrays that shorter lists refuse; the count costs less than that inference did (47 us at
            # 4,096 ids on this host, against 95)
            ok = operator.countOf(map(type, ids), int) == k
            if ok:
                try:
                    arr = np.array(ids, dtype=np.int64)
                except OverflowError:
                    ok = False
            if ok:
                lo, hi = int(arr.min()), int(arr.max())
                if lo >= 0 and hi < n:
                    dst[:k] = arr
                    return k
        if type(ids) in (list, tuple) and operator.countOf(map(type, ids), int) == len(ids):
            k = len(ids)
            if k > self.max_batch:
                raise BlockIdError(
                    f"block_ids: batch of {k} exceeds max_batch {self.max_batch}", field="block_ids", value=k
                )
            if k:
                try:
                    dst[:k] = ids
                except OverflowError:
                    normalize_block_ids(ids, n)  # raises, naming the element
                    raise
                if k <= 64:
                    lo, hi = min(ids), max(ids)
                else:
                    v = dst[:k]
                    lo, hi = int(v.min()), int(v.max())
                if lo < 0 or hi >= n:
                    normalize_block_ids(ids, n)  # raises, naming the first bad id
            return k
        if isinstance(ids, np.ndarray) and ids.ndim == 1:  # its size before its values: a broadcast view of
            self.check_batch(ids.size)  # 2**28 ids was validated for 3.5 s and 500 MB first (pass 32)
        arr = normalize_block_ids(ids, n)
        self.check_batch(arr.size)
        dst[: arr.size] = arr
        return int(arr.size)

    def _stage(self, ids: Any, slot: _Slot) -> torch.Tensor:
        """Write host ids (validated by :meth:`_fill`) into ``slot`` without a host sync."""
        if MODE != "native":
            k = self._fill(slot.ids.numpy(), ids)
            return slot.ids[:k]
        capturing = _capturing()
        staging = None
        if not capturing:
            with self._lock:
                for st in self._staging:
                    if not st.busy and (st.done is None or st.done.query()):
                        st.busy = True
                        staging = st
                        break
        if staging is None:  # every pinned buffer is still being copied from: add one
            pinned = torch.empty(self.max_batch, dtype=torch.int64, pin_memory=True)
            staging = _Staging(pinned, pinned.numpy(), busy=True)
            if not capturing:
                with self._lock:
                    self._staging.append(staging)
        k = 0
        try:
            k = self._fill(staging.view, ids)
            if k:
                slot.ids[:k].copy_(staging.pinned[:k], non_blocking=True)
        finally:
            if not capturing:
                if k:
                    staging.done = staging.done or torch.cuda.Event()
                    staging.done.record()
                with self._lock:
                    staging.busy = False
        return slot.ids[:k]

    # ---- per step ----------------------------------------------------------------------
    @plain_torch
    def zero(self, block_ids: Any, group: str | None = None) -> None:
        """Zero ``block_ids``: host ids (list, tuple, NumPy, CPU tensor) or a device tensor.

        ``group`` names one cache group: only that group's rows are cleared (GEOMETRY.md
        section 7); ``None`` clears every row. Host ids and the group are validated first
        (error, nothing written). A device tensor (int32 or int64, 1-D) is launched on as
        is; out-of-range ids write nothing and set the flag that :meth:`check` raises.
        """
        self._check_storage()
        if group is not None and type(group) is not str:  # a str subclass as its plain str (pass 25)
            group = plain_str(group)
        if isinstance(block_ids, torch.Tensor):
            if block_ids.device.type == DEVICE_TYPE and (MODE == "native" or block_ids.device == self.device):
                self._zero_device(block_ids, group)
                return
            block_ids = host_ids(block_ids)
        if self.graphs and not _capturing() and self._zero_replay(block_ids, group):
            return
        self._plan_for(group)  # a bad group raises before anything is staged
        slot, stream = self._acquire()
        try:
            dev_ids = self._stage(block_ids, slot)
            if dev_ids.numel():
                self._launch(dev_ids, dplan=self._plan_for_batch(dev_ids.numel(), group))
        finally:
            self._release(slot, stream)

    def _zero_device(self, block_ids: torch.Tensor, group: str | None) -> None:
        if MODE == "native" and block_ids.device != self.device:
            raise BlockIdError(
                f"block_ids device = {block_ids.device}: must be {self.device}",
                field="block_ids.device",
                value=str(block_ids.device),
            )
        dplan = self._plan_for(group)
        dev_ids = dense_ids(block_ids, self.words)
        if MODE != "native":  # CPU tensors under the interpreter are host ids: validate
            normalize_block_ids(dev_ids.numpy(), self.table.num_blocks)
        if dev_ids.numel():
            self._launch(
                dev_ids, dplan=self._plan_for_batch(dev_ids.numel(), group) if self.small_batch else dplan
            )

    def _check_storage(self) -> None:
        """The buffer's storage still holds the layout: one resized to 0 B after the zeroer was made
        was written through the old pointer (issue 25, pass 23)."""
        have = self.words.untyped_storage().nbytes()
        if have < self._storage_need:
            msg = f"buffer storage = {have} B: the zeroer writes up to byte {self._storage_need} (resized?)"
            raise LayoutBufferError(msg, field="buffer", value=have)
        at = self.words.data_ptr()
        if at != self._address:
            msg = (
                f"buffer data_ptr = {at:#x}: the storage moved from {self._address:#x} after the zeroer was "
                "made (resized?); its captured graphs write the old address: make a new zeroer"
            )
            raise LayoutBufferError(msg, field="buffer.data_ptr", value=at)
        if self.buffer.data_ptr() != self._buffer_address:
            at = self.buffer.data_ptr()
            msg = (
                f"buffer data_ptr = {at:#x}: the tensor was re-pointed from {self._buffer_address:#x} after "
                "the zeroer was made (set_ or .data =): the zeroer writes the old memory: make a new zeroer"
            )
            raise LayoutBufferError(msg, field="buffer.data_ptr", value=at)

    def check_batch(self, n: int) -> None:
        """Refuse a host batch of ``n`` ids larger than ``max_batch`` (the staging buffers' size)."""
        if not is_int(n) or n < 0:  # a str or None raised TypeError (pass 32)
            raise BlockIdError(f"batch size = {short(n)}: must be a count of ids", field="block_ids", value=n)
        if n > self.max_batch:
            raise BlockIdError(
                f"block_ids: batch of {n} exceeds max_batch {self.max_batch}", field="block_ids", value=n
            )

    @plain_torch
    def zero_validated(self, ids: np.ndarray, group: str | None = None) -> None:
        """Zero host ids already validated against ``[0, num_blocks)`` (int64 ``[n]``): stage, launch."""
        self._check_storage()
        if not isinstance(ids, np.ndarray):  # a list raised AttributeError, a tensor TypeError (pass 32)
            kind = type(ids).__name__
            msg = f"block_ids type = {kind}: must be a NumPy array"
            raise BlockIdError(msg, field="block_ids", value=kind)
        self.check_batch(ids.size)
        self.zero(ids, group)

    # ---- native host batches: graph replay --------------------------------------------
    @plain_torch
    def capture(self, group: str | None = None) -> None:
        """Capture the replay graphs of ``group`` (None: every group) for every batch-size bucket, now.

        Natively with ``graphs=True`` the constructor captures ``group=None``; call this at set-up
        time for each group zeroed on its own. Captures happen only here, never during a step: a
        capture fails any device-wide synchronisation another thread makes meanwhile. Host
        batches of a group without graphs, and batches arriving while every buffer of the ring
        is still in flight, launch eagerly.
        """
        if not self.graphs:
            return
        group = plain_str(group)
        self._plan_for(group)
        buckets = []
        b = 1
        while True:
            buckets.append(min(b, self.max_batch))
            if b >= self.max_batch:
                break
            b *= 2
        while len(self._replays) < GRAPH_RING:
            pinned = torch.empty(self.max_batch + 1, dtype=torch.int64, pin_memory=True)
            dev = torch.zeros(self.max_batch + 1, dtype=torch.int64, device=self.device)
            signal = _graph_event()
            self._replays.append(_Replay(pinned, pinned.numpy(), dev, {}, done=signal, signal=signal))
        torch.cuda.synchronize(self.device)
        for r in self._replays:
            for bucket in buckets:
                dplan = self._plan_for_batch(bucket, group)
                key = (group, dplan.plan.chunk_words, bucket)
                if key not in r.graphs:
                    r.graphs[key] = self._capture(r, dplan, bucket)
        torch.cuda.synchronize(self.device)
        self._captured.add(group)

    def _replay_acquire(self) -> _Replay | None:
        """A ring entry no replay in flight reads (owned until released), or None if all are busy."""
        with self._lock:
            count = len(self._replays)
            for j in range(count):
                r = self._replays[(self._next_replay + j) % count]
                if not r.busy and (r.done is None or r.done.query()):
                    r.busy = True
                    self._next_replay = (self._next_replay + j + 1) % count
                    return r
        return None

    def _capture(self, r: _Replay, dplan: _DevicePlan, bucket: int) -> Any:
        """Capture (copy ``[count, ids]`` of the bucket, counted launch) over ``r``'s buffers.

        If this torch cannot capture the copy out of pinned memory, the graph holds the
        launch alone and :meth:`_zero_replay` copies before replaying (``graph_copy`` False).
        """
        cur = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(cur)
        words = r.dev[: bucket + 1]
        with torch.cuda.stream(side):
            r.dev[:1].zero_()  # count 0: the warm-up launch (compiles the kernel) writes nothing
            self._launch(r.dev[1 : bucket + 1], count=r.dev[:1], dplan=dplan)
            copies = (True, False) if self.graph_copy is not False else (False,)
            # with the signal first: a torch that cannot record it in a graph falls back to host records
            signals = (r.signal, None) if r.signal is not None else (None,)
            for with_copy, signal in [(c, sg) for c in copies for sg in signals]:
                graph = torch.cuda.CUDAGraph()
                try:
                    graph.capture_begin(capture_error_mode="thread_local")
                    try:
                        if with_copy:
                            words.copy_(r.pinned[: bucket + 1], non_blocking=True)
                        self._launch(r.dev[1 : bucket + 1], count=r.dev[:1], dplan=dplan)
                        if signal is not None:
                            signal.record()
                    finally:
                        graph.capture_end()
                except RuntimeError:
                    if signal is None and not with_copy:
                        raise
                    if signal is None:
                        self.graph_copy = False
                    continue
                if signal is None and r.signal is not None:  # this entry's replays are signalled by the host
                    r.signal = r.done = None
                self.graph_copy = with_copy
                break
        cur.wait_stream(side)
        return graph

    def _zero_replay(self, block_ids: Any, group: str | None) -> bool:
        """Stage host ids in a free ring entry and replay its graph; False if none is free or captured."""
        self._plan_for(group)  # a bad group raises first
        if group not in self._captured:
            return False
        r = self._replay_acquire()
        if r is None:
            return False
        replayed = False
        try:
            k = self._fill(r.view[1:], block_ids)
            if not k:
                return True
            r.view[0] = k
            bucket = _bucket(k, self.max_batch)
            dplan = self._plan_for_batch(bucket, group)
            graph = r.graphs[(group, dplan.plan.chunk_words, bucket)]
            if not self.graph_copy:
                r.dev[: k + 1].copy_(r.pinned[: k + 1], non_blocking=True)
            graph.replay()
            replayed = True
        finally:
            if replayed and r.signal is None:  # else the graph recorded r.signal (== r.done) itself
                r.done = r.done or torch.cuda.Event()
                r.done.record()
            with self._lock:
                r.busy = False
        return True

    def _launch(
        self,
        dev_ids: torch.Tensor,
        id_lo: int = 0,
        id_limit: int | None = None,
        *,
        count: torch.Tensor | None = None,
        dplan: _DevicePlan | None = None,
        words: torch.Tensor | None = None,
        routed: bool = False,
    ) -> None:
        """One launch over device ids (into ``words``, default this zeroer's buffer).

        Ids in ``[id_lo, id_lo + num_blocks)`` zero local block ``id - id_lo``; ids outside
        ``[0, id_limit)`` (default ``num_blocks``) set the error flag; any other id belongs to
        another shard and writes nothing. ``count``: only the first ``count[0]`` ids are
        live (packed by :meth:`launch_routed`, or staged with the ids for a graph replay).
        """
        dp = self._plans[(None, self._chunk_words)] if dplan is None else dplan
        limit = self.table.num_blocks if id_limit is None else id_limit
        if count is None:  # counted launches carry host-checked or routed (already local) ids
            self._flag_bound(limit)
        num_ids = dev_ids.numel()
        programs, items = launch_grid(dp.plan, num_ids, self.max_programs)
        # one program per work item on a (units, ids) grid up to CUDA's limit, no persistent loop;
        # routed batches (``count`` of them live, the rest idle programs) only while they fit max_programs
        # (Triton's launcher multiplies the grid as C ints and skips a launch whose product is not
        # positive: a grid of 2**31 programs or more would write nothing, silently)
        one_shot = (
            self.small_batch
            and num_ids <= MAX_GRID_Y
            and items <= MAX_GRID_X
            and (items <= self.max_programs or not routed)
        )
        grid = (dp.plan.units_per_block, num_ids) if one_shot else (programs,)
        with launch_guard(), plain_ops():  # the kernel reads data_ptr() (pass 30)
            zero_units_kernel[grid](
                self.words if words is None else words,
                dev_ids,
                dp.base,
                dp.stride,
                dp.words,
                self._err,
                self._no_count if count is None else count,
                dp.plan.units_per_block,
                id_lo,
                self.table.num_blocks,
                limit,
                items,
                SUB=dp.sub,
                ALIGNED=dp.plan.aligned16,
                CACHE=self.cache_modifier,
                EVICT=self.eviction_policy,
                COUNTED=count is not None,
                ONE_SHOT=one_shot,
                SINGLE=dp.single,
                num_warps=self.num_warps,
            )

    @plain_torch
    def launch_routed(
        self, dev_ids: torch.Tensor, id_lo: int, id_limit: int, group: str | None = None
    ) -> None:
        """Zero the device ids this buffer owns, ``[id_lo, id_lo + num_blocks)``, of a global batch.

        No host sync: the count is reset, one program per 1,024 ids packs the owned ids as
        local ids and counts them (ids outside ``[0, id_limit)`` set the error flag), then the
        zero kernel walks only the packed ones. Ids owned by other shards cost one read, not
        a work item each. Graph-capturable (the reset is a memset in the stream; the graph
        keeps the buffers of the captured call).
        """
        self._check_storage()  # public: a storage freed behind the zeroer is refused here too (pass 24)
        # its arguments checked as zero()'s are: a float id_lo 0.5 zeroed blocks 0 and 1 for ids 1 and 2,
        # float and 2-D ids were launched on, a list raised AttributeError, an id_limit of 2**70
        # OverflowError and stayed in the bounds a later check() could not sort (TypeError; pass 24)
        if not isinstance(dev_ids, torch.Tensor):
            kind = type(dev_ids).__name__
            raise BlockIdError(f"block_ids type = {kind}: must be a tensor", field="block_ids", value=kind)
        check_id_tensor(dev_ids)  # (made dense below, once the arguments are checked)
        if dev_ids.device != self.device:
            msg = f"block_ids device = {dev_ids.device}: must be {self.device}"
            raise BlockIdError(msg, field="block_ids.device", value=str(dev_ids.device))
        for name, v, least in (("id_lo", id_lo, 0), ("id_limit", id_limit, 1)):
            if not (is_int(v) and least <= v <= INT32_MAX):
                why = f"must be an integer in [{least}, {INT32_MAX}]"
                raise BlockIdError(f"{name} = {short(v)}: {why}", field=name, value=v)
        id_lo, id_limit = int(id_lo), int(id_limit)
        if id_lo + self.table.num_blocks > id_limit:
            top = id_lo + self.table.num_blocks
            why = f"this buffer's blocks [{id_lo}, {top}) must lie in the pool [0, {id_limit})"
            raise BlockIdError(f"id_lo = {id_lo}: {why}", field="id_lo", value=id_lo)
        n = dev_ids.numel()  # at most MAX_IDS (check_id_tensor): route_ids_kernel's offsets are int32
        dplan = self._plan_for(group)
        dev_ids = dense_ids(dev_ids)  # the kernel reads dense ids: a strided view gave it others (pass 28)
        self._flag_bound(id_limit)
        slot, stream = self._acquire()
        try:
            if slot.routed.numel() < n:
                slot.routed = torch.empty(max(n, self.max_batch), dtype=torch.int64, device=self.device)
            slot.count.zero_()
            grid = (triton.cdiv(n, ROUTE_BLOCK),)
            with launch_guard(), plain_ops():  # the kernel reads data_ptr() (pass 30)
                route_ids_kernel[grid](
                    dev_ids,
                    slot.routed,
                    slot.count,
                    self._err,
                    n,
                    id_lo,
                    self.table.num_blocks,
                    id_limit,
                    BLOCK=ROUTE_BLOCK,
                )
            self._launch(slot.routed[:n], count=slot.count, dplan=dplan, routed=True)
        finally:
            self._release(slot, stream)

    def _flag_bound(self, limit: int) -> None:
        """Note that launches now flag device ids outside ``[0, limit)`` (named by :meth:`check`). Past
        :data:`NAMED_BOUNDS` limits since the last check only their range is kept: every id_limit ever
        given was, and one bad id named 2,000 of them in 25,000 characters (pass 32)."""
        if limit not in self._bounds:
            with self._lock:
                self._bounds.add(limit)
                if len(self._bounds) > NAMED_BOUNDS:
                    self._bounds = {min(self._bounds), max(self._bounds)}
                    self._bounds_ranged = True

    @plain_torch
    def check(self) -> None:
        """Raise if device-side ids were out of range since the last check (synchronises the current stream).

        The kernels only ever add to the device counter; each check reports what was added
        since the previous one, so a check never races a launch in flight on another stream.
        The message names the bound of the launches made: ``[0, num_blocks)``, and a routed
        batch's ``[0, id_limit)`` (the global pool, :meth:`launch_routed`).
        """
        with self._lock:
            total, bad = (int(x) for x in self._err.tolist())
            count = total - self._reported
            self._reported = total
            bounds = sorted(self._bounds) or [self.table.num_blocks]
            ranged, self._bounds, self._bounds_ranged = self._bounds_ranged, set(), False  # since this check
        if count:
            # a routed launch's bound is its id_limit (the global pool), not this buffer's num_blocks
            outside = " or ".join(f"[0, {b})" for b in bounds)
            if ranged:
                span = f"id_limit {bounds[0]} to {bounds[-1]} since the last check"
                outside = f"its launch's [0, id_limit) ({span})"
            raise BlockIdError(
                f"device block_ids: {count} work items had an id outside {outside} "
                f"(e.g. {bad}); they wrote nothing",
                field="block_ids",
                value=bad,
            )
