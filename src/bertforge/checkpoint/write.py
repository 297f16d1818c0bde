"""The Hugging Face checkpoint format: per-family weight-name maps, ``config.json`` both ways, and writing a dir.

A bertforge checkpoint *is* a ``transformers`` checkpoint dir: ``config.json`` (with ``model_type`` and
``architectures``), ``model.safetensors``, ``tokenizer.json`` + ``tokenizer_config.json``. This module
holds, per family, the map between our parameter names and Hugging Face's (fused Q/K/V, ALBERT's shared
groups, DistilBERT's names), the config translation, and :func:`save_pretrained`. Weights are never pickled.
Reading a dir back is :func:`bertforge.checkpoint.read.load_pretrained`.

A dir is written so that every tool that loads it computes bertforge's outputs, or refuses it: where
``transformers``' class for a head computes another function (a sequence head on mean / max pooling,
:func:`pooling_transformers_lacks`), ``config.json`` gets a ``model_type`` transformers does not know
(``bertforge-mean-pooled-bert``, :func:`config_to_hf`) instead of one it would silently load into [CLS] logits.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_file
from tokenizers import Tokenizer

from ..config import FAMILIES, ModelConfig
from ..errors import CheckpointError, ConfigError
from ..heads import HEADS
from ..io import atomic_dir, move_files_into
from .layout import BERTFORGE_MODEL_TYPE, META_KEY, meta_section, model_family, with_meta
from ..tokenizer import TOKENIZER_FILES, copy_tokenizer_files, save_tokenizer

FAMILY_CLASS = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "electra": "Electra",
                "distilbert": "DistilBert", "modernbert": "ModernBert", "mobilebert": "MobileBert",
                "mpnet": "MPNet"}
PREFIX = {f: f for f in FAMILIES}
PREFIX["modernbert"] = "model"  # ModernBertFor…: the base model is ``model.*``
OUR_CONFIG_KEYS = ("embedding_size", "layer_sharing", "layer_num_heads", "layer_intermediate_sizes",
                   "add_pooling_layer", META_KEY)


# ----------------------------------------------------------------------------------------- key maps
def _linear(ours: str, theirs) -> list:
    """[(our_key, [hf_keys…])] for weight and bias; several HF keys are concatenated along dim 0."""
    theirs = [theirs] if isinstance(theirs, str) else theirs
    return [(f"{ours}.{p}", [f"{t}.{p}" for t in theirs]) for p in ("weight", "bias")]


def encoder_key_map(config: ModelConfig) -> list:
    """Our encoder parameter names ↔ HF base-model names (without the family prefix).

    Returns a list of ``(our_key, [hf_key, …])``; a list of several HF keys means our tensor is their
    concatenation along dim 0 (fused Q/K/V). Shared ALBERT layers map every depth onto its group.
    """
    fam, n = config.model_type, config.num_hidden_layers
    if fam == "modernbert":
        return modernbert_key_map(config)
    if fam == "mobilebert":
        return mobilebert_key_map(config)
    m = [("embeddings.word_embeddings.weight", ["embeddings.word_embeddings.weight"]),
         ("embeddings.position_embeddings.weight", ["embeddings.position_embeddings.weight"])]
    if config.type_vocab_size > 0:
        m.append(("embeddings.token_type_embeddings.weight", ["embeddings.token_type_embeddings.weight"]))
    m += _linear("embeddings.LayerNorm", "embeddings.LayerNorm")
    if fam == "albert":
        m += _linear("embeddings.projection", "encoder.embedding_hidden_mapping_in")
    elif config.embedding_size != config.hidden_size:
        m += _linear("embeddings.projection", "embeddings_project")
    groups = albert_num_groups(config) if fam == "albert" else n
    for i in range(n):
        o = f"layers.{i}"
        if fam == "distilbert":
            t = f"transformer.layer.{i}"
            m += _linear(f"{o}.attention.qkv", [f"{t}.attention.q_lin", f"{t}.attention.k_lin",
                                                f"{t}.attention.v_lin"])
            m += _linear(f"{o}.attention.out", f"{t}.attention.out_lin")
            m += _linear(f"{o}.attention_norm", f"{t}.sa_layer_norm")
            m += _linear(f"{o}.ffn.intermediate", f"{t}.ffn.lin1")
            m += _linear(f"{o}.ffn.output", f"{t}.ffn.lin2")
            m += _linear(f"{o}.ffn_norm", f"{t}.output_layer_norm")
        elif fam == "mpnet":  # MPNetLayer: attention.attn.{q,k,v,o} + attention.LayerNorm, then BERT's FFN names
            t = f"encoder.layer.{i}"
            m += _linear(f"{o}.attention.qkv", [f"{t}.attention.attn.q", f"{t}.attention.attn.k",
                                                f"{t}.attention.attn.v"])
            m += _linear(f"{o}.attention.out", f"{t}.attention.attn.o")
            m += _linear(f"{o}.attention_norm", f"{t}.attention.LayerNorm")
            m += _linear(f"{o}.ffn.intermediate", f"{t}.intermediate.dense")
            m += _linear(f"{o}.ffn.output", f"{t}.output.dense")
            m += _linear(f"{o}.ffn_norm", f"{t}.output.LayerNorm")
        elif fam == "albert":
            g = i // (n // groups)
            t = f"encoder.albert_layer_groups.{g}.albert_layers.0"
            m += _linear(f"{o}.attention.qkv", [f"{t}.attention.query", f"{t}.attention.key",
                                                f"{t}.attention.value"])
            m += _linear(f"{o}.attention.out", f"{t}.attention.dense")
            m += _linear(f"{o}.attention_norm", f"{t}.attention.LayerNorm")
            m += _linear(f"{o}.ffn.intermediate", f"{t}.ffn")
            m += _linear(f"{o}.ffn.output", f"{t}.ffn_output")
            m += _linear(f"{o}.ffn_norm", f"{t}.full_layer_layer_norm")
        else:
            t = f"encoder.layer.{i}"
            m += _linear(f"{o}.attention.qkv", [f"{t}.attention.self.query", f"{t}.attention.self.key",
                                                f"{t}.attention.self.value"])
            m += _linear(f"{o}.attention.out", f"{t}.attention.output.dense")
            m += _linear(f"{o}.attention_norm", f"{t}.attention.output.LayerNorm")
            m += _linear(f"{o}.ffn.intermediate", f"{t}.intermediate.dense")
            m += _linear(f"{o}.ffn.output", f"{t}.output.dense")
            m += _linear(f"{o}.ffn_norm", f"{t}.output.LayerNorm")
    if fam == "mpnet":
        m.append(("relative_attention_bias.weight", ["encoder.relative_attention_bias.weight"]))
    if config.add_pooling_layer:
        m += _linear("pooler", "pooler" if fam == "albert" else "pooler.dense")
    return m


def modernbert_key_map(config: ModelConfig) -> list:
    """ModernBERT: our names ↔ ``ModernBertModel``'s (no biases; norms have one only with ``norm_bias``;
    layer 0 has no ``attn_norm``). Same list form as :func:`encoder_key_map`."""
    def norm(ours, theirs):
        return _linear(ours, theirs) if config.norm_bias else [(f"{ours}.weight", [f"{theirs}.weight"])]

    m = [("embeddings.word_embeddings.weight", ["embeddings.tok_embeddings.weight"])]
    m += norm("embeddings.norm", "embeddings.norm")
    for i in range(config.num_hidden_layers):
        o, t = f"layers.{i}", f"layers.{i}"
        if i > 0:
            m += norm(f"{o}.attention_norm", f"{t}.attn_norm")
        m += [(f"{o}.attention.qkv.weight", [f"{t}.attn.Wqkv.weight"]),
              (f"{o}.attention.out.weight", [f"{t}.attn.Wo.weight"])]
        m += norm(f"{o}.ffn_norm", f"{t}.mlp_norm")
        m += [(f"{o}.ffn.wi.weight", [f"{t}.mlp.Wi.weight"]), (f"{o}.ffn.wo.weight", [f"{t}.mlp.Wo.weight"])]
    m += norm("final_norm", "final_norm")
    return m


def mobilebert_key_map(config: ModelConfig) -> list:
    """MobileBERT: our names ↔ ``MobileBertModel``'s (NoNorm and LayerNorm both hold ``weight`` and ``bias``
    under ``LayerNorm``). Same list form as :func:`encoder_key_map`."""
    m = [("embeddings.word_embeddings.weight", ["embeddings.word_embeddings.weight"]),
         ("embeddings.position_embeddings.weight", ["embeddings.position_embeddings.weight"])]
    if config.type_vocab_size > 0:
        m.append(("embeddings.token_type_embeddings.weight", ["embeddings.token_type_embeddings.weight"]))
    m += _linear("embeddings.transformation", "embeddings.embedding_transformation")
    m += _linear("embeddings.norm", "embeddings.LayerNorm")
    for i in range(config.num_hidden_layers):
        o, t = f"layers.{i}", f"encoder.layer.{i}"
        if config.use_bottleneck:
            m += _linear(f"{o}.bottleneck_input.dense", f"{t}.bottleneck.input.dense")
            m += _linear(f"{o}.bottleneck_input.norm", f"{t}.bottleneck.input.LayerNorm")
            if config.key_query_shared_bottleneck:
                m += _linear(f"{o}.bottleneck_qk.dense", f"{t}.bottleneck.attention.dense")
                m += _linear(f"{o}.bottleneck_qk.norm", f"{t}.bottleneck.attention.LayerNorm")
        for part in ("query", "key", "value"):
            m += _linear(f"{o}.attention.{part}", f"{t}.attention.self.{part}")
        m += _linear(f"{o}.attention.out", f"{t}.attention.output.dense")
        m += _linear(f"{o}.attention_norm", f"{t}.attention.output.LayerNorm")
        for j in range(config.num_feedforward_networks - 1):
            m += _linear(f"{o}.ffns.{j}.intermediate", f"{t}.ffn.{j}.intermediate.dense")
            m += _linear(f"{o}.ffns.{j}.output", f"{t}.ffn.{j}.output.dense")
            m += _linear(f"{o}.ffns.{j}.norm", f"{t}.ffn.{j}.output.LayerNorm")
        m += _linear(f"{o}.ffn.intermediate", f"{t}.intermediate.dense")
        m += _linear(f"{o}.ffn.output", f"{t}.output.dense")
        m += _linear(f"{o}.ffn.norm", f"{t}.output.LayerNorm")
        if config.use_bottleneck:
            m += _linear(f"{o}.output_bottleneck", f"{t}.output.bottleneck.dense")
            m += _linear(f"{o}.output_norm", f"{t}.output.bottleneck.LayerNorm")
    if config.add_pooling_layer:
        m += _linear("pooler", "pooler.dense")
    return m


#: MobileBertConfig keys read and written as they are (ModelConfig has fields of the same names)
_MOBILEBERT_SAME = ("embedding_size", "trigram_input", "use_bottleneck", "intra_bottleneck_size",
                    "use_bottleneck_attention", "key_query_shared_bottleneck", "num_feedforward_networks",
                    "normalization_type")


def mobilebert_config_from_hf(d: dict) -> dict:
    """The MobileBERT-only keys of a ``MobileBertConfig`` dict → ModelConfig keywords (the BERT keys are read
    as for BERT). Raises CheckpointError for what this family does not implement: a pooler without its dense
    layer (``classifier_activation=false``) and an untied decoder (``tie_word_embeddings=false``)."""
    if d.get("classifier_activation") is False:
        raise CheckpointError("config.json has classifier_activation=false; bertforge's MobileBERT pooler is "
                              "tanh(W·h_[CLS]) (every released MobileBERT checkpoint)")
    if d.get("tie_word_embeddings") is False:
        raise CheckpointError("config.json has tie_word_embeddings=false; bertforge's MobileBERT decoder is "
                              "tied to the token embeddings")
    kw = {k: d[k] for k in _MOBILEBERT_SAME if d.get(k) is not None}
    kw.setdefault("embedding_size", 128)  # transformers' default, absent from a minimal config.json
    for k, v in (("hidden_size", 512), ("num_hidden_layers", 24), ("num_attention_heads", 4),
                 ("intermediate_size", 512), ("hidden_act", "relu"), ("hidden_dropout_prob", 0.0)):
        if d.get(k) is None:
            kw[k] = v
    return kw


def mobilebert_config_to_hf(config: ModelConfig) -> dict:
    """ModelConfig → the MobileBERT-only keys of ``MobileBertConfig``."""
    d = {k: getattr(config, k) for k in _MOBILEBERT_SAME}
    d.update(classifier_activation=True, tie_word_embeddings=True)
    return d


#: ModelConfig field → ModernBertConfig key, where the names differ
_MODERNBERT_KEYS = {"hidden_act": "hidden_activation", "layer_norm_eps": "norm_eps",
                    "attention_probs_dropout_prob": "attention_dropout", "hidden_dropout_prob": "mlp_dropout"}
_MODERNBERT_SAME = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "global_attn_every_n_layers", "local_attention", "norm_bias", "classifier_pooling",
                    "classifier_activation")


def modernbert_config_from_hf(d: dict) -> dict:
    """``ModernBertConfig`` dict (transformers ≥ 5 ``layer_types`` / ``rope_parameters``, or the older
    ``global_attn_every_n_layers`` / ``global_rope_theta`` / ``local_rope_theta``) → ModelConfig keywords.

    Raises CheckpointError for what this family does not implement: biases in linear layers
    (``attention_bias``, ``mlp_bias``, ``classifier_bias``), untied decoder weights, a RoPE type other than
    ``default``."""
    for k in ("attention_bias", "mlp_bias", "classifier_bias"):
        if d.get(k):
            raise CheckpointError(f"config.json has {k}=true; bertforge's ModernBERT has no biases there "
                                  f"(as every released ModernBERT checkpoint)")
    if d.get("tie_word_embeddings") is False:
        raise CheckpointError("config.json has tie_word_embeddings=false; bertforge's ModernBERT decoder is "
                              "tied to the token embeddings")
    kw: dict = {k: d[k] for k in _MODERNBERT_SAME if d.get(k) is not None}
    kw.update({ours: d[theirs] for ours, theirs in _MODERNBERT_KEYS.items() if d.get(theirs) is not None})
    if d.get("classifier_dropout") is not None:
        kw["classifier_dropout"] = d["classifier_dropout"]
    if d.get("layer_types"):
        kw["layer_types"] = list(d["layer_types"])
    rope = d.get("rope_parameters") or {}
    for kind, key in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        p = rope.get(kind) or {}
        if p.get("rope_type", "default") != "default":
            raise CheckpointError(f"config.json has rope_type={p['rope_type']!r} for {kind}; bertforge's "
                                  f"ModernBERT implements the default RoPE only")
        theta = p.get("rope_theta", d.get(key))
        if theta is not None:
            kw[key] = float(theta)
    kw.update(type_vocab_size=0, add_pooling_layer=False)
    return kw


def modernbert_config_to_hf(config: ModelConfig) -> dict:
    """ModelConfig → the keys of ``ModernBertConfig`` (both RoPE spellings, so transformers 4.x and 5 read it).
    Special-token ids are left to the tokenizer files (None here: a small vocabulary has no id 50281)."""
    d = {k: getattr(config, k) for k in _MODERNBERT_SAME}
    d.update({theirs: getattr(config, ours) for ours, theirs in _MODERNBERT_KEYS.items()})
    layer_types = [config.layer_type(i) for i in range(config.num_hidden_layers)]
    d.update(layer_types=layer_types, embedding_dropout=config.hidden_dropout_prob,
             classifier_dropout=config.classifier_dropout or 0.0, attention_bias=False, mlp_bias=False,
             classifier_bias=False, decoder_bias=True, tie_word_embeddings=True, sparse_prediction=False,
             global_rope_theta=config.global_rope_theta, local_rope_theta=config.local_rope_theta,
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
                              "sliding_attention": {"rope_type": "default",
                                                    "rope_theta": config.local_rope_theta}},
             bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
    return d


#: the MPNetConfig keys read and written as they are (MPNet has no token types: type_vocab_size is always 0)
_MPNET_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
               "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps",
               "relative_attention_num_buckets")


def mpnet_config_from_hf(d: dict) -> dict:
    """``MPNetConfig`` dict → ModelConfig keywords (no token types; the pooler as the weights say).

    Raises CheckpointError for a relative-attention setting transformers' ``MPNetEncoder`` does not compute
    (buckets other than 32, or a ``relative_attention_*`` key it has none of)."""
    from ..config import MPNET_BUCKETS
    unknown = sorted(k for k in d if k.startswith("relative_attention") and k != "relative_attention_num_buckets")
    buckets = d.get("relative_attention_num_buckets", MPNET_BUCKETS)
    if unknown or buckets != MPNET_BUCKETS:
        what = f"{unknown[0]}={d[unknown[0]]!r}" if unknown else f"relative_attention_num_buckets={buckets!r}"
        raise CheckpointError(f"config.json has {what}; MPNet's relative position bias has {MPNET_BUCKETS} "
                              f"buckets up to distance 128 (transformers' MPNetEncoder), nothing else is known")
    kw = {k: d[k] for k in _MPNET_KEYS if d.get(k) is not None}
    kw["type_vocab_size"] = 0
    return kw


def albert_num_groups(config: ModelConfig) -> int:
    """ALBERT stores one weight group when every layer is shared, else one group per layer."""
    return 1 if config.layer_sharing == "all" else config.num_hidden_layers


# ------------------------------------------------------------------------------------ config mapping
def config_from_hf(d: dict) -> ModelConfig:
    """HF ``config.json`` dict → :class:`ModelConfig`. Raises CheckpointError for unknown families."""
    fam = model_family(d)  # a bertforge-only dir (model_type bertforge-…) records its family in its own section
    if fam not in FAMILIES:
        raise CheckpointError(
            f"config.json has model_type={d.get('model_type')!r}; bertforge loads {', '.join(FAMILIES)} "
            f"checkpoints")
    kw: dict = {}
    if fam == "modernbert":
        kw.update(modernbert_config_from_hf(d))
    elif fam == "mpnet":
        kw.update(mpnet_config_from_hf(d))
    elif fam == "distilbert":
        kw.update(hidden_size=d.get("dim", 768), num_hidden_layers=d.get("n_layers", 6),
                  num_attention_heads=d.get("n_heads", 12), intermediate_size=d.get("hidden_dim", 3072),
                  hidden_act=d.get("activation", "gelu"), hidden_dropout_prob=d.get("dropout", 0.1),
                  attention_probs_dropout_prob=d.get("attention_dropout", 0.1),
                  type_vocab_size=0, add_pooling_layer=False, layer_norm_eps=1e-12,
                  classifier_dropout=d.get("seq_classif_dropout"))
        if d.get("sinusoidal_pos_embds"):
            kw[META_KEY] = {"sinusoidal_pos_embds": True}
    else:
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "type_vocab_size",
                  "layer_norm_eps", "embedding_size"):
            if k in d and d[k] is not None:
                kw[k] = d[k]
        if fam == "mobilebert":
            kw.update(mobilebert_config_from_hf(d))
        cd = d.get("classifier_dropout", d.get("classifier_dropout_prob"))
        if cd is not None:
            kw["classifier_dropout"] = cd
        if fam == "albert" and "layer_sharing" not in d:
            kw["layer_sharing"] = "all" if d.get("num_hidden_groups", 1) == 1 else "none"
            if d.get("num_hidden_groups", 1) not in (1, d.get("num_hidden_layers")) or d.get(
                    "inner_group_num", 1) != 1:
                raise CheckpointError("ALBERT checkpoints with num_hidden_groups other than 1 or "
                                      "num_hidden_layers, or inner_group_num != 1, are not supported")
    for k in ("vocab_size", "max_position_embeddings", "initializer_range", "pad_token_id",
              "problem_type"):
        if d.get(k) is not None:
            kw[k] = d[k]
    for k in OUR_CONFIG_KEYS:
        if k in d and d[k] is not None:
            kw[k] = d[k]
    if meta_section(d).get("pooling"):
        kw["pooling"] = meta_section(d)["pooling"]
    if d.get("id2label"):
        id2label = {int(k): v for k, v in d["id2label"].items()}
        kw["id2label"] = id2label
        kw["num_labels"] = len(id2label)
    if fam == "electra":
        kw.setdefault("add_pooling_layer", False)
    return ModelConfig(model_type=fam, **kw)


#: the sequence head (classification, regression, multi-label): the one head whose function depends on a pooling
SEQUENCE_HEAD = "sequence_classification"


def pooling_transformers_lacks(family: str, head: str, pooling, classifier_pooling=None):
    """The pooling (``mean`` / ``max`` / ``cls``) that bertforge's ``head`` on ``family`` reads and
    ``transformers``' class for that head does not, else None (the two compute one function).

    ``transformers``' ``…ForSequenceClassification`` reads, per family: the tanh pooler over h_[CLS] (bert, albert,
    mobilebert), h_[CLS] (roberta, electra, distilbert, mpnet), the ``classifier_pooling`` of its config
    (modernbert: ``cls`` or ``mean``; ``classifier_pooling`` None: the one :func:`config_to_hf` writes). Every
    other head (token classification, QA, the pretraining heads, the encoder) reads no pooling. ``pooling`` is
    :attr:`ModelConfig.pooling` (None: the family's own reading, which is transformers')."""
    if head != SEQUENCE_HEAD or pooling is None:
        return None
    if family == "modernbert":
        return None if pooling in ((classifier_pooling,) if classifier_pooling else ("cls", "mean")) else pooling
    if family in getattr(HEADS[SEQUENCE_HEAD], "POOLER_FAMILIES", ("bert", "albert", "mobilebert")):
        return pooling  # even ``cls``: bertforge reads h_[CLS], transformers tanh(W·h_[CLS])
    return None if pooling == "cls" else pooling


def bertforge_model_type(family: str, pooling: str) -> str:
    """The ``model_type`` of a dir only bertforge computes right: ``bertforge-mean-pooled-bert`` … (a type
    ``transformers`` does not know, so that ``AutoModelFor…`` / ``AutoConfig`` / ``pipeline`` /
    ``SentenceTransformer`` refuse it, naming it, instead of loading it into another function)."""
    return f"{BERTFORGE_MODEL_TYPE}{pooling}-pooled-{family}"


def config_to_hf(config: ModelConfig, head: str) -> dict:
    """:class:`ModelConfig` → HF ``config.json`` dict for ``{Family}{head suffix}``.

    Where ``transformers``' class for the head computes another function than bertforge's
    (:func:`pooling_transformers_lacks`: a sequence head on mean / max pooling, or on h_[CLS] without the
    pooler for bert / albert / mobilebert), the dir is written for bertforge alone: ``model_type``
    ``bertforge-<pooling>-pooled-<family>`` (:func:`bertforge_model_type`; the family in the ``bertforge``
    section's ``family``, read back by :func:`config_from_hf`) and ``architectures``
    ``<Pooling>Pooled<Family>ForSequenceClassification``. Weights and every other key are as for the family.
    ModernBERT's ``classifier_pooling`` is written as the pooling the head reads (``cls`` / ``mean``)."""
    fam = config.model_type
    arch = FAMILY_CLASS[fam] + HEADS[head].hf_suffix
    d: dict = {"architectures": [arch], "model_type": fam}
    if fam == "modernbert":
        d.update(modernbert_config_to_hf(config))
    elif fam == "mpnet":
        d.update({k: getattr(config, k) for k in _MPNET_KEYS}, bos_token_id=0, eos_token_id=2)
    elif fam == "distilbert":
        d.update(dim=config.hidden_size, n_layers=config.num_hidden_layers,
                 n_heads=config.num_attention_heads, hidden_dim=config.intermediate_size,
                 activation=config.hidden_act, dropout=config.hidden_dropout_prob,
                 attention_dropout=config.attention_probs_dropout_prob, sinusoidal_pos_embds=False,
                 seq_classif_dropout=config.classifier_dropout or 0.2, qa_dropout=0.1)
    else:
        d.update(hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
                 num_attention_heads=config.num_attention_heads,
                 intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
                 hidden_dropout_prob=config.hidden_dropout_prob,
                 attention_probs_dropout_prob=config.attention_probs_dropout_prob,
                 type_vocab_size=config.type_vocab_size, layer_norm_eps=config.layer_norm_eps)
        if config.classifier_dropout is not None:
            d["classifier_dropout"] = config.classifier_dropout
        if fam in ("albert", "electra"):
            d["embedding_size"] = config.embedding_size
        if fam == "mobilebert":
            d.update(mobilebert_config_to_hf(config))
        if fam == "albert":
            d.update(num_hidden_groups=albert_num_groups(config), inner_group_num=1)
            if config.classifier_dropout is not None:
                d["classifier_dropout_prob"] = config.classifier_dropout
        if fam == "roberta":
            d.update(bos_token_id=0, eos_token_id=2)
    d.update(vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings,
             initializer_range=config.initializer_range, pad_token_id=config.pad_token_id)
    if head != "base" and HEADS[head].has_labels:
        id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
        d["id2label"] = {str(k): v for k, v in id2label.items()}
        d["label2id"] = {v: int(k) for k, v in id2label.items()}
        if config.problem_type:
            d["problem_type"] = config.problem_type
    for k in OUR_CONFIG_KEYS:
        d[k] = getattr(config, k)
    # ``pooling`` and ``family`` are written from the config as it is now, never carried over from the dir it was
    # read from (a head switched back to the pooler, a head transformers computes, must not keep them)
    d[META_KEY] = {k: v for k, v in meta_section(d).items() if k not in ("pooling", "family")}
    if fam == "modernbert" and head == SEQUENCE_HEAD and config.pooling in ("cls", "mean"):
        d["classifier_pooling"] = config.pooling  # what the head reads (config.pooling wins over classifier_pooling)
    if config.pooling:  # the sequence head's pooling (ModelConfig.pooling), kept in bertforge's own section
        d = with_meta(d, pooling=config.pooling)
    lacks = pooling_transformers_lacks(fam, head, config.pooling, d.get("classifier_pooling"))
    if lacks:  # transformers would load it into another function: a model_type it refuses, naming it
        d["model_type"] = bertforge_model_type(fam, lacks)
        d["architectures"] = [f"{lacks.capitalize()}Pooled{arch}"]
        d = with_meta(d, family=fam)
    d["bertforge_head"] = head
    return d


# ------------------------------------------------------------------------------------------- saving
def hf_state_dict(model) -> dict:
    """Our weights under HF names (``{prefix}.…`` for the encoder, top-level for the head)."""
    config = model.config
    own = model.state_dict()
    p = PREFIX[config.model_type] + "."
    out: dict = {}
    for ours, theirs in encoder_key_map(config):
        t = own["encoder." + ours]
        if len(theirs) == 1:
            out[p + theirs[0]] = t
        else:
            for name, part in zip(theirs, t.chunk(len(theirs), 0)):
                out[p + name] = part
    if model.head is not None:
        for o, t in model.head.hf_keys(config).items():
            out[t] = own["head." + o]
    # safetensors refuses shared memory: give every entry its own contiguous storage
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in out.items()}


