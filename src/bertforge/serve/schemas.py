"""What the HTTP API takes and gives: the checks of a request's JSON body, each failing with one
:class:`HTTPError` (422 ``validation`` or 413 ``payload_too_large``), and the encoding of answers.

The routes (:mod:`~bertforge.serve.routes`) call these before any model runs, so a malformed request costs
no tokenization and no forward pass.
"""
from __future__ import annotations

import json

import numpy as np

#: longest sliding-window input of /ner and /qa, in windows per text
MAX_WINDOWS = 64


class HTTPError(Exception):
    """An error answer: ``status`` and the body ``{"error": message, "error_type": kind}``."""

    def __init__(self, status: int, message: str, kind: str):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def invalid(message: str) -> HTTPError:
    """A 422 ``validation`` error."""
    return HTTPError(422, message, "validation")


def too_many(message: str) -> HTTPError:
    """A 413 ``payload_too_large`` error."""
    return HTTPError(413, message, "payload_too_large")


# ---------------------------------------------------------------------------------------------- answers
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


def dumps(obj) -> str:
    """``obj`` as compact JSON (a :class:`RawJSON` as it is). Raises ValueError on NaN/inf."""
    return obj if isinstance(obj, RawJSON) else json.dumps(obj, separators=(",", ":"), allow_nan=False)


# ---------------------------------------------------------------------------------------------- input checks
def text_list(body: dict, key: str, limit: int, allow_single: bool = True) -> tuple:
    """``body[key]``: a string or a list of strings → (texts, was a single string). Raises 422 / 413."""
    if key not in body:
        raise invalid(f"the body has no {key!r} field; send {{\"{key}\": \"text\"}} or a list of texts")
    v = body[key]
    single = isinstance(v, str)
    if single and allow_single:
        v = [v]
    if not isinstance(v, list):
        raise invalid(f"{key!r} is a JSON {type(v).__name__}; send a string or a list of strings")
    if not v:
        raise invalid(f"{key!r} is an empty list; send at least one text")
    if len(v) > limit:
        raise too_many(f"{key!r} holds {len(v)} inputs, more than the {limit} allowed per request "
                       f"(--max-client-batch-size); split it")
    for i, t in enumerate(v):
        check_text(t, f"{key}[{i}]" if not single else key)
    return v, single


def check_text(t, where: str) -> str:
    """``t`` itself: a non-empty string of valid UTF-8. Raises 422 naming ``where``."""
    if not isinstance(t, str):
        raise invalid(f"{where} is a JSON {type(t).__name__}; send a string")
    if not t.strip():
        raise invalid(f"{where} is empty; send some text")
    try:
        t.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(f"{where} is not valid UTF-8 (a lone surrogate); send valid text") from None
    return t


def flag(body: dict, key: str, default: bool) -> bool:
    """``body[key]``: true / false (absent or null: ``default``). Raises 422."""
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid(f"{key!r} is {json.dumps(v)[:20]}; send true or false")
    return v


def predict_inputs(v, limit: int) -> tuple:
    """TEI's ``/predict`` inputs: a string, a pair ``[a, b]``, or a list of strings / ``[a]`` / ``[a, b]`` →
    ([(a, b or None)], was one input). Raises 422 / 413."""
    def seq(x, where):
        if isinstance(x, str):
            return check_text(x, where), None
        if isinstance(x, list) and len(x) in (1, 2) and all(isinstance(s, str) for s in x):
            return check_text(x[0], where), (check_text(x[1], where) if len(x) == 2 else None)
        raise invalid(f"{where} is {json.dumps(x)[:40]}; send a text or a pair [text, text]")
    if isinstance(v, str) or (isinstance(v, list) and len(v) == 2 and all(isinstance(s, str) for s in v)):
        return [seq(v, "inputs")], True
    if not isinstance(v, list):
        raise invalid(f"'inputs' is a JSON {type(v).__name__}; send a text, a pair or a list of them")
    if not v:
        raise invalid("'inputs' is an empty list; send at least one text")
    if len(v) > limit:
        raise too_many(f"'inputs' holds {len(v)} inputs, more than the {limit} allowed per request "
                       f"(--max-client-batch-size); split it")
    return [seq(x, f"inputs[{i}]") for i, x in enumerate(v)], False


def qa_inputs(body: dict, limit: int) -> tuple:
    """``/qa``'s body: ``{"question", "context"}``, or ``{"inputs": [{"question", "context"}, …]}`` (a single
    object there too) → ([{"question", "context"}], was one question). Raises 422 / 413."""
    if "inputs" in body:
        items, single = body["inputs"], False
        if isinstance(items, dict):
            items, single = [items], True
        if not isinstance(items, list) or not items:
            raise invalid("'inputs' must be a non-empty list of {\"question\", \"context\"} objects")
        if len(items) > limit:
            raise too_many(f"'inputs' holds {len(items)} questions, more than the {limit} allowed per request; "
                           f"split it")
    else:
        items, single = [body], True
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise invalid(f"inputs[{i}] is a JSON {type(it).__name__}; send {{\"question\", \"context\"}}")
        for k in ("question", "context"):
            if k not in it:
                raise invalid(f"the body has no {k!r} field; send {{\"question\": \"...\", \"context\": \"...\"}}")
            check_text(it[k], k)
        out.append({"question": it["question"], "context": it["context"]})
    return out, single


def check_windows(encoded, n_inputs: int, what: str) -> None:
    """413 when one input of ``encoded`` (task windows with ``example_index``) needs more than
    :data:`MAX_WINDOWS` windows; ``what`` words it, with ``{n}`` for the count."""
    per_input = np.bincount([w["example_index"] for w in encoded], minlength=n_inputs)
    if per_input.max() > MAX_WINDOWS:
        raise too_many(f"{what.format(n=int(per_input.max()))}, more than {MAX_WINDOWS}; split it")


__all__ = ["HTTPError", "invalid", "too_many", "RawJSON", "vectors_json", "dumps", "text_list", "check_text",
           "flag", "predict_inputs", "qa_inputs", "check_windows", "MAX_WINDOWS"]
