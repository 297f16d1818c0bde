"""Low-bit weights: group-wise quantization grids, straight-through fake quantization and the bits-per-layer
allocation of mixed precision (Shen et al. 2020, "Q-BERT: Hessian Based Ultra Low Precision Quantization of
BERT", AAAI; §3.2 group-wise quantization, §3.1 Hessian-aware mixed precision).

**Grid** (:func:`quantize_groups`): a weight matrix ``W`` (N out, K in) is cut along the input dimension into
groups of ``group_size`` consecutive columns (K padded with zeros to a multiple of the group); each row's group
gets its own scale ``s`` and zero point ``z`` (asymmetric, the layout of ONNX Runtime's
``com.microsoft::MatMulNBits``: ``W ≈ s · (q − z)``, ``q, z ∈ {0, …, 2^b − 1}``):

    lo = min(min W_g, 0),  hi = max(max W_g, 0),  s = (hi − lo) / (2^b − 1),  z = clamp(round(−lo / s)),
    q = clamp(round(W / s) + z, 0, 2^b − 1)

(``symmetric``: ``s = max|W_g| / (2^{b−1} − 1)``, ``z = 2^{b−1}``.) The range always holds 0, so zero
weights (pruned units, padding) stay exactly zero.

**Fake quantization** (:class:`FakeQuant`): a weight parametrization whose forward is ``dequantize(quantize(W))``
and whose gradient is the identity — the straight-through estimator (Bengio et al. 2013; Q-BERT §3) — so that
quantization-aware fine-tuning trains the FP32 master weights through the grid.

**Allocation** (:func:`allocate_bits`): every layer starts at the fewest bits; while the size budget allows,
the layer whose next step up buys the largest drop of estimated loss per byte is raised:

    gain(l, b → b') = Ω_l · (‖Q_b(W_l) − W_l‖² − ‖Q_b'(W_l) − W_l‖²) / (bytes_l(b') − bytes_l(b))

where ``Ω_l`` is the layer's Hessian sensitivity (:mod:`bertforge.compress.hessian`; the second-order term of
the loss change, ΔL ≈ ½ ΔWᵀ H ΔW ≈ ½ Ω ‖ΔW‖², Q-BERT §3.1 eq. 2). Sizes count bits × weights + FP32 scales +
packed zero points (:func:`matrix_bytes`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import ConfigError

#: the bit widths a layer may get
BITS = (2, 3, 4, 8)
#: the group sizes offered (columns of the input dimension sharing one scale)
GROUP_SIZES = (16, 32, 64, 128, 256)
#: the width ONNX Runtime stores each bit width in (MatMulNBits runs 2, 4 and 8 bits; 3-bit weights are written
#: on their 3-bit grid in a 4-bit MatMulNBits, exactly: the same s and z, q ≤ 7)
STORED_BITS = {2: 2, 3: 4, 4: 4, 8: 8}


def check_bits(bits) -> int:
    """``bits`` as an int; ConfigError unless it is one of :data:`BITS`."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in BITS:
        raise ConfigError(f"--bits {bits}: choose one of {', '.join(map(str, BITS))} (or mixed)")
    return bits


def check_group_size(group_size) -> int:
    if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise ConfigError(f"--group-size {group_size}: choose one of {', '.join(map(str, GROUP_SIZES))}")
    return int(group_size)


