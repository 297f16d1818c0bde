"""Running means of the logged loss terms, kept on the training device between log steps.

Each micro-batch adds its ``loss`` and named ``terms`` (0-d tensors or numbers) to per-name float64 sums
without reading them back to the host; :meth:`RunningMeans.reduce` sums them over ranks and reads them
once per log step (one device→host transfer instead of one per term per micro-batch). The sums are the
same IEEE float64 additions, in the same order, as adding the host values one by one, so the logged means
are unchanged by where they are kept.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ...io import atomic_write_text
from . import distributed as dist_utils


class RunningMeans:
    """Per-name ``(sum, count)`` of the values added since the last :meth:`clear`."""

    def __init__(self, start: dict | None = None):
        """``start``: name → ``(sum, count)`` carried over (a resumed log window)."""
        self._d: dict = {k: (float(s), int(c)) for k, (s, c) in (start or {}).items()}

    def add(self, name: str, value) -> None:
        """Add one value: a tensor (read as float32, summed in float64 where it lives) or a number (rounded to
        float32 first, as a tensor would be)."""
        if torch.is_tensor(value):
            v = value.detach().float().reshape(()).double()
        else:
            v = float(np.float32(value))
        s, c = self._d.get(name, (0.0, 0))
        self._d[name] = (s + v, c + 1)

    def clear(self) -> None:
        self._d.clear()

    def reduce(self, ctx: dist_utils.DistContext) -> dict:
        """name → ``(sum, count)`` as floats, summed over ranks (a collective: every rank must hold the same
        names); the only host sync of the values."""
        keys = sorted(self._d) if ctx.world_size > 1 else list(self._d)  # every rank in one order
        if not keys:
            return {}
        sums = [self._d[k][0] for k in keys]
        dev = next((s.device for s in sums if torch.is_tensor(s)), torch.device("cpu"))
        t = torch.stack([torch.as_tensor(s, dtype=torch.float64, device=dev) for s in sums])
        t = torch.stack([t, torch.tensor([float(self._d[k][1]) for k in keys], dtype=torch.float64, device=dev)], 1)
        if ctx.world_size > 1:
            dist_utils.all_reduce_sum(t, ctx)
        rows = t.tolist()
        if ctx.world_size == 1:
            return {k: (rows[i][0], self._d[k][1]) for i, k in enumerate(keys)}
        return {k: (rows[i][0], rows[i][1]) for i, k in enumerate(keys)}

    def means(self, ctx: dist_utils.DistContext) -> dict:
        """name → mean over every rank's values; a ``*_count`` term (counted per rank's shard) is scaled by
        the number of ranks, so it counts per global micro-batch as in one process."""
        rec = {k: v / max(1, c) for k, (v, c) in self.reduce(ctx).items()}
        for k in rec:
            if k.endswith("_count"):
                rec[k] *= ctx.world_size
        return rec


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the records of ``metrics.jsonl`` written after ``step`` (by a killed run), and a torn last line."""
    if not Path(path).is_file():
        return
    keep = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("step", 0) <= step:
            keep.append(line)
    atomic_write_text(Path(path), "".join(x + "\n" for x in keep))


__all__ = ["RunningMeans", "truncate_metrics"]
