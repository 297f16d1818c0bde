"""A record id given twice is refused in one line (exit 2): ``bertforge embed`` inputs (a vector per id: the
second would silently stand for the first) and BEIR judgements (``retrieval-eval``)."""
from __future__ import annotations

import json

import pytest

from bertforge.data.stream import plan_shards
from bertforge.errors import DataError


def _jsonl(p, rows):
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return p


def test_embed_refuses_a_repeated_jsonl_id_naming_both_lines(tmp_path, cli_error, minilm_dir):
    src = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "a", "text": "z"}])
    line = cli_error(["embed", "--model", minilm_dir, "--input", src, "--out", tmp_path / "out"], tmp_path / "none")
    assert "c.jsonl:3 repeats id 'a'" in line and "c.jsonl:1" in line


def test_a_number_and_its_string_are_one_id(tmp_path):
    src = _jsonl(tmp_path / "c.jsonl", [{"id": 7, "text": "x"}, {"_id": "7", "text": "y"}])
    with pytest.raises(DataError, match=r"c.jsonl:2 repeats id '7'"):
        plan_shards([src], 10)


def test_two_text_files_of_one_name_repeat_their_line_ids(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "t.txt").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(DataError, match="repeats id 't.txt:1'.*distinct name"):
        plan_shards([tmp_path / "a" / "t.txt", tmp_path / "b" / "t.txt"], 10)


def test_distinct_ids_pass_and_are_counted(tmp_path):
    src = _jsonl(tmp_path / "c.jsonl", [{"id": i, "text": f"t{i}"} for i in range(25)])
    assert plan_shards([src], 10)["records"] == 25


def test_retrieval_eval_refuses_a_repeated_judgement(tmp_path, cli_error, minilm_dir):
    from bertforge.data.beir import write_beir
    d = write_beir(tmp_path / "set", {"d1": "a cat", "d2": "a dog"}, {"q1": "cat?"}, {"test": {"q1": {"d1": 1}}})
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t1\n")
    line = cli_error(["retrieval-eval", "--model", minilm_dir, "--data", d, "--out", tmp_path / "r.json"],
                     tmp_path / "set")
    assert "test.tsv:3 repeats the judgement of query 'q1' on document 'd1'" in line
