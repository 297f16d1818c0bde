"""Scratch memory reused across training steps.

A fresh large CPU tensor is page-faulted in on first touch: on our 2-core VM ~1 µs per 4 KB page, so a
(4096, 1024) FP32 activation gradient costs ~4 ms before any arithmetic, and glibc hands memory of that size
back to the kernel between steps. :class:`ReusedBuffer` keeps one such block and hands it out again once
nothing else holds it.
"""
from __future__ import annotations

import math
from typing import Optional

import torch


def _storage_unshared(t: torch.Tensor) -> bool:
    use_count = getattr(torch._C, "_storage_Use_Count", None)  # absent in some builds: then never reuse
    # 2 = ``t`` itself + the temporary storage object of this call
    return use_count is not None and use_count(t.untyped_storage()._cdata) <= 2


class ReusedBuffer:
    """Scratch memory handed out again once nothing — no tensor, view, detached alias or autograd saved
    tensor — still shares it (checked with the storage's reference count); otherwise a fresh tensor.

    Why: see the module docstring; for the (617, 30522) FP32 logits of one MLM step the page faults cost
    20–30 ms, more than the arithmetic that fills them.
    ``empty(shape, dtype, device)`` → uninitialised tensor of ``shape``."""

    def __init__(self):
        self._buf: Optional[torch.Tensor] = None

    def empty(self, shape, dtype, device) -> torch.Tensor:
        n = math.prod(shape)
        b = self._buf
        if (b is None or b.numel() < n or b.dtype != dtype or b.device != torch.device(device)
                or not _storage_unshared(b)):
            b = self._buf = torch.empty(n, dtype=dtype, device=device)
        return b[:n].view(shape)


__all__ = ["ReusedBuffer"]
