"""Verifier benchmark (GEOMETRY.md section 8): time and peak memory for 10^2..10^5 rows and
10^3..2**31-1 blocks, on the table shapes that exercise each part of the proof.

Shapes: ``packed`` (one stride, every row inside one block row: the vectorised fast path),
``layer_major`` (one region per row: clusters split by the gap rule), ``sweep`` (one stride,
windings chained so the circle sweep runs over every row), ``two-strides`` (alternating
strides, disjoint extents: the class-pair path), plus the ``dsv4`` preset at 10^7 blocks.
Time is the median of repeated calls; peak memory is measured on one extra call with
tracemalloc (Python allocations, NumPy included). Targets: < 2 s and < 500 MB at 10^5 rows,
< 50 ms for dsv4 at 10^7 blocks. Prints a table, writes JSON.

    python bench/bench_verify.py [--out bench/results/verify.json] [--rows 100,1000,10000,100000]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kvlayout as K

sys.path.insert(0, str(Path(__file__).parent))
from timing import median_s  # noqa: E402  (bench/ holds the one timing helper)

BLOCKS = (10**3, 10**6, 2**31 - 1)


def packed(rows: int, n: int) -> K.SegmentTable:
    stride = 4 * rows
    return K.SegmentTable(stride * n, n, tuple(K.Segment(4 * i, stride, 4) for i in range(rows)))


def layer_major(rows: int, n: int) -> K.SegmentTable:
    page = 4096
    return K.SegmentTable(rows * page * n, n, tuple(K.Segment(j * page * n, page, page) for j in range(rows)))


def sweep(rows: int, n: int) -> K.SegmentTable:
    """Row i at circle position (i mod m), winding i: all in one cluster, safe because m > n - 1."""
    m = max(2048, min(n, 2**20))
    stride = 4 * m
    segs = tuple(K.Segment(i * stride + (i % m) * 4, stride, 4) for i in range(rows))
    return K.SegmentTable(rows * stride + n * stride, n, segs)


def two_strides(rows: int, n: int) -> K.SegmentTable:
    region = 8192 * n
    segs = tuple(K.Segment(j * region, 8192 - 4096 * (j % 2), 64) for j in range(rows))
    return K.SegmentTable(rows * region, n, segs)


SHAPES: dict[str, Callable[[int, int], K.SegmentTable]] = {
    "packed": packed,
    "layer_major": layer_major,
    "sweep": sweep,
    "two-strides": two_strides,
}


def measure(table: K.SegmentTable, repeats: int) -> tuple[float, float, bool]:
    """(median seconds, peak MiB, verdict) of ``verify(table)``."""
    ok = K.verify(table).ok
    secs = median_s(lambda: K.verify(table), repeats)
    tracemalloc.start()
    K.verify(table)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return secs, peak, ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="bench/results/verify.json")
    ap.add_argument("--rows", default="100,1000,10000,100000")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows_list = [int(x) for x in args.rows.split(",")]
    results: list[dict[str, object]] = []
    for shape, make in SHAPES.items():
        for rows in rows_list:
            for n in BLOCKS:
                if rows * 8192 * n >= K.ranges.MAX_BYTES:
                    continue  # beyond the section-8 limit: refused at load, nothing to time
                table = make(rows, n)
                secs, peak, ok = measure(table, args.repeats)
                results.append(
                    {
                        "shape": shape,
                        "rows": rows,
                        "num_blocks": n,
                        "seconds": round(secs, 4),
                        "peak_mib": round(peak, 1),
                        "safe": ok,
                    }
                )
                print(
                    f"{shape:12s} {rows:>7} rows {n:>11} blocks {secs * 1e3:9.1f} ms {peak:7.1f} MiB "
                    f"{'SAFE' if ok else 'UNSAFE'}",
                    flush=True,
                )
    spec = K.preset("dsv4").with_num_blocks(10**7)
    plan_verify = median_s(lambda: K.verify(K.plan(spec)), args.repeats)
    table = K.plan(spec)
    secs, peak, ok = measure(table, args.repeats)
    results.append(
        {
            "shape": "dsv4 preset",
            "rows": len(table),
            "num_blocks": 10**7,
            "seconds": round(secs, 4),
            "plan_and_verify_seconds": round(plan_verify, 4),
            "peak_mib": round(peak, 1),
            "safe": ok,
        }
    )
    worst = max((r for r in results if r["rows"] == 100_000), key=lambda r: r["seconds"], default=None)
    print()
    print(f"{'shape':12s} {'rows':>7} {'blocks':>11} {'ms':>9} {'MiB':>7}")
    for r in results:
        ms = float(r["seconds"]) * 1e3  # type: ignore[arg-type]
        print(f"{r['shape']!s:12s} {r['rows']:>7} {r['num_blocks']:>11} {ms:9.1f} {r['peak_mib']:>7}")
    print(
        f"dsv4 at 10^7 blocks: verify {secs * 1e3:.1f} ms, "
        f"plan + verify {plan_verify * 1e3:.1f} ms (target < 50 ms)"
    )
    if worst is not None:
        worst_s = float(worst["seconds"])  # type: ignore[arg-type]
        print(f"slowest at 10^5 rows: {worst['shape']} {worst_s:.2f} s (target < 2 s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "numpy": np.__version__,
                "python": platform.python_version(),
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
