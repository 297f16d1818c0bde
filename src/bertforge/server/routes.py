"""The routes of the HTTP API: each takes the server's state and its request, validated
(:mod:`~bertforge.server.schemas`), and returns the answer (JSON-ready, or :class:`~bertforge.server.schemas.
RawJSON`), or raises :class:`~bertforge.server.schemas.HTTPError`.

A route picks the model, encodes the texts, runs them through the model's batch worker and shapes the answer,
with text-embeddings-inference's semantics for every field it documents (docs/serve.md has the table). Task
routes encode and decode with the model's task adapter (:func:`bertforge.tasks.adapter_for_model`: the same
``encode`` / ``decode`` that ``evaluate`` and ``predict`` use on files): ``/ner`` and ``/qa`` entirely,
``/predict`` for decoding (its tokenization is the server's own, :meth:`~bertforge.server.models.ServedModel.
encode`: ``truncate`` per request, 422 when too long).
"""
from __future__ import annotations

import asyncio
import base64
import json
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import DataError
from . import schemas as S
from .models import Encoded, InputError, ServedModel
from .schemas import MAX_WINDOWS, HTTPError, RawJSON, invalid, too_many, vectors_json

#: above this many characters in one request, tokenization leaves the event loop (a thread of its own)
INLINE_CHARS = 20_000
#: that thread: one, for every app of the process (one malloc arena; big inputs wait for each other)
_BIG = ThreadPoolExecutor(1, thread_name_prefix="bertforge-tokenize")


def _size(texts) -> int:
    return sum(len(t) if isinstance(t, (str, list)) else 0 for t in texts)


def _encode_big(model: ServedModel, texts: list, truncate: bool, pairs, direction: str, prompt: str,
                cut_at=None) -> list:
    from ..engine.kernels.allocator import trim
    try:
        out, err = model.encode(texts, truncate, pairs, direction, prompt, cut_at), None
    except InputError as e:
        out, err = None, str(e)
    # only here, after the except block, are the exception's frames — and the huge input's token buffers
    # they hold — gone: now their freed pages can go back to the system (a flat RSS)
    trim()
    if err is not None:
        raise InputError(err)
    return out


async def _encode(model: ServedModel, texts: list, truncate: bool, pairs=None, direction: str = "right",
                  prompt: str = "", cut_at=None) -> list:
    try:
        if _size(texts) + _size(p for p in pairs or () if p) > INLINE_CHARS:
            return await asyncio.get_running_loop().run_in_executor(_BIG, _encode_big, model, texts, truncate,
                                                                    pairs, direction, prompt, cut_at)
        return model.encode(texts, truncate, pairs, direction, prompt, cut_at)
    except InputError as e:
        raise invalid(str(e)) from None


def _batch(v, key: str, limit: int, single_if=lambda v: isinstance(v, str)) -> tuple:
    """A request's inputs as a list (413 above ``limit``) and whether it was one input."""
    single = single_if(v)
    items = [v] if single else list(v)
    if len(items) > limit:
        raise too_many(f"{key!r} holds {len(items)} inputs, more than the {limit} allowed per request "
                       f"(--max-client-batch-size); split it", key)
    return items, single


def _one_input(v) -> bool:
    """TEI's ``Input``: a text or one list of token ids is one input."""
    return isinstance(v, str) or (isinstance(v, list) and bool(v) and all(isinstance(x, int) for x in v))


def _prompt(model: ServedModel, name) -> str:
    try:
        return model.prompt(name)
    except InputError as e:
        raise invalid(str(e), "prompt_name", "unknown_prompt") from None


def _truncate(st, value) -> bool:
    return st.limits["auto_truncate"] if value is None else value


def _normalize(vecs: np.ndarray) -> np.ndarray:
    return vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)


# ---------------------------------------------------------------------------------------------- embeddings
async def _embed_texts(st, model: ServedModel, texts: list, truncate: bool, normalize: bool,
                       direction: str = "right", prompt: str = "", dimensions=None) -> tuple:
    """(N, d) vectors of ``texts`` (pooled as the dir declares, cut to its Matryoshka dim, then to
    ``dimensions``, then L2-normalised if ``normalize`` — TEI's order) and the tokens they took."""
    seqs = await _encode(model, texts, truncate, None, direction, prompt)
    vecs = np.stack(await st.run(model, seqs, "embed")).astype(np.float32)
    if dimensions is not None:
        if dimensions > vecs.shape[1]:
            raise invalid(f"dimensions {dimensions} is more than model {model.name!r} gives ({vecs.shape[1]}); "
                          f"send at most {vecs.shape[1]}", "dimensions", "too_large")
        vecs = vecs[:, :dimensions]
    if normalize:
        vecs = _normalize(vecs)
    return vecs, sum(len(s.ids) for s in seqs)


