"""Export a checkpoint to ONNX (dynamic batch/sequence axes) + ONNX Runtime graph optimisation (+ INT8).

Writes OUT/model.onnx, OUT/config.json, the tokenizer files and OUT/onnx.json (fused ops, FP32 parity).

Examples:
  bertforge export --model runs/sst2 --out runs/sst2-onnx
  bertforge export --model runs/sst2 --out runs/sst2-onnx-int8 --int8
"""
from __future__ import annotations


from ._common import add_int8_weight_args, print_json


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
    from ...pipelines.export import ExportOptions, export_with
    opts = {f: getattr(args, f) for f in ExportOptions.__dataclass_fields__}
    print_json(export_with(args.model, args.out, ExportOptions(**opts)).record)
    return 0
