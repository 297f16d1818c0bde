"""Task-free evaluation of an encoder on the embedded default data, for PyTorch and ONNX Runtime models.

Every model — a checkpoint dir run by PyTorch, or an ``.onnx`` graph (FP32 or INT8) run by ONNX Runtime,
each through :mod:`bertforge.runtime` — is wrapped in an :class:`Embedder` that returns mean-pooled
sentence embeddings

    e = Σ_t m_t·h_t / Σ_t m_t      (h_t: last-layer hidden state (H,), m_t: attention_mask ∈ {0, 1})

as Sentence-BERT does (Reimers & Gurevych 2019, §3, MEAN strategy). On them:

* :func:`lee_spearman` — Spearman ρ between cosine(e_i, e_j) and the mean human rating of each of the
  1225 document pairs i < j of the Lee 50-document corpus (Lee, Pincombe & Welsh 2005);
* :func:`polarity_accuracy` — 5-fold stratified cross-validated accuracy of a scikit-learn logistic
  regression on the embeddings of the 200 Pang–Lee polarity sentences (a linear probe, as SentEval's
  MR task, Conneau & Kiela 2018);
* :func:`measure_latencies` — wall-clock latency (ms) of one forward pass at a fixed shape (default
  seq 128, batch 1), measured for several models in interleaved rounds so that load from other
  processes hits every model alike; p50 and p90 are reported;
* parameters (count of weights stored in the file) and file size (MB = 10⁶ bytes).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..data.bundled import lee_corpus, polarity_sentences
from ..data.collate import length_sorted_batches
from ..errors import CheckpointError, ConfigError
from ..metrics.task import compute
from ..tasks import adapter_for, get_task
from ..tokenizer import encode_texts, pad_id
from . import load_runner


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, T, H) hidden states, (B, T) mask of 1/0 → (B, H) mean over unmasked positions."""
    m = mask[..., None].astype(np.float32)
    return (hidden.astype(np.float32) * m).sum(1) / np.clip(m.sum(1), 1.0, None)


