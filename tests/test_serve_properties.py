"""Property-based tests of the HTTP routes (hypothesis, schemathesis): whatever JSON a client sends, the server
answers a documented status — never a 5xx, never a NaN — and a 200 for a text is the offline model's answer for
the same text.

* random JSON values, and random bodies made of each route's own field names with random values, to every
  POST route: the status is one the route documents (``/openapi.json``) and below 500;
* random unicode texts to ``/embed``: 200 equals :func:`bertforge.embed` of the same text (cos ≥ 0.9999; a
  float32 forward pass of another batch shape differs by ~1e-7), whitespace-only texts are 422; to
  ``/tokenize``: every token's ``text`` is its byte slice of the input, offsets in order and in range;
* schemathesis, from the server's own ``/openapi.json``: no 5xx, no status code, content type or answer body
  the document does not describe.

Bounded: a few dozen examples per property and a deadline each, all together well under a minute on one core.
"""
from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import numpy as np
import pytest

from helpers import make_tiny_checkpoint

hypothesis = pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


MAX_LEN = 24
SETTINGS = dict(deadline=5000, derandomize=True, suppress_health_check=list(HealthCheck), database=None)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny encoder declaring mean pooling, normalisation, max_seq_length 24 and a default prompt; a tiny
    3-label classifier on the same tokenizer."""
    import torch
    from bertforge.checkpoint.layout import ST_MODEL_CONFIG, write_pooling
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    root = tmp_path_factory.mktemp("props")
    emb = make_tiny_checkpoint(root / "emb")
    write_pooling(emb, "mean", normalize=True, max_seq_length=MAX_LEN)
    (emb / ST_MODEL_CONFIG).write_text(json.dumps({"prompts": {"query": "query: "}, "default_prompt_name": "query"}))
    tok = load_tokenizer(emb)
    torch.manual_seed(1)
    cfg = ModelConfig(model_type="bert", vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, num_labels=3,
                      id2label={0: "neg", 1: "neu", 2: "pos"})
    TaskModel(cfg, head="sequence_classification").eval().save_pretrained(root / "cls", tokenizer=tok)
    return {"emb": emb, "cls": root / "cls"}


@pytest.fixture(scope="module")
def srv(dirs):
    import bertforge
    with bertforge.serve({"emb": dirs["emb"], "cls": dirs["cls"]}, threads=1, max_client_batch_size=8) as s:
        yield s


@pytest.fixture(scope="module")
def spec(srv):
    with urllib.request.urlopen(srv.url + "/openapi.json", timeout=30) as r:
        return json.load(r)


def post(url, path, raw: bytes):
    req = urllib.request.Request(url + path, raw, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def no_nan(x) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, list):
        return all(map(no_nan, x))
    if isinstance(x, dict):
        return all(map(no_nan, x.values()))
    return True


def check_answer(spec, path: str, status: int, body: bytes) -> None:
    documented = set(spec["paths"][path]["post"]["responses"]) - {"500"}
    assert str(status) in documented, (path, status, body[:300])
    obj = json.loads(body, parse_constant=lambda c: float("nan"))  # NaN / Infinity would parse as nan
    assert no_nan(obj), (path, body[:300])
    if status != 200:
        err = obj["error"]
        assert (err["message"] if isinstance(err, dict) else err), (path, obj)


# ------------------------------------------------------------------------------------------ strategies
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=12)
#: values a field of ours might take, right or wrong: texts, ids, booleans, names, nesting
VALUES = (st.text(max_size=40) | st.lists(st.text(max_size=20), max_size=4) | st.integers(-5, 400)
          | st.lists(st.integers(-3, 200), max_size=6) | st.booleans() | st.none()
          | st.sampled_from(["Left", "right", "up", "query", "nope", "emb", "cls", "float", "base64"])
          | st.lists(st.lists(st.text(max_size=10), max_size=3), max_size=3) | JSON)


def route_bodies(spec):
    """A route and a body of its own field names (some dropped, a stranger sometimes added) with random values."""
    routes = {p: op["post"] for p, op in spec["paths"].items() if "post" in op}
    schemas = spec["components"]["schemas"]

    def fields(path):
        ref = routes[path]["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
        return sorted(schemas[ref]["properties"])

    return st.sampled_from(sorted(routes)).flatmap(
        lambda p: st.tuples(st.just(p), st.dictionaries(st.sampled_from(fields(p) + ["extra"]), VALUES,
                                                         max_size=5)))


# ------------------------------------------------------------------------------------------ properties
def test_random_json_bodies_get_a_documented_status_below_500(srv, spec):
    paths = sorted(p for p, op in spec["paths"].items() if "post" in op)

    @settings(max_examples=60, **SETTINGS)
    @given(path=st.sampled_from(paths), body=JSON)
    def prop(path, body):
        status, raw = post(srv.url, path, json.dumps(body).encode())
        check_answer(spec, path, status, raw)

    prop()


def test_bodies_of_the_routes_own_fields_get_a_documented_status_below_500(srv, spec):
    @settings(max_examples=150, **SETTINGS)
    @given(case=route_bodies(spec))
    def prop(case):
        path, body = case
        status, raw = post(srv.url, path, json.dumps(body).encode())
        check_answer(spec, path, status, raw)

    prop()


def test_random_texts_embed_as_the_offline_model_does(srv, spec, dirs):
    from bertforge.runtime.embedder import load_embedder
    offline = load_embedder(dirs["emb"], threads=1)

    @settings(max_examples=40, **SETTINGS)
    @given(texts=st.lists(st.text(max_size=60), min_size=1, max_size=4))
    def prop(texts):
        status, raw = post(srv.url, "/embed", json.dumps({"inputs": texts, "truncate": True,
                                                           "model": "emb"}).encode())
        check_answer(spec, "/embed", status, raw)
        if any(not t.strip() for t in texts):
            assert status == 422
            return
        assert status == 200, raw[:300]
        served = np.asarray(json.loads(raw), dtype=np.float64)
        want = offline.embed(texts).astype(np.float64)  # the dir's length, default prompt, normalisation
        cos = (served * want).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() >= 0.9999, (texts, cos)

    prop()


def test_random_texts_tokenize_to_byte_slices_of_themselves(srv, spec):
    @settings(max_examples=40, **SETTINGS)
    @given(text=st.text(min_size=1, max_size=60).filter(lambda t: t.strip()))
    def prop(text):
        status, raw = post(srv.url, "/tokenize", json.dumps({"inputs": text, "model": "emb"}).encode())
        check_answer(spec, "/tokenize", status, raw)
        assert status == 200
        full = ("query: " + text).encode("utf-8")  # the default prompt is part of the tokenized input
        last = 0
        for t in json.loads(raw)[0]:
            if t["special"]:
                continue
            assert last <= t["start"] <= t["stop"] <= len(full)
            assert t["text"] == full[t["start"]:t["stop"]].decode("utf-8", "replace")
            last = t["start"]

    prop()


# ------------------------------------------------------------------------------------------ schemathesis
def _schema():
    from bertforge import __version__
    from bertforge.server.openapi import build_spec
    from bertforge.server.routes import POST_ROUTES
    return schemathesis.openapi.from_dict(build_spec(POST_ROUTES, __version__))


schema = _schema()


@schema.parametrize()
@settings(max_examples=6, **SETTINGS)
def test_schemathesis_finds_nothing_the_document_does_not_describe(case, srv):
    from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                     status_code_conformance)
    case.call_and_validate(base_url=srv.url, timeout=60, checks=[not_a_server_error, status_code_conformance,
                                                                 content_type_conformance,
                                                                 response_schema_conformance])
