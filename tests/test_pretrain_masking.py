"""Statistical tests of pretraining masking and pair building, each over ≥ 1M synthetic tokens.

Truths: the rates the papers specify — BERT 15% selection and 80/10/10 replacement (Devlin et al. 2018
§3.1), SpanBERT span lengths Geometric(0.2) truncated at 10 words, mean 3.8 (Joshi et al. 2020 §3.1),
NSP/SOP labels 50/50 (Devlin §3.1, Lan et al. 2019 §4.1) — checked with tolerances of several standard
errors at this sample size.
"""
import math

import numpy as np
import pytest
import torch

from bertforge.data.corpus import PretrainDataset
from bertforge.objectives.collate import PretrainCollator
from bertforge.objectives.masking import mask_spans, mask_tokens, span_length_distribution, word_units

V, MASK, CLS, SEP, PAD = 30522, 103, 101, 102, 0
SPECIAL_IDS = [PAD, CLS, SEP, MASK, 100]
RANDOM_IDS = np.setdiff1d(np.arange(V), SPECIAL_IDS)
N, T = 8192, 128  # 1,048,576 positions


def synthetic_batch(seed=0):
    """(N, T) ids with [CLS] first, [SEP] last real token, padding on ¼ of the rows, random words."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, V, size=(N, T))
    lengths = np.where(rng.random(N) < 0.25, rng.integers(16, T, size=N), T)
    pad = np.arange(T)[None, :] >= lengths[:, None]
    ids[pad] = PAD
    ids[:, 0] = CLS
    ids[np.arange(N), lengths - 1] = SEP
    ids[:, T // 2] = SEP  # a segment separator in the middle
    special = np.isin(ids, SPECIAL_IDS)
    word_starts = rng.random((N, T)) < 0.7  # ~1.43 sub-tokens per word
    return ids, special, word_starts


def _check_replacement(ids, out, units=None):
    sel = out.selected
    got = out.input_ids[sel]
    orig = ids[sel]
    f_mask = (got == MASK).mean()
    f_same = (got == orig).mean()
    # a random replacement equal to the original is possible (1/V); it counts as "kept"
    f_rand = 1 - f_mask - f_same
    assert abs(f_mask - 0.8) < 0.01, f_mask
    assert abs(f_rand - 0.1) < 0.01, f_rand
    assert abs(f_same - 0.1) < 0.01, f_same
    assert not np.isin(got[got != orig], [PAD, CLS, SEP, 100]).any()  # random ids never special


def test_token_masking_rates_over_1m_tokens():
    ids, special, _ = synthetic_batch(0)
    out = mask_tokens(ids, special, np.random.default_rng(1), MASK, RANDOM_IDS)
    cand = ~special
    assert cand.sum() >= 1_000_000 * 0.7
    rate = out.selected[cand].mean()
    assert abs(rate - 0.15) < 0.005, rate
    assert not out.selected[special].any()  # [CLS], [SEP], padding never selected
    assert (out.input_ids[special] == ids[special]).all()
    assert (out.labels[out.selected] == ids[out.selected]).all()
    assert (out.labels[~out.selected] == -100).all()
    _check_replacement(ids, out)


def test_electra_generator_input_is_85_mask_15_kept():
    """ELECTRA's reference masking (google-research/electra pretrain_helpers.mask): 85% of the selected
    tokens become [MASK], 15% stay, none is replaced by a random token; the electra objective uses it and
    every other objective BERT's 80/10/10; other splits are refused in one line."""
    from bertforge.errors import ConfigError
    from bertforge.objectives.pretrain import resolve_options
    assert resolve_options("electra", {})["replace_probs"] == [0.85, 0.0, 0.15]
    for objective in ("bert", "roberta", "albert", "spanbert"):
        assert resolve_options(objective, {})["replace_probs"] == [0.8, 0.1, 0.1]
    for bad in ([0.9, 0.2, 0.1], [0.5, 0.5], "0.8", [0.8, -0.1, 0.3]):
        with pytest.raises(ConfigError, match="pretrain.replace_probs"):
            resolve_options("bert", {"replace_probs": bad})
    ids, special, _ = synthetic_batch(2)
    out = mask_tokens(ids, special, np.random.default_rng(3), MASK, RANDOM_IDS,
                      replace_probs=tuple(resolve_options("electra", {})["replace_probs"]))
    got, orig = out.input_ids[out.selected], ids[out.selected]
    assert abs((got == MASK).mean() - 0.85) < 0.005 and abs((got == orig).mean() - 0.15) < 0.005
    assert ((got == MASK) | (got == orig)).all()  # no random token


