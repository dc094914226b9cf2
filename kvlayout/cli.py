"""``kvlayout`` command line (GEOMETRY.md section 5): plan, check, zero, and friends.

Exit status: 0 success/safe/equal, 1 unsafe/differs, 2 bad input (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from . import registry
from .conformance import GUARD_BYTES, run_case
from .errors import BackendError, KVLayoutError, SpecError, TableError, bad_value, short
from .planner import Layout, plan_layout
from .presets import PRESETS, preset
from .reference import normalize_block_ids, poison_pattern, range_count_bound
from .sharding import MAX_MESH_AXES, MAX_MESH_DEVICES
from .spec import KVCacheSpec
from .table import SegmentTable
from .validate import read_json_file
from .verify import verify
from .viz.common import MAX_PLOT_GROUPS, MAX_PLOT_LAYERS, MAX_PLOT_ROWS  # no matplotlib: viz imports it late

#: Largest layout ``zero``/``shard``/``plot --kind diff`` run on a host buffer (they need a few copies).
MAX_HOST_BYTES = 2**28
#: Most block ids ``--blocks`` may name (10,000,000 took 39 s and 1 GB on the host; issue 25).
MAX_CLI_IDS = 100_000
#: Most shards ``shard`` lists one line each (``--json`` lists every one).
MAX_SHARDS_SHOWN = 64
#: Most byte ranges a zero report may list (rows x id runs, bounded before anything runs).
MAX_REPORT_RANGES = 1_000_000


#: Commands that take ``--engine tpu-inference`` (typed per-layer arrays, GEOMETRY.md section 9).
NATIVE_COMMANDS = ("plan", "check", "zero")


class UsageError(KVLayoutError):
    """Bad command-line input (exit 2)."""


def _add_source(p: argparse.ArgumentParser, *, table: bool = False) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help="log backend choices")
    p.add_argument("spec", nargs="?", help="spec JSON file (GEOMETRY.md section 4)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="use a built-in spec instead of SPEC.json")
    p.add_argument("--num-blocks", type=_count, help="override the spec's num_blocks")
    if table:
        p.add_argument("--table", help="check a segment table JSON instead of a spec")
    m = p.add_argument_group("a model's config.json (kvlayout.models): the cache an engine allocates for it")
    m.add_argument("--config", metavar="CONFIG.json", help="a Hugging Face config.json instead of SPEC.json")
    m.add_argument("--engine", help="with --config: vllm (default) or tpu-inference")
    m.add_argument("--tp", type=_count, help="with --config: tensor-parallel ranks (one rank's layout)")
    m.add_argument("--kv-cache-dtype", help="with --config: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2")
    m.add_argument("--block-size", type=_count, help="with --config: tokens per block (else the engine's)")
    m.add_argument("--device", help="with --config: the GPU: hopper (default), blackwell, ampere")
    m.add_argument("--attention-backend", help="with --config: a vLLM attention backend (else vLLM's choice)")
    m.add_argument(
        "--reader",
        help="with --config: auto (default: as written, through transformers where a field is left out), "
        "json (as written) or transformers (as vLLM)",
    )
    m.add_argument("--dp", type=_count, help="with --engine tpu-inference: the mesh's data axis")
    m.add_argument("--dcp", type=_count, help="with --engine tpu-inference: decode context parallel size")
    m.add_argument("--model-impl", help="with --engine tpu-inference: auto (default), flax_nnx, vllm")
    m.add_argument("--max-model-len", type=_count, help="with --engine tpu-inference: sets its default page")


def _count(text: str) -> int:
    """A plain decimal count for argparse (no sign, no underscores)."""
    if not re.fullmatch(r"[0-9]{1,19}", text):
        why = "at most 19 digits" if re.fullmatch(r"[0-9]+", text) else "not a non-negative decimal integer"
        raise argparse.ArgumentTypeError(f"{_short(text)!r}: {why}")
    return int(text)


def _model_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that describe a model's cache (with ``--config``), by name."""
    return {
        "--engine": args.engine,
        "--tp": args.tp,
        "--kv-cache-dtype": args.kv_cache_dtype,
        "--block-size": args.block_size,
        "--device": args.device,
        "--attention-backend": args.attention_backend,
        "--reader": args.reader,
        "--dp": args.dp,
        "--dcp": args.dcp,
        "--model-impl": args.model_impl,
        "--max-model-len": args.max_model_len,
    }


def _refuse_model_flags(args: argparse.Namespace) -> None:
    """A model flag without ``--config`` is refused naming it (it would be silently ignored)."""
    given = [flag for flag, v in _model_flags(args).items() if v is not None]
    if given:
        raise UsageError(f"{given[0]} applies with --config CONFIG.json only", field=given[0], value=None)


