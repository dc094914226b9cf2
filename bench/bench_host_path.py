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


def replay_breakdown(batches: list[int], num_blocks: int = 28_728) -> list[dict[str, Any]]:
    """GPU only: where a graph-replay step's host time goes, piece by piece (dsv4-test).

    Each piece of ``CudaZeroer._zero_replay`` timed alone (medians of many calls): taking a
    ring entry (lock + event query), writing the ids (``_fill``), choosing the plan, the
    graph's replay, the completion event's record; and the whole ``zero(list)`` step. The
    device keeps up at these batch sizes, so the times are the host's.
    """
    t = K.plan(K.preset("dsv4-test").with_num_blocks(num_blocks))
    buf = torch.empty(t.total_bytes, dtype=torch.uint8, device="cuda")
    z = kc.CudaZeroer(t, buf, max_batch=max(batches))
    rng = np.random.default_rng(0)
    rows = []
    for k in batches:
        ids = rng.choice(num_blocks, size=k, replace=False).tolist()
        n = 2000 if k <= 512 else 300
        r = z._replay_acquire()
        if r is None:
            raise RuntimeError("no free replay entry")
        bucket = kc.zeroer._bucket(k, z.max_batch)
        dplan = z.plan_for_batch(bucket, None)
        graph = r.graphs[(None, dplan.plan.chunk_words, bucket)]
        r.view[0] = z._fill(r.view[1:], ids)
        event = torch.cuda.Event()

        def take(r: Any = r) -> None:
            r.busy = False
            if z._replay_acquire() is None:
                raise RuntimeError("no free replay entry")

        row = {
            "batch": k,
            "acquire_us": _median_us(take, n),
            "fill_us": _median_us(lambda ids=ids, r=r: z._fill(r.view[1:], ids), n),
            "plan_us": _median_us(lambda b=bucket: z.plan_for_batch(b, None), n),
            "replay_us": _median_us(graph.replay, n),
            "event_record_us": _median_us(event.record, n),
        }
        torch.cuda.synchronize()
        r.busy = False
        row["zero_list_us"] = _median_us(lambda ids=ids: z.zero(ids), n)
        torch.cuda.synchronize()
        pieces = [v for key, v in row.items() if key.endswith("_us") and key != "zero_list_us"]
        row["pieces_sum_us"] = round(sum(pieces), 2)
        rows.append(row)
    z.check()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,8,64,512,4096,16384")
    ap.add_argument("--replay", action="store_true", help="GPU: break a graph-replay step's host time down")
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="write host_path.json here")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    out: dict[str, Any] = {"host": host_path(batches)}
    if args.replay:
        out["replay"] = replay_breakdown([b for b in batches if b <= 4096])
    for name, rows in out.items():
        print(f"== {name}")
        for row in rows:
            print(json.dumps(row))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "host_path.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
