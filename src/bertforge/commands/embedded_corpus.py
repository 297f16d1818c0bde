"""Write the embedded default corpus (gensim's Wikipedia articles + Lee background news) as text files.

One sentence per line, a blank line between documents (the BERT pretraining layout), split into
``train.txt`` and a held-out slice of whole documents ``heldout.txt``; ``corpus.json`` records counts.
Needs no network: the text ships inside the ``gensim`` wheel.

Example:
  bertforge embedded-corpus --out runs/corpus
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BertforgeError
from ._common import print_json


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="folder for train.txt, heldout.txt, corpus.json")
    p.add_argument("--heldout-fraction", type=float, default=0.05,
                   help="share of documents kept for evaluation (default 0.05)")
    p.add_argument("--max-documents", type=int, help="keep only the first N documents of each source")
    p.add_argument("--overwrite", action="store_true", help="replace an existing corpus in --out")


def run(args) -> int:
    from ..data.embedded import build_corpus
    out = Path(args.out)
    if (out / "corpus.json").exists() and not args.overwrite:
        raise BertforgeError(f"--out {out} already holds a corpus; pass --overwrite to rebuild it")
    info = build_corpus(out, args.heldout_fraction, args.max_documents)
    print_json({"out": str(out), "train": info["train"], "heldout": info["heldout"]})
    return 0
