"""Distil a teacher into a smaller student (KD, DistilBERT, BERT-PKD, TinyBERT, MiniLM, MobileBERT, embeddings).

Methods: kd, distilbert, pkd, tinybert, minilm, mobilebert (progressive transfer); embedding_mse, margin_mse and
inbatch_kl for embedding models; static (a static embedding table, no training).

Examples:
  bertforge distill --teacher runs/sst2 --student layers:0,2,4 --method kd --task sst2 \
      --train train.tsv --eval dev.tsv --out runs/sst2-3l
  bertforge distill --stage general --teacher minilm --student 4L-312H-12A-1200I --method tinybert \
      --corpus wiki.valid.raw emma.txt --out runs/tiny-general --max-steps 300
  bertforge distill --teacher runs/sst2 --student runs/tiny-general --method tinybert --task sst2 \
      --train train.tsv --eval dev.tsv --augment 4 --out runs/tiny-sst2
  bertforge distill --method static --teacher minilm --dim 256 --out runs/minilm-static
  bertforge distill --teacher runs/sst2 --student mobilebert:6L-384H-96B-12A-384I-4F-384E --method mobilebert \
      --task sst2 --train train.tsv --eval dev.tsv --out runs/sst2-mobilebert

The verb parses flags and prints the result; the work is :func:`bertforge.pipelines.distill.distill_with`
(``bertforge.distill`` from Python, docs/python.md).
"""
from __future__ import annotations

from ..names import DISTILL_METHODS, DISTILL_STAGES, DISTILL_TABLE_METHODS, LAYER_MAPS, Choices
from ._common import add_recipe_args, add_train_args, print_json


def add_arguments(p) -> None:
    p.add_argument("--teacher", action="append",
                   help="teacher checkpoint dir or 'minilm'; repeat for several teachers (averaged soft targets); "
                        "default: the ones --recipe RUN/recipe.yaml records")
    p.add_argument("--student", help="shape (4L-312H-12A-1200I, 6L-768H), FAMILY:SHAPE for another family "
                                     "(modernbert:4L-384H-6A-576I), layers:0,2,4 (copied from the "
                                     "teacher) or a checkpoint dir (an earlier stage)")
    p.add_argument("--method", choices=Choices(DISTILL_METHODS + DISTILL_TABLE_METHODS,
                                               "bertforge.distillation.distiller:METHODS"),
                   help="named loss set (default kd for --stage task, tinybert for --stage general); static: "
                        "a static embedding table (every vocabulary token through the teacher, PCA to --dim, "
                        "SIF/Zipf weights; no training)")
    p.add_argument("--dim", type=int, metavar="D", help="--method static: dimensions of the table (default 256)")
    p.add_argument("--sif-coefficient", type=float, metavar="A",
                   help="--method static: SIF weight a/(a+p(w)) coefficient a (default 1e-4)")
    p.add_argument("--remove-top", type=int, metavar="K",
                   help="--method static: skip the top K principal components (common-component removal; "
                        "default 8, at most the teacher's width − --dim; 0: model2vec's recipe)")
    p.add_argument("--stage", choices=DISTILL_STAGES, help="task (labelled data) or general (raw text)")
    p.add_argument("--task", help="task name for --stage task (default: the teacher's task)")
    p.add_argument("--train", help="labelled training file (--stage task)")
    p.add_argument("--eval", help="labelled evaluation file")
    p.add_argument("--corpus", nargs="+", help="text files (--stage general)")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--max-train-samples", type=int, metavar="N",
                   help="--stage task: use only the first N training records, as in finetune (rows; NER: "
                        "sentences, packed into fewer windows; QA: questions, a long context gives several "
                        "windows); --stage general: N sequences of --max-seq-len tokens spread evenly over the "
                        "corpus; the run prints how many items and optimizer steps that makes")
    p.add_argument("--temperature", type=float, help="soft-target temperature T (all logits losses)")
    p.add_argument("--alpha", type=float, help="kd, inbatch_kl: weight of the soft loss; 1−α goes to the hard labels")
    p.add_argument("--layer-map", help=f"{' | '.join(LAYER_MAPS)} | pairs like 1:2,2:4,3:6")
    p.add_argument("--augment", type=int, default=None, metavar="N",
                   help="TinyBERT augmentation: N augmented copies per training example (task stage)")
    p.add_argument("--augment-prob", type=float, help="per-word replacement probability (default 0.4)")
    p.add_argument("--augment-mlm", metavar="DIR",
                   help="masked LM whose top-K predictions replace single-piece words (TinyBERT §3.3): a "
                        "checkpoint with an MLM head and the teacher's tokenizer, e.g. the pretrained model "
                        "the teacher was fine-tuned from (default: nearest neighbours in the teacher's "
                        "embeddings for every word)")
    p.add_argument("--mlm-prob", type=float, help="general stage: MLM-corrupt inputs with this probability")
    p.add_argument("--no-cache", action="store_true", help="run the teacher every step (no disk cache)")
    p.add_argument("--cache-dir", help="where teacher outputs are cached (default: <out>/teacher_cache)")
    add_train_args(p)
    add_recipe_args(p)


def run(args) -> int:
    """``bertforge distill``: the flags → :func:`bertforge.pipelines.distill.distill_with` → one JSON line
    (the run folder, stage, method, student, parameter counts and the Trainer's result)."""
    from ...pipelines.distill import DistillOptions, distill_with
    opts = DistillOptions(**{f: getattr(args, f) for f in DistillOptions.__dataclass_fields__ if hasattr(args, f)})
    result = distill_with(opts)
    print_json({"out": str(result.out), **result.metrics})
    return 0