def _word_selection(out, special, ws):
    """Per word (row-unique key) of the non-special tokens: selected tokens, tokens, and whether it is
    partly selected."""
    key = (word_units(ws | special) + np.arange(N)[:, None] * T)[~special]
    n_sel = np.bincount(key, weights=out.selected[~special].astype(np.int64), minlength=N * T)
    n_tok = np.bincount(key, minlength=N * T)
    return n_sel, n_tok, (n_sel > 0) & (n_sel < n_tok)


def test_whole_word_masking_selects_whole_words():
    ids, special, ws = synthetic_batch(2)
    out = mask_tokens(ids, special, np.random.default_rng(3), MASK, RANDOM_IDS, word_starts=ws)
    rate = out.selected[~special].mean()
    assert abs(rate - 0.15) < 0.005, rate
    assert not out.selected[special].any()
    # every word (among non-special tokens) is all-selected or none-selected
    n_sel, n_tok, part = _word_selection(out, special, ws)
    assert not part.any()
    assert (n_tok[n_sel > 0] > 1).any()  # multi-token words were selected whole
    _check_replacement(ids, out)
    # the replacement is drawn per token (Google's WWM release): a selected 2-token word is mixed
    # ([MASK] beside a kept/random token) with probability 1 - 0.8² - 0.2² = 0.32
    key = (word_units(ws | special) + np.arange(N)[:, None] * T)[~special]
    n_mask = np.bincount(key, weights=(out.input_ids[~special] == MASK).astype(np.int64), minlength=N * T)
    two = (n_tok == 2) & (n_sel == 2)
    mixed = ((n_mask[two] > 0) & (n_mask[two] < 2)).mean()
    assert abs(mixed - 0.32) < 0.02, mixed


def reference_span_masking(n_tok, word_start, rng, ratio=0.15, p=0.2, max_len=10):
    """The masking loop of SpanBERT's code (facebookresearch/SpanBERT, pretraining/fairseq/data/masking.py,
    PairWithSpanMaskingScheme.mask + merge_intervals), re-written plainly for one segment of ``n_tok``
    tokens: returns the merged spans as (first, last) inclusive token indices."""
    lens = np.arange(1, max_len + 1)
    w = p * (1 - p) ** (lens - 1)
    w = w / w.sum()
    goal = math.ceil(n_tok * ratio - 1e-9)
    masked, spans = set(), []

    def word_end(i):  # index after the word containing i
        i += 1
        while i < n_tok and not word_start[i]:
            i += 1
        return i
    while len(masked) < goal:
        length = rng.choice(lens, p=w)
        anchor = int(rng.integers(n_tok))
        if anchor in masked:
            continue
        lo = anchor
        while lo > 0 and not word_start[lo]:
            lo -= 1
        span = [lo, lo]
        words, i = 0, lo
        while words < length and i < n_tok and len(masked) < goal:
            end = word_end(i)
            for j in range(i, end):
                if len(masked) >= goal:
                    break
                masked.add(j)
                span[1] = j
            words += 1
            i = end
        spans.append(span)
    merged = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def test_span_masking_lengths_and_rates():
    ids, special, ws = synthetic_batch(4)
    out = mask_spans(ids, special, np.random.default_rng(5), MASK, RANDOM_IDS, word_starts=ws)
    dist = span_length_distribution(0.2, 10)
    assert abs((dist * np.arange(1, 11)).sum() - 3.8) < 0.05  # the paper's mean
    assert abs(out.span_sampled.mean() - 3.8) < 0.2, out.span_sampled.mean()
    assert out.span_sampled.max() <= 10 and out.span_lengths.max() <= 10
    assert (out.span_lengths <= out.span_sampled).all()
    # empirical length distribution matches the truncated geometric (each bin within 1 point)
    freq = np.bincount(out.span_sampled, minlength=11)[1:] / len(out.span_sampled)
    assert np.abs(freq - dist).max() < 0.01
    # each row selects exactly its budget, ceil(15% of its non-special tokens), as the reference code
    n_cand = (~special).sum(1)
    assert (out.selected.sum(1) == np.ceil(0.15 * n_cand - 1e-9)).all()
    assert not out.selected[special].any()
    # boundaries lie just outside each (merged) span and are never masked themselves, so the SBO
    # always conditions on context (Joshi et al. §3.2); positions count from 0 at the span start
    r, c = np.nonzero(out.selected)
    assert ((out.span_left >= 0) == out.selected).all()
    assert (out.span_left[r, c] < c).all() and (out.span_right[r, c] > c).all()
    assert not out.selected[r, out.span_left[r, c]].any()
    assert not out.selected[r, np.minimum(out.span_right[r, c], T - 1)][out.span_right[r, c] < T].any()
    assert (c - out.span_left[r, c] - 1 == out.span_pos[r, c]).all()
    # 80/10/10 is decided per span: a span is all [MASK], or has no [MASK] at all
    sid = out.span_left[r, c] + r * T
    is_mask = out.input_ids[r, c] == MASK
    m = np.bincount(sid, weights=is_mask, minlength=N * T)
    n = np.bincount(sid, minlength=N * T)
    spans = n > 0
    assert not ((m[spans] > 0) & (m[spans] < n[spans])).any()
    assert abs((m[spans] == n[spans]).mean() - 0.8) < 0.015
    _check_replacement(ids, out)


