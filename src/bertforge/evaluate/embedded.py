"""Task-free evaluation of an encoder on the embedded default data, for PyTorch and ONNX Runtime models.

Every model — a checkpoint dir run by PyTorch, or an ``.onnx`` graph (FP32 or INT8) run by ONNX Runtime
— is wrapped in an :class:`Embedder` that returns mean-pooled sentence embeddings

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

from ..errors import CheckpointError, ConfigError


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, T, H) hidden states, (B, T) mask of 1/0 → (B, H) mean over unmasked positions."""
    m = mask[..., None].astype(np.float32)
    return (hidden.astype(np.float32) * m).sum(1) / np.clip(m.sum(1), 1.0, None)


class Embedder:
    """Interface: ``embed(texts) -> (N, H) float32``; ``forward(input_ids, attention_mask,
    token_type_ids)`` for timing; ``num_parameters``; ``size_mb``; ``backend``; ``name``."""

    backend = "?"

    #: token positions the model can embed (None: unknown); texts are truncated to it
    max_positions: Optional[int] = None

    def __init__(self, name: str, tokenizer, path: Path):
        self.name, self.tok, self.path = name, tokenizer, Path(path)

    def truncation(self, max_seq_len: int) -> int:
        """``max_seq_len`` capped at the model's positions (a truncation length, like a tokenizer's)."""
        return max_seq_len if self.max_positions is None else min(max_seq_len, self.max_positions)

    def _batches(self, texts: list, max_seq_len: int, batch_size: int):
        from ..tokenizer import encode_texts, pad_id
        encs = encode_texts(self.tok, texts, None, self.truncation(max_seq_len))
        pid = pad_id(self.tok)
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].ids))
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            t = max(len(encs[i].ids) for i in idx)
            ids = np.full((len(idx), t), pid, dtype=np.int64)
            am = np.zeros((len(idx), t), dtype=np.int64)
            tt = np.zeros((len(idx), t), dtype=np.int64)
            for r, i in enumerate(idx):
                n = len(encs[i].ids)
                ids[r, :n], am[r, :n], tt[r, :n] = encs[i].ids, 1, encs[i].type_ids
            yield idx, ids, am, tt

    def embed(self, texts: list, max_seq_len: int = 256, batch_size: int = 16) -> np.ndarray:
        """Mean-pooled last-layer embeddings, (N, H) float32, in the order of ``texts``."""
        out: list = [None] * len(texts)
        for idx, ids, am, tt in self._batches(texts, max_seq_len, batch_size):
            pooled = mean_pool(self.hidden(ids, am, tt), am)
            for i, row in zip(idx, pooled):
                out[i] = row
        return np.stack(out)

    @property
    def can_embed(self) -> bool:
        return True

    def hidden(self, input_ids: np.ndarray, attention_mask: np.ndarray,
               token_type_ids: np.ndarray) -> np.ndarray:
        """(B, T) int64 arrays → last-layer hidden states (B, T, H) float32."""
        raise NotImplementedError

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray):
        """One full inference call (what latency measures)."""
        raise NotImplementedError

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray):
        """Task-head logits (B, num_labels) float32, or None for a head-less encoder."""
        return None

    @property
    def size_mb(self) -> float:
        files = getattr(self, "weight_files", None) or [self.weights_file]
        return sum(f.stat().st_size for f in files) / 1e6


class TorchEmbedder(Embedder):
    """A checkpoint dir (HF layout) run by bertforge's PyTorch encoder, FP32, ``torch.inference_mode``.

    The model is loaded with the head it was saved with; embeddings read the encoder's last layer
    (all positions), latency times the whole forward (encoder + head), as it would be served.
    """

    backend = "torch"

    def __init__(self, model_dir, name: Optional[str] = None):
        import torch

        from ..hf import load_pretrained
        from ..tokenizer import load_tokenizer
        model_dir = Path(model_dir)
        super().__init__(name or model_dir.name, load_tokenizer(model_dir), model_dir)
        from ..kernels import apply_kernels
        self.model = apply_kernels(load_pretrained(model_dir).eval(), "auto")  # speed only
        from ..hf import read_config, token_positions
        self.max_positions = token_positions(read_config(model_dir))
        self.torch = torch
        from ..hf import weight_files
        self.weight_files = weight_files(model_dir)  # one file, or a sharded checkpoint's shards
        self.weights_file = self.weight_files[0]
        self.num_parameters = sum(p.numel() for p in self.model.parameters())

    def _tensors(self, input_ids, attention_mask, token_type_ids) -> dict:
        t = self.torch
        return {"input_ids": t.from_numpy(input_ids), "attention_mask": t.from_numpy(attention_mask),
                "token_type_ids": t.from_numpy(token_type_ids)}

    def hidden(self, input_ids, attention_mask, token_type_ids):
        with self.torch.inference_mode():
            out = self.model.encoder(**self._tensors(input_ids, attention_mask, token_type_ids))
        return out.last_hidden_state.float().numpy()

    def forward(self, input_ids, attention_mask, token_type_ids):
        with self.torch.inference_mode():
            out = self.model(**self._tensors(input_ids, attention_mask, token_type_ids))
        return out.logits if out.logits is not None else out.last_hidden_state

    def logits(self, input_ids, attention_mask, token_type_ids):
        if self.model.head is None:
            return None
        with self.torch.inference_mode():
            out = self.model(**self._tensors(input_ids, attention_mask, token_type_ids))
        return out.logits.float().numpy()


