"""glibc malloc settings that keep a long-running server's resident memory flat (Linux; a no-op elsewhere).

A server sees rare huge requests (a 1 MB text, a 10,000-item batch) among many small ones. With glibc's
defaults such a request leaves resident memory behind that later small requests never give back:

* the mmap threshold is *dynamic*: once a large ``mmap``-ed block is freed, glibc raises the threshold to its
  size, so the next large buffers are carved from the heap, where fragmentation pins them (glibc manual,
  "Memory Allocation Tunables": ``M_MMAP_THRESHOLD``; setting it fixes the threshold);
* every thread that allocates may get its own arena (up to 8 per core), each with its own high-water mark
  (``M_ARENA_MAX``).

:func:`tame_malloc` fixes the threshold at 256 KiB (large buffers are mapped and unmapped, so freeing them
returns them to the system) and caps the arenas; :func:`trim` (``malloc_trim(0)``) hands free heap pages back
after a huge request.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Optional

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

_libc: Optional[ctypes.CDLL] = None
_tried = False


def _glibc():
    global _libc, _tried
    if not _tried:
        _tried = True
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim"):
                    _libc = lib
            except OSError:
                _libc = None
    return _libc


def tame_malloc(mmap_threshold: int = 256 * 1024, arenas: int = 4) -> bool:
    """Fix glibc's mmap threshold (and with it the trim threshold) and cap its arenas, for this process.
    Returns True when applied (glibc), False elsewhere."""
    lib = _glibc()
    if lib is None:
        return False
    ok = lib.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)) == 1
    ok &= lib.mallopt(M_TRIM_THRESHOLD, 2 * int(mmap_threshold)) == 1
    ok &= lib.mallopt(M_ARENA_MAX, int(arenas)) == 1
    return bool(ok)


def trim() -> None:
    """Give the free pages of every malloc arena back to the system (glibc ``malloc_trim(0)``)."""
    lib = _glibc()
    if lib is not None:
        lib.malloc_trim(0)


__all__ = ["tame_malloc", "trim"]
