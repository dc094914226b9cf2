"""Error types. Every validation failure is a :class:`KVLayoutError` naming the field and value."""

from __future__ import annotations

import reprlib
from typing import Any, TypeVar

E = TypeVar("E", bound="KVLayoutError")


class KVLayoutError(ValueError):
    """Base class for every error kvlayout raises on bad input.

    ``field`` names what was wrong (a JSON path like ``groups[0].layers[2].dtype``) and
    ``value`` holds the offending value, so callers and the CLI can report one clear line.
    """

    def __init__(self, message: str, *, field: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class SpecError(KVLayoutError):
    """A layout spec (JSON or dataclass) is malformed or cannot be planned."""


class TableError(KVLayoutError):
    """A segment table is malformed (missing columns, wrong types)."""


class BlockIdError(KVLayoutError):
    """Block ids are not a 1-D batch of integers inside ``[0, num_blocks)``."""


class LayoutBufferError(KVLayoutError):
    """A buffer has the wrong size, dtype, device or layout for a table."""


class BackendError(KVLayoutError):
    """A backend name is unknown, cannot be imported, or its extra is not installed."""


def spec_error(field: str, value: Any, why: str) -> SpecError:
    """Build a :class:`SpecError` whose message is ``field = value: why``."""
    return bad_value(SpecError, field, value, why)


def bad_value(cls: type[E], field: str, value: Any, why: str, *, shown: str | None = None) -> E:
    """The one message form for bad input: ``field = value: why`` (value shown with repr, shortened)."""
    shown = short(value) if shown is None else _cut(shown)
    return cls(f"{field} = {shown}: {why}", field=field, value=value)


def _short_int(v: int) -> str:
    """An integer's repr, or its size when the repr would pass the interpreter's 4,300-digit limit
    (a product of hostile config values; ``repr`` would raise ``ValueError``)."""
    bits = int.bit_length(v)  # int's own: a subclass's methods are not asked
    if bits <= 256:
        return int.__repr__(v)
    return f"<an integer of {bits:,} bits>"


class _Repr(reprlib.Repr):
    """``reprlib``'s bounded repr (nesting, items, strings), integers by :func:`_short_int`."""

    def repr_int(self, x: int, level: int) -> str:
        return _short_int(x)


_REPR = _Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 4, 80, 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 24


def short(value: Any) -> str:
    """``repr(value)`` cut to 80 characters: a user's 50,000-character name is not echoed whole, and
    a list nested 100,000 deep is shown to four levels (its full repr raised RecursionError; issue 25)."""
    kind = type(value)  # the real type: an object's own __class__ may say int (pass 33)
    if kind is bool:
        return repr(value)
    if issubclass(kind, int):
        return _cut(_short_int(value))
    if issubclass(kind, str):
        return _cut(repr(str.__str__(value)[:100]))
    if issubclass(kind, (list, tuple, dict, set, frozenset)):
        return _cut(_REPR.repr(value))
    try:
        return _cut(repr(value))
    except Exception:  # noqa: BLE001  # a repr that recurses or fails: the type is enough to name it
        return f"<{type(value).__name__}>"


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
