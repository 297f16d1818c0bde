"""INT8 of a checkpoint from Python: :func:`quantize` (what ``bertforge quantize`` runs).

ONNX Runtime (default): export → optimise → INT8 with the scheme of the CPU kind it is made for, checked by the
accuracy gate (:mod:`bertforge.compress.int8`); PyTorch: torch.ao dynamic INT8. The output folder goes through
:class:`~bertforge.pipelines.rundir.RunDir`: it appears whole, or not at all.

    >>> import bertforge
    >>> r = bertforge.quantize("runs/sst2", "runs/sst2-int8", target="avx2", calib=["a text", "another"])
    >>> r.out, r.record["scheme"], r.gate["agreement"]
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..errors import BertforgeError, ConfigError, require_at_least
from .rundir import RunDir
from .options import options_from, python_names


@dataclass
class QuantizeOptions:
    """Options of :func:`quantize` (the flags of ``bertforge quantize``, same names and defaults). ``calib``: a
    text file (one text per line, a tab splits a pair) or a list of texts / (text, text) pairs. ``bits``
    (2, 3, 4, 8 or ``"mixed"`` with ``size_budget`` MB) switches to low-bit weights
    (:mod:`bertforge.pipelines.quantize_lowbit`; ``group_size`` columns per scale, default 64; ``embed_bits`` of
    the word-embedding table; ``qat_steps`` of quantization-aware fine-tuning, default 300, on ``qat_train``
    rows or the calibration texts; ``hessian_*`` / ``trace_samples``: the sensitivity estimate; ``accuracy_level``
    4: MatMulNBits multiplies int8-quantized activations, faster, not exact; 0: FP32 products)."""

    backend: str = "onnxruntime"
    target: Optional[str] = None
    scheme: Optional[str] = None
    per_tensor: bool = False
    reduce_range: bool = False
    no_fused: bool = False
    fusions: Optional[str] = None
    calib: Union[str, Path, list, None] = None
    calib_samples: Optional[int] = None
    max_drop: Optional[float] = None
    calibration: Optional[str] = None
    eval: Optional[str] = None
    task: Optional[str] = None
    max_eval_samples: Optional[int] = None
    max_seq_len: Optional[int] = None
    overwrite: bool = False
    # low-bit (Q-BERT; pipelines/quantize_lowbit.py): bits None = INT8
    bits: Union[int, str, None] = None
    size_budget: Optional[float] = None
    group_size: Optional[int] = None
    embed_bits: int = 4
    qat_steps: Optional[int] = None
    qat_train: Optional[str] = None
    max_qat_samples: Optional[int] = None
    qat_lr: float = 5e-5
    qat_batch_size: int = 32
    hessian_batches: int = 2
    hessian_batch_size: int = 8
    hessian_iters: int = 20
    trace_samples: int = 8
    seed: int = 0
    accuracy_level: int = 0


@dataclass
class QuantizeResult:
    """The INT8 dir written (``out``) and its record (what ``onnx.json`` holds plus the source's size, the
    output difference on a random batch and, with ``eval``, the task metrics of FP32 and INT8)."""

    out: Path
    record: dict

    @property
    def gate(self) -> Optional[dict]:
        return self.record.get("gate")

    @property
    def eval(self) -> Optional[dict]:
        return self.record.get("eval")


def quantize(model, out, **options) -> QuantizeResult:
    """Quantize ``model`` (an FP32 checkpoint dir or ``"minilm"``) into ``out``; ``options``: the fields of
    :class:`QuantizeOptions`.

    Raises:
        ConfigError: contradicting or out-of-range options, an input that is already exported / quantized.
        BertforgeError: the accuracy gate finds no scheme within ``max_drop`` (nothing is written)."""
    opts = options_from(QuantizeOptions, "quantize", options)
    with python_names(QuantizeOptions):
        return quantize_with(model, out, opts)


def quantize_with(model, out, opts: QuantizeOptions) -> QuantizeResult:
    """:func:`quantize` from a complete :class:`QuantizeOptions` (what the verb builds from its flags)."""
    rec = _run(model, out, opts)
    return QuantizeResult(Path(rec["out"]), rec)


def _run(model, out, args) -> dict:
    if args.bits is not None:
        return _run_lowbit(model, out, args)
    # every option is checked before torch loads or anything is read
    if args.backend != "onnxruntime":  # graph options would be silently ignored by the torch backend
        used = [f for f, on in (("--reduce-range", args.reduce_range), ("--no-fused", args.no_fused),
                                ("--fusions", args.fusions is not None), ("--target", args.target),
                                ("--scheme", args.scheme), ("--calib", args.calib),
                                ("--calibration", args.calibration), ("--max-drop", args.max_drop is not None),
                                ("--calib-samples", args.calib_samples is not None)) if on]
        if used:
            why = ("PyTorch's fbgemm already quantizes activations to 7 bits" if used[0] == "--reduce-range"
                   else "it shapes the exported ONNX graph")
            raise ConfigError(f"{used[0]} applies to the onnxruntime backend ({why}); drop it or use "
                              f"--backend onnxruntime")
    if not args.eval:
        unused = [f for f, v in (("--task", args.task), ("--max-eval-samples", args.max_eval_samples),
                                 ("--max-seq-len", args.max_seq_len)) if v]
        if unused:
            raise ConfigError(f"{unused[0]} sets up the accuracy check of --eval FILE; pass --eval or drop it")
    _check_int8_args(args)
    require_at_least("--max-eval-samples", args.max_eval_samples, 1)
    require_at_least("--max-seq-len", args.max_seq_len, 2)
    import numpy as np
    from ..compress import onnx as bo
    from ..compress import quantize as bq
    from ..checkpoint.read import load_pretrained
    from ..checkpoint.modeldir import ModelDir
    md = ModelDir.open(model)
    model_dir = md.path
    run_dir = RunDir(out, inputs=(model_dir,), overwrite=args.overwrite)
    if md.format not in ("fp32", "static") or md.graph is not None:
        raise ConfigError(f"{model_dir} is already exported/quantized; pass the FP32 checkpoint dir")
    eval_data = None
    if args.eval:  # read and check the evaluation data before anything is written
        from .evaluate import load_for_task
        _, task, adapter, _ = load_for_task(str(model_dir), args.task, args.max_seq_len)
        eval_data = adapter.load(args.eval, args.max_eval_samples)
    gate = None
    if args.backend == "onnxruntime":  # calibration texts read before anything is written
        gate = gate_spec(model_dir, args, eval_data)
    model = load_pretrained(model_dir).eval()
    from ..engine.kernels import apply_kernels
    apply_kernels(model, "auto")  # speed only (bertforge.engine.kernels)
    src_mb = round((model_dir / "model.safetensors").stat().st_size / 2**20, 3) \
        if (model_dir / "model.safetensors").is_file() else None
    rec = {"model": str(model_dir), "out": str(run_dir.out), "backend": args.backend, "fp32_file_mb": src_mb}
    from ..runtime import load_runner
    from ..runtime.torch import TorchRunner
    with run_dir as tmp:  # --out (or the dir it replaces) changes only once every check has run
        if args.backend == "onnxruntime":
            try:
                rec.update(bo.deploy(model, tmp, source_dir=model_dir, quantize=True, fused=not args.no_fused,
                                     per_channel=not args.per_tensor, fusions=args.fusions or "lean",
                                     reduce_range=args.reduce_range, scheme=args.scheme, target=args.target,
                                     gate=gate))
            except BertforgeError as e:
                hint = _saturation_note(args)
                if hint:
                    raise type(e)(f"{e}; {hint}") from None
                raise
        else:
            qmodel = bq.quantize_dynamic(model, per_channel=not args.per_tensor)
            bq.save_quantized(qmodel, model, tmp, tokenizer_dir=model_dir)
            rec.update(quantization=bq.scheme(not args.per_tensor), file_mb=bq.file_size_mb(tmp / bq.INT8_FILE))
        fp32, int8 = TorchRunner.from_model(model), load_runner(tmp)  # the INT8 model as written
        # output agreement on a random padded batch
        x = bo.dummy_inputs(model, batch=4, seq=32, seed=3)
        a, b = fp32(**x), int8(**x)
        main = "logits" if "logits" in a else "last_hidden_state"
        if main in b and b[main].shape == a[main].shape:
            rec["int8_max_abs_diff"] = round(float(np.abs(b[main] - a[main]).max()), 6)
        if eval_data is not None:
            n = len(getattr(eval_data, "examples", eval_data))  # token tasks: sentences, not windows
            rec["eval"] = {"task": task.name, "n": n, "fp32": adapter.evaluate(fp32, eval_data),
                           "int8": adapter.evaluate(int8, eval_data)}
    note = _saturation_note(args)
    if note:  # an explicit scheme the target's kernels do not compute exactly: written, and said so
        import sys
        rec["warning"] = note
        print(f"bertforge quantize: warning: {note}", file=sys.stderr)
    return rec


def _run_lowbit(model, out, args) -> dict:
    """``--bits``: low-bit weights (:mod:`bertforge.pipelines.quantize_lowbit`), options checked first."""
    from ..checkpoint.modeldir import ModelDir
    from . import quantize_lowbit as lb
    if not args.eval:
        unused = [f for f, v in (("--task", args.task), ("--max-eval-samples", args.max_eval_samples)) if v]
        if unused:
            raise ConfigError(f"{unused[0]} sets up the accuracy check of --eval FILE; pass --eval or drop it")
    require_at_least("--max-eval-samples", args.max_eval_samples, 1)
    require_at_least("--max-seq-len", args.max_seq_len, 2)
    md = ModelDir.open(model)
    lb.check_options(args, md)
    if isinstance(args.calib, (str, Path)) and not Path(args.calib).is_file():
        from ..errors import DataError
        raise DataError(f"--calib {args.calib} is not a file; pass a text file with one text per line")
    run_dir = RunDir(out, inputs=(md.path,), overwrite=args.overwrite)
    eval_data = task = adapter = None
    if args.eval:
        from .evaluate import load_for_task
        _, task, adapter, _ = load_for_task(str(md.path), args.task, args.max_seq_len)
        eval_data = adapter.load(args.eval, args.max_eval_samples)
    items, collate = _lowbit_calibration(md, args, eval_data)
    return lb.run_lowbit(args, md.path, run_dir, eval_data, adapter, task, items, collate)


def _lowbit_calibration(md, args, eval_data) -> tuple:
    """``(items, collate)``: encoded calibration texts (--calib file or list, else the --eval rows, else the
    bundled news sentences), at most ``calib_samples``, and the padding collator."""
    from ..data.collate import PadCollator
    from ..tokenizer import pad_id
    n = max(args.calib_samples or 128, args.hessian_batches * args.hessian_batch_size)
    tok = md.tokenizer()
    max_len = min(args.max_seq_len or md.max_seq_len or 128, md.positions)
    return calibration_items(tok, args.calib, eval_data, n, max_len), PadCollator(pad_id(tok))


def calibration_items(tok, calib, eval_data, n: int, max_len: int) -> list:
    """At most ``n`` encoded calibration inputs (``input_ids`` [, ``token_type_ids``], ≤ ``max_len`` tokens):
    the texts (or text pairs) of ``calib`` — a list from Python, or a file (:func:`calibration_texts`) —, else
    the encoded ``eval_data`` rows, else the news sentences gensim ships (the Lee background corpus)."""
    if isinstance(calib, (list, tuple)):  # texts given from Python
        return _encode(tok, [tuple(t) if isinstance(t, (list, tuple)) else t for t in calib][:n], max_len)
    if calib:
        return _encode(tok, calibration_texts(calib, n), max_len)
    if eval_data is not None:
        return [{k: v for k, v in d.items() if k in ("input_ids", "token_type_ids")} for d in eval_data][:n]
    from ..data.bundled import lee_background_documents
    sents = [s.strip() + "." for _, (doc,) in lee_background_documents() for s in doc.split(". ") if s.strip()]
    return _encode(tok, sents[:n], max_len)


def _saturation_note(args) -> Optional[str]:
    """The warning for an explicitly named scheme that saturates on the target's kernels, else None."""
    from ..compress.int8 import SCHEMES, default_scheme, exact_on, host_target
    if not args.scheme or args.backend != "onnxruntime":
        return None
    target = args.target or host_target()
    if exact_on(SCHEMES[args.scheme], target):
        return None
    return (f"scheme {args.scheme} saturates on {target} (u8×s8 pair sums in int16, vpmaddubsw); drop --scheme "
            f"for {target}'s {default_scheme(target).name}")


