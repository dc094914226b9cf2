"""One place for input rules: integers in range, names, block ids, offsets and host buffers.

Every rule raises a :class:`~kvlayout.errors.KVLayoutError` subclass whose message is
``field = value: why`` (:func:`~kvlayout.errors.bad_value`), before anything is written.
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata
from typing import Any

import numpy as np

from .errors import BackendError, BlockIdError, KVLayoutError, LayoutBufferError, bad_value, short
from .ranges import INT32_MAX, MAX_BLOCKS, MAX_BYTES

#: NumPy's own integer scalar types (a subclass of one may redefine its comparisons: :func:`is_int`).
_NUMPY_INTS = frozenset(
    t for t in set(np.sctypeDict.values()) if issubclass(t, np.integer) and t is not np.timedelta64
)
#: What an ``int`` subclass must take from ``int`` itself to be an integer here: every operator, reading
#: and method (a ``__lt__`` answering False for ``-512 < 0`` placed a zeroer 512 B before its buffer, and
#: routed ids 4 blocks off: pass 32). Its repr, str, hash and pickling are its own (an ``IntEnum``'s).
_INT_OWN = frozenset(dir(int)) - {
    "__new__", "__init__", "__init_subclass__", "__subclasshook__", "__hash__", "__repr__", "__str__",
    "__format__", "__reduce__", "__reduce_ex__", "__dir__", "__doc__", "__class__", "__sizeof__",
    "__getnewargs__", "__setattr__", "__delattr__", "__getstate__",
}

_MRO = type.__dict__["__mro__"]
_CLASS_DICT = type.__dict__["__dict__"]


def is_int(v: object) -> bool:
    """A real integer (bools are not, nor NumPy timedeltas: a subclass of ``np.integer``, nor a subclass of
    NumPy's integer types, nor an ``int`` subclass whose readings disagree or that redefines any of int's
    operators: :func:`honest_int`)."""
    kind = type(v)  # the real type: an object's own __class__ may say int (isinstance believes it: pass 33)
    if kind is int:
        return True
    if issubclass(kind, np.integer):
        return kind in _NUMPY_INTS
    return issubclass(kind, int) and not issubclass(kind, bool) and honest_int(v)  # type: ignore[arg-type]


#: Most block ids in one call (a NumPy array's size; the cuda kernels' grids and routed offsets are int32).
MAX_IDS = INT32_MAX
#: Why an ``int`` subclass that :func:`honest_int` refuses is no integer.
LYING_INT_WHY = "an int subclass that redefines int's operators or reads differently is no integer"


def honest_int(v: int) -> bool:
    """Whether an ``int`` (subclass) takes every operator and reading from int itself (:data:`_INT_OWN`):
    one whose ``int()`` or ``__index__()`` disagreed with its value would be a different id on different
    paths (the vLLM plugin's torch check, the JAX zeroers' NumPy check), one whose comparisons lie passes
    range checks it fails (pass 32); both are refused. An ``IntEnum`` member keeps int's own. The classes
    are read past any metaclass's own ``__mro__`` or ``__dict__``."""
    mro = _MRO.__get__(type(v))
    if int not in mro:  # an object whose __class__ says int
        return False
    return not any(_INT_OWN.intersection(_CLASS_DICT.__get__(c)) for c in mro[: mro.index(int)])


def id_element_why(v: object, why: str = "must be an integer block id") -> str:
    """Why ``v``, an element of a list of block ids, is refused (``why``, more precisely where it can be)."""
    if issubclass(type(v), (bool, np.bool_)):  # the real type, not an object's own __class__
        return f"{why}, not a bool"
    if issubclass(type(v), int):
        return f"{why}: {LYING_INT_WHY}"
    return why


def plain_str(v: Any) -> Any:
    """A ``str`` subclass as the plain str it holds; anything else as it is. A group name's own ``__eq__``
    or ``__hash__`` may lie: one equal to every name chose every group's rows, and another group's cached
    plan (issue 25, pass 25)."""
    return str.__str__(v) if isinstance(v, str) and type(v) is not str else v


def plain_fields(obj: Any) -> None:
    """Every NumPy integer field of the frozen dataclass ``obj`` made a Python int, and every ``str``
    subclass (alone or in a tuple) the plain str it holds, before they are checked. NumPy's int64
    arithmetic wraps without a word (a row's extent ``5 * stride`` wrapped into range, and a wild write
    followed; issue 25, fourth pass), Python's never does; a row's group name whose own ``__eq__`` said it
    was every group made per-group zeroing clear another group's bytes (pass 26)."""
    for name, v in list(vars(obj).items()):  # the fields' values (a dataclass without slots)
        if type(v) is not int and is_int(v):
            object.__setattr__(obj, name, int(v))
        elif isinstance(v, str) and type(v) is not str:
            object.__setattr__(obj, name, str.__str__(v))
        elif type(v) is tuple and any(isinstance(x, str) and type(x) is not str for x in v):
            object.__setattr__(obj, name, tuple(plain_str(x) for x in v))


