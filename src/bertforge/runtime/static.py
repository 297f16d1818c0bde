"""The static backend: a static embedding dir (``bertforge distill --method static``) run by PyTorch.

A static model has no transformer: its ``last_hidden_state`` is the (B, T, d) token vectors of its one
table (:class:`bertforge.models.static.StaticEmbedding`), which every consumer mean-pools as it pools an
encoder's states (``embed-eval``, ``retrieval-eval``, ``embed``, ``bench``, the server). It reports
``backend="torch"``: it is bertforge's PyTorch model of that dir. ``load_runner(dir, backend="onnxruntime")``
exports it on the fly to the Gather + masked-mean graph of :func:`bertforge.compress.onnx.deploy_static`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .base import Runner, check_threads


class StaticRunner(Runner):
    """A :class:`~bertforge.models.static.StaticEmbedding` behind the Runner interface: outputs
    ``last_hidden_state`` (B, T, d) float32 only; the head is ``base``."""

    backend = "torch"

    def __init__(self, model, path, threads: Optional[int] = None, tokenizer_dir=None):
        super().__init__()
        check_threads(threads)
        if threads:
            torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        self.model = model.eval()
        self.path = Path(path)
        self.config = dict(model.config)
        self.head = "base"
        self.outputs = ("last_hidden_state",)
        self.weight_files = [self.path / "model.safetensors"] if (self.path / "model.safetensors").is_file() else []
        self.size_bytes = sum(f.stat().st_size for f in self.weight_files) if self.weight_files else None
        self.weights_file = "model.safetensors" if self.weight_files else None
        self.num_parameters = int(model.embeddings.weight.numel())
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else self.path
        self.info["model_kind"] = "static"
        self._table = model.embeddings.weight.detach().numpy()

    @classmethod
    def load(cls, path, threads: Optional[int] = None, tokenizer_dir=None) -> "StaticRunner":
        """The static dir at ``path``. Raises CheckpointError for a missing or malformed table."""
        from ..models.static import load_static
        return cls(load_static(path), path, threads, tokenizer_dir)

    def _run(self, input_ids, attention_mask, token_type_ids, outputs: tuple) -> dict:
        ids = input_ids.cpu().numpy() if torch.is_tensor(input_ids) else np.asarray(input_ids)
        return {"last_hidden_state": self._table[ids.astype(np.int64, copy=False)]}  # a lookup: numpy take


__all__ = ["StaticRunner"]
