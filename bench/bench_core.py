"""Core benchmark: planner + table + verifier cost, and the NumPy reference zeroer.

Prints a table and writes JSON (default ``bench/results/core.json``). Timings are medians
of repeated runs in one process; the reference is compared with a plain NumPy fill of the
same number of bytes, measured in the same run.

    python bench/bench_core.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

import kvlayout as K

sys.path.insert(0, str(Path(__file__).parent))
from timing import median_s  # noqa: E402  (bench/ holds the one timing helper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="bench/results/core.json")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    results: dict[str, object] = {
        "machine": platform.processor() or platform.machine(),
        "numpy": np.__version__,
    }

    plan_rows = []
    for n in (10**3, 10**5, 10**7):
        spec = K.preset("dsv4").with_num_blocks(n)

        def job(spec: K.KVCacheSpec = spec) -> bool:
            return K.verify(K.plan(spec)).ok

        assert job()
        t = median_s(job, args.repeats)
        plan_rows.append({"num_blocks": n, "rows": 181, "plan_table_verify_ms": t * 1e3})
    results["plan"] = plan_rows

    n_blocks = 4096
    table = K.plan(K.preset("dsv4-test").with_num_blocks(n_blocks))
    buf = K.poison_pattern(table.total_bytes)
    rng = np.random.default_rng(0)
    zero_rows = []
    for batch in (16, 256, 4096):
        ids = rng.choice(n_blocks, size=batch, replace=False)
        nbytes = batch * table.bytes_per_block
        flat = np.ones(nbytes, np.uint8)
        t_ref = median_s(lambda ids=ids: K.zero_blocks_numpy(buf, table, ids), args.repeats)
        t_fill = median_s(lambda flat=flat: flat.fill(0), args.repeats)
        zero_rows.append(
            {
                "batch": batch,
                "bytes": nbytes,
                "reference_ms": t_ref * 1e3,
                "numpy_fill_ms": t_fill * 1e3,
                "reference_GBps": nbytes / t_ref / 1e9,
                "fill_GBps": nbytes / t_fill / 1e9,
                "ratio_fill_over_reference": t_fill / t_ref,
            }
        )
    results["reference_zero"] = zero_rows

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"plan + table + verify, dsv4 preset (181 rows), median of {args.repeats}")
    print(f"{'num_blocks':>12} {'ms':>8}")
    for r in plan_rows:
        print(f"{r['num_blocks']:>12} {r['plan_table_verify_ms']:>8.2f}")
    print(
        f"\nreference zeroing, dsv4-test geometry ({n_blocks} blocks pool), vs numpy fill of the same bytes"
    )
    print(
        f"{'batch':>6} {'bytes':>12} {'ref ms':>8} {'fill ms':>8} "
        f"{'ref GB/s':>9} {'fill GB/s':>9} {'fill/ref':>8}"
    )
    for r in zero_rows:
        print(
            f"{r['batch']:>6} {r['bytes']:>12} {r['reference_ms']:>8.3f} {r['numpy_fill_ms']:>8.3f} "
            f"{r['reference_GBps']:>9.2f} {r['fill_GBps']:>9.2f} {r['ratio_fill_over_reference']:>8.2f}"
        )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
