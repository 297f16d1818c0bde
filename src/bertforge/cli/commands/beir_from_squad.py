"""Turn a SQuAD JSON file into a BEIR retrieval set (question → its paragraph), split by article.

Every paragraph becomes a document of corpus.jsonl, every question a query of queries.jsonl judged relevant
to its own paragraph. Articles are split as `bertforge qa-split` splits them (sha1(seed:title) order, no
article in both parts): qrels/test.tsv judges the questions of --eval-fraction of the questions' articles,
qrels/train.tsv the rest, also written as train.jsonl pairs {"query", "positive"} for
`finetune --task retrieval`. --eval-fraction 1 puts every article in test (the whole file as one set).
Example (SQuAD v1.1 dev: 2,067 paragraphs, 10,570 questions):
  bertforge beir-from-squad --data ../shared/data/squad/dev-v1.1.json --out-dir /tmp/squad-beir
"""
from __future__ import annotations

from pathlib import Path

from ...errors import BertforgeError
from ._common import print_json


def add_arguments(p) -> None:
    p.add_argument("--data", required=True, help="SQuAD v1.1/v2.0 JSON file")
    p.add_argument("--out-dir", required=True, help="new folder for the BEIR set")
    p.add_argument("--eval-fraction", type=float, default=0.2,
                   help="share of questions (whole articles) in qrels/test.tsv (default 0.2; 1 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing BEIR set in --out-dir")


def run(args) -> int:
    from ...data.beir import squad_to_beir
    from ...pipelines.rundir import enclosing_output, holds_output
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise BertforgeError(f"--out-dir {out} is a file; pass a new folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / "corpus.jsonl").is_file() or not args.overwrite:
            what = "a BEIR set; pass --overwrite to replace it" if (out / "corpus.jsonl").is_file() else \
                "files that are not a BEIR set; pass a new folder"
            raise BertforgeError(f"--out-dir {out} holds {what}")
    res = out.resolve()
    if holds_output(res) or enclosing_output(res) is not None:
        raise BertforgeError(f"--out-dir {out} lies in a bertforge run or model dir; write elsewhere")
    if Path(args.data).resolve().parent == res or res in Path(args.data).resolve().parents:
        raise BertforgeError(f"--out-dir {out} holds the input --data; choose another folder")
    print_json(squad_to_beir(args.data, out, args.eval_fraction, args.seed))
    return 0
