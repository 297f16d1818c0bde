"""Evaluate an embedding model on a BEIR retrieval set: NDCG@10, MRR@10, Recall@1/10/100.

--data is a BEIR dir (corpus.jsonl, queries.jsonl, qrels/<split>.tsv; `bertforge beir-from-squad` builds one
from SQuAD). Every document (title + " " + text, cut at --max-seq-len tokens) and every judged query of
--split is embedded with the model's own pooling (its 1_Pooling/config.json; mean otherwise), optionally cut
to --dim coordinates (Matryoshka), then ranked by cosine: exact search (numpy, chunked) or a faiss index
(--index flat | hnsw | ivf). Metrics as BEIR / pytrec_eval define them (docs/search.md). Prints one JSON
object; --out also writes it to a file.

Example:
  bertforge beir-from-squad --data ../shared/data/squad/dev-v1.1.json --out-dir /tmp/squad-beir
  bertforge retrieval-eval --model minilm --data /tmp/squad-beir --split test
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ...errors import require_at_least
from ...io import atomic_write_text
from ..names import INDEX_KINDS
from ._common import print_json


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, metavar="PATH",
                   help="embedding model: checkpoint dir, export dir / .onnx file, or 'minilm'")
    p.add_argument("--data", required=True, help="BEIR dir: corpus.jsonl, queries.jsonl, qrels/<split>.tsv")
    p.add_argument("--split", default="test", help="qrels split to evaluate (default test)")
    p.add_argument("--index", default="exact", choices=("exact",) + INDEX_KINDS,
                   help="exact numpy search (default) or a faiss index: flat (exact), hnsw, ivf (approximate)")
    p.add_argument("--dim", type=int, help="keep the first D coordinates of each vector (Matryoshka models)")
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    p.add_argument("--max-seq-len", type=int,
                   help="truncation of documents and queries in tokens (default: the max_seq_length the model "
                        "dir declares, else its positions — where /embed and `embed` cut too)")
    p.add_argument("--top-k", type=int, default=100,
                   help="documents retrieved per query (default 100; never fewer than the largest cut-off, 100)")
    p.add_argument("--threads", type=int, help="intra-op threads for PyTorch and ONNX Runtime")
    p.add_argument("--tokenizer", help="tokenizer dir for an .onnx file whose folder has none")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")


def run(args) -> int:
    from ...data.beir import read_beir
    from ...runtime.bench import check_threads
    from ._common import check_out_file, resolve
    check_threads(args.threads)
    for k in ("batch_size", "max_seq_len", "top_k", "dim"):
        require_at_least(f"--{k.replace('_', '-')}", getattr(args, k), 1)
    model_path = resolve(str(args.model))
    if args.out:  # before anything is computed: never into a model dir, nor over a file, nor over the data
        models = [model_path if model_path.is_dir() else model_path.parent] if model_path.exists() else []
        data_dir = Path(args.data)
        inputs = [f for f in data_dir.rglob("*") if f.is_file()] if data_dir.is_dir() else [data_dir]
        check_out_file(Path(args.out), models, inputs, args.overwrite, example="retrieval.json")
    data = read_beir(args.data, args.split)
    import torch

    from ...runtime.embedder import evaluate_retrieval, load_embedder
    if args.threads:
        torch.set_num_threads(args.threads)
    emb = load_embedder(args.model, None, args.tokenizer, threads=args.threads, dim=args.dim)
    result = evaluate_retrieval(emb, data, index=args.index, batch_size=args.batch_size,
                                max_seq_len=args.max_seq_len, top_k=args.top_k)
    result.update(model=str(args.model), data=str(args.data), split=args.split, threads=torch.get_num_threads())
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(result, indent=2))
    sys.stderr.write("  ".join(f"{k.upper().replace('RECALL', 'Recall').replace('NDCG', 'NDCG')} {result[k]:.4f}"
                               for k in ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100")) + "\n")
    print_json(result)
    return 0