def test_span_masking_matches_the_reference_code():
    """Merged-span statistics equal those of the authors' loop (re-written above) on the same segments:
    mean merged span length in tokens and merged spans per segment, within a few standard errors."""
    rng = np.random.default_rng(7)
    rows = 3000
    n_tok = rng.integers(40, 127, size=rows)
    word_start = rng.random((rows, 127)) < 0.7
    word_start[:, 0] = True
    ref_len, ref_count = [], []
    for i in range(rows):
        merged = reference_span_masking(int(n_tok[i]), word_start[i, :n_tok[i]], rng)
        ref_len += [b - a + 1 for a, b in merged]
        ref_count.append(len(merged))
    ids = np.full((rows, 128), PAD)
    ids[:, 0] = CLS
    for i in range(rows):
        ids[i, 1:n_tok[i] + 1] = rng.integers(1000, V, size=n_tok[i])
        ids[i, n_tok[i] + 1] = SEP
    special = np.isin(ids, SPECIAL_IDS)
    ws = np.zeros((rows, 128), bool)
    ws[:, 1:] = word_start
    out = mask_spans(ids, special, np.random.default_rng(8), MASK, RANDOM_IDS, word_starts=ws)
    r, c = np.nonzero(out.selected & (out.span_pos == 0))
    got_len = (out.span_right - out.span_left - 1)[r, c]
    got_count = np.bincount(r, minlength=rows)
    se_len = np.std(ref_len) / np.sqrt(len(ref_len)) * np.sqrt(2)
    assert abs(got_len.mean() - np.mean(ref_len)) < 4 * se_len, (got_len.mean(), np.mean(ref_len))
    se_count = np.std(ref_count) / np.sqrt(rows) * np.sqrt(2)
    assert abs(got_count.mean() - np.mean(ref_count)) < 4 * se_count, (got_count.mean(), np.mean(ref_count))


