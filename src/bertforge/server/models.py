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

from ..checkpoint.layout import Prompts
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


#: the kinds whose routes read texts through the task head (at the dir's fine-tuning length, as ``predict``)
TASK_KINDS = ("classification", "regression", "token_classification", "question_answering")


#: the POST paths of each route family (``GET /info``'s ``paths``; /embed_sparse answers no bertforge model)
PATHS_BY_ROUTE = {"embed": ("/embed", "/embed_all", "/similarity", "/v1/embeddings"), "predict": ("/predict",),
                  "rerank": ("/rerank",), "tokenize": ("/tokenize", "/decode"), "ner": ("/ner",), "qa": ("/qa",)}


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
    #: the prompts the dir declares (``prompt_name``; the default one when a request names none)
    prompts: Prompts = field(default_factory=Prompts)
    #: tokens the task head reads per text, as ``evaluate`` / ``predict`` read them
    #: (:meth:`bertforge.checkpoint.modeldir.ModelDir.task_max_length`: the fine-tuning length); None: max_length
    task_length: Optional[int] = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _adapter: object = field(default=None, repr=False, compare=False)

    @property
    def tokenizer(self):
        return self.runner.tokenizer

    @property
    def adapter(self):
        """The task adapter of a classification, regression, token-classification or QA model
        (:func:`bertforge.tasks.adapter_for_model`: the ``encode`` / ``decode`` that ``evaluate`` and ``predict``
        use) with their windows of :attr:`task_length` tokens (the fine-tuning length, as ``evaluate`` reads).
        Raises DataError for another kind."""
        if self._adapter is None:
            from ..tasks import adapter_for_model
            length = self.task_length or self.max_length
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
        routes = [x for x in self.routes if x != "embed" or self.can_embed]
        d = {"name": self.name, "path": str(r.path), "kind": self.kind, "task": self.task, "routes": routes,
             "paths": [p for x in routes for p in PATHS_BY_ROUTE.get(x, ())],
             "max_input_length": self.max_length, "task_max_length": self.task_length, "pooling": self.pooling if self.can_embed else None,
             "labels": self.labels, "hidden_size": r.config.get("hidden_size"), "dimensions": self.dim,
             "prompts": sorted(self.prompts.prompts), "default_prompt_name": self.prompts.default_prompt_name}
        d.update({k: v for k, v in r.describe().items() if k in ("backend", "precision", "threads",
                                                                  "parameters", "file_mb", "weights_file")})
        return d

    # ---------------------------------------------------------------------------------- tokenization
    def _special(self, pair: bool) -> int:
        return self.tokenizer.num_special_tokens_to_add(pair)

    def prompt(self, name: Optional[str]) -> str:
        """The text of prompt ``name`` (None: the dir's default prompt, "" without one). Raises InputError for a
        name the dir does not declare."""
        try:
            return self.prompts.text(name)
        except KeyError:
            raise InputError(f"prompt_name {name!r} is not a prompt of model {self.name!r}; choose one of "
                             f"{', '.join(map(repr, self.prompts.prompts)) or 'none (it declares no prompts)'}"
                             ) from None

    def encode(self, texts: list, truncate: bool, pairs: Optional[list] = None, direction: str = "right",
               prompt: str = "", cut_at: Optional[int] = None) -> list:
        """Encode ``texts`` (with ``pairs``: ``(texts[i], pairs[i])`` pairs, a None entry for a single text)
        into :class:`Encoded` sequences of at most :attr:`max_length` tokens. A text may be token ids (a list
        of ints, TEI's ``InputType::Ids``): taken as they are, no special tokens added. ``prompt`` is put
        before every single text (ids are decoded first, as TEI does). Cut at the ``direction`` end
        (``left`` / ``right``); a pair longest-first, as ``tokenizers`` does. ``cut_at``: a sequence within
        :attr:`max_length` but longer than this is cut here whatever ``truncate`` says (a task head reads its
        fine-tuning length, :attr:`task_length`, as ``predict`` does).

        Raises:
            InputError: a sequence longer than :attr:`max_length` with ``truncate`` False; a token id outside
                the vocabulary.
        """
        tok = self.tokenizer
        left = direction.lower() == "left"
        ids_at = {i: t for i, t in enumerate(texts) if not isinstance(t, str)}
        if ids_at:
            vocab = tok.get_vocab_size()
            for i, t in ids_at.items():
                if max(t) >= vocab:
                    raise InputError(f"input {i} holds token id {max(t)}, outside model {self.name!r}'s "
                                     f"vocabulary of {vocab}")
            if prompt:  # TEI: the ids' text (no special tokens), after the prompt, encoded as a text
                with self.lock:
                    texts = [tok.decode(t, skip_special_tokens=True) if i in ids_at else t
                             for i, t in enumerate(texts)]
                ids_at = {}
        if prompt:
            texts = [prompt + t for t in texts]
        strs = [t for i, t in enumerate(texts) if i not in ids_at]
        with self.lock:
            a_enc = iter(tok.encode_batch(strs, add_special_tokens=False)) if strs else iter(())
            bs = [p for p in pairs if p is not None] if pairs is not None else []
            b_enc = iter(tok.encode_batch(bs, add_special_tokens=False)) if bs else iter(())
        a = [None if i in ids_at else next(a_enc) for i in range(len(texts))]
        b = [next(b_enc) if p is not None else None for p in pairs] if pairs is not None else [None] * len(a)
        out = []
        limit = min(self.max_length, cut_at) if cut_at else self.max_length
        for i, (ea, eb) in enumerate(zip(a, b)):
            if ea is None:  # token ids, as given
                ids = list(ids_at[i])
                if len(ids) > self.max_length and not truncate:
                    raise InputError(f"input {i} has {len(ids)} tokens, more than model {self.name!r} "
                                     f'takes ({self.max_length}); shorten it or pass "truncate": true')
                if len(ids) > limit:
                    ids = ids[-limit:] if left else ids[:limit]
                out.append(Encoded(ids, [0] * len(ids), len(ids_at[i])))
                continue
            special = self._special(eb is not None)
            n = len(ea.ids) + (len(eb.ids) if eb is not None else 0)
            if n > self.max_length - special and not truncate:
                raise InputError(f"input {i} has {n + special} tokens, more than model {self.name!r} takes "
                                 f'({self.max_length}); shorten it or pass "truncate": true')
            room = limit - special
            if n > room:
                side = "left" if left else "right"
                if eb is None:
                    ea.truncate(max(room, 0), direction=side)
                else:  # longest first
                    la, lb = len(ea.ids), len(eb.ids)
                    while la + lb > room:
                        if la >= lb:
                            la -= 1
                        else:
                            lb -= 1
                    ea.truncate(la, direction=side)
                    eb.truncate(lb, direction=side)
            enc = tok.post_process(ea, eb, add_special_tokens=True)
            type_ids = list(enc.type_ids)
            if eb is not None and tok.post_processor is None:  # no template: the pair's ids as encode() types them
                type_ids = [0] * len(ea.ids) + [1] * len(eb.ids)
            out.append(Encoded(list(enc.ids), type_ids, n + special))
        return out

    def tokens(self, texts: list, add_special_tokens: bool, prompt: str = "") -> list:
        """Per text (``prompt`` put before it), its tokens as text-embeddings-inference's ``/tokenize`` gives
        them: ``{"id", "text", "special", "start", "stop"}``, ``start`` / ``stop`` the token's UTF-8 byte
        offsets in the prompted text and ``text`` those bytes of it (a special token: its own string, offsets
        None)."""
        texts = [prompt + t for t in texts]
        with self.lock:
            encs = self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        out = []
        for text, e in zip(texts, encs):
            raw = text.encode("utf-8")
            byte_at = np.zeros(len(text) + 1, dtype=np.int64)  # char offset → byte offset
            byte_at[1:] = np.cumsum([len(c.encode("utf-8")) for c in text]) if text else []
            row = []
            for tid, tstr, off, special in zip(e.ids, e.tokens, e.offsets, e.special_tokens_mask):
                if special:
                    row.append({"id": int(tid), "text": tstr, "special": True, "start": None, "stop": None})
                    continue
                b0, b1 = int(byte_at[off[0]]), int(byte_at[off[1]])
                row.append({"id": int(tid), "text": raw[b0:b1].decode("utf-8", "replace"), "special": False,
                            "start": b0, "stop": b1})
            out.append(row)
        return out

    def decode(self, ids: list, skip_special_tokens: bool) -> list:
        """Per id list, its text (the tokenizer's decoder). Raises InputError for an id outside the vocabulary."""
        vocab = self.tokenizer.get_vocab_size()
        for i, row in enumerate(ids):
            if max(row) >= vocab:
                raise InputError(f"ids[{i}] holds token id {max(row)}, outside model {self.name!r}'s vocabulary "
                                 f"of {vocab}")
        with self.lock:
            return self.tokenizer.decode_batch([list(r) for r in ids], skip_special_tokens=skip_special_tokens)

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
    max_len = md.embed_max_length(runner.max_length)  # where the offline embedder cuts, too
    kind = runner.kind
    labels = None
    if kind in ("classification", "regression", "token_classification"):
        id2 = runner.config.get("id2label") or {}
        labels = [str(id2[k]) for k in sorted(id2, key=int)] if id2 else \
            [f"LABEL_{i}" for i in range(runner.num_labels or 1)]
    task_len = md.task_max_length(runner.max_length) if kind in TASK_KINDS else None
    m = ServedModel(name, runner, kind, pooling.mode, max_len, labels, md.meta.task, dim=md.truncate_dim,
                    prompts=md.prompts, task_length=task_len)
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
