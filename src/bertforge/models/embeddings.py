"""Input embeddings of the BERT family (Devlin et al. 2018, §3 "Input/Output Representations").

``E(x) = LayerNorm(token(x) + position(p) + segment(s))``, then dropout, then — when the embedding size
E differs from the hidden size H — a Linear E → H: ALBERT's factorized embedding parameterization
(Lan et al. 2019, §3.1) and ELECTRA's ``embeddings_project`` (Clark et al. 2020, §3.2).

RoBERTa (Liu et al. 2019) numbers positions from ``pad_token_id + 1`` and gives padding the position
``pad_token_id``, as fairseq does; DistilBERT (Sanh et al. 2019) has no segment embeddings. MPNet (Song et al.
2020) numbers positions as RoBERTa with the padding id fixed at 1 (its fairseq dictionary's ``<pad>``, which
transformers' ``MPNetEmbeddings`` hard-codes) and has no segment embeddings.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..config import ModelConfig

#: the families whose positions count from ``padding_idx + 1`` and give padding the position ``padding_idx``
OFFSET_POSITIONS = ("roberta", "mpnet")
#: MPNet's padding index of the token and position tables (transformers' ``MPNetEmbeddings.padding_idx``)
MPNET_PADDING_IDX = 1


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    Vaswani et al. 2017, §3.5. Returns (num_positions, dim) float32.
    """
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    i2 = torch.arange(0, dim, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, i2 / dim)
    pe = torch.zeros(num_positions, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return pe.float()


class Embeddings(nn.Module):
    """Token + learned absolute position + segment embeddings → LayerNorm → dropout (→ E→H projection).

    Shapes: ``input_ids``/``token_type_ids``/``position_ids`` (B, T) → (B, T, H).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        e = config.embedding_size
        self.family = config.model_type
        pad = MPNET_PADDING_IDX if self.family == "mpnet" else config.pad_token_id
        self.pad_token_id = pad
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=pad)
        n_pos = config.max_position_embeddings
        offset = self.family in OFFSET_POSITIONS
        self.position_offset = pad + 1 if offset else 0
        self.position_embeddings = nn.Embedding(n_pos, e, padding_idx=pad if offset else None)
        self.token_type_embeddings = (nn.Embedding(config.type_vocab_size, e)
                                      if config.type_vocab_size > 0 else None)
        self.LayerNorm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # ALBERT always maps E → H (even when E == H); ELECTRA only when they differ.
        self.projection = (nn.Linear(e, config.hidden_size)
                           if e != config.hidden_size or self.family == "albert" else None)

    def position_ids_for(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        if self.family in OFFSET_POSITIONS:
            mask = (input_ids != self.pad_token_id).long()
            return torch.cumsum(mask, dim=1) * mask + self.pad_token_id
        return torch.arange(t, device=input_ids.device)[None, :].expand_as(input_ids)

    def forward(self, input_ids: torch.Tensor, token_type_ids: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None,
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        if position_ids is None:
            position_ids = self.position_ids_for(input_ids)
        x = self.token_lookup(input_ids) if inputs_embeds is None else inputs_embeds
        x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        x = self.dropout(self.LayerNorm(x))
        if self.projection is not None:
            x = self.projection(x)
        return x

    def token_lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, E) of ``input_ids`` (B, T)."""
        return self.word_embeddings(input_ids)

    @property
    def max_positions(self) -> int:
        return self.position_embeddings.num_embeddings - self.position_offset


def init_weights(module: nn.Module, std: float) -> None:
    """BERT initialisation: N(0, std) for Linear/Embedding weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:  # ModernBERT's norms have none
                nn.init.zeros_(m.bias)


__all__ = ["MPNET_PADDING_IDX", "OFFSET_POSITIONS", "Embeddings", "sinusoidal_positions", "init_weights"]
