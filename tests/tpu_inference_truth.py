"""tpu-inference 0.32.0's own KV-cache code as ground truth (issue 24), run as a script.

``python tests/tpu_inference_truth.py CASES.json OUT.json`` is started by
tests/test_tpu_inference_truth.py in a subprocess of its own, because:

- tpu-inference imports ``vllm`` and expects vllm-tpu 0.32.0, while the test environment holds
  vLLM 0.33.0 for the vLLM ground truth. scripts/test.sh installs tpu-inference, vllm-tpu's
  ``vllm`` package and torchax into ``.tpu-inference-deps`` (requirements-tpu-inference.txt),
  and the parent puts that directory first on ``PYTHONPATH`` (child processes that vLLM starts
  see it too);
- the meshes need 9 host devices (``XLA_FLAGS``) before JAX starts; they use devices 1..8,
  because Pallas's TPU interpret mode stages its callbacks on cpu:0 (see CacheZeroer).

Per case, tpu-inference's pipeline runs as its runner runs it: the default page size from its
attention backends (``PallasAttentionBackend.get_page_size`` / ``get_min_page_size``,
``PallasMLAttentionBackend.get_page_size``) when the case gives none,
``KVCacheManager.get_kv_cache_spec``, vLLM-tpu's ``get_kv_cache_groups`` and
``get_kv_cache_config_from_groups``, then ``KVCacheManager.initialize_kv_cache``, which calls
``create_kv_caches`` / ``get_kv_cache_shape_with_mesh`` and allocates ``runner.kv_caches``
with its shardings. Options go in as tpu-inference reads them: environment variables read on
each access (``MLA_TRANSPOSE_KV_CACHE``, ``MLA_KV_PACKING_SIZE``, ``USE_BATCHED_RPA_KERNEL``,
``NEW_MODEL_DESIGN`` for the 7-axis mesh).

What is not tpu-inference's code, and why:

- the runner is a namespace holding what ``KVCacheManager`` reads (mesh, configs, dtype); the
  model config is the Hugging Face config read by vllm-tpu's ``get_config`` with vllm-tpu's
  ``ModelConfig`` methods bound to it (``ModelConfig(...)`` itself inspects the model class in
  a child process that must import a TPU platform);
- with ``MODEL_IMPL_TYPE=vllm`` tpu-inference reads the attention layers vLLM's model
  registered (``static_forward_context``); the harness registers vLLM ``Attention`` objects
  with the fields it reads (KV heads, head size, sliding window, no KV sharing, decoder), as
  the model's layers set them in tpu-inference's one-process vLLM world (tp 1 there: JAX
  shards);
- stubs (each assumption asserted below): ``TPU_ACCELERATOR_TYPE``/``TPU_NAME``/
  ``TPU_WORKER_ID`` stop ``tpu_inference.tpu_info`` from polling the cloud metadata server
  (a guard makes any poll fail the run); torchax 0.0.13's package ``__init__`` fails under
  torch 2.13, so the package is entered without it when, and only when, it fails that way
  (``torchax.ops.mappings``, which tpu-inference's utils import, loads on its own).

Then, on those arrays (same shapes, dtypes and shardings, filled with a poison pattern),
kvlayout's ``CacheZeroer`` runs inside a jitted, donated step: the exact bytes (only the
requested pages of every array, nothing else) and every shard's buffer pointer unchanged.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from typing import Any

REQUIRED_ENV = {"TPU_ACCELERATOR_TYPE": "v6e-8", "TPU_NAME": "kvlayout-cpu", "TPU_WORKER_ID": "0"}
OPTION_ENVS = (
    "MLA_TRANSPOSE_KV_CACHE",
    "MLA_KV_PACKING_SIZE",
    "USE_BATCHED_RPA_KERNEL",
    "MODEL_IMPL_TYPE",
    "NEW_MODEL_DESIGN",
)


def _enter_torchax_without_init() -> str:
    """Import torchax; if its ``__init__`` fails as it does under torch 2.13, enter the package
    without running it (its submodules load on their own). Returns what happened."""
    import importlib.util

    try:
        import torchax  # noqa: F401

        return "torchax imported"
    except AttributeError as e:
        if "dim_Dimname" not in str(e):
            raise
        why = str(e)
    for k in [k for k in sys.modules if k == "torchax" or k.startswith("torchax.")]:
        del sys.modules[k]
    spec = importlib.util.find_spec("torchax")
    assert spec is not None and spec.submodule_search_locations, "torchax is not installed"
    pkg = types.ModuleType("torchax")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    sys.modules["torchax"] = pkg
    return f"torchax __init__ skipped ({why})"


def _setup() -> dict[str, Any]:
    for k, v in REQUIRED_ENV.items():
        os.environ[k] = v
    info: dict[str, Any] = {"torchax": _enter_torchax_without_init()}
    import jax

    assert jax.device_count() >= 9, "run with XLA_FLAGS=--xla_force_host_platform_device_count=9"
    import tpu_inference
    import tpu_inference.tpu_info as tpu_info
    import vllm

    here = os.path.dirname(os.path.abspath(tpu_inference.__file__))
    assert os.path.dirname(os.path.abspath(vllm.__file__)).startswith(os.path.dirname(here)), (
        "vllm must come from the tpu-inference deps directory",
        vllm.__file__,
        here,
    )
    assert vllm.__version__ == "0.32.0", vllm.__version__
    info["vllm"] = vllm.__version__

    def no_poll(key: str = "") -> str:
        raise AssertionError(f"tpu_info polled the metadata server for {key!r}")

    tpu_info.get_tpu_metadata = no_poll  # the env vars must make every lookup local
    assert tpu_info.get_tpu_type() == REQUIRED_ENV["TPU_ACCELERATOR_TYPE"]
    assert tpu_info.get_node_name() == REQUIRED_ENV["TPU_NAME"] and tpu_info.get_node_worker_id() == 0
    import tpu_inference.utils as tutils

    try:  # the HBM figure of initialize_kv_cache's last log line asks the TPU runtime
        tutils.hbm_usage_gb(jax.devices()[:1])
        raise AssertionError("hbm_usage_gb ran on the CPU: no stub needed")
    except RuntimeError as e:
        assert "Expected TPU devices" in str(e), e
    tutils.hbm_usage_gb = lambda devices: "n/a (CPU)"
    # the batched RPA kernel's cache shape asks the chip for its lane count: a v6e, as TPU_ACCELERATOR_TYPE
    from jax._src.pallas.mosaic import tpu_info as chip

    try:
        chip.get_tpu_info()
        raise AssertionError("pltpu.get_tpu_info answered on the CPU: no stub needed")
    except ValueError as e:
        assert "Unsupported TPU device kind: cpu" in str(e), e
    assert "cpu" not in chip.registry
    chip.registry["cpu"] = lambda: chip.get_tpu_info_for_chip(chip.ChipVersion.TPU_V6E, 1)
    info["lanes"] = chip.get_tpu_info().num_lanes
    info["zeroing"] = _zeroing_in_source(os.path.dirname(tpu_inference.__file__))
    return info


def _zeroing_in_source(pkg: str) -> dict[str, Any]:
    """Where tpu-inference zeroes its caches: the allocator's line, and every file that reads the
    scheduler's ``new_block_ids_to_zero`` (vLLM's list of recycled blocks to zero)."""
    with open(os.path.join(pkg, "runner", "kv_cache.py")) as f:
        lines = f.read().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("def _get_kv_cache_allocator("))
    zeros = next(i for i in range(start, len(lines)) if "jnp.zeros(" in lines[i])
    readers = []
    for root, _, files in os.walk(pkg):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name)) as f:
                    if "new_block_ids_to_zero" in f.read():
                        readers.append(os.path.relpath(os.path.join(root, name), pkg))
    return {"allocator_line": zeros + 1, "allocator": lines[zeros].strip(), "readers": readers}


# --------------------------------------------------------------------------- one case
def _model_config(path: str, max_model_len: int) -> Any:
    from types import SimpleNamespace as NS

    from vllm.config.model import ModelConfig
    from vllm.transformers_utils.config import get_config, get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    hf = get_config(path, trust_remote_code=False)
    text = get_hf_text_config(hf)
    arch = MODEL_ARCH_CONFIG_CONVERTORS.get(hf.model_type, ModelArchConfigConvertorBase)(hf, text).convert()
    from vllm.config.model import _get_and_verify_dtype

    dtype = _get_and_verify_dtype(path, hf, "auto", is_pooling_model=False)
    mc = NS(
        hf_config=hf,
        hf_text_config=text,
        model_arch_config=arch,
        use_mla=arch.is_deepseek_mla,
        max_model_len=max_model_len,
        dtype=str(dtype).removeprefix("torch."),
        architectures=list(hf.architectures),
        architecture=hf.architectures[0],
    )
    for name in (
        "get_head_size",
        "get_total_num_kv_heads",
        "get_num_layers",
        "get_layers_start_end_indices",
        "get_total_num_hidden_layers",
    ):
        setattr(mc, name, getattr(ModelConfig, name).__get__(mc))
    return mc


def _mesh(axes: dict[str, int]) -> Any:
    import math

    import jax
    import numpy as np
    from jax.sharding import Mesh

    devs = jax.devices()[1 : 1 + math.prod(axes.values())]
    return Mesh(np.array(devs).reshape(tuple(axes.values())), tuple(axes))


def _vllm_layers(mc: Any) -> dict[str, Any]:
    """vLLM ``Attention`` layers as the model registers them (MODEL_IMPL_TYPE=vllm)."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backend import AttentionType

    text = mc.hf_text_config
    types_ = list(getattr(text, "layer_types", None) or [])
    out = {}
    for i in range(mc.get_total_num_hidden_layers()):
        layer = Attention.__new__(Attention)
        layer.__dict__.update(
            num_kv_heads=mc.get_total_num_kv_heads(),
            head_size=mc.get_head_size(),
            sliding_window=text.sliding_window
            if i < len(types_) and types_[i] == "sliding_attention"
            else None,
            kv_sharing_target_layer_name=None,
            attn_type=AttentionType.DECODER,
        )
        out[f"model.layers.{i}.self_attn.attn"] = layer
    return out


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    from types import SimpleNamespace as NS

    import jax.numpy as jnp
    from tpu_inference.layers.common import sharding as tsh
    from tpu_inference.runner.kv_cache_manager import KVCacheManager
    from vllm.config.vllm import set_current_vllm_config
    from vllm.v1.core.kv_cache_planning import (
        _get_kv_cache_bytes_per_block,
        get_kv_cache_config_from_groups,
        get_kv_cache_groups,
    )

    t0 = time.perf_counter()
    for k in OPTION_ENVS:
        os.environ.pop(k, None)
    os.environ.update({k: str(v) for k, v in case.get("env", {}).items()})
    seven_axes = "dcp" in case["mesh"]
    if seven_axes:
        os.environ["NEW_MODEL_DESIGN"] = "1"
    tsh.ShardingAxisName._cls = None  # its lazy choice of axis names follows the env vars again
    want = tsh.ShardingAxisNameBase if seven_axes else tsh.ShardingAxisName2D
    tsh.ShardingAxisName._initialize()
    assert tsh.ShardingAxisName._cls is want
    mesh = _mesh(case["mesh"])
    mc = _model_config(case["config"], case.get("max_model_len", 4096))
    sched = NS(max_num_seqs=case.get("max_num_seqs", 128), disable_hybrid_kv_cache_manager=False)
    vc = NS(model_config=mc, scheduler_config=sched)
    defaults = {
        "attention": _backend_method("flash_attn", "PallasAttentionBackend", "get_page_size")(vc),
        "attention_min": _backend_method("flash_attn", "PallasAttentionBackend", "get_min_page_size")(vc),
        "mla": _backend_method("flash_attn_mla", "PallasMLAttentionBackend", "get_page_size")(vc),
    }
    if case.get("block_size") is not None:
        block_size = case["block_size"]
    elif mc.use_mla:
        block_size = defaults["mla"]
    else:
        block_size = max(defaults["attention"], defaults["attention_min"])
    kv = case.get("kv_cache_dtype", "auto")
    from tpu_inference.utils import to_torch_dtype

    kv_dtype = to_torch_dtype(mc.dtype if kv == "auto" else kv)  # the runner's rule (tpu_runner.py)
    impl = case.get("model_impl") or _auto_impl(mc.architecture)
    cache = NS(
        block_size=block_size,
        cache_dtype=kv,
        num_gpu_blocks_override=None,
        mamba_cache_mode="none",
        prefix_cache_retention_interval=None,
        get_resolved_kv_cache_layout=None,
    )
    vllm_config = NS(
        model_config=mc,
        cache_config=cache,
        scheduler_config=sched,
        speculative_config=None,
        compilation_config=NS(static_forward_context=_vllm_layers(mc) if impl == "vllm" else {}),
        additional_config={},
        attention_config=NS(hisparse_config=None),
        parallel_config=NS(),
        offload_config=NS(uva=NS(cpu_offload_gb=0)),
        kv_transfer_config=None,
    )
    runner = NS(
        mesh=mesh,
        cache_config=cache,
        model_config=mc,
        vllm_config=vllm_config,
        parallel_config=NS(tensor_parallel_size=1, rank=0, pipeline_parallel_size=1),
        speculative_config=None,
        kv_cache_dtype=kv_dtype,
        attention_backend=None,
        kv_caches=[],
        layer_name_to_kvcache_index={},
        max_num_reqs=case.get("max_num_seqs", 128),
        max_model_len=mc.max_model_len,
        max_num_tokens=8192,
        dp_size=1,
        persistent_batch_manager=NS(input_batch=None),
    )
    mc.get_vocab_size = lambda: 32000
    manager = KVCacheManager(runner)
    specs = manager.get_kv_cache_spec()
    layout = _resolve_layout(vllm_config, specs)  # the engine core resolves it before grouping
    cache.get_resolved_kv_cache_layout = lambda: layout
    groups = get_kv_cache_groups(vllm_config, specs)
    pages = case.get("num_blocks", 8)
    memory = _get_kv_cache_bytes_per_block(groups, layout) * pages
    config = get_kv_cache_config_from_groups(vllm_config, groups, memory)
    with set_current_vllm_config(vllm_config):
        manager.initialize_kv_cache(config)
    arrays = runner.kv_caches
    index = dict(runner.layer_name_to_kvcache_index)
    out = {
        "name": case["name"],
        "block_size": block_size,
        "model_impl": impl,
        "defaults": defaults,
        "arrays": [
            {
                "shape": list(a.shape),
                "dtype": jnp.dtype(a.dtype).name,
                "spec": [list(x) if isinstance(x, tuple) else x for x in a.sharding.spec],
            }
            for a in arrays
        ],
        "groups": [list(g.layer_names) for g in config.kv_cache_groups],
        "layer_to_array": index,
        "mesh_axes": list(mesh.axis_names),
        "create_s": round(time.perf_counter() - t0, 2),
    }
    if case.get("zero"):
        out["zero"] = _zero_check(arrays, mesh, config, index, case["zero"], case.get("zero_group"))
    out["total_s"] = round(time.perf_counter() - t0, 2)
    return out


