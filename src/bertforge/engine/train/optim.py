"""Optimiser and learning-rate schedules.

AdamW (Loshchilov & Hutter 2019) with no weight decay on biases and LayerNorm weights, as BERT
(Devlin et al. 2018, App. A.2). Schedules (multiplier of the peak lr, by step):

* ``linear``: linear warmup, then linear decay to 0 (BERT);
* ``cosine``: linear warmup, then half-cosine decay to 0;
* ``constant``: linear warmup, then constant;
* ``inverse_sqrt``: the Transformer's schedule (Vaswani et al. 2017, eq. 3),
  ``lr = peak · min(step/warmup, sqrt(warmup/step))`` — with peak = d_model^-0.5 · warmup^-0.5 this is
  exactly ``d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ...errors import ConfigError


def param_groups(model: nn.Module, weight_decay: float) -> list:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or "LayerNorm" in name or "norm" in name.split(".")[-2:][0].lower():
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.999),
                   eps: float = 1e-8) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay)
    if not any(g["params"] for g in groups):
        raise ConfigError("the model has no trainable parameters")
    # the fused kernel (one pass over each parameter, CPU and CUDA; transformers' default optimizer too)
    # is several times cheaper than the multi-tensor path for the large embedding matrix
    for kw in ({"fused": True}, {"foreach": True}, {}):
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **kw)
        except (TypeError, RuntimeError):
            continue
    raise ConfigError("could not build AdamW for these parameters")


def lr_lambda(schedule: str, warmup: int, total: int):
    """Return f(step) → multiplier of the peak learning rate (step counts optimizer updates from 0)."""
    if schedule not in ("linear", "cosine", "constant", "inverse_sqrt"):
        raise ConfigError(f"train.schedule={schedule!r}; choose linear, cosine, constant or inverse_sqrt")

    def f(step: int) -> float:
        s = step + 1
        if schedule == "inverse_sqrt":
            w = max(1, warmup)
            return min(s / w, math.sqrt(w / s))
        if s <= warmup:
            return s / max(1, warmup)
        if schedule == "constant":
            return 1.0
        progress = (s - warmup) / max(1, total - warmup)
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return f


def make_scheduler(optimizer, schedule: str, warmup: int, total: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(schedule, warmup, total))


def set_peak_lr(scheduler, optimizer, lr: float) -> float:
    """Make ``lr`` the peak of a restored LambdaLR ``scheduler`` (its state carries the peak of the run that
    saved it) and set every parameter group's rate for the scheduler's next step. Returns the previous peak."""
    old = list(scheduler.base_lrs)
    new = [float(lr)] * len(old)
    scheduler.base_lrs = new
    # the rate of the next step, also when the schedule's length changed (train.max_steps)
    for group, base, factor in zip(optimizer.param_groups, new, scheduler.lr_lambdas):
        group["initial_lr"] = base
        group["lr"] = base * factor(scheduler.last_epoch)
    return old[0] if old else float(lr)


def resume_notes(checkpoint: str, step: int, old_lr: float, lr: float, schedule: str, planned, total: int,
                 warmup_of) -> list:
    """What a resumed run changes about the schedule, as lines to print: a new peak ``lr`` (the run had
    ``old_lr``), and a new length (``planned`` → ``total`` steps) where the rate depends on it (linear and
    cosine decay; the others through a warm-up ratio, ``warmup_of(total)``)."""
    notes = []
    if old_lr != float(lr):
        notes.append(f"bertforge: resuming from {checkpoint} with train.lr={lr:g} (the run had {old_lr:g}): the "
                     f"schedule continues from step {step} with the new peak")
    moves = schedule in ("linear", "cosine") or warmup_of(planned or 0) != warmup_of(total)
    if planned is not None and planned != total and moves:
        notes.append(f"bertforge: resuming at step {step} a run planned for {planned} steps as one of {total}: the "
                     f"learning-rate schedule is recomputed over {total} steps (the rate jumps), so this is not "
                     f"the same as one run of {total} steps")
    return notes
