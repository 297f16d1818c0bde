"""The routes of the HTTP API: each takes the server's state and a request's JSON body and returns the answer
(JSON-ready, or :class:`~bertforge.serve.schemas.RawJSON`), or raises :class:`~bertforge.serve.schemas.HTTPError`.

A route checks the body (:mod:`~bertforge.serve.schemas`), picks the model, encodes the texts, runs them
through the model's batch worker and shapes the answer. Task routes encode and decode with the model's task
adapter (:func:`bertforge.tasks.adapter_for_model`: the same ``encode`` / ``decode`` that ``evaluate`` and
``predict`` use on files): ``/ner`` and ``/qa`` entirely, ``/predict`` for decoding (its tokenization is the
server's own, :meth:`~bertforge.serve.models.ServedModel.encode`: ``truncate`` per request, 422 when too long).
"""
from __future__ import annotations

import asyncio
import base64
import json
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import DataError
from .models import Encoded, InputError, ServedModel
from .schemas import (RawJSON, check_text, check_windows, flag, invalid, predict_inputs, qa_inputs, text_list,
                      vectors_json)


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
        raise invalid(str(e)) from None


# ---------------------------------------------------------------------------------------------- routes
async def _embed_texts(st, model: ServedModel, texts: list, truncate: bool,
                       normalize: bool) -> tuple:
    seqs = await _encode(model, texts, truncate)
    vecs = np.stack(await st.run(model, seqs, "embed")).astype(np.float32)
    if normalize:
        vecs = vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
    return vecs, sum(len(s.ids) for s in seqs)


async def embed(st, body: dict):
    texts, _ = text_list(body, "inputs", st.limits["max_client_batch_size"])
    model = st.model_for(body, "embed")
    vecs, _ = await _embed_texts(st, model, texts, flag(body, "truncate", st.limits["auto_truncate"]),
                                 flag(body, "normalize", True))
    return RawJSON("[" + ",".join(vectors_json(vecs)) + "]")


async def openai_embeddings(st, body: dict):
    texts, _ = text_list(body, "input", st.limits["max_client_batch_size"])
    model = st.model_for(body, "embed")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64", None):
        raise invalid(f"encoding_format {json.dumps(fmt)[:20]}; choose float or base64")
    vecs, n_tokens = await _embed_texts(st, model, texts, flag(body, "truncate", st.limits["auto_truncate"]),
                                        True)
    dims = body.get("dimensions")
    if dims is not None:
        if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= vecs.shape[1]:
            raise invalid(f"dimensions {json.dumps(dims)[:20]}; send an integer from 1 to {vecs.shape[1]}")
        vecs = vecs[:, :dims]
        vecs = vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
    if fmt == "base64":
        data = [json.dumps(base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")) for v in vecs]
    else:
        data = vectors_json(vecs)
    items = ",".join(f'{{"object":"embedding","index":{i},"embedding":{e}}}' for i, e in enumerate(data))
    return RawJSON(f'{{"object":"list","model":{json.dumps(model.name)},"data":[{items}],'
                   f'"usage":{{"prompt_tokens":{n_tokens},"total_tokens":{n_tokens}}}}}')


async def predict(st, body: dict):
    if "inputs" not in body:
        raise invalid("the body has no 'inputs' field; send {\"inputs\": \"text\"}")
    seqs_in, single = predict_inputs(body["inputs"], st.limits["max_client_batch_size"])
    model = st.model_for(body, "predict")
    raw = flag(body, "raw_scores", False)
    seqs = await _encode(model, [a for a, _ in seqs_in], flag(body, "truncate", st.limits["auto_truncate"]),
                         [b for _, b in seqs_in])
    # per input its labels ranked by score; a multi-label model's each with "predicted" (its saved threshold)
    out = model.adapter.decode(await st.run(model, seqs, "logits"), raw=raw)
    return out[0] if single else out


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


async def rerank(st, body: dict):
    if "query" not in body:
        raise invalid("the body has no 'query' field; send {\"query\": \"...\", \"texts\": [...]}")
    query = check_text(body["query"], "query")
    texts, _ = text_list(body, "texts", st.limits["max_client_batch_size"], allow_single=False)
    model = st.model_for(body, "rerank")
    truncate = flag(body, "truncate", st.limits["auto_truncate"])
    raw = flag(body, "raw_scores", False)
    if model.kind in ("classification", "regression"):
        if len(model.labels or ()) != 1:
            raise invalid(f"model {model.name!r} is a {len(model.labels)}-label classifier; /rerank needs a "
                           f"one-output cross-encoder (scores) or an embedding model (cosine)")
        seqs = await _encode(model, [query] * len(texts), truncate, texts)
        z = [float(np.asarray(x).reshape(-1)[0]) for x in await st.run(model, seqs, "logits")]
        scores = z if raw else [_sigmoid(x) for x in z]
    else:
        vecs, _ = await _embed_texts(st, model, [query] + texts, truncate, True)
        scores = [float(x) for x in vecs[1:] @ vecs[0]]
    ret_text = flag(body, "return_text", False)
    order = sorted(range(len(texts)), key=lambda i: -scores[i])
    return [{"index": i, "score": scores[i], **({"text": texts[i]} if ret_text else {})} for i in order]


async def tokenize(st, body: dict):
    texts, _ = text_list(body, "inputs", st.limits["max_client_batch_size"])
    model = st.model_for(body, "tokenize")
    return model.tokens(texts, flag(body, "add_special_tokens", True))


async def ner(st, body: dict):
    texts, single = text_list(body, "inputs", st.limits["max_client_batch_size"])
    model = st.model_for(body, "ner")
    adapter = model.adapter
    with model.lock:
        encoded = adapter.encode(texts)
    check_windows(encoded, len(texts), f"a text needs {{n}} windows of {model.max_length} tokens")
    logits = await st.run(model, [Encoded(w["input_ids"], w["token_type_ids"]) for w in encoded], "token_logits")
    out = [p["entities"] for p in adapter.decode(logits, encoded)]
    return out[0] if single else out


async def qa(st, body: dict):
    items, single = qa_inputs(body, st.limits["max_client_batch_size"])
    model = st.model_for(body, "qa")
    adapter = model.adapter
    try:
        with model.lock:  # QA windows set the tokenizer's truncation while they are cut
            encoded = adapter.encode(items)
    except DataError as e:
        raise invalid(str(e)) from None
    check_windows(encoded, len(items), "a context needs {n} windows")
    z = await st.run(model, [Encoded(w["input_ids"], w["token_type_ids"]) for w in encoded], "qa_logits")
    out = [{k: a[k] for k in ("answer", "start", "end", "score")} for a in adapter.decode(z, encoded)]
    return out[0] if single else out


POST_ROUTES = {"/embed": embed, "/predict": predict, "/rerank": rerank, "/tokenize": tokenize,
               "/v1/embeddings": openai_embeddings, "/ner": ner, "/qa": qa}


__all__ = ["POST_ROUTES", "embed", "openai_embeddings", "predict", "rerank", "tokenize", "ner", "qa",
           "INLINE_CHARS"]
