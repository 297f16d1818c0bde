"""Which precision a training run uses: ``impl.dtype`` ∈ {float32, bfloat16, auto}.

bf16 autocast pays off only where the hardware multiplies bf16 natively: CUDA GPUs with bf16 support, and x86
CPUs with AVX512-BF16 or AMX-BF16 (ARM: the ``bf16`` extension). On other CPUs PyTorch falls back to a
reference bf16 GEMM: on an AVX2-only AMD EPYC here a (4096×256)·(256×1024) bf16 matmul ran at 1.1 GFLOP/s
against 94 GFLOP/s in float32, so a bf16 run there is ~100× slower, not faster. ``auto`` picks bfloat16
exactly where it is native, and the Trainer warns when bfloat16 is asked for where it is not.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch

from ...hardware import cpu_flags

#: /proc/cpuinfo flags of CPUs with native bf16 dot products
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
DTYPES = ("float32", "bfloat16", "auto")


def native_bf16(device: str = "cpu", flags: Optional[list] = None) -> bool:
    """Whether ``device`` ("cpu", "cuda", "cuda:1", …) has native bf16 matmuls. ``flags``: CPU flags to judge
    (default: this CPU's, from /proc/cpuinfo)."""
    if str(device).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if flags is None:
        flags = cpu_flags()
    return any(f in flags for f in BF16_CPU_FLAGS)


def warn_if_emulated(dtype: str, device: str = "cpu") -> bool:
    """Print a one-line warning to stderr when ``dtype`` is "bfloat16" on a CPU without native bf16; returns
    whether it warned (used by the Trainer and by ``translate decode --bf16``)."""
    if dtype != "bfloat16" or str(device) != "cpu" or native_bf16("cpu"):
        return False
    sys.stderr.write("bertforge: warning: bfloat16 on a CPU without native bf16 (avx512_bf16/amx_bf16): its bf16 "
                     "matmuls are ~100x slower than float32 here; use float32 (impl.dtype=float32 or auto, or "
                     "drop --bf16)\n")
    return True


def resolve_dtype(dtype: str, device: str = "auto") -> str:
    """``auto`` → "bfloat16" where :func:`native_bf16` holds for the run's device, else "float32"; other values
    are returned unchanged. ``device`` "auto" means CUDA when available, else CPU."""
    if dtype != "auto":
        return dtype
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "bfloat16" if native_bf16(device) else "float32"


__all__ = ["BF16_CPU_FLAGS", "DTYPES", "native_bf16", "cpu_flags", "resolve_dtype", "warn_if_emulated"]
