"""tpu-inference's native per-layer arrays for a config (GEOMETRY.md section 9, :mod:`kvlayout.native`).

Built from vLLM's spec (tpu-inference copies vLLM's grouping): one array per layer slot,
page axis first, shared by the slot's layers of every group. Attention: ``(pages, page_size,
align(2 * kv_heads, packing) // packing, packing, align(head_dim, 128))``, ``packing = 32 //
dtype bits``; MLA: ``(pages, page_size // 32, 32, align(kv_lora_rank, 128) +
align(qk_rope_head_dim, 128))`` (tpu-inference 0.32.0, CONTEXT.md). Mamba states live per
request slot there, outside the page arrays; the DeepSeek-V3.2/V4 arrays are not modeled and
refused. The page size is vLLM's rule (tpu-inference's own default is not known here: pass
``block_size`` to match a deployment).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import spec_error
from ..native import NativeCacheSpec, NativeLeaf
from ..spec import DTYPE_SIZES, FullAttentionSpec, LayerSpec, MambaSpec, MLASpec
from .base import Ctx, ModelSpec, fmt_int, summary_head

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


def align(x: int, a: int) -> int:
    return -(-x // a) * a


def tpu_page_shape(layer: LayerSpec, c: Ctx) -> tuple[tuple[int, ...], str]:
    """One page of a layer's tpu-inference 0.32 array: its shape and dtype (CONTEXT.md)."""
    if isinstance(layer, FullAttentionSpec):  # ragged paged attention v3: K and V interleaved on heads
        packing = 4 // DTYPE_SIZES[layer.dtype]  # 32 bits // dtype bits
        heads = align(2 * layer.num_kv_heads, packing) // packing
        return (layer.block_size, heads, packing, align(layer.head_size, TPU_LANES)), layer.dtype
    if isinstance(layer, MLASpec) and c.mla_dims is not None and layer.dtype is not None:
        if layer.block_size % 32:
            why = "tpu-inference's MLA arrays hold pages of a multiple of 32 tokens"
            raise spec_error("block_size", layer.block_size, why)
        rank, rope = c.mla_dims
        return (layer.block_size // 32, 32, align(rank, TPU_LANES) + align(rope, TPU_LANES)), layer.dtype
    raise spec_error("engine", "tpu-inference", f"no native array known for {layer.where}")


def tpu_inference_spec(ms: ModelSpec, c: Ctx) -> NativeModelSpec:
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
        shapes = {tpu_page_shape(layer, c) for _, layer in slot}
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


def native_summary(ms: NativeModelSpec, *, proof: bool) -> str:
    spec = ms.spec
    pages = f"{len(spec.leaves)} arrays of {spec.num_blocks} pages (GEOMETRY.md section 9)"
    lines = summary_head(ms, "arrays", f"{ms.block_size}-token pages, {pages}")
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