class OnnxEmbedder(Embedder):
    """An ``.onnx`` graph run by ONNX Runtime (CPU execution provider, all graph optimisations on).

    Inputs are fed by name (``input_ids``, ``attention_mask``, ``token_type_ids`` — whichever the graph
    declares); embeddings read the output ``last_hidden_state`` (else the first rank-3 output), task
    metrics the output ``logits``.
    The tokenizer is read from ``tokenizer_dir`` or the graph's folder.
    Raises:
        CheckpointError: file missing / unreadable, no tokenizer, or neither output.
    """

    backend = "onnxruntime"

    def __init__(self, onnx_path, name: Optional[str] = None, tokenizer_dir=None,
                 threads: Optional[int] = None):
        import onnxruntime as ort

        from ..tokenizer import load_tokenizer
        onnx_path = Path(onnx_path)
        if not onnx_path.is_file():
            raise CheckpointError(f"{onnx_path} does not exist; pass an .onnx file written by "
                                  f"`bertforge export` / `bertforge quantize`")
        tok_dir = Path(tokenizer_dir) if tokenizer_dir else onnx_path.parent
        super().__init__(name or onnx_path.stem, load_tokenizer(tok_dir), onnx_path)
        if (tok_dir / "config.json").is_file():  # the export dir keeps the model's config
            from ..hf import read_config, token_positions
            self.max_positions = token_positions(read_config(tok_dir))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads is None:
            import torch
            threads = torch.get_num_threads()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise CheckpointError(f"ONNX Runtime cannot load {onnx_path} ({str(e).splitlines()[0][:160]}); "
                                  f"re-export it") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        outs = self.session.get_outputs()
        names = [o.name for o in outs]
        rank3 = [o.name for o in outs if o.shape is not None and len(o.shape) == 3]
        self.hidden_output = "last_hidden_state" if "last_hidden_state" in names else \
            (rank3[0] if rank3 and "logits" not in names else None)
        self.logits_output = "logits" if "logits" in names else None
        if self.hidden_output is None and self.logits_output is None:
            raise CheckpointError(f"{onnx_path} has neither a last_hidden_state nor a logits output "
                                  f"({', '.join(names)}); export it with `bertforge export`")
        self.weights_file = onnx_path
        self.num_parameters = onnx_num_parameters(onnx_path)

    @property
    def can_embed(self) -> bool:
        return self.hidden_output is not None

    def _feed(self, input_ids, attention_mask, token_type_ids) -> dict:
        feed = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return {k: feed[k] for k in self.input_names}

    def hidden(self, input_ids, attention_mask, token_type_ids):
        if self.hidden_output is None:
            raise CheckpointError(f"{self.path} outputs logits only; export the base encoder to embed")
        return self.session.run([self.hidden_output], self._feed(input_ids, attention_mask, token_type_ids))[0]

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.hidden_output or self.logits_output
        return self.session.run([out], self._feed(input_ids, attention_mask, token_type_ids))[0]

    def logits(self, input_ids, attention_mask, token_type_ids):
        if self.logits_output is None:
            return None
        return self.session.run([self.logits_output],
                                self._feed(input_ids, attention_mask, token_type_ids))[0].astype(np.float32)

    @property
    def size_mb(self) -> float:
        p = self.path
        extra = sum(f.stat().st_size for f in p.parent.glob(p.name + ".data")) if p.parent.is_dir() else 0
        return (p.stat().st_size + extra) / 1e6


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


