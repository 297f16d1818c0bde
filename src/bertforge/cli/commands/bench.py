"""Time inference of a model dir (bertforge, ONNX, INT8 or plain transformers); prints one JSON object.

Fields: latency p50/p90 (ms), throughput (sequences/s), parameters (each distinct weight once — a tied
embedding once — so one dir gives one count on every backend), file size (MB), GFLOPs per sequence,
achieved GFLOP/s, threads, CPU flags. The same timing loop serves every backend. `--backend transformers`
loads the class of the config's ``architectures`` (``model_class``) and lists any checkpoint weights it
leaves out (``checkpoint_weights_unused``, e.g. SpanBERT's SBO head) or initialises fresh.

Examples:
  bertforge bench --model runs/sst2 --seq-len 128 --batch-size 1
  bertforge bench --model runs/sst2-int8 --backend onnxruntime
  bertforge bench --model /path/to/hf-bert --backend transformers

Bad options (--iters 0, --threads beyond 4 × cores, a batch × sequence too large for the available memory,
--int8 on an FP32 ONNX dir) stop with one error line before anything is loaded or timed.
"""
from __future__ import annotations


from ..names import BACKENDS
from ._common import print_json


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="checkpoint dir, exported dir (model.onnx) or a "
                                                  "transformers dir")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto: onnxruntime if the dir has model.onnx, else torch")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, help="intra-op threads, 1 … 4 × cores (default: PyTorch's default)")
    p.add_argument("--int8", action="store_true",
                   help="torch: dynamic INT8 Linear; onnxruntime on a checkpoint: export + INT8 on the fly")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (≥ 0)")
    p.add_argument("--iters", type=int, default=30, help="timed calls (≥ 1)")
    p.add_argument("--min-seconds", type=float, default=0.0, help="keep timing at least this long (≥ 0)")


def run(args) -> int:
    from ...pipelines.bench import bench
    rec = bench(args.model, backend=args.backend, seq_len=args.seq_len, batch_size=args.batch_size,
                threads=args.threads, warmup=args.warmup, iters=args.iters, min_seconds=args.min_seconds,
                int8=args.int8)
    if rec.get("warning"):
        import sys
        print(f"bertforge bench: warning: {rec['warning']}", file=sys.stderr)
    print_json(rec)
    return 0
