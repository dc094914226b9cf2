"""Pallas-Triton zeroer options inside a user's jitted, donated step, against the cuda kernel (issue 15).

For each preset (pool sized as ``bench_step.py`` sizes it: ``--pool-gib`` GiB, at least 20,000
blocks) and batch, every variant (a set of :class:`PallasZeroer` options, :data:`VARIANTS`) gets
one jitted, donated step that chains ``K`` applies over ``ROT`` rotating id batches (a tuple of
arrays, as an engine passes its ids; ``NAME@stacked``: rows of one ``[ROT, n]`` array, as
``bench_step.py`` passes them, each apply slicing its row), and is

1. checked: on a poisoned buffer the step must leave exactly the bytes of
   ``kvlayout.backends.cuda.testing.torch_reference_zero`` (strided torch views, no Triton) for
   the timed ids with no bad id, and for ``ROT`` copies of a batch with duplicates and 4
   out-of-range ids (bad count ``4 K``);
2. timed: wall clock per step with a sync after each (``timing.interleaved_us``, all variants'
   rounds interleaved); device time per zeroing ``(t(step) - t(base)) / K``, where ``base`` is
   a jitted, donated step with one tiny kernel (the launch and sync every step pays).

The cuda backend's kernel on the same bytes (``CudaZeroer`` with device ids, CUDA-graph replay,
``timing.cuda_graph_us``, its bytes checked too) gives the ratio; issue 15's target is at most
1.1x. Prints a table last, writes ``pallas_sweep.json`` and ``pallas_sweep.md`` under ``--out``
(default ``$OUT``, else ``bench/results/pallas-sweep``).

    python bench/pallas_gpu_sweep.py --out DIR [--variants a,b] [--batches 64,4096] [--presets dsv4]
    python bench/pallas_gpu_sweep.py --dry-run   # CPU: 64-block pool, interpreted kernels, rough times
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch

import numpy as np  # noqa: E402

import kvlayout as K  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved_us, median_s  # noqa: E402

ROT = 8
GIB = 2**30
MIN_BLOCKS = 20_000  # bench_step.py's pool: max(20,000, pool bytes // bytes per block)
TARGET = 1.1
#: name -> PallasZeroer options; "per_sm" becomes ``programs = per_sm * SMs`` (persistent grid).
#: ``NAME@stacked`` on the command line: that variant with the ids as rows of one array.
VARIANTS: dict[str, dict[str, Any]] = {
    "sorted": {},  # the current default: sort + dedup around the kernel, per-lane masks
    "sorted-vec": {"vector": True},
    "direct": {"dedup": False},
    "direct-vec": {"dedup": False, "vector": True},
    "direct-vec-umaj": {"dedup": False, "vector": True, "unit_major": True},
    "direct-vec-c8": {"dedup": False, "vector": True, "chunk_rows": 8},
    "direct-vec-c32": {"dedup": False, "vector": True, "chunk_rows": 32},
    "direct-vec-c32w8": {"dedup": False, "vector": True, "chunk_rows": 32, "num_warps": 8},
    "direct-vec-ef": {"dedup": False, "vector": True, "evict_first": True},
    "direct-vec-pers4": {"dedup": False, "vector": True, "per_sm": 4},
    "direct-vec-pers8": {"dedup": False, "vector": True, "per_sm": 8},
}
DEFAULT_VARIANTS = ",".join(
    [
        "sorted",
        "sorted-vec",
        "direct-vec",
        "direct-vec@stacked",
        "direct-vec-umaj",
        "direct-vec-c32",
        "direct-vec-ef",
        "direct-vec-pers8",
    ]
)


def options(name: str, sms: int) -> dict[str, Any]:
    kw = dict(VARIANTS[name.partition("@")[0]])
    per_sm = kw.pop("per_sm", None)
    if per_sm is not None:
        kw["programs"] = per_sm * sms
    return kw


class Bench:
    """One preset's pool: the table, a torch poison source, the JAX step factory."""

    def __init__(self, preset: str, pool_bytes: int, dry: bool, k: int) -> None:
        import torch
        from kvlayout.backends.cuda.testing import device_poison

        spec = K.preset(preset)
        per_block = K.plan(spec).bytes_per_block
        n = 64 if dry else max(MIN_BLOCKS, pool_bytes // per_block)
        self.preset, self.dry, self.k = preset, dry, k
        self.table = K.plan(spec.with_num_blocks(n))
        self.num_blocks = n
        self.dev = "cpu" if dry else "cuda"
        self.torch = torch
        from kvlayout.backends.pallas import PallasZeroer

        self.zeroers: dict[str, Any] = {}
        self.master: Any = None
        self.rows = PallasZeroer(self.table, kernel="triton", interpret=True).buffer_shape[0]
        self.poison_u8 = device_poison(self.rows * 512, self.dev)  # kvlayout.poison_pattern's bytes

    def zeroer(self, name: str, sms: int) -> Any:
        """The variant's zeroer, made once per preset (construction verifies the table)."""
        from kvlayout.backends.pallas import PallasZeroer

        if name not in self.zeroers:
            kw = options(name, sms)
            self.zeroers[name] = PallasZeroer(self.table, kernel="triton", interpret=self.dry, **kw)
        return self.zeroers[name]

    def jax_poisoned(self) -> Any:
        """A fresh JAX-owned copy of the poisoned rows (a device copy of one master copy)."""
        import jax
        import jax.numpy as jnp

        if self.master is None:
            src = self.poison_u8.view(self.torch.int32).reshape(self.rows, 128)
            try:
                self.master = jnp.array(jax.dlpack.from_dlpack(src), copy=True)
            except Exception as e:  # no DLPack between the two: one trip through the host
                print(f"dlpack torch -> jax failed ({type(e).__name__}: {e}); copying via the host")
                self.master = jnp.asarray(src.cpu().numpy())
        return jnp.copy(self.master)

    def reference(self, ids: np.ndarray) -> Any:
        """torch int32 [rows, 128]: the poison with the valid ``ids`` zeroed by strided views."""
        from kvlayout.backends.cuda.testing import torch_reference_zero

        words = self.poison_u8.view(self.torch.int32).clone()
        valid = ids[(ids >= 0) & (ids < self.num_blocks)]
        torch_reference_zero(words, self.table, self.torch.from_numpy(valid.astype(np.int64)).to(self.dev))
        return words.reshape(self.rows, 128)

    def equal(self, out: Any, ref: Any) -> bool:
        """Whether a JAX buffer holds the torch reference's bytes (compared on the device)."""
        try:
            view = self.torch.from_dlpack(out)
        except Exception:  # the other way round, then through the host
            import jax
            import jax.numpy as jnp

            try:
                return bool(jnp.array_equal(out, jax.dlpack.from_dlpack(ref)))
            except Exception:
                return bool(np.array_equal(np.asarray(out), ref.cpu().numpy()))
        same = bool(self.torch.equal(view, ref))
        del view
        return same

    def step(self, z: Any, k: int, stacked: bool) -> Any:
        """``jit(step, donate buf)``: ``k`` chained applies over the rotating id batches.

        The batches come as a tuple of arrays, as an engine passes its ids; ``stacked``: as
        rows of one ``[ROT, n]`` array (``bench_step.py``'s way), each apply taking a row.
        """
        import jax
        import jax.numpy as jnp

        def step(b: jax.Array, all_ids: Any) -> tuple[jax.Array, jax.Array]:
            bad = jnp.zeros((), jnp.int32)
            for j in range(k):
                b, e = z.apply(b, all_ids[j % len(all_ids)])
                bad = bad + e
            return b, bad  # the rest of an engine's step would go here

        return jax.jit(step, donate_argnums=0)


def awkward_batch(num_blocks: int, batch: int, seed: int) -> np.ndarray:
    """``batch`` int32 ids: distinct valid ids, duplicates of some, and 4 out-of-range ids."""
    rng = np.random.default_rng(seed)
    dups = min(8, batch // 4)
    base = rng.choice(num_blocks, size=batch - 4 - dups, replace=False)
    bad = [-1, num_blocks, 2**31 - 1, -(2**31)]
    return rng.permutation(np.concatenate([base, base[:dups], bad])).astype(np.int32)


def cuda_kernel_us(bench: Bench, batch: int, id_sets: np.ndarray) -> dict[str, Any]:
    """The cuda backend's kernel on the same bytes: CUDA-graph replay over device ids (native),
    or one rough interpreted call (dry run); its bytes checked against the reference first."""
    import kvlayout.backends.cuda as kc
    from kvlayout.backends.cuda.testing import device_poison

    torch = bench.torch
    buf = device_poison(bench.table.total_bytes, bench.dev)
    words = bench.table.total_bytes // 4
    devs = [torch.from_numpy(x.astype(np.int64)).to(bench.dev) for x in id_sets]
    z = kc.CudaZeroer(bench.table, buf, max_batch=batch)
    z.zero(devs[0])
    z.check()
    ref = bench.reference(id_sets[0]).reshape(-1)[:words]
    equal = bool(torch.equal(buf.view(torch.int32), ref))
    del ref
    if bench.dry:
        us = round(median_s(lambda: z.zero(devs[1]), repeats=1) * 1e6, 2)
    else:
        from timing import cuda_graph_us

        us = cuda_graph_us(lambda i: z.zero(devs[i % ROT]))
    z.check()
    return {"cuda_kernel_us": us, "cuda_equal": equal}


#: optimized-HLO opcodes that launch nothing (or only hold what does: command-buffer calls)
NO_LAUNCH = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "call"}


def launched_ops(hlo: str) -> dict[str, int]:
    """Opcodes of the instructions a compiled module runs itself: its entry computation's and
    those of computations it ``call``s (command buffers), not fusion bodies or reducers.
    Each is roughly one kernel launch."""
    comps: dict[str, list[tuple[str, str]]] = {}
    entry, cur = "", ""
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            m = re.match(r"(ENTRY )?%?([^ ]+) ", line)
            if m:
                cur = m.group(2)
                comps[cur] = []
                entry = cur if m.group(1) else entry
        elif line.startswith("  ") and cur:
            m = re.search(r" = .*? ([a-z][a-z0-9-]*)\(", line)
            if m:
                comps[cur].append((m.group(1), line))
    todo, seen, ops = [entry], set(), {}
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for op, line in comps[name]:
            if op == "call":
                todo += re.findall(r"to_apply=%?([^ ,}]+)", line)
            if op not in NO_LAUNCH:
                ops[op] = ops.get(op, 0) + 1
    return ops


def entry_ops(f: Any, buf: Any, ids: Any) -> dict[str, int]:
    """:func:`launched_ops` of the step compiled for these shapes (one more compile)."""
    import jax

    spec = jax.ShapeDtypeStruct(buf.shape, buf.dtype)
    ids_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), ids)
    return launched_ops(f.lower(spec, ids_spec).compile().as_text())


