"""The PyTorch backend: bertforge's own :class:`~bertforge.task_model.TaskModel` in eval mode.

Supports every bertforge checkpoint dir — any family, any head (classification, regression, token
classification, QA, masked-LM and the other pretraining heads, or none), pruned per-layer shapes — in FP32,
and the PyTorch INT8 dirs written by ``bertforge quantize --backend torch`` (``model.int8.safetensors``,
dynamic INT8 Linear layers; CPU only). Options at load time: ``int8`` quantizes an FP32 checkpoint's Linear
layers on the fly (:func:`bertforge.compress.quantize.quantize_dynamic`), ``mkl_pack`` pre-packs the FP32
Linear weights for MKL (:mod:`bertforge.compress.packed`: same outputs within 1e-5, ~10% faster GEMMs on
x86; what ``bench`` times), ``device`` moves an FP32 model to e.g. ``cuda``.

A model already in memory (a freshly quantized one, the FP32 model ``quantize --eval`` compares with) is
wrapped with :meth:`TorchRunner.from_model`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..engine.kernels import apply_kernels
from ..models.output import Features
from .base import Runner, check_threads, split_qa, to_numpy


def prepare(model: torch.nn.Module) -> torch.nn.Module:
    """Ready ``model`` for inference: eval mode (dropout off). The one place a runner's PyTorch model is
    prepared, so inference speed paths are switched on here for every caller."""
    return apply_kernels(model.eval(), "auto")  # speed only: CPU kernels on a CPU (bertforge.engine.kernels)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct weights (elements) of ``model``: a tensor shared by several modules (tied input
    and output embeddings, ALBERT's shared layers) is counted once, buffers are not counted."""
    return int(sum(p.numel() for p in model.parameters()))  # parameters() yields a shared tensor once


def count_int8_parameters(model: torch.nn.Module) -> int:
    """Weights of a PyTorch INT8 model, as many as its FP32 source has: the INT8 matrices, biases and the
    FP32 rest, not the quantization metadata (``.scale`` / ``.zero_point`` / per-channel ``.axis``)."""
    from ..compress.quantize import int8_state
    return int(sum(v.numel() for k, v in int8_state(model).items()
                   if not k.endswith((".scale", ".zero_point", ".axis"))))


