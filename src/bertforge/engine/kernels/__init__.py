"""Speed kernels behind ``impl.kernels`` (an ``impl`` key: it changes speed, never results).

The model code in :mod:`bertforge.models` and :mod:`bertforge.objectives` is plain PyTorch and knows
nothing of this package. :func:`apply_kernels` gives a built model faster implementations by swapping the
class of each module listed in :data:`CPU_KERNELS` for its subclass in :mod:`.cpu` (the encoder) or
:mod:`.mlm` (the MLM head) (``m.__class__ = CpuFeedForward``): only ``forward`` changes, so parameters,
buffers, ``state_dict`` and hooks stay as they are, and ``apply_kernels(model, "none")`` swaps every class
back. Each kernel class says ``kernels = "cpu"``, so the model shows what runs: ``model.kernels`` and its
``repr`` (``TaskModel(head='mlm', kernels=cpu)``, ``Encoder(kernels=cpu)``), and the Trainer names it in the
line it prints when a run starts. ModernBERT's encoder has no CPU kernel (it unpads by itself).

Modes: ``cpu`` — the CPU kernels of :mod:`.cpu` (unpadded layers, the last block only where the head
reads, fused attention with cheap dropout masks, gradients in reused memory, the chunked vocabulary
cross-entropy); ``none`` — the plain modules (the path for ``torch.compile`` and for GPUs); ``auto`` —
``cpu`` when the model's parameters are on a CPU, else ``none``. Under ``torch.compile`` the CPU kernels
step aside by themselves (each ``forward`` falls back to the plain one while being compiled), so
``apply_kernels(model, "auto")`` followed by ``torch.compile(model)`` compiles the plain path.

Not a kernel but a CPU speed setting of the same kind: :func:`.allocator.keep_freed_memory`
(``impl.keep_freed_memory``).
"""
from __future__ import annotations

from torch import nn

from ...config import KERNELS
from ...errors import ConfigError
from ...models.attention import MultiHeadAttention
from ...models.embeddings import Embeddings
from ...models.encoder import Encoder, EncoderLayer, FeedForward
from ...objectives.mlm import MLMPrediction
from ...task_model import kernels_of
from . import cpu, mlm
from .dropout import Dropout as CpuDropout

#: plain module class → its CPU kernel class (a subclass that only replaces ``forward``)
CPU_KERNELS: dict[type, type] = {
    Embeddings: cpu.CpuEmbeddings,
    MultiHeadAttention: cpu.CpuMultiHeadAttention,
    FeedForward: cpu.CpuFeedForward,
    EncoderLayer: cpu.CpuEncoderLayer,
    Encoder: cpu.CpuEncoder,
    MLMPrediction: mlm.CpuMLMPrediction,
}

#: (plain module class, attribute) → kernel class of that child: the dropouts of the encoder's own modules
#: draw cheap CPU masks (heads keep torch's dropout)
CPU_CHILD_KERNELS: dict[tuple, type] = {
    (Embeddings, "dropout"): CpuDropout,
    (MultiHeadAttention, "dropout"): CpuDropout,
    (EncoderLayer, "dropout"): CpuDropout,
}

_PLAIN: dict[type, type] = {k: p for p, k in CPU_KERNELS.items()}
_PLAIN[CpuDropout] = nn.Dropout


def resolve_kernels(module: nn.Module, mode: str) -> str:
    """``mode`` (``auto|cpu|none``) → ``cpu`` or ``none`` for ``module``: ``auto`` is ``cpu`` when every
    parameter of ``module`` is on a CPU (or it has none), else ``none``.

    Raises:
        ConfigError: an unknown mode (the message lists the choices).
    """
    if mode not in KERNELS:
        raise ConfigError(f"impl.kernels={mode!r}; choose one of {', '.join(KERNELS)}")
    if mode == "auto":
        return "cpu" if all(p.device.type == "cpu" for p in module.parameters()) else "none"
    return mode


def _swap(m: nn.Module, cls: type) -> None:
    if type(m) is cls:
        return
    teardown = getattr(type(m), "kernel_teardown", None)
    if teardown is not None:
        teardown(m)
    m.__class__ = cls
    setup = getattr(cls, "kernel_setup", None)
    if setup is not None:
        setup(m)


def apply_kernels(module: nn.Module, mode: str = "auto") -> nn.Module:
    """Give ``module`` and every submodule the implementation ``mode`` picks (see the module docstring), in
    place; returns ``module``. Idempotent; ``none`` undoes ``cpu``. Modules of classes without a kernel
    (heads, a quantized Linear, subclasses of the plain classes) are left as they are.

    Raises:
        ConfigError: an unknown mode.
    """
    use = resolve_kernels(module, mode)
    for m in list(module.modules()):
        plain = _PLAIN.get(type(m), type(m))
        if use == "cpu":
            for (owner, name), kernel in CPU_CHILD_KERNELS.items():
                child = m._modules.get(name) if plain is owner else None
                if child is not None and type(child) is nn.Dropout:
                    _swap(child, kernel)
            if plain in CPU_KERNELS:
                _swap(m, CPU_KERNELS[plain])
        elif type(m) in _PLAIN:
            _swap(m, _PLAIN[type(m)])
    return module


def kernels_in_use(module: nn.Module) -> str:
    """``cpu`` when some submodule of ``module`` runs a CPU kernel, else ``none``
    (:func:`bertforge.task_model.kernels_of`: what ``TaskModel.kernels`` says)."""
    return kernels_of(module)


__all__ = ["CPU_KERNELS", "CPU_CHILD_KERNELS", "apply_kernels", "kernels_in_use", "resolve_kernels"]