async def embed(st, req: S.EmbedRequest):
    texts, _ = _batch(req.inputs, "inputs", st.limits["max_client_batch_size"], _one_input)
    model = st.model_for(req.model, "embed")
    vecs, _ = await _embed_texts(st, model, texts, _truncate(st, req.truncate), req.normalize,
                                 req.truncation_direction, _prompt(model, req.prompt_name), req.dimensions)
    return RawJSON("[" + ",".join(vectors_json(vecs)) + "]")


async def embed_all(st, req: S.EmbedAllRequest):
    texts, _ = _batch(req.inputs, "inputs", st.limits["max_client_batch_size"], _one_input)
    model = st.model_for(req.model, "embed")
    seqs = await _encode(model, texts, _truncate(st, req.truncate), None, req.truncation_direction,
                         _prompt(model, req.prompt_name))
    states = await st.run(model, seqs, "hidden")
    return RawJSON("[" + ",".join("[" + ",".join(vectors_json(h)) + "]" for h in states) + "]")


async def embed_sparse(st, req: S.EmbedSparseRequest):
    model = st.model_for(req.model, "embed")
    raise invalid(f"model {model.name!r} has no SPLADE pooling, so it gives no sparse embeddings; POST /embed "
                  f"for its dense vectors", "inputs", "not_sparse")