def reference_ngram_masking(n_tok, word_start, rng, ratio=0.15, max_ngram=3):
    """ALBERT's ``create_masked_lm_predictions`` (google-research/albert, n-gram part) re-written plainly
    for one segment of ``n_tok`` tokens: returns the n of each n-gram it masks and the tokens masked."""
    words = []
    for i in range(n_tok):
        if word_start[i] or not words:
            words.append([i])
        else:
            words[-1].append(i)
    goal = max(1, int(round(n_tok * ratio)))
    pv = 1.0 / np.arange(1, max_ngram + 1)
    order = list(range(len(words)))
    rng.shuffle(order)
    covered, taken, ns = set(), 0, []
    for w in order:
        if taken >= goal:
            break
        grams = [sum(words[w:w + k], []) for k in range(1, max_ngram + 1) if w + k <= len(words)]
        p = pv[:len(grams)] / pv[:len(grams)].sum()
        k = int(rng.choice(np.arange(1, len(grams) + 1), p=p))
        while k > 1 and taken + len(grams[k - 1]) > goal:
            k -= 1
        if taken + len(grams[k - 1]) > goal or covered & set(grams[k - 1]):
            continue
        covered |= set(grams[k - 1])
        taken += len(grams[k - 1])
        ns.append(k)
    return ns, taken


def test_ngram_masking_matches_albert_reference_code():
    """Over ≥ 1M tokens: whole words only, ~15% selected, per-token 80/10/10, never a special token; the
    n-gram length histogram and the selected count equal those of ALBERT's loop (re-written above)."""
    from bertforge.objectives.masking import mask_ngrams, ngram_length_distribution
    assert np.allclose(ngram_length_distribution(3), [6 / 11, 3 / 11, 2 / 11])
    ids, special, ws = synthetic_batch(6)
    out = mask_ngrams(ids, special, np.random.default_rng(7), MASK, RANDOM_IDS, word_starts=ws)
    rate = out.selected[~special].mean()
    assert abs(rate - 0.15) < 0.005, rate
    assert not out.selected[special].any()
    assert not _word_selection(out, special, ws)[2].any()  # whole words
    _check_replacement(ids, out)
    # the reference on single segments of the same shape as our rows' halves
    rng = np.random.default_rng(9)
    rows, seg = 4000, 62
    ref_ns, ref_taken = [], 0
    word_start = rng.random((rows, seg)) < 0.7
    for i in range(rows):
        ns, taken = reference_ngram_masking(seg, word_start[i], rng)
        ref_ns += ns
        ref_taken += taken
    seg_ids = np.concatenate([np.full((rows, 1), CLS), rng.integers(1000, V, size=(rows, seg)),
                              np.full((rows, 1), SEP)], axis=1)
    seg_ws = np.concatenate([np.ones((rows, 1), bool), word_start, np.ones((rows, 1), bool)], axis=1)
    got = mask_ngrams(seg_ids, np.isin(seg_ids, SPECIAL_IDS), np.random.default_rng(10), MASK, RANDOM_IDS,
                      word_starts=seg_ws)
    assert int(got.selected.sum()) == ref_taken  # both fill round(15% · 62) = 9 tokens a row
    h_got = np.bincount(got.span_sampled, minlength=4)[1:] / len(got.span_sampled)
    h_ref = np.bincount(ref_ns, minlength=4)[1:] / len(ref_ns)
    assert np.abs(h_got - h_ref).max() < 0.015, (h_got, h_ref)


class FakeCorpus:
    """A TokenizedCorpus stand-in: documents of random sentences with globally unique token ids."""

    def __init__(self, n_docs=3200, seed=0):
        rng = np.random.default_rng(seed)
        lens, docs = [], []
        for d in range(n_docs):
            k = int(rng.integers(1, 30))  # some one-sentence documents
            lens += list(rng.integers(5, 40, size=k))
            docs += [d] * k
        self.offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        self.doc = np.array(docs, dtype=np.int64)
        n = int(self.offsets[-1])
        self.ids = (np.arange(n) % 20000 + 1000).astype(np.int32)
        self.word_starts = np.ones(n, np.uint8)
        self.sent_of = np.repeat(np.arange(len(lens)), lens)  # token → sentence

    @property
    def lengths(self):
        return np.diff(self.offsets)

    def __len__(self):
        return len(self.doc)


