"""Hardware counters (Nsight Compute) of the step's write: kvlayout's kernel against the ceiling (issue 26).

``bench/bench_write_ceiling.py`` times kvlayout's kernel at 0.90x the best contiguous write of
the same bytes at >= 4,096 ids. This script reads what the hardware did in each kernel: the
DRAM bytes written and read (extra bytes would be partial-sector read-modify-writes or a wrong
span), the L2 write sectors, the DRAM throughput against its peak, the warps resident, the
instructions. Each method runs once per batch under ``ncu --clock-control none`` (the clocks
are left alone, METHOD.md), only the launches between ``cudaProfilerStart``/``Stop`` are
profiled, and only the kernels named in ``KERNELS``; every profiled kernel is matched to its
method by launch order and checked by name.

Methods, on the same pool and table as ``bench_write_ceiling.py``: torch ``zero_()`` and Triton
16-byte stores over the step's bytes as one contiguous run; kvlayout's kernel on random ids,
the same ids sorted, and consecutive blocks; vLLM 0.33's kernel on the random ids.

Writes ``ncu.json``, ``ncu.md``, the raw counters ``ncu_raw.csv`` and the report ``ncu.ncu-rep``
under ``--out``; prints the table last.

    python bench/bench_ncu_write.py --out DIR [--presets dsv4-test] [--batches 4096,16384]
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the counters read for every kernel (Hopper names)
METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_write.sum",
    "dram__bytes_read.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sectors_op_write.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
)
#: the fallback if this ncu lacks one of them
BASIC = ("gpu__time_duration.sum", "dram__bytes_write.sum", "dram__bytes_read.sum")
#: method -> a piece of its kernel's name
KERNELS = {
    "torch_zero": "elementwise",
    "triton_b1024_w4": "contig_zero_kernel",
    "triton_b2048_w8": "contig_zero_kernel",
    "kvlayout": "zero_units_kernel",
    "kvlayout_sorted": "zero_units_kernel",
    "kvlayout_dense": "zero_units_kernel",
    "vllm033": "vllm033_kernel",
}
KERNEL_REGEX = "regex:" + "|".join(sorted(set(KERNELS.values())))


def child(args: argparse.Namespace) -> int:
    """The profiled process: every method once per batch, between profiler start and stop."""
    import bench_write_ceiling as bw
    import kvlayout.backends.cuda as kc
    import numpy as np
    import torch
    from bench_step import Vllm033
    from kvlayout.backends.cuda.testing import device_poison

    import kvlayout as K

    order: list[dict[str, Any]] = []
    for preset in args.presets.split(","):
        spec = K.preset(preset)
        n = max(20_000, int(args.pool_gib * bw.GIB) // K.plan(spec).bytes_per_block)
        table = K.plan(spec.with_num_blocks(n))
        buf = device_poison(table.total_bytes, "cuda")
        words = buf.view(torch.int32)
        batches = [int(b) for b in args.batches.split(",")]
        z = kc.CudaZeroer(table, buf, max_batch=max(batches), graphs=False)
        v = Vllm033(table, words)
        rng = np.random.default_rng(26)
        for batch in batches:
            ids = torch.from_numpy(rng.choice(n, batch, replace=False)).cuda()
            srt = torch.sort(ids).values
            dense = torch.arange(batch, device="cuda")
            nbytes = batch * table.bytes_per_block
            regs = bw.regions(words, nbytes // 4)
            methods = {
                "torch_zero": lambda: regs[0].zero_(),
                "triton_b1024_w4": lambda: bw.contig_zero_kernel[(-(-(nbytes // 4) // 1024),)](
                    regs[0], nbytes // 4, BLOCK=1024, num_warps=4
                ),
                "triton_b2048_w8": lambda: bw.contig_zero_kernel[(-(-(nbytes // 4) // 2048),)](
                    regs[0], nbytes // 4, BLOCK=2048, num_warps=8
                ),
                "kvlayout": lambda: z.zero(ids),
                "kvlayout_sorted": lambda: z.zero(srt),
                "kvlayout_dense": lambda: z.zero(dense),
                "vllm033": lambda: v.launch(ids),
            }
            for fn in methods.values():  # compile and warm, outside the profiled range
                fn()
                fn()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            for name, fn in methods.items():
                fn()
                torch.cuda.synchronize()
                order.append({"preset": preset, "batch": batch, "method": name, "bytes": nbytes})
            torch.cuda.profiler.stop()
        z.check()
        methods.clear()
    Path(args.order).write_text(json.dumps(order))
    return 0


def find_ncu() -> str | None:
    """``ncu`` on the PATH, else the newest Nsight Compute under /opt/nvidia or /usr/local/cuda."""
    found = shutil.which("ncu")
    if found:
        return found
    cands = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu") + glob.glob("/usr/local/cuda*/bin/ncu"))
    return cands[-1] if cands else None


def profile(
    ncu: str, out: Path, args: argparse.Namespace, metrics: tuple[str, ...]
) -> subprocess.CompletedProcess:
    """Run this script's child under ncu, writing ``out/ncu.ncu-rep``."""
    cmd = [
        ncu, "--clock-control", "none", "--profile-from-start", "off", "--kernel-name", KERNEL_REGEX,
        "--metrics", ",".join(metrics), "-f", "-o", str(out / "ncu"),
        sys.executable, __file__, "--child", "--order", str(out / "order.json"),
        "--presets", args.presets, "--batches", args.batches, "--pool-gib", str(args.pool_gib),
    ]
    print(" ".join(cmd), flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)


