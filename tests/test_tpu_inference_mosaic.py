"""The zeroer over tpu-inference's arrays, compiled for a v6e 2x4 slice by the real TPU compiler (issue 24).

The shapes and PartitionSpecs are kvlayout's ``engine="tpu-inference"`` spec, which
tests/test_tpu_inference_truth.py checks against tpu-inference 0.32.0's own allocation: Llama-3.1-8B
bf16 and DeepSeek-V3 MLA on its 2-D mesh (data 2 x model 4), and Llama on its 7-axis mesh with
dcp 2 (model 4). For each, the jitted donated step is lowered on a deviceless v6e topology (libtpu,
no TPU) and compiled; the optimised HLO must alias every leaf to its output, run one custom call
(the Pallas kernel), and hold no copy, relayout or collective. ``python -m
tests.test_tpu_inference_mosaic`` runs the compile in a fresh interpreter (JAX on the CPU without
forced host devices) and prints one JSON line per program, which the test reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPOLOGY = "v6e=2x4"
#: (name, fixture, from_config options): the arrays compiled
PROGRAMS: list[tuple[str, str, dict[str, Any]]] = [
    ("llama-8b bf16, data 2 x model 4", "llama", {"tp": 4, "dp": 2, "block_size": 16}),
    ("deepseek-v3 MLA bf16, data 2 x model 4", "deepseek_v3", {"tp": 4, "dp": 2, "block_size": 64}),
    ("llama-8b bf16, 7-axis mesh model 4 x dcp 2", "llama", {"tp": 4, "dcp": 2, "block_size": 16}),
]
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


def compile_programs() -> None:
    """In the subprocess: lower and compile each program, print its facts as JSON."""
    import jax
    import jax.numpy as jnp
    import kvlayout.backends.pallas as kp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import kvlayout.models as M
    from tests.native_hlo import cache_leaf_facts

    devices = np.array(topologies.get_topology_desc(TOPOLOGY, platform="tpu").devices)
    for name, fixture, options in PROGRAMS:
        ms = M.from_config(
            os.path.join(ROOT, "tests", "fixtures", "models", fixture, "config.json"),
            engine="tpu-inference",
            num_blocks=512,
            **options,
        )
        assert isinstance(ms, M.NativeModelSpec) and ms.mesh is not None
        mesh = Mesh(devices.reshape(tuple(ms.mesh.values())), tuple(ms.mesh))
        specs = [P(*s) for s in ms.partition_specs]
        caches = [
            jax.ShapeDtypeStruct(leaf.shape, jnp.dtype(leaf.dtype), sharding=NamedSharding(mesh, s))
            for leaf, s in zip(ms.spec.leaves, specs)
        ]
        z = kp.CacheZeroer(caches, mesh=mesh, spec=ms.spec, kernel="tpu", interpret=False)
        lowered = z.lower(1024)
        text = lowered.as_text()  # a donated leaf: aliased to an output, or a buffer donor under a mesh
        donated = text.count("tf.aliasing_output") + text.count("jax.buffer_donor = true")
        hlo = lowered.compile().as_text()
        facts = cache_leaf_facts(hlo, len(caches))
        local = [tuple(s) for s in z.local_shapes[:1]]
        print(
            json.dumps(
                {
                    "name": name,
                    "leaves": len(caches),
                    "donated": donated,
                    **facts,
                    "collectives": [op for op in COLLECTIVES if op in hlo],
                    "local_shape": local[0],
                    "global_shape": ms.spec.leaves[0].shape,
                    "spec": [list(x) if isinstance(x, tuple) else x for x in ms.partition_specs[0]],
                }
            ),
            flush=True,
        )


def test_zeroer_compiles_for_v6e_on_tpu_inference_arrays() -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1")
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "tests.test_tpu_inference_mosaic"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert [x["name"] for x in rows] == [p[0] for p in PROGRAMS]
    for x in rows:
        n = x["leaves"]
        assert x["donated"] == n and x["aliased"] == n, x  # every leaf donated and aliased in place
        assert x["custom_calls"] == 1 and x["touched"] == [] and x["forbidden_ops"] == [], x
        assert x["collectives"] == [], x
    llama, mla, dcp = rows
    # each chip holds its shard: pages over data 2, heads over model 4 (8 KV heads -> 2 rows of 2 each)
    assert llama["global_shape"] == [512, 16, 8, 2, 128] and llama["local_shape"] == [256, 16, 2, 2, 128]
    assert mla["global_shape"] == [512, 2, 32, 640] and mla["local_shape"] == [256, 2, 32, 640]
    # dcp 2: the page-token axis holds 32 tokens, 16 on each dcp shard
    assert dcp["global_shape"] == [512, 32, 8, 2, 128] and dcp["local_shape"] == [512, 16, 2, 2, 128]
    assert dcp["spec"] == [["data", "attn_dp", "attn_dp_expert"], ["pcp", "dcp"], ["model", "expert"]]


if __name__ == "__main__":
    compile_programs()
