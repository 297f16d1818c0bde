"""Write predictions of a fine-tuned checkpoint: JSONL (one object per input example, each with the row's
``id``), or with ``--format glue`` the TSV the GLUE server takes (``index<TAB>prediction``).

Example:
  bertforge predict --model runs/sst2 --data test.tsv --out preds.jsonl
  bertforge predict --model runs/rte --data RTE/test.tsv --out RTE.tsv --format glue
"""
from __future__ import annotations

import json

from .evaluate import add_aggregation_arg, add_multilabel_args


def add_arguments(p) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--task")
    p.add_argument("--data", required=True, help="input file (labels not needed; GLUE test files as shipped)")
    p.add_argument("--out", required=True, help="output file (a new file unless --overwrite)")
    p.add_argument("--format", choices=("jsonl", "glue"), default="jsonl",
                   help="jsonl: one JSON object per example with its id (the row's index/id column, else its "
                        "line number); glue: the GLUE submission TSV (index<TAB>prediction; sequence tasks)")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    add_multilabel_args(p)
    add_aggregation_arg(p)


def run(args) -> int:
    from ...pipelines.predict import predict
    fmt = getattr(args, "format", "jsonl")
    preds = predict(args.model, args.data, args.out, task=args.task, format=fmt, max_seq_len=args.max_seq_len,
                    batch_size=args.batch_size, threshold=getattr(args, "threshold", None),
                    labels_file=getattr(args, "labels_file", None), overwrite=args.overwrite,
                    aggregation=getattr(args, "aggregation", None))
    print(json.dumps({"out": args.out, "n": len(preds), "format": fmt}))
    return 0
