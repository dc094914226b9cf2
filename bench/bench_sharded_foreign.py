"""What G-way block sharding costs each GPU: ids owned by the other G-1 GPUs (one GPU).

In ``block_sharded`` mode every GPU sees the whole global batch and skips the ids it does
not own (torch: inside the cuda kernel; JAX: invalid slots of ``apply_masked``). With
4,096 own ids per GPU, each GPU of a G-GPU pool also reads (G-1) x 4,096 foreign ids. This
measures that on one GPU, on the same dsv4 buffer as scripts/gpu_sharded.py: the kernels a
shard runs, with G-1 batches of foreign ids mixed in, against own ids only (G = 1). Queued calls,
host clock, median of rounds; prints a table, writes bench_sharded_foreign.json.

    python bench/bench_sharded_foreign.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from timing import queued_us  # noqa: E402  (bench/ is on sys.path when run as a script)

import kvlayout as K  # noqa: E402

BLOCKS = 10**5
OWN = 4096
GS = (1, 2, 4, 8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    import jax
    import kvlayout.backends.cuda as kc
    import kvlayout.backends.pallas as kp

    table = K.plan(K.preset("dsv4").with_num_blocks(BLOCKS))
    rng = np.random.default_rng(3)
    own = rng.choice(BLOCKS, OWN, replace=False)
    rows = kp.PallasZeroer(table).buffer_shape[0]
    owner = torch.empty(rows * 512, dtype=torch.uint8, device="cuda")
    owner.fill_(0x5A)
    cz = kc.CudaZeroer(table, owner, max_batch=OWN * max(GS))
    pz = kp.PallasZeroer(table)
    step = jax.jit(pz.apply_masked, donate_argnums=0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pz_p = kp.PallasZeroer(table, programs=kp.sharded.PERSISTENT_PROGRAMS_PER_SM * sms)
    step_p = jax.jit(pz_p.apply_masked, donate_argnums=0)
    state = {"buf": jax.dlpack.from_dlpack(owner.view(torch.int32).view(rows, 128))}
    res: dict[str, Any] = {"preset": "dsv4", "blocks_per_gpu": BLOCKS, "own_ids": OWN, "rows": []}
    for g in GS:
        foreign = (
            BLOCKS + rng.choice(BLOCKS * (g - 1), OWN * (g - 1), replace=False)
            if g > 1
            else np.zeros(0, np.int64)
        )
        mix = rng.permutation(np.concatenate([own, foreign]))
        t_ids = torch.from_numpy(mix).cuda()
        t_skip = queued_us(
            lambda t_ids=t_ids, g=g: cz._launch(t_ids, id_lo=0, id_limit=BLOCKS * g), torch.cuda.synchronize
        )
        t_us = queued_us(
            lambda t_ids=t_ids, g=g: cz.launch_routed(t_ids, id_lo=0, id_limit=BLOCKS * g),
            torch.cuda.synchronize,
        )
        j_ids = jax.device_put(np.where(mix < BLOCKS, mix, 0).astype(np.int32))
        j_valid = jax.device_put(mix < BLOCKS)

        def jstep(j_ids: Any = j_ids, j_valid: Any = j_valid) -> None:
            state["buf"] = step(state["buf"], j_ids, j_valid)

        j_us = queued_us(jstep, lambda: state["buf"].block_until_ready())

        def jstep_p(j_ids: Any = j_ids, j_valid: Any = j_valid) -> None:
            state["buf"] = step_p(state["buf"], j_ids, j_valid)

        jp_us = queued_us(jstep_p, lambda: state["buf"].block_until_ready())
        res["rows"].append(
            {
                "G": g,
                "ids_seen": int(mix.size),
                "torch_skip_us": t_skip,
                "torch_us": t_us,
                "jax_us": j_us,
                "jax_persistent_us": jp_us,
            }
        )
    cz.check()
    base = res["rows"][0]
    for r in res["rows"]:
        r["torch_skip_ratio"] = round(r["torch_skip_us"] / base["torch_skip_us"], 3)
        r["torch_ratio"] = round(r["torch_us"] / base["torch_us"], 3)
        r["jax_ratio"] = round(r["jax_us"] / base["jax_us"], 3)
        r["jax_persistent_ratio"] = round(
            r["jax_persistent_us"] / base["jax_us"], 3
        )  # against the grid at G = 1
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_sharded_foreign.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(
        f"per-GPU cost of G-way block sharding: {OWN} own ids + (G-1) x {OWN} foreign ids, "
        f"dsv4, {BLOCKS} blocks (queued, median)"
    )
    print("torch skip: one launch, foreign ids skipped per work item; torch routed: pack owned ids,")
    print("then zero (what ShardedCudaZeroer runs); jax grid / persistent: apply_masked with foreign")
    print("ids as invalid slots,")
    print(
        f"per-slot grid or {kp.sharded.PERSISTENT_PROGRAMS_PER_SM} x {sms} persistent programs (what "
        "ShardedPallasZeroer runs for device ids); ratios against G = 1 (grid for jax)"
    )
    print(
        f"{'G':>3} {'ids seen':>9} {'torch skip us':>14} {'ratio':>6} {'torch routed us':>16} {'ratio':>6} "
        f"{'jax grid us':>12} {'ratio':>6} {'jax persistent us':>18} {'ratio':>6}"
    )
    for r in res["rows"]:
        print(
            f"{r['G']:>3} {r['ids_seen']:>9} {r['torch_skip_us']:>14.1f} {r['torch_skip_ratio']:>6.3f} "
            f"{r['torch_us']:>16.1f} {r['torch_ratio']:>6.3f} {r['jax_us']:>12.1f} {r['jax_ratio']:>6.3f} "
            f"{r['jax_persistent_us']:>18.1f} {r['jax_persistent_ratio']:>6.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
