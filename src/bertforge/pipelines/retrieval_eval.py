"""Retrieval quality of an embedding model from Python: :func:`retrieval_eval` (what ``bertforge retrieval-eval``
calls) — NDCG@10, MRR@10, Recall@1/10/100 on a BEIR set, as BEIR / pytrec_eval define them (docs/search.md).

    >>> import bertforge
    >>> m = bertforge.retrieval_eval("minilm", "/tmp/squad-beir", split="test")
    >>> m["ndcg@10"]
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, require_at_least
from ..io import atomic_write_text
from ..metrics.retrieval import INDEX_KINDS
from .options import check_option

INDEXES = ("exact",) + INDEX_KINDS


def retrieval_eval(model, data, *, split: str = "test", index: str = "exact", dim: Optional[int] = None,
                   batch_size: int = 32, max_seq_len: Optional[int] = None, top_k: int = 100,
                   threads: Optional[int] = None, tokenizer=None, out=None, overwrite: bool = False,
                   ignore_identical_ids: bool = True) -> dict:
    """Embed every document (title + " " + text) and every judged query of ``split`` of the BEIR dir ``data``
    (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) with ``model`` (pooled as its dir declares, cut to ``dim``
    coordinates, texts cut at ``max_seq_len`` tokens — None: where the dir declares), rank by cosine
    (``index``: ``exact`` numpy search or a faiss ``flat`` / ``hnsw`` / ``ivf`` index) and score. A retrieved
    document whose id is the query's own id is left out of that query's ranking, as BEIR's evaluation does by
    default (ArguAna, Quora: the queries are corpus documents too); ``ignore_identical_ids=False``
    (``--keep-identical-ids``) counts it as retrieved. Returns the metrics of
    :func:`bertforge.runtime.embedder.evaluate_retrieval` — ``identical_ids``: the judged queries that retrieved
    their own id, ``ignore_identical_ids`` — with ``model``, ``data``, ``split`` and ``threads``; ``out``: also
    write them there as JSON.

    Raises:
        ConfigError: bad sizes or index, an ``out`` that exists (without ``overwrite``) or lies in a model or
            the data; DataError / CheckpointError: unreadable data or model."""
    fn = "retrieval_eval"
    batch_size, top_k = check_option(fn, "batch_size", batch_size, int), check_option(fn, "top_k", top_k, int)
    dim, threads = check_option(fn, "dim", dim, Optional[int]), check_option(fn, "threads", threads, Optional[int])
    max_seq_len = check_option(fn, "max_seq_len", max_seq_len, Optional[int])
    overwrite = check_option(fn, "overwrite", overwrite, bool)
    ignore_identical_ids = check_option(fn, "ignore_identical_ids", ignore_identical_ids, bool)
    for flag, value in (("--batch-size", batch_size), ("--top-k", top_k), ("--dim", dim),
                        ("--max-seq-len", max_seq_len)):
        require_at_least(flag, value, 1)
    if index not in INDEXES:
        raise ConfigError(f"--index {index!r}: choose one of {', '.join(INDEXES)}")
    if data is None or not isinstance(data, (str, os.PathLike)):
        raise ConfigError(f"retrieval_eval(): data={data!r:.60} is a {type(data).__name__}; pass a BEIR dir")
    from ..checkpoint.modeldir import resolve
    from ..data.beir import read_beir
    from ..runtime.bench import check_threads
    from .outputs import check_out_file
    check_threads(threads)
    model_path = resolve(model)
    if out is not None:  # before anything is computed: never into a model dir, nor over a file, nor the data
        models = [model_path if model_path.is_dir() else model_path.parent] if model_path.exists() else []
        data_dir = Path(data)
        inputs = [f for f in data_dir.rglob("*") if f.is_file()] if data_dir.is_dir() else [data_dir]
        check_out_file(Path(out), models, inputs, overwrite, example="retrieval.json")
    beir = read_beir(data, split)
    import torch

    from ..runtime.embedder import evaluate_retrieval, load_embedder
    if threads:
        torch.set_num_threads(threads)
    emb = load_embedder(model, None, tokenizer, threads=threads, dim=dim)
    result = evaluate_retrieval(emb, beir, index=index, batch_size=batch_size, max_seq_len=max_seq_len,
                                top_k=top_k, ignore_identical_ids=ignore_identical_ids)
    result.update(model=str(model), data=str(data), split=split, threads=torch.get_num_threads())
    if out is not None:
        atomic_write_text(Path(out), json.dumps(result, indent=2))
    return result


__all__ = ["retrieval_eval"]
