"""ONNX export of a checkpoint from Python: :func:`export` (what ``bertforge export`` runs).

    >>> import bertforge
    >>> r = bertforge.export("runs/sst2", "runs/sst2-onnx")
    >>> r.out, r.record["fp32_max_abs_diff"]
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ConfigError
from .rundir import RunDir
from .options import options_from, python_names


@dataclass
class ExportOptions:
    """Options of :func:`export` (the flags of ``bertforge export``, same names and defaults)."""

    int8: bool = False
    per_tensor: bool = False
    reduce_range: bool = False
    no_optimize: bool = False
    no_fused: bool = False
    fusions: Optional[str] = None
    overwrite: bool = False


@dataclass
class ExportResult:
    """The dir written (``out``: model.onnx, config, tokenizer, onnx.json) and its record (``onnx.json``'s fields:
    inputs, output, fused ops, FP32 parity …)."""

    out: Path
    record: dict


def export(model, out, **options) -> ExportResult:
    """Export ``model`` (a checkpoint dir, a static embedding dir or ``"minilm"``) to ONNX in ``out``.

    Raises:
        ConfigError: contradicting options. BertforgeError: the exporter failed or FP32 parity exceeds 1e-4."""
    opts = options_from(ExportOptions, "export", options)
    with python_names(ExportOptions):
        return export_with(model, out, opts)


def export_with(model, out, opts: ExportOptions) -> ExportResult:
    """:func:`export` from a complete :class:`ExportOptions` (what the verb builds from its flags)."""
    rec = _run(model, out, opts)
    return ExportResult(Path(rec["out"]), rec)


def _run(model, out, args) -> dict:
    from ..compress.onnx import deploy
    from ..checkpoint.read import load_pretrained
    for flag, on in (("--reduce-range", args.reduce_range), ("--per-tensor", args.per_tensor)):
        if on and not args.int8:
            raise ConfigError(f"{flag} sets how INT8 weights are quantized; add --int8 or drop it")
    if args.fusions is not None and args.no_optimize:
        raise ConfigError("--fusions picks the ONNX Runtime optimizer's fusions and --no-optimize skips that "
                          "optimizer; pass one of them")
    from ..checkpoint.modeldir import ModelDir
    md = ModelDir.open(model)
    model_dir = md.path
    if md.is_static:
        return _export_static(out, args, model_dir)
    run_dir = RunDir(out, inputs=(model_dir,), overwrite=args.overwrite)
    model = load_pretrained(model_dir).eval()
    from ..engine.kernels import apply_kernels
    apply_kernels(model, "auto")  # speed only (bertforge.engine.kernels)
    with run_dir as work:
        rec = deploy(model, work, source_dir=model_dir, optimize=not args.no_optimize, quantize=args.int8,
                     fused=not args.no_fused, per_channel=not args.per_tensor, fusions=args.fusions or "lean",
                     reduce_range=args.reduce_range)
    return {"model": str(model_dir), "out": str(run_dir.out), **rec}


def _export_static(out, args, model_dir) -> dict:
    """A static embedding dir → the Gather + masked-mean graph (no optimizer, no INT8: a lookup has neither
    attention to fuse nor Linear layers to quantize)."""
    from ..compress.onnx import deploy_static
    from ..models.static import load_static
    if args.int8:
        raise ConfigError(f"{model_dir} is a static embedding model (a table lookup, no Linear layer to "
                          f"quantize); drop --int8")
    run_dir = RunDir(out, inputs=(model_dir,), overwrite=args.overwrite)
    model = load_static(model_dir)
    with run_dir as work:
        rec = deploy_static(model, work, source_dir=model_dir)
    return {"model": str(model_dir), "out": str(run_dir.out), **rec}


__all__ = ["export_with", "ExportOptions", "ExportResult", "export"]
