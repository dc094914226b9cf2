"""torch side of sharded zeroing: one :class:`CudaZeroer` per local shard buffer.

Each process (a ``torch.distributed`` rank, or one process driving several GPUs) builds a
:class:`ShardedCudaZeroer` over the shard buffers it holds and calls ``zero(global_ids)``
with the step's global block ids. Ids are routed to the shards that own them and
translated to local ids; nothing crosses devices and no collective runs.

- Host ids (list, tuple, NumPy, CPU tensor) are validated against the global pool first:
  a bad id raises and nothing is written on any shard. Under Triton's interpreter the
  backend's tensors live on the CPU, so a CPU tensor is validated the same way before it
  takes the device path below.
- Device ids (a tensor on the backend's device type) are routed on the device with no
  host sync: in ``block_sharded`` mode a small kernel packs the ids in the shard's range
  as local ids and counts them, and the zero kernel walks only those
  (:meth:`CudaZeroer.launch_routed`); in ``replicated`` mode every id is every shard's;
  an id outside the global pool writes nothing on any shard and sets the flag that
  :meth:`check` raises (the batch's valid ids are zeroed, as with the single-device
  zeroers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from kvlayout.errors import BlockIdError, LayoutBufferError, TableError
from kvlayout.sharding import ShardedLayout

from ._mode import DEVICE_TYPE, MODE
from .zeroer import (
    CudaZeroer,
    check_apart,
    check_id_tensor,
    dense_ids,
    host_ids,
    plain_torch,
    private_ids,
)


class ShardedCudaZeroer:
    """Zero global block ids in the shard buffers this process holds.

    ``buffers`` maps shard index -> tensor (or is a sequence holding every shard, index =
    position). Each buffer holds the shard's local layout (``layout.local_table``) at
    ``offset``. Extra keyword arguments go to every :class:`CudaZeroer`.

    Thread safe as its :class:`CudaZeroer` objects are: calls from several threads may
    overlap (host routing works on per-call arrays; each shard's zeroer owns per-call
    buffers); :meth:`check` reports each bad device id once.
    """

    @plain_torch
    def __init__(
        self,
        layout: ShardedLayout,
        buffers: Mapping[int, torch.Tensor] | Sequence[torch.Tensor],
        *,
        offset: int = 0,
        **kwargs: Any,
    ) -> None:
        if type(layout) is not ShardedLayout:  # a subclass's own block_shard() / _owned() routed ids to
            kind = type(layout).__name__  # another shard's buffer (pass 32)
            sub = isinstance(layout, ShardedLayout)
            itself = " itself (a subclass's methods route the ids)" if sub else ""
            msg = f"layout type = {kind}: must be a kvlayout.ShardedLayout{itself}"
            raise TableError(msg, field="layout", value=kind)
        layout.require_safe()
        self.layout = layout
        if isinstance(buffers, Mapping):
            items = dict(buffers)
        elif not isinstance(buffers, (list, tuple, torch.Tensor)):  # a set was numbered in its hash order: a
            # global block zeroed in another shard's buffer; a generator had no len() (pass 38)
            kind = type(buffers).__name__
            why = "must map shard index to tensor, or be a list or tuple in shard order"
            raise LayoutBufferError(f"buffers type = {kind}: {why}", field="buffers", value=kind)
        else:
            if len(buffers) != layout.num_shards:
                raise LayoutBufferError(
                    f"buffers: {len(buffers)} given for {layout.num_shards} shards "
                    "(pass a dict {shard: tensor} for a subset)",
                    field="buffers",
                    value=len(buffers),
                )
            items = dict(enumerate(buffers))
        if not items:
            raise LayoutBufferError("buffers: empty (give at least one shard)", field="buffers", value=0)
        for k in items:
            layout._check_shard(k)
        plain = {int(k): v for k, v in items.items()}  # keys as plain ints: an int subclass with its own
        if len(plain) != len(items):  # __hash__ gave shard 0 twice, and sorting them raised (pass 33)
            raise LayoutBufferError("buffers: a shard is given twice", field="buffers", value=sorted(plain))
        items = plain
        self.zeroers: dict[int, CudaZeroer] = {
            k: CudaZeroer(layout.local_table, buf, offset=offset, **kwargs)
            for k, buf in sorted(items.items())
        }
        # the shards are different blocks: two views of one memory had shard 1's block 1 clear shard 0's
        # block 1 too (pass 32)
        spans = sorted(
            (str(z.device), z.words.data_ptr(), z.words.data_ptr() + z.words.numel() * 4, k)
            for k, z in self.zeroers.items()
        )
        for (dev, _, end, k), (dev2, start2, _, k2) in zip(spans, spans[1:]):
            if dev == dev2 and start2 < end:
                why = f"share memory with shard {k}'s: every shard must be its own buffer"
                raise LayoutBufferError(f"buffers[{k2}]: {why}", field=f"buffers[{k2}]", value=k2)
        # per step only a launch per shard: (zeroer, first global id it owns), computed once
        self._routes = [(z, layout.block_shard(k) * layout.blocks_per_shard) for k, z in self.zeroers.items()]
        self._id_limit = layout.num_blocks

    @classmethod
    def for_rank(
        cls, layout: ShardedLayout, buffer: torch.Tensor, rank: int | None = None, **kwargs: Any
    ) -> ShardedCudaZeroer:
        """The zeroer of one ``torch.distributed`` rank (default: the current rank) for its buffer."""
        if rank is None:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                raise LayoutBufferError(
                    "rank = None: torch.distributed is not initialised; pass rank=", field="rank", value=None
                )
            rank = dist.get_rank()
        return cls(layout, {layout.shard_of_rank(rank): buffer}, **kwargs)

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(self.zeroers)

    @plain_torch
    def zero(self, block_ids: Any, group: str | None = None) -> None:
        """Zero global ``block_ids`` (of one cache ``group``, or all) in every shard held here.

        See the module notes. The group is checked on every shard before anything is written.
        """
        for z in self.zeroers.values():
            z._plan_for(group)
            # every shard's storage before any shard is written: the device path launched through a storage
            # freed behind its zeroer, and the host path wrote shard 0 before refusing shard 1's (pass 24)
            z._check_storage()
        if isinstance(block_ids, torch.Tensor) and block_ids.device.type == DEVICE_TYPE:
            if MODE != "native":  # a CPU tensor holds host ids: validate globally before any launch
                check_id_tensor(block_ids)
                self.layout.validate_ids(block_ids.detach().numpy())
            self._zero_device(block_ids, group)
            return
        if isinstance(block_ids, torch.Tensor):
            block_ids = host_ids(block_ids)
        if isinstance(block_ids, np.ndarray) and block_ids.ndim == 1:  # its size before its values: a
            # broadcast view of 2**27 ids was validated for 5.2 s and 1 GB, then taken (pass 33); a batch
            # past every shard's max_batch puts more than that on one of them (counting repeats, as
            # CudaZeroer counts them)
            most = max(z.max_batch for z in self.zeroers.values()) * self.layout.num_shards
            if block_ids.size > most:
                why = f"more than max_batch on some shard ({self.layout.num_shards} shards, at most {most})"
                raise BlockIdError(f"block_ids: batch of {block_ids.size}: {why}", field="block_ids",
                                   value=block_ids.size)
        ids = self.layout.validate_ids(block_ids)  # once, against the global pool
        owned = {k: self.layout._owned(k, ids) for k in self.zeroers}
        for k, z in self.zeroers.items():  # every shard's batch fits before any shard is written (a
            z.check_batch(owned[k].size)  # shard past max_batch refused after shard 0 ran: issue 25)
        for k, z in self.zeroers.items():
            z.zero_validated(owned[k], group)

    def _zero_device(self, ids: torch.Tensor, group: str | None = None) -> None:
        ids = dense_ids(ids)  # checked and dense, no __torch_function__ between (pass 29)
        if ids.numel() == 0:
            return
        moved = [ids if ids.device == z.device else ids.to(z.device, non_blocking=True)
                 for z, _ in self._routes]
        for g, (z, _) in zip(moved, self._routes):  # ids kept in a shard's buffer were cleared while read
            check_apart(g, z.words)  # (pass 29): every shard before any is written (pass 30)
        # ids that may be a shard's bytes mapped again are copied, as CudaZeroer copies them: the replicated
        # launch read them while clearing them (pass 34); zero() runs under plain_ops already
        own = private_ids(ids)
        moved = [own if g is ids else g for g in moved]  # the moved ones are copies already
        for g, (z, lo) in zip(moved, self._routes):
            if self.layout.block_shards == 1:  # replicated: every id is this shard's, one launch
                z._launch(g, dplan=z._plan_for(group))
            else:  # block_sharded: pack this shard's ids first, zero only those
                z.launch_routed(g, id_lo=lo, id_limit=self._id_limit, group=group)

    @plain_torch
    def check(self) -> None:
        """Raise if a device batch so far had ids outside the global pool (syncs; resets all shards)."""
        first: BlockIdError | None = None
        for z in self.zeroers.values():
            try:
                z.check()
            except BlockIdError as e:
                first = first or e
        if first is not None:
            raise BlockIdError(
                f"device block_ids: ids outside [0, {self.layout.num_blocks}) (e.g. {first.value}); "
                "they wrote nothing on any shard",
                field="block_ids",
                value=first.value,
            )
