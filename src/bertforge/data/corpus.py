"""Pretraining corpora: text → documents → sentences → tokenized, cached → training sequences.

Pipeline (Devlin et al. 2018 App. A.2; Liu et al. 2019 §4.2):

1. **Documents** (:mod:`bertforge.data.text_sources`). Local text files are read line by line (streaming). ``doc_sep`` says where a document
   ends: ``file`` (one document per file), ``blank`` (a blank line ends a document — BERT's
   ``create_pretraining_data`` format), ``heading`` (WikiText ``= Title =`` lines start one), or
   ``auto`` (``heading`` when the file has WikiText headings, ``blank`` for one sentence per line with
   blank lines between documents, else ``file``). Lines of one paragraph are
   joined (hard-wrapped books), then split into sentences. A name that is not a local file is read from
   the HF hub with ``datasets.load_dataset(name, streaming=True)`` (column ``text``; one row = one
   document).
2. **Tokenization, cached.** Sentences are tokenized in batches with the HF ``tokenizers`` object and
   written through ``datasets.Dataset.from_generator`` to Arrow files in the cache directory (memory-mapped,
   never all in RAM), then flattened once into memory-mapped NumPy arrays: token ids, word-start flags
   (from the tokenizer's ``word_ids``: whole-word masking works for any tokenizer), sentence offsets and
   document ids. The cache key is the files' paths/sizes/mtimes, the tokenizer JSON and ``doc_sep``.
3. **Sequences** (:class:`PretrainDataset`):

   * ``full`` — FULL-SENTENCES: contiguous sentences packed up to ``max_seq_len`` tokens, crossing
     document boundaries with an extra [SEP] between documents (RoBERTa §4.2);
   * ``doc`` — DOC-SENTENCES: the same, never crossing a document boundary;
   * ``nsp`` — BERT segment pairs ``[CLS] A [SEP] B [SEP]``: B is the true continuation (label 0, IsNext)
     or, with probability 0.5, text from a random other document (label 1, NotNext) (Devlin et al. §3.1,
     Task #2); built as in BERT's ``create_instances_from_document``;
   * ``sop`` — ALBERT sentence-order pairs: two consecutive segments of one document, in order (label 0)
     or, with probability 0.5, swapped (label 1) (Lan et al. 2019 §4.1).

   With probability ``short_seq_prob`` the target length is drawn uniformly in [2, max] (BERT uses
   0.1). ``dupe_factor`` K builds the instances K times with different randomness (BERT's static
   masking duplicates the data 10×); with ``static_masking`` each instance carries a ``mask_seed`` so it
   is masked the same way every time it is served.

The label draw is made *before* a pair is built and documents with a single sentence never yield an
instance, so NSP/SOP labels are exactly Bernoulli(0.5) (BERT's reference code forces NotNext for
one-sentence chunks, which biases the split).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import DataError
from ..io import atomic_dir
# step 1, the raw text (re-exported: callers import them from here too)
from .text_sources import (_iter_hub_documents, hub_dataset, iter_corpus_lines, iter_documents,  # noqa: F401
                           open_hub_dataset, reach_hub_sources, require_corpus_file, source_meta,
                           split_sentences)

MODES = ("full", "doc", "nsp", "sop")
CACHE_VERSION = "3"  # 3: auto doc_sep recognises blank-line documents


def default_cache_dir() -> Path:
    return Path(os.environ.get("BERTFORGE_CACHE", Path.home() / ".cache" / "bertforge"))


def _from_generator(datasets, root: Path, sources: list, doc_sep, tj: str, meta: list):
    """The tokenized sentence rows as an Arrow-backed ``datasets.Dataset`` under ``root / "arrow"``."""
    return datasets.Dataset.from_generator(
        _tokenized_rows, gen_kwargs={"sources_json": json.dumps(sources), "doc_sep": doc_sep,
                                     "tokenizer_json": tj, "meta_json": json.dumps(meta)},
        cache_dir=str(root / "arrow"), features=datasets.Features({
            "doc": datasets.Value("int64"),
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "word_starts": datasets.Sequence(datasets.Value("int8"))}))


def _tokenized_rows(sources_json: str, doc_sep: str, tokenizer_json: str, batch_size: int = 2000,
                    meta_json: str = ""):
    """Generator for ``datasets.Dataset.from_generator``: one row per sentence (``meta_json`` keys the
    cache). Arguments are JSON strings: ``datasets`` would shard list arguments and restart the
    document numbering per file."""
    from tokenizers import Tokenizer
    sources = json.loads(sources_json)
    tok = Tokenizer.from_str(tokenizer_json)
    tok.no_truncation()
    tok.no_padding()
    buf_doc, buf_text = [], []
    doc_id = 0

    def emit():
        encs = tok.encode_batch(buf_text, add_special_tokens=False)
        for d, e in zip(buf_doc, encs):
            if not e.ids:
                continue
            wid = e.word_ids
            starts = [1 if k == 0 or wid[k] != wid[k - 1] or wid[k] is None else 0 for k in range(len(wid))]
            yield {"doc": d, "input_ids": e.ids, "word_starts": starts}
        buf_doc.clear()
        buf_text.clear()

    for src in sources:
        docs = _iter_hub_documents(src) if hub_dataset(src) else iter_documents(src, doc_sep)
        for sents in docs:
            for s in sents:
                buf_doc.append(doc_id)
                buf_text.append(s)
            doc_id += 1
            if len(buf_text) >= batch_size:
                yield from emit()
    if buf_text:
        yield from emit()


class TokenizedCorpus:
    """Memory-mapped tokenized corpus: ``ids`` (n_tokens,) int32, ``word_starts`` (n_tokens,) uint8,
    ``offsets`` (n_sentences + 1,) int64, ``doc`` (n_sentences,) int64 (non-decreasing)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.ids = np.load(self.path / "ids.npy", mmap_mode="r")
        self.word_starts = np.load(self.path / "word_starts.npy", mmap_mode="r")
        self.offsets = np.load(self.path / "offsets.npy")
        self.doc = np.load(self.path / "doc.npy")
        self.meta = json.loads((self.path / "meta.json").read_text())

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return len(self.doc)

    @classmethod
    def build(cls, sources: list, tokenizer, cache_dir=None, doc_sep: str = "auto") -> "TokenizedCorpus":
        """Tokenize ``sources`` (text files or hub dataset names) once; later calls reuse the cache.

        Raises:
            DataError: a file is missing or the corpus has no text.
        """
        sources = [str(s) for s in sources]
        meta = source_meta(sources)
        tj = tokenizer.to_str()
        key = hashlib.sha256(json.dumps([CACHE_VERSION, meta, doc_sep,
                                         hashlib.sha256(tj.encode()).hexdigest()]).encode()).hexdigest()[:16]
        root = Path(cache_dir) if cache_dir else default_cache_dir()
        path = root / f"corpus-{key}"
        if (path / "meta.json").is_file():
            return cls(path)
        reach_hub_sources(sources)  # inside from_generator a failure would be a DatasetGenerationError
        import datasets
        datasets.disable_progress_bars()
        with atomic_dir(path) as tmp:
            try:
                ds = _from_generator(datasets, root, sources, doc_sep, tj, meta)
            except ValueError as e:  # datasets: 'Instruction "train" corresponds to no data!'
                if "no data" not in str(e):
                    raise
                raise DataError(f"corpus {', '.join(sources)} has no text (only blank lines); pass non-empty "
                                f"text files") from None
            if len(ds) == 0:
                raise DataError(f"corpus {', '.join(sources)} has no text; pass non-empty text files")
            lengths = _lengths(ds)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            n = int(offsets[-1])
            ids = np.lib.format.open_memmap(tmp / "ids.npy", mode="w+", dtype=np.int32, shape=(n,))
            ws = np.lib.format.open_memmap(tmp / "word_starts.npy", mode="w+", dtype=np.uint8, shape=(n,))
            pos, docs = 0, []
            for batch in ds.with_format("arrow").iter(batch_size=10000):
                flat = batch["input_ids"].combine_chunks().flatten().to_numpy()
                wflat = batch["word_starts"].combine_chunks().flatten().to_numpy()
                ids[pos:pos + len(flat)] = flat
                ws[pos:pos + len(flat)] = wflat
                pos += len(flat)
                docs.append(batch["doc"].to_numpy())
            ids.flush()
            ws.flush()
            del ids, ws
            np.save(tmp / "offsets.npy", offsets)
            np.save(tmp / "doc.npy", np.concatenate(docs).astype(np.int64))
            (tmp / "meta.json").write_text(json.dumps({"sources": meta, "doc_sep": doc_sep,
                                                       "num_tokens": n, "num_sentences": len(lengths)}))
        return cls(path)


