"""Token selection and corruption for masked-language-model pretraining.

Four selection schemes over a (N, T) batch of token ids with a NumPy ``Generator``:

* **token masking** (BERT, Devlin et al. 2018 §3.1 "Task #1: Masked LM"): each non-special token is
  selected with probability ``mlm_probability`` (0.15);
* **whole-word masking** (BERT's 2019 WWM release; Cui et al. 2019): the selection draw is made once
  per *word* and every sub-token of a selected word is selected. Words come from the tokenizer's own word ids
  (``Encoding.word_ids`` → ``word_starts``), so it works for WordPiece, byte-level BPE and Unigram alike
  (no ``##`` convention);
* **span masking** (SpanBERT, Joshi et al. 2020 §3.1): span lengths in *words* are drawn from
  Geometric(p = 0.2) truncated to [1, 10] (renormalised; mean ≈ 3.8), anchored at the word of a random
  token, until 15% of the tokens are selected; touching spans are merged (as the authors' code);
* **n-gram masking** (ALBERT, Lan et al. 2019 §4.1): whole-word n-grams, p(n) ∝ 1/n for n ≤ 3.

Selected tokens are then replaced 80% by ``[MASK]``, 10% by a random token, 10% kept (§3.1 and App.
A.1); the decision is drawn per token (also under whole-word and n-gram masking, as Google's WWM release and
``transformers``' ``DataCollatorForWholeWordMask``: the *selection* is per word, the replacement per
token) or per span (SpanBERT: "we replace 80% of the span with [MASK], 10% with random tokens and 10%
with the original tokens", always for the whole span). Special tokens and padding (``special_mask``) are never selected.

Static vs dynamic masking (RoBERTa, Liu et al. 2019 §4.1) is decided by the caller: static masking
calls these functions with a generator seeded by the example (same mask every time it is served),
dynamic masking with a fresh generator per batch.

Labels use the ``-100`` ignore index of :func:`torch.nn.functional.cross_entropy`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

IGNORE_INDEX = -100

#: SpanBERT span-length distribution: p(l) ∝ p·(1-p)^(l-1), l = 1..10, p = 0.2 (Joshi et al. 2020 §3.1)
SPAN_LENGTHS = np.arange(1, 11)


def span_length_distribution(p: float = 0.2, max_len: int = 10) -> np.ndarray:
    """Truncated geometric probabilities for span lengths 1..max_len (sum 1). Mean for p=0.2: 3.78."""
    lens = np.arange(1, max_len + 1)
    w = p * (1 - p) ** (lens - 1)
    return w / w.sum()


@dataclass
class MaskOutput:
    """``input_ids`` (N, T) corrupted ids; ``labels`` (N, T) original id where selected else -100;
    ``selected`` (N, T) bool; for span masking also ``span_left``/``span_right`` (N, T) token index of
    the left/right boundary token outside the (merged) span (x_{s-1}, x_{e+1}; never selected) and
    ``span_pos`` (N, T) position of the token inside its span (0-based), all -1 where not selected;
    ``span_sampled`` (S,) the length in words drawn for each of the S sampled spans and ``span_lengths``
    (S,) the words each one covered (fewer where cut at the budget or a special token)."""

    input_ids: np.ndarray
    labels: np.ndarray
    selected: np.ndarray
    span_left: Optional[np.ndarray] = None
    span_right: Optional[np.ndarray] = None
    span_pos: Optional[np.ndarray] = None
    span_lengths: Optional[np.ndarray] = None
    span_sampled: Optional[np.ndarray] = None


def word_units(word_starts: np.ndarray) -> np.ndarray:
    """(N, T) bool/int word-start flags → (N, T) int word index per token, unique within a row and < T."""
    ws = np.asarray(word_starts).astype(bool).copy()
    ws[:, 0] = True
    return np.cumsum(ws, axis=1) - 1


def corrupt(input_ids: np.ndarray, selected: np.ndarray, rng: np.random.Generator, mask_id: int,
            random_ids: np.ndarray, units: Optional[np.ndarray] = None,
            replace_probs: tuple = (0.8, 0.1, 0.1)) -> np.ndarray:
    """Apply 80/10/10 replacement to the ``selected`` (N, T) positions of ``input_ids`` (N, T).

    ``units`` (N, T) ints < T: one draw per unit (word or span) instead of per token.
    ``random_ids``: ids a random replacement is drawn from (uniformly; the non-special vocabulary).
    Returns the corrupted ids (a copy).
    """
    n, t = input_ids.shape
    r = rng.random((n, t))
    if units is not None:
        r = np.take_along_axis(r, np.clip(units, 0, t - 1), axis=1)
    p_mask, p_rand = replace_probs[0], replace_probs[1]
    to_mask = selected & (r < p_mask)
    to_rand = selected & (r >= p_mask) & (r < p_mask + p_rand)
    out = input_ids.copy()
    out[to_mask] = mask_id
    k = int(to_rand.sum())
    if k:
        out[to_rand] = random_ids[rng.integers(0, len(random_ids), size=k)]
    return out


def mask_tokens(input_ids: np.ndarray, special_mask: np.ndarray, rng: np.random.Generator, mask_id: int,
                random_ids: np.ndarray, mlm_probability: float = 0.15,
                word_starts: Optional[np.ndarray] = None, replace_probs: tuple = (0.8, 0.1, 0.1),
                ) -> MaskOutput:
    """BERT MLM masking (token-level, or whole-word when ``word_starts`` is given).

    Args:
        input_ids: (N, T) int token ids.
        special_mask: (N, T) bool, True for [CLS]/[SEP]/[PAD]/… (never selected).
        rng: NumPy generator (seed it per example for static masking).
        mask_id: id of [MASK] / <mask>.
        random_ids: candidate ids for the 10% random replacement.
        mlm_probability: selection rate (0.15 in BERT).
        word_starts: (N, T) flags, 1 where a token starts a word: enables whole-word masking.
    Returns:
        :class:`MaskOutput` with ``input_ids``, ``labels`` and ``selected``.
    """
    input_ids = np.asarray(input_ids)
    n, t = input_ids.shape
    u = rng.random((n, t))
    units = None
    if word_starts is not None:
        units = word_units(word_starts)
        u = np.take_along_axis(u, units, axis=1)  # one draw per word, shared by its sub-tokens
    selected = (u < mlm_probability) & ~special_mask
    ids = corrupt(input_ids, selected, rng, mask_id, random_ids, None, replace_probs)  # 80/10/10 per token
    labels = np.where(selected, input_ids, IGNORE_INDEX)
    return MaskOutput(ids, labels, selected)


def _boundaries(word_starts: Optional[np.ndarray], special_mask: np.ndarray) -> np.ndarray:
    """(N, T) bool: where a word starts or a special token stands (every token is a word when
    ``word_starts`` is None); a candidate token right after a special token also starts a word."""
    n, t = special_mask.shape
    ws = np.ones((n, t), dtype=bool) if word_starts is None else np.asarray(word_starts).astype(bool)
    prev_special = np.concatenate([np.ones((n, 1), bool), special_mask[:, :-1]], axis=1)
    return ws | special_mask | prev_special


def _words(boundaries: np.ndarray, cand: np.ndarray) -> tuple:
    """One row's words among its candidate tokens: ``(starts, ends)`` token indices (ends exclusive; a
    word ends at the next boundary of :func:`_boundaries`, or at T)."""
    starts = np.flatnonzero(boundaries & cand)
    allb = np.flatnonzero(boundaries)
    nxt = np.searchsorted(allb, starts, side="right")
    return starts, np.where(nxt < len(allb), allb[np.minimum(nxt, len(allb) - 1)], len(boundaries))


def mask_spans(input_ids: np.ndarray, special_mask: np.ndarray, rng: np.random.Generator, mask_id: int,
               random_ids: np.ndarray, mlm_probability: float = 0.15,
               word_starts: Optional[np.ndarray] = None, geometric_p: float = 0.2, max_span: int = 10,
               replace_probs: tuple = (0.8, 0.1, 0.1)) -> MaskOutput:
    """SpanBERT span masking (Joshi et al. 2020, §3.1), as the authors' ``PairWithSpanMaskingScheme``.

    Per row, the budget is ``ceil(mlm_probability · n)`` of its n non-special tokens. Repeatedly: sample a
    span length ℓ (words) from the truncated geometric distribution and an anchor token uniformly (a long
    word is hit more often); an anchor already selected is skipped. The span starts at the anchor's word
    and covers ℓ consecutive whole words, *running through* words that earlier spans selected; it stops
    early at a special token or when the budget is spent (the last word may be cut there). Overlapping or
    touching spans are then merged, so each merged span's outer boundaries x_{s-1}, x_{e+1} are never
    masked (the SBO conditions on them, §3.2), and each merged span is replaced 80/10/10 as a unit.

    Args: as :func:`mask_tokens`; ``word_starts`` None means every token is a word.
    Returns:
        :class:`MaskOutput` including the merged spans' boundaries (for the SBO head) and, per sampled
        span, its length and the words it covered.
    """
    input_ids = np.asarray(input_ids)
    n, t = input_ids.shape
    ws = _boundaries(word_starts, special_mask)
    probs = span_length_distribution(geometric_p, max_span)
    cdf = np.cumsum(probs)
    cdf[-1] = 1.0
    selected = np.zeros((n, t), dtype=bool)
    left = np.full((n, t), -1, dtype=np.int64)
    right = np.full((n, t), -1, dtype=np.int64)
    pos = np.full((n, t), -1, dtype=np.int64)
    span_unit = np.zeros((n, t), dtype=np.int64)
    realised, sampled = [], []
    sid = 0
    for i in range(n):
        cand = ~special_mask[i]
        cand_pos = np.flatnonzero(cand)
        if len(cand_pos) == 0:
            continue
        # ceil as the reference (1e-9: 0.15 · 100 is 15.000000000000002 in floating point)
        budget = max(1, math.ceil(mlm_probability * len(cand_pos) - 1e-9))
        starts, ends = _words(ws[i], cand)
        word_of = np.searchsorted(starts, cand_pos, side="right") - 1  # candidate token → its word
        nw = len(starts)
        wsel = np.zeros(nw, dtype=bool)
        count, tries = 0, 0
        spans = []
        draws_l = draws_a = np.empty(0, dtype=np.int64)
        while count < budget and tries < 50 * budget:
            if tries % 64 == 0:  # draw lengths and anchors in blocks (one RNG call per 64 spans)
                draws_l = np.searchsorted(cdf, rng.random(64), side="right") + 1
                draws_a = rng.integers(0, len(cand_pos), size=64)
            L, a = int(min(draws_l[tries % 64], max_span)), int(draws_a[tries % 64])
            tries += 1
            if selected[i, cand_pos[a]]:
                continue
            w = int(word_of[a])
            s_tok = e_tok = starts[w]
            nwords = 0
            while w < nw and nwords < L and count < budget:
                if nwords > 0 and starts[w] != ends[w - 1]:
                    break  # a special token lies between the two words
                if wsel[w]:  # selected by an earlier span: the span runs through it
                    e_tok = ends[w]
                else:
                    take = min(ends[w] - starts[w], budget - count)
                    selected[i, starts[w]:starts[w] + take] = True
                    count += take
                    e_tok = starts[w] + take
                    wsel[w] = True
                nwords += 1
                w += 1
            spans.append((int(s_tok), int(e_tok)))
            realised.append(nwords)
            sampled.append(L)
        merged: list = []
        for s_tok, e_tok in sorted(spans):
            if merged and s_tok <= merged[-1][1]:  # overlapping or touching: one span
                merged[-1][1] = max(merged[-1][1], e_tok)
            else:
                merged.append([s_tok, e_tok])
        for s_tok, e_tok in merged:
            sid += 1
            span = slice(s_tok, e_tok)
            left[i, span] = s_tok - 1
            right[i, span] = e_tok
            pos[i, span] = np.arange(e_tok - s_tok)
            span_unit[i, span] = sid
    ids = corrupt(input_ids, selected, rng, mask_id, random_ids, span_unit % t, replace_probs)
    labels = np.where(selected, input_ids, IGNORE_INDEX)
    return MaskOutput(ids, labels, selected, left, right, pos, np.array(realised, dtype=np.int64),
                      np.array(sampled, dtype=np.int64))


def ngram_length_distribution(max_ngram: int = 3) -> np.ndarray:
    """ALBERT's n-gram lengths: p(n) ∝ 1/n for n = 1..max_ngram (Lan et al. 2019 §4.1; 6/11, 3/11, 2/11)."""
    w = 1.0 / np.arange(1, max_ngram + 1)
    return w / w.sum()


