"""Tokenize examples once; pad each batch to its own longest sequence (dynamic padding)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..tokenizer import encode_texts


def encode_examples(tok, examples: list, max_length: int) -> list:
    """Examples → list of dicts ``input_ids``, ``token_type_ids`` (lists of int) and ``labels``.

    Sentence pairs become ``[CLS] A [SEP] B [SEP]`` (segment ids 0/1) by the tokenizer's own
    post-processor; pairs are truncated longest-first to ``max_length``.
    """
    pair = examples and examples[0].text_b is not None
    encs = encode_texts(tok, [e.text_a for e in examples],
                        [e.text_b or "" for e in examples] if pair else None, max_length)
    out = []
    for e, enc in zip(examples, encs):
        d = {"input_ids": enc.ids, "token_type_ids": enc.type_ids}
        if e.label is not None:
            d["labels"] = e.label
        out.append(d)
    return out


class PadCollator:
    """List of encoded examples → batch dict of (B, T) tensors, T = longest in the batch.

    ``input_ids`` padded with ``pad_id``; ``attention_mask`` 1 for tokens, 0 for padding;
    ``token_type_ids`` padded with 0; ``labels`` (B,) long, or float when they are floats.
    """

    def __init__(self, pad_id: int = 0, pad_to_multiple_of: Optional[int] = None):
        self.pad_id, self.multiple = pad_id, pad_to_multiple_of

    def __call__(self, items: list) -> dict:
        t = max(len(x["input_ids"]) for x in items)
        if self.multiple:
            t = -(-t // self.multiple) * self.multiple
        b = len(items)
        ids = torch.full((b, t), self.pad_id, dtype=torch.long)
        tt = torch.zeros((b, t), dtype=torch.long)
        am = torch.zeros((b, t), dtype=torch.long)
        for i, x in enumerate(items):
            n = len(x["input_ids"])
            ids[i, :n] = torch.tensor(x["input_ids"])
            if "token_type_ids" in x:
                tt[i, :n] = torch.tensor(x["token_type_ids"])
            am[i, :n] = 1
        batch = {"input_ids": ids, "attention_mask": am, "token_type_ids": tt}
        if all("labels" in x for x in items):  # e.g. predict on a file where only some rows are labelled
            labs = [x["labels"] for x in items]
            batch["labels"] = torch.tensor(labs, dtype=torch.float if isinstance(labs[0], float) else torch.long)
        return batch


def length_sorted_batches(encs: list, pid: int, batch_size: int):
    """Inference batches of encoded texts (``tokenizers.Encoding``-like: ``ids``, ``type_ids``) in order of
    length, each padded with ``pid`` to its own longest: yields (row indices, (B, T) int64 ``input_ids``,
    ``attention_mask``, ``token_type_ids``) numpy arrays."""
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
