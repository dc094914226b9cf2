"""The JAX side's per-step cost on a GPU (H200), issue 26: where a standalone call's time goes.

Geometry: ``--leaves`` leaves of ``(pages, 16, 8, 2, 128)`` bf16 (tpu-inference's attention
shape, 64 KiB per page per leaf; 32 leaves of 8192 pages = 16 GiB), the same random pages
for every method (``ROT`` batches rotated, so the L2 does not flatter small batches).
Per batch size, in interleaved rounds of queued calls with one sync (bench/timing.py):

- ``xla_set``: ``leaf.at[ids].set(0)`` on every leaf, one jitted, donated function, device ids;
- ``call_dev``: ``CacheZeroer(caches, ids)`` standalone, device ids;
- ``call_list``: the same with a Python list of ids;
- ``old_*``: the same two calls with the zeroer of ``--old MODULE`` (a copy of an earlier
  ``kvlayout.backends.pallas``), when given, for the before/after comparison;
- ``flat_*``: ``PallasZeroer(buf, ids)`` standalone on an ``int32[rows, 128]`` buffer of the
  same leaves back to back (device ids, list), with ``flat_old_*`` likewise.

Then device time from the JAX profiler's trace (XPlane events on the GPU's streams), per call:
``CacheZeroer.apply`` inside the user's own jitted, donated step, and the standalone calls
(every kernel and copy they launch, by name: the one-id evidence). The cuda backend's kernel
on a torch buffer of the same bytes (one row per leaf), by CUDA-graph replay. A host-side
profile (cProfile) of the standalone calls, and the jit cache sizes before and after the
timed rounds (0 new compiles expected). Correctness at scale first: every leaf poisoned with
a per-leaf constant, one batch with duplicates and out-of-range ids; zeroed pages must be
exactly zero, all others untouched (bit compare on the device), ``check()`` must count 3.

    python bench/bench_jax_step.py [--out DIR] [--pages 8192] [--leaves 32] [--old kvl_old_pallas]
    python bench/bench_jax_step.py --smoke    # tiny sizes on the CPU (interpreters): checks the script
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import importlib
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cuda_graph_us, interleaved_us  # noqa: E402

import kvlayout as K  # noqa: E402

ROT = 8
PAGE = (16, 8, 2, 128)  # bf16: 64 KiB per page per leaf
BATCHES = (1, 8, 64, 512, 4096)
SMOKE_BATCHES = (1, 8)
PROFILE_BATCHES = (1, 8, 64)
PROFILE_STEPS = 20


def flat_table(leaves: int, pages: int, page_bytes: int) -> K.SegmentTable:
    """The leaves back to back in one buffer: one row per leaf (base, stride = span = page)."""
    rows = [K.Segment(i * page_bytes * pages, page_bytes, page_bytes, "", f"leaf{i}") for i in range(leaves)]
    return K.SegmentTable(leaves * page_bytes * pages, pages, tuple(rows))


# ---- the JAX profiler: device events per call --------------------------------------------------
def device_events(fn: Callable[[], Any], sync: Callable[[], Any], steps: int) -> dict[str, Any]:
    """:func:`trace_events`, or the error it raised (a profiler problem must not end the run)."""
    try:
        return trace_events(fn, sync, steps)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def trace_events(fn: Callable[[], Any], sync: Callable[[], Any], steps: int) -> dict[str, Any]:
    """Run ``fn`` ``steps`` times inside a JAX profiler trace; the GPU's events per call.

    Returns ``{"per_call_us": sum of device event time / steps, "span_us": first start to last
    end / steps, "events": {name: [count per call, us per call]}}`` from the XPlane of the
    trace (planes ``/device:GPU:*``, every line whose events are kernels or copies).
    """
    import jax

    fn()
    sync()
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(steps):
                fn()
            sync()
        files = sorted(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True))
        if not files:
            return {"error": "no xplane.pb written"}
        pd = jax.profiler.ProfileData.from_file(files[-1])
    by_name: dict[str, list[float]] = {}
    starts, ends, total, lines = [], [], 0.0, set()
    for plane in pd.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            lines.add(f"{plane.name}/{line.name}")
            if "stream" not in line.name.lower():  # kernels and copies sit on the stream lines
                continue
            for ev in line.events:
                dur = ev.duration_ns / 1e3
                rec = by_name.setdefault(ev.name[:80], [0, 0.0])
                rec[0] += 1
                rec[1] += dur
                total += dur
                starts.append(ev.start_ns)
                ends.append(ev.start_ns + ev.duration_ns)
    events = {
        k: [round(c / steps, 2), round(t / steps, 2)]
        for k, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])
    }
    span = (max(ends) - min(starts)) / 1e3 / steps if starts else None
    return {
        "per_call_us": round(total / steps, 2),
        "span_us": None if span is None else round(span, 2),
        "events": events,
        "lines": sorted(lines),
    }


def host_profile(fn: Callable[[], Any], sync: Callable[[], Any], calls: int = 200) -> dict[str, Any]:
    """cProfile of ``calls`` calls (queued, one sync): host microseconds per call and the top lines."""
    fn()
    sync()
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    host = (time.perf_counter() - t) / calls
    sync()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    top = [ln.strip() for ln in s.getvalue().splitlines() if ln.strip()[:1].isdigit()][:12]
    return {"host_us_profiled": round(host * 1e6, 1), "top_tottime": top}


def host_us(fn: Callable[[], Any], sync: Callable[[], Any], calls: int = 50) -> float:
    """Median host microseconds of the call itself (until it returns; queued, sync every 10)."""
    fn()
    sync()
    ts = []
    for k in range(calls):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
        if k % 10 == 9:
            sync()
    sync()
    return round(statistics.median(ts) * 1e6, 2)


def jit_cache(*objs: Any) -> int:
    """Compiled variants held by the jitted functions of these zeroers (their retrace count)."""
    n = 0
    for o in objs:
        for f in vars(o).values():
            if hasattr(f, "_cache_size"):
                n += f._cache_size()
    return n


# ---- correctness at scale -----------------------------------------------------------------------
def check_native(kp: Any, leaves: int, pages: int, rng: np.random.Generator, **kw: Any) -> dict[str, Any]:
    """Poisoned leaves (a per-leaf constant), a batch with duplicates and 3 bad ids; exact on device."""
    import jax
    import jax.numpy as jnp

    shape = (pages, *PAGE)
    fills = [np.uint16(0x3F80 + 7 * i) for i in range(leaves)]  # bf16 bit patterns, none zero
    caches = [jax.lax.bitcast_convert_type(jnp.full(shape, f, jnp.uint16), jnp.bfloat16) for f in fills]
    z = kp.CacheZeroer(caches, **kw)
    n = min(pages, 64)
    ids = rng.choice(pages, n, replace=False).astype(np.int32)
    batch = np.concatenate([ids, ids[: n // 4], [pages, -1, 2**31 - 1]]).astype(np.int32)
    rng.shuffle(batch)
    out = z(caches, jnp.asarray(batch))
    mask = np.zeros(pages, bool)
    mask[ids] = True
    m = jnp.asarray(mask).reshape(pages, *([1] * len(PAGE)))
    exact = []
    for leaf, f in zip(out, fills):
        u = jax.lax.bitcast_convert_type(leaf, jnp.uint16)
        exact.append(bool(jnp.all(jnp.where(m, u == 0, u == f))))
    try:
        z.check()
        bad = 0
    except K.BlockIdError as e:
        bad = int(e.value)
    # a Python list through the host path, on the same leaves
    more = rng.choice(np.flatnonzero(~mask), min(5, int((~mask).sum())), replace=False)
    out = z(out, [int(i) for i in more])
    mask[more] = True
    m = jnp.asarray(mask).reshape(pages, *([1] * len(PAGE)))
    exact_list = all(
        bool(
            jnp.all(
                jnp.where(
                    m,
                    jax.lax.bitcast_convert_type(x, jnp.uint16) == 0,
                    jax.lax.bitcast_convert_type(x, jnp.uint16) == f,
                )
            )
        )
        for x, f in zip(out, fills)
    )
    z.check()
    del out, caches
    res = {"leaves_exact": all(exact), "list_exact": exact_list, "bad_ids_counted": bad, "mode": z.mode}
    print("correctness:", json.dumps(res), flush=True)
    return res


# ---- the host cost of getting ids to the device, and of a 32-leaf dispatch ----------------------
def h2d_micro(st: dict[str, Any], sync: Callable[[], Any]) -> dict[str, float]:
    """Host microseconds per call (until it returns) of the pieces a standalone call is made of."""
    import jax

    dev = jax.devices()[0]
    kinds = {m.kind for m in dev.addressable_memories()}
    pin = None
    if "pinned_host" in kinds:
        pin = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
    h8 = np.arange(8, dtype=np.int32)
    d8 = jax.device_put(h8)
    plus = jax.jit(lambda x: x + 1)
    plus_dev = jax.jit(lambda x: jax.device_put(x, jax.memory.Space.Device) + 1)
    ident = jax.jit(lambda c: c, donate_argnums=0)
    touch = jax.jit(lambda c, i: i + 1)
    keep: dict[str, Any] = {}

    def put(x: Any) -> Callable[[], None]:
        def run() -> None:
            keep["x"] = x()

        return run

    def donate() -> None:
        st["c"] = ident(st["c"])

    both = lambda: (sync(), jax.block_until_ready(keep.get("x")))  # noqa: E731
    pieces: dict[str, Callable[[], None]] = {
        "device_put_numpy": put(lambda: jax.device_put(h8)),
        "jit_numpy_arg": put(lambda: plus(h8)),
        "jit_device_arg": put(lambda: plus(d8)),
        "dispatch_32_leaves_donated_identity": donate,
        "dispatch_32_leaves_not_donated": put(lambda: touch(st["c"], d8)),
    }
    if pin is not None:
        p8 = jax.device_put(h8, pin)
        pieces["device_put_pinned_host"] = put(lambda: jax.device_put(h8, pin))
        pieces["jit_pinned_arg_to_device"] = put(lambda: plus_dev(p8))
        pieces["pinned_put_plus_jit"] = put(lambda: plus_dev(jax.device_put(h8, pin)))
        try:  # JAX's own C++ transfer without device_put's Python layers (private API: evidence only)
            from jax._src import core
            from jax._src.interpreters import pxla

            aval = core.ShapedArray((8,), np.dtype(np.int32))
            pieces["pinned_put_cpp"] = put(lambda: pxla.batched_device_put(aval, pin, [h8], [dev]))
            dsh = jax.sharding.SingleDeviceSharding(dev)
            pieces["device_put_cpp"] = put(lambda: pxla.batched_device_put(aval, dsh, [h8], [dev]))
        except Exception as e:  # noqa: BLE001
            print("no private batched_device_put:", e, flush=True)
    out: dict[str, Any] = {"pinned_host": pin is not None}
    for name, fn in pieces.items():  # one failing piece must not end the run
        try:
            out[name] = host_us(fn, both)
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
        print("host us:", name, out[name], flush=True)
    return out


def host_trace(fn: Callable[[], Any], sync: Callable[[], Any], steps: int) -> dict[str, Any]:
    """The host threads' events of ``steps`` calls in a JAX profiler trace: ``{name: [count, us]}``
    per call, the 20 longest (events nest, so the times overlap; they say where the host waits)."""
    import jax

    try:
        fn()
        sync()
        opts = jax.profiler.ProfileOptions()
        opts.python_tracer_level = 0  # C++ events only: Python frames would add their own cost
        opts.host_tracer_level = 3
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d, profiler_options=opts):
                for _ in range(steps):
                    fn()
                sync()
            files = sorted(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True))
            if not files:
                return {"error": "no xplane.pb written"}
            pd = jax.profiler.ProfileData.from_file(files[-1])
        by_name: dict[str, list[float]] = {}
        for plane in pd.planes:
            if plane.name.startswith("/device:"):
                continue
            for line in plane.lines:
                for ev in line.events:
                    rec = by_name.setdefault(f"{line.name[:24]}: {ev.name[:70]}", [0, 0.0])
                    rec[0] += 1
                    rec[1] += ev.duration_ns / 1e3
        top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:20]
        return {k: [round(c / steps, 2), round(t / steps, 1)] for k, (c, t) in top}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def pending_inputs(st: dict[str, Any], sync: Callable[[], Any]) -> dict[str, Any]:
    """Host us of one donated 32-leaf call whose small input is a NumPy array, a ready device array, a
    freshly transferred one, or a freshly transferred one waited for: does the pending transfer cost?"""
    import jax

    h8 = np.arange(8, dtype=np.int32)
    d8 = jax.device_put(h8)
    step = jax.jit(lambda c, i: (c, i + 1), donate_argnums=0)
    keep: dict[str, Any] = {}

    def call(ids: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            st["c"], keep["i"] = step(st["c"], ids())

        return run

    def fresh_wait() -> Any:
        x = jax.device_put(h8)
        x.block_until_ready()
        return x

    pieces = {
        "numpy": call(lambda: h8),
        "device_ready": call(lambda: d8),
        "device_put_fresh": call(lambda: jax.device_put(h8)),
        "device_put_fresh_waited": call(fresh_wait),
        "device_put_alone_waited": fresh_wait,
    }
    out: dict[str, Any] = {}
    for name, fn in pieces.items():
        try:
            out[name] = host_us(fn, sync)
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
        print("pending inputs us:", name, out[name], flush=True)
    return out


# ---- the list path: which host-to-device route blocks the host ----------------------------------
def transfer_wait(
    busy: Callable[[], None], sync: Callable[[], Any], pieces: dict[str, Callable[[], Any]], reps: int = 9
) -> dict[str, Any]:
    """Host microseconds of each piece with the device idle and right after ``busy()`` queued ~2 ms.

    A piece whose host time grows by the queued work waits for the device queue to drain.
    """
    out: dict[str, Any] = {}
    for name, fn in pieces.items():
        try:
            fn()
            sync()
            idle, after = [], []
            for _ in range(reps):
                sync()
                t = time.perf_counter()
                r = fn()
                idle.append(time.perf_counter() - t)
                jax_block(r)
                busy()
                t = time.perf_counter()
                r = fn()
                after.append(time.perf_counter() - t)
                jax_block(r)
                sync()
            out[name] = {
                "idle_us": round(statistics.median(idle) * 1e6, 1),
                "busy_us": round(statistics.median(after) * 1e6, 1),
            }
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {str(e)[:200]}"
        print("transfer wait:", name, out[name], flush=True)
    return out


def jax_block(x: Any) -> None:
    import jax

    if x is not None:
        jax.block_until_ready(x)


def list_paths(args: argparse.Namespace) -> dict[str, Any]:
    """The standalone call with host ids through each host-to-device route, against device ids.

    Routes (each ends in the same ``CacheZeroer`` call on device ids, except ``list``):
    ``list`` (the library's host path), ``put_sharding`` (validate, unique, bucket, then
    ``jax.device_put`` with a cached sharding), ``put_cpp`` (the same through JAX's C++ batched
    transfer, private API), ``pinned_in_jit`` (the C++ transfer to pinned host memory, moved to the
    device inside a jitted ``apply``), and ``host_only`` (validation, unique and bucketing alone, no call).
    Then :func:`transfer_wait` on the transfer pieces.
    """
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.pallas as kp
    from jax._src import core
    from jax._src.interpreters import pxla
    from kvlayout.backends.pallas.zeroer import bucket_ids

    from kvlayout.reference import normalize_block_ids

    pages, leaves = args.pages, args.leaves
    rng = np.random.default_rng(27)
    shape = (pages, *PAGE)
    st: dict[str, Any] = {"c": [jnp.full(shape, 1.5, jnp.bfloat16) for _ in range(leaves)]}
    z = kp.CacheZeroer(st["c"])
    sync = lambda: jax.block_until_ready(st["c"])  # noqa: E731
    dev = jax.devices()[0]
    sh = jax.sharding.SingleDeviceSharding(dev)
    kinds = {m.kind for m in dev.addressable_memories()}
    pin = (
        jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host") if "pinned_host" in kinds else None
    )

    def host_ids(lst: list[int]) -> np.ndarray:
        return bucket_ids(np.unique(normalize_block_ids(lst, pages)))

    avals: dict[int, Any] = {}

    def put_cpp(b: np.ndarray, target: Any = sh) -> Any:
        aval = avals.setdefault(b.size, core.ShapedArray(b.shape, b.dtype))
        return pxla.batched_device_put(aval, target, [b], [dev])

    res: dict[str, Any] = {"jax": jax.__version__, "leaves": leaves, "pages": pages, "rows": []}
    big = [jax.device_put(rng.choice(pages, min(pages, 4096), replace=False).astype(np.int32))]

    def busy() -> None:
        st["c"] = z(st["c"], big[0])

    in_jit_to_device = jax.jit(
        lambda c, i: z.apply(c, jax.device_put(i, jax.memory.Space.Device))[0], donate_argnums=0
    )

    h8 = host_ids(list(range(8)))
    pieces: dict[str, Callable[[], Any]] = {
        "host_only_8": lambda: (host_ids(list(range(8))), None)[1],
        "device_put_numpy": lambda: jax.device_put(h8),
        "device_put_sharding": lambda: jax.device_put(h8, sh),
        "device_put_no_alias": lambda: jax.device_put(h8, sh, may_alias=False),
        "put_cpp": lambda: put_cpp(h8),
        "jnp_asarray": lambda: jnp.asarray(h8),
    }
    if pin is not None:
        pieces["put_cpp_pinned_host"] = lambda: put_cpp(h8, pin)
    res["transfer_wait"] = transfer_wait(busy, sync, pieces)
    res["pending_inputs"] = pending_inputs(st, sync)
    rounds, calls = (2, 2) if args.smoke else (11, 20)
    for n in [b for b in (1, 8, 64) if b <= pages]:
        host = [rng.choice(pages, n, replace=False).astype(np.int32) for _ in range(ROT)]
        devs = [jax.device_put(h) for h in host]
        lists = [[int(i) for i in h] for h in host]
        it = {"k": 0}

        def nxt() -> int:
            it["k"] = (it["k"] + 1) % ROT
            return it["k"]

        def via(route: Callable[[list[int]], Any]) -> Callable[[], None]:
            def run() -> None:
                st["c"] = z(st["c"], route(lists[nxt()]))

            return run

        fns = {
            "dev": lambda: st.__setitem__("c", z(st["c"], devs[nxt()])),
            "list": via(lambda lst: lst),
            "put_sharding": via(lambda lst: jax.device_put(host_ids(lst), sh)),
            "put_cpp": via(lambda lst: put_cpp(host_ids(lst))),
            "put_wait": via(lambda lst: jax.device_put(host_ids(lst), sh).block_until_ready()),
            "put_cpp_wait": via(lambda lst: put_cpp(host_ids(lst)).block_until_ready()),
        }
        if pin is not None:  # the ids to pinned host memory, moved to the device inside the step
            def pinned_step(lst: list[int]) -> None:
                st["c"] = in_jit_to_device(st["c"], put_cpp(host_ids(lst), pin))

            try:  # evidence only: a JAX that cannot lower the move must not end the run
                pinned_step(lists[0])
                fns["pinned_in_jit"] = lambda: pinned_step(lists[nxt()])
            except Exception as e:  # noqa: BLE001
                res.setdefault("errors", {})[f"pinned_in_jit_{n}"] = f"{type(e).__name__}: {str(e)[:200]}"
                print("route pinned_in_jit failed:", res["errors"][f"pinned_in_jit_{n}"], flush=True)
        for f in fns.values():  # compile every variant first (the running count's first value too)
            for _ in range(3):
                f()
            sync()
        interleaved_us(fns, sync, 2, 2)  # every route after every other one, untimed (see bench())
        before = jit_cache(z)
        r: dict[str, Any] = {"ids": n}
        for k, t in interleaved_us(fns, sync, rounds, calls).items():
            r[f"{k}_us"] = t
        r["host_only_us"] = host_us(lambda: host_ids(lists[nxt()]), lambda: None)
        for k in ("dev", "list", "put_cpp"):
            r[f"host_{k}_us"] = host_us(fns[k], sync)
        r["new_compiles_in_timed_rounds"] = jit_cache(z) - before
        for k in ("list", "put_sharding", "put_cpp", "put_wait", "put_cpp_wait", "pinned_in_jit"):
            if f"{k}_us" in r:
                r[f"{k}_minus_dev_us"] = round(r[f"{k}_us"] - r["dev_us"], 1)
        if n == 8:
            r["host_profile_list"] = host_profile(fns["list"], sync, 20 if args.smoke else 200)
            for k in ("dev", "list", "put_wait"):
                r[f"host_trace_{k}"] = host_trace(fns[k], sync, 5 if args.smoke else 50)
                print(f"host trace {k}:", json.dumps(r[f"host_trace_{k}"]), flush=True)
        res["rows"].append(r)
        skip = ("host_profile", "host_trace")
        print("list paths:", json.dumps({k: v for k, v in r.items() if not k.startswith(skip)}), flush=True)
    z.check()
    return res


# ---- timing -------------------------------------------------------------------------------------
def bench(args: argparse.Namespace) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.pallas as kp

    old = importlib.import_module(args.old) if args.old else None
    smoke = args.smoke
    pages, leaves = args.pages, args.leaves
    batches = [b for b in (SMOKE_BATCHES if smoke else BATCHES) if b <= pages]
    rng = np.random.default_rng(26)
    res: dict[str, Any] = {
        "jax": jax.__version__,
        "device": str(jax.devices()[0].device_kind),
        "leaves": leaves,
        "pages": pages,
        "page_shape": list(PAGE),
        "dtype": "bfloat16",
        "old": args.old,
        "smoke": smoke,
    }
    res["correctness"] = check_native(kp, leaves, pages, rng)
    if old is not None:
        res["correctness_old"] = check_native(old, leaves, pages, rng)

    shape = (pages, *PAGE)
    page_bytes = int(np.prod(PAGE)) * 2
    st: dict[str, Any] = {"c": [jnp.full(shape, 1.5, jnp.bfloat16) for _ in range(leaves)]}
    z = kp.CacheZeroer(st["c"])
    zo = old.CacheZeroer(st["c"]) if old is not None else None
    xla_set = jax.jit(lambda c, i: [x.at[i].set(0) for x in c], donate_argnums=0)
    in_jit = jax.jit(lambda c, i: z.apply(c, i)[0], donate_argnums=0)
    in_jit_old = jax.jit(lambda c, i: zo.apply(c, i)[0], donate_argnums=0) if zo is not None else None
    sync = lambda: jax.block_until_ready(st["c"])  # noqa: E731

    # the flat zeroer on an int32 [rows, 128] buffer holding the same leaves back to back
    table = flat_table(leaves, pages, page_bytes)
    fz = kp.PallasZeroer(table)
    fzo = old.PallasZeroer(table) if old is not None else None
    st["f"] = jnp.full(fz.buffer_shape, 3, jnp.int32)
    fsync = lambda: jax.block_until_ready(st["f"])  # noqa: E731

    cuda = None
    try:
        import kvlayout.backends.cuda as kc
        import torch

        if torch.cuda.is_available():
            tbuf = torch.full((table.total_bytes // 4,), 3, dtype=torch.int32, device="cuda")
            cuda = (torch, kc.CudaZeroer(table, tbuf.view(torch.uint8), max_batch=max(batches)))
    except ImportError as e:
        print(f"cuda backend skipped: {e}", flush=True)

    res["host_pieces_us"] = h2d_micro(st, sync)
    rows = []
    for n in batches:
        host = [rng.choice(pages, n, replace=False).astype(np.int32) for _ in range(ROT)]
        dev = [jax.device_put(h) for h in host]
        lists = [[int(i) for i in h] for h in host]
        it = {"k": 0}

        def nxt() -> int:
            it["k"] = (it["k"] + 1) % ROT
            return it["k"]

        def set_c(f: Callable[..., Any], src: list[Any]) -> Callable[[], None]:
            def run() -> None:
                st["c"] = f(st["c"], src[nxt()])

            return run

        def set_f(f: Callable[..., Any], src: list[Any]) -> Callable[[], None]:
            def run() -> None:
                st["f"] = f(st["f"], src[nxt()])

            return run

        fns = {
            "xla_set": set_c(xla_set, dev),
            "call_dev": set_c(z, dev),
            "call_list": set_c(z, lists),
            "in_jit": set_c(in_jit, dev),
        }
        if zo is not None and in_jit_old is not None:
            fns.update(old_call_dev=set_c(zo, dev), old_call_list=set_c(zo, lists))
        ffns = {"flat_dev": set_f(fz, dev), "flat_list": set_f(fz, lists)}
        if fzo is not None:
            ffns.update(flat_old_dev=set_f(fzo, dev), flat_old_list=set_f(fzo, lists))
        for group in (fns, ffns):  # compile everything first; a method that fails is dropped
            for k, f in list(group.items()):
                try:
                    f()
                    sync()
                    fsync()
                except Exception as e:  # noqa: BLE001
                    res.setdefault("errors", {})[f"{k}@{n}"] = f"{type(e).__name__}: {str(e)[:300]}"
                    print("dropped", k, res["errors"][f"{k}@{n}"], flush=True)
                    del group[k]
        # one untimed interleaved pass: each method after each other one, so every argument
        # signature the timed rounds can meet (committed or not, count or not) is compiled now
        interleaved_us(fns, sync, 2, 2)
        interleaved_us(ffns, fsync, 2, 2)
        before = jit_cache(z, fz, *([zo, fzo] if zo is not None else []))
        rounds, calls = (2, 2) if smoke else (11, 20)
        r: dict[str, Any] = {"ids": n, "bytes": n * leaves * page_bytes}
        for k, t in interleaved_us(fns, sync, rounds, calls).items():
            r[f"{k}_us"] = t
        for k, t in interleaved_us(ffns, fsync, rounds, calls).items():
            r[f"{k}_us"] = t
        after = jit_cache(z, fz, *([zo, fzo] if zo is not None else []))
        r["new_compiles_in_timed_rounds"] = after - before
        # host time of the call itself (until it returns)
        r["host_call_dev_us"] = host_us(fns["call_dev"], sync)
        r["host_call_list_us"] = host_us(fns["call_list"], sync)
        r["host_xla_set_us"] = host_us(fns["xla_set"], sync)
        for k in ("old_call_dev", "old_call_list"):
            if k in fns:
                r[f"host_{k}_us"] = host_us(fns[k], sync)
        if cuda is not None:
            torch, cz = cuda
            tids = [torch.from_numpy(h.astype(np.int64)).cuda() for h in host]
            r["cuda_graph_us"] = cuda_graph_us(lambda i: cz.zero(tids[i % ROT]))
            cz.check()
        if n in PROFILE_BATCHES or smoke:
            prof: dict[str, Any] = {}
            steps = 2 if smoke else PROFILE_STEPS
            for k in ("in_jit", "call_dev", "call_list", "xla_set", "old_call_dev", "old_call_list"):
                if k in fns:
                    prof[k] = device_events(fns[k], sync, steps)
            for k in ("flat_dev", "flat_old_dev"):
                if k in ffns:
                    prof[k] = device_events(ffns[k], fsync, steps)
            r["device_profile"] = prof
            r["in_jit_device_us"] = prof["in_jit"].get("per_call_us")
        if n in (1, 8) or smoke:
            pcalls = 20 if smoke else 200
            r["host_profile"] = {
                k: host_profile(fns[k], sync, pcalls)
                for k in ("call_dev", "call_list", "old_call_dev", "old_call_list")
                if k in fns
            }
        r["dev_vs_xla"] = round(r["call_dev_us"] / r["xla_set_us"], 3)
        r["list_minus_dev_us"] = round(r["call_list_us"] - r["call_dev_us"], 1)
        if "cuda_graph_us" in r and r.get("in_jit_device_us"):
            r["in_jit_vs_cuda"] = round(r["in_jit_device_us"] / r["cuda_graph_us"], 3)
        rows.append(r)
        print(format_row(r), flush=True)
    for zz in (z, fz):
        zz.check()
    res["rows"] = rows
    return res


def format_row(r: dict[str, Any]) -> str:
    def g(k: str) -> str:
        v = r.get(k)
        return "-" if v is None else f"{v:.1f}"

    return (
        f"{r['ids']:5d} ids | xla-set {g('xla_set_us')} | call dev {g('call_dev_us')} "
        f"({r['dev_vs_xla']}x xla) | list {g('call_list_us')} | in-jit device {g('in_jit_device_us')} "
        f"| cuda graph {g('cuda_graph_us')} | old dev {g('old_call_dev_us')} old list "
        f"{g('old_call_list_us')} | flat dev {g('flat_dev_us')} list {g('flat_list_us')} "
        f"old {g('flat_old_dev_us')}/{g('flat_old_list_us')} | host dev {g('host_call_dev_us')} "
        f"list {g('host_call_list_us')} xla {g('host_xla_set_us')}"
    )


def format_table(res: dict[str, Any]) -> str:
    head = (
        "| ids | XLA `leaf.at[ids].set(0)` jitted donated | `CacheZeroer(caches, ids)` device ids "
        "| same, Python list | `apply` in the user's jit (profiler device time) "
        "| cuda kernel (graph replay) | before: device ids / list |\n|---|---|---|---|---|---|---|"
    )
    out = [head]
    for r in res["rows"]:

        def g(k: str) -> str:
            v = r.get(k)
            return "-" if v is None else f"{v:,.1f} us"

        out.append(
            f"| {r['ids']:,} | {g('xla_set_us')} | {g('call_dev_us')} ({r['dev_vs_xla']:.2f}x) | "
            f"{g('call_list_us')} | {g('in_jit_device_us')} | "
            f"{g('cuda_graph_us')} | "
            f"{g('old_call_dev_us')} / {g('old_call_list_us')} |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    ap.add_argument("--pages", type=int, default=8192)
    ap.add_argument("--leaves", type=int, default=32)
    ap.add_argument("--old", help="module of an earlier kvlayout.backends.pallas, for before/after")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, interpreters (no GPU needed)")
    ap.add_argument("--list-paths", action="store_true", help="only the host-ids routes (list_paths)")
    args = ap.parse_args()
    import jax

    if args.smoke:
        args.pages, args.leaves = 16, 2
    elif jax.default_backend() != "gpu":
        print("needs a CUDA device for JAX (or --smoke)", file=sys.stderr)
        return 2
    if args.list_paths:
        lp = list_paths(args)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "list_paths.json"), "w") as f:
            json.dump(lp, f, indent=1)
        for r in lp["rows"]:
            print({k: v for k, v in r.items() if not k.startswith(("host_profile", "host_trace"))})
        return 0
    res = bench(args)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_jax_step.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)
    print(format_table(res))
    checks = [res["correctness"]]
    ok = all(c["leaves_exact"] and c["list_exact"] and c["bad_ids_counted"] == 3 for c in checks)
    print("correctness:", "all exact" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
