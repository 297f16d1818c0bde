"""Sentence embeddings from token states: mean, CLS and max pooling, optional L2 normalisation.

The pooling an embedding model was trained with is part of the model: a mean-pooled model read through its
[CLS] vector gives worse vectors without any error. Sentence-BERT (Reimers & Gurevych 2019, §3) compares the
three strategies; MEAN is its default and the one the MiniLM checkpoint was trained with.

:func:`pool` is the PyTorch path (training, the torch runner); :func:`pool_numpy` the same arithmetic on the
arrays an ONNX Runtime or static runner returns (serving, ``embed``, ``retrieval-eval``).
"""
from __future__ import annotations

import numpy as np
import torch

from ..checkpoint.layout import (POOLING_MODES, Pooling, carry_pooling, check_pooling_mode as _check,  # noqa: F401
                                 read_pooling, read_truncate_dim, write_pooling, write_truncate_dim)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str = "mean",
         normalize: bool = False) -> torch.Tensor:
    """(B, T, H) ``hidden`` states and (B, T) ``attention_mask`` (1 = token, 0 = padding) → (B, H).

    ``mean``: average over the unmasked positions (a row with none gives zeros); ``cls``: position 0;
    ``max``: element-wise max over the unmasked positions. ``normalize``: divide each row by its L2 norm
    (cosine similarity becomes a dot product). Raises ValueError for an unknown ``mode``.
    """
    _check(mode)
    if mode == "cls":
        out = hidden[:, 0]
    else:
        m = attention_mask.to(hidden.dtype).unsqueeze(-1)
        if mode == "mean":
            out = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
        else:
            out = hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).max(1).values
            out = torch.where(m.sum(1) > 0, out, torch.zeros_like(out))
    return torch.nn.functional.normalize(out, dim=-1) if normalize else out


def pool_numpy(hidden: np.ndarray, attention_mask: np.ndarray, mode: str = "mean",
               normalize: bool = False) -> np.ndarray:
    """:func:`pool` on numpy arrays: (B, T, H), (B, T) → (B, H) float32."""
    _check(mode)
    h = hidden.astype(np.float32, copy=False)
    if mode == "cls":
        out = h[:, 0].copy()
    else:
        m = attention_mask[..., None].astype(np.float32)
        if mode == "mean":  # (B, 1, T) @ (B, T, H): one batched GEMV instead of a (B, T, H) product
            out = np.matmul(m.transpose(0, 2, 1), h)[:, 0] / np.clip(m.sum(1), 1.0, None)
        else:
            out = np.where(m > 0, h, np.finfo(np.float32).min).max(1)
            out = np.where(m.sum(1) > 0, out, 0.0).astype(np.float32)
    if normalize:
        out = out / np.clip(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12, None)
    return out


__all__ = ["POOLING_MODES", "Pooling", "pool", "carry_pooling", "pool_numpy", "read_pooling", "write_pooling",
           "write_truncate_dim", "read_truncate_dim"]
