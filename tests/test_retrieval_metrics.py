"""NDCG@k / MRR@k / Recall@k against hand-computed values, and exact / faiss search against brute force."""
import math

import numpy as np
import pytest

from bertforge.metrics.retrieval import (build_index, exact_search, query_metrics, retrieval_metrics,
                                          run_from_topk, search_index)

QRELS = {"q1": {"d1": 1, "d3": 2, "d5": 0}, "q2": {"d2": 1}, "q3": {"d9": 1}}
RUN = {"q1": {"d2": 0.9, "d3": 0.8, "d1": 0.7, "d4": 0.1, "d5": 0.05},
       "q2": {"d2": 0.5, "d1": 0.4},
       "q3": {"d1": 0.3, "d2": 0.2}}


def test_metrics_match_hand_computed_values():
    m = retrieval_metrics(RUN, QRELS, k_values=(1, 10, 100))
    # q1: ranked d2 (0), d3 (grade 2), d1 (grade 1) → DCG = 2/log2(3) + 1/log2(4); ideal 2/log2(2) + 1/log2(3)
    ndcg_q1 = (2 / math.log2(3) + 1 / 2) / (2 + 1 / math.log2(3))
    assert m["ndcg@10"] == pytest.approx((ndcg_q1 + 1.0 + 0.0) / 3)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert m["recall@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["recall@10"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["recall@100"] == m["recall@10"]
    assert m["ndcg@1"] == pytest.approx((0 + 1 + 0) / 3)
    assert m["queries"] == 3


def test_a_query_missing_from_the_run_scores_zero_and_cutoffs_cut():
    m = retrieval_metrics({"q2": ["d1", "d2"]}, {"q2": {"d2": 1}, "q3": {"d9": 1}}, k_values=(1, 2))
    assert m["mrr@1"] == 0.0 and m["mrr@2"] == pytest.approx(0.5 / 2)
    assert m["ndcg@2"] == pytest.approx((1 / math.log2(3)) / 2)
    q = query_metrics(["a", "b", "c"], {"c": 1, "z": 1}, (2, 3))
    assert q["recall@2"] == 0 and q["recall@3"] == 0.5


def test_exact_search_is_brute_force_at_any_chunking():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(23, 8)).astype(np.float32), rng.normal(size=(301, 8)).astype(np.float32)
    cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    ref = np.argsort(-cos, axis=1, kind="stable")[:, :10]
    for qc, dc in ((1024, 65536), (5, 17), (1, 300)):
        s, i = exact_search(q, d, 10, "cos", query_chunk=qc, doc_chunk=dc)
        assert (i == ref).all()
        assert np.allclose(s, np.take_along_axis(cos, ref, 1), atol=1e-5)
    s, i = exact_search(q, d, 5, "dot", doc_chunk=50)
    assert (i == np.argsort(-(q @ d.T), axis=1)[:, :5]).all()
    assert exact_search(q, d[:3], 10)[1].shape == (23, 3)  # k capped at N


def test_faiss_flat_is_exact_and_hnsw_ivf_find_clustered_neighbours():
    pytest.importorskip("faiss")
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(20, 16)) * 5
    d = (centres[rng.integers(0, 20, 2000)] + rng.normal(size=(2000, 16))).astype(np.float32)
    q = d[rng.choice(2000, 50, replace=False)] + 0.01 * rng.normal(size=(50, 16)).astype(np.float32)
    s, ref = exact_search(q, d, 10)
    fs, fi = build_index(d, "flat").search(q, 10)
    assert np.allclose(fs, s, atol=1e-5)  # the same scores (float noise may swap near-equal neighbours)
    assert (fi == ref).mean() >= 0.98
    for kind in ("hnsw", "ivf"):
        idx = build_index(d, kind)
        _, got = search_index(idx, q, 10)
        assert (got[:, 0] == ref[:, 0]).mean() >= 0.95, kind  # the query's own document is found
        assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, ref)]) >= 0.8, kind


def test_run_from_topk_skips_missing_hits():
    run = run_from_topk(["q"], ["a", "b"], np.array([[0.9, -1.0]]), np.array([[1, -1]]))
    assert run == {"q": {"b": pytest.approx(0.9)}}


def test_agreement_spearman_matches_scipy_and_overlap_counts_shared_neighbours():
    from scipy.stats import spearmanr

    from bertforge.metrics.retrieval import agreement, spearman
    rng = np.random.default_rng(3)
    a = rng.normal(size=(40, 8))
    b = a @ rng.normal(size=(8, 5)) + 0.5 * rng.normal(size=(40, 5))  # another width, related geometry
    x, y = rng.normal(size=300), np.round(rng.normal(size=300), 1)  # ties in y
    assert spearman(x, y) == pytest.approx(spearmanr(x, y)[0], abs=1e-12)
    same = agreement(a, 3.0 * a)  # a rescaled copy: the same cosines
    assert same["pair_spearman"] == pytest.approx(1.0) and same["overlap@10"] == 1.0
    got = agreement(a, b)
    na, nb = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (a, b))
    ca, cb = na @ na.T, nb @ nb.T
    iu = np.triu_indices(40, 1)
    assert got["pair_spearman"] == pytest.approx(spearmanr(ca[iu], cb[iu])[0], abs=1e-9)
    np.fill_diagonal(ca, -9)
    np.fill_diagonal(cb, -9)
    ref = np.mean([len(set(np.argsort(-ca[i])[:10]) & set(np.argsort(-cb[i])[:10])) / 10 for i in range(40)])
    assert got["overlap@10"] == pytest.approx(ref)
    assert 0.1 < got["overlap@10"] < 1.0
    assert agreement(a, rng.normal(size=(40, 8)))["pair_spearman"] < 0.2  # unrelated vectors: no agreement