# ----------------------------------------------------------------------------------------------- the grid
def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N, K) → (N, G, group_size), K zero-padded to G · group_size."""
    n, k = w.shape
    g = math.ceil(k / group_size)
    if g * group_size != k:
        w = torch.nn.functional.pad(w, (0, g * group_size - k))
    return w.reshape(n, g, group_size)


def quantize_groups(w: torch.Tensor, bits: int, group_size: int, symmetric: bool = False) -> tuple:
    """Quantize ``w`` (N, K) group-wise along K. Returns ``(q, scale, zero_point)``: ``q`` (N, K) uint8 in
    [0, 2^bits − 1], ``scale`` (N, G) float32, ``zero_point`` (N, G) uint8, G = ceil(K / group_size).
    ``w ≈ dequantize_groups(q, scale, zero_point, group_size)`` (formula in the module doc)."""
    w = w.detach().float()
    n, k = w.shape
    x = _grouped(w, group_size)
    qmax = 2 ** bits - 1
    if symmetric:
        half = 2 ** (bits - 1)
        scale = x.abs().amax(-1) / max(half - 1, 1)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zp = torch.full_like(scale, float(half))
    else:
        lo = x.amin(-1).clamp(max=0.0)
        hi = x.amax(-1).clamp(min=0.0)
        scale = (hi - lo) / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zp = torch.clamp(torch.round(-lo / scale), 0, qmax)
    q = torch.clamp(torch.round(x / scale[..., None]) + zp[..., None], 0, qmax)
    q = q.reshape(n, -1)[:, :k]
    return q.to(torch.uint8), scale.float(), zp.to(torch.uint8)


def dequantize_groups(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, group_size: int) -> torch.Tensor:
    """``scale · (q − zero_point)`` per group: (N, K) float32 from :func:`quantize_groups`' output."""
    n, k = q.shape
    x = _grouped(q.float(), group_size)
    w = (x - zero_point.float()[..., None]) * scale[..., None]
    return w.reshape(n, -1)[:, :k]


def fake_quantize(w: torch.Tensor, bits: int, group_size: int, symmetric: bool = False) -> torch.Tensor:
    """The weights on their grid (``dequantize(quantize(w))``), same shape and dtype as ``w``."""
    q, s, z = quantize_groups(w, bits, group_size, symmetric)
    return dequantize_groups(q, s, z, group_size).to(w.dtype)


def quant_error(w: torch.Tensor, bits: int, group_size: int, symmetric: bool = False) -> float:
    """‖Q_bits(w) − w‖² (sum of squares over the matrix)."""
    return float((fake_quantize(w, bits, group_size, symmetric) - w.detach().float()).pow(2).sum())


class FakeQuant(nn.Module):
    """Weight parametrization: forward ``W ↦ Q(W)`` (the grid of :func:`quantize_groups`), backward the
    identity (straight-through estimator): ``W + (Q(W) − W).detach()``."""

    def __init__(self, bits: int, group_size: int, symmetric: bool = False):
        super().__init__()
        self.bits, self.group_size, self.symmetric = int(bits), int(group_size), bool(symmetric)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w + (fake_quantize(w, self.bits, self.group_size, self.symmetric) - w).detach()


def attach_fake_quant(model: nn.Module, plan: dict, group_size: int, symmetric: bool = False) -> None:
    """Put a :class:`FakeQuant` on ``weight`` of every module named in ``plan`` (module name → bits)."""
    from torch.nn.utils import parametrize
    mods = dict(model.named_modules())
    for name, bits in plan.items():
        parametrize.register_parametrization(mods[name], "weight", FakeQuant(bits, group_size, symmetric))


def bake_fake_quant(model: nn.Module) -> dict:
    """Remove every :class:`FakeQuant`, leaving each weight on its grid: the codes are computed once from the
    FP32 master weight and the weight becomes exactly ``dequantize(q, s, z)``. Returns module name →
    ``(q, scale, zero_point, bits, dequantized)`` (what :func:`bertforge.compress.lowbit_onnx.rewrite_graph`
    writes). Re-quantizing a dequantized weight need not give the same codes, hence this one pass."""
    from torch.nn.utils import parametrize
    out = {}
    for name, m in list(model.named_modules()):
        if not parametrize.is_parametrized(m, "weight"):
            continue
        fq = next(p for p in m.parametrizations["weight"] if isinstance(p, FakeQuant))
        w = m.parametrizations["weight"].original.detach()
        q, s, z = quantize_groups(w, fq.bits, fq.group_size, fq.symmetric)
        dq = dequantize_groups(q, s, z, fq.group_size).to(w.dtype)
        parametrize.remove_parametrizations(m, "weight", leave_parametrized=False)
        with torch.no_grad():
            m.weight.copy_(dq)
        out[name] = (q, s, z, fq.bits, dq)
    return out


