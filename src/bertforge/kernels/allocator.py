"""Host memory allocator settings for CPU training: keep freed memory in the process.

A training step allocates and frees the same large activation, gradient and logits tensors every step.
With glibc's default ``malloc`` a block above the (dynamic) mmap threshold is ``mmap``-ed and handed back
to the kernel when freed, and the top of the heap is trimmed once more than the trim threshold is free;
either way the next step touches fresh pages, and the kernel zero-fills each 4 KiB page on its first touch.
On a 2-core x86 VM an MLM step of the benchmark shape (batch 32 × 128, hidden 256) took 15–27 thousand such
page faults (60–110 MB, 50–90 ms of kernel time); see ``benchmarks/bench_pretrain.py`` and
docs/pretraining.md.

:func:`keep_freed_memory` raises both thresholds (``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` — the largest
value glibc accepts — and ``mallopt(M_TRIM_THRESHOLD, …)``), so blocks up to 32 MiB come from the heap
and freed memory stays there for the next step. Blocks above 32 MiB are still mapped per allocation; the
MLM logits use :class:`bertforge.kernels.scratch.ReusedBuffer` for that. The cost: the process keeps its
peak heap size instead of shrinking between steps. This is the CPU counterpart of PyTorch's CUDA caching
allocator, and an ``impl`` setting (``impl.keep_freed_memory``, default on): numbers are unchanged.

Reference: glibc manual, "Malloc Tunable Parameters" (``mallopt``, ``M_MMAP_THRESHOLD``,
``M_TRIM_THRESHOLD``).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit systems (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = (1 << 31) - 1  # never trim the heap top (a C int)

_applied = False


def _glibc():
    """The process's C library if it is glibc (has ``gnu_get_libc_version`` and ``mallopt``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # absent in musl and other C libraries  # noqa: B018
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> bool:
    """Make glibc ``malloc`` keep freed blocks of up to 32 MiB in the process (see the module docstring).

    Process-wide and idempotent. Returns True when the settings are in force (glibc on Linux), False
    where there is no glibc (macOS, Windows, musl): nothing is changed there. Raises nothing.
    """
    global _applied
    if _applied:
        return True
    libc = _glibc()
    if libc is None:
        return False
    _applied = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and \
        bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied


__all__ = ["keep_freed_memory"]