def _load_spec(args: argparse.Namespace) -> KVCacheSpec:
    if args.spec and args.preset:
        raise UsageError("give SPEC.json or --preset, not both", field="spec", value=args.spec)
    if args.config:
        if args.spec or args.preset:
            raise UsageError(
                "give --config or a spec (SPEC.json, --preset), not both", field="config", value=args.config
            )
        from .models import DEFAULT_NUM_BLOCKS, ModelSpec, from_config

        args.model_spec = from_config(
            args.config,
            engine="vllm" if args.engine is None else args.engine,
            tp=1 if args.tp is None else args.tp,
            kv_cache_dtype=args.kv_cache_dtype,
            block_size=args.block_size,
            num_blocks=DEFAULT_NUM_BLOCKS if args.num_blocks is None else args.num_blocks,
            device="hopper" if args.device is None else args.device,
            attention_backend=args.attention_backend,
            reader="auto" if args.reader is None else args.reader,
            **{
                k: v
                for k, v in (("dp", args.dp), ("dcp", args.dcp), ("model_impl", args.model_impl),
                             ("max_model_len", args.max_model_len))
                if v is not None
            },
        )
        if not isinstance(args.model_spec, ModelSpec):  # tpu-inference: per-layer arrays, not a flat buffer
            if args.cmd not in NATIVE_COMMANDS:
                raise UsageError(
                    f"--engine {args.engine}: native arrays are planned, checked and zeroed by "
                    f"{', '.join(NATIVE_COMMANDS)}; {args.cmd} takes vLLM's flat layout",
                    field="engine",
                    value=args.engine,
                )
            return None  # type: ignore[return-value]  # the command reads args.model_spec
        return args.model_spec.spec
    _refuse_model_flags(args)
    if args.preset:
        spec = preset(args.preset)
    elif args.spec:
        data = read_json_file(SpecError, "spec file", args.spec)
        if isinstance(data, dict) and data.get("layout") == "native":  # GEOMETRY.md section 9
            _load_native(args, data)
            return None  # type: ignore[return-value]  # the command reads args.native
        if args.cmd == "plot":  # refuse a spec too large to draw before parsing and planning it
            groups = data.get("groups") if isinstance(data, dict) else None
            if isinstance(groups, list):
                layers = sum(
                    len(g["layers"])
                    for g in groups
                    if isinstance(g, dict) and isinstance(g.get("layers"), list)
                )
                if layers > MAX_PLOT_LAYERS:
                    raise UsageError(
                        f"plot: the spec has {layers} layers; plots draw at most {MAX_PLOT_LAYERS}",
                        field="layers",
                        value=layers,
                    )
        spec = KVCacheSpec.from_dict(data)
    else:
        raise UsageError("missing SPEC.json (or --preset NAME)", field="spec", value=None)
    if args.num_blocks is not None:
        spec = spec.with_num_blocks(args.num_blocks)
    return spec


def _load_native(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """A native spec file (``layout: native``): typed per-layer arrays, read by plan/check/zero."""
    from .native import NativeCacheSpec

    if args.cmd not in NATIVE_COMMANDS:
        raise UsageError(
            f"{_short(args.spec)!r} is a native spec (layout 'native'): {', '.join(NATIVE_COMMANDS)} "
            f"read it; {args.cmd} takes a flat-buffer spec",
            field="spec.layout",
            value="native",
        )
    native = NativeCacheSpec.from_dict(data)
    if args.num_blocks is not None:
        native = native.with_num_blocks(args.num_blocks)
    args.native = (native, "native spec")


def _native_of(args: argparse.Namespace) -> Any:
    """``(NativeCacheSpec, engine label)`` of a native spec file or ``--engine tpu-inference``."""
    if getattr(args, "native", None) is not None:
        return args.native
    return args.model_spec.spec, args.model_spec.engine


def _fmt_native(spec: Any) -> str:
    """A native spec's arrays and their one-row tables (GEOMETRY.md section 9)."""
    from .native import native_tables

    lines = [
        f"layout native: {len(spec.leaves)} arrays, {spec.num_blocks} blocks, groups {', '.join(spec.groups)}"
    ]
    for leaf, (name, t) in zip(spec.leaves, native_tables(spec).items()):
        row = f"base 0 stride {t.segments[0].stride} span {t.segments[0].span}" if len(t) else "not zeroed"
        lines.append(f"  {name}: {list(leaf.shape)} {leaf.dtype} group {leaf.group_label}: {row}")
    lines.append(f"{spec.bytes_per_block} B cleared per block")
    return "\n".join(lines)


def _fmt_table(layout: Layout | None, table: SegmentTable) -> str:
    lines = []
    if layout is not None:
        sp = layout.spec
        kind = (
            f"block_stride {layout.block_stride}"
            if layout.block_stride
            else f"{len(layout.slot_pages)} slots"
        )
        lines.append(
            f"layout {sp.layout}: {len(sp.groups)} groups, {len(sp.layers)} layers, "
            f"{sp.num_blocks} blocks, {kind}, "
            f"total_bytes {table.total_bytes}"
        )
    lines.append(f"{'row':>4} {'base':>12} {'stride':>9} {'span':>8}  group/layer/part")
    for i, s in enumerate(table.segments):
        lines.append(f"{i:>4} {s.base:>12} {s.stride:>9} {s.span:>8}  {s.label}")
    lines.append(f"{len(table)} rows, {table.bytes_per_block} B cleared per block")
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    if args.compact and not args.json:
        raise UsageError("--compact only applies with --json", field="compact", value=True)
    spec = _load_spec(args)
    if getattr(args, "native", None) is not None:  # a native spec file: its arrays' tables
        from .native import native_tables

        native = args.native[0]
        if args.json:
            tables = {name: t.to_dict() for name, t in native_tables(native).items()}
            print(
                json.dumps(
                    {"version": 1, "layout": "native", "tables": tables}, indent=None if args.compact else 1
                )
            )
        else:
            print(_fmt_native(native))
        return 0
    model = getattr(args, "model_spec", None)
    if model is not None and (spec is None or not args.json):  # --config: the summary (kvlayout.models)
        from .models import summary

        print(model.spec.to_json(indent=None if args.compact else 1) if args.json else summary(model))
        return 0
    layout = plan_layout(spec)
    table = layout.table()
    if args.coalesce:
        table = table.coalesced()
    print(table.to_json(indent=None if args.compact else 1) if args.json else _fmt_table(layout, table))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    if args.table:
        if args.spec or args.preset or args.config:  # a table is checked as given: no spec beside it
            raise UsageError("give --table or a spec, not both", field="table", value=args.table)
        _refuse_model_flags(args)
        if args.num_blocks is not None:
            raise UsageError(
                "--num-blocks applies to specs; a table JSON fixes its own num_blocks",
                field="num_blocks",
                value=args.num_blocks,
            )
        table = SegmentTable.from_dict(read_json_file(TableError, "table file", args.table))
    else:
        spec = _load_spec(args)
        if spec is None:  # --engine tpu-inference: one single-row table per array
            return _check_native(args)
        table = plan_layout(spec).table()
    report = verify(table)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.format())
    return 0 if report.ok else 1


