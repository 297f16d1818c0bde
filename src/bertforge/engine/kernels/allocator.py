"""Host memory allocator settings (glibc ``malloc``): keep freed memory in a training process
(:func:`keep_freed_memory`), or give it back in a long-running server (:func:`tame_malloc`, :func:`trim`).

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
MLM logits use :class:`bertforge.engine.kernels.scratch.ReusedBuffer` for that. The cost: the process keeps its
peak heap size instead of shrinking between steps. This is the CPU counterpart of PyTorch's CUDA caching
allocator, and an ``impl`` setting (``impl.keep_freed_memory``, default on): numbers are unchanged.

A server wants the opposite. It sees rare huge requests (a 1 MB text, a 10,000-item batch) among many small
ones, and with glibc's defaults resident memory only grows: the mmap threshold is *dynamic* (once a large
mapped block is freed, glibc raises the threshold to its size, so the next large buffers come from the heap,
where fragmentation pins them), and every thread that allocates may get an arena of its own, each with its
own high-water mark. :func:`tame_malloc` fixes the threshold at 256 KiB (large buffers are mapped and
unmapped) and caps the arenas (``M_ARENA_MAX``); :func:`trim` (``malloc_trim(0)``) hands the free pages of
every arena back — ``bertforge serve`` calls it after a huge request and when a model's queue runs empty.

Reference: glibc manual, "Malloc Tunable Parameters" (``mallopt``, ``M_MMAP_THRESHOLD``,
``M_TRIM_THRESHOLD``).
"""
from __future__ import annotations

import ctypes
import functools
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit systems (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = (1 << 31) - 1  # never trim the heap top (a C int)

_applied = False


@functools.lru_cache(maxsize=None)
def _glibc():
    """The process's C library if it is glibc (has ``gnu_get_libc_version`` and ``mallopt``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # absent in musl and other C libraries  # noqa: B018
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
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


def tame_malloc(mmap_threshold: int = 256 * 1024, arenas: int = 4) -> bool:
    """A server's setting (see the module docstring): fix glibc's mmap threshold at ``mmap_threshold`` bytes
    (the trim threshold at twice that) and cap its arenas at ``arenas``, for this process. Returns True when
    applied (glibc), False elsewhere; raises nothing."""
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)) == 1
    ok &= libc.mallopt(M_TRIM_THRESHOLD, 2 * int(mmap_threshold)) == 1
    ok &= libc.mallopt(M_ARENA_MAX, int(arenas)) == 1
    return bool(ok)


def trim() -> None:
    """Give the free pages of every malloc arena back to the system (glibc ``malloc_trim(0)``; a no-op
    without glibc)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


__all__ = ["keep_freed_memory", "tame_malloc", "trim"]
