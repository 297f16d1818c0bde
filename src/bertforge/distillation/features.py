"""What each distillation feature asks of the models and how it is read: :data:`FEATURES`, one row per feature.

A distillation loss compares one *feature* of the student with the same feature of the teacher
(:class:`~bertforge.distillation.losses.LossSpec` ``feature`` names a row here). A row says, as data:

* what it **requests** from the encoders (a :class:`~bertforge.models.output.Features`; the distiller asks each
  model once, for the union of its terms' requests);
* how a layer's tensor is **read** from a model output (layer-wise features: hidden states, attention
  probabilities and scores, values), or how the teacher's value is made otherwise (logits, pooled embeddings,
  score margins, in-batch scores);
* how a term's **loss** value is formed from the student's output and the teacher's features;
* which teachers give it (``first``, ``each`` for an ensemble's soft targets, ``none``), which layer pairs
  are allowed (``blocks_only``: no layer 0; ``windowed``: attention maps pair only layers of the same
  attention kind), whether a temperature applies (``soft_targets``), what the models must have (``check``);
* how it is cached (:class:`~bertforge.distillation.cache.TeacherCache`): per-example ``shape``, the axes padded to
  ``max_len``, float32 or float16 — or why it is not.

A new feature is one row of :data:`FEATURES` (and a loss naming it in ``LOSSES``). Sources of the rows: Hinton
et al. 2015 (logits), DistilBERT (Sanh et al. 2019; MLM logits, hidden states), TinyBERT (Jiao et al. 2020;
attention scores, hidden states), MiniLM (Wang et al. 2020; attention probabilities, values), Reimers &
Gurevych 2020 (pooled embeddings), Hofstätter et al. 2020 (score margins), Lin et al. 2021 (in-batch scores of
each row's columns), MobileBERT (Sun et al. 2020;
feature maps of equal width, no projection).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..heads import has_mlm_head
from ..models.output import Features


@dataclass(frozen=True)
class Feature:
    """One row of :data:`FEATURES` (see the module doc). Callables:

    * ``read(output, layer) → tensor`` — a layer-wise feature at ``layer`` (1-based blocks, 0 = embeddings);
      None for a feature that is not layer-wise;
    * ``teacher(distiller, teacher_output, index, inputs) → tensor`` — the teacher's value (default: ``read``);
      ``teacher_output`` is None for an ``own_pass`` feature, which runs the teacher itself;
    * ``loss(distiller, term, student_output, feats, inputs) → scalar`` — the term's unweighted value;
      ``feats``: feature name (``"<row>.<index>"``) → teacher tensor; ``inputs``: ``input_ids``,
      ``attention_mask``, ``token_type_ids``, ``labels``, ``mlm_labels``, ``pairs``;
    * ``check(loss, student, teacher) → wording or None`` — what is missing for this feature;
    * ``shape(config, index, max_len, num_labels, columns) → tuple`` — per-example cached shape (None: not
      cached, ``uncached`` says why); ``columns``: texts per example (query, positive, negatives…; 1 otherwise);
    * ``given(extra) → tensor or None`` — the teacher's value when the batch carries it (no teacher run).
    """

    name: str
    loss: Callable
    request: Features = field(default_factory=Features)
    read: Optional[Callable] = None
    teacher: Optional[Callable] = None
    teachers: str = "first"
    own_pass: bool = False
    blocks_only: bool = False
    windowed: bool = False
    soft_targets: bool = False
    check: Optional[Callable] = None
    shape: Optional[Callable] = None
    uncached: str = ""
    seq_axes: tuple = ()
    float32: bool = False
    masked_as_zero: bool = False
    given: Optional[Callable] = None

    @property
    def layerwise(self) -> bool:
        """Whether the feature is read per layer pair of a layer map."""
        return self.read is not None

    def teacher_value(self, distiller, out, index: int, inputs: dict) -> torch.Tensor:
        return self.teacher(distiller, out, index, inputs) if self.teacher is not None else self.read(out, index)


# ------------------------------------------------------------------------------------------ shared pieces

def pooled(out, attention_mask: torch.Tensor, pooling: str, normalize: bool = False) -> torch.Tensor:
    """The pooled embeddings (N, H) of a model output whose input was (B, T) or (B, C, T)."""
    from ..models.pooling import pool
    mask = attention_mask.flatten(0, 1) if attention_mask.dim() == 3 else attention_mask
    return pool(out.last_hidden_state, mask, pooling, normalize)


def margins(emb: torch.Tensor, cols: int, sim: str) -> torch.Tensor:
    """(B·C, H) embeddings of (query, positive, negative) rows → (B,) ``s(q, p⁺) − s(q, p⁻)``."""
    e = emb.float().reshape(-1, cols, emb.shape[-1])
    if sim == "cos":
        e = torch.nn.functional.normalize(e, dim=-1)
    return (e[:, 0] * e[:, 1]).sum(-1) - (e[:, 0] * e[:, 2]).sum(-1)


def combined_logits(feats: dict, name: str, temperature: float, multi_label: bool = False) -> torch.Tensor:
    """The teachers' logits of feature ``name`` as one soft target: the one teacher's, or the ensemble's
    averaged probabilities at ``temperature`` T as logits ``T·log p`` (sigmoids per label for multi-label;
    predictions averaged for regression) — Hinton et al. 2015 §2."""
    zs = [feats[n] for n in sorted(feats) if n.startswith(name + ".")]
    if len(zs) == 1:
        return zs[0]
    z = torch.stack([x.float() for x in zs])
    if z.shape[-1] == 1:  # regression: average predictions
        return z.mean(0)
    t = float(temperature)
    if multi_label:  # averaged per-label probabilities at T, as logits
        p = torch.sigmoid(z / t).mean(0).clamp(1e-7, 1 - 1e-7)
        return t * torch.log(p / (1 - p))  # averaged soft targets, as logits whose softmax at T is the mean
    return t * torch.log(torch.softmax(z / t, -1).mean(0).clamp_min(1e-30))


# ---------------------------------------------------------------------------------- teacher-side readers

def _logits(distiller, out, index: int, inputs: dict) -> torch.Tensor:
    return out.logits.float()


def _teacher_embedding(distiller, out, index: int, inputs: dict) -> torch.Tensor:
    return pooled(out, inputs["attention_mask"], distiller.pooling, distiller.normalize).float()


def _teacher_margin(distiller, out, index: int, inputs: dict) -> torch.Tensor:
    """The teacher's score margin per triple, (B, 1): a cross-encoder scores the (query, passage) pairs
    (its one logit), a bi-encoder compares its pooled embeddings (its own similarity)."""
    ids, mask, tt, pairs = inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], inputs["pairs"]
    if distiller.cross_encoder:
        p_ids = pairs.get("pair_input_ids")
        z = distiller.teacher(p_ids, pairs.get("pair_attention_mask"), pairs.get("pair_token_type_ids")).logits.float()
        z = z.reshape(p_ids.shape[0], 2)
        return (z[:, 0] - z[:, 1])[:, None]
    out = distiller.teacher(ids, mask, tt)
    return margins(pooled(out, mask, distiller.pooling), ids.shape[1], distiller.margin_sim)[:, None]


def _teacher_columns(distiller, out, index: int, inputs: dict) -> torch.Tensor:
    """The teacher's pooled embeddings of every column of (B, C, T) rows, (B, C, H_T): the same pooling and
    normalisation as its dir declares."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    out = distiller.teacher(ids, mask, inputs["token_type_ids"])
    return pooled(out, mask, distiller.pooling, distiller.normalize).float().reshape(ids.shape[0], ids.shape[1], -1)