def _check_int8_args(args) -> None:
    """One line for INT8 options that contradict each other or are out of range (before anything is read)."""
    from ..compress.int8 import SCHEMES
    if args.scheme is not None and args.scheme not in SCHEMES:
        raise ConfigError(f"--scheme {args.scheme!r} is not an INT8 scheme; choose one of {', '.join(SCHEMES)}")
    if args.reduce_range and args.scheme not in (None, "u8s8-7bit"):
        raise ConfigError(f"--reduce-range means --scheme u8s8-7bit, not {args.scheme}; pass one of them")
    if args.calibration and not (args.scheme and SCHEMES[args.scheme].static):
        raise ConfigError("--calibration sets how a static scheme's activation ranges are found; add "
                          "--scheme s8s8-static or drop it")
    args.max_drop = 1.0 if args.max_drop is None else args.max_drop
    args.calib_samples = 128 if args.calib_samples is None else args.calib_samples
    if not (0.0 <= args.max_drop <= 100.0) or args.max_drop != args.max_drop:
        raise ConfigError(f"--max-drop {args.max_drop:g} is not a number of points in [0, 100]; e.g. 0.5")
    require_at_least("--calib-samples", args.calib_samples, 1)
    if isinstance(args.calib, (list, tuple)) and not any(args.calib):
        raise ConfigError("calib holds no text; pass a list of calibration texts or a file")
    if isinstance(args.calib, (str, Path)) and not Path(args.calib).is_file():
        from ..errors import DataError
        raise DataError(f"--calib {args.calib} is not a file; pass a text file with one text per line")