def load_embedder(path, name: Optional[str] = None, tokenizer_dir=None) -> Embedder:
    """A checkpoint dir → :class:`TorchEmbedder`; an ``.onnx`` file (or a dir holding exactly one, with
    no ``model.safetensors``) → :class:`OnnxEmbedder`. ``minilm`` names the embedded teacher.
    Raises:
        CheckpointError: nothing loadable at ``path``.
    """
    from ..commands._common import resolve_model_dir
    p = resolve_model_dir(str(path))
    if not p.exists():
        raise CheckpointError(f"model {path} does not exist; pass a checkpoint dir, an .onnx file or 'minilm'")
    if name is None and str(p) != str(path) and not Path(path).exists():
        name = str(path)  # an alias such as 'minilm': the row is named after it, not its folder
    if p.is_file() and p.suffix == ".onnx":
        return OnnxEmbedder(p, name, tokenizer_dir)
    from ..hf import weight_files
    if p.is_dir() and not weight_files(p):
        graphs = sorted(p.glob("*.onnx"))
        if len(graphs) == 1:
            return OnnxEmbedder(graphs[0], name or p.name, tokenizer_dir)
        if len(graphs) > 1:
            raise CheckpointError(f"{p} holds several .onnx files ({', '.join(g.name for g in graphs)}); "
                                  f"pass one of them")
    return TorchEmbedder(p, name)


# ------------------------------------------------------------------------------------------ metrics
def lee_spearman(embedder: Embedder, max_seq_len: int = 256, docs=None, ratings=None) -> float:
    """Spearman ρ between cosine similarities of mean-pooled embeddings and the human ratings of the
    1225 pairs (i < j) of the Lee 50-document corpus. ``docs``/``ratings`` default to gensim's files."""
    from scipy.stats import spearmanr

    from ..data.embedded import lee_corpus
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

    from ..data.embedded import polarity_sentences
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
                      iters: int = 10, warmup: int = 3, progress: bool = True) -> dict:
    """Latency (ms) of one forward pass for each embedder, measured in ``rounds`` interleaved rounds of
    ``iters`` timed calls each (after ``warmup`` untimed calls), so that load from other processes falls
    on every model alike. Returns ``{name: {"p50_ms", "p90_ms", "min_ms", "n"}}``."""
    from tqdm.auto import tqdm
    inputs = {e.name: latency_inputs(e, seq_len, batch_size) for e in embedders}
    times: dict = {e.name: [] for e in embedders}
    for e in embedders:
        for _ in range(warmup):
            e.forward(*inputs[e.name])
    bar = tqdm(total=rounds * len(embedders), desc="latency", unit="model", disable=not progress,
               dynamic_ncols=True)
    for _ in range(rounds):
        for e in embedders:
            x = inputs[e.name]
            for _ in range(iters):
                t0 = time.perf_counter()
                e.forward(*x)
                times[e.name].append((time.perf_counter() - t0) * 1e3)
            bar.update(1)
    bar.close()
    return {k: {"p50_ms": float(np.percentile(v, 50)), "p90_ms": float(np.percentile(v, 90)),
                "min_ms": float(np.min(v)), "n": len(v)} for k, v in times.items()}


def task_metrics(embedder: Embedder, task_name: str, data, max_seq_len: int = 128,
                 batch_size: int = 64, max_samples: Optional[int] = None) -> Optional[dict]:
    """Task metrics (the task's own, e.g. ``accuracy``) of a fine-tuned model on a labelled file, from
    its head's ``logits`` — PyTorch or ONNX Runtime alike. None when the model has no task head.
    Only sequence classification / regression tasks. Raises DataError for unreadable data."""
    from ..adapters import adapter_for
    from ..data.tasks import get_task
    from ..evaluate.metrics import compute
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
                       task_max_samples: Optional[int] = None) -> list:
    """All figures for each embedder: ``lee_spearman``, ``polarity_acc`` (+ ``_std``) — None for a graph
    that only outputs logits —, ``task`` metrics when ``task``/``task_data`` are given, ``latency_ms``
    (p50), ``latency_p90_ms``, ``params``, ``size_mb``, ``backend``. Returns a list of dicts in order."""
    from tqdm.auto import tqdm
    if not embedders:
        raise ConfigError("no models to evaluate; pass --model at least once")
    rows = []
    for e in tqdm(embedders, desc="quality", unit="model", disable=not progress, dynamic_ncols=True):
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
    lat = measure_latencies(embedders, seq_len, batch_size, rounds, iters, progress=progress)
    for r in rows:
        r.update(latency_ms=lat[r["name"]]["p50_ms"], latency_p90_ms=lat[r["name"]]["p90_ms"],
                 latency_min_ms=lat[r["name"]]["min_ms"], latency_seq_len=seq_len,
                 latency_batch_size=batch_size)
    return rows


__all__ = ["Embedder", "TorchEmbedder", "OnnxEmbedder", "load_embedder", "lee_spearman",
           "polarity_accuracy", "measure_latencies", "evaluate_embedders", "mean_pool",
           "onnx_num_parameters", "task_metrics"]
