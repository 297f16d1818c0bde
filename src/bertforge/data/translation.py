"""Parallel text for translation: reading, a joint subword tokenizer, and batches by token count.

* Files are plain text, one sentence per line, source and target aligned line by line (Multi30k,
  WMT ``.en``/``.de`` files).
* The tokenizer is one subword vocabulary learned on source + target together (the paper's shared
  source-target BPE, Vaswani et al. 2017 §5.1; Sennrich et al. 2016), trained with HF ``tokenizers``:
  ``bpe`` or ``unigram`` (Kudo 2018) over NFKC-normalised text with SentencePiece-style ``▁`` word
  boundaries, so decoding gives back detokenized text. Special tokens: ``<pad>`` 0, ``<unk>`` 1,
  ``<s>`` 2, ``</s>`` 3.
* Batches hold about ``max_tokens`` tokens (§5.1: "sentence pairs were batched together by approximate
  sequence length"): pairs are sorted by length and cut so that ``rows × longest side ≤ max_tokens``.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..errors import ConfigError, DataError

SPECIAL_TOKENS = ["<pad>", "<unk>", "<s>", "</s>"]
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def read_lines(path) -> list:
    """Lines of a UTF-8 text file without their newline. Raises DataError: missing, unreadable or empty."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{path} does not exist; pass a text file with one sentence per line")
    try:
        lines = p.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text; convert it (e.g. iconv -t utf-8)") from None
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise DataError(f"{path} is empty; pass a file with one sentence per line")
    return [ln.rstrip("\r") for ln in lines]


