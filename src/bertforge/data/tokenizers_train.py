"""Train subword tokenizers with HF ``tokenizers`` (never re-implemented here).

Kinds, each with the special tokens (and ids) of the family that introduced it:

* ``wordpiece`` — BERT uncased (Devlin et al. 2018; Wu et al. 2016 WordPiece): BertNormalizer
  (lowercase, strip accents), BertPreTokenizer; ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``;
* ``wordpiece-cased`` — the same without lowercasing / accent stripping;
* ``bpe`` — byte-level BPE (GPT-2, Radford et al. 2019; used by RoBERTa, Liu et al. 2019 §4.4):
  ``<s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4``, post-processor ``<s> A </s>``;
* ``unigram`` — Unigram LM (Kudo 2018), SentencePiece-style Metaspace pre-tokenizer, lowercased as ALBERT
  (Lan et al. 2019): ``<pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4``.

:func:`train_tokenizer` returns a ``tokenizers.Tokenizer`` whose post-processor adds the family's
[CLS]/[SEP] so that ``encode(a, b)`` gives ``[CLS] A [SEP] B [SEP]`` with segment ids 0/1.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ..errors import ConfigError

KINDS = ("wordpiece", "wordpiece-cased", "bpe", "unigram")

SPECIALS = {
    "wordpiece": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "wordpiece-cased": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "bpe": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    "unigram": ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
}


def _bert_template(tok: Tokenizer, cls: str, sep: str) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int = 30522,
                    min_frequency: int = 2, length: int | None = None,
                    max_chars: int | None = None) -> Tokenizer:
    """Train a ``kind`` tokenizer on an iterator of texts (streamed; nothing is held in memory).

    Args:
        kind: one of :data:`KINDS`.
        texts: iterable of strings (lines or documents).
        vocab_size: target vocabulary size including the special tokens.
        length: number of texts, for the progress display only.
        max_chars: stop reading texts after this many characters (Unigram training is
            super-linear; by default it reads the first 2M characters).
    Raises:
        ConfigError: unknown kind, ``vocab_size`` below :func:`min_vocab_size`, or a corpus whose distinct
            characters alone need more than ``vocab_size`` tokens.
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)} or pass a "
                          "checkpoint dir")
    specials = SPECIALS[kind]
    if max_chars is None and kind == "unigram":
        max_chars = 2_000_000
    if max_chars:
        texts = _take_chars(texts, max_chars)
    check_vocab_size(kind, vocab_size)
    if kind.startswith("wordpiece"):
        lower = kind == "wordpiece"
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=lower, lowercase=lower)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=specials, continuing_subword_prefix="##",
                                            show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer, length=length)
        tok.model = _canonical_wordpiece(tok, specials)
        tok.post_processor = _bert_template(tok, "[CLS]", "[SEP]")
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer, length=length)
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                          ("<s>", tok.token_to_id("<s>")))
    else:  # unigram
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC(),
                                               normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                          unk_token="<unk>", show_progress=False)
        seen: set = set()  # the characters read, to name the size needed if the trainer refuses

        def noting(lines):
            for line in lines:
                seen.update(line)
                yield line
        failed = False
        try:
            tok.train_from_iterator(noting(texts), trainer=trainer, length=length)
        except Exception as e:  # tokenizers raises a bare Exception
            if "not large enough" not in str(e):
                raise
            failed = True
        # below this (each character, "▁", the specials and one more) the trainer fails or overshoots
        need = len(set(tok.normalizer.normalize_str("".join(seen))) - {" ", "\n"}) + 1 + len(specials) + 1
        if vocab_size < need or failed:
            _too_small(kind, vocab_size, max(need, vocab_size + 1))
        tok.post_processor = _bert_template(tok, "[CLS]", "[SEP]")
    check_trained_size(tok, kind, vocab_size)
    return tok


def min_vocab_size(kind: str) -> int:
    """Smallest vocabulary :func:`train_tokenizer` accepts for ``kind``: byte-level BPE holds its 256 byte
    symbols + the special tokens (Radford et al. 2019, §2.2); the others the special tokens + 64."""
    return len(SPECIALS[kind]) + (256 if kind == "bpe" else 64)


def check_vocab_size(kind: str, vocab_size: int) -> None:
    """Raise ConfigError when ``vocab_size`` is below :func:`min_vocab_size` of ``kind``."""
    need = min_vocab_size(kind)
    if vocab_size < need:
        raise ConfigError(f"--vocab-size {vocab_size} is too small for a {kind} tokenizer; use at least {need}"
                          + (" (its 256 byte symbols + 5 special tokens)" if kind == "bpe" else ""))


def check_trained_size(tok: Tokenizer, kind: str, vocab_size: int) -> None:
    """Raise ConfigError when a tokenizer trained for ``vocab_size`` came out larger: the WordPiece trainer
    keeps every character of the corpus whatever the budget."""
    if tok.get_vocab_size() > vocab_size:
        n = tok.get_vocab_size()
        raise ConfigError(f"--vocab-size {vocab_size} is too small for this corpus: the {kind} tokenizer came "
                          f"out with {n} tokens (one per distinct character at least); use --vocab-size {n} "
                          f"or more")


def _too_small(kind: str, vocab_size: int, need: int):
    raise ConfigError(f"--vocab-size {vocab_size} is too small for this corpus: the {kind} tokenizer needs "
                      f"{need} tokens for its characters alone; use --vocab-size {need} or more") from None


def _canonical_wordpiece(tok: Tokenizer, specials: list) -> models.WordPiece:
    """The trained WordPiece model with its ids re-assigned in a fixed order: special tokens first (as
    trained), then every other token sorted by its string. The trainer numbers tokens by merge order, and
    merges of equal count come out in a different order in every run (``tokenizers`` iterates Rust hash
    maps with per-process random seeds), so the same corpus gave other ids each time; WordPiece's
    greedy longest-match encoding does not depend on the ids, only on the set of tokens."""
    vocab = tok.get_vocab()
    rest = sorted(t for t in vocab if t not in specials)
    ordered = [t for t in specials if t in vocab] + rest
    return models.WordPiece(vocab={t: i for i, t in enumerate(ordered)}, unk_token="[UNK]",
                            continuing_subword_prefix="##", max_input_chars_per_word=100)


def _take_chars(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    n = 0
    for t in texts:
        if n >= max_chars:
            return
        n += len(t)
        yield t


def iter_lines(files: Iterable[str]) -> Iterator[str]:
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if line:
                    yield line


__all__ = ["KINDS", "SPECIALS", "train_tokenizer", "min_vocab_size", "check_vocab_size",
           "check_trained_size", "iter_lines"]
