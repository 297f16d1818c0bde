"""Pretraining setups by name — the registry :data:`OBJECTIVES` — and model shapes.

Each objective is declared as data in its own file (``OBJECTIVE = Objective(...)`` at its end); this table
summarises them:

============  ========  =====================  ==========  ==========  ===================================
objective     family    head (HF class)        sequences   masking     source
============  ========  =====================  ==========  ==========  ===================================
bert          bert      mlm_nsp (ForPreTrain)  nsp pairs   static ×10  Devlin et al. 2018 §3.1, App. A
roberta       roberta   mlm (ForMaskedLM)      FULL-SENT.  dynamic     Liu et al. 2019 §4.1–4.2
albert        albert    mlm_sop (ForPreTrain)  sop pairs   dyn. n-gram Lan et al. 2019 §3.1–4.1
electra       electra   G: mlm, D: rtd         FULL-SENT.  dynamic     Clark et al. 2020 §2–3
spanbert      bert      mlm_sbo (ForMaskedLM)  DOC-SENT.   span        Joshi et al. 2020 §3
modernbert    modern…   mlm (ForMaskedLM)      FULL-SENT.  dyn. 30%    Warner et al. 2024 §2.2
============  ========  =====================  ==========  ==========  ===================================

The optimizer constants of each paper (``Objective.train``) lie over the size's ``train`` defaults; a recipe,
override or flag wins. Shapes (``tiny``/``small``/``base``) are the ``model``/``train`` defaults of
``recipes/pretrain/*.yaml``.
"""
from __future__ import annotations

import numpy as np
import torch

from ..config import ModelConfig, Recipe, deep_merge
from ..errors import ConfigError, require_number
from ..task_model import TaskModel
from . import electra, mlm, modernbert, nsp, sop, spanbert
from .spec import Objective

#: objective name → :class:`~bertforge.objectives.spec.Objective`: the one place an objective is registered.
#: Each entry is the ``OBJECTIVE`` at the end of its objectives file (docs/extending.md).
OBJECTIVES: dict[str, Objective] = {o.name: o for o in [
    nsp.OBJECTIVE,  # bert
    mlm.OBJECTIVE,  # roberta
    sop.OBJECTIVE,  # albert
    electra.OBJECTIVE,  # electra
    spanbert.OBJECTIVE,  # spanbert
    modernbert.OBJECTIVE,  # modernbert
]}

#: default recipe per shape (mirrored in recipes/pretrain/<size>.yaml; a test keeps them equal)
SIZES = {
    "tiny": {"model": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "intermediate_size": 512, "embedding_size": 64},
             "data": {"max_seq_len": 128},
             "train": {"batch_size": 32, "lr": 1.0e-3, "max_steps": 300, "warmup_ratio": 0.06,
                       "weight_decay": 0.01, "schedule": "linear", "log_every": 10, "eval_every": 100,
                       "save_every": 1000, "load_best_at_end": False, "metric_for_best": "mlm_acc"},
             "pretrain": {"vocab_size": 8192, "eval_fraction": 0.02, "max_eval_sequences": 256}},
    "small": {"model": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                        "intermediate_size": 1024, "embedding_size": 128},
              "data": {"max_seq_len": 128},
              "train": {"batch_size": 128, "lr": 5.0e-4, "max_steps": 10000, "warmup_ratio": 0.01,
                        "weight_decay": 0.01, "schedule": "linear", "log_every": 50, "eval_every": 1000,
                        "save_every": 1000, "load_best_at_end": False, "metric_for_best": "mlm_acc"},
              "pretrain": {"vocab_size": 30522, "eval_fraction": 0.01, "max_eval_sequences": 1024}},
    "base": {"model": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                       "intermediate_size": 3072, "embedding_size": 128},
             "data": {"max_seq_len": 512},
             "train": {"batch_size": 256, "lr": 1.0e-4, "max_steps": 1000000, "warmup_steps": 10000,
                       "weight_decay": 0.01, "schedule": "linear", "log_every": 100, "eval_every": 10000,
                       "save_every": 10000, "load_best_at_end": False, "metric_for_best": "mlm_acc"},
             "pretrain": {"vocab_size": 30522, "eval_fraction": 0.005, "max_eval_sequences": 2048}},
}