async def openai_embeddings(st, req: S.OpenAIEmbeddingRequest):
    texts, _ = _batch(req.input, "input", st.limits["max_client_batch_size"], _one_input)
    model = st.model_for(req.model, "embed", openai=True)
    vecs, n_tokens = await _embed_texts(st, model, texts, _truncate(st, req.truncate), True,
                                        prompt=_prompt(model, None), dimensions=req.dimensions)
    if req.encoding_format == "base64":
        data = [json.dumps(base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")) for v in vecs]
    else:
        data = vectors_json(vecs)
    items = ",".join(f'{{"object":"embedding","index":{i},"embedding":{e}}}' for i, e in enumerate(data))
    return RawJSON(f'{{"object":"list","model":{json.dumps(model.name)},"data":[{items}],'
                   f'"usage":{{"prompt_tokens":{n_tokens},"total_tokens":{n_tokens}}}}}')


async def similarity(st, req: S.SimilarityRequest):
    p = req.parameters or S.SimilarityParameters()
    sents = req.inputs.sentences
    _batch(sents, "inputs.sentences", st.limits["max_client_batch_size"])
    model = st.model_for(req.model, "embed")
    vecs, _ = await _embed_texts(st, model, [req.inputs.source_sentence] + list(sents), _truncate(st, p.truncate),
                                 True, p.truncation_direction, _prompt(model, p.prompt_name))
    return [float(x) for x in vecs[1:] @ vecs[0]]


# ---------------------------------------------------------------------------------------------- task heads
async def predict(st, req: S.PredictRequest):
    v = req.inputs
    # "a", ["a"] or ["a", "b"]: one input (TEI); three or more bare texts: a batch of texts (bertforge's)
    one = isinstance(v, str) or (len(v) <= 2 and all(isinstance(x, str) for x in v))
    seqs_in, _ = _batch(v, "inputs", st.limits["max_client_batch_size"], lambda _: one)
    pairs_in = [(x, None) if isinstance(x, str) else (x[0], x[1] if len(x) == 2 else None) for x in seqs_in]
    model = st.model_for(req.model, "predict")
    seqs = await _encode(model, [a for a, _ in pairs_in], _truncate(st, req.truncate), [b for _, b in pairs_in],
                         req.truncation_direction, cut_at=model.task_length)  # read as `predict` reads it
    # per input its labels ranked by score; a multi-label model's each with "predicted" (its saved threshold)
    out = model.adapter.decode(await st.run(model, seqs, "logits"), raw=req.raw_scores)
    return out[0] if one else out


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


async def rerank(st, req: S.RerankRequest):
    texts, _ = _batch(req.texts, "texts", st.limits["max_client_batch_size"])
    model = st.model_for(req.model, "rerank")
    truncate, side = _truncate(st, req.truncate), req.truncation_direction
    if model.kind in ("classification", "regression"):
        if len(model.labels or ()) != 1:
            raise invalid(f"model {model.name!r} is a {len(model.labels)}-label classifier; /rerank needs a "
                          f"one-output cross-encoder (scores) or an embedding model (cosine)", "model")
        seqs = await _encode(model, [req.query] * len(texts), truncate, texts, side, cut_at=model.task_length)
        z = [float(np.asarray(x).reshape(-1)[0]) for x in await st.run(model, seqs, "logits")]
        scores = z if req.raw_scores else [_sigmoid(x) for x in z]
    else:  # an embedding model: the cosine of the dir's default-prompted vectors, as /embed gives them
        vecs, _ = await _embed_texts(st, model, [req.query] + texts, truncate, True, side, _prompt(model, None))
        scores = [float(x) for x in vecs[1:] @ vecs[0]]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[:req.top_n]
    return [{"index": i, "score": scores[i], **({"text": texts[i]} if req.return_text else {})} for i in order]


# ---------------------------------------------------------------------------------------------- tokenizer
async def tokenize(st, req: S.TokenizeRequest):
    texts, _ = _batch(req.inputs, "inputs", st.limits["max_client_batch_size"])
    model = st.model_for(req.model, "tokenize")
    return model.tokens(texts, req.add_special_tokens, _prompt(model, req.prompt_name))


async def decode(st, req: S.DecodeRequest):
    rows, _ = _batch(req.ids, "ids", st.limits["max_client_batch_size"],
                     lambda v: all(isinstance(x, int) for x in v))
    model = st.model_for(req.model, "tokenize")
    try:
        return model.decode(rows, req.skip_special_tokens)
    except InputError as e:
        raise invalid(str(e), "ids") from None


# ---------------------------------------------------------------------------------------------- ner, qa
def check_windows(encoded, n_inputs: int, what: str) -> None:
    """413 when one input of ``encoded`` (task windows with ``example_index``) needs more than
    :data:`~bertforge.server.schemas.MAX_WINDOWS` windows; ``what`` words it, with ``{n}`` for the count."""
    per_input = np.bincount([w["example_index"] for w in encoded], minlength=n_inputs)
    if per_input.max() > MAX_WINDOWS:
        raise too_many(f"{what.format(n=int(per_input.max()))}, more than {MAX_WINDOWS}; split it")


async def ner(st, req: S.NerRequest):
    texts, single = _batch(req.inputs, "inputs", st.limits["max_client_batch_size"])
    model = st.model_for(req.model, "ner")
    adapter = model.adapter
    with model.lock:
        encoded = adapter.encode(texts)
    length = model.task_length or model.max_length
    check_windows(encoded, len(texts), f"a text needs {{n}} windows of {length} tokens")
    logits = await st.run(model, [Encoded(w["input_ids"], w["token_type_ids"]) for w in encoded], "token_logits")
    out = [p["entities"] for p in adapter.decode(logits, encoded, aggregation=req.aggregation)]
    return out[0] if single else out


async def qa(st, req: S.QaRequest):
    if req.inputs is None:
        items, single = [S.QaItem(question=req.question, context=req.context)], True
    else:
        items, single = _batch(req.inputs, "inputs", st.limits["max_client_batch_size"],
                               lambda v: isinstance(v, S.QaItem))
    model = st.model_for(req.model, "qa")
    adapter = model.adapter
    try:
        with model.lock:  # QA windows set the tokenizer's truncation while they are cut
            encoded = adapter.encode([{"question": x.question, "context": x.context} for x in items])
    except DataError as e:
        raise invalid(str(e)) from None
    check_windows(encoded, len(items), "a context needs {n} windows")
    z = await st.run(model, [Encoded(w["input_ids"], w["token_type_ids"]) for w in encoded], "qa_logits")
    out = [{k: a[k] for k in ("answer", "start", "end", "score")} for a in adapter.decode(z, encoded)]
    return out[0] if single else out


#: every POST route: path → (route, request model, answer model, summary)
POST_ROUTES = {
    "/embed": (embed, S.EmbedRequest, S.Vectors, "Sentence embeddings (TEI)"),
    "/embed_all": (embed_all, S.EmbedAllRequest, S.TokenVectors, "Every token's last hidden state (TEI)"),
    "/embed_sparse": (embed_sparse, S.EmbedSparseRequest, S.SparseVectors,
                      "Sparse embeddings (TEI; SPLADE models only: none of bertforge's dirs, always 422)"),
    "/v1/embeddings": (openai_embeddings, S.OpenAIEmbeddingRequest, S.OpenAIEmbeddings, "Embeddings (OpenAI)"),
    "/similarity": (similarity, S.SimilarityRequest, S.Scores, "Cosine of a sentence with others (TEI)"),
    "/predict": (predict, S.PredictRequest, S.Predictions, "Sequence classification (TEI)"),
    "/rerank": (rerank, S.RerankRequest, S.Ranks, "Rank texts against a query (TEI)"),
    "/tokenize": (tokenize, S.TokenizeRequest, S.Tokens, "Tokens with byte offsets (TEI)"),
    "/decode": (decode, S.DecodeRequest, S.Texts, "Token ids to text (TEI)"),
    "/ner": (ner, S.NerRequest, S.Entities, "Named entities with character offsets (bertforge)"),
    "/qa": (qa, S.QaRequest, S.Answers, "Extractive question answering (bertforge)"),
}


__all__ = ["POST_ROUTES", "embed", "embed_all", "embed_sparse", "openai_embeddings", "similarity", "predict",
           "rerank", "tokenize", "decode", "ner", "qa", "check_windows", "INLINE_CHARS", "HTTPError"]