def parse_blocks(text: str, num_blocks: int) -> np.ndarray:
    """``"0,5,99"`` -> int64 ``[0, 5, 99]``; ranges ``a-b`` (inclusive, ``a <= b``); empty means none.

    Every item is checked against ``[0, num_blocks)`` and the total against
    :data:`MAX_CLI_IDS` before anything is expanded.
    """
    spans: list[tuple[int, int]] = []
    count = 0
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        m = re.fullmatch(r"([0-9]{1,19})(?:-([0-9]{1,19}))?", tok)
        if not m:
            raise UsageError(
                f"--blocks item {tok!r}: must be N or A-B (decimal digits)", field="blocks", value=tok
            )
        a = int(m[1])
        b = int(m[2]) if m[2] is not None else a
        if a > b:
            raise UsageError(f"--blocks item {tok!r}: range is descending", field="blocks", value=tok)
        if b >= num_blocks:
            raise UsageError(
                f"--blocks item {tok!r}: block {b} outside [0, {num_blocks})", field="blocks", value=tok
            )
        count += b - a + 1
        if count > MAX_CLI_IDS:
            raise UsageError(f"--blocks names more than {MAX_CLI_IDS} ids", field="blocks", value=count)
        spans.append((a, b + 1))
    if not spans:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, e, dtype=np.int64) for a, e in spans])


def _host_sized(nbytes: int, what: str, quarter: bool = False) -> None:
    """Refuse host buffers above :data:`MAX_HOST_BYTES` (a quarter of it) before allocating them."""
    limit = MAX_HOST_BYTES // 4 if quarter else MAX_HOST_BYTES
    if nbytes > limit:
        raise UsageError(
            f"{what} = {nbytes} B: above the {limit} B this command checks on the host; "
            "use --num-blocks N to check the same layout with a smaller pool",
            field="total_bytes",
            value=nbytes,
        )


def _report_sized(ranges: int) -> None:
    """Refuse a zero whose contract could list more than :data:`MAX_REPORT_RANGES` byte ranges."""
    if ranges > MAX_REPORT_RANGES:
        raise UsageError(
            f"--blocks: the contract for these ids may hold up to {ranges} separate byte ranges; a zero "
            f"report lists at most {MAX_REPORT_RANGES} (give fewer or consecutive ids)",
            field="blocks",
            value=ranges,
        )


def _shard_ranges(local: SegmentTable, routes: Sequence[np.ndarray]) -> int:
    """An upper bound on the gathered contract's byte ranges: each shard's :func:`range_count_bound`,
    which is ``dense * runs + sparse * ids``; the two coefficients read off one and two ids."""
    if not any(r.size for r in routes):
        return 0
    one = range_count_bound(local, [0])
    sparse = range_count_bound(local, [0, 1]) - one if local.num_blocks > 1 else 0
    dense = one - sparse
    runs = ids = 0
    seen: dict[int, tuple[int, int]] = {}  # routes share one array where shards zero the same ids
    for r in routes:
        if id(r) not in seen:  # once per distinct array: 65,536 shards of one array took 52 s (issue 25)
            u = np.unique(r)
            seen[id(r)] = (1 + int(np.count_nonzero(np.diff(u) != 1)) if u.size else 0, int(u.size))
        runs, ids = runs + seen[id(r)][0], ids + seen[id(r)][1]
    return dense * runs + sparse * ids


