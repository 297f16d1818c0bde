"""Write predictions of a fine-tuned checkpoint: JSONL (one object per input example, each with the row's
``id``), or with ``--format glue`` the TSV the GLUE server takes (``index<TAB>prediction``).

Example:
  bertforge predict --model runs/sst2 --data test.tsv --out preds.jsonl
  bertforge predict --model runs/rte --data RTE/test.tsv --out RTE.tsv --format glue
"""
from __future__ import annotations

import json
from pathlib import Path

from ...errors import ConfigError, require_at_least
from ...io import atomic_write_text
from ._common import check_out_file
from .evaluate import add_multilabel_args


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


def _check_glue_format(task) -> None:
    if task.kind not in ("classification", "regression"):
        raise ConfigError(f"--format glue writes sentence (pair) classification and regression predictions; "
                          f"task {task.name} is {task.kind}: use --format jsonl")


def run(args) -> int:
    require_at_least("--batch-size", args.batch_size, 1)
    fmt = getattr(args, "format", "jsonl")
    if fmt == "glue" and args.task:  # before loading the model
        from ...tasks import ALIASES, TASKS
        named = TASKS.get(ALIASES.get(args.task.lower(), args.task.lower()))
        if named is not None:
            _check_glue_format(named)
    from ...pipelines.evaluate import load_for_task
    model_dir, task, adapter, runner = load_for_task(args.model, args.task, args.max_seq_len,
                                                     getattr(args, "threshold", None),
                                                     getattr(args, "labels_file", None))
    if fmt == "glue":
        _check_glue_format(task)
    out = check_out_file(Path(args.out), (model_dir,), (args.data,), args.overwrite,
                         example="preds.tsv" if fmt == "glue" else "preds.jsonl")
    # read → encode → run → decode (the task adapter's steps, as evaluate and the server's routes)
    data = adapter.encode(adapter.read(args.data, require_labels=False), source=str(args.data))
    preds = adapter.predictions(runner, data, args.batch_size)
    if fmt == "glue":
        from ...tasks.classification import glue_submission
        text = glue_submission(preds)
    else:
        text = "".join(json.dumps(p) + "\n" for p in preds)
    atomic_write_text(out, text)
    print(json.dumps({"out": args.out, "n": len(preds), "format": fmt}))
    return 0
