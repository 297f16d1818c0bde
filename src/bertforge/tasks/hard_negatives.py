"""Hard negatives mined with the model being trained, and what must never be mined as one.

A passage mined as a query's negative that is in fact relevant to it trains the model against the truth. Two
guards (issue 39; sentence-transformers PR #2848 and its ``mine_hard_negatives`` margins): every positive of the
same query text is excluded (not only the row's own), and a passage scoring within a margin of the query's
positive — a near-duplicate of it, or an unlabelled positive — is skipped.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

import numpy as np

from ..errors import ConfigError

#: the default ``retrieval.hard_negatives_margin``: a mined negative scores at least this much (cosine) below the
#: query's positive (sentence-transformers' ``absolute_margin``; its docs use 0.1 and below in examples)
HARD_NEGATIVES_MARGIN = 0.05


def mine_hard_negatives(query_emb: np.ndarray, doc_emb: np.ndarray, positives: Sequence, n: int = 1,
                        skip: int = 0, sim: str = "cos", margin: Optional[float] = None,
                        stats: Optional[dict] = None) -> list:
    """Hard negatives mined with the model itself (as DPR's "BM25 negatives" but ranked by the bi-encoder:
    Xiong et al. 2021 ANCE §3; sentence-transformers' ``mine_hard_negatives``): for query i, the ``n``
    best-scored documents that are none of its positives, after skipping the ``skip`` best of those (a margin
    in ranks against unlabelled positives).

    ``positives[i]``: the index of query i's positive, or a collection of them — every positive of the same
    query text (another row's positive of that query is no negative: sentence-transformers PR #2848).
    ``margin`` (absolute, in the units of ``sim``; None: off): a document scoring above
    ``min(score of the query's positives) − margin`` is skipped as a likely near-duplicate of a positive, as
    sentence-transformers' ``absolute_margin`` (a negative must score at least ``margin`` below the positive;
    with several positives the least similar one sets the bar, the cautious choice). A query for which fewer
    than ``n + skip`` documents pass takes its ``n`` lowest-scored non-positive documents instead (counted in
    ``stats["fallback"]``; ``stats["margin_skipped"]``: documents skipped by the margin among those ranked
    above the chosen ones). ``query_emb`` (Q, H), ``doc_emb`` (D, H); returns Q lists of ``n`` document
    indices. Raises ConfigError when the corpus has fewer than ``n + skip + 1`` documents."""
    d = doc_emb.shape[0]
    if d < n + skip + 1:
        raise ConfigError(f"hard negatives: the corpus has {d} distinct passages; it needs more than "
                          f"{n + skip} to mine {n} per query")
    q, x = query_emb.astype(np.float32), doc_emb.astype(np.float32)
    if sim == "cos":
        q = q / np.clip(np.linalg.norm(q, axis=1, keepdims=True), 1e-12, None)
        x = x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)
    stats = stats if stats is not None else {}
    stats.setdefault("fallback", 0)
    stats.setdefault("margin_skipped", 0)
    out, m = [], n + skip
    for s in range(0, q.shape[0], 1024):
        scores = q[s:s + 1024] @ x.T
        for r in range(scores.shape[0]):
            own = positives[s + r]
            own = [int(own)] if np.isscalar(own) else [int(j) for j in own]
            row = scores[r].astype(np.float64)
            keep = row.copy()
            keep[own] = -np.inf
            if margin is not None:
                near = keep > row[own].min() - margin
                stats["margin_skipped"] += int(near.sum())
                keep[near] = -np.inf
            if int(np.isfinite(keep).sum()) >= m:
                top = np.argpartition(-keep, m - 1)[:m]
                ranked = top[np.lexsort((top, -keep[top]))]  # by score, then index (deterministic ties)
                out.append([int(j) for j in ranked[skip:skip + n]])
                continue
            stats["fallback"] += 1
            rest = row.copy()
            rest[own] = np.inf
            out.append([int(j) for j in np.argsort(rest, kind="stable")[:n]])
    return out


def positives_by_query(examples, index: dict) -> dict:
    """Query text → the set of document indices (``index``: passage text → index) of every positive that
    ``examples`` (rows with ``query`` and ``positive``) give that query."""
    out: dict = {}
    for e in examples:
        out.setdefault(e.query, set()).add(index[e.positive])
    return out


def mining_note(n: int, n_docs: int, examples, of_query: dict, margin, stats: dict, verb: str = "finetune") -> None:
    """The one stderr line saying what mining excluded (rows whose query has other positives, candidates within
    the margin, queries that fell back to their lowest-scored passages)."""
    shared = sum(len(of_query[e.query]) > 1 for e in examples)
    print(f"bertforge {verb}: mined {n} hard negative(s) per query over {n_docs} passages; {shared} rows' queries "
          f"have other positives (all excluded), {stats.get('margin_skipped', 0)} candidates within "
          f"hard_negatives_margin={margin} of the positive skipped, {stats.get('fallback', 0)} queries took their "
          f"lowest-scored passages", file=sys.stderr, flush=True)


__all__ = ["mine_hard_negatives", "positives_by_query", "mining_note", "HARD_NEGATIVES_MARGIN"]
