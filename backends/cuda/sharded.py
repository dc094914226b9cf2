"""torch side of sharded zeroing: one :class:`CudaZeroer` per local shard buffer.

Each process (a ``torch.distributed`` rank, or one process driving several GPUs) builds a
:class:`ShardedCudaZeroer` over the shard buffers it holds and calls ``zero(global_ids)``
with the step's global block ids. Ids are routed to the shards that own them and
translated to local ids; nothing crosses devices and no collective runs.

- Host ids (list, tuple, NumPy, CPU tensor) are validated against the global pool first:
  a bad id raises and nothing is written on any shard.
- Device ids (a tensor on the backend's device type) are routed on the device without a
  host sync: unowned ids become the kernel's skip id; if any id is outside the global
  pool, the whole batch writes nothing on any shard and :meth:`check` raises later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kvlayout.errors import BlockIdError, LayoutBufferError
from kvlayout.sharding import ShardedLayout

from ._mode import DEVICE_TYPE
from .zeroer import CudaZeroer

#: Local id that routed-away slots get: the kernel skips it without counting an error.
SKIP_ID = -1


class ShardedCudaZeroer:
    """Zero global block ids in the shard buffers this process holds.

    ``buffers`` maps shard index -> tensor (or is a sequence holding every shard, index =
    position). Each buffer holds the shard's local layout (``layout.local_table``) at
    ``offset``. Extra keyword arguments go to every :class:`CudaZeroer`.
    """

    def __init__(
        self,
        layout: ShardedLayout,
        buffers: Mapping[int, torch.Tensor] | Sequence[torch.Tensor],
        *,
        offset: int = 0,
        **kwargs: Any,
    ) -> None:
        layout.require_safe()
        self.layout = layout
        if isinstance(buffers, Mapping):
            items = dict(buffers)
        else:
            if len(buffers) != layout.num_shards:
                raise LayoutBufferError(
                    f"buffers: {len(buffers)} given for {layout.num_shards} shards (pass a dict {{shard: tensor}} for a subset)",
                    field="buffers",
                    value=len(buffers),
                )
            items = dict(enumerate(buffers))
        if not items:
            raise LayoutBufferError("buffers: empty (give at least one shard)", field="buffers", value=0)
        for k in items:
            layout._check_shard(k)
        self.zeroers: dict[int, CudaZeroer] = {
            k: CudaZeroer(layout.local_table, buf, offset=offset, **kwargs) for k, buf in sorted(items.items())
        }
        self._bad = {k: torch.zeros((), dtype=torch.int64, device=z.device) for k, z in self.zeroers.items()}

    @classmethod
    def for_rank(cls, layout: ShardedLayout, buffer: torch.Tensor, rank: int | None = None, **kwargs: Any) -> ShardedCudaZeroer:
        """The zeroer of one ``torch.distributed`` rank (default: the current rank) for its buffer."""
        if rank is None:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                raise LayoutBufferError("rank = None: torch.distributed is not initialised; pass rank=", field="rank", value=None)
            rank = dist.get_rank()
        return cls(layout, {layout.shard_of_rank(rank): buffer}, **kwargs)

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(self.zeroers)

    def zero(self, block_ids: Any) -> None:
        """Zero global ``block_ids`` in every shard held here (see the module notes)."""
        if isinstance(block_ids, torch.Tensor) and block_ids.device.type == DEVICE_TYPE:
            self._zero_device(block_ids)
            return
        if isinstance(block_ids, torch.Tensor):
            block_ids = block_ids.detach().numpy()
        ids = self.layout.validate_ids(block_ids)
        for k, z in self.zeroers.items():
            local = self.layout._owned(k, ids)
            if local.size:
                z.zero(local)

    def _zero_device(self, ids: torch.Tensor) -> None:
        if ids.dtype not in (torch.int32, torch.int64):
            raise BlockIdError(f"block_ids dtype = {ids.dtype}: must be int32 or int64", field="block_ids.dtype", value=str(ids.dtype))
        if ids.dim() != 1:
            raise BlockIdError(f"block_ids shape = {tuple(ids.shape)}: must be 1-D", field="block_ids", value=tuple(ids.shape))
        if ids.numel() == 0:
            return
        bps, n = self.layout.blocks_per_shard, self.layout.num_blocks
        for k, z in self.zeroers.items():
            g = ids.to(z.device, dtype=torch.int64, non_blocking=True)
            bad = (g < 0) | (g >= n)
            lo = self.layout.block_shard(k) * bps
            keep = (g >= lo) & (g < lo + bps) & ~bad.any()
            local = torch.where(keep, g - lo, SKIP_ID)
            self._bad[k] += bad.sum()
            z._launch(local, skip_id=SKIP_ID)

    def check(self) -> None:
        """Raise if a device batch had ids outside the global pool (synchronises; resets)."""
        for z in self.zeroers.values():
            z.check()  # never fires for routed batches: skipped slots are no error
        counts = [int(b) for b in self._bad.values()]  # every shard saw the same batches
        for b in self._bad.values():
            b.zero_()
        count = max(counts)
        if count:
            raise BlockIdError(
                f"device block_ids: {count} ids outside [0, {self.layout.num_blocks}); their batches wrote nothing on any shard",
                field="block_ids",
                value=count,
            )
