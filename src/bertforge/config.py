"""Typed configuration: the model architecture and a run recipe split by axis.

Following cramming (Geiping & Goldstein 2022), a recipe has four axes:

* ``model`` — the architecture (:class:`ModelConfig`, stored in ``config.json``);
* ``data``  — what is read and how it is tokenized (:class:`DataConfig`);
* ``train`` — everything that changes results: optimiser, schedule, batch, epochs, seed (:class:`TrainConfig`);
* ``impl``  — only speed: threads, dtype, compile, kernels (:class:`ImplConfig`). An ``impl`` change must never change
  the numbers beyond noise (bf16 autocast is the documented exception: it is a precision choice).

Recipes are YAML files with those top-level keys; ``key=value`` overrides use dotted paths
(``train.lr=3e-5``). Unknown keys raise :class:`~bertforge.errors.ConfigError` naming the key.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

from .errors import ConfigError, require_number
from .io import atomic_write_text

FAMILIES = ("bert", "roberta", "albert", "electra", "distilbert", "modernbert", "mobilebert", "mpnet")
#: MobileBERT's norms (``ModelConfig.normalization_type``, Hugging Face's names)
NORMALIZATIONS = ("no_norm", "layer_norm")
#: MPNet's relative-position buckets and the distance past which they stop growing: the values transformers'
#: ``MPNetEncoder.compute_position_bias`` uses whatever the config says (so the only ones bertforge accepts)
MPNET_BUCKETS, MPNET_MAX_DISTANCE = 32, 128
#: the attention kinds of a ModernBERT layer (``ModelConfig.layer_types``, Hugging Face's names)
LAYER_TYPES = ("full_attention", "sliding_attention")
POOLINGS = ("cls", "mean")  # ModernBERT's classifier_pooling
SHARING = ("none", "attention", "ffn", "all")
KERNELS = ("auto", "cpu", "none")  # impl.kernels (bertforge.engine.kernels.apply_kernels)


@dataclass
class ModelConfig:
    """Architecture of one encoder (BERT family), in Hugging Face ``BertConfig`` vocabulary.

    ``model_type`` picks the family: ``bert`` (Devlin et al. 2018), ``roberta`` (Liu et al. 2019; positions
    offset by ``pad_token_id + 1``), ``albert`` (Lan et al. 2019; factorized embeddings ``embedding_size`` → H
    and cross-layer sharing), ``electra`` (Clark et al. 2020; embedding projection when E ≠ H), ``distilbert``
    (Sanh et al. 2019; no token types, no pooler), ``modernbert`` (Warner et al. 2024; rotary positions, GeGLU,
    pre-LN without biases, alternating local/global attention — :mod:`bertforge.models.modernbert`),
    ``mobilebert`` (Sun et al. 2020; trigram embeddings of size ``embedding_size``, blocks with bottlenecks
    ``hidden_size`` → ``intra_bottleneck_size`` → ``hidden_size``, ``num_feedforward_networks`` stacked FFNs,
    ``normalization_type`` ``no_norm`` | ``layer_norm`` — :mod:`bertforge.models.mobilebert`; heads divide the
    intra-block width, :attr:`inner_size`), ``mpnet`` (Song et al. 2020; BERT's block with a bucketed relative position bias shared by all layers, RoBERTa's position
    ids, no token types — :class:`bertforge.models.encoder.Encoder`).

    ModernBERT keys (read by that family only, Hugging Face ``ModernBertConfig`` names): a layer ``i`` attends
    globally when ``i % global_attn_every_n_layers == 0``, else within ``local_attention // 2`` positions
    either side (``layer_types`` lists the kinds explicitly and wins when given); ``global_rope_theta`` /
    ``local_rope_theta`` are the RoPE bases of those layers; ``norm_bias`` gives the LayerNorms a bias;
    ``classifier_pooling`` (``cls`` | ``mean``) and ``classifier_activation`` shape the task heads.

    ``layer_num_heads`` / ``layer_intermediate_sizes`` (one entry per layer) describe structurally pruned
    models (Michel et al. 2019); ``None`` means every layer has ``num_attention_heads`` heads and
    ``intermediate_size`` FFN units. The head size is always ``hidden_size // num_attention_heads``.
    """

    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    embedding_size: Optional[int] = None
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    layer_sharing: str = "none"
    add_pooling_layer: bool = True
    layer_num_heads: Optional[list] = None
    layer_intermediate_sizes: Optional[list] = None
    # ModernBERT (model_type "modernbert"; Warner et al. 2024 §2.1)
    global_attn_every_n_layers: int = 3
    local_attention: int = 128
    layer_types: Optional[list] = None
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    norm_bias: bool = False
    classifier_pooling: str = "cls"
    classifier_activation: str = "gelu"
    # MobileBERT (model_type "mobilebert"; Sun et al. 2020 §3.1-3.2; Hugging Face MobileBertConfig names)
    trigram_input: bool = True
    use_bottleneck: bool = True
    intra_bottleneck_size: int = 128
    use_bottleneck_attention: bool = False
    key_query_shared_bottleneck: bool = True
    num_feedforward_networks: int = 4
    normalization_type: str = "no_norm"
    # MPNet (model_type "mpnet"; Song et al. 2020 §2.2): buckets of the relative position bias shared by all layers
    relative_attention_num_buckets: int = MPNET_BUCKETS
    # task head
    num_labels: int = 2
    problem_type: Optional[str] = None  # "single_label_classification" | "regression" | ...
    id2label: Optional[dict] = None
    classifier_dropout: Optional[float] = None
    #: what the sequence head reads: None (``pooler``) = the family's own (BERT/ALBERT: the tanh pooler over [CLS], as
    #: ``transformers``); ``mean`` / ``max`` / ``cls`` = :func:`bertforge.models.pooling.pool` of the last
    #: layer (the pooling a sentence-embedding checkpoint was trained with). Saved in config.json → bertforge.
    pooling: Optional[str] = None
    # free-form provenance (e.g. how a student was built); saved in config.json
    bertforge: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_type not in FAMILIES:
            raise ConfigError(
                f"unknown model family {self.model_type!r}; choose one of {', '.join(FAMILIES)}")
        if self.layer_sharing not in SHARING:
            raise ConfigError(
                f"model.layer_sharing={self.layer_sharing!r} is not one of {', '.join(SHARING)}")
        for name, low in (("vocab_size", 1), ("hidden_size", 1), ("num_attention_heads", 1),
                          ("num_hidden_layers", 0), ("intermediate_size", 0), ("max_position_embeddings", 1),
                          ("type_vocab_size", 0)):
            require_number(f"model.{name}", getattr(self, name), low, whole=True)
        if self.embedding_size is not None:
            require_number("model.embedding_size", self.embedding_size, 1, whole=True)
        dropouts = ["hidden_dropout_prob", "attention_probs_dropout_prob"]
        if self.classifier_dropout is not None:  # None: the classifier uses hidden_dropout_prob
            dropouts.append("classifier_dropout")
        for name in dropouts:
            require_number(f"model.{name}", getattr(self, name), 0, 1, open_high=True, note="a probability")
        require_number("model.layer_norm_eps", self.layer_norm_eps, 0, open_low=True)
        if self.model_type == "mobilebert":
            self._check_mobilebert()
        elif self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; pick a head count that divides it")
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.pooling == "pooler":  # model.pooling=pooler: the family's own [CLS] pooler (transformers parity)
            self.pooling = None
        if self.pooling is not None and self.pooling not in ("mean", "max", "cls"):
            raise ConfigError(f"model.pooling={self.pooling!r}; choose mean, max, cls or pooler (the family's "
                              f"own [CLS] pooler, as transformers)")
        if self.model_type == "modernbert":
            self._check_modernbert()
        if self.model_type == "mpnet":
            self.type_vocab_size = 0  # MPNet has no segment embeddings (token_type_ids are not read)
        if self.model_type == "mpnet":  # 32.0 would pass the != below and fail inside nn.Embedding
            require_number("model.relative_attention_num_buckets", self.relative_attention_num_buckets, 1, whole=True)
        if self.model_type == "mpnet" and self.relative_attention_num_buckets != MPNET_BUCKETS:
            raise ConfigError(f"model.relative_attention_num_buckets={self.relative_attention_num_buckets!r}: MPNet "
                              f"buckets relative positions into {MPNET_BUCKETS} (transformers' MPNetEncoder "
                              f"ignores any other count); use {MPNET_BUCKETS}")
        for name in ("layer_num_heads", "layer_intermediate_sizes"):
            v = getattr(self, name)
            if v is not None and len(v) != self.num_hidden_layers:
                raise ConfigError(f"{name} has {len(v)} entries but the model has "
                                  f"{self.num_hidden_layers} layers")

    def _check_modernbert(self) -> None:
        if self.layer_sharing != "none":
            raise ConfigError(f"model.layer_sharing={self.layer_sharing!r}: ModernBERT layers are not shared; "
                              f"use none")
        require_number("model.global_attn_every_n_layers", self.global_attn_every_n_layers, 1, whole=True)
        require_number("model.local_attention", self.local_attention, 2, whole=True)
        for name in ("global_rope_theta", "local_rope_theta"):
            require_number(f"model.{name}", getattr(self, name), 0, open_low=True)
        if self.head_dim % 2:
            raise ConfigError(f"head size {self.head_dim} is odd; rotary position embeddings rotate pairs of "
                              f"dimensions: pick hidden_size / num_attention_heads even")
        if self.classifier_pooling not in POOLINGS:
            raise ConfigError(f"model.classifier_pooling={self.classifier_pooling!r}; choose one of "
                              f"{', '.join(POOLINGS)}")
        if self.layer_types is not None:
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            if bad or len(self.layer_types) != self.num_hidden_layers:
                raise ConfigError(f"model.layer_types must list {self.num_hidden_layers} of "
                                  f"{', '.join(LAYER_TYPES)} (one per layer), got {self.layer_types!r}")

    def _check_mobilebert(self) -> None:
        require_number("model.intra_bottleneck_size", self.intra_bottleneck_size, 1, whole=True)
        require_number("model.num_feedforward_networks", self.num_feedforward_networks, 1, whole=True)
        if self.layer_sharing != "none":
            raise ConfigError(f"model.layer_sharing={self.layer_sharing!r}: MobileBERT layers are not shared; "
                              f"use none")
        if self.normalization_type not in NORMALIZATIONS:
            raise ConfigError(f"model.normalization_type={self.normalization_type!r}; choose one of "
                              f"{', '.join(NORMALIZATIONS)}")
        if self.inner_size % self.num_attention_heads:
            raise ConfigError(f"MobileBERT intra-block width {self.inner_size} is not divisible by "
                              f"num_attention_heads {self.num_attention_heads}; pick a head count that divides it")
        if (self.use_bottleneck and not self.key_query_shared_bottleneck and not self.use_bottleneck_attention
                and self.intra_bottleneck_size != self.hidden_size):
            raise ConfigError("MobileBERT without key_query_shared_bottleneck or use_bottleneck_attention reads "
                              "queries from the inter-block state: intra_bottleneck_size must equal hidden_size")

    @property
    def inner_size(self) -> int:
        """The width inside a block: MobileBERT's ``intra_bottleneck_size`` (with ``use_bottleneck``), else
        ``hidden_size``."""
        if self.model_type == "mobilebert" and self.use_bottleneck:
            return self.intra_bottleneck_size
        return self.hidden_size

    def layer_type(self, layer: int) -> str:
        """``full_attention`` or ``sliding_attention`` (ModernBERT): ``layer_types[layer]`` when given, else
        global every ``global_attn_every_n_layers`` layers from layer 0 (Warner et al. 2024 §2.1.2)."""
        if self.layer_types:
            return self.layer_types[layer]
        return "full_attention" if layer % self.global_attn_every_n_layers == 0 else "sliding_attention"

    @property
    def head_dim(self) -> int:
        return self.inner_size // self.num_attention_heads

    def heads_of(self, layer: int) -> int:
        return self.layer_num_heads[layer] if self.layer_num_heads else self.num_attention_heads

    def intermediate_of(self, layer: int) -> int:
        if self.layer_intermediate_sizes:
            return self.layer_intermediate_sizes[layer]
        return self.intermediate_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **kw) -> "ModelConfig":
        d = self.to_dict()
        d.update(kw)
        return ModelConfig(**d)


@dataclass
class DataConfig:
    """What is read: task name, files and tokenization limits."""

    task: Optional[str] = None
    train: Optional[str] = None
    eval: Optional[str] = None
    max_seq_len: int = 128
    max_train_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    # generic CSV/TSV/JSONL layouts (``task: custom`` or to override a registered task's columns)
    text_columns: Optional[list] = None
    label_column: Optional[Any] = None
    labels: Optional[list] = None
    header: Optional[bool] = None
    metric: Optional[str] = None
    corpus: Optional[list] = None
    # multi-label tasks (tasks/multilabel.py): the label field is a list; labels_file names the labels (one
    # per line) instead of ``labels``; thresholds set by hand (a float, one per label, or name → float)
    # instead of tuning them on ``eval``
    multi_label: Optional[bool] = None
    allow_empty_labels: Optional[bool] = None
    labels_file: Optional[str] = None
    thresholds: Optional[Any] = None


@dataclass
class TrainConfig:
    """Everything that changes results."""

    epochs: float = 3.0
    max_steps: Optional[int] = None
    max_minutes: Optional[float] = None  # wall-clock budget of one fit(): stop, evaluate, save
    batch_size: int = 32
    grad_accum_steps: int = 1
    lr: float = 5e-5
    weight_decay: float = 0.01
    adam_betas: tuple = (0.9, 0.999)
    adam_eps: float = 1e-8
    warmup_ratio: float = 0.1
    warmup_steps: Optional[int] = None
    schedule: str = "linear"  # linear | constant | cosine | inverse_sqrt
    max_grad_norm: float = 1.0
    seed: int = 42
    eval_every: Optional[int] = None  # steps; None = once per epoch
    save_every: Optional[int] = None  # steps; None = once per epoch
    keep_checkpoints: int = 2
    metric_for_best: Optional[str] = None
    load_best_at_end: bool = True
    log_every: int = 10
    dropout_off: bool = False
    # multi-label BCE (tasks/multilabel.py): pos_weight none | frequency | sqrt; focal loss γ (0 = off)
    pos_weight: Optional[str] = None
    focal_gamma: float = 0.0
    deterministic: bool = False
    # batches of texts of similar length (engine/train/sampler.py, as transformers' group_by_length): less padding,
    # other batch compositions; None = the data's choice (on for embedding_mse distillation's single texts)
    group_by_length: Optional[bool] = None
    # in-batch-negative training (retrieval): no batch holds one query/positive text twice (engine/train/sampler.py
    # no_duplicate_batches); deferred and dropped pairs are counted on stderr. false: the plain shuffled slices
    no_duplicates: bool = True


@dataclass
class ImplConfig:
    """Only speed. ``dtype`` bfloat16 turns on CPU/GPU autocast; ``auto`` uses it where the device multiplies
    bf16 natively (engine/train/precision.py), else float32."""

    dtype: str = "float32"  # float32 | bfloat16 | auto
    threads: Optional[int] = None
    compile: bool = False
    num_workers: int = 0
    device: str = "auto"
    progress: bool = True
    parallel: str = "ddp"  # under torchrun: ddp | fsdp (sharded params/grads/optimizer state)
    keep_freed_memory: bool = True  # CPU: glibc malloc keeps freed blocks ≤ 32 MiB (engine/kernels/allocator.py)
    #: which implementation of the encoder's layers runs (bertforge.engine.kernels): ``cpu`` = the CPU training and
    #: inference kernels, ``none`` = the plain PyTorch modules, ``auto`` = ``cpu`` when the model's parameters
    #: are on a CPU, else plain. Speed only: both compute the same function (same weights, same outputs up
    #: to float rounding; dropout masks come from another random stream)
    kernels: str = "auto"

    def __post_init__(self) -> None:
        if self.kernels not in KERNELS:
            raise ConfigError(f"impl.kernels={self.kernels!r}; choose one of {', '.join(KERNELS)}")


@dataclass
class Recipe:
    model: dict = field(default_factory=dict)  # overrides of the ModelConfig of the loaded/new model
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    impl: ImplConfig = field(default_factory=ImplConfig)
    extra: dict = field(default_factory=dict)  # verb-specific sections (objective, distill, …)
    #: what the run read, by the flag that names it (``--model``, ``--train``, ``--teacher #2`` …): a model dir
    #: as ``{path, sha256}`` (plus ``name`` for ``minilm`` or a hub id), a data file as ``{path, bytes,
    #: sha256}``, a hub dataset as ``{name}`` (``bertforge.pipelines.sources``); empty in recipes written by
    #: hand and by older versions
    sources: dict = field(default_factory=dict)
    #: dotted keys the recipe file or a KEY=VALUE override set (not a verb's defaults): a value equal to a
    #: default is still a choice (not saved; see :func:`load_recipe`)
    given: set = field(default_factory=set, compare=False)

    def to_dict(self) -> dict:
        d = {"model": dict(self.model), "data": dataclasses.asdict(self.data),
             "train": dataclasses.asdict(self.train), "impl": dataclasses.asdict(self.impl)}
        d["train"]["adam_betas"] = list(d["train"]["adam_betas"])
        d.update(self.extra)
        if self.sources:
            d["sources"] = copy.deepcopy(self.sources)
        return d

    def save(self, path: Path) -> None:
        atomic_write_text(Path(path), yaml.safe_dump(self.to_dict(), sort_keys=False))


_SECTIONS = {"data": DataConfig, "train": TrainConfig, "impl": ImplConfig}


_NUMBER = re.compile(r"[-+]?\d*\.?\d+([eE][-+]?\d+)?")


def _coerce(value: str) -> Any:
    """Parse an override value with YAML rules (``3e-5`` → float, ``true`` → bool, ``[1,2]`` → list)."""
    try:
        v = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if isinstance(v, str) and _NUMBER.fullmatch(v):
        return float(v)  # YAML 1.1 reads "3e-5" as a string
    return v


_BOOL_WORDS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}
_NONE_WORDS = ("none", "null", "~", "")
_MISSING = object()


def _type_parts(tp) -> tuple:
    """``(base type, optional)`` of a resolved field annotation (``Optional[int]`` → ``(int, True)``)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union:
        return (args[0] if len(args) == 1 else Any), True
    return (typing.get_origin(tp) or tp), False


