"""GPU zeroing benchmark (H200): kvlayout backends against the ceiling and the baselines.

One run, one harness, CUDA events around every call, median of many repeats. Block ids
are drawn at random from a pool much larger than L2 and rotated between repeats (``ROT``
distinct batches), so small batches are not flattered by the 60 MB L2.

Methods (each zeroes the same number of bytes per call):
- ``kvlayout-cuda``: this project's Triton kernel, device ids;
- ``kvlayout-cuda-host``: the same, host ids through the pinned staging ring;
- ``kvlayout-pallas``: the Pallas backend through JAX on the same GPU (if importable);
- ``xla-scatter``: ``buf.at[rows].set(0)`` with donation (JAX, if importable);
- ``zero_``: torch ``zero_()`` of a contiguous region of the same bytes (the ceiling);
- ``vllm-style``: 3-D grid (ids x rows x ceil(max_span/1024)) of masked 1,024-int32 chunks;
- ``naive-torch``: per row, a strided view and ``view[ids] = 0``;
- ``empty-launch``: an empty Triton kernel (launch floor, for the 1-block row).

    python bench/bench_zero_gpu.py [--designs] [--out DIR]
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
import triton
import triton.language as tl

import kvlayout as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: one timing helper
from timing import counted, cuda_events_us, cuda_graph_us, queued_us  # noqa: E402

ROT = 16
BATCHES = (1, 16, 256, 4096, 16384)
POOL = 65536


@triton.jit
def vllm_style_kernel(buf_ptr, ids_ptr, base_ptr, stride_ptr, span_ptr, CHUNK: tl.constexpr):
    """The vLLM-style baseline: one program per (id, row, 1,024-word chunk), masked."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    c = tl.program_id(2)
    bid = tl.load(ids_ptr + b).to(tl.int64)
    start = tl.load(base_ptr + s) + bid * tl.load(stride_ptr + s)
    span = tl.load(span_ptr + s)
    off = c * CHUNK + tl.arange(0, CHUNK)
    tl.store(buf_ptr + start + off, tl.zeros([CHUNK], dtype=tl.int32), mask=off < span)


@triton.jit
def empty_kernel(x_ptr):
    pass


def reps_for(nbytes: int) -> int:
    return 200 if nbytes < 1 << 28 else 60


def make_id_batches(batch: int, rng: np.random.Generator) -> list[torch.Tensor]:
    return [torch.from_numpy(rng.choice(POOL, batch, replace=False)).cuda() for _ in range(ROT)]


