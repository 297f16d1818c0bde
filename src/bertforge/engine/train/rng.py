"""Random-number state of a training run: seeding, a seeded block, and a portable saved state.

Three generators draw during training — Python's ``random``, NumPy's global generator and torch's (CPU, and
each CUDA device). A run is reproducible when all three start from ``train.seed`` (:func:`set_seed`), the
collator's draws for a micro-batch come from a seed that depends only on its position in the data
(:func:`seeded`), and a resumed run restores the state the checkpoint saved (:func:`rng_state` /
:func:`set_rng_state`). The saved state holds only tensors, ints and lists, so
``torch.load(weights_only=True)`` reads it back without unpickling arbitrary objects.
"""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) RNGs. Call it before building a model whose
    fresh weights (e.g. a new head) must be the same in every run and on every rank."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def seeded(seed: int):
    """Run a block under fixed torch/python/numpy RNG seeds (``seed`` an int in [0, 2**63)), restoring the
    outer state afterwards."""
    state = rng_state()
    set_seed(seed)
    try:
        yield
    finally:
        set_rng_state(state)


def rng_state() -> dict:
    """This process's RNG states as tensors/ints/lists only: ``{"python", "numpy", "torch"[, "cuda"]}``."""
    py = random.getstate()
    npst = np.random.get_state()
    s = {"python": [py[0], list(py[1]), py[2]],
         "numpy": [npst[0], torch.from_numpy(npst[1].astype(np.int64)), int(npst[2]), int(npst[3]),
                   float(npst[4])],
         "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda"] = list(torch.cuda.get_rng_state_all())
    return s


def set_rng_state(s: dict) -> None:
    """Restore a state returned by :func:`rng_state` (the CUDA part only where CUDA is available)."""
    random.setstate((s["python"][0], tuple(s["python"][1]), s["python"][2]))
    n = s["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


__all__ = ["set_seed", "seeded", "rng_state", "set_rng_state"]
