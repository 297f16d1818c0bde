"""Quantize a checkpoint to INT8: ONNX Runtime graph (default, fastest on x86) or PyTorch dynamic INT8.

--backend onnxruntime: export (fused attention) → ORT transformer optimizer → ORT dynamic INT8, written as
OUT/model.onnx. --backend torch: torch.ao dynamic INT8 of the Linear layers, OUT/model.int8.safetensors.
With --eval (and a task) the task metric of the FP32 model and of the INT8 model are printed side by side
(both run by :mod:`bertforge.runtime`; the INT8 one as written to OUT).

Examples:
  bertforge quantize --model runs/sst2 --out runs/sst2-int8 --eval dev.tsv
  bertforge quantize --model runs/sst2 --backend torch --out runs/sst2-int8-torch
"""
from __future__ import annotations

from ..errors import ConfigError, require_at_least
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
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def run(args) -> int:
    import numpy as np
    from ..compress import onnx as bo
    from ..compress import quantize as bq
    from ..hf import load_pretrained
    model_dir = resolve_model_dir(args.model)
    run_dir = RunDir(args.out, inputs=(model_dir,), overwrite=args.overwrite)
    if bq.is_quantized_dir(model_dir) or (model_dir / "model.onnx").is_file():
        raise ConfigError(f"{model_dir} is already exported/quantized; pass the FP32 checkpoint dir")
    if args.backend != "onnxruntime":  # graph options would be silently ignored by the torch backend
        used = [f for f, on in (("--reduce-range", args.reduce_range), ("--no-fused", args.no_fused),
                                ("--fusions", args.fusions is not None)) if on]
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
    require_at_least("--max-eval-samples", args.max_eval_samples, 1)
    require_at_least("--max-seq-len", args.max_seq_len, 2)
    eval_data = None
    if args.eval:  # read and check the evaluation data before anything is written
        from .evaluate import load_for_task
        _, task, adapter, _ = load_for_task(str(model_dir), args.task, args.max_seq_len)
        eval_data = adapter.load(args.eval, args.max_eval_samples)
    model = load_pretrained(model_dir).eval()
    from ..kernels import apply_kernels
    apply_kernels(model, "auto")  # speed only (bertforge.kernels)
    src_mb = round((model_dir / "model.safetensors").stat().st_size / 2**20, 3) \
        if (model_dir / "model.safetensors").is_file() else None
    rec = {"model": str(model_dir), "out": str(run_dir.out), "backend": args.backend, "fp32_file_mb": src_mb}
    from ..runtime import load_runner
    from ..runtime.torch import TorchRunner
    with run_dir as tmp:  # --out (or the dir it replaces) changes only once every check has run
        if args.backend == "onnxruntime":
            rec.update(bo.deploy(model, tmp, source_dir=model_dir, quantize=True, fused=not args.no_fused,
                                 per_channel=not args.per_tensor, fusions=args.fusions or "lean",
                                 reduce_range=args.reduce_range))
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
