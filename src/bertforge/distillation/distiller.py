"""The distiller: an objective module whose ``forward(**batch)`` returns ``loss`` + ``terms``.

It is trained by the one :class:`~bertforge.engine.train.trainer.Trainer` like any model. It holds the student
(trainable), the learned projections W (student H → teacher H; one per term, shared by its layer pairs as
TinyBERT eq. 8's single W_h) and, outside its parameter tree, one or
more frozen teachers (``requires_grad=False``, always in eval mode, never saved in checkpoints).

A distillation setup is a list of *terms* (TextBrewer's "intermediate matches" + KD loss, as data):
``{loss: <name in LOSSES>, weight: w, layers: <map>, temperature: T, alpha: α, relation_heads: R}``.
Each term's weighted value is logged under its name (``terms`` → ``metrics.jsonl``).

What each loss compares — its *feature*: logits, hidden states, attention maps, values, pooled embeddings,
score margins — is one row of :data:`bertforge.distillation.features.FEATURES`, which says what it asks of the encoders,
how it is read and cached and how a term's value is formed; the distiller reads those rows and names no
feature itself. Teacher features come from the :class:`~bertforge.distillation.cache.TeacherCache` when the batch's
rows are cached (``example_index`` in the batch), else from running the teachers under ``no_grad``; the result is
then written to the cache. With several teachers the soft targets are averaged:
``p = (1/K) Σ_k softmax(z_k/T)`` (passed on as logits ``T·log p``); representation losses read the first
teacher (Hinton et al. 2015 §2 uses ensembles as the teacher; TinyBERT/MiniLM use one).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ..errors import ConfigError
from ..heads import MLM_HEAD, has_mlm_head  # noqa: F401  (has_mlm_head: imported from here by cli/commands/distill.py)
from ..models.output import ModelOutput
from ..task_model import TaskModel
from .cache import TeacherCache
from .features import Feature, get_feature, request_of
from .losses import get_loss
from .mapping import resolve_map


@dataclass
class Term:
    """One loss term: ``loss`` name, ``weight``, resolved layer ``pairs`` (student, teacher) for
    layer-wise losses, ``temperature``, ``alpha`` (kd), ``relation_heads`` (value_relation_kl)."""

    loss: str
    weight: float = 1.0
    pairs: list = field(default_factory=list)
    temperature: float = 1.0
    alpha: float = 1.0
    relation_heads: Optional[int] = None
    name: str = ""

    @property
    def spec(self):
        return get_loss(self.loss)

    @property
    def feature(self) -> Feature:
        """The row of :data:`~bertforge.distillation.features.FEATURES` this term's loss compares."""
        return get_feature(self.spec.feature)


