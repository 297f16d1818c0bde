"""The task adapters' four steps (read / encode / decode / score) are one path for files and for plain texts:
a NER or QA adapter gives the texts of a request exactly the predictions it gives the same sentences or
questions read from a file; the server's /ner and /predict answer what the adapter decodes for the same text;
and ``bertforge.serve`` from Python answers requests and, stopped, frees its port.

Truths: the file path (what ``evaluate`` / ``predict`` read), the texts themselves (entity and answer offsets
cut the very characters named), and the operating system (a stopped server refuses connections; its port
binds again).
"""
from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from helpers import make_tiny_checkpoint, sentences

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXTS = [s for s, _ in sentences(24, 7)]


def _tiny_head(root: Path, name: str, head: str, seed: int, **cfg_kw) -> Path:
    """A tiny random BERT with a ``head`` whose every weight is perturbed (outputs differ by position)."""
    import torch
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    base = root / "base"
    if not base.exists():
        make_tiny_checkpoint(base)
    tok = load_tokenizer(base)
    torch.manual_seed(seed)
    cfg = ModelConfig(model_type="bert", vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, **cfg_kw)
    m = TaskModel(cfg, head=head).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():  # the head's scores spread wide: every label wins somewhere
            p.add_((3.0 if n.startswith("head.") else 0.05) * torch.randn_like(p))
    m.save_pretrained(root / name, tokenizer=tok)
    return root / name


def _ner_dir(root: Path) -> Path:
    return _tiny_head(root, "ner", "token_classification", 3, num_labels=len(NER_LABELS),
                      id2label=dict(enumerate(NER_LABELS)), add_pooling_layer=False)


def _ner_adapter(model_dir: Path, runner, max_seq_len: int):
    from bertforge.tasks import adapter_for, get_task
    adapter = adapter_for(get_task("ner"), runner.tokenizer, max_seq_len)
    from bertforge.checkpoint.modeldir import ModelDir
    adapter.use_model_labels(ModelDir.open(model_dir))  # a dir is read through ModelDir
    return adapter


# ------------------------------------------------------------------------------- texts = files
def test_ner_adapter_decodes_plain_texts_as_the_same_sentences_read_from_a_file(tmp_path):
    from bertforge.runtime import load_runner
    d = _ner_dir(tmp_path)
    runner = load_runner(d)
    # words joined by single spaces, punctuation apart: the file's sentences are these texts' words
    texts = [TEXTS[0] + " , " + TEXTS[1] + " .", " ".join(TEXTS[2:12]), "film ; actor"]
    f = tmp_path / "sentences.jsonl"
    f.write_text("".join(json.dumps({"tokens": t.split()}) + "\n" for t in texts))
    adapter = _ner_adapter(d, runner, 16)  # 16 tokens: the long text needs several windows

    from_file = adapter.encode(adapter.read(f, require_labels=False), source=str(f))
    from_texts = adapter.encode(texts)
    assert len(from_texts) > len(texts) + 2 and [w["input_ids"] for w in from_texts] == \
        [w["input_ids"] for w in from_file]
    want = adapter.decode(adapter.run(runner, from_file), from_file)
    got = adapter.decode(adapter.run(runner, from_texts), from_texts)
    assert got == want
    n_entities = 0
    for text, p in zip(texts, got):
        assert p["tokens"] == text.split() and len(p["tags"]) == len(p["tokens"])
        for e in p["entities"]:
            assert text[e["start"]:e["end"]] == e["text"] and e["label"] in ("PER", "LOC") and 0 < e["score"] <= 1
        n_entities += len(p["entities"])
    assert n_entities > 0
    # and predict's rows are those tags, score its metrics (a file tagged with the predictions: F1 1)
    assert [r["tags"] for r in adapter.predictions(runner, from_file)] == [p["tags"] for p in want]
    assert adapter.score(got, [p["tags"] for p in want])["f1"] == 1.0


