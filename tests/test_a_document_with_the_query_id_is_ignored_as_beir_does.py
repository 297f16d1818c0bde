"""A retrieved document whose id is the query's own id is left out of that query's ranking, as BEIR's
``EvaluateRetrieval.evaluate(..., ignore_identical_ids=True)`` does by default (ArguAna and Quora hold their
queries in the corpus), and `retrieval-eval` says how many queries retrieved their own id; ``--keep-identical-ids``
/ ``ignore_identical_ids=False`` counts it as a retrieved, non-relevant document (issue #49 (5)).

Truth, by hand: two queries over six documents, one relevant document each. Query ``arg1`` is itself document
``arg1`` of the corpus and retrieves it first, its relevant document ``arg2`` second:

* BEIR's rule: ``arg1`` is dropped, ``arg2`` moves to rank 1 → NDCG@10 = 1 for both queries → 1.0;
  MRR@10 = 1.0; Recall@1 = 1.0.
* kept: ``arg2`` at rank 2 → NDCG@10 = (1/log2 3) / 1 = 0.63093 for ``arg1``, 1 for the other → 0.81546;
  MRR@10 = (1/2 + 1) / 2 = 0.75; Recall@1 = 0.5.
"""
import json
import math

import pytest

BEIR_NDCG = 1.0
KEPT_NDCG = (1 / math.log2(3) + 1.0) / 2  # 0.81546

DOCS = {
    "arg1": "Zoos should be banned because keeping wild animals in cages is cruel.",
    "arg2": "Zoos are cruel: wild animals suffer when they are kept in cages and should be free.",
    "bee": "Bees make honey from the nectar of flowers.",
    "rain": "Rain falls when water vapour in clouds condenses into drops.",
    "chess": "A chess game starts with sixteen pieces for each player.",
    "bread": "Bread is baked from flour, water, yeast and salt.",
}
QUERIES = {"arg1": DOCS["arg1"], "q-bee": "How do bees make honey?"}
QRELS = {"arg1": {"arg2": 1}, "q-bee": {"bee": 1}}


def test_the_metric_drops_the_query_itself_by_default_and_keeps_it_on_request():
    from bertforge.metrics.retrieval import retrieval_metrics
    run = {"arg1": {"arg1": 1.0, "arg2": 0.8, "bee": 0.1, "rain": 0.05},
           "q-bee": {"bee": 0.9, "bread": 0.2, "arg1": 0.1}}
    beir = retrieval_metrics(run, QRELS, k_values=(1, 10))
    assert beir["ndcg@10"] == pytest.approx(BEIR_NDCG) and beir["mrr@10"] == 1.0 and beir["recall@1"] == 1.0
    assert beir["identical_ids"] == 1 and beir["ignore_identical_ids"] is True
    kept = retrieval_metrics(run, QRELS, k_values=(1, 10), ignore_identical_ids=False)
    assert kept["ndcg@10"] == pytest.approx(KEPT_NDCG, abs=1e-5) and round(kept["ndcg@10"], 4) == 0.8155
    assert kept["mrr@10"] == pytest.approx(0.75) and kept["recall@1"] == pytest.approx(0.5)
    assert kept["identical_ids"] == 1 and kept["ignore_identical_ids"] is False
    # a ranked list ([did, …]) and a query that retrieves no document of its own id
    assert retrieval_metrics({"arg1": ["arg1", "arg2"]}, {"arg1": {"arg2": 1}})["ndcg@10"] == 1.0
    none = retrieval_metrics({"q-bee": ["bee"]}, {"q-bee": {"bee": 1}})
    assert none["identical_ids"] == 0 and none["ndcg@10"] == 1.0


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory):
    from bertforge.data.beir import write_beir
    d = tmp_path_factory.mktemp("identical-ids")
    return write_beir(d / "set", DOCS, QUERIES, {"test": QRELS})


def test_retrieval_eval_follows_beir_and_says_how_many_it_dropped(beir_dir, minilm_dir, capsys, tmp_path):
    from bertforge.cli import main
    assert main(["retrieval-eval", "--model", str(minilm_dir), "--data", str(beir_dir), "--out",
                 str(tmp_path / "r.json")]) == 0
    cap = capsys.readouterr()
    got = json.loads(cap.out)
    assert got["ndcg@10"] == pytest.approx(BEIR_NDCG) and got["recall@1"] == 1.0
    assert got["identical_ids"] == 1 and got["ignore_identical_ids"] is True
    assert "1 of 2 queries retrieved a document with their own id; left out" in cap.err
    assert json.loads((tmp_path / "r.json").read_text())["identical_ids"] == 1

    assert main(["retrieval-eval", "--model", str(minilm_dir), "--data", str(beir_dir), "--keep-identical-ids"]) == 0
    cap = capsys.readouterr()
    kept = json.loads(cap.out)
    assert kept["ndcg@10"] == pytest.approx(KEPT_NDCG, abs=1e-5) and kept["mrr@10"] == pytest.approx(0.75)
    assert kept["identical_ids"] == 1 and kept["ignore_identical_ids"] is False
    assert "counted as retrieved" in cap.err


def test_the_python_option_is_the_flag(beir_dir, minilm_dir):
    import bertforge
    from bertforge.errors import ConfigError
    m = bertforge.retrieval_eval(minilm_dir, beir_dir, ignore_identical_ids=False)
    assert m["ndcg@10"] == pytest.approx(KEPT_NDCG, abs=1e-5)
    assert bertforge.retrieval_eval(minilm_dir, beir_dir)["ndcg@10"] == pytest.approx(BEIR_NDCG)
    with pytest.raises(ConfigError, match="ignore_identical_ids"):
        bertforge.retrieval_eval(minilm_dir, beir_dir, ignore_identical_ids="no")
