"""Fine-tune a checkpoint on a labelled task (GLUE, custom CSV/TSV/JSONL, NER, QA).

Example:
  bertforge finetune --model minilm --task sst2 --train train.tsv --eval dev.tsv --out runs/sst2 \
      --epochs 1 --batch-size 32 --lr 5e-5 --max-seq-len 64 --max-train-samples 8000
"""
from __future__ import annotations

from pathlib import Path

from ..names import TASK_NAMES
from ._common import add_recipe_args, add_train_args, print_json

#: what ``--max-train-samples`` counts, per kind of task (the help text and docs/ner_qa.md say the same)
MAX_TRAIN_SAMPLES_HELP = ("use only the first N training records: rows (classification, regression), sentences "
                          "(NER: packed into fewer windows of --max-seq-len tokens) or questions (QA: a long "
                          "context gives several windows); the run prints how many windows and optimizer "
                          "steps that makes before training")


def add_arguments(p) -> None:
    p.add_argument("--model", help="checkpoint dir (HF layout) or 'minilm' (embedded); default: the one "
                                   "--recipe RUN/recipe.yaml records")
    p.add_argument("--task", help=f"task name ({', '.join(TASK_NAMES)} or custom)")
    p.add_argument("--train", help="training file (TSV/CSV/JSONL) or hub dataset name")
    p.add_argument("--eval", help="evaluation file")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--max-train-samples", type=int, metavar="N", help=MAX_TRAIN_SAMPLES_HELP)
    g = p.add_argument_group("--task retrieval (recipe section retrieval.*; docs/search.md)")
    g.add_argument("--matryoshka-dims", metavar="D,D,…",
                   help="Matryoshka representation learning: the loss summed over these nested embedding dims "
                        "(e.g. 384,256,128,64; each ≤ the model's width)")
    g.add_argument("--truncate-dim", type=int, metavar="D",
                   help="the embedding dim the saved dir serves (sentence-transformers' truncate_dim)")
    g.add_argument("--hard-negatives", type=int, metavar="N",
                   help="mine N hard negatives per query with the model itself before training")
    g.add_argument("--symmetric", action="store_true",
                   help="symmetric in-batch-negatives loss (query→passage and passage→query)")
    g.add_argument("--pooling", choices=("mean", "cls", "max"),
                   help="pooling of the embedding (default: the model dir's, else mean)")
    add_train_args(p)
    add_recipe_args(p)


def run(args) -> int:
    from ...pipelines.finetune import FinetuneOptions, finetune_with
    opts = FinetuneOptions(**{f: getattr(args, f, None) for f in FinetuneOptions.__dataclass_fields__
                              if hasattr(args, f)})
    result = finetune_with(opts)
    print_json({"out": str(result.out), **result.metrics})
    return 0
