"""The backend protocol every zeroer implements (built-in and third-party alike).

A backend is constructed once per (table, buffer) and then called every step, the
plan/run split of FlashInfer: all table preparation happens in ``__init__``; ``zero`` only
launches work. ``from_host``/``to_host`` move a host byte image in and out of the backend's
native buffer type, which is what the CLI and the conformance suite use.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from . import validate
from .table import SegmentTable


class Backend(abc.ABC):
    """Zero blocks of one buffer laid out by one segment table.

    Subclasses set ``name`` and ``extra`` (the ``pip install 'kvlayout[extra]'`` that brings
    their dependencies), validate the buffer in ``__init__`` and block ids in ``zero``
    *before* writing anything, and report in ``mode`` how they run (``native``,
    ``interpreter``, ``tpu-interpret``, ...).
    """

    name: ClassVar[str] = ""
    extra: ClassVar[str | None] = None

    table: SegmentTable
    offset: int

    @abc.abstractmethod
    def __init__(self, table: SegmentTable, buffer: Any, *, offset: int = 0) -> None:
        """Prepare to zero ``buffer``, whose layout starts ``offset`` bytes in."""

    @property
    @abc.abstractmethod
    def mode(self) -> str:
        """How this backend runs here."""

    @abc.abstractmethod
    def zero(self, block_ids: Any, group: str | None = None) -> None:
        """Zero ``block_ids`` of cache ``group`` (``None``: every group; GEOMETRY.md section 7).

        Validated first: nothing is written on bad ids or an unknown group.
        """

    @classmethod
    @abc.abstractmethod
    def from_host(cls, table: SegmentTable, data: np.ndarray, *, offset: int = 0) -> Backend:
        """A backend over a native copy of the host bytes ``data`` (uint8 ``[n]``)."""

    @abc.abstractmethod
    def to_host(self) -> np.ndarray:
        """The buffer's bytes now, as uint8 ``[n]`` on the host (synchronises)."""


def validate_host_buffer(buf: Any, table: SegmentTable, offset: int) -> np.ndarray:
    """Check a NumPy buffer against a table; return its bytes as a uint8 ``[n]`` view."""
    return validate.host_buffer(buf, table.total_bytes, offset)


def check_offset_and_size(offset: Any, nbytes: int, table: SegmentTable) -> int:
    """Shared size check: the layout ``[offset, offset + total_bytes)`` must fit the buffer; the
    offset as a Python int (a NumPy int8 offset wrapped in ``offset + 16``; issue 25, fifth pass)."""
    return validate.offset_and_size(offset, nbytes, table.total_bytes)
