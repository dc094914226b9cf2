"""The write ceiling of the cuda step benchmark's byte counts (issue 26), and the kernels against it.

For each preset of ``bench/bench_step.py`` (same 4 GiB pool, same table) and each batch of
ids, the bytes kvlayout clears (``ids * bytes_per_block``) are written as ONE contiguous run
by every general-purpose write this GPU has:

- ``torch_zero``: torch's ``zero_()`` of an int32 view;
- ``memset``: ``cudaMemsetAsync`` through ctypes on the CUDA runtime library torch loads;
- ``triton_b{BLOCK}_w{warps}``: a Triton kernel, one program per ``BLOCK`` int32 words,
  16-byte stores over the span (several block sizes and warp counts).

The *ceiling* is the fastest of them. Next to it: kvlayout's cuda kernel (``CudaZeroer``,
device ids, its defaults) and vLLM 0.33's kernel (``bench_step.Vllm033``) on the same table
and the same ids. Every time is the median over CUDA-graph replays (``timing.cuda_graph_us``:
16 calls per graph, rotating among ``ROT`` id batches, or ``ROT`` disjoint regions for the
contiguous writes); the methods are measured in ``--repeats`` interleaved passes and each
method's median over the passes is reported.

``--sweep`` adds kvlayout's kernel under launch options (work-unit size, persistent or one
program per work item, warps, vector width, store policy), each checked byte-equal to the
default kernel's result on a poisoned buffer first; ``sweep.json`` holds every row.

Writes ``ceiling.json`` and ``ceiling.md`` under ``--out``; prints the table last.

    python bench/bench_write_ceiling.py --out DIR [--presets dsv4-test,dsv4]
        [--batches 1,8,64,512,4096,16384] [--repeats 3] [--sweep] [--orders]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvlayout.backends.cuda as kc
import kvlayout.backends.cuda.zeroer as kz
import numpy as np
import torch
import triton
import triton.language as tl
from kvlayout.backends.cuda.testing import device_poison

import kvlayout as K

sys.path.insert(0, str(Path(__file__).parent))
from bench_step import Vllm033  # noqa: E402
from timing import cuda_graph_us  # noqa: E402

ROT = 8
GIB = 2**30
#: issue 26's targets: kernel >= 0.95x the ceiling at >= 4,096 ids, >= 1.0x vLLM 0.33 at every batch
CEILING_TARGET, CEILING_FROM, VLLM_TARGET = 0.95, 4096, 1.0
#: the contiguous Triton write's variants: (int32 words per program, warps)
CONTIG = ((1024, 4), (2048, 8), (4096, 4), (4096, 8), (16384, 8))
#: the same contiguous write, each program first loading one id from the device (as a zeroer must):
#: not a general-purpose write, so not a ceiling candidate; it prices the dependent load
IDLOAD = ((1024, 4), (2048, 8))


#: every row as it is measured, one JSON line each (``--out``/rows.jsonl), so a run cut short keeps them
_ROWS: list[Any] = []


def emit(kind: str, row: dict[str, Any]) -> None:
    """Print ``row`` and append it to the rows file (if open)."""
    line = json.dumps({"kind": kind, **row})
    print(line, flush=True)
    for f in _ROWS:
        f.write(line + "\n")
        f.flush()


@triton.jit
def contig_zero_kernel(ptr, n_words, BLOCK: tl.constexpr):
    """Zero ``n_words`` int32 words from ``ptr`` (16-byte aligned): program p writes block p."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.full([BLOCK], 0, tl.int32), mask=offs < n_words)


@triton.jit
def contig_idload_kernel(ptr, ids_ptr, n_words, num_ids, BLOCK: tl.constexpr):
    """:func:`contig_zero_kernel` whose programs first load an id (never negative) and depend on it."""
    pid = tl.program_id(0).to(tl.int64)
    gid = tl.load(ids_ptr + pid % num_ids).to(tl.int64)
    start = pid * BLOCK + tl.where(gid < 0, 1, 0)
    offs = start + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.full([BLOCK], 0, tl.int32), mask=offs < n_words)


def _cudart() -> Any:
    """The CUDA runtime library torch uses (its own copy if it ships one), or None."""
    names = []
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    names += sorted(glob.glob(os.path.join(torch_lib, "libcudart*.so*")))
    for sp in sys.path:
        names += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib", "libcudart.so*")))
        names += sorted(glob.glob(os.path.join(sp, "nvidia", "cu*", "lib", "libcudart.so*")))
    names += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            fn = lib.cudaMemsetAsync
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
        lib._kvl_path = name
        return lib
    return None


