"""TinyBERT data augmentation for task distillation (Jiao et al. 2020, §3.3 and Algorithm 1).

For every word w of a sentence (whitespace words): if w is a single word piece, mask it and take a
masked LM's top-K predictions as candidates; otherwise take the K nearest neighbours of w in a word
embedding table (the paper uses GloVe; here any :class:`Lexicon`). Each of the N augmented copies
replaces every word, with probability ``p`` (TinyBERT: p_t = 0.4, K = 15, N = 20), by a random
candidate. Optional extras: word-order swaps of adjacent words with probability ``swap_prob`` per
position (EDA, Wei & Zou 2019) and a ``generator`` hook (back-translation, LM generation…) whose outputs
are added as further copies.

Lexicons are pluggable: :class:`EmbeddingLexicon` over any (words, vectors) table — built from gensim
``KeyedVectors`` (GloVe / word2vec) or from a checkpoint's own input token embeddings (whole-word
pieces; a multi-piece word is looked up by the mean of its pieces' vectors).
"""
from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import Callable, Optional, Protocol

import numpy as np
import torch

from ..errors import ConfigError
from ..heads import has_mlm_head

_WORDLIKE = re.compile(r"^[A-Za-z][A-Za-z'-]*$")


class Lexicon(Protocol):
    def neighbors(self, word: str, k: int) -> list:
        """Up to ``k`` words similar to ``word`` (most similar first), never ``word`` itself."""


class EmbeddingLexicon:
    """Cosine nearest neighbours in a word-vector table.

    Args:
        words: the table's words (V,).
        vectors: (V, D) float array.
        embed: optional ``word -> vector | None`` for words not in the table (e.g. mean of word pieces).
    """

    def __init__(self, words: list, vectors, embed: Optional[Callable] = None):
        v = np.asarray(vectors, dtype=np.float32)
        if len(words) != v.shape[0]:
            raise ConfigError(f"lexicon has {len(words)} words but {v.shape[0]} vectors")
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.unit = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-8)
        self.embed = embed

    def vector(self, word: str):
        i = self.index.get(word)
        if i is not None:
            return self.unit[i]
        return self.embed(word) if self.embed is not None else None

    def neighbors(self, word: str, k: int) -> list:
        q = self.vector(word)
        if q is None:
            return []
        q = q / max(float(np.linalg.norm(q)), 1e-8)
        sims = self.unit @ q
        top = np.argpartition(-sims, min(k + 1, len(sims) - 1))[:k + 1]
        top = top[np.argsort(-sims[top])]
        return [self.words[i] for i in top if self.words[i] != word][:k]

    @classmethod
    def from_keyed_vectors(cls, kv) -> "EmbeddingLexicon":
        """From gensim ``KeyedVectors`` (GloVe converted with gensim, word2vec, fastText…)."""
        return cls(list(kv.index_to_key), kv.vectors)

    @classmethod
    def from_token_embeddings(cls, tokenizer, weight: torch.Tensor) -> "EmbeddingLexicon":
        """From a model's input token embedding matrix (V, E): the table is the alphabetic whole-word
        tokens; other words are embedded as the mean of their word pieces."""
        vocab = tokenizer.get_vocab()
        w = weight.detach().float().cpu().numpy()
        words = sorted((t for t in vocab if _WORDLIKE.match(t) and len(t) > 1), key=vocab.get)
        ids = [vocab[t] for t in words]

        def embed(word: str):
            pieces = tokenizer.encode(word, add_special_tokens=False).ids
            return w[pieces].mean(0) if pieces else None
        return cls(words, w[ids], embed)


class MaskedLMPredictor:
    """Top-K word-piece predictions of a masked LM for a masked word.

    ``mlm_fn(input_ids (1, T)) -> logits (1, T, V)``: e.g. a :class:`~bertforge.task_model.TaskModel`
    with an MLM head, or ``transformers.AutoModelForMaskedLM`` wrapped as ``lambda x: m(x).logits``.
    """

    def __init__(self, tokenizer, mlm_fn: Callable, mask_token: str = "[MASK]"):
        self.tok, self.fn = tokenizer, mlm_fn
        self.mask_id = tokenizer.token_to_id(mask_token)
        if self.mask_id is None:
            raise ConfigError(f"the tokenizer has no {mask_token} token; MLM augmentation needs one")
        vocab = tokenizer.get_vocab()
        self.allowed = torch.zeros(len(vocab) if vocab else 0, dtype=torch.bool)
        for t, i in vocab.items():
            if _WORDLIKE.match(t):
                self.allowed[i] = True

    @torch.no_grad()
    def candidates(self, words: list, i: int, k: int) -> list:
        """Top-``k`` whole-word predictions for ``words[i]`` masked in context (original excluded)."""
        left = " ".join(words[:i])
        right = " ".join(words[i + 1:])
        ids_l = self.tok.encode(left, add_special_tokens=False).ids if left else []
        ids_r = self.tok.encode(right, add_special_tokens=False).ids if right else []
        enc = self.tok.encode("x", add_special_tokens=True)  # find [CLS] … [SEP] framing
        cls_ids = enc.ids[:1] if len(enc.ids) > 1 else []
        sep_ids = enc.ids[-1:] if len(enc.ids) > 1 else []
        ids = cls_ids + ids_l + [self.mask_id] + ids_r + sep_ids
        pos = len(cls_ids) + len(ids_l)
        logits = self.fn(torch.tensor([ids]))[0, pos].float()
        allowed = self.allowed
        if allowed.numel() < logits.numel():
            allowed = torch.cat([allowed, torch.zeros(logits.numel() - allowed.numel(), dtype=torch.bool)])
        logits = logits.masked_fill(~allowed[:logits.numel()], float("-inf"))
        top = torch.topk(logits, min(k + 1, int(allowed.sum()))).indices.tolist()
        out = [self.tok.id_to_token(t) for t in top]
        return [w for w in out if w != words[i].lower() and w != words[i]][:k]


