"""What the hostile-pass tests of the cuda zeroer share (tests/test_hostile_s28.py to s31): the backend or a
skip, its device (buffers and device ids go there: the CPU under Triton's interpreter, CUDA natively, so
scripts/gpu_run.sh runs the same tests on a GPU), a table of eight 256 B blocks of one group, and the blocks
a write changed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvlayout as K
from kvlayout.table import Segment, SegmentTable


def cuda() -> tuple[Any, Any]:
    """(torch, kvlayout.backends.cuda), or skip the test where either cannot be imported."""
    torch = pytest.importorskip("torch")
    kc = pytest.importorskip("kvlayout.backends.cuda")
    return torch, kc


def device() -> str:
    """The torch device type the cuda backend's buffers live on (``DEVICE_TYPE``: ``cpu`` or ``cuda``)."""
    return str(cuda()[1].DEVICE_TYPE)


def to_dev(tensor: Any) -> Any:
    """``tensor`` on the backend's device (itself under the interpreter). Call it outside any test mode: a
    TorchFunctionMode sees its ``.to()``."""
    return tensor.to(device())


def to_host(tensor: Any) -> np.ndarray:
    """A tensor's bytes read back to the host as NumPy (shared with it where it is a CPU tensor)."""
    return tensor.detach().cpu().numpy()  # type: ignore[no-any-return]


def eight() -> SegmentTable:
    """Eight blocks of 256 B, group ``a``'s one row covering each whole."""
    return SegmentTable(256 * 8, 8, (Segment(0, 256, 256, "a", "la"),))


def zeroed_blocks(before: np.ndarray, after: np.ndarray) -> list[int]:
    """The 256 B blocks in which ``after`` differs from ``before``."""
    return sorted({a // 256 for a, b in K.changed_ranges(before, after).tolist() for a in range(a, b, 256)})


def verifying_zeroer(num_blocks: int = 8) -> tuple[Any, list[list[int]]]:
    """The vLLM plugin's verify-mode class over a stand-in for vLLM's kernel module, as after a proven
    construction on the CPU: ``(zeroer, launches)``, each launch recorded as the ids it was given."""
    import types

    torch, _ = cuda()
    from kvlayout.integrations import vllm_plugin as P

    launches: list[list[int]] = []

    class Kernel:
        def __getitem__(self, grid: object) -> object:
            return lambda *args, **kw: launches.append(args[3].tolist())

    cls = P._verifying_class(type("VLLMBase", (), {}), types.SimpleNamespace(_zero_kv_blocks_kernel=Kernel()))
    z = cls.__new__(cls)
    z._meta = (*(torch.zeros(1, dtype=torch.int64) for _ in range(3)), 1, 1024, 1)
    z.kvlayout_num_blocks, z.kvlayout_pin_memory, z.device = num_blocks, False, torch.device("cpu")
    return z, launches
