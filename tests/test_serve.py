"""``bertforge serve`` over real HTTP on loopback: the server runs as a subprocess on a free port.

Truths used: the offline code paths on the same dirs — :mod:`bertforge.runtime.embedder`'s mean-pooled
vectors (``embed-eval``), the runner's logits with softmax / sigmoid (``predict``), the NER and QA adapters'
decoding (``evaluate``) and the tokenizer's own ids — and the limits' documented status codes.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, cli_env, make_tiny_checkpoint, sentences

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXTS = [s for s, _ in sentences(24, 7)]


# ------------------------------------------------------------------------------------------ helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port, method, path, body=None, raw: bytes = None, headers=None, timeout=60):
    """One request; returns (status, parsed JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    conn.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def post(port, path, body, **kw):
    return call(port, "POST", path, body, **kw)


class Server:
    def __init__(self, models: list, *flags, env=None):
        self.port = free_port()
        args = [a for n, d in models for a in ("--model", f"{n}={d}")]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bertforge", "serve", *args, "--port", str(self.port), *map(str, flags)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(**(env or {})), cwd=str(REPO))

    def wait_ready(self, timeout=120):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                if call(self.port, "GET", "/health", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("server not ready")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _tiny_head(root: Path, name: str, head: str, tok_dir: Path, seed: int, **cfg_kw) -> Path:
    import torch
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    tok = load_tokenizer(tok_dir)
    torch.manual_seed(seed)
    cfg = ModelConfig(model_type="bert", vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, **cfg_kw)
    m = TaskModel(cfg, head=head).eval()
    with torch.no_grad():  # non-trivial heads: every output differs
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    m.save_pretrained(root / name, tokenizer=tok)
    return root / name


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Tiny random models written with bertforge's own save_pretrained: an encoder (``emb``), a 3-label
    classifier, a 1-output cross-encoder, a NER tagger, a QA model, and the encoder's PyTorch INT8 dir
    (``quantize --backend torch``) and FP32 ONNX dir (``export``)."""
    from bertforge.compress import quantize as bq
    from bertforge.checkpoint import load_pretrained
    root = tmp_path_factory.mktemp("serve")
    d = {"emb": make_tiny_checkpoint(root / "emb")}
    d["cls"] = _tiny_head(root, "cls", "sequence_classification", d["emb"], 1, num_labels=3,
                          id2label={0: "neg", 1: "neu", 2: "pos"})
    d["cross"] = _tiny_head(root, "cross", "sequence_classification", d["emb"], 2, num_labels=1,
                            problem_type="regression", id2label={0: "score"})
    d["ner"] = _tiny_head(root, "ner", "token_classification", d["emb"], 3, num_labels=len(NER_LABELS),
                          id2label=dict(enumerate(NER_LABELS)), add_pooling_layer=False)
    d["qa"] = _tiny_head(root, "qa", "question_answering", d["emb"], 4, num_labels=2, add_pooling_layer=False)
    m = load_pretrained(d["emb"])
    bq.save_quantized(bq.quantize_dynamic(m), m, root / "emb-int8", tokenizer_dir=d["emb"])
    d["int8"] = root / "emb-int8"
    from bertforge.compress.onnx import deploy
    deploy(m, root / "emb-onnx", source_dir=d["emb"], optimize=False, check=False)
    d["onnx"] = root / "emb-onnx"
    return d


@pytest.fixture(scope="module")
def servers(dirs, minilm_dir):
    """Three servers started together (their start-ups overlap):

    * ``main``: every tiny model, the INT8 dir and the MiniLM checkpoint in one process; batches wait ≤ 5 ms;
    * ``strict``: one tiny encoder behind an API key, tight limits, 300 ms batching waits (requests stay in
      flight);
    * ``drain``: one tiny encoder with 1 s batching waits, for SIGTERM with requests in flight."""
    started = {
        "main": Server([(k, dirs[k]) for k in ("emb", "cls", "cross", "ner", "qa", "int8", "onnx")] + [("minilm", "minilm")],
                       "--max-wait-ms", 5, "--max-client-batch-size", 8, "--threads", 1),
        "strict": Server([("emb", dirs["emb"])], "--max-wait-ms", 300, "--max-concurrent-requests", 2,
                         "--payload-limit", 4000, "--threads", 1, env={"BERTFORGE_API_KEY": "s3cret"}),
        "drain": Server([("emb", dirs["emb"])], "--max-wait-ms", 1000, "--threads", 1),
    }
    try:
        yield {k: s.wait_ready() for k, s in started.items()}
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def main_server(servers):
    return servers["main"]


@pytest.fixture(scope="module")
def strict_server(servers):
    return servers["strict"]


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


# ------------------------------------------------------------------------------------------ routes
def test_embed_equals_offline_embeddings_for_fp32_onnx_int8_and_minilm(main_server, dirs, minilm_dir):
    from bertforge.runtime.embedder import load_embedder
    p = main_server.port
    for name, path in (("emb", dirs["emb"]), ("onnx", dirs["onnx"]), ("int8", dirs["int8"]),
                       ("minilm", minilm_dir)):
        st, got = post(p, "/embed", {"inputs": TEXTS[:6], "model": name})
        assert st == 200, got
        ref = _unit(load_embedder(path).embed(TEXTS[:6]))
        cos = (_unit(got) * ref).sum(1)
        # FP32: the same vectors; dynamic INT8 quantizes activations per batch, so batch-mates matter a little
        assert cos.min() >= (0.999 if name == "int8" else 0.9999), (name, cos)
        assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)  # normalize defaults to true
    st, one = post(p, "/embed", {"inputs": TEXTS[0], "normalize": False, "model": "emb"})
    raw = load_embedder(dirs["emb"]).embed(TEXTS[:1])
    assert st == 200 and len(one) == 1 and np.allclose(one[0], raw[0], atol=1e-4)


def test_embed_minilm_equals_sentence_transformers_encode(main_server, minilm_dir):
    """The MiniLM checkpoint served over HTTP gives sentence-transformers' own ``encode`` vectors (its
    modules: BERT → mean pooling → normalize; its truncation at max_seq_length 256 for a long text)."""
    st_mod = pytest.importorskip("sentence_transformers")
    texts = TEXTS[:5] + [" ".join(TEXTS) * 3]  # the last one is over 256 tokens: cut as ST cuts it
    st, got = post(main_server.port, "/embed", {"inputs": texts, "model": "minilm", "truncate": True})
    assert st == 200, got
    ref = st_mod.SentenceTransformer(str(minilm_dir), device="cpu", local_files_only=True).encode(
        texts, normalize_embeddings=True, convert_to_numpy=True)
    cos = (_unit(got) * _unit(ref)).sum(1)
    assert cos.min() >= 0.9999, cos


def test_openai_embeddings_float_and_base64(main_server, dirs):
    p = main_server.port
    st, ref = post(p, "/embed", {"inputs": TEXTS[:3], "model": "emb"})
    st, got = post(p, "/v1/embeddings", {"model": "emb", "input": TEXTS[:3]})
    assert st == 200 and got["object"] == "list" and got["model"] == "emb"
    assert [d["index"] for d in got["data"]] == [0, 1, 2]
    assert np.allclose([d["embedding"] for d in got["data"]], ref, atol=1e-6)
    from bertforge.tokenizer import load_tokenizer
    n_tok = sum(len(e.ids) for e in load_tokenizer(dirs["emb"]).encode_batch(TEXTS[:3]))
    assert got["usage"] == {"prompt_tokens": n_tok, "total_tokens": n_tok}
    st, b64 = post(p, "/v1/embeddings", {"model": "emb", "input": TEXTS[:3], "encoding_format": "base64"})
    vecs = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]]
    assert st == 200 and np.allclose(vecs, ref, atol=1e-6)


def test_predict_equals_softmax_of_offline_logits(main_server, dirs):
    from bertforge.runtime import load_runner
    from bertforge.tokenizer import encode_texts
    runner = load_runner(dirs["cls"])
    p = main_server.port
    st, got = post(p, "/predict", {"inputs": [[t] for t in TEXTS[:4]], "model": "cls"})
    assert st == 200 and len(got) == 4
    for t, scores in zip(TEXTS[:4], got):
        e = encode_texts(runner.tokenizer, [t], max_length=64)[0]
        z = runner(np.array([e.ids]), np.ones((1, len(e.ids)), dtype=np.int64))["logits"][0].astype(np.float64)
        prob = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert [s["label"] for s in scores] == [["neg", "neu", "pos"][i] for i in np.argsort(-prob)]
        assert np.allclose(sorted([s["score"] for s in scores], reverse=True), np.sort(prob)[::-1], atol=1e-5)
    st, single = post(p, "/predict", {"inputs": TEXTS[0], "model": "cls"})
    assert st == 200 and [x["label"] for x in single] == [x["label"] for x in got[0]]
    assert np.allclose([x["score"] for x in single], [x["score"] for x in got[0]], atol=1e-6)
    st, pair = post(p, "/predict", {"inputs": [TEXTS[0], TEXTS[1]], "model": "cls", "raw_scores": True})
    e = encode_texts(runner.tokenizer, [TEXTS[0]], [TEXTS[1]], 64)[0]
    z = runner(np.array([e.ids]), np.ones((1, len(e.ids)), dtype=np.int64), np.array([e.type_ids]))["logits"][0]
    assert st == 200 and np.allclose(sorted(s["score"] for s in pair), np.sort(z), atol=1e-4)


def test_rerank_by_cross_encoder_and_by_cosine(main_server, dirs):
    from bertforge.runtime import load_runner
    from bertforge.tokenizer import encode_texts
    p = main_server.port
    q, docs = TEXTS[0], TEXTS[1:6]
    st, got = post(p, "/rerank", {"query": q, "texts": docs, "model": "cross", "return_text": True})
    assert st == 200
    r = load_runner(dirs["cross"])
    encs = encode_texts(r.tokenizer, [q] * len(docs), docs, 64)
    ref = []
    for e in encs:
        z = r(np.array([e.ids]), np.ones((1, len(e.ids)), dtype=np.int64), np.array([e.type_ids]))["logits"][0, 0]
        ref.append(1 / (1 + np.exp(-z)))
    assert [x["index"] for x in got] == list(np.argsort(-np.array(ref), kind="stable"))
    assert np.allclose([x["score"] for x in got], np.sort(ref)[::-1], atol=1e-5)
    assert all(x["text"] == docs[x["index"]] for x in got)
    st, cos = post(p, "/rerank", {"query": q, "texts": docs, "model": "emb"})
    st2, vecs = post(p, "/embed", {"inputs": [q] + docs, "model": "emb"})
    sims = np.asarray(vecs[1:]) @ np.asarray(vecs[0])
    assert st == 200 and [x["index"] for x in cos] == list(np.argsort(-sims, kind="stable"))
    assert np.allclose([x["score"] for x in cos], np.sort(sims)[::-1], atol=1e-5)


def test_tokenize_gives_the_tokenizers_ids_and_offsets(main_server, minilm_dir):
    from bertforge.tokenizer import load_tokenizer
    tok = load_tokenizer(minilm_dir)
    text = "Angela Merkel visited Paris."
    st, got = post(main_server.port, "/tokenize", {"inputs": [text], "model": "minilm"})
    enc = tok.encode(text)
    assert st == 200 and [t["id"] for t in got[0]] == enc.ids
    assert got[0][0] == {"id": enc.ids[0], "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert [(t["start"], t["stop"]) for t in got[0][1:-1]] == [tuple(o) for o in enc.offsets[1:-1]]
    assert text[got[0][1]["start"]:got[0][1]["stop"]] == "Angela"
    st, bare = post(main_server.port, "/tokenize", {"inputs": text, "model": "minilm", "add_special_tokens": False})
    assert st == 200 and [t["id"] for t in bare[0]] == enc.ids[1:-1]


def test_ner_equals_evaluate_decoding(main_server, dirs):
    from bertforge.data.conll import TokenExample, encode_token_windows
    from bertforge.runtime import load_runner
    from bertforge.tasks import get_task
    from bertforge.tasks.base import Windows
    from bertforge.tasks.ner import TokenClassificationAdapter, entity_spans
    runner = load_runner(dirs["ner"])
    adapter = TokenClassificationAdapter(get_task("ner"), runner.tokenizer, 64)
    adapter.labels = NER_LABELS
    texts = [TEXTS[0] + ", " + TEXTS[1], " ".join(TEXTS[2:20])]  # the second needs several windows
    st, got = post(main_server.port, "/ner", {"inputs": texts, "model": "ner"})
    assert st == 200 and len(got) == 2
    n_ents = 0
    for text, ents in zip(texts, got):
        import re
        words = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]  # whitespace words
        ex = [TokenExample([w for w, _, _ in words])]
        win = Windows(encode_token_windows(runner.tokenizer, ex, 64), ex)
        tags = adapter.word_tags(runner, win)[0]
        want = [(t, words[a][1], words[b][2]) for t, a, b in entity_spans(tags)]
        assert [(e["label"], e["start"], e["end"]) for e in ents] == want
        assert all(e["text"] == text[e["start"]:e["end"]] and 0 < e["score"] <= 1 for e in ents)
        n_ents += len(ents)
    assert n_ents > 0
    assert len(encode_token_windows(runner.tokenizer, [TokenExample(texts[1].split())], 64)) > 1


def test_qa_equals_evaluate_decoding(main_server, dirs):
    from bertforge.data.squad import QAExample
    from bertforge.runtime import load_runner
    from bertforge.tasks import adapter_for, get_task
    from bertforge.tasks.base import Windows
    from bertforge.data.squad import encode_qa_windows
    runner = load_runner(dirs["qa"])
    q, ctx = "what was the film", " ".join(TEXTS[:10])
    adapter = adapter_for(get_task("squad"), runner.tokenizer, 64)
    ex = [QAExample("0", q, ctx)]
    win = Windows(encode_qa_windows(runner.tokenizer, ex, 64, adapter.stride, adapter.max_query_len, False), ex)
    assert len(win) > 1  # the context spans several windows
    ref = adapter.answers(runner, win)[0]
    st, got = post(main_server.port, "/qa", {"question": q, "context": ctx, "model": "qa"})
    assert st == 200 and got["answer"] == ref["answer"] and got["start"] == ref["start"]
    assert got["answer"] and ctx[got["start"]:got["end"]] == got["answer"]
    assert abs(got["score"] - ref["score"]) < 1e-4
    st, many = post(main_server.port, "/qa", {"inputs": [{"question": q, "context": ctx}] * 2, "model": "qa"})
    assert st == 200 and many == [got, got]


def test_health_info_metrics(main_server):
    p = main_server.port
    st, info = call(p, "GET", "/info")
    assert st == 200 and [m["name"] for m in info["models"]][:2] == ["emb", "cls"]
    kinds = {m["name"]: (m["kind"], m["backend"], m["precision"]) for m in info["models"]}
    assert kinds["int8"] == ("base", "torch", "int8") and kinds["ner"][0] == "token_classification"
    assert kinds["onnx"] == ("base", "onnxruntime", "fp32")
    assert info["limits"]["max_client_batch_size"] == 8 and "api_key" not in info["limits"]
    from bertforge.server.routes import POST_ROUTES  # every path a model answers is listed, and exists
    emb = next(m for m in info["models"] if m["name"] == "emb")
    assert set(emb["paths"]) >= {"/embed", "/v1/embeddings", "/similarity", "/embed_all", "/tokenize", "/decode"}
    assert all(path in POST_ROUTES for m in info["models"] for path in m["paths"])
    before = _count(p, "/tokenize", "200")
    for _ in range(3):
        post(p, "/tokenize", {"inputs": "a"})
    post(p, "/tokenize", {"inputs": ""})
    post(p, "/embed", {"inputs": "a", "model": "emb"})  # a batch observed, whichever tests ran before
    st, text = call(p, "GET", "/metrics")
    assert st == 200 and "bertforge_batch_size_bucket" in text and "bertforge_queue_depth" in text
    assert "bertforge_tokens_per_second" in text and "bertforge_request_duration_seconds_bucket" in text
    assert _count(p, "/tokenize", "200") == before + 3
    assert _count(p, "/tokenize", "422") >= 1


def _count(port, route, status) -> float:
    text = call(port, "GET", "/metrics")[1]
    key = f'bertforge_requests_total{{route="{route}",status="{status}"}} '
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(key))


def test_concurrent_mixed_requests_equal_one_at_a_time(main_server):
    """Many concurrent requests of mixed lengths (batched together, split across batches) return the vectors
    that one request at a time returns, in order."""
    p = main_server.port
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(48):
        k = int(rng.integers(1, 5))
        reqs.append([" ".join(TEXTS[(i + j) % len(TEXTS)].split()[: int(rng.integers(1, 12))] * int(rng.integers(1, 4)))
                     for j in range(k)])
    alone = {t: post(p, "/embed", {"inputs": t, "model": "emb"})[1][0] for r in reqs for t in r}
    before = call(p, "GET", "/metrics")[1]
    with ThreadPoolExecutor(16) as ex:
        got = list(ex.map(lambda r: post(p, "/embed", {"inputs": r, "model": "emb"}), reqs))
    for r, (st, vecs) in zip(reqs, got):
        assert st == 200 and len(vecs) == len(r)
        assert np.allclose(vecs, [alone[t] for t in r], atol=1e-5)
    after = call(p, "GET", "/metrics")[1]
    n_seq = sum(len(r) for r in reqs)

    def batches(text):
        return sum(float(ln.split()[-1]) for ln in text.splitlines()
                   if ln.startswith('bertforge_batch_size_count{model="emb"}'))
    assert batches(after) - batches(before) < n_seq  # sequences shared forward passes


# ------------------------------------------------------------------------------------------ errors
def test_invalid_input_is_422_and_too_many_is_413(main_server):
    p = main_server.port
    for body in ({"inputs": 3}, {"inputs": ""}, {"inputs": ["ok", ""]}, {"inputs": ["ok", 4]}, {"inputs": []},
                 {"nope": "x"}, {"inputs": "x", "model": "nosuch"}, {"inputs": "x", "normalize": "yes"}):
        st, err = post(p, "/embed", body)
        assert st == 422 and err["error_type"] == "validation" and err["error"], (body, err)
    for raw in (b"{not json", b'{"inputs": "caf\xe9"}', b"[1, 2]"):
        st, err = post(p, "/embed", None, raw=raw)
        assert st == 422 and set(err) == {"error", "error_type"}, (raw, err)
    long = " ".join(["film"] * 100)  # > 64 positions of the tiny models
    st, err = post(p, "/embed", {"inputs": long, "model": "emb"})
    assert st == 422 and "truncate" in err["error"]
    st, ok = post(p, "/embed", {"inputs": long, "model": "emb", "truncate": True})
    assert st == 200 and len(ok[0]) == 32
    huge = "film " * 20000  # 100 kB: tokenized off the event loop
    assert post(p, "/embed", {"inputs": huge, "model": "emb"})[0] == 422
    st, cut = post(p, "/embed", {"inputs": huge, "model": "emb", "truncate": True})
    assert st == 200 and np.allclose(cut, post(p, "/embed", {"inputs": " ".join(["film"] * 64), "model": "emb"})[1],
                                     atol=1e-5)
    st, err = post(p, "/ner", {"inputs": "x", "model": "emb"})  # a model that does not answer the route
    assert st == 422 and "/ner" in err["error"]
    st, err = post(p, "/embed", {"inputs": ["a"] * 9})
    assert st == 413 and err["error_type"] == "payload_too_large"
    st, err = call(p, "GET", "/nosuch")
    assert st == 404 and "error" in err


def test_auth_body_limit_and_overload(strict_server):
    p = strict_server.port
    good = {"Authorization": "Bearer s3cret"}
    assert call(p, "GET", "/health")[0] == 200  # probes need no key
    for h in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        st, err = post(p, "/embed", {"inputs": "a"}, headers=h)
        assert st == 401 and err["error_type"] == "unauthorized"
    assert call(p, "GET", "/metrics")[0] == 401
    st, _ = post(p, "/embed", {"inputs": "a film"}, headers=good)
    assert st == 200
    st, err = post(p, "/embed", {"inputs": "a " * 3000}, headers=good)
    assert st == 413 and err["error_type"] == "payload_too_large"
    with ThreadPoolExecutor(8) as ex:  # 300 ms batching waits keep requests in flight; 2 allowed
        codes = list(ex.map(lambda i: post(p, "/embed", {"inputs": f"film {i}"}, headers=good)[0], range(8)))
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes, codes


def test_sigterm_drains_requests_in_flight(servers):
    s = servers["drain"]
    with ThreadPoolExecutor(6) as ex:
        futs = [ex.submit(post, s.port, "/embed", {"inputs": [TEXTS[i]] * (1 + i % 3)}) for i in range(6)]
        time.sleep(0.4)  # all six sit in the 1 s batching wait
        s.proc.send_signal(signal.SIGTERM)
        res = [f.result() for f in futs]
    assert [st for st, _ in res] == [200] * 6
    assert s.proc.wait(30) == 0
    assert "Traceback" not in s.proc.stderr.read()


def _refused(argv: list, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bertforge", "serve", *map(str, argv), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=str(REPO))


def _one_error_line(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(timeout=120)
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("bertforge: error:"), err
    return lines[0]


def test_bad_model_dir_and_busy_port_exit_2_before_listening(dirs, tmp_path):
    port = free_port()
    with socket.socket() as s:  # a port something listens on
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        procs = [_refused(["--model", f"x={tmp_path / 'missing'}"], port), _refused(["--model", dirs["emb"]], busy)]
        lines = [_one_error_line(p) for p in procs]
    assert "--model x" in lines[0] and "does not exist" in lines[0] and "in use" in lines[1]
    with socket.socket() as s:  # the refused servers never listened on their port
        s.bind(("127.0.0.1", port))