class Embedder:
    """A model as a sentence encoder: ``embed(texts) -> (N, H) float32`` (last hidden states pooled as the
    dir declares: :func:`bertforge.models.pooling.read_pooling` — mean, CLS or max, L2-normalised or not;
    mean and not normalised for a dir that declares nothing), optionally cut to its first ``dim`` coordinates
    (Matryoshka truncation, Kusupati et al. 2022, §3),
    ``forward(input_ids, attention_mask, token_type_ids)`` for timing, ``logits`` for task metrics,
    ``num_parameters``, ``size_mb``, ``backend``, ``name``. The model is run by a
    :class:`bertforge.runtime.base.Runner` (PyTorch, ONNX Runtime …; see :func:`load_embedder`).

    ``num_parameters``: a PyTorch model's distinct weights; for an ONNX graph the weights stored in the file
    (:func:`onnx_num_parameters`). ``size_mb``: the weight files in MB = 10⁶ bytes.
    """

    backend = "?"

    #: token positions the model can embed (None: unknown); texts are truncated to it
    max_positions: Optional[int] = None

    def __init__(self, runner, name: Optional[str] = None, dim: Optional[int] = None, pooling=None):
        from ..checkpoint.modeldir import ModelDir
        md = runner.model_dir or ModelDir.open(runner.path, require_config=False)
        self.runner = runner
        self.name = name or (runner.path.stem if runner.path.is_file() else runner.path.name)
        self.tok, self.path, self.backend = runner.tokenizer, runner.path, runner.backend
        self.max_positions = runner.max_length
        self.num_parameters = (onnx_num_parameters(runner.onnx_path)  # a graph exported on the fly is gone
                               if runner.backend == "onnxruntime" and runner.onnx_path.is_file()
                               else runner.num_parameters)
        #: :class:`bertforge.models.pooling.Pooling` (mode, normalize, max_seq_length) read from the dir
        self.pooling = pooling if pooling is not None else md.pooling
        width = self.width
        if dim is None:  # a Matryoshka dir serves the dim it records (sentence-transformers' truncate_dim)
            dim = md.truncate_dim
        if dim is not None and (dim < 1 or (width is not None and dim > width)):
            raise ConfigError(f"--dim {dim} is not in 1..{width}: model {self.name!r} gives {width}-dimensional "
                              f"vectors; pass a smaller --dim")
        #: coordinates kept (Matryoshka truncation); None: all
        self.dim = dim
        #: tokens a text is cut at when no ``max_seq_len`` is given: the dir's declared ``max_seq_length``
        #: capped at the positions, as the server cuts (:meth:`~bertforge.checkpoint.modeldir.ModelDir.embed_max_length`)
        self.max_seq_len = md.embed_max_length(self.max_positions)
        #: the prompts the dir declares (:class:`bertforge.checkpoint.layout.Prompts`)
        self.prompts = md.prompts

    @property
    def width(self) -> Optional[int]:
        """The width of the pooled vectors (``hidden_size`` of the config), None when unknown."""
        cfg = getattr(self.runner, "config", None) or {}
        h = cfg.get("hidden_size") or cfg.get("dim") or cfg.get("d_model")
        return int(h) if isinstance(h, int) else None

    def truncation(self, max_seq_len: int) -> int:
        """``max_seq_len`` capped at the model's positions (a truncation length, like a tokenizer's)."""
        return max_seq_len if self.max_positions is None else min(max_seq_len, self.max_positions)

    def _batches(self, texts: list, max_seq_len: int, batch_size: int):
        encs = encode_texts(self.tok, texts, None, self.truncation(max_seq_len), offsets=False)
        return length_sorted_batches(encs, pad_id(self.tok), batch_size)

    def embed(self, texts: list, max_seq_len: Optional[int] = None, batch_size: int = 16,
              normalize: Optional[bool] = None, prompt_name: Optional[str] = None) -> np.ndarray:
        """Sentence embeddings, (N, dim or H) float32, in the order of ``texts``: the last hidden states pooled
        by :attr:`pooling` (:func:`bertforge.models.pooling.pool_numpy`), cut to :attr:`dim` coordinates, then
        L2-normalised when the dir says so (``normalize`` overrides it). Each text is prefixed with the prompt
        ``prompt_name`` names (None: the dir's ``default_prompt_name``, as ``SentenceTransformer.encode``
        does; ``""``: none), then cut at ``max_seq_len`` tokens (None: :attr:`max_seq_len`, the dir's; capped
        at the model's positions); batches are formed by length. Raises ConfigError for a prompt name the dir
        does not declare."""
        from ..models.pooling import pool_numpy
        if max_seq_len is None:
            max_seq_len = self.max_seq_len
        if prompt_name != "":
            try:
                prompt = self.prompts.text(prompt_name)
            except KeyError:
                raise ConfigError(f"prompt {prompt_name!r} is not declared by {self.name}; choose one of "
                                  f"{', '.join(self.prompts.prompts) or 'none'}") from None
            if prompt:
                texts = [prompt + t for t in texts]
        norm = self.pooling.normalize if normalize is None else normalize
        width = self.dim or self.width or 0
        out = np.zeros((len(texts), width), dtype=np.float32) if width else None
        for idx, ids, am, tt in self._batches(texts, max_seq_len, batch_size):
            pooled = pool_numpy(self.hidden(ids, am, tt), am, self.pooling.mode)
            if self.dim:
                pooled = pooled[:, :self.dim]
            if norm:
                pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            if out is None or out.shape[1] != pooled.shape[1]:
                out = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
            out[np.asarray(idx)] = pooled
        return out if out is not None else np.zeros((0, width), dtype=np.float32)

    @property
    def can_embed(self) -> bool:
        """Whether the model gives hidden states (a graph exported with a task head gives logits only)."""
        return "last_hidden_state" in self.runner.outputs

    def hidden(self, input_ids: np.ndarray, attention_mask: np.ndarray,
               token_type_ids: np.ndarray) -> np.ndarray:
        """(B, T) int64 arrays → last-layer hidden states (B, T, H) float32 (all positions, also under a
        head that reads [CLS] only)."""
        if not self.can_embed:
            raise CheckpointError(f"{self.path} outputs logits only; export the base encoder to embed")
        return self.runner(input_ids, attention_mask, token_type_ids,
                           outputs=("last_hidden_state",))["last_hidden_state"]

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray):
        """One full inference call, encoder and head, as it would be served (what latency measures)."""
        return self.runner(input_ids, attention_mask, token_type_ids)

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray):
        """Task-head logits (B, num_labels) float32, or None for a head-less encoder."""
        if "logits" not in self.runner.outputs:
            return None
        return self.runner(input_ids, attention_mask, token_type_ids, outputs=("logits",))["logits"]

    @property
    def size_mb(self) -> float:
        return sum(f.stat().st_size for f in self.runner.weight_files) / 1e6


