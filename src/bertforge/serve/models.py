"""The models a server holds: a :class:`~bertforge.runtime.base.Runner` each, with its tokenizer, its kind and
its pooling, plus the tokenization every route shares.

A model is loaded with :func:`bertforge.runtime.load_runner` — the same runner ``bench``, ``evaluate``,
``predict`` and ``embed-eval`` use (PyTorch FP32 / INT8 dirs, the ONNX / INT8 dirs of ``export`` and
``quantize``, ``transformers`` dirs) — and warmed with one forward pass before the server listens.

Tokenization never changes the tokenizer's state (no ``enable_truncation``), so the tokenizer may be used
from any thread: texts are encoded without special tokens, cut to the model's length, then given their
special tokens by the tokenizer's own post-processor (what truncation inside ``tokenizers`` does).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import CheckpointError, ConfigError

#: the routes each kind of model answers (``embed`` reads the encoder's hidden states)
ROUTES_BY_KIND = {
    "base": ("embed", "rerank", "tokenize"),
    "embedding": ("embed", "rerank", "tokenize"),  # finetune --task retrieval, distill --method embedding_mse
    "classification": ("predict", "rerank", "embed", "tokenize"),
    "regression": ("predict", "rerank", "embed", "tokenize"),
    "token_classification": ("ner", "embed", "tokenize"),
    "question_answering": ("qa", "embed", "tokenize"),
}


class InputError(ValueError):
    """A request's input the model cannot take (HTTP 422): too long without truncation, nothing to encode."""


@dataclass
class Encoded:
    """One sequence ready for the model: token ``ids`` and ``type_ids`` (with special tokens), and how many
    tokens the text had before truncation (``n_original``)."""

    ids: list
    type_ids: list
    n_original: int = 0


