"""Translation with the original Transformer: `translate train` and `translate decode`.

`translate train` learns a joint subword vocabulary on source + target, batches sentence pairs by token
count and trains the encoder-decoder (Vaswani et al. 2017) with label-smoothed cross-entropy and the
warmup / inverse-square-root schedule on the one Trainer; the run dir is the checkpoint (config.json with
model_type "bertforge-transformer", model.safetensors, tokenizer.json) plus recipe.yaml and metrics.jsonl
(val_loss and greedy val BLEU at every evaluation). `translate decode` translates a file with greedy
(--beam 1) or beam search and, given --reference, prints sacreBLEU on the detokenized output.

Examples:
  bertforge translate train --src train.en --tgt train.de --valid-src val.en --valid-tgt val.de \
      --out runs/mt-small train.max_minutes=55
  bertforge translate decode --model runs/mt-small --input test.en --beam 4 --reference test.de
"""
from __future__ import annotations

import json
import sys

from ...errors import ConfigError
from ._common import add_train_args, print_json

def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="translate_cmd", metavar="{train,decode}", parser_class=type(p))
    t = sub.add_parser("train", help="train a translation Transformer on parallel text files",
                       description=(__doc__ or "").strip())
    t.add_argument("--src", help="training source sentences, one per line (default: --recipe's translate.src)")
    t.add_argument("--tgt", help="training target sentences, aligned with --src (default: --recipe's translate.tgt)")
    t.add_argument("--valid-src", help="validation source sentences (default: --recipe's translate.valid_src)")
    t.add_argument("--valid-tgt", help="validation target sentences (default: --recipe's translate.valid_tgt)")
    t.add_argument("--out", required=True, help="run directory (becomes the checkpoint)")
    t.add_argument("--max-minutes", type=float, help="wall-clock training budget (train.max_minutes)")
    t.add_argument("--max-tokens", type=int, help="tokens per batch (translate.max_tokens)")
    add_train_args(t)
    t.add_argument("--recipe", help="YAML recipe (model/train/impl/translate sections); defaults: "
                                    "recipes/translate/small.yaml")
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="recipe overrides, e.g. model.d_model=512 translate.vocab_size=10000")
    t.set_defaults(_translate_run=run_train)
    d = sub.add_parser("decode", help="translate a file with a trained model (greedy or beam search)")
    d.add_argument("--model", required=True, help="checkpoint dir written by `translate train`")
    d.add_argument("--input", required=True, help="source sentences, one per line")
    d.add_argument("--output", help="write translations here (default: stdout); never inside a run or model "
                                    "dir, and an existing file only with --overwrite")
    d.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    d.add_argument("--beam", type=int, help="beam size; 1 = greedy (default: the run's translate.beam, "
                                            "else 4 as Vaswani et al. §6.1)")
    d.add_argument("--length-penalty", type=float, help="GNMT α (default: the run's translate.length_penalty, "
                                                        "else 0.6)")
    d.add_argument("--max-len-a", type=float, help="max output length = a·|src| + b (default: the run's "
                                                   "translate.max_len_a / max_len_b, else 1.5 and 10)")
    d.add_argument("--max-len-b", type=int)
    d.add_argument("--batch-tokens", type=int, default=4000, help="source tokens × beam per batch")
    d.add_argument("--reference", help="reference translations: print sacreBLEU (detokenized, cased)")
    d.add_argument("--bf16", action="store_true", help="bf16 autocast")
    d.add_argument("--threads", type=int, help="torch threads")
    d.set_defaults(_translate_run=run_decode)


def run(args) -> int:
    if not getattr(args, "translate_cmd", None):
        raise ConfigError("choose a subcommand: `bertforge translate train …` or `bertforge translate decode …`")
    return args._translate_run(args)


def run_train(args) -> int:
    from ...pipelines.translate import TranslateTrainOptions, translate_train_with
    result = translate_train_with(TranslateTrainOptions(**{f: getattr(args, f)
                                                           for f in TranslateTrainOptions.__dataclass_fields__}))
    print_json({**result.metrics, "out": str(result.out)})
    return 0


def run_decode(args) -> int:
    from ...pipelines.translate import TranslateOptions, translate_with
    res = translate_with(args.model, args.input, TranslateOptions(**{f: getattr(args, f)
                                                                      for f in TranslateOptions.__dataclass_fields__}))
    if not args.output:
        sys.stdout.write("\n".join(res.hypotheses) + "\n")
    if args.reference or args.output:
        (sys.stderr if not args.output else sys.stdout).write(json.dumps(res.record) + "\n")
    return 0
