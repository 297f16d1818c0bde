"""Evaluate models as sentence encoders on the embedded data: Lee similarity ρ, Pang–Lee accuracy, latency.

Each ``--model`` (a checkpoint dir run by PyTorch, an ``.onnx`` file run by ONNX Runtime, or ``minilm``;
``NAME=PATH`` sets the row name) is scored on: Spearman ρ between cosine similarities of mean-pooled
embeddings and the human ratings of gensim's Lee 50-document corpus; 5-fold CV logistic-regression
accuracy on the 200 Pang–Lee polarity sentences; latency (ms, p50/p90) at --seq-len × --batch-size,
measured in interleaved rounds across all models; parameters; file size (MB = 10^6 bytes).
With --heldout FILE (documents no model was trained on: one sentence a line, a blank line between documents)
also: teacher agreement — Spearman ρ of pairwise passage cosines and overlap@10 of nearest neighbours against
the --reference model (default the first) — and NDCG@10 / MRR@10 / Recall@1 of a retrieval set built from
those documents (each 3-sentence passage's middle sentence finds the other two).
Prints one JSON object {"models": [...]}; --out also writes it to a file.

Example:
  bertforge embed-eval --model teacher=minilm --model runs/demo/student-a --model runs/demo/onnx/model.onnx
"""
from __future__ import annotations

from ._common import print_json


def add_arguments(p) -> None:
    p.add_argument("--model", action="append", required=True, metavar="[NAME=]PATH",
                   help="checkpoint dir, .onnx file or 'minilm'; repeat for several models")
    p.add_argument("--tokenizer", help="tokenizer dir for .onnx files whose folder has none")
    p.add_argument("--seq-len", type=int, default=128, help="latency sequence length (default 128)")
    p.add_argument("--batch-size", type=int, default=1, help="latency batch size (default 1)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved latency rounds (default 5)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per model per round (default 10)")
    p.add_argument("--threads", type=int, help="intra-op threads for PyTorch and ONNX Runtime")
    p.add_argument("--lee-max-seq-len", type=int, default=256,
                   help="truncation of the Lee documents in tokens (default 256: none is longer)")
    p.add_argument("--task", help="also score each model's task head on --data with this task's metrics")
    p.add_argument("--data", help="labelled file for --task (TSV/CSV/JSONL)")
    p.add_argument("--max-seq-len", type=int, default=128, help="truncation for --data (default 128)")
    p.add_argument("--max-eval-samples", type=int, help="score only the first N examples of --data")
    p.add_argument("--heldout", help="held-out documents (text; blank line between documents) for teacher "
                                     "agreement and a retrieval set built from them")
    p.add_argument("--reference", help="model NAME the agreement is measured against (default: the first)")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    from ...pipelines.embed_eval import EmbedEvalOptions, embed_eval_with
    opts = EmbedEvalOptions(**{f: getattr(args, f) for f in EmbedEvalOptions.__dataclass_fields__})
    print_json(embed_eval_with(args.model, opts).record)
    return 0