#: ncu's unit names (SI multiples) -> the base unit the table uses (ns, bytes)
SCALE = {
    "nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9,
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
}


def parse_raw(text: str) -> list[dict[str, str]]:
    """ncu's raw CSV page (a header row, a units row, one row per kernel) as one dict per kernel,
    every value in the table's base units (ncu scales times and bytes to ms, GB, ... as it likes)."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head, units = rows[start], rows[start + 1]
    out = []
    for r in rows[start + 2 :]:
        if len(r) != len(head):
            continue
        k = dict(zip(head, r))
        for name, unit in zip(head, units):
            if unit in SCALE and name in k:
                k[name] = repr(num(k[name]) * SCALE[unit])
        out.append(k)
    return out


def read_report(ncu: str, rep: Path, out: Path) -> list[dict[str, str]]:
    """The raw page of the report (kept as ``ncu_raw.csv``), one dict per profiled kernel."""
    text = subprocess.run(
        [ncu, "--import", str(rep), "--csv", "--page", "raw"], capture_output=True, text=True, check=True
    ).stdout
    (out / "ncu_raw.csv").write_text(text)
    return parse_raw(text)


#: methods that may run as several kernels of the same name in a row (summed)
SPLIT = ("torch_zero",)


def merge(a: dict[str, str], b: dict[str, str]) -> dict[str, str]:
    """Two launches of one method as one: counts and times summed, percentages time-weighted."""
    ta, tb = num(a.get("gpu__time_duration.sum")), num(b.get("gpu__time_duration.sum"))
    out = dict(a)
    for m in METRICS:
        x, y = num(a.get(m)), num(b.get(m))
        if m.endswith("pct_of_peak_sustained_elapsed") or m.endswith("pct_of_peak_sustained_active"):
            out[m] = str((x * ta + y * tb) / (ta + tb))
        elif m in ("launch__block_size", "launch__registers_per_thread"):
            out[m] = str(x)
        else:
            out[m] = str(x + y)
    out["launches"] = str(int(num(a.get("launches", "1"))) + 1)
    return out


def num(s: str | None) -> float:
    """A counter value as ncu prints it (thousands separators), NaN when absent."""
    try:
        return float(str(s).replace(",", ""))
    except (TypeError, ValueError):
        return float("nan")


def summarise(order: list[dict[str, Any]], kernels: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One row per method launch: its counters, and ratios to the contiguous write of the same bytes."""
    rows, extra, pos = [], [], 0
    for o in order:  # in launch order; a kernel of another name in between is reported, not matched
        want = KERNELS[o["method"]]
        while pos < len(kernels) and want not in kernels[pos].get("Kernel Name", ""):
            extra.append(kernels[pos].get("Kernel Name", "")[:80])
            pos += 1
        if pos == len(kernels):
            raise SystemExit(f"no profiled kernel left for {o}; unmatched before it: {extra}")
        k, pos = kernels[pos], pos + 1
        if o["method"] in SPLIT:  # torch splits a write past 2^31 bytes into several launches
            while pos < len(kernels) and want in kernels[pos].get("Kernel Name", ""):
                k, pos = merge(k, kernels[pos]), pos + 1
        name = k.get("Kernel Name", "")
        ns = num(k.get("gpu__time_duration.sum"))
        wr = num(k.get("dram__bytes_write.sum"))
        rows.append(
            {
                **o,
                "kernel": name[:80],
                "launches": int(num(k.get("launches", "1"))),
                "name_ok": KERNELS[o["method"]] in name,
                "us": ns / 1e3,
                "dram_write_bytes": wr,
                "dram_write_x_bytes": wr / o["bytes"],
                "dram_read_bytes": num(k.get("dram__bytes_read.sum")),
                "dram_write_gb_s": wr / ns,
                "dram_pct_peak": num(k.get("dram__throughput.avg.pct_of_peak_sustained_elapsed")),
                "l2_write_sectors_x": num(k.get("lts__t_sectors_op_write.sum")) * 32 / o["bytes"],
                "warps_active_pct": num(k.get("sm__warps_active.avg.pct_of_peak_sustained_active")),
                "inst": num(k.get("smsp__inst_executed.sum")),
                "grid": num(k.get("launch__grid_size")),
                "block": num(k.get("launch__block_size")),
                "regs": num(k.get("launch__registers_per_thread")),
            }
        )
    for r in rows:
        best = min(
            (x["us"] for x in rows if x["preset"] == r["preset"] and x["batch"] == r["batch"]
             and x["method"] in ("torch_zero", "triton_b1024_w4", "triton_b2048_w8")),
            default=float("nan"),
        )
        r["x_contiguous"] = best / r["us"]
    if extra:
        print("profiled kernels matched to no launch:", extra, flush=True)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| preset | ids | method | us (ncu) | x best contiguous | DRAM written / bytes | DRAM read MB "
        "| DRAM GB/s | DRAM % of peak | L2 write sectors x bytes | warps active % | inst (M) | grid x block "
        "| regs |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['batch']} | {r['method']}{'' if r['name_ok'] else ' (name?)'} "
            f"| {r['us']:.1f} | {r['x_contiguous']:.3f} | {r['dram_write_x_bytes']:.3f} "
            f"| {r['dram_read_bytes'] / 1e6:.2f} | {r['dram_write_gb_s']:.0f} | {r['dram_pct_peak']:.1f} "
            f"| {r['l2_write_sectors_x']:.3f} | {r['warps_active_pct']:.1f} | {r['inst'] / 1e6:.2f} "
            f"| {r['grid']:.0f} x {r['block']:.0f} | {r['regs']:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out")
    ap.add_argument("--presets", default="dsv4-test")
    ap.add_argument("--batches", default="4096,16384")
    ap.add_argument("--pool-gib", type=float, default=4.0)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--reparse", action="store_true", help="rebuild the table from --out's ncu_raw.csv")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--order", default="order.json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    if args.child:
        return child(args)
    out = Path(args.out)
    if args.reparse:  # the same counters, read again (no GPU, no ncu)
        old = json.loads((out / "ncu.json").read_text())["meta"] if (out / "ncu.json").exists() else {}
        order = json.loads((out / "order.json").read_text())
        rows = summarise(order, parse_raw((out / "ncu_raw.csv").read_text()))
        meta = {**old, "reparsed": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        return write(out, args, meta, rows)
    ncu = find_ncu()
    if ncu is None:
        print("no ncu (Nsight Compute) here", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    metrics = METRICS
    proc = profile(ncu, out, args, metrics)
    if proc.returncode != 0 and "metric" in (proc.stdout + proc.stderr).lower():
        print(proc.stdout[-2000:], proc.stderr[-2000:], "\nretrying with the basic counters", flush=True)
        metrics = BASIC
        proc = profile(ncu, out, args, metrics)
    print(proc.stdout[-3000:], proc.stderr[-3000:], flush=True)
    if proc.returncode != 0:
        return proc.returncode
    order = json.loads((out / "order.json").read_text())
    rows = summarise(order, read_report(ncu, out / "ncu.ncu-rep", out))
    meta = {"ncu": ncu, "metrics": list(metrics), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    return write(out, args, meta, rows)


def write(out: Path, args: argparse.Namespace, meta: dict[str, Any], rows: list[dict[str, Any]]) -> int:
    """``ncu.json`` and ``ncu.md`` under ``out``; the table printed last."""
    (out / "ncu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    table = format_table(rows)
    (out / "ncu.md").write_text(
        f"# Nsight Compute counters of the step's write ({meta['date']})\n\n"
        f"`python bench/bench_ncu_write.py --presets {args.presets} --batches {args.batches}` "
        "(`ncu --clock-control none`, each kernel once, caches flushed by ncu between kernels).\n\n"
        f"{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
