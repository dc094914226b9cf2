"""Per-step zeroing cost as engines call it (issue 15), against vLLM 0.33's own zeroing path.

One run on one GPU, same buffer and same ids for every method:

- ``vllm033``: vLLM 0.33.0's ``KVBlockZeroer`` path, written by us from its description
  (``vllm/v1/worker/utils.py``): segments deduplicated by address keeping the widest span, one
  Triton launch on a grid ``(ids, segments, ceil(max_page_words / BLOCK))`` with ``BLOCK =
  min(next_pow2(max page words), 1024)``, masked int32 stores, early exit past a segment's
  page, no bounds check; its host path is a fresh pinned tensor from the Python list, then a
  non-blocking copy. Checked byte-equal to kvlayout (poisoned buffer) before timing.
- ``kvlayout``: ``CudaZeroer.zero(list)``, what a vLLM worker would call each step: graph
  replay (default) and eager launches (``graphs=False``).
- kernel only: both kernels replayed from one CUDA graph over device ids (rotating among
  ``ROT`` batches); an int32 ``zero_()`` of the same number of bytes (one contiguous run; the
  write ceiling of these bytes and the launch-option sweep are ``bench/bench_write_ceiling.py``).
- ``pallas in jit``: the Pallas zeroer's device time inside a user's jitted, donated step
  (``apply`` chained K times in one step; the slope over K), against the cuda kernel.
- per group (dsv4): bytes and kernel time of one cache group vs all groups.
- ``--plugin`` (issue 27): the modes of kvlayout's vLLM plugin per step against vLLM's own path,
  queued and interleaved as above: ``verify`` is vLLM's path (the ``vllm033`` transcription)
  with the plugin's own id check (:func:`kvlayout.integrations.vllm_plugin.checked_step_ids`:
  one ``aminmax`` over the host tensor vLLM builds anyway) before the copy and launch;
  ``replace`` is the drop-in's ``zero_block_ids`` (kvlayout's ``KVBlockZeroer``, graph replay);
  plus the id check alone on the host. Byte-equal to vLLM's path checked first. Writes
  ``plugin.json`` and ``plugin.md``.
- ``--smoke``: the ``--plugin`` part on the CPU under Triton's interpreter, tiny sizes: a check
  that the script runs (its times mean nothing).

Per-step numbers are queued calls (``calls`` back to back, one sync, median of 15 rounds, the
methods' rounds interleaved so a noisy host slows each alike); ids
rotate among ``ROT`` random batches of a pool much larger than L2. Prints a table last,
writes ``step.json`` and ``step.md`` under ``--out``.

    python bench/bench_step.py --out DIR [--presets dsv4-test,dsv4] [--batches 1,8,64,512,4096,16384]
    python bench/bench_step.py --plugin --out DIR      # the plugin's modes only
    python bench/bench_step.py --smoke --out DIR       # CPU: the plugin part, tiny, interpreted
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch
if "--smoke" in sys.argv:  # vLLM's transcribed kernel is a plain @triton.jit: interpret it on the CPU
    os.environ["TRITON_INTERPRET"] = "1"

import kvlayout.backends.cuda as kc  # noqa: E402
import numpy as np
import torch
import triton
import triton.language as tl
from kvlayout.backends.cuda.testing import device_poison

import kvlayout as K
from kvlayout.integrations.vllm import KVBlockZeroer
from kvlayout.integrations.vllm_plugin import checked_step_ids

sys.path.insert(0, str(Path(__file__).parent))
from bench_host_path import host_path  # noqa: E402
from timing import cuda_graph_us, interleaved_us, queued_us  # noqa: E402

ROT = 8
#: applies chained in the long jitted step of the Pallas measurement (the slope is over 1 .. K_HI)
K_HI = 17
GIB = 2**30
#: issue 15's targets: per-step speed-up over vLLM 0.33 (small / large batches), kernel ratios
STEP_TARGET_SMALL, STEP_TARGET_LARGE, KERNEL_TARGET, MEMSET_TARGET, PALLAS_TARGET = 1.5, 1.1, 1.0, 0.95, 1.1


@triton.jit
def vllm033_kernel(addr_ptr, stride_ptr, page_ptr, ids_ptr, BLOCK: tl.constexpr):
    """vLLM 0.33's zero kernel as described: program (id, segment, chunk); early exit past the page."""
    i = tl.program_id(0)
    seg = tl.program_id(1)
    chunk = tl.program_id(2)
    page_words = tl.load(page_ptr + seg)
    first = chunk.to(tl.int64) * BLOCK
    if first < page_words:
        stride_words = tl.load(stride_ptr + seg)
        bid = tl.load(ids_ptr + i).to(tl.int64)
        base = tl.load(addr_ptr + seg).to(tl.pointer_type(tl.int32))
        cols = first + tl.arange(0, BLOCK).to(tl.int64)
        dst = base + bid * stride_words + cols
        tl.store(dst, tl.full([BLOCK], 0, tl.int32), mask=cols < page_words)


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
                j = index[a]
                pages[j] = max(pages[j], s.span // 4)
                continue
            index[a] = len(addrs)
            addrs.append(a)
            strides.append(s.stride // 4)
            pages.append(s.span // 4)
        dev = words.device
        self.addr = torch.tensor(addrs, dtype=torch.int64, device=dev)
        self.stride = torch.tensor(strides, dtype=torch.int64, device=dev)
        self.page = torch.tensor(pages, dtype=torch.int64, device=dev)
        biggest = max(pages)
        self.block = min(1 << (biggest - 1).bit_length(), 1024)
        self.chunks = -(-biggest // self.block)
        self.segments = len(addrs)
        self.device = dev
        self.pin = dev.type == "cuda"  # vLLM pins where it can (not on a CPU-only smoke run)
        self.num_blocks = table.num_blocks

    def launch(self, dev_ids: torch.Tensor) -> None:
        grid = (dev_ids.numel(), self.segments, self.chunks)
        vllm033_kernel[grid](self.addr, self.stride, self.page, dev_ids, BLOCK=self.block)

    def zero_block_ids(self, block_ids: list[int]) -> None:
        """The scheduler's Python list -> fresh pinned tensor -> non-blocking copy -> launch."""
        if not block_ids:
            return
        host = torch.tensor(block_ids, dtype=torch.int64, device="cpu", pin_memory=self.pin)
        self.launch(host.to(self.device, non_blocking=True))


class VerifyStep:
    """The plugin's ``verify`` step: vLLM's path with the plugin's id check before copy and launch."""

    def __init__(self, v: Vllm033) -> None:
        self.v = v

    def zero_block_ids(self, block_ids: list[int]) -> None:
        if not block_ids:
            return
        host = checked_step_ids(block_ids, self.v.num_blocks, self.v.pin)
        self.v.launch(host.to(self.v.device, non_blocking=True))


def graph_us(fns: list[Callable[[], None]]) -> float:
    """Median microseconds per call replayed from one CUDA graph of 16 calls cycling ``fns``."""
    return cuda_graph_us(lambda i: fns[i % len(fns)]())


def equal_bytes(table: K.SegmentTable, buf: torch.Tensor, ids: list[int], v: Vllm033) -> dict[str, bool]:
    """vLLM 0.33's path and kvlayout's zero the same bytes of a poisoned buffer (both host paths)."""
    before = buf.clone()
    out: dict[str, bool] = {}
    for graphs in (True, False):
        buf.copy_(before)
        z = kc.CudaZeroer(table, buf, max_batch=max(len(ids), 1), graphs=graphs)
        z.zero(ids)
        z.check()
        torch.cuda.synchronize()
        ours = buf.clone()
        buf.copy_(before)
        v.zero_block_ids(ids)
        torch.cuda.synchronize()
        out["graph" if graphs else "eager"] = bool(torch.equal(ours, buf)) and not torch.equal(ours, before)
        del ours
    buf.copy_(before)
    del before
    return out


def pallas_in_jit(
    table: K.SegmentTable, batch: int, reps: int = 15, **options: Any
) -> dict[str, float] | None:
    """Device microseconds per zeroing inside a jitted, donated step: slope of K chained applies."""
    try:
        import jax
        import jax.numpy as jnp
        from kvlayout.backends.pallas import PallasZeroer
    except ImportError as e:
        print(f"pallas skipped: {e}", flush=True)
        return None
    z = PallasZeroer(table, **options)
    rng = np.random.default_rng(1)
    buf = jnp.full(z.buffer_shape, 7, jnp.int32)
    # one array per batch, as an engine holds its step's ids (slicing rows of one array would
    # add a slice kernel per apply to the zeroing's time)
    n = table.num_blocks
    ids = tuple(jnp.asarray(rng.choice(n, size=batch, replace=False).astype(np.int32)) for _ in range(ROT))

    def make(k: int) -> Any:
        def step(b: jax.Array, all_ids: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
            bad = jnp.zeros((), jnp.int32)
            for j in range(k):
                b, e = z.apply(b, all_ids[j % ROT])
                bad = bad + e
            return b, bad  # the rest of an engine's step would go here

        return jax.jit(step, donate_argnums=0)

    out: dict[str, float] = {}
    state = {"buf": buf}
    del buf  # donated: the state holds the live buffer
    for k in (1, K_HI):
        f = make(k)

        def call(f: Any = f) -> None:
            state["buf"], _ = f(state["buf"], ids)

        # one synchronous step per round: the step's wall time, dispatch included
        out[f"k{k}_us"] = queued_us(call, lambda: state["buf"].block_until_ready(), rounds=reps, calls=1)
    out["per_zero_us"] = round((out[f"k{K_HI}_us"] - out["k1_us"]) / (K_HI - 1), 2)
    return out


def per_group(table: K.SegmentTable, buf: torch.Tensor, batch: int) -> list[dict[str, Any]]:
    """Bytes and kernel time of one group's rows vs every group's (GEOMETRY.md section 7)."""
    rng = np.random.default_rng(6)
    devs = [torch.from_numpy(rng.choice(table.num_blocks, batch, replace=False)).cuda() for _ in range(ROT)]
    lists = [d.tolist() for d in devs]
    z = kc.CudaZeroer(table, buf, max_batch=batch)
    rows = []
    picks: list[str | None] = [None]
    for family in ("c4.", "c128.", "swa."):
        picks += [g for g in table.groups if g.startswith(family)][:1]
    for g in picks:
        z.capture(g)
        per_block = int(table.for_group(g).coalesced().spans.sum())  # overlaid groups: bytes once
        k = iter(range(10**9))
        row = {
            "group": g or "all",
            "batch": batch,
            "bytes_per_block": per_block,
            "bytes": per_block * batch,
            "kernel_us": graph_us([lambda d=d, g=g: z.zero(d, g) for d in devs]),
            "step_us": queued_us(lambda g=g: z.zero(lists[next(k) % ROT], g), torch.cuda.synchronize),
        }
        row["gb_per_s"] = round(row["bytes"] / row["kernel_us"] / 1e3, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench(preset: str, pool_bytes: int, batches: list[int], calls: int) -> dict[str, Any]:
    spec = K.preset(preset)
    per_block = K.plan(spec).bytes_per_block
    n = max(20_000, pool_bytes // per_block)
    table = K.plan(spec.with_num_blocks(n))
    buf = device_poison(table.total_bytes, "cuda")
    words = buf.view(torch.int32)
    rng = np.random.default_rng(0)
    z = kc.CudaZeroer(table, buf, max_batch=max(batches))
    ze = kc.CudaZeroer(table, buf, max_batch=max(batches), graphs=False)
    v = Vllm033(table, words)
    out = []
    for batch in batches:
        lists = [rng.choice(n, size=batch, replace=False).tolist() for _ in range(ROT)]
        devs = [torch.tensor(x, dtype=torch.int64, device="cuda") for x in lists]
        same = equal_bytes(table, buf, lists[0], v)
        k = iter(range(10**9))
        steps = interleaved_us(
            {
                "graph": lambda: z.zero(lists[next(k) % ROT]),
                "eager": lambda: ze.zero(lists[next(k) % ROT]),
                "vllm": lambda: v.zero_block_ids(lists[next(k) % ROT]),
            },
            torch.cuda.synchronize,
            calls=calls,
        )
        ours, eager, theirs = steps["graph"], steps["eager"], steps["vllm"]
        ours_k = graph_us([lambda d=d: z.zero(d) for d in devs])
        theirs_k = graph_us([lambda d=d: v.launch(d) for d in devs])
        nbytes = batch * table.bytes_per_block
        flat = words[: max(1, nbytes // 4)]
        memset = graph_us([lambda: flat.zero_()])
        # the same scattered blocks as whole rows through torch's own kernel: what scattering
        # costs a vendor kernel (a contiguous memset is the bound for one run of bytes only)
        strides = {s.stride for s in z.kernel_table.segments}
        rows_us = None
        if len(strides) == 1:
            stride_words = strides.pop() // 4
            rows = words[: n * stride_words].view(n, stride_words)
            rows_us = graph_us([lambda d=d: rows.index_fill_(0, d, 0) for d in devs])
        z.check()
        row: dict[str, Any] = {
            "preset": preset,
            "batch": batch,
            "num_blocks": n,
            "bytes": nbytes,
            "segments_vllm": v.segments,
            "kernel_rows": len(z.kernel_table),
            "byte_equal": same["graph"] and same["eager"],
            "byte_equal_detail": same,
            "step_us": ours,
            "step_eager_us": eager,
            "vllm_step_us": theirs,
            "kernel_us": ours_k,
            "vllm_kernel_us": theirs_k,
            "memset_us": memset,
            "step_speedup": round(theirs / ours, 3),
            "step_eager_speedup": round(theirs / eager, 3),
            "kernel_speedup": round(theirs_k / ours_k, 3),
            "kernel_vs_memset": round(memset / ours_k, 3),
            "rows_index_fill_us": rows_us,
            "kernel_vs_rows": None if rows_us is None else round(rows_us / ours_k, 3),
            "kernel_chunk": z.plan_for_batch(batch).plan.chunk_words,
        }
        if batch in (64, 4096) and os.environ.get("BENCH_PALLAS", "1") == "1":
            try:
                pj = pallas_in_jit(table, batch)
            except Exception as e:  # report, keep the rest of the run
                print(f"pallas_in_jit failed: {type(e).__name__}: {e}", flush=True)
                pj = None
            if pj is not None:
                row["pallas"] = pj
                row["pallas_in_jit_us"] = pj["per_zero_us"]
                row["pallas_vs_cuda_kernel"] = round(pj["per_zero_us"] / ours_k, 3)
        out.append(row)
        print(json.dumps(row), flush=True)
    groups = per_group(table, buf, 4096) if len(table.groups) > 1 else []
    return {"rows": out, "groups": groups, "graph_copy": z.graph_copy}


def plugin_modes(
    preset: str, pool_bytes: int, batches: list[int], calls: int, rounds: int = 15
) -> list[dict[str, Any]]:
    """Per step: vLLM 0.33's path, the plugin's verify (same + id check) and replace (kvlayout)."""
    dev = torch.device(kc.DEVICE_TYPE)
    spec = K.preset(preset)
    n = max(64 if dev.type == "cpu" else 20_000, pool_bytes // K.plan(spec).bytes_per_block)
    table = K.plan(spec.with_num_blocks(n))
    buf = device_poison(table.total_bytes, dev)
    v = Vllm033(table, buf.view(torch.int32))
    verify = VerifyStep(v)
    replace = KVBlockZeroer._from_table(table, buf, max_batch=max(batches))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rng = np.random.default_rng(11)
    rows = []
    for batch in batches:
        lists = [rng.choice(n, size=batch, replace=False).tolist() for _ in range(ROT)]
        before = buf.clone()
        after = {}
        for name, fn in (("vllm", v.zero_block_ids), ("verify", verify.zero_block_ids)):
            buf.copy_(before)
            fn(lists[0])
            sync()
            after[name] = buf.clone()
        buf.copy_(before)
        replace.zero_block_ids(lists[0])
        replace.check()
        sync()
        equal = bool(torch.equal(after["vllm"], after["verify"]) and torch.equal(after["vllm"], buf))
        equal = equal and not torch.equal(before, buf)
        buf.copy_(before)
        del before, after
        try:  # the id vLLM's kernel would write past the buffer with: refused, nothing written
            verify.zero_block_ids([0, n])
            refused = False
        except K.BlockIdError:
            refused = True
        k = iter(range(10**9))
        steps = interleaved_us(
            {
                "vllm": lambda: v.zero_block_ids(lists[next(k) % ROT]),
                "verify": lambda: verify.zero_block_ids(lists[next(k) % ROT]),
                "replace": lambda: replace.zero_block_ids(lists[next(k) % ROT]),
            },
            sync,
            rounds=rounds,
            calls=calls,
        )
        host = interleaved_us(
            {
                "tensor": lambda: torch.tensor(lists[next(k) % ROT], dtype=torch.int64, pin_memory=v.pin),
                "checked": lambda: checked_step_ids(lists[next(k) % ROT], n, v.pin),
            },
            lambda: None,
            rounds=rounds,
            calls=calls,
        )
        row = {
            "preset": preset,
            "batch": batch,
            "num_blocks": n,
            "segments_vllm": v.segments,
            "byte_equal": equal,
            "bad_id_refused": refused,
            "vllm_step_us": steps["vllm"],
            "verify_step_us": steps["verify"],
            "replace_step_us": steps["replace"],
            "verify_vs_vllm": round(steps["verify"] / steps["vllm"], 3),
            "replace_speedup": round(steps["vllm"] / steps["replace"], 3),
            "host_tensor_us": host["tensor"],
            "host_checked_us": host["checked"],
            "id_check_us": round(host["checked"] - host["tensor"], 2),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def format_plugin(rows: list[dict[str, Any]]) -> str:
    head = (
        "| preset | ids | vLLM 0.33 step us | verify step us (x vLLM) | replace step us (vLLM / replace) "
        "| id check alone us (host tensor us) | equal | id num_blocks refused |"
    )
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['batch']} | {r['vllm_step_us']:.1f} "
            f"| {r['verify_step_us']:.1f} ({r['verify_vs_vllm']:.2f}) "
            f"| {r['replace_step_us']:.1f} ({r['replace_speedup']:.2f}x) "
            f"| {r['id_check_us']:.1f} ({r['host_tensor_us']:.1f}) "
            f"| {r['byte_equal']} | {r['bad_id_refused']} |"
        )
    return "\n".join(lines)


def plugin_main(args: argparse.Namespace) -> int:
    smoke = args.smoke
    batches = [1, 8] if smoke else [int(b) for b in args.batches.split(",")]
    presets = ["dsv4-test"] if smoke else args.presets.split(",")
    pool = 1 << 20 if smoke else int(args.pool_gib * GIB)
    rows = [
        r
        for p in presets
        for r in plugin_modes(p, pool, batches, 2 if smoke else args.calls, rounds=3 if smoke else 15)
    ]
    meta = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (smoke)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "mode": kc.MODE,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plugin.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    table = format_plugin(rows)
    cmd = "python bench/bench_step.py --smoke" if smoke else "python bench/bench_step.py --plugin"
    (out / "plugin.md").write_text(
        f"# vLLM plugin modes per step vs vLLM 0.33 ({meta['device']}, {meta['date']})\n\n"
        f"`{cmd}` (torch {meta['torch']}, triton {meta['triton']}, {meta['mode']}); "
        "queued calls, medians of interleaved rounds, one run.\n\n"
        f"{table}\n"
    )
    print(table)
    return 0 if all(r["byte_equal"] and r["bad_id_refused"] for r in rows) else 1


def verdict(r: dict[str, Any]) -> list[str]:
    """Targets missed by this row, each with by how much."""
    miss = []
    want = STEP_TARGET_SMALL if r["batch"] <= 512 else STEP_TARGET_LARGE
    if r["step_speedup"] < want:
        miss.append(f"step {r['step_speedup']:.2f}x < {want}x")
    if r["kernel_speedup"] < KERNEL_TARGET:
        miss.append(f"kernel {r['kernel_speedup']:.2f}x < {KERNEL_TARGET}x vLLM")
    if r["batch"] >= 4096 and r["kernel_vs_memset"] < MEMSET_TARGET:
        miss.append(f"memset ratio {r['kernel_vs_memset']:.2f} < {MEMSET_TARGET}")
    if "pallas_vs_cuda_kernel" in r and r["pallas_vs_cuda_kernel"] > PALLAS_TARGET:
        miss.append(f"pallas {r['pallas_vs_cuda_kernel']:.2f}x cuda > {PALLAS_TARGET}x")
    return miss


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| preset | ids | step us kvlayout (graph / eager) | step us vLLM 0.33 | step x "
        "| kernel us kvlayout / vLLM "
        "| kernel x | memset us | kernel vs memset | rows index_fill us (kernel x) "
        "| pallas in jit us | equal | targets missed |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        pj = (
            f"{r['pallas_in_jit_us']:.1f} ({r['pallas_vs_cuda_kernel']:.2f}x cuda)"
            if "pallas_in_jit_us" in r
            else ""
        )
        miss = "; ".join(verdict(r)) or "none"
        fill = ""
        if r.get("rows_index_fill_us") is not None:
            fill = f"{r['rows_index_fill_us']:.1f} ({r['kernel_vs_rows']:.2f})"
        lines.append(
            f"| {r['preset']} | {r['batch']} | {r['step_us']:.1f} / {r['step_eager_us']:.1f} "
            f"| {r['vllm_step_us']:.1f} | {r['step_speedup']:.2f} "
            f"| {r['kernel_us']:.1f} / {r['vllm_kernel_us']:.1f} | {r['kernel_speedup']:.2f} | "
            f"{r['memset_us']:.1f} | {r['kernel_vs_memset']:.2f} | {fill} | {pj} | {r['byte_equal']} "
            f"| {miss} |"
        )
    return "\n".join(lines)


def format_groups(rows: list[dict[str, Any]]) -> str:
    lines = ["| group | ids | bytes/block | kernel us | GB/s | step us (list) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['group']} | {r['batch']} | {r['bytes_per_block']} | {r['kernel_us']:.1f} | "
            f"{r['gb_per_s']} | {r['step_us']:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="out")
    ap.add_argument("--presets", default="dsv4-test,dsv4")
    ap.add_argument("--batches", default="1,8,64,512,4096,16384")
    ap.add_argument("--pool-gib", type=float, default=4.0)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--plugin", action="store_true", help="only the vLLM plugin's modes (issue 27)")
    ap.add_argument(
        "--smoke", action="store_true", help="the --plugin part on the CPU, tiny (runs, no timing)"
    )
    args = ap.parse_args()
    if args.plugin or args.smoke:
        return plugin_main(args)
    batches = [int(b) for b in args.batches.split(",")]
    host = host_path(batches)
    for h in host:
        print(json.dumps(h), flush=True)
    results = {}
    for p in args.presets.split(","):
        results[p] = bench(p, int(args.pool_gib * GIB), batches, args.calls)
        torch.cuda.empty_cache()
    rows = [r for p in results.values() for r in p["rows"]]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "mode": kc.MODE,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    (Path(args.out) / "step.json").write_text(
        json.dumps({"meta": meta, "host": host, "results": results}, indent=1)
    )
    table = format_table(rows)
    groups = [g for p in results.values() for g in p["groups"]]
    md = (
        f"# Per-step zeroing vs vLLM 0.33 ({meta['gpu']}, {meta['date']})\n\n"
        f"`python bench/bench_step.py` (torch {meta['torch']}, triton {meta['triton']}); "
        "medians, one run.\n\n"
        f"{table}\n\n## Per group (dsv4, kvlayout)\n\n{format_groups(groups)}\n"
    )
    (Path(args.out) / "step.md").write_text(md)
    print(format_groups(groups))
    print(table)
    return 0 if all(r["byte_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
