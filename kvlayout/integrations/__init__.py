"""Adapters from serving engines' own objects to kvlayout specs.

Each adapter lives in its own module and imports its engine lazily, inside its functions:
``import kvlayout`` (and ``import kvlayout.integrations``) never imports vLLM.

- :mod:`kvlayout.integrations.vllm`: :func:`~kvlayout.integrations.vllm.spec_from_kv_cache_config`
  turns vLLM 0.33's ``KVCacheConfig`` and resolved ``KVCacheLayout`` into a
  :class:`~kvlayout.spec.KVCacheSpec`; :func:`~kvlayout.integrations.vllm.table_from_block_zeroer`
  reads a ``KVBlockZeroer``'s segments as a :class:`~kvlayout.table.SegmentTable`.
- :mod:`kvlayout.integrations.vllm_plugin`: vLLM's general plugin (entry point
  ``vllm.general_plugins``), which proves vLLM's own zeroer table at start-up or replaces the
  zeroer, as ``KVLAYOUT_VLLM_MODE`` says (``verify``, ``replace`` or ``off``).
"""