# ------------------------------------------------------------------------------------------------- sizes
def matrix_bytes(shape: tuple, bits: int, group_size: int, stored: bool = False) -> int:
    """Bytes of one (N, K) matrix at ``bits``: N·K·bits/8 for the codes, N·G·4 for FP32 scales, N·ceil(G·bits/8)
    for the packed zero points (G = ceil(K / group_size)). ``stored``: with the width ONNX Runtime keeps it in
    (:data:`STORED_BITS`; K padded to whole groups) — the file's bytes — instead of the true ``bits``."""
    n, k = int(shape[0]), int(shape[1])
    g = math.ceil(k / group_size)
    b = STORED_BITS[bits] if stored else bits
    kk = g * group_size if stored else k
    return math.ceil(n * kk * b / 8) + n * g * 4 + n * math.ceil(g * b / 8)


@dataclass
class LayerCost:
    """One unit of the allocation: ``name`` (an encoder layer …), ``shapes`` of its matrices, ``sensitivity``
    Ω (Hessian), ``error`` {bits: Σ ‖Q_bits(W) − W‖² over its matrices}."""

    name: str
    shapes: list
    sensitivity: float
    error: dict = field(default_factory=dict)

    def bytes(self, bits: int, group_size: int) -> int:
        return sum(matrix_bytes(s, bits, group_size) for s in self.shapes)

    @property
    def params(self) -> int:
        return sum(int(s[0]) * int(s[1]) for s in self.shapes)


def ceil_mb(n_bytes: float, decimals: int = 3) -> str:
    """``n_bytes`` in MB rounded *up* at ``decimals`` places: a budget printed as the least to pass must pass."""
    q = 10 ** decimals
    return f"{math.ceil(n_bytes / 2**20 * q) / q:.{decimals}f}"


def allocate_bits(layers: list, budget_bytes: float, group_size: int, fixed_bytes: float = 0.0,
                  choices: tuple = BITS) -> dict:
    """Bits per layer (name → bits, from ``choices``) with ``fixed_bytes`` + Σ layer bytes ≤ ``budget_bytes``,
    greedy on the loss drop per byte (module doc).

    Raises:
        ConfigError: the budget is below every layer at the fewest bits (the message names that size)."""
    choices = tuple(sorted(choices))
    plan = {l.name: choices[0] for l in layers}
    used = fixed_bytes + sum(l.bytes(choices[0], group_size) for l in layers)
    if used > budget_bytes:
        raise ConfigError(f"--size-budget {budget_bytes / 2**20:.4f} MB is below what {choices[0]} bits allow "
                          f"({used / 2**20:.4f} MB for this model); pass at least {ceil_mb(used)}")
    while True:
        best = None
        for l in layers:
            b = plan[l.name]
            if b == choices[-1]:
                continue
            nb = choices[choices.index(b) + 1]
            extra = l.bytes(nb, group_size) - l.bytes(b, group_size)
            if used + extra > budget_bytes:
                continue
            gain = l.sensitivity * (l.error[b] - l.error[nb]) / max(extra, 1)
            if best is None or gain > best[0]:
                best = (gain, l, nb, extra)
        if best is None:
            return plan
        _, l, nb, extra = best
        plan[l.name] = nb
        used += extra


def average_bits(layers: list, plan: dict) -> float:
    """Weight-averaged bits of ``plan`` over ``layers``."""
    n = sum(l.params for l in layers)
    return sum(l.params * plan[l.name] for l in layers) / max(n, 1)


__all__ = ["BITS", "GROUP_SIZES", "STORED_BITS", "check_bits", "check_group_size", "quantize_groups",
           "dequantize_groups", "fake_quantize", "quant_error", "FakeQuant", "attach_fake_quant",
           "bake_fake_quant", "matrix_bytes", "LayerCost", "allocate_bits", "average_bits"]
