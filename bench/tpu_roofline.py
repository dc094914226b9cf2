"""Roofline of the Pallas TPU kernel for TPU v5e and v6e (computed from the host plan, no TPU).

Per batch: bytes the contract clears, HBM bytes the kernel moves (whole-row DMAs write;
each partial row is read and written back, 512 B each way), DMA count and grid steps, and
the bandwidth floor against 0.82 TB/s (v5e) and 1.64 TB/s (v6e) HBM.

    python bench/tpu_roofline.py [--out bench/results/tpu_roofline.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvlayout.backends.pallas.plan import plan_rows

import kvlayout as K

HBM = {"v5e": 0.82e12, "v6e": 1.64e12}
IDS_PER_STEP = 64


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/tpu_roofline.json")
    args = ap.parse_args()
    rows = []
    for name in ("dsv4-test", "dsv4", "llama-8b"):
        table = K.plan(K.preset(name).with_num_blocks(65536)).coalesced()
        plan = plan_rows(table, 0, tile_rows=128)
        full_per_block, rmw_per_block = plan.items_per_block()
        full_rows_per_block = float(plan.full_rows.sum()) / plan.period
        for batch in (1, 16, 256, 4096, 16384):
            cleared = batch * table.bytes_per_block
            moved = batch * (full_rows_per_block * 512 + rmw_per_block * 2 * 512)
            dmas = batch * (full_per_block + 2 * rmw_per_block)
            steps = -(-batch // IDS_PER_STEP)
            r = {"preset": name, "batch": batch, "bytes_cleared": cleared, "hbm_bytes_moved": int(moved),
                 "dmas": int(round(dmas)), "grid_steps": steps, "period": plan.period, "fast_path": plan.aligned}
            for chip, bw in HBM.items():
                r[f"{chip}_floor_us"] = moved / bw * 1e6
            rows.append(r)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print("| preset | batch | bytes cleared | HBM bytes moved | DMAs | grid steps | v5e floor us | v6e floor us |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['batch']} | {r['bytes_cleared']} | {r['hbm_bytes_moved']} | {r['dmas']} | {r['grid_steps']} "
              f"| {r['v5e_floor_us']:.1f} | {r['v6e_floor_us']:.1f} |")


if __name__ == "__main__":
    main()
