"""``bertforge.serve_bench`` called from Python: a misspelt option is refused before torch loads, a missing
model dir before any server starts, and a tiny model served on loopback answers every request of its burst.

Independent truths: ``sys.modules`` of a fresh interpreter; the HTTP answers of the ``bertforge serve`` child
process (counted by status)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import make_tiny_checkpoint

_PROBE = """
import json, sys
import bertforge
from bertforge.errors import ConfigError
try:
    bertforge.serve_bench({"teacher": "minilm"}, request=10)
    said = None
except ConfigError as e:
    said = str(e)
print(json.dumps({"said": said, "torch": "torch" in sys.modules}))
"""


def test_an_unknown_option_is_refused_before_torch_loads():
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["said"] and "request" in out["said"] and "ServeBenchOptions" in out["said"]
    assert out["torch"] is False


def test_a_missing_model_is_refused_before_a_server_starts(tmp_path):
    import bertforge
    from bertforge.errors import BertforgeError
    with pytest.raises(BertforgeError, match="does not exist"):
        bertforge.serve_bench({"x": tmp_path / "nothing"}, requests=4)


def test_a_tiny_served_model_answers_every_request_of_its_burst(tmp_path):
    import bertforge
    tiny = make_tiny_checkpoint(tmp_path / "tiny")
    texts = tmp_path / "texts.txt"
    texts.write_text("a good film\nthe plot was dull\na very funny scene\n", encoding="utf-8")
    out = tmp_path / "served.json"
    r = bertforge.serve_bench([f"tiny={tiny}"], requests=6, concurrency=2, rounds=2, texts=texts, threads=1,
                              out=out, startup_timeout=120)
    assert r.failed == []
    (row,) = r.models
    assert row["name"] == "tiny" and row["requests"] == 6 and row["ok"] == 6 and row["texts_per_s"] > 0
    assert r.record["texts"] == "3 lines of texts.txt" and json.loads(out.read_text()) == r.record


def test_a_classifier_that_cannot_embed_is_timed_on_its_own_route(exported_workspace, tmp_path):
    """An INT8 ONNX classifier (its graph ends in logits, so it has no /v1/embeddings) is timed on /predict and
    every request is answered; the record names each model's route (issue 49: the README's serve-bench line
    answered 0 of 400 with 422 for its INT8 classifier)."""
    import bertforge
    from bertforge.pipelines.serve_bench import bench_routes
    texts = tmp_path / "texts.txt"
    texts.write_text("a good film\nthe plot was dull\n", encoding="utf-8")
    info = {"models": [{"name": "a", "kind": "classification", "routes": ["predict", "rerank", "tokenize"]},
                       {"name": "b", "kind": "embedding", "routes": ["embed", "rerank"]},
                       {"name": "c", "kind": "token_classification", "routes": ["ner", "embed"]}]}
    assert bench_routes(json.dumps(info).encode()) == {"a": "/predict", "b": "/v1/embeddings", "c": "/v1/embeddings"}
    r = bertforge.serve_bench([f"cls={exported_workspace.onnx}"], requests=4, concurrency=2, rounds=1, texts=texts,
                              threads=1, startup_timeout=120)
    assert r.failed == [], r.record
    (row,) = r.models
    assert row["ok"] == 4 and row["route"] in ("POST /predict", "POST /v1/embeddings")
