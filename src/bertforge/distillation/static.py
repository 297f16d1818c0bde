"""Static embeddings distilled from a sentence encoder (the model2vec recipe; Tulkens & van Dongen 2024).

Three steps, each a function here, :func:`distill_static` runs them in order:

1. :func:`token_vectors` — every vocabulary token *alone* through the teacher, with the model's special
   tokens around it (``[CLS] t [SEP]``), and the teacher's output mean-pooled over those positions:
   one (H,) vector per token, the vector the teacher gives a one-token text.
2. :func:`pca` — principal component analysis of those vectors (centred), projected on ``d`` components
   (sign fixed so that each component's largest-magnitude score is positive). PCA both shrinks the table
   and spreads the variance the raw outputs concentrate in a few directions (model2vec). Beyond model2vec,
   the top ``remove_top`` components are skipped (components ``remove_top + 1 … remove_top + d`` are
   kept): the common directions that every token shares and that dominate a mean of token vectors —
   SIF's common-component removal (Arora et al. 2017, §4.1, the first singular vector) and "all-but-the-top"
   (Mu & Viswanath 2018, the top D ≈ H/100 components). ``remove_top=0`` is model2vec's recipe; the default
   8 was chosen on the *train* articles of the SQuAD-dev retrieval split (NDCG@10 0.608 → 0.650 at d = 256;
   benchmarks/results/static.txt reports the held-out eval articles).
3. :func:`sif_weights` — each row scaled by the SIF weight a / (a + p(w)) (Arora, Liang & Ma 2017, eq. 1
   and §4.1), with p(w) estimated from Zipf's law on the token's frequency rank r: p ∝ 1 / (r + 1) over the
   n ranked tokens (rank = vocabulary order, which for BERT's WordPiece vocabulary roughly follows
   frequency among whole words), a = 1e-4 by default. Frequent tokens (p ≫ a) count little in the mean.

Special tokens ([CLS], [SEP], [PAD], [MASK], [UNK]) and ``[unusedN]`` placeholders get zero rows. The result
is written by :func:`bertforge.models.static.save_static`, whose ``tokenizer.json`` adds no special tokens to a
text (as model2vec and sentence-transformers tokenize it) and cuts it at the dir's one maximum length; a text
is then encoded by a table lookup and a mean over its own word pieces.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..errors import CheckpointError, ConfigError

#: token strings that are not text: placeholders of BERT vocabularies
PLACEHOLDER = re.compile(r"^\[unused\d+\]$")


def text_token_ids(tok) -> tuple:
    """``(kept, dropped)`` id arrays of a ``tokenizers.Tokenizer``'s vocabulary, each in id order: kept are
    the ids that stand for text; dropped the special tokens and ``[unusedN]`` placeholders."""
    from ..tokenizer import special_tokens
    vocab = tok.get_vocab(with_added_tokens=True)
    special = {tok.token_to_id(t) for t in special_tokens(tok).values()}
    special |= {i for t, i in vocab.items() if PLACEHOLDER.match(t)}
    try:
        special |= {int(i) for i, a in tok.get_added_tokens_decoder().items() if a.special}
    except AttributeError:  # an older tokenizers without get_added_tokens_decoder
        pass
    n = max(vocab.values()) + 1
    ids = np.arange(n)
    keep = np.array([i not in special for i in ids])
    return ids[keep], ids[~keep]


def token_vectors(model, token_ids, cls_id: Optional[int], sep_id: Optional[int], batch_size: int = 1024,
                  pooling: str = "mean", progress: bool = False) -> np.ndarray:
    """Each token of ``token_ids`` alone through ``model`` (a :class:`~bertforge.task_model.TaskModel`),
    as ``[cls_id] t [sep_id]`` (whichever of them is not None), pooled over those positions → (N, H)
    float32. ``pooling``: :data:`bertforge.models.pooling.POOLING_MODES` (model2vec: mean)."""
    from ..models.pooling import pool
    ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long)[:, None]
    parts = ([torch.full_like(ids, cls_id)] if cls_id is not None else []) + [ids] + \
            ([torch.full_like(ids, sep_id)] if sep_id is not None else [])
    x = torch.cat(parts, 1)
    out = np.empty((len(ids), model.config.hidden_size), dtype=np.float32)
    device = next(model.parameters()).device
    model.eval()
    from ..progress import track
    with torch.inference_mode():
        for s in track(range(0, len(x), batch_size), "vocabulary", unit="batch", show=progress):
            b = x[s:s + batch_size].to(device)
            am = torch.ones_like(b)
            h = model(b, am, torch.zeros_like(b)).last_hidden_state
            out[s:s + len(b)] = pool(h, am, pooling).float().cpu().numpy()
    return out


def pca(x: np.ndarray, dim: int, skip: int = 0) -> tuple:
    """Project the rows of ``x`` (N, H) on their principal components ``skip + 1 … skip + dim`` (after
    centring; ``skip=0``: the top ``dim``).

    Returns ``(scores (N, dim) float32, explained_variance_ratio (dim,))``. Each component's sign makes its
    largest-magnitude score positive (sklearn's ``svd_flip`` convention on the scores), so the result is
    deterministic. Raises ConfigError unless 1 ≤ ``dim`` and ``skip + dim`` ≤ min(N, H)."""
    n, h = x.shape
    if dim < 1 or skip < 0 or skip + dim > min(n, h):
        raise ConfigError(f"--dim {dim} (+ {skip} removed components): the teacher's vectors have {h} "
                          f"dimensions ({n} tokens); pass --dim + --remove-top ≤ {min(n, h)}")
    x64 = x.astype(np.float64)
    xc = x64 - x64.mean(0)
    cov = xc.T @ xc / max(n - 1, 1)
    vals, vecs = np.linalg.eigh(cov)
    order = np.argsort(vals)[::-1][skip:skip + dim]
    comps = vecs[:, order]
    scores = xc @ comps
    big = np.abs(scores).argmax(0)
    scores *= np.sign(scores[big, np.arange(dim)])
    ratio = np.clip(vals[order], 0, None) / max(float(np.clip(vals, 0, None).sum()), 1e-30)
    return scores.astype(np.float32), ratio


def sif_weights(n: int, a: float = 1e-4) -> np.ndarray:
    """SIF weights a / (a + p_r) for ranks r = 1 … n, with the Zipf estimate p_r = (1 / (r + 1)) / Σ_k 1 / (k + 1)
    (Arora et al. 2017, eq. 1; Zipf rank as in model2vec). (n,) float64, increasing with rank.
    Raises ConfigError unless 0 < a < 1."""
    if not 0 < a < 1:
        raise ConfigError(f"--sif-coefficient {a}: pass a value in (0, 1) (model2vec: 1e-4)")
    inv = 1.0 / np.arange(2, n + 2, dtype=np.float64)
    p = inv / inv.sum()
    return a / (a + p)


#: default number of top principal components removed (see the module docstring)
REMOVE_TOP = 8


def distill_static(teacher, tokenizer, dim: int = 256, sif_coefficient: float = 1e-4, batch_size: int = 1024,
                   progress: bool = False, remove_top: int = REMOVE_TOP) -> tuple:
    """The static table of ``teacher`` (a TaskModel) over the vocabulary of ``tokenizer``.

    Returns ``(table (V, dim) float32, record)``: V = the tokenizer's vocabulary size (rows of special
    tokens and placeholders are zero), ``record`` the facts for ``config.json`` (tokens embedded, explained
    variance, coefficient). Raises ConfigError for ``dim`` beyond the teacher's width, CheckpointError for
    a vocabulary larger than the teacher's embedding table."""
    from ..tokenizer import special_tokens
    kept, dropped = text_token_ids(tokenizer)
    v_model = teacher.config.vocab_size
    if len(kept) == 0:
        raise CheckpointError("the teacher's tokenizer has no text tokens; pass a teacher with its tokenizer")
    if kept.max() >= v_model:
        raise CheckpointError(f"the tokenizer has ids up to {kept.max()} but the teacher embeds {v_model} "
                              f"tokens; the tokenizer files belong to another model")
    if not 1 <= dim <= teacher.config.hidden_size:
        raise ConfigError(f"--dim {dim}: the teacher's vectors have {teacher.config.hidden_size} dimensions; "
                          f"pass 1 … {teacher.config.hidden_size}")
    remove_top = min(remove_top, teacher.config.hidden_size - dim)  # as many as the width leaves
    sp = special_tokens(tokenizer)
    cls_id = tokenizer.token_to_id(sp["cls"]) if "cls" in sp else None
    sep_id = tokenizer.token_to_id(sp["sep"]) if "sep" in sp else None
    vecs = token_vectors(teacher, kept, cls_id, sep_id, batch_size, progress=progress)
    scores, ratio = pca(vecs, dim, remove_top)
    scores = scores * sif_weights(len(kept), sif_coefficient)[:, None].astype(np.float32)
    table = np.zeros((int(max(v_model, kept.max() + 1)), dim), dtype=np.float32)
    table[kept] = scores
    rec = {"method": "static", "dim": dim, "sif_coefficient": sif_coefficient, "removed_components": remove_top, "tokens_embedded": int(len(kept)),
           "tokens_zeroed": int(len(dropped)), "pca_explained_variance": round(float(ratio.sum()), 4),
           "token_input": " ".join(x for x in ("[cls]" if cls_id is not None else "", "t",
                                               "[sep]" if sep_id is not None else "") if x),
           "frequency_estimate": "zipf rank = vocabulary order"}
    return table, rec


def check_teacher_tokenizer(teacher_dir) -> None:
    """CheckpointError (one line) unless ``teacher_dir`` has tokenizer files: a static model *is* its
    tokenizer's vocabulary, so there is nothing to distil without one."""
    from ..tokenizer import TOKENIZER_FILES
    d = Path(teacher_dir)
    if not any((d / f).is_file() for f in ("tokenizer.json", "vocab.txt", "vocab.json")):
        raise CheckpointError(f"teacher {d} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])} or vocab.txt); "
                              f"a static model embeds the teacher's vocabulary, so copy the tokenizer files of "
                              f"the model into {d}")


__all__ = ["REMOVE_TOP", "text_token_ids", "token_vectors", "pca", "sif_weights", "distill_static", "check_teacher_tokenizer"]