def _backend_method(module: str, cls: str, name: str) -> Any:
    """A static method of tpu-inference's vLLM attention backends, compiled from its own source.

    Those modules import ``torchax.interop``, which needs torchax's whole package (it fails under
    torch 2.13); the page-size rules themselves are plain arithmetic, so the method's own code is
    taken from the module's file and run with the helpers it names from ``vllm.utils.math_utils``."""
    import ast

    import tpu_inference
    import vllm.utils.math_utils as mu

    origin = os.path.join(
        os.path.dirname(tpu_inference.__file__), "layers", "vllm", "backends", f"{module}.py"
    )
    with open(origin) as f:
        tree = ast.parse(f.read())
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (fn,) = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert [d.id for d in fn.decorator_list if isinstance(d, ast.Name)] == ["staticmethod"]
    fn.decorator_list = []
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    env = {k: getattr(mu, k) for k in ("cdiv", "next_power_of_2") if k in names}
    code = compile(ast.Module([fn], []), origin, "exec")
    exec(code, env)
    return env[name]


def _auto_impl(arch: str) -> str:
    """``MODEL_IMPL_TYPE=auto`` as tpu-inference resolves it (``models/common/model_loader.py``): vLLM's
    model for its preferred architectures; else its JAX model, falling back to vLLM's when it has none.
    The two lists are read from that module's source: importing it loads every JAX model (flax, qwix)."""
    import ast

    import tpu_inference

    path = os.path.join(os.path.dirname(tpu_inference.__file__), "models", "common", "model_loader.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    preferred: set[str] = set()
    registry: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AnnAssign)
            and getattr(node.target, "id", "") == "_VLLM_PREFERRED_ARCHITECTURES"
        ):
            preferred |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            t = node.targets[0]
            if getattr(t.value, "id", "") == "_MODEL_REGISTRY" and isinstance(t.slice, ast.Constant):
                registry.add(t.slice.value)
    assert "GptOssForCausalLM" in preferred and "LlamaForCausalLM" in registry, (preferred, registry)
    return "vllm" if arch in preferred or arch not in registry else "flax_nnx"


