"""Shared timing for the GPU bench scripts: queued calls, one sync, median of rounds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def queued_us(fn: Callable[[], Any], sync: Callable[[], Any], rounds: int = 9, calls: int = 20) -> float:
    """Microseconds per call: ``calls`` back-to-back calls then ``sync()``, median over ``rounds`` (one warm-up call)."""
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
