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

import json
from pathlib import Path

from ...errors import ConfigError, require_at_least
from ...io import atomic_write_text
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


def parse_model_arg(spec: str) -> tuple:
    """``NAME=PATH`` → (NAME, PATH); ``PATH`` → (None, PATH)."""
    if "=" in spec:
        name, path = spec.split("=", 1)
        if not name or not path:
            raise ConfigError(f"--model {spec!r}: write NAME=PATH or just PATH")
        return name, path
    return None, spec


def run(args) -> int:
    import torch

    from ...runtime.embedder import evaluate_embedders, load_embedder
    from ...runtime.bench import check_threads
    from ._common import check_out_file, resolve_model_dir
    check_threads(args.threads)
    for k in ("seq_len", "batch_size", "rounds", "iters", "lee_max_seq_len", "max_seq_len", "max_eval_samples"):
        require_at_least(f"--{k.replace('_', '-')}", getattr(args, k), 1)
    if args.threads:
        torch.set_num_threads(args.threads)
    if bool(args.task) != bool(args.data):
        raise ConfigError("--task and --data go together; pass both or neither")
    specs = [parse_model_arg(spec) for spec in args.model]
    if args.out:  # before any model is loaded: never into a model, run or checkpoint dir, nor over a file
        paths = [resolve_model_dir(str(path)) for _, path in specs]
        check_out_file(Path(args.out), [p if p.is_dir() else p.parent for p in paths], (args.data,),
                       args.overwrite, example="results.json")
    embedders, seen = [], set()
    for name, path in specs:
        e = load_embedder(path, name, args.tokenizer)
        if e.name in seen:
            raise ConfigError(f"two models are named {e.name!r}; give them names with NAME=PATH")
        seen.add(e.name)
        if e.max_positions is not None and args.seq_len > e.max_positions:
            raise ConfigError(f"--seq-len {args.seq_len} exceeds the {e.max_positions} positions of model "
                              f"{e.name!r}; pass --seq-len {e.max_positions} or less")
        embedders.append(e)
    if args.reference and args.reference not in seen:
        raise ConfigError(f"--reference {args.reference!r} is none of the models ({', '.join(seen)}); pass one "
                          f"of their names")
    if args.heldout and not Path(args.heldout).is_file():
        raise ConfigError(f"--heldout {args.heldout} does not exist; pass a text file of documents")
    rows = evaluate_embedders(embedders, args.seq_len, args.batch_size, args.rounds, args.iters,
                              args.lee_max_seq_len, progress=not args.no_progress, task=args.task,
                              task_data=args.data, task_max_seq_len=args.max_seq_len,
                              task_max_samples=args.max_eval_samples, heldout=args.heldout,
                              reference=args.reference)
    result = {"models": rows, "threads": torch.get_num_threads()}
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))
    print_json(result)
    return 0