def check_int(
    cls: type[KVLayoutError], field: str, v: object, *, lo: int | None = None, hi: int = MAX_BYTES - 1
) -> int:
    """``v`` as an int in ``[lo, hi]``; the error says which bound it broke."""
    if not is_int(v):
        raise bad_value(cls, field, v, "must be an integer")
    x = int(v)  # type: ignore[call-overload]
    if lo is not None and x < lo:
        raise bad_value(cls, field, x, "must be positive" if lo == 1 else f"must be at least {lo}")
    if x > hi:
        limit = "2**62 - 1" if hi == MAX_BYTES - 1 else "2**31 - 1" if hi == MAX_BLOCKS else str(hi)
        raise bad_value(cls, field, x, f"must be at most {limit} (GEOMETRY.md section 8)")
    return x


#: Longest name (a layer, group, part or backend) a spec or table may hold.
MAX_NAME_CHARS = 4096
#: Characters a name may not hold: controls, format, surrogates, private use, unassigned (``C*``), and
#: the line and paragraph separators, which ``str.splitlines`` breaks on (a forged row; issue 25).
_UNPRINTED = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def check_name(cls: type[KVLayoutError], field: str, v: object, *, empty: bool = False) -> str:
    """A printable string (no control characters: names end up in terminal output)."""
    if not isinstance(v, str) or (not v and not empty):
        raise bad_value(cls, field, v, "must be a non-empty string" if not empty else "must be a string")
    if len(v) > MAX_NAME_CHARS:
        raise bad_value(cls, field, v, f"must be at most {MAX_NAME_CHARS} characters")
    if not v.isprintable() and any(unicodedata.category(c) in _UNPRINTED for c in v):  # fast path first
        raise bad_value(cls, field, v, "must not contain control characters or line separators")
    return v


def block_ids(ids: Any, num_blocks: int) -> np.ndarray:
    """Validate a batch of block ids; returns int64 ``[n]`` (empty and duplicates are fine).

    Accepts a list, tuple or 1-D integer NumPy array; rejects bools, floats, other types and
    anything outside ``[0, num_blocks)``. Lists are checked by C-speed passes (``map(type)``,
    NumPy), not by a Python loop, except to name the first bad element.
    """
    if isinstance(ids, np.ndarray):
        if type(ids) is not np.ndarray:  # a masked array's checks skip masked ids its data still holds
            ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":  # bool; timedelta64 is an np.integer subdtype (issue 25)
            raise bad_value(
                BlockIdError,
                "block_ids.dtype",
                str(ids.dtype),
                "must be an integer dtype",
                shown=str(ids.dtype),
            )
        if ids.ndim != 1:
            raise bad_value(BlockIdError, "block_ids.shape", ids.shape, "must be 1-D", shown=str(ids.shape))
        if ids.size > MAX_IDS:  # a broadcast view of 8 B standing for 2**40 ids: the checks below allocated
            # a 1 TiB mask, NumPy's raw MemoryError (pass 32)
            raise bad_value(BlockIdError, "block_ids.size", ids.size, f"at most {MAX_IDS} ids in one call")
        if np.issubdtype(ids.dtype, np.unsignedinteger) and ids.size and int(ids.max()) >= num_blocks:
            i = int(np.argmax(ids >= num_blocks))
            raise bad_value(BlockIdError, f"block_ids[{i}]", int(ids[i]), f"outside [0, {num_blocks})")
        arr = ids.astype(np.int64, copy=False)
    elif isinstance(ids, (list, tuple)):
        types = set(map(type, ids))  # C-speed pass; timedelta64 is an np.integer subclass (issue 25), and a
        # subclass of NumPy's own int types was read by its own __index__ (7 for a stored 2: pass 34)
        if not all(t is int or t in _NUMPY_INTS for t in types):
            odd = next(((i, v) for i, v in enumerate(ids) if not is_int(v)), None)
            if odd is not None:  # else int subclasses (IntEnum) that read the same every way (is_int)
                lying = issubclass(type(odd[1]), int) and not issubclass(type(odd[1]), bool)
                if isinstance(odd[1], tuple(_NUMPY_INTS)):  # a subclass of one (NumPy's own pass is_int)
                    why = "must be an integer of NumPy's own types, not a subclass (nothing was written)"
                else:
                    why = f"must be an integer{': ' + LYING_INT_WHY if lying else ''} (nothing was written)"
                raise bad_value(BlockIdError, f"block_ids[{odd[0]}]", odd[1], why)
        try:
            arr = np.array(ids, dtype=np.int64) if ids else np.zeros(0, np.int64)
        except OverflowError:
            i, v = next((i, v) for i, v in enumerate(ids) if not -(2**63) <= int(v) < 2**63)
            raise bad_value(BlockIdError, f"block_ids[{i}]", v, f"outside [0, {num_blocks})") from None
    else:
        why = "must be a list, tuple or integer NumPy array"
        try:  # a long container by its type and length: a deque of 10**7 ids took 1.3 s to show (pass 37)
            size = len(ids) if not isinstance(ids, (str, bytes, range)) else 0
        except Exception:  # noqa: BLE001  a container's own __len__ may raise anything: shown by repr then
            size = 0
        if size > 64:
            kind = type(ids).__name__
            raise bad_value(BlockIdError, "block_ids", kind, why, shown=f"<{kind} of {size} items>")
        raise bad_value(BlockIdError, "block_ids", ids, why)
    bad = np.flatnonzero((arr < 0) | (arr >= num_blocks)) if arr.size else np.zeros(0, np.int64)
    if bad.size:
        i = int(bad[0])
        raise bad_value(
            BlockIdError,
            f"block_ids[{i}]",
            int(arr[i]),
            f"outside [0, {num_blocks}) ({bad.size} bad ids; nothing was written)",
        )
    return arr.astype(np.int64, copy=False)


