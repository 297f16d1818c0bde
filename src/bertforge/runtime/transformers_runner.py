"""The ``transformers`` backend: the checkpoint run by Hugging Face's own model class, for comparisons.

Supports any checkpoint dir with FP32 weights (``model.safetensors``, ``pytorch_model.bin`` or shards) that
``transformers`` can build: the class named by ``config.json``'s ``architectures[0]`` (e.g.
``RobertaForMaskedLM``), else ``AutoModel`` (the bare encoder). FP32 only, eval mode. Not supported:
ONNX and INT8 dirs (use the ``onnxruntime`` / ``torch`` backends) and per-layer pruned shapes, which
``transformers`` cannot express. Where its class leaves out part of the checkpoint (a head it has no class
for, e.g. SpanBERT's SBO) or initialises weights the checkpoint lacks, :attr:`Runner.info` lists them
(``checkpoint_weights_unused`` / ``weights_initialised_fresh``): that model is not the checkpoint's.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import CheckpointError
from .base import Runner, check_threads, to_numpy


def transformers_class(cfg: dict):
    """The ``transformers`` class of ``cfg``'s ``architectures[0]``, so that this backend runs the same head
    as ``torch`` / ``onnxruntime``; ``AutoModel`` when the config names no architecture or one this
    ``transformers`` lacks."""
    import transformers
    archs = cfg.get("architectures") or []
    cls = getattr(transformers, archs[0], None) if archs and isinstance(archs[0], str) else None
    return cls if isinstance(cls, type) and hasattr(cls, "from_pretrained") else transformers.AutoModel


def check_loadable(model_dir: Path, cfg: dict) -> None:
    """Raise CheckpointError unless ``transformers`` can build ``model_dir``: it needs FP32 weights and one
    width for every layer. The message names what the dir holds and the backend that runs it."""
    from ..checkpoint.modeldir import Meta, ModelDir
    md = ModelDir.open(model_dir)
    if not md.fp32_weights:
        if md.format != "fp32":
            raise CheckpointError(f"{model_dir} holds {md.describe()}, no model.safetensors, so transformers "
                                  f"cannot load it; use --backend {md.backend} (or auto)")
        raise CheckpointError(f"{model_dir} has no model.safetensors or pytorch_model.bin for transformers; "
                              f"pass a checkpoint dir with FP32 weights")
    if cfg.get("layer_num_heads") or cfg.get("layer_intermediate_sizes"):
        what = " and ".join(w for k, w in (("layer_num_heads", "head counts"),
                                           ("layer_intermediate_sizes", "FFN widths")) if cfg.get(k))
        raise CheckpointError(f"{model_dir} has per-layer pruned shapes ({what}), which transformers "
                              f"cannot build (one width for every layer; no pruned_heads since v5); use "
                              f"--backend torch or onnxruntime")
    from ..checkpoint.layout import model_family
    from ..checkpoint.write import pooling_transformers_lacks
    pooling = pooling_transformers_lacks(model_family(cfg), cfg.get("bertforge_head"), Meta.from_config(cfg).pooling,
                                         cfg.get("classifier_pooling"))
    if pooling:  # a dir only bertforge computes right (model_type bertforge-…), or one an older bertforge wrote
        raise CheckpointError(f"{model_dir} has a sequence head on {pooling} pooling (model.pooling), which "
                              f"transformers' ForSequenceClassification does not have (it reads [CLS]): its "
                              f"logits would not be this model's; use --backend torch or onnxruntime")


class HFRunner(Runner):
    """A ``transformers`` ``PreTrainedModel`` behind the :class:`~bertforge.runtime.base.Runner` interface.

    Outputs: ``last_hidden_state`` (every class; for a head class read from its last hidden state), and for
    a head class ``logits`` — for a QA class also ``start_logits`` / ``end_logits``, stacked into a
    (B, 2, T) ``logits`` as bertforge's QA head gives them (padding not masked).
    """

    backend = "transformers"

    def __init__(self, model, model_dir, config: dict, threads: Optional[int] = None):
        super().__init__()
        import transformers

        from ..checkpoint.read import saved_head_name, shard_index, weight_files
        from .torch import count_parameters
        check_threads(threads)
        if threads:
            torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        self.model = model.eval()
        self.path = self.tokenizer_dir = Path(model_dir)
        self.config = config
        name = type(model).__name__
        bare = "For" not in name
        self.head = "base" if bare else (saved_head_name(config) or "base")
        self._qa = name.endswith("ForQuestionAnswering")
        self.outputs = ("last_hidden_state",) if bare else (
            ("logits", "start_logits", "end_logits", "last_hidden_state") if self._qa
            else ("logits", "last_hidden_state"))
        self._accepts = set(inspect.signature(model.forward).parameters)
        self.weight_files = weight_files(self.path)
        self.size_bytes = sum(f.stat().st_size for f in self.weight_files) or None
        self.weights_file = self.weight_files[0].name if len(self.weight_files) == 1 else \
            (shard_index(self.path)[0].name if self.weight_files else None)
        self.num_parameters = count_parameters(model)
        self.info.update(model_class=name, library=f"transformers {transformers.__version__}")

    @classmethod
    def load(cls, model_dir, threads: Optional[int] = None) -> "HFRunner":
        """Load ``model_dir`` with :func:`transformers_class`.

        Raises:
            CheckpointError: no FP32 weights (an ONNX or INT8 dir), per-layer pruned shapes, or a dir
            ``transformers`` fails to load (its first error line is quoted).
        """
        from transformers.utils import logging as hf_logging

        from ..checkpoint.modeldir import ModelDir
        model_dir = Path(model_dir)
        cfg = ModelDir.open(model_dir).config
        check_loadable(model_dir, cfg)
        klass = transformers_class(cfg)
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Loading weights" bar is no output of ours
        try:
            model, loading = klass.from_pretrained(str(model_dir), output_loading_info=True)
        except Exception as e:
            raise CheckpointError(f"transformers cannot load {model_dir} ({str(e).splitlines()[0][:160]}); "
                                  f"use --backend torch") from None
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        runner = cls(model, model_dir, cfg, threads)
        fresh = sorted(loading.get("missing_keys") or [])
        unused = sorted(loading.get("unexpected_keys") or [])
        if fresh:  # the model run is not the checkpoint's: these weights were initialised at random
            runner.info["weights_initialised_fresh"] = fresh
        if unused:  # … or it leaves out part of the checkpoint (a head transformers has no class for)
            runner.info["checkpoint_weights_unused"] = unused
        return runner

    def _run(self, input_ids, attention_mask, token_type_ids, outputs: tuple) -> dict:
        def t(x):
            return x if torch.is_tensor(x) else torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
        x = {"input_ids": t(input_ids), "attention_mask": t(attention_mask)}
        if token_type_ids is not None and "token_type_ids" in self._accepts:
            x["token_type_ids"] = t(token_type_ids)
        head_hidden = self.head != "base" and "last_hidden_state" in outputs
        with torch.inference_mode():
            o = self.model(**x, output_hidden_states=True) if head_hidden else self.model(**x)
        res = {}
        if self._qa:
            res["start_logits"], res["end_logits"] = to_numpy(o.start_logits), to_numpy(o.end_logits)
            res["logits"] = np.stack([res["start_logits"], res["end_logits"]], axis=1)
        elif getattr(o, "logits", None) is not None:
            res["logits"] = to_numpy(o.logits)
        if "last_hidden_state" in outputs:
            res["last_hidden_state"] = to_numpy(o.hidden_states[-1] if head_hidden else o.last_hidden_state)
        return {k: res[k] for k in outputs}


__all__ = ["HFRunner", "transformers_class", "check_loadable"]
