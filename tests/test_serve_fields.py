"""Every field of the TEI and OpenAI request bodies, one by one, against a truth computed without the server:
the runner's last hidden states on token ids cut and prompted by hand (mean pooling, then the cut to
``dimensions`` and the L2 norm, in TEI's order), the tokenizer's own offsets turned into UTF-8 byte offsets,
and sentence-transformers' prompt rules (``prompts`` + ``default_prompt_name`` of
``config_sentence_transformers.json``). Fields the server does not implement are refused with 422 naming them.

The model: a tiny BERT (H=32; its tokenizer adds [CLS] and [SEP]) whose dir declares mean pooling, ``max_seq_length`` 24, and prompts
``{"query": "query: ", "doc": "passage: "}`` with ``query`` the default.
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from helpers import make_tiny_checkpoint, sentences

pytest.importorskip("pydantic")

PROMPTS = {"query": "query: ", "doc": "passage: "}
MAX_LEN = 24
TEXTS = [s for s, _ in sentences(6, 11)]
LONG = " ".join(["good film", "bad plot", "the actor was very funny"] * 4)  # > MAX_LEN tokens


@pytest.fixture(scope="module")
def emb_dir(tmp_path_factory):
    from bertforge.checkpoint.layout import ST_MODEL_CONFIG, write_pooling
    from tokenizers import Tokenizer
    from tokenizers.processors import BertProcessing
    d = make_tiny_checkpoint(tmp_path_factory.mktemp("fields") / "emb")
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))  # [CLS] … [SEP], as a real BERT dir's tokenizer adds
    tok.post_processor = BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
    tok.save(str(d / "tokenizer.json"))
    write_pooling(d, "mean", normalize=False, max_seq_length=MAX_LEN)
    (d / ST_MODEL_CONFIG).write_text(json.dumps({"prompts": PROMPTS, "default_prompt_name": "query"}))
    return d


@pytest.fixture(scope="module")
def srv(emb_dir):
    import bertforge
    with bertforge.serve({"emb": emb_dir}, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def two(emb_dir):
    """Two models served: a name that is neither is refused."""
    import bertforge
    with bertforge.serve({"emb": emb_dir, "emb2": emb_dir}, threads=1) as s:
        yield s


@pytest.fixture(scope="module")
def truth(emb_dir):
    """The offline answer: ids (with special tokens) → mean-pooled last hidden state, by the runner alone."""
    from bertforge.models.pooling import pool_numpy
    from bertforge.runtime import load_runner
    runner = load_runner(emb_dir, threads=1)
    tok = runner.tokenizer
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")

    def ids_of(text, prompt=PROMPTS["query"], side="right"):
        body = tok.encode(prompt + text, add_special_tokens=False).ids
        room = MAX_LEN - 2
        body = body[-room:] if side == "left" else body[:room]
        return [cls_id, *body, sep_id]

    def vec(ids):
        a = np.asarray([ids], dtype=np.int64)
        h = runner(a, np.ones_like(a), np.zeros_like(a), outputs=("last_hidden_state",))["last_hidden_state"]
        return pool_numpy(h, np.ones_like(a), "mean")[0]

    class T:
        pass
    t = T()
    t.tok, t.ids_of, t.vec = tok, ids_of, vec
    t.embed = lambda text, **kw: vec(ids_of(text, **kw))
    return t


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=60) as r:
        return r.status, r.read().decode()


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def close(a, b, tol=1e-5):  # float32 forward passes of different batch shapes: ~1e-6 apart
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), atol=tol)


# ------------------------------------------------------------------------------------------ /embed
def test_embed_default_prompt_normalize_and_dimensions(srv, truth):
    st, got = post(srv.url, "/embed", {"inputs": TEXTS[:3]})
    assert st == 200
    for t, v in zip(TEXTS, got):
        close(v, unit(truth.embed(t)))  # the default prompt ("query: ") is put before the text
    st, raw = post(srv.url, "/embed", {"inputs": TEXTS[0], "normalize": False})
    close(raw[0], truth.embed(TEXTS[0]))
    for k in (1, 5, 32):  # dimensions=k: the first k coordinates, renormalised (TEI: cut, then normalise)
        st, v = post(srv.url, "/embed", {"inputs": TEXTS[0], "dimensions": k})
        assert st == 200 and len(v[0]) == k
        close(v[0], unit(truth.embed(TEXTS[0])[:k]))
    st, v = post(srv.url, "/embed", {"inputs": TEXTS[0], "dimensions": 4, "normalize": False})
    close(v[0], truth.embed(TEXTS[0])[:4])
    for bad in (0, 33, -1, 2.0, "4", True):
        st, err = post(srv.url, "/embed", {"inputs": TEXTS[0], "dimensions": bad})
        assert st == 422 and "dimensions" in err["error"], (bad, err)


def test_embed_prompt_name(srv, truth):
    st, got = post(srv.url, "/embed", {"inputs": TEXTS[1], "prompt_name": "doc", "normalize": False})
    close(got[0], truth.embed(TEXTS[1], prompt="passage: "))
    st, err = post(srv.url, "/embed", {"inputs": TEXTS[1], "prompt_name": "nope"})
    assert st == 422 and "prompt_name" in err["error"] and "'query'" in err["error"]


def test_truncate_and_truncation_direction(srv, truth):
    st, err = post(srv.url, "/embed", {"inputs": LONG})
    assert st == 422 and "truncate" in err["error"]
    for side, spelled in (("right", "Right"), ("left", "Left"), ("left", "left")):
        st, got = post(srv.url, "/embed", {"inputs": LONG, "truncate": True, "truncation_direction": spelled,
                                           "normalize": False})
        assert st == 200
        close(got[0], truth.embed(LONG, side=side))
    l_, r_ = (post(srv.url, "/embed", {"inputs": LONG, "truncate": True, "truncation_direction": s})[1][0]
              for s in ("Left", "Right"))
    assert not np.allclose(l_, r_)  # the two ends differ: the field is not ignored
    st, err = post(srv.url, "/embed", {"inputs": LONG, "truncate": True, "truncation_direction": "up"})
    assert st == 422 and "truncation_direction" in err["error"]


def test_token_id_inputs(srv, truth, emb_dir):
    # TEI: with a prompt (here the default one), ids are decoded and the prompt put before their text
    ids = truth.tok.encode(TEXTS[2]).ids
    st, got = post(srv.url, "/embed", {"inputs": [ids, TEXTS[2]], "normalize": False})
    assert st == 200
    close(got[0], truth.embed(TEXTS[2]))
    close(got[0], got[1])
    st, err = post(srv.url, "/embed", {"inputs": [10 ** 6]})
    assert st == 422 and "vocabulary" in err["error"]
    # without a prompt they are taken as given: no special tokens added, cut at the chosen end
    from bertforge.server.models import load_model
    m = load_model("emb", emb_dir, threads=1, warm=False)
    long_ids = list(range(5, 5 + MAX_LEN + 3))
    assert m.encode([ids], False)[0].ids == ids
    assert m.encode([long_ids], True, direction="left")[0].ids == long_ids[-MAX_LEN:]
    assert m.encode([long_ids], True, direction="right")[0].ids == long_ids[:MAX_LEN]


def test_unknown_fields_are_refused_by_name(srv):
    for path, body in (("/embed", {"inputs": "a", "normalise": True}), ("/rerank", {"query": "a", "texts": ["b"],
                                                                                   "top_k": 1}),
                       ("/v1/embeddings", {"input": "a", "encoding": "float"}),
                       ("/tokenize", {"inputs": "a", "add_special": False})):
        st, err = post(srv.url, path, body)
        assert st == 422, (path, err)
        msg = err["error"]["message"] if path.startswith("/v1/") else err["error"]
        assert ({*body} - {"inputs", "input", "query", "texts"}).pop() in msg


# ------------------------------------------------------------------------------------------ other TEI routes
def test_embed_all_is_every_token_state(srv, truth):
    st, got = post(srv.url, "/embed_all", {"inputs": [TEXTS[0]], "prompt_name": "doc"})
    ids = truth.ids_of(TEXTS[0], prompt="passage: ")
    assert st == 200 and len(got[0]) == len(ids)
    close(np.mean(got[0], axis=0), truth.vec(ids))  # mean pooling of them is the sentence vector


def test_similarity_and_rerank_fields(srv, truth):
    src, others = TEXTS[0], TEXTS[1:4]
    st, sims = post(srv.url, "/similarity", {"inputs": {"source_sentence": src, "sentences": others}})
    want = [float(unit(truth.embed(src)) @ unit(truth.embed(o))) for o in others]
    close(sims, want)
    st, ranks = post(srv.url, "/rerank", {"query": src, "texts": others, "top_n": 2, "return_text": True})
    order = np.argsort(want)[::-1][:2]
    assert [r["index"] for r in ranks] == list(order)
    assert [r["text"] for r in ranks] == [others[i] for i in order]
    close([r["score"] for r in ranks], [want[i] for i in order])
    st, ranks = post(srv.url, "/rerank", {"query": src, "texts": others})
    assert len(ranks) == 3 and all("text" not in r for r in ranks)


def test_tokenize_offsets_are_utf8_bytes_of_the_prompted_text(srv, truth):
    text = "héllo wörld – good film"
    st, got = post(srv.url, "/tokenize", {"inputs": [text], "prompt_name": "doc"})
    assert st == 200
    full = ("passage: " + text).encode("utf-8")
    enc = truth.tok.encode("passage: " + text)
    assert [t["id"] for t in got[0]] == enc.ids
    for t in got[0]:
        if t["special"]:
            assert t["start"] is None and t["stop"] is None
        else:  # TEI: text is the input's bytes start..stop
            assert t["text"] == full[t["start"]:t["stop"]].decode("utf-8")
    st, plain = post(srv.url, "/tokenize", {"inputs": "good film", "add_special_tokens": False,
                                            "prompt_name": "doc"})
    assert not any(t["special"] for t in plain[0])


def test_decode(srv, truth):
    ids = truth.tok.encode("good film").ids
    st, got = post(srv.url, "/decode", {"ids": [ids, ids], "skip_special_tokens": True})
    assert st == 200 and got == [truth.tok.decode(ids)] * 2
    st, got = post(srv.url, "/decode", {"ids": ids, "skip_special_tokens": False})
    assert got == [truth.tok.decode(ids, skip_special_tokens=False)]


def test_embed_sparse_is_refused_for_a_dense_model(srv):
    st, err = post(srv.url, "/embed_sparse", {"inputs": "good film"})
    assert st == 422 and "SPLADE" in err["error"]


# ------------------------------------------------------------------------------------------ OpenAI
def test_openai_fields(srv, truth):
    st, got = post(srv.url, "/v1/embeddings", {"input": TEXTS[:2], "model": "any-name-at-all",
                                               "dimensions": 8, "user": "u1"})
    assert st == 200 and got["model"] == "emb" and got["object"] == "list"
    for i, d in enumerate(got["data"]):
        assert d["index"] == i and d["object"] == "embedding"
        close(d["embedding"], unit(truth.embed(TEXTS[i])[:8]))
    st, b64 = post(srv.url, "/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})
    v = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    close(v, unit(truth.embed(TEXTS[0])))
    assert b64["usage"]["prompt_tokens"] == len(truth.ids_of(TEXTS[0]))
    st, err = post(srv.url, "/v1/embeddings", {"input": TEXTS[0], "dimensions": 0})
    assert st == 422 and set(err) == {"error"} and set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["param"] == "dimensions" and err["error"]["type"] == "invalid_request_error"
    st, models = get(srv.url, "/v1/models")
    assert [m["id"] for m in json.loads(models)["data"]] == ["emb"]


def test_openai_unknown_model_among_several_is_404_model_not_found(two):
    st, err = post(two.url, "/v1/embeddings", {"input": "good film", "model": "gpt-nope"})
    assert st == 404 and err["error"]["code"] == "model_not_found" and err["error"]["param"] == "model"
    assert post(two.url, "/v1/embeddings", {"input": "good film", "model": "emb2"})[0] == 200
    st, err = post(two.url, "/embed", {"inputs": "good film", "model": "nope"})  # TEI routes: 422, TEI's shape
    assert st == 422 and err["error_type"] == "validation"


# ------------------------------------------------------------------------------------------ the document
def test_openapi_describes_every_route_with_the_validating_models(srv):
    from bertforge.server.app import GET_ROUTES
    from bertforge.server.routes import POST_ROUTES
    spec = json.loads(get(srv.url, "/openapi.json")[1])
    assert set(spec["paths"]) == set(POST_ROUTES) | set(GET_ROUTES)
    schemas = spec["components"]["schemas"]
    for path, (_, req, ans, _) in POST_ROUTES.items():
        op = spec["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
        assert set(schemas[ref]["properties"]) == set(req.model_fields), path
        assert {"200", "413", "422"} <= set(op["responses"])
    assert "dimensions" in schemas["EmbedRequest"]["properties"]
    st, html = get(srv.url, "/docs")
    assert st == 200 and "openapi.json" in html and "<script>" in html and "https://" not in html


# ------------------------------------------------------------------------------------------ offline = served
def test_offline_embed_agrees_with_the_served_vectors(srv, emb_dir):
    import bertforge
    texts = TEXTS + [LONG]  # LONG: cut at the dir's max_seq_length (24), not the old default of 256
    offline = np.asarray(bertforge.embed(emb_dir, texts), dtype=np.float64)
    st, served = post(srv.url, "/embed", {"inputs": texts, "truncate": True})
    cos = (offline / np.linalg.norm(offline, axis=1, keepdims=True) * np.asarray(served)).sum(1)
    assert st == 200 and cos.min() >= 0.9999, cos
    no_prompt = np.asarray(bertforge.embed(emb_dir, texts[:1], prompt_name=""))[0]
    assert float(unit(no_prompt) @ unit(offline[0])) < 0.9999  # the default prompt is applied, not ignored


def test_sentence_transformers_of_the_dir_agrees_with_embed(srv, emb_dir):
    """sentence-transformers reads the same declarations (pooling, max_seq_length, prompts and the default one)."""
    st_mod = pytest.importorskip("sentence_transformers")
    model = st_mod.SentenceTransformer(str(emb_dir), device="cpu")
    texts = TEXTS[:3] + [LONG]
    for kw, body in (({}, {}), ({"prompt_name": "doc"}, {"prompt_name": "doc"})):
        want = model.encode(texts, **kw)
        st, got = post(srv.url, "/embed", {"inputs": texts, "truncate": True, **body})
        cos = (unit_rows(want) * unit_rows(got)).sum(1)
        assert st == 200 and cos.min() >= 0.9999, (kw, cos)


def unit_rows(a):
    a = np.asarray(a, dtype=np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)
