"""Pretraining collator: pad a list of :class:`~bertforge.data.corpus.PretrainDataset` items and mask.

* **dynamic** masking (RoBERTa, Liu et al. 2019 §4.1): items have no ``mask_seed``; the batch is masked
  with a generator seeded from the torch RNG — the Trainer seeds it per (seed, epoch, step), so a
  re-served sequence gets a fresh mask while runs stay reproducible;
* **static** masking (BERT): items carry ``mask_seed``; each is masked alone with
  ``numpy.random.default_rng(mask_seed)``: the same mask whenever (and in whatever batch) it is served.

Schemes: ``token`` (BERT), ``wwm`` (whole-word), ``span`` (SpanBERT; adds ``span_left``,
``span_right``, ``span_pos`` for the SBO head), ``ngram`` (ALBERT). Special tokens and padding are never selected.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..errors import ConfigError
from .masking import IGNORE_INDEX, mask_ngrams, mask_spans, mask_tokens

SCHEMES = ("token", "wwm", "span", "ngram")


class PretrainCollator:
    """items → batch of (B, T) tensors: ``input_ids`` (masked), ``attention_mask``, ``token_type_ids``,
    ``labels`` (original id where selected, else -100), plus pair labels / span fields when present.

    Args:
        pad_id, mask_id: token ids of padding and [MASK].
        special_ids: ids never selected (CLS, SEP, PAD, MASK, UNK…).
        vocab_size: size of the vocabulary (random replacements are drawn from its non-special ids).
        scheme: ``token`` | ``wwm`` | ``span`` | ``ngram``.
        pad_to_multiple_of: pad T up to a multiple (tensor-core friendly); None = longest.
    """

    def __init__(self, pad_id: int, mask_id: int, special_ids, vocab_size: int, scheme: str = "token",
                 mlm_probability: float = 0.15, replace_probs=(0.8, 0.1, 0.1),
                 pad_to_multiple_of: Optional[int] = 8, geometric_p: float = 0.2, max_span: int = 10,
                 max_ngram: int = 3):
        if scheme not in SCHEMES:
            raise ConfigError(f"masking scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        if not 0.0 < mlm_probability < 1.0:
            raise ConfigError(f"mlm_probability={mlm_probability} must be in (0, 1)")
        self.pad_id, self.mask_id, self.scheme = pad_id, mask_id, scheme
        self.special_ids = np.array(sorted(set(int(i) for i in special_ids) | {pad_id, mask_id}))
        self.random_ids = np.setdiff1d(np.arange(vocab_size), self.special_ids)
        self.p, self.replace = mlm_probability, tuple(replace_probs)
        self.multiple = pad_to_multiple_of
        self.geometric_p, self.max_span, self.max_ngram = geometric_p, max_span, max_ngram

    def mask(self, ids: np.ndarray, special: np.ndarray, word_starts: np.ndarray, rng):
        """Mask (N, T) arrays with ``rng``; returns a :class:`~bertforge.objectives.masking.MaskOutput`."""
        if self.scheme == "span":
            return mask_spans(ids, special, rng, self.mask_id, self.random_ids, self.p, word_starts,
                              self.geometric_p, self.max_span, self.replace)
        if self.scheme == "ngram":
            return mask_ngrams(ids, special, rng, self.mask_id, self.random_ids, self.p, word_starts,
                               self.max_ngram, self.replace)
        return mask_tokens(ids, special, rng, self.mask_id, self.random_ids, self.p,
                           word_starts if self.scheme == "wwm" else None, self.replace)

    def __call__(self, items: list) -> dict:
        b = len(items)
        t = max(len(x["input_ids"]) for x in items)
        if self.multiple:
            t = -(-t // self.multiple) * self.multiple
        ids = np.full((b, t), self.pad_id, dtype=np.int64)
        tt = np.zeros((b, t), dtype=np.int64)
        ws = np.ones((b, t), dtype=np.uint8)
        am = np.zeros((b, t), dtype=np.int64)
        for i, x in enumerate(items):
            n = len(x["input_ids"])
            ids[i, :n] = x["input_ids"]
            tt[i, :n] = x.get("token_type_ids", 0)
            if "word_starts" in x:
                ws[i, :n] = x["word_starts"]
            am[i, :n] = 1
        special = np.isin(ids, self.special_ids) | (am == 0)
        span = self.scheme == "span"
        out_ids, labels = ids.copy(), np.full((b, t), IGNORE_INDEX, dtype=np.int64)
        sl = sr = sp = None
        if span:
            sl, sr, sp = (np.full((b, t), -1, dtype=np.int64) for _ in range(3))
        if "mask_seed" in items[0]:  # static: each row on its own, seeded by the example
            for i, x in enumerate(items):
                n = len(x["input_ids"])
                m = self.mask(ids[i:i + 1, :n], special[i:i + 1, :n], ws[i:i + 1, :n],
                              np.random.default_rng(int(x["mask_seed"])))
                out_ids[i, :n], labels[i, :n] = m.input_ids[0], m.labels[0]
                if span:
                    sl[i, :n], sr[i, :n], sp[i, :n] = m.span_left[0], m.span_right[0], m.span_pos[0]
        else:
            rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,)).item()))
            m = self.mask(ids, special, ws, rng)
            out_ids, labels = m.input_ids, m.labels
            if span:
                sl, sr, sp = m.span_left, m.span_right, m.span_pos
        batch = {"input_ids": torch.from_numpy(out_ids), "attention_mask": torch.from_numpy(am),
                 "token_type_ids": torch.from_numpy(tt), "labels": torch.from_numpy(labels)}
        if span:
            batch.update(span_left=torch.from_numpy(sl), span_right=torch.from_numpy(sr),
                         span_pos=torch.from_numpy(sp))
        for key in ("next_sentence_label", "sentence_order_label"):
            if key in items[0]:
                batch[key] = torch.tensor([int(x[key]) for x in items], dtype=torch.long)
        return batch


__all__ = ["PretrainCollator", "SCHEMES"]
