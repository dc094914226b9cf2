"""Roofline of the Pallas TPU kernel for TPU v5e and v6e (computed from the host plan, no TPU).

Per batch: bytes the contract clears, HBM bytes the kernel moves (whole-row DMAs write;
each partial row is read and written back, 512 B each way), DMA count and grid steps, and
the bandwidth floor against 0.82 TB/s (v5e) and 1.64 TB/s (v6e) HBM.

The same for the native-cache kernel (``CacheZeroer``, GEOMETRY.md section 9) on
tpu-inference-shaped caches: one zero-tile DMA per page chunk of every leaf, no reads
(rank-2 8/16-bit leaves read and write their row group), from ``plan_tpu``.

    python bench/tpu_roofline.py [--out bench/results/tpu_roofline.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvlayout.backends.pallas.native_kernels import ids_per_step_for, plan_tpu
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
            r = {
                "preset": name,
                "batch": batch,
                "bytes_cleared": cleared,
                "hbm_bytes_moved": int(moved),
                "dmas": int(round(dmas)),
                "grid_steps": steps,
                "period": plan.period,
                "fast_path": plan.aligned,
            }
            for chip, bw in HBM.items():
                r[f"{chip}_floor_us"] = moved / bw * 1e6
            rows.append(r)
    native = native_rows()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    Path(args.out).with_name("tpu_roofline_native.json").write_text(json.dumps(native, indent=1))
    cols = ("preset", "batch", "bytes cleared", "HBM bytes moved", "DMAs", "grid steps", "v5e floor us")
    print("| " + " | ".join(cols) + " | v6e floor us |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['preset']} | {r['batch']} | {r['bytes_cleared']} | {r['hbm_bytes_moved']} "
            f"| {r['dmas']} | {r['grid_steps']} "
            f"| {r['v5e_floor_us']:.1f} | {r['v6e_floor_us']:.1f} |"
        )

    print()
    cols = ("cache", "leaves", "batch", "bytes_cleared", "hbm_bytes_moved", "dmas", "grid_steps")
    print(
        "| native cache | leaves | batch | bytes cleared | HBM bytes moved | DMAs | grid steps "
        "| v5e floor us | v6e floor us |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in native:
        floors = f" | {r['v5e_floor_us']:.1f} | {r['v6e_floor_us']:.1f} |"
        print("| " + " | ".join(str(r[c]) for c in cols) + floors)


#: tpu-inference-shaped native caches: name -> [(leaf shape without the page axis, dtype)] * layers
NATIVE_CACHES = {
    "llama-8b bf16": [((16, 8, 2, 128), "bfloat16")] * 32,
    "llama-8b fp8": [((16, 4, 4, 128), "float8_e4m3fn")] * 32,
    "deepseek-v3 mla": [((2, 32, 640), "bfloat16")] * 61,
    "deepseek-v4 roles": [((64, 4, 128), "uint8"), ((16, 4, 256), "uint8")] * 43,
}


def native_rows(pages: int = 65536) -> list[dict]:
    """Roofline rows of the native-cache kernel: its plan's DMAs and bytes per batch."""
    out = []
    for name, leaves in NATIVE_CACHES.items():
        plan = plan_tpu([((pages, *page), dtype) for page, dtype in leaves])
        step = ids_per_step_for(plan)
        per_id = sum(lp.page_bytes for lp in plan.leaves)
        # a page leaf's DMAs write its page; an rmw leaf reads and writes its whole row group
        moved_per_id = sum(lp.page_bytes * (2 * lp.chunk if lp.kind == "rmw" else 1) for lp in plan.leaves)
        rmw = sum(2 for lp in plan.leaves if lp.kind == "rmw")
        for batch in (1, 16, 256, 4096, 16384):
            moved = batch * moved_per_id
            r = {
                "cache": name,
                "leaves": len(leaves),
                "batch": batch,
                "bytes_cleared": batch * per_id,
                "hbm_bytes_moved": moved,
                "dmas": batch * (plan.dmas_per_id + rmw),
                "grid_steps": -(-batch // step),
                "ids_per_step": step,
            }
            for chip, bw in HBM.items():
                r[f"{chip}_floor_us"] = moved / bw * 1e6
            out.append(r)
    return out


if __name__ == "__main__":
    main()
