"""Sentence embeddings from Python: :func:`embed` (the path ``retrieval-eval``, ``embed-eval`` and the server
use: :class:`bertforge.runtime.embedder.Embedder`).

    >>> import bertforge
    >>> v = bertforge.embed("minilm", ["a cat sat on the mat", "a dog lay on the rug"])   # (2, 384)
"""
from __future__ import annotations

from typing import Optional


def embed(model, texts, *, max_seq_len: Optional[int] = None, batch_size: int = 32, dim: Optional[int] = None,
          normalize: Optional[bool] = None, threads: Optional[int] = None, prompt_name: Optional[str] = None):
    """(N, d) float32 sentence embeddings of ``texts`` (a list of str) by ``model`` — a checkpoint dir, an
    export / INT8 dir, a static embedding dir or ``"minilm"`` — pooled as the dir declares (its
    ``1_Pooling``; mean otherwise), cut to ``dim`` coordinates (Matryoshka) and L2-normalised when the dir says
    so (``normalize`` overrides). Each text gets the prompt ``prompt_name`` names (None: the dir's
    ``default_prompt_name``; ``""``: none) and is cut at ``max_seq_len`` tokens (None: the dir's
    ``max_seq_length``, capped at its positions) — the vectors ``POST /embed`` of ``bertforge serve`` gives.

    Raises:
        ConfigError: ``texts`` is a single string or holds a non-string; ``dim`` wider than the model; a
            prompt name the dir does not declare.
        CheckpointError: nothing loadable at ``model``."""
    from ..errors import ConfigError
    from ..runtime.embedder import load_embedder
    from .options import check_option
    if isinstance(texts, str) or texts is None:
        raise ConfigError("embed(): texts must be a list of strings (wrap a single text in a list)")
    try:
        texts = list(texts)  # any iterable, read once
    except TypeError:
        raise ConfigError(f"embed(): texts is a {type(texts).__name__}; pass a list of strings") from None
    if not all(isinstance(t, str) for t in texts):
        raise ConfigError("embed(): texts must be a list of strings (wrap a single text in a list)")
    max_seq_len = check_option("embed", "max_seq_len", max_seq_len, Optional[int])
    batch_size = check_option("embed", "batch_size", batch_size, int)
    dim = check_option("embed", "dim", dim, Optional[int])
    threads = check_option("embed", "threads", threads, Optional[int])
    normalize = check_option("embed", "normalize", normalize, Optional[bool])
    prompt_name = check_option("embed", "prompt_name", prompt_name, Optional[str])
    if max_seq_len is not None and max_seq_len < 3:
        raise ConfigError(f"embed(): max_seq_len={max_seq_len} leaves no room for a token beside [CLS] and "
                          f"[SEP]; pass 3 or more (None: what the dir declares)")
    if batch_size < 1:
        raise ConfigError(f"embed(): batch_size={batch_size} must be ≥ 1")
    from .options import python_names
    with python_names(embed):  # the embedder words its errors for the command line (--dim)
        emb = load_embedder(str(model), threads=threads, dim=dim)
        return emb.embed(texts, max_seq_len, batch_size, normalize=normalize, prompt_name=prompt_name)


__all__ = ["embed"]
