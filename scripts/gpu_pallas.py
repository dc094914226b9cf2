"""GPU checks of the ``pallas`` backend (H200, device tool): the Pallas-Triton kernel natively.

A torch-owned, poisoned buffer (dsv4 preset, 10**5 blocks, ~15 GB) is handed to JAX through
DLPack without a copy, zeroed in place by the donated Pallas call (same pointer), and
compared on the device with an independent torch reference. Also: dsv4-test exact host
checks, device-side bad ids, and the llama-8b (aligned) layout.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python scripts/gpu_pallas.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import kvlayout.backends.pallas as kp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from kvlayout.backends.cuda.testing import device_poison, torch_reference_zero  # noqa: E402

import kvlayout as K  # noqa: E402
from kvlayout.conformance import run_case  # noqa: E402


def check_dlpack_scale(name: str, num_blocks: int, batches: list[np.ndarray]) -> dict[str, object]:
    table = K.plan(K.preset(name).with_num_blocks(num_blocks))
    z = kp.PallasZeroer(table)
    rows = z.buffer_shape[0]
    owner = device_poison(rows * 512, "cuda")
    ref = owner.clone()
    torch.cuda.synchronize()
    ptr = owner.data_ptr()
    buf = jax.dlpack.from_dlpack(owner.view(torch.int32).view(rows, 128))
    same_in = buf.unsafe_buffer_pointer() == ptr
    for ids in batches:
        buf = z(buf, jnp.asarray(ids.astype(np.int32)))  # device ids, donated, in place
    buf.block_until_ready()
    same_out = buf.unsafe_buffer_pointer() == ptr
    z.check()
    words = ref[: table.total_bytes].view(torch.int32)
    for ids in batches:
        torch_reference_zero(words, table, torch.from_numpy(ids).cuda())
    torch.cuda.synchronize()
    equal = bool(torch.equal(owner, ref))
    del buf, owner, ref
    torch.cuda.empty_cache()
    return {
        "preset": name,
        "num_blocks": num_blocks,
        "total_bytes": table.total_bytes,
        "rows": rows,
        "mode": z.mode,
        "dlpack_zero_copy": bool(same_in),
        "in_place_same_pointer": bool(same_out),
        "equal_to_torch_reference": equal,
        "ids": int(sum(len(b) for b in batches)),
    }


def check_exact_host(name: str) -> dict[str, object]:
    table = K.plan(K.preset(name))
    n = table.num_blocks
    out: dict[str, object] = {"preset": name}
    for label, ids in (
        ("first", [0]),
        ("odd", [1, 3]),
        ("last", [n - 1]),
        ("all", list(range(n))),
        ("dups", [3, 3, n - 1]),
        ("empty", []),
    ):
        res = run_case(kp.PallasBackend, table, ids)
        out[label] = res.ok and res.mode == "native-gpu"
    return out


def check_bad_ids() -> dict[str, object]:
    table = K.plan(K.preset("dsv4-test"))
    data = K.poison_pattern(table.total_bytes)
    z = kp.PallasZeroer(table)
    buf = jnp.asarray(data.view(np.int32).reshape(z.buffer_shape))
    out = z(buf, jnp.array([5, 100, -1, 10**6], jnp.int32))
    got = np.asarray(out).reshape(-1).view(np.uint8)
    only = K.reference.compare_to_contract(data, got, table, [5]).matches
    msg = ""
    try:
        z.check()
    except K.BlockIdError as e:
        msg = str(e)
    return {"flag_raised": bool(msg), "message": msg, "only_valid_ids_written": only}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if jax.default_backend() != "gpu":
        print(f"JAX default backend is {jax.default_backend()}: this script is for the GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    rng = np.random.default_rng(0)
    n = 10**5
    batches = [rng.choice(n, 4096, replace=False) for _ in range(4)] + [np.array([0, n - 1, n - 1, 7])]
    res: dict[str, object] = {"jax": jax.__version__, "device": str(jax.devices()[0])}
    res["scale"] = [
        check_dlpack_scale("dsv4", n, batches),
        check_dlpack_scale("dsv4-test", n, batches[:2]),
        check_dlpack_scale("llama-8b", 8192, [rng.choice(8192, 1024)]),
    ]
    res["exact_host"] = [check_exact_host(p) for p in ("dsv4-test", "dsv4")]
    res["bad_ids"] = check_bad_ids()
    res["seconds"] = time.time() - t0
    ok = all(
        r["equal_to_torch_reference"] and r["in_place_same_pointer"] and r["dlpack_zero_copy"]
        for r in res["scale"]
    )  # type: ignore[index,union-attr]
    ok &= all(all(v for k, v in r.items() if k != "preset") for r in res["exact_host"])  # type: ignore[union-attr]
    ok &= bool(res["bad_ids"]["flag_raised"] and res["bad_ids"]["only_valid_ids_written"])  # type: ignore[index]
    res["all_ok"] = ok
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_pallas.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
