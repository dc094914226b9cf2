"""The ``pallas`` backend's adapter to the :class:`kvlayout.Backend` protocol."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from kvlayout.backend import Backend
from kvlayout.errors import LayoutBufferError, TableError, short
from kvlayout.table import SegmentTable

from .plan import LANES, ROW_BYTES
from .zeroer import PallasZeroer


class PallasBackend(Backend):
    """Backend protocol adapter: holds the current buffer and swaps in each donated result.

    Thread safe: a lock chains concurrent :meth:`zero` calls through the held buffer.
    """

    name: ClassVar[str] = "pallas"
    extra: ClassVar[str | None] = "pallas"

    def __init__(self, table: SegmentTable, buffer: Any, *, offset: int = 0, **kwargs: Any) -> None:
        self.table = table
        self.offset = offset
        self.zeroer = PallasZeroer(table, offset=offset, **kwargs)
        self.zeroer._check_buffer(buffer)
        self.buffer = buffer
        self._nbytes: int | None = None
        self._lock = threading.Lock()
        self._kwargs = dict(kwargs, offset=offset)
        # one zeroer per cache group zeroed so far (GEOMETRY.md section 7), made on first use
        self._by_group: dict[str | None, PallasZeroer] = {None: self.zeroer}

    @property
    def mode(self) -> str:
        return self.zeroer.mode

    def _zeroer_for(self, group: str | None) -> PallasZeroer:
        if group is not None and not isinstance(group, str):  # before the lookup: a list is unhashable
            msg = f"group = {short(group)}: must be a group name (str) or None"
            raise TableError(msg, field="group", value=repr(group))
        found = self._by_group.get(group)
        if found is None:
            found = PallasZeroer(self.table, group=group, **self._kwargs)
            found._bad = self.zeroer._bad  # one bad-id count for the buffer, whichever group
            self._by_group[group] = found
        return found

    def zero(self, block_ids: Any, group: str | None = None) -> None:
        with self._lock:
            self.buffer = self._zeroer_for(group)(self.buffer, block_ids)

    @classmethod
    def from_host(
        cls, table: SegmentTable, data: np.ndarray, *, offset: int = 0, **kwargs: Any
    ) -> PallasBackend:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.size % 4:
            raise LayoutBufferError(
                f"host bytes = {raw.size}: must be a multiple of 4", field="buffer.nbytes", value=raw.size
            )
        rows = -(-raw.size // ROW_BYTES)
        padded = np.zeros(rows * ROW_BYTES, np.uint8)
        padded[: raw.size] = raw
        be = cls(table, jnp.asarray(padded.view(np.int32).reshape(rows, LANES)), offset=offset, **kwargs)
        be._nbytes = raw.size
        return be

    def to_host(self) -> np.ndarray:
        self.zeroer.check()
        with self._lock:
            out = np.asarray(jax.device_get(self.buffer)).reshape(-1).view(np.uint8)
        return out[: self._nbytes].copy() if self._nbytes is not None else out.copy()