def save_pretrained(model, out_dir, tokenizer_dir=None, tokenizer=None, pooling=None) -> None:
    """Write a :class:`~bertforge.task_model.TaskModel` as ``config.json`` + ``model.safetensors`` (+ tokenizer
    files) atomically into ``out_dir``.

    Files that already exist in ``out_dir`` and are not part of a checkpoint (``metrics.jsonl``,
    ``recipe.yaml``, sub-directories) are kept. Each file is written under a temporary name and renamed.

    Args:
        tokenizer_dir: a dir whose tokenizer files (``tokenizer.json``, ``vocab.txt`` …) are copied.
        tokenizer: a ``tokenizers.Tokenizer`` to save instead.
        pooling: an embedding model's :class:`bertforge.models.pooling.Pooling` (or a mode name: ``mean``,
            ``cls``, ``max``); default ``model.pooling`` when the head is ``base``, the head's own pooling and
            normalisation when it is ``embedding``. Given, the dir is also
            written in the sentence-transformers layout (``modules.json``, ``1_Pooling/config.json``,
            ``sentence_bert_config.json``; :func:`bertforge.models.pooling.write_pooling`), so that
            ``SentenceTransformer(out_dir)`` loads it and gives the same vectors.
    Raises:
        ConfigError: ``tokenizer_dir`` holds no tokenizer file, or ``tokenizer`` is not a
        ``tokenizers.Tokenizer`` — checked before anything is written.
    """
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise ConfigError(f"tokenizer={tokenizer!r:.60} is a {type(tokenizer).__name__}; pass a "
                          f"tokenizers.Tokenizer, or tokenizer_dir=<a dir holding tokenizer.json>")
    if tokenizer is None and tokenizer_dir is not None and not any(
            (Path(tokenizer_dir) / n).is_file() for n in TOKENIZER_FILES):
        raise ConfigError(f"tokenizer_dir={str(tokenizer_dir)!r} holds no tokenizer file "
                          f"({', '.join(TOKENIZER_FILES)}); pass the dir of the model's tokenizer")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = config_to_hf(model.config, model.head_name)
    with atomic_dir(out_dir / ".staging") as tmp:
        save_file(hf_state_dict(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp, model_max_length=model.config.max_position_embeddings)
        elif tokenizer_dir is not None:
            copy_tokenizer_files(Path(tokenizer_dir), tmp)
        move_files_into(tmp, out_dir)
    shutil.rmtree(out_dir / ".staging", ignore_errors=True)
    if pooling is None and getattr(model, "head_name", None) == "base":
        pooling = getattr(model, "pooling", None)
    settings = getattr(getattr(model, "head", None), "settings", None)
    if pooling is None and getattr(model, "head_name", None) == "embedding" and settings is not None:
        from ..models.pooling import Pooling  # the embedding head's own pooling: SentenceTransformer(out_dir) = it
        pooling = Pooling(settings.pooling, settings.normalize)
    if pooling is not None:
        from ..models.pooling import Pooling, write_pooling
        if isinstance(pooling, str):
            pooling = Pooling(pooling)
        write_pooling(out_dir, pooling.mode, pooling.normalize, hidden_size=model.config.hidden_size,
                      max_seq_length=pooling.max_seq_length)
    for stale in ("pytorch_model.bin",):
        if (out_dir / stale).exists():
            (out_dir / stale).unlink()


__all__ = ["FAMILY_CLASS", "PREFIX", "SEQUENCE_HEAD", "pooling_transformers_lacks", "bertforge_model_type",
           "encoder_key_map", "mobilebert_key_map", "albert_num_groups", "config_from_hf", "config_to_hf",
           "hf_state_dict", "save_pretrained"]
