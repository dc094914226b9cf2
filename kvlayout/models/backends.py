"""The attention backend vLLM 0.33 resolves, and the block sizes that follow from it.

Block size (tokens): 16 for standard attention (FlashAttention), 64 for MLA (FlashMLA),
256 for DeepSeek-V4's compressed layers (:mod:`.deepseek_v4`); a hybrid gets the block of
its alignment rule (:mod:`.hybrid`).
"""

from __future__ import annotations

#: vLLM's tokens per block: FlashAttention, FlashMLA.
VLLM_BLOCK_SIZE = 16
VLLM_MLA_BLOCK_SIZE = 64
#: The attention kernel's block-size unit in vLLM's hybrid alignment (tokens).
HYBRID_BLOCK_UNIT = 16
