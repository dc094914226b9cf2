"""Pallas-Triton design sweep on the GPU: rows per program and warps (wall clock, queued calls).

XLA_PYTHON_CLIENT_PREALLOCATE=false python bench/pallas_design.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import kvlayout.backends.pallas as kp
import numpy as np

import kvlayout as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import counted, queued_us  # noqa: E402  (bench/ holds the one timing helper)

POOL = 65536
CONFIGS = [
    tuple(int(x) for x in c.split("x"))
    for c in os.environ.get("PALLAS_CONFIGS", "16x4,32x4,64x4,64x8,128x4,128x8,256x8,32x2").split(",")
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for name in ("dsv4-test", "dsv4"):
        table = K.plan(K.preset(name).with_num_blocks(POOL))
        for chunk_rows, warps in CONFIGS:
            z = kp.PallasZeroer(table, chunk_rows=chunk_rows, num_warps=warps)
            buf = jnp.zeros(z.buffer_shape, jnp.int32)
            for batch in (4096, 16384):
                ids = [jnp.asarray(rng.choice(POOL, batch, replace=False).astype(np.int32)) for _ in range(8)]
                state = {"buf": buf}

                def call(i: int, z: kp.PallasZeroer = z, ids: list[jax.Array] = ids) -> None:
                    state["buf"] = z(state["buf"], ids[i % 8])

                us = queued_us(counted(call), lambda: state["buf"].block_until_ready(), rounds=6, calls=10)
                buf = state["buf"]
                nbytes = batch * table.bytes_per_block
                rows.append(
                    {
                        "preset": name,
                        "batch": batch,
                        "chunk_rows": chunk_rows,
                        "num_warps": warps,
                        "us": us,
                        "TBps": nbytes / us / 1e6,
                    }
                )
                print(
                    f"{name:>9} {batch:>6} chunk_rows={chunk_rows:>4} warps={warps} "
                    f"{us:9.1f} us {nbytes / us / 1e6:5.2f} TB/s",
                    flush=True,
                )
            del buf
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pallas_design.json"), "w") as f:
        json.dump({"device": str(jax.devices()[0]), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
