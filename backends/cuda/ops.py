"""``torch.ops.kvlayout.zero_blocks``: the zero step as a torch custom op.

``zero_blocks(buffer, ids, handle, group=None)`` zeroes ``ids`` of ``buffer`` with the
:class:`~kvlayout.backends.cuda.CudaZeroer` registered under ``handle``
(:attr:`CudaZeroer.handle`). Declared as mutating ``buffer``, so eager calls bump its version
counter and functionalisation (``torch.compile``) sees the write; the fake implementation
does nothing, so ``torch.compile(fullgraph=True)`` traces through it without a graph break.
Device ids inside a CUDA graph capture are launched on as they are (the kernel bounds-checks
them). Registered when ``kvlayout.backends.cuda`` is imported (``import kvlayout`` stays
free of torch).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from kvlayout.errors import BlockIdError

from .zeroer import zeroer_for_handle


@torch.library.custom_op("kvlayout::zero_blocks", mutates_args=("buffer",))
def zero_blocks(buffer: torch.Tensor, ids: torch.Tensor, handle: int, group: str | None = None) -> None:
    """Zero block ``ids`` of ``buffer`` (in place) with the zeroer named by ``handle``."""
    zeroer_for_handle(handle).zero_into(buffer, ids, group)


@zero_blocks.register_fake
def _zero_blocks_fake(buffer: torch.Tensor, ids: torch.Tensor, handle: int, group: str | None = None) -> None:
    """Shape-only tracing: the op returns nothing and changes no metadata. Reached outside tracing only
    when an argument is on the meta device beside a real buffer: refused (it returned silently, pass 23)."""
    if buffer.device.type != "meta" and not isinstance(buffer, FakeTensor):
        kind = f"{ids.dtype} tensor on {ids.device}"
        msg = f"block_ids = {kind}: must be a dense integer tensor holding data"
        raise BlockIdError(msg, field="block_ids", value=kind)
    return None
