"""Scratch memory reused across training steps, and one gradient tensor for tied weights (CPU kernels).

A fresh large CPU tensor is page-faulted in on first touch: on a 2-core x86 VM ~1 µs per 4 KB page, so a
(4096, 1024) FP32 activation gradient costs ~4 ms before any arithmetic, and glibc hands memory of that size
back to the kernel between steps. :class:`ReusedBuffer` keeps one such block and hands it out again once
nothing else holds it; :class:`TiedGradient` builds the gradient of a weight shared by the token embedding
and the MLM decoder in one tensor instead of summing two.
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
    ``empty(shape, dtype, device)`` → uninitialised tensor of ``shape``; a new block has 1/8 more room than
    asked for."""

    def __init__(self):
        self._buf: Optional[torch.Tensor] = None

    def empty(self, shape, dtype, device) -> torch.Tensor:
        n = math.prod(shape)
        b = self._buf
        if (b is None or b.numel() < n or b.dtype != dtype or b.device != torch.device(device)
                or not _storage_unshared(b)):
            # 1/8 headroom: sizes that vary a little from step to step (the MLM logits' row count is the
            # number of masked tokens) then reuse one block instead of mapping a larger one every few steps
            b = self._buf = torch.empty(n + n // 8, dtype=dtype, device=device)
        # a tensor on the same storage that is not an autograd view of the buffer (in-place autograd
        # Functions with several outputs, like the biased CE, refuse views)
        return torch.empty(0, dtype=dtype, device=device).set_(b.untyped_storage(), 0, tuple(shape))


def _graph_task() -> int:
    """Id of the backward pass running now (-1 outside one, or where torch does not expose it)."""
    f = getattr(torch._C, "_current_graph_task_id", None)
    return f() if f is not None else -1


class TiedGradient:
    """One (V, E) weight gradient for a token embedding and the output decoder(s) tied to it (Press & Wolf
    2017; BERT's MLM decoder), completed in place instead of summed by autograd.

    Autograd gives the tied weight one gradient per use — the decoder's dense ``dlogitsᵀ·x`` and each
    embedding lookup's scatter of its (B·T, E) output gradient — and adds them out of place: a fresh V×E
    tensor (31 MB for BERT's vocabulary) every step, plus a zeroed, mostly-empty V×E block for the lookup.
    Here, within one backward pass, the first of these backward functions to run offers (:meth:`offer`) and
    returns its dense gradient; every later one defers (:meth:`defer`) its part (e.g. "add these rows") and
    returns none.
    A hook on the weight then receives the gradient autograd has summed from everything returned — the
    offered tensor alone, or its sum with uses of the weight that know nothing of this class — and applies
    the deferred parts to it: in place when it is the offered tensor, else to a copy. The result is always
    the full sum, whatever else uses the weight.

    Parts are applied only in the backward pass that deferred them (autograd's graph-task id), and the
    state is dropped once the weight's gradient has been accumulated (a post-accumulate-grad hook). Where
    torch exposes no graph-task id, nothing is offered or deferred (autograd sums, as without this class).
    """

    def __init__(self):
        self._task = -1
        self._offered: Optional[torch.Tensor] = None
        self._deferred: list = []
        self._handle = None  # of the hook on the watched Parameter (hook ids are unique across tensors)

    # copies and pickles (deepcopy goes through these too) start afresh: a copied model's weight is a new
    # Parameter without our hooks, and offered tensors or deferred closures must not travel
    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def watch(self, weight: torch.Tensor) -> bool:
        """Register the hooks on ``weight`` unless it already carries them (once per Parameter object, again
        if it has lost them). False — do not share — when ``weight`` is not a Parameter."""
        if self._handle is None or self._handle.id not in (getattr(weight, "_backward_hooks", None) or {}):
            if not isinstance(weight, nn.Parameter):
                return False
            self._handle = weight.register_hook(self._complete)
            weight.register_post_accumulate_grad_hook(self._drop)
            self._drop(None)
        return True

    def offered(self) -> bool:
        """Whether a dense gradient has been offered in the backward pass running now."""
        task = _graph_task()
        return task >= 0 and task == self._task and self._offered is not None

    def offer(self, grad: torch.Tensor) -> None:
        """``grad`` is returned to autograd as this pass's dense gradient of the weight."""
        # an alias, not ``grad`` itself: autograd may then adopt ``grad`` as ``weight.grad`` without a copy
        self._task, self._offered, self._deferred = _graph_task(), grad.detach(), []

    def defer(self, add_into) -> None:
        """``add_into(g)`` adds this use's part into the weight's gradient ``g`` in place, once autograd has
        summed what the backward functions returned. Call only when :meth:`offered`."""
        self._deferred.append(add_into)

    def _complete(self, grad: torch.Tensor) -> Optional[torch.Tensor]:
        if not self._deferred or _graph_task() != self._task:
            return None
        parts, self._deferred = self._deferred, []
        own = self._offered is not None and grad.data_ptr() == self._offered.data_ptr()
        g = grad if own else grad.clone()  # never write into a tensor some other use handed to autograd
        for add_into in parts:
            add_into(g)
        return None if own else g

    def _drop(self, _param) -> None:
        self._offered, self._deferred = None, []


def share_tied_gradient(embedding: nn.Module) -> None:
    """Give ``embedding`` (an ``nn.Embedding`` a decoder is tied to) its :class:`TiedGradient`, once."""
    if getattr(embedding, "_tied_gradient", None) is None:
        embedding._tied_gradient = TiedGradient()


def tied_gradient(embedding: nn.Module) -> Optional[TiedGradient]:
    """The :class:`TiedGradient` of ``embedding``, watching its weight; None when it has none (no tied
    decoder) or the weight is not a Parameter."""
    tied = getattr(embedding, "_tied_gradient", None)
    return tied if tied is not None and tied.watch(embedding.weight) else None


__all__ = ["ReusedBuffer", "TiedGradient", "share_tied_gradient", "tied_gradient"]