#: method name → stage → list of term dicts (the defaults; recipes under recipes/distill/ may override)
METHODS: dict = {
    "kd": {  # Hinton et al. 2015
        "task": [{"loss": "kd", "weight": 1.0, "temperature": 2.0, "alpha": 0.5}],
        "general": [{"loss": "mlm_soft", "weight": 1.0, "temperature": 2.0}],
    },
    "distilbert": {  # Sanh et al. 2019: 5·L_ce + 2·L_mlm + 1·L_cos (no MLM labels in task stage)
        "task": [{"loss": "kd", "weight": 1.0, "temperature": 2.0, "alpha": 0.5},
                 {"loss": "cosine", "weight": 1.0, "layers": "last"}],
        "general": [{"loss": "mlm_soft", "weight": 5.0, "temperature": 2.0},
                    {"loss": "mlm", "weight": 2.0},
                    {"loss": "cosine", "weight": 1.0, "layers": "last"}],
    },
    "pkd": {  # Sun et al. 2019: (1−α)·CE + α·T²·KL + β·Σ PT, β = 100 (Table 1 grid {10,100,500,1000})
        "task": [{"loss": "kd", "weight": 1.0, "temperature": 5.0, "alpha": 0.5},
                 {"loss": "pkd", "weight": 100.0, "layers": "pkd_skip"}],
        "general": [{"loss": "pkd", "weight": 100.0, "layers": "uniform"}],
    },
    "tinybert": {  # Jiao et al. 2020: L = L_embd + Σ (L_hidn + L_attn) (+ L_pred in the task stage)
        "task": [{"loss": "embedding_mse", "weight": 1.0, "layers": [[0, 0]]},
                 {"loss": "hidden_mse", "weight": 1.0, "layers": "uniform"},
                 {"loss": "attention_mse", "weight": 1.0, "layers": "uniform"},
                 {"loss": "soft_ce", "weight": 1.0, "temperature": 1.0}],
        "general": [{"loss": "embedding_mse", "weight": 1.0, "layers": [[0, 0]]},
                    {"loss": "hidden_mse", "weight": 1.0, "layers": "uniform"},
                    {"loss": "attention_mse", "weight": 1.0, "layers": "uniform"}],
    },
    "minilm": {  # Wang et al. 2020: last-layer attention KL + value-relation KL
        "task": [{"loss": "attention_kl", "weight": 1.0, "layers": "last"},
                 {"loss": "value_relation_kl", "weight": 1.0, "layers": "last"},
                 {"loss": "kd", "weight": 1.0, "temperature": 1.0, "alpha": 1.0}],
        "general": [{"loss": "attention_kl", "weight": 1.0, "layers": "last"},
                    {"loss": "value_relation_kl", "weight": 1.0, "layers": "last"}],
    },
    "mobilebert": {  # Sun et al. 2020 §3.3-3.5: progressive transfer (one layer per stage, lower ones frozen:
        # distillation/progressive.py) of feature maps (FMT) and attention maps (AT), then pre-training distillation
        # α·L_MLM + (1−α)·L_KD (α = 0.5); the task stage ends on logit KD instead
        "task": [{"loss": "feature_map_mse", "weight": 1.0, "layers": "uniform"},
                 {"loss": "attention_kl", "weight": 1.0, "layers": "uniform"},
                 {"loss": "kd", "weight": 1.0, "temperature": 1.0, "alpha": 0.5}],
        "general": [{"loss": "feature_map_mse", "weight": 1.0, "layers": "uniform"},
                    {"loss": "attention_kl", "weight": 1.0, "layers": "uniform"},
                    {"loss": "mlm", "weight": 0.5},
                    {"loss": "mlm_soft", "weight": 0.5, "temperature": 1.0}],
    },
    "embedding_mse": {  # Reimers & Gurevych 2020 eq. 1: student's pooled embedding → teacher's (W when widths differ)
        "task": [{"loss": "pooled_mse", "weight": 1.0}],  # --task retrieval: every text of the pairs file
        "general": [{"loss": "pooled_mse", "weight": 1.0}],  # --corpus: sequences of raw text
    },
    "margin_mse": {  # Hofstätter et al. 2020 eq. 1: the teacher's score margins of (query, positive, negative)
        "task": [{"loss": "margin_mse", "weight": 1.0}],
        "general": [{"loss": "margin_mse", "weight": 1.0}],  # refused by the command: needs triples
    },
    "inbatch_kl": {  # Lin et al. 2021 (TCT-ColBERT) §3: each query's in-batch score distribution, teacher → student
        "task": [{"loss": "inbatch_kl", "weight": 1.0, "temperature": 1.0, "alpha": 1.0}],
        "general": [{"loss": "inbatch_kl", "weight": 1.0}],  # refused by the command: needs (query, positive) rows
    },
}

#: methods whose losses read sentence embeddings (the student is an embedding model; docs/search.md)
EMBEDDING_METHODS = ("embedding_mse", "margin_mse", "inbatch_kl")

#: losses whose ``alpha`` weighs the soft (teacher) part against the hard-label part (``--alpha``)
HARD_LABEL_LOSSES = ("kd", "inbatch_kl")