def bench_geometry(
    name: str, buf: torch.Tensor, rng: np.random.Generator, methods: set[str]
) -> list[dict[str, object]]:
    table = K.plan(K.preset(name).with_num_blocks(POOL))
    words = buf[: table.total_bytes].view(torch.int32)
    z = kc.CudaZeroer(table, words, max_batch=max(BATCHES))
    per_block = table.bytes_per_block
    raw = table  # vLLM zeroes the uncoalesced, per-layer table
    vb = torch.from_numpy(raw.bases // 4).cuda()
    vs = torch.from_numpy(raw.strides // 4).cuda()
    vsp = torch.from_numpy(raw.spans // 4).cuda()
    max_chunks = int(-(-(raw.spans.max() // 4) // 1024))
    views = [words.as_strided((POOL, s.span // 4), (s.stride // 4, 1), s.base // 4) for s in raw.segments]
    pz = None
    if "kvlayout-pallas" in methods or "xla-scatter" in methods:
        pz = _pallas_setup(table, buf)
    rows = []
    for batch in BATCHES:
        ids = make_id_batches(batch, rng)
        host_ids = [t.cpu().numpy() for t in ids]
        nbytes = batch * per_block
        reps = reps_for(nbytes)
        res: dict[str, object] = {
            "preset": name,
            "batch": batch,
            "bytes": nbytes,
            "rows": len(table),
            "kernel_rows": len(z.kernel_table),
        }
        res["kvlayout-cuda"] = cuda_events_us(lambda i: z.zero(ids[i % ROT]), reps)
        res["kvlayout-cuda-host"] = cuda_events_us(lambda i: z.zero(host_ids[i % ROT]), reps)
        region = buf.numel() - nbytes
        offs = [int(x) // 4096 * 4096 for x in rng.integers(0, max(1, region), ROT)]
        res["zero_"] = cuda_events_us(lambda i: buf[offs[i % ROT] : offs[i % ROT] + nbytes].zero_(), reps)
        w32 = buf.view(torch.int32)
        res["zero_i32"] = cuda_events_us(
            lambda i: w32[offs[i % ROT] // 4 : (offs[i % ROT] + nbytes) // 4].zero_(), reps
        )
        if batch <= 256:
            graph = {"calls": 32, "replays": 20, "warmup": 3}
            res["kvlayout-cuda-graph"] = cuda_graph_us(lambda i: z.zero(ids[i % ROT]), **graph)
            res["empty-launch-graph"] = cuda_graph_us(lambda i: empty_kernel[(1,)](words), **graph)
        res["vllm-style"] = cuda_events_us(
            lambda i: vllm_style_kernel[(batch, len(raw), max_chunks)](
                words, ids[i % ROT], vb, vs, vsp, CHUNK=1024
            ),
            reps,
        )
        if batch <= 4096 and "naive-torch" in methods:

            def naive(i: int) -> None:
                for v in views:
                    v[ids[i % ROT]] = 0

            res["naive-torch"] = cuda_events_us(naive, max(20, reps // 4))
        res["empty-launch"] = cuda_events_us(lambda i: empty_kernel[(1,)](words), reps)
        if pz is not None:
            res["kvlayout-cuda-wall"] = queued_us(
                counted(lambda i: z.zero(ids[i % ROT])), torch.cuda.synchronize, max(3, reps // 10), 10
            )
            res.update(pz(batch, host_ids, reps))
        for k in list(res):
            if k not in ("preset", "batch", "bytes", "rows", "kernel_rows") and not k.startswith("empty"):
                us = float(res[k])  # type: ignore[arg-type]
                res[f"{k}_TBps"] = nbytes / us / 1e6
        rows.append(res)
    z.check()
    return rows


def _pallas_setup(
    table: K.SegmentTable, buf: torch.Tensor
) -> Callable[[int, list[np.ndarray], int], dict[str, float]] | None:
    """Timers for the Pallas backend and an XLA scatter, on JAX's copy of the same geometry."""
    try:
        import jax
        import jax.numpy as jnp
        import kvlayout.backends.pallas as kp
    except Exception as e:  # pragma: no cover - GPU machine only
        print(f"pallas timings skipped: {e}", file=sys.stderr)
        return None
    zp = kp.PallasZeroer(table)
    state = {"buf": jnp.zeros(zp.buffer_shape, jnp.int32)}

    def scatter(b: jax.Array, rows: jax.Array, lanes: jax.Array) -> jax.Array:
        return b.at[rows, lanes].set(0)  # 2-D int32 indices: no overflow past 2**31 words

    scatter_d = jax.jit(scatter, donate_argnums=0)

    def sync() -> None:
        state["buf"].block_until_ready()

    def run(batch: int, host_ids: list[np.ndarray], reps: int) -> dict[str, float]:
        out: dict[str, float] = {}
        dev_ids = [jnp.asarray(h.astype(np.int32)) for h in host_ids]

        def pallas_call(i: int) -> None:
            state["buf"] = zp(state["buf"], dev_ids[i % ROT])

        out["kvlayout-pallas"] = queued_us(counted(pallas_call), sync, max(3, reps // 10), 10)
        if batch <= 256:
            idx = [_word_indices(table, h) for h in host_ids]
            rl = [
                (jnp.asarray((w // 128).astype(np.int32)), jnp.asarray((w % 128).astype(np.int32)))
                for w in idx
            ]

            def scatter_call(i: int) -> None:
                state["buf"] = scatter_d(state["buf"], *rl[i % ROT])

            out["xla-scatter"] = queued_us(counted(scatter_call), sync, max(3, max(20, reps // 4) // 10), 10)
        return out

    return run


def _word_indices(table: K.SegmentTable, ids: np.ndarray) -> np.ndarray:
    parts = [
        np.arange(s.span // 4, dtype=np.int64) + (s.base + int(b) * s.stride) // 4
        for s in table.segments
        for b in ids
    ]
    return np.concatenate(parts)


class LaunchRecorder:
    """Stands in for a Triton kernel in the cuda zeroer's module: launches it unchanged and keeps
    the last compiled kernel, whose PTX shows which store widths a design compiled to."""

    def __init__(self, kernel: Any) -> None:
        self.kernel, self.last = kernel, None

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self.kernel[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            self.last = launch(*args, **kwargs)
            return self.last

        return run


def bench_designs(buf: torch.Tensor, rng: np.random.Generator) -> list[dict[str, object]]:
    """Compare kernel designs (time and PTX store widths), the zeroer's kernel wrapped meanwhile."""
    import kvlayout.backends.cuda.zeroer as kz

    launches = LaunchRecorder(kz.zero_units_kernel)
    kz.zero_units_kernel = launches
    try:
        return _designs(buf, rng, launches)
    finally:
        kz.zero_units_kernel = launches.kernel


def _designs(
    buf: torch.Tensor, rng: np.random.Generator, launches: LaunchRecorder
) -> list[dict[str, object]]:
    """Compare kernel designs: unit size, store width, warps, programs per SM."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base: dict[str, object] = dict(
        chunk_words=8192,
        sub_words=2048,
        num_warps=4,
        max_programs=sms * 16,
        cache_modifier="",
        eviction_policy="",
    )
    variants = [base]
    for k, vals in (
        ("max_programs", (sms, sms * 2, sms * 4)),
        ("eviction_policy", ("evict_first",)),
    ):
        for v in vals:
            variants.append({**base, k: v})
    for p in (sms, sms * 2, sms * 4):
        for extra in (
            {"num_warps": 8},
            {"num_warps": 16},
            {"sub_words": 4096},
            {"sub_words": 4096, "num_warps": 8},
            {"chunk_words": 16384, "num_warps": 8},
        ):
            variants.append({**base, "max_programs": p, "eviction_policy": "evict_first", **extra})
    rows = []
    for name in ("dsv4-test", "dsv4"):
        table = K.plan(K.preset(name).with_num_blocks(POOL))
        words = buf[: table.total_bytes].view(torch.int32)
        for batch in (256, 4096, 16384):
            ids = make_id_batches(batch, rng)
            nbytes = batch * table.bytes_per_block
            for v in variants:
                z = kc.CudaZeroer(table, words, max_batch=batch, **v)  # type: ignore[arg-type]
                us = cuda_events_us(lambda i, z=z: z.zero(ids[i % ROT]), reps_for(nbytes))
                ptx = launches.last.asm.get("ptx", "") if launches.last is not None else ""
                stores = {
                    w: ptx.count(w)
                    for w in ("st.global.v4", "st.global.v2", "st.global.b32", "st.global.cs", "evict_first")
                }
                rows.append(
                    {
                        "preset": name,
                        "batch": batch,
                        **v,
                        "us": us,
                        "TBps": nbytes / us / 1e6,
                        "ptx_stores": stores,
                    }
                )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--designs", action="store_true", help="also compare kernel design variants")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--methods", default="kvlayout-cuda,naive-torch,kvlayout-pallas,xla-scatter")
    args = ap.parse_args()
    methods = set(args.methods.split(","))
    rng = np.random.default_rng(0)
    nbytes = K.plan(K.preset("dsv4").with_num_blocks(POOL)).total_bytes
    buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    buf.fill_(0x5A)
    out: dict[str, object] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "pool_blocks": POOL,
        "rotation": ROT,
    }
    if args.designs:
        out["designs"] = bench_designs(buf, rng)
    out["results"] = [r for name in ("dsv4-test", "dsv4") for r in bench_geometry(name, buf, rng, methods)]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_zero.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    if args.designs:
        print("design comparison (us, TB/s)")
        for r in out["designs"]:  # type: ignore[union-attr]
            print(
                f"{r['preset']:>9} {r['batch']:>6} chunk={r['chunk_words']:>6} sub={r['sub_words']:>5} "
                f"warps={r['num_warps']} progs={r['max_programs']:>10} cache={r['cache_modifier'] or '-':>3} "
                f"evict={r['eviction_policy'] or '-':>11} "
                f"{r['us']:>9.1f} {r['TBps']:>6.2f} {r['ptx_stores']}"
            )
    print(format_table(out["results"]))  # type: ignore[arg-type]
    return 0


def format_table(results: list[dict[str, object]]) -> str:
    cols = [
        "kvlayout-cuda",
        "kvlayout-cuda-host",
        "kvlayout-cuda-graph",
        "kvlayout-cuda-wall",
        "kvlayout-pallas",
        "xla-scatter",
        "zero_",
        "zero_i32",
        "vllm-style",
        "naive-torch",
        "empty-launch",
        "empty-launch-graph",
    ]
    lines = [
        "| preset | batch | bytes | "
        + " | ".join(f"{c} us" for c in cols)
        + " | cuda TB/s | cuda/best zero_ | cuda/vllm | pallas/cuda (wall) |",
        "|---" * (len(cols) + 7) + "|",
    ]
    for r in results:
        cells = [f"{r[c]:.1f}" if c in r else "-" for c in cols]
        cu = float(r["kvlayout-cuda"])  # type: ignore[arg-type]
        ceiling = min(float(r["zero_"]), float(r["zero_i32"])) / cu  # type: ignore[arg-type]
        vllm = float(r["vllm-style"]) / cu  # type: ignore[arg-type]
        pal = (
            f"{float(r['kvlayout-cuda-wall']) / float(r['kvlayout-pallas']):.2f}"
            if "kvlayout-pallas" in r
            else "-"
        )  # type: ignore[arg-type]
        tbps = float(r["bytes"]) / cu / 1e6  # type: ignore[arg-type]
        lines.append(
            f"| {r['preset']} | {r['batch']} | {r['bytes']} | "
            + " | ".join(cells)
            + f" | {tbps:.2f} | {ceiling:.2f} | {vllm:.2f} | {pal} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
