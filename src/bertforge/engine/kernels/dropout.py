"""Dropout (Srivastava et al. 2014, JMLR 15) with a cheap keep-mask, for CPU training.

Inverted dropout: in training each element is kept with probability 1 − p and scaled by 1 / (1 − p), so the
expectation is unchanged; in eval it is the identity. ``torch``'s CPU dropout draws one Bernoulli per element
in the tensor's dtype (about 4 ns per element on a 2-core x86 VM, ~15% of a small BERT's training step),
and even ``int16.random_()`` runs its Mersenne Twister one number at a time (~5 ns per element). Here the
mask comes from 16-bit uniform integers cut out of numpy's SFC64 generator (Small Fast Chaotic, 64-bit
outputs, ~1 ns per element) compared with a threshold. The SFC64 stream is seeded per mask with a 63-bit
number drawn from torch's default generator, so ``torch.manual_seed`` still reproduces every mask.
p is rounded to a multiple of 2⁻¹⁶ (p = 0.1 → 0.099998); the scale uses that rounded p, so the expectation
is still exact. :class:`Dropout` has the module API of :class:`torch.nn.Dropout`; on other devices it defers
to :func:`torch.nn.functional.dropout`. The masks differ from torch's (another random stream), so a model
trained with these kernels and one trained without see different dropout masks under the same seed.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

#: resolution of the drop probability: masks compare uniform integers in [0, 2¹⁶) with a threshold
MASK_LEVELS = 1 << 16


def _threshold(p: float) -> int:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return round(p * MASK_LEVELS)


def _uniform_int16(shape, device=None) -> torch.Tensor:
    """int16 tensor of ``shape`` with i.i.d. values uniform over all 2¹⁶ values; on CPU from SFC64 seeded by
    the default torch generator (reproducible under ``torch.manual_seed``)."""
    shape = torch.Size(shape)
    if device is not None and torch.device(device).type != "cpu":
        return torch.randint(-(1 << 15), 1 << 15, shape, dtype=torch.int16, device=device)
    seed = int(torch.randint(0, (1 << 63) - 1, (), dtype=torch.int64))
    n = shape.numel()
    raw = np.random.SFC64(seed).random_raw((n + 3) // 4)  # 4 × 16 bits per 64-bit output
    return torch.from_numpy(raw.view(np.int16)[:n]).view(shape)


def keep_mask(shape, p: float, device=None) -> tuple:
    """A bool keep-mask of ``shape`` (True with probability 1 − p′, p′ = round(p·2¹⁶)/2¹⁶) and its scale
    1 / (1 − p′). Seeded from the default torch generator (``torch.manual_seed`` reproduces it).

    Raises:
        ValueError: p outside [0, 1).
    """
    t = _threshold(p)
    return _uniform_int16(shape, device) >= t - (1 << 15), MASK_LEVELS / (MASK_LEVELS - t)


def scaled_keep_mask(shape, p: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The keep-mask of :func:`keep_mask` (same draws from the same seed) as a CPU float tensor of ``dtype``
    holding 0 or the scale 1 / (1 − p′): dropout is then one multiply, forward and backward. torch's CPU
    ``float × uint8`` first casts the mask to float in a separate pass, so 4 bytes per element buy ~3× less
    time than 1; use it for FP32/FP64 (in bf16/fp16 the scale would be rounded).

    Raises:
        ValueError: p outside [0, 1).
    """
    t = _threshold(p)
    mask = torch.empty(torch.Size(shape), dtype=dtype)
    torch.ge(_uniform_int16(shape), t - (1 << 15), out=mask)
    return mask.mul_(MASK_LEVELS / (MASK_LEVELS - t))


def apply_mask(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """x · keep for a bool ``keep``, multiplied as uint8 (torch's CPU kernel for float × uint8 is vectorised
    and ~2× faster than float × bool or ``torch.where``; the values are identical); a uint8 or float mask
    is multiplied as it is."""
    return torch.mul(x, keep.view(torch.uint8) if keep.dtype == torch.bool else keep)


class _MaskedScale(torch.autograd.Function):
    """y = x · mask · scale; ∂y/∂x = mask · scale. ``mask`` is either the 1-byte keep-mask of :func:`keep_mask`
    with its ``scale``, or the float 0-or-scale mask of :func:`scaled_keep_mask` with ``scale`` = 1."""

    @staticmethod
    def forward(ctx, x, mask, scale: float):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        y = apply_mask(x, mask)
        return y if scale == 1.0 else y.mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        g = apply_mask(grad, mask)
        return (g if ctx.scale == 1.0 else g.mul_(ctx.scale)), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Functional form of :class:`Dropout`: x (any shape) → same shape and dtype."""
    if not training or p == 0.0:
        return x
    if p >= 1.0 or x.device.type != "cpu":
        return F.dropout(x, p, training)
    if x.dtype in (torch.float32, torch.float64):
        return _MaskedScale.apply(x, scaled_keep_mask(x.shape, p, x.dtype), 1.0)
    keep, scale = keep_mask(x.shape, p, x.device)
    return _MaskedScale.apply(x, keep, scale)


class Dropout(nn.Dropout):
    """Drop-in :class:`torch.nn.Dropout` (same ``p``, ``train()``/``eval()``) with the cheap CPU mask; under
    ``torch.compile`` it is torch's dropout."""

    kernels = "cpu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return super().forward(x)
        return dropout(x, self.p, self.training)


__all__ = ["MASK_LEVELS", "Dropout", "apply_mask", "dropout", "keep_mask", "scaled_keep_mask"]
