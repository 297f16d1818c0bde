"""Prune attention heads / FFN neurons by importance (Michel et al. 2019), or weights by magnitude.

Head importance |∂L/∂ξ_h| is estimated on --data: a task file (the model's own task loss when it has
labels) or plain text, one example per line (label-free Fisher loss: the model's own sampled predictions;
or --loss mlm for a masked-LM model). Heads are removed physically, in --steps rounds up to --fraction of
all heads, re-scoring after each round; the task metric on --eval (or, without labels, the KL / hidden-state
drift from the unpruned model) is tracked per round in prune_history.csv / .png.

Examples:
  bertforge prune --model runs/sst2 --data dev.tsv --eval dev.tsv --fraction 0.3 --steps 3 --out runs/sst2-p30
  bertforge prune --model runs/student --data corpus.txt --fraction 0.25 --ffn-fraction 0.2 --out runs/s-p25
  bertforge prune --model runs/sst2 --magnitude 0.5 --eval dev.tsv --out runs/sst2-m50

--magnitude zeroes the smallest encoder weights (attention and FFN; pooler and task head stay dense) and
cannot be combined with --fraction / --ffn-fraction.
"""
from __future__ import annotations

from ._common import print_json


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="checkpoint dir (HF layout) or 'minilm'")
    p.add_argument("--out", required=True, help="output dir for the pruned checkpoint")
    p.add_argument("--data", help="importance sample: task file (TSV/CSV/JSONL) or plain text (.txt, one "
                                  "example per line)")
    p.add_argument("--task", help="task of --data/--eval (default: the one the model was fine-tuned on)")
    p.add_argument("--eval", help="labelled file whose task metric is tracked after each step")
    p.add_argument("--fraction", type=float, default=0.0, help="fraction of all heads to remove (0–1)")
    p.add_argument("--ffn-fraction", type=float, default=0.0, help="fraction of all FFN units to remove")
    p.add_argument("--steps", type=int, help="pruning rounds, importance re-scored before each (default 1)")
    p.add_argument("--loss", choices=["auto", "task", "fisher", "mlm"],
                   help="importance loss: task labels, label-free fisher (sampled own predictions), mlm (default auto)")
    p.add_argument("--importance-norm", choices=["layer", "none"],
                   help="layer: L2-normalise scores within each layer before the global ranking (Michel et "
                        "al. 2019 §4.1; the default); none: rank raw |dL/dxi| across layers")
    p.add_argument("--min-heads-per-layer", type=int,
                   help="heads every layer keeps (0: a layer may lose every head; must be below the heads "
                        "per layer)")
    p.add_argument("--max-samples", type=int, help="examples used to score importance (default 512)")
    p.add_argument("--max-eval-samples", type=int)
    p.add_argument("--max-seq-len", type=int,
                   help="tokens per example, 2 … the model's positions (default: the model's fine-tuning "
                        "length, else 128, or the positions if fewer)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--magnitude", type=float, metavar="AMOUNT",
                   help="unstructured L1 magnitude pruning of this fraction (0–1) of the encoder's Linear "
                        "weights instead (pooler and task head stay dense); --eval reports the metric")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def run(args) -> int:
    from ...pipelines.prune import PruneOptions, prune_with
    opts = PruneOptions(**{f: getattr(args, f) for f in PruneOptions.__dataclass_fields__})
    print_json(prune_with(args.model, args.out, opts).record)
    return 0
