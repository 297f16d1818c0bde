"""Write predictions of a fine-tuned checkpoint as JSONL (one object per input example).

Example:
  bertforge predict --model runs/sst2 --data test.tsv --out preds.jsonl
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import BertforgeError, require_at_least
from ..io import atomic_write_text
from .evaluate import load_for_task


def add_arguments(p) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--task")
    p.add_argument("--data", required=True, help="input file (labels not needed)")
    p.add_argument("--out", required=True, help="output .jsonl (a new file unless --overwrite)")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def check_out_file(out: Path, model_dir: Path, data: str, overwrite: bool, example: str = "preds.jsonl") -> Path:
    """Refuse an ``--out`` that is a directory, lies inside the model dir, is the input file, or exists
    (without ``--overwrite``): predictions never replace a checkpoint's or a run's files."""
    out = Path(out)
    if out.is_dir():
        raise BertforgeError(f"--out {out} is a directory; pass a file path such as {out}/{example}")
    target = out.resolve()
    if Path(model_dir).resolve() in target.parents:
        raise BertforgeError(f"--out {out} lies inside the model directory {model_dir}; write predictions "
                             f"elsewhere")
    from ._common import enclosing_output
    parent = enclosing_output(target)
    if parent is not None:
        raise BertforgeError(f"--out {out} lies inside {parent}, which holds a bertforge run or model; "
                             f"write outside it")
    if Path(data).exists() and Path(data).resolve() == target:
        raise BertforgeError(f"--out {out} is the input file; choose another --out")
    if out.exists() and not overwrite:
        raise BertforgeError(f"--out {out} exists; pass --overwrite to replace it, or another --out")
    return out


def run(args) -> int:
    require_at_least("--batch-size", args.batch_size, 1)
    model_dir, _, adapter, model = load_for_task(args.model, args.task, args.max_seq_len)
    out = check_out_file(Path(args.out), model_dir, args.data, args.overwrite)
    data = adapter.load(args.data, require_labels=False)
    preds = adapter.predictions(model, data, args.batch_size)
    atomic_write_text(out, "".join(json.dumps(p) + "\n" for p in preds))
    print(json.dumps({"out": args.out, "n": len(preds)}))
    return 0
