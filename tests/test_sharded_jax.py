"""JAX path of sharded zeroing: the 8-device mesh cases, a 1-device mesh, and Mosaic compilation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kvlayout as K
from kvlayout.sharding import shard_spec

jax = pytest.importorskip("jax")
kp = pytest.importorskip("kvlayout.backends.pallas")
import jax.numpy as jnp  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _reset_interpreter() -> Iterator[None]:
    yield
    pltpu.reset_tpu_interpret_mode_state()


@pytest.mark.parametrize("mode", ["replicated", "block_sharded"])
def test_one_device_mesh_both_modes(mode: str) -> None:
    """The shape the one-GPU run uses: a 1-device mesh (cpu:0 is fine when it is the only device)."""
    axes = {"x": 1}
    lay = shard_spec(
        K.preset("dsv4-test").with_num_blocks(6),
        axes,
        **({"block_axes": ("x",)} if mode == "block_sharded" else {"head_axes": ("x",)}),
    )
    assert lay.mode == mode
    m = Mesh(np.array(jax.devices()[:1]), ("x",))
    z = kp.ShardedPallasZeroer(lay, m)
    data = K.poison_pattern(lay.gathered_bytes)
    buf = z(z.make_buffer(data), [1, 4, 4])
    buf = z(buf, jnp.array([5], jnp.int32))
    z.check()
    chk = lay.compare(data, z.to_host(buf), [1, 4, 5])
    assert chk.matches, chk.describe()


SHARDED_MOSAIC = textwrap.dedent(
    """
    import sys
    try:
        import libtpu  # noqa: F401
    except ImportError as e:
        sys.exit(f"libtpu is not installed ({e}): pip install 'kvlayout[tpu-compile]' (scripts/test.sh does)")
    import numpy as np
    import kvlayout as K, kvlayout.backends.pallas as kp
    from kvlayout.sharding import shard_spec
    from jax.experimental import topologies
    from jax.sharding import Mesh
    devs = topologies.get_topology_desc("v5e=2x2", platform="tpu").devices
    mesh = Mesh(np.array(devs).reshape(2, 2), ("dp", "tp"))
    cases = {
        "block_sharded dsv4-test": shard_spec(
            K.preset("dsv4-test"), {"dp": 2, "tp": 2}, block_axes=("dp",), head_axes=("tp",)
        ),
        "replicated llama-8b": shard_spec(K.preset("llama-8b"), {"dp": 2, "tp": 2}, head_axes=("tp",)),
    }
    for name, lay in cases.items():
        z = kp.ShardedPallasZeroer(lay, mesh, kernel="tpu", interpret=False)
        lowered = z.lower(4096)
        assert "jax.buffer_donor = true" in lowered.as_text(), "buffer not donated"
        hlo = lowered.compile().as_text()
        assert "input_output_alias={ {0}: (0, {}" in hlo, "buffer not aliased to the output"
        assert f"s32[{z.shard_rows},128]" in hlo, "each device must see only its own shard"
        collectives = ("all-gather", "all-reduce", "all-to-all", "collective-permute")
        assert not any(op in hlo for op in collectives), "collective in the program"
        print("compiled", name, lay.mode, z.buffer_shape, flush=True)
    """
)


def test_sharded_mosaic_compiles_for_a_v5e_2x2_mesh() -> None:
    """The whole SPMD program (shard_map + TPU kernel) through the real TPU compiler, no collectives."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run(
        [sys.executable, "-c", SHARDED_MOSAIC], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("compiled")]
    assert len(lines) == 2, r.stdout
