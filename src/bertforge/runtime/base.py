"""The :class:`Runner` interface: one forward pass of a loaded model, whatever runs it.

A runner is built from a model directory by :func:`bertforge.runtime.load_runner` and called on a batch of
token ids::

    runner = load_runner("runs/sst2")                       # torch, onnxruntime or transformers
    out = runner(input_ids, attention_mask, token_type_ids)  # (B, T) int arrays or tensors
    out["logits"]                                            # (B, num_labels) float32 numpy

Outputs are float32 numpy arrays named as the field names them (the ``transformers`` ``ModelOutput`` field
names): ``logits`` for a task head — (B, C) sequence classification / regression, (B, T, C) token
classification, (B, T, V) a masked-LM head —, ``start_logits`` / ``end_logits`` (B, T) beside the (B, 2, T)
``logits`` of an extractive-QA head, and ``last_hidden_state`` (B, T, H) for an encoder without a head.
Which of them a runner can produce is in :attr:`Runner.outputs`; ``outputs=("last_hidden_state",)`` asks
a model with a head for its encoder states instead (what sentence embeddings read).

The backends are :mod:`bertforge.runtime.torch` (bertforge's PyTorch model, FP32 or INT8),
:mod:`bertforge.runtime.onnx` (an ONNX graph in ONNX Runtime) and :mod:`bertforge.runtime.transformers_runner` (a
``transformers`` model, for comparisons).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from ..errors import CheckpointError, ConfigError

#: the backends a runner can have; ``auto`` (for :func:`~bertforge.runtime.load_runner`) picks by what a
#: directory holds
BACKENDS = ("auto", "torch", "onnxruntime", "transformers")

#: the input names every runner accepts, in call order
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def head_kind(head: Optional[str], config: dict) -> str:
    """What a model's head predicts: ``classification`` / ``regression`` (a sequence head; regression when
    ``num_labels`` is 1 or ``problem_type`` says so), ``token_classification``, ``question_answering``,
    ``base`` (no head: an encoder / embedding model), or the head's own name for the rest (``mlm``,
    ``electra_discriminator`` …). ``head``: a bertforge head name, None for none; ``config``: config.json."""
    if head in (None, "base"):
        return "base"
    if head == "sequence_classification":
        n = len(config.get("id2label") or {}) or config.get("num_labels")
        return "regression" if n == 1 or config.get("problem_type") == "regression" else "classification"
    return head


def to_numpy(x) -> np.ndarray:
    """A tensor (any device / dtype) or array → float32 numpy (no copy for an FP32 CPU tensor)."""
    if torch.is_tensor(x):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def check_threads(threads: Optional[int]) -> None:
    """``threads`` is None (the library default) or a positive count; ConfigError otherwise."""
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads={threads!r}: pass a thread count ≥ 1, or None for the default")


class Runner(ABC):
    """One loaded model and the forward pass that serves it.

    Attributes:
        backend: ``"torch"``, ``"onnxruntime"`` or ``"transformers"``.
        path: the directory (or ``.onnx`` file) it was loaded from.
        config: the model's ``config.json`` as a dict ({} when there is none).
        head: the bertforge head name (``sequence_classification``, ``question_answering``, ``base`` …),
            None when unknown (a bare graph without config).
        kind: what the head predicts (:func:`head_kind`).
        outputs: the output names a call can return (see the module docstring).
        precision: ``"fp32"`` or ``"int8"``.
        threads: intra-op threads the backend computes with.
        num_parameters: distinct weights (a tied embedding once; quantization scales and zero points not
            counted), so one model gives one count on every backend.
        weight_files: the files the weights were read from; ``weights_file``: the name reported for them.
        size_bytes: their total size in bytes (of the graph that was loaded, for one exported on the fly).
        info: backend-specific facts for reports (``model_class``, ``quantization`` …).
    """

    backend: str = "?"
    path: Path
    config: dict
    head: Optional[str] = None
    outputs: tuple = ()
    precision: str = "fp32"
    threads: int = 1
    num_parameters: Optional[int] = None
    weight_files: list
    weights_file: Optional[str] = None
    size_bytes: Optional[int] = None
    tokenizer_dir: Optional[Path] = None
    _model_dir = None

    def __init__(self):
        self.info: dict = {}
        self._tokenizer = None

    # ------------------------------------------------------------------------------ what it is
    @property
    def kind(self) -> str:
        return head_kind(self.head, self.config) if self.head is not None else "unknown"

    @property
    def model_dir(self):
        """The :class:`~bertforge.checkpoint.modeldir.ModelDir` it was loaded from (``load_runner`` sets it;
        opened from :attr:`path` on first use otherwise)."""
        if self._model_dir is None:
            from ..checkpoint.modeldir import ModelDir
            self._model_dir = ModelDir.open(self.path, require_config=False)
        return self._model_dir

    @model_dir.setter
    def model_dir(self, md) -> None:
        self._model_dir = md

    @property
    def meta(self):
        """bertforge's metadata of the model (:class:`~bertforge.checkpoint.modeldir.Meta`: task, thresholds,
        max length …), all None for a model bertforge did not write."""
        from ..checkpoint.modeldir import Meta
        return Meta.from_config(self.config)

    @property
    def tokenizer(self):
        """The model's ``tokenizers.Tokenizer``, loaded on first use from :attr:`tokenizer_dir` (the model
        dir unless given). Raises CheckpointError when there are no tokenizer files."""
        if self._tokenizer is None:
            from ..tokenizer import load_tokenizer
            if self.tokenizer_dir is None:
                raise CheckpointError(f"{self.path} comes with no tokenizer; pass the tokenizer dir")
            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        return self._tokenizer

    @property
    def max_length(self) -> Optional[int]:
        """Token positions the model can embed (:func:`bertforge.checkpoint.layout.token_positions`), None when
        unknown."""
        if not self.config:
            return None
        from ..checkpoint.layout import token_positions
        return token_positions(self.config)

    @property
    def num_labels(self) -> Optional[int]:
        """Outputs per example (or per token) of the task head, None for an encoder without one."""
        if self.head in (None, "base"):
            return None
        return len(self.config.get("id2label") or {}) or self.config.get("num_labels")

    @property
    def primary_outputs(self) -> tuple:
        """What a call returns by default: the head's outputs, or ``last_hidden_state`` without a head."""
        if "logits" in self.outputs:
            return tuple(n for n in ("logits", "start_logits", "end_logits") if n in self.outputs)
        return ("last_hidden_state",)

    def describe(self) -> dict:
        """JSON-able facts about what runs: backend, precision, threads, parameters, weight file, size (MB =
        2²⁰ bytes), and :attr:`info`."""
        return {"backend": self.backend,
                "file_mb": round(self.size_bytes / 2**20, 3) if self.size_bytes is not None else None,
                "weights_file": self.weights_file, "parameters": self.num_parameters,
                "precision": self.precision, "threads": self.threads, **self.info}

    # ------------------------------------------------------------------------------ running it
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
                 outputs: Optional[Sequence[str]] = None) -> dict:
        """One forward pass (no gradients, dropout off).

        Args:
            input_ids, attention_mask, token_type_ids: (B, T) integer numpy arrays or tensors;
                ``attention_mask`` defaults to all ones, ``token_type_ids`` to zeros (ignored by a model
                without segment embeddings).
            outputs: names of :attr:`outputs` to return (default :attr:`primary_outputs`).
        Returns:
            ``{name: float32 numpy array}`` (see the module docstring for shapes).
        Raises:
            ConfigError: an output this runner cannot produce.
        """
        want = tuple(outputs) if outputs is not None else self.primary_outputs
        missing = [n for n in want if n not in self.outputs]
        if missing:
            raise ConfigError(f"{self.path} ({self.backend}) has no output {missing[0]!r}; it gives "
                              f"{', '.join(self.outputs) or 'nothing'}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids) if torch.is_tensor(input_ids) else np.ones_like(input_ids)
        return self._run(input_ids, attention_mask, token_type_ids, want)

    @abstractmethod
    def _run(self, input_ids, attention_mask, token_type_ids, outputs: tuple) -> dict:
        """The backend's forward pass; ``outputs`` are checked names of :attr:`outputs`."""


def split_qa(out: dict) -> dict:
    """Add ``start_logits`` / ``end_logits`` (B, T) views of a (B, 2, T) QA ``logits`` array."""
    z = out["logits"]
    out["start_logits"], out["end_logits"] = z[:, 0], z[:, 1]
    return out


__all__ = ["BACKENDS", "INPUT_NAMES", "Runner", "head_kind", "to_numpy", "split_qa", "check_threads"]
