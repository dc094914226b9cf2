"""The attention backend vLLM 0.33 resolves on a CUDA GPU, and the block size that follows.

vLLM picks the backend from a priority list per GPU generation (``vllm/platforms/cuda.py``,
``_get_backend_priorities``): the first backend whose compute capability, KV cache dtype and
model-specific checks (``validate_configuration``) pass. The cache block size is then the
backend's preference (``Platform.update_block_size_for_backend``): vLLM's default of 16 tokens
when the backend's kernel block sizes accept it (a size ``s`` or ``MultipleOf(s)`` with
``16 % s == 0``), else the smallest size it lists. So DeepSeek-V2's MLA cache is 16-token
blocks with a bf16 cache on Hopper (FLASH_ATTN_MLA, ``MultipleOf(16)``), 64 with an fp8 one
(FLASHMLA, ``[64]``), 32 on Blackwell (FLASHINFER_MLA, ``[32, 64]``). Every standard-attention
backend takes 16.

The table :data:`BACKENDS` is read from vLLM 0.33.0's backend classes (their
``supported_kv_cache_dtypes``, ``get_supported_kernel_block_sizes``,
``supports_compute_capability``); ``tests/test_models_backends.py`` checks it, and the
priority lists, against the installed vLLM. Checks that need the GPU at run time
(``flash_attn_supports_mla``, FlashMLA's library probe) are assumed to pass on the named
device. DeepSeek-V4's blocks are fixed by its model code (:mod:`.deepseek_v4`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import spec_error

#: vLLM's default tokens per block (``CacheConfig.DEFAULT_BLOCK_SIZE``).
VLLM_BLOCK_SIZE = 16
#: The attention kernel's block-size unit in vLLM's hybrid alignment (tokens).
HYBRID_BLOCK_UNIT = 16

#: GPU generations by name: compute capability (major, minor).
DEVICES: Mapping[str, tuple[int, int]] = {"hopper": (9, 0), "blackwell": (10, 0), "ampere": (8, 0)}
DEFAULT_DEVICE = "hopper"

_HALF = ("auto", "float16", "bfloat16")
_FP8 = ("fp8", "fp8_e4m3")
#: compute-capability majors where FLASH_ATTN takes an fp8 cache (FA3 on Hopper, FA4 on Blackwell)
_FA_FP8_MAJORS = (9, 10)


@dataclass(frozen=True)
class Backend:
    """One vLLM attention backend as far as the cache layout needs it."""

    name: str
    mla: bool
    sparse: bool
    majors: tuple[int, ...] | None  # compute-capability majors it runs on (None: 8.0 and newer)
    kv_dtypes: tuple[str, ...]
    #: kernel block sizes: ``(s, False)`` a size, ``(s, True)`` ``MultipleOf(s)``
    block_sizes: tuple[tuple[int, bool], ...]
    #: the R1 MLA dimensions (qk_nope_head_dim in this set), None: any
    qk_nope: tuple[int, ...] | None = None

    def accepts(self, block_size: int) -> bool:
        """``supports_block_size``: a multiple of one kernel size (a fixed size included)."""
        return any(block_size % s == 0 for s, _ in self.block_sizes)

    def preferred_block_size(self) -> int:
        """``get_preferred_block_size(16)``."""
        if self.accepts(VLLM_BLOCK_SIZE):
            return VLLM_BLOCK_SIZE
        return min(s for s, _ in self.block_sizes)


BACKENDS: Mapping[str, Backend] = {
    b.name: b
    for b in (
        Backend("FLASH_ATTN", False, False, None, _HALF + _FP8, ((16, True),)),
        Backend(
            "FLASHINFER",
            False,
            False,
            None,
            _HALF + _FP8 + ("fp8_e5m2",),
            ((16, False), (32, False), (64, False)),
        ),
        Backend("TRITON_ATTN", False, False, None, _HALF + _FP8 + ("fp8_e5m2",), ((16, True),)),
        Backend("FLASH_ATTN_MLA", True, False, (9,), _HALF, ((16, True),)),
        Backend("FLASHMLA", True, False, (9, 10), _HALF + _FP8, ((64, False),)),
        Backend(
            "FLASHINFER_MLA", True, False, (10,), _HALF + _FP8, ((32, False), (64, False)), (64, 128, 192)
        ),
        Backend("TOKENSPEED_MLA", True, False, (10,), _FP8, ((32, False), (64, False)), (128,)),
        Backend("CUTLASS_MLA", True, False, (10,), _HALF + _FP8, ((128, False),)),
        Backend("TRITON_MLA", True, False, None, _HALF + _FP8, ((16, True),)),
        Backend("FLASH_ATTN_MLA_SPARSE", True, True, (9,), _HALF, ((64, True),)),
        Backend(
            "FLASHMLA_SPARSE", True, True, (9, 10), ("auto", "bfloat16", "fp8_ds_mla", "fp8"), ((64, True),)
        ),
    )
}

#: ``_get_backend_priorities`` (causal decoder attention, no multimodal prefix), by major.
_PRIORITY: Mapping[tuple[bool, int], tuple[str, ...]] = {
    (False, 10): ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN"),
    (False, 9): ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"),
    (False, 8): ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"),
    (True, 10): (
        "FLASHINFER_MLA",
        "TOKENSPEED_MLA",
        "CUTLASS_MLA",
        "FLASH_ATTN_MLA",
        "FLASHMLA",
        "TRITON_MLA",
    ),
    (True, 9): (
        "FLASH_ATTN_MLA",
        "FLASHMLA",
        "FLASHINFER_MLA",
        "TRITON_MLA",
        "FLASH_ATTN_MLA_SPARSE",
        "FLASHMLA_SPARSE",
    ),
    (True, 8): (
        "FLASH_ATTN_MLA",
        "FLASHMLA",
        "FLASHINFER_MLA",
        "TRITON_MLA",
        "FLASH_ATTN_MLA_SPARSE",
        "FLASHMLA_SPARSE",
    ),
}


#: FlashAttention 4's fixed kernel pages (vLLM 0.33 ``v1/attention/backends/flash_attn.py``): its SM90 kernel
#: for an fp8 cache and head size 512 (``_get_sm90_fa4_fp8_kv_block_size``, a 64-token TMA tile) and its
#: Blackwell head-size-256 kernel (``_get_fa4_hd256_block_size``, ``fa_utils.FA4_HD256_PAGE_SIZE``)
SM90_FA4_FP8_PAGE = 64
FA4_HD256_PAGE = 128


def flash_attn_version(device: str, head_size: int, kv_cache_dtype: str, *, hd256_fallback: bool) -> int:
    """The FlashAttention version vLLM 0.33 runs FLASH_ATTN with (``fa_utils.get_flash_attn_version``, no
    ``flash_attn_version`` or batch invariance set; the wheel ships FA2 and FA3 as ``.so`` files and FA4 as
    ``cute/interface.py``, so each is available where its compute capability allows): FA3 on Hopper, upgraded
    to FA4 above head size 256; FA4 on Blackwell, where its head-size-256 kernel falls back to FA2 for
    soft-capped logits, a quantized cache, a multimodal prefix LM or R-SWA (``hd256_fallback`` for the
    model's), and head sizes above 128 but 256 take FA2 (TMEM); FA2 elsewhere."""
    major = DEVICES[device][0]
    if major == 9:
        return 4 if head_size > 256 else 3
    if major != 10:
        return 2
    if head_size == 256:
        return 2 if hd256_fallback or kv_cache_dtype not in _HALF else 4
    return 2 if head_size > 128 else 4


def flash_attn_page(device: str, head_size: int, kv_cache_dtype: str, *, hd256_fallback: bool) -> int | None:
    """FLASH_ATTN's fixed kernel page for attention of ``head_size`` (None: ``MultipleOf(16)``), vLLM 0.33's
    ``get_supported_kernel_block_sizes`` / ``get_preferred_block_size``: 64 tokens on Hopper for an fp8 cache
    and head size 512 (FA4), 128 on Blackwell for head size 256 on FA4's hd256 kernel."""
    v = flash_attn_version(device, head_size, kv_cache_dtype, hd256_fallback=hd256_fallback)
    major = DEVICES[device][0]
    if major == 9 and kv_cache_dtype in _FP8 and head_size == 512 and v == 4:
        return SM90_FA4_FP8_PAGE
    if major == 10 and head_size == 256 and v == 4:
        return FA4_HD256_PAGE
    return None


def flash_attn_refuses(
    device: str, head_size: int, kv_cache_dtype: str, *, hd256_fallback: bool
) -> str | None:
    """Why FLASH_ATTN refuses attention of ``head_size`` with this cache (``supports_head_size``: a multiple
    of 8, at most 256, or 512 with FA4; ``supports_combination``: an fp8 cache needs FA3 on Hopper, FA4 with
    head size 512 on Hopper, or FA4 on Blackwell), None where it takes it."""
    major = DEVICES[device][0]
    if head_size % 8 or head_size > (512 if major in (9, 10) else 256):
        return f"head size {head_size} not supported"
    v = flash_attn_version(device, head_size, kv_cache_dtype, hd256_fallback=hd256_fallback)
    if kv_cache_dtype in _FP8 and not (
        (major == 9 and (v == 3 or (v == 4 and head_size == 512))) or (major == 10 and v == 4)
    ):
        v_name = f"FlashAttention {v}"
        return f"kv_cache_dtype {kv_cache_dtype} not supported with head size {head_size} ({v_name})"
    return None


@dataclass(frozen=True)
class Resolved:
    """The backend vLLM would use, the block size it implies, and why."""

    backend: Backend
    block_size: int
    reason: str


#: head sizes a standard-attention backend takes (vLLM 0.33's ``supports_head_size``): FlashInfer's
#: ``get_supported_head_sizes`` list; Triton ``head_size >= 32`` (FLASH_ATTN: :func:`flash_attn_refuses`)
FLASHINFER_HEAD_SIZES = (64, 128, 256, 512)
TRITON_MIN_HEAD_SIZE = 32


def head_size_refused(backend: str, head_size: int) -> str | None:
    """Why FLASHINFER or TRITON_ATTN refuses attention of ``head_size`` (None: it takes it, or another
    backend)."""
    if backend == "FLASHINFER" and head_size not in FLASHINFER_HEAD_SIZES:
        return f"head size {head_size} not supported (FlashInfer takes {list(FLASHINFER_HEAD_SIZES)})"
    if backend == "TRITON_ATTN" and head_size < TRITON_MIN_HEAD_SIZE:
        return f"head size {head_size} not supported (Triton takes {TRITON_MIN_HEAD_SIZE} and more)"
    return None


def _why_not(
    b: Backend, major: int, kv: str, qk_nope: int | None, sparse: bool, block_size: int | None
) -> str | None:
    """Why ``b`` fails vLLM's ``validate_configuration`` here (None: it passes)."""
    if b.sparse != sparse:
        return "sparse not supported" if sparse else "non-sparse not supported"
    if not (major >= 8 if b.majors is None else major in b.majors):
        return "compute capability not supported"
    if kv not in b.kv_dtypes:
        return f"kv_cache_dtype {kv} not supported"
    if b.name == "FLASH_ATTN" and kv in _FP8 and major not in _FA_FP8_MAJORS:
        # FlashAttentionBackend.supports_kv_cache_dtype -> fa_utils.flash_attn_supports_kv_cache_dtype: an fp8
        # cache needs FA3 on SM90 or FA4 on SM100; get_flash_attn_version gives FA2 elsewhere
        return f"kv_cache_dtype {kv} not supported (FlashAttention 2 on SM{major}x has no fp8 cache)"
    if b.qk_nope is not None and qk_nope not in b.qk_nope:
        return f"qk_nope_head_dim {qk_nope} not in {list(b.qk_nope)}"
    if block_size is not None and not b.accepts(block_size):
        return "block_size not supported"
    return None


def _checked(r: Resolved, device: str, kv_cache_dtype: str) -> Resolved:
    """``r``, unless its implementation refuses the cache when built (TritonMLAImpl: an fp8 cache
    needs compute capability 8.9)."""
    if r.backend.name == "TRITON_MLA" and kv_cache_dtype.startswith("fp8") and DEVICES[device] < (8, 9):
        why = f"vLLM's TRITON_MLA (the MLA backend on {device}) needs compute capability 8.9 for an fp8 cache"
        raise spec_error("kv_cache_dtype", kv_cache_dtype, why)
    return r


def check_device(device: object) -> str:
    """A GPU generation name (:data:`DEVICES`)."""
    if not isinstance(device, str) or device not in DEVICES:
        raise spec_error("device", device, f"valid: {', '.join(DEVICES)}")
    return device


def resolve(
    *,
    mla: bool,
    device: str,
    kv_cache_dtype: str,
    attention_backend: str | None = None,
    sparse: bool = False,
    qk_nope_head_dim: int | None = None,
    block_size: int | None = None,
) -> Resolved:
    """vLLM 0.33's backend for one kind of attention on ``device`` (``kv_cache_dtype`` as the user
    wrote it: ``auto``, ``fp8``, ...), or the one named by ``attention_backend``. A ``block_size``
    the user set rules out the backends that do not take it, as in vLLM."""
    device = check_device(device)
    major = DEVICES[device][0]
    kind = ("sparse MLA" if sparse else "MLA") if mla else "attention"
    if sparse and attention_backend is None and major != 9:
        why = (
            f"vLLM 0.33's sparse MLA choice on {device} depends on head count and kernels not modeled here; "
            "name one with attention_backend (--attention-backend), e.g. FLASHMLA_SPARSE"
        )
        raise spec_error("device", device, why)
    if attention_backend is not None:
        b = BACKENDS.get(attention_backend) if isinstance(attention_backend, str) else None
        if b is None or b.mla != mla:
            known = ", ".join(n for n, x in BACKENDS.items() if x.mla == mla and x.sparse == sparse)
            raise spec_error("attention_backend", attention_backend, f"valid for {kind}: {known}")
        bad = _why_not(b, major, kv_cache_dtype, qk_nope_head_dim, sparse, block_size)
        if bad is not None:
            raise spec_error("attention_backend", attention_backend, f"vLLM refuses it on {device}: {bad}")
        return _checked(
            Resolved(b, b.preferred_block_size(), f"--attention-backend {b.name}"), device, kv_cache_dtype
        )
    skipped: list[str] = []
    for name in _PRIORITY[(mla, major)]:
        b = BACKENDS[name]
        bad = _why_not(b, major, kv_cache_dtype, qk_nope_head_dim, sparse, block_size)
        if bad is None:
            why = f"first valid {kind} backend on {device} in vLLM's priority list"
            if skipped:
                why += f" (skipped {'; '.join(skipped)})"
            return _checked(Resolved(b, b.preferred_block_size(), why), device, kv_cache_dtype)
        if b.sparse == sparse:
            skipped.append(f"{name}: {bad}")
    why = f"no vLLM {kind} backend on {device} takes it ({'; '.join(skipped)})"
    if sparse and major == 9 and kv_cache_dtype == "fp8_e4m3" and (block_size or 64) % 64 == 0:
        # vLLM's list ends with FLASHINFER_MLA_SPARSE_SM90 (kv dtypes auto, bfloat16, fp8, fp8_e4m3)
        why = (
            f"vLLM 0.33 passes over the sparse MLA backends modeled here ({'; '.join(skipped)}) to "
            "FLASHINFER_MLA_SPARSE_SM90 (FlashInfer's SM90 sparse MLA), whose cache kvlayout does not model"
        )
    elif block_size is not None and any(
        _why_not(BACKENDS[n], major, kv_cache_dtype, qk_nope_head_dim, sparse, None) is None
        for n in _PRIORITY[(mla, major)]
    ):
        # a backend takes this cache at its own block size: the block size the user set is what no one takes
        raise spec_error("block_size", block_size, why)
    raise spec_error("kv_cache_dtype", kv_cache_dtype, why)
