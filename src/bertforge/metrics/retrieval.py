"""Retrieval metrics, exact nearest-neighbour search and faiss indexes (core layer: numpy; faiss on demand).

Metrics, as BEIR reports them (Thakur et al. 2021, §4; computed there by ``pytrec_eval``, i.e. trec_eval's
definitions), for one query with judged grades ``rel(d)`` (> 0: relevant) and a ranked list d_1, d_2, …:

* ``ndcg@k``   = DCG@k / IDCG@k, DCG@k = Σ_{i ≤ k} rel(d_i) / log2(i + 1) (linear gain, Järvelin & Kekäläinen
  2002, as trec_eval's ``ndcg_cut``); IDCG@k is DCG@k of the grades sorted descending; 0 when no grade > 0;
* ``mrr@k``    = 1 / rank of the first relevant d_i with i ≤ k, 0 when none (Voorhees 1999; BEIR's MRR@k);
* ``recall@k`` = |{relevant d_i : i ≤ k}| / |{d : rel(d) > 0}| (trec_eval ``recall_k``); 0 when none relevant.

Each is averaged over the queries of the qrels (a query absent from the run scores 0). Ties in score are
broken by the order the documents were given in (a stable sort) — trec_eval breaks them by document id, so a
run with tied scores may differ from it in the tied places only.

A retrieved document whose id is the query's own id is left out of that query's ranking before scoring, as BEIR's
``EvaluateRetrieval.evaluate`` does by default (``ignore_identical_ids=True``: in ArguAna and Quora the queries
are documents of the corpus too, and finding a query itself is no hit); ``ignore_identical_ids=False`` keeps it
(it then counts as a retrieved document that is not relevant, unless the qrels judge it). Either way the result
says how many judged queries retrieved their own id (``identical_ids``).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

#: the figures ``retrieval-eval`` prints, in order
HEADLINE = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100")


def _ranked(scores: dict) -> list:
    """Document ids of ``{did: score}`` by score descending (stable: insertion order breaks ties)."""
    items = list(scores.items())
    order = sorted(range(len(items)), key=lambda i: -float(items[i][1]))
    return [items[i][0] for i in order]


def query_metrics(ranked: list, rels: dict, k_values=(1, 10, 100)) -> dict:
    """The metrics of one query: ``ranked`` document ids (best first), ``rels`` {did: grade}. Returns
    ``{"ndcg@k", "mrr@k", "recall@k"}`` for each k (definitions in the module docstring)."""
    pos = {d: g for d, g in rels.items() if g > 0}
    ideal = sorted(pos.values(), reverse=True)
    out = {}
    for k in k_values:
        top = ranked[:k]
        dcg = sum(pos.get(d, 0) / math.log2(i + 2) for i, d in enumerate(top))
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal[:k]))
        out[f"ndcg@{k}"] = dcg / idcg if idcg > 0 else 0.0
        first = next((i for i, d in enumerate(top) if d in pos), None)
        out[f"mrr@{k}"] = 1.0 / (first + 1) if first is not None else 0.0
        out[f"recall@{k}"] = sum(1 for d in top if d in pos) / len(pos) if pos else 0.0
    return out


def retrieval_metrics(run, qrels: dict, k_values=(1, 10, 100), per_query: bool = False,
                      ignore_identical_ids: bool = True) -> dict:
    """Mean NDCG@k, MRR@k and Recall@k over the queries of ``qrels``.

    Args:
        run: ``{qid: {did: score}}`` (higher is better; any number of documents per query), or
            ``{qid: [did, …]}`` already ranked best first.
        qrels: ``{qid: {did: grade}}`` (grade > 0: relevant; 0 or less: judged not relevant).
        k_values: cut-offs; ``(1, 10, 100)`` gives ndcg@10, mrr@10, recall@1, recall@10, recall@100 among others.
        per_query: also return ``"per_query": {qid: {...}}``.
        ignore_identical_ids: leave a document whose id equals the query's id out of its ranking (BEIR's default;
            the documents below it move up one place); False: keep it.
    Returns:
        ``{"ndcg@k": float, "mrr@k": float, "recall@k": float for each k, "queries": int, "identical_ids": int,
        "ignore_identical_ids": bool}`` (fractions in [0, 1]); ``identical_ids``: judged queries whose run held a
        document with their own id (left out when ``ignore_identical_ids``).
    Raises:
        ValueError: empty ``qrels`` or a cut-off < 1.
    """
    if not qrels:
        raise ValueError("no judged queries: qrels is empty")
    ks = sorted({int(k) for k in k_values})
    if ks[0] < 1:
        raise ValueError(f"cut-offs must be ≥ 1, got {k_values}")
    sums: dict = {}
    each = {}
    identical = 0
    for qid, rels in qrels.items():
        r = run.get(qid, {})
        ranked = _ranked(r) if isinstance(r, dict) else list(r)
        if qid in ranked:
            identical += 1
            if ignore_identical_ids:
                ranked = [d for d in ranked if d != qid]
        m = query_metrics(ranked, rels, ks)
        each[qid] = m
        for key, v in m.items():
            sums[key] = sums.get(key, 0.0) + v
    n = len(qrels)
    out = {key: v / n for key, v in sums.items()}
    out["queries"] = n
    out["identical_ids"], out["ignore_identical_ids"] = identical, bool(ignore_identical_ids)
    if per_query:
        out["per_query"] = each
    return out


def run_from_topk(query_ids: list, doc_ids: list, scores: np.ndarray, indices: np.ndarray) -> dict:
    """(Q, k) ``scores`` and document ``indices`` (from :func:`exact_search` / :func:`search_index`; index -1
    = no hit, as faiss gives) → ``{qid: {did: score}}`` in rank order."""
    out = {}
    for qi, qid in enumerate(query_ids):
        out[qid] = {doc_ids[j]: float(s) for j, s in zip(indices[qi], scores[qi]) if j >= 0}
    return out


# ------------------------------------------------------------------------------- teacher agreement
def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x`` with ties given their average rank (as scipy.stats.rankdata)."""
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inv]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ of two equal-length 1-D arrays: Pearson correlation of their (tie-averaged) ranks."""
    ra, rb = _ranks(np.ravel(a)), _ranks(np.ravel(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def agreement(reference: np.ndarray, vectors: np.ndarray, k: int = 10) -> dict:
    """How closely ``vectors`` (N, d') reproduce the similarity structure of ``reference`` (N, d) — e.g. a
    student's embeddings of N held-out texts against its teacher's; widths may differ.

    Returns:
        ``pair_spearman``: Spearman ρ between the two models' cosine similarities over all N(N−1)/2 pairs
        i < j (1 = the same order of every pair); ``overlap@k``: mean over texts of |kNN_ref(i) ∩ kNN(i)| / k,
        the k nearest other texts by cosine (1 = the same neighbours; the k used, ``k``, is capped at N − 1);
        ``texts``: N.
    Raises:
        ValueError: different N, or N < 3.
    """
    a, b = normalize_rows(reference), normalize_rows(vectors)
    n = len(a)
    if len(b) != n or n < 3:
        raise ValueError(f"agreement needs the same N ≥ 3 texts in both, got {len(a)} and {len(b)}")
    ca, cb = a @ a.T, b @ b.T
    iu = np.triu_indices(n, 1)
    want, k = k, min(k, n - 1)
    np.fill_diagonal(ca, -np.inf)
    np.fill_diagonal(cb, -np.inf)
    na = np.argsort(-ca, axis=1, kind="stable")[:, :k]
    nb = np.argsort(-cb, axis=1, kind="stable")[:, :k]
    overlap = np.mean([len(set(x) & set(y)) / k for x, y in zip(na.tolist(), nb.tolist())])
    return {"pair_spearman": spearman(ca[iu], cb[iu]), f"overlap@{want}": float(overlap), "k": k, "texts": n}


# ------------------------------------------------------------------------------------------ search
def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` (N, d) divided by their L2 norms (a zero row stays zero), float32."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


def _check_pair(q: np.ndarray, d) -> None:
    if q.ndim != 2 or d.ndim != 2 or q.shape[1] != d.shape[1]:
        raise ValueError(f"query vectors {q.shape} and document vectors {d.shape} must be (Q, d) and (N, d)")


def exact_search(query_vecs: np.ndarray, doc_vecs: np.ndarray, top_k: int = 100, score: str = "cos",
                 query_chunk: int = 1024, doc_chunk: int = 65536) -> tuple:
    """Exact top-k documents of each query by cosine (``score="cos"``) or dot product (``"dot"``).

    Memory: one (query_chunk, doc_chunk) float32 block of scores at a time, plus the running (query_chunk, k)
    best; the document matrix is read chunk by chunk (a ``np.memmap`` works).

    Args:
        query_vecs: (Q, d); doc_vecs: (N, d); top_k: hits per query (capped at N).
    Returns:
        ``(scores (Q, k) float32, indices (Q, k) int64)``, best first; ties keep the lower document index first.
    Raises:
        ValueError: mismatched shapes, an unknown ``score``, top_k < 1.
    """
    if score not in ("cos", "dot"):
        raise ValueError(f"unknown score {score!r}; choose cos or dot")
    if top_k < 1:
        raise ValueError(f"top_k {top_k} must be ≥ 1")
    q = np.asarray(query_vecs, dtype=np.float32)
    _check_pair(q, doc_vecs)
    if score == "cos":
        q = normalize_rows(q)
    n = doc_vecs.shape[0]
    k = min(top_k, n)
    all_s = np.empty((len(q), k), dtype=np.float32)
    all_i = np.empty((len(q), k), dtype=np.int64)
    for qs in range(0, len(q), query_chunk):
        qb = q[qs:qs + query_chunk]
        best_s = np.full((len(qb), 0), -np.inf, dtype=np.float32)
        best_i = np.zeros((len(qb), 0), dtype=np.int64)
        for ds in range(0, n, doc_chunk):
            db = np.asarray(doc_vecs[ds:ds + doc_chunk], dtype=np.float32)
            if score == "cos":
                db = normalize_rows(db)
            s = qb @ db.T
            idx = np.broadcast_to(np.arange(ds, ds + len(db), dtype=np.int64), s.shape)
            cs, ci = np.concatenate([best_s, s], 1), np.concatenate([best_i, idx], 1)
            if cs.shape[1] > k:
                part = np.argpartition(-cs, k - 1, axis=1)[:, :k]
                cs, ci = np.take_along_axis(cs, part, 1), np.take_along_axis(ci, part, 1)
            best_s, best_i = cs, ci
        order = np.lexsort((best_i, -best_s), axis=1)  # score descending, then index ascending
        all_s[qs:qs + len(qb)] = np.take_along_axis(best_s, order, 1)
        all_i[qs:qs + len(qb)] = np.take_along_axis(best_i, order, 1)
    return all_s, all_i


INDEX_KINDS = ("flat", "hnsw", "ivf")


class VectorIndex:
    """A faiss index with what searching it needs: ``index`` (the faiss object), ``kind``, ``score``
    (``cos``: queries are normalised before the inner product), ``ntotal`` (vectors held)."""

    def __init__(self, index, kind: str, score: str, keep=()):
        self.index, self.kind, self.score, self._keep = index, kind, score, keep

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def search(self, query_vecs: np.ndarray, top_k: int = 100) -> tuple:
        """:func:`search_index` on this index."""
        return search_index(self, query_vecs, top_k)


#: faiss's k-means warns below this many training points per IVF cell (``min_points_per_centroid``)
IVF_MIN_POINTS_PER_CELL = 39


def ivf_nprobe(nlist: int) -> int:
    """The IVF cells a query visits by default: min(nlist, 16)."""
    return min(nlist, 16)


def ivf_nlist(n: int) -> int:
    """The IVF cells for an index of ``n`` vectors: min(4·√n, n/39), at least 1 — the usual 4·√n (faiss's
    guidelines: 4·√n … 16·√n), capped so that every cell gets :data:`IVF_MIN_POINTS_PER_CELL` training points
    when all ``n`` train it."""
    return max(1, min(int(4 * math.sqrt(n)), n // IVF_MIN_POINTS_PER_CELL))


def build_index(vectors: np.ndarray, kind: str = "flat", score: str = "cos", hnsw_m: int = 32,
                ef_search: int = 128, nlist: Optional[int] = None, nprobe: Optional[int] = None,
                train: Optional[np.ndarray] = None, faiss_warns: bool = True):
    """A :class:`VectorIndex` (faiss) over (N, d) ``vectors`` (Johnson, Douze & Jégou 2019, "Billion-scale similarity search
    with GPUs"). ``kind``: ``flat`` (exact inner product), ``hnsw`` (Malkov & Yashunin 2018; ``hnsw_m`` links
    per node, ``ef_search`` candidates at query time), ``ivf`` (inverted lists over ``nlist`` k-means cells,
    ``nprobe`` visited; defaults: nlist = :func:`ivf_nlist` (N), nprobe = min(nlist, 16); ``train``: the
    vectors k-means places the cells on, default ``vectors`` — an index that will hold more than ``vectors``
    (filled shard by shard) passes a sample of all it will hold, and its ``nlist``; ``faiss_warns=False``
    silences faiss's own stderr line about fewer than 39 training points per cell, for a caller that says it
    itself). ``score="cos"``
    normalises the vectors (queries are normalised by :func:`search_index`); all kinds rank by inner product.
    Raises:
        ValueError: unknown ``kind`` / ``score``, or no vectors.
        ImportError: faiss is not installed (``pip install faiss-cpu``).
    """
    import faiss
    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown index {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    if score not in ("cos", "dot"):
        raise ValueError(f"unknown score {score!r}; choose cos or dot")
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"vectors {x.shape} must be (N ≥ 1, d)")
    if score == "cos":
        x = normalize_rows(x)
    d = x.shape[1]
    ip = faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, ip)
        index.hnsw.efSearch = ef_search
    else:
        t = x if train is None else np.ascontiguousarray(train, dtype=np.float32)
        if t.ndim != 2 or len(t) == 0 or t.shape[1] != d:
            raise ValueError(f"training vectors {t.shape} must be (N ≥ 1, {d})")
        if train is not None and score == "cos":
            t = normalize_rows(t)
        nl = nlist or ivf_nlist(len(t))
        quant = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quant, d, nl, ip)
        if not faiss_warns:
            index.cp.min_points_per_centroid = 1
        index.train(t)
        index.nprobe = nprobe or ivf_nprobe(nl)
    index.add(x)
    return VectorIndex(index, kind, score, keep=(quant,) if kind == "ivf" else ())


def search_index(index, query_vecs: np.ndarray, top_k: int = 100, score: Optional[str] = None) -> tuple:
    """Search a :class:`VectorIndex` (or a bare faiss index): (Q, d) queries → ``(scores (Q, k) float32,
    indices (Q, k) int64)``, best first; index -1 marks a missing hit (an IVF probe that found fewer than k).
    ``score``: as the index was built (default: what :func:`build_index` recorded; ``cos`` for a bare index)."""
    score = score or getattr(index, "score", "cos")
    raw = index.index if isinstance(index, VectorIndex) else index
    q = np.ascontiguousarray(query_vecs, dtype=np.float32)
    if score == "cos":
        q = normalize_rows(q)
    k = min(top_k, int(raw.ntotal))
    s, i = raw.search(q, k)
    return s.astype(np.float32), i.astype(np.int64)


__all__ = ["HEADLINE", "INDEX_KINDS", "IVF_MIN_POINTS_PER_CELL", "VectorIndex", "agreement", "spearman", "ivf_nlist", "ivf_nprobe", "build_index", "exact_search", "normalize_rows", "query_metrics",
           "retrieval_metrics", "run_from_topk", "search_index"]