def read_parallel(src_path, tgt_path) -> tuple[list, list]:
    """Aligned (source lines, target lines). Raises DataError: the files have different line counts."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; source and "
                        "target files must be aligned line by line")
    return src, tgt


def min_vocab_size(texts: list, kind: str = "bpe") -> int:
    """The smallest ``vocab_size`` :func:`train_joint_tokenizer` can honour on ``texts``: every distinct
    character after NFKC normalisation (a space counts as the word-boundary mark ``▁``) has a token of its
    own, plus the 4 special tokens; the ``unigram`` trainer needs one more. Below it, BPE silently
    returns this many tokens anyway and Unigram fails."""
    from tokenizers import normalizers
    norm = normalizers.NFKC()
    chars = {"▁"}
    for i in range(0, len(texts), 10000):  # in chunks: one normalizer call each, no copy of the corpus
        chars.update(norm.normalize_str("\n".join(texts[i:i + 10000])))
    chars -= {" ", "\n"}
    return len(chars) + len(SPECIAL_TOKENS) + (1 if kind == "unigram" else 0)


def train_joint_tokenizer(texts: list, vocab_size: int = 8000, kind: str = "bpe",
                          min_frequency: int = 2, name: str = "vocab_size"):
    """Learn one subword vocabulary on ``texts`` (source and target sentences together).

    Returns a ``tokenizers.Tokenizer`` of at most ``vocab_size`` tokens whose ids 0–3 are
    ``<pad> <unk> <s> </s>`` and whose decoder turns ids back into detokenized text.
    Raises DataError: unknown ``kind``. ConfigError: ``vocab_size`` below :func:`min_vocab_size` (the
    message names the minimum and calls the setting ``name``, e.g. ``translate.vocab_size``).
    """
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=SPECIAL_TOKENS, show_progress=False)
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                          unk_token="<unk>", show_progress=False)
    else:
        raise DataError(f"tokenizer kind {kind!r}; choose bpe or unigram")
    need = min_vocab_size(texts, kind)
    if vocab_size < need:
        raise ConfigError(f"{name}={vocab_size} is too small for these files: the {kind} tokenizer needs "
                          f"at least {need} (one token per distinct character + {len(SPECIAL_TOKENS)} "
                          f"special tokens); use {name}={need} or more")
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
        pre_tokenizers.Punctuation(behavior="isolated")])  # punctuation never merges into words
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tok.get_vocab_size() > vocab_size:  # a trainer quirk min_vocab_size did not foresee: never exceed
        n = tok.get_vocab_size()
        raise ConfigError(f"{name}={vocab_size} is too small for these files: the {kind} tokenizer came "
                          f"out with {n} tokens; use {name}={n} or more")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise DataError(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    return tok


def encode_source(tokenizer, sentences: list, eos_id: int = EOS, max_positions: int = 1024) -> list:
    """Token ids of each sentence plus ``</s>``, truncated to ``max_positions`` (list of lists)."""
    encs = tokenizer.encode_batch(list(sentences), add_special_tokens=False)
    return [e.ids[: max_positions - 1] + [eos_id] for e in encs]


def encode_pairs(tokenizer, src: list, tgt: list, max_len: int | None = None) -> tuple[list, list, int]:
    """(source ids + </s>, target ids + </s>) per pair; pairs with a side longer than ``max_len``
    tokens (``</s>`` included) are dropped. Returns (src_ids, tgt_ids, n_dropped); the lists are empty
    when every pair was dropped (callers say which setting to raise, see ``translate train``)."""
    s_ids = encode_source(tokenizer, src, EOS, 10**9)
    t_ids = encode_source(tokenizer, tgt, EOS, 10**9)
    if max_len is None:
        return s_ids, t_ids, 0
    keep = [i for i in range(len(s_ids)) if len(s_ids[i]) <= max_len and len(t_ids[i]) <= max_len]
    return [s_ids[i] for i in keep], [t_ids[i] for i in keep], len(s_ids) - len(keep)


def collate_pairs(src_ids: list, tgt_ids: list, pad_id: int = PAD, bos_id: int = BOS) -> dict:
    """Pad a batch: ``input_ids``/``attention_mask`` (B, S); ``decoder_input_ids`` = ``<s> y``;
    ``labels`` = ``y </s>`` with −100 at padding (B, T)."""
    b = len(src_ids)
    s_len = max(len(s) for s in src_ids)
    t_len = max(len(t) for t in tgt_ids)
    input_ids = torch.full((b, s_len), pad_id, dtype=torch.long)
    labels = torch.full((b, t_len), -100, dtype=torch.long)
    dec = torch.full((b, t_len), pad_id, dtype=torch.long)
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        input_ids[i, :len(s)] = torch.tensor(s)
        labels[i, :len(t)] = torch.tensor(t)
        dec[i, 0] = bos_id
        dec[i, 1:len(t)] = torch.tensor(t[:-1])
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad_id).long(),
            "decoder_input_ids": dec, "labels": labels}


def token_batches(src_ids: list, tgt_ids: list, max_tokens: int, seed: int = 0) -> list:
    """Group pair indices into batches of ≤ ``max_tokens`` padded tokens (rows × max(len_src, len_tgt)).

    Pairs are sorted by (target length, source length) with random tie-breaking, so each batch has
    similar lengths and little padding. Returns a list of index lists. Raises DataError: a single pair
    is longer than ``max_tokens``.
    """
    rng = random.Random(seed)
    keys = [(len(tgt_ids[i]), len(src_ids[i]), rng.random(), i) for i in range(len(src_ids))]
    keys.sort()
    batches, cur, longest = [], [], 0
    for tl, sl, _, i in keys:
        m = max(tl, sl)
        if m > max_tokens:
            raise DataError(f"a sentence pair has {m} tokens, more than max_tokens={max_tokens}; raise "
                            "translate.max_tokens or lower translate.max_len")
        if cur and (len(cur) + 1) * max(longest, m) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, m)
    if cur:
        batches.append(cur)
    return batches


class TokenBatchDataset(Dataset):
    """Map-style dataset whose items are whole pre-built batches (dicts of tensors, see
    :func:`collate_pairs`), so the Trainer runs with ``train.batch_size = 1`` and
    :func:`unwrap_collate`; the Trainer's sampler shuffles the batch order every epoch. ``prebatched``
    tells the Trainer that under torchrun each rank takes its own items (batches), not rows of one."""

    prebatched = True

    def __init__(self, src_ids: list, tgt_ids: list, max_tokens: int, seed: int = 0):
        self.batches = [collate_pairs([src_ids[i] for i in idx], [tgt_ids[i] for i in idx])
                        for idx in token_batches(src_ids, tgt_ids, max_tokens, seed)]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict:
        return self.batches[i]


def unwrap_collate(items: list) -> dict:
    """Collate for :class:`TokenBatchDataset` with ``batch_size = 1``: the item is already a batch."""
    if len(items) != 1:
        raise ConfigError("translation batches are built by token count; keep train.batch_size=1 and set "
                          "translate.max_tokens instead")
    return items[0]


__all__ = [
    "SPECIAL_TOKENS",
    "TokenBatchDataset",
    "collate_pairs",
    "encode_pairs",
    "encode_source",
    "min_vocab_size",
    "read_lines",
    "read_parallel",
    "token_batches",
    "train_joint_tokenizer",
    "unwrap_collate",
]
