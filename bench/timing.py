"""Shared timing for the GPU bench scripts: queued calls, one sync, median of rounds."""

from __future__ import annotations

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
