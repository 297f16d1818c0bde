"""Export a checkpoint to ONNX (dynamic batch/sequence axes) + ONNX Runtime graph optimisation (+ INT8).

Writes OUT/model.onnx, OUT/config.json, the tokenizer files and OUT/onnx.json (fused ops, FP32 parity).

Examples:
  bertforge export --model runs/sst2 --out runs/sst2-onnx
  bertforge export --model runs/sst2 --out runs/sst2-onnx-int8 --int8
"""
from __future__ import annotations


from ...errors import ConfigError
from ._common import add_int8_weight_args, print_json, resolve_model_dir
from ._rundir import RunDir


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="checkpoint dir (HF layout) or 'minilm'")
    p.add_argument("--out", required=True, help="output dir (model.onnx + config + tokenizer)")
    p.add_argument("--int8", action="store_true", help="ONNX Runtime dynamic INT8 after optimisation")
    add_int8_weight_args(p)
    p.add_argument("--no-optimize", action="store_true", help="skip the ONNX Runtime transformer optimizer")
    p.add_argument("--no-fused", action="store_true",
                   help="standard ONNX ops only (no com.microsoft Attention contrib op)")
    p.add_argument("--fusions", default=None, choices=["lean", "all"],
                   help="ORT optimizer fusion set (lean: Attention only, faster on our CPU; all: every fusion)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def run(args) -> int:
    from ...compress.onnx import deploy
    from ...checkpoint.read import load_pretrained
    for flag, on in (("--reduce-range", args.reduce_range), ("--per-tensor", args.per_tensor)):
        if on and not args.int8:
            raise ConfigError(f"{flag} sets how INT8 weights are quantized; add --int8 or drop it")
    if args.fusions is not None and args.no_optimize:
        raise ConfigError("--fusions picks the ONNX Runtime optimizer's fusions and --no-optimize skips that "
                          "optimizer; pass one of them")
    model_dir = resolve_model_dir(args.model)
    from ...models.static import is_static_dir
    if is_static_dir(model_dir):
        return _export_static(args, model_dir)
    run_dir = RunDir(args.out, inputs=(model_dir,), overwrite=args.overwrite)
    model = load_pretrained(model_dir).eval()
    from ...engine.kernels import apply_kernels
    apply_kernels(model, "auto")  # speed only (bertforge.engine.kernels)
    with run_dir as work:
        rec = deploy(model, work, source_dir=model_dir, optimize=not args.no_optimize, quantize=args.int8,
                     fused=not args.no_fused, per_channel=not args.per_tensor, fusions=args.fusions or "lean",
                     reduce_range=args.reduce_range)
    print_json({"model": str(model_dir), "out": str(run_dir.out), **rec})
    return 0


def _export_static(args, model_dir) -> int:
    """A static embedding dir → the Gather + masked-mean graph (no optimizer, no INT8: a lookup has neither
    attention to fuse nor Linear layers to quantize)."""
    from ...compress.onnx import deploy_static
    from ...models.static import load_static
    if args.int8:
        raise ConfigError(f"{model_dir} is a static embedding model (a table lookup, no Linear layer to "
                          f"quantize); drop --int8")
    run_dir = RunDir(args.out, inputs=(model_dir,), overwrite=args.overwrite)
    model = load_static(model_dir)
    with run_dir as work:
        rec = deploy_static(model, work, source_dir=model_dir)
    print_json({"model": str(model_dir), "out": str(run_dir.out), **rec})
    return 0
