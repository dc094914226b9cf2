"""The cuda kernel's stores are 16-byte vectors, checked in the PTX Triton compiles for sm_90 on the CPU.

The write ceiling (issue 26) needs 16-byte stores; whether Triton emits them depends on the
alignment hints in :func:`zero_units_kernel` (``tl.multiple_of`` under ``ALIGNED``), which no
interpreter run can see. A refactor that moved the store loop into a ``@triton.jit`` helper
lost them (every store became 4 bytes) while every byte-level test still passed.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.backends.nvidia")
kk = pytest.importorskip("kvlayout.backends.cuda.kernel")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

SIGNATURE = {
    "buf_ptr": "*i32", "ids_ptr": "*i64", "ubase_ptr": "*i64", "ustride_ptr": "*i64", "uwords_ptr": "*i32",
    "err_ptr": "*i64", "count_ptr": "*i32", "num_units": "i64", "id_lo": "i64", "num_blocks": "i64",
    "id_limit": "i64", "total_items": "i64",
}


def ptx(aligned: bool, one_shot: bool, single: bool, sub: int = 2048, warps: int = 8) -> str:
    """PTX of ``zero_units_kernel`` for sm_90 (the buffer pointer 16-byte aligned, as Triton's
    launcher specialises an aligned pointer)."""
    k: Any = kk.zero_units_kernel
    fn = k if isinstance(k, triton.runtime.JITFunction) else triton.jit(k.fn)
    consts = {"SUB": sub, "ALIGNED": aligned, "CACHE": "", "EVICT": "evict_first", "COUNTED": False,
              "ONE_SHOT": one_shot, "SINGLE": single}
    sig = {**SIGNATURE, **{name: "constexpr" for name in consts}}
    src = ASTSource(fn, sig, constexprs=consts, attrs={(0,): [["tt.divisibility", 16]]})
    return str(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"])


def test_every_launch_path_stores_16_byte_vectors() -> None:
    # SUB words over 32 * warps threads: 2,048 / 256 = 8 words = two 16-byte stores per thread and store
    for one_shot, single, stores in ((True, True, 2), (True, False, 4), (False, False, 4)):
        text = ptx(True, one_shot, single)
        v4 = re.findall(r"st\.global\S*\.v4\.b32", text)
        assert len(v4) == stores, (one_shot, single, len(v4))
        assert len(re.findall(r"st\.global", text)) == stores  # no narrower store anywhere
    # the hint is what gives them: without ALIGNED the same path stores 4 bytes at a time
    unaligned = ptx(False, True, True)
    assert not re.findall(r"st\.global\S*\.v4", unaligned) and re.findall(r"st\.global", unaligned)