def _given_margin(extra: dict) -> Optional[torch.Tensor]:
    m = extra.get("teacher_margin")
    return None if m is None else m.float().reshape(-1, 1)


# ------------------------------------------------------------------------------------------ term values

def _soft_targets(distiller, term, out_S, feats: dict, inputs: dict, multi_label: bool = False) -> torch.Tensor:
    zt = combined_logits(feats, term.feature.name, term.temperature, distiller.multi_label)
    return term.spec.fn(out_S.logits, zt, temperature=term.temperature, labels=inputs["labels"], alpha=term.alpha,
                        mask=inputs["attention_mask"], mlm_labels=inputs["mlm_labels"], multi_label=multi_label)


def _task_soft_targets(distiller, term, out_S, feats: dict, inputs: dict) -> torch.Tensor:
    return _soft_targets(distiller, term, out_S, feats, inputs, multi_label=distiller.multi_label)


def _student_mlm(distiller, term, out_S, feats: dict, inputs: dict) -> torch.Tensor:
    return term.spec.fn(out_S.logits, mlm_labels=inputs["mlm_labels"])


def _layer_pairs(distiller, term, out_S, feats: dict, inputs: dict) -> torch.Tensor:
    """Σ over the term's (student, teacher) layer pairs of the loss of the two layers' tensors."""
    row, value = term.feature, 0.0
    for s, t in term.pairs:
        value = value + term.spec.fn(row.read(out_S, s), feats[f"{row.name}.{t}"], mask=inputs["attention_mask"],
                                     proj=distiller.projection(term), relation_heads=term.relation_heads)
    return value


def _embedding(distiller, term, out_S, feats: dict, inputs: dict) -> torch.Tensor:
    return term.spec.fn(pooled(out_S, inputs["attention_mask"], distiller.pooling), feats[f"{term.feature.name}.0"],
                        proj=distiller.projection(term), normalize=distiller.normalize)


def _margin(distiller, term, out_S, feats: dict, inputs: dict) -> torch.Tensor:
    ids = inputs["input_ids"]
    e = pooled(out_S, inputs["attention_mask"], distiller.pooling).reshape(ids.shape[0], ids.shape[1], -1)
    return term.spec.fn(e[:, 0], e[:, 1], e[:, 2], feats[f"{term.feature.name}.0"], sim=distiller.margin_sim)


