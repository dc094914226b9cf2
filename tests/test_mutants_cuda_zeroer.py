"""The cuda zeroer's host code at full mutation score (issue 25): CPU rules and the native paths.

Two halves. The rules that run here anyway (option checks, id staging, plans, ``zero_into``,
routing bounds, ``check()``) are checked on poisoned buffers with guard bands on both sides
(the layout sits at ``offset`` inside a larger buffer: bytes outside it must never change).
The native host logic (graph capture and replay, pinned staging, slots, events, streams) is
run on the CPU through :class:`FakeCuda`, a test double of the few ``torch.cuda`` objects the
zeroer uses, injected by monkeypatch into ``backends/cuda/zeroer.py`` only, with ``MODE`` set to
``"native"``; the Triton kernels still run under the interpreter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import kvlayout as K

torch = pytest.importorskip("torch")
kc = pytest.importorskip("kvlayout.backends.cuda")
Z = pytest.importorskip("kvlayout.backends.cuda.zeroer")

pytestmark = pytest.mark.skipif(kc.MODE == "native", reason="CPU rules and the CUDA double: interpreter only")

GUARD = 64  # poisoned bytes before and after the layout


def wide(num_blocks: int = 6) -> K.SegmentTable:
    """One 8 KB row per block (2,048 words): one unit of the default chunk, two of the small one."""
    layer = K.FullAttentionSpec(name="w", block_size=16, num_kv_heads=1, head_size=128, dtype="bfloat16")
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", (K.GroupSpec("g", (layer,)),)))


def tiny(num_blocks: int = 6, groups: bool = False) -> K.SegmentTable:
    """One 512 B page per block and layer; ``groups``: g holds layers a and c, h holds b."""
    layer = [
        K.FullAttentionSpec(name=n, block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
        for n in "abc"
    ]
    gs = (K.GroupSpec("g", (layer[0], layer[2])), K.GroupSpec("h", (layer[1],))) if groups else None
    return K.plan(K.KVCacheSpec(num_blocks, "BLHNC", gs or (K.GroupSpec("g", (layer[0],)),)))


class Case:
    """A poisoned buffer holding ``table`` at ``GUARD`` with guard bands, and its expected bytes."""

    def __init__(self, table: K.SegmentTable, seed: int = 3) -> None:
        self.table = table
        self.data = K.poison_pattern(table.total_bytes + 2 * GUARD, seed=seed)
        self.buf = torch.from_numpy(self.data.copy())
        self.done: list[tuple[list[int], str | None]] = []

    def zeroer(self, **kw: Any) -> Any:
        kw.setdefault("graphs", False)
        return kc.CudaZeroer(self.table, self.buf, offset=GUARD, **kw)

    def expect(self, ids: list[int], group: str | None = None) -> None:
        """Add ``ids`` (of ``group``) to what must be zero and compare every byte, guards included."""
        self.done.append((list(ids), group))
        want = self.data.copy()
        for done, g in self.done:
            K.zero_blocks_numpy(want[GUARD : GUARD + self.table.total_bytes], self.table, done, group=g)
        got = self.buf.numpy()
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"bytes differ at {bad[:8].tolist()} (layout at {GUARD})"


def raises(exc: type[Exception], call: Callable[[], Any], field: str, value: Any, message: str) -> None:
    with pytest.raises(exc) as info:
        call()
    assert str(info.value) == message
    assert (info.value.field, info.value.value) == (field, value)  # type: ignore[attr-defined]


class Recorder:
    """Stands in for a Triton kernel object: records ``kernel[grid](*args, **kwargs)``, runs nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *a, **kw: self.calls.append((grid, a, kw))


# ---- the two reported defects ---------------------------------------------------------------


def test_routed_batches_past_int32_offsets_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """route_ids_kernel indexes ids with int32 offsets: 2**31 ids are refused, 2**31 - 1 launch."""
    c = Case(tiny())
    z = c.zeroer(max_batch=4)
    route, units = Recorder(), Recorder()
    monkeypatch.setattr(Z, "route_ids_kernel", route)
    monkeypatch.setattr(Z, "zero_units_kernel", units)
    huge = torch.zeros(1, dtype=torch.int64).expand(2**31)  # 2**31 ids, 8 bytes of memory
    raises(
        K.BlockIdError,
        lambda: z.launch_routed(huge, 6, 18),
        "block_ids.size",
        2**31,
        f"block_ids.size = {2**31}: at most {2**31 - 1} ids in one call",
    )
    assert route.calls == [] and units.calls == [] and len(z._slots) == 1 and not z._slots[0].busy
    # the largest batch that fits still launches (a routed buffer as large as the batch, no memory: the
    # expanded ids are launched on as they are, where launch_routed would make them dense, 16 GiB)
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.Tensor, "is_contiguous", lambda self, *a, **k: True)
    monkeypatch.setattr(Z, "check_id_tensor", lambda ids: None)  # a broadcast view is refused since pass 33
    edge = huge[: 2**31 - 1]
    z._slots[0].routed = edge
    z.launch_routed(edge, 6, 18)
    ((grid, args, _),) = route.calls
    assert grid == (2**21,) and args[4] == 2**31 - 1  # cdiv(2**31 - 1, 1024) programs, n
    assert units.calls[0][1][1].numel() == 2**31 - 1
    c.expect([])


def test_check_names_the_bound_of_routed_launches() -> None:
    """After a routed launch, a bad id is one outside [0, id_limit) (the global pool), not num_blocks."""
    c = Case(tiny())
    z = c.zeroer()
    z.launch_routed(torch.tensor([18, 8, -1, 13]), 6, 18)  # 8 and 13 are local 2 and 7 (other shard)
    with pytest.raises(K.BlockIdError) as info:
        z.check()
    assert str(info.value).startswith("device block_ids: 2 work items had an id outside [0, 18) (e.g. ")
    assert info.value.value in (18, -1)
    c.expect([2])
    z.check()  # reported once
    z._launch(torch.tensor([6]))  # a launch of this buffer's own ids: its bound is num_blocks (the routed
    with pytest.raises(K.BlockIdError, match=r"outside \[0, 6\) \(e\.g\. 6\)"):  # bound was checked)
        z.check()
    z.launch_routed(torch.tensor([18]), 6, 18)
    z._launch(torch.tensor([6]))  # both since the last check: both named
    with pytest.raises(K.BlockIdError, match=r"outside \[0, 6\) or \[0, 18\) \(e\.g\. (6|18)\)"):
        z.check()
    fresh = c.zeroer()
    fresh._launch(torch.tensor([7, 0]))
    raises(
        K.BlockIdError,
        fresh.check,
        "block_ids",
        7,
        "device block_ids: 1 work items had an id outside [0, 6) (e.g. 7); they wrote nothing",
    )
    c.expect([0])


# ---- a CPU double of torch.cuda, for the native host logic --------------------------------------


class FakeEvent:
    """``torch.cuda.Event``: complete (``query()``) once every record of it has run on the device."""

    def __init__(self, cuda: FakeCuda, external: bool) -> None:
        self.cuda, self.external, self.pending, self.records = cuda, external, 0, 0

    def record(self, stream: Any = None) -> None:
        self.cuda.record(self, stream)

    def query(self) -> bool:
        return self.pending == 0  # an event never recorded is complete, as in CUDA


