"""Evaluate a fine-tuned checkpoint (or its ONNX / INT8 export) on a labelled file; prints one JSON object
of metrics. The model is run by :mod:`bertforge.runtime`.

Example:
  bertforge evaluate --model runs/sst2 --task sst2 --data dev.tsv
"""
from __future__ import annotations

import sys

from ...errors import require_at_least
from ._common import print_json


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="fine-tuned checkpoint dir")
    p.add_argument("--task", help="task name (default: the task the model was fine-tuned on)")
    p.add_argument("--data", required=True, help="labelled file (TSV/CSV/JSONL) or hub dataset name")
    p.add_argument("--max-seq-len", type=int, help="default: the fine-tuning length")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-samples", type=int)
    add_multilabel_args(p)
    add_aggregation_arg(p)


def add_multilabel_args(p) -> None:
    """``--threshold`` / ``--labels-file`` of a multi-label model (``evaluate``, ``predict``)."""
    p.add_argument("--threshold", metavar="T",
                   help="multi-label: predict a label when its probability >= T, instead of the thresholds "
                        "saved in the model dir (a number, or a JSON list / object label -> threshold)")
    p.add_argument("--labels-file", metavar="FILE",
                   help="multi-label: label names, one per line; checked to be the model's labels in order")


def add_aggregation_arg(p) -> None:
    """``--aggregation`` of a NER model (``evaluate``, ``predict``)."""
    p.add_argument("--aggregation", choices=("first", "average", "max"),
                   help="NER: a word's tag from its first subword (first: the trained scheme), the average of its "
                        "subwords' probabilities, or its subword of max probability (transformers' "
                        "aggregation_strategy; default: what the model dir records, first)")


def run(args) -> int:
    require_at_least("--batch-size", args.batch_size, 1)
    require_at_least("--max-samples", args.max_samples, 1)
    from ...pipelines.evaluate import evaluate_with
    result = evaluate_with(args.model, args.data, task=args.task, max_seq_len=args.max_seq_len,
                           batch_size=args.batch_size, max_samples=args.max_samples,
                           threshold=getattr(args, "threshold", None),
                           labels_file=getattr(args, "labels_file", None),
                           aggregation=getattr(args, "aggregation", None))
    metrics, task = result.metrics, result.task
    from ...pipelines.report import collapse_message
    warning = collapse_message(metrics, task)
    if warning:
        print(f"bertforge evaluate: {warning}", file=sys.stderr)
    if "constant_macro_f1" in metrics and metrics["macro_f1"] <= metrics["constant_macro_f1"]:
        print(f"bertforge evaluate: warning: macro-F1 {metrics['macro_f1']:.4g} is no better than the constant "
              f"predictor's {metrics['constant_macro_f1']:.4g} (every label for every row): the model has "
              f"collapsed — more steps, another learning rate, train.pos_weight=sqrt", file=sys.stderr)
    # token tasks batch windows; n counts the source sentences / questions
    print_json({"task": task.name, "n": result.n, **metrics, "eval_seconds": result.seconds})
    return 0