def test_qa_adapter_decodes_plain_questions_as_the_same_questions_read_from_a_file(tmp_path):
    from bertforge.runtime import load_runner
    from bertforge.tasks import adapter_for, get_task
    d = _tiny_head(tmp_path, "qa", "question_answering", 4, num_labels=2, add_pooling_layer=False)
    runner = load_runner(d)
    items = [{"question": "what was the film", "context": " ".join(TEXTS[:8])},
             {"question": "who is the actor", "context": TEXTS[9]}]
    f = tmp_path / "dev.json"
    f.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": it["context"], "qas": [{"id": f"q{i}", "question": it["question"], "answers": []}]}
        for i, it in enumerate(items)]}]}))
    adapter = adapter_for(get_task("squad"), runner.tokenizer, 32)

    from_file = adapter.encode(adapter.read(f, require_labels=False), source=str(f))
    from_texts = adapter.encode(items)
    assert len(from_texts) > len(items) + 1  # the long context spans several windows
    want = adapter.decode(adapter.run(runner, from_file), from_file)
    got = adapter.decode(adapter.run(runner, from_texts), from_texts)
    keys = ("answer", "start", "end", "score", "null_score")
    assert [{k: a[k] for k in keys} for a in got] == [{k: a[k] for k in keys} for a in want]
    assert [a["id"] for a in got] == ["0", "1"] and [a["id"] for a in want] == ["q0", "q1"]
    for it, a in zip(items, got):
        assert a["answer"] and it["context"][a["start"]:a["end"]] == a["answer"]
    # the predictions are scored against gold answers: their own answers score 100
    assert adapter.score(got, [[a["answer"]] for a in got])["exact_match"] == 100.0


# ------------------------------------------------------------------------------- the server decodes alike
def _post(url: str, body: dict):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_served_ner_and_predict_answer_what_the_adapters_decode_for_the_same_text(tmp_path):
    import bertforge
    from bertforge.runtime import load_runner
    from bertforge.tasks import adapter_for, get_task
    ner = _ner_dir(tmp_path)
    cls = _tiny_head(tmp_path, "cls", "sequence_classification", 1, num_labels=3,
                     id2label={0: "neg", 1: "neu", 2: "pos"})
    text = TEXTS[3] + " , " + TEXTS[4]
    with bertforge.serve({"ner": ner, "cls": cls}, threads=1) as srv:
        st, ents = _post(srv.url + "/ner", {"inputs": text, "model": "ner"})
        st2, ranked = _post(srv.url + "/predict", {"inputs": text, "model": "cls"})
        st3, err = _post(srv.url + "/ner", {"inputs": "", "model": "ner"})
    assert st == 200 and st2 == 200 and st3 == 422 and "empty" in err["error"]

    runner = load_runner(ner)
    adapter = _ner_adapter(ner, runner, 64)  # the server's windows: the model's 64 positions
    enc = adapter.encode([text])
    want = adapter.decode(adapter.run(runner, enc), enc)[0]["entities"]
    assert want and [{k: e[k] for k in ("label", "text", "start", "end")} for e in ents] == \
        [{k: e[k] for k in ("label", "text", "start", "end")} for e in want]
    assert np.allclose([e["score"] for e in ents], [e["score"] for e in want], atol=1e-6)

    runner = load_runner(cls)
    adapter = adapter_for(get_task("custom", text_columns=["text"], label_column="label",
                                   labels=["neg", "neu", "pos"]), runner.tokenizer, 64)
    enc = adapter.encode([text])
    want = adapter.decode(adapter.run(runner, enc), enc)[0]
    assert [x["label"] for x in ranked] == [x["label"] for x in want]
    assert np.allclose([x["score"] for x in ranked], [x["score"] for x in want], atol=1e-6)
    assert abs(sum(x["score"] for x in ranked) - 1) < 1e-6


# ------------------------------------------------------------------------------- bertforge.server
def test_bertforge_serve_from_python_answers_and_stop_frees_its_port(tmp_path):
    import bertforge
    from bertforge.errors import ConfigError
    d = make_tiny_checkpoint(tmp_path / "emb")
    srv = bertforge.serve(str(d), threads=1)
    port = srv.port
    try:
        assert srv.running and srv.url == f"http://127.0.0.1:{port}" and srv.models == ["emb"]
        with urllib.request.urlopen(srv.url + "/health", timeout=30) as r:
            assert json.load(r) == {"status": "ok", "models": ["emb"]}
        st, vecs = _post(srv.url + "/embed", {"inputs": TEXTS[:2]})
        assert st == 200
        ref = np.asarray(bertforge.embed(d, TEXTS[:2]), dtype=np.float64)
        ref /= np.linalg.norm(ref, axis=1, keepdims=True)
        assert np.allclose(vecs, ref, atol=1e-5)
        with pytest.raises(ConfigError, match="in use"):  # a taken port fails before any model loads
            bertforge.serve(str(d), port=port)
    finally:
        srv.stop()
    assert not srv.running
    assert not any(t.name == f"bertforge-serve-{port}" for t in threading.enumerate())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    with socket.socket() as s:  # the port is free again (as the server binds it: SO_REUSEADDR)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    srv.stop()  # a second stop does nothing
    with bertforge.serve({"again": d}, port=port, threads=1) as again:  # the same port, a with block
        assert again.port == port and _post(again.url + "/embed", {"inputs": "x"})[0] == 200
    assert not again.running
