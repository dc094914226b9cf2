"""What every family builds: the result (:class:`ModelSpec`) and the context it is built in."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from ..errors import spec_error
from ..planner import Layout, plan_layout
from ..spec import KVCacheSpec, LayerSpec
from ..validate import is_int
from .backends import BACKENDS, DEFAULT_DEVICE, VLLM_BLOCK_SIZE, Resolved, resolve
from .config import MAX_CONFIG_INT, MAX_CONFIG_LAYERS, Config

ENGINES = ("vllm", "tpu-inference")
#: Blocks in a spec made from a config unless ``num_blocks`` says otherwise: small enough
#: that ``kvlayout zero`` can check every family on the host.
DEFAULT_NUM_BLOCKS = 16
#: A bound on ``num_hidden_layers``: planning stays within about a second and 100 MB.
MAX_LAYERS = MAX_CONFIG_LAYERS


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
    device: str = DEFAULT_DEVICE  # the GPU generation the backend was resolved for
    attention_backend: str = ""  # the vLLM attention backend assumed ("" where the model fixes its blocks)
    backend_reason: str = ""  # why that backend

    @cached_property
    def layout(self) -> Layout:
        """The plan of :attr:`spec`, made once (a summary asks for it three times: 10,000 DeepSeek-V4
        layers took 1.1 s a plan)."""
        return plan_layout(self.spec)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id takes in the buffer: the block row (packed) or every slot's page."""
        lay = self.layout
        return lay.block_stride if lay.block_stride is not None else sum(lay.slot_pages)

    @property
    def blocks_per_gib(self) -> int:
        return 2**30 // self.bytes_per_block


@dataclass
class Ctx:
    top: Config
    cfg: Config  # the text config
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
    device: str | None = DEFAULT_DEVICE  # None: no CUDA GPU (tpu-inference), no backend resolved
    attention_backend: str | None = None  # the backend the user named
    resolved: Resolved | None = None  # the backend assumed for the attention layers
    text_arch: str = ""  # a TEXT_CONFIG_WRAPPERS model's language model architecture (attention.py)

    def backend(
        self, *, mla: bool, sparse: bool = False, qk_nope_head_dim: int | None = None, by_block: bool = True
    ) -> Resolved:
        """The attention backend vLLM resolves for this model (:func:`.backends.resolve`); a block size
        the user set rules backends out unless ``by_block`` is false (hybrids: vLLM realigns it)."""
        user_block = None if self.block_size is None or not by_block else self.block(VLLM_BLOCK_SIZE)
        if self.device is None:  # no CUDA GPU (tpu-inference): vLLM's FlashAttention / FlashMLA blocks
            b = BACKENDS["FLASHMLA" if mla else "FLASH_ATTN"]
            return Resolved(
                b, 64 if mla else VLLM_BLOCK_SIZE, "no CUDA device: FlashAttention's or FlashMLA's blocks"
            )
        self.resolved = resolve(
            mla=mla,
            device=self.device,
            kv_cache_dtype="auto" if self.kv_cache_dtype is None else self.kv_cache_dtype,
            attention_backend=self.attention_backend,
            sparse=sparse,
            qk_nope_head_dim=qk_nope_head_dim,
            block_size=user_block,
        )
        return self.resolved

    def num_layers(self) -> int:
        n = self.cfg.req_int("num_hidden_layers", "the number of decoder layers")
        if n > MAX_LAYERS:
            raise spec_error(self.cfg.field("num_hidden_layers"), n, f"must be at most {MAX_LAYERS:,}")
        return n

    def name(self, i: int, tail: str) -> str:
        return f"{self.prefix}.{i}.{tail}" if tail else f"{self.prefix}.{i}"

    def block(self, default: int) -> int:
        if self.block_size is None:
            return default
        if not is_int(self.block_size) or not 1 <= self.block_size <= MAX_CONFIG_INT:
            raise spec_error("block_size", self.block_size, "must be a positive integer, at most 2**53")
        return int(self.block_size)

    def add(self, kind: str, layer: LayerSpec, bucket: dict[str, list[LayerSpec]]) -> None:
        self.kinds[layer.name] = kind
        bucket.setdefault(kind, []).append(layer)


# --------------------------------------------------------------------------- summary helpers
class Described(Protocol):
    """What a summary's first lines need of a :class:`ModelSpec` or a native one."""

    @property
    def architecture(self) -> str: ...

    @property
    def family(self) -> str: ...

    @property
    def engine(self) -> str: ...

    @property
    def tp(self) -> int: ...

    @property
    def dtype(self) -> str: ...

    @property
    def kv_cache_dtype(self) -> str: ...

    @property
    def notes(self) -> tuple[str, ...]: ...


def fmt_int(x: int) -> str:
    return f"{x:,}"


def summary_head(ms: Described, what: str, sizes: str) -> list[str]:
    """The summary's first lines: the model, engine and rank; dtypes and sizes; the notes."""
    return [
        f"{ms.architecture} ({ms.family}) on {ms.engine}, tp {ms.tp} (one rank's {what})",
        f"dtype {ms.dtype}, KV cache {ms.kv_cache_dtype}, {sizes}",
        *(f"note: {x}" for x in ms.notes),
    ]