def onnx_num_parameters(path) -> int:
    """Number of weights stored as initializers of an ONNX graph (INT8 weights count once; scales and
    zero points of quantization, ≤ 1 per output channel, are excluded as bookkeeping)."""
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    n = 0
    for init in m.graph.initializer:
        if init.name.endswith(("_scale", "_zero_point")):
            continue
        n += int(np.prod(init.dims)) if len(init.dims) else 1
    return n


def load_embedder(path, name: Optional[str] = None, tokenizer_dir=None,
                  threads: Optional[int] = None, dim: Optional[int] = None) -> Embedder:
    """An :class:`Embedder` over :func:`bertforge.runtime.load_runner` of ``path``: a checkpoint dir (PyTorch),
    an ``.onnx`` file or a dir holding one (ONNX Runtime), or ``minilm`` (the embedded teacher).
    ``tokenizer_dir``: where a graph's tokenizer is read when its folder has none. ``dim``: keep the first
    ``dim`` coordinates of each vector (a Matryoshka model's truncation).
    Raises:
        CheckpointError: nothing loadable at ``path``.
        ConfigError: ``dim`` larger than the model's width.
    """
    from ..checkpoint.modeldir import ModelDir
    md = ModelDir.open(path, require_config=False)
    p = md.graph if md.graph is not None and str(path).endswith(".onnx") else md.path
    if name is None and str(p) != str(path) and not Path(path).exists():
        name = str(path)  # an alias such as 'minilm': the row is named after it, not its folder
    name = name or (p.stem if p.is_file() else p.name)
    return Embedder(load_runner(md, threads=threads, tokenizer_dir=tokenizer_dir), name, dim=dim)


# ------------------------------------------------------------------------------------------ metrics
def evaluate_retrieval(embedder, data, index: str = "exact", batch_size: int = 32, max_seq_len: Optional[int] = None,
                       top_k: int = 100, k_values=(1, 10, 100), return_vectors: bool = False,
                       ignore_identical_ids: bool = True) -> dict:
    """Embed ``data`` (:class:`bertforge.data.beir.BeirData`) with ``embedder``
    (:class:`bertforge.runtime.embedder.Embedder`), rank by cosine (``index``: ``exact`` or a faiss kind) and
    score (with ``ignore_identical_ids``, BEIR's default, a document whose id is the query's own id is left out
    of that query's ranking). Returns the metrics of :func:`bertforge.metrics.retrieval.retrieval_metrics` plus
    ``documents``, ``dim``, ``index``, ``docs_per_s`` / ``queries_per_s`` (encoding throughput, texts/s) and
    ``search_s``; with ``return_vectors`` also ``(doc_vectors (N, d), query_vectors (Q, d))`` as a second value."""
    from ..metrics.retrieval import build_index, exact_search, retrieval_metrics, run_from_topk
    doc_ids, q_ids = list(data.corpus), list(data.queries)
    max_seq_len = max_seq_len or embedder.max_seq_len
    t0 = time.perf_counter()
    dv = embedder.embed([data.corpus[d] for d in doc_ids], max_seq_len, batch_size)
    t1 = time.perf_counter()
    qv = embedder.embed([data.queries[q] for q in q_ids], max_seq_len, batch_size)
    t2 = time.perf_counter()
    k = max(max(k_values), top_k)
    if index == "exact":
        s, i = exact_search(qv, dv, k, "cos")
    else:
        s, i = build_index(dv, index, "cos").search(qv, k)
    t3 = time.perf_counter()
    m = retrieval_metrics(run_from_topk(q_ids, doc_ids, s, i), data.qrels, k_values,
                          ignore_identical_ids=ignore_identical_ids)
    m.update(documents=len(doc_ids), dim=int(dv.shape[1]), index=index, max_seq_len=max_seq_len,
             docs_per_s=len(doc_ids) / max(t1 - t0, 1e-9), queries_per_s=len(q_ids) / max(t2 - t1, 1e-9),
             search_s=t3 - t2)
    return (m, (dv, qv)) if return_vectors else m


