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
from torch import nn


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


def _graph_task() -> int:
    """Id of the backward pass running now (-1 outside one, or where torch does not expose it)."""
    f = getattr(torch._C, "_current_graph_task_id", None)
    return f() if f is not None else -1


class TiedGradient:
    """One (V, E) weight gradient for a token embedding and the output decoder(s) tied to it (Press & Wolf
    2017; BERT's MLM decoder), accumulated in place instead of summed by autograd.

    Autograd gives the tied weight one gradient per use — the decoder's dense ``dlogitsᵀ·x`` and each
    embedding lookup's scatter of its (B·T, E) output gradient — and adds them out of place: a fresh V×E
    tensor (31 MB for BERT's vocabulary) every step. Here, within one backward pass, the first of these
    backward functions to run :meth:`offer`\ s its gradient and returns it to autograd; every later one adds
    its part into that tensor (:meth:`take`) and returns no gradient. Autograd accumulates the weight's
    gradient only after all of them have run, so it receives the complete sum, as a single tensor.

    An offer is taken only inside the backward pass that made it (autograd's graph-task id) and is
    withdrawn once the weight's gradient has been accumulated (a post-accumulate-grad hook), so nothing
    is ever added into a gradient already consumed, and the scratch memory behind it can be reused.
    Where torch exposes no graph-task id, nothing is shared (autograd sums, as without this class).
    """

    def __init__(self):
        self._grad: Optional[torch.Tensor] = None
        self._task = -1
        self._hooked = None  # the Parameter the withdraw hook is registered on

    def watch(self, weight: torch.Tensor) -> bool:
        """Register the withdraw hook on ``weight`` (once per Parameter object). False — do not share —
        when ``weight`` is not a Parameter."""
        if self._hooked is not weight:
            if not isinstance(weight, nn.Parameter):
                return False
            weight.register_post_accumulate_grad_hook(self._withdraw)
            self._hooked, self._grad = weight, None
        return True

    def take(self, shape, dtype) -> Optional[torch.Tensor]:
        """The gradient offered earlier in this backward pass (add into it in place), else None."""
        task, g = _graph_task(), self._grad
        if g is None or task < 0 or task != self._task or tuple(g.shape) != tuple(shape) or g.dtype != dtype:
            return None
        return g

    def offer(self, grad: torch.Tensor) -> None:
        """``grad`` is returned to autograd as this pass's gradient of the weight; later parts go into it."""
        # an alias, not ``grad`` itself: autograd may then adopt ``grad`` as ``weight.grad`` without a copy
        self._grad, self._task = grad.detach(), _graph_task()

    def _withdraw(self, _param) -> None:
        self._grad = None


__all__ = ["ReusedBuffer", "TiedGradient"]
