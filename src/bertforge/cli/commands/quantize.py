"""Quantize a checkpoint to INT8: ONNX Runtime graph (default, fastest on x86) or PyTorch dynamic INT8.

--backend onnxruntime: export (fused attention) → ORT transformer optimizer → ORT INT8, written as
OUT/model.onnx. The scheme follows the CPU the graph is for (--target; default this machine's:
8-bit weights where int32 dot products are exact — VNNI, AMX, ARM64 —, 7-bit weights on AVX2, whose u8×s8
kernel saturates), and an accuracy gate measures the INT8 graph against FP32 on calibration texts (--calib
FILE, the texts of --eval, else the embedded corpus): beyond --max-drop points of agreement it keeps the most
sensitive MatMuls in FP32 (listed in OUT/onnx.json), and where no scheme can meet it nothing is written.

--backend torch: torch.ao dynamic INT8 of the Linear layers, OUT/model.int8.safetensors.

With --eval (and a task) the task metric of the FP32 model and of the INT8 model are printed side by side
(both run by :mod:`bertforge.runtime`; the INT8 one as written to OUT).

Examples:
  bertforge quantize --model runs/sst2 --out runs/sst2-int8 --eval dev.tsv
  bertforge quantize --model runs/sst2 --out runs/sst2-avx2 --target avx2 --calib texts.txt --max-drop 0.5
  bertforge quantize --model runs/sst2 --out runs/sst2-static --scheme s8s8-static --calibration percentile
  bertforge quantize --model runs/sst2 --backend torch --out runs/sst2-int8-torch
  bertforge quantize --model runs/sst2 --out runs/sst2-q4 --bits mixed --size-budget 14 --qat-train train.tsv

--bits (Q-BERT, Shen et al. 2020): bits per encoder layer from {2, 3, 4, 8} by Hessian sensitivity under
--size-budget MB (or one width for all), group-wise scales, fine-tuning with the FP32 model as teacher, and a
graph of ONNX Runtime's MatMulNBits / GatherBlockQuantized; lowbit.json records bits per layer, sizes and
round-to-nearest beside the result.
"""
from __future__ import annotations

from ._common import add_int8_weight_args, print_json


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="FP32 checkpoint dir (HF layout) or 'minilm'")
    p.add_argument("--out", required=True, help="output dir (model.onnx or model.int8.safetensors, config, "
                                                "tokenizer, onnx.json)")
    p.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "torch"])
    add_int8_weight_args(p)
    p.add_argument("--no-fused", action="store_true", help="onnxruntime: standard ONNX ops only")
    p.add_argument("--eval", help="labelled file: report the task metric of FP32 and INT8 (its texts also feed "
                                  "the accuracy gate unless --calib is given)")
    p.add_argument("--task", help="task of --eval (default: the model's own)")
    p.add_argument("--max-eval-samples", type=int)
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--fusions", default=None, choices=["lean", "all"],
                   help="ORT optimizer fusion set (lean: Attention only, faster on our CPU; all: every fusion)")
    from ..names import CALIBRATION_METHODS, INT8_SCHEMES, INT8_TARGETS
    p.add_argument("--target", choices=INT8_TARGETS,
                   help="CPU kind the graph will run on (default: this machine's, from /proc/cpuinfo): avx2 = x86 "
                        "without VNNI (e.g. AMD Zen 2/3), vnni = avx512_vnni or avx_vnni, amx = amx_int8, arm64; "
                        "picks the scheme")
    p.add_argument("--scheme", choices=INT8_SCHEMES,
                   help="INT8 scheme (default: the target's: u8s8 on vnni/amx/arm64, u8s8-7bit on avx2)")
    p.add_argument("--calib", help="calibration texts for the accuracy gate, one per line (a tab splits a pair)")
    p.add_argument("--calib-samples", type=int, help="calibration texts the gate (and a static scheme's calibration) "
                                                                    "runs (default 128)")
    p.add_argument("--max-drop", type=float,
                   help="most points (0-100) of FP32 agreement INT8 may lose on the calibration texts (labels "
                        "agreeing, cosine × 100, span agreement; default 1.0); beyond it the most sensitive "
                        "MatMuls stay FP32, and if half of them cannot meet it nothing is written")
    p.add_argument("--calibration", choices=CALIBRATION_METHODS, default=None,
                   help="static schemes: how activation ranges are calibrated (default minmax)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    g = p.add_argument_group("low-bit weights (Q-BERT: Hessian-guided mixed precision, group-wise, with KD)")
    g.add_argument("--bits", help="2, 3, 4, 8 (every encoder layer) or mixed (bits per layer from {2,3,4,8} by "
                                  "Hessian sensitivity under --size-budget); writes a MatMulNBits graph")
    g.add_argument("--size-budget", type=float, help="--bits mixed: most MB of weights (true size: bits × "
                                                     "weights + scales + zero points, FP32 rest)")
    g.add_argument("--group-size", type=int, help="input columns sharing one scale and zero point (default 64)")
    g.add_argument("--embed-bits", type=int, default=4, help="bits of the word-embedding table (4 or 8)")
    g.add_argument("--qat-steps", type=int, help="quantization-aware fine-tuning steps, FP32 model as teacher "
                                                 "(default 300; 0 = round-to-nearest only)")
    g.add_argument("--qat-train", help="task file whose texts the fine-tuning distils on (default the "
                                       "calibration texts)")
    g.add_argument("--max-qat-samples", type=int)
    g.add_argument("--qat-lr", type=float, default=5e-5)
    g.add_argument("--qat-batch-size", type=int, default=32)
    g.add_argument("--hessian-batches", type=int, default=2, help="calibration batches the sensitivity reads")
    g.add_argument("--hessian-batch-size", type=int, default=8)
    g.add_argument("--hessian-iters", type=int, default=20, help="most power-iteration steps per layer")
    g.add_argument("--trace-samples", type=int, default=8, help="Hutchinson probes per layer and batch")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--accuracy-level", type=int, default=0,
                   help="MatMulNBits compute: 0 = FP32 products (equals the fake-quantized model), 4 = int8 "
                        "activations and integer dot products (faster on VNNI/AMX CPUs, not exact)")


def run(args) -> int:
    from ...pipelines.quantize import QuantizeOptions, quantize_with
    opts = {f: getattr(args, f) for f in QuantizeOptions.__dataclass_fields__ if hasattr(args, f)}
    print_json(quantize_with(args.model, args.out, QuantizeOptions(**opts)).record)
    return 0
