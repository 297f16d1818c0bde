"""The encoder of the BERT family: a stack of post-LN Transformer blocks (Vaswani et al. 2017, §3.1).

Each block is ``x = LN(x + MHA(x))`` then ``x = LN(x + W₂·act(W₁x))``. Every family of this shape (bert, roberta,
albert, electra, distilbert) is :class:`Encoder` with a different :class:`~bertforge.config.ModelConfig`;
their differences live in the embeddings and in the weight names (``bertforge.checkpoint.read``).
ModernBERT (pre-LN, RoPE, GeGLU, local/global attention) is an encoder of its own,
:class:`~bertforge.models.modernbert.ModernBertEncoder`, on :class:`EncoderBase` as this one: the same call
(``forward(input_ids, attention_mask, token_type_ids, position_ids, features)``), the same
:class:`~bertforge.models.output.Features` request and :class:`~bertforge.models.output.EncoderOutput`.
``bertforge.task_model.build_encoder`` picks the class by ``config.model_type``.

MPNet (Song et al. 2020) is this block with one more additive attention term: a learned bias per head and
bucket of the relative distance ``j − i`` (T5's buckets, Raffel et al. 2020 §2.1: 16 per direction, exact below
8, log-spaced up to 128), one table shared by every layer and computed once per call
(:meth:`Encoder.position_bias`); the reference is transformers' ``modeling_mpnet.py``.

Cross-layer parameter sharing (ALBERT, Lan et al. 2019 §3.1): ``layer_sharing`` = ``none`` |
``attention`` (one attention block reused at every depth) | ``ffn`` | ``all`` (one whole block).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ..config import MPNET_MAX_DISTANCE, ModelConfig
from ..errors import ConfigError
from .activations import get_activation
from .attention import MultiHeadAttention, linear, padding_mask_bias
from .embeddings import Embeddings, init_weights
from .output import EncoderOutput, Features


class FeedForward(nn.Module):
    """Position-wise FFN(x) = W₂·act(W₁x + b₁) + b₂ (Vaswani et al. 2017, eq. 2). (…, H) → (…, H)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        self.intermediate = linear(hidden_size, intermediate_size)
        self.output = linear(intermediate_size, hidden_size)
        self.act = get_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.intermediate.out_features == 0:  # every unit pruned: only the output bias is left
            return self.output.bias.expand_as(x)
        return self.output(self.act(self.intermediate(x)))


class EncoderLayer(nn.Module):
    """One post-LN block: self-attention → add & LayerNorm → FFN → add & LayerNorm.

    ``forward(x (B, T, H), bias (B, 1, 1, T) additive or None, explicit, head_gates)`` →
    ``(x (B, T, H), probs, scores, values)`` as :class:`~.attention.MultiHeadAttention` returns them.
    """

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        h = config.hidden_size
        self.attention = MultiHeadAttention(h, config.heads_of(layer), config.head_dim,
                                            config.attention_probs_dropout_prob)
        self.attention_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.ffn = FeedForward(h, config.intermediate_of(layer), config.hidden_act)
        self.ffn_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor], explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None):
        a, probs, scores, values = self.attention(x, bias, explicit=explicit, head_gates=head_gates)
        x = self.attention_norm(x + self.dropout(a))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, probs, scores, values