#: the file beside a distilled student holding its learned projections W (see :meth:`Distiller.save_projections`)
PROJECTIONS_FILE = "distill_projections.safetensors"

#: losses that read masked-LM logits (the general stage's MLM-corrupted inputs and MLM heads)
MLM_LOSSES = ("mlm_soft", "mlm")

_TERM_KEYS = {"loss", "weight", "layers", "temperature", "alpha", "relation_heads", "name"}


def mlm_head_name() -> str:
    """The head a general-stage student (and a teacher with any masked-LM head) is built with:
    :data:`bertforge.heads.MLM_HEAD`."""
    return MLM_HEAD


def method_terms(method: str, stage: str) -> list:
    """Default term dicts of a named method for a stage (``task`` | ``general``)."""
    if method not in METHODS:
        raise ConfigError(f"unknown distillation method {method!r}; choose one of {', '.join(METHODS)}")
    if stage not in ("task", "general"):
        raise ConfigError(f"unknown stage {stage!r}; choose task or general")
    return [dict(t) for t in METHODS[method][stage]]


def follows_layer_map(entry: dict) -> bool:
    """Whether a ``--layer-map`` replaces this loss entry's layer map: a layer-wise loss whose ``layers`` is a
    strategy name (default ``uniform``), except ``embedding_mse`` (always the embedding pair)."""
    return (get_loss(entry["loss"]).layerwise and entry["loss"] != "embedding_mse"
            and isinstance(entry.get("layers", "uniform"), str))


def reads_logits(loss: str) -> bool:
    """Whether a loss compares (softened) logits, so that a temperature applies to it."""
    return get_feature(get_loss(loss).feature).soft_targets


def build_terms(entries: list, m: int, n: int, temperature: Optional[float] = None,
                alpha: Optional[float] = None, layer_map=None) -> list:
    """Term dicts → :class:`Term` list with layer maps resolved against student depth ``m`` and teacher
    depth ``n``. ``temperature``/``alpha``/``layer_map`` (CLI flags) override every term's values
    (``layer_map`` only those whose map is a strategy name, not the fixed embedding pair).

    Raises:
        ConfigError: unknown loss or key, a layer-wise loss without ``layers``, bad maps.
    """
    if not entries:
        raise ConfigError("no distillation losses given; pick --method or list distill.losses in the recipe")
    out = []
    for e in entries:
        if not isinstance(e, dict) or "loss" not in e:
            raise ConfigError(f"distill.losses entry {e!r} must be a mapping with a 'loss' key")
        bad = set(e) - _TERM_KEYS
        if bad:
            raise ConfigError(f"distill.losses entry has unknown keys {sorted(bad)}; valid: "
                              f"{', '.join(sorted(_TERM_KEYS))}")
        spec = get_loss(e["loss"])
        pairs = []
        if spec.layerwise:
            lay = e.get("layers", "uniform")
            if e["loss"] == "embedding_mse":
                lay = [[0, 0]]
            elif layer_map is not None and follows_layer_map(e):
                lay = layer_map
            pairs = resolve_map(lay, m, n)
            if not pairs:  # e.g. PKD's maps leave out the student's last layer: a 1-layer student has none
                raise ConfigError(f"{e['loss']}: the layer map {lay!r} pairs no layers of a {m}-layer student "
                                  f"with the {n}-layer teacher; use a deeper student or give pairs with "
                                  f"--layer-map (e.g. 1:{n})")
            if get_feature(spec.feature).blocks_only:
                zero = [p for p in pairs if 0 in p]
                if zero:
                    raise ConfigError(f"{e['loss']}: layer 0 (embeddings) has no attention; remove pair "
                                      f"{zero[0]} from its layer map")
        t = Term(loss=e["loss"], weight=float(e.get("weight", 1.0)), pairs=pairs,
                 temperature=float(temperature if temperature is not None else e.get("temperature", 1.0)),
                 alpha=float(alpha if alpha is not None and e["loss"] in HARD_LABEL_LOSSES
                             else e.get("alpha", 1.0)),
                 relation_heads=e.get("relation_heads"), name=e.get("name") or e["loss"])
        out.append(t)
    return out