def calibration_texts(path, limit: int) -> list:
    """Up to ``limit`` texts of a calibration file: one per non-empty line, a tab splitting a text pair
    (→ (a, b)). Raises DataError for a missing, unreadable or empty file."""
    from pathlib import Path
    from ..errors import DataError
    p = Path(path)
    if not p.is_file():
        raise DataError(f"--calib {path} is not a file; pass a text file with one text per line")
    try:
        lines = [ln.rstrip("\r\n") for ln in p.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError:
        raise DataError(f"--calib {path} is not UTF-8 text; pass a text file with one text per line") from None
    texts = [tuple(ln.split("\t", 1)) if "\t" in ln else ln for ln in lines if ln.strip()][:limit]
    if not texts:
        raise DataError(f"--calib {path} holds no text; pass a file with one text per line")
    return texts


def gate_spec(model_dir, args, eval_data=None):
    """The accuracy gate's :class:`~bertforge.compress.int8.GateSpec` for ``model_dir``: calibration batches
    from --calib, else the encoded --eval rows, else the embedded corpus's sentences; the output kind and
    what agreement reads (label names, pooling)."""
    import numpy as np
    from ..compress.int8 import GateSpec
    from ..data.collate import PadCollator
    from ..checkpoint.modeldir import ModelDir
    from ..runtime.base import head_kind
    from ..tokenizer import pad_id
    md = ModelDir.open(model_dir)
    cfg = md.config
    n = args.calib_samples
    max_len = min(args.max_seq_len or md.meta.max_seq_len or 128, int(cfg.get("max_position_embeddings") or 512))
    tok = md.tokenizer()
    items = calibration_items(tok, args.calib, eval_data, n, max_len)
    collate = PadCollator(pad_id(tok))
    batches = []
    for i in range(0, len(items), 32):
        b = collate(items[i:i + 32])
        batches.append({k: b[k].numpy().astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})
    head = md.head
    kind = head_kind(head, cfg)
    if head == "multi_label_classification" or cfg.get("problem_type") == "multi_label_classification":
        kind = "multi_label_classification"
    labels = [str(v) for v in md.labels or []]
    return GateSpec(batches, kind, args.max_drop, args.calibration or "minmax", labels=labels or None,
                    pooling=md.pooling.mode)


def _encode(tok, texts: list, max_len: int) -> list:
    out = []
    for t in texts:
        enc = tok.encode(*t) if isinstance(t, tuple) else tok.encode(t)
        ids = enc.ids[:max_len]
        item = {"input_ids": ids}
        if enc.type_ids:
            item["token_type_ids"] = enc.type_ids[:max_len]
        out.append(item)
    return out


__all__ = ["quantize_with", "QuantizeOptions", "QuantizeResult", "quantize", "gate_spec", "calibration_texts"]
