"""Compile the Pallas TPU kernels with the real TPU compiler (libtpu), no TPU needed.

Run in a subprocess by the tests (``python -m tests.mosaic_compile CHECK``, from the repository
root): loading libtpu and building TPU topologies stays out of the test process, whose JAX
runs on forced CPU host devices. Each check asserts what must hold and prints one line per
compiled program for the calling test to read.

    flat     PallasZeroer for v5e and v6e (dsv4-test, dsv4, llama-8b), buffer aliased
    native   CacheZeroer over tpu-inference-shaped leaves: aliased, no copy of a leaf
             (tests/native_hlo.py reads the HLO), every leaf path, sharded on a 2x2 mesh,
             and the flat path's relayout copies for comparison
    sharded  ShardedPallasZeroer's SPMD program on a v5e 2x2 mesh: donated, local shapes,
             no collective
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

TOPOLOGIES = ("v5e=2x2", "v6e=2x2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_check(name: str) -> str:
    """Run one check in a fresh interpreter (JAX on the CPU, no forced host devices); its stdout.

    Fails the calling test with the tail of its output if the check exits non-zero.
    """
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1")
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "tests.mosaic_compile", name]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    if r.returncode != 0:
        raise AssertionError(f"mosaic_compile {name} exited {r.returncode}:\n{(r.stdout + r.stderr)[-4000:]}")
    return r.stdout


def _tpu_devices(topology: str) -> list[Any]:
    try:
        import libtpu  # noqa: F401
    except ImportError as e:
        sys.exit(f"libtpu is not installed ({e}): pip install 'kvlayout[tpu-compile]' (scripts/test.sh does)")
    from jax.experimental import topologies

    return list(topologies.get_topology_desc(topology, platform="tpu").devices)


def check_flat() -> None:
    import kvlayout.backends.pallas as kp

    import kvlayout as K

    for topology in TOPOLOGIES:
        dev = _tpu_devices(topology)[0]
        for name in ("dsv4-test", "dsv4", "llama-8b"):
            z = kp.PallasZeroer(K.plan(K.preset(name)), kernel="tpu", interpret=False)
            lowered = z.lower(4096, dev)
            if "tf.aliasing_output = 0" not in lowered.as_text():
                sys.exit(f"{topology} {name}: the buffer is not aliased to the output")
            lowered.compile()
            print("compiled", topology, name, "fast-path" if z.plan.aligned else "rmw", flush=True)


def check_native() -> None:
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.pallas as kp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from tests.native_hlo import TPU_INFERENCE_LEAVES, cache_leaf_facts, evidence

    caches = [jax.ShapeDtypeStruct(s, jnp.dtype(d)) for s, d in TPU_INFERENCE_LEAVES]
    for topology in TOPOLOGIES:
        dev = _tpu_devices(topology)[0]
        z = kp.CacheZeroer(caches, kernel="tpu", interpret=False)
        lowered = z.lower(4096, dev)
        if lowered.as_text().count("tf.aliasing_output") != len(caches):
            sys.exit(f"{topology}: a leaf is not donated")
        facts = cache_leaf_facts(lowered.compile().as_text(), len(caches))
        print("compiled", topology, facts, flush=True)
        # every other path: rank-2 rmw (bf16, uint8 with a tail group, fp8), rank-2 row (f32),
        # pages in chunks (a 4 KiB tile budget) along a tiled (rank 3) and an untiled first axis
        odd = [
            ((72, 1024), "bfloat16"),
            ((72, 512), "uint8"),
            ((72, 640), "float8_e4m3fn"),
            ((72, 200), "float32"),
            ((72, 64, 256), "uint8"),
            ((72, 6, 2, 2, 128), "bfloat16"),
        ]
        leaves = [jax.ShapeDtypeStruct(s, jnp.dtype(d)) for s, d in odd]
        zo = kp.CacheZeroer(leaves, kernel="tpu", interpret=False, tile_bytes=4096)
        plan = kp.native_kernels.plan_tpu(odd, tile_bytes=4096)
        kinds = sorted({(lp.kind, len(lp.chunks) > 1) for lp in plan.leaves})
        facts = cache_leaf_facts(zo.lower(64, dev).compile().as_text(), len(odd))
        print("odd", topology, kinds, facts, flush=True)
    mesh = Mesh(np.array(_tpu_devices("v5e=2x2")).reshape(2, 2), ("dp", "tp"))
    heads, pages, whole = P("dp", None, "tp", None, None), P("dp"), P(None, None, "tp")
    specs = [heads, heads, pages, pages, pages, P(None, None, "tp", None, None), whole]
    z = kp.CacheZeroer(caches, mesh=mesh, partition_specs=specs, kernel="tpu", interpret=False)
    hlo = z.lower(4096).compile().as_text()
    ops = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
    collectives = [op for op in ops if op in hlo]
    local = "bf16[512,64,2,2,128]" in hlo  # each device holds its own shard only
    print("sharded", cache_leaf_facts(hlo, len(caches)), collectives, local, flush=True)
    e = evidence("v5e=2x2")
    flat, native, cache = e["flat"], e["native"], e["cache_bytes"]
    print("flat", sorted(flat["forbidden_ops"]), flat["temp_size_in_bytes"] // cache, flush=True)
    print("native", native["forbidden_ops"], native["temp_size_in_bytes"] < cache // 16, flush=True)


def check_sharded() -> None:
    import kvlayout.backends.pallas as kp
    import numpy as np
    from jax.sharding import Mesh

    import kvlayout as K
    from kvlayout.sharding import shard_spec

    mesh = Mesh(np.array(_tpu_devices("v5e=2x2")).reshape(2, 2), ("dp", "tp"))
    cases = {
        "block_sharded dsv4-test": shard_spec(
            K.preset("dsv4-test"), {"dp": 2, "tp": 2}, block_axes=("dp",), head_axes=("tp",)
        ),
        "replicated llama-8b": shard_spec(K.preset("llama-8b"), {"dp": 2, "tp": 2}, head_axes=("tp",)),
    }
    collectives = ("all-gather", "all-reduce", "all-to-all", "collective-permute")
    for name, lay in cases.items():
        z = kp.ShardedPallasZeroer(lay, mesh, kernel="tpu", interpret=False)
        lowered = z.lower(4096)
        hlo = lowered.compile().as_text()
        problems = [
            why
            for why, bad in (
                ("buffer not donated", "jax.buffer_donor = true" not in lowered.as_text()),
                ("buffer not aliased to the output", "input_output_alias={ {0}: (0, {}" not in hlo),
                ("a device sees more than its own shard", f"s32[{z.shard_rows},128]" not in hlo),
                ("collective in the program", any(op in hlo for op in collectives)),
            )
            if bad
        ]
        if problems:
            sys.exit(f"{name}: {'; '.join(problems)}")
        print("compiled", name, lay.mode, z.buffer_shape, flush=True)


CHECKS: dict[str, Callable[[], None]] = {"flat": check_flat, "native": check_native, "sharded": check_sharded}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CHECKS:
        sys.exit(f"usage: python -m tests.mosaic_compile {{{','.join(CHECKS)}}}")
    CHECKS[sys.argv[1]]()
