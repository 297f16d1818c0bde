"""The BEIR reader refuses bad sets with file:line, write/read round-trips, and the SQuAD → BEIR split keeps
every article on one side."""
import json

import pytest

from bertforge.data.beir import read_beir, squad_to_beir, write_beir
from bertforge.errors import DataError

CORPUS = {"d1": "the cat sat on the mat", "d2": "dogs bark at night", "d3": "a film about a cat"}
QUERIES = {"q1": "where did the cat sit", "q2": "what do dogs do", "q3": "unjudged"}


def small_set(d):
    return write_beir(d, CORPUS, QUERIES, {"test": {"q1": {"d1": 1, "d3": 0}, "q2": {"d2": 2}}},
                      titles={"d3": "Cats"})


def test_write_then_read_round_trips_and_keeps_only_judged_queries(tmp_path):
    data = read_beir(small_set(tmp_path / "s"), "test")
    assert data.corpus == {**CORPUS, "d3": "Cats a film about a cat"}  # title + " " + text
    assert data.queries == {"q1": QUERIES["q1"], "q2": QUERIES["q2"]}
    assert data.qrels == {"q1": {"d1": 1, "d3": 0}, "q2": {"d2": 2}}


def _lines(p, rows):
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")


@pytest.mark.parametrize("bad,match", [
    ("qrels_doc", r"qrels/test.tsv:3 names document 'd7', which corpus.jsonl does not hold"),
    ("qrels_query", r"qrels/test.tsv:2 names query 'q9'"),
    ("dup_doc", r"corpus.jsonl:3 repeats document id 'd1' \(first at line 1\)"),
    ("dup_query", r"queries.jsonl:2 repeats query id 'q1'"),
    ("empty_query", r"queries.jsonl:2 query 'q2' has an empty text"),
    ("bad_json", r"corpus.jsonl:2 is not valid JSON"),
    ("bad_score", r"qrels/test.tsv:3 score 'x' is not an integer"),
    ("fractional_score", r"qrels/test.tsv:3 score '1.5' is not an integer"),
    ("no_split", r"qrels/dev.tsv does not exist; pass --split test"),
    ("no_relevant", r"qrels/test.tsv marks no document relevant"),
])
def test_bad_sets_are_refused_with_file_and_line(tmp_path, bad, match):
    d = small_set(tmp_path / "s")
    split = "test"
    if bad == "qrels_doc":
        (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td7\t1\n")
    elif bad == "qrels_query":
        (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq9\td1\t1\n")
    elif bad == "dup_doc":
        _lines(d / "corpus.jsonl", [{"_id": "d1", "text": "a"}, {"_id": "d2", "text": "b"},
                                    {"_id": "d1", "text": "c"}])
    elif bad == "dup_query":
        _lines(d / "queries.jsonl", [{"_id": "q1", "text": "a"}, {"_id": "q1", "text": "b"}])
    elif bad == "empty_query":
        _lines(d / "queries.jsonl", [{"_id": "q1", "text": "a"}, {"_id": "q2", "text": "  "}])
    elif bad == "bad_json":
        _lines(d / "corpus.jsonl", [{"_id": "d1", "text": "a"}, '{"_id": "d2", "text": '])
    elif bad == "bad_score":
        (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\tx\n")
    elif bad == "fractional_score":
        (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1.5\n")
    elif bad == "no_relevant":  # every metric would be 0 whatever the model
        (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t0\nq2\td2\t0\n")
    else:
        split = "dev"
    with pytest.raises(DataError, match=match):
        read_beir(d, split)


def test_write_refuses_a_judgement_of_an_unknown_document_and_writes_nothing(tmp_path):
    with pytest.raises(DataError, match="document 'd7' is not in the corpus"):
        write_beir(tmp_path / "s", CORPUS, QUERIES, {"test": {"q1": {"d7": 1}}})
    assert not (tmp_path / "s").exists()


def _squad(n_articles=6, paras=3, qs=2):
    data = []
    for a in range(n_articles):
        data.append({"title": f"Art{a}", "paragraphs": [
            {"context": f"article {a} paragraph {p} text",
             "qas": [{"id": f"{a}-{p}-{q}", "question": f"question {q} on {a}/{p}?",
                      "answers": [{"text": "text", "answer_start": 0}]} for q in range(qs)]}
            for p in range(paras)]})
    return {"version": "1.1", "data": data}


def test_squad_to_beir_maps_questions_to_their_paragraph_with_article_disjoint_splits(tmp_path):
    src = tmp_path / "squad.json"
    src.write_text(json.dumps(_squad()))
    info = squad_to_beir(src, tmp_path / "b", eval_fraction=0.34, seed=3)
    test, train = read_beir(tmp_path / "b", "test"), read_beir(tmp_path / "b", "train")
    assert info["documents"] == 18 and info["queries"] == 36
    assert len(test.queries) + len(train.queries) == 36 and len(test.queries) >= 0.34 * 36
    for data in (test, train):
        for qid, rels in data.qrels.items():
            a, p, _ = qid.split("-")
            assert list(rels) == [f"a{a}-p{p}"] and rels[f"a{a}-p{p}"] == 1  # its own paragraph, only it
            assert data.corpus[f"a{a}-p{p}"] == f"article {a} paragraph {p} text"
    arts = lambda d: {q.split("-")[0] for q in d.qrels}  # noqa: E731
    assert arts(test) and arts(train) and not arts(test) & arts(train)
    pairs = [json.loads(x) for x in (tmp_path / "b" / "train.jsonl").read_text().splitlines()]
    assert {p["query_id"] for p in pairs} == set(train.queries)
    assert all(train.corpus[p["corpus_id"]] == p["positive"] for p in pairs)
    split = json.loads((tmp_path / "b" / "split.json").read_text())
    assert not set(split["articles"]["test"]) & set(split["articles"]["train"])


def test_squad_dev_whole_file_is_one_set_of_2067_paragraphs(tmp_path, data_dir):
    info = squad_to_beir(data_dir / "squad" / "dev-v1.1.json", tmp_path / "b", eval_fraction=1.0)
    assert (info["documents"], info["test_queries"], info["train_queries"]) == (2067, 10570, 0)
    assert not (tmp_path / "b" / "train.jsonl").exists()


def test_passage_set_asks_each_passage_for_its_middle_sentence(tmp_path):
    from bertforge.data.beir import passage_set, read_documents
    f = tmp_path / "docs.txt"
    f.write_text("s1 a.\ns2 a.\ns3 a.\ns4 a.\n\nt1 b.\nt2 b.\nt3 b.\n\nshort.\n")
    docs = read_documents(f)
    assert docs == [["s1 a.", "s2 a.", "s3 a.", "s4 a."], ["t1 b.", "t2 b.", "t3 b."], ["short."]]
    data = passage_set(docs, sentences_per_passage=3)
    assert data.corpus == {"p0": "s1 a. s3 a.", "p1": "t1 b. t3 b."}  # s4 (a tail) and "short." left out
    assert data.queries == {"q0": "s2 a.", "q1": "t2 b."} and data.qrels == {"q0": {"p0": 1}, "q1": {"p1": 1}}
    assert len(passage_set(docs * 50, 3, max_passages=7).corpus) == 7
    with pytest.raises(DataError, match="no document has 5 sentences"):
        passage_set(docs, 5)