def offset_and_size(offset: Any, nbytes: int, total_bytes: int) -> int:
    """The layout ``[offset, offset + total_bytes)`` must fit ``nbytes``; ``offset`` a multiple of 4."""
    if not is_int(offset) or int(offset) < 0:
        raise bad_value(LayoutBufferError, "offset", offset, "must be a non-negative integer")
    if int(offset) % 4:
        raise bad_value(LayoutBufferError, "offset", offset, "must be a multiple of 4")
    if nbytes < int(offset) + total_bytes:
        raise bad_value(
            LayoutBufferError,
            "buffer.nbytes",
            nbytes,
            f"smaller than offset {int(offset)} + total_bytes {total_bytes}",
        )
    return int(offset)


def host_buffer(buf: Any, total_bytes: int, offset: Any) -> np.ndarray:
    """A writeable, C-contiguous NumPy buffer holding the layout; returns its bytes as uint8 ``[n]``."""
    if not isinstance(buf, np.ndarray):
        raise bad_value(LayoutBufferError, "buffer", type(buf).__name__, "must be a numpy.ndarray")
    # read as a plain ndarray before anything is checked: a subclass's own flags, nbytes or dtype may lie
    # (flags saying C-contiguous over a reversed view had 37,375 B zeroed past it: issue 25, pass 24), and
    # its own reshape (numpy.matrix stays 2-D, (1, n)) put 1-D slices on other blocks' bytes (seventh pass)
    buf = np.ndarray.view(buf, np.ndarray)
    if buf.dtype.hasobject:  # references, not bytes: NumPy cannot view them as uint8 (issue 25)
        why = "must hold plain data (its dtype holds Python object references)"
        raise bad_value(LayoutBufferError, "buffer.dtype", str(buf.dtype), why, shown=str(buf.dtype))
    if not buf.flags.c_contiguous:
        raise bad_value(LayoutBufferError, "buffer", "non-contiguous", "must be C-contiguous")
    if not buf.flags.writeable:
        raise bad_value(LayoutBufferError, "buffer", "read-only", "must be writeable")
    offset_and_size(offset, buf.nbytes, total_bytes)
    return buf.reshape(-1).view(np.uint8)  # C-contiguous: a view, never a copy


#: Largest JSON file the command line reads (a 100,000-row table is about 12 MB).
MAX_JSON_BYTES = 64 * 2**20
#: Most arrays and objects, and most values (commas), a JSON input may hold: a 100,000-row table has
#: 100,000 objects and about 800,000 values; kept to about 100 MB of Python objects.
MAX_JSON_CONTAINERS = 1_000_000
MAX_JSON_VALUES = 2_000_000