def run_batch(
    bench: Bench, batch: int, names: list[str], sms: int, rounds: int, count_ops: bool = False
) -> dict[str, Any]:
    """Check then time every variant at one batch size; one compiled step per variant.

    The step chains ``K`` applies over the ``ROT`` id batches. Checks: the timed ids (the
    first ``min(K, ROT)`` batches zeroed, bad = 0), then the same step over ``ROT`` copies of a batch with
    duplicates and 4 out-of-range ids (bad = 4 K). Time per zeroing: ``(t(step) - t(base)) /
    K``, where ``base`` is a jitted, donated step with one tiny kernel and no zeroing.
    """
    import jax
    import jax.numpy as jnp

    k = bench.k
    rng = np.random.default_rng(batch)
    id_sets = np.stack([rng.choice(bench.num_blocks, size=batch, replace=False) for _ in range(ROT)])
    stacked_ids = jnp.asarray(id_sets.astype(np.int32))
    tuple_ids = tuple(jnp.asarray(x.astype(np.int32)) for x in id_sets)
    awkward = awkward_batch(bench.num_blocks, batch, batch + 1)
    awkward_stacked = jnp.asarray(np.tile(awkward, (ROT, 1)))
    awkward_tuple = tuple(jnp.asarray(awkward) for _ in range(ROT))
    ref = bench.reference(id_sets[: min(k, ROT)].reshape(-1))  # the batches the step applies
    ref_awkward = bench.reference(awkward)
    row: dict[str, Any] = {"preset": bench.preset, "batch": batch, "num_blocks": bench.num_blocks}
    row["bytes"] = batch * bench.table.bytes_per_block
    steps: dict[str, tuple[Any, Any]] = {}
    checks: dict[str, Any] = {}
    t0 = time.perf_counter()
    for name in names:
        base_name, _, how = name.partition("@")
        z = bench.zeroer(base_name, sms)
        stacked = how == "stacked"
        f = bench.step(z, k, stacked)
        ids = stacked_ids if stacked else tuple_ids
        try:
            buf, bad = f(bench.jax_poisoned(), ids)  # compiles
            c = {"vector_width": z.vector_width, "equal": bench.equal(buf, ref), "bad": int(bad)}
            del buf
            buf, bad = f(bench.jax_poisoned(), awkward_stacked if stacked else awkward_tuple)
            c["awkward_equal"], c["awkward_bad"] = bench.equal(buf, ref_awkward), int(bad)
            del buf
        except Exception as e:  # one variant failing to compile or run must not lose the others
            checks[name] = {"error": f"{type(e).__name__}: {e}"[:500], "exact": False}
            print(json.dumps({"variant": name, "batch": batch, **checks[name]}), flush=True)
            continue
        c["exact"] = c["equal"] and c["bad"] == 0 and c["awkward_equal"] and c["awkward_bad"] == 4 * k
        if count_ops:  # what one step launches, from the optimized HLO (one more compile)
            try:
                c["entry_ops"] = entry_ops(f, bench.master, ids)
                c["launches_per_apply"] = round(sum(c["entry_ops"].values()) / k, 2)
            except Exception as e:
                c["entry_ops_error"] = f"{type(e).__name__}: {e}"[:300]
        checks[name] = c
        steps[name] = (f, ids)
    del ref, ref_awkward
    row["compile_check_s"] = round(time.perf_counter() - t0, 2)

    def base(b: jax.Array, all_ids: Any) -> tuple[jax.Array, jax.Array]:
        return b, all_ids[0][0] + 1  # one tiny kernel: the launch and sync every step pays

    state = {"buf": bench.jax_poisoned()}

    def call(f: Any, ids: Any) -> Any:
        def go() -> None:
            state["buf"], _ = f(state["buf"], ids)

        return go

    fns = {"base": call(jax.jit(base, donate_argnums=0), tuple_ids)}
    fns.update({name: call(f, ids) for name, (f, ids) in steps.items()})
    times = interleaved_us(fns, lambda: jax.block_until_ready(state["buf"]), rounds=rounds, calls=1)
    del state["buf"]
    try:
        row.update(cuda_kernel_us(bench, batch, id_sets))
    except Exception as e:  # keep the Pallas numbers
        row.update(
            {"cuda_kernel_us": -1.0, "cuda_equal": False, "cuda_error": f"{type(e).__name__}: {e}"[:500]}
        )
    row["base_us"] = times["base"]
    row["variants"] = {}
    for name in names:
        if name not in steps:
            row["variants"][name] = checks[name]
            continue
        per = round((times[name] - times["base"]) / k, 2)
        cuda = row["cuda_kernel_us"]
        row["variants"][name] = {
            **checks[name],
            f"k{k}_us": times[name],
            "per_zero_us": per,
            "vs_cuda": round(per / cuda, 3) if cuda > 0 else None,
        }
    return row


