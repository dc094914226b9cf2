"""tpu-inference 0.32.0's native per-layer arrays for a config (GEOMETRY.md section 9, kvlayout.native).

``from_config(config, engine="tpu-inference", tp=..., dp=..., dcp=..., ...)`` gives the list of
global ``jax.Array`` s that tpu-inference's runner allocates (``runner.kv_caches``), each with
its shape, dtype, ``PartitionSpec`` and the cache groups of the layers that use it. The rules,
read from tpu-inference 0.32.0 (paths under ``tpu_inference/``) and checked against its own code
on forced CPU devices by tests/test_tpu_inference_truth.py:

- Mesh: ``dp`` x ``tp`` on its 2-D mesh ``(data, model)``; with ``dcp > 1`` its 7-axis mesh
  ``(data, attn_dp, attn_dp_expert, expert, model, dcp, pcp)`` (``layers/common/sharding.py``:
  ``ShardingAxisName2D`` / ``ShardingAxisNameBase``). Arrays are sharded
  ``P(BATCH, KV_CONTEXT, KV_HEAD)`` (MLA: ``P(BATCH, KV_CONTEXT)``): pages over the data axes,
  the page-token axis over dcp, heads over the model axis (``runner/kv_cache.py``).
- Model implementation (``MODEL_IMPL_TYPE``; ``models/common/model_loader.py``): ``auto`` runs
  tpu-inference's own JAX model (``flax_nnx``) for Llama, Qwen2, Qwen3 and DeepSeek-V3, vLLM's
  model (``vllm``) for GPT-OSS (preferred) and every architecture it has no JAX model for. Under
  ``flax_nnx`` every layer is full attention (``layer.{i}``, no sliding window): one group, one
  array per layer. Under ``vllm`` the layers keep vLLM's names and sliding windows, vLLM groups
  them, and layers of different groups at the same position in their groups share one array
  (``KVCacheManager.initialize_kv_cache``: one array per physical slot).
- KV heads (``KVCacheManager.get_kv_cache_spec``, ``utils.get_padded_num_heads``): padded up to
  the attention-head shard count when fewer (it must divide them, or they it); that count is the
  ``model`` axis (7-axis ``flax_nnx``: ``model * expert * dcp``). Head size: 64 stays 64, others
  are padded to a multiple of 128 (``get_padded_head_dim``).
- Attention array (``get_kv_cache_shape_with_mesh`` with ragged paged attention v3): one shard's
  ``h = heads / tp`` heads give ``(pages, page_size * dcp, align(2 * h, p) // p, p,
  align(head_dim, 128))``, ``p = 32 // dtype bits``, then the head axis is multiplied by ``tp``;
  head size 64 packs K and V in one 128-lane row: ``(..., align(h, p) // p, p, 128)``
  (``kernel_hd64.py``).
- MLA array (``kernels/mla/v2/kernel.py``, ``get_kv_cache_shape``): head ``align(kv_lora_rank,
  128) + align(qk_rope_head_dim, 128)`` (RoPE unpadded with ``MLA_TRANSPOSE_KV_CACHE``);
  ``(pages, align(T, k) // k, k, align(head, 128))`` with ``T = page_size * dcp`` and
  ``k = MLA_KV_PACKING_SIZE`` (default 32); transposed ``(pages, head, T)`` (``T`` a multiple
  of 128).
- Page size when not given (``platforms/tpu_platform.py``): MLA 1,024 tokens
  (``PallasMLAttentionBackend.get_page_size``); attention ``next_power_of_2(max_model_len) //
  16`` clamped to [16, 256] (16 when ``max_model_len > 8192``), raised to ``next_power_of_2(
  ceil(max_model_len / (2**17 // max_num_seqs)))`` (``get_min_page_size``).
- Pages: the data axes shard them, so ``num_blocks`` must be a multiple of ``dp``.

Options are explicit parameters (never environment variables read here): ``model_impl``,
``max_model_len``, ``max_num_seqs``, ``mla_transpose_kv_cache``, ``mla_kv_packing_size``,
``batched_rpa`` (``USE_BATCHED_RPA_KERNEL``: its default layout has the same shape, with the
TPU's 128 lanes). Not modelled: DeepSeek-V3.2/V4 (refused: their indexer, window and compressed
caches have arrays of their own, ``_initialize_ds_v4_kv_cache``), and, with no parameter here,
``USE_BATCHED_RPA_SEQ_ON_LANE`` (another axis order: ``(pages, 2 * heads, head_dim / packing,
packing, page_size)``), pcp > 1, attention data parallelism (``attn_dp``), expert axes and
speculative-decoding draft layers. Hybrids (Mamba, gated delta net) are given as
tpu-inference's ``duplicate_shared_layers`` path allocates them, one array per attention layer at
its page size (no vLLM hybrid alignment), named by layer because ``runner.kv_caches`` also holds
the Mamba state tuples (per request slot, their own leading size, never zeroed by block id); this
path is outside the CI battery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import spec_error
from ..native import NativeCacheSpec, NativeLeaf
from ..sharding import MAX_MESH_DEVICES
from ..spec import DTYPE_SIZES, FullAttentionSpec, LayerSpec, MambaSpec, MLASpec
from ..validate import is_int
from .base import DEFAULT_NUM_BLOCKS, fmt_int
from .build import build
from .config import MAX_CONFIG_INT
from .families import VL_WRAPPERS
from .hybrid import MAMBA_ONLY
from .registry_vllm import TRANSFORMERS_BACKEND

#: tpu-inference pads the head size of its attention and MLA arrays to the TPU lane width.
TPU_LANES = 128
#: ``MLA_KV_PACKING_SIZE``'s default: tokens packed per MLA sublane group.
MLA_KV_PACKING = 32
#: ``PallasMLAttentionBackend.get_page_size``: tokens per MLA page when none is given.
MLA_PAGE_SIZE = 1024
#: vLLM's ``max_num_seqs`` default off GPUs (``engine/arg_utils.py``), which sizes the minimum page.
DEFAULT_MAX_NUM_SEQS = 256
#: ``get_min_page_size`` divides by ``2**17 // max_num_seqs`` (pages a request may hold in half of SMEM).
MAX_NUM_SEQS = 2**17
MODEL_IMPLS = ("auto", "flax_nnx", "vllm")
#: Architectures tpu-inference 0.32.0 has its own JAX model for, among kvlayout's, and runs as
#: such under ``MODEL_IMPL_TYPE=auto`` (GPT-OSS has one but prefers vLLM's).
JAX_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "DeepseekV3ForCausalLM")
#: The mesh axes of tpu-inference's 2-D and 7-axis meshes.
MESH_2D = ("data", "model")
MESH_7 = ("data", "attn_dp", "attn_dp_expert", "expert", "model", "dcp", "pcp")

#: A PartitionSpec as plain data: one entry per array dimension (None, an axis, or a tuple of axes).
PSpec = tuple[Any, ...]


@dataclass(frozen=True)
class NativeModelSpec:
    """tpu-inference's cache for a config: typed per-layer arrays (GEOMETRY.md section 9)."""

    spec: NativeCacheSpec
    architecture: str
    family: str
    engine: str
    tp: int
    dtype: str
    kv_cache_dtype: str
    block_size: int  # tokens per page per device (the array's page-token axis holds block_size * dcp)
    kinds: Mapping[str, str]  # layer name -> kind label
    shared_by: Mapping[str, tuple[str, ...]]  # array (leaf) name -> the layers that use it
    notes: tuple[str, ...] = ()
    mesh: Mapping[str, int] | None = None  # tpu-inference's mesh: axis name -> size
    partition_specs: tuple[PSpec, ...] = ()  # per leaf, tpu-inference's PartitionSpec
    model_impl: str = "flax_nnx"
    groups: Mapping[str, tuple[str, ...]] | None = None  # group name -> its layers, in vLLM's group order

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one page over every array (the whole mesh): what one block id takes."""
        return sum(leaf.page_bytes for leaf in self.spec.leaves)

    @property
    def blocks_per_gib(self) -> int:
        return 2**30 // self.bytes_per_block

    def layer_to_array(self) -> dict[str, int]:
        """Layer name -> index in ``runner.kv_caches`` (tpu-inference's ``layer_name_to_kvcache_index``)."""
        return {layer: i for i, leaf in enumerate(self.spec.leaves) for layer in self.shared_by[leaf.name]}


def align(x: int, a: int) -> int:
    return -(-x // a) * a


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _pos_int(field: str, v: object) -> int:
    if not is_int(v) or not 1 <= int(v) <= MAX_CONFIG_INT:  # type: ignore[call-overload]
        raise spec_error(field, v, "must be a positive integer, at most 2**53")
    return int(v)  # type: ignore[call-overload]


def _bool(field: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise spec_error(field, v, "must be True or False")
    return v


@dataclass(frozen=True)
class TpuOptions:
    """The deployment choices that change tpu-inference's arrays (module docstring)."""

    tp: int = 1
    dp: int = 1
    dcp: int = 1
    model_impl: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    mla_transpose_kv_cache: bool = False
    mla_kv_packing_size: int = MLA_KV_PACKING
    batched_rpa: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "dcp", "max_num_seqs", "mla_kv_packing_size"):
            _pos_int(name, getattr(self, name))
        devices = self.dp * self.tp * self.dcp
        if devices > MAX_MESH_DEVICES:  # as kvlayout.sharding bounds a mesh
            raise spec_error("dp * tp * dcp", devices, f"a mesh has at most {MAX_MESH_DEVICES:,} devices")
        if self.max_model_len is not None:
            _pos_int("max_model_len", self.max_model_len)
        if self.max_num_seqs > MAX_NUM_SEQS:
            why = f"at most {MAX_NUM_SEQS:,}: tpu-inference's minimum page divides by 2**17 // max_num_seqs"
            raise spec_error("max_num_seqs", self.max_num_seqs, why)
        if self.model_impl not in MODEL_IMPLS:
            raise spec_error("model_impl", self.model_impl, f"valid: {', '.join(MODEL_IMPLS)}")
        _bool("mla_transpose_kv_cache", self.mla_transpose_kv_cache)
        _bool("batched_rpa", self.batched_rpa)

    @property
    def seven_axes(self) -> bool:
        return self.dcp > 1

    @property
    def mesh(self) -> dict[str, int]:
        if not self.seven_axes:
            return {"data": self.dp, "model": self.tp}
        sizes = {"data": self.dp, "model": self.tp, "dcp": self.dcp}
        return {a: sizes.get(a, 1) for a in MESH_7}

    def pspec(self, mla: bool) -> PSpec:
        """``P(BATCH, KV_CONTEXT[, KV_HEAD])`` in this mesh's axis names (runner/kv_cache.py)."""
        if self.seven_axes:
            batch, context, heads = ("data", "attn_dp", "attn_dp_expert"), ("pcp", "dcp"), ("model", "expert")
            return (batch, context) if mla else (batch, context, heads)
        return ("data", None) if mla else ("data", None, "model")

    def head_shards(self, impl: str) -> int:
        """The count KV heads are padded to a multiple of (``ATTN_HEAD``; the vLLM path: ``model``)."""
        return self.tp * self.dcp if self.seven_axes and impl == "flax_nnx" else self.tp


def default_page_size(mla: bool, max_model_len: int, max_num_seqs: int) -> int:
    """tpu-inference's page size when none is given (module docstring)."""
    if mla:
        return MLA_PAGE_SIZE
    page = 16 if max_model_len > 8192 else min(max(_next_pow2(max_model_len) // 16, 16), 256)
    per_req = 1024 * 1024 // 2 // max_num_seqs // 4
    return max(page, _next_pow2(-(-max_model_len // per_req)))


def _padded_heads(kv_heads: int, shards: int, field: str) -> int:
    """``get_padded_num_heads``: KV heads replicated up to ``shards`` (``field``: tp or tp * dcp)."""
    if kv_heads >= shards:
        if kv_heads % shards:
            raise spec_error(
                field, shards, f"does not divide the {kv_heads} KV heads (tpu-inference asserts it)"
            )
        return kv_heads
    if shards % kv_heads:
        raise spec_error(
            field, shards, f"is not a multiple of the {kv_heads} KV heads (tpu-inference asserts it)"
        )
    return shards


def attention_array_page(
    kv_heads: int, head_size: int, dtype: str, o: TpuOptions, page_size: int, impl: str
) -> tuple[int, ...]:
    """One page of an attention array over the whole mesh (``get_kv_cache_shape_with_mesh``)."""
    shards = o.head_shards(impl)
    heads = _padded_heads(kv_heads, shards, "tp" if shards == o.tp else "tp * dcp")
    head_dim = head_size if head_size == 64 else align(head_size, TPU_LANES)
    if heads % o.tp:
        raise spec_error(
            "tp", o.tp, f"does not divide the {heads} padded KV heads (tpu-inference asserts it)"
        )
    shard = heads // o.tp
    packing = 4 // DTYPE_SIZES[dtype]  # 32 bits // dtype bits
    tokens = page_size * o.dcp
    if head_dim == 64:  # kernel_hd64: K and V share one 128-lane row
        return (tokens, align(shard, packing) // packing * o.tp, packing, TPU_LANES)
    return (tokens, align(2 * shard, packing) // packing * o.tp, packing, align(head_dim, TPU_LANES))


def mla_array_page(rank: int, rope: int, o: TpuOptions, page_size: int) -> tuple[int, ...]:
    """One page of an MLA array (``mla.v2.get_kv_cache_shape``)."""
    head = align(rank, TPU_LANES) + (rope if o.mla_transpose_kv_cache else align(rope, TPU_LANES))
    tokens = page_size * o.dcp
    if o.mla_transpose_kv_cache:
        if tokens % TPU_LANES:
            why = (
                f"MLA_TRANSPOSE_KV_CACHE needs pages of a multiple of 128 tokens (page_size * dcp = {tokens})"
            )
            raise spec_error("block_size", page_size, why)
        return (head, tokens)
    k = o.mla_kv_packing_size
    return (align(tokens, k) // k, k, align(head, TPU_LANES))


def _impl(arch: str, family: str, model_impl: str) -> str:
    if model_impl != "auto":
        return model_impl
    return "flax_nnx" if arch in JAX_ARCHITECTURES else "vllm"


def tpu_inference_from_config(
    config: Mapping[str, Any] | str | Path,
    *,
    tp: int = 1,
    dtype: str | None = None,
    kv_cache_dtype: str | None = None,
    block_size: int | None = None,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    mamba_ssm_cache_dtype: str | None = None,
    reader: str = "auto",
    dp: int = 1,
    dcp: int = 1,
    model_impl: str = "auto",
    max_model_len: int | None = None,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    mla_transpose_kv_cache: bool = False,
    mla_kv_packing_size: int = MLA_KV_PACKING,
    batched_rpa: bool = False,
) -> NativeModelSpec:
    """tpu-inference's ``runner.kv_caches`` for ``config`` on a ``dp`` x ``tp`` (x ``dcp``) mesh."""
    o = TpuOptions(
        tp,
        dp,
        dcp,
        model_impl,
        max_model_len,
        max_num_seqs,
        mla_transpose_kv_cache,
        mla_kv_packing_size,
        batched_rpa,
    )
    if not is_int(num_blocks) or int(num_blocks) < 0:
        raise spec_error("num_blocks", num_blocks, "must be a non-negative integer")
    nb = int(num_blocks)
    if nb % dp:
        raise spec_error(
            "num_blocks", num_blocks, f"must be a multiple of dp = {dp}: the data axis shards the pages"
        )
    # vLLM's reading of the config, unsharded (tpu-inference shards the global arrays itself)
    probe, c = build(
        config, 1, dtype, kv_cache_dtype, block_size, max(nb, 1), mamba_ssm_cache_dtype, reader=reader
    )
    if probe.family in ("deepseek_v32", "deepseek_v4"):
        why = (
            "tpu-inference's arrays for the DeepSeek-V3.2/V4 indexer, window and compressed caches are not "
            "modeled"
        )
        raise spec_error("engine", "tpu-inference", why)
    if probe.family in ("gemma4", "mimo_v2"):
        why = (
            f"tpu-inference's arrays for {probe.architecture}'s layers of different shapes are not modeled "
            "(vLLM unifies their pages; what tpu-inference allocates for them is not read here)"
        )
        raise spec_error("engine", "tpu-inference", why)
    if probe.architecture in TRANSFORMERS_BACKEND:
        why = (
            f"tpu-inference's arrays for {probe.architecture}, which vLLM serves through its Transformers "
            "modeling backend, are not checked against its code (vLLM's are: plan with engine vllm)"
        )
        raise spec_error("engine", "tpu-inference", why)
    if probe.architecture in (*VL_WRAPPERS, "KimiK25ForConditionalGeneration"):
        why = (
            f"tpu-inference's arrays for the multimodal {probe.architecture} are not checked against its "
            "code (vLLM's are: plan with engine vllm)"
        )
        raise spec_error("engine", "tpu-inference", why)
    checked = (
        "nemotron_nas", "plamo3", "domyn_edge", "iquest_loopcoder", "beam", "step1", "rnj1", "flint",
        "openpangu", "hrm_text", "dory", "inkling", "longcat_flash", "kimi_linear", "alice_ai",
        "bailing_moe_v3",
    )
    if probe.family in checked:
        what = {
            "nemotron_nas": "per-layer KV heads and no-op layers",
            "plamo3": "per-layer windows",
            "domyn_edge": "per-layer head sizes and windows",
            "iquest_loopcoder": "attention loops",
            "beam": "BeamConfig's per-layer windows",
            "step1": "ALiBi layers",
            "rnj1": "chunked layers",
            "flint": "sink layers",
            "openpangu": "per-layer windows",
            "hrm_text": "recurrent stacks",
            "dory": "recurrent loops",
            "inkling": "short-conv states beside attention",
            "longcat_flash": "two MLA attentions per decoder layer",
            "kimi_linear": "KDA states beside MLA layers",
            "alice_ai": "KDA states beside gated attention",
            "bailing_moe_v3": "KDA states beside MLA layers",
        }[probe.family]
        why = (
            f"tpu-inference's arrays for {probe.architecture}'s {what} are not checked against its code "
            "(vLLM's are: plan with engine vllm)"
        )
        raise spec_error("engine", "tpu-inference", why)
    if probe.family == "gemma3n":
        why = "tpu-inference's arrays for Gemma 3n's layers that read earlier layers' caches are not modeled"
        raise spec_error("engine", "tpu-inference", why)
    if probe.family in MAMBA_ONLY or all(isinstance(x, MambaSpec) for _, x in probe.spec.layers):  # no
        # attention layer (an empty leaf list was refused inside: issue 25, passes 20 and 21)
        why = f"tpu-inference's arrays for {probe.architecture} without an attention layer are not read"
        raise spec_error("engine", "tpu-inference", why)
    hybrid = any(isinstance(x, MambaSpec) for _, x in probe.spec.layers)
    mla = c.mla_dims is not None
    notes: list[str] = []
    if block_size is None:
        if max_model_len is None and not mla:
            max_model_len = c.cfg.req_int(
                "max_position_embeddings",
                "tpu-inference's default page size follows max_model_len (or pass it)",
            )
            notes.append(f"max_model_len {max_model_len:,} from max_position_embeddings (pass max_model_len)")
        page_size: int = default_page_size(mla, max_model_len or 0, max_num_seqs)
        notes.append(
            f"page size {page_size}: tpu-inference's default"
            + ("" if mla else f" for max_model_len {max_model_len:,}")
        )
        probe, c = build(
            config, 1, dtype, kv_cache_dtype, page_size, max(nb, 1), mamba_ssm_cache_dtype, reader=reader
        )
    else:
        page_size = probe.block_size if not hybrid else int(block_size)
    ms = probe
    impl = _impl(ms.architecture, ms.family, model_impl)
    notes += [x for x in ms.notes if "block_size" not in x and not x.startswith("hybrid:")]
    groups = [list(g.layers) for g in ms.spec.groups]
    names = [g.name for g in ms.spec.groups]
    o_pspec = o.pspec(mla)

    def page(layer: LayerSpec) -> tuple[tuple[int, ...], str]:
        # a hybrid's pages stay tpu-inference's (vLLM's hybrid alignment is not applied there)
        if isinstance(layer, MLASpec) and c.mla_dims is not None and layer.dtype is not None:
            return mla_array_page(*c.mla_dims, o, page_size if hybrid else layer.block_size), layer.dtype
        if isinstance(layer, FullAttentionSpec):
            tokens = page_size if hybrid else layer.block_size
            return attention_array_page(
                layer.num_kv_heads, layer.head_size, layer.dtype, o, tokens, impl
            ), layer.dtype
        raise spec_error("engine", "tpu-inference", f"no native array known for {layer.where}")

    # (array name, its layers with their group names)
    slots: list[list[tuple[str, LayerSpec, str]]] = []
    if hybrid:  # duplicate_shared_layers: each attention layer its own array; Mamba tuples elsewhere
        slots = [
            [(x.name, x, names[i])] for i, g in enumerate(groups) for x in g if not isinstance(x, MambaSpec)
        ]
        kinds = dict(ms.kinds)
        group_layers = {
            n: tuple(x.name for x in g if not isinstance(x, MambaSpec))
            for n, g in zip(names, groups)
            if any(not isinstance(x, MambaSpec) for x in g)
        }
        notes.append(
            "hybrid: one array per attention layer (named by layer: runner.kv_caches also holds the Mamba "
            "state tuples, per request slot, never zeroed by block id); not checked against tpu-inference's "
            "own code"
        )
    elif impl == "flax_nnx":  # every layer full attention, one group, one array per layer
        layers = [x for _, x in ms.spec.layers]
        only = "mla" if mla else "full"
        slots = [[(f"layer.{i}", x, only)] for i, x in enumerate(layers)]
        kinds = {f"layer.{i}": only for i in range(len(layers))}
        group_layers = {only: tuple(kinds)}
    else:  # vLLM's groups; the j-th layer of every group shares one physical slot
        for j in range(max(len(g) for g in groups)):
            slots.append([(g[j].name, g[j], names[i]) for i, g in enumerate(groups) if j < len(g)])
        kinds = dict(ms.kinds)
        group_layers = {n: tuple(x.name for x in g) for n, g in zip(names, groups) if g}
    leaves, shared, specs = [], {}, []
    for j, slot in enumerate(slots):
        shapes = {page(layer) for _, layer, _ in slot}
        if len(shapes) != 1:
            raise spec_error(
                "engine", "tpu-inference", f"the layers of array {j} need different arrays: {shapes}"
            )
        (shape, dt) = shapes.pop()
        owners = tuple(dict.fromkeys(g for _, _, g in slot))
        name = slot[0][0] if hybrid else f"kv_caches[{j}]"
        leaves.append(NativeLeaf(name, (nb, *shape), dt, owners[0] if len(owners) == 1 else owners))
        shared[name] = tuple(n for n, _, _ in slot)
        specs.append(o_pspec if len(shape) + 1 >= len(o_pspec) else o_pspec[: len(shape) + 1])
    return NativeModelSpec(
        NativeCacheSpec(tuple(leaves)),
        ms.architecture,
        ms.family,
        "tpu-inference",
        tp,
        ms.dtype,
        ms.kv_cache_dtype,
        page_size,
        kinds,
        shared,
        tuple(notes),
        o.mesh,
        tuple(specs),
        impl,
        group_layers,
    )


def native_summary(ms: NativeModelSpec, *, proof: bool) -> str:
    spec = ms.spec
    pages = f"{len(spec.leaves)} arrays of {spec.num_blocks} pages (GEOMETRY.md section 9)"
    lines = [
        f"{ms.architecture} ({ms.family}) on {ms.engine}, tp {ms.tp} (the global arrays of the mesh)",
        f"dtype {ms.dtype}, KV cache {ms.kv_cache_dtype}, {ms.block_size}-token pages, {pages}",
        *(f"note: {x}" for x in ms.notes),
    ]
    if ms.mesh is not None:
        mesh = " x ".join(f"{a}={n}" for a, n in ms.mesh.items() if n > 1) or "one device"
        lines.append(f"model implementation {ms.model_impl}; mesh {mesh} (global arrays, sharded)")
    lines.append(
        f"  {'kind':<20} {'arrays':>6} {'layers':>6}  {'page shape':<24} {'dtype':<14} {'page B':>12}"
    )
    per_kind: dict[tuple[str, int, tuple[int, ...], str, int], int] = {}
    for leaf in spec.leaves:
        users = ms.shared_by[leaf.name]
        kind = "+".join(dict.fromkeys(ms.kinds[x] for x in users))
        key = (kind, len(users), leaf.page_shape, leaf.dtype, leaf.page_bytes)
        per_kind[key] = per_kind.get(key, 0) + 1
    for (kind, n_users, shape, dt, page), count in per_kind.items():
        lines.append(f"  {kind:<20} {count:>6} {n_users:>6}  {str(shape):<24} {dt:<14} {fmt_int(page):>12}")
    lines.append(
        f"bytes per block {fmt_int(ms.bytes_per_block)}; blocks per GiB {fmt_int(ms.blocks_per_gib)}"
    )
    if proof:
        from ..native import verify_native

        reports = verify_native(spec)
        bad = [name for name, r in reports.items() if not r.ok]
        verdict = "SAFE" if not bad else f"UNSAFE ({', '.join(bad[:3])})"
        lines.append(f"zeroing: {len(reports)} single-row tables (base 0, stride = span = page): {verdict}")
    return "\n".join(lines)