def _columns(distiller, term, out_S, feats: dict, inputs: dict) -> torch.Tensor:
    ids = inputs["input_ids"]
    e = pooled(out_S, inputs["attention_mask"], distiller.pooling).reshape(ids.shape[0], ids.shape[1], -1)
    return term.spec.fn(e, feats[f"{term.feature.name}.0"], sim=distiller.margin_sim, temperature=term.temperature,
                        alpha=term.alpha)


# ------------------------------------------------------------------------------------- model requirements

def _task_heads(loss: str, student, teacher) -> Optional[str]:
    if student.head is None or teacher.head is None:
        return f"loss {loss} needs task heads (logits) on teacher and student; use --stage task or representation losses"
    return None


def _mlm_heads(loss: str, student, teacher) -> Optional[str]:
    if not (has_mlm_head(student) and has_mlm_head(teacher)):
        return (f"loss {loss} needs masked-LM heads on teacher and student; this teacher has none: use "
                f"representation losses (--method tinybert or minilm)")
    return None


def _student_mlm_head(loss: str, student, teacher) -> Optional[str]:
    if not has_mlm_head(student):
        return (f"loss {loss} needs a masked-LM head on the student; use --stage general with a teacher that has "
                f"one, or drop the {loss} term")
    return None


def _same_width(loss: str, student, teacher) -> Optional[str]:
    hs, ht = student.config.hidden_size, teacher.config.hidden_size
    if hs != ht:
        return (f"loss {loss} matches feature maps without a projection, but the student's inter-block width "
                f"{hs} is not the teacher's hidden size {ht}; use a student of width {ht} (e.g. --student "
                f"mobilebert:{teacher.config.num_hidden_layers}L-{ht}H) or a teacher of width {hs}")
    return None


def _attention_shape(config, layer: int, max_len: int, num_labels: int, columns: int = 1) -> tuple:
    return (config.heads_of(layer - 1), max_len, max_len)


def _values_shape(config, layer: int, max_len: int, num_labels: int, columns: int = 1) -> tuple:
    return (config.heads_of(layer - 1), max_len, config.head_dim)


#: feature name → :class:`Feature`: the one place a distillation feature is described
FEATURES: dict[str, Feature] = {f.name: f for f in [
    Feature("logits", _task_soft_targets, teacher=_logits, teachers="each", soft_targets=True, check=_task_heads,
            shape=lambda c, i, t, n, k: (n,), float32=True),
    Feature("mlm_logits", _soft_targets, teacher=_logits, soft_targets=True, check=_mlm_heads,
            uncached="mlm_soft reads teacher MLM logits (B×T×V): too large to cache, and MLM inputs change every "
                     "epoch; run without the cache"),
    Feature("student_mlm", _student_mlm, teachers="none", check=_student_mlm_head),
    Feature("hidden", _layer_pairs, Features(hidden_states=True), read=lambda o, layer: o.hidden_states[layer],
            shape=lambda c, i, t, n, k: (t, c.hidden_size), seq_axes=(0,)),
    Feature("feature_maps", _layer_pairs, Features(hidden_states=True), read=lambda o, layer: o.hidden_states[layer],
            check=_same_width, shape=lambda c, i, t, n, k: (t, c.hidden_size), seq_axes=(0,)),
    Feature("attention_scores", _layer_pairs, Features(attention_scores=True),
            read=lambda o, layer: o.attention_scores[layer - 1], blocks_only=True, windowed=True,
            shape=_attention_shape, seq_axes=(1, 2), masked_as_zero=True),
    Feature("attentions", _layer_pairs, Features(attentions=True), read=lambda o, layer: o.attentions[layer - 1],
            blocks_only=True, windowed=True, shape=_attention_shape, seq_axes=(1, 2)),
    Feature("values", _layer_pairs, Features(values=True), read=lambda o, layer: o.values[layer - 1],
            blocks_only=True, shape=_values_shape, seq_axes=(1,)),
    Feature("embedding", _embedding, teacher=_teacher_embedding, shape=lambda c, i, t, n, k: (c.hidden_size,),
            float32=True),
    Feature("margin", _margin, teacher=_teacher_margin, own_pass=True, shape=lambda c, i, t, n, k: (1,),
            float32=True, given=_given_margin),
    Feature("columns", _columns, teacher=_teacher_columns, own_pass=True, soft_targets=True,
            shape=lambda c, i, t, n, k: (k, c.hidden_size), float32=True),
]}


def get_feature(name: str) -> Feature:
    """The row of ``name``; KeyError names the rows (a loss registered with a feature that has none)."""
    try:
        return FEATURES[name]
    except KeyError:
        raise KeyError(f"no distillation feature {name!r}; FEATURES has {', '.join(FEATURES)}") from None


def request_of(rows) -> Features:
    """The union of the requests of ``rows`` (:class:`Feature`)."""
    req = Features()
    for row in rows:
        req = req | row.request
    return req


__all__ = ["FEATURES", "Feature", "combined_logits", "get_feature", "margins", "pooled", "request_of"]
