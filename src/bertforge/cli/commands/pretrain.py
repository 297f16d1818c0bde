"""Pretrain an encoder from raw text: --objective bert|roberta|albert|electra|spanbert|modernbert.

Trains (or reuses) a tokenizer, tokenizes and caches the corpus, builds FULL-SENTENCES / DOC-SENTENCES
/ NSP / SOP sequences, masks them (static ×K or dynamic; token, whole-word or span) and trains on the
one Trainer. The run dir is a Hugging Face checkpoint (ELECTRA: the discriminator, generator in
generator/) plus recipe.yaml and metrics.jsonl (per-term losses, MLM/RTD accuracy, held-out accuracy
vs the unigram baseline).

Example:
  bertforge pretrain --objective roberta --corpus ../shared/data/wikitext-2-raw/wiki.valid.raw \
      --out runs/roberta-tiny --size tiny --max-steps 300
"""
from __future__ import annotations

from ..names import OBJECTIVE_NAMES, SIZE_NAMES, Choices
from ._common import add_train_args, print_json


def add_arguments(p) -> None:
    p.add_argument("--objective", choices=Choices(sorted(OBJECTIVE_NAMES), "bertforge.objectives.pretrain:OBJECTIVES"),
                   help="default: the one --recipe RUN/recipe.yaml records (pretrain.objective)")
    p.add_argument("--corpus", nargs="+", metavar="FILE",
                   help="text files, or HF hub dataset names (NAME or NAME:CONFIG, a 'text' column; streamed); "
                        "default: the ones --recipe RUN/recipe.yaml records")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--size", choices=Choices(sorted(SIZE_NAMES), "bertforge.objectives.pretrain:SIZES"),
                   help="model/train shape (default tiny; a --recipe's own values must agree with it)")
    p.add_argument("--tokenizer", help="wordpiece | wordpiece-cased | bpe | unigram (trained on the corpus) "
                                       "or a checkpoint dir / 'minilm' to reuse its tokenizer")
    p.add_argument("--vocab-size", type=int, help="vocabulary size of a trained tokenizer")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--masking", choices=("static", "dynamic"))
    p.add_argument("--dupe-factor", type=int, help="static masking: copies with different masks (BERT: 10)")
    p.add_argument("--whole-word", action="store_true", help="whole-word masking")
    p.add_argument("--doc-sep", choices=("auto", "file", "blank", "heading"),
                   help="where a document ends (default auto)")
    p.add_argument("--cache-dir", help="tokenization cache (default $BERTFORGE_CACHE or ~/.cache/bertforge)")
    add_train_args(p)
    p.add_argument("--recipe", help="YAML recipe (model/data/train/impl/pretrain sections)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="recipe overrides with dotted keys, e.g. train.lr=3e-4 pretrain.mlm_probability=0.2")


def run(args) -> int:
    from ...pipelines.pretrain import PretrainOptions, pretrain_with
    result = pretrain_with(PretrainOptions(**{f: getattr(args, f) for f in PretrainOptions.__dataclass_fields__}))
    print_json({"out": str(result.out), **{k: v for k, v in result.metrics.items()
                                           if not isinstance(v, (list, dict))}})
    return 0