def format_table(rows: list[dict[str, Any]], names: list[str]) -> str:
    head = "| preset | ids | cuda kernel us | " + " | ".join(f"{n} us (x cuda)" for n in names)
    lines = [head + " | best exact |", "|" + "---|" * (4 + len(names))]
    for r in rows:
        cells = []
        for n in names:
            v = r["variants"].get(n)
            if v is None or "error" in v:
                cells.append("" if v is None else "FAILED (see json)")
                continue
            flag = "" if v["exact"] else " NOT EXACT"
            ratio = f"{v['vs_cuda']:.2f}x" if v["vs_cuda"] is not None else "-"
            cells.append(f"{v['per_zero_us']:.1f} ({ratio}){flag}")
        cuda = f"{r['cuda_kernel_us']:.1f}" + ("" if r["cuda_equal"] else " NOT EXACT")
        timed = [(v["per_zero_us"], n) for n, v in r["variants"].items() if v.get("exact")]
        best = ""
        if timed:
            us, n = min(timed)
            ratio = r["variants"][n]["vs_cuda"]
            best = f"{n} {us:.1f}" + (f" ({ratio:.2f}x)" if ratio is not None else "")
        lines.append(f"| {r['preset']} | {r['batch']} | {cuda} | " + " | ".join(cells) + f" | {best} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results/pallas-sweep")
    ap.add_argument("--presets", default="dsv4-test,dsv4")
    ap.add_argument("--batches", default="64,4096,512,16384", help="in this order (most wanted first)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"from: {', '.join(VARIANTS)}")
    ap.add_argument("--pool-gib", type=float, default=4.0)
    ap.add_argument("--k", type=int, default=17, help="applies chained in each step")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--time-limit", type=float, default=190.0, help="seconds: no new batch starts after")
    ap.add_argument("--dry-run", action="store_true", help="CPU: 64-block pool, interpreted kernels")
    args = ap.parse_args()
    names = args.variants.split(",")
    for n in names:
        if n.partition("@")[0] not in VARIANTS or n.partition("@")[2] not in ("", "stacked"):
            ap.error(f"--variants: unknown {n!r}; known: {', '.join(VARIANTS)}")
    batches = [int(b) for b in args.batches.split(",")]
    if min(batches) < 8:
        ap.error(f"--batches: at least 8 ids each (the awkward batch has 4 bad ids), got {args.batches}")
    presets = args.presets.split(",")
    if args.dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"
        batches = [8]
        args.k, args.rounds = 2, 1
    import jax
    import torch

    start = time.perf_counter()
    sms = 2 if args.dry_run else torch.cuda.get_device_properties(0).multi_processor_count
    print(json.dumps({"jax": jax.__version__, "devices": str(jax.devices()), "sms": sms}), flush=True)
    benches = {p: Bench(p, int(args.pool_gib * GIB), args.dry_run, args.k) for p in presets}
    rows: list[dict[str, Any]] = []
    skipped = []
    for batch in batches:  # both presets per batch: the most wanted batches first
        for p, bench in benches.items():
            if time.perf_counter() - start > args.time_limit:
                skipped.append((p, batch))
                continue
            row = run_batch(bench, batch, names, sms, args.rounds, count_ops=batch == batches[0])
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "dry_run": args.dry_run,
        "k": args.k,
        "rounds": args.rounds,
        "variants": {n: options(n, sms) for n in names},
        "skipped_for_time": skipped,
        "seconds": round(time.perf_counter() - start, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pallas_sweep.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    table = format_table(rows, names)
    md = (
        f"# Pallas-Triton options in a jitted step vs the cuda kernel ({meta['device']}, {meta['date']})\n\n"
        "`python bench/pallas_gpu_sweep.py`: device us per zeroing = (step - base) / "
        f"{args.k}, a step being {args.k} chained applies in one jitted, donated step (medians of "
        f"{args.rounds} interleaved rounds, a sync after each step); cuda = CudaZeroer kernel, "
        "CUDA-graph replay; target <= "
        f"{TARGET}x. Variants: `{json.dumps(meta['variants'])}`.\n\n{table}\n"
    )
    if skipped:
        md += f"\nSkipped for time: {skipped}\n"
    (out / "pallas_sweep.md").write_text(md)
    print(f"seconds: {meta['seconds']}; skipped for time: {skipped}")
    print(table)
    exact = all(v["exact"] for r in rows for v in r["variants"].values()) and all(
        r["cuda_equal"] for r in rows
    )
    print("all exact" if exact else "NOT ALL EXACT")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
