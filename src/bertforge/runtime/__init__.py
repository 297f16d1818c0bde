"""Runtime: one runner interface for every way bertforge runs a trained model.

``bench``, ``embed-eval``, ``evaluate``, ``predict``, ``quantize --eval`` and anything that serves models
load a model with :func:`load_runner` and call the :class:`~bertforge.runtime.base.Runner` it returns::

    from bertforge.runtime import load_runner
    runner = load_runner("runs/sst2-int8")             # picks the backend by what the dir holds
    logits = runner(input_ids, attention_mask)["logits"]

Backends (each module's docstring says what it supports):

* ``torch`` — :mod:`bertforge.runtime.torch`: bertforge's PyTorch model from a checkpoint dir, FP32, or the
  INT8 dir of ``quantize --backend torch``;
* ``onnxruntime`` — :mod:`bertforge.runtime.onnx`: the ``model.onnx`` of ``export`` / ``quantize`` (FP32 or
  INT8) or any ``.onnx`` file; a checkpoint dir is exported on the fly;
* ``transformers`` — :mod:`bertforge.runtime.transformers_runner`: the checkpoint in Hugging Face's own class, for
  comparisons;
* static embedding dirs (``distill --method static``: one table, mean pooling, no transformer) —
  :mod:`bertforge.runtime.static` under ``torch`` / ``auto``, exported on the fly under ``onnxruntime``.

Layering: the runtime imports the core (models, compress, hf) and is imported by the CLI and the
evaluation reports; the core never imports it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import CheckpointError, ConfigError
from .base import BACKENDS, Runner, head_kind


def load_runner(path, backend: str = "auto", threads: Optional[int] = None, *, int8: bool = False,
                mkl_pack: bool = False, device: Optional[str] = None, tokenizer_dir=None) -> Runner:
    """A runner for the model at ``path``.

    Args:
        path: a checkpoint dir (``config.json`` + FP32 weights), a ``quantize --backend torch`` dir
            (``model.int8.safetensors``), an ``export`` / ``quantize`` dir (``model.onnx``), an ``.onnx``
            file, or ``minilm`` (the embedded checkpoint).
        backend: ``auto`` (``onnxruntime`` when ``path`` holds an ONNX graph, else ``torch``), ``torch``,
            ``onnxruntime`` (a checkpoint dir is exported on the fly) or ``transformers``.
        threads: intra-op threads (None: PyTorch's default count). PyTorch's count is process-wide.
        int8: quantize an FP32 checkpoint to dynamic INT8 on the fly (``torch``: Linear layers;
            ``onnxruntime``: the exported graph).
        mkl_pack: ``torch`` FP32 on CPU: pre-pack Linear weights for MKL (outputs equal within 1e-5).
        device: ``torch`` only: where the FP32 model runs (default CPU).
        tokenizer_dir: where the tokenizer is read (default: the model's dir / the graph's folder).
    Raises:
        ConfigError: an unknown backend, or ``int8`` where it does not apply.
        CheckpointError: ``path`` does not exist or holds nothing this backend can run (one line that
        says what to pass instead).
    """
    from ..checkpoint.modeldir import ModelDir
    from .base import check_threads
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    check_threads(threads)
    md = path if isinstance(path, ModelDir) else ModelDir.open(path, require_config=False)
    runner = _runner(md, Path(path) if isinstance(path, Path) else _given(md), backend, threads, int8, mkl_pack,
                     device, tokenizer_dir)
    runner.model_dir = md
    return runner


def _given(md) -> Path:
    """The path to load: the graph itself when the caller named an ``.onnx`` file, else the dir."""
    return md.graph if md.graph is not None and str(md.name).endswith(".onnx") else md.path


def _runner(md, path: Path, backend: str, threads, int8: bool, mkl_pack: bool, device, tokenizer_dir) -> Runner:
    if md.is_static:
        return _static_runner(md, backend, threads, int8, tokenizer_dir)
    graph = md.graph
    if backend == "auto":
        backend = "onnxruntime" if graph is not None else "torch"
    if int8 and backend == "transformers":
        raise ConfigError("int8 quantizes bertforge models; use the torch or onnxruntime backend")
    if backend == "onnxruntime":
        from .onnx import OnnxRunner
        if graph is None:
            return OnnxRunner.export(md.path, threads, int8=int8, tokenizer_dir=tokenizer_dir)
        runner = OnnxRunner(graph, threads, tokenizer_dir, config=md.config or None)
        if int8 and runner.precision != "int8":
            raise ConfigError(f"{graph} is an FP32 ONNX graph; int8 quantizes a checkpoint on the fly, so pass "
                              f"the checkpoint or the INT8 dir `bertforge quantize` writes")
        return runner
    if path.is_file():
        raise CheckpointError(f"{path} is a file, not a checkpoint directory; the {backend} backend needs the "
                              f"folder that holds config.json")
    if backend == "transformers":
        from .transformers_runner import HFRunner
        return HFRunner.load(md.path, threads)
    from .torch import TorchRunner
    return TorchRunner.load(md, threads, int8=int8, mkl_pack=mkl_pack, device=device,
                            tokenizer_dir=tokenizer_dir)


def _static_runner(md, backend: str, threads, int8: bool, tokenizer_dir) -> Runner:
    """A static embedding dir: its lookup in PyTorch (``auto`` / ``torch``) or its Gather + mean graph
    exported on the fly (``onnxruntime``). ConfigError for ``transformers`` and ``int8`` (no Linear layer)."""
    path = md.path
    if int8:
        raise ConfigError(f"{path} is a static embedding model (a table lookup, no Linear layer to quantize); "
                          f"drop --int8")
    if backend == "transformers":
        raise ConfigError(f"{path} is a static embedding model, which transformers has no class for; use the "
                          f"torch or onnxruntime backend")
    from .onnx import OnnxRunner
    graph = md.graph  # an `export` of a static dir: its graph beside the static config.json
    if graph is not None and backend in ("auto", "onnxruntime"):
        return OnnxRunner(graph, threads, tokenizer_dir)
    if backend == "onnxruntime":
        return OnnxRunner.export_static(path, threads, tokenizer_dir=tokenizer_dir)
    from .static import StaticRunner
    return StaticRunner.load(path, threads, tokenizer_dir)


__all__ = ["BACKENDS", "Runner", "head_kind", "load_runner"]