def mask_ngrams(input_ids: np.ndarray, special_mask: np.ndarray, rng: np.random.Generator, mask_id: int,
                random_ids: np.ndarray, mlm_probability: float = 0.15,
                word_starts: Optional[np.ndarray] = None, max_ngram: int = 3,
                replace_probs: tuple = (0.8, 0.1, 0.1)) -> MaskOutput:
    """ALBERT n-gram masking (Lan et al. 2019 §4.1, after Joshi et al.), as ``create_masked_lm_predictions``
    of google-research/albert: the budget is ``round(mlm_probability · n)`` of a row's n non-special
    tokens; the words are visited in random order, and at each an n-gram length is drawn with
    p(n) ∝ 1/n, n ≤ ``max_ngram`` (and ≤ the words left before the next special token); while the n words
    would overrun the budget n shrinks; an n-gram that still overruns or overlaps a selected word is
    skipped, else its n whole words are selected (it may sit right beside an earlier one). Replacement
    80/10/10 per token.

    Args: as :func:`mask_tokens`; ``word_starts`` None means every token is a word.
    Returns: :class:`MaskOutput` with ``input_ids``, ``labels``, ``selected`` and ``span_sampled`` (the
    n drawn for each selected n-gram, after shrinking).
    """
    input_ids = np.asarray(input_ids)
    n, t = input_ids.shape
    ws = _boundaries(word_starts, special_mask)
    probs = ngram_length_distribution(max_ngram)
    cdfs = [np.cumsum(probs[:k]) / probs[:k].sum() for k in range(1, max_ngram + 1)]  # n ≤ k words left
    selected = np.zeros((n, t), dtype=bool)
    lengths = []
    for i in range(n):
        cand = ~special_mask[i]
        n_tok = int(cand.sum())
        if n_tok == 0:
            continue
        budget = max(1, int(round(mlm_probability * n_tok)))
        starts_a, ends_a = _words(ws[i], cand)
        nw = len(starts_a)
        # words left in the same run of non-special tokens, from each word on (reverse count per run)
        brk = np.append(starts_a[1:] != ends_a[:-1], True)  # the run ends after word w
        run_id = np.concatenate([[0], np.cumsum(brk[:-1])])
        run_end = np.flatnonzero(brk)[run_id]
        left_a = run_end - np.arange(nw) + 1
        # each word's n drawn up front: the inverse CDF of u over n ≤ min(max_ngram, words left)
        u = rng.random(nw)
        by_k = np.stack([np.searchsorted(c, u, side="right") + 1 for c in cdfs])  # (max_ngram, nw)
        grams = by_k[np.minimum(left_a, max_ngram) - 1, np.arange(nw)].tolist()
        run_left = left_a.tolist()
        starts, ends = starts_a.tolist(), ends_a.tolist()
        covered = [False] * nw
        count = 0
        for w0 in rng.permutation(nw).tolist():
            if count >= budget:
                break
            g = min(grams[w0], run_left[w0], max_ngram)
            while g > 0 and count + ends[w0 + g - 1] - starts[w0] > budget:
                g -= 1  # a shorter n-gram that fits
            if g == 0 or any(covered[w0:w0 + g]):
                continue
            covered[w0:w0 + g] = [True] * g
            selected[i, starts[w0]:ends[w0 + g - 1]] = True
            count += ends[w0 + g - 1] - starts[w0]
            lengths.append(g)
    ids = corrupt(input_ids, selected, rng, mask_id, random_ids, None, replace_probs)
    labels = np.where(selected, input_ids, IGNORE_INDEX)
    return MaskOutput(ids, labels, selected, span_sampled=np.array(lengths, dtype=np.int64))


__all__ = ["IGNORE_INDEX", "MaskOutput", "mask_tokens", "mask_spans", "mask_ngrams", "corrupt", "word_units",
           "span_length_distribution", "ngram_length_distribution"]
