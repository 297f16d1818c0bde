"""Write the embedded default corpus (gensim's Wikipedia articles + Lee background news) as text files.

One sentence per line, a blank line between documents (the BERT pretraining layout), split into
``train.txt`` and a held-out slice of whole documents ``heldout.txt``; ``corpus.json`` records counts.
Needs no network: the text ships inside the ``gensim`` wheel.

Example:
  bertforge embedded-corpus --out runs/corpus
"""
from __future__ import annotations

from pathlib import Path

from ...errors import BertforgeError, require_at_least
from ._common import check_out_files, print_json


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="folder for train.txt, heldout.txt, corpus.json")
    p.add_argument("--heldout-fraction", type=float, default=0.05,
                   help="share of documents kept for evaluation (default 0.05)")
    p.add_argument("--max-documents", type=int, help="keep only the first N documents of each source")
    p.add_argument("--overwrite", action="store_true", help="replace an existing corpus in --out")


def run(args) -> int:
    from ...data.bundled import build_corpus
    if args.max_documents is not None:
        require_at_least("--max-documents", args.max_documents, 1)
    if not 0.0 < args.heldout_fraction < 1.0:
        raise BertforgeError(f"--heldout-fraction {args.heldout_fraction} must be in (0, 1), e.g. 0.05")
    out = check_out_files(Path(args.out), ("train.txt", "heldout.txt", "corpus.json"), args.overwrite)
    created = not out.exists()
    try:
        info = build_corpus(out, args.heldout_fraction, args.max_documents)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # nothing was written: leave nothing behind
        raise
    print_json({"out": str(out), "train": info["train"], "heldout": info["heldout"]})
    return 0