class FakeStream:
    """``torch.cuda.Stream``: a name; ``wait_stream`` is logged (one device timeline: see FakeCuda)."""

    def __init__(self, cuda: FakeCuda, name: str, mine: bool = True) -> None:
        self.cuda, self.name, self.mine = cuda, name, mine  # mine: a stream of the buffer's device

    def wait_stream(self, other: FakeStream) -> None:
        self.cuda.log.append(("wait", self.name, other.name))

    def __repr__(self) -> str:
        return self.name


class FakeGraph:
    """``torch.cuda.CUDAGraph``: what the capturing thread enqueues between ``capture_begin`` and
    ``capture_end`` (kernel launches, in-place tensor writes, event records) is kept, not run; each
    ``replay()`` enqueues it again, and it then reads the buffers as they are at that moment."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.captured = cuda, False
        self.nodes: list[tuple[str, Any]] = []

    def capture_begin(self, capture_error_mode: str = "global") -> None:
        assert self.cuda.graph is None and not self.captured, "nested or repeated capture"
        self.cuda.log.append(("capture_begin", capture_error_mode))
        self.cuda.graph = self

    def capture_end(self) -> None:
        assert self.cuda.graph is self
        self.cuda.graph, self.captured = None, True
        self.cuda.log.append(("capture_end", len(self.nodes)))

    def replay(self) -> None:
        assert self.captured and self.cuda.graph is None, "replay of a graph not captured, or mid-capture"
        self.cuda.log.append(("replay", id(self)))
        for node in self.nodes:
            self.cuda.submit(node)


class _Defer(torch.overrides.TorchFunctionMode):
    """Routes in-place tensor writes (the device work torch enqueues: ``copy_``, ``zero_``) to FakeCuda."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.cuda = cuda

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "to" and not self.cuda.running:  # a move to the device: host memory is copied
            out = func(*args, **kwargs)
            where = kwargs.get("device", args[1] if len(args) > 1 else None)
            if isinstance(where, (str, torch.device)) and self.cuda.is_host(out):
                out = out.clone()
            return out
        if self.cuda.running or not (name.endswith("_") and not name.startswith("_")):
            return func(*args, **kwargs)
        if name == "copy_":
            self.cuda.copied(args[0], args[1], bool(kwargs.get("non_blocking", False)))
        self.cuda.enqueue(("run", lambda: func(*args, **kwargs)))
        return args[0]


class _Kernel:
    """A Triton kernel object seen through FakeCuda: ``kernel[grid](...)`` is enqueued as device work."""

    def __init__(self, cuda: FakeCuda, real: Any, name: str) -> None:
        self.cuda, self.real, self.name = cuda, real, name

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            if self.cuda.graph is not None and not self.cuda.launch_capturable:
                raise RuntimeError("kernel launch not capturable (test double)")
            if any(isinstance(a, torch.Tensor) and self.cuda.is_host(a) for a in args):
                raise RuntimeError("a kernel given host memory (test double: an illegal address natively)")
            if not self.cuda.current.mine:
                raise RuntimeError("a launch on another device's stream (test double)")
            # Triton compiles a variant per constexprs, dtypes and 16-byte pointer alignment at its first
            # launch, loading a module: not permitted while a stream captures
            variant = (
                self.name,
                tuple(sorted(kwargs.items())),
                tuple((a.dtype, a.data_ptr() % 16 == 0) for a in args if isinstance(a, torch.Tensor)),
            )
            if variant not in self.cuda.compiled:
                if self.cuda.graph is not None:
                    raise RuntimeError("kernel compiled during capture (test double)")
                self.cuda.compiled.add(variant)
            self.cuda.log.append(("launch", self.name, repr(self.cuda.current), grid))
            self.cuda.enqueue(("run", lambda: self.real[grid](*args, **kwargs)))

        return launch


