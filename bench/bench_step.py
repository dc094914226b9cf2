"""Per-step zeroing cost as engines call it (issue 15), against vLLM 0.33's own zeroing path.

One run on one GPU, same buffer and same ids for every method:

- ``vllm033``: vLLM 0.33.0's ``KVBlockZeroer`` path, written from its description: segments
  deduplicated by address keeping the widest span, one Triton launch on a grid
  ``(ids, segments, ceil(max_page_words / BLOCK))`` with ``BLOCK = min(next_pow2(max page
  words), 1024)``, masked int32 stores, and its host path (a fresh pinned tensor from the
  Python list, then a non-blocking copy). Checked byte-equal to kvlayout before timing.
- ``kvlayout``: ``CudaZeroer.zero(list)``: what a vLLM worker would call each step.
- kernel only: both kernels replayed from a CUDA graph with device ids; an int32 ``zero_()``
  of the same number of bytes (the write ceiling).
- ``pallas-in-jit``: the Pallas zeroer's device time inside a user's jitted, donated step
  (``apply`` chained K times in one step; the slope over K), against the cuda kernel.

Per-step numbers are queued calls (``calls`` back to back, one sync, median of rounds); ids
rotate among ``ROT`` random batches of a pool much larger than L2. Prints a table last and
writes JSON under ``--out``.

    python bench/bench_step.py --out DIR [--presets dsv4-test,dsv4] [--batches 1,8,64,512,4096,16384]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvlayout.backends.cuda as kc
import numpy as np
import torch
import triton
import triton.language as tl

import kvlayout as K

sys.path.insert(0, str(Path(__file__).parent))
from timing import queued_us  # noqa: E402

ROT = 8
GIB = 2**30


@triton.jit
def vllm033_kernel(addr_ptr, stride_ptr, page_ptr, ids_ptr, BLOCK: tl.constexpr):
    """vLLM 0.33's zero kernel as described: program (id, segment, chunk); early exit past the page."""
    i = tl.program_id(0)
    seg = tl.program_id(1)
    chunk = tl.program_id(2)
    stride_words = tl.load(stride_ptr + seg)
    page_words = tl.load(page_ptr + seg)
    first = chunk.to(tl.int64) * BLOCK
    if first >= page_words:
        return
    bid = tl.load(ids_ptr + i)
    base = tl.cast(tl.load(addr_ptr + seg), tl.pointer_type(tl.int32))
    cols = first + tl.arange(0, BLOCK).to(tl.int64)
    dst = base + bid.to(tl.int64) * stride_words.to(tl.int64) + cols
    tl.store(dst, tl.zeros([BLOCK], dtype=tl.int32), mask=cols < page_words)