def run_zero(
    table: SegmentTable,
    block_ids: Sequence[int] | np.ndarray,
    backend: str | None = None,
    group: str | None = None,
) -> dict[str, Any]:
    """Zero ``block_ids`` (of ``group``) with a real backend on a poisoned buffer; the report of section 4."""
    ids = normalize_block_ids(block_ids, table.num_blocks)  # before any buffer exists
    table.for_group(group)
    name, _ = registry.resolve(backend)
    return _run_zero_with(name, registry.load(name), table, ids, group)


def _run_zero_with(
    name: str, cls: Any, table: SegmentTable, ids: np.ndarray, group: str | None = None
) -> dict[str, Any]:
    """:func:`run_zero` with the backend already resolved and imported (``name``, ``cls``): the
    registry scans installed entry points on every lookup, too slow to repeat per native array.

    A backend that fails with anything but a :class:`KVLayoutError` (a ``module:attr`` class that
    is no usable backend) is one :class:`BackendError` naming it and the exception (its traceback
    logged under ``-v``), so the CLI prints one line and exits 2."""
    try:
        res = run_case(cls, table, ids, group=group)
    except (KVLayoutError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001  # a user's backend class failing as it runs
        logging.getLogger("kvlayout").info("backend %s raised", name, exc_info=True)
        why = f"failed as it ran: {type(e).__name__}: {short(str(e))[1:-1]}"
        raise bad_value(BackendError, "backend", name, why) from None
    return {
        "version": 1,
        "backend": res.backend if ":" in name else name,
        "mode": res.mode,
        "total_bytes": table.total_bytes,
        "block_ids": [int(i) for i in ids],
        "matches_contract": res.ok,
        "zeroed": res.check.zeroed.tolist(),
        "zeroed_bytes": res.check.zeroed_bytes,
        "_check": res.check,
    }


def _zero_unzeroed_group(
    args: argparse.Namespace, spec: KVCacheSpec, table: SegmentTable, ids: np.ndarray
) -> int:
    """``--group`` naming a group of the spec whose layers are never zeroed (Mamba state): nothing to
    clear, as vLLM's own zeroer does for it (exit 0). A name that is no group of the spec is exit 2
    listing every group, those that zero nothing marked."""
    names = [g.name for g in spec.groups]
    if args.group not in names:
        why = "unknown group; valid groups: " + ", ".join(repr(n) for n in table.groups)
        empty = [repr(n) for n in names if n not in table.groups]
        why += "; groups that zero nothing: " + ", ".join(empty) if empty else ""
        raise bad_value(TableError, "group", args.group, why)
    name, _ = registry.resolve(args.backend)
    rep = {
        "version": 1, "backend": name, "mode": "none", "total_bytes": table.total_bytes,
        "block_ids": [int(i) for i in ids], "matches_contract": True, "zeroed": [], "zeroed_bytes": 0,
        "group": args.group,
    }
    if args.json:
        print(json.dumps(rep))
    else:
        print(
            f"group {args.group!r} holds no zeroed layer (its state is never zeroed, docs/GEOMETRY.md "
            f"section 7): {len(ids)} block ids, 0 B zeroed of a {table.total_bytes} B buffer"
        )
    return 0


def cmd_zero(args: argparse.Namespace) -> int:
    spec = _load_spec(args)
    if args.blocks is None:
        raise UsageError("--blocks is required (e.g. --blocks 0,5,99)", field="blocks", value=None)
    if spec is None:  # --engine tpu-inference
        return _zero_native(args)
    table = plan_layout(spec).table()
    ids = parse_blocks(args.blocks, table.num_blocks)
    if args.group is not None and args.group not in table.groups:
        return _zero_unzeroed_group(args, spec, table, ids)
    _host_sized(table.total_bytes, "total_bytes")
    _report_sized(range_count_bound(table, ids, args.group))
    rep = run_zero(table, ids, args.backend, args.group)
    if args.group is not None:
        rep["group"] = args.group
    chk = rep.pop("_check")
    if args.json:
        print(json.dumps(rep))
    else:
        print(
            f"backend {rep['backend']} ({rep['mode']}): {len(rep['block_ids'])} block ids, "
            f"{rep['zeroed_bytes']} B zeroed in {len(rep['zeroed'])} ranges of a "
            f"{rep['total_bytes']} B buffer "
            f"(+{GUARD_BYTES} B guard bands each side)"
        )
        print(f"contract: {chk.describe()}")
    return 0 if rep["matches_contract"] else 1


def _check_native(args: argparse.Namespace) -> int:
    """``check --config --engine tpu-inference``: every array's one-row table (section 9) verified."""
    from .native import verify_native

    reports = verify_native(_native_of(args)[0])
    ok = all(r.ok for r in reports.values())
    shared: dict[int, Any] = {}  # arrays of one table share one report: render it once

    def render(r: Any) -> Any:
        if id(r) not in shared:
            shared[id(r)] = r.to_dict() if args.json else r.format().splitlines()[0]
        return shared[id(r)]

    if args.json:
        print(json.dumps({"safe": ok, "arrays": {name: render(r) for name, r in reports.items()}}))
    else:
        for name, r in reports.items():
            print(f"{name}: {render(r)}")
        print(f"{len(reports)} arrays: {'SAFE' if ok else 'UNSAFE'}")
    return 0 if ok else 1


#: Most different array tables ``zero`` runs a backend on for one native spec (each is a
#: poisoned run, a compile for Pallas); arrays with equal tables share one run.
MAX_NATIVE_ZERO_TABLES = 256


def _table_key(t: SegmentTable) -> tuple[Any, ...]:
    """Equal keys: equal tables up to the names in their rows (the same poisoned run)."""
    return (t.total_bytes, t.num_blocks, tuple((s.base, s.stride, s.span) for s in t.segments))


def _zero_native(args: argparse.Namespace) -> int:
    """``zero --config --engine tpu-inference``: each array is a buffer with one row (section 9),
    zeroed by the backend on a poisoned copy and compared with the contract."""
    from .native import native_tables

    spec, engine = _native_of(args)
    ids = parse_blocks(args.blocks, spec.num_blocks)
    tables = native_tables(spec, args.group)  # exit 2 naming the valid groups
    # one poisoned run per distinct array at a time: the largest array is what the host holds
    _host_sized(max((t.total_bytes for t in tables.values()), default=0), "total_bytes of an array")
    distinct = {_table_key(t) for t in tables.values()}
    if len(distinct) > MAX_NATIVE_ZERO_TABLES:
        raise UsageError(
            f"spec: {len(distinct)} different array shapes; zero runs the backend on at most "
            f"{MAX_NATIVE_ZERO_TABLES} (arrays of one shape share one run)",
            field="leaves",
            value=len(distinct),
        )
    first: dict[Any, SegmentTable] = {}
    for t in tables.values():
        first.setdefault(_table_key(t), t)
    per_key = {k: range_count_bound(t, ids) for k, t in first.items()}  # each array's report lists its own
    _report_sized(sum(per_key[_table_key(t)] for t in tables.values()))
    backend, _ = registry.resolve(args.backend)  # once: the lookup scans installed entry points
    cls = registry.load(backend)
    runs: dict[Any, dict[str, Any]] = {}  # arrays of one page size and group mask: one poisoned run
    arrays = []
    for name, t in tables.items():
        key = _table_key(t)
        if key not in runs:
            runs[key] = _run_zero_with(backend, cls, t, normalize_block_ids(ids, t.num_blocks))
        rep = dict(runs[key])
        chk = rep.pop("_check")
        arrays.append(
            {
                "name": name,
                **{k: rep[k] for k in ("total_bytes", "zeroed", "zeroed_bytes")},
                "matches_contract": rep["matches_contract"],
                "_check": chk,
            }
        )
    ok = all(a["matches_contract"] for a in arrays)
    out: dict[str, Any] = {
        "version": 1,
        "engine": engine,
        "backend": rep["backend"],
        "mode": rep["mode"],
        "block_ids": [int(i) for i in ids],
        "matches_contract": ok,
    }
    if args.group is not None:
        out["group"] = args.group
    if args.json:
        out["arrays"] = [{k: v for k, v in a.items() if k != "_check"} for a in arrays]
        print(json.dumps(out))
    else:
        total = sum(a["zeroed_bytes"] for a in arrays)
        print(
            f"backend {out['backend']} ({out['mode']}): {len(ids)} block ids, {total} B zeroed in "
            f"{len(arrays)} arrays (+{GUARD_BYTES} B guard bands each side of each)"
        )
        for a in arrays:
            if not a["matches_contract"]:
                print(f"{a['name']}: {a['_check'].describe()}")
        print(f"contract: {'every array matches' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def parse_mesh(text: str) -> list[tuple[str, int]]:
    """``"dp=2,tp=4"`` -> ``[("dp", 2), ("tp", 4)]`` (mesh order)."""
    out = []
    for tok in (t.strip() for t in text.split(",")):
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]{0,63})=([0-9]+)", tok)
        if not m:
            raise UsageError(
                f"--mesh item {_short(tok)!r}: must be NAME=SIZE (e.g. dp=2,tp=4)", field="mesh", value=tok
            )
        if len(m[2]) > 10 or not 1 <= int(m[2]) <= MAX_MESH_DEVICES:
            raise UsageError(
                f"--mesh item {_short(tok)!r}: axis size must lie in [1, {MAX_MESH_DEVICES}]",
                field=f"mesh.{m[1]}",
                value=_short(m[2]),
            )
        out.append((m[1], int(m[2])))
        if len(out) > MAX_MESH_AXES:
            raise UsageError(f"--mesh names more than {MAX_MESH_AXES} axes", field="mesh", value=len(out))
    return out  # the product of the sizes is bounded by kvlayout.sharding