def heldout_agreement(embedders: list, documents: list, reference: Optional[str] = None, max_seq_len: int = 128,
                      batch_size: int = 32, max_passages: int = 128, k: int = 10,
                      sentences_per_passage: int = 3) -> dict:
    """Teacher–student agreement on held-out documents, and a small retrieval set built from them.

    ``documents`` (lists of sentences; e.g. the demo corpus's ``heldout.txt``, text no model was trained on)
    become :func:`bertforge.data.beir.passage_set` passages (``sentences_per_passage`` sentences, up to
    ``max_passages``; the middle sentence is the query of the others). Each embedder embeds the passages and queries; per embedder:

    * ``heldout_ndcg@10``, ``heldout_mrr@10``, ``heldout_recall@1`` — that retrieval set, exact cosine search
      (:func:`bertforge.metrics.retrieval.retrieval_metrics`);
    * ``agreement_spearman`` — Spearman ρ between its and the reference's cosine similarities over all passage
      pairs; ``agreement_overlap@10`` — mean share of each passage's 10 nearest passages that the reference
      also puts there (:func:`bertforge.metrics.retrieval.agreement`);
    * ``heldout_passages``.

    ``reference``: the embedder the others are compared with (default: the first, the teacher). Returns
    ``{name: {field: value}}``.
    """
    from ..data.beir import passage_set
    from ..metrics.retrieval import agreement
    data = passage_set(documents, sentences_per_passage, max_passages)
    ref = reference or embedders[0].name
    out, vecs = {}, {}
    for e in embedders:
        if not e.can_embed:
            continue
        m, (dv, _) = evaluate_retrieval(e, data, batch_size=batch_size, max_seq_len=max_seq_len,
                                        k_values=(1, 10), top_k=10, return_vectors=True)
        vecs[e.name] = dv
        out[e.name] = {"heldout_ndcg@10": m["ndcg@10"], "heldout_mrr@10": m["mrr@10"],
                       "heldout_recall@1": m["recall@1"], "heldout_passages": len(data.corpus)}
    if ref in vecs:
        for name, v in vecs.items():
            a = agreement(vecs[ref], v, k)
            out[name].update({"agreement_spearman": a["pair_spearman"],
                              f"agreement_overlap@{k}": a[f"overlap@{k}"], "agreement_reference": ref})
    return out

def lee_spearman(embedder: Embedder, max_seq_len: int = 256, docs=None, ratings=None) -> float:
    """Spearman ρ between cosine similarities of mean-pooled embeddings and the human ratings of the
    1225 pairs (i < j) of the Lee 50-document corpus. ``docs``/``ratings`` default to gensim's files."""
    from scipy.stats import spearmanr

    if docs is None:
        docs, ratings = lee_corpus()
    e = embedder.embed(docs, max_seq_len)
    e = e / np.linalg.norm(e, axis=1, keepdims=True).clip(1e-12)
    cos = e @ e.T
    iu = np.triu_indices(len(docs), 1)
    return float(spearmanr(cos[iu], np.asarray(ratings)[iu])[0])