def _lengths(ds) -> np.ndarray:
    out = []
    for batch in ds.with_format("arrow").iter(batch_size=10000):
        col = batch["input_ids"].combine_chunks()
        off = col.offsets.to_numpy()
        out.append(np.diff(off))
    return np.concatenate(out).astype(np.int64)


def split_documents(corpus: TokenizedCorpus, eval_fraction: float, seed: int) -> tuple:
    """Boolean sentence masks (train, held-out). The held-out text is the last ``eval_fraction`` of the
    sentences of every document (a contiguous tail, never trained on), so every source/domain of the
    corpus is represented; documents shorter than ``1 / eval_fraction`` sentences stay in training.
    ``seed`` is accepted for API stability (the split is deterministic)."""
    doc = corpus.doc
    ev = np.zeros(len(doc), dtype=bool)
    if eval_fraction <= 0 or len(doc) == 0:
        return ~ev, ev
    bounds = np.flatnonzero(np.diff(doc)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(doc)]])
    for s, e in zip(starts, ends):
        k = int((e - s) * eval_fraction)
        if k >= 1:
            ev[e - k:e] = True
    return ~ev, ev


class PretrainDataset(torch.utils.data.Dataset):
    """Training sequences over a :class:`TokenizedCorpus` (see module doc for ``mode``).

    Items: dict ``input_ids`` (T,) int64 with [CLS]/[SEP], ``token_type_ids`` (T,), ``word_starts`` (T,)
    uint8, plus ``next_sentence_label`` (nsp) / ``sentence_order_label`` (sop) and ``mask_seed`` when
    masking is static.

    Raises:
        DataError: no sequence can be built (corpus too small, or one-sentence documents only for pairs).
    """

    def __init__(self, corpus: TokenizedCorpus, mode: str, max_seq_len: int, cls_id: int, sep_id: int,
                 sentence_mask: Optional[np.ndarray] = None, short_seq_prob: float = 0.0,
                 dupe_factor: int = 1, static_masking: bool = False, seed: int = 0,
                 max_items: Optional[int] = None):
        if mode not in MODES:
            raise DataError(f"sequence mode {mode!r}; choose one of {', '.join(MODES)}")
        if max_seq_len < 8:
            raise DataError(f"max_seq_len {max_seq_len} is too short; use at least 8")
        self.c, self.mode, self.max_len = corpus, mode, max_seq_len
        self.cls_id, self.sep_id = cls_id, sep_id
        self.static, self.seed = static_masking, seed
        sel = np.flatnonzero(sentence_mask) if sentence_mask is not None else np.arange(len(corpus))
        # the units sequences are built from: sentences, a sentence longer than fits a pair being split into
        # pieces at word starts (as RoBERTa's and HF's block packing keep all text), not truncated
        self.sent, self.lo, self.hi = _pieces(corpus, sel, max_seq_len - 3)  # unit → sentence id, tokens
        lengths = self.hi - self.lo
        docs = corpus.doc[self.sent]
        rows = []
        for k in range(max(1, dupe_factor)):
            rng = np.random.default_rng([seed, k, 7])
            if mode in ("full", "doc"):
                r = self._pack(lengths, docs, rng, short_seq_prob)
            else:
                r = self._pairs(lengths, docs, rng, short_seq_prob)
            r = np.concatenate([r, np.full((len(r), 1), k, dtype=np.int64)], axis=1)
            rows.append(r)
        self.index = np.concatenate(rows) if rows else np.zeros((0, 7), np.int64)
        if max_items is not None:
            self.index = self.index[:max_items]
        if len(self.index) == 0:
            raise DataError(f"no {mode} sequences could be built from the corpus; add text (for nsp/sop "
                            "documents need at least two sentences)")

    # -------------------------------------------------------------- building
    def _pack(self, lengths, docs, rng, short_seq_prob) -> np.ndarray:
        budget = self.max_len - 2
        out = []
        i, n = 0, len(lengths)
        full = self.mode == "full"
        while i < n:
            target = budget
            if short_seq_prob and rng.random() < short_seq_prob:
                target = int(rng.integers(2, budget + 1))
            start, length = i, 0
            while i < n:
                extra = lengths[i] + (1 if full and i > start and docs[i] != docs[i - 1] else 0)
                if i > start and (length + extra > target or (not full and docs[i] != docs[start])):
                    break
                length += extra
                i += 1
            out.append((start, i, 0, 0, -1, 0))
        return np.array(out, dtype=np.int64).reshape(-1, 6)

    def _pairs(self, lengths, docs, rng, short_seq_prob) -> np.ndarray:
        max_tokens = self.max_len - 3
        bounds = np.flatnonzero(np.diff(docs)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(docs)]])
        n_docs = len(starts)
        if self.mode == "nsp" and n_docs < 2:
            raise DataError("NSP needs at least two documents (its negatives come from another "
                            "document) but the corpus has one; pass several files or --doc-sep blank")
        out = []
        for d in range(n_docs):
            s, e = starts[d], ends[d]
            if e - s < 2:
                continue
            target = max_tokens
            if short_seq_prob and rng.random() < short_seq_prob:
                target = int(rng.integers(2, max_tokens + 1))
            i, chunk_start, cur = s, s, 0
            while i < e:
                cur += lengths[i]
                if i == e - 1 or cur >= target:
                    chunk_end = i + 1
                    label = int(rng.random() < 0.5)
                    if chunk_end - chunk_start < 2:
                        if chunk_end < e:  # extend by the next sentence so a continuation exists
                            chunk_end += 1
                        else:  # a one-sentence tail: no pair either way (keeps labels unbiased)
                            break
                    n_chunk = chunk_end - chunk_start
                    a_end = chunk_start + (1 if n_chunk < 2 else int(rng.integers(1, n_chunk)))
                    if self.mode == "nsp" and label == 1 and n_docs > 1:
                        rd = d
                        for _ in range(10):
                            rd = int(rng.integers(0, n_docs))
                            if rd != d:
                                break
                        if rd == d:
                            rd = (d + 1) % n_docs
                        rs, re_ = starts[rd], ends[rd]
                        b0 = int(rng.integers(rs, re_))
                        b1, tb = b0, 0
                        target_b = max(1, target - int(lengths[chunk_start:a_end].sum()))
                        while b1 < re_ and tb < target_b:
                            tb += lengths[b1]
                            b1 += 1
                        out.append((chunk_start, a_end, b0, b1, 1, int(rng.integers(0, 2**62))))
                        i = a_end  # the unused sentences go back (BERT: i -= num_unused_segments)
                        chunk_start, cur = i, 0
                        continue
                    if self.mode == "nsp" and label == 1:
                        label = 0  # a single-document corpus has no "other document"
                    out.append((chunk_start, a_end, a_end, chunk_end, label, int(rng.integers(0, 2**62))))
                    i = chunk_end
                    chunk_start, cur = i, 0
                    continue
                i += 1
        return np.array(out, dtype=np.int64).reshape(-1, 6)

    # --------------------------------------------------------------- serving
    def __len__(self) -> int:
        return len(self.index)

    def _tokens(self, a: int, b: int):
        """Tokens and word starts of local units (sentences or pieces of one) [a, b)."""
        o0, o1 = self.lo[a], self.hi[b - 1]
        if o1 - o0 == self.hi[a:b].sum() - self.lo[a:b].sum():  # contiguous in the corpus: one slice
            return np.asarray(self.c.ids[o0:o1], np.int64), np.asarray(self.c.word_starts[o0:o1], np.uint8)
        parts = zip(self.lo[a:b], self.hi[a:b])
        return (np.concatenate([self.c.ids[x:y] for x, y in parts]).astype(np.int64),
                np.concatenate([self.c.word_starts[x:y] for x, y in parts]).astype(np.uint8))

    def __getitem__(self, i: int) -> dict:
        a0, a1, b0, b1, label, seed, k = (int(x) for x in self.index[i])
        item: dict = {}
        if self.mode in ("full", "doc"):
            if self.mode == "full" and self.c.doc[self.sent[a1 - 1]] != self.c.doc[self.sent[a0]]:
                ids_l, ws_l = [], []
                for j in range(a0, a1):  # an extra [SEP] between documents (RoBERTa FULL-SENTENCES)
                    t, w = self._tokens(j, j + 1)
                    if j > a0 and self.c.doc[self.sent[j]] != self.c.doc[self.sent[j - 1]]:
                        ids_l.append(np.array([self.sep_id]))
                        ws_l.append(np.ones(1, np.uint8))
                    ids_l.append(t)
                    ws_l.append(w)
                toks, ws = np.concatenate(ids_l), np.concatenate(ws_l)
            else:
                toks, ws = self._tokens(a0, a1)
            toks, ws = toks[: self.max_len - 2], ws[: self.max_len - 2]
            ids = np.concatenate([[self.cls_id], toks, [self.sep_id]])
            wst = np.concatenate([[1], ws, [1]]).astype(np.uint8)
            tt = np.zeros(len(ids), np.int64)
        else:
            ta, wa = self._tokens(a0, a1)
            tb, wb = self._tokens(b0, b1)
            rng = np.random.default_rng(seed)
            ta, wa, tb, wb = _truncate_pair(ta, wa, tb, wb, self.max_len - 3, rng)
            if self.mode == "sop" and label == 1:
                ta, wa, tb, wb = tb, wb, ta, wa
            ids = np.concatenate([[self.cls_id], ta, [self.sep_id], tb, [self.sep_id]])
            wst = np.concatenate([[1], wa, [1], wb, [1]]).astype(np.uint8)
            tt = np.concatenate([np.zeros(len(ta) + 2, np.int64), np.ones(len(tb) + 1, np.int64)])
            item["next_sentence_label" if self.mode == "nsp" else "sentence_order_label"] = label
        wst[0] = 1
        item.update(input_ids=ids.astype(np.int64), token_type_ids=tt, word_starts=wst)
        if self.static:
            item["mask_seed"] = (self.seed * 1_000_003 + k * 7919 + i) % 2**63
        return item


