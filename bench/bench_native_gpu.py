"""Native caches on a GPU (H200): CacheZeroer against XLA's scatter and the cuda backend.

A native cache is a list of typed per-layer arrays, page axis first (GEOMETRY.md section 9).
For each geometry and batch size, one zeroing step of ``ids`` random pages (rotated over
``ROT`` batches, so the 60 MB L2 does not flatter small batches), queued calls, host clock,
median of rounds (bench/timing.py):

- ``native``: ``CacheZeroer.apply`` inside a jitted, donated step (the Pallas-Triton kernel,
  one launch over every leaf), device ids;
- ``xla-set``: ``leaf.at[ids].set(0)`` on every leaf, in the same kind of jitted, donated step;
- ``cuda-flat``: the cuda backend (``CudaZeroer``, one Triton launch) on one flat torch buffer
  holding the same leaves back to back (a table with one row per leaf), device ids;
- ``zero_``: torch ``zero_()`` of a contiguous region of as many bytes (the write ceiling).

Then, natively at scale, correctness: every leaf poisoned with a no-zero-byte pattern, guard
leaves (another group, never zeroed) before and after the cache in the pytree, a batch with
duplicates and out-of-range ids; every leaf must equal ``leaf.at[valid].set(0)`` bit for bit,
the guards must be untouched and ``check()`` must count the bad ids. The cuda backend's flat
buffer is checked against the same contract page by page.

    python bench/bench_native_gpu.py [--out DIR] [--pages 8192] [--geometries llama,mla,dsv4,fp8]
    python bench/bench_native_gpu.py --smoke      # tiny sizes, any machine (interpreters): checks the script

Needs jax with CUDA (0.11.2 tested API), triton 3.6, torch 2.11 with CUDA for the real run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import queued_us  # noqa: E402

import kvlayout as K  # noqa: E402

ROT = 8
BATCHES = (1, 16, 256, 4096)
SMOKE_BATCHES = (1, 4)

#: name -> (layers, page shape, dtype): tpu-inference shapes of real models
GEOMETRIES: dict[str, tuple[int, tuple[int, ...], str]] = {
    # Llama-3.1-8B: 32 layers, 8 KV heads (K and V interleaved: 16 // packing 2), head_dim 128, 16 tokens
    "llama": (32, (16, 8, 2, 128), "bfloat16"),
    # DeepSeek-V3 MLA: 61 layers, 64 tokens -> (2, 32, 640) bf16
    "mla": (61, (2, 32, 640), "bfloat16"),
    # DeepSeek-V4 uint8 roles: NoPE (T, 4, 128) and indexer (T / 4, 4, 256), T = 64 (two leaves per layer)
    "dsv4": (43, (64, 4, 128), "uint8"),
    # fp8 attention, packing 4: 8 KV heads -> 16 // 4, 32 tokens
    "fp8": (32, (32, 4, 4, 128), "float8_e4m3fn"),
}
DSV4_INDEXER = ((16, 4, 256), "uint8")


def leaf_specs(name: str, pages: int, layers: int | None = None) -> list[tuple[tuple[int, ...], str]]:
    """``(shape, dtype)`` of every leaf of geometry ``name`` with ``pages`` pages."""
    n, page, dtype = GEOMETRIES[name]
    n = layers or n
    out = [((pages, *page), dtype)] * n
    if name == "dsv4":
        indexer = ((pages, *DSV4_INDEXER[0]), DSV4_INDEXER[1])
        out = [leaf for _ in range(n) for leaf in (((pages, *page), dtype), indexer)]
    return out


def page_bytes(spec: tuple[tuple[int, ...], str]) -> int:
    import jax.numpy as jnp

    shape, dtype = spec
    return int(np.prod(shape[1:])) * jnp.dtype(dtype).itemsize


def flat_table(specs: list[tuple[tuple[int, ...], str]]) -> K.SegmentTable:
    """The leaves back to back in one buffer: one row per leaf (base, stride = span = page)."""
    rows, base = [], 0
    pages = specs[0][0][0]
    for i, s in enumerate(specs):
        pb = page_bytes(s)
        rows.append(K.Segment(base, pb, pb, "", f"leaf{i}"))
        base += pb * pages
    return K.SegmentTable(base, pages, tuple(rows))


def poison(shape: tuple[int, ...], dtype: str, seed: int) -> Any:
    """A device array of random bytes with no zero byte (and no NaN pattern change: bits only)."""
    import jax
    import jax.numpy as jnp

    dt = jnp.dtype(dtype)
    raw = jax.random.bits(jax.random.key(seed), (*shape, dt.itemsize), jnp.uint8)
    raw = jnp.where(raw == 0, jnp.uint8(0xA5), raw)
    return jax.lax.bitcast_convert_type(raw if dt.itemsize > 1 else raw[..., 0], dt)


def same_bits(a: Any, b: Any) -> bool:
    import jax
    import jax.numpy as jnp

    u = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[jnp.dtype(a.dtype).itemsize]
    return bool(jnp.array_equal(jax.lax.bitcast_convert_type(a, u), jax.lax.bitcast_convert_type(b, u)))


def bench_geometry(
    name: str, pages: int, batches: tuple[int, ...], smoke: bool, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """Time the four methods at every batch size on one geometry; one row per batch."""
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.cuda as kc
    import kvlayout.backends.pallas as kp
    import torch

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    sync_t: Callable[[], Any] = torch.cuda.synchronize if cuda else (lambda: None)
    specs = leaf_specs(name, pages, layers=2 if smoke else None)
    per_block = sum(page_bytes(s) for s in specs)
    state: dict[str, Any] = {"c": [jnp.zeros(s, jnp.dtype(d)) for s, d in specs]}
    z = kp.CacheZeroer(state["c"])
    native = jax.jit(lambda c, i: z.apply(c, i)[0], donate_argnums=0)
    xla_set = jax.jit(lambda c, i: [x.at[i].set(0) for x in c], donate_argnums=0)
    table = flat_table(specs)
    flat = torch.zeros(table.total_bytes, dtype=torch.uint8, device=dev)
    cz = kc.CudaZeroer(table, flat, max_batch=max(batches))
    ceiling = torch.empty(per_block * max(batches), dtype=torch.uint8, device=dev)
    sync_j = lambda: jax.block_until_ready(state["c"])  # noqa: E731
    rows = []
    for n in batches:
        host = [rng.choice(pages, n, replace=False).astype(np.int32) for _ in range(ROT)]
        j_ids = [jax.device_put(h) for h in host]
        t_ids = [torch.from_numpy(h.astype(np.int64)).to(dev) for h in host]
        it = {"k": 0}

        def nxt() -> int:
            it["k"] = (it["k"] + 1) % ROT
            return it["k"]

        def run_native() -> None:
            state["c"] = native(state["c"], j_ids[nxt()])

        def run_xla() -> None:
            state["c"] = xla_set(state["c"], j_ids[nxt()])

        def run_cuda() -> None:
            cz.zero(t_ids[nxt()])

        def run_ceiling(nbytes: int = n * per_block) -> None:
            ceiling[:nbytes].zero_()

        rounds, calls = (1, 2) if smoke else (9, 20)
        us = {
            "native": queued_us(run_native, sync_j, rounds, calls),
            "xla_set": queued_us(run_xla, sync_j, rounds, calls),
            "cuda_flat": queued_us(run_cuda, sync_t, rounds, calls),
            "zero": queued_us(run_ceiling, sync_t, rounds, calls),
        }
        nbytes = n * per_block
        r: dict[str, Any] = {"geometry": name, "leaves": len(specs), "pages": pages, "ids": n}
        r["bytes"] = nbytes
        for k, t in us.items():
            r[f"{k}_us"] = t
            r[f"{k}_TBps"] = round(nbytes / (t * 1e-6) / 1e12, 3) if t else None
        r["native_vs_xla_set"] = round(us["xla_set"] / us["native"], 2) if us["native"] else None
        r["native_vs_cuda"] = round(us["cuda_flat"] / us["native"], 2) if us["native"] else None
        rows.append(r)
        print(format_row(r), flush=True)
    cz.check()
    z.check()
    state.clear()  # free the leaves before the next geometry
    return rows


def check_geometry(name: str, pages: int, smoke: bool, rng: np.random.Generator) -> dict[str, Any]:
    """Correctness at scale: poisoned leaves between guard leaves, dups and bad ids, bit-exact."""
    import jax.numpy as jnp
    import kvlayout.backends.cuda as kc
    import kvlayout.backends.pallas as kp
    import torch

    specs = leaf_specs(name, pages, layers=2 if smoke else None)
    guard = ((pages, 8, 128), "float32")
    all_specs = [guard, *specs, guard]
    groups = ["guard", *(["cache"] * len(specs)), "guard"]
    t0 = time.perf_counter()
    caches = [poison(s, d, i) for i, (s, d) in enumerate(all_specs)]
    n = min(pages, 16 if smoke else 4096)
    ids = rng.choice(pages, n, replace=False).astype(np.int32)
    batch = np.concatenate([ids, ids[: n // 4], [pages, -1, 2**31 - 1]]).astype(np.int32)  # dups + 3 bad
    rng.shuffle(batch)
    z = kp.CacheZeroer(caches, groups)
    out = z(caches, jnp.asarray(batch), group="cache")
    exact = []
    for i, (leaf, (s, d), g) in enumerate(zip(out, all_specs, groups)):  # one reference leaf at a time
        want = poison(s, d, i)
        exact.append(same_bits(leaf, want.at[jnp.asarray(ids)].set(0) if g == "cache" else want))
        del want
    del out
    leaves_ok, guards_ok = all(exact[1:-1]), exact[0] and exact[-1]
    try:
        z.check()
        bad_counted = 0
    except K.BlockIdError as e:
        bad_counted = int(e.value)
    # the cuda backend on the flat copy of the same leaves: every page against the contract
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    table = flat_table(specs)
    flat = torch.empty(table.total_bytes, dtype=torch.uint8, device=dev)
    flat.fill_(0x5A)
    cz = kc.CudaZeroer(table, flat, max_batch=batch.size)
    cuda_bad: bool | None = None  # did check() flag the bad device ids (its value is an example id)
    if dev == "cuda":  # device ids: bad ones write nothing and are flagged by the kernel
        cz.zero(torch.from_numpy(batch.astype(np.int64)).to(dev))
        try:
            cz.check()
            cuda_bad = False
        except K.BlockIdError:
            cuda_bad = True
    else:  # the interpreter validates tensor ids on the host (a bad one raises): valid ids only
        cz.zero(torch.from_numpy(batch[(batch >= 0) & (batch < pages)].astype(np.int64)))
    host = flat.view(-1).cpu().numpy()
    exp = K.expected_zeroed(table, ids)
    mask = np.zeros(table.total_bytes, bool)
    for a, b in exp.tolist():
        mask[a:b] = True
    cuda_ok = bool((host[mask] == 0).all() and (host[~mask] == 0x5A).all())
    res = {"geometry": name, "pages": pages, "leaves": len(specs), "ids": int(n), "batch": int(batch.size),
           "leaves_exact": leaves_ok, "guards_untouched": guards_ok, "bad_ids_counted": bad_counted,
           "cuda_flat_exact": cuda_ok, "cuda_bad_ids_counted": cuda_bad, "mode": z.mode,
           "seconds": round(time.perf_counter() - t0, 1)}
    print(" ".join(f"{k}={v}" for k, v in res.items()), flush=True)
    return res


def format_row(r: dict[str, Any]) -> str:
    return (f"{r['geometry']:6s} {r['leaves']:4d} leaves {r['ids']:6d} ids {r['bytes'] / 2**20:10.1f} MiB | "
            f"native {r['native_us']:9.1f} us ({r['native_TBps']} TB/s) | "
            f"xla-set {r['xla_set_us']:9.1f} us | "
            f"cuda-flat {r['cuda_flat_us']:9.1f} us | zero_ {r['zero_us']:9.1f} us | "
            f"xla-set/native {r['native_vs_xla_set']}x cuda/native {r['native_vs_cuda']}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--pages", type=int, default=8192)
    ap.add_argument("--geometries", default=",".join(GEOMETRIES))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, interpreters (no GPU needed)")
    args = ap.parse_args()
    names = [g for g in args.geometries.split(",") if g]
    unknown = [g for g in names if g not in GEOMETRIES]
    if unknown:
        print(f"unknown geometry {unknown[0]!r}; valid: {', '.join(GEOMETRIES)}", file=sys.stderr)
        return 2
    import jax
    import torch

    if not args.smoke and not (torch.cuda.is_available() and jax.default_backend() == "gpu"):
        print("needs a CUDA device for torch and JAX (or --smoke)", file=sys.stderr)
        return 2
    pages = 16 if args.smoke else args.pages
    batches = SMOKE_BATCHES if args.smoke else BATCHES
    rng = np.random.default_rng(16)
    res: dict[str, Any] = {
        "jax": jax.__version__, "torch": torch.__version__, "device": str(jax.devices()[0].device_kind),
        "smoke": args.smoke, "timing": [], "correctness": [],
    }
    for name in names:
        res["correctness"].append(check_geometry(name, pages, args.smoke, rng))
        res["timing"] += bench_geometry(name, pages, batches, args.smoke, rng)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_native_gpu.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)
    ok = all(c["leaves_exact"] and c["guards_untouched"] and c["cuda_flat_exact"]
             and c["bad_ids_counted"] == 3 and c["cuda_bad_ids_counted"] in (True, None)
             for c in res["correctness"])
    print("correctness:", "all exact" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