class FakeCuda:
    """The ``torch.cuda`` calls of ``backends/cuda/zeroer.py``, on the CPU. Assumptions, each how CUDA
    behaves where the zeroer relies on it (and where this double is simpler):

    - Device work (kernel launches, in-place tensor writes such as ``copy_``/``zero_``, event records)
      runs in the order it is enqueued, at once, except: while a graph captures it is kept in the graph
      (:class:`FakeGraph`), and while ``hold`` is set it waits in one queue until :meth:`finish` (the
      device lagging behind the host). Host writes (NumPy views of pinned memory) happen at once: a
      staging buffer rewritten before the copy out of it ran shows as wrong bytes.
    - A kernel variant (constexprs, dtypes, 16-byte pointer alignment) launched for the first time
      during a capture fails (Triton compiles and loads it then); ``current_stream(None)``,
      ``Stream(None)``: the current device's, not the buffer's (a launch there fails);
      ``synchronize(None)`` is logged as the current device's. A copy of mismatched shapes fails when
      it is enqueued.
    - Every stream shares that one queue, so the double cannot show a race between two streams: the
      zeroer's stream bookkeeping (the slot a stream may reuse, ``wait_stream``) is checked through the
      calls it logs instead.
    - An event is complete once every record of it has run (a never-recorded event is complete).
    - ``synchronize()`` runs everything queued. ``is_current_stream_capturing()`` is True mid-capture.
    - Tensors made without a device (``torch.zeros``/``empty``/``from_numpy``) are host memory: a kernel
      given one fails (an illegal address natively) until ``.to(device)`` copies it to the device.
      The device itself is the CPU: the zeroer's buffer and the test's id tensors live "on the device".
    - ``get_device_properties(None)`` describes the current device, here not the buffer's (3 SMs, not 5).
    - Pinned memory (``torch.empty(..., pin_memory=True)``) is ordinary CPU memory, remembered as pinned;
      a copy inside a capture must be ``non_blocking`` (a blocking copy synchronises), and may be refused
      (``copy_capturable=False``: a torch that cannot capture it), as may a graph's own event record
      (``signal_capturable=False``), an event made with ``external=True`` (``external_events=False``:
      a torch without that argument raises ``TypeError``), or any kernel launch (``launch_capturable``).
    """

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.queue: list[tuple[str, Any]] = []
        self.graph: FakeGraph | None = None
        self.hold = False
        self.running = False
        self.pinned: set[int] = set()
        self.host: list[torch.Tensor] = []
        self.host_ptrs: set[int] = set()
        self.copy_capturable = self.signal_capturable = self.external_events = self.launch_capturable = True
        self.default = FakeStream(self, "default")
        self.elsewhere = FakeStream(self, "current device's", mine=False)
        self.compiled: set[Any] = set()
        self.current = self.default
        self.streams = 0

    # the torch.cuda namespace the zeroer calls
    def Event(self, external: bool = False) -> FakeEvent:  # noqa: N802 (torch's name)
        if external and not self.external_events:
            raise TypeError("Event() got an unexpected keyword argument 'external'")
        return FakeEvent(self, external)

    def Stream(self, device: Any = None) -> FakeStream:  # noqa: N802
        self.streams += 1
        return FakeStream(self, f"side{self.streams}", mine=device is not None)

    def CUDAGraph(self) -> FakeGraph:  # noqa: N802
        return FakeGraph(self)

    def current_stream(self, device: Any = None) -> FakeStream:
        return self.current if device is not None else self.elsewhere

    @contextmanager
    def stream(self, s: FakeStream | None) -> Iterator[None]:
        if s is None:  # as torch: no stream, no change
            yield
            return
        before, self.current = self.current, s
        self.log.append(("stream", s.name))
        try:
            yield
        finally:
            self.current = before

    def synchronize(self, device: Any = None) -> None:
        self.log.append(("synchronize",) if device is not None else ("synchronize", "current device"))
        self.finish()

    def is_current_stream_capturing(self) -> bool:
        return self.graph is not None

    def get_device_properties(self, device: Any) -> Any:
        # None is the current device: here another GPU than the buffer's, with fewer SMs
        return SimpleNamespace(multi_processor_count=3 if device is None else 5)

    def host_memory(self, t: torch.Tensor) -> torch.Tensor:
        """Mark ``t`` as host memory (kept alive: its address is never reused meanwhile)."""
        if t.untyped_storage().data_ptr():
            self.host.append(t)
            self.host_ptrs.add(t.untyped_storage().data_ptr())
        return t

    def is_host(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.host_ptrs

    # the device timeline
    def record(self, event: FakeEvent, stream: Any) -> None:
        if self.graph is not None and not (event.external and self.signal_capturable):
            raise RuntimeError("event record not capturable (test double)")
        self.log.append(("record", id(event), repr(stream or self.current)))
        self.enqueue(("record", event))

    def copied(self, dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
        pinned = src.untyped_storage().data_ptr() in self.pinned
        self.log.append(("copy", pinned, non_blocking))
        if torch.broadcast_shapes(dst.shape, src.shape) != dst.shape:  # checked when enqueued, as torch
            raise RuntimeError(f"copy_ of {tuple(src.shape)} into {tuple(dst.shape)} (test double)")
        if self.graph is not None and (not non_blocking or (pinned and not self.copy_capturable)):
            raise RuntimeError("copy not capturable (test double)")

    def enqueue(self, node: tuple[str, Any]) -> None:
        if self.graph is not None:
            self.graph.nodes.append(node)
        else:
            self.submit(node)

    def submit(self, node: tuple[str, Any]) -> None:
        if node[0] == "record":
            node[1].pending += 1
        self.queue.append(node)
        if not self.hold:
            self.finish()

    def finish(self, nodes: int | None = None) -> None:
        """Run the queued device work, in order (only its first ``nodes`` items if given)."""
        self.running = True
        try:
            while self.queue and (nodes is None or nodes > 0):
                nodes = None if nodes is None else nodes - 1
                kind, what = self.queue.pop(0)
                if kind == "record":
                    what.pending -= 1
                    what.records += 1
                else:
                    what()
        finally:
            self.running = False


class _CWithoutDisable:
    """``torch._C`` with ``DisableTorchFunction`` a no-op: :class:`_Defer`, a TorchFunctionMode, stands for
    the device's asynchrony here, which the zeroer's guard against a caller's own mode must not switch off
    (only inside this double)."""

    DisableTorchFunction = contextlib.nullcontext

    def __getattr__(self, name: str) -> Any:
        return getattr(torch._C, name)


class _TorchWithFakeCuda:
    """The ``torch`` module as backends/cuda/zeroer.py sees it: ``cuda`` is the double, tensors made
    without a device (pinned or not, or from NumPy) are host memory, everything else is torch itself."""

    _C = _CWithoutDisable()

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def empty(self, *args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        t = torch.empty(*args, **kwargs)
        if pin_memory:
            self.cuda.pinned.add(t.untyped_storage().data_ptr())
        return self.cuda.host_memory(t) if kwargs.get("device") is None else t

    def zeros(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        t = torch.zeros(*args, **kwargs)
        return self.cuda.host_memory(t) if kwargs.get("device") is None else t

    def from_numpy(self, array: np.ndarray) -> torch.Tensor:
        return self.cuda.host_memory(torch.from_numpy(array))


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    """The zeroer module in native mode over :class:`FakeCuda` (the kernels still interpreted)."""
    fake = FakeCuda()
    monkeypatch.setattr(Z, "torch", _TorchWithFakeCuda(fake))
    monkeypatch.setattr(Z, "MODE", "native")
    monkeypatch.setattr(Z, "zero_units_kernel", _Kernel(fake, Z.zero_units_kernel, "zero"))
    monkeypatch.setattr(Z, "route_ids_kernel", _Kernel(fake, Z.route_ids_kernel, "route"))
    with _Defer(fake):
        yield fake
    assert not fake.queue, "device work left queued: call finish()"


def events(cuda: FakeCuda, kind: str) -> list[tuple[Any, ...]]:
    return [e for e in cuda.log if e[0] == kind]


def test_construction_captures_a_ring_of_replay_graphs(cuda: FakeCuda) -> None:
    """Natively the constructor captures, per ring entry and batch bucket, (copy [count, ids], launch,
    signal); a host batch then fills a free entry's pinned buffer and replays its bucket's graph."""
    c = Case(tiny())
    z = c.zeroer(graphs=True, max_batch=5)
    assert z.graphs and z.graph_copy is True and z.max_programs == 5 * Z.DEFAULT_PROGRAMS_PER_SM
    assert len(z._replays) == Z.GRAPH_RING and z._captured == {None}
    chunk = z.plan_for_batch(1).plan.chunk_words
    for r in z._replays:
        assert sorted(r.graphs) == [(None, z.plan_for_batch(b).plan.chunk_words, b) for b in (1, 2, 4, 5)]
        assert r.pinned.shape == (6,) and r.pinned.dtype == torch.int64
        assert r.pinned.untyped_storage().data_ptr() in cuda.pinned
        assert r.dev.shape == (6,) and not r.dev.any() and r.view.base is not None
        assert r.dev.dtype == torch.int64  # ids past 2**24 stay exact (float32 would round them)
        assert r.signal is not None and r.signal.external and r.done is r.signal and not r.busy
        assert all(len(g.nodes) == 3 for g in r.graphs.values())  # copy, launch, signal
    assert chunk == 1024
    log = cuda.log
    assert log[0] == ("synchronize",) and log[-1] == ("synchronize",)
    assert len(events(cuda, "capture_begin")) == 16 and {e[1] for e in events(cuda, "capture_begin")} == {
        "thread_local"
    }
    # every capture runs on a side stream that waits for the current one, and the current one waits back
    waits = events(cuda, "wait")
    assert len(waits) == 32 and all(w[2] == "default" for w in waits[::2])
    assert all(w[1] == "default" for w in waits[1::2]) and waits[0][1] == waits[1][2]
    assert all(e[2] != "default" for e in events(cuda, "launch"))
    c.expect([])  # warm-up launches (count 0) and captures wrote nothing
    before = len(cuda.log)
    z.zero([1, 3, 1])
    assert cuda.log[before:] == [("replay", id(z._replays[0].graphs[(None, chunk, 4)]))]
    assert z._replays[0].view[:4].tolist() == [3, 1, 3, 1] and z._replays[0].signal.records == 1
    c.expect([1, 3])
    for ids in ([5], [0, 2, 4, 2, 0], [], [4, 4]):
        z.zero(ids)
        c.expect(ids)
    assert z._next_replay == 1  # five batches over four entries in turn ([] takes one, replays nothing)
    assert [r.signal.records for r in z._replays] == [2, 1, 1, 0]
    assert not any(r.busy for r in z._replays)


def test_replays_wait_for_their_entry_and_fall_back_to_eager_launches(cuda: FakeCuda) -> None:
    """An entry is reused only once the signal its last replay recorded has completed: with the device
    held back, four batches take the four entries and a fifth launches eagerly from a pinned staging
    buffer; every batch's bytes are right once the device catches up (its ids read at that time)."""
    c = Case(tiny(8))
    z = c.zeroer(graphs=True, max_batch=4)
    cuda.hold = True
    batches = [[1], [2, 3], [4], [5, 6, 7], [0]]
    for ids in batches:
        z.zero(ids)
    assert len(events(cuda, "replay")) == 4 and not any(r.signal.query() for r in z._replays)
    assert len(z._staging) == 1 and len(z._slots) == 1  # the fifth: staged and launched eagerly
    st = z._staging[0]
    assert st.done is not None and not st.done.query() and not st.busy and st.view[0] == 0
    c.expect([])  # nothing ran yet
    cuda.finish()
    c.expect(sorted(i for ids in batches for i in ids))
    assert all(r.signal.query() for r in z._replays) and st.done.query()
    cuda.hold = False
    z.zero([3])  # entries free again: a replay
    assert cuda.log[-1][0] == "replay"


def test_graphs_without_a_signal_or_a_captured_copy(cuda: FakeCuda) -> None:
    """Torch versions that cannot record the external event in a graph, cannot make one, or cannot
    capture the copy out of pinned memory: the graphs hold less and the host does the rest."""
    cuda.signal_capturable = False
    c = Case(tiny())
    z = c.zeroer(graphs=True, max_batch=2)
    assert z.graph_copy is True
    for r in z._replays:
        assert r.signal is None and r.done is None and all(len(g.nodes) == 2 for g in r.graphs.values())
    z.zero([4, 2])
    r = z._replays[0]
    assert r.done is not None and not r.done.external and r.done.records == 1
    assert events(cuda, "record")[-1][2] == "default"
    first = r.done
    z.zero([1])
    z.zero([1])
    z.zero([1])
    z.zero([5])  # the first entry again: its host event is recorded again, not replaced
    assert z._replays[0].done is first and first.records == 2
    c.expect([1, 2, 4, 5])

    cuda2 = cuda
    cuda2.signal_capturable, cuda2.copy_capturable = True, False
    c = Case(tiny(), seed=5)
    z = c.zeroer(graphs=True, max_batch=2)
    assert z.graph_copy is False
    assert all(r.signal is not None for r in z._replays)
    assert all(len(g.nodes) == 2 for r in z._replays for g in r.graphs.values())  # launch, signal
    n = len(cuda.log)
    z.zero([3, 0])
    assert cuda.log[n:] == [("copy", True, True), ("replay", id(z._replays[0].graphs[(None, 1024, 2)]))]
    c.expect([0, 3])

    cuda.external_events, cuda.copy_capturable = False, True
    c = Case(tiny(), seed=6)
    z = c.zeroer(graphs=True, max_batch=1)
    assert z.graph_copy is True and all(r.signal is None and r.done is None for r in z._replays)
    z.zero([2])
    c.expect([2])
    assert z._replays[0].done.records == 1

    cuda.launch_capturable = False
    with pytest.raises(RuntimeError, match="kernel launch not capturable"):
        Case(tiny()).zeroer(graphs=True, max_batch=1)
    assert cuda.graph is None


def test_capture_per_group_and_without_graphs(cuda: FakeCuda) -> None:
    """``capture(group)`` adds that group's graphs to every entry (a bad group raises first); host
    batches of a group without graphs launch eagerly; ``graphs=False`` never captures."""
    c = Case(tiny(groups=True))
    z = c.zeroer(graphs=True, max_batch=3)
    assert {k[0] for r in z._replays for k in r.graphs} == {None}
    n = len(cuda.log)
    z.zero([1], "h")  # no graphs for h yet: staged and launched eagerly
    c.expect([1], "h")
    assert [e[0] for e in cuda.log[n:]] == ["copy", "record", "launch", "record"]
    with pytest.raises(K.TableError, match="nope"):
        z.capture("nope")
    assert len(cuda.log) == n + 4
    z.capture("h")
    assert z._captured == {None, "h"} and len(z._replays) == Z.GRAPH_RING
    for r in z._replays:
        assert sorted(k for k in r.graphs if k[0] == "h") == [("h", 1024, b) for b in (1, 2, 3)]
    assert len(events(cuda, "capture_begin")) == 2 * 4 * 3
    z.capture("h")  # again: nothing new to capture
    assert len(events(cuda, "capture_begin")) == 2 * 4 * 3
    z.zero([2, 4], "h")
    assert cuda.log[-1][0] == "replay"
    c.expect([2, 4], "h")
    z.zero([5], "g")  # g has no graphs of its own (None's are every row): eager, g's rows only
    c.expect([5], "g")
    with pytest.raises(K.TableError, match="nope"):
        z.zero([0], "nope")
    off = Case(tiny()).zeroer(graphs=False, max_batch=3)
    n = len(cuda.log)
    off.capture()
    assert cuda.log[n:] == [] and off._replays == [] and off._captured == set()


def test_eager_staging_reuses_buffers_only_when_the_device_is_done(cuda: FakeCuda) -> None:
    """Without graphs a host batch is written into a pinned staging buffer, copied (non_blocking) into
    its slot and launched. While the device lags, a staging buffer whose copy has not run yet is not
    rewritten (the pool grows) and a slot is reused only by the stream it was last launched on."""
    c = Case(tiny(8))
    z = c.zeroer(max_batch=4)
    assert z.graphs is False and z._replays == [] and z.max_programs == 10
    cuda.hold = True
    z.zero([1, 2])
    z.zero([3])
    assert len(z._staging) == 2 and len(z._slots) == 1
    assert z._staging[0].pinned.untyped_storage().data_ptr() in cuda.pinned
    assert all(st.pinned.shape == (4,) and st.pinned.dtype == torch.int64 for st in z._staging)
    assert events(cuda, "copy") == [("copy", True, True)] * 2
    slot = z._slots[0]
    assert slot.stream is cuda.default and not slot.done.query() and not slot.busy
    side = cuda.Stream(c.buf.device)
    with cuda.stream(side):
        z.zero([4])  # another stream: slot 0 may still be read by the default stream's launch
        assert len(z._slots) == 2 and z._slots[1].stream is side
        z.zero([5])  # its own stream's slot again
        assert len(z._slots) == 2
    assert len(z._staging) == 4
    c.expect([])
    cuda.finish()
    c.expect([1, 2, 3, 4, 5])
    cuda.hold = False
    z.zero([6, 7])  # everything done: the first buffers again
    assert len(z._staging) == 4 and len(z._slots) == 2
    c.expect([6, 7])
    with pytest.raises(K.BlockIdError, match=r"block_ids\[1\]"):
        z.zero([0, 8])
    assert not any(st.busy for st in z._staging) and not any(s.busy for s in z._slots)
    z.zero([])  # nothing staged, nothing launched, no event recorded
    c.expect([])


def test_a_graph_the_caller_captures_owns_the_call_buffers(cuda: FakeCuda) -> None:
    """A call inside the caller's capture launches eagerly into that graph, over a fresh slot and
    staging buffer that no later call reuses (no event is queried or recorded mid-capture)."""
    c = Case(tiny(8))
    z = c.zeroer(graphs=True, max_batch=2)
    z.zero(torch.tensor([3, 6]))  # warm-up: the variant the capture launches, compiled outside it
    z.zero(torch.tensor([1]))
    slots, staging = list(z._slots), list(z._staging)
    g = cuda.CUDAGraph()
    n = len(cuda.log)
    g.capture_begin()
    z.zero([3, 6])
    z.zero(torch.tensor([1]))
    g.capture_end()
    assert z._slots == slots and z._staging == staging
    assert [e[0] for e in cuda.log[n:]] == ["capture_begin", "copy", "launch", "launch", "capture_end"]
    c.expect([1, 3, 6])  # the warm-up's
    c.buf.copy_(torch.from_numpy(c.data))  # poisoned again: the capture ran nothing
    c.done.clear()
    g.replay()
    c.expect([1, 3, 6])
    g2 = cuda.CUDAGraph()
    begun = len(events(cuda, "capture_begin"))
    g2.capture_begin()
    inner = c.zeroer(graphs=True, max_batch=2)  # made mid-capture: no replay graphs
    g2.capture_end()
    assert inner._replays == [] and inner.graphs and len(events(cuda, "capture_begin")) == begun + 1


def test_native_device_ids_are_bounded_by_the_kernel(cuda: FakeCuda) -> None:
    """Natively a device tensor is launched on as it is (no host copy, no host check): the kernel
    zeroes the ids in range and flags the rest for check(); ids on another device are refused."""
    c = Case(wide())
    z = c.zeroer(max_batch=4)
    assert z.max_programs == 10
    z.zero(torch.tensor([1, 9, -2]))
    assert events(cuda, "launch")[-1][3] == (2, 3)  # 3 ids x 2 small-batch units: one-shot grid
    c.expect([1])
    with pytest.raises(K.BlockIdError, match=r"^device block_ids: 4 work items had an id outside \[0, 6\)"):
        z.check()  # 2 ids x 2 units
    z.zero(torch.tensor([2, 3, 4, 5, 0], dtype=torch.int32))  # more ids than max_batch: device ids
    assert events(cuda, "launch")[-1][3] == (1, 5)  # 5 ids fill half the grid with the 8 KB units
    c.expect([0, 2, 3, 4, 5])
    big = c.zeroer(max_batch=4, small_batch=False)
    big.zero(torch.tensor([1]))
    assert events(cuda, "launch")[-1][3] == (1,)  # no small-batch geometry: the whole table's units
    copy = torch.from_numpy(c.data.copy())
    z.zero_into(copy, torch.tensor([4, 6]))  # a same-layout copy: device ids, bounded in the kernel
    want = c.data.copy()
    K.zero_blocks_numpy(want[GUARD : GUARD + c.table.total_bytes], c.table, [4])
    assert np.array_equal(copy.numpy(), want)
    with pytest.raises(K.BlockIdError, match=r"outside \[0, 6\) \(e\.g\. 6\)"):
        z.check()
    z.zero_into(copy, torch.tensor([], dtype=torch.int64))  # nothing to do
    z.check()
    z.device = torch.device("cpu", 1)  # as if the buffer were on a second device of the same type
    raises(
        K.BlockIdError,
        lambda: z.zero(torch.tensor([1])),
        "block_ids.device",
        "cpu",
        "block_ids device = cpu: must be cpu:1",
    )
    raises(
        K.LayoutBufferError,
        lambda: z.zero_into(copy, torch.tensor([1])),
        "buffer.device",
        "cpu",
        "buffer device = cpu: must be cpu:1",
    )
    assert np.array_equal(copy.numpy(), want)
    c.expect([])


def test_native_routed_batches_use_per_stream_slots(cuda: FakeCuda) -> None:
    """launch_routed packs a shard's ids in a slot's routed buffer (grown to the batch, at least
    max_batch) and zeroes them; the slot's event is recorded on the launching stream after the zero
    launch, and another stream gets a slot of its own while the device lags."""
    c = Case(tiny(8))
    z = c.zeroer(max_batch=2)
    slot = z._slots[0]
    assert slot.ids.shape == (2,) and slot.ids.dtype == torch.int64
    assert slot.count.shape == (1,) and slot.count.dtype == torch.int32 and slot.routed.numel() == 0
    assert slot.stream is None and slot.done is None and not slot.busy
    cuda.hold = True
    z.launch_routed(torch.tensor([8, 9, 15, 3]), 8, 16)  # shard [8, 16): local 0, 1, 7
    assert slot.routed.shape == (4,) and slot.routed.dtype == torch.int64
    assert [e[1] for e in events(cuda, "launch")] == ["route", "zero"]
    assert events(cuda, "record")[-1][2] == "default" and slot.stream is cuda.default
    done = slot.done
    assert not done.query() and cuda.queue[-1] == ("record", done)
    z.launch_routed(torch.tensor([10]), 8, 16)  # same stream: the same slot (stream order)
    assert z._slots == [slot] and slot.done is done and slot.routed.shape == (4,)
    side = cuda.Stream(c.buf.device)
    with cuda.stream(side):
        z.launch_routed(torch.tensor([12]), 8, 16)
    assert len(z._slots) == 2 and z._slots[1].stream is side and z._slots[1].routed.shape == (2,)
    assert events(cuda, "record")[-1][2] == repr(side)
    c.expect([])
    cuda.finish()
    cuda.hold = False
    c.expect([0, 1, 2, 4, 7])
    z.check()
    z.launch_routed(torch.tensor([11]), 8, 16)  # both slots free: the first one
    assert len(z._slots) == 2 and slot.done is done and done.records == 3
    c.expect([3])


# ---- host rules that run here anyway ----------------------------------------------------------


def test_host_ids_that_are_not_flat_int_sequences_are_refused() -> None:
    """Only lists, tuples and integer NumPy arrays are ids: a range, a scalar, nested lists or floats of
    any length raise BlockIdError naming the value, whatever path the batch's length picks."""
    c = Case(tiny(100))
    z = c.zeroer(max_batch=200)
    dst = np.full(200, -1, np.int64)
    for bad, msg in (
        (range(70), "block_ids = range(0, 70): must be a list, tuple or integer NumPy array"),
        (5, "block_ids = 5: must be a list, tuple or integer NumPy array"),
        ([[2, 3]] * 70, "block_ids[0] = [2, 3]"),
        ([2.0] * 70, "block_ids[0] = 2.0"),
        ([3] * 69 + [7.0], "block_ids[69] = 7.0"),
        (tuple([4] * 70) + (True,), "block_ids[70] = True"),
    ):
        with pytest.raises(K.BlockIdError) as info:
            z._fill(dst, bad)
        assert str(info.value).startswith(msg), (msg, str(info.value))
        with pytest.raises(K.BlockIdError):
            z.zero(bad)
    assert (dst[70:] == -1).all()
    c.expect([])


def test_small_batch_geometry_at_its_edges() -> None:
    """Smaller units only while ``bucket * units < max_programs // 2``; the group's own rows always."""
    c = Case(tiny(8, groups=True))
    z = c.zeroer(max_programs=8)  # want 4 work items; one unit per block and group
    assert z._chunk_words == 2048
    chunks = [z.plan_for_batch(k).plan.chunk_words for k in (1, 2, 3, 4, 5, 8)]
    assert chunks == [1024, 1024, 2048, 2048, 2048, 2048]
    assert z.plan_for_batch(3, "h") is z._plans[("h", 2048)]
    assert z.plan_for_batch(2, "h") is z._plans[("h", 1024)]
    for small in (True, False):
        w = c.zeroer(max_programs=2, small_batch=small)
        w.zero([1, 6], "h")  # eager, group h's rows only
        c.expect([1, 6], "h")
        w.zero([2], "g")
        c.expect([2], "g")
    z.zero(torch.tensor([3, 4, 5, 7]), "h")
    c.expect([3, 4, 5, 7], "h")


def huge_rows() -> K.SegmentTable:
    """One block of 525,312 contiguous bytes: 32,832 units of 4 words, so 65,535 ids are past 2**31 items."""
    big = K.FullAttentionSpec(name="big", block_size=16, num_kv_heads=16, head_size=512, dtype="bfloat16")
    small = K.FullAttentionSpec(name="s", block_size=16, num_kv_heads=1, head_size=16, dtype="bfloat16")
    return K.plan(K.KVCacheSpec(1, "BLHNC", (K.GroupSpec("g", (big, small)),)))


def test_launch_grids_stay_within_cuda_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """One program per work item on a (units, ids) grid while it fits CUDA (ids <= 65,535, units x ids
    < 2**31: Triton skips a larger launch silently) and, for routed batches, max_programs; a capped
    persistent grid otherwise. The user's store options and the plan's constants reach the kernel."""
    units = Recorder()
    monkeypatch.setattr(Z, "zero_units_kernel", units)

    def grid(z: Any, n: int, **kw: Any) -> Any:
        z._launch(torch.zeros(1, dtype=torch.int64).expand(n), **kw)
        return units.calls[-1][0]

    z = Case(tiny()).zeroer(max_programs=3)
    assert grid(z, 3) == (1, 3) and grid(z, 4) == (1, 4)  # past max_programs: still one-shot
    count = torch.ones(1, dtype=torch.int32)
    assert grid(z, 3, count=count, routed=True) == (1, 3) and grid(z, 4, count=count, routed=True) == (3,)
    assert grid(z, 65535) == (1, 65535) and grid(z, 65536) == (3,)
    assert grid(Case(tiny()).zeroer(small_batch=False), 2) == (2,)
    h = Case(huge_rows()).zeroer(chunk_words=4, sub_words=4, max_programs=7)
    assert h.plan.units_per_block == 32832
    assert grid(h, 65408) == (32832, 65408) and grid(h, 65409) == (7,)  # 2**31 - 1 items at most
    _, args, kw = units.calls[-1]
    assert args[7:] == (32832, 0, 1, 1, 65409 * 32832) and args[6] is h._no_count
    assert kw == dict(
        SUB=4,
        ALIGNED=True,
        CACHE="",
        EVICT="evict_first",
        COUNTED=False,
        ONE_SHOT=False,
        SINGLE=True,
        num_warps=8,
    )
    o = Case(wide()).zeroer(
        cache_modifier=".cs", eviction_policy="evict_last", num_warps=2, sub_words=512, max_programs=64
    )
    o._launch(torch.tensor([1]), count=count)
    _, args, kw = units.calls[-1]
    assert args[6] is count and args[7:] == (1, 0, 6, 6, 1)
    assert kw == dict(
        SUB=512,
        ALIGNED=True,
        CACHE=".cs",
        EVICT="evict_last",
        COUNTED=True,
        ONE_SHOT=True,
        SINGLE=False,
        num_warps=2,
    )
    odd = Case(
        K.plan(
            K.KVCacheSpec(
                2,
                "BLHNC",
                (
                    K.GroupSpec(
                        "g",
                        (
                            K.FullAttentionSpec(
                                name="o", block_size=1, num_kv_heads=1, head_size=2, dtype="bfloat16"
                            ),
                        ),
                    ),
                ),
            )
        )
    )
    odd_z = odd.zeroer()
    odd_z._launch(torch.tensor([1]))
    assert units.calls[-1][2]["ALIGNED"] is False and odd_z.plan.aligned16 is False


def test_a_launch_owns_ids_lo_to_lo_plus_num_blocks_and_flags_those_outside_its_limit() -> None:
    c = Case(tiny())
    z = c.zeroer()
    z._launch(torch.tensor([8, 13, 18, 6, -1]), id_lo=6, id_limit=18)  # local 2 and 0; 13 another shard's
    c.expect([0, 2])
    with pytest.raises(K.BlockIdError, match=r"^device block_ids: 2 work items had an id outside \[0, 18\)"):
        z.check()


def test_group_plans_coalesce_and_list_batches_check_max_batch_first() -> None:
    c = Case(tiny(groups=True))
    for coalesce, rows in ((True, 1), (False, 2)):
        z = c.zeroer(coalesce=coalesce, max_batch=3)
        plan = z._plan_for("g")
        assert len(plan.table) == rows and plan.plan.units_per_block == rows
        assert z._plan_for("g") is plan and z._plan_for("g", 1024) is not plan
        z.zero([1], "g")
        c.expect([1], "g")
        z.zero((2, 3, 4), "h")  # exactly max_batch ids: accepted
        c.expect([2, 3, 4], "h")
        for bad in ([0, 1, 2, 99], (0, 1, 2, 99), [-1] * 4):  # refused as too long, before the bad id
            raises(
                K.BlockIdError,
                lambda bad=bad, z=z: z.zero(bad),
                "block_ids",
                4,
                "block_ids: batch of 4 exceeds max_batch 3",
            )
        with pytest.raises(K.BlockIdError) as info:
            z.zero([2**70])
        assert str(info.value) == f"block_ids[0] = {2**70}: outside [0, 6)"
    c.expect([])


def test_every_option_is_checked_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each option's refusal names it and its value (nothing is allocated or written); edges pass."""
    c = Case(tiny())
    cases = [
        ("sub_words", 3, "a positive power of two, at most 65536"),
        ("sub_words", 1 << 17, "a positive power of two, at most 65536"),
        ("num_warps", 64, "a positive power of two, at most 32"),
        ("num_warps", 6, "a positive power of two, at most 32"),
        ("max_programs", 0, f"a positive integer, at most {2**31 - 1}"),
        ("max_programs", 2**31, f"a positive integer, at most {2**31 - 1}"),
    ]
    for name, value, rule in cases:
        raises(
            K.BackendError,
            lambda n=name, v=value: c.zeroer(**{n: v}),
            name,
            value,
            f"{name} = {value!r}: must be {rule}",
        )
    raises(
        K.BlockIdError,
        lambda: c.zeroer(max_batch=2**31),
        "max_batch",
        2**31,
        f"max_batch = {2**31}: must be a positive integer, at most {2**31 - 1}",
    )
    z = c.zeroer(sub_words=1 << 16, num_warps=32, max_programs=3, max_batch=1, chunk_words=1 << 17)
    assert (z.sub_words, z.num_warps, z.max_programs, z.max_batch) == (1 << 16, 32, 3, 1)
    assert z._plans[(None, 1 << 17)].sub == 1 << 16  # a chunk wider than the vector keeps the vector
    monkeypatch.setattr(Z.CudaZeroer, "_new_slot", lambda self: None)  # no 16 GiB ids buffer
    assert c.zeroer(max_batch=2**31 - 1).max_batch == 2**31 - 1
    c.expect([])


def test_device_plans_and_defaults(cuda: FakeCuda) -> None:
    """The defaults: coalesced rows, replay graphs natively, programs per SM of the buffer's device; plans
    hold their tensors on the device, vectors no wider than a power-of-two chunk."""
    c = Case(tiny(groups=True))
    z = kc.CudaZeroer(c.table, c.buf, offset=GUARD, max_batch=2)
    assert z.graphs and z._captured == {None} and len(z._replays) == Z.GRAPH_RING and z.mode == "native"
    assert z.kernel_table == c.table.coalesced() and len(z.kernel_table) == 1 < len(c.table)
    assert z.plan is z._plans[(None, 2048)].plan and z.buffer is c.buf and z.device == c.buf.device
    assert z.max_programs == 5 * Z.DEFAULT_PROGRAMS_PER_SM and z.offset == GUARD and z._next_replay == 0
    assert z._err.dtype == torch.int64 and z._err.tolist() == [0, 0]
    assert z._no_count.dtype == torch.int32 and z._no_count.shape == (1,)
    assert z.graph_copy is True
    for chunk, sub_words, sub in ((1024, 4096, 1024), (12, 8, 8), (2048, 1024, 1024), (24, 64, 64)):
        dp = Z._device_plan(c.table, True, chunk, sub_words, c.buf.device)
        assert dp.sub == sub and dp.table == c.table.coalesced(), (chunk, sub_words)
        assert dp.single == (int(dp.plan.words.max()) <= sub)
        assert not any(cuda.is_host(t) for t in (dp.base, dp.stride, dp.words))
        assert dp.base.tolist() == dp.plan.base_words.tolist() and dp.words.tolist() == dp.plan.words.tolist()
        assert dp.stride.tolist() == dp.plan.stride_words.tolist()
    edge = Z._device_plan(c.table, False, 128, 128, c.buf.device)  # units of exactly one vector: single
    assert edge.single and edge.table == c.table and edge.plan.units_per_block == 3
    z.zero([1, 2], "h")
    c.expect([1, 2], "h")


class _Reentrant(list):  # type: ignore[type-arg]
    """Host ids whose first read runs ``hook`` (another thread's call, made while this one stages)."""

    def __init__(self, ids: list[int], hook: Callable[[], None]) -> None:
        super().__init__(ids)
        self.hook: Callable[[], None] | None = hook

    def __iter__(self) -> Any:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return super().__iter__()


def test_buffers_a_call_owns_are_not_taken_by_a_call_made_meanwhile(cuda: FakeCuda) -> None:
    """A call owns its replay entry, or its slot and staging buffer, until its work is enqueued: a call
    made while it reads its ids (another thread) takes others; with the device lagging, each batch's
    copy then reads its own ids."""
    for graphs in (True, False):
        c = Case(tiny(8), seed=7)
        z = c.zeroer(graphs=graphs, max_batch=4)
        cuda.hold = True
        n = len(events(cuda, "replay"))
        z.zero(_Reentrant([1, 2], lambda z=z: z.zero([5])))
        assert len(events(cuda, "replay")) == n + (2 if graphs else 0)
        z.launch_routed(torch.tensor([3]), 0, 8)  # a device batch: a slot while another call's is out
        cuda.finish()
        cuda.hold = False
        c.expect([1, 2, 3, 5])
        if graphs:
            assert z._next_replay == 2
        else:
            assert len(z._staging) == 2 and len(z._slots) == 2


def test_without_graph_signals_the_host_records_each_replay(cuda: FakeCuda) -> None:
    """Graphs without their signal: the host records the entry's event after each replay, so an entry
    still in flight is not refilled; a batch that fails or is empty enqueues nothing at all."""
    cuda.signal_capturable = False
    c = Case(tiny(8))
    z = c.zeroer(graphs=True, max_batch=2)
    cuda.hold = True
    for ids in ([1], [2], [3], [4], [5, 6]):
        z.zero(ids)
    assert len(events(cuda, "replay")) == 4 and len(z._staging) == 1  # the fifth: eager
    cuda.finish()
    cuda.hold = False
    c.expect([1, 2, 3, 4, 5, 6])
    n = len(cuda.log)
    with pytest.raises(K.BlockIdError):
        z.zero([0, 9])
    z.zero([])
    assert cuda.log[n:] == [] and not any(r.busy for r in z._replays)
    off = c.zeroer(max_batch=2)  # eager: a bad group raises before anything; no copy, no launch
    with pytest.raises(K.TableError):
        off.zero([0], "nope")
    assert cuda.log[n:] == []
    with pytest.raises(K.BlockIdError):
        off.zero([9])
    assert [e[0] for e in cuda.log[n:]] == ["record"]  # the slot's release only
    off.zero([])
    assert [e[0] for e in cuda.log[n:]] == ["record", "record"]
    c.expect([])


def test_graphs_when_neither_the_copy_nor_the_signal_can_be_captured(cuda: FakeCuda) -> None:
    cuda.signal_capturable = cuda.copy_capturable = False
    c = Case(tiny())
    z = c.zeroer(graphs=True, max_batch=4)
    assert z.graph_copy is False and all(r.signal is None for r in z._replays)
    assert all(len(g.nodes) == 1 for r in z._replays for g in r.graphs.values())  # the launch alone
    z.zero([4, 1])  # the host copies [count, ids] (3 of 5 words) before the replay
    assert events(cuda, "copy")[-1] == ("copy", True, True) and z._replays[0].dev[:3].tolist() == [2, 4, 1]
    c.expect([1, 4])


def test_host_tensors_natively_are_host_ids(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    """Natively a CPU tensor holds host ids: staged and replayed like a list, validated first; in
    zero_into, checked on the host and copied to the device. Buffers elsewhere are refused by name."""
    c = Case(tiny(8, groups=True))
    z = c.zeroer(graphs=True, max_batch=4)
    monkeypatch.setattr(Z, "DEVICE_TYPE", "cuda")  # the zeroer's device is "cuda", the CPU is the host
    n = len(events(cuda, "replay"))
    z.zero(cuda.host_memory(torch.tensor([2, 5])))
    assert len(events(cuda, "replay")) == n + 1
    c.expect([2, 5])
    with pytest.raises(K.BlockIdError, match=r"^block_ids\[1\] = 8"):
        z.zero(torch.tensor([1, 8]))
    raises(
        K.LayoutBufferError,
        lambda: kc.CudaZeroer(c.table, c.buf, offset=GUARD),
        "buffer.device",
        "cpu",
        "buffer device = cpu: must be on a CUDA device",
    )
    z.check()
    c.expect([])


def test_groups_natively(cuda: FakeCuda) -> None:
    """Each native path zeroes only the named group's rows; group h's own bucket plans differ from the
    whole table's (1 unit a block against 2), so replays look their graphs up by the group's plan."""
    layer = [
        K.FullAttentionSpec(name=n, block_size=16, num_kv_heads=1, head_size=128, dtype="bfloat16")
        for n in "abc"
    ]
    t = K.plan(
        K.KVCacheSpec(4, "BLHNC", (K.GroupSpec("g", (layer[0], layer[2])), K.GroupSpec("h", (layer[1],))))
    )
    c = Case(t)
    z = c.zeroer(graphs=True, max_batch=2, max_programs=8)
    assert z.plan_for_batch(2).plan.chunk_words == 2048 and z.plan_for_batch(2, "h").plan.chunk_words == 1024
    z.capture("h")
    z.zero([1, 3], "h")
    assert cuda.log[-1][0] == "replay"
    c.expect([1, 3], "h")
    z.launch_routed(torch.tensor([6, 9]), 4, 8, "h")
    c.expect([2], "h")
    copy = torch.from_numpy(c.data.copy())
    z.zero_into(copy, torch.tensor([0]), "h")
    want = c.data.copy()
    K.zero_blocks_numpy(want[GUARD : GUARD + t.total_bytes], t, [0], group="h")
    assert np.array_equal(copy.numpy(), want)
    z.zero(torch.tensor([0]), "g")
    c.expect([0], "g")
    with pytest.raises(K.BlockIdError, match="outside"):
        z.check()  # 9 is outside [0, 8)


def test_routed_buffers_are_kept_and_large_routed_batches_use_a_capped_grid(cuda: FakeCuda) -> None:
    c = Case(tiny(8))
    z = c.zeroer(max_batch=2, max_programs=3)
    z.launch_routed(torch.tensor([1, 2, 3, 4]), 0, 8)
    routed = z._slots[0].routed
    assert events(cuda, "launch")[-1][3] == (3,)  # 4 items > max_programs: the persistent grid
    z.launch_routed(torch.tensor([5, 6, 7, 0]), 0, 8)  # as many ids as the buffer holds: kept
    assert z._slots[0].routed is routed and events(cuda, "launch")[-1][3] == (3,)
    z.launch_routed(torch.tensor([6, 7]), 0, 8)
    assert events(cuda, "launch")[-1][3] == (1, 2)
    c.expect(list(range(8)))


def test_cpu_tensors_under_the_interpreter_and_typed_buffers() -> None:
    """Under the interpreter a CPU tensor is the device batch (checked as device ids, then bounded on the
    host): any length, int32/int64 only; a meta tensor holds no ids. Buffers of any dtype hold the bytes."""
    c = Case(tiny(8))
    z = c.zeroer(max_batch=2)
    z.zero(torch.tensor([1, 2, 3]))  # more than max_batch: device ids have no batch limit
    c.expect([1, 2, 3])
    raises(
        K.BlockIdError,
        lambda: z.zero(torch.tensor([1.0])),
        "block_ids.dtype",
        "torch.float32",
        "block_ids dtype = torch.float32: must be int32 or int64",
    )
    kind = "torch.int64 torch.strided tensor on meta"
    raises(
        K.BlockIdError,
        lambda: z.zero(torch.zeros(2, dtype=torch.int64, device="meta")),
        "block_ids",
        kind,
        f"block_ids = {kind}: must be a dense integer tensor holding data",
    )
    raises(
        K.BlockIdError,
        lambda: z.zero(torch.tensor([1]).to_sparse()),
        "block_ids",
        "torch.sparse_coo",
        "block_ids layout = torch.sparse_coo: must be dense",
    )
    Z.check_id_tensor(torch.tensor([1], dtype=torch.int32))
    t = tiny(3)
    data = K.poison_pattern(t.total_bytes)
    for dtype in (torch.float32, torch.int16):
        buf = torch.from_numpy(data.copy()).view(dtype)  # exactly the layout's bytes
        kc.CudaZeroer(t, buf, graphs=False).zero([2])
        want = data.copy()
        K.zero_blocks_numpy(want, t, [2])
        assert np.array_equal(buf.view(torch.uint8).numpy(), want)
    c.expect([])


def test_nested_calls_and_a_ring_with_one_free_entry(cuda: FakeCuda) -> None:
    """Three calls nested in each other's id reads each own a slot and staging buffer (pooled ones
    first); with only the ring's first entry complete, a call made while it is being filled launches
    eagerly instead of refilling it."""
    c = Case(tiny(8), seed=9)
    z = c.zeroer(max_batch=4)
    z.zero([0])  # one slot and one staging buffer in the pools, free again
    c.expect([0])
    cuda.hold = True
    third = _Reentrant([7], lambda: None)
    z.zero(_Reentrant([1, 2], lambda: z.zero(_Reentrant([5], lambda: z.zero(third)))))
    assert len(z._slots) == 3 and len(z._staging) == 3
    cuda.finish()
    c.expect([1, 2, 5, 7])
    r = c.zeroer(graphs=True, max_batch=2)
    for ids in ([1], [2], [3], [4]):
        r.zero(ids)  # every entry in flight
    cuda.finish(3)  # the first replay's copy, launch and signal ran
    assert [e.signal.query() for e in r._replays] == [True, False, False, False] and r._next_replay == 0
    n = len(events(cuda, "replay"))
    r.zero(_Reentrant([5], lambda: r.zero([6])))
    assert len(events(cuda, "replay")) == n + 1  # the inner call: eager (entry 0 is the outer's)
    cuda.finish()
    cuda.hold = False
    c.expect([3, 4, 6])
    assert r.graph_copy is True and c.zeroer().graph_copy is None  # decided by a capture only


def test_ragged_lists_and_group_types_are_refused_by_name(cuda: FakeCuda) -> None:
    """A 65-4,096-id list holding a list (NumPy's inference raises ValueError) goes to the checked path,
    which names the element; a group that is not a str is refused before any lookup (a list is
    unhashable), graphs or not; nothing is written (issue 25)."""
    c = Case(tiny(num_blocks=80, groups=True))
    for graphs in (False, True):  # natively (the fake): with graphs, a replay is looked up by the group
        z = c.zeroer(graphs=graphs, max_batch=128)
        assert z.graphs is graphs
        raises(K.BlockIdError, lambda z=z: z.zero(list(range(2, 70)) + [[5]]), "block_ids[68]", [5],
               "block_ids[68] = [5]: must be an integer (nothing was written)")
        for group, shown in ((["g"], "['g']"), (3, "3"), (("g",), "('g',)")):
            raises(K.TableError, lambda z=z, g=group: z.zero([1], g), "group", shown,
                   f"group = {shown}: must be a group name (str) or None")
        c.expect([])
    z = c.zeroer(max_batch=128)
    z.zero(list(range(2, 70)))  # the fast path itself still takes a plain list
    c.expect(list(range(2, 70)))


def test_an_empty_pool_from_a_zero_length_host_buffer() -> None:
    """A 0-byte table on a 0-length buffer (an empty NumPy array has stride 0): an empty word view, not
    torch's refusal to view its bytes as int32; zeroing nothing works (issue 25)."""
    t = K.SegmentTable.from_dict({"total_bytes": 0, "num_blocks": 0,
                                  "segments": [{"base": 0, "stride": 256, "span": 64}]})
    words = Z._as_words(torch.from_numpy(np.zeros(0, np.uint8)), t, 0)
    assert words.dtype == torch.int32 and words.shape == (0,) and words.device.type == "cpu"
    b = kc.CudaBackend.from_host(t, np.zeros(0, np.uint8))
    b.zero([])
    assert b.to_host().size == 0
