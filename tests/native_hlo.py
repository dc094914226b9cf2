"""Read compiled (optimised, scheduled) HLO text: what happens to the cache leaves.

Used by ``tests/test_native_pallas.py`` in a subprocess with libtpu, and runnable as
``python -m tests.native_hlo`` to print the evidence the README quotes: the native zeroer
against the flat ``int32[rows, 128]`` path on the same bf16 cache, both compiled for v5e
and v6e by the real TPU compiler, no TPU needed.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

#: tpu-inference-shaped leaves (CONTEXT.md): attention bf16 (packing 2) and fp8 (packing 4),
#: MLA, DeepSeek-V4 uint8 NoPE and indexer roles, a second bf16 attention layer, a Mamba-like
#: rank-3 f32 leaf. 1,024 pages each.
TPU_INFERENCE_LEAVES: list[tuple[tuple[int, ...], str]] = [
    ((1024, 64, 4, 2, 128), "bfloat16"),
    ((1024, 64, 2, 4, 128), "float8_e4m3fn"),
    ((1024, 2, 32, 640), "bfloat16"),
    ((1024, 64, 4, 128), "uint8"),
    ((1024, 16, 4, 256), "uint8"),
    ((1024, 64, 4, 2, 128), "bfloat16"),
    ((1024, 16, 512), "float32"),
]

#: Opcodes that may consume a cache leaf without moving its bytes.
ALLOWED = ("parameter", "get-tuple-element", "tuple", "custom-call")
#: Opcodes the issue names: any of them on a cache leaf is a relayout or copy.
FORBIDDEN = ("copy", "copy-start", "copy-done", "transpose", "bitcast-convert", "reshape", "bitcast")

_INST = re.compile(
    r"^\s*(ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s(?P<op>[a-z][\w\-]*)\((?P<args>[^)]*)\)"
)


def entry_instructions(hlo: str) -> list[dict[str, Any]]:
    """``{name, op, args, line}`` for every instruction of the ENTRY computation."""
    m = re.search(r"^ENTRY [^\n]*\{\n(.*?)^\}", hlo, re.S | re.M)
    if m is None:
        raise ValueError("no ENTRY computation in the HLO text")
    out = []
    for line in m.group(1).splitlines():
        im = _INST.match(line)
        if im:
            args = re.findall(r"%([\w.\-]+)", im.group("args"))
            out.append({"name": im.group("name"), "op": im.group("op"), "args": args, "line": line.strip()})
    return out


def aliases(hlo: str) -> dict[int, int]:
    """``output index -> parameter`` from the module header's ``input_output_alias``."""
    header = hlo.split("\n", 1)[0]
    m = re.search(r"input_output_alias=\{(.*?)\}, entry", header)
    if m is None:
        return {}
    return {int(o): int(p) for o, p in re.findall(r"\{(\d+)\}: \((\d+), \{\}", m.group(1))}


def cache_leaf_facts(hlo: str, num_leaves: int) -> dict[str, Any]:
    """What the compiled program does with parameters ``0 .. num_leaves - 1`` (the leaves).

    ``aliased``: leaves whose parameter is aliased to the output of the same index.
    ``touched``: ``(opcode, name)`` of every instruction other than a custom call, a tuple or
    a get-tuple-element that consumes a leaf or a value derived from one (any of them moves
    or reads a whole leaf). ``custom_calls``: custom calls that take leaves or values derived
    from them.
    """
    insts = entry_instructions(hlo)
    params = {}
    for i in insts:
        if i["op"] == "parameter":
            num = re.search(r"parameter\((\d+)\)", i["line"])
            if num is not None:
                params[i["name"]] = int(num.group(1))
    tainted = {n for n, k in params.items() if k < num_leaves}
    touched: list[tuple[str, str]] = []
    calls = set()
    changed = True
    while changed:  # to a fixpoint: order-independent
        changed = False
        for i in insts:
            if i["name"] in tainted or not tainted.intersection(i["args"]):
                continue
            tainted.add(i["name"])  # whatever consumes a leaf carries its bytes on
            changed = True
            if i["op"] == "custom-call":
                calls.add(i["name"])
            elif i["op"] not in ALLOWED:
                touched.append((i["op"], i["name"]))
    al = aliases(hlo)
    return {
        "aliased": sum(1 for k in range(num_leaves) if al.get(k) == k),
        "touched": touched,
        "custom_calls": len(calls),
        "forbidden_ops": sorted({op for op, _ in touched if op in FORBIDDEN}),
    }


def _memory(compiled: Any) -> dict[str, int]:
    m = compiled.memory_analysis()
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")
    return {k: int(getattr(m, k)) for k in keys if m is not None and hasattr(m, k)}


def evidence(topo: str = "v5e=2x2", pages: int = 16) -> dict[str, Any]:
    """Compile both paths for one bf16 cache ``(pages, 128, 8, 2, 128)``; return the facts."""
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.pallas as kp
    from jax.experimental import topologies

    import kvlayout as K

    dev = topologies.get_topology_desc(topo, platform="tpu").devices[0]
    sh = jax.sharding.SingleDeviceSharding(dev)
    shape = (pages, 128, 8, 2, 128)
    page_bytes = 128 * 8 * 2 * 128 * 2
    cache = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sh)
    ids = jax.ShapeDtypeStruct((64,), jnp.int32, sharding=sh)
    out: dict[str, Any] = {"topology": topo, "cache": f"bfloat16{shape}", "cache_bytes": pages * page_bytes}

    z = kp.CacheZeroer([cache], kernel="tpu", interpret=False)
    native = z.lower(64, dev).compile()
    out["native"] = {**cache_leaf_facts(native.as_text(), 1), **_memory(native)}

    table = K.SegmentTable(pages * page_bytes, pages, (K.Segment(0, page_bytes, page_bytes),))
    flat = kp.PallasZeroer(table, kernel="tpu", interpret=False)

    def flat_step(c: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        # the flat view: int32 word (r, l) holds the bf16 pair at flat index 2 * (128 r + l)
        words = jax.lax.bitcast_convert_type(c.reshape(*flat.buffer_shape, 2), jnp.int32)
        words, bad = flat.apply(words, i)
        return jax.lax.bitcast_convert_type(words, jnp.bfloat16).reshape(shape), bad

    compiled = jax.jit(flat_step, donate_argnums=0).lower(cache, ids).compile()
    text = compiled.as_text()
    facts = cache_leaf_facts(text, 1)
    out["flat"] = {**facts, **_memory(compiled)}
    return out


if __name__ == "__main__":
    topos = sys.argv[1:] or ["v5e=2x2", "v6e=2x2"]
    print(json.dumps([evidence(t) for t in topos], indent=1))