def attention_kind(config, layer: int) -> tuple:
    """``("global", None)`` or ``("local", half window)`` for block ``layer`` (1-based, as layer maps) of a
    model of ``config``: ModernBERT's local layers attend within ``local_attention // 2`` positions."""
    if config.model_type == "modernbert" and config.layer_type(layer - 1) == "sliding_attention":
        return "local", config.local_attention // 2
    return "global", None


def check_attention_pairs(term, student_config, teacher_config) -> None:
    """Attention-map losses (attention probabilities or scores) compare two maps over the same keys: a
    local-window layer's map is zero (scores: masked) outside its window, a global layer's is not, so such
    a pair only teaches the student to spread attention it cannot have. Pairs must be of the same kind
    (global ↔ global, local ↔ local with the same window); value relations and hidden states have no
    window and pair freely (docs/modernbert.md).

    Raises:
        ConfigError: a pair of layers of different attention kinds, naming both and the fix."""
    for s, t in term.pairs:
        ks, kt = attention_kind(student_config, s), attention_kind(teacher_config, t)
        if ks != kt:
            def say(k):
                return "global" if k[0] == "global" else f"local (±{k[1]} positions)"
            raise ConfigError(f"{term.loss} pairs student layer {s}, {say(ks)}, with teacher layer {t}, "
                              f"{say(kt)}: attention maps of different windows are not comparable; map "
                              f"student global layers only (--layer-map, e.g. 1:{t}) or use hidden/value losses")