#: keys of the ``pretrain`` recipe section and their defaults (objective defaults fill the None ones)
PRETRAIN_KEYS = {"objective": None, "tokenizer": None, "vocab_size": 30522, "mode": None, "masking": None,
                 "dupe_factor": None, "scheme": None, "whole_word": False, "mlm_probability": 0.15,
                 "short_seq_prob": None, "doc_sep": "auto", "eval_fraction": 0.02,
                 "max_eval_sequences": 256, "generator_size": 0.25, "rtd_weight": 50.0,
                 "geometric_p": 0.2, "max_span": 10, "max_ngram": 3, "replace_probs": [0.8, 0.1, 0.1]}


def resolve_options(objective: str, section: dict) -> dict:
    """Objective defaults, then the recipe's ``pretrain`` section. Raises ConfigError on unknown keys."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    unknown = set(section) - set(PRETRAIN_KEYS)
    if unknown:
        raise ConfigError(f"unknown recipe key(s) pretrain.{sorted(unknown)[0]}; valid keys: "
                          f"{', '.join(sorted(PRETRAIN_KEYS))}")
    opts = dict(PRETRAIN_KEYS)
    opts.update(OBJECTIVES[objective].defaults())
    opts.update({k: v for k, v in section.items() if v is not None})
    opts["objective"] = objective
    if opts["whole_word"] and opts["scheme"] == "token":
        opts["scheme"] = "wwm"
    if opts["masking"] not in ("static", "dynamic"):
        raise ConfigError(f"pretrain.masking={opts['masking']!r}; choose static or dynamic")
    _check_ranges(opts)
    if opts["masking"] == "dynamic":  # copies exist to give static masking several masks (Devlin et al. §A.2)
        if section.get("dupe_factor") not in (None, 1):
            raise ConfigError(f"--dupe-factor / pretrain.dupe_factor={section['dupe_factor']} copies the data "
                              f"for static masking; dynamic masking draws a fresh mask each time a sequence "
                              f"is served, so drop it or pass --masking static")
        opts["dupe_factor"] = 1
    return opts


#: ``pretrain.*`` number → the bounds of :func:`~bertforge.errors.require_number`
_RANGES = {"short_seq_prob": dict(low=0.0, high=1.0), "eval_fraction": dict(low=0.0, high=1.0, open_high=True),
           "generator_size": dict(low=0.0, high=1.0, open_low=True), "rtd_weight": dict(low=0.0, open_low=True),
           "geometric_p": dict(low=0.0, high=1.0, open_low=True), "max_span": dict(low=1, whole=True),
           "max_ngram": dict(low=1, whole=True),
           "dupe_factor": dict(low=1, whole=True), "max_eval_sequences": dict(low=1, whole=True),
           "mlm_probability": dict(low=0.0, high=1.0, open_low=True, open_high=True)}


def _check_ranges(opts: dict) -> None:
    """One-line ConfigError for a numeric ``pretrain.*`` setting outside its range (nan and text included)."""
    for key, bounds in _RANGES.items():
        if opts.get(key) is not None:
            require_number(f"pretrain.{key}", opts[key], **bounds)
    rp = opts.get("replace_probs")
    ok = isinstance(rp, (list, tuple)) and len(rp) == 3 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in rp)
    if not ok or abs(sum(rp) - 1.0) > 1e-6:
        raise ConfigError(f"pretrain.replace_probs={rp!r}; give [mask, random, keep] fractions of the selected "
                          f"tokens that sum to 1, e.g. [0.8, 0.1, 0.1] (BERT)")


def model_config(opts: dict, recipe: Recipe, vocab_size: int, pad_id: int) -> ModelConfig:
    """ModelConfig for the objective's family from the recipe's ``model`` section."""
    fam = opts["family"]
    m = dict(recipe.model)
    if fam not in ("albert", "electra"):
        m.pop("embedding_size", None)  # E = H for bert/roberta
    seq = recipe.data.max_seq_len
    kw = dict(model_type=fam, vocab_size=vocab_size, pad_token_id=pad_id,
              max_position_embeddings=seq + (pad_id + 1 if fam == "roberta" else 0),
              type_vocab_size=1 if fam == "roberta" else 2,
              add_pooling_layer=OBJECTIVES[opts["objective"]].pooler)
    if fam == "albert":
        kw.update(layer_sharing="all", hidden_act="gelu_new")
    if fam == "roberta":
        kw.update(layer_norm_eps=1e-5)  # fairseq's and transformers' RoBERTa (BERT and the others: 1e-12)
    if fam == "modernbert":  # no segments, no positions table; transformers' ModernBertConfig defaults
        kw.update(type_vocab_size=0, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, max_position_embeddings=max(seq, 512))
    kw.update(m)
    try:
        return ModelConfig(**kw)
    except TypeError as e:
        raise ConfigError(f"bad model key in recipe ({e}); see bertforge.config.ModelConfig") from None


def build_model(opts: dict, config: ModelConfig):
    """A fresh model for the objective of ``opts`` (:func:`resolve_options`): its ``build`` (e.g. ELECTRA's
    generator + discriminator), else ``TaskModel(config, head=opts["head"])``."""
    objective = OBJECTIVES[opts["objective"]]
    if objective.build is not None:
        return objective.build(config, opts)
    return TaskModel(config, head=opts["head"])


@torch.no_grad()
def evaluate_mlm(model, dataset, collate, batch_size: int = 64, unigram_id=None) -> dict:
    """Held-out metrics over a dataset with static masks: masked-token accuracy (``mlm_acc``, weighted by
    the number of masked tokens), ``mlm_loss``, pair/RTD accuracies, and ``unigram_acc`` — the accuracy of
    always predicting the most frequent training token (the baseline MLM must beat)."""
    dev = next(model.parameters()).device
    sums: dict = {}
    n_masked = n_uni = n_seq = 0
    for s in range(0, len(dataset), batch_size):
        batch = collate([dataset[i] for i in range(s, min(len(dataset), s + batch_size))])
        batch = {k: v.to(dev) for k, v in batch.items()}
        out = model(**batch)
        k = int((batch["labels"] != -100).sum())
        bsz = batch["input_ids"].shape[0]
        for name, v in (out.terms or {}).items():
            if name == "mlm_count":
                continue
            w = k if name.startswith(("mlm", "sbo")) else bsz
            sums.setdefault(name, [0.0, 0])
            sums[name][0] += float(v) * w
            sums[name][1] += w
        if unigram_id is not None:
            n_uni += int((batch["labels"] == unigram_id).sum())
        n_masked += k
        n_seq += bsz
    res = {name: tot / max(1, w) for name, (tot, w) in sums.items()}
    if unigram_id is not None:
        res["unigram_acc"] = n_uni / max(1, n_masked)
    res["masked_tokens"] = n_masked
    # metric_for_best reads the first key: put mlm_acc first
    return dict(sorted(res.items(), key=lambda kv: kv[0] != "mlm_acc"))


def unigram_top_id(corpus, sentence_mask, special_ids) -> int:
    """Most frequent non-special token id over the training sentences (the unigram baseline)."""
    counts = np.zeros(int(corpus.ids.max()) + 1 if len(corpus.ids) else 1, dtype=np.int64)
    sel = np.flatnonzero(sentence_mask)
    # contiguous runs of selected sentences → token ranges
    if len(sel):
        breaks = np.flatnonzero(np.diff(sel) != 1) + 1
        for run in np.split(sel, breaks):
            o0, o1 = corpus.offsets[run[0]], corpus.offsets[run[-1] + 1]
            for a in range(o0, o1, 10_000_000):
                counts += np.bincount(np.asarray(corpus.ids[a:min(o1, a + 10_000_000)]),
                                      minlength=len(counts))
    for s in special_ids:
        if 0 <= s < len(counts):
            counts[s] = 0
    return int(counts.argmax())


__all__ = ["OBJECTIVES", "SIZES", "PRETRAIN_KEYS", "resolve_options", "model_config", "build_model",
           "evaluate_mlm", "unigram_top_id", "deep_merge"]
