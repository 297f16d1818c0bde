"""Retrieval: a bi-encoder trained on (query, positive[, negative …]) pairs with in-batch negatives.

* task: ``retrieval`` (kind ``retrieval``): JSONL rows ``{"query", "positive"[, "negative" | "negatives"]}``
  (also ``anchor`` for the query), or TSV/CSV with those header names (else positional: query, positive,
  negatives …). Evaluation data: a BEIR dir (``corpus.jsonl``, ``queries.jsonl``, ``qrels/*.tsv``, read by
  :func:`bertforge.data.beir.read_beir`) or a pairs file (its distinct positives are the corpus).
* head: :class:`EmbeddingHead` (``embedding``): pooled (:func:`bertforge.models.pooling.pool`) last hidden
  states; saved as the plain encoder (``…Model``) plus the sentence-transformers pooling files.
* losses (:data:`CONTRASTIVE_LOSSES`): ``mnrl`` — MultipleNegativesRanking / InfoNCE with a scale
  (Henderson et al. 2017 §4.4 "batch negatives"; van den Oord et al. 2018 eq. 4): every other positive
  (and every hard negative) of the batch is a negative; ``mnrl_symmetric`` adds the positive → query
  direction. :func:`matryoshka_loss` sums a loss over truncated prefixes of the embedding (Kusupati et al.
  2022, eq. 2), so the first d dimensions alone are an embedding.
* hard negatives: :func:`~bertforge.tasks.hard_negatives.mine_hard_negatives` ranks the corpus of positives
  with the model being trained (before training) and takes, per query, the best-ranked passages that are no
  positive of that query text and score at least ``hard_negatives_margin`` below its positive.
* metrics: :func:`bertforge.metrics.retrieval.retrieval_metrics` (NDCG@10, MRR@10, Recall@k).

A batch holds C texts per example: ``input_ids`` (B, C, T) (query, positive, negatives; T the longest in the
batch); :class:`~bertforge.task_model.TaskModel` encodes the B·C rows in one pass (unpadded by the CPU
kernels) and the head regroups them.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..data.collate import length_sorted_batches
from ..errors import ConfigError, DataError
from ..models.head import Head
from ..models.output import EncoderOutput
from ..models.pooling import POOLING_MODES, pool
from ..tokenizer import encode_texts, pad_id
from .base import Task, TaskAdapter
from .hard_negatives import HARD_NEGATIVES_MARGIN, mine_hard_negatives, mining_note, positives_by_query

#: the retrieval task: (query, positive[, negatives]) files for training, NDCG@10 first for the best checkpoint;
#: its default learning rate is the benchmark's (benchmarks/bench_retrieval.py: MNRL fine-tuning of MiniLM, lr 2e-5,
#: as sentence-transformers' training examples)
TASKS = [Task("retrieval", ("query", "positive"), None, None, ("ndcg@10", "mrr@10", "recall@10"),
              kind="retrieval", train_defaults={"train.lr": 2e-5})]


# ------------------------------------------------------------------------------------------------ losses
def similarity(a: torch.Tensor, b: torch.Tensor, kind: str = "cos") -> torch.Tensor:
    """(N, H), (M, H) → (N, M) similarity: ``cos`` (cosine) or ``dot`` (inner product)."""
    if kind == "cos":
        a, b = F.normalize(a.float(), dim=-1), F.normalize(b.float(), dim=-1)
    elif kind != "dot":
        raise ConfigError(f"similarity {kind!r}; choose cos or dot")
    return a.float() @ b.float().T


def mnrl_loss(emb: torch.Tensor, scale: float = 20.0, sim: str = "cos") -> torch.Tensor:
    """MultipleNegativesRanking / InfoNCE loss with in-batch negatives (Henderson et al. 2017 §4.4; van den
    Oord et al. 2018 eq. 4; sentence-transformers' ``MultipleNegativesRankingLoss``).

    ``emb`` (B, C, H): per example its query (column 0), positive (column 1) and C − 2 hard negatives.
    Query i is scored against all B·(C − 1) candidates (every positive, then every negative column):
    ``s_ij = scale · sim(q_i, d_j)``; the loss is the cross-entropy of the softmax over j with target i,
    averaged over the B queries. ``scale`` = 1/temperature (20 = τ 0.05). Returns a float32 scalar."""
    q = emb[:, 0]
    docs = emb[:, 1:].transpose(0, 1).reshape(-1, emb.shape[-1])  # positives first, then each negative column
    scores = similarity(q, docs, sim) * scale
    target = torch.arange(q.shape[0], device=q.device)
    return F.cross_entropy(scores, target)


def mnrl_symmetric_loss(emb: torch.Tensor, scale: float = 20.0, sim: str = "cos") -> torch.Tensor:
    """Symmetric InfoNCE: the mean of :func:`mnrl_loss` (query → documents) and the positive → query
    direction (each positive against the B queries; CLIP's symmetric loss, Radford et al. 2021 §2.3;
    sentence-transformers' ``MultipleNegativesSymmetricRankingLoss``). ``emb`` (B, C, H)."""
    forward = mnrl_loss(emb, scale, sim)
    scores = similarity(emb[:, 1], emb[:, 0], sim) * scale  # (B positives, B queries)
    backward = F.cross_entropy(scores, torch.arange(emb.shape[0], device=emb.device))
    return (forward + backward) / 2


#: contrastive loss name → fn(emb (B, C, H), scale, sim) → scalar
CONTRASTIVE_LOSSES: dict[str, Callable] = {"mnrl": mnrl_loss, "mnrl_symmetric": mnrl_symmetric_loss}


def matryoshka_loss(loss_fn: Callable, emb: torch.Tensor, dims: Sequence[int],
                    weights: Optional[Sequence[float]] = None, **kw) -> torch.Tensor:
    """Matryoshka Representation Learning (Kusupati et al. 2022, eq. 2): ``Σ_m w_m · L(emb[..., :m])`` over
    the nested dimensions ``dims`` (weights ``w_m`` default 1), so that every prefix of the embedding is an
    embedding. ``loss_fn(emb, **kw)`` is any loss on (…, H) embeddings (e.g. :func:`mnrl_loss`)."""
    weights = list(weights) if weights is not None else [1.0] * len(dims)
    total = None
    for d, w in zip(dims, weights):
        v = w * loss_fn(emb[..., :int(d)], **kw)
        total = v if total is None else total + v
    return total


def margin_mse_loss(q: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, target_margin: torch.Tensor,
                    sim: str = "dot") -> torch.Tensor:
    """Margin-MSE (Hofstätter et al. 2020, eq. 1): ``MSE(M_s(q, p⁺) − M_s(q, p⁻), M_t(q, p⁺) − M_t(q, p⁻))``.

    ``q``, ``pos``, ``neg`` (B, H) the student's embeddings; ``target_margin`` (B,) the teacher's score margin;
    the student's score is the dot product (the paper's and sentence-transformers' ``MarginMSELoss`` default)
    or cosine (``sim="cos"``). Returns a float32 scalar (mean over the batch)."""
    s_pos = (_rows(q, sim) * _rows(pos, sim)).sum(-1)
    s_neg = (_rows(q, sim) * _rows(neg, sim)).sum(-1)
    return F.mse_loss(s_pos - s_neg, target_margin.float())


def _rows(x: torch.Tensor, sim: str) -> torch.Tensor:
    return F.normalize(x.float(), dim=-1) if sim == "cos" else x.float()


# -------------------------------------------------------------------------------------------------- head
@dataclass
class EmbeddingSettings:
    """How the embedding head pools and what it trains: ``pooling`` (mean | cls | max), ``normalize`` (L2),
    ``loss`` (a key of :data:`CONTRASTIVE_LOSSES`), ``scale`` (1/τ), ``similarity`` (cos | dot),
    ``matryoshka_dims`` (nested dims, largest first; None: the full width only), ``matryoshka_weights``."""

    pooling: str = "mean"
    normalize: bool = False
    loss: str = "mnrl"
    scale: float = 20.0
    similarity: str = "cos"
    matryoshka_dims: Optional[list] = None
    matryoshka_weights: Optional[list] = None


class EmbeddingHead(Head):
    """Pooled sentence embeddings and, for a batch of several texts per example, a contrastive loss.

    ``enc.last_hidden_state`` (N, T, H) and ``batch["attention_mask"]`` (N, T) → ``logits`` (N, H), the pooled
    embeddings (:func:`bertforge.models.pooling.pool`). When the batch was (B, C, T) (``batch["columns"]``
    = C ≥ 2, see :class:`~bertforge.task_model.TaskModel`), ``logits`` is (B, C, H) and ``loss`` the
    :data:`CONTRASTIVE_LOSSES` entry (inside :func:`matryoshka_loss` when ``matryoshka_dims`` is set). The head
    has no weights: the dir it saves is the plain encoder (``…Model``) plus its pooling files."""

    hf_suffix = "Model"
    has_labels = False  # no label space in config.json

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.settings = EmbeddingSettings()

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        s = self.settings
        mask = batch.get("attention_mask")
        if mask is None:
            mask = torch.ones(enc.last_hidden_state.shape[:2], dtype=torch.long, device=enc.last_hidden_state.device)
        emb = pool(enc.last_hidden_state, mask, s.pooling, s.normalize)
        cols = int(batch.get("columns") or 1)
        if cols < 2:
            return {"logits": emb}
        emb = emb.reshape(-1, cols, emb.shape[-1])
        fn = CONTRASTIVE_LOSSES[s.loss]
        if s.matryoshka_dims:
            loss = matryoshka_loss(fn, emb, s.matryoshka_dims, s.matryoshka_weights, scale=s.scale, sim=s.similarity)
        else:
            loss = fn(emb, scale=s.scale, sim=s.similarity)
        return {"logits": emb, "loss": loss}

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        return {}


# ---------------------------------------------------------------------------------------- data reading
@dataclass(frozen=True)
class PairExample:
    """One training row: ``query``, its ``positive`` passage, ``negatives`` (hard negatives, may be empty),
    ``id`` (the row's ``id`` field or its line number) and ``scores`` (optional teacher scores of the
    positive then each negative, e.g. a cross-encoder's, for ``margin_mse``)."""

    query: str
    positive: str
    negatives: tuple = ()
    id: str = ""
    scores: Optional[tuple] = None


_QUERY_KEYS = ("query", "anchor", "question")
_POS_KEYS = ("positive", "pos", "passage", "document")


def _pick(row: dict, keys) -> Optional[str]:
    return next((row[k] for k in keys if k in row), None)


def read_pairs(path, max_samples: Optional[int] = None) -> list:
    """Read (query, positive[, negatives]) rows from JSONL (one object per line, keys ``query``/``anchor``,
    ``positive``, optional ``negative`` (text) or ``negatives`` (list), ``scores`` (teacher scores of the
    positive then each negative), ``id``) or TSV/CSV (header ``query``, ``positive``, ``negative``… or no
    header: positional). Returns :class:`PairExample` list (the first ``max_samples``).

    Raises:
        DataError: a missing/empty/non-UTF-8 file; a row without a query or positive, or with an empty one;
            rows with different numbers of negatives (a batch needs the same on every row); bad ``scores``.
    """
    from ..data.readers import _read_jsonl, _read_text, split_lines
    path = Path(path)
    rows = []  # (line, query, positive, negatives, id, scores)
    if path.suffix.lower() in (".jsonl", ".json"):
        for line, r in _read_jsonl(path):
            if not isinstance(r, dict):
                raise DataError(f"{path}:{line} is not a JSON object; write "
                                f'{{"query": "...", "positive": "...", "negative": "..."}} per line')
            negs = r.get("negatives", r.get("negative", []))
            negs = [negs] if isinstance(negs, str) else list(negs or [])
            rows.append((line, _pick(r, _QUERY_KEYS), _pick(r, _POS_KEYS), negs, str(r.get("id", line)),
                         r.get("scores")))
    else:
        delim = "," if path.suffix.lower() == ".csv" else "\t"
        lines = split_lines(_read_text(path))
        table = list(csv.reader(lines, delimiter=delim, quoting=csv.QUOTE_MINIMAL if delim == "," else csv.QUOTE_NONE))
        start = 1 if table and table[0] and table[0][0].strip().lower() in _QUERY_KEYS else 0
        for i, cells in enumerate(table[start:], start + 1):
            if not any(c.strip() for c in cells):
                continue
            if len(cells) < 2:
                raise DataError(f"{path}:{i} has {len(cells)} column(s); write query, positive[, negatives] "
                                f"separated by {'commas' if delim == ',' else 'tabs'}")
            rows.append((i, cells[0], cells[1], [c for c in cells[2:] if c.strip()], str(i), None))
    out = []
    for line, q, p, negs, rid, scores in rows[:max_samples] if max_samples else rows:
        for what, v in (("query", q), ("positive", p)):
            if not isinstance(v, str) or not v.strip():
                raise DataError(f"{path}:{line} has {'an empty' if isinstance(v, str) else 'no'} {what}; "
                                f"every row needs a non-empty query and positive")
        if any(not isinstance(n, str) or not n.strip() for n in negs):
            raise DataError(f"{path}:{line} has an empty negative; drop it or give its text")
        if scores is not None:
            if not isinstance(scores, list) or len(scores) != 1 + len(negs) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in scores):
                raise DataError(f"{path}:{line}: scores must be a list of {1 + len(negs)} numbers (the teacher's "
                                f"score of the positive, then of each negative)")
            scores = tuple(float(x) for x in scores)
        out.append(PairExample(q, p, tuple(negs), rid, scores))
    if not out:
        raise DataError(f"{path} has no (query, positive) rows; pass a file with data rows")
    counts = {len(e.negatives) for e in out}
    if len(counts) > 1:
        raise DataError(f"{path}: rows have {sorted(counts)} negatives; give every row the same number "
                        f"(a batch stacks them as columns)")
    return out


@dataclass
class RetrievalSet:
    """An evaluation set: ``queries`` (id → text), ``corpus`` (id → text), ``qrels`` (query id → {doc id:
    relevance})."""

    queries: dict
    corpus: dict
    qrels: dict
    source: str = ""

    def __len__(self) -> int:
        return len(self.queries)


def pairs_to_retrieval_set(pairs: list, source: str = "") -> RetrievalSet:
    """A retrieval set from pairs: the distinct positives (and negatives) are the corpus; each query's
    positive is its one relevant document (relevance 1)."""
    doc_ids: dict = {}
    for e in pairs:
        for t in (e.positive, *e.negatives):
            doc_ids.setdefault(t, f"d{len(doc_ids)}")
    queries = {f"q{i}": e.query for i, e in enumerate(pairs)}
    qrels = {f"q{i}": {doc_ids[e.positive]: 1} for i, e in enumerate(pairs)}
    return RetrievalSet(queries, {v: k for k, v in doc_ids.items()}, qrels, source)


# ------------------------------------------------------------------------------------------- embedding
def embed_texts(model, tok, texts: Sequence[str], max_seq_len: int, pooling: str = "mean",
                normalize: bool = False, batch_size: int = 64) -> np.ndarray:
    """Embed ``texts`` with a PyTorch :class:`~bertforge.task_model.TaskModel` (no gradients, in the mode the
    caller set) or a runner of :mod:`bertforge.runtime` (a callable returning ``last_hidden_state``):
    tokenized (truncated to ``max_seq_len``), batched by length, last hidden states pooled
    (:func:`bertforge.models.pooling.pool`). Returns (N, H) float32."""
    encs = encode_texts(tok, list(texts), None, max_seq_len)
    batches = length_sorted_batches(encs, pad_id(tok), batch_size)
    if not isinstance(model, torch.nn.Module):
        from ..models.pooling import pool_numpy
        rows = []
        for idx, ids, am, _ in batches:
            h = np.asarray(model(ids, am, np.zeros_like(ids), outputs=["last_hidden_state"])
                           ["last_hidden_state"], dtype=np.float32)
            rows.append((idx, pool_numpy(h, am, pooling, normalize)))
        out = np.zeros((len(encs), rows[0][1].shape[1] if rows else 0), dtype=np.float32)
        for idx, v in rows:
            out[idx] = v
        return out
    dev = next(model.parameters()).device
    out = np.zeros((len(encs), model.config.hidden_size), dtype=np.float32)
    with torch.no_grad():
        for idx, ids, am, _ in batches:
            ids, am = torch.from_numpy(ids).to(dev), torch.from_numpy(am).to(dev)
            h = model(ids, am, torch.zeros_like(ids)).last_hidden_state
            out[idx] = pool(h, am, pooling, normalize).float().cpu().numpy()
    return out


# --------------------------------------------------------------------------------------------- adapter
class ColumnCollator:
    """Examples of C token-id lists each → ``input_ids``, ``attention_mask``, ``token_type_ids`` (B, C, T),
    T = the longest text in the batch; ``teacher_margin`` (B,) when every example has one; ``pair_input_ids``,
    ``pair_attention_mask``, ``pair_token_type_ids`` (B, 2, T₂) when the examples carry cross-encoder pairs."""

    def __init__(self, pad_id: int = 0):
        self.pad_id = pad_id

    def __call__(self, items: list) -> dict:
        c = len(items[0]["input_ids"])
        t = max(len(x) for it in items for x in it["input_ids"])
        ids = torch.full((len(items), c, t), self.pad_id, dtype=torch.long)
        am = torch.zeros((len(items), c, t), dtype=torch.long)
        for b, it in enumerate(items):
            for j, x in enumerate(it["input_ids"]):
                ids[b, j, :len(x)] = torch.tensor(x, dtype=torch.long)
                am[b, j, :len(x)] = 1
        batch = {"input_ids": ids, "attention_mask": am, "token_type_ids": torch.zeros_like(ids)}
        if all("pair_input_ids" in it for it in items):  # (query, passage) pairs of a cross-encoder teacher
            c2 = len(items[0]["pair_input_ids"])
            t2 = max(len(x) for it in items for x in it["pair_input_ids"])
            pids = torch.full((len(items), c2, t2), self.pad_id, dtype=torch.long)
            pam = torch.zeros((len(items), c2, t2), dtype=torch.long)
            ptt = torch.zeros((len(items), c2, t2), dtype=torch.long)
            for b, it in enumerate(items):
                for j, (x, tt) in enumerate(zip(it["pair_input_ids"], it["pair_token_type_ids"])):
                    pids[b, j, :len(x)] = torch.tensor(x, dtype=torch.long)
                    pam[b, j, :len(x)] = 1
                    ptt[b, j, :len(x)] = torch.tensor(tt, dtype=torch.long)
            batch.update(pair_input_ids=pids, pair_attention_mask=pam, pair_token_type_ids=ptt)
        if all("teacher_margin" in it for it in items):
            batch["teacher_margin"] = torch.tensor([it["teacher_margin"] for it in items], dtype=torch.float32)
        return batch


class Pairs(list):
    """Encoded training items (``input_ids``: one token-id list per column) that remember their
    :class:`PairExample` rows (``examples``)."""

    def __init__(self, items, examples):
        super().__init__(items)
        self.examples = examples

    def batch_keys(self) -> list:
        """Per item ``(texts, negatives)``: its query and positive, then its hard negatives, as token-id tuples
        (what the model reads: two texts that truncate to the same tokens are one text), for the Trainer's
        ``train.no_duplicates`` batches (:func:`bertforge.engine.train.sampler.no_duplicate_batches`)."""
        return [(tuple(tuple(x) for x in it["input_ids"][:2]), tuple(tuple(x) for x in it["input_ids"][2:]))
                for it in self]


#: recipe keys of the ``retrieval`` section (finetune --task retrieval)
SETTINGS_KEYS = ("loss", "scale", "similarity", "symmetric", "pooling", "normalize", "matryoshka_dims",
                 "matryoshka_weights", "hard_negatives", "hard_negatives_skip", "hard_negatives_margin",
                 "truncate_dim")



def check_dims(dims, width: int, what: str = "--matryoshka-dims") -> list:
    """Matryoshka dims as a list of ints, largest first, each in 1..``width`` (the model's hidden size).

    Raises:
        ConfigError: a dim that is not a positive integer, repeated, or larger than ``width``.
    """
    if isinstance(dims, str):
        dims = [x for x in dims.replace(" ", "").split(",") if x]
    try:
        out = [int(x) for x in dims]
    except (TypeError, ValueError):
        raise ConfigError(f"{what} {dims!r}: give positive integers, e.g. 384,256,128,64") from None
    if not out or any(d < 1 for d in out) or len(set(out)) != len(out):
        if len(out) == 1:  # one dim (truncate_dim, or a one-dim list)
            raise ConfigError(f"{what} {out[0]!r}: give a positive integer ≤ {width}, e.g. {min(128, width)}")
        raise ConfigError(f"{what} {dims!r}: give distinct positive integers, e.g. 384,256,128,64")
    big = [d for d in out if d > width]
    if big:
        raise ConfigError(f"{what}: {big[0]} is larger than the model's embedding width {width}; give dims "
                          f"≤ {width}")
    return sorted(out, reverse=True)


class RetrievalAdapter(TaskAdapter):
    """(query, positive[, negatives]) pairs → a bi-encoder trained with a contrastive loss; evaluated by
    retrieval (NDCG@10 …). Settings come from :meth:`configure` (the recipe's ``retrieval`` section)."""

    head = "embedding"
    read_unit = "pairs"
    item_unit = "pairs"
    #: ``evaluate --task retrieval`` takes any encoder dir (its pooling as the dir declares it)
    reads_any_encoder = True

    def __init__(self, task: Task, tokenizer, max_seq_len: int):
        super().__init__(task, tokenizer, max_seq_len)
        self.settings = EmbeddingSettings()
        self.hard_negatives, self.hard_negatives_skip, self.truncate_dim = 0, 0, None
        self.hard_negatives_margin: Optional[float] = HARD_NEGATIVES_MARGIN
        #: what the last mining did: ``fallback`` queries, ``margin_skipped`` documents (mine_hard_negatives)
        self.mining_stats: dict = {}

    def configure(self, section: dict, width: int, pooling=None) -> None:
        """Check and take the ``retrieval`` settings (:data:`SETTINGS_KEYS`) for a model of embedding width
        ``width``; ``pooling`` (:class:`bertforge.models.pooling.Pooling`) is the source dir's, the default.

        Raises:
            ConfigError: an unknown key, loss, pooling or similarity; a scale ≤ 0; a Matryoshka dim or
                ``truncate_dim`` larger than ``width``; weights not one per dim; hard negatives < 0.
        """
        bad = set(section) - set(SETTINGS_KEYS)
        if bad:
            raise ConfigError(f"unknown recipe key retrieval.{sorted(bad)[0]}; valid: {', '.join(SETTINGS_KEYS)}")
        s = EmbeddingSettings(pooling=getattr(pooling, "mode", "mean"), normalize=bool(getattr(pooling, "normalize", False)))
        loss = section.get("loss") or ("mnrl_symmetric" if section.get("symmetric") else "mnrl")
        if loss not in CONTRASTIVE_LOSSES:
            raise ConfigError(f"retrieval.loss={loss!r}; choose one of {', '.join(CONTRASTIVE_LOSSES)}")
        s.loss = loss
        if section.get("pooling") is not None:
            if section["pooling"] not in POOLING_MODES:
                raise ConfigError(f"--pooling {section['pooling']!r}; choose one of {', '.join(POOLING_MODES)}")
            s.pooling = section["pooling"]
        if section.get("normalize") is not None:
            s.normalize = bool(section["normalize"])
        s.scale = float(section.get("scale", 20.0))
        if not 0 < s.scale < float("inf"):
            raise ConfigError(f"retrieval.scale={s.scale}: must be a finite number > 0 (1/temperature; 20 = τ 0.05)")
        s.similarity = section.get("similarity", "cos")
        if s.similarity not in ("cos", "dot"):
            raise ConfigError(f"retrieval.similarity={s.similarity!r}; choose cos or dot")
        if section.get("matryoshka_dims"):
            s.matryoshka_dims = check_dims(section["matryoshka_dims"], width)
            w = section.get("matryoshka_weights")
            if w is not None and len(list(w)) != len(s.matryoshka_dims):
                raise ConfigError(f"retrieval.matryoshka_weights: give one weight per dim "
                                  f"({len(s.matryoshka_dims)}), got {len(list(w))}")
            s.matryoshka_weights = [float(x) for x in w] if w is not None else None
        td = section.get("truncate_dim")
        self.truncate_dim = check_dims([td], width, "retrieval.truncate_dim")[0] if td is not None else None
        for k in ("hard_negatives", "hard_negatives_skip"):
            v = section.get(k, 0) or 0
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"retrieval.{k}={v!r}: give a whole number ≥ 0")
        self.hard_negatives = int(section.get("hard_negatives") or 0)
        self.hard_negatives_skip = int(section.get("hard_negatives_skip") or 0)
        mg = section.get("hard_negatives_margin", HARD_NEGATIVES_MARGIN)
        if mg is not None and (isinstance(mg, bool) or not isinstance(mg, (int, float)) or not 0 <= mg < float("inf")):
            raise ConfigError(f"retrieval.hard_negatives_margin={mg!r}: give a number ≥ 0 (a similarity gap) or "
                              f"null to turn it off")
        self.hard_negatives_margin = None if mg is None else float(mg)
        self.settings = s

    def head_config(self) -> dict:
        return {}

    def _encode(self, texts) -> list:
        return [e.ids for e in encode_texts(self.tok, list(texts), None, self.max_seq_len)]

    def read(self, path, max_samples=None, require_labels=True):
        """A training/evaluation pairs file → :class:`PairExample` rows; a BEIR dir (evaluation) → its
        :class:`RetrievalSet` (scored by search over the corpus: :meth:`evaluate` embeds it then)."""
        p = Path(path)
        return read_retrieval_set(p, max_samples) if p.is_dir() else read_pairs(p, max_samples)

    def encode(self, items, require_labels=False, source="the input"):
        """:class:`PairExample` rows → :class:`Pairs` (:meth:`load_examples`); a :class:`RetrievalSet` as it is."""
        return items if isinstance(items, RetrievalSet) else self.load_examples(items)

    def load_examples(self, ex: list):
        """:class:`PairExample` rows → encoded :class:`Pairs` (one token-id list per column; ``teacher_margin``
        where the row has teacher scores)."""
        cols = [self._encode(texts) for texts in zip(*[(e.query, e.positive, *e.negatives) for e in ex])]
        items = [{"input_ids": [c[i] for c in cols]} for i in range(len(ex))]
        for it, e in zip(items, ex):
            if e.scores is not None and len(e.scores) >= 2:
                it["teacher_margin"] = e.scores[0] - e.scores[1]
        return Pairs(items, ex)

    def collator(self):
        return ColumnCollator(pad_id(self.tok))

    def prepare_model(self, model, train_ds=None) -> None:
        """Give ``model``'s :class:`EmbeddingHead` this adapter's settings and, with ``hard_negatives`` > 0,
        add that many negatives to every training item, mined with ``model`` (:func:`mine_hard_negatives`)
        over the training set's distinct positives."""
        if isinstance(getattr(model, "head", None), EmbeddingHead):
            model.head.settings = self.settings
        if self.hard_negatives and train_ds is not None:
            self.add_hard_negatives(model, train_ds)

    def add_hard_negatives(self, model, train_ds: Pairs) -> None:
        """Append ``hard_negatives`` mined negatives to every item of ``train_ds``: the corpus is the distinct
        positives; a query's exclusions are the positives of every row with the same query text, and documents
        within ``hard_negatives_margin`` of its positive's score (:func:`mine_hard_negatives`). One stderr line
        says what was excluded."""
        ex = train_ds.examples
        docs = list(dict.fromkeys(e.positive for e in ex))
        index = {t: i for i, t in enumerate(docs)}
        of_query = positives_by_query(ex, index)
        was = model.training
        model.eval()
        s = self.settings
        qe = embed_texts(model, self.tok, [e.query for e in ex], self.max_seq_len, s.pooling, s.normalize)
        de = embed_texts(model, self.tok, docs, self.max_seq_len, s.pooling, s.normalize)
        model.train(was)
        self.mining_stats = {}
        mined = mine_hard_negatives(qe, de, [sorted(of_query[e.query]) for e in ex], self.hard_negatives,
                                    self.hard_negatives_skip, s.similarity, self.hard_negatives_margin,
                                    self.mining_stats)
        mining_note(self.hard_negatives, len(docs), ex, of_query, self.hard_negatives_margin, self.mining_stats)
        doc_ids = self._encode(docs)
        for it, negs in zip(train_ds, mined):
            it["input_ids"] = list(it["input_ids"]) + [doc_ids[j] for j in negs]

    def embed(self, model, texts, batch_size: int = 64) -> np.ndarray:
        """(N, H) embeddings of ``texts``: a PyTorch model with this adapter's pooling, or a runner of
        :mod:`bertforge.runtime` through :class:`bertforge.runtime.embedder.Embedder` (the dir's pooling)."""
        s = self.settings
        if not isinstance(model, torch.nn.Module):
            p = model.model_dir.pooling  # a runner: the pooling its dir declares
            return embed_texts(model, self.tok, texts, self.max_seq_len, p.mode, p.normalize, batch_size)
        return embed_texts(model, self.tok, texts, self.max_seq_len, s.pooling, s.normalize, batch_size)

    def evaluate(self, model, dataset, batch_size: int = 64) -> dict:
        """Retrieval metrics of ``model`` on ``dataset`` (a :class:`RetrievalSet`, or :class:`Pairs`: their
        positives are the corpus): exact search over the corpus, :func:`bertforge.metrics.retrieval.
        retrieval_metrics`; with Matryoshka dims also ``ndcg@10@<dim>`` for each smaller dim. With
        ``truncate_dim`` the headline metrics (``ndcg@10`` …, the one that picks the best checkpoint) are those
        of the dim the saved dir serves, as ``retrieval-eval`` of that dir reports them, and the full width's
        NDCG@10 is ``ndcg@10@<width>``."""
        from ..metrics.retrieval import exact_search, retrieval_metrics, run_from_topk
        rs = dataset if isinstance(dataset, RetrievalSet) else pairs_to_retrieval_set(dataset.examples)
        if isinstance(model, torch.nn.Module):
            model.eval()
        qids, dids = list(rs.queries), list(rs.corpus)
        q = self.embed(model, [rs.queries[i] for i in qids], batch_size)
        d = self.embed(model, [rs.corpus[i] for i in dids], batch_size)
        out = {}
        width = q.shape[1]
        served = self.truncate_dim if self.truncate_dim and self.truncate_dim < width else None  # None: all
        smaller = {m for m in (self.settings.matryoshka_dims or []) if m < width} | ({served} - {None})
        for dim in [None, *sorted(smaller, reverse=True)]:
            qs, ds = (q, d) if dim is None else (q[:, :dim], d[:, :dim])
            score = self.settings.similarity if dim is None else "cos"
            run = run_from_topk(qids, dids, *exact_search(qs, ds, top_k=100, score=score))
            m = retrieval_metrics(run, rs.qrels)
            if dim == served:
                out.update({k: v for k, v in m.items() if k in ("ndcg@10", "mrr@10", "recall@1", "recall@10",
                                                                 "recall@100")})
            if dim is not None or served is not None:  # the full width apart from the headline when it isn't it
                out[f"ndcg@10@{dim or width}"] = m["ndcg@10"]
        return out

    def predictions(self, model, dataset, batch_size=64) -> list:
        """Per example: ``id`` and ``embedding`` of its query (list of floats)."""
        ex = dataset.examples
        q = self.embed(model, [e.query for e in ex], batch_size)
        return [{"id": e.id, "embedding": [float(x) for x in v]} for e, v in zip(ex, q)]

    def finish_dir(self, model, out_dir) -> None:
        """Make ``out_dir`` (a saved checkpoint) an embedding dir: the pooling in the sentence-transformers
        layout (:func:`bertforge.models.pooling.write_pooling`) and, with ``truncate_dim``, the dimension
        served (``config_sentence_transformers.json``)."""
        from ..models.pooling import write_pooling, write_truncate_dim
        s = self.settings
        write_pooling(out_dir, s.pooling, s.normalize, hidden_size=model.config.hidden_size,
                      max_seq_length=self.max_seq_len)
        if self.truncate_dim:
            write_truncate_dim(out_dir, self.truncate_dim)


def read_retrieval_set(path, max_queries: Optional[int] = None) -> RetrievalSet:
    """A BEIR dir (:func:`bertforge.data.beir.read_beir`) as a :class:`RetrievalSet` (the first
    ``max_queries`` queries that have judgements)."""
    from ..data.beir import read_beir
    b = read_beir(path, "test")
    queries, corpus, qrels = b.queries, b.corpus, b.qrels
    qids = [q for q in queries if q in qrels]
    if max_queries:
        qids = qids[:max_queries]
    return RetrievalSet({q: queries[q] for q in qids}, dict(corpus), {q: qrels[q] for q in qids}, str(path))


__all__ = ["TASKS", "CONTRASTIVE_LOSSES", "EmbeddingHead", "EmbeddingSettings", "RetrievalAdapter",
           "PairExample", "RetrievalSet", "ColumnCollator", "Pairs", "read_pairs", "pairs_to_retrieval_set",
           "mnrl_loss", "mnrl_symmetric_loss", "matryoshka_loss", "margin_mse_loss", "similarity",
           "embed_texts", "mine_hard_negatives", "check_dims", "read_retrieval_set", "SETTINGS_KEYS"]
