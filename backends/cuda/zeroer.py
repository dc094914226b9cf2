"""Torch wrapper around the Triton zeroer: plan once per (table, buffer), launch every step.

A step neither synchronises the host nor allocates device memory: host block ids are
validated, written into a pinned staging slot and copied asynchronously into a device ids
buffer made at construction; a staging slot is reused only once the event recorded after
its copy has completed (otherwise another pinned host slot is added). Device id tensors
are used as they are and bounds-checked inside the kernel; :meth:`CudaZeroer.check`
reports bad ones later.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton

from kvlayout.backend import check_offset_and_size
from kvlayout.errors import BlockIdError, LayoutBufferError
from kvlayout.reference import normalize_block_ids
from kvlayout.table import SegmentTable
from kvlayout.verify import require_safe

from ._mode import DEVICE_TYPE, MODE
from .kernel import UnitPlan, launch_grid, plan_units, route_ids_kernel, zero_units_kernel

#: Tuned on an H200 (bench/bench_zero_gpu.py --designs): bench/results/h200-run3/gpu_zero.json.
DEFAULT_CHUNK_WORDS = 8192
DEFAULT_SUB_WORDS = 4096
DEFAULT_NUM_WARPS = 4
DEFAULT_PROGRAMS_PER_SM = 2
DEFAULT_CACHE = ""
DEFAULT_EVICT = "evict_first"
#: Ids per program of the routing kernel.
ROUTE_BLOCK = 1024


def _as_words(buffer: Any, table: SegmentTable, offset: int) -> torch.Tensor:
    """Validate ``buffer`` and return its layout bytes as an int32 ``[total_bytes/4]`` view."""
    if not isinstance(buffer, torch.Tensor):
        raise LayoutBufferError(f"buffer type = {type(buffer).__name__}: must be a torch.Tensor", field="buffer", value=type(buffer).__name__)
    if buffer.device.type != DEVICE_TYPE:
        want = "a CUDA device" if DEVICE_TYPE == "cuda" else "the CPU (Triton interpreter: no CUDA device here)"
        raise LayoutBufferError(f"buffer device = {buffer.device}: must be on {want}", field="buffer.device", value=str(buffer.device))
    if not buffer.is_contiguous():
        raise LayoutBufferError("buffer: must be contiguous", field="buffer", value="non-contiguous")
    if buffer.data_ptr() % 4:
        raise LayoutBufferError(f"buffer data_ptr = {buffer.data_ptr():#x}: must be 4-byte aligned", field="buffer.data_ptr", value=buffer.data_ptr())
    nbytes = buffer.numel() * buffer.element_size()
    check_offset_and_size(offset, nbytes, table)
    flat = buffer.reshape(-1).view(torch.uint8)
    return flat[offset : offset + table.total_bytes].view(torch.int32)


def check_id_tensor(ids: torch.Tensor) -> None:
    """Device ids must be a 1-D int32/int64 tensor (values are checked in the kernel)."""
    if ids.dtype not in (torch.int32, torch.int64):
        raise BlockIdError(f"block_ids dtype = {ids.dtype}: must be int32 or int64", field="block_ids.dtype", value=str(ids.dtype))
    if ids.dim() != 1:
        raise BlockIdError(f"block_ids shape = {tuple(ids.shape)}: must be 1-D", field="block_ids", value=tuple(ids.shape))


class CudaZeroer:
    """Zero block ids of one buffer laid out by ``table``, in one Triton launch per step.

    ``buffer`` is a contiguous tensor of any dtype (CUDA natively, CPU under the
    interpreter) holding at least ``offset + total_bytes`` bytes. ``max_batch`` bounds the
    ids per step (the device ids buffer is allocated once). Memory owned elsewhere comes in
    through :meth:`from_dlpack`. The table is verified first; an unsafe table is refused.
    """

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
    ) -> None:
        require_safe(table)
        self.table = table
        self.kernel_table = table.coalesced() if coalesce else table
        self.words = _as_words(buffer, table, offset)
        self.buffer = buffer
        self.offset = offset
        self.device = buffer.device
        self.mode = MODE
        self.plan: UnitPlan = plan_units(self.kernel_table, chunk_words)
        dev = self.device
        self._ubase = torch.from_numpy(self.plan.base_words).to(dev)
        self._ustride = torch.from_numpy(self.plan.stride_words).to(dev)
        self._uwords = torch.from_numpy(self.plan.words).to(dev)
        self._err = torch.zeros(2, dtype=torch.int64, device=dev)
        self.max_batch = int(max_batch if max_batch is not None else 1 << 16)
        if self.max_batch <= 0:
            raise BlockIdError(f"max_batch = {self.max_batch}: must be positive", field="max_batch", value=self.max_batch)
        self._dev_ids = torch.zeros(self.max_batch, dtype=torch.int64, device=dev)
        self._count = torch.zeros(1, dtype=torch.int32, device=dev)
        self._routed = torch.zeros(0, dtype=torch.int64, device=dev)  # grown on first routed launch
        self.sub_words = sub_words
        self.num_warps = num_warps
        self.cache_modifier = cache_modifier
        self.eviction_policy = eviction_policy
        if max_programs is None:
            if MODE == "native":
                sms = torch.cuda.get_device_properties(dev).multi_processor_count
                max_programs = sms * DEFAULT_PROGRAMS_PER_SM
            else:
                max_programs = 64
        self.max_programs = int(max_programs)
        self._slots: list[tuple[torch.Tensor, np.ndarray, torch.cuda.Event]] = []
        self._next_slot = 0

    @classmethod
    def from_dlpack(cls, obj: Any, table: SegmentTable, **kwargs: Any) -> CudaZeroer:
        """Zero memory owned elsewhere (JAX, CuPy, ...) in place, through DLPack (no copy)."""
        return cls(table, torch.utils.dlpack.from_dlpack(obj), **kwargs)

    # ---- per step ----------------------------------------------------------------------
    def _stage(self, ids: np.ndarray) -> torch.Tensor:
        """Copy validated host ids to the device ids buffer without a host sync."""
        k = ids.size
        if MODE != "native":
            self._dev_ids[:k].copy_(torch.from_numpy(ids))
            return self._dev_ids[:k]
        slot = None
        if self._slots:
            cand = self._slots[self._next_slot]
            if cand[2].query():
                slot = cand
                self._next_slot = (self._next_slot + 1) % len(self._slots)
        if slot is None:  # the next slot's copy is still in flight: add one (pinned host memory)
            pinned = torch.empty(self.max_batch, dtype=torch.int64, pin_memory=True)
            slot = (pinned, pinned.numpy(), torch.cuda.Event())
            self._slots.insert(self._next_slot, slot)
            self._next_slot = (self._next_slot + 1) % len(self._slots)
        pinned, view, event = slot
        view[:k] = ids
        self._dev_ids[:k].copy_(pinned[:k], non_blocking=True)
        event.record()
        return self._dev_ids[:k]

    def zero(self, block_ids: Any) -> None:
        """Zero ``block_ids``: host ids (list, tuple, NumPy, CPU tensor) or a device tensor.

        Host ids are validated first (error, nothing written). A device tensor (int32 or
        int64, 1-D) is launched on as is; out-of-range ids write nothing and set the flag
        that :meth:`check` raises.
        """
        if isinstance(block_ids, torch.Tensor) and block_ids.device.type == DEVICE_TYPE and (
            MODE == "native" or block_ids.device == self.device
        ):
            if MODE == "native" and block_ids.device != self.device:
                raise BlockIdError(f"block_ids device = {block_ids.device}: must be {self.device}", field="block_ids.device", value=str(block_ids.device))
            check_id_tensor(block_ids)
            dev_ids = block_ids.contiguous()
            if MODE != "native":  # CPU tensors under the interpreter are host ids: validate
                normalize_block_ids(dev_ids.numpy(), self.table.num_blocks)
            if dev_ids.numel():
                self._launch(dev_ids)
            return
        if isinstance(block_ids, torch.Tensor):
            block_ids = block_ids.detach().cpu().numpy()
        self.zero_validated(normalize_block_ids(block_ids, self.table.num_blocks))

    def zero_validated(self, ids: np.ndarray) -> None:
        """Zero host ids already validated against ``[0, num_blocks)`` (int64 ``[n]``): stage, launch."""
        if ids.size > self.max_batch:
            raise BlockIdError(f"block_ids: batch of {ids.size} exceeds max_batch {self.max_batch}", field="block_ids", value=ids.size)
        if ids.size:
            self._launch(self._stage(ids))

    def _launch(self, dev_ids: torch.Tensor, id_lo: int = 0, id_limit: int | None = None, *, counted: bool = False) -> None:
        """One launch over device ids.

        Ids in ``[id_lo, id_lo + num_blocks)`` zero local block ``id - id_lo``; ids outside
        ``[0, id_limit)`` (default ``num_blocks``) set the error flag; any other id belongs to
        another shard and writes nothing. ``counted``: only the first ``self._count[0]`` ids
        are live (packed by :meth:`launch_routed`).
        """
        programs, items = launch_grid(self.plan, dev_ids.numel(), self.max_programs)
        self.last_compiled = zero_units_kernel[(programs,)](
            self.words,
            dev_ids,
            self._ubase,
            self._ustride,
            self._uwords,
            self._err,
            self._count,
            self.plan.units_per_block,
            id_lo,
            self.table.num_blocks,
            self.table.num_blocks if id_limit is None else id_limit,
            items,
            SUB=self.sub_words,
            ALIGNED=self.plan.aligned16,
            CACHE=self.cache_modifier,
            EVICT=self.eviction_policy,
            COUNTED=counted,
            num_warps=self.num_warps,
        )

    def launch_routed(self, dev_ids: torch.Tensor, id_lo: int, id_limit: int) -> None:
        """Zero the device ids this buffer owns, ``[id_lo, id_lo + num_blocks)``, of a global batch.

        No host sync: the count is reset, one program per 1,024 ids packs the owned ids as
        local ids and counts them (ids outside ``[0, id_limit)`` set the error flag), then the
        zero kernel walks only the packed ones. Ids owned by other shards cost one read, not
        a work item each. Graph-capturable (the reset is a memset in the stream).
        """
        n = dev_ids.numel()
        if self._routed.numel() < n:
            self._routed = torch.empty(max(n, self.max_batch), dtype=torch.int64, device=self.device)
        self._count.zero_()
        grid = (triton.cdiv(n, ROUTE_BLOCK),)
        route_ids_kernel[grid](dev_ids, self._routed, self._count, self._err, n, id_lo, self.table.num_blocks, id_limit, BLOCK=ROUTE_BLOCK)
        self._launch(self._routed[:n], counted=True)

    def check(self) -> None:
        """Raise if any device-side id so far was out of range (synchronises; resets the flag)."""
        count, bad = (int(x) for x in self._err.tolist())
        if count:
            self._err.zero_()
            raise BlockIdError(
                f"device block_ids: {count} work items had an id outside [0, {self.table.num_blocks}) (e.g. {bad}); they wrote nothing",
                field="block_ids",
                value=bad,
            )