def regions(words: torch.Tensor, nwords: int) -> list[torch.Tensor]:
    """``ROT`` runs of ``nwords`` words spread over the pool (disjoint while they fit), 128-B aligned."""
    total = words.numel()
    step = (total - nwords) // max(ROT - 1, 1)
    return [words[(r * step) // 32 * 32 :][:nwords] for r in range(ROT)]


def contiguous_methods(
    words: torch.Tensor, nbytes: int, cudart: Any, devs: list[torch.Tensor]
) -> dict[str, Callable[[int], None]]:
    """The general-purpose writes of ``nbytes`` contiguous bytes, each ``fn(i)`` on region ``i % ROT``,
    and the ``idload_*`` variants (ids from ``devs``)."""
    nwords = max(1, nbytes // 4)
    regs = regions(words, nwords)
    out: dict[str, Callable[[int], None]] = {"torch_zero": lambda i: regs[i % ROT].zero_()}
    if cudart is not None:

        def memset(i: int) -> None:
            r = regs[i % ROT]
            stream = torch.cuda.current_stream().cuda_stream
            rc = cudart.cudaMemsetAsync(r.data_ptr(), 0, r.numel() * 4, stream)
            if rc != 0:
                raise RuntimeError(f"cudaMemsetAsync returned {rc}")

        out["memset"] = memset
    for block, warps in CONTIG:

        def contig(i: int, block: int = block, warps: int = warps) -> None:
            r = regs[i % ROT]
            contig_zero_kernel[(triton.cdiv(nwords, block),)](r, nwords, BLOCK=block, num_warps=warps)

        out[f"triton_b{block}_w{warps}"] = contig
    for block, warps in IDLOAD:

        def idload(i: int, block: int = block, warps: int = warps) -> None:
            r, d = regs[i % ROT], devs[i % ROT]
            grid = (triton.cdiv(nwords, block),)
            contig_idload_kernel[grid](r, d, nwords, d.numel(), BLOCK=block, num_warps=warps)

        out[f"idload_b{block}_w{warps}"] = idload
    return out


def sweep_configs(batch: int, sms: int) -> list[dict[str, Any]]:
    """kvlayout launch options tried at ``batch`` ids (``CudaZeroer`` keywords). One-shot: one program
    per work item; persistent (``small_batch=False``): ``max_programs`` programs stride over the items.

    Run 2 (bench/results/h200-ceiling/run2-sweep) also tried a persistent grid that loads each
    program's next item during its stores (``prefetch``): slower everywhere, since removed."""
    one_shot = 1 << 30  # max_programs above the items: one program per work item
    cfgs: list[dict[str, Any]] = []
    if batch <= 512:
        for chunk, sub in ((1024, 1024), (1168, 2048), (2048, 2048), (2336, 4096)):
            for warps in (1, 2, 4, 8):
                if chunk < warps * 128:  # fewer words than 32-bit lanes
                    continue
                for evict in ("evict_first", ""):
                    cfgs.append(
                        {
                            "chunk_words": chunk,
                            "sub_words": sub,
                            "num_warps": warps,
                            "max_programs": one_shot,
                            "eviction_policy": evict,
                        }
                    )
    if batch >= 512:
        for chunk, sub, warps in (
            (1024, 1024, 2),
            (1024, 1024, 4),
            (2048, 2048, 4),
            (2048, 2048, 8),
            (2048, 1024, 8),
            (2336, 4096, 8),
            (4096, 4096, 8),
            (4096, 4096, 16),
            (8192, 4096, 8),
        ):
            cfgs.append(
                {"chunk_words": chunk, "sub_words": sub, "num_warps": warps, "max_programs": one_shot}
            )
        for chunk, warps in ((1024, 4), (2048, 8)):
            cfgs.append(
                {"chunk_words": chunk, "num_warps": warps, "max_programs": one_shot, "eviction_policy": ""}
            )
        for chunk in (8192, 9344, 16384):
            for per_sm in (1, 2, 4):
                for warps in (4, 8):
                    cfgs.append(
                        {
                            "chunk_words": chunk,
                            "num_warps": warps,
                            "max_programs": per_sm * sms,
                            "small_batch": False,
                        }
                    )
    return cfgs


def dense_ids(n: int, batch: int) -> list[torch.Tensor]:
    """``ROT`` batches of ``batch`` consecutive block ids, spread over the pool of ``n`` blocks."""
    step = max(0, n - batch) // max(ROT - 1, 1)
    return [torch.arange(r * step, r * step + batch, device="cuda") for r in range(ROT)]


def bench_preset(
    preset: str, pool_bytes: int, batches: list[int], repeats: int, sweep: bool, cudart: Any,
    orders: bool = False,
) -> dict[str, Any]:
    spec = K.preset(preset)
    per_block = K.plan(spec).bytes_per_block
    n = max(20_000, pool_bytes // per_block)
    table = K.plan(spec.with_num_blocks(n))
    buf = device_poison(table.total_bytes, "cuda")
    words = buf.view(torch.int32)
    z = kc.CudaZeroer(table, buf, max_batch=max(batches), graphs=False)
    v = Vllm033(table, words)
    rng = np.random.default_rng(26)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, sweep_rows = [], []
    for batch in batches:
        devs = [torch.from_numpy(rng.choice(n, batch, replace=False)).cuda() for _ in range(ROT)]
        nbytes = batch * table.bytes_per_block
        methods: dict[str, Callable[[int], None]] = dict(contiguous_methods(words, nbytes, cudart, devs))
        methods["kvlayout"] = lambda i: z.zero(devs[i % ROT])
        methods["vllm033"] = lambda i: v.launch(devs[i % ROT])
        if orders:  # the same kernel on the same ids in ascending order, and on consecutive blocks
            srt = [torch.sort(d).values for d in devs]
            dense = dense_ids(n, batch)
            methods["kvlayout_sorted"] = lambda i: z.zero(srt[i % ROT])
            methods["kvlayout_dense"] = lambda i: z.zero(dense[i % ROT])
        passes: dict[str, list[float]] = {k: [] for k in methods}
        errors: dict[str, str] = {}
        for _ in range(repeats):
            for name, fn in methods.items():
                if name in errors:
                    continue
                try:
                    passes[name].append(cuda_graph_us(fn))
                except Exception as e:  # noqa: BLE001 (one failing method must not end the run)
                    errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
                    print("method failed:", name, errors[name], flush=True)
        us = {k: round(statistics.median(t), 2) for k, t in passes.items() if t}
        contiguous = {
            k: t for k, t in us.items() if not k.startswith(("kvlayout", "vllm033")) and "idload" not in k
        }
        best = min(contiguous, key=lambda k: contiguous[k])
        row: dict[str, Any] = {
            "preset": preset,
            "batch": batch,
            "bytes": nbytes,
            "us": us,
            "passes": passes,
            "errors": errors,
            "ceiling_method": best,
            "ceiling_us": us[best],
            "ceiling_gb_s": round(nbytes / us[best] / 1e3, 1),
            "kvlayout_us": us["kvlayout"],
            "vllm_us": us["vllm033"],
            "kvlayout_gb_s": round(nbytes / us["kvlayout"] / 1e3, 1),
            "kvlayout_vs_ceiling": round(us[best] / us["kvlayout"], 3),
            "kvlayout_vs_vllm": round(us["vllm033"] / us["kvlayout"], 3),
            "vllm_vs_ceiling": round(us[best] / us["vllm033"], 3),
            "kvlayout_chunk": z.plan_for_batch(batch).plan.chunk_words,
        }
        for k in ("kvlayout_sorted", "kvlayout_dense"):
            if k in us:
                row[f"{k}_vs_ceiling"] = round(us[best] / us[k], 3)
        rows.append(row)
        emit("row", row)
        if sweep:
            sweep_rows += sweep_batch(table, buf, devs, batch, sms, row)
        del methods
    del buf, words
    torch.cuda.empty_cache()
    return {"num_blocks": n, "bytes_per_block": table.bytes_per_block, "rows": rows, "sweep": sweep_rows}


def sweep_batch(
    table: K.SegmentTable,
    buf: torch.Tensor,
    devs: list[torch.Tensor],
    batch: int,
    sms: int,
    anchor: dict[str, Any],
) -> list[dict[str, Any]]:
    """kvlayout's kernel under each launch option at ``batch`` ids, byte-checked, vLLM re-measured."""
    words = buf.view(torch.int32)
    v = Vllm033(table, words)
    # the bytes the default kernel leaves for devs[0], from a poisoned state, to check each option
    buf.copy_(device_poison(table.total_bytes, buf.device))
    before = buf.clone()
    kc.CudaZeroer(table, buf, graphs=False).zero(devs[0])
    want = buf.clone()
    out = []
    for cfg in sweep_configs(batch, sms):
        row: dict[str, Any] = {"batch": batch, **cfg}
        try:
            zc = kc.CudaZeroer(table, buf, graphs=False, **cfg)
            # launch with this option's own units (the small-batch heuristic would swap them)
            zc._geometry[(None, (batch - 1).bit_length())] = zc._plan_for(None)
            buf.copy_(before)
            zc.zero(devs[0])
            zc.check()
            row["equal"] = bool(torch.equal(buf, want))
            row["kernel_us"] = cuda_graph_us(lambda i, zc=zc: zc.zero(devs[i % ROT]))
            row["vllm_us"] = cuda_graph_us(lambda i: v.launch(devs[i % ROT]))
            row["x_vllm"] = round(row["vllm_us"] / row["kernel_us"], 3)
            row["x_ceiling"] = round(anchor["ceiling_us"] / row["kernel_us"], 3)
            units = zc.plan_for_batch(batch).plan.units_per_block
            row["one_shot"] = cfg.get("small_batch", True)
            row["units_per_block"] = units
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        out.append(row)
        emit("sweep", row)
    buf.copy_(before)
    del before, want
    ok = [r for r in out if r.get("equal")]
    if ok:
        best = min(ok, key=lambda r: r["kernel_us"])
        emit("sweep_best", best)
    return out


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| preset | ids | MB | torch zero_ us | memset us | best Triton contiguous us "
        "| ceiling us (GB/s) | same + id load us | kvlayout us (GB/s) | x ceiling | vLLM 0.33 us "
        "| kvlayout x vLLM | vLLM x ceiling | sorted ids x ceiling | consecutive ids x ceiling "
        "| targets missed |"
    )
    lines = [head, "|" + "---|" * 16]
    for r in rows:
        us = r["us"]
        tri = min((t for k, t in us.items() if k.startswith("triton_")), default=None)
        idl = min((t for k, t in us.items() if k.startswith("idload_")), default=float("nan"))
        miss = []
        if r["batch"] >= CEILING_FROM and r["kvlayout_vs_ceiling"] < CEILING_TARGET:
            miss.append(f"ceiling {r['kvlayout_vs_ceiling']:.2f} < {CEILING_TARGET}")
        if r["kvlayout_vs_vllm"] < VLLM_TARGET:
            miss.append(f"vLLM {r['kvlayout_vs_vllm']:.2f}x < {VLLM_TARGET}x")
        nan = float("nan")
        lines.append(
            f"| {r['preset']} | {r['batch']} | {r['bytes'] / 1e6:.1f} | {us.get('torch_zero', nan):.1f} "
            f"| {us.get('memset', nan):.1f} | {tri if tri is not None else nan:.1f} "
            f"| {r['ceiling_us']:.1f} ({r['ceiling_gb_s']:.0f}) | {idl:.1f} "
            f"| {r['kvlayout_us']:.1f} ({r['kvlayout_gb_s']:.0f}) | {r['kvlayout_vs_ceiling']:.2f} "
            f"| {r['vllm_us']:.1f} | {r['kvlayout_vs_vllm']:.2f} | {r['vllm_vs_ceiling']:.2f} "
            f"| {r.get('kvlayout_sorted_vs_ceiling', nan):.2f} "
            f"| {r.get('kvlayout_dense_vs_ceiling', nan):.2f} "
            f"| {'; '.join(miss) or 'none'} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out")
    ap.add_argument("--presets", default="dsv4-test,dsv4")
    ap.add_argument("--batches", default="1,8,64,512,4096,16384")
    ap.add_argument("--pool-gib", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sweep", action="store_true", help="kvlayout's kernel under launch options too")
    ap.add_argument(
        "--orders", action="store_true",
        help="kvlayout's kernel also on the ids sorted, and on consecutive blocks (where the scatter costs)",
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _ROWS.append(open(out / "rows.jsonl", "w"))  # noqa: SIM115 (open for the whole run)
    cudart = _cudart()
    print("cudart:", getattr(cudart, "_kvl_path", None), flush=True)
    results = {}
    for i, p in enumerate(args.presets.split(",")):
        # kvlayout's kernel sees the same coalesced table for both presets: sweep the first only
        results[p] = bench_preset(
            p, int(args.pool_gib * GIB), batches, args.repeats, args.sweep and i == 0, cudart, args.orders
        )
    rows = [r for p in results.values() for r in p["rows"]]
    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cudart": getattr(cudart, "_kvl_path", None),
        "kvlayout_defaults": {
            "chunk_words": kz.DEFAULT_CHUNK_WORDS,
            "sub_words": kz.DEFAULT_SUB_WORDS,
            "num_warps": kz.DEFAULT_NUM_WARPS,
            "programs_per_sm": kz.DEFAULT_PROGRAMS_PER_SM,
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (out / "ceiling.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    table = format_table(rows)
    (out / "ceiling.md").write_text(
        f"# Write ceiling vs kvlayout's and vLLM 0.33's kernels ({meta['gpu']}, {meta['date']})\n\n"
        f"`python bench/bench_write_ceiling.py{' --sweep' if args.sweep else ''}` (torch {meta['torch']}, "
        f"triton {meta['triton']}); medians over CUDA-graph replays, median of {args.repeats} "
        "interleaved passes; one run.\n\n"
        f"{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