def _resolve_layout(vllm_config: Any, specs: dict[str, Any]) -> Any:
    """vLLM's layout resolution for a worker whose backends declare no layout (tpu-inference's)."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout

    vllm_config.cache_config.kv_cache_layout = None
    names = [x.name for x in get_supported_kv_cache_layouts([])]
    return resolve_kv_cache_layout(vllm_config, [names], specs.values())


# --------------------------------------------------------------------------- zeroing the real arrays
def _poisoned(arrays: list[Any], seed: int) -> list[Any]:
    """Random bits in each array's shape, dtype and sharding, made on its devices by one program."""
    import jax
    import jax.numpy as jnp

    bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}

    def make(key: Any) -> list[Any]:
        keys = jax.random.split(key, len(arrays))
        return [
            jax.lax.bitcast_convert_type(jax.random.bits(k, a.shape, bits[a.dtype.itemsize]), a.dtype)
            for k, a in zip(keys, arrays)
        ]

    return list(jax.jit(make, out_shardings=[a.sharding for a in arrays])(jax.random.key(seed)))


def _zero_check(
    arrays: list[Any], mesh: Any, config: Any, index: dict[str, int], ids: list[int], group: str | None
) -> dict[str, Any]:
    """kvlayout's CacheZeroer, through the tpu-inference adapter, on poisoned copies of tpu-inference's
    arrays (same shape, dtype and sharding) inside a jitted donated step: exact bytes (the pages of
    every array of ``group``, a tpu-inference group id, or of every array), pointers unchanged.
    The arrays of a group are read from tpu-inference's own mapping: an array is the group's when
    one of the group's layers maps to it (``layer_name_to_kvcache_index``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from kvlayout.integrations.tpu_inference import zeroer_for_runner

    # poison made on the device by a jitted program (XLA owns the buffers, as it owns tpu-inference's
    # jnp.zeros): a NumPy array put on a CPU device may be borrowed, and a borrowed buffer is copied
    # instead of donated
    caches = _poisoned(arrays, 7)
    hosts = [np.asarray(c).reshape(-1).view(np.uint8).copy() for c in caches]
    z = zeroer_for_runner(caches, config, index, mesh=mesh)
    step = jax.jit(lambda c, i: z.apply(c, i, group=group), donate_argnums=0)
    mine = set(range(len(arrays)))
    if group is not None:
        mine = {index[layer] for layer in config.kv_cache_groups[int(group)].layer_names}
    ptrs = [[s.data.unsafe_buffer_pointer() for s in c.addressable_shards] for c in caches]
    specs = [c.sharding for c in caches]
    new, bad = step(caches, jnp.asarray(ids, jnp.int32))
    jax.block_until_ready(new)
    same_ptr = all(
        [s.data.unsafe_buffer_pointer() for s in c.addressable_shards] == p for c, p in zip(new, ptrs)
    )
    exact = True
    for k, (h, a, c) in enumerate(zip(hosts, arrays, new)):
        want = h.reshape(a.shape[0], -1).copy()
        if k in mine:
            want[ids] = 0
        got = np.asarray(c).reshape(-1).view(np.uint8).reshape(a.shape[0], -1)
        exact &= bool(np.array_equal(got, want))
    return {
        "ids": ids,
        "group": group,
        "arrays_zeroed": len(mine),
        "exact": exact,
        "pointers_unchanged": same_ptr,
        "bad": int(bad),
        "shardings_unchanged": all(c.sharding == s for c, s in zip(new, specs)),
        "donated": all(c.is_deleted() for c in caches),
    }


def main() -> None:
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    t0 = time.perf_counter()
    info = _setup()
    info["import_s"] = round(time.perf_counter() - t0, 2)
    results = [run_case(c) for c in cases]
    with open(sys.argv[2], "w") as f:
        json.dump({"info": info, "cases": results}, f)


if __name__ == "__main__":
    main()