def parse_json(cls: type[KVLayoutError], what: str, text: str | bytes) -> Any:
    """``json.loads`` with every failure as ``cls``: bad syntax, bad UTF-8, nesting too deep."""
    import json

    # an upper bound on the values before any is built (and before decoding): 64 MB of "{}," made 22
    # million dicts, 1.7 GB (issue 25); brackets and commas inside strings count too (errs to refusing)
    if isinstance(text, bytes):
        containers, commas = text.count(b"{") + text.count(b"["), text.count(b",")
    else:
        containers, commas = text.count("{") + text.count("["), text.count(",")
    if containers > MAX_JSON_CONTAINERS or commas > MAX_JSON_VALUES:
        why = (
            f"holds up to {containers:,} arrays/objects and {commas + 1:,} values: at most "
            f"{MAX_JSON_CONTAINERS:,} and {MAX_JSON_VALUES:,} are read"
        )
        raise bad_value(cls, what, "too many values", why)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise bad_value(cls, what, f"byte {e.start}", "is not UTF-8 text") from None
    try:
        return json.loads(text, parse_int=_json_int, object_pairs_hook=_unique_keys)
    except _RepeatedKey as e:
        why = "appears twice in one object: JSON keys must be unique (which one was meant is not guessed)"
        raise bad_value(cls, f"{what} key", e.args[0], why) from None
    except json.JSONDecodeError as e:
        raise cls(f"{what} is not valid JSON: {e}", field="json", value=None) from None
    except RecursionError:
        raise bad_value(cls, what, "nested arrays/objects", "nesting too deep") from None
    except _LongInt as e:
        why = f"an integer literal of {e.digits} digits: at most {MAX_JSON_INT_DIGITS} allowed"
        raise bad_value(cls, what, e.shown, why) from None


#: Longest integer literal a JSON input may hold (Python's own ``int(str)`` limit; every
#: quantity kvlayout accepts is below 2**62, 19 digits).
MAX_JSON_INT_DIGITS = 4300


class _LongInt(Exception):
    """An integer literal longer than :data:`MAX_JSON_INT_DIGITS` (turned into ``cls`` above)."""

    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.digits = len(literal.lstrip("-"))
        self.shown = f"{literal[:20]}...({self.digits} digits)"


class _RepeatedKey(Exception):
    """A key written twice in one JSON object, its one argument (made ``cls`` in :func:`parse_json`)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: an object whose keys are unique. ``json.loads`` alone keeps the last of a
    repeated key, so ``{"num_blocks": 4, "num_blocks": 100000}`` read as 100,000 blocks without a word
    (issue 25, ninth pass)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _RepeatedKey(k)
            seen.add(k)
    return obj


def _json_int(literal: str) -> int:
    """``parse_int`` hook: refuse literals whose conversion would raise (or take quadratic time)."""
    if len(literal.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise _LongInt(literal)
    try:
        return int(literal)
    except ValueError:  # the interpreter's limit was set lower (sys.set_int_max_str_digits)
        raise _LongInt(literal) from None


def _read_capped(path: str, cap: int) -> bytes:
    """At most ``cap + 1`` bytes of ``path``. Opened without blocking, then read blocking:
    a FIFO nobody writes to reads as empty instead of hanging in ``open`` forever (issue 25), and a
    pipe with a writer (``<(cat spec.json)``) is read whole."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        os.set_blocking(fd, True)
        with open(fd, "rb", closefd=False) as f:
            return f.read(cap + 1)
    finally:
        os.close(fd)


def read_json_file(cls: type[KVLayoutError], what: str, path: str, max_bytes: int | None = None) -> Any:
    """Read and parse a JSON file of at most ``max_bytes`` (default :data:`MAX_JSON_BYTES`; an endless
    ``/dev/zero`` is refused once one byte past the cap is read: about 0.2 s and 100 MB)."""
    cap = MAX_JSON_BYTES if max_bytes is None else max_bytes
    try:
        data = _read_capped(path, cap)
    except OSError as e:
        raise bad_value(cls, what, path, e.strerror or str(e)) from None
    if len(data) > cap:
        raise bad_value(cls, what, path, f"larger than {cap} B")
    return parse_json(cls, f"{what} {path!r}", data)


def check_option(name: str, value: Any, *, power_of_two: bool = False, limit: int = INT32_MAX) -> int:
    """A positive integer backend option (not a bool), optionally a power of two, at most ``limit``."""
    ok = is_int(value) and 0 < value <= limit  # no bools, no timedeltas (issue 25)
    if ok and power_of_two:
        ok = value & (value - 1) == 0
    if not ok:
        what = "a positive power of two" if power_of_two else "a positive integer"
        why = f"{name} = {short(value)}: must be {what}, at most {limit}"
        raise BackendError(why, field=name, value=value)
    return int(value)
