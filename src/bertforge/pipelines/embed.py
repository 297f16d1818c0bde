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
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise ConfigError("texts must be a list of strings (wrap a single text in a list)")
    emb = load_embedder(str(model), threads=threads, dim=dim)
    return emb.embed(list(texts), max_seq_len, batch_size, normalize=normalize, prompt_name=prompt_name)


__all__ = ["embed"]
