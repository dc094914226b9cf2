"""Shared timing for the GPU bench scripts: queued calls, one sync, median of rounds."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any


def queued_us(fn: Callable[[], Any], sync: Callable[[], Any], rounds: int = 9, calls: int = 20) -> float:
    """Microseconds per call: ``calls`` back-to-back calls then ``sync()``, median over ``rounds``
    (one warm-up call)."""
    fn()
    sync()
    per = []
    for _ in range(rounds):
        s = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per.append((time.perf_counter() - s) / calls)
    return round(statistics.median(per) * 1e6, 2)


def median_s(fn: Callable[[], Any], repeats: int = 5) -> float:
    """Seconds per call on the host: median of ``repeats`` timed calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - s)
    return statistics.median(times)


def interleaved_us(
    fns: dict[str, Callable[[], Any]], sync: Callable[[], Any], rounds: int = 15, calls: int = 20
) -> dict[str, float]:
    """Microseconds per call of each of ``fns``, rounds interleaved (A, B, C, A, B, C, ...).

    Each round is ``calls`` back-to-back calls then ``sync()``; the median over ``rounds``.
    Interleaving gives every method the same share of a noisy host's slow periods, so their
    ratios hold even when absolute times drift between rounds.
    """
    per: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    sync()
    for _ in range(rounds):
        for name, fn in fns.items():
            s = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            per[name].append((time.perf_counter() - s) / calls)
    return {name: round(statistics.median(v) * 1e6, 2) for name, v in per.items()}


def cuda_graph_us(fn: Callable[[int], Any], calls: int = 16, replays: int = 15, warmup: int = 2) -> float:
    """Median microseconds per call of ``fn(i)``, ``i`` in ``range(calls)``, replayed from one CUDA graph.

    Kernel time without host launch cost: ``warmup`` calls on a side stream (compiles, and lets
    lazy allocations happen outside the capture), one capture of ``calls`` calls, one replay to
    settle, then ``replays`` replays timed between CUDA events. GPU only (imports torch here, so
    host-only benchmarks can use this module without it).
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    del graph
    return round(statistics.median(times), 2)


def cuda_events_us(fn: Callable[[int], Any], reps: int, warmup: int = 5) -> float:
    """Median microseconds of ``fn(i)`` between CUDA events, ``reps`` calls issued back to back
    (one sync at the end: the host stays ahead, so this is device time per call). GPU only."""
    import torch

    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    return round(statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)), 2)


def counted(fn: Callable[[int], Any]) -> Callable[[], Any]:
    """``fn(i)`` as a no-argument call with ``i`` counting up (for :func:`queued_us` and
    :func:`interleaved_us` over rotating inputs)."""
    calls = itertools.count()
    return lambda: fn(next(calls))
