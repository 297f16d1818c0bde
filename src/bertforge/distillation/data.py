"""Distillation data: raw-text corpora → token sequences (general distillation), and the collator that
carries each example's dataset position (``example_index``) for the teacher-output cache.

General distillation (TinyBERT §3.2 "general distillation" on a text corpus; DistilBERT on the BERT
corpus) reads plain text: files are split into paragraphs (blank lines; WikiText ``= Heading =`` lines
are dropped), tokenized without special tokens, concatenated per file and cut into chunks of
``max_seq_len − 2`` tokens, each wrapped as ``[CLS] chunk [SEP]``. Inputs are the plain text (TinyBERT)
or, with ``mlm_probability > 0``, MLM-style corrupted (BERT's 15% with 80/10/10 replacement,
Devlin et al. 2018 §3.1; DistilBERT), with ``mlm_labels`` = the original ids at selected positions and
−100 elsewhere.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import torch

from ..data.corpus import require_corpus_file
from ..errors import DataError
from ..tokenizer import special_tokens

_HEADING = re.compile(r"^\s*=+ .* =+\s*$")


def read_paragraphs(path) -> list:
    """Paragraphs of a UTF-8 text file (blank-line separated; WikiText headings dropped).

    Files that are not UTF-8 are read as Latin-1 (with a note on stderr).
    Raises:
        DataError: missing or empty file.
    """
    p = require_corpus_file(path, "pass text files with --corpus")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # old plain-text corpora (e.g. Gutenberg) are often Latin-1
        import sys
        text = raw.decode("latin-1")
        print(f"bertforge: {p} is not UTF-8; read as Latin-1", file=sys.stderr)
    paras, cur = [], []
    for line in text.splitlines():
        if not line.strip() or _HEADING.match(line):
            if cur:
                paras.append(" ".join(cur))
                cur = []
            continue
        cur.append(line.strip())
    if cur:
        paras.append(" ".join(cur))
    if not paras:
        raise DataError(f"corpus file {p} has no text; pass a non-empty file")
    return paras


def corpus_sequences(paths: list, tokenizer, max_seq_len: int, max_sequences: Optional[int] = None) -> list:
    """Text files → list of ``{"input_ids", "token_type_ids"}`` of length ≤ ``max_seq_len``
    (``max_sequences``: keep that many, evenly spread over the whole corpus).

    Raises:
        DataError: no files, unreadable files, or no sequence produced; ConfigError-like DataError when
            the tokenizer has no [CLS]/[SEP].
    """
    if not paths:
        raise DataError("general distillation needs text: pass --corpus FILE [FILE …]")
    sp = special_tokens(tokenizer)
    if "cls" not in sp or "sep" not in sp:
        raise DataError("the teacher's tokenizer has no [CLS]/[SEP] tokens; use a BERT-family checkpoint")
    cls_id, sep_id = tokenizer.token_to_id(sp["cls"]), tokenizer.token_to_id(sp["sep"])
    body = max(1, max_seq_len - 2)
    out: list = []
    for path in paths:
        paras = read_paragraphs(path)
        stream: list = []
        for enc in tokenizer.encode_batch(paras, add_special_tokens=False):
            stream.extend(enc.ids)
        for s in range(0, len(stream), body):
            chunk = stream[s:s + body]
            if len(chunk) < 8 and out:
                continue
            ids = [cls_id] + chunk + [sep_id]
            out.append({"input_ids": ids, "token_type_ids": [0] * len(ids)})
    if not out:
        raise DataError(f"the corpus {', '.join(map(str, paths))} produced no sequences; pass more text")
    if max_sequences is not None and len(out) > max_sequences:  # spread evenly over every file
        step = len(out) / max_sequences
        out = [out[int(i * step)] for i in range(max_sequences)]
    return out


class IndexedDataset:
    """A list of encoded examples whose items also carry their position ``idx`` (for the cache)."""

    def __init__(self, items: list, group_by_length: bool = False):
        self.items = items
        #: the Trainer's default for ``train.group_by_length`` (independent texts: embedding_mse)
        self.group_by_length = group_by_length

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return {**self.items[i], "idx": i}


class DistillCollator:
    """Wrap a collator: pop each item's ``idx`` into ``example_index`` (B,); optionally apply MLM
    corruption (``mlm_probability`` > 0: 80% [MASK], 10% random token, 10% unchanged, Devlin et al.
    2018 §3.1) to non-special, non-padding tokens, adding ``mlm_labels`` (B, T)."""

    def __init__(self, base, mlm_probability: float = 0.0, mask_id: Optional[int] = None,
                 vocab_size: Optional[int] = None, special_ids: tuple = ()):
        self.base, self.p = base, float(mlm_probability)
        self.mask_id, self.vocab_size, self.special_ids = mask_id, vocab_size, tuple(special_ids)

    def __call__(self, items: list) -> dict:
        idx = [it.get("idx") for it in items]
        batch = self.base([{k: v for k, v in it.items() if k != "idx"} for it in items])
        if all(i is not None for i in idx):
            batch["example_index"] = torch.tensor(idx, dtype=torch.long)
        if self.p > 0:
            ids = batch["input_ids"]
            can = batch["attention_mask"].bool()
            for s in self.special_ids:
                can &= ids != s
            sel = (torch.rand(ids.shape) < self.p) & can
            labels = torch.where(sel, ids, torch.full_like(ids, -100))
            r = torch.rand(ids.shape)
            ids = ids.clone()
            ids[sel & (r < 0.8)] = self.mask_id
            rnd = sel & (r >= 0.8) & (r < 0.9)
            ids[rnd] = torch.randint(self.vocab_size, (int(rnd.sum()),))
            batch["input_ids"], batch["mlm_labels"] = ids, labels
        return batch