class EncoderBase(nn.Module):
    """What every encoder shares: the call, input checks, cross-layer sharing, and the kernels in effect.

    ``forward(input_ids (B, T), attention_mask (B, T) 1=token/0=pad, token_type_ids (B, T),
    position_ids (B, T), features)`` → :class:`~bertforge.models.output.EncoderOutput` holding what the
    :class:`~bertforge.models.output.Features` request ``features`` asked for (default: ``last_hidden_state``
    and ``pooler_output`` only).

    Raises:
        ConfigError: a config of a family this class does not build (see :attr:`families`).
        ValueError: malformed inputs (:meth:`_check_inputs`).
    """

    #: the families (``config.model_type``) this encoder builds
    families: tuple = ()

    #: which implementation of ``forward`` runs: ``none`` (these plain modules) or ``cpu`` (the class swapped for
    #: its CPU kernel by ``bertforge.engine.kernels.apply_kernels``); shown in ``repr``
    kernels: str = "none"

    #: run a padded batch on its real tokens only where the implementation can (:mod:`.unpad`; speed only)
    unpad: bool = True

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.model_type not in self.families:
            raise ConfigError(f"{type(self).__name__} builds {', '.join(self.families)} models, not "
                              f"model_type={config.model_type!r}; build the encoder with "
                              f"bertforge.task_model.build_encoder(config)")
        self.config = config

    @staticmethod
    def share_layers(layers: list, sharing: str) -> list:
        """ALBERT's cross-layer sharing: every layer takes layer 0's attention (``attention``), FFN (``ffn``)
        or both (``all``), with their norms; ``none`` leaves ``layers`` as they are. Returns ``layers``."""
        for lyr in layers[1:]:
            if sharing in ("attention", "all"):
                lyr.attention, lyr.attention_norm = layers[0].attention, layers[0].attention_norm
            if sharing in ("ffn", "all"):
                lyr.ffn, lyr.ffn_norm = layers[0].ffn, layers[0].ffn_norm
        return layers

    def extra_repr(self) -> str:
        return f"kernels={self.kernels}"

    def _check_inputs(self, input_ids, attention_mask, token_type_ids=None) -> None:
        """ValueError, naming the fix, for ids that are not a (B, T) integer tensor, a mask or segment ids
        of another shape, T = 0 or beyond the position embeddings, and (on CPU, outside tracing / compiling)
        ids outside the vocabulary or segment ids outside ``type_vocab_size`` (a bare IndexError otherwise)."""
        if not torch.is_tensor(input_ids) or input_ids.dim() != 2 or input_ids.is_floating_point():
            what = (f"a {input_ids.dim()}-D {input_ids.dtype} tensor" if torch.is_tensor(input_ids)
                    else type(input_ids).__name__)
            raise ValueError(f"input_ids must be an integer tensor of shape (batch, seq_len), got {what}; "
                             f"e.g. torch.tensor([[101, 2023, 102]])")
        if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids "
                             f"{tuple(input_ids.shape)}; give one 0/1 per token")
        tracing = torch.jit.is_tracing()  # shapes are traced tensors there: the export checked them already
        if not tracing and token_type_ids is not None and tuple(token_type_ids.shape) != tuple(input_ids.shape):
            raise ValueError(f"token_type_ids has shape {tuple(token_type_ids.shape)} but input_ids "
                             f"{tuple(input_ids.shape)}; give one segment id per token")
        limit = self.embeddings.max_positions
        if input_ids.shape[1] > limit:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's {limit} positions; "
                             f"truncate the input to {limit} tokens")
        if not tracing and input_ids.shape[1] == 0:
            raise ValueError(f"input_ids of shape {tuple(input_ids.shape)} hold no token; give at least one")
        if tracing or torch.compiler.is_compiling() or input_ids.device.type != "cpu" or input_ids.numel() == 0:
            return  # value checks read the data: not in an exported/compiled graph, no accelerator sync
        vocab = self.embeddings.word_embeddings.num_embeddings
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"input_ids hold id {hi if hi >= vocab else lo}, outside the vocabulary 0…{vocab - 1}; "
                             f"encode the text with the model's own tokenizer")
        types = self.embeddings.token_type_embeddings
        if token_type_ids is not None and types is not None:
            lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
            if lo < 0 or hi >= types.num_embeddings:
                raise ValueError(f"token_type_ids hold {hi if hi >= types.num_embeddings else lo}; this model "
                                 f"has segment ids 0…{types.num_embeddings - 1}")

    def unique_layers(self) -> list:
        return list(dict.fromkeys(self.layers))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class Encoder(EncoderBase):
    """Embeddings + L post-LN blocks + optional pooler (tanh(W·h_[CLS]), Devlin et al. 2018 §3), for the
    families of :attr:`families`; the call is :class:`EncoderBase`'s.

    Here every position is computed and the ``cls_only`` / ``rows`` positions of a request are then selected;
    the CPU kernels (``bertforge.engine.kernels.cpu.CpuEncoder``) compute only those, and run a right-padded
    batch unpadded (:attr:`unpad`).
    """

    families = ("bert", "roberta", "albert", "electra", "distilbert", "mpnet")

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.embeddings = Embeddings(config)
        layers = [EncoderLayer(config, i) for i in range(config.num_hidden_layers)]
        self.layers = nn.ModuleList(self.share_layers(layers, config.layer_sharing))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        #: MPNet's relative position bias, (buckets, heads), shared by all layers (None: the other families)
        self.relative_attention_bias = (nn.Embedding(config.relative_attention_num_buckets,
                                                     config.num_attention_heads)
                                        if config.model_type == "mpnet" else None)
        init_weights(self, config.initializer_range)

    def position_bias(self, t: int, device) -> Optional[torch.Tensor]:
        """MPNet's additive attention bias (1, heads, T, T) for T positions: ``table[bucket(j − i)]`` for query
        ``i`` and key ``j`` (:func:`relative_position_bucket`); None for the families without one."""
        if self.relative_attention_bias is None:
            return None
        pos = torch.arange(t, device=device)
        buckets = relative_position_bucket(pos[None, :] - pos[:, None], self.config.relative_attention_num_buckets)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def layer_bias(self, mask_bias: Optional[torch.Tensor], pos_bias: Optional[torch.Tensor],
                   layer: Optional[int] = None) -> Optional[torch.Tensor]:
        """The additive attention bias of block ``layer``: the padding bias (B, 1, 1, T) plus the position bias
        (1, heads, T, T) when there is one, restricted to the heads the block kept after pruning (their
        original indices: ``config.bertforge["pruned_heads"]``, :func:`bertforge.compress.prune.prune_heads`);
        ``layer`` None: every head."""
        if pos_bias is None:
            return mask_bias
        if layer is not None and self.layers[layer].attention.num_heads != pos_bias.shape[1]:
            gone = set((self.config.bertforge or {}).get("pruned_heads", {}).get(str(layer), []))
            keep = [h for h in range(pos_bias.shape[1]) if h not in gone]
            pos_bias = pos_bias[:, keep]
        return pos_bias if mask_bias is None else pos_bias + mask_bias.to(pos_bias.dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                features: Optional[Features] = None) -> EncoderOutput:
        req = features or Features()
        self._check_inputs(input_ids, attention_mask, token_type_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        bias = padding_mask_bias(attention_mask, x.dtype)
        pos = self.position_bias(x.shape[1], x.device)
        shared = self.layer_bias(bias, pos)  # every head's; a block that lost heads to pruning takes its own
        hidden, attns, scores, values = [x], [], [], []
        for i, layer in enumerate(self.layers):
            b = shared if layer.attention.num_heads == self.config.num_attention_heads else self.layer_bias(bias, pos, i)
            x, p, s, v = layer(x, b, explicit=req.explicit, head_gates=req.gates(i))
            hidden.append(x)
            attns.append(p)
            scores.append(s)
            values.append(v)
        rows = req.last_rows  # a head that reads only [CLS] (cls_only) or only some rows gets just those
        if self.layers and req.last_cls:
            x = hidden[-1] = x[:, :1]
        elif self.layers and rows is not None:
            x = hidden[-1] = x[rows]
        pooled = torch.tanh(self.pooler(x[:, 0])) if (self.pooler is not None and rows is None and req.pooler) \
            else None
        return req.output(x, pooled, hidden, attns, scores, values)


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int,
                             max_distance: int = MPNET_MAX_DISTANCE) -> torch.Tensor:
    """Bucket of each relative distance ``j − i`` (integer tensor, any shape → same shape, long): half of
    the ``num_buckets`` for keys at or before the query (``j ≤ i``), the other half for keys after it; in
    each half, distances below a quarter of ``num_buckets`` have a bucket each, longer ones share log-spaced
    buckets up to ``max_distance``, beyond which they all fall in the last (Raffel et al. 2020 §2.1; MPNet,
    Song et al. 2020, uses 32 buckets and 128)."""
    half = num_buckets // 2
    exact = half // 2
    n = -relative_position
    side = (n < 0).long() * half
    n = n.abs()
    far = exact + (torch.log(n.clamp(min=1).float() / exact) / math.log(max_distance / exact)
                   * (half - exact)).long()
    far = far.clamp(max=half - 1)
    return side + torch.where(n < exact, n, far)


__all__ = ["relative_position_bucket", "Encoder", "EncoderBase", "EncoderLayer", "EncoderOutput", "FeedForward", "Features"]
