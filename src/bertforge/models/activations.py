"""Activation functions by their Hugging Face names (``hidden_act`` in ``config.json``).

``gelu`` is the exact erf form of Hendrycks & Gimpel 2016 (BERT, RoBERTa, ELECTRA); ``gelu_new`` /
``gelu_pytorch_tanh`` its tanh approximation (ALBERT, GPT-2); ``gelu_fast`` the same tanh form written
out; ``quick_gelu`` x·σ(1.702x) (CLIP); ``relu``, ``silu``/``swish`` (Ramachandran et al. 2017), ``tanh``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import ConfigError


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), PyTorch's ``approximate="tanh"`` GELU."""
    return F.gelu(x, approximate="tanh")


def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


#: name → activation (any shape → same shape), with Hugging Face's names (``hidden_act``)
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_fast": gelu_fast,
    "quick_gelu": quick_gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation called ``name``.

    Raises:
        ConfigError: an unknown name (the message lists the known ones).
    """
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ConfigError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}") from None


__all__ = ["ACTIVATIONS", "get_activation", "gelu_tanh", "gelu_fast", "quick_gelu"]