class Vllm033:
    """vLLM 0.33's per-step path over the same table: dedup by address (widest span), 3-D grid."""

    def __init__(self, table: K.SegmentTable, words: torch.Tensor) -> None:
        ptr = words.data_ptr()
        index: dict[int, int] = {}
        addrs: list[int] = []
        strides: list[int] = []
        pages: list[int] = []
        for s in table.segments:  # uncoalesced rows: one per layer view, as vLLM builds them
            a = ptr + s.base
            if a in index:
                pages[index[a]] = max(pages[index[a]], s.span // 4)
                continue
            index[a] = len(addrs)
            addrs.append(a)
            strides.append(s.stride // 4)
            pages.append(s.span // 4)
        dev = words.device
        self.addr = torch.tensor(addrs, dtype=torch.uint64, device=dev)
        self.stride = torch.tensor(strides, dtype=torch.int64, device=dev)
        self.page = torch.tensor(pages, dtype=torch.int64, device=dev)
        biggest = max(pages)
        self.block = min(1 << (biggest - 1).bit_length(), 1024)
        self.chunks = -(-biggest // self.block)
        self.segments = len(addrs)

    def launch(self, dev_ids: torch.Tensor) -> None:
        grid = (dev_ids.numel(), self.segments, self.chunks)
        vllm033_kernel[grid](self.addr, self.stride, self.page, dev_ids, BLOCK=self.block)

    def zero_block_ids(self, block_ids: list[int]) -> None:
        """The scheduler's Python list -> fresh pinned tensor -> non-blocking copy -> launch."""
        if not block_ids:
            return
        host = torch.tensor(block_ids, dtype=torch.int64, device="cpu", pin_memory=True)
        self.launch(host.to(self.addr.device, non_blocking=True))


def graph_us(fn: Callable[[], None], calls: int = 16, replays: int = 15) -> float:
    """Median microseconds per call replayed from one CUDA graph of ``calls`` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def equal_bytes(table: K.SegmentTable, buf: torch.Tensor, ids: list[int], words: torch.Tensor) -> bool:
    """vLLM 0.33's path and kvlayout's zero the same bytes (poisoned buffer, both runs compared)."""
    sub = np.unique(np.asarray(ids))[:64].tolist()
    before = buf.clone()
    z = kc.CudaZeroer(table, buf)
    z.zero(sub)
    z.check()
    torch.cuda.synchronize()
    ours = buf.clone()
    buf.copy_(before)
    Vllm033(table, words).zero_block_ids(sub)
    torch.cuda.synchronize()
    theirs = buf.clone()
    buf.copy_(before)
    return bool(torch.equal(ours, theirs)) and not torch.equal(ours, before)


def pallas_in_jit(table: K.SegmentTable, batch: int, reps: int = 4) -> dict[str, float] | None:
    """Device microseconds per zeroing inside a jitted, donated step: slope of K chained applies."""
    try:
        import jax
        import jax.numpy as jnp
        from kvlayout.backends.pallas import PallasZeroer
    except ImportError:
        return None
    z = PallasZeroer(table)
    rng = np.random.default_rng(1)
    rows, lanes = z.buffer_shape
    buf = jnp.zeros((rows, lanes), jnp.int32)
    ids = jnp.asarray(rng.choice(table.num_blocks, size=(8, batch), replace=batch * 8 > table.num_blocks)
                      .astype(np.int32))

    def make(k: int) -> Any:
        def step(b: jax.Array, all_ids: jax.Array) -> jax.Array:
            for j in range(k):
                b, _ = z.apply(b, all_ids[j % 8])
            return b + 0 * all_ids[0, 0]  # stand-in for the rest of the engine's step

        return jax.jit(step, donate_argnums=0)

    out: dict[str, float] = {}
    for k in (1, 5):
        f = make(k)
        buf = f(buf, ids)
        buf.block_until_ready()
        times = []
        for _ in range(reps * 3):
            t0 = time.perf_counter()
            buf = f(buf, ids)
            buf.block_until_ready()
            times.append((time.perf_counter() - t0) * 1e6)
        out[f"k{k}"] = statistics.median(times)
    out["per_zero_us"] = (out["k5"] - out["k1"]) / 4
    del buf
    return out


def bench(preset: str, pool_bytes: int, batches: list[int], calls: int) -> list[dict[str, Any]]:
    spec = K.preset(preset)
    per_block = K.plan(spec).total_bytes // spec.num_blocks
    n = max(20_000, pool_bytes // per_block)
    table = K.plan(spec.with_num_blocks(n))
    buf = torch.empty(table.total_bytes, dtype=torch.uint8, device="cuda")
    buf.fill_(0xA5)
    words = buf.view(torch.int32)
    rng = np.random.default_rng(0)
    z = kc.CudaZeroer(table, buf, max_batch=max(batches))
    v = Vllm033(table, words)
    out = []
    for batch in batches:
        lists = [rng.choice(n, size=batch, replace=False).tolist() for _ in range(ROT)]
        devs = [torch.tensor(x, dtype=torch.int64, device="cuda") for x in lists]
        same = equal_bytes(table, buf, lists[0], words)
        k = iter(range(10**9))
        ours = queued_us(lambda: z.zero(lists[next(k) % ROT]), torch.cuda.synchronize, calls=calls)
        theirs = queued_us(lambda: v.zero_block_ids(lists[next(k) % ROT]), torch.cuda.synchronize, calls=calls)
        d = devs[0]
        ours_k = graph_us(lambda: z.zero(d))
        theirs_k = graph_us(lambda: v.launch(d))
        nbytes = batch * table.bytes_per_block
        flat = words[: max(1, nbytes // 4)]
        memset = graph_us(lambda: flat.zero_())
        z.check()
        row: dict[str, Any] = {
            "preset": preset, "batch": batch, "num_blocks": n, "bytes": nbytes, "segments_vllm": v.segments,
            "byte_equal": same, "step_us": ours, "vllm_step_us": theirs, "kernel_us": ours_k,
            "vllm_kernel_us": theirs_k, "memset_us": memset,
            "step_speedup": theirs / ours, "kernel_speedup": theirs_k / ours_k, "kernel_vs_memset": memset / ours_k,
        }
        pj = pallas_in_jit(table, batch) if batch in (64, 4096) and os.environ.get("BENCH_PALLAS", "1") == "1" else None
        if pj is not None:
            row["pallas_in_jit_us"] = pj["per_zero_us"]
            row["pallas_vs_cuda_kernel"] = pj["per_zero_us"] / ours_k
        out.append(row)
        print(json.dumps(row), flush=True)
    del buf, words
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="out")
    ap.add_argument("--presets", default="dsv4-test,dsv4")
    ap.add_argument("--batches", default="1,8,64,512,4096,16384")
    ap.add_argument("--pool-gib", type=float, default=4.0)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[dict[str, Any]] = []
    for p in args.presets.split(","):
        rows += bench(p, int(args.pool_gib * GIB), batches, args.calls)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
            "mode": kc.MODE}
    (Path(args.out) / "step.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(format_table(rows))
    return 0 if all(r["byte_equal"] for r in rows) else 1


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ("| preset | ids | step us (kvlayout / vLLM 0.33) | x | kernel us (kvlayout / vLLM) | x | "
            "memset us | kernel vs memset | pallas in jit us | equal |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        pj = f"{r['pallas_in_jit_us']:.1f} ({r['pallas_vs_cuda_kernel']:.2f}x cuda)" if "pallas_in_jit_us" in r else ""
        lines.append(
            f"| {r['preset']} | {r['batch']} | {r['step_us']:.1f} / {r['vllm_step_us']:.1f} | {r['step_speedup']:.2f} | "
            f"{r['kernel_us']:.1f} / {r['vllm_kernel_us']:.1f} | {r['kernel_speedup']:.2f} | {r['memset_us']:.1f} | "
            f"{r['kernel_vs_memset']:.2f} | {pj} | {r['byte_equal']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