class Augmenter:
    """TinyBERT Algorithm 1 (see module doc).

    Args:
        tokenizer: HF ``tokenizers.Tokenizer`` of the models (decides single- vs multi-piece words).
        mlm: a :class:`MaskedLMPredictor` for single-piece words (None: use ``lexicon`` for all words).
        lexicon: a :class:`Lexicon` for multi-piece words (and single-piece ones without ``mlm``).
        p: replacement probability per word (0…1); k: candidates per word; swap_prob: per-position
            probability of swapping two adjacent words; generator: ``(text, n) -> list[str]`` hook.
        seed: RNG seed (augmentation is reproducible).
    """

    def __init__(self, tokenizer, mlm: Optional[MaskedLMPredictor] = None, lexicon: Optional[Lexicon] = None,
                 p: float = 0.4, k: int = 15, swap_prob: float = 0.0,
                 generator: Optional[Callable] = None, seed: int = 0):
        if not 0.0 <= p <= 1.0 or not 0.0 <= swap_prob <= 1.0:
            raise ConfigError(f"augmentation probabilities must be in [0, 1] (p={p}, swap_prob={swap_prob})")
        if mlm is None and lexicon is None and generator is None:
            raise ConfigError("augmentation needs a masked LM, a lexicon or a generator")
        self.tok, self.mlm, self.lexicon = tokenizer, mlm, lexicon
        self.p, self.k, self.swap_prob, self.generator = p, int(k), swap_prob, generator
        self.rng = random.Random(seed)

    def is_single_piece(self, word: str) -> bool:
        return len(self.tok.encode(word, add_special_tokens=False).ids) == 1

    def candidates(self, words: list) -> list:
        """Per word: its candidate list (empty for non-words such as punctuation)."""
        out = []
        for i, w in enumerate(words):
            if not _WORDLIKE.match(w):
                out.append([])
            elif self.mlm is not None and self.is_single_piece(w):
                out.append(self.mlm.candidates(words, i, self.k))
            elif self.lexicon is not None:
                out.append(self.lexicon.neighbors(w.lower() if w.lower() != w else w, self.k))
            else:
                out.append([])
        return out

    def augment(self, text: str, n: int) -> list:
        """``n`` augmented copies of ``text`` (plus the generator's outputs when a hook is set)."""
        words = text.split()
        copies = []
        if (self.mlm is not None or self.lexicon is not None) and words:
            cands = self.candidates(words)
            for _ in range(n):
                new = [self.rng.choice(c) if c and self.rng.random() < self.p else w
                       for w, c in zip(words, cands)]
                for j in range(len(new) - 1):
                    if self.swap_prob and self.rng.random() < self.swap_prob:
                        new[j], new[j + 1] = new[j + 1], new[j]
                copies.append(" ".join(new))
        if self.generator is not None:
            copies.extend(self.generator(text, n))
        return copies


def augment_examples(examples: list, augmenter: Augmenter, n: int) -> list:
    """Originals followed by ``n`` augmented copies of each (labels kept; pairs augment ``text_a`` and
    ``text_b`` independently). Soft targets for the copies come from the teacher during distillation."""
    out = list(examples)
    for e in examples:
        a = augmenter.augment(e.text_a, n)
        b = augmenter.augment(e.text_b, n) if e.text_b else [None] * len(a)
        for j, (ta, tb) in enumerate(zip(a, b)):
            out.append(replace(e, text_a=ta, text_b=tb, guid=f"{e.guid}-aug{j}"))
    return out


def default_augmenter(tokenizer, teacher, corpus_examples=None, p: float = 0.4, k: int = 15,
                      swap_prob: float = 0.0, seed: int = 0, mlm_model=None) -> Augmenter:
    """MLM predictions for single-piece words from ``mlm_model`` (a TaskModel whose ``logits`` are masked-LM
    logits (B, T, V) over the teacher's vocabulary, e.g. the pretrained BERT the teacher came from, as
    TinyBERT uses BERT-base), else from the teacher when it has a masked-LM head; the lexicon is the
    teacher's input token embedding table (always, for multi-piece words; also for single-piece words
    without an MLM).

    Raises:
        ConfigError: ``mlm_model``'s logits are not over the tokenizer's vocabulary."""
    lexicon = EmbeddingLexicon.from_token_embeddings(tokenizer, teacher.encoder.embeddings.word_embeddings.weight)
    mlm = None
    source = mlm_model if mlm_model is not None else (teacher if has_mlm_head(teacher) else None)
    if source is not None:
        source.eval()
        mlm = MaskedLMPredictor(tokenizer, lambda x: source(x).logits)
        with torch.no_grad():
            z = source(torch.tensor([[mlm.mask_id]])).logits
        if z is None or z.dim() != 3 or z.shape[-1] < tokenizer.get_vocab_size():
            raise ConfigError(f"the augmentation masked LM gives logits of shape "
                              f"{None if z is None else tuple(z.shape)}, not (B, T, {tokenizer.get_vocab_size()})")
    return Augmenter(tokenizer, mlm=mlm, lexicon=lexicon, p=p, k=k, swap_prob=swap_prob, seed=seed)
