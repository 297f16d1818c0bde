"""Sentence embeddings from token states: mean, CLS and max pooling, optional L2 normalisation.

The pooling an embedding model was trained with is part of the model: a mean-pooled model read through its
[CLS] vector gives worse vectors without any error. Sentence-BERT (Reimers & Gurevych 2019, §3) compares the
three strategies; MEAN is its default and the one the MiniLM checkpoint was trained with.

:func:`pool` is the PyTorch path (training, the torch runner); :func:`pool_numpy` the same arithmetic on the
arrays an ONNX Runtime or static runner returns (serving, ``embed``, ``retrieval-eval``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

#: the pooling modes, in the order sentence-transformers' ``1_Pooling/config.json`` lists them
POOLING_MODES = ("mean", "cls", "max")


def _check(mode: str) -> None:
    if mode not in POOLING_MODES:
        raise ValueError(f"unknown pooling {mode!r}; choose one of {', '.join(POOLING_MODES)}")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str = "mean",
         normalize: bool = False) -> torch.Tensor:
    """(B, T, H) ``hidden`` states and (B, T) ``attention_mask`` (1 = token, 0 = padding) → (B, H).

    ``mean``: average over the unmasked positions (a row with none gives zeros); ``cls``: position 0;
    ``max``: element-wise max over the unmasked positions. ``normalize``: divide each row by its L2 norm
    (cosine similarity becomes a dot product). Raises ValueError for an unknown ``mode``.
    """
    _check(mode)
    if mode == "cls":
        out = hidden[:, 0]
    else:
        m = attention_mask.to(hidden.dtype).unsqueeze(-1)
        if mode == "mean":
            out = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
        else:
            out = hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).max(1).values
            out = torch.where(m.sum(1) > 0, out, torch.zeros_like(out))
    return torch.nn.functional.normalize(out, dim=-1) if normalize else out


def pool_numpy(hidden: np.ndarray, attention_mask: np.ndarray, mode: str = "mean",
               normalize: bool = False) -> np.ndarray:
    """:func:`pool` on numpy arrays: (B, T, H), (B, T) → (B, H) float32."""
    _check(mode)
    h = hidden.astype(np.float32, copy=False)
    if mode == "cls":
        out = h[:, 0].copy()
    else:
        m = attention_mask[..., None].astype(np.float32)
        if mode == "mean":  # (B, 1, T) @ (B, T, H): one batched GEMV instead of a (B, T, H) product
            out = np.matmul(m.transpose(0, 2, 1), h)[:, 0] / np.clip(m.sum(1), 1.0, None)
        else:
            out = np.where(m > 0, h, np.finfo(np.float32).min).max(1)
            out = np.where(m.sum(1) > 0, out, 0.0).astype(np.float32)
    if normalize:
        out = out / np.clip(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12, None)
    return out


# ------------------------------------------------------------------------------ pooling saved in a dir
#: the ``1_Pooling/config.json`` key of each mode (sentence-transformers' ``models.Pooling``)
_ST_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}
_ST_TRANSFORMER = "sentence_transformers.models.Transformer"
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class Pooling:
    """How a dir's token states become one sentence vector: ``mode`` (mean / cls / max), ``normalize``
    (L2 to unit length), ``max_seq_length`` (tokens the model was trained to embed; None: its positions),
    and ``declared`` (whether the dir says so, rather than the default ``mean``, not normalised)."""

    mode: str = "mean"
    normalize: bool = False
    max_seq_length: Optional[int] = None
    declared: bool = False


def _json(path: Path) -> dict:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def read_pooling(model_dir) -> Pooling:
    """The pooling a model dir declares, in the sentence-transformers layout: ``1_Pooling/config.json``
    (mode; ``pooling_mode_mean_sqrt_len_tokens`` and weighted modes are read as mean), a
    ``sentence_transformers.models.Normalize`` entry in ``modules.json`` (normalize) and
    ``sentence_bert_config.json`` (``max_seq_length``). A dir without them (any plain HF checkpoint, an
    ``.onnx`` file's folder) gives ``Pooling("mean", False)``: Sentence-BERT's default (Reimers & Gurevych
    2019, §3). ``model_dir`` may be a file: its folder is read. Never raises for a missing/garbled file."""
    d = Path(model_dir)
    d = d.parent if d.is_file() else d
    modules = []
    try:
        m = json.loads((d / "modules.json").read_text(encoding="utf-8"))
        modules = m if isinstance(m, list) else []
    except (OSError, ValueError):
        pass
    pool_path = next((str(x.get("path") or "1_Pooling") for x in modules
                      if isinstance(x, dict) and x.get("type") == _ST_POOLING), "1_Pooling")
    cfg = _json(d / pool_path / "config.json")
    mode = "mean"
    if cfg.get("pooling_mode_cls_token") and not cfg.get("pooling_mode_mean_tokens"):
        mode = "cls"
    elif cfg.get("pooling_mode_max_tokens") and not cfg.get("pooling_mode_mean_tokens"):
        mode = "max"
    normalize = any(isinstance(x, dict) and x.get("type") == _ST_NORMALIZE for x in modules)
    st = _json(d / "sentence_bert_config.json")
    msl = st.get("max_seq_length")
    msl = msl if isinstance(msl, int) and not isinstance(msl, bool) and msl > 0 else None
    return Pooling(mode, normalize, msl, declared=bool(cfg) or bool(modules))


def write_pooling(model_dir, mode: str = "mean", normalize: bool = False, hidden_size: Optional[int] = None,
                  max_seq_length: Optional[int] = None, do_lower_case: bool = False) -> None:
    """Write the sentence-transformers layout into an HF checkpoint dir (``config.json`` +
    ``model.safetensors`` + tokenizer already there): ``modules.json`` (Transformer → Pooling
    [→ Normalize]), ``1_Pooling/config.json``, ``sentence_bert_config.json`` and, with ``normalize``,
    ``2_Normalize/``. ``SentenceTransformer(model_dir)`` then loads it and gives the vectors
    :func:`read_pooling` + :func:`pool` give. ``hidden_size``: the vector width (default: ``hidden_size`` of
    ``config.json``). Files are written atomically. Raises ValueError for an unknown ``mode``."""
    from ..io import atomic_write_text
    _check(mode)
    d = Path(model_dir)
    if hidden_size is None:
        hidden_size = _json(d / "config.json").get("hidden_size")
    modules = [{"idx": 0, "name": "0", "path": "", "type": _ST_TRANSFORMER},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST_POOLING}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _ST_NORMALIZE})
        (d / "2_Normalize").mkdir(parents=True, exist_ok=True)
    (d / "1_Pooling").mkdir(parents=True, exist_ok=True)
    cfg = {"word_embedding_dimension": hidden_size,
           **{k: (m == mode) for m, k in _ST_KEYS.items()},
           "pooling_mode_mean_sqrt_len_tokens": False}
    atomic_write_text(d / "1_Pooling" / "config.json", json.dumps(cfg, indent=2))
    st = {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case}
    if max_seq_length is None:
        st.pop("max_seq_length")
    atomic_write_text(d / "sentence_bert_config.json", json.dumps(st, indent=2))
    atomic_write_text(d / "modules.json", json.dumps(modules, indent=2))


def carry_pooling(src_dir, dst_dir) -> bool:
    """Write the pooling ``src_dir`` declares into ``dst_dir`` (an export, a quantized copy of the same model),
    so that the copy embeds as the original does. Returns whether there was one to carry."""
    p = read_pooling(src_dir)
    if not p.declared:
        return False
    write_pooling(dst_dir, p.mode, p.normalize, max_seq_length=p.max_seq_length)
    return True


#: sentence-transformers' model settings file (``truncate_dim``: the dimension a Matryoshka model serves)
_ST_MODEL_CONFIG = "config_sentence_transformers.json"


def write_truncate_dim(model_dir, dim: int) -> None:
    """Record in ``model_dir`` that its vectors are served cut to their first ``dim`` coordinates (a
    Matryoshka model, Kusupati et al. 2022): ``truncate_dim`` in ``config_sentence_transformers.json``, which
    ``SentenceTransformer(model_dir)`` applies; other keys of that file are kept. Written atomically."""
    from ..io import atomic_write_text
    d = Path(model_dir)
    cfg = _json(d / _ST_MODEL_CONFIG)
    cfg["truncate_dim"] = int(dim)
    atomic_write_text(d / _ST_MODEL_CONFIG, json.dumps(cfg, indent=2))


def read_truncate_dim(model_dir) -> Optional[int]:
    """The ``truncate_dim`` a dir records (:func:`write_truncate_dim`), or None."""
    d = Path(model_dir)
    v = _json((d.parent if d.is_file() else d) / _ST_MODEL_CONFIG).get("truncate_dim")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


__all__ = ["POOLING_MODES", "Pooling", "pool", "carry_pooling", "pool_numpy", "read_pooling", "write_pooling",
           "write_truncate_dim", "read_truncate_dim"]