def check_value(key: str, value: Any, tp, raw: Any = _MISSING) -> Any:
    """``value`` (of recipe key ``key``, a YAML-parsed override or recipe entry) checked and coerced against
    the declared field type ``tp`` (``int``, ``float``, ``bool``, ``str``, ``tuple``, ``list``,
    ``Optional[...]``, ``Any``). ``raw`` is the override's text, when there is one.

    Raises:
        ConfigError: ``"train.lr=abc: expected a number"`` (the key, the value, the expected type).
    """
    base, optional = _type_parts(tp)
    shown = raw if raw is not _MISSING else value

    def bad(expected: str):
        return ConfigError(f"{key}={shown}: expected {expected}" + (" (or null)" if optional else ""))

    if value is None or (optional and isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
        if optional or base is Any:
            return None
        if value is None:  # an empty override (`impl.dtype=`) or a YAML null for a key that needs a value
            raise ConfigError(f"{key}={raw if raw is not _MISSING else 'null'}: a value is needed here; give one "
                              f"or leave the key out for its default")
    if base is Any:
        return value
    if base in (int, float) and isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads "1e-4" (no dot) as a string, in recipe files too
    if base is bool:
        text = raw if isinstance(raw, str) else value if isinstance(value, str) else None
        if text is not None and text.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[text.strip().lower()]
        if text is None and isinstance(value, bool):
            return value
        if text is None and isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise bad("true/false (also yes/no, 1/0)")
    if base is int:
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad("an integer")
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if base is str:
        if isinstance(value, str):
            return value
        if isinstance(raw, str) and not isinstance(value, (list, dict)):
            return raw  # e.g. impl.device=0 → "0"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad("a string")
    if base in (list, tuple):
        if isinstance(value, (list, tuple)):
            return base(value)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and base is list:
            return [value]  # data.text_columns=sentence → ["sentence"]
        raise bad("a list, e.g. [a,b]")
    if base is dict:
        if isinstance(value, dict):
            return value
        raise bad("a mapping")
    return value


@functools.lru_cache(maxsize=None)
def _section_types(cls) -> dict:
    """Resolved field annotations of a recipe section's dataclass (computed once per class)."""
    return typing.get_type_hints(cls)


#: numeric keys of free-form verb sections (``distill.temperature=abc`` must fail at load time)
_EXTRA_TYPES = {"distill": {"temperature": Optional[float], "alpha": Optional[float],
                            "mlm_probability": Optional[float]}}


def _build_section(name: str, cls, values: dict):
    known = {f.name: f for f in fields(cls)}
    for k in values:
        if k not in known:
            raise ConfigError(f"unknown recipe key '{name}.{k}'; valid keys: {', '.join(sorted(known))}")
    types = _section_types(cls)
    vals = {k: check_value(f"{name}.{k}", v, types[k]) for k, v in values.items()}
    if "adam_betas" in vals:
        betas = tuple(vals["adam_betas"])
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas):
            raise ConfigError(f"{name}.adam_betas={list(betas)}: expected two numbers, e.g. [0.9,0.999]")
        vals["adam_betas"] = betas
    return cls(**vals)


