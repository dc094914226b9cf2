"""From a Hugging Face ``config.json`` to the KV-cache layout an engine allocates (issue 17).

``spec_from_config(config, engine="vllm", tp=..., kv_cache_dtype=...)`` answers "what will
vLLM allocate for this model, and is the zeroing table safe?": it reads the config the way
vLLM does and returns a kvlayout spec with vLLM's layer names, so ``kvlayout.plan`` and
``kvlayout.verify`` apply unchanged. ``from_config`` returns the same spec with what was
decided on the way (:class:`ModelSpec`), and :func:`summary` prints it on one screen.

Every value comes from the config or from an engine rule written below; a missing field,
a field of the wrong type or an unknown architecture is a :class:`~kvlayout.SpecError`
naming the field (``config.num_key_value_heads``, ``config.text_config.head_dim``), never
a guess. The spec is the cache of **one tensor-parallel rank**.

vLLM's rules (vLLM 0.33.0, whose source the rules were read from; paths named per rule):

- Text config: a ``...ForConditionalGeneration`` config keeps the language model in
  ``text_config`` (vLLM's ``hf_text_config``); its layers are named
  ``language_model.model.layers.{i}...``, others ``model.layers.{i}...``.
- Model dtype: ``torch_dtype`` (or ``dtype``, newer transformers); vLLM's ``auto`` runs a
  float32 checkpoint in bfloat16 (the first dtype the GPU supports).
- Head size: ``head_dim``, else ``hidden_size // num_attention_heads`` (Nemotron-H:
  ``attention_head_dim``); MLA: ``kv_lora_rank + qk_rope_head_dim``. KV heads: the first of
  ``n_head_kv``, ``num_kv_heads``, ``num_key_value_heads``, ``multi_query_group_num``, else
  ``num_attention_heads``; per rank ``max(1, total // tp)`` (replicated when fewer than tp;
  ``tp`` must divide the heads or be a multiple of them); MLA keeps its one latent head.
- KV cache dtype: ``auto`` is the model dtype, ``fp8``/``fp8_e4m3`` float8_e4m3fn,
  ``fp8_e5m2`` float8_e5m2. DeepSeek-V3.2 stores an fp8 cache as ``fp8_ds_mla``, 656 B per
  token (512 fp8 + 4 fp32 scales + 64 bf16 RoPE values); DeepSeek-V4 only has an fp8 cache,
  584 B per stored token.
- Block size (tokens): 16 for standard attention (FlashAttention), 64 for MLA (FlashMLA),
  256 for DeepSeek-V4's compressed layers (its sliding-window cache has 64-token blocks and
  its compressor states 4 or 8); a hybrid gets the block of the alignment rule below.
- Sliding windows: ``layer_types`` (``sliding_attention``/``full_attention``) when the config
  has it; else Gemma 2 alternates (even layers slide), Gemma 3 slides unless
  ``(i + 1) % sliding_window_pattern == 0``, Qwen2/Qwen3 slide from ``max_window_layers`` on
  when ``use_sliding_window`` is true, Mistral slides everywhere when ``sliding_window`` is set.
- Groups (``vllm/v1/core/kv_cache_planning.py``, ``get_kv_cache_groups``; DeepSeek-V4: below): a
  model whose layers all have one spec is one group; DeepSeek V2/V3/V3.2 (every layer an MLA spec, the V3.2
  indexer included) is one group; otherwise (``_get_kv_cache_groups_uniform_page_size``)
  layers are split by spec kind, ``size`` = the fewest layers of a kind (the most, when that
  is under 1.5x the fewest), and a kind of ``n`` layers becomes ``k = ceil(n / size)`` groups
  taking every ``k``-th layer. Groups share block ids and overlay one another.
- Hybrid alignment (``Platform._align_hybrid_block_size``): with ``unit = max(16, block_size)``
  the attention block becomes ``unit * ceil(mamba_page / (unit * attention_bytes_per_token))``
  tokens, rounded up to a multiple of 16, unless the block is already that large; the Mamba page
  is padded to the attention page (``alignment``). (A FlashInfer gated-delta-net backend with
  prefix caching can ask for a coarser unit; not modeled.) Mamba states: Mamba1 (Jamba) conv
  ``(d_conv - 1, expand * hidden / tp)`` + ssm ``(expand * hidden / tp, d_state)``; Mamba2
  (Nemotron-H) conv ``(conv_kernel - 1, (heads * head_dim + 2 * n_groups * state) / tp)`` + ssm
  ``(heads / tp, head_dim, state)``; gated delta net (Qwen3-Next, Qwen3.5) conv ``(conv_kernel -
  1, (2 * k_heads * k_dim + v_heads * v_dim) / tp)`` + ssm ``(v_heads / tp, k_dim, v_dim)``.
  Conv states are in the model dtype; ssm states in ``mamba_ssm_cache_dtype`` (argument), else
  (Nemotron-H) the config's ``mamba_ssm_cache_dtype`` or float32, (Qwen3.5) the config's
  ``mamba_ssm_dtype``, else the model dtype (vLLM's ``NemotronHForCausalLMConfig`` and
  ``Qwen3_5ForConditionalGenerationConfig``).
- DeepSeek-V4 (``vllm/models/deepseek_v4/attention.py`` and ``compressor.py``,
  ``vllm/v1/attention/backends/mla/sparse_swa.py``; FlashMLA's fp8_ds_mla layout):
  ``compress_ratios[i]`` (``0``/``1``: window only, ``4``, ``128``) per layer. Every layer has a
  sliding-window MLA cache (``swa_cache``); a compressed layer has its compressed cache and its
  compressor state (``2 * coff * head_dim`` float32 values per token, ``coff = 2`` for ratio 4,
  blocks of 4 or 8 tokens); a ratio-4 layer adds the indexer cache (``index_head_dim +
  index_head_dim // 128 * 4`` bytes per stored token) and the indexer's compressor state. Every
  page is padded to 576 B.

kvlayout's choices, where the engine's layout is not one of kvlayout's:

- Layout ``packed`` for every family: the groups overlay in one block row whose stride is
  the largest group's pages (GEOMETRY.md section 2). vLLM 0.33's per-layer tensors of a
  uniform-page model (one tensor per layer slot, shared by the slot's layers of every group)
  take the same bytes per block (tests/test_models.py checks every vLLM layout: equal bytes per
  block for every family; DeepSeek-V4's mixed pages only on the block-outermost ones);
  ``packed`` is where kvlayout's table and proof apply as they are.
- DeepSeek-V4's pages differ per kind, so vLLM 0.33 groups them with its block-outermost packer
  (``_get_packed_kv_cache_groups``), reproduced here: layers fall into uniform-type buckets
  (the window cache; the compressed caches with the indexer, one block size; the ratio-4
  compressor states, window 8; the ratio-128 ones, window 128); a bucket whose pages have
  equal layer counts repeats one layer of each and is split into groups of ``r`` repeats,
  ``r`` >= the largest mixed-page bucket's repeats, chosen to pad least; the others stay whole.
  The fixture gives vLLM's five groups (window cache 22 + 21, compressed 62, ratio-4 states 42,
  ratio-128 states 20) and its 1,002,240 B per block; tests/test_models.py checks both against
  vLLM's ``get_kv_cache_groups``. Not modeled: vLLM's cap on Mamba and circular-buffer state
  buckets (no DeepSeek-V4 bucket is one).
- Multi-token-prediction layers (``num_nextn_predict_layers``) get no cache: vLLM allocates
  them only with speculative decoding.
- Mamba states take their page in every block and are never zeroed (section 1).

``engine="tpu-inference"`` gives that stack's native per-layer arrays (GEOMETRY.md section 9,
:mod:`kvlayout.native`), built from vLLM's spec (tpu-inference copies vLLM's grouping): one
array per layer slot, page axis first, shared by the slot's layers of every group.
Attention: ``(pages, page_size, align(2 * kv_heads, packing) // packing, packing,
align(head_dim, 128))``, ``packing = 32 // dtype bits``; MLA: ``(pages, page_size // 32, 32,
align(kv_lora_rank, 128) + align(qk_rope_head_dim, 128))`` (tpu-inference 0.32.0, CONTEXT.md).
Mamba states live per request slot there, outside the page arrays; the DeepSeek-V3.2/V4
arrays are not modeled and refused. The page size is vLLM's rule above (tpu-inference's own
default is not known here: pass ``block_size`` to match a deployment).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SpecError, spec_error
from .native import NativeCacheSpec, NativeLeaf
from .planner import Layout, plan_layout
from .spec import (
    DTYPE_SIZES,
    FP8_DS_MLA,
    FullAttentionSpec,
    GroupSpec,
    KVCacheSpec,
    LayerSpec,
    MambaSpec,
    MLASpec,
    SlidingWindowSpec,
)
from .validate import is_int, read_json_file

ENGINES = ("vllm", "tpu-inference")
#: Blocks in a spec made from a config unless ``num_blocks`` says otherwise: small enough
#: that ``kvlayout zero`` can check every family on the host.
DEFAULT_NUM_BLOCKS = 16
#: vLLM's tokens per block: FlashAttention, FlashMLA, DeepSeek-V4's compressed layers.
VLLM_BLOCK_SIZE = 16
VLLM_MLA_BLOCK_SIZE = 64
DSV4_BLOCK_SIZE = 256
#: DeepSeek-V4's fixed blocks: the sliding-window cache and the compressor states (tokens).
DSV4_SWA_BLOCK_SIZE = 64
DSV4_STATE_BLOCK_SIZE = {4: 4, 128: 8}
#: FlashMLA's page alignment for DeepSeek-V4 (bytes).
DSV4_ALIGN = 576
#: The attention kernel's block-size unit in vLLM's hybrid alignment (tokens).
HYBRID_BLOCK_UNIT = 16

_MODEL_DTYPES = ("bfloat16", "float16", "float32")
_KV_DTYPES: Mapping[str, str | None] = {
    "auto": None,
    "bfloat16": "bfloat16",
    "float16": "float16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}

# architecture -> family
_FAMILIES: Mapping[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "JambaForCausalLM": "jamba",
    "NemotronHForCausalLM": "nemotron_h",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5",
}
ARCHITECTURES = tuple(_FAMILIES)
_ATTENTION_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt_oss")
_MLA_FAMILIES = ("deepseek_v2", "deepseek_v3", "deepseek_v32")
_HYBRID_FAMILIES = ("jamba", "nemotron_h", "qwen3_next", "qwen3_5")


# --------------------------------------------------------------------------- reading a config
class _Config:
    """A JSON object read field by field; a missing or mistyped field names its path."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        self.data = data
        self.path = path

    def field(self, key: str) -> str:
        return f"{self.path}.{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def missing(self, key: str, why: str) -> SpecError:
        return spec_error(self.field(key), None, f"missing; {why}")

    def req_int(self, key: str, why: str, *, lo: int = 1) -> int:
        """A required integer ``>= lo``."""
        if not self.has(key):
            raise self.missing(key, why)
        return self._int(key, self.data[key], lo)

    def opt_int(self, key: str, *, lo: int = 1) -> int | None:
        return self._int(key, self.data[key], lo) if self.has(key) else None

    def _int(self, key: str, v: Any, lo: int) -> int:
        if not is_int(v):
            raise spec_error(self.field(key), v, "must be an integer")
        if v < lo:
            raise spec_error(self.field(key), v, f"must be at least {lo}")
        return int(v)

    def req_str(self, key: str, why: str) -> str:
        if not self.has(key):
            raise self.missing(key, why)
        v = self.data[key]
        if not isinstance(v, str):
            raise spec_error(self.field(key), v, "must be a string")
        return v

    def req_bool(self, key: str, why: str) -> bool:
        if key not in self.data:
            raise self.missing(key, why)
        v = self.data[key]
        if not isinstance(v, bool):
            raise spec_error(self.field(key), v, "must be true or false")
        return v

    def req_list(self, key: str, why: str, n: int, kind: type) -> list[Any]:
        """A required list of at least ``n`` items of type ``kind`` (the first ``n`` are returned)."""
        if not self.has(key):
            raise self.missing(key, why)
        v = self.data[key]
        if not isinstance(v, list):
            raise spec_error(self.field(key), v, "must be a list")
        if len(v) < n:
            raise spec_error(self.field(key), f"{len(v)} items", f"needs one item per layer ({n})")
        for i, x in enumerate(v[:n]):
            ok = is_int(x) if kind is int else isinstance(x, kind)
            if not ok:
                raise spec_error(
                    f"{self.field(key)}[{i}]", x, f"must be {'an integer' if kind is int else 'a string'}"
                )
        return list(v[:n])


