"""Pallas-Triton on the GPU: the (id slot, unit) grid against persistent programs over live items.

dsv4, 10**5 blocks (15 GB), device ids; per config: 4,096 and 16,384 own ids, and the
8-way block-sharded case (4,096 own ids + 28,672 ids of other shards as invalid slots of
``apply_masked``, what ``ShardedPallasZeroer`` runs for device ids). The cuda backend on
the same memory is the yardstick. Queued calls, host clock, median of rounds. Prints a
table, writes pallas_persistent.json.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python bench/pallas_persistent.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from timing import queued_us  # noqa: E402  (bench/ is on sys.path when run as a script)

import kvlayout as K  # noqa: E402

BLOCKS = 10**5


class Step:
    """A donated jitted step over one buffer: each call keeps the result."""

    def __init__(self, fn: Callable[..., Any], buf: Any, *args: Any) -> None:
        self.fn, self.buf, self.args = fn, buf, args

    def __call__(self) -> None:
        self.buf = self.fn(self.buf, *self.args)

    def sync(self) -> None:
        self.buf.block_until_ready()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.cuda as kc
    import kvlayout.backends.pallas as kp

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    table = K.plan(K.preset("dsv4").with_num_blocks(BLOCKS))
    rng = np.random.default_rng(4)
    own4, own16 = rng.choice(BLOCKS, 4096, replace=False), rng.choice(BLOCKS, 16384, replace=False)
    mix = rng.permutation(np.concatenate([own4, BLOCKS + rng.choice(7 * BLOCKS, 7 * 4096, replace=False)]))
    rows = kp.PallasZeroer(table).buffer_shape[0]
    owner = torch.empty(rows * 512, dtype=torch.uint8, device="cuda")
    owner.fill_(0x5A)
    cz = kc.CudaZeroer(table, owner)
    res: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "sms": sms,
        "jax": jax.__version__,
        "rows": [],
    }
    t4, t16, tmix = (torch.from_numpy(x).cuda() for x in (own4, own16, mix))
    cuda = {
        "own4096": queued_us(lambda: cz.zero(t4), torch.cuda.synchronize, rounds=7),
        "own16384": queued_us(lambda: cz.zero(t16), torch.cuda.synchronize, rounds=7),
        "g8": queued_us(lambda: cz.launch_routed(tmix, 0, 8 * BLOCKS), torch.cuda.synchronize, rounds=7),
    }
    res["cuda_us"] = cuda
    configs: list[tuple[int | None, int, int]] = [(None, 16, 4)]
    configs += [(sms * m, c, 4) for m in (4, 8, 16) for c in (16, 32, 64)]
    configs += [(sms * 8, 32, 8)]
    buf = jax.dlpack.from_dlpack(owner.view(torch.int32).view(rows, 128))
    for programs, chunk_rows, warps in configs:
        z = kp.PallasZeroer(table, chunk_rows=chunk_rows, num_warps=warps, programs=programs)
        row: dict[str, Any] = {"programs": programs, "chunk_rows": chunk_rows, "num_warps": warps}
        for name, ids in (("own4096", own4), ("own16384", own16)):
            st = Step(z, buf, jnp.asarray(ids.astype(np.int32)))
            row[name] = queued_us(st, st.sync, rounds=7)
            buf = st.buf
        masked = jax.jit(z.apply_masked, donate_argnums=0)
        st = Step(
            masked,
            buf,
            jnp.asarray(np.where(mix < BLOCKS, mix, 0).astype(np.int32)),
            jnp.asarray(mix < BLOCKS),
        )
        row["g8"] = queued_us(st, st.sync, rounds=7)
        buf = st.buf
        for k in ("own4096", "own16384", "g8"):
            row[f"{k}_cuda_over_pallas"] = round(cuda[k] / row[k], 3)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    z.check()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "pallas_persistent.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\npallas-triton, dsv4 {BLOCKS} blocks, queued us (cuda/pallas in brackets); cuda: {cuda}")
    head = f"{'programs':>9} {'chunk':>5} {'warps':>5} {'own 4096':>16} {'own 16384':>16}"
    print(f"{head} {'8-way (4096 own)':>18}")
    for r in res["rows"]:
        p = "grid" if r["programs"] is None else str(r["programs"])
        print(
            f"{p:>9} {r['chunk_rows']:>5} {r['num_warps']:>5} "
            f"{r['own4096']:>9.1f} ({r['own4096_cuda_over_pallas']:.2f}) "
            f"{r['own16384']:>9.1f} ({r['own16384_cuda_over_pallas']:.2f}) "
            f"{r['g8']:>10.1f} ({r['g8_cuda_over_pallas']:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
