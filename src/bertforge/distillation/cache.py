"""Teacher outputs cached on disk, memory-mapped (``numpy.lib.format.open_memmap``).

The first time an example is seen, the teacher runs and its features (logits, the hidden states /
attention scores / probabilities / values of the mapped teacher layers) are written to one ``.npy`` file
per feature, padded to ``max_len``; a ``filled`` byte per example records what is present. Later epochs
(and resumed runs) read them back and only the student runs. ``meta.json`` holds a fingerprint of the
teacher, data and features: a cache made for other inputs is discarded and rebuilt.

Storage, as each feature's row of :data:`~bertforge.distillation.features.FEATURES` says (``shape``, ``seq_axes``,
``float32``): logits float32 (n, C); pooled embeddings float32 (n, H); score margins float32 (n, 1); hidden
(n, T, H), attention maps (n, heads, T, T), values (n, heads, T, d_k) float16. Valid only for deterministic
inputs (no dynamic masking).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..io import atomic_write_text
from .features import get_feature


def _row(name: str):
    """The :class:`~bertforge.distillation.features.Feature` of a cached feature name ``"<row>.<index>"``."""
    return get_feature(name.split(".")[0])


def is_cache_dir(d) -> bool:
    """Whether ``d`` may serve as a teacher cache: new, empty, or holding only what a
    :class:`TeacherCache` writes (``meta.json`` with its keys, ``.npy`` files)."""
    d = Path(d)
    if not d.exists():
        return True
    if not d.is_dir():
        return False
    files = list(d.iterdir())
    if not files:
        return True
    if any(not f.is_file() or (f.suffix != ".npy" and f.name != "meta.json") for f in files):
        return False
    try:
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and {"n", "shapes", "fingerprint"} <= set(meta)


class TeacherCache:
    """Disk cache of teacher features for ``n`` examples.

    Args:
        root: directory (created).
        n: number of examples (indices 0…n−1 = dataset positions).
        shapes: feature name (``"<kind>.<layer or teacher>"``) → per-example shape with T = max_len.
        fingerprint: any JSON-able description of teacher + data; a mismatch rebuilds the cache.
    """

    def __init__(self, root, n: int, shapes: dict, fingerprint: dict):
        self.root = Path(root)
        self.n, self.shapes = n, {k: tuple(v) for k, v in shapes.items()}
        meta = {"n": n, "shapes": {k: list(v) for k, v in self.shapes.items()}, "fingerprint": fingerprint}
        mp = self.root / "meta.json"
        if mp.is_file():
            try:
                old = json.loads(mp.read_text())
            except json.JSONDecodeError:
                old = None
            if old != json.loads(json.dumps(meta)):
                for f in [mp, *self.root.glob("*.npy")]:  # only this cache's files (see is_cache_dir)
                    f.unlink(missing_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        fresh = not mp.is_file()
        mode = "w+" if fresh else "r+"
        self.arrays = {}
        for name, shape in self.shapes.items():
            dtype = np.float32 if _row(name).float32 else np.float16
            self.arrays[name] = np.lib.format.open_memmap(self.root / f"{name}.npy", mode=mode,
                                                          dtype=dtype, shape=(n, *shape))
        self.filled = np.lib.format.open_memmap(self.root / "filled.npy", mode=mode, dtype=np.uint8,
                                                shape=(n,))
        if fresh:
            atomic_write_text(mp, json.dumps(meta))

    def has(self, idx: torch.Tensor) -> bool:
        return bool(self.filled[idx.cpu().numpy()].all())

    @property
    def complete(self) -> bool:
        return bool(self.filled.all())

    def write(self, idx: torch.Tensor, feats: dict, lengths: torch.Tensor) -> None:
        """Store the batch's features (tensors with the batch's T ≤ max_len) at rows ``idx``."""
        rows = idx.cpu().numpy()
        for name, t in feats.items():
            arr = self.arrays[name]
            x = t.detach().float().cpu().numpy()
            if _row(name).masked_as_zero:  # masked entries hold the dtype minimum: store 0 there
                x = np.where(x < -1e4, 0.0, x)
            x = x.astype(arr.dtype)
            slices = [slice(None)] + [slice(0, s) for s in x.shape[1:]]
            block = np.zeros((len(rows), *arr.shape[1:]), dtype=arr.dtype)
            block[tuple(slices)] = x
            arr[rows] = block
        self.filled[rows] = 1

    def read(self, idx: torch.Tensor, t: int, device) -> dict:
        """Features of rows ``idx`` cut to sequence length ``t``, as float32 tensors on ``device``."""
        rows = idx.cpu().numpy()
        out = {}
        for name, arr in self.arrays.items():
            x = arr[rows]
            sl = [slice(None)] * x.ndim
            for ax in _row(name).seq_axes:
                sl[ax + 1] = slice(0, t)
            out[name] = torch.from_numpy(np.ascontiguousarray(x[tuple(sl)])).to(device, torch.float32)
        return out

    def flush(self) -> None:
        for a in self.arrays.values():
            a.flush()
        self.filled.flush()
