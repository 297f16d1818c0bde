"""Hessian sensitivity of parameter blocks without forming the Hessian (Shen et al. 2020, Q-BERT §3.1).

Both estimates need only Hessian-vector products, ``Hv = ∂(gᵀv)/∂θ`` with ``g = ∂L/∂θ`` kept in the autograd
graph (Pearlmutter 1994), restricted to one block of parameters (the diagonal block ``H_ll`` of a layer):

* :func:`top_eigenvalue` — power iteration ``v ← H v / ‖H v‖``, the Rayleigh quotient ``vᵀ H v`` as the
  estimate (Q-BERT Alg. 1). It converges to the eigenvalue of largest magnitude; the error after k steps is
  at most ``(λ_max − λ_min) · tan²θ₀ · (|λ₂| / |λ₁|)^{2k}`` (θ₀: angle of the start vector to the top
  eigenvector; Golub & Van Loan §8.2.1).
* :func:`hutchinson_trace` — ``tr(H) ≈ (1/m) Σ zᵢᵀ H zᵢ`` with Rademacher ``zᵢ`` (Hutchinson 1990): unbiased,
  variance ``2 (‖H‖_F² − Σ H_ii²) / m``.

:func:`block_sensitivities` runs both on calibration batches of a model's task loss, per named block:
Q-BERT's Ω = mean + std of the top eigenvalue over the batches, and the mean trace per parameter.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def hvp(grads: tuple, params: list, v: list) -> list:
    """``H v`` for ``params`` given their first derivatives ``grads`` (made with ``create_graph=True``)."""
    dot = sum((g * x).sum() for g, x in zip(grads, v))
    out = torch.autograd.grad(dot, params, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if o is None else o.detach() for o, p in zip(out, params)]


def _dot(a: list, b: list) -> float:
    return float(sum((x * y).sum() for x, y in zip(a, b)))


def top_eigenvalue(hv: Callable[[list], list], shapes: list, iters: int = 20, tol: float = 1e-4,
                   generator: Optional[torch.Generator] = None, v0: Optional[list] = None) -> tuple:
    """Power iteration on the operator ``hv`` (list of tensors → list of tensors of ``shapes``). Start from
    ``v0`` (default a Gaussian draw of ``generator``), stop after ``iters`` products or when the Rayleigh
    quotient changes by less than ``tol`` relative (``tol`` 0: always ``iters``). Returns ``(eigenvalue, iterations run)``."""
    v = [x.clone() for x in v0] if v0 is not None else [torch.randn(s, generator=generator) for s in shapes]
    norm = math.sqrt(_dot(v, v)) or 1.0
    v = [x / norm for x in v]
    lam, k = 0.0, 0
    for k in range(1, iters + 1):
        hvv = hv(v)
        new = _dot(v, hvv)  # Rayleigh quotient, v of unit norm
        norm = math.sqrt(_dot(hvv, hvv))
        if norm == 0.0:
            return 0.0, k
        v = [x / norm for x in hvv]
        done = tol > 0 and k > 1 and abs(new - lam) <= tol * max(abs(new), 1e-12)
        lam = new
        if done:
            break
    return lam, k


def hutchinson_trace(hv: Callable[[list], list], shapes: list, samples: int = 8,
                     generator: Optional[torch.Generator] = None) -> float:
    """Hutchinson's estimate of ``tr(H)`` from ``samples`` Rademacher probes."""
    total = 0.0
    for _ in range(samples):
        z = [torch.randint(0, 2, s, generator=generator).float() * 2 - 1 for s in shapes]
        total += _dot(z, hv(z))
    return total / samples


def block_sensitivities(model, loss_fn: Callable, batches: list, blocks: dict, iters: int = 20,
                        trace_samples: int = 8, seed: int = 0) -> dict:
    """Per block (name → list of parameters of ``model``): ``{"eig": [λ per batch], "omega": mean + std of λ
    (Q-BERT §3.1), "trace": mean Hutchinson trace, "trace_per_param": trace / parameters, "iters": [...]}``.
    ``loss_fn(model, batch)`` → the scalar task loss on one calibration batch. The model is put in eval mode
    (no dropout: the Hessian of one fixed function)."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    every = [p for ps in blocks.values() for p in ps]
    saved = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in every:
        p.requires_grad_(True)
    out = {name: {"eig": [], "trace": [], "iters": []} for name in blocks}
    try:
        for batch in batches:
            with sdpa_kernel([SDPBackend.MATH]):  # the fused CPU attention kernels have no double backward
                loss = loss_fn(model, batch)
            grads = torch.autograd.grad(loss, every, create_graph=True)
            by_param = dict(zip(map(id, every), grads))
            for name, ps in blocks.items():
                gs = tuple(by_param[id(p)] for p in ps)
                shapes = [p.shape for p in ps]
                op = (lambda v, gs=gs, ps=ps: hvp(gs, ps, v))
                lam, k = top_eigenvalue(op, shapes, iters, generator=g)
                out[name]["eig"].append(lam)
                out[name]["iters"].append(k)
                out[name]["trace"].append(hutchinson_trace(op, shapes, trace_samples, generator=g))
            del grads, by_param, loss
    finally:
        for p, r in zip(model.parameters(), saved):
            p.requires_grad_(r)
    for name, ps in blocks.items():
        e = torch.tensor(out[name]["eig"], dtype=torch.float64)
        r = out[name]
        r["omega"] = float(e.mean().abs() + (e.std() if len(e) > 1 else 0.0))
        r["trace"] = float(sum(r.pop("trace")) / len(batches))
        r["trace_per_param"] = r["trace"] / sum(p.numel() for p in ps)
    return out


__all__ = ["hvp", "top_eigenvalue", "hutchinson_trace", "block_sensitivities"]