@pytest.mark.parametrize("mode", ["nsp", "sop"])
def test_pair_labels_balanced(mode):
    c = FakeCorpus()
    assert c.offsets[-1] >= 1_000_000
    ds = PretrainDataset(c, mode, 128, CLS, SEP, short_seq_prob=0.1, seed=3)
    labels = ds.index[:, 4]
    assert len(labels) > 5000
    assert abs(labels.mean() - 0.5) < 0.02, labels.mean()
    # inspect instances: segment A then B, positives/negatives built as the papers say
    key = "next_sentence_label" if mode == "nsp" else "sentence_order_label"
    for i in range(0, len(ds), max(1, len(ds) // 400)):
        it = ds[i]
        ids = it["input_ids"]
        assert len(ids) <= 128 and ids[0] == CLS and ids[-1] == SEP
        seps = np.flatnonzero(ids == SEP)
        a, b = ids[1:seps[0]], ids[seps[0] + 1:-1]
        assert (it["token_type_ids"][:seps[0] + 1] == 0).all() and (it["token_type_ids"][seps[0] + 1:] == 1).all()
        tok_a, tok_b = a.astype(np.int64) - 1000, b.astype(np.int64) - 1000  # ids encode positions mod 20000
        a0, a1, b0, b1, lab = (int(x) for x in ds.index[i, :5])
        da, db = c.doc[ds.sent[a0]], c.doc[ds.sent[b0]]
        assert it[key] == lab
        if mode == "nsp":
            if lab == 0:
                assert da == db and b0 == a1  # B is the actual continuation
            else:
                assert da != db  # B from another document
        else:
            assert da == db and b0 == a1  # SOP pairs are always consecutive segments of one document
            if len(tok_a) and len(tok_b):
                # token ids grow with corpus position (mod 20000): swapped ⇔ the first segment is later
                later_first = (tok_a[0] - tok_b[0]) % 20000 < 10000
                assert later_first == (lab == 1)


def _items(n=64, seed=0):
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        L = int(rng.integers(20, 60))
        ids = np.concatenate([[CLS], rng.integers(1000, V, L - 2), [SEP]])
        items.append({"input_ids": ids, "token_type_ids": np.zeros(L, np.int64),
                      "word_starts": np.ones(L, np.uint8)})
    return items


def test_dynamic_masking_changes_static_does_not():
    coll = PretrainCollator(PAD, MASK, SPECIAL_IDS, V)
    items = _items()
    torch.manual_seed(0)
    d1 = coll(items)["labels"]
    torch.manual_seed(1)
    d2 = coll(items)["labels"]
    assert not torch.equal(d1 != -100, d2 != -100)  # dynamic: a fresh mask on re-serve
    static = [dict(x, mask_seed=1000 + i) for i, x in enumerate(items)]
    torch.manual_seed(0)
    s1 = coll(static)
    torch.manual_seed(1)
    s2 = coll(list(reversed(static[:10])) + static[10:])  # other order and batch padding
    lab1 = s1["labels"]
    lab2 = torch.cat([s2["labels"][:10].flip(0), s2["labels"][10:]])
    t = min(lab1.shape[1], lab2.shape[1])
    assert torch.equal(lab1[:, :t], lab2[:, :t])  # static: the same mask every time it is served
    assert (s1["labels"][s1["attention_mask"] == 0] == -100).all()


def test_collator_never_masks_specials_over_many_batches():
    coll = PretrainCollator(PAD, MASK, SPECIAL_IDS, V, scheme="span")
    items = _items(256, seed=5)
    total = sel = budget = 0
    for s in range(4):
        torch.manual_seed(s)
        b = coll(items)
        orig = torch.zeros_like(b["input_ids"])
        for i, x in enumerate(items):
            orig[i, :len(x["input_ids"])] = torch.from_numpy(x["input_ids"])
        special = torch.isin(orig, torch.tensor(SPECIAL_IDS)) | (b["attention_mask"] == 0)
        assert ((b["labels"] != -100) & special).sum() == 0
        assert (b["input_ids"][special] == orig[special]).all()
        total += int((~special).sum())
        sel += int((b["labels"] != -100).sum())
        budget += int(np.ceil(0.15 * (~special).sum(1).numpy() - 1e-9).sum())  # SpanBERT's per-row ceil
    assert sel == budget and abs(sel / total - 0.15) < 0.02
