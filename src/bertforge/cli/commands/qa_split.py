"""Split a SQuAD JSON file by article (no article in both parts) into train.json and eval.json.

Deterministic: articles are ordered by sha1(seed:title) and moved to the eval part until it holds
--eval-fraction of the questions. Example (SQuAD v1.1 dev → ~80% / ~20% of the questions):
  bertforge qa-split --data ../shared/data/squad/dev-v1.1.json --out-dir /tmp/squad-split
"""
from __future__ import annotations

import json
from pathlib import Path

from ...io import atomic_write_text
from ._common import check_out_files, print_json


def add_arguments(p) -> None:
    p.add_argument("--data", required=True, help="SQuAD v1.1/v2.0 JSON file")
    p.add_argument("--out-dir", required=True, help="folder for train.json and eval.json")
    p.add_argument("--eval-fraction", type=float, default=0.2, help="share of questions in eval.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace existing train.json / eval.json")


def _count(d: dict) -> int:
    return sum(len(p.get("qas", [])) for a in d["data"] for p in a.get("paragraphs", []))


def run(args) -> int:
    from ...data.squad import _load_json, split_by_article
    out = check_out_files(Path(args.out_dir), ("train.json", "eval.json"), args.overwrite, inputs=(args.data,),
                          flag="--out-dir")
    data = _load_json(Path(args.data))
    train, evl = split_by_article(data, args.eval_fraction, args.seed)
    atomic_write_text(out / "train.json", json.dumps(train, ensure_ascii=False))
    atomic_write_text(out / "eval.json", json.dumps(evl, ensure_ascii=False))
    print_json({"train": str(out / "train.json"), "eval": str(out / "eval.json"),
                "train_articles": len(train["data"]), "eval_articles": len(evl["data"]),
                "train_questions": _count(train), "eval_questions": _count(evl)})
    return 0
