"""Write predictions of a fine-tuned checkpoint as JSONL (one object per input example).

Example:
  bertforge predict --model runs/sst2 --data test.tsv --out preds.jsonl
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import require_at_least
from ..io import atomic_write_text
from ._common import check_out_file
from .evaluate import load_for_task


def add_arguments(p) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--task")
    p.add_argument("--data", required=True, help="input file (labels not needed)")
    p.add_argument("--out", required=True, help="output .jsonl (a new file unless --overwrite)")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def run(args) -> int:
    require_at_least("--batch-size", args.batch_size, 1)
    model_dir, _, adapter, runner = load_for_task(args.model, args.task, args.max_seq_len)
    out = check_out_file(Path(args.out), (model_dir,), (args.data,), args.overwrite)
    data = adapter.load(args.data, require_labels=False)
    preds = adapter.predictions(runner, data, args.batch_size)
    atomic_write_text(out, "".join(json.dumps(p) + "\n" for p in preds))
    print(json.dumps({"out": args.out, "n": len(preds)}))
    return 0
