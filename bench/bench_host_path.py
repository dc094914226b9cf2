"""Host-only cost of a zero step's id handling (issue 15): validation + staging, no launch.

Times, per batch of Python-list ids: kvlayout's fast path (``CudaZeroer._fill``: C-speed
type count, NumPy conversion straight into the staging buffer, min/max bounds), the generic
path (``normalize_block_ids`` then a copy into the staging buffer), and vLLM 0.33's host
path (``torch.tensor(list)``, pinned when a GPU is present). Runs on a CPU (interpreter
mode) or on the GPU machine's host. Medians of many calls.

    python bench/bench_host_path.py [--batches 1,8,64,512,4096,16384]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import kvlayout.backends.cuda as kc
import numpy as np
import torch

import kvlayout as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import median_s  # noqa: E402  (bench/ holds the one timing helper)


def _median_us(fn: Callable[[], Any], n: int) -> float:
    return round(median_s(fn, n) * 1e6, 2)


def host_path(batches: list[int], num_blocks: int = 100_000) -> list[dict[str, Any]]:
    """One row per batch: microseconds of each host path (no kernel launch, no copy)."""
    t = K.plan(K.preset("dsv4-test").with_num_blocks(num_blocks))
    buf = torch.empty(t.total_bytes if kc.MODE != "native" else 4, dtype=torch.uint8)
    if kc.MODE == "native":  # only the host part is timed: a one-block table's buffer will do
        t = K.plan(K.preset("dsv4-test").with_num_blocks(1))
        buf = torch.empty(t.total_bytes, dtype=torch.uint8, device="cuda")
    z = kc.CudaZeroer(t, buf, max_batch=max(batches), graphs=False)
    z.table = K.plan(K.preset("dsv4-test").with_num_blocks(num_blocks))  # bounds of the large pool
    pin = kc.MODE == "native"
    staging = np.empty(max(batches) + 1, np.int64)
    rng = np.random.default_rng(0)
    rows = []
    for k in batches:
        ids = rng.choice(num_blocks, size=k, replace=False).tolist()
        n = 2000 if k <= 512 else 200

        def generic(ids: list[int] = ids) -> None:
            arr = K.reference.normalize_block_ids(ids, num_blocks)
            staging[: arr.size] = arr

        rows.append(
            {
                "batch": k,
                "kvlayout_fill_us": _median_us(lambda ids=ids: z._fill(staging, ids), n),
                "generic_validate_us": _median_us(generic, n),
                "vllm_torch_tensor_us": _median_us(
                    lambda ids=ids: torch.tensor(ids, dtype=torch.int64, device="cpu", pin_memory=pin), n
                ),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,8,64,512,4096,16384")
    args = ap.parse_args()
    for row in host_path([int(b) for b in args.batches.split(",")]):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