def polarity_accuracy(embedder: Embedder, folds: int = 5, seed: int = 0, max_seq_len: int = 128,
                      texts=None, labels=None) -> tuple:
    """5-fold stratified CV accuracy of ``StandardScaler → LogisticRegression`` on mean-pooled
    embeddings of the Pang–Lee polarity sentences. Returns ``(mean, std)`` over folds, fractions."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if texts is None:
        texts, labels = polarity_sentences()
    x = embedder.embed(texts, max_seq_len)
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    scores = cross_val_score(clf, x, np.asarray(labels), cv=cv, scoring="accuracy")
    return float(scores.mean()), float(scores.std())


def latency_inputs(embedder: Embedder, seq_len: int = 128, batch_size: int = 1, seed: int = 0):
    """Fixed (batch, seq) int64 inputs: random non-special token ids, full attention mask."""
    rng = np.random.default_rng(seed)
    vocab = embedder.tok.get_vocab_size()
    ids = rng.integers(min(1000, vocab // 2), vocab, size=(batch_size, seq_len), dtype=np.int64)
    return ids, np.ones_like(ids), np.zeros_like(ids)


def measure_latencies(embedders: list, seq_len: int = 128, batch_size: int = 1, rounds: int = 5,
                      iters: int = 10, warmup: int = 3, progress: bool = True,
                      warmup_seconds: float = 0.2) -> dict:
    """Latency (ms) of one forward pass for each embedder, measured in ``rounds`` interleaved rounds of
    ``iters`` timed calls each, so that load from other processes falls on every model alike. Before its
    timed calls in every round each model runs untimed for at least ``warmup_seconds`` (and ``warmup`` calls
    before the first round): the previous model's thread pool (PyTorch's OpenMP workers, ONNX Runtime's
    spinning threads) keeps spinning for a while after its last call, and without this the few-ms INT8 graph
    timed right after a PyTorch model paid for it (the demo's 3 × 384 INT8 student measured 1.14× its FP32
    graph instead of the 3.3× `bench` gives it). Returns ``{name: {"p50_ms", "p90_ms", "min_ms", "n"}}``."""
    from .bench import time_calls
    from ..progress import Progress
    inputs = {e.name: latency_inputs(e, seq_len, batch_size) for e in embedders}
    times: dict = {e.name: [] for e in embedders}
    for e in embedders:
        for _ in range(warmup):
            e.forward(*inputs[e.name])
    bar = Progress(rounds * len(embedders), "latency", unit="model", show=progress)
    for _ in range(rounds):
        for e in embedders:
            x = inputs[e.name]
            times[e.name] += time_calls(lambda: e.forward(*x), warmup=1, iters=iters,  # noqa: B023
                                        warmup_seconds=warmup_seconds)
            bar.update(1)
    bar.close()
    return {k: {"p50_ms": float(np.percentile(v, 50)), "p90_ms": float(np.percentile(v, 90)),
                "min_ms": float(np.min(v)), "n": len(v)} for k, v in times.items()}


def task_metrics(embedder: Embedder, task_name: str, data, max_seq_len: int = 128,
                 batch_size: int = 64, max_samples: Optional[int] = None) -> Optional[dict]:
    """Task metrics (the task's own, e.g. ``accuracy``) of a fine-tuned model on a labelled file, from
    its head's ``logits`` — PyTorch or ONNX Runtime alike. None when the model has no task head.
    Only sequence classification / regression tasks. Raises DataError for unreadable data."""
    task = get_task(task_name)
    if task.kind not in ("classification", "regression"):
        raise ConfigError(f"task {task.name} is {task.kind}; embed-eval scores sequence tasks only")
    adapter = adapter_for(task, embedder.tok, embedder.truncation(max_seq_len))
    items = adapter.load(data, max_samples)
    collate = adapter.collator()
    preds: list = [None] * len(items)
    order = sorted(range(len(items)), key=lambda i: len(items[i]["input_ids"]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        b = collate([items[i] for i in idx])
        lg = embedder.logits(b["input_ids"].numpy(), b["attention_mask"].numpy(),
                             b["token_type_ids"].numpy())
        if lg is None:
            return None
        lg = np.asarray(lg)
        if lg.ndim != 2 or lg.shape[0] != len(idx):  # a token tagger or QA head: one output per token
            raise ConfigError(f"{embedder.name} is not a sequence classifier (its head outputs "
                              f"{tuple(lg.shape[1:])} per example); --task {task.name} needs a model "
                              f"fine-tuned on it")
        if lg.shape[1] != task.num_labels:
            raise ConfigError(f"{embedder.name} predicts {lg.shape[1]} labels but task {task.name} has "
                              f"{task.num_labels}; pass the task it was fine-tuned on")
        for i, row in zip(idx, lg):
            preds[i] = row
    logits = np.stack(preds)
    pred = logits[:, 0] if task.kind == "regression" else logits.argmax(-1)
    ref = np.array([it["labels"] for it in items])
    return compute(task.metrics, pred, ref, task.num_labels)


def evaluate_embedders(embedders: list, seq_len: int = 128, batch_size: int = 1, rounds: int = 5,
                       iters: int = 10, lee_max_seq_len: int = 256, progress: bool = True,
                       task: Optional[str] = None, task_data=None, task_max_seq_len: int = 128,
                       task_max_samples: Optional[int] = None, heldout=None,
                       reference: Optional[str] = None) -> list:
    """All figures for each embedder: ``lee_spearman``, ``polarity_acc`` (+ ``_std``) — None for a graph
    that only outputs logits —, ``task`` metrics when ``task``/``task_data`` are given, ``latency_ms``
    (p50), ``latency_p90_ms``, ``params``, ``size_mb``, ``backend``; with ``heldout`` (a text file of
    documents, or lists of sentences) the :func:`heldout_agreement` fields against ``reference`` (default the
    first embedder). Returns a list of dicts in order."""
    from ..progress import track
    if not embedders:
        raise ConfigError("no models to evaluate; pass --model at least once")
    rows = []
    for e in track(embedders, "quality", unit="model", show=progress):
        row = {"name": e.name, "backend": e.backend, "path": str(e.path), "lee_spearman": None,
               "polarity_acc": None, "polarity_acc_std": None}
        if e.can_embed:
            acc, acc_std = polarity_accuracy(e)
            row.update(lee_spearman=lee_spearman(e, lee_max_seq_len), polarity_acc=acc,
                       polarity_acc_std=acc_std)
        if task and task_data:
            row["task"] = task
            row["task_metrics"] = task_metrics(e, task, task_data, task_max_seq_len,
                                               max_samples=task_max_samples)
        row.update(params=int(e.num_parameters), size_mb=float(e.size_mb))
        rows.append(row)
    if heldout is not None:
        from ..data.beir import read_documents
        docs = read_documents(heldout) if isinstance(heldout, (str, Path)) else heldout
        agree = heldout_agreement(embedders, docs, reference)
        for r in rows:
            r.update(agree.get(r["name"], {}))
    lat = measure_latencies(embedders, seq_len, batch_size, rounds, iters, progress=progress)
    for r in rows:
        r.update(latency_ms=lat[r["name"]]["p50_ms"], latency_p90_ms=lat[r["name"]]["p90_ms"],
                 latency_min_ms=lat[r["name"]]["min_ms"], latency_seq_len=seq_len,
                 latency_batch_size=batch_size)
    return rows


__all__ = ["Embedder", "load_embedder", "evaluate_retrieval", "heldout_agreement", "lee_spearman",
           "polarity_accuracy", "measure_latencies", "evaluate_embedders", "mean_pool",
           "onnx_num_parameters", "task_metrics"]
