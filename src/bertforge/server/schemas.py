"""What the HTTP API takes and gives: one pydantic model per request body (the fields of
text-embeddings-inference's and OpenAI's documented APIs, plus bertforge's ``model``), the models of the answers,
and the errors.

The same classes validate every request (:func:`parse`: strict types, unknown fields refused — 422 naming the
field) and describe it in ``GET /openapi.json`` (:mod:`~bertforge.server.openapi`), so the document and the
server cannot disagree. The routes (:mod:`~bertforge.server.routes`) call :func:`parse` before any model runs: a
malformed request costs no tokenization and no forward pass.
"""
from __future__ import annotations

import json
from typing import Annotated, Literal, Optional, Union

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, ValidationError, model_validator

#: longest sliding-window input of /ner and /qa, in windows per text
MAX_WINDOWS = 64


class HTTPError(Exception):
    """An error answer: ``status`` and the body ``{"error": message, "error_type": kind}`` (on ``/v1/*``:
    OpenAI's ``{"error": {"message", "type", "param", "code"}}``, ``param`` the field at fault)."""

    def __init__(self, status: int, message: str, kind: str, param: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code


def invalid(message: str, param: Optional[str] = None, code: Optional[str] = None) -> HTTPError:
    """A 422 ``validation`` error (``param``: the field at fault)."""
    return HTTPError(422, message, "validation", param, code)


def too_many(message: str, param: Optional[str] = None) -> HTTPError:
    """A 413 ``payload_too_large`` error."""
    return HTTPError(413, message, "payload_too_large", param)


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


# ---------------------------------------------------------------------------------------------- field types
def check_text(t: str) -> str:
    """``t`` itself: a string with some non-space character and no lone surrogate (valid UTF-8)."""
    if not t.strip():
        raise ValueError("the text is empty; send some text")
    try:
        t.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text is not valid UTF-8 (a lone surrogate); send valid text") from None
    return t


#: a non-empty text
Text = Annotated[str, AfterValidator(check_text)]
#: token ids as a tokenizer gives them (u32, as TEI takes them)
Ids = Annotated[list[Annotated[int, Field(ge=0, le=2**32 - 1)]], Field(min_length=1)]
#: TEI's ``Input``: a text, token ids, or a non-empty list of texts and token ids
Input = Union[Text, Ids, Annotated[list[Union[Text, Ids]], Field(min_length=1)]]
#: TEI's ``truncation_direction`` (it takes both spellings)
Direction = Literal["Left", "Right", "left", "right"]

PROMPT_NAME = ("The name of a prompt of the model dir (`prompts` of config_sentence_transformers.json), put "
               "before every text. Null: the dir's `default_prompt_name`, if any.")
TRUNCATE = "Cut inputs longer than the model takes (null: the server's --auto-truncate)."
DIRECTION = "Which end a truncated input loses (TEI: Left or Right)."
MODEL = "The served model to use (bertforge; TEI serves one). Absent: the first that answers the route."


class Body(BaseModel):
    """A request body: strict JSON types, no field beyond the documented ones."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: Optional[str] = Field(None, description=MODEL)


class EmbedRequest(Body):
    """``POST /embed`` (TEI)."""

    inputs: Input
    normalize: bool = Field(True, description="L2-normalise each vector (after the cut to `dimensions`).")
    truncate: Optional[bool] = Field(None, description=TRUNCATE)
    truncation_direction: Direction = Field("Right", description=DIRECTION)
    prompt_name: Optional[str] = Field(None, description=PROMPT_NAME)
    dimensions: Optional[Annotated[int, Field(ge=1)]] = Field(
        None, description="Keep the first `dimensions` coordinates (Matryoshka), then normalise if asked.")


class EmbedAllRequest(Body):
    """``POST /embed_all`` (TEI): every token's last hidden state."""

    inputs: Input
    truncate: Optional[bool] = Field(None, description=TRUNCATE)
    truncation_direction: Direction = Field("Right", description=DIRECTION)
    prompt_name: Optional[str] = Field(None, description=PROMPT_NAME)


class EmbedSparseRequest(EmbedAllRequest):
    """``POST /embed_sparse`` (TEI; SPLADE models only — none of bertforge's dirs is one: always 422)."""


class OpenAIEmbeddingRequest(Body):
    """``POST /v1/embeddings`` (OpenAI; TEI's fields)."""

    input: Input
    model: Optional[str] = Field(None, description="With one model served any name is taken (as TEI does); "
                                                   "with several, a served name (else 404 model_not_found).")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[Annotated[int, Field(ge=1)]] = Field(
        None, description="Keep the first `dimensions` coordinates (Matryoshka) and renormalise.")
    user: Optional[str] = Field(None, description="Accepted and ignored (as TEI does).")
    truncate: Optional[bool] = Field(None, description=TRUNCATE + " bertforge's; not in OpenAI's API.")


class PredictRequest(Body):
    """``POST /predict`` (TEI): a text, ``[a]`` or a pair ``[a, b]`` (one input), or a list of ``[a]`` / ``[a, b]``
    (bertforge also takes texts in that list, and three or more bare texts as a batch: TEI refuses both)."""

    inputs: Union[Text, Annotated[list[Text], Field(min_length=1, max_length=2)],
                  Annotated[list[Union[Text, Annotated[list[Text], Field(min_length=1, max_length=2)]]],
                            Field(min_length=1)]]
    raw_scores: bool = Field(False, description="The logits instead of softmax / sigmoid scores.")
    truncate: Optional[bool] = Field(None, description=TRUNCATE)
    truncation_direction: Direction = Field("Right", description=DIRECTION)


class RerankRequest(Body):
    """``POST /rerank`` (TEI)."""

    query: Text
    texts: Annotated[list[Text], Field(min_length=1)]
    raw_scores: bool = Field(False, description="A cross-encoder's logits instead of their sigmoid.")
    return_text: bool = Field(False, description="Give each text back in its rank.")
    truncate: Optional[bool] = Field(None, description=TRUNCATE)
    truncation_direction: Direction = Field("Right", description=DIRECTION)
    top_n: Optional[Annotated[int, Field(ge=1)]] = Field(
        None, description="Keep the best `top_n` (bertforge's; Cohere's and Jina's rerank field, not TEI's).")


class TokenizeRequest(Body):
    """``POST /tokenize`` (TEI)."""

    inputs: Union[Text, Annotated[list[Text], Field(min_length=1)]]
    add_special_tokens: bool = True
    prompt_name: Optional[str] = Field(None, description=PROMPT_NAME)


class DecodeRequest(Body):
    """``POST /decode`` (TEI)."""

    ids: Union[Ids, Annotated[list[Ids], Field(min_length=1)]]
    skip_special_tokens: bool = True


class SimilarityInput(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    source_sentence: Text
    sentences: Annotated[list[Text], Field(min_length=1)]


class SimilarityParameters(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    prompt_name: Optional[str] = Field(None, description=PROMPT_NAME)
    truncate: Optional[bool] = Field(None, description=TRUNCATE)
    truncation_direction: Direction = Field("Right", description=DIRECTION)


class SimilarityRequest(Body):
    """``POST /similarity`` (TEI): the cosine of ``source_sentence`` with each of ``sentences``."""

    inputs: SimilarityInput
    parameters: Optional[SimilarityParameters] = None


class NerRequest(Body):
    """``POST /ner`` (bertforge): ``inputs`` are cut into words at whitespace (the CoNLL words the model was
    trained on; send tokenised text); ``aggregation`` — how a word's tag comes from its subwords, as
    ``transformers``' ``aggregation_strategy``: ``first`` (its first subword's, the trained scheme), ``average``,
    ``max`` — defaults to what the model dir records (``first``)."""

    inputs: Union[Text, Annotated[list[Text], Field(min_length=1)]]
    aggregation: Optional[Literal["first", "average", "max"]] = None


class QaItem(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    question: Text
    context: Text


class QaRequest(Body):
    """``POST /qa`` (bertforge): ``question`` + ``context``, or ``inputs`` (one such object or a list)."""

    question: Optional[Text] = None
    context: Optional[Text] = None
    inputs: Optional[Union[QaItem, Annotated[list[QaItem], Field(min_length=1)]]] = None

    @model_validator(mode="after")
    def _one_form(self):
        if self.inputs is None and (self.question is None or self.context is None):
            raise ValueError("send {\"question\": \"...\", \"context\": \"...\"} or {\"inputs\": [...]}")
        if self.inputs is not None and (self.question is not None or self.context is not None):
            raise ValueError("send either question + context or inputs, not both")
        return self


# ---------------------------------------------------------------------------------------------- answers' models
class Vectors(RootModel[list[list[float]]]):
    """One vector per input."""


class TokenVectors(RootModel[list[list[list[float]]]]):
    """Per input, one vector per token."""


class SparseValue(BaseModel):
    index: int
    value: float


class SparseVectors(RootModel[list[list[SparseValue]]]):
    """Per input, its non-zero coordinates."""


class Prediction(BaseModel):
    label: str
    score: float
    predicted: Optional[bool] = Field(None, description="A multi-label model's decision at its threshold.")


class Predictions(RootModel[Union[list[Prediction], list[list[Prediction]]]]):
    """Per input (or for the one input), every label best first."""


class Rank(BaseModel):
    index: int
    score: float
    text: Optional[str] = None


class Ranks(RootModel[list[Rank]]):
    """The texts best first."""


class SimpleToken(BaseModel):
    id: int
    text: str = Field(description="The input's bytes from start to stop (a special token: its own string).")
    special: bool
    start: Optional[int] = Field(description="UTF-8 byte offset in the input (with its prompt), as TEI gives.")
    stop: Optional[int]


class Tokens(RootModel[list[list[SimpleToken]]]):
    """Per input, its tokens."""


class Texts(RootModel[list[str]]):
    """Per id list, its text."""


class Scores(RootModel[list[float]]):
    """One cosine per sentence."""


class Entity(BaseModel):
    label: str
    text: str
    start: int
    end: int
    score: float


class Entities(RootModel[Union[list[Entity], list[list[Entity]]]]):
    """Per text (or for the one text), its entities."""


class Answer(BaseModel):
    answer: str
    start: int
    end: int
    score: float


class Answers(RootModel[Union[Answer, list[Answer]]]):
    """One answer per question."""


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: Union[list[float], str]


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddings(BaseModel):
    object: Literal["list"]
    model: str
    data: list[OpenAIEmbedding]
    usage: OpenAIUsage


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class OpenAIModels(BaseModel):
    object: Literal["list"]
    data: list[OpenAIModel]


class ErrorResponse(BaseModel):
    """TEI's error body."""

    error: str
    error_type: str


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class OpenAIError(BaseModel):
    """OpenAI's error body (every ``/v1/*`` route)."""

    error: OpenAIErrorDetail


# ---------------------------------------------------------------------------------------------- parsing
#: what each union field of a request may hold, for its error message
UNION_HINTS = {"inputs": "send a text, token ids, or a list of them", "input": "send a text, token ids, "
               "or a list of them", "ids": "send a list of token ids or a list of such lists",
               "question": "send a text", "context": "send a text",
               ("PredictRequest", "inputs"): "send a text, a pair [a, b], or a list of [a] / [a, b]",
               ("TokenizeRequest", "inputs"): "send a text or a list of texts",
               ("NerRequest", "inputs"): "send a text or a list of texts"}


def where(loc: tuple) -> str:
    """A pydantic error location as a JSON path (``inputs[1]``), without its union members' tags."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out and not part.isidentifier():
            continue  # a union member's tag: list[...], function-after[...]
        elif part in ("str", "int", "bool", "float", "list", "dict") or (out and part[:1].isupper()):
            continue
        else:
            out += ("." if out else "") + part
    return out or "body"


def parse(cls: type, body: dict):
    """``body`` (a JSON object) validated as ``cls``. Raises :func:`invalid` (422) naming the first field at
    fault — an unknown one (``extra_forbidden``), a wrong type, an empty text or list, a value out of range."""
    try:
        return cls.model_validate(body, strict=True)
    except ValidationError as e:
        errors = e.errors(include_url=False, include_context=False)
        if errors[0]["type"] == "extra_forbidden" or len(errors) == 1:
            first = errors[0]
        else:  # a union: the deepest error of the branch that fits best, a value error before a type error
            first = max(errors, key=lambda x: (len(x["loc"]), not x["type"].endswith("_type")))
        field = where(first["loc"])
        if first["type"] == "extra_forbidden":
            raise invalid(f"unknown field {field!r}: {cls.__name__} has no such field (see GET /openapi.json)",
                          field, "unknown_field") from None
        top = field.split("[")[0].split(".")[0]
        hint = UNION_HINTS.get((cls.__name__, top), UNION_HINTS.get(top))
        if hint and first["type"].endswith("_type"):
            msg = f"{field}: {hint} (got {json.dumps(body.get(top))[:40]})"
        else:
            text = first["msg"].removeprefix("Value error, ")
            msg = f"{field}: {text}" if field != "body" else text
        raise invalid(msg, field, first["type"]) from None


__all__ = ["HTTPError", "invalid", "too_many", "RawJSON", "vectors_json", "dumps", "check_text", "parse", "where",
           "MAX_WINDOWS", "Body", "EmbedRequest", "EmbedAllRequest", "EmbedSparseRequest", "OpenAIEmbeddingRequest",
           "PredictRequest", "RerankRequest", "TokenizeRequest", "DecodeRequest", "SimilarityRequest", "NerRequest",
           "QaRequest", "ErrorResponse", "OpenAIError"]
