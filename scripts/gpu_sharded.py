"""Sharded zeroing on every GPU of this machine: torch (one process per GPU) and JAX (a mesh over all).

The number of GPUs comes from the machine, so the same script serves the one-GPU run and a
multi-GPU run. For both modes (``replicated``: every GPU holds a full local layout and
zeroes every id; ``block_sharded``: the pool is split over the GPUs and global ids are
routed), at real scale (``dsv4`` preset, ``--blocks`` blocks per GPU, ~15 GB each):

- torch path: ``torch.multiprocessing`` spawns one process per GPU; each joins a
  ``torch.distributed`` group (gloo, no collective is used for zeroing) and builds its
  zeroer with ``ShardedCudaZeroer.for_rank``;
- JAX path: one ``jax.Array`` sharded over a mesh of all GPUs, its per-device buffers
  torch-owned and handed over by DLPack, zeroed in place by ``ShardedPallasZeroer``.

Each GPU's bytes are compared on the device with an independent torch reference (strided
views, no Triton) applied to a clone of the poisoned shard with the ids routed there. Then
one batch of 4,096 blocks per GPU is timed against the single-device zeroer on the same
local buffer (median of several rounds; the ratio should stay near 1: no communication).

    XLA_PYTHON_CLIENT_PREALLOCATE=false python scripts/gpu_sharded.py [--out DIR] [--blocks N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvlayout as K  # noqa: E402
from kvlayout.sharding import ShardedLayout, shard_spec  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from timing import cuda_events_us, interleaved_us  # noqa: E402  (bench/ holds the one timing helper)

MODES = ("replicated", "block_sharded")
BATCH = 4096


def layout_for(mode: str, ngpu: int, per_gpu: int) -> ShardedLayout:
    axes = {"x": ngpu}
    if mode == "block_sharded":
        return shard_spec(K.preset("dsv4").with_num_blocks(per_gpu * ngpu), axes, block_axes=("x",))
    return shard_spec(K.preset("dsv4").with_num_blocks(per_gpu), axes, head_axes=("x",))


def batches_for(lay: ShardedLayout, seed: int) -> list[np.ndarray]:
    """Global id batches: 4,096 ids per GPU each (block_sharded: drawn from every GPU's part),
    plus edge ids."""
    rng = np.random.default_rng(seed)
    bps = lay.blocks_per_shard
    out = []
    for _ in range(3):
        parts = [j * bps + rng.choice(bps, BATCH, replace=False) for j in range(lay.block_shards)]
        out.append(rng.permutation(np.concatenate(parts)))
    out.append(np.array([0, lay.num_blocks - 1, lay.num_blocks - 1, bps - 1, min(bps, lay.num_blocks - 1)]))
    return out


class Donating:
    """A timed step that donates its buffer: each call keeps the result as the next input."""

    def __init__(self, fn: Callable[[Any, Any], Any], buf: Any, ids: Any) -> None:
        self.fn, self.buf, self.ids = fn, buf, ids

    def __call__(self) -> None:
        self.buf = self.fn(self.buf, self.ids)


# --------------------------------------------------------------------------- torch path
def torch_rank(rank: int, world: int, per_gpu: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist
    from kvlayout.backends.cuda import CudaZeroer, ShardedCudaZeroer
    from kvlayout.backends.cuda.testing import device_poison, torch_reference_zero

    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dev = torch.device("cuda", rank)
    res: dict[str, Any] = {"rank": rank, "device": torch.cuda.get_device_name(dev)}
    for mode in MODES:
        lay = layout_for(mode, world, per_gpu)
        shard = lay.shard_of_rank(rank)
        buf = device_poison(lay.shard_bytes, dev, seed=1000 + rank)
        ref = buf.clone()
        z = ShardedCudaZeroer.for_rank(lay, buf, max_batch=BATCH * world + 16)  # rank from torch.distributed
        batches = batches_for(lay, seed=7)
        t0 = time.time()
        for i, ids in enumerate(batches):
            z.zero(torch.from_numpy(ids).to(dev) if i % 2 == 0 else ids)  # device and host ids
        batches.append(np.array([5, lay.num_blocks, -1]))  # bad ids write nothing anywhere; 5 is zeroed
        z.zero(torch.from_numpy(batches[-1]).to(dev))
        torch.cuda.synchronize()
        bad_flagged = False
        try:
            z.check()
        except K.BlockIdError:
            bad_flagged = True
        words = ref[: lay.local_table.total_bytes].view(torch.int32)
        for ids in batches:
            local = lay.local_ids(shard, ids[(ids >= 0) & (ids < lay.num_blocks)])
            torch_reference_zero(words, lay.local_table, torch.from_numpy(local).to(dev))
        torch.cuda.synchronize()
        equal = bool(torch.equal(buf, ref))
        seconds = time.time() - t0
        # timing: one batch of 4,096 blocks per GPU, sharded (global device ids) vs the
        # single-device zeroer (local ids)
        ids_g = torch.from_numpy(batches[0]).to(dev)
        ids_l = torch.from_numpy(lay.local_ids(shard, batches[0])).to(dev)
        single = CudaZeroer(lay.local_table, buf, max_batch=BATCH)
        sharded_step, single_step = partial(z.zero, ids_g), partial(single.zero, ids_l)
        t_sh = cuda_events_us(lambda i, f=sharded_step: f(), reps=30)
        t_si = cuda_events_us(lambda i, f=single_step: f(), reps=30)
        queued = interleaved_us(
            {"sharded": sharded_step, "single": single_step},
            torch.cuda.synchronize,
            rounds=7,
        )
        q_sh, q_si = queued["sharded"], queued["single"]
        del sharded_step, single_step
        z.check()
        res[mode] = {
            "shard": shard,
            "blocks_per_gpu": lay.blocks_per_shard,
            "global_blocks": lay.num_blocks,
            "shard_bytes": lay.shard_bytes,
            "ids_zeroed_here": int(
                sum(lay.local_ids(shard, b[(b >= 0) & (b < lay.num_blocks)]).size for b in batches)
            ),
            "equal_to_torch_reference": equal,
            "bad_ids_flagged": bad_flagged,
            "check_seconds": round(seconds, 2),
            "local_ids_in_timed_batch": int(ids_l.numel()),
            "sharded_us": t_sh,
            "single_us": t_si,
            "ratio_sharded_over_single": round(t_sh / t_si, 3),
            "queued_sharded_us": q_sh,
            "queued_single_us": q_si,
            "queued_ratio": round(q_sh / q_si, 3),
            "bytes_per_batch": int(ids_l.numel()) * lay.local_table.bytes_per_block,
        }
        del z, single, buf, ref, words
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, f"torch_rank{rank}.json"), "w") as f:
        json.dump(res, f, indent=1)
    dist.destroy_process_group()


def run_torch(world: int, per_gpu: int, out_dir: str) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(
            torch_rank, args=(world, per_gpu, os.path.join(tmp, "init"), out_dir), nprocs=world, join=True
        )
    out = []
    for r in range(world):
        with open(os.path.join(out_dir, f"torch_rank{r}.json")) as f:
            out.append(json.load(f))
    return out


# --------------------------------------------------------------------------- JAX path
def run_jax(per_gpu: int) -> dict[str, Any]:
    import jax
    import kvlayout.backends.pallas as kp
    from jax.sharding import Mesh
    from kvlayout.backends.cuda.testing import device_poison, torch_reference_zero

    gpus = jax.devices("gpu")
    mesh = Mesh(np.array(gpus), ("x",))
    res: dict[str, Any] = {"jax": jax.__version__, "devices": [str(d) for d in gpus]}
    for mode in MODES:
        lay = layout_for(mode, len(gpus), per_gpu)
        z = kp.ShardedPallasZeroer(lay, mesh)
        owners, refs, locals_ = [], [], []
        for k, d in enumerate(gpus):
            t = device_poison(lay.shard_bytes, torch.device("cuda", d.local_hardware_id), seed=2000 + k)
            owners.append(t)
            refs.append(t.clone())
        torch.cuda.synchronize()
        rows = z.shard_rows
        for k, t in enumerate(owners):
            arr = jax.dlpack.from_dlpack(t.view(torch.int32).view(rows, 128))
            assert arr.devices() == {gpus[k]}
            locals_.append(arr)
        ptrs = [t.data_ptr() for t in owners]
        buf = jax.make_array_from_single_device_arrays(z.buffer_shape, z.sharding, locals_)
        del locals_
        batches = batches_for(lay, seed=11)
        t0 = time.time()
        for i, ids in enumerate(batches):
            buf = z(buf, jax.device_put(ids.astype(np.int32), z.ids_sharding) if i % 2 == 0 else ids)
        batches.append(np.array([5, lay.num_blocks, -1]))  # bad ids write nothing anywhere; 5 is zeroed
        buf = z(buf, jax.device_put(batches[-1].astype(np.int32), z.ids_sharding))
        buf.block_until_ready()
        bad_flagged = False
        try:
            z.check()
        except K.BlockIdError:
            bad_flagged = True
        in_place = sorted(s.data.unsafe_buffer_pointer() for s in buf.addressable_shards) == sorted(ptrs)
        same_sharding = buf.sharding.is_equivalent_to(z.sharding, 2)
        per_dev = []
        for k, (t, ref) in enumerate(zip(owners, refs)):
            words = ref[: lay.local_table.total_bytes].view(torch.int32)
            for ids in batches:
                valid = ids[(ids >= 0) & (ids < lay.num_blocks)]
                torch_reference_zero(
                    words, lay.local_table, torch.from_numpy(lay.local_ids(k, valid)).to(ref.device)
                )
            torch.cuda.synchronize()
            per_dev.append(bool(torch.equal(t, ref)))
        seconds = time.time() - t0
        # timing: one 4,096-per-GPU batch, sharded over the mesh vs PallasZeroer on GPU 0's local buffer alone
        ids_g = jax.device_put(batches[0].astype(np.int32), z.ids_sharding)
        single = kp.PallasZeroer(lay.local_table)
        one = jax.dlpack.from_dlpack(owners[0].view(torch.int32).view(rows, 128))
        ids_l = jax.device_put(lay.local_ids(0, batches[0]).astype(np.int32), gpus[0])
        buf = z(buf, ids_g)
        one = single(one, ids_l)
        jax.block_until_ready((buf, one))
        sharded_call, single_call = Donating(z, buf, ids_g), Donating(single, one, ids_l)
        queued = interleaved_us(
            {"sharded": sharded_call, "single": single_call},
            lambda a=sharded_call, b=single_call: jax.block_until_ready((a.buf, b.buf)),
            rounds=7,
        )
        t_sh, t_si = queued["sharded"], queued["single"]
        buf, one = sharded_call.buf, single_call.buf
        del sharded_call, single_call
        z.check()
        single.check()
        res[mode] = {
            "mode": z.mode,
            "blocks_per_gpu": lay.blocks_per_shard,
            "global_blocks": lay.num_blocks,
            "shard_bytes": lay.shard_bytes,
            "equal_to_torch_reference_per_gpu": per_dev,
            "in_place_same_pointers": in_place,
            "sharding_kept": same_sharding,
            "bad_ids_flagged": bad_flagged,
            "check_seconds": round(seconds, 2),
            "local_ids_in_timed_batch": int(lay.local_ids(0, batches[0]).size),
            "sharded_us": t_sh,
            "single_us": t_si,
            "ratio_sharded_over_single": round(t_sh / t_si, 3),
            "traces": sum(f._cache_size() for f in (z._jitted, z._jitted_local)),
        }
        del buf, one, owners, refs, z, single
        torch.cuda.empty_cache()
    return res


def check_routed_one_gpu(per_shard: int = 25_000, shards: int = 4) -> dict[str, Any]:
    """The routed device-id paths natively, with every shard of a 4-way pool on this one GPU.

    torch: ``ShardedCudaZeroer`` over 4 buffers (so each launch packs its own ids out of
    4 x 4,096), plus CUDA-graph capture and replay of a step. JAX: the persistent Pallas
    kernel (what block_sharded device ids use) with the other shards' ids as invalid slots.
    Everything compared with the torch reference.
    """
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.pallas as kp
    from kvlayout.backends.cuda import ShardedCudaZeroer
    from kvlayout.backends.cuda.testing import device_poison, torch_reference_zero

    lay = shard_spec(K.preset("dsv4").with_num_blocks(per_shard * shards), {"x": shards}, block_axes=("x",))
    bufs = [device_poison(lay.shard_bytes, "cuda", seed=300 + k) for k in range(shards)]
    refs = [b.clone() for b in bufs]
    z = ShardedCudaZeroer(lay, bufs, max_batch=BATCH * shards)
    batches = batches_for(lay, seed=13)
    for ids in batches[:2]:
        z.zero(torch.from_numpy(ids).cuda())
    z.zero(torch.tensor([7, lay.num_blocks + 3], device="cuda"))  # one bad id: written nowhere, flagged
    flagged = False
    try:
        z.check()
    except K.BlockIdError:
        flagged = True
    # CUDA graph: capture one step on a static ids tensor, replay it with two other batches
    static = torch.from_numpy(batches[2]).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        z.zero(static)  # warm-up outside the capture (lazy allocations, compilation)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        z.zero(static)
    replays = [batches_for(lay, seed=s)[0] for s in (21, 22)]
    for ids in replays:
        static.copy_(torch.from_numpy(ids))
        graph.replay()
    torch.cuda.synchronize()
    z.check()
    done = [*batches[:2], np.array([7]), batches[2], *replays]
    equal = []
    for k in range(shards):
        words = refs[k][: lay.local_table.total_bytes].view(torch.int32)
        for ids in done:
            torch_reference_zero(words, lay.local_table, torch.from_numpy(lay.local_ids(k, ids)).cuda())
        torch.cuda.synchronize()
        equal.append(bool(torch.equal(bufs[k], refs[k])))
    del bufs, refs, z, graph
    torch.cuda.empty_cache()
    # JAX: the persistent kernel of block_sharded device ids, shard 1's view of a 4-way batch
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pz = kp.PallasZeroer(lay.local_table, programs=kp.sharded.PERSISTENT_PROGRAMS_PER_SM * sms)
    rows = pz.buffer_shape[0]
    owner = device_poison(rows * 512, "cuda", seed=400)
    ref = owner.clone()
    step = jax.jit(pz.apply_masked, donate_argnums=0)
    buf = jax.dlpack.from_dlpack(owner.view(torch.int32).view(rows, 128))
    lo, bps = 1 * lay.blocks_per_shard, lay.blocks_per_shard
    jdone = []
    for ids in batches[:2]:
        own = (ids >= lo) & (ids < lo + bps)
        buf = step(buf, jnp.asarray(np.where(own, ids - lo, 0).astype(np.int32)), jnp.asarray(own))
        jdone.append(ids[own] - lo)
    buf.block_until_ready()
    words = ref[: lay.local_table.total_bytes].view(torch.int32)
    for local in jdone:
        torch_reference_zero(words, lay.local_table, torch.from_numpy(local).cuda())
    torch.cuda.synchronize()
    jax_equal = bool(torch.equal(owner, ref))
    del buf, owner, ref
    torch.cuda.empty_cache()
    return {
        "shards_on_one_gpu": shards,
        "blocks_per_shard": per_shard,
        "torch_equal_per_shard": equal,
        "torch_bad_id_flagged": flagged,
        "torch_graph_replays": len(replays),
        "jax_persistent_equal": jax_equal,
        "jax_persistent_programs": pz.programs,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--blocks", type=int, default=10**5, help="blocks per GPU")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-jax", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ngpu = torch.cuda.device_count()
    if ngpu == 0:
        print(
            "no CUDA device: this script is for GPU machines (CPU tests: tests/test_sharded_*.py)",
            file=sys.stderr,
        )
        return 2
    t0 = time.time()
    res: dict[str, Any] = {
        "gpus": ngpu,
        "blocks_per_gpu": args.blocks,
        "preset": "dsv4",
        "batch_per_gpu": BATCH,
        "torch": torch.__version__,
    }
    if not args.skip_torch:
        res["torch_path"] = run_torch(ngpu, args.blocks, args.out)
    if not args.skip_jax:
        res["jax_path"] = run_jax(args.blocks)
    if not (args.skip_jax or args.skip_torch):
        res["routed_one_gpu"] = check_routed_one_gpu()
    res["seconds"] = round(time.time() - t0, 1)
    ok = True
    rows = []
    for r in res.get("torch_path", []):
        for mode in MODES:
            m = r[mode]
            ok &= m["equal_to_torch_reference"] and m["bad_ids_flagged"]
            rows.append(
                (
                    "torch",
                    mode,
                    f"rank {r['rank']} events",
                    m["equal_to_torch_reference"],
                    m["sharded_us"],
                    m["single_us"],
                    m["ratio_sharded_over_single"],
                )
            )
            rows.append(
                (
                    "torch",
                    mode,
                    f"rank {r['rank']} queued",
                    m["equal_to_torch_reference"],
                    m["queued_sharded_us"],
                    m["queued_single_us"],
                    m["queued_ratio"],
                )
            )
    if "jax_path" in res:
        for mode in MODES:
            m = res["jax_path"][mode]
            ok &= (
                all(m["equal_to_torch_reference_per_gpu"])
                and m["in_place_same_pointers"]
                and m["sharding_kept"]
                and m["bad_ids_flagged"]
            )
            rows.append(
                (
                    "jax",
                    mode,
                    f"{ngpu}-GPU queued",
                    all(m["equal_to_torch_reference_per_gpu"]),
                    m["sharded_us"],
                    m["single_us"],
                    m["ratio_sharded_over_single"],
                )
            )
    if "routed_one_gpu" in res:
        r1 = res["routed_one_gpu"]
        ok &= all(r1["torch_equal_per_shard"]) and r1["torch_bad_id_flagged"] and r1["jax_persistent_equal"]
    res["all_ok"] = bool(ok)
    with open(os.path.join(args.out, "gpu_sharded.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    print(
        f"\nsharded zeroing, dsv4, {args.blocks} blocks per GPU, {ngpu} GPU(s); "
        f"timed: one batch of {BATCH} blocks per GPU (median)"
    )
    print(
        f"{'path':6} {'mode':14} {'timing':15} {'equal':6} {'sharded us':>11} {'single us':>10} {'ratio':>6}"
    )
    for p, mode, where, eq, sh, si, ratio in rows:
        print(f"{p:6} {mode:14} {where:15} {eq!s:6} {sh:11.1f} {si:10.1f} {ratio:6.3f}")
    if "routed_one_gpu" in res:
        r1 = res["routed_one_gpu"]
        print(
            f"routed device ids, {r1['shards_on_one_gpu']} shards on one GPU: "
            f"torch equal per shard {r1['torch_equal_per_shard']} "
            f"(incl. {r1['torch_graph_replays']} CUDA-graph replays), "
            f"bad id flagged {r1['torch_bad_id_flagged']}; "
            f"JAX persistent kernel ({r1['jax_persistent_programs']} programs) "
            f"equal {r1['jax_persistent_equal']}"
        )
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