@dataclass
class ServedModel:
    """A loaded model and what the routes need of it.

    Attributes:
        name: the name requests use (``"model"`` field).
        runner: the :class:`~bertforge.runtime.base.Runner`.
        kind: :attr:`Runner.kind` (``base``, ``classification``, ``regression``, ``token_classification``,
            ``question_answering`` …).
        pooling: ``mean`` (default; Sentence-BERT's MEAN), ``cls`` or ``max``, as the dir's
            ``1_Pooling/config.json`` says (:func:`bertforge.models.pooling.read_pooling`).
        max_length: the longest input in tokens, special tokens included: the model's positions, or the
            ``max_seq_length`` of ``sentence_bert_config.json`` when smaller.
        labels: label names in id order (task heads), else None.
        dim: the coordinates ``/embed`` keeps: the dir's Matryoshka ``truncate_dim``
            (:func:`bertforge.models.pooling.read_truncate_dim`), None for all.
        lock: held while the tokenizer runs (QA windows set its truncation).
        adapter: the task adapter that encodes texts for a task model and decodes its outputs (built on
            first use, :attr:`adapter`).
    """

    name: str
    runner: object
    kind: str
    pooling: str = "mean"
    max_length: int = 512
    labels: Optional[list] = None
    task: Optional[str] = None
    #: coordinates an embedding keeps (a Matryoshka dir's ``truncate_dim``); None: all
    dim: Optional[int] = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _adapter: object = field(default=None, repr=False, compare=False)

    @property
    def tokenizer(self):
        return self.runner.tokenizer

    @property
    def adapter(self):
        """The task adapter of a classification, regression, token-classification or QA model
        (:func:`bertforge.tasks.adapter_for_model`: the ``encode`` / ``decode`` that ``evaluate`` and ``predict``
        use): windows of :attr:`max_length` tokens, a QA model's of its fine-tuning length (384 when unknown)
        at most. Raises DataError for another kind."""
        if self._adapter is None:
            from ..tasks import adapter_for_model
            length = self.max_length
            if self.kind == "question_answering":
                length = min(int(self.runner.meta.max_seq_len or 384), self.max_length)
            self._adapter = adapter_for_model(self.kind, self.runner.config, self.tokenizer, length, self.labels)
        return self._adapter

    @property
    def routes(self) -> tuple:
        routes = ROUTES_BY_KIND.get(self.kind, ("embed", "tokenize"))
        if self.kind in ("classification", "regression") and len(self.labels or ()) != 1:
            routes = tuple(r for r in routes if r != "rerank")  # only a one-output cross-encoder scores pairs
        return routes

    @property
    def can_embed(self) -> bool:
        return "last_hidden_state" in self.runner.outputs

    def describe(self) -> dict:
        """JSON facts for ``GET /info``."""
        r = self.runner
        d = {"name": self.name, "path": str(r.path), "kind": self.kind, "task": self.task,
             "routes": [x for x in self.routes if x != "embed" or self.can_embed],
             "max_input_length": self.max_length, "pooling": self.pooling if self.can_embed else None,
             "labels": self.labels, "hidden_size": r.config.get("hidden_size")}
        d.update({k: v for k, v in r.describe().items() if k in ("backend", "precision", "threads",
                                                                  "parameters", "file_mb", "weights_file")})
        return d

    # ---------------------------------------------------------------------------------- tokenization
    def _special(self, pair: bool) -> int:
        return self.tokenizer.num_special_tokens_to_add(pair)

    def encode(self, texts: list, truncate: bool, pairs: Optional[list] = None) -> list:
        """Encode ``texts`` (with ``pairs``: ``(texts[i], pairs[i])`` pairs, a None entry for a single text)
        into :class:`Encoded` sequences of at most :attr:`max_length` tokens. A pair is cut longest-first,
        as ``tokenizers`` does.

        Raises:
            InputError: a sequence longer than :attr:`max_length` with ``truncate`` False.
        """
        tok = self.tokenizer
        with self.lock:
            a = tok.encode_batch(list(texts), add_special_tokens=False)
            bs = [p for p in pairs if p is not None] if pairs is not None else []
            b_enc = iter(tok.encode_batch(bs, add_special_tokens=False)) if bs else iter(())
        b = [next(b_enc) if p is not None else None for p in pairs] if pairs is not None else [None] * len(a)
        out = []
        for i, (ea, eb) in enumerate(zip(a, b)):
            special = self._special(eb is not None)
            room = self.max_length - special
            n = len(ea.ids) + (len(eb.ids) if eb is not None else 0)
            if n > room:
                if not truncate:
                    raise InputError(f"input {i} has {n + special} tokens, more than model {self.name!r} takes "
                                     f'({self.max_length}); shorten it or pass "truncate": true')
                if eb is None:
                    ea.truncate(room)
                else:  # longest first
                    la, lb = len(ea.ids), len(eb.ids)
                    while la + lb > room:
                        if la >= lb:
                            la -= 1
                        else:
                            lb -= 1
                    ea.truncate(la)
                    eb.truncate(lb)
            enc = tok.post_process(ea, eb, add_special_tokens=True)
            type_ids = list(enc.type_ids)
            if eb is not None and tok.post_processor is None:  # no template: the pair's ids as encode() types them
                type_ids = [0] * len(ea.ids) + [1] * len(eb.ids)
            out.append(Encoded(list(enc.ids), type_ids, n + special))
        return out

    def tokens(self, texts: list, add_special_tokens: bool) -> list:
        """Per text, its tokens as ``{"id", "text", "special", "start", "stop"}`` (character offsets; None for
        a special token), the layout of text-embeddings-inference's ``/tokenize``."""
        with self.lock:
            encs = self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        out = []
        for text, e in zip(texts, encs):
            row = []
            for tid, tstr, off, special in zip(e.ids, e.tokens, e.offsets, e.special_tokens_mask):
                sp = bool(special)
                row.append({"id": int(tid), "text": tstr, "special": sp,
                            "start": None if sp else int(off[0]), "stop": None if sp else int(off[1])})
            out.append(row)
        return out

    # ---------------------------------------------------------------------------------- outputs
    def pool(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(B, T, H) hidden states, (B, T) mask → (B, H) sentence embeddings by :attr:`pooling`."""
        from ..models.pooling import pool_numpy
        out = pool_numpy(hidden, mask, self.pooling)
        return out[:, :self.dim] if self.dim else out


def pooling_of(path: Path) -> str:
    """The pooling mode a dir declares (:class:`~bertforge.checkpoint.modeldir.ModelDir`); ``mean`` otherwise."""
    from ..checkpoint.modeldir import ModelDir
    return ModelDir.open(path, require_config=False).pooling.mode


def parse_model_args(values: list) -> list:
    """``--model`` values → ``[(name, dir)]``: ``NAME=DIR`` or ``DIR`` (named after its folder; ``minilm``
    keeps its alias). Raises ConfigError for an empty or repeated name."""
    from ..checkpoint.read import EMBEDDED
    out, seen = [], set()
    for v in values:
        name, sep, d = v.partition("=")
        if not sep or Path(v).exists():
            d = v
            name = v if v.lower() in EMBEDDED else (Path(v).stem if Path(v).is_file() else Path(v).resolve().name)
        name, d = name.strip(), d.strip()
        if not name or not d:
            raise ConfigError(f"--model {v!r}: pass DIR or NAME=DIR")
        if name in seen:
            raise ConfigError(f"two models are named {name!r}; give one another name with --model NAME=DIR")
        seen.add(name)
        out.append((name, d))
    if not out:
        raise ConfigError("no model given; pass --model DIR (or NAME=DIR, several times)")
    return out


def load_model(name: str, path, backend: str = "auto", threads: Optional[int] = None,
               warm: bool = True) -> ServedModel:
    """Load one model with :func:`bertforge.runtime.load_runner`, check it has a tokenizer, and run one
    forward pass (``warm``).

    Raises:
        CheckpointError: nothing servable at ``path`` (one line naming it).
    """
    from ..checkpoint.modeldir import ModelDir
    from ..runtime import load_runner
    try:
        md = ModelDir.open(path, require_config=False)
    except CheckpointError as e:
        raise CheckpointError(f"--model {name}={path}: {e}") from None
    p = md.graph if md.graph is not None and str(path).endswith(".onnx") else md.path
    try:
        runner = load_runner(md, backend=backend, threads=threads)
    except CheckpointError as e:
        raise CheckpointError(f"--model {name}: {e}") from None
    try:
        tok = runner.tokenizer
    except CheckpointError as e:
        raise CheckpointError(f"--model {name}: {e}") from None
    pooling = md.pooling
    max_len = runner.max_length or 512
    if pooling.max_seq_length:
        max_len = min(max_len, pooling.max_seq_length)
    kind = runner.kind
    labels = None
    if kind in ("classification", "regression", "token_classification"):
        id2 = runner.config.get("id2label") or {}
        labels = [str(id2[k]) for k in sorted(id2, key=int)] if id2 else \
            [f"LABEL_{i}" for i in range(runner.num_labels or 1)]
    m = ServedModel(name, runner, kind, pooling.mode, max_len, labels, md.meta.task, dim=md.truncate_dim)
    if tok.get_vocab_size() == 0:
        raise CheckpointError(f"--model {name}: {p} has an empty tokenizer")
    if warm:
        ids = np.asarray([m.encode(["warm up"], truncate=True)[0].ids], dtype=np.int64)
        runner(ids, np.ones_like(ids), np.zeros_like(ids))
        if m.can_embed and "logits" in runner.outputs:
            runner(ids, np.ones_like(ids), np.zeros_like(ids), outputs=("last_hidden_state",))
    return m


__all__ = ["ServedModel", "Encoded", "InputError", "load_model", "parse_model_args", "pooling_of",
           "ROUTES_BY_KIND"]
