"""Static embeddings: one (V, d) table and mean pooling, no transformer (the model2vec model kind).

A static model maps each token id to a fixed vector; a text's embedding is the mean of its tokens' vectors
(normalised to unit length), so encoding costs one table lookup per token. The table is distilled from a
sentence encoder by :func:`bertforge.distillation.static.distill_static` (every vocabulary token through the
teacher, PCA, SIF/Zipf weights; Tulkens & van Dongen 2024, model2vec).

A static dir is a model dir like any other — ``config.json`` (``model_type: "static"``; the recipe in its
``bertforge`` section), ``model.safetensors`` holding the one tensor ``embedding.weight`` (V, d) float32,
and the teacher's tokenizer files — and every consumer reads it through :func:`bertforge.runtime.load_runner`
(torch: :class:`StaticEmbedding`; ONNX Runtime: a Gather + masked-mean graph). It is also a
sentence-transformers dir (``modules.json``: ``StaticEmbedding`` → ``Normalize``), so
``SentenceTransformer(DIR)`` loads it and gives the same vectors, and
:func:`bertforge.models.pooling.read_pooling` reads its pooling (mean, normalised) like any other dir's.

One maximum length, :data:`STATIC_MAX_POSITIONS` tokens of text, holds for every consumer. A lookup has no
positions, so the bound only keeps requests finite; it is declared once and every file agrees with it:
``sentence_bert_config.json`` ``max_seq_length`` (what ``bertforge embed``, ``retrieval-eval``, the server's
``/embed`` and ``bertforge bundle`` cut at: :meth:`~bertforge.checkpoint.modeldir.ModelDir.embed_max_length`),
``max_position_embeddings``, ``tokenizer_config.json`` ``model_max_length``, and ``tokenizer.json``'s own
truncation — the one limit sentence-transformers' ``StaticEmbedding`` honours (its ``max_seq_length`` is
infinite; it tokenizes without special tokens and cuts only where ``tokenizer.json`` says). The teacher's
tokenizer is copied without its post-processor (no ``[CLS]`` / ``[SEP]``: their rows are zero anyway, and
model2vec and sentence-transformers embed a text's word pieces alone), so a length counts the same tokens in
every consumer. Without this, a MiniLM teacher's ``tokenizer.json`` (cut at 128) made
``SentenceTransformer(dir)`` embed the first 128 tokens of a long text and bertforge all of them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ..checkpoint.layout import (META_KEY, STATIC_MODEL_TYPE, is_static_config, is_static_dir,  # noqa: F401
                                 meta_section)

#: the one tensor of a static dir's ``model.safetensors`` (the name sentence-transformers' StaticEmbedding reads)
STATIC_WEIGHT = "embedding.weight"

#: the sentence-transformers modules a static dir lists in ``modules.json`` (mean is StaticEmbedding's own
#: EmbeddingBag mode)
ST_STATIC = "sentence_transformers.models.StaticEmbedding"
ST_NORMALIZE = "sentence_transformers.models.Normalize"

#: tokens of text a static model embeds, in every consumer (a lookup has no position limit; a bound keeps
#: requests finite, within the server's default batch of 16,384 tokens): ``max_seq_length``,
#: ``max_position_embeddings``, ``model_max_length`` and the truncation of ``tokenizer.json``
STATIC_MAX_POSITIONS = 8192


def static_config(vocab_size: int, dim: int, pad_token_id: int = 0, extra: Optional[dict] = None) -> dict:
    """The ``config.json`` of a static dir: sizes in the fields every reader knows (``hidden_size`` = d,
    no layers, no segments) and ``extra`` (the distillation recipe, pooling) in the ``bertforge`` section."""
    return {"model_type": STATIC_MODEL_TYPE, "architectures": ["StaticEmbedding"],
            "vocab_size": int(vocab_size), "hidden_size": int(dim), "num_hidden_layers": 0,
            "num_attention_heads": 1, "intermediate_size": 0, "type_vocab_size": 0,
            "max_position_embeddings": STATIC_MAX_POSITIONS, "pad_token_id": int(pad_token_id),
            "add_pooling_layer": False,
            META_KEY: {"kind": STATIC_MODEL_TYPE, "pooling": "mean", "normalize": True, **(extra or {})}}


class StaticEmbedding(nn.Module):
    """Token lookup: ``forward(input_ids (B, T), attention_mask=None, token_type_ids=None)`` → (B, T, d)
    float32 token vectors (the ``last_hidden_state`` of a static model; pool them with
    :func:`bertforge.models.pooling.pool`, mean). ``sentence_embedding(input_ids, attention_mask)`` → (B, d):
    the masked mean, L2-normalised when ``config['bertforge']['normalize']``."""

    head = None
    head_name = "base"

    def __init__(self, weight: torch.Tensor, config: Optional[dict] = None):
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"a static embedding table is (V, d); got shape {tuple(weight.shape)}")
        self.embeddings = nn.Embedding.from_pretrained(weight.float(), freeze=True)
        self.config = config or static_config(weight.shape[0], weight.shape[1])

    @property
    def dim(self) -> int:
        return self.embeddings.embedding_dim

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.embeddings(input_ids)

    def sentence_embedding(self, input_ids, attention_mask) -> torch.Tensor:
        from .pooling import pool
        bf = meta_section(self.config)
        return pool(self(input_ids), attention_mask, bf.get("pooling", "mean"), bool(bf.get("normalize", True)))


def static_tokenizer_json(tokenizer_dir, max_length: int = STATIC_MAX_POSITIONS) -> str:
    """The ``tokenizer.json`` of a static dir made from the tokenizer of ``tokenizer_dir`` (``tokenizer.json``, or
    ``vocab.txt`` / ``vocab.json`` + ``merges.txt`` converted): no post-processor (a static model embeds a
    text's own tokens, no ``[CLS]`` / ``[SEP]``, as sentence-transformers' ``StaticEmbedding`` and model2vec
    tokenize), no padding, and truncation at ``max_length`` tokens (right, longest first) — the dir's one
    maximum length, which sentence-transformers reads only from here."""
    from tokenizers import Tokenizer

    from ..tokenizer import load_tokenizer
    tok = load_tokenizer(tokenizer_dir)  # no truncation, no padding
    tok.enable_truncation(max_length=int(max_length), strategy="longest_first", direction="right")
    spec = json.loads(tok.to_str())
    spec["post_processor"] = None
    return Tokenizer.from_str(json.dumps(spec)).to_str(pretty=True)  # parsed back: a file tokenizers reads


def save_static(out_dir, weight, tokenizer_dir, config: dict) -> None:
    """Write a static dir into ``out_dir`` (an existing, empty staging dir): ``model.safetensors``
    (``embedding.weight`` float32), ``config.json``, the tokenizer files of ``tokenizer_dir`` with
    ``tokenizer.json`` rewritten by :func:`static_tokenizer_json`, and the sentence-transformers files
    (``modules.json``, ``sentence_bert_config.json``), every length set to the config's
    ``max_position_embeddings`` (the module docstring)."""
    import numpy as np
    from safetensors.torch import save_file

    from ..io import atomic_write_text
    from ..tokenizer import copy_tokenizer_files
    out_dir = Path(out_dir)
    w = torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32)) if not torch.is_tensor(weight) \
        else weight.detach().float().contiguous()
    save_file({STATIC_WEIGHT: w}, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_text(out_dir / "config.json", json.dumps(config, indent=2))
    copy_tokenizer_files(Path(tokenizer_dir), out_dir)
    max_len = int(config.get("max_position_embeddings") or STATIC_MAX_POSITIONS)
    atomic_write_text(out_dir / "tokenizer.json", static_tokenizer_json(tokenizer_dir, max_len))
    tc = out_dir / "tokenizer_config.json"
    if tc.is_file():  # transformers' AutoTokenizer reads its limit here: the same one
        try:
            tcfg = json.loads(tc.read_text(encoding="utf-8"))
        except ValueError:
            tcfg = None
        if isinstance(tcfg, dict):
            tcfg["model_max_length"] = max_len
            atomic_write_text(tc, json.dumps(tcfg, indent=2))
    atomic_write_text(out_dir / "sentence_bert_config.json",
                      json.dumps({"max_seq_length": max_len, "do_lower_case": False}, indent=2))
    bf = meta_section(config)
    modules = [{"idx": 0, "name": "0", "path": "", "type": ST_STATIC}]
    if bf.get("normalize", True):
        modules.append({"idx": 1, "name": "1", "path": "1_Normalize", "type": ST_NORMALIZE})
        (out_dir / "1_Normalize").mkdir(exist_ok=True)
    atomic_write_text(out_dir / "modules.json", json.dumps(modules, indent=2))


def load_static(path) -> StaticEmbedding:
    """The :class:`StaticEmbedding` of a static dir. Raises CheckpointError for a missing or wrong table."""
    from safetensors.torch import load_file

    from ..errors import CheckpointError
    from ..checkpoint.modeldir import ModelDir
    path = Path(path)
    cfg = ModelDir.open(path).config
    f = path / "model.safetensors"
    if not f.is_file():
        raise CheckpointError(f"{path} is a static model without model.safetensors; re-create it with "
                              f"`bertforge distill --method static`")
    state = load_file(str(f))
    w = state.get(STATIC_WEIGHT)
    if w is None or w.dim() != 2 or w.shape[1] != cfg.get("hidden_size", w.shape[1]):
        raise CheckpointError(f"{f} holds no ({cfg.get('vocab_size')}, {cfg.get('hidden_size')}) "
                              f"{STATIC_WEIGHT}; re-create it with `bertforge distill --method static`")
    m = StaticEmbedding(w, cfg).eval()
    m.source_dir = str(path)
    return m


__all__ = ["STATIC_MODEL_TYPE", "STATIC_WEIGHT", "STATIC_MAX_POSITIONS", "StaticEmbedding", "is_static_config",
           "is_static_dir", "static_config", "static_tokenizer_json", "save_static", "load_static"]