def _short(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters for a one-line message."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"


def _axes(text: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip()) if text else ()


def cmd_shard(args: argparse.Namespace) -> int:
    from .sharding import shard_spec

    if not args.mesh:
        raise UsageError("--mesh is required (e.g. --mesh dp=2,tp=4)", field="mesh", value=None)
    lay = shard_spec(
        _load_spec(args),
        parse_mesh(args.mesh),
        block_axes=_axes(args.block_axes),
        head_axes=_axes(args.head_axes),
    )
    report = lay.verify()
    if args.blocks is not None:
        _host_sized(lay.gathered_bytes, "gathered bytes")
    out: dict[str, Any] = {**lay.to_dict(), "safe": report.ok}
    routes = []
    check = None
    if args.blocks is not None:
        ids = lay.validate_ids(parse_blocks(args.blocks, lay.num_blocks))  # exit 2 before anything
        routes = lay.route(ids)
        routed = sum(r.size for r in routes)
        if args.json and routed > MAX_CLI_IDS:
            raise UsageError(
                f"--blocks: {ids.size} ids routed to {lay.num_shards} shards give {routed} local ids; "
                f"--json lists at most {MAX_CLI_IDS}",
                field="blocks",
                value=routed,
            )
        _report_sized(_shard_ranges(lay.local_table, routes))
        out["block_ids"] = ids.tolist()
        if args.json:
            out["local_ids"] = [r.tolist() for r in routes]
        # the NumPy reference on a poisoned gathered buffer, every changed byte against the contract
        before = poison_pattern(lay.gathered_bytes)
        after = before.copy()
        lay.zero_reference(after, ids)
        check = lay.compare(before, after, ids)
        out["matches_contract"] = check.matches
        out["zeroed_bytes"] = check.zeroed_bytes
    if args.json:
        out.pop("local_spec")
        print(json.dumps(out))
    else:
        print(lay.describe())
        print(f"local table: {report.format().splitlines()[0]}")
        for k, r in enumerate(routes[:MAX_SHARDS_SHOWN]):
            coords = ", ".join(f"{a}={i}" for a, i in lay.shard_coords(k).items())
            coords += "; " if coords else ""  # no shard axes: one shard, no coordinates
            shown = ", ".join(map(str, r[:8].tolist())) + (f", ... ({len(r)} ids)" if len(r) > 8 else "")
            print(
                f"  shard {k} ({coords}bytes [{k * lay.shard_bytes}, {(k + 1) * lay.shard_bytes})): "
                f"local ids [{shown}]"
            )
        if len(routes) > MAX_SHARDS_SHOWN:
            print(f"  ... {len(routes) - MAX_SHARDS_SHOWN} more shards (--json lists every one)")
        if check is not None:
            print(f"reference on the gathered buffer: {check.zeroed_bytes} B zeroed, {check.describe()}")
    return 0 if report.ok and (check is None or check.matches) else 1


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = _Parser(
        prog="kvlayout",
        description="Plan, verify and zero paged KV-cache layouts (contract: docs/GEOMETRY.md).",
    )
    p.add_argument("--version", action="version", version=f"kvlayout {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    pp = sub.add_parser("plan", help="plan a spec and print its segment table")
    _add_source(pp)
    pp.add_argument("--json", action="store_true", help="print the table JSON of GEOMETRY.md section 4")
    pp.add_argument("--compact", action="store_true", help="with --json: one line")
    pp.add_argument("--coalesce", action="store_true", help="print the coalesced (kernel) table")
    pp.set_defaults(func=cmd_plan)

    pc = sub.add_parser("check", help="prove a table safe for every block id")
    _add_source(pc, table=True)
    pc.add_argument("--json", action="store_true", help="print the report as JSON")
    pc.set_defaults(func=cmd_check)

    pz = sub.add_parser("zero", help="zero blocks with a real backend on a poisoned buffer and compare")
    _add_source(pz)
    pz.add_argument("--blocks", help="block ids, e.g. 0,5,99 or 0-15")
    pz.add_argument("--backend", help=f"backend name (else ${registry.ENV_VAR}, else auto)")
    pz.add_argument("--json", action="store_true", help="print the zero report JSON")
    pz.add_argument("--group", help="zero the ids of this cache group only (docs/GEOMETRY.md section 7)")
    pz.set_defaults(func=cmd_zero)
    ps = sub.add_parser("shard", help="shard a spec over a device mesh: per-shard layout, proof, id routing")
    _add_source(ps)
    ps.add_argument("--mesh", help="mesh axes in order, e.g. dp=2,tp=4")
    ps.add_argument("--block-axes", help="axes that split the block pool (block_sharded mode), e.g. dp")
    ps.add_argument(
        "--head-axes", help="axes that split the KV heads (each shard: a full local layout), e.g. tp"
    )
    ps.add_argument("--blocks", help="global block ids to route (and zero with the reference), e.g. 0,5,99")
    ps.add_argument("--json", action="store_true", help="print the sharded layout (and routing) as JSON")
    ps.set_defaults(func=cmd_shard)

    pm = sub.add_parser("plot", help="draw a layout: byte map, table rows, zeroing, bytes per step")
    _add_source(pm)
    pm.add_argument("--table", help="draw a segment table JSON instead of a spec (--kind table or steps)")
    pm.add_argument("--out", required=True, help="FILE.png, FILE.svg or FILE.pdf")
    pm.add_argument(
        "--blocks",
        help="block ids to draw (default: first, second, middle, last); for --kind diff: ids to zero",
    )
    pm.add_argument(
        "--kind",
        choices=("map", "table", "diff", "steps"),
        default=None,
        help="map (default for a spec): lanes per group shape, gaps at byte scale; table "
        "(default for --table): what each row clears, red only where unsafe; diff: "
        "reference zeroing, changed bytes; steps: bytes written per step, per-group "
        "against all-group zeroing",
    )
    pm.add_argument(
        "--compare",
        metavar="KEY=VALUE[,...]",
        help="draw the spec above a variant of it: layout=NAME, tp=N, dtype=NAME, num_blocks=N, "
        "preset=NAME or spec=FILE (e.g. --compare layout=layer_major or --compare tp=2)",
    )
    pm.set_defaults(func=cmd_plot)

    pf = sub.add_parser("conformance", help="run the conformance battery on one or every installed backend")
    pf.add_argument("--backend", help="name or module:attr (default: every installed backend)")
    pf.add_argument("--quick", action="store_true", help="fewer random specs")
    pf.set_defaults(func=cmd_conformance)
    return p


#: Pseudo file systems a plot is never written into (writes there are kernel requests, not files).
NO_PLOT_DIRS = ("/proc", "/sys", "/dev")


def _plot_path(text: str) -> Path:
    """``--out``: a new or regular ``.png``/``.svg``/``.pdf`` file in an existing, writable folder."""
    out = Path(text)
    if text.endswith(("/", "\\")) or out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UsageError(
            f"--out {_short(text)!r}: the file must end in .png, .svg or .pdf", field="out", value=text
        )
    try:
        resolved = out.resolve()
        is_dir, exists = out.is_dir(), out.exists()
        parent_ok = resolved.parent.is_dir()
    except (OSError, RuntimeError) as e:  # a symlink loop, a name too long
        raise UsageError(f"--out {_short(text)!r}: {e}", field="out", value=text) from None
    if resolved.suffix.lower() not in (".png", ".svg", ".pdf"):  # a link to /etc/passwd, say
        raise UsageError(
            f"--out {_short(text)!r}: links to {_short(str(resolved))!r}, not a .png, .svg or .pdf file",
            field="out",
            value=text,
        )
    if any(resolved == Path(d) or Path(d) in resolved.parents for d in NO_PLOT_DIRS):
        raise UsageError(
            f"--out {_short(text)!r}: {', '.join(NO_PLOT_DIRS)} hold no plot files", field="out", value=text
        )
    if is_dir or (exists and not resolved.is_file()):
        raise UsageError(
            f"--out {_short(text)!r}: is a folder or not a regular file", field="out", value=text
        )
    if not parent_ok:
        raise UsageError(
            f"--out {_short(text)!r}: folder {str(out.parent)!r} does not exist", field="out", value=text
        )
    if not os.access(resolved.parent, os.W_OK) or (exists and not os.access(resolved, os.W_OK)):
        raise UsageError(f"--out {_short(text)!r}: not writable", field="out", value=text)
    return out


# MAX_PLOT_ROWS, MAX_PLOT_LAYERS, MAX_PLOT_GROUPS: kvlayout.viz's own bounds (imported above)
def _plot_sized(table: SegmentTable, specs: Sequence[KVCacheSpec]) -> None:
    """Refuse, before matplotlib is imported, a plot too large to draw in seconds or to read."""
    groups = len({s.group for s in table.segments})
    for what, n, limit in (("rows", len(table), MAX_PLOT_ROWS), ("groups", groups, MAX_PLOT_GROUPS)):
        if n > limit:
            raise UsageError(
                f"plot: the table has {n} {what}; plots draw at most {limit} (use kvlayout plan or check)",
                field=what,
                value=n,
            )
    for spec in specs:
        if len(spec.layers) > MAX_PLOT_LAYERS:
            raise UsageError(
                f"plot: the spec has {len(spec.layers)} layers; byte maps draw at most {MAX_PLOT_LAYERS}",
                field="layers",
                value=len(spec.layers),
            )


def cmd_plot(args: argparse.Namespace) -> int:
    out = _plot_path(args.out)
    from .viz import describe_changes, parse_compare, variant  # no matplotlib: the input is checked first

    kind = args.kind or ("table" if args.table else "map")
    spec: KVCacheSpec | None = None
    if args.table:
        if args.spec or args.preset or getattr(args, "config", None):
            raise UsageError("give --table or a spec, not both", field="table", value=args.table)
        _refuse_model_flags(args)
        if args.num_blocks is not None or args.compare is not None or kind not in ("table", "steps"):
            raise UsageError(
                "--table draws --kind table or steps (a table JSON has no layout: --compare, "
                "--num-blocks and --kind map/diff need a spec)",
                field="table",
                value=args.table,
            )
        table = SegmentTable.from_dict(read_json_file(TableError, "table file", args.table))
    else:
        spec = _load_spec(args)
        table = plan_layout(spec).table()
    other: KVCacheSpec | None = None
    changes: list[tuple[str, str]] = []
    if args.compare is not None:
        if kind != "map" or spec is None:
            raise UsageError(
                "--compare draws two byte maps: use it without --kind (or with --kind map)",
                field="compare",
                value=args.compare,
            )
        changes = parse_compare(args.compare)
        other = variant(spec, changes)
        plan_layout(other)  # a variant that cannot be planned is exit 2 here, before matplotlib
    _plot_sized(table, [x for x in (spec, other) if x is not None] if kind == "map" else [])
    for what, nb in (("num_blocks", table.num_blocks if kind in ("diff", "steps") else 1),
                     ("num_blocks" if table.num_blocks == 0 else "--compare num_blocks",
                      1 if other is None else other.num_blocks)):
        if nb == 0:  # a drawing that zeroes ids needs one: said so, not as an id of the user's
            why = f"{what} = 0: --kind {kind} draws block ids, and this pool has none"
            raise UsageError(why, field="num_blocks", value=0)
    blocks = parse_blocks(args.blocks, table.num_blocks).tolist() if args.blocks else None
    if kind == "diff":  # a drawing: a quarter of zero's bound (it holds about six masks of the pool)
        _host_sized(table.total_bytes, "total_bytes", quarter=True)
    try:  # only once the input is known good: importing matplotlib takes seconds
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        raise UsageError(
            "kvlayout plot needs matplotlib: pip install 'kvlayout[notebook]'", field="plot", value=None
        ) from None
    from .reference import ReferenceBackend
    from .viz import byte_map, bytes_per_step, compare_maps, table_map, zero_diff

    config = getattr(args, "config", None)
    name = args.preset or (
        Path(config).parent.name or "config" if config else Path(args.spec or args.table).name
    )
    # a file name that is not UTF-8 reaches Python with surrogates, which matplotlib cannot draw
    name = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if other is not None and spec is not None:
        fig = compare_maps(spec, other, (name, f"{name} with {describe_changes(changes)}"), blocks)
    elif kind == "map" and spec is not None:
        fig = byte_map(spec, blocks, title=name)
    elif kind == "table":
        fig = table_map(table, blocks)
    elif kind == "steps":
        fig = bytes_per_step(spec if spec is not None else table)
    else:
        ids = blocks if blocks is not None else [0]
        res = run_case(ReferenceBackend, table, ids)
        before = poison_pattern(res.after.size)
        fig = zero_diff(before, {"reference": res.after}, table, ids, origin=GUARD_BYTES)
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        raise UsageError(
            f"--out {_short(args.out)!r}: {e.strerror or e}", field="out", value=args.out
        ) from None
    print(f"wrote {out}")
    return 0


def installed_backends() -> dict[str, Any]:
    """Every registered backend whose extra is importable here."""
    out = {}
    for name in registry.registered():
        try:
            out[name] = registry.load(name)
        except KVLayoutError:
            continue
    return out


def cmd_conformance(args: argparse.Namespace) -> int:
    from .conformance import run_conformance

    # an empty --backend is a name to check (refused), not "every backend" (issue 25, fifth pass)
    named = args.backend is not None
    backends = {args.backend: registry.load(args.backend)} if named else installed_backends()
    failures = run_conformance(backends, quick=args.quick)
    for f in failures:
        print(f.format())
    modes = ", ".join(backends)
    print(
        f"conformance: {len(backends)} backends ({modes}): "
        + ("all passed" if not failures else f"{len(failures)} failures")
    )
    return 0 if not failures else 1


def _one_line(text: str) -> str:
    """Messages stay one line and free of terminal control characters."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING, format="%(message)s"
    )
    try:
        for name in ("spec", "table", "config"):  # an empty path read as "not given" (issue 25)
            if getattr(args, name, None) == "":
                raise UsageError(f"{name} = '': an empty path", field=name, value="")
        rc = int(args.func(args))
        flush = getattr(sys.stdout, "flush", None)  # None where fd 1 was closed (`>&-`)
        if flush is not None:
            flush()  # a write that fails (a full disk, /dev/full) fails here, inside the try
        return rc
    except KVLayoutError as e:
        print(f"kvlayout {args.cmd}: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"kvlayout {args.cmd}: error: out of host memory (try a smaller --num-blocks)", file=sys.stderr)
        return 2
    except BrokenPipeError:  # pragma: no cover - e.g. `kvlayout plan | head`
        return 0
    except OSError as e:  # the output could not be written (issue 25, seventeenth pass): one line
        _drop_stdout()
        print(f"kvlayout {args.cmd}: error: writing the output: {e.strerror or e}", file=sys.stderr)
        return 2


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's flush at exit does not fail on the
    unwritten rest again (a traceback after the one-line error)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):  # no file descriptor (a test's captured output): nothing to drop
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
