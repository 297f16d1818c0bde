"""Quantize a checkpoint to INT8: ONNX Runtime graph (default, fastest on x86) or PyTorch dynamic INT8.

--backend onnxruntime: export (fused attention) → ORT transformer optimizer → ORT INT8, written as
OUT/model.onnx. The scheme follows the CPU the graph is for (--target; default this machine's:
8-bit weights where int32 dot products are exact — VNNI, AMX, ARM64 —, 7-bit weights on AVX2, whose u8×s8
kernel saturates), and an accuracy gate measures the INT8 graph against FP32 on calibration texts (--calib
FILE, the texts of --eval, else the embedded corpus): beyond --max-drop points of agreement it keeps the most
sensitive MatMuls in FP32 (listed in OUT/onnx.json), and where no scheme can meet it nothing is written. --backend torch: torch.ao dynamic INT8 of the Linear layers, OUT/model.int8.safetensors.
With --eval (and a task) the task metric of the FP32 model and of the INT8 model are printed side by side
(both run by :mod:`bertforge.runtime`; the INT8 one as written to OUT).

Examples:
  bertforge quantize --model runs/sst2 --out runs/sst2-int8 --eval dev.tsv
  bertforge quantize --model runs/sst2 --out runs/sst2-avx2 --target avx2 --calib texts.txt --max-drop 0.5
  bertforge quantize --model runs/sst2 --out runs/sst2-static --scheme s8s8-static --calibration percentile
  bertforge quantize --model runs/sst2 --backend torch --out runs/sst2-int8-torch
"""
from __future__ import annotations

from ...errors import ConfigError, require_at_least
from ._common import add_int8_weight_args, print_json, resolve_model_dir
from ._rundir import RunDir


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="FP32 checkpoint dir (HF layout) or 'minilm'")
    p.add_argument("--out", required=True)
    p.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "torch"])
    add_int8_weight_args(p)
    p.add_argument("--no-fused", action="store_true", help="onnxruntime: standard ONNX ops only")
    p.add_argument("--eval", help="labelled file: report the task metric of FP32 and INT8")
    p.add_argument("--task", help="task of --eval (default: the model's own)")
    p.add_argument("--max-eval-samples", type=int)
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--fusions", default=None, choices=["lean", "all"],
                   help="ORT optimizer fusion set (lean: Attention only, faster on our CPU; all: every fusion)")
    from ..names import CALIBRATION_METHODS, INT8_SCHEMES, INT8_TARGETS
    p.add_argument("--target", choices=INT8_TARGETS,
                   help="CPU kind the graph will run on (default: this machine's); picks the scheme")
    p.add_argument("--scheme", choices=INT8_SCHEMES,
                   help="INT8 scheme (default: the target's: u8s8 on vnni/amx/arm64, u8s8-7bit on avx2)")
    p.add_argument("--calib", help="calibration texts for the accuracy gate, one per line (a tab splits a pair)")
    p.add_argument("--calib-samples", type=int, help="calibration texts the gate runs (default 128)")
    p.add_argument("--max-drop", type=float,
                   help="most points of FP32 agreement INT8 may lose on the calibration texts (labels agreeing, "
                        "cosine × 100, span agreement; default 1.0)")
    p.add_argument("--calibration", choices=CALIBRATION_METHODS, default=None,
                   help="static schemes: how activation ranges are calibrated (default minmax)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def run(args) -> int:
    import numpy as np
    from ...compress import onnx as bo
    from ...compress import quantize as bq
    from ...checkpoint.read import load_pretrained
    model_dir = resolve_model_dir(args.model)
    run_dir = RunDir(args.out, inputs=(model_dir,), overwrite=args.overwrite)
    if bq.is_quantized_dir(model_dir) or (model_dir / "model.onnx").is_file():
        raise ConfigError(f"{model_dir} is already exported/quantized; pass the FP32 checkpoint dir")
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
    eval_data = None
    if args.eval:  # read and check the evaluation data before anything is written
        from .evaluate import load_for_task
        _, task, adapter, _ = load_for_task(str(model_dir), args.task, args.max_seq_len)
        eval_data = adapter.load(args.eval, args.max_eval_samples)
    gate = None
    if args.backend == "onnxruntime":  # calibration texts read before anything is written
        gate = gate_spec(model_dir, args, eval_data)
    model = load_pretrained(model_dir).eval()
    from ...engine.kernels import apply_kernels
    apply_kernels(model, "auto")  # speed only (bertforge.engine.kernels)
    src_mb = round((model_dir / "model.safetensors").stat().st_size / 2**20, 3) \
        if (model_dir / "model.safetensors").is_file() else None
    rec = {"model": str(model_dir), "out": str(run_dir.out), "backend": args.backend, "fp32_file_mb": src_mb}
    from ...runtime import load_runner
    from ...runtime.torch import TorchRunner
    with run_dir as tmp:  # --out (or the dir it replaces) changes only once every check has run
        if args.backend == "onnxruntime":
            rec.update(bo.deploy(model, tmp, source_dir=model_dir, quantize=True, fused=not args.no_fused,
                                 per_channel=not args.per_tensor, fusions=args.fusions or "lean",
                                 reduce_range=args.reduce_range, scheme=args.scheme, target=args.target,
                                 gate=gate))
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
    print_json(rec)
    return 0


def _check_int8_args(args) -> None:
    """One line for INT8 options that contradict each other or are out of range (before anything is read)."""
    from ...compress.int8 import SCHEMES
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


def calibration_texts(path, limit: int) -> list:
    """Up to ``limit`` texts of a calibration file: one per non-empty line, a tab splitting a text pair
    (→ (a, b)). Raises DataError for a missing, unreadable or empty file."""
    from pathlib import Path
    from ...errors import DataError
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
    from ...compress.int8 import GateSpec
    from ...data.collate import PadCollator
    from ...checkpoint.read import read_config, saved_head_name
    from ...models.pooling import read_pooling
    from ...runtime.base import head_kind
    from ...tokenizer import load_tokenizer, pad_id
    cfg = read_config(model_dir)
    n = args.calib_samples
    max_len = min(args.max_seq_len or (cfg.get("bertforge") or {}).get("max_seq_len") or 128,
                  int(cfg.get("max_position_embeddings") or 512))
    tok = load_tokenizer(model_dir)
    if args.calib:
        items = _encode(tok, calibration_texts(args.calib, n), max_len)
    elif eval_data is not None:
        items = [{k: v for k, v in d.items() if k in ("input_ids", "token_type_ids")} for d in eval_data][:n]
    else:
        from ...data.bundled import lee_background_documents  # news sentences shipped by gensim
        sents = [s.strip() + "." for _, (doc,) in lee_background_documents() for s in doc.split(". ") if s.strip()]
        items = _encode(tok, sents[:n], max_len)
    collate = PadCollator(pad_id(tok))
    batches = []
    for i in range(0, len(items), 32):
        b = collate(items[i:i + 32])
        batches.append({k: b[k].numpy().astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})
    head = saved_head_name(cfg)
    kind = head_kind(head, cfg)
    if head == "multi_label_classification" or cfg.get("problem_type") == "multi_label_classification":
        kind = "multi_label_classification"
    labels = [str(v) for _, v in sorted((cfg.get("id2label") or {}).items(), key=lambda kv: int(kv[0]))]
    return GateSpec(batches, kind, args.max_drop, args.calibration or "minmax", labels=labels or None,
                    pooling=read_pooling(model_dir).mode)


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
