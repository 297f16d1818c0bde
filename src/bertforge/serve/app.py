"""The HTTP API of ``bertforge serve``: an ASGI app (Starlette) over the models' batch workers.

Routes (JSON in and out; docs/serve.md has a curl example of each):

* text-embeddings-inference compatible: ``POST /embed``, ``POST /predict``, ``POST /rerank``,
  ``POST /tokenize``;
* OpenAI compatible: ``POST /v1/embeddings``;
* beyond TEI: ``POST /ner`` (entities with character offsets), ``POST /qa`` (answer span with character
  offsets);
* ``GET /health``, ``GET /info``, ``GET /metrics`` (Prometheus text).

Every POST body may name a model (``"model": NAME``); without it the first served model that answers the
route does. Errors are ``{"error": "...", "error_type": "..."}`` with the status text-embeddings-inference
documents: 401 ``unauthorized`` (``api_key`` set, bearer token missing or wrong; compared in constant time),
413 ``payload_too_large`` (more than ``max_client_batch_size`` inputs, a body over ``payload_limit`` bytes),
422 ``validation`` (malformed JSON, invalid UTF-8, wrong types, empty text, too long without truncation,
an unknown model or one that does not answer the route), 429 ``overloaded`` (``max_concurrent_requests``
requests already in flight), 500 ``backend`` (the model failed), 404 / 405 for an unknown path / method.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Optional

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import BertforgeError
from .batching import ModelWorker
from .metrics import ServerMetrics
from .models import InputError, ServedModel, load_model

#: the defaults of :func:`build_app` (and the ``bertforge serve`` flags)
LIMITS = {"max_batch_tokens": 16384, "max_batch_requests": 32, "max_wait_ms": 0.0,
          "max_concurrent_requests": 512, "max_client_batch_size": 32, "payload_limit": 2_000_000,
          "auto_truncate": False, "api_key": None}

#: routes that need no bearer token (load balancers' probes)
OPEN_PATHS = ("/health",)

#: longest sliding-window input of /ner and /qa, in windows per text
MAX_WINDOWS = 64

_WORD = re.compile(r"\w+|[^\w\s]")


class HTTPError(Exception):
    """An error answer: ``status`` and the body ``{"error": message, "error_type": kind}``."""

    def __init__(self, status: int, message: str, kind: str):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _json(obj, status: int = 200) -> Response:
    body = obj if isinstance(obj, RawJSON) else json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return Response(body.encode(), status, media_type="application/json")


class RawJSON(str):
    """A JSON text already encoded (embedding vectors, written by :func:`vectors_json`)."""


def vectors_json(vecs: np.ndarray) -> list:
    """(N, H) float32 vectors → per row its JSON array text, every float with 9 significant digits (the
    float32 value exactly; ~3× faster than ``json.dumps`` of Python floats). Raises ValueError on NaN/inf."""
    vecs = np.asarray(vecs, dtype=np.float32)
    if not np.isfinite(vecs).all():
        raise ValueError("the model gave a non-finite embedding")
    fmt = "[" + ",".join(["%.9g"] * vecs.shape[1]) + "]"
    return [fmt % tuple(r) for r in vecs.tolist()]


def _error(status: int, message: str, kind: str) -> Response:
    return _json({"error": message, "error_type": kind}, status)


def _invalid(message: str) -> HTTPError:
    return HTTPError(422, message, "validation")


# ---------------------------------------------------------------------------------------------- input checks
def _text_list(body: dict, key: str, limit: int, allow_single: bool = True) -> tuple:
    """``body[key]``: a string or a list of strings → (texts, was a single string). Raises 422 / 413."""
    if key not in body:
        raise _invalid(f"the body has no {key!r} field; send {{\"{key}\": \"text\"}} or a list of texts")
    v = body[key]
    single = isinstance(v, str)
    if single and allow_single:
        v = [v]
    if not isinstance(v, list):
        raise _invalid(f"{key!r} is a JSON {type(v).__name__}; send a string or a list of strings")
    if not v:
        raise _invalid(f"{key!r} is an empty list; send at least one text")
    if len(v) > limit:
        raise HTTPError(413, f"{key!r} holds {len(v)} inputs, more than the {limit} allowed per request "
                             f"(--max-client-batch-size); split it", "payload_too_large")
    for i, t in enumerate(v):
        _check_text(t, f"{key}[{i}]" if not single else key)
    return v, single


def _check_text(t, where: str) -> str:
    if not isinstance(t, str):
        raise _invalid(f"{where} is a JSON {type(t).__name__}; send a string")
    if not t.strip():
        raise _invalid(f"{where} is empty; send some text")
    try:
        t.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(f"{where} is not valid UTF-8 (a lone surrogate); send valid text") from None
    return t


def _flag(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _invalid(f"{key!r} is {json.dumps(v)[:20]}; send true or false")
    return v


class ServerState:
    """What the routes share: models, their workers, limits, metrics, the in-flight count."""

    def __init__(self, models: dict, limits: dict, executors: Optional[dict] = None):
        self.models = models
        self.limits = limits
        self.metrics = ServerMetrics()
        for name in models:
            self.metrics.register_model(name)
        self.workers = {name: ModelWorker(m, limits["max_batch_tokens"], limits["max_batch_requests"],
                                          limits["max_wait_ms"], self.metrics, self.arriving,
                                          (executors or {}).get(name))
                        for name, m in models.items()}
        self.in_flight = 0
        self.ready = False
        self.started = time.time()

    def arriving(self) -> bool:
        """Whether a request in flight has not queued its items yet (it is being read or tokenized): only
        then can a batch gain by waiting (see :mod:`bertforge.serve.batching`)."""
        return self.in_flight > sum(w.inside for w in self.workers.values())

    def model_for(self, body: dict, route: str) -> ServedModel:
        """The model a request names (``"model"``) or, without a name, the first that answers ``route``."""
        name = body.get("model")
        if name is not None:
            if not isinstance(name, str) or name not in self.models:
                raise _invalid(f"model {json.dumps(name)[:60]} is not served here; choose one of "
                               f"{', '.join(self.models)}")
            m = self.models[name]
            if route not in m.routes or (route == "embed" and not m.can_embed):
                raise _invalid(f"model {name!r} is a {m.kind} model and does not answer /{route}; it answers "
                               f"{', '.join('/' + r for r in m.routes)}")
            return m
        for m in self.models.values():
            if route in m.routes and (route != "embed" or m.can_embed):
                return m
        need = {"ner": "a token-classification", "qa": "a question-answering",
                "predict": "a sequence-classification"}.get(route, "an embedding")
        raise _invalid(f"no served model answers /{route}; serve {need} model dir")

    async def run(self, model: ServedModel, seqs: list, kind: str) -> list:
        try:
            return await self.workers[model.name].run_items(seqs, kind)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise HTTPError(500, f"model {model.name!r} failed: {type(e).__name__}: {str(e)[:200]}",
                            "backend") from None


#: above this many characters in one request, tokenization leaves the event loop (a thread of its own)
INLINE_CHARS = 20_000
#: that thread: one, for every app of the process (one malloc arena; big inputs wait for each other)
_BIG = ThreadPoolExecutor(1, thread_name_prefix="bertforge-tokenize")


def _encode_big(model: ServedModel, texts: list, truncate: bool, pairs) -> list:
    from ..engine.kernels.allocator import trim
    try:
        out, err = model.encode(texts, truncate, pairs), None
    except InputError as e:
        out, err = None, str(e)
    # only here, after the except block, are the exception's frames — and the huge input's token buffers
    # they hold — gone: now their freed pages can go back to the system (a flat RSS)
    trim()
    if err is not None:
        raise InputError(err)
    return out


async def _encode(model: ServedModel, texts: list, truncate: bool, pairs=None) -> list:
    try:
        if sum(map(len, texts)) + sum(len(p) for p in pairs or () if p) > INLINE_CHARS:
            return await asyncio.get_running_loop().run_in_executor(_BIG, _encode_big, model, texts, truncate,
                                                                    pairs)
        return model.encode(texts, truncate, pairs)
    except InputError as e:
        raise _invalid(str(e)) from None


# ---------------------------------------------------------------------------------------------- routes
async def _embed_texts(st: ServerState, model: ServedModel, texts: list, truncate: bool,
                       normalize: bool) -> tuple:
    seqs = await _encode(model, texts, truncate)
    vecs = np.stack(await st.run(model, seqs, "embed")).astype(np.float32)
    if normalize:
        vecs = vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
    return vecs, sum(len(s.ids) for s in seqs)


async def embed(st: ServerState, body: dict):
    texts, _ = _text_list(body, "inputs", st.limits["max_client_batch_size"])
    model = st.model_for(body, "embed")
    vecs, _ = await _embed_texts(st, model, texts, _flag(body, "truncate", st.limits["auto_truncate"]),
                                 _flag(body, "normalize", True))
    return RawJSON("[" + ",".join(vectors_json(vecs)) + "]")


async def openai_embeddings(st: ServerState, body: dict):
    texts, _ = _text_list(body, "input", st.limits["max_client_batch_size"])
    model = st.model_for(body, "embed")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64", None):
        raise _invalid(f"encoding_format {json.dumps(fmt)[:20]}; choose float or base64")
    vecs, n_tokens = await _embed_texts(st, model, texts, _flag(body, "truncate", st.limits["auto_truncate"]),
                                        True)
    dims = body.get("dimensions")
    if dims is not None:
        if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= vecs.shape[1]:
            raise _invalid(f"dimensions {json.dumps(dims)[:20]}; send an integer from 1 to {vecs.shape[1]}")
        vecs = vecs[:, :dims]
        vecs = vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
    if fmt == "base64":
        data = [json.dumps(base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")) for v in vecs]
    else:
        data = vectors_json(vecs)
    items = ",".join(f'{{"object":"embedding","index":{i},"embedding":{e}}}' for i, e in enumerate(data))
    return RawJSON(f'{{"object":"list","model":{json.dumps(model.name)},"data":[{items}],'
                   f'"usage":{{"prompt_tokens":{n_tokens},"total_tokens":{n_tokens}}}}}')


def _predict_inputs(v, limit: int) -> tuple:
    """TEI's ``/predict`` inputs: a string, a pair ``[a, b]``, or a list of strings / ``[a]`` / ``[a, b]`` →
    ([(a, b or None)], was one input)."""
    def seq(x, where):
        if isinstance(x, str):
            return _check_text(x, where), None
        if isinstance(x, list) and len(x) in (1, 2) and all(isinstance(s, str) for s in x):
            return _check_text(x[0], where), (_check_text(x[1], where) if len(x) == 2 else None)
        raise _invalid(f"{where} is {json.dumps(x)[:40]}; send a text or a pair [text, text]")
    if isinstance(v, str) or (isinstance(v, list) and len(v) == 2 and all(isinstance(s, str) for s in v)):
        return [seq(v, "inputs")], True
    if not isinstance(v, list):
        raise _invalid(f"'inputs' is a JSON {type(v).__name__}; send a text, a pair or a list of them")
    if not v:
        raise _invalid("'inputs' is an empty list; send at least one text")
    if len(v) > limit:
        raise HTTPError(413, f"'inputs' holds {len(v)} inputs, more than the {limit} allowed per request "
                             f"(--max-client-batch-size); split it", "payload_too_large")
    return [seq(x, f"inputs[{i}]") for i, x in enumerate(v)], False


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _multi_label_thresholds(model):
    """(C,) thresholds of a multi-label classifier (``problem_type`` in its config.json; those saved in
    ``bertforge.thresholds``, else 0.5), None for any other model."""
    cfg = model.runner.config or {}
    if cfg.get("problem_type") != "multi_label_classification":
        return None
    from ..tasks.multilabel import active_thresholds
    return active_thresholds((cfg.get("bertforge") or {}).get("thresholds"), len(model.labels))


async def predict(st: ServerState, body: dict):
    if "inputs" not in body:
        raise _invalid("the body has no 'inputs' field; send {\"inputs\": \"text\"}")
    seqs_in, single = _predict_inputs(body["inputs"], st.limits["max_client_batch_size"])
    model = st.model_for(body, "predict")
    raw = _flag(body, "raw_scores", False)
    seqs = await _encode(model, [a for a, _ in seqs_in], _flag(body, "truncate", st.limits["auto_truncate"]),
                   [b for _, b in seqs_in])
    out = []
    th = _multi_label_thresholds(model)
    for z in await st.run(model, seqs, "logits"):
        z = np.asarray(z, dtype=np.float64)
        if model.kind == "regression":
            out.append([{"label": model.labels[0], "score": float(z[0])}])
            continue
        if th is not None:  # multi-label: independent sigmoids, each label against its saved threshold
            p = 1.0 / (1.0 + np.exp(-z))
            order = np.argsort(-p, kind="stable")
            out.append([{"label": model.labels[i], "score": float(z[i] if raw else p[i]),
                         "predicted": bool(p[i] >= th[i])} for i in order])
            continue
        s = z if raw else _softmax(z)
        order = np.argsort(-s, kind="stable")
        out.append([{"label": model.labels[i], "score": float(s[i])} for i in order])
    return out[0] if single else out


async def rerank(st: ServerState, body: dict):
    if "query" not in body:
        raise _invalid("the body has no 'query' field; send {\"query\": \"...\", \"texts\": [...]}")
    query = _check_text(body["query"], "query")
    texts, _ = _text_list(body, "texts", st.limits["max_client_batch_size"], allow_single=False)
    model = st.model_for(body, "rerank")
    truncate = _flag(body, "truncate", st.limits["auto_truncate"])
    raw = _flag(body, "raw_scores", False)
    if model.kind in ("classification", "regression"):
        if len(model.labels or ()) != 1:
            raise _invalid(f"model {model.name!r} is a {len(model.labels)}-label classifier; /rerank needs a "
                           f"one-output cross-encoder (scores) or an embedding model (cosine)")
        seqs = await _encode(model, [query] * len(texts), truncate, texts)
        z = [float(np.asarray(x).reshape(-1)[0]) for x in await st.run(model, seqs, "logits")]
        scores = z if raw else [_sigmoid(x) for x in z]
    else:
        vecs, _ = await _embed_texts(st, model, [query] + texts, truncate, True)
        scores = [float(x) for x in vecs[1:] @ vecs[0]]
    ret_text = _flag(body, "return_text", False)
    order = sorted(range(len(texts)), key=lambda i: -scores[i])
    return [{"index": i, "score": scores[i], **({"text": texts[i]} if ret_text else {})} for i in order]


async def tokenize(st: ServerState, body: dict):
    texts, _ = _text_list(body, "inputs", st.limits["max_client_batch_size"])
    model = st.model_for(body, "tokenize")
    return model.tokens(texts, _flag(body, "add_special_tokens", True))


async def ner(st: ServerState, body: dict):
    from ..data.conll import TokenExample, encode_token_windows, words_from_windows
    from ..tasks.ner import entity_spans, word_tags_from_scores
    from .models import Encoded
    texts, single = _text_list(body, "inputs", st.limits["max_client_batch_size"])
    model = st.model_for(body, "ner")
    words = [[(m.group(), m.start(), m.end()) for m in _WORD.finditer(t)] for t in texts]
    with model.lock:
        windows = encode_token_windows(model.tokenizer, [TokenExample([w for w, _, _ in ws]) for ws in words],
                                       model.max_length)
    per_text = np.bincount([w["example_index"] for w in windows], minlength=len(texts))
    if per_text.max() > MAX_WINDOWS:
        raise HTTPError(413, f"a text needs {int(per_text.max())} windows of {model.max_length} tokens, more "
                             f"than {MAX_WINDOWS}; split it", "payload_too_large")
    logits = await st.run(model, [Encoded(w["input_ids"], w["token_type_ids"]) for w in windows], "token_logits")
    per_word = words_from_windows(windows, logits, [len(ws) for ws in words])
    id2 = dict(enumerate(model.labels))
    out = []
    for text, ws, scores in zip(texts, words, per_word):
        tags = word_tags_from_scores(scores, id2)
        ents = []
        for typ, a, b in entity_spans(tags):
            probs = [float(_softmax(np.asarray(scores[k], np.float64))[model.labels.index(tags[k])])
                     for k in range(a, b + 1) if scores[k] is not None]
            s, e = ws[a][1], ws[b][2]
            ents.append({"label": typ, "text": text[s:e], "start": s, "end": e,
                         "score": float(np.mean(probs)) if probs else 0.0})
        out.append(ents)
    return out[0] if single else out


async def qa(st: ServerState, body: dict):
    from ..data.squad import QAExample, decode_answers, encode_qa_windows
    from ..errors import DataError
    from ..tasks import adapter_for, get_task
    from .models import Encoded
    if "inputs" in body:
        items, single = body["inputs"], False
        if isinstance(items, dict):
            items, single = [items], True
        if not isinstance(items, list) or not items:
            raise _invalid("'inputs' must be a non-empty list of {\"question\", \"context\"} objects")
        if len(items) > st.limits["max_client_batch_size"]:
            raise HTTPError(413, f"'inputs' holds {len(items)} questions, more than the "
                                 f"{st.limits['max_client_batch_size']} allowed per request; split it",
                            "payload_too_large")
    else:
        items, single = [body], True
    examples = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise _invalid(f"inputs[{i}] is a JSON {type(it).__name__}; send {{\"question\", \"context\"}}")
        for k in ("question", "context"):
            if k not in it:
                raise _invalid(f"the body has no {k!r} field; send {{\"question\": \"...\", \"context\": \"...\"}}")
            _check_text(it[k], k)
        examples.append(QAExample(str(i), it["question"], it["context"]))
    model = st.model_for(body, "qa")
    task = get_task("squad_v2" if model.task == "squad_v2" else "squad")
    meta = model.runner.config.get("bertforge") or {}
    seq_len = min(int(meta.get("max_seq_len") or 384), model.max_length)
    adapter = adapter_for(task, model.tokenizer, seq_len)
    try:
        with model.lock:
            windows = encode_qa_windows(model.tokenizer, examples, seq_len, adapter._stride(),
                                        adapter.max_query_len, with_labels=False)
    except DataError as e:
        raise _invalid(str(e)) from None
    per_ex = np.bincount([w["example_index"] for w in windows], minlength=len(examples))
    if per_ex.max() > MAX_WINDOWS:
        raise HTTPError(413, f"a context needs {int(per_ex.max())} windows, more than {MAX_WINDOWS}; split it",
                        "payload_too_large")
    z = await st.run(model, [Encoded(w["input_ids"], w["token_type_ids"]) for w in windows], "qa_logits")
    answers = decode_answers(examples, windows, [a[0] for a in z], [a[1] for a in z], adapter.n_best,
                             adapter.max_answer_len, adapter.version_2, adapter.null_threshold)
    out = [{"answer": a["answer"], "start": a["start"],
            "end": a["start"] + len(a["answer"]) if a["start"] >= 0 else -1, "score": a["score"]}
           for a in answers]
    return out[0] if single else out


POST_ROUTES = {"/embed": embed, "/predict": predict, "/rerank": rerank, "/tokenize": tokenize,
               "/v1/embeddings": openai_embeddings, "/ner": ner, "/qa": qa}
GET_ROUTES = ("/health", "/info", "/metrics")


# ---------------------------------------------------------------------------------------------- plumbing
class _ClientGone(Exception):
    """The client closed the connection before its request body arrived."""


async def _receive_body(scope, receive, limit: int) -> bytes:
    """The request body, read straight from the ASGI ``receive`` channel. Raises 413 (over ``limit``
    bytes, by ``content-length`` before reading or by the bytes read), :class:`_ClientGone`."""
    for k, v in scope["headers"]:
        if k == b"content-length":
            if v.isdigit() and int(v) > limit:
                raise HTTPError(413, f"the body has {int(v)} bytes, more than the {limit} allowed "
                                     f"(--payload-limit)", "payload_too_large")
            break
    chunks, n = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = msg.get("body", b"")
        if chunk:
            n += len(chunk)
            if n > limit:
                raise HTTPError(413, f"the body has more than the {limit} bytes allowed (--payload-limit)",
                                "payload_too_large")
            chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_JSON_HEADERS = (b"content-type", b"application/json")


async def _send_json(send, status: int, obj) -> None:
    body = (obj if isinstance(obj, RawJSON) else json.dumps(obj, separators=(",", ":"), allow_nan=False)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [_JSON_HEADERS, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _post_endpoint(st: ServerState, fn):
    """The ASGI app of one POST route: body → JSON → ``fn(st, body)`` → JSON answer, or the error answer.
    Raw ASGI (no Request / Response objects): this is the per-request hot path."""
    limit = st.limits["payload_limit"]

    async def answer(scope, receive) -> tuple:
        try:
            raw = await _receive_body(scope, receive, limit)
            try:
                body = json.loads(raw)
            except UnicodeDecodeError:
                raise _invalid("the body is not valid UTF-8; send UTF-8 JSON") from None
            except ValueError as e:
                raise _invalid(f"the body is not valid JSON ({str(e)[:80]}); send a JSON object") from None
            if not isinstance(body, dict):
                raise _invalid(f"the body is a JSON {type(body).__name__}; send a JSON object")
            return 200, await fn(st, body)
        except HTTPError as e:
            return e.status, {"error": e.message, "error_type": e.kind}
        except UnicodeError:
            return 422, {"error": "the input is not valid UTF-8; send valid text", "error_type": "validation"}
        except BertforgeError as e:  # a library check on the input (e.g. a QA question too long)
            return 422, {"error": " ".join(str(e).split()), "error_type": "validation"}

    async def endpoint(scope, receive, send) -> None:
        try:
            status, obj = await answer(scope, receive)
        except _ClientGone:
            return
        except Exception as e:  # a real failure: logged, answered 500
            import logging
            logging.getLogger("bertforge.serve").exception("%s failed", scope["path"])
            status, obj = 500, {"error": f"{type(e).__name__}: {str(e)[:200]}", "error_type": "backend"}
        try:
            await _send_json(send, status, obj)
        except ValueError as e:  # NaN / inf in an answer (allow_nan=False): a backend failure
            await _send_json(send, 500, {"error": f"ValueError: {str(e)[:200]}", "error_type": "backend"})
    return endpoint


class _Gate:
    """The outer ASGI layer: bearer-token check, the in-flight limit, request metrics."""

    def __init__(self, app, st: ServerState):
        self.app, self.st = app, st
        self.post = {p: _post_endpoint(st, fn) for p, fn in POST_ROUTES.items()}
        key = st.limits.get("api_key")
        self.key = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        st = self.st
        path = scope["path"]
        route = path if path in POST_ROUTES or path in GET_ROUTES else "other"
        t0 = time.perf_counter()
        status = [499]  # a client that left before the answer

        async def send_wrapped(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        counted = False
        try:
            if self.key is not None and path not in OPEN_PATHS:
                given = dict(scope["headers"]).get(b"authorization", b"")
                if not hmac.compare_digest(given, self.key):
                    return await _error(401, "missing or wrong bearer token; send 'Authorization: Bearer <key>'",
                                        "unauthorized")(scope, receive, send_wrapped)
            if scope["method"] == "POST" and path in POST_ROUTES:
                if st.in_flight >= st.limits["max_concurrent_requests"]:
                    return await _error(429, f"{st.in_flight} requests are in flight, the most this server "
                                             f"takes (--max-concurrent-requests); retry later",
                                        "overloaded")(scope, receive, send_wrapped)
                st.in_flight += 1
                counted = True
                st.metrics.in_flight.set(st.in_flight)
                return await self.post[path](scope, receive, send_wrapped)
            await self.app(scope, receive, send_wrapped)
        finally:
            if counted:
                st.in_flight -= 1
                st.metrics.in_flight.set(st.in_flight)
            st.metrics.observe_request(route, status[0], time.perf_counter() - t0)


def build_app(models: dict, **limits):
    """The ASGI app serving ``models``.

    Args:
        models: ``{name: dir}`` (a checkpoint dir, an ``export`` / ``quantize`` dir, an ``.onnx`` file or
            ``minilm``), or ``{name: ServedModel}`` already loaded. Loaded (and warmed) here, before the app
            exists, so a bad dir fails before anything listens.
        **limits: ``max_batch_tokens`` (16384; padded tokens per forward pass), ``max_batch_requests`` (32;
            sequences per forward pass), ``max_wait_ms`` (0; how long a batch waits to fill),
            ``max_concurrent_requests`` (512; more → 429), ``max_client_batch_size`` (32; inputs per request,
            more → 413), ``payload_limit`` (2 000 000 bytes; bigger body → 413), ``auto_truncate`` (False;
            the default of a request's ``truncate``), ``api_key`` (None; else every route but /health needs
            ``Authorization: Bearer <key>``), and for loading: ``backend`` (``auto``), ``threads`` (None).
    Returns:
        the app (``app.state.server`` is the :class:`ServerState`). Its lifespan starts the batch schedulers
        and, at shutdown, finishes what is queued.
    Raises:
        CheckpointError / ConfigError: a model that cannot be served; a limit below 1.
    """
    from ..errors import ConfigError
    backend = limits.pop("backend", "auto")
    threads = limits.pop("threads", None)
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise ConfigError(f"unknown limit(s) {', '.join(sorted(unknown))}; choose from {', '.join(LIMITS)}")
    lim = {**LIMITS, **{k: v for k, v in limits.items() if v is not None}}
    for k in ("max_batch_tokens", "max_batch_requests", "max_concurrent_requests", "max_client_batch_size",
              "payload_limit"):
        if not isinstance(lim[k], int) or lim[k] < 1:
            raise ConfigError(f"--{k.replace('_', '-')} {lim[k]}: pass a whole number ≥ 1")
    if not (isinstance(lim["max_wait_ms"], (int, float)) and 0 <= lim["max_wait_ms"] < math.inf):
        raise ConfigError(f"--max-wait-ms {lim['max_wait_ms']}: pass a number of milliseconds ≥ 0")
    if not models:
        raise ConfigError("no model given; pass --model DIR (or NAME=DIR, several times)")
    # each model is loaded, warmed and run on one thread of its own: that thread is the only one that ever
    # runs its intra-op (OpenMP) parallel regions, so the process holds one thread team per model, as the
    # bare model in a script does; a second team on the same cores (e.g. the load's on the main thread)
    # makes libgomp's idle threads sleep after ~100 spins, and every parallel region of every forward pass
    # then pays a futex wake-up
    loaded, executors = {}, {}
    try:
        for name, m in models.items():
            if isinstance(m, ServedModel):
                loaded[name] = m
                continue
            ex = executors[name] = ThreadPoolExecutor(1, thread_name_prefix=f"bertforge-{name}")
            loaded[name] = ex.submit(load_model, name, m, backend, threads).result()
    except BaseException:
        for ex in executors.values():
            ex.shutdown(wait=False)
        raise
    st = ServerState(loaded, lim, executors)

    async def health(request: Request) -> Response:
        if not st.ready:
            return _error(503, "the models are not ready (starting or shutting down)", "unhealthy")
        return _json({"status": "ok", "models": list(st.models)})

    async def info(request: Request) -> Response:
        from .. import __version__
        return _json({"version": __version__, "models": [m.describe() for m in st.models.values()],
                      "limits": {k: v for k, v in lim.items() if k != "api_key"},
                      "auth": lim["api_key"] is not None, "uptime_s": round(time.time() - st.started, 3)})

    async def metrics(request: Request) -> Response:
        body, ctype = st.metrics.render()
        return Response(body, 200, headers={"Content-Type": ctype})

    @asynccontextmanager
    async def lifespan(app):
        for w in st.workers.values():
            w.start()
        st.ready = True
        try:
            yield
        finally:
            st.ready = False
            for w in st.workers.values():
                await w.stop()

    # POST routes are answered by _Gate's raw ASGI endpoints; Starlette's copies give 405 to other methods
    routes = [Route(p, _post_endpoint(st, fn), methods=["POST"]) for p, fn in POST_ROUTES.items()]
    routes += [Route("/health", health, methods=["GET"]), Route("/info", info, methods=["GET"]),
               Route("/metrics", metrics, methods=["GET"])]

    async def not_found(request, exc):
        code = getattr(exc, "status_code", 404)
        msg = "no such route; see GET /info and docs/serve.md" if code == 404 else \
            f"{request.method} is not allowed on {request.url.path}"
        return _error(code, msg, "not_found" if code == 404 else "method_not_allowed")

    inner = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app = _Gate(inner, st)
    app.state = inner.state
    inner.state.server = st
    return app


__all__ = ["build_app", "HTTPError", "ServerState", "LIMITS", "POST_ROUTES"]
