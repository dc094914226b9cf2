"""GPU checks of the ``cuda`` backend (run on the H200 with the device tool).

Native correctness at real scale (dsv4 preset, 10**5 blocks, ~15 GB, guard bands, on-device
poison and an independent torch reference), the exact host comparison on dsv4-test, CUDA
graph capture and replay, device-side bad ids, and back-to-back host batches through the
pinned staging ring. ``--small`` is the representative run for compute-sanitizer.

    python scripts/gpu_cuda.py [--small] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import kvlayout.backends.cuda as kc
import numpy as np
import torch
from kvlayout.backends.cuda.testing import device_poison, torch_reference_zero

import kvlayout as K
from kvlayout.conformance import run_case

GUARD = 4096


def check_scale(
    name: str,
    num_blocks: int,
    batches: list[np.ndarray],
    coalesce: bool = True,
    group: str | None = None,
    **kw: object,
) -> dict[str, object]:
    table = K.plan(K.preset(name).with_num_blocks(num_blocks))
    total = table.total_bytes
    buf = device_poison(GUARD + total + GUARD, "cuda")
    ref = buf.clone()
    z = kc.CudaZeroer(
        table, buf, offset=GUARD, coalesce=coalesce, max_batch=max(len(b) for b in batches), **kw
    )
    ref_words = ref[GUARD : GUARD + total].view(torch.int32)
    for j, ids in enumerate(batches):
        z.zero(ids.tolist() if j % 2 else ids, group)  # host ids (lists and arrays), no sync between batches
        torch_reference_zero(ref_words, table.for_group(group), torch.from_numpy(ids).cuda())
    z.check()
    torch.cuda.synchronize()
    equal = bool(torch.equal(buf, ref))
    guards = bool(torch.equal(buf[:GUARD], ref[:GUARD]) and torch.equal(buf[-GUARD:], ref[-GUARD:]))
    del buf, ref
    torch.cuda.empty_cache()
    return {
        "preset": name,
        "num_blocks": num_blocks,
        "rows": len(table),
        "kernel_rows": len(z.kernel_table),
        "group": group,
        "options": {k: str(v) for k, v in kw.items()},
        "batches": len(batches),
        "ids": int(sum(len(b) for b in batches)),
        "total_bytes": total,
        "equal_to_torch_reference": equal,
        "guards_intact": guards,
    }


def check_exact_host(name: str) -> dict[str, object]:
    table = K.plan(K.preset(name))
    n = table.num_blocks
    out = {}
    for label, ids in (
        ("first", [0]),
        ("last", [n - 1]),
        ("all", list(range(n))),
        ("dups", [3, 3, n - 1, 0, 3]),
        ("empty", []),
    ):
        res = run_case(kc.CudaBackend, table, ids)
        out[label] = res.ok and res.mode == "native"
    return {"preset": name, **out}


def check_graph() -> dict[str, object]:
    table = K.plan(K.preset("dsv4").with_num_blocks(20000))
    buf = device_poison(table.total_bytes, "cuda")
    ref = buf.clone()
    z = kc.CudaZeroer(table, buf)
    ids_dev = torch.zeros(512, dtype=torch.int64, device="cuda")
    rng = np.random.default_rng(1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        z.zero(ids_dev)  # warm-up compile outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        z.zero(ids_dev)
    ref_words = ref.view(torch.int32)
    torch_reference_zero(ref_words, table, ids_dev)  # the warm-up zeroed ids_dev's initial ids (all 0)
    for _ in range(5):
        new = torch.from_numpy(rng.choice(table.num_blocks, 512, replace=False)).cuda()
        ids_dev.copy_(new)
        g.replay()
        torch_reference_zero(ref_words, table, new)
    torch.cuda.synchronize()
    z.check()
    return {"graph_replays": 5, "equal_to_torch_reference": bool(torch.equal(buf, ref))}


def check_device_bad_ids() -> dict[str, object]:
    table = K.plan(K.preset("dsv4-test"))
    buf = device_poison(GUARD + table.total_bytes + GUARD, "cuda")
    ref = buf.clone()
    z = kc.CudaZeroer(table, buf, offset=GUARD)
    z.zero(torch.tensor([5, table.num_blocks + 3, -1, 10**9], dtype=torch.int64, device="cuda"))
    torch_reference_zero(
        ref[GUARD : GUARD + table.total_bytes].view(torch.int32), table, torch.tensor([5], device="cuda")
    )
    raised = ""
    try:
        z.check()
    except K.BlockIdError as e:
        raised = str(e)
    torch.cuda.synchronize()
    return {
        "flag_raised": bool(raised),
        "message": raised,
        "only_valid_ids_written": bool(torch.equal(buf, ref)),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="representative small run (for compute-sanitizer)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if kc.MODE != "native":
        print("no CUDA device: this script is for the GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    results: dict[str, object] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    import triton

    results["triton"] = triton.__version__
    rng = np.random.default_rng(0)
    if args.small:
        results["scale"] = [check_scale("dsv4-test", 100, [np.array([0, 5, 99]), np.array([1, 1, 2])])]
        results["bad_ids"] = check_device_bad_ids()
    else:
        n = 10**5
        batches = [rng.choice(n, 4096, replace=False) for _ in range(6)] + [np.array([0, n - 1, n - 1, 7])]
        batches += [rng.choice(n, k, replace=False) for k in (1, 37, 300, 5000)]  # every bucket size class
        results["scale"] = [
            check_scale("dsv4", n, batches),
            check_scale("dsv4", n, batches[:2], coalesce=False),
            check_scale("dsv4", n, batches, graphs=False),
            check_scale("dsv4", n, batches, group="c4.3"),
            check_scale("dsv4-test", n, batches),
            check_scale("llama-8b", 8192, [rng.choice(8192, 1024)]),
        ]
        results["exact_host"] = [check_exact_host(p) for p in ("dsv4-test", "dsv4", "llama-8b")]
        results["graph"] = check_graph()
        results["bad_ids"] = check_device_bad_ids()
    results["seconds"] = time.time() - t0
    ok = all(r["equal_to_torch_reference"] and r["guards_intact"] for r in results["scale"])  # type: ignore[index,union-attr]
    ok &= all(all(v for k, v in r.items() if k != "preset") for r in results.get("exact_host", []))  # type: ignore[union-attr]
    ok &= bool(results.get("graph", {"equal_to_torch_reference": True})["equal_to_torch_reference"])  # type: ignore[index]
    bad = results["bad_ids"]
    ok &= bool(bad["flag_raised"] and bad["only_valid_ids_written"])  # type: ignore[index]
    results["all_ok"] = ok
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_cuda_small.json" if args.small else "gpu_cuda.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