class TorchRunner(Runner):
    """A bertforge ``TaskModel`` (FP32 or dynamic INT8) behind the :class:`~bertforge.runtime.base.Runner`
    interface. Build it with :meth:`load` (a dir) or :meth:`from_model` (a model in memory)."""

    backend = "torch"

    def __init__(self, model: torch.nn.Module, path=None, config: Optional[dict] = None,
                 precision: str = "fp32", threads: Optional[int] = None, weight_files=(),
                 num_parameters: Optional[int] = None, tokenizer_dir=None):
        super().__init__()
        check_threads(threads)
        if threads:
            torch.set_num_threads(threads)  # process-wide: PyTorch has one intra-op pool
        self.threads = torch.get_num_threads()
        self.model = prepare(model)
        self.path = Path(path) if path is not None else Path(getattr(model, "source_dir", "") or ".")
        if config is None:
            from ..checkpoint.write import config_to_hf
            config = config_to_hf(model.config, model.head_name)
        self.config = config
        self.head = model.head_name
        self.precision = precision
        self.weight_files = [Path(f) for f in weight_files]
        self.size_bytes = sum(f.stat().st_size for f in self.weight_files) if self.weight_files else None
        self.weights_file = self.weight_files[0].name if len(self.weight_files) == 1 else None
        self.num_parameters = num_parameters if num_parameters is not None else (
            count_parameters(model) if precision == "fp32" else count_int8_parameters(model))
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else (
            self.path if self.path.is_dir() else None)
        outs = ("last_hidden_state",) if model.head is None else ("logits", "last_hidden_state")
        if self.head == "question_answering":
            outs += ("start_logits", "end_logits")
        self.outputs = outs
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))

    @property
    def num_labels(self) -> Optional[int]:
        """The head's output count (None without a head)."""
        return self.model.head.num_labels if self.model.head is not None else None

    @classmethod
    def from_model(cls, model: torch.nn.Module, threads: Optional[int] = None, tokenizer_dir=None,
                   precision: Optional[str] = None) -> "TorchRunner":
        """Wrap a ``TaskModel`` in memory (its weights are not copied; it is put in eval mode).
        ``precision``: default ``int8`` when its Linear layers are dynamically quantized, else ``fp32``."""
        if precision is None:
            from ..compress.quantize import _is_qlinear
            precision = "int8" if any(_is_qlinear(m) for m in model.modules()) else "fp32"
        return cls(model, precision=precision, threads=threads, tokenizer_dir=tokenizer_dir)

    @classmethod
    def load(cls, model_dir, threads: Optional[int] = None, int8: bool = False, mkl_pack: bool = False,
             device: Optional[str] = None, tokenizer_dir=None) -> "TorchRunner":
        """Load a checkpoint dir (FP32 weights) or a ``bertforge quantize --backend torch`` dir.

        Raises:
            CheckpointError: a missing / unusable dir, or one that holds only an ONNX graph.
            ConfigError: ``device`` other than CPU for an INT8 model.
        """
        from ..checkpoint.layout import shard_index, weight_files
        from ..checkpoint.modeldir import ModelDir
        from ..checkpoint.read import load_pretrained
        from ..compress import quantize as bq
        from ..errors import ConfigError
        md = model_dir if isinstance(model_dir, ModelDir) and model_dir.config else ModelDir.open(model_dir)
        model_dir, config = md.path, md.config
        info = {}
        if md.format == "torch-int8":
            model = bq.load_quantized(model_dir)
            precision, n_params, files = "int8", count_int8_parameters(model), [model_dir / bq.INT8_FILE]
        else:
            model = load_pretrained(model_dir)
            n_params, files = count_parameters(model), weight_files(model_dir)
            precision = "int8" if int8 else "fp32"
            if int8:
                model = bq.quantize_dynamic(model)
            elif mkl_pack and (device is None or str(device) == "cpu"):
                from ..compress.packed import pack_linears
                info["mkl_packed_linears"] = pack_linears(model)
        if device is not None and str(device) != "cpu":
            if precision == "int8":
                raise ConfigError(f"{model_dir}: PyTorch dynamic INT8 runs on CPU only; drop the device "
                                  f"{device!r} or load the FP32 checkpoint")
            model = model.to(device)
        runner = cls(model, model_dir, config, precision, threads, files, n_params, tokenizer_dir)
        if len(files) > 1:  # a sharded checkpoint: report its index
            runner.weights_file = shard_index(model_dir)[0].name
        runner.info.update(info)
        runner.model_dir = md
        return runner

    def _tensor(self, x) -> Optional[torch.Tensor]:
        if x is None:
            return None
        if not torch.is_tensor(x):
            x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
        return x.to(self.device)

    def _run(self, input_ids, attention_mask, token_type_ids, outputs: tuple) -> dict:
        x = {"input_ids": self._tensor(input_ids), "attention_mask": self._tensor(attention_mask),
             "token_type_ids": self._tensor(token_type_ids)}
        m = self.model
        with torch.inference_mode():
            if m.head is not None and outputs == ("last_hidden_state",):  # encoder states only
                return {"last_hidden_state": to_numpy(m.encoder(**x).last_hidden_state)}
            # a head that reads [CLS] only skips the other positions of the last layer unless all are asked
            full = m.head is not None and "last_hidden_state" in outputs
            o = m(**x, features=Features(hidden_states=full))
        res = {}
        if o.logits is not None:
            res["logits"] = to_numpy(o.logits)
            if self.head == "question_answering":
                split_qa(res)
        if "last_hidden_state" in outputs:
            res["last_hidden_state"] = to_numpy(o.last_hidden_state)
        return {k: res[k] for k in outputs}


__all__ = ["TorchRunner", "prepare", "count_parameters", "count_int8_parameters"]
