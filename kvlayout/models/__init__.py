"""From a Hugging Face ``config.json`` to the KV-cache layout an engine allocates (issue 17).

``spec_from_config(config, engine="vllm", tp=..., kv_cache_dtype=...)`` answers "what will
vLLM allocate for this model, and is the zeroing table safe?": it reads the config the way
vLLM does and returns a kvlayout spec with vLLM's layer names, so ``kvlayout.plan`` and
``kvlayout.verify`` apply unchanged. ``from_config`` returns the same spec with what was
decided on the way (:class:`ModelSpec`), and :func:`summary` prints it on one screen.

Every value comes from the config or from an engine rule written in the modules below; a missing field,
a field of the wrong type or an unknown architecture is a :class:`~kvlayout.SpecError`
naming the field (``config.num_key_value_heads``, ``config.text_config.head_dim``), never
a guess. The spec is the cache of **one tensor-parallel rank**.

The rules are vLLM 0.33.0's, read from its source; each module states its part:

- :mod:`.config`: reading ``config.json`` (fields by path, the text config, dtypes, tp);
- :mod:`.families`: the architectures known and the rule that builds each;
- :mod:`.attention`: standard and sliding-window attention (head size, KV heads per rank);
- :mod:`.mla`, :mod:`.deepseek_v4`: multi-head latent attention, DeepSeek V2 to V4;
- :mod:`.hybrid`: Mamba and linear-attention hybrids and vLLM's hybrid block alignment;
- :mod:`.backends`: the attention backend's block sizes;
- :mod:`.grouping`: vLLM's split of layers into KV-cache groups;
- :mod:`.build`, :mod:`.summary`: the entry points and the one-screen summary;
- :mod:`.tpu_inference`: tpu-inference's native per-layer arrays (``engine="tpu-inference"``).

kvlayout's choices, where the engine's layout is not one of kvlayout's:

- Layout ``packed`` for every family: the groups overlay in one block row whose stride is
  the largest group's pages (GEOMETRY.md section 2). vLLM 0.33's per-layer tensors of a
  uniform-page model (one tensor per layer slot, shared by the slot's layers of every group)
  take the same bytes per block (tests/test_models.py checks every vLLM layout: equal bytes per
  block for every family; DeepSeek-V4's mixed pages only on the block-outermost ones);
  ``packed`` is where kvlayout's table and proof apply as they are.
- Multi-token-prediction layers (``num_nextn_predict_layers``) get no cache: vLLM allocates
  them only with speculative decoding.
- Mamba states take their page in every block and are never zeroed (section 1).
"""

from __future__ import annotations

from .base import DEFAULT_NUM_BLOCKS, ENGINES, ModelSpec
from .build import from_config, spec_from_config
from .families import ARCHITECTURES
from .summary import summary
from .tpu_inference import NativeModelSpec

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
