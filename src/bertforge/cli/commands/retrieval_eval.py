"""Evaluate an embedding model on a BEIR retrieval set: NDCG@10, MRR@10, Recall@1/10/100.

--data is a BEIR dir (corpus.jsonl, queries.jsonl, qrels/<split>.tsv; `bertforge beir-from-squad` builds one
from SQuAD). Every document (title + " " + text, cut at --max-seq-len tokens) and every judged query of
--split is embedded with the model's own pooling (its 1_Pooling/config.json; mean otherwise), optionally cut
to --dim coordinates (Matryoshka), then ranked by cosine: exact search (numpy, chunked) or a faiss index
(--index flat | hnsw | ivf). Metrics as BEIR / pytrec_eval define them (docs/search.md); as in BEIR, a
retrieved document whose id is the query's own id is left out of its ranking (--keep-identical-ids counts it),
and stderr says how many queries retrieved their own id. Prints one JSON object; --out also writes it to a file.

Example:
  bertforge beir-from-squad --data ../shared/data/squad/dev-v1.1.json --out-dir /tmp/squad-beir
  bertforge retrieval-eval --model minilm --data /tmp/squad-beir --split test
"""
from __future__ import annotations

import sys

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
    p.add_argument("--keep-identical-ids", dest="ignore_identical_ids", action="store_false",
                   help="count a retrieved document whose id is the query's own id (default: left out of the "
                        "ranking, as BEIR's ignore_identical_ids=True; ArguAna and Quora need it)")


def run(args) -> int:
    from ...pipelines.retrieval_eval import retrieval_eval
    result = retrieval_eval(args.model, args.data, split=args.split, index=args.index, dim=args.dim,
                            batch_size=args.batch_size, max_seq_len=args.max_seq_len, top_k=args.top_k,
                            threads=args.threads, tokenizer=args.tokenizer, out=args.out,
                            overwrite=args.overwrite, ignore_identical_ids=args.ignore_identical_ids)
    sys.stderr.write("  ".join(f"{k.upper().replace('RECALL', 'Recall').replace('NDCG', 'NDCG')} {result[k]:.4f}"
                               for k in ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100")) + "\n")
    n = result.get("identical_ids", 0)
    if n:
        sys.stderr.write(f"bertforge retrieval-eval: {n} of {result['queries']} queries retrieved a document with "
                         f"their own id; " + ("left out of their rankings, as BEIR does (--keep-identical-ids "
                                              "counts them)" if result["ignore_identical_ids"] else
                                              "counted as retrieved (--keep-identical-ids)") + "\n")
    print_json(result)
    return 0