def deep_merge(a: dict, b: dict) -> dict:
    """``b`` over ``a``, recursively for nested mappings (neither input is modified)."""
    out = copy.deepcopy(a)
    for k, v in (b or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else copy.deepcopy(v)
    return out


def parse_override(ov: str) -> tuple:
    """``"section.key=value"`` → ``("section.key", "value")``; ConfigError for any other shape."""
    key, eq, value = ov.partition("=")
    if not eq or "." not in key:
        raise ConfigError(f"override {ov!r} must look like section.key=value (e.g. train.lr=3e-5)")
    return key, value


def load_recipe(path: Optional[str] = None, overrides: Optional[list] = None,
                extra_sections: tuple = (), defaults: Optional[dict] = None) -> Recipe:
    """Read a YAML recipe over ``defaults`` (a verb's built-in recipe) and apply ``key=value`` overrides.

    Args:
        path: YAML file with top-level ``model``/``data``/``train``/``impl`` (and verb sections listed
            in ``extra_sections``), or ``None`` for defaults.
        overrides: strings ``section.key=value``.
    Raises:
        ConfigError: unreadable YAML, unknown section or key, malformed override, a key overridden twice
            with different values.
    """
    raw: dict = {}
    if path:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"--recipe {path} is a directory; pass a YAML file (e.g. one in recipes/)")
        if not p.is_file():
            raise ConfigError(f"recipe file {path} does not exist; pass a YAML file (see recipes/)")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            msg = str(e).splitlines()[0]
            raise ConfigError(f"recipe {path} is not valid YAML ({msg}); fix the file") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"recipe {path} must be a mapping with keys model/data/train/impl")
        for k, v in raw.items():
            if v is not None and not isinstance(v, dict):
                raise ConfigError(f"recipe {path}: section {k!r} must be a mapping of keys (e.g. "
                                  f"'{k}: {{key: value}}'), not {v!r}; fix the file")
    chosen = {f"{sec}.{k}" for sec, keys in raw.items() for k in (keys or {})}
    raw = deep_merge(defaults or {}, raw)
    raw = {k: dict(v or {}) for k, v in raw.items()}
    given: dict = {}
    for ov in overrides or []:
        key, value = parse_override(ov)
        if key in given and given[key] != value:  # "the last one wins" would hide a typo or a stale copy
            raise ConfigError(f"{key} is given twice ({key}={given[key]} and {key}={value}); keep one")
        given[key] = value
        section, sub = key.split(".", 1)
        parsed = _coerce(value)
        types = (_section_types(_SECTIONS[section]) if section in _SECTIONS
                 else _section_types(ModelConfig) if section == "model" else _EXTRA_TYPES.get(section, {}))
        if sub in types:
            parsed = check_value(key, parsed, types[sub], raw=value)
        if "." in sub and section not in _SECTIONS and section != "model":  # a verb section's nested
            outer, inner = sub.split(".", 1)  # mapping, e.g. distill.augment.swap_prob=0.1
            node = raw.setdefault(section, {})
            if not isinstance(node.get(outer), dict):
                node[outer] = dict(node.get(outer) or {})
            node[outer][inner] = parsed
            continue
        raw.setdefault(section, {})[sub] = parsed
    allowed = {"model", "sources", *_SECTIONS, *extra_sections}
    for k in raw:
        if k not in allowed:
            raise ConfigError(f"unknown recipe section {k!r}; valid sections: {', '.join(sorted(allowed))}")
    model_types = _section_types(ModelConfig)
    recipe = Recipe(model={k: check_value(f"model.{k}", v, model_types[k]) if k in model_types else v
                           for k, v in raw.get("model", {}).items()})
    for name, cls in _SECTIONS.items():
        setattr(recipe, name, _build_section(name, cls, raw.get(name, {})))
    recipe.extra = {k: raw[k] for k in extra_sections if k in raw}
    recipe.sources = _check_sources(raw.get("sources") or {}, path)
    recipe.given = chosen | set(given)
    for sec, types in _EXTRA_TYPES.items():
        for k, tp in types.items():
            if k in recipe.extra.get(sec, {}):
                recipe.extra[sec][k] = check_value(f"{sec}.{k}", recipe.extra[sec][k], tp)
    return recipe


def _check_sources(sources: dict, path) -> dict:
    """The ``sources`` section of a run's recipe: flag → a mapping with a ``path`` or a ``name``."""
    for flag, entry in sources.items():
        if not isinstance(entry, dict) or not (entry.get("path") or entry.get("name")):
            raise ConfigError(f"recipe {path}: sources.{flag} must be a mapping with a path (or a name) and its "
                              f"fingerprint, as a run writes it; fix the file or drop the entry")
    return {str(k): dict(v) for k, v in sources.items()}


def model_config_from_dict(d: dict) -> ModelConfig:
    known = {f.name for f in fields(ModelConfig)}
    unknown = set(d) - known
    if unknown:
        raise ConfigError(f"unknown model keys {sorted(unknown)}; valid keys: {', '.join(sorted(known))}")
    return ModelConfig(**d)


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False)