def _pieces(corpus: TokenizedCorpus, sel: np.ndarray, cap: int) -> tuple:
    """Split the sentences ``sel`` into units of at most ``cap`` tokens: ``(sentence id, first token, end
    token)`` arrays, one entry per unit, in corpus order. A longer sentence is cut at the last word start
    that keeps a piece within ``cap`` (mid-word only for a single word longer than ``cap``)."""
    lo = corpus.offsets[sel].astype(np.int64)
    hi = corpus.offsets[sel + 1].astype(np.int64)
    long = np.flatnonzero(hi - lo > cap)
    if len(long) == 0:
        return sel, lo, hi
    sent, los, his = [], [], []
    prev = 0
    for j in long:
        sent.append(sel[prev:j]), los.append(lo[prev:j]), his.append(hi[prev:j])
        starts, end = lo[j], hi[j]
        ws = np.asarray(corpus.word_starts[starts:end])
        cuts, a = [], int(starts)
        while end - a > cap:
            window = np.flatnonzero(ws[a - starts + 1:a - starts + cap + 1])  # word starts in (a, a + cap]
            b = a + 1 + int(window[-1]) if len(window) else a + cap
            cuts.append(b)
            a = b
        bounds = np.array([starts, *cuts, end], dtype=np.int64)
        sent.append(np.full(len(bounds) - 1, sel[j])), los.append(bounds[:-1]), his.append(bounds[1:])
        prev = j + 1
    sent.append(sel[prev:]), los.append(lo[prev:]), his.append(hi[prev:])
    return np.concatenate(sent), np.concatenate(los), np.concatenate(his)


def _truncate_pair(ta, wa, tb, wb, max_tokens: int, rng):
    """BERT's truncate_seq_pair: drop one token at a time from the longer segment, from the front or
    the back with probability ½ each (Devlin et al. 2018, ``create_pretraining_data.py``)."""
    fa = ba = fb = bb = 0
    la, lb = len(ta), len(tb)
    while la + lb > max_tokens:
        front = rng.random() < 0.5
        if la > lb:
            fa, ba = (fa + 1, ba) if front else (fa, ba + 1)
            la -= 1
        else:
            fb, bb = (fb + 1, bb) if front else (fb, bb + 1)
            lb -= 1
    return (ta[fa:len(ta) - ba], wa[fa:len(wa) - ba], tb[fb:len(tb) - bb], wb[fb:len(wb) - bb])


__all__ = ["TokenizedCorpus", "PretrainDataset", "split_sentences", "iter_documents", "split_documents",
           "default_cache_dir", "MODES"]
