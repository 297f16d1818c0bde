"""The ONNX Runtime backend: an exported graph in an ``onnxruntime.InferenceSession`` on CPU.

Supports the dirs written by ``bertforge export`` (FP32 graph) and ``bertforge quantize`` (ONNX Runtime
dynamic INT8 graph, or the low-bit ``MatMulNBits`` / ``GatherBlockQuantized`` graph of ``--bits``) — ``model.onnx`` beside ``config.json``, the tokenizer files and ``onnx.json`` —, a
dir holding one other ``.onnx`` file and no FP32 weights, and a bare ``.onnx`` file (its config and
tokenizer then come from ``tokenizer_dir``). Graph inputs are fed by name (``input_ids``,
``attention_mask``, ``token_type_ids``: whichever the graph declares); outputs are the graph's ``logits``
and / or ``last_hidden_state`` (else its first rank-3 output, read as the hidden states). The session is
built by :func:`bertforge.compress.onnx.session` (all graph optimisations, the model's thread count).

:meth:`OnnxRunner.export` runs a PyTorch checkpoint in ONNX Runtime: it exports it on the fly (fused
attention, ONNX Runtime transformer optimisation, INT8 with ``int8``) into a temporary dir that is removed
once the session holds the graph.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import CheckpointError
from .base import INPUT_NAMES, Runner, check_threads, split_qa

from ..checkpoint.modeldir import INT8_OPS  # noqa: E402  operators only a quantized graph holds


def graph_is_int8(graph) -> bool:
    """Whether an ONNX ``GraphProto`` holds INT8 operators (:data:`INT8_OPS`)."""
    return any(n.op_type in INT8_OPS for n in graph.node)


def graph_is_low_bit(graph) -> bool:
    """Whether an ONNX ``GraphProto`` holds ONNX Runtime's block-quantized weights (``quantize --bits``)."""
    return any(n.op_type in ("MatMulNBits", "GatherBlockQuantized") for n in graph.node)


def count_graph_parameters(cfg: dict, graph) -> dict:
    """``{"parameters": n}`` for a graph with its ``config.json`` dict: the distinct weights of the model the
    config describes (built without weights on the meta device), so an exported or INT8 dir counts as the
    checkpoint it came from. The graph's initializers are not a weight count: a tied output projection is
    stored again, transposed, and the exporter merges initializers that happen to hold equal values. For a
    config bertforge cannot build, the initializer elements are counted and ``parameters_counted`` says so."""
    from ..models.static import is_static_config
    if is_static_config(cfg):  # one (V, d) table
        return {"parameters": int(cfg["vocab_size"]) * int(cfg["hidden_size"])}
    try:
        from ..checkpoint.read import config_from_hf, saved_head_name
        from ..task_model import TaskModel
        from .torch import count_parameters
        with torch.device("meta"):
            model = TaskModel(config_from_hf(cfg), head=saved_head_name(cfg) or "base")
        return {"parameters": count_parameters(model)}
    except Exception:  # noqa: BLE001 - a foreign ONNX dir: fall back to the graph
        n = int(sum(int(np.prod(t.dims)) for t in graph.initializer if len(t.dims) > 0))
        return {"parameters": n, "parameters_counted": "onnx initializer elements (tied weights may be "
                                                        "counted twice)"}