def _load(config: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    data = (
        read_json_file(SpecError, "config file", str(config)) if isinstance(config, (str, Path)) else config
    )
    if not isinstance(data, Mapping):
        raise spec_error("config", type(data).__name__, "must be a JSON object (a model's config.json)")
    return data


def _architecture(top: _Config) -> tuple[str, str]:
    archs = top.data.get("architectures")
    if archs is None:
        raise top.missing("architectures", "it names the model class the engine builds")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise spec_error(top.field("architectures"), archs, "must be a non-empty list of class names")
    arch = archs[0]
    if arch not in _FAMILIES:
        raise spec_error(
            top.field("architectures[0]"), arch, f"unknown architecture; known: {', '.join(ARCHITECTURES)}"
        )
    return arch, _FAMILIES[arch]


def _text_config(top: _Config) -> _Config:
    tc = top.data.get("text_config")
    if tc is None:
        return top
    if not isinstance(tc, Mapping):
        raise spec_error(top.field("text_config"), tc, "must be a JSON object")
    return _Config(tc, top.field("text_config"))


# --------------------------------------------------------------------------- dtypes
def _model_dtype(top: _Config, text: _Config, dtype: str | None, notes: list[str]) -> str:
    if dtype is not None and dtype != "auto":
        if dtype not in _MODEL_DTYPES:
            raise spec_error("dtype", dtype, f"valid: auto, {', '.join(_MODEL_DTYPES)}")
        return dtype
    for cfg in (top, text):
        for key in ("torch_dtype", "dtype"):
            if cfg.has(key):
                raw = cfg.data[key]
                if raw not in _MODEL_DTYPES:
                    raise spec_error(
                        cfg.field(key), raw, f"valid: {', '.join(_MODEL_DTYPES)} (or pass dtype=)"
                    )
                if raw == "float32":
                    notes.append("float32 checkpoint: vLLM's dtype auto runs it in bfloat16")
                    return "bfloat16"
                return str(raw)
    raise top.missing("torch_dtype", "the model dtype (or pass dtype=)")


def _kv_dtype(kv_cache_dtype: str | None, model_dtype: str) -> str:
    key = "auto" if kv_cache_dtype is None else kv_cache_dtype
    if key not in _KV_DTYPES:
        raise spec_error("kv_cache_dtype", kv_cache_dtype, f"valid: {', '.join(_KV_DTYPES)}")
    return _KV_DTYPES[key] or model_dtype


def _check_tp(tp: object) -> int:
    if not is_int(tp) or int(tp) < 1:  # type: ignore[call-overload]
        raise spec_error("tp", tp, "must be a positive integer")
    return int(tp)  # type: ignore[call-overload]


def _per_rank(cfg: _Config, key: str, total: int, tp: int) -> int:
    """``total / tp`` where vLLM shards a dimension over tensor parallelism (it must divide)."""
    if total % tp:
        raise spec_error(cfg.field(key), total, f"not divisible by tp = {tp}")
    return total // tp


# --------------------------------------------------------------------------- attention geometry
@dataclass(frozen=True)
class _Attention:
    heads: int  # query heads (total)
    kv_heads: int  # KV heads per rank
    head_size: int


def _attention(cfg: _Config, tp: int, *, head_keys: Sequence[str] = ("head_dim",)) -> _Attention:
    heads = cfg.req_int("num_attention_heads", "the query heads")
    if heads % tp:
        raise spec_error(cfg.field("num_attention_heads"), heads, f"not divisible by tp = {tp}")
    total = None
    for key in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"):
        if cfg.has(key):
            total, kv_key = cfg.req_int(key, ""), key
            break
    if total is None:
        total, kv_key = heads, "num_attention_heads"
    if total >= tp and total % tp:
        raise spec_error(cfg.field(kv_key), total, f"not divisible by tp = {tp}")
    if total < tp and tp % total:
        raise spec_error(
            cfg.field(kv_key), total, f"tp = {tp} is not a multiple of it (KV heads are replicated)"
        )
    head_size = None
    for key in head_keys:
        if cfg.has(key):
            head_size = cfg.req_int(key, "")
            break
    if head_size is None:
        hidden = cfg.req_int(
            "hidden_size", f"the head size is hidden_size // num_attention_heads without {head_keys[0]}"
        )
        head_size = hidden // heads
    return _Attention(heads, max(1, total // tp), head_size)


def _token_bytes(att: _Attention, kv_dtype: str) -> int:
    """K plus V of one token on one rank."""
    return 2 * att.kv_heads * att.head_size * DTYPE_SIZES[kv_dtype]


def _layer_types(cfg: _Config, family: str, n: int) -> list[str]:
    """``"full"`` or ``"sliding"`` per layer, by the family's rule (module docstring)."""
    if cfg.has("layer_types"):
        raw = cfg.req_list("layer_types", "", n, str)
        out = []
        for i, t in enumerate(raw):
            if t not in ("sliding_attention", "full_attention"):
                raise spec_error(
                    f"{cfg.field('layer_types')}[{i}]", t, "valid: sliding_attention, full_attention"
                )
            out.append("sliding" if t == "sliding_attention" else "full")
        return out
    if family == "gemma2":
        return ["sliding" if i % 2 == 0 else "full" for i in range(n)]
    if family == "gemma3":
        p = cfg.req_int(
            "sliding_window_pattern",
            "Gemma 3 slides unless (i + 1) % sliding_window_pattern == 0 "
            "(transformers' default is 6: write it into config.json)",
        )
        return ["full" if (i + 1) % p == 0 else "sliding" for i in range(n)]
    if family in ("qwen2", "qwen3"):
        if not cfg.req_bool("use_sliding_window", "Qwen2/Qwen3 slide only when use_sliding_window is true"):
            return ["full"] * n
        first = cfg.req_int("max_window_layers", "layers from max_window_layers on slide", lo=0)
        return ["sliding" if i >= first else "full" for i in range(n)]
    if family == "mistral":
        if "sliding_window" not in cfg.data:
            raise cfg.missing("sliding_window", "null for full attention (transformers' default is 4096)")
        return ["full"] * n if cfg.data["sliding_window"] is None else ["sliding"] * n
    if family == "gpt_oss":
        raise cfg.missing("layer_types", "GPT-OSS names its sliding and full layers there")
    return ["full"] * n


# --------------------------------------------------------------------------- groups
def _vllm_groups(kinds: Sequence[tuple[str, Sequence[LayerSpec]]]) -> tuple[GroupSpec, ...]:
    """vLLM's split of layers of several spec kinds into groups of (about) one size."""
    kinds = [(k, list(ls)) for k, ls in kinds if ls]
    if len(kinds) == 1:
        return (GroupSpec(kinds[0][0], tuple(kinds[0][1])),)
    counts = [len(ls) for _, ls in kinds]
    size = min(counts)
    if max(counts) * 2 < size * 3:  # max < 1.5 * min: one group per kind, padded
        size = max(counts)
    groups = []
    for kind, layers in kinds:
        n = -(-len(layers) // size)
        for j in range(n):
            groups.append(GroupSpec(kind if n == 1 else f"{kind}.{j}", tuple(layers[j::n])))
    return tuple(groups)


def _least_padding_chunk(values: Sequence[int], lo: int) -> int:
    """The chunk ``d >= lo`` that pads ``values`` up to multiples of ``d`` the least (ties: larger)."""
    best, best_pad = lo, None
    for d in range(lo, max(max(values), lo) + 1):
        pad = sum(-x % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def _vllm_packed_groups(
    layers: Sequence[tuple[tuple[str, str, int, int | None], LayerSpec]],
) -> tuple[GroupSpec, ...]:
    """vLLM 0.33's grouping of layers with different pages for a block-outermost layout
    (``_get_packed_kv_cache_groups``). ``layers`` are ``(kind, bucket key, layer)`` in model
    order; a layer joins the first bucket of its key (one spec type, block size and window).
    A bucket whose page sizes have equal layer counts is "balanced": it repeats one layer of
    each page, and balanced buckets are split into groups of ``r`` repeats, ``r`` the chunk
    (at least the repeats of the largest mixed-page balanced bucket) that pads the repeat
    counts least. Other buckets stay whole. No bucket here holds Mamba states, so vLLM's
    state-bucket cap does not apply."""
    buckets: dict[tuple[str, str, int, int | None], list[LayerSpec]] = {}
    for key, layer in layers:
        buckets.setdefault(key, []).append(layer)
    info = []
    for (name, *_), members in buckets.items():
        by_page: dict[int, list[LayerSpec]] = {}
        for layer in members:
            by_page.setdefault(layer.page, []).append(layer)
        counts = {len(v) for v in by_page.values()}
        info.append((name, members, by_page, len(counts) == 1, max(len(v) for v in by_page.values())))
    floor = max((reps for *_, by_page, bal, reps in info if bal and len(by_page) > 1), default=0)
    per_group = _least_padding_chunk([reps for *_, bal, reps in info if bal], floor) if floor else None
    groups = []
    for name, members, by_page, balanced, reps in info:
        n = -(-reps // per_group) if balanced and per_group else 1
        if n == 1:
            groups.append(GroupSpec(name, tuple(members)))
            continue
        repeats = list(zip(*by_page.values()))
        for j in range(n):
            groups.append(GroupSpec(f"{name}.{j}", tuple(x for rep in repeats[j::n] for x in rep)))
    return tuple(groups)


# --------------------------------------------------------------------------- the result
@dataclass(frozen=True)
class ModelSpec:
    """A spec made from a config, with what was decided on the way."""

    spec: KVCacheSpec
    architecture: str
    family: str
    engine: str
    tp: int
    dtype: str  # the model dtype the engine runs
    kv_cache_dtype: str  # what the attention cache stores ("fp8_ds_mla" for DeepSeek's packed fp8)
    block_size: int  # tokens per block of the (main) attention layers
    kinds: Mapping[str, str]  # layer name -> kind label ("full", "sliding", "mla", "mamba", ...)
    notes: tuple[str, ...] = ()

    @property
    def layout(self) -> Layout:
        return plan_layout(self.spec)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id takes in the buffer: the block row (packed) or every slot's page."""
        lay = self.layout
        return lay.block_stride if lay.block_stride is not None else sum(lay.slot_pages)

    @property
    def blocks_per_gib(self) -> int:
        return 2**30 // self.bytes_per_block


# --------------------------------------------------------------------------- families
@dataclass
class _Ctx:
    top: _Config
    cfg: _Config  # the text config
    family: str
    tp: int
    dtype: str
    kv_cache_dtype: str | None
    block_size: int | None
    mamba_ssm_cache_dtype: str | None
    prefix: str  # "model.layers" or "language_model.model.layers"
    notes: list[str]
    kinds: dict[str, str]
    mla_dims: tuple[int, int] | None = None  # (kv_lora_rank, qk_rope_head_dim) of an MLA model

    def num_layers(self) -> int:
        return self.cfg.req_int("num_hidden_layers", "the number of decoder layers")

    def name(self, i: int, tail: str) -> str:
        return f"{self.prefix}.{i}.{tail}" if tail else f"{self.prefix}.{i}"

    def block(self, default: int) -> int:
        if self.block_size is None:
            return default
        if not is_int(self.block_size) or self.block_size < 1:
            raise spec_error("block_size", self.block_size, "must be a positive integer")
        return int(self.block_size)

    def add(self, kind: str, layer: LayerSpec, bucket: dict[str, list[LayerSpec]]) -> None:
        self.kinds[layer.name] = kind
        bucket.setdefault(kind, []).append(layer)


def _attention_family(c: _Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    n = c.num_layers()
    att = _attention(c.cfg, c.tp)
    kv = _kv_dtype(c.kv_cache_dtype, c.dtype)
    bs = c.block(VLLM_BLOCK_SIZE)
    types = _layer_types(c.cfg, c.family, n)
    window = c.cfg.req_int("sliding_window", "the window of the sliding layers") if "sliding" in types else 0
    tail = "attn.attn" if c.family == "gpt_oss" else "self_attn.attn"
    bucket: dict[str, list[LayerSpec]] = {}
    for i, t in enumerate(types):
        name = c.name(i, tail)
        if t == "sliding":
            layer: LayerSpec = SlidingWindowSpec(
                name=name,
                block_size=bs,
                num_kv_heads=att.kv_heads,
                head_size=att.head_size,
                dtype=kv,
                window=window,
            )
        else:
            layer = FullAttentionSpec(
                name=name, block_size=bs, num_kv_heads=att.kv_heads, head_size=att.head_size, dtype=kv
            )
        c.add(t, layer, bucket)
    return _vllm_groups(list(bucket.items())), kv, bs


def _mla_family(c: _Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    n = c.num_layers()
    heads = c.cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(c.cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    rank = c.cfg.req_int("kv_lora_rank", "the MLA latent (head size kv_lora_rank + qk_rope_head_dim)")
    rope = c.cfg.req_int("qk_rope_head_dim", "the MLA RoPE part (head size kv_lora_rank + qk_rope_head_dim)")
    head = rank + rope
    c.mla_dims = (rank, rope)
    bs = c.block(VLLM_MLA_BLOCK_SIZE)
    v32 = c.family == "deepseek_v32" or c.cfg.has("index_topk")
    raw = "auto" if c.kv_cache_dtype is None else c.kv_cache_dtype
    layers: list[LayerSpec] = []
    if v32:
        idx_dim = c.cfg.req_int(
            "index_head_dim", "the DeepSeek-V3.2 indexer key (index_head_dim + 4 B per 128)"
        )
        idx_bytes = idx_dim + idx_dim // 128 * 4
        fp8 = raw.startswith("fp8")
        kv = FP8_DS_MLA if fp8 else _kv_dtype(raw, c.dtype)
        ds_bytes = rank + rank // 128 * 4 + 2 * rope  # 512 fp8 + 16 B scales + 128 B bf16 RoPE = 656
        for i in range(n):
            idx = MLASpec(
                name=c.name(i, "self_attn.indexer.k_cache"), block_size=bs, head_size=idx_bytes, dtype="uint8"
            )
            c.kinds[idx.name] = "indexer"
            if fp8:
                att = MLASpec(
                    name=c.name(i, "self_attn.attn"),
                    block_size=bs,
                    head_size=head,
                    cache_dtype=FP8_DS_MLA,
                    token_bytes=ds_bytes,
                )
            else:
                att = MLASpec(name=c.name(i, "self_attn.attn"), block_size=bs, head_size=head, dtype=kv)
            c.kinds[att.name] = "mla"
            layers += [idx, att]
    else:
        kv = _kv_dtype(raw, c.dtype)
        for i in range(n):
            att = MLASpec(name=c.name(i, "self_attn.attn"), block_size=bs, head_size=head, dtype=kv)
            c.kinds[att.name] = "mla"
            layers.append(att)
    return (GroupSpec("mla", tuple(layers)),), kv, bs


def _dsv4_family(c: _Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    n = c.num_layers()
    heads = c.cfg.req_int("num_attention_heads", "the query heads")
    if heads % c.tp:
        raise spec_error(c.cfg.field("num_attention_heads"), heads, f"not divisible by tp = {c.tp}")
    raw = "auto" if c.kv_cache_dtype is None else c.kv_cache_dtype
    if raw != "auto" and not raw.startswith("fp8"):
        raise spec_error(
            "kv_cache_dtype", c.kv_cache_dtype, "DeepSeek-V4 has only an fp8 KV cache (fp8_ds_mla) in vLLM"
        )
    head = c.cfg.req_int("head_dim", "the MLA head (NoPE + RoPE)")
    rope = c.cfg.req_int("qk_rope_head_dim", "the RoPE part of the MLA head")
    if rope >= head:
        raise spec_error(c.cfg.field("qk_rope_head_dim"), rope, f"must be below head_dim {head}")
    nope = head - rope
    token = nope + 2 * rope + nope // 64 + 1  # fp8 NoPE, bf16 RoPE, UE8M0 scales, 1 pad: 584
    tb = None if token == 584 else token
    c.cfg.req_int("sliding_window", "the window of every layer's sliding-window cache")
    ratios = [max(1, r) for r in c.cfg.req_list("compress_ratios", "one compression ratio per layer", n, int)]
    for i, r in enumerate(ratios):
        if r not in (1, 4, 128):
            raise spec_error(
                f"{c.cfg.field('compress_ratios')}[{i}]", r, "valid: 0 or 1 (window only), 4, 128"
            )
    bs = c.block(DSV4_BLOCK_SIZE)
    for r in sorted(set(ratios) - {1}):
        if bs % r:
            raise spec_error("block_size", bs, f"must be a multiple of the compression ratio {r}")
    idx_dim = c.cfg.req_int("index_head_dim", "the indexer key of ratio-4 layers") if 4 in ratios else 0

    def mla(name: str, block: int, ratio: int | None = None) -> MLASpec:
        return MLASpec(
            name=name,
            block_size=block,
            head_size=head,
            cache_dtype=FP8_DS_MLA,
            compress_ratio=ratio,
            token_bytes=tb,
            alignment=DSV4_ALIGN,
        )

    def state(name: str, ratio: int, dim: int) -> MLASpec:
        coff = 2 if ratio == 4 else 1
        return MLASpec(
            name=name,
            block_size=DSV4_STATE_BLOCK_SIZE[ratio],
            head_size=2 * coff * dim,
            dtype="float32",
            alignment=DSV4_ALIGN,
        )

    bucket: dict[str, list[LayerSpec]] = {}
    for i, r in enumerate(ratios):
        a = c.name(i, "attn")
        if r == 4:
            c.add(
                "c4_indexer",
                MLASpec(
                    name=f"{a}.indexer.k_cache",
                    block_size=bs,
                    head_size=idx_dim + idx_dim // 128 * 4,
                    dtype="uint8",
                    compress_ratio=4,
                    alignment=DSV4_ALIGN,
                ),
                bucket,
            )
            c.add("c4_indexer_state", state(f"{a}.indexer.compressor.state_cache", 4, idx_dim), bucket)
        c.add("swa", mla(f"{a}.swa_cache", DSV4_SWA_BLOCK_SIZE), bucket)
        if r > 1:
            c.add(f"c{r}", mla(a, bs, r), bucket)
            c.add(f"c{r}_state", state(f"{a}.compressor.state_cache", r, head), bucket)
    # vLLM's uniform-type buckets (named here): one spec type, block size and window each; the
    # window of a compressor state is coff * ratio (8 for ratio 4, 128 for ratio 128)
    window = c.cfg.data["sliding_window"]
    compressed = ("compressed", "full", bs, None)
    c4_states = ("c4_states", "sliding", DSV4_STATE_BLOCK_SIZE[4], 8)
    keys = {
        "swa": ("swa", "sliding", DSV4_SWA_BLOCK_SIZE, window),
        "c4": compressed,
        "c128": compressed,
        "c4_indexer": compressed,
        "c4_state": c4_states,
        "c4_indexer_state": c4_states,
        "c128_state": ("c128_states", "sliding", DSV4_STATE_BLOCK_SIZE[128], 128),
    }
    return _vllm_packed_groups([(keys[c.kinds[x.name]], x) for x in _model_order(c, bucket)]), FP8_DS_MLA, bs


def _model_order(c: _Ctx, bucket: Mapping[str, Sequence[LayerSpec]]) -> list[LayerSpec]:
    """The layers of ``bucket`` in the order the model creates them (``c.kinds`` keeps it)."""
    by_name = {x.name: x for layers in bucket.values() for x in layers}
    return [by_name[n] for n in c.kinds if n in by_name]


def _ssm_dtype(c: _Ctx, config_keys: Sequence[str], default: str) -> str:
    """The ssm state dtype: the argument, else the first config key present, else ``default``."""
    if c.mamba_ssm_cache_dtype not in (None, "auto"):
        if c.mamba_ssm_cache_dtype not in _MODEL_DTYPES:
            raise spec_error(
                "mamba_ssm_cache_dtype", c.mamba_ssm_cache_dtype, f"valid: auto, {', '.join(_MODEL_DTYPES)}"
            )
        return str(c.mamba_ssm_cache_dtype)
    for key in config_keys:
        if c.cfg.has(key):
            v = c.cfg.data[key]
            if v not in _MODEL_DTYPES:
                raise spec_error(c.cfg.field(key), v, f"valid: {', '.join(_MODEL_DTYPES)}")
            return str(v)
    return default


def _mamba_layers(c: _Ctx, n: int) -> tuple[list[bool], list[bool], int, str, str]:
    """Per layer: has a cache, is attention; the Mamba state bytes, the Mamba kind and its name tail."""
    cfg, tp, conv_dt = c.cfg, c.tp, c.dtype
    conv_size = DTYPE_SIZES[conv_dt]
    if c.family == "jamba":
        period = cfg.req_int(
            "attn_layer_period", "layer i is attention when i % attn_layer_period == attn_layer_offset"
        )
        offset = cfg.req_int(
            "attn_layer_offset", "layer i is attention when i % attn_layer_period == attn_layer_offset", lo=0
        )
        is_attn = [i % period == offset for i in range(n)]
        expand = cfg.req_int("mamba_expand", "the Mamba inner size is mamba_expand * hidden_size")
        inner = _per_rank(
            cfg, "mamba_expand", expand * cfg.req_int("hidden_size", "the Mamba inner size"), tp
        )
        d_conv = cfg.req_int("mamba_d_conv", "the Mamba conv state keeps mamba_d_conv - 1 steps")
        d_state = cfg.req_int("mamba_d_state", "the Mamba ssm state size")
        ssm = _ssm_dtype(c, (), conv_dt)
        state = (d_conv - 1) * inner * conv_size + inner * d_state * DTYPE_SIZES[ssm]
        return [True] * n, is_attn, state, "mamba", "mixer"
    if c.family == "nemotron_h":
        pattern = cfg.req_str(
            "hybrid_override_pattern", "one character per layer: M Mamba, * attention, - MLP, E MoE"
        )
        if len(pattern) != n or set(pattern) - set("M*-E"):
            raise spec_error(
                cfg.field("hybrid_override_pattern"),
                pattern,
                f"needs {n} characters (num_hidden_layers), each of M, *, -, E",
            )
        is_attn = [ch == "*" for ch in pattern]
        keep = [ch in "M*" for ch in pattern]
        heads = cfg.req_int("mamba_num_heads", "the Mamba2 heads")
        hdim = cfg.req_int("mamba_head_dim", "the Mamba2 head size")
        groups = cfg.req_int("n_groups", "the Mamba2 B/C groups")
        d_state = cfg.req_int("ssm_state_size", "the Mamba2 state size")
        k = cfg.req_int("conv_kernel", "the Mamba2 conv state keeps conv_kernel - 1 steps")
        if groups % tp:
            groups += tp - groups  # vLLM replicates the groups a head shard needs
        conv_dim = _per_rank(cfg, "n_groups", heads * hdim + 2 * groups * d_state, tp)
        ssm = _ssm_dtype(c, ("mamba_ssm_cache_dtype",), "float32")
        state = (k - 1) * conv_dim * conv_size + _per_rank(
            cfg, "mamba_num_heads", heads, tp
        ) * hdim * d_state * DTYPE_SIZES[ssm]
        return keep, is_attn, state, "mamba", "mixer"
    # gated delta net: Qwen3-Next, Qwen3.5
    if cfg.has("layer_types"):
        raw = cfg.req_list("layer_types", "", n, str)
        for i, t in enumerate(raw):
            if t not in ("linear_attention", "full_attention"):
                raise spec_error(
                    f"{cfg.field('layer_types')}[{i}]", t, "valid: linear_attention, full_attention"
                )
        is_attn = [t == "full_attention" for t in raw]
    else:
        every = cfg.req_int(
            "full_attention_interval",
            "layer i is full attention when (i + 1) % full_attention_interval == 0 (or give layer_types)",
        )
        is_attn = [(i + 1) % every == 0 for i in range(n)]
    kh = cfg.req_int("linear_num_key_heads", "the gated delta net key heads")
    vh = cfg.req_int("linear_num_value_heads", "the gated delta net value heads")
    kd = cfg.req_int("linear_key_head_dim", "the gated delta net key head size")
    vd = cfg.req_int("linear_value_head_dim", "the gated delta net value head size")
    k = cfg.req_int("linear_conv_kernel_dim", "the conv state keeps linear_conv_kernel_dim - 1 steps")
    conv_dim = _per_rank(cfg, "linear_num_key_heads", 2 * kh * kd + vh * vd, tp)
    ssm = _ssm_dtype(c, ("mamba_ssm_dtype",) if c.family == "qwen3_5" else (), conv_dt)
    state = (k - 1) * conv_dim * conv_size + _per_rank(
        cfg, "linear_num_value_heads", vh, tp
    ) * kd * vd * DTYPE_SIZES[ssm]
    return [True] * n, is_attn, state, "gdn", "linear_attn"


def _hybrid_family(c: _Ctx) -> tuple[tuple[GroupSpec, ...], str, int]:
    n = c.num_layers()
    head_keys = ("head_dim", "attention_head_dim") if c.family == "nemotron_h" else ("head_dim",)
    att = _attention(c.cfg, c.tp, head_keys=head_keys)
    keep, is_attn, state, mkind, mtail = _mamba_layers(c, n)
    kv = _kv_dtype(c.kv_cache_dtype, c.dtype)
    per_token = _token_bytes(att, kv)
    # vLLM 0.33 (Platform._align_hybrid_block_size): the unit is the kernel's smallest block or the
    # block size already set, whichever is larger; the result is rounded to the kernel's unit.
    given = None if c.block_size is None else c.block(HYBRID_BLOCK_UNIT)
    unit = max(HYBRID_BLOCK_UNIT, given or HYBRID_BLOCK_UNIT)
    need = unit * -(-state // (unit * per_token))
    need = HYBRID_BLOCK_UNIT * -(-need // HYBRID_BLOCK_UNIT)
    bs = given or HYBRID_BLOCK_UNIT
    if bs < need:
        if given is not None:
            c.notes.append(f"block_size {given} raised to {need}: one attention page must hold a Mamba state")
        bs = need
    page = bs * per_token
    c.notes.append(
        f"hybrid: {bs}-token blocks; {page:,} B attention page >= {state:,} B Mamba state "
        f"(+{page - state:,} B padding)"
    )
    bucket: dict[str, list[LayerSpec]] = {}
    tail = {"jamba": "attn", "nemotron_h": "mixer.attn"}.get(c.family, "self_attn.attn")
    for i in range(n):
        if not keep[i]:
            continue
        if is_attn[i]:
            c.add(
                "full",
                FullAttentionSpec(
                    name=c.name(i, tail),
                    block_size=bs,
                    num_kv_heads=att.kv_heads,
                    head_size=att.head_size,
                    dtype=kv,
                ),
                bucket,
            )
        else:
            c.add(
                mkind,
                MambaSpec(
                    name=c.name(i, mtail), state_bytes=state, alignment=page if page != state else None
                ),
                bucket,
            )
    return _vllm_groups(list(bucket.items())), kv, bs


# --------------------------------------------------------------------------- entry points
def _build(
    config: Mapping[str, Any] | str | Path,
    tp: int,
    dtype: str | None,
    kv_cache_dtype: str | None,
    block_size: int | None,
    num_blocks: int,
    mamba_ssm_cache_dtype: str | None,
) -> tuple[ModelSpec, _Ctx]:
    """vLLM's spec for ``config`` and the context it was read in."""
    tp = _check_tp(tp)
    top = _Config(_load(config), "config")
    arch, family = _architecture(top)
    text = _text_config(top)
    notes: list[str] = []
    model_dtype = _model_dtype(top, text, dtype, notes)
    prefix = "language_model.model.layers" if arch.endswith("ForConditionalGeneration") else "model.layers"
    if family == "deepseek_v3" and text.has("index_topk"):
        family = "deepseek_v32"
    c = _Ctx(
        top,
        text,
        family,
        tp,
        model_dtype,
        kv_cache_dtype,
        block_size,
        mamba_ssm_cache_dtype,
        prefix,
        notes,
        {},
    )
    if family in _ATTENTION_FAMILIES:
        groups, kv, bs = _attention_family(c)
    elif family in _MLA_FAMILIES:
        groups, kv, bs = _mla_family(c)
    elif family == "deepseek_v4":
        groups, kv, bs = _dsv4_family(c)
    else:
        groups, kv, bs = _hybrid_family(c)
    spec = KVCacheSpec(num_blocks=num_blocks, layout="packed", groups=groups)
    return ModelSpec(spec, arch, family, "vllm", tp, model_dtype, kv, bs, dict(c.kinds), tuple(notes)), c


def from_config(
    config: Mapping[str, Any] | str | Path,
    *,
    engine: str = "vllm",
    tp: int = 1,
    dtype: str | None = None,
    kv_cache_dtype: str | None = None,
    block_size: int | None = None,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    mamba_ssm_cache_dtype: str | None = None,
) -> ModelSpec | NativeModelSpec:
    """What ``engine`` allocates for the model of ``config`` (a dict or a path to ``config.json``)
    on one of ``tp`` ranks, with the decisions made on the way: a :class:`ModelSpec` for vLLM,
    a :class:`NativeModelSpec` (typed per-layer arrays) for tpu-inference."""
    if engine not in ENGINES:
        raise spec_error("engine", engine, f"valid: {', '.join(ENGINES)}")
    ms, c = _build(config, tp, dtype, kv_cache_dtype, block_size, num_blocks, mamba_ssm_cache_dtype)
    return _tpu_inference(ms, c) if engine == "tpu-inference" else ms


def spec_from_config(
    config: Mapping[str, Any] | str | Path, *, engine: str = "vllm", **options: Any
) -> KVCacheSpec | NativeCacheSpec:
    """The kvlayout spec of what ``engine`` allocates for ``config``: :func:`from_config`'s spec,
    with its options (``tp``, ``dtype``, ``kv_cache_dtype``, ``block_size``, ``num_blocks``,
    ``mamba_ssm_cache_dtype``). A flat-buffer :class:`~kvlayout.KVCacheSpec` for vLLM, a
    :class:`~kvlayout.native.NativeCacheSpec` of per-layer arrays for tpu-inference."""
    return from_config(config, engine=engine, **options).spec


# --------------------------------------------------------------------------- tpu-inference
#: tpu-inference pads the head size of its attention and MLA arrays to the TPU lane width.
TPU_LANES = 128


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
    block_size: int  # tokens per page
    kinds: Mapping[str, str]  # layer name -> kind label
    shared_by: Mapping[str, tuple[str, ...]]  # array (leaf) name -> the layers that use it
    notes: tuple[str, ...] = ()

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one page over every array: what one block id takes."""
        return sum(leaf.page_bytes for leaf in self.spec.leaves)

    @property
    def blocks_per_gib(self) -> int:
        return 2**30 // self.bytes_per_block


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def _tpu_page_shape(layer: LayerSpec, c: _Ctx) -> tuple[tuple[int, ...], str]:
    """One page of a layer's tpu-inference 0.32 array: its shape and dtype (CONTEXT.md)."""
    if isinstance(layer, FullAttentionSpec):  # ragged paged attention v3: K and V interleaved on heads
        packing = 4 // DTYPE_SIZES[layer.dtype]  # 32 bits // dtype bits
        heads = _align(2 * layer.num_kv_heads, packing) // packing
        return (layer.block_size, heads, packing, _align(layer.head_size, TPU_LANES)), layer.dtype
    if isinstance(layer, MLASpec) and c.mla_dims is not None and layer.dtype is not None:
        if layer.block_size % 32:
            why = "tpu-inference's MLA arrays hold pages of a multiple of 32 tokens"
            raise spec_error("block_size", layer.block_size, why)
        rank, rope = c.mla_dims
        return (layer.block_size // 32, 32, _align(rank, TPU_LANES) + _align(rope, TPU_LANES)), layer.dtype
    raise spec_error("engine", "tpu-inference", f"no native array known for {layer.where}")


def _tpu_inference(ms: ModelSpec, c: _Ctx) -> NativeModelSpec:
    """tpu-inference's arrays for vLLM's spec ``ms``: one array per layer slot (vLLM's KV cache
    tensors, shared by the slot's layers of every group), page axis first."""
    if ms.family in ("deepseek_v32", "deepseek_v4"):
        why = (
            "tpu-inference's arrays for the DeepSeek-V3.2/V4 indexer, window and compressed caches are not "
            "modeled (CONTEXT.md names only some of their roles)"
        )
        raise spec_error("engine", "tpu-inference", why)
    notes = list(ms.notes)
    groups = [[x for x in g.layers if not isinstance(x, MambaSpec)] for g in ms.spec.groups]
    if any(isinstance(x, MambaSpec) for _, x in ms.spec.layers):
        notes.append("Mamba states live per request slot in tpu-inference, outside the page arrays")
    names = [g.name for g in ms.spec.groups]
    leaves, shared = [], {}
    for j in range(max(len(g) for g in groups)):
        slot = [(names[i], g[j]) for i, g in enumerate(groups) if j < len(g)]
        shapes = {_tpu_page_shape(layer, c) for _, layer in slot}
        if len(shapes) != 1:
            raise spec_error(
                "engine", "tpu-inference", f"the layers of slot {j} need different arrays: {shapes}"
            )
        (shape, dt) = shapes.pop()
        owners = {g for g, _ in slot}
        name = f"kv_caches[{j}]"
        leaves.append(
            NativeLeaf(name, (ms.spec.num_blocks, *shape), dt, owners.pop() if len(owners) == 1 else "")
        )
        shared[name] = tuple(layer.name for _, layer in slot)
    spec = NativeCacheSpec(tuple(leaves))
    return NativeModelSpec(
        spec,
        ms.architecture,
        ms.family,
        "tpu-inference",
        ms.tp,
        ms.dtype,
        ms.kv_cache_dtype,
        ms.block_size,
        ms.kinds,
        shared,
        tuple(notes),
    )


# --------------------------------------------------------------------------- one-screen summary
def _n(x: int) -> str:
    return f"{x:,}"


def _head(ms: ModelSpec | NativeModelSpec, what: str, sizes: str) -> list[str]:
    """The summary's first lines: the model, engine and rank; dtypes and sizes; the notes."""
    return [
        f"{ms.architecture} ({ms.family}) on {ms.engine}, tp {ms.tp} (one rank's {what})",
        f"dtype {ms.dtype}, KV cache {ms.kv_cache_dtype}, {sizes}",
        *(f"note: {x}" for x in ms.notes),
    ]


def summary(ms: ModelSpec | NativeModelSpec, *, proof: bool = True) -> str:
    """Groups, layers per group, page and padding per kind, bytes per block, blocks per GiB, the proof."""
    if isinstance(ms, NativeModelSpec):
        return _native_summary(ms, proof=proof)
    spec = ms.spec
    blocks = f"{ms.block_size}-token blocks, layout {spec.layout}, {spec.num_blocks} blocks"
    lines = _head(ms, "cache", blocks)
    ng = len(spec.groups)
    lines.append(
        f"{ng} group{'s' * (ng != 1)}, {len(spec.layers)} layers (groups share block ids and overlay):"
    )
    for g in spec.groups:
        kinds = dict.fromkeys(ms.kinds.get(layer.name, layer.kind) for layer in g.layers)
        pages = sum(layer.page for layer in g.layers)
        kinds_text = "+".join(kinds)
        lines.append(f"  {g.name:<20} {len(g.layers):>4} layers {_n(pages):>14} B per block  {kinds_text}")
    lines.append(
        f"  {'kind':<20} {'layers':>6} {'tokens':>7} {'real page B':>14} {'page B':>14} {'padding B':>10}"
    )
    per_kind: dict[tuple[str, int | None, int, int], int] = {}
    for _, layer in spec.layers:
        key = (ms.kinds.get(layer.name, layer.kind), layer.logical_block_size, layer.real_page, layer.page)
        per_kind[key] = per_kind.get(key, 0) + 1
    for (kind, tokens, real, page), count in per_kind.items():
        shown = "-" if tokens is None else str(tokens)
        lines.append(
            f"  {kind:<20} {count:>6} {shown:>7} {_n(real):>14} {_n(page):>14} {_n(page - real):>10}"
        )
    bpb = ms.bytes_per_block
    lines.append(f"bytes per block {_n(bpb)}; blocks per GiB {_n(ms.blocks_per_gib)}")
    if proof:
        from .verify import verify

        report = verify(ms.layout.table())
        lines.append(f"zeroing table: {report.format().splitlines()[0]}")
    return "\n".join(lines)


def _native_summary(ms: NativeModelSpec, *, proof: bool) -> str:
    spec = ms.spec
    pages = f"{len(spec.leaves)} arrays of {spec.num_blocks} pages (GEOMETRY.md section 9)"
    lines = _head(ms, "arrays", f"{ms.block_size}-token pages, {pages}")
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
        lines.append(f"  {kind:<20} {count:>6} {n_users:>6}  {str(shape):<24} {dt:<14} {_n(page):>12}")
    lines.append(f"bytes per block {_n(ms.bytes_per_block)}; blocks per GiB {_n(ms.blocks_per_gib)}")
    if proof:
        from .native import verify_native

        reports = verify_native(spec)
        bad = [name for name, r in reports.items() if not r.ok]
        verdict = "SAFE" if not bad else f"UNSAFE ({', '.join(bad[:3])})"
        lines.append(f"zeroing: {len(reports)} single-row tables (base 0, stride = span = page): {verdict}")
    return "\n".join(lines)


__all__ = [
    "ARCHITECTURES",
    "NativeModelSpec",
    "DEFAULT_NUM_BLOCKS",
    "ENGINES",
    "ModelSpec",
    "from_config",
    "spec_from_config",
    "summary",
]
