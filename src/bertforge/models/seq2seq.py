"""The original Transformer encoder-decoder for translation (Vaswani et al. 2017, "Attention Is All You Need").

Built from the same parts as the BERT-family encoder:

* the encoder stack is :class:`~bertforge.models.encoder.EncoderLayer` (post-LN: ``x = LN(x + MHA(x))``,
  ``x = LN(x + FFN(x))``, §3.1);
* each decoder block is masked self-attention (``is_causal``, §3.2.3) → add & LN → encoder-decoder
  attention (:class:`~bertforge.models.attention.MultiHeadAttention` with ``cross=True``; queries from the
  decoder, keys/values from the encoder memory) → add & LN → FFN → add & LN;
* inputs are ``√d_model · Embedding(x) + PE(pos)`` with the sinusoidal encoding of §3.5
  (:func:`~bertforge.models.embeddings.sinusoidal_positions`), then dropout (§5.4);
* source and target embeddings may be one matrix (``share_embeddings``, a joint subword vocabulary) and
  the pre-softmax linear layer may reuse the target embedding matrix (``tie_output``, §3.4, after
  Press & Wolf 2017);
* the loss is label-smoothed cross-entropy with ε = 0.1 (§5.4, Szegedy et al. 2016).

Checkpoints are HF-style directories: ``config.json`` (``model_type = "bertforge-transformer"``),
``model.safetensors`` and the joint tokenizer's ``tokenizer.json``.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..errors import CheckpointError, ConfigError, require_number
from ..io import atomic_dir, move_files_into
from ..tokenizer import copy_tokenizer_files, save_tokenizer
from .attention import MultiHeadAttention, causal_mask_bias, padding_mask_bias
from .embeddings import sinusoidal_positions
from .encoder import EncoderLayer, FeedForward

MODEL_TYPE = "bertforge-transformer"
ARCHITECTURE = "BertforgeTransformerForTranslation"


@dataclass
class TransformerConfig:
    """Architecture of the encoder-decoder Transformer (defaults: the paper's base model, Table 3).

    ``vocab_size`` is the target vocabulary (and the source one when ``share_embeddings``);
    ``src_vocab_size`` is used only when the embeddings are not shared. Special token ids follow the
    joint tokenizer written by :mod:`bertforge.data.translation` (``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2,
    ``</s>`` 3).
    """

    model_type: str = MODEL_TYPE
    vocab_size: int = 8000
    src_vocab_size: int | None = None
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    num_heads: int = 8
    ffn_dim: int = 2048
    activation: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_positions: int = 1024
    layer_norm_eps: float = 1e-5
    share_embeddings: bool = True
    tie_output: bool = True
    scale_embeddings: bool = True
    label_smoothing: float = 0.1
    pad_token_id: int = 0
    unk_token_id: int = 1
    bos_token_id: int = 2
    eos_token_id: int = 3
    bertforge: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"model_type {self.model_type!r} is not {MODEL_TYPE!r}")
        for k in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "num_heads", "ffn_dim",
                  "max_positions"):
            require_number(f"model.{k}", getattr(self, k), 1, whole=True)
        for k in ("dropout", "attention_dropout", "label_smoothing"):
            require_number(f"model.{k}", getattr(self, k), 0, 1, open_high=True)
        if self.d_model % self.num_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by model.num_heads="
                              f"{self.num_heads}; pick a head count that divides it")
        if self.activation_dropout:
            raise ConfigError("model.activation_dropout is not supported (the paper has none); set it to 0")
        if self.src_vocab_size is None:
            self.src_vocab_size = self.vocab_size
        if self.share_embeddings and self.src_vocab_size != self.vocab_size:
            raise ConfigError("model.share_embeddings needs one joint vocabulary (src_vocab_size == "
                              "vocab_size); set share_embeddings=false for separate vocabularies")

    @classmethod
    def from_dict(cls, d: dict) -> TransformerConfig:
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k not in ("architectures", "transformers_version")}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown model keys {sorted(unknown)} for the translation Transformer; "
                              f"valid keys: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def encoder_layer_config(self) -> ModelConfig:
        """The :class:`ModelConfig` that makes :class:`EncoderLayer` a Transformer encoder block."""
        return ModelConfig(model_type="bert", vocab_size=self.src_vocab_size, hidden_size=self.d_model,
                           num_hidden_layers=self.encoder_layers, num_attention_heads=self.num_heads,
                           intermediate_size=self.ffn_dim, hidden_act=self.activation,
                           hidden_dropout_prob=self.dropout,
                           attention_probs_dropout_prob=self.attention_dropout,
                           max_position_embeddings=self.max_positions, layer_norm_eps=self.layer_norm_eps,
                           pad_token_id=self.pad_token_id, add_pooling_layer=False)


@dataclass
class Seq2SeqOutput:
    """``loss`` scalar (label-smoothed CE per target token); ``logits`` (B, T_tgt, V);
    ``encoder_last_hidden_state`` (B, T_src, d); ``decoder_hidden_states``: L_dec+1 tensors (B, T_tgt, d)
    when asked; ``terms``: logged components (``nll`` = un-smoothed CE per token)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    encoder_last_hidden_state: torch.Tensor | None = None
    decoder_hidden_states: tuple | None = None
    terms: dict | None = None


def label_smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.1,
                                 ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy, mean over the non-ignored target tokens.

    The target distribution is ``q = (1 − ε)·onehot(y) + ε/V`` (uniform over all V classes, Szegedy et al.
    2016 §7, used with ε = 0.1 by Vaswani et al. 2017 §5.4), so per token
    ``loss = (1 − ε)·(−log p_y) + ε·mean_v(−log p_v)``.

    Args:
        logits: (N, V) or (B, T, V) unnormalised scores.
        labels: (N,) or (B, T) class ids; ``ignore_index`` positions are skipped.
    Returns:
        (loss, nll): smoothed loss and plain negative log-likelihood, both means over counted tokens
        (0 when nothing is counted).
    """
    v = logits.shape[-1]
    logits = logits.reshape(-1, v).float()
    labels = labels.reshape(-1)
    keep = labels != ignore_index
    if not bool(keep.any()):
        zero = logits.sum() * 0.0
        return zero, zero
    lp = torch.log_softmax(logits[keep], dim=-1)
    nll = -lp.gather(1, labels[keep][:, None]).squeeze(1)
    smooth = -lp.mean(dim=-1)
    loss = (1.0 - epsilon) * nll + epsilon * smooth
    return loss.mean(), nll.mean()


def _smoothed_loss_masked(logits: torch.Tensor, labels: torch.Tensor, epsilon: float):
    """Same numbers as :func:`label_smoothed_cross_entropy` on (B, T, V) logits, without boolean
    indexing (which is slow to back-propagate on CPU): masked sums over all positions."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    keep = labels != -100
    n = keep.sum().clamp(min=1)
    nll = -lp.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    smooth = -lp.mean(dim=-1)
    loss = ((1.0 - epsilon) * nll + epsilon * smooth).masked_fill(~keep, 0.0).sum() / n
    return loss, nll.masked_fill(~keep, 0.0).sum() / n, n.float()


class ScaledEmbedding(nn.Module):
    """``√d_model · E[x] + PE[pos]`` then dropout (Vaswani et al. 2017 §3.4–3.5). (B, T) → (B, T, d).

    The sinusoidal table is a non-persistent buffer (it is a formula, not a weight). ``offset`` gives the
    position of the first token (incremental decoding feeds one position at a time).
    """

    def __init__(self, embedding: nn.Embedding, d_model: int, max_positions: int, dropout: float,
                 scale: bool = True):
        super().__init__()
        self.embedding = embedding
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.register_buffer("pe", sinusoidal_positions(max_positions, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        t = ids.shape[1]
        if offset + t > self.pe.shape[0]:
            raise ConfigError(f"sequence of {offset + t} tokens is longer than model.max_positions="
                              f"{self.pe.shape[0]}; shorten the input or raise max_positions")
        x = self.embedding(ids) * self.scale + self.pe[offset:offset + t].to(self.embedding.weight.dtype)
        return self.dropout(x)


class DecoderLayer(nn.Module):
    """One post-LN decoder block (§3.1): masked self-attention, encoder-decoder attention, FFN, each
    followed by dropout, residual add and LayerNorm.

    ``forward(x (B, T, d), memory (B, S, d), memory_bias (B, 1, 1, S) | None)`` → (B, T, d). Position t
    attends only to positions ≤ t (causal mask, §3.2.3).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d, h = config.d_model, config.num_heads
        self.self_attention = MultiHeadAttention(d, h, d // h, config.attention_dropout)
        self.self_attention_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.cross_attention = MultiHeadAttention(d, h, d // h, config.attention_dropout, cross=True)
        self.cross_attention_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.ffn = FeedForward(d, config.ffn_dim, config.activation)
        self.ffn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_bias: torch.Tensor | None,
                explicit: bool = False):
        a = self.self_attention(x, None, is_causal=True, explicit=explicit)[0]
        x = self.self_attention_norm(x + self.dropout(a))
        a = self.cross_attention(x, memory_bias, key_value_states=memory, explicit=explicit)[0]
        x = self.cross_attention_norm(x + self.dropout(a))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))

    # ------------------------------------------------------------ incremental decoding (inference)
    def cross_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder-decoder keys/values, computed once per source: 2 × (B, heads, S, d_k)."""
        att = self.cross_attention
        k, v = att.kv(memory).split(att.num_heads * att.head_dim, dim=-1)
        return att._split(k), att._split(v)

    def step(self, x: torch.Tensor, cache: dict, memory_bias: torch.Tensor | None) -> torch.Tensor:
        """Decode new positions given cached keys/values of the earlier ones (same numbers as
        :meth:`forward` on the whole prefix, without recomputing it).

        ``x`` (B, n, d) are the new positions; ``cache`` holds ``self_k``/``self_v`` (B, heads, t, d_k) of
        earlier positions (extended in place) and ``cross_k``/``cross_v``. Returns (B, n, d).
        """
        att = self.self_attention
        inner = att.num_heads * att.head_dim
        b, n, _ = x.shape
        q, k, v = att.qkv(x).split(inner, dim=-1)
        q, k, v = att._split(q), att._split(k), att._split(v)
        if "self_k" in cache:
            k = torch.cat([cache["self_k"], k], dim=2)
            v = torch.cat([cache["self_v"], v], dim=2)
        cache["self_k"], cache["self_v"] = k, v
        causal = None
        if n > 1:
            causal = causal_mask_bias(n, k.shape[2], q.dtype, q.device)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        a = att.out(ctx.transpose(1, 2).reshape(b, n, inner))
        x = self.self_attention_norm(x + a)
        ca = self.cross_attention
        q = ca._split(ca.q(x))
        bias = memory_bias.to(q.dtype) if memory_bias is not None else None
        ctx = F.scaled_dot_product_attention(q, cache["cross_k"], cache["cross_v"], attn_mask=bias)
        a = ca.out(ctx.transpose(1, 2).reshape(b, n, inner))
        x = self.cross_attention_norm(x + a)
        return self.ffn_norm(x + self.ffn(x))


class TransformerSeq2Seq(nn.Module):
    """Encoder-decoder Transformer for translation (Vaswani et al. 2017, Fig. 1).

    ``forward(input_ids (B, S), attention_mask (B, S) 1=token/0=pad, decoder_input_ids (B, T),
    labels (B, T) with −100 = ignore)`` → :class:`Seq2SeqOutput`. ``decoder_input_ids`` is the target
    shifted right (``<s> y₁ … y_{T−1}``); when only ``labels`` are given it is built from them.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        tgt_emb = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        src_emb = tgt_emb if config.share_embeddings else nn.Embedding(
            config.src_vocab_size, d, padding_idx=config.pad_token_id)
        self.src_embed = ScaledEmbedding(src_emb, d, config.max_positions, config.dropout,
                                         config.scale_embeddings)
        self.tgt_embed = ScaledEmbedding(tgt_emb, d, config.max_positions, config.dropout,
                                         config.scale_embeddings)
        enc_cfg = config.encoder_layer_config()
        self.encoder_layers = nn.ModuleList(EncoderLayer(enc_cfg, i) for i in range(config.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        self.output_projection = None if config.tie_output else nn.Linear(d, config.vocab_size, bias=False)
        #: speed only (not saved): compute attention as softmax(QKᵀ/√d_k + mask)·V with plain matmuls
        #: instead of the fused SDPA kernel; on CPU under bf16 autocast the matmul path is ~3× faster
        #: for short sentences. Same numbers up to rounding.
        self.explicit_attention = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform Linear weights, zero biases, N(0, d^-½) embeddings (so √d·E has unit scale),
        as in the tensor2tensor / fairseq Transformer."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for emb in {id(e): e for e in (self.src_embed.embedding, self.tgt_embed.embedding)}.values():
            nn.init.normal_(emb.weight, 0.0, self.config.d_model ** -0.5)
            with torch.no_grad():
                emb.weight[self.config.pad_token_id].zero_()

    # ------------------------------------------------------------------------------ pieces
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> tuple:
        """(B, S) source ids → (memory (B, S, d), memory_bias (B, 1, 1, S) | None)."""
        if attention_mask is None:
            attention_mask = (input_ids != self.config.pad_token_id).long()
        x = self.src_embed(input_ids)
        bias = padding_mask_bias(attention_mask, x.dtype)
        for layer in self.encoder_layers:
            x = layer(x, bias, explicit=self.explicit_attention)[0]
        return x, bias

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Decoder states (…, d) → logits (…, V) through the (possibly tied) pre-softmax linear map."""
        if self.output_projection is None:
            return F.linear(h, self.tgt_embed.embedding.weight)
        return self.output_projection(h)

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor,
               memory_bias: torch.Tensor | None, output_hidden_states: bool = False):
        """(B, T) target prefix ids → (decoder states (B, T, d), all states or None)."""
        x = self.tgt_embed(decoder_input_ids)
        states = [x]
        for layer in self.decoder_layers:
            x = layer(x, memory, memory_bias, explicit=self.explicit_attention)
            states.append(x)
        return x, (tuple(states) if output_hidden_states else None)

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """labels (B, T) → decoder inputs ``<s> y₁ … y_{T−1}`` (−100 replaced by ``<pad>``)."""
        lab = labels.masked_fill(labels == -100, self.config.pad_token_id)
        bos = torch.full_like(lab[:, :1], self.config.bos_token_id)
        return torch.cat([bos, lab[:, :-1]], dim=1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, **_) -> Seq2SeqOutput:
        if decoder_input_ids is None:
            if labels is None:
                raise ConfigError("pass decoder_input_ids or labels to the translation model")
            decoder_input_ids = self.shift_right(labels)
        memory, bias = self.encode(input_ids, attention_mask)
        h, states = self.decode(decoder_input_ids, memory, bias, output_hidden_states)
        logits = self.project(h)
        if labels is not None:
            loss, nll, n = _smoothed_loss_masked(logits, labels, self.config.label_smoothing)
            return Seq2SeqOutput(loss=loss, logits=logits, encoder_last_hidden_state=memory,
                                 decoder_hidden_states=states, terms={"nll": nll.detach(), "ntokens": n})
        return Seq2SeqOutput(logits=logits, encoder_last_hidden_state=memory,
                             decoder_hidden_states=states)

    # ------------------------------------------------------------------- incremental decoding
    def init_cache(self, memory: torch.Tensor) -> list:
        """Per decoder layer: precomputed cross-attention keys/values of ``memory`` (B, S, d)."""
        caches = []
        for layer in self.decoder_layers:
            k, v = layer.cross_kv(memory)
            caches.append({"cross_k": k, "cross_v": v})
        return caches

    def decode_step(self, new_ids: torch.Tensor, caches: list, memory_bias: torch.Tensor | None,
                    offset: int) -> torch.Tensor:
        """Logits (B, n, V) of ``n`` new target positions starting at ``offset``, extending ``caches``."""
        x = self.tgt_embed(new_ids, offset=offset)
        for layer, cache in zip(self.decoder_layers, caches):
            x = layer.step(x, cache, memory_bias)
        return self.project(x)

    @staticmethod
    def reorder_cache(caches: list, index: torch.Tensor) -> list:
        """Select rows ``index`` (B',) of every cached tensor (beam search reordering)."""
        return [{k: v.index_select(0, index) for k, v in c.items()} for c in caches]

    # ----------------------------------------------------------------------------- save / load
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, out_dir, tokenizer=None, tokenizer_dir=None) -> None:
        """Write ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``) into ``out_dir``; each
        file is written to a temporary name and renamed."""
        from safetensors.torch import save_file
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        cfg = {**self.config.to_dict(), "architectures": [ARCHITECTURE]}
        state = {k: v.detach().cpu().contiguous().clone() for k, v in self.state_dict().items()}
        # tied matrices are stored once (safetensors refuses aliases); loading re-ties them
        if self.config.share_embeddings:
            state.pop("src_embed.embedding.weight", None)
        with atomic_dir(out_dir / ".staging") as tmp:
            save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
            if tokenizer is not None:
                save_tokenizer(tokenizer, tmp, model_max_length=self.config.max_positions)
            elif tokenizer_dir is not None:
                copy_tokenizer_files(Path(tokenizer_dir), tmp)
            move_files_into(tmp, out_dir)

    @classmethod
    def from_pretrained(cls, path) -> TransformerSeq2Seq:
        """Load a directory written by :meth:`save_pretrained`.

        Raises:
            CheckpointError: missing files, another ``model_type``, or weights that do not fit.
        """
        from safetensors.torch import load_file
        path = Path(path)
        from ..checkpoint.modeldir import ModelDir
        md = ModelDir.open(path, require_config=False)  # its one-line error: no such dir, or a file
        wf = path / "model.safetensors"
        if not md.config or not md.fp32_weights or md.fp32_weights[0] != wf:
            raise CheckpointError(f"{path} is not a translation checkpoint (needs config.json and "
                                  "model.safetensors); pass the --out dir of `bertforge translate train`")
        d = md.config
        if d.get("model_type") != MODEL_TYPE:
            raise CheckpointError(f"{path} holds model_type {d.get('model_type')!r}, not {MODEL_TYPE!r}; "
                                  "pass a checkpoint written by `bertforge translate train`")
        model = cls(TransformerConfig.from_dict(d))
        state = load_file(str(wf))
        if model.config.share_embeddings:
            state.setdefault("src_embed.embedding.weight", state["tgt_embed.embedding.weight"])
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise CheckpointError(f"{wf} does not fit the config (missing {missing[:3]}, unexpected "
                                  f"{unexpected[:3]}); the checkpoint is damaged or from another version")
        return model.eval()  # ready for decoding (dropout off), as load_pretrained


__all__ = [
    "MODEL_TYPE",
    "DecoderLayer",
    "ScaledEmbedding",
    "Seq2SeqOutput",
    "TransformerConfig",
    "TransformerSeq2Seq",
    "label_smoothed_cross_entropy",
]