class OnnxRunner(Runner):
    """An ONNX graph in ONNX Runtime behind the :class:`~bertforge.runtime.base.Runner` interface.

    ``OnnxRunner(onnx_path, threads, tokenizer_dir)``: ``threads`` intra-op threads (default PyTorch's
    count, so both backends compute with as many); ``tokenizer_dir`` where the tokenizer (and, when the
    graph's folder has none, ``config.json``) is read (default the graph's folder).
    Raises:
        CheckpointError: the file is missing or ONNX Runtime cannot load it, or the graph has neither a
        ``logits`` nor a hidden-state output.
    """

    backend = "onnxruntime"

    def __init__(self, onnx_path, threads: Optional[int] = None, tokenizer_dir=None, config: Optional[dict] = None):
        super().__init__()
        import onnx

        from ..compress.onnx import session
        from ..checkpoint.modeldir import ModelDir, saved_head_name
        check_threads(threads)
        onnx_path = Path(onnx_path)
        if not onnx_path.is_file():
            raise CheckpointError(f"{onnx_path} does not exist; pass an .onnx file written by "
                                  f"`bertforge export` / `bertforge quantize`")
        self.onnx_path = self.path = onnx_path
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else onnx_path.parent
        if config is None:
            cfg_dir = next((d for d in (onnx_path.parent, self.tokenizer_dir) if (d / "config.json").is_file()),
                           None)
            config = ModelDir.open(cfg_dir).config if cfg_dir is not None else {}
        self.config = config
        self.threads = threads or torch.get_num_threads()
        self.session = session(onnx_path, self.threads)
        self.input_names = [i.name for i in self.session.get_inputs()]
        outs = self.session.get_outputs()
        names = [o.name for o in outs]
        rank3 = [o.name for o in outs if o.shape is not None and len(o.shape) == 3]
        hidden = "last_hidden_state" if "last_hidden_state" in names else \
            (rank3[0] if rank3 and "logits" not in names else None)
        self._graph_outputs = {k: v for k, v in (("logits", "logits" if "logits" in names else None),
                                                 ("last_hidden_state", hidden)) if v is not None}
        if not self._graph_outputs:
            raise CheckpointError(f"{onnx_path} has neither a last_hidden_state nor a logits output "
                                  f"({', '.join(names)}); export it with `bertforge export`")
        if config:
            self.head = saved_head_name(config) or "base"
        else:
            self.head = None if "logits" in self._graph_outputs else "base"
        self.outputs = tuple(self._graph_outputs)
        if self.head == "question_answering" and "logits" in self.outputs:
            self.outputs += ("start_logits", "end_logits")
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
        self.precision = "low-bit" if graph_is_low_bit(graph) else ("int8" if graph_is_int8(graph) else "fp32")
        self.weight_files = [onnx_path] + [f for f in onnx_path.parent.glob(onnx_path.name + ".data")]
        self.size_bytes = sum(f.stat().st_size for f in self.weight_files)
        self.weights_file = onnx_path.name
        if config:
            counted = count_graph_parameters(config, graph)
        else:
            counted = {"parameters": int(sum(int(np.prod(t.dims)) for t in graph.initializer if len(t.dims))),
                       "parameters_counted": "onnx initializer elements (tied weights may be counted twice)"}
        self.num_parameters = counted.pop("parameters")
        self.info.update(counted)
        rec_path = onnx_path.parent / "onnx.json"  # how export / quantize made the graph (8- or 7-bit weights…)
        if rec_path.is_file():
            try:
                made = json.loads(rec_path.read_text(encoding="utf-8"))
                self.info["quantization"] = made.get("quantization")
                for k in ("scheme", "target"):  # the CPU kind the INT8 scheme was chosen for
                    if made.get(k):
                        self.info[f"int8_{k}"] = made[k]
            except (ValueError, UnicodeDecodeError, AttributeError):
                pass

    @classmethod
    def load(cls, path, threads: Optional[int] = None, tokenizer_dir=None) -> "OnnxRunner":
        """The graph at ``path`` (see :func:`find_graph`). Raises CheckpointError when there is none."""
        from ..checkpoint.modeldir import ModelDir
        path = Path(path)
        graph = ModelDir.open(path, require_config=False).graph
        if graph is None:
            raise CheckpointError(f"{path} holds no ONNX graph (model.onnx); run `bertforge export` on the "
                                  f"checkpoint, or pass the dir it wrote")
        return cls(graph, threads, tokenizer_dir)

    @classmethod
    def export(cls, model_dir, threads: Optional[int] = None, int8: bool = False,
               tokenizer_dir=None) -> "OnnxRunner":
        """Export a PyTorch checkpoint dir on the fly (fused attention, ONNX Runtime optimisation, INT8 with
        ``int8``) and run that graph; the temporary export is removed before this returns.

        Raises:
            CheckpointError: an unusable checkpoint, or a PyTorch INT8 dir (export its FP32 source).
        """
        from ..checkpoint.modeldir import ModelDir
        from ..checkpoint.read import load_pretrained
        from ..compress.onnx import deploy
        from .torch import count_parameters
        md = model_dir if isinstance(model_dir, ModelDir) and model_dir.config else ModelDir.open(model_dir)
        model_dir, config = md.path, md.config
        if md.format == "torch-int8":
            raise CheckpointError(f"{model_dir} holds a PyTorch INT8 model; run `bertforge quantize "
                                  f"--backend onnxruntime` on its FP32 source for ONNX Runtime")
        model = load_pretrained(model_dir)
        tmp = Path(tempfile.mkdtemp(prefix="bertforge-onnx-"))
        try:
            deploy(model, tmp / "m", optimize=True, quantize=int8, check=False)
            runner = cls(tmp / "m" / "model.onnx", threads, tokenizer_dir or model_dir, config)
        finally:  # the session holds the graph in memory: the export is not kept
            shutil.rmtree(tmp, ignore_errors=True)
        runner.path, runner.weight_files = model_dir, []
        runner.num_parameters = count_parameters(model)  # the model exported just now, as the torch backend
        runner.weights_file = "model.onnx (exported on the fly, not kept)"
        runner.info.pop("parameters_counted", None)
        runner.info["exported_on_the_fly"] = True
        return runner

    @classmethod
    def export_static(cls, model_dir, threads: Optional[int] = None, tokenizer_dir=None) -> "OnnxRunner":
        """A static embedding dir exported on the fly (:func:`bertforge.compress.onnx.deploy_static`: Gather
        + masked mean) and run in ONNX Runtime; the temporary export is removed before this returns."""
        from ..compress.onnx import deploy_static
        from ..models.static import load_static
        model_dir = Path(model_dir)
        model = load_static(model_dir)
        tmp = Path(tempfile.mkdtemp(prefix="bertforge-onnx-"))
        try:
            deploy_static(model, tmp / "m", check=False)
            runner = cls(tmp / "m" / "model.onnx", threads, tokenizer_dir or model_dir, dict(model.config))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        runner.path, runner.weight_files = model_dir, []
        runner.weights_file = "model.onnx (exported on the fly, not kept)"
        runner.info["exported_on_the_fly"] = True
        return runner

    def _run(self, input_ids, attention_mask, token_type_ids, outputs: tuple) -> dict:
        given = {n: (x.cpu().numpy() if torch.is_tensor(x) else x)
                 for n, x in zip(INPUT_NAMES, (input_ids, attention_mask, token_type_ids))}
        ids = np.asarray(given["input_ids"])
        feed = {name: np.asarray(given[name] if given.get(name) is not None else np.zeros_like(ids))
                .astype(np.int64, copy=False) for name in self.input_names}
        graph_names = [n for n in ("logits", "last_hidden_state")
                       if n in outputs or (n == "logits" and {"start_logits", "end_logits"} & set(outputs))]
        got = self.session.run([self._graph_outputs[n] for n in graph_names], feed)
        res = {n: np.asarray(v, dtype=np.float32) for n, v in zip(graph_names, got)}
        if "logits" in res and self.head == "question_answering":
            split_qa(res)
        return {k: res[k] for k in outputs}


__all__ = ["OnnxRunner", "count_graph_parameters", "graph_is_int8", "graph_is_low_bit", "INT8_OPS"]
