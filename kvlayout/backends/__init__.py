"""Kernel backends, imported only when asked for.

``kvlayout.backends.cuda`` (folder ``backends/cuda``: Triton, torch) and
``kvlayout.backends.pallas`` (folder ``backends/pallas``: Pallas, JAX) are mapped here by
``pyproject.toml``. Importing this package imports neither torch nor JAX.
"""