class Distiller(nn.Module):
    """Student + frozen teachers + projections → ``ModelOutput(loss, logits, terms)``.

    Args:
        student: the :class:`TaskModel` being trained.
        teachers: one or more frozen :class:`TaskModel` (or any module with the same ``forward``).
        terms: :class:`Term` list (see :func:`build_terms`).
        cache: optional :class:`TeacherCache`; requires ``example_index`` (B,) in every batch.
    Batch: ``input_ids``/``attention_mask``/``token_type_ids`` (B, T); ``labels`` (B,) for kd α < 1;
    ``mlm_labels`` (B, T) with −100 at unmasked positions for ``mlm_soft`` (optional) and ``mlm`` (required).
    Raises:
        ConfigError: a term needs a feature the models cannot give (e.g. ``mlm_soft`` without MLM heads).
    """

    def __init__(self, student: TaskModel, teachers: list, terms: list,
                 cache: Optional[TeacherCache] = None):
        super().__init__()
        if not teachers:
            raise ConfigError("distillation needs at least one --teacher")
        self.student = student
        self._teachers = list(teachers)  # not registered: not trained, not saved
        for t in self._teachers:
            t.eval()
            for p in t.parameters():
                p.requires_grad_(False)
        self.terms = terms
        self.cache = cache
        # sentence embeddings (pooled_mse, margin_mse): the pooling both sides use and whether pooled_mse
        # compares unit vectors (the teacher dir's, :func:`bertforge.models.pooling.read_pooling`: a teacher
        # that normalises is matched in direction, what cosine search reads), the similarity of margins (the
        # teacher's: cosine when its embeddings are normalised), and whether the teacher is a cross-encoder
        self.pooling, self.normalize, self.margin_sim, self.cross_encoder = "mean", False, "dot", False
        self.columns = 1  # texts per example: (query, positive, negatives…) rows of inbatch_kl have C
        self.proj = nn.ModuleDict()
        hs = student.config.hidden_size
        ht = self.teacher.config.hidden_size
        for term in terms:
            spec, row = term.spec, term.feature
            problem = row.check(term.loss, student, self.teacher) if row.check is not None else None
            if problem:
                raise ConfigError(problem)
            if row.windowed:
                check_attention_pairs(term, student.config, self.teacher.config)
            if spec.projects and hs != ht and term.name not in self.proj:
                # one W per term, shared by all its layer pairs: TinyBERT eq. 8 has a single W_h for every
                # hidden layer (eq. 9 its own W_e: embedding_mse is a term of its own)
                lin = nn.Linear(hs, ht)
                nn.init.normal_(lin.weight, 0.0, student.config.initializer_range)
                nn.init.zeros_(lin.bias)
                self.proj[term.name] = lin
        self._needs = self._features()
        #: what the student and the first teacher are asked for: the union of the terms' features' requests
        self._request = request_of(term.feature for term in terms)
        #: multi-label heads: per-label sigmoid soft targets (losses.multi_label_kd_loss)
        self.multi_label = getattr(student.config, "problem_type", None) == "multi_label_classification"

    # ------------------------------------------------------------------------ projections
    def save_projections(self, out_dir) -> None:
        """Write the learned W of each projecting term to ``out_dir/`` :data:`PROJECTIONS_FILE` (safetensors,
        ``<term>.weight`` (H_T, H_S) / ``<term>.bias``), so a later stage continues from them as TinyBERT's
        task distillation does from its general stage. Nothing is written when no term projects."""
        if not len(self.proj):
            return
        from safetensors.torch import save_file
        tensors = {f"{k}.{n}": v.detach().cpu().contiguous() for k, lin in self.proj.items()
                   for n, v in lin.state_dict().items()}
        save_file(tensors, str(Path(out_dir) / PROJECTIONS_FILE))

    def load_projections(self, src_dir) -> list:
        """Initialise each projection from ``src_dir/`` :data:`PROJECTIONS_FILE` where that file holds a W of
        the same term name and shape; returns the names loaded (none when the file is absent)."""
        f = Path(src_dir) / PROJECTIONS_FILE
        if not len(self.proj) or not f.is_file():
            return []
        from safetensors.torch import load_file
        saved = load_file(str(f))
        loaded = []
        for k, lin in self.proj.items():
            w, b = saved.get(f"{k}.weight"), saved.get(f"{k}.bias")
            if w is not None and b is not None and w.shape == lin.weight.shape and b.shape == lin.bias.shape:
                with torch.no_grad():
                    lin.weight.copy_(w)
                    lin.bias.copy_(b)
                loaded.append(k)
        return loaded

    # ----------------------------------------------------------------- teacher handling
    @property
    def teacher(self) -> TaskModel:
        return self._teachers[0]

    @property
    def teachers(self) -> list:
        return list(self._teachers)

    def _apply(self, fn, *args, **kwargs):  # .to()/.cuda() also move the (unregistered) teachers
        super()._apply(fn, *args, **kwargs)
        for t in self._teachers:
            t._apply(fn, *args, **kwargs)
        return self

    def train(self, mode: bool = True):
        super().train(mode)
        for t in self._teachers:
            t.eval()
        return self

    def projection(self, term: Term) -> Optional[nn.Linear]:
        """The learned W (student H → teacher H) of ``term``, or None (equal widths, or a loss without one)."""
        return self.proj[term.name] if term.name in self.proj else None

    def _features(self) -> dict:
        """Teacher features needed: name → (feature row name, index): ``{"hidden.3": ("hidden", 3),
        "logits.0": ("logits", 0), …}`` — a layer for a layer-wise feature, a teacher for one each teacher gives
        (``teachers="each"``), else 0."""
        need = {}
        for term in self.terms:
            row = term.feature
            if row.teachers == "none":  # the student's own loss: no teacher feature
                continue
            if row.layerwise:
                indices = [t for _, t in term.pairs]
            else:
                indices = range(len(self._teachers)) if row.teachers == "each" else [0]
            for i in indices:
                need[f"{row.name}.{i}"] = (row.name, i)
        return need

    def _source(self, kind: str, index: int) -> int:
        """The teacher that gives need ``(kind, index)``: teacher ``index`` for a feature each teacher gives,
        else the first."""
        return index if get_feature(kind).teachers == "each" else 0

    def cache_shapes(self, max_len: int) -> dict:
        """Per-example shapes of the cacheable teacher features (see :mod:`.features`).

        Raises:
            ConfigError: a feature that is not cached (``mlm_logits``), saying why."""
        out = {}
        nl = self.teacher.config.num_labels if self.teacher.head is not None else 0
        for name, (kind, index) in self._needs.items():
            row = get_feature(kind)
            if row.shape is None:
                raise ConfigError(row.uncached)
            config = self._teachers[self._source(kind, index)].config
            out[name] = row.shape(config, index, max_len, nl, self.columns)
        return out

    @torch.no_grad()
    def teacher_features(self, input_ids, attention_mask=None, token_type_ids=None, **pairs) -> dict:
        """Run the teachers (eval, no grad) and collect the needed features (see :meth:`_features`): each
        teacher once, asked for the union of its features' requests (an ``own_pass`` feature runs it itself);
        ``pairs``: the cross-encoder inputs of ``margin`` (``pair_input_ids`` … (B, 2, T))."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                  "pairs": pairs}
        feats = {}
        for k, teacher in enumerate(self._teachers):
            wanted = [(name, get_feature(kind), i) for name, (kind, i) in self._needs.items()
                      if self._source(kind, i) == k]
            shared = [row for _, row, _ in wanted if not row.own_pass]
            out = teacher(input_ids, attention_mask, token_type_ids, features=request_of(shared)) if shared else None
            for name, row, i in wanted:
                feats[name] = row.teacher_value(self, out, i, inputs)
        return feats

    def _given(self, extra: dict) -> Optional[dict]:
        """The teacher features when the batch carries every one of them (e.g. ``teacher_margin`` scores given
        with the data), else None."""
        feats = {}
        for name, (kind, _) in self._needs.items():
            row = get_feature(kind)
            value = row.given(extra) if row.given is not None else None
            if value is None:
                return None
            feats[name] = value
        return feats or None

    def _teacher_side(self, input_ids, attention_mask, token_type_ids, example_index, teacher_margin,
                      extra: dict) -> dict:
        """The teacher features of a batch: a cache hit, features given with the data, or the teachers run
        (filling the cache)."""
        feats = None
        if self.cache is not None and example_index is not None and self.cache.has(example_index):
            feats = self.cache.read(example_index, input_ids.shape[1], input_ids.device)
        if feats is None:
            feats = self._given({**extra, "teacher_margin": teacher_margin})
        if feats is None:
            pairs = {k: v for k, v in extra.items() if k.startswith("pair_")}
            feats = self.teacher_features(input_ids, attention_mask, token_type_ids, **pairs)
            if self.cache is not None and example_index is not None:
                self.cache.write(example_index, feats, attention_mask.sum(1))
        return feats

    @torch.no_grad()
    def fit_projections(self, batches, ridge: float = 1e-3, names=None, orthogonal: bool = False) -> list:
        """Linear-probe start of the fresh sentence-embedding projections (LP-FT: Kumar et al. 2022, "Fine-Tuning
        can Distort Pretrained Features and Underperform Out-of-Distribution", §3): each ``embedding`` term's
        W (H_T, H_S) and b (H_T,) set to the ridge least-squares fit

            [W | b] = argmin ‖E_S Wᵀ + b − E_T‖² + λ ‖W‖²,   λ = ridge · tr(E_Sᵀ E_S) / H_S

        of the teacher's pooled embeddings E_T (n, H_T) from the student's E_S (n, H_S), the student in eval mode,
        on ``batches`` (collated training batches; the teacher side as in training: cache, features given with
        the data, or the teachers, filling the cache). From a random W, a pretrained student's first steps follow
        gradients through a map that means nothing yet and distort the features the distillation starts from.
        ``orthogonal``: instead W = U Vᵀ from the SVD U Σ Vᵀ of E_Tᵀ E_S, the semi-orthogonal W nearest the teacher
        (orthogonal Procrustes, Schönemann 1966), b = 0, and W frozen: cos(W s, W s') = cos(s, s'), so matching
        W e_S to e_T shapes the student's own cosine geometry — what its search reads — after the teacher's.
        ``names``: fit only these terms' W (None: every one). Returns the names of the terms fitted (none: no
        embedding term projects)."""
        terms = [t for t in self.terms if t.name in self.proj and t.feature.name == "embedding"
                 and (names is None or t.name in names)]
        if not terms:
            return []
        from .features import pooled
        was_training = self.student.training
        self.student.eval()
        xs, ys = [], []
        for batch in batches:
            b = dict(batch)
            own = {k[len("student_"):]: b.pop(k) for k in list(b) if k.startswith("student_")}
            ids = b.pop("input_ids")
            mask = b.pop("attention_mask", None)
            mask = torch.ones_like(ids) if mask is None else mask
            tt = b.pop("token_type_ids", None)
            for k in ("labels", "mlm_labels"):
                b.pop(k, None)
            feats = self._teacher_side(ids, mask, tt, b.pop("example_index", None), b.pop("teacher_margin", None), b)
            if own:
                ids, mask, tt = own["input_ids"], own["attention_mask"], own.get("token_type_ids")
            out = self.student(ids, mask, tt, features=self._request)
            xs.append(pooled(out, mask, self.pooling).double())
            ys.append(feats[f"{terms[0].feature.name}.0"].double())
        self.student.train(was_training)
        x, y = torch.cat(xs), torch.cat(ys)
        if orthogonal:
            u, _, vh = torch.linalg.svd(y.T @ x, full_matrices=False)  # (H_T, H_S), (H_S, H_S)
            for term in terms:
                lin = self.proj[term.name]
                lin.weight.copy_((u @ vh).to(lin.weight.dtype))
                lin.bias.zero_()
                lin.weight.requires_grad_(False)
                lin.bias.requires_grad_(False)
            return [t.name for t in terms]
        xa = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
        reg = torch.eye(xa.shape[1], dtype=x.dtype) * (ridge * float((x * x).sum()) / x.shape[1])
        reg[-1, -1] = 0.0  # the bias is not shrunk
        sol = torch.linalg.solve(xa.T @ xa + reg, xa.T @ y)  # (H_S + 1, H_T)
        for term in terms:
            lin = self.proj[term.name]
            lin.weight.copy_(sol[:-1].T.to(lin.weight.dtype))
            lin.bias.copy_(sol[-1].to(lin.bias.dtype))
        return [t.name for t in terms]

    # --------------------------------------------------------------------------- forward
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                example_index: Optional[torch.Tensor] = None, mlm_labels: Optional[torch.Tensor] = None,
                teacher_margin: Optional[torch.Tensor] = None, **extra):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        # a student of another vocabulary reads its own tokens of the same texts (pooled embedding losses only)
        own = {k[len("student_"):]: extra.pop(k) for k in list(extra) if k.startswith("student_")}
        feats = self._teacher_side(input_ids, attention_mask, token_type_ids, example_index, teacher_margin, extra)
        if own:
            input_ids, attention_mask = own["input_ids"], own["attention_mask"]
            token_type_ids = own.get("token_type_ids")
        # student side: one pass asked for every term's feature
        out_S = self.student(input_ids, attention_mask, token_type_ids, features=self._request)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                  "labels": labels, "mlm_labels": mlm_labels}
        total = None
        terms = {}
        for term in self.terms:
            weighted = term.weight * term.feature.loss(self, term, out_S, feats, inputs)
            terms[term.name] = terms.get(term.name, 0.0) + weighted.detach()
            total = weighted if total is None else total + weighted
        return ModelOutput(loss=total, logits=out_S.logits, terms=terms)
