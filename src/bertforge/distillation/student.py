"""Students: a named shape (fresh weights) or teacher layers copied (DistilBERT initialisation).

* Shape ``4L-312H-12A-1200I`` (TinyBERT-4, Jiao et al. 2020 §4.1), ``6L-768H`` …: parts ``<n>L`` layers,
  ``<n>H`` hidden size, ``<n>A`` heads (default H/64), ``<n>I`` FFN size (default 4H). Vocabulary,
  positions, family and tokenizer are the teacher's; weights are freshly initialised (N(0, 0.02)).
* ``layers:0,2,4`` — the student has those teacher blocks (0-based block indices), the teacher's
  embeddings, pooler and (when the heads agree) task head: DistilBERT's initialisation "taking one
  layer out of two" (Sanh et al. 2019, §3) and BERT-PKD's (Sun et al. 2019, §4.1).
* ``modernbert:4L-256H-4A-384I`` — a shape of another family (cross-family distillation): a fresh
  ModernBERT-layout student (RoPE, GeGLU, alternating local/global attention; Warner et al. 2024) on the
  teacher's vocabulary and tokenizer, :func:`cross_family_config`; when its hidden size is the teacher's
  embedding size, it starts from the teacher's token embeddings (the rest is fresh). Which losses apply across families:
  docs/modernbert.md ("Distillation").
* ``mobilebert:24L-512H-128B-4A-512I-4F-128E`` — a MobileBERT-shape student (Sun et al. 2020 §3.1–3.2;
  :func:`parse_mobilebert_shape`): ``H`` its inter-block width (default: the teacher's hidden size, so its
  feature maps match the teacher's without a projection, as progressive transfer needs), ``B`` the
  intra-block bottleneck (default H/4), ``A`` heads dividing B, ``I`` the FFN width, ``F`` stacked FFNs,
  ``E`` the trigram embedding size; NoNorm and ReLU.
* an existing checkpoint directory — the student of an earlier stage (chaining general → task).

How the student was made is recorded in ``config.bertforge["student"]`` (saved in ``config.json``).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

import torch

from ..checkpoint.read import load_pretrained
from ..config import ModelConfig
from ..errors import ConfigError
from ..task_model import TaskModel

_PART = re.compile(r"^(\d+)([LHAI])$", re.IGNORECASE)


def parse_shape(spec: str) -> dict:
    """``"4L-312H-12A-1200I"`` → ``{num_hidden_layers: 4, hidden_size: 312, num_attention_heads: 12,
    intermediate_size: 1200}`` (missing A → max(1, H/64), missing I → 4H; L and H are required).

    Raises:
        ConfigError: malformed or repeated part, missing L or H, or H not divisible by A.
    """
    keys = {"L": "num_hidden_layers", "H": "hidden_size", "A": "num_attention_heads", "I": "intermediate_size"}
    out: dict = {}
    for part in spec.strip().split("-"):
        m = _PART.match(part.strip())
        if not m:
            raise ConfigError(f"student shape {spec!r}: part {part!r} is not like 4L, 312H, 12A or 1200I; "
                              f"write e.g. --student 4L-312H-12A-1200I or --student layers:0,2,4")
        key = keys[m.group(2).upper()]
        if key in out:
            raise ConfigError(f"student shape {spec!r} gives {m.group(2).upper()} twice; name each size once")
        out[key] = int(m.group(1))
    if "num_hidden_layers" not in out or "hidden_size" not in out:
        raise ConfigError(f"student shape {spec!r} needs at least <n>L and <n>H (e.g. 6L-768H)")
    h = out["hidden_size"]
    out.setdefault("num_attention_heads", max(1, h // 64))
    out.setdefault("intermediate_size", 4 * h)
    if min(out.values()) < 1:
        raise ConfigError(f"student shape {spec!r}: every size must be ≥ 1")
    if h % out["num_attention_heads"]:
        raise ConfigError(f"student shape {spec!r}: hidden size {h} is not divisible by "
                          f"{out['num_attention_heads']} heads; pick a head count that divides it")
    return out


_MOBILE_PART = re.compile(r"^(\d+)([LHBAIFE])$", re.IGNORECASE)
_MOBILE_KEYS = {"L": "num_hidden_layers", "H": "hidden_size", "B": "intra_bottleneck_size",
                "A": "num_attention_heads", "I": "intermediate_size", "F": "num_feedforward_networks",
                "E": "embedding_size"}


def parse_mobilebert_shape(spec: str, teacher_hidden: Optional[int] = None, teacher_heads: Optional[int] = None,
                           teacher_layers: Optional[int] = None) -> dict:
    """``"24L-512H-128B-4A-512I-4F-128E"`` → ModelConfig keywords of a MobileBERT student (parts in any order:
    ``L`` layers, ``H`` inter-block width, ``B`` intra-block bottleneck, ``A`` heads, ``I`` FFN width, ``F``
    stacked FFNs, ``E`` embedding size). Defaults (Sun et al. 2020 Table 1's MobileBERT proportions): L and H
    the teacher's, B = H/4, A = the teacher's heads when they divide B (else 4), I = min(4B, H), F = 4,
    E = B.

    Raises:
        ConfigError: a malformed or repeated part, a width of 0, heads that do not divide B, or an L or H missing
        without a teacher to take them from."""
    out: dict = {}
    for part in spec.strip().split("-") if spec.strip() else []:
        m = _MOBILE_PART.match(part.strip())
        if not m:
            raise ConfigError(f"mobilebert student shape {spec!r}: part {part!r} is not like 24L, 512H, 128B, 4A, "
                              f"512I, 4F or 128E; write e.g. --student mobilebert:24L-512H-128B-4A-512I-4F")
        key = _MOBILE_KEYS[m.group(2).upper()]
        if key in out:
            raise ConfigError(f"mobilebert student shape {spec!r} gives {m.group(2).upper()} twice; name each size "
                              f"once")
        out[key] = int(m.group(1))
    for key, default in (("num_hidden_layers", teacher_layers), ("hidden_size", teacher_hidden)):
        if key not in out:
            if default is None:
                raise ConfigError(f"mobilebert student shape {spec!r} needs <n>L and <n>H (e.g. 24L-512H)")
            out[key] = default
    if min(out.values()) < 1:
        raise ConfigError(f"mobilebert student shape {spec!r}: every size must be ≥ 1")
    b = out.setdefault("intra_bottleneck_size", max(1, out["hidden_size"] // 4))
    if "num_attention_heads" not in out:
        out["num_attention_heads"] = teacher_heads if teacher_heads and b % teacher_heads == 0 else 4
    out.setdefault("intermediate_size", min(4 * b, out["hidden_size"]))
    out.setdefault("num_feedforward_networks", 4)
    out.setdefault("embedding_size", b)
    if b % out["num_attention_heads"]:
        raise ConfigError(f"mobilebert student shape {spec!r}: {out['num_attention_heads']} heads do not divide "
                          f"the bottleneck width {b}; pick a head count that divides it (e.g. "
                          f"{next(a for a in (4, 2, 1) if b % a == 0)}A)")
    return out


def parse_layers(spec: str, teacher_layers: int) -> list:
    """``"layers:0,2,4"`` → [0, 2, 4], validated against the teacher depth (0-based block indices, strictly
    increasing: the student keeps the teacher's block order, as DistilBERT and BERT-PKD do)."""
    body = spec.split(":", 1)[1]
    parts = [x.strip() for x in body.split(",")] if body.strip() else []
    if not all(parts):
        raise ConfigError(f"student {spec!r} has an empty entry; write teacher block indices like layers:0,2,4")
    try:
        idx = [int(x) for x in parts]
    except ValueError:
        raise ConfigError(f"student {spec!r}: write teacher block indices like layers:0,2,4") from None
    if not idx:
        raise ConfigError(f"student {spec!r} names no layers; write e.g. layers:0,2,4")
    bad = [i for i in idx if not 0 <= i < teacher_layers]
    if bad:
        raise ConfigError(f"student {spec!r}: layer {bad[0]} does not exist; the teacher has blocks "
                          f"0…{teacher_layers - 1}")
    if any(b <= a for a, b in zip(idx, idx[1:])):
        raise ConfigError(f"student {spec!r}: list the teacher blocks once each, in increasing order "
                          f"(e.g. layers:0,2,4)")
    return idx


def student_config(teacher_config: ModelConfig, shape: dict, **overrides) -> ModelConfig:
    """The teacher's config with the student's sizes (per-layer pruning lists cleared)."""
    kw = dict(shape, layer_num_heads=None, layer_intermediate_sizes=None, **overrides)
    if teacher_config.model_type != "albert":
        kw["embedding_size"] = None  # = hidden size
    return teacher_config.replace(**kw)


def cross_family_config(teacher_config: ModelConfig, family: str, shape: dict, **overrides) -> ModelConfig:
    """A student config of ``family`` with ``shape`` on the teacher's vocabulary, padding id, positions and
    task labels; the family's own defaults for the rest (ModernBERT: no segments, no pooler, LayerNorm ε
    1e-5, no dropout, global attention every 3 layers from layer 0, a 128-token local window).

    Raises:
        ConfigError: an unknown family."""
    from ..config import FAMILIES
    if family not in FAMILIES:
        raise ConfigError(f"student family {family!r} is not one of {', '.join(FAMILIES)}; write e.g. "
                          f"--student modernbert:4L-256H-4A-384I")
    tc = teacher_config
    kw = dict(model_type=family, vocab_size=tc.vocab_size, pad_token_id=tc.pad_token_id,
              max_position_embeddings=tc.max_position_embeddings, num_labels=tc.num_labels,
              id2label=tc.id2label, problem_type=tc.problem_type, initializer_range=tc.initializer_range)
    if family == "mobilebert":  # MobileBERT's own: NoNorm, ReLU, no hidden dropout, trigram embeddings
        kw.update(type_vocab_size=max(1, tc.type_vocab_size), hidden_act="relu", normalization_type="no_norm",
                  hidden_dropout_prob=0.0, trigram_input=True, use_bottleneck=True,
                  key_query_shared_bottleneck=True)
    if family == "modernbert":
        kw.update(type_vocab_size=0, add_pooling_layer=False, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)
    if family == "roberta":
        kw["max_position_embeddings"] = tc.max_position_embeddings + tc.pad_token_id + 1
    if family == "mpnet":  # positions from 2 (its padding index is 1), no segments
        kw.update(max_position_embeddings=tc.max_position_embeddings + 2, type_vocab_size=0)
    kw.update(shape)
    kw.update(overrides)
    return ModelConfig(**kw)


def copy_layers(teacher: TaskModel, layers: list, head: Optional[str] = None, **overrides) -> TaskModel:
    """A student made of the teacher's blocks ``layers`` + embeddings + pooler (+ head when ``head`` is
    the teacher's and shapes agree). Weights are copied (not shared)."""
    tc = teacher.config
    lnh = [tc.heads_of(i) for i in layers] if tc.layer_num_heads else None
    lis = [tc.intermediate_of(i) for i in layers] if tc.layer_intermediate_sizes else None
    meta = dict(tc.bertforge or {})
    if meta.get("pruned_heads"):  # the removed heads by the student's own layer numbers (MPNet's shared bias reads it)
        meta["pruned_heads"] = {str(j): meta["pruned_heads"][str(i)] for j, i in enumerate(layers)
                                if meta["pruned_heads"].get(str(i))}
    cfg = tc.replace(num_hidden_layers=len(layers), layer_num_heads=lnh, layer_intermediate_sizes=lis,
                     bertforge=meta, **overrides)
    head = head or teacher.head_name
    student = TaskModel(cfg, head=head)
    te, se = teacher.encoder, student.encoder
    with torch.no_grad():
        se.embeddings.load_state_dict(te.embeddings.state_dict())
        if getattr(se, "relative_attention_bias", None) is not None:  # MPNet: the one position-bias table all layers share
            se.relative_attention_bias.load_state_dict(te.relative_attention_bias.state_dict())
        for j, i in enumerate(layers):
            se.layers[j].load_state_dict(te.layers[i].state_dict())
        if se.pooler is not None and te.pooler is not None:
            se.pooler.load_state_dict(te.pooler.state_dict())
        if student.head is not None and teacher.head is not None and head == teacher.head_name:
            own = student.head.state_dict()
            src = teacher.head.state_dict()
            if all(k in src and src[k].shape == v.shape for k, v in own.items()):
                student.head.load_state_dict(src)
    if student.head is not None:
        student.head.tie_weights(student.encoder)
    return student


def estimate_parameters(cfg: ModelConfig) -> int:
    """The parameter count of ``cfg``'s encoder from its sizes alone, without building it: the weight matrices
    of the embeddings, attention and FFNs (MobileBERT: its bottlenecks and stacked FFNs); biases and norms left
    out. Cheap for any size (a guard, not an exact count)."""
    L, h, i = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    if cfg.model_type == "mobilebert" and getattr(cfg, "use_bottleneck", True):
        b, f = cfg.intra_bottleneck_size, cfg.num_feedforward_networks or 1
        per_layer = 2 * h * b + 4 * b * b + f * 2 * b * i
        emb = 3 * (cfg.embedding_size or h) * h if getattr(cfg, "trigram_input", False) else 0  # the 3-token conv
    else:
        per_layer, emb = 4 * h * h + 2 * h * i, 0
    return L * per_layer + emb + cfg.vocab_size * (cfg.embedding_size or h) + cfg.max_position_embeddings * h


def check_fits_in_memory(spec: str, cfg: ModelConfig) -> None:
    """Refuse a student shape whose training state cannot fit this machine's memory, before a single tensor is
    allocated (a typo like ``99999999999L`` would otherwise build layers until the host swaps): 16 bytes per
    parameter of :func:`estimate_parameters` (FP32 weights, gradients and AdamW's two moments) against the
    physical memory.

    Raises:
        ConfigError: the estimate exceeds the machine's physical memory."""
    params = estimate_parameters(cfg)
    need = 16 * params
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX host: no check
        return
    if need > have:
        raise ConfigError(f"student shape {spec!r} has about {params / 1e9:.3g}B parameters: training it needs about "
                          f"{need / 2**30:,.0f} GiB (FP32 weights, gradients and AdamW's two moments), more than "
                          f"this machine's {have / 2**30:.0f} GiB; pick smaller sizes")


def build_student(spec: str, teacher: TaskModel, head: str = "base", head_config: Optional[dict] = None,
                  teacher_dir: Optional[str] = None, notes: bool = True) -> TaskModel:
    """Make the student named by ``spec`` (shape, ``layers:…`` or a checkpoint dir); see module doc.
    ``notes``: :func:`bertforge.checkpoint.read.load_pretrained`'s notes on a head that starts fresh (off when a
    checkpoint replaces the weights next: ``--resume``).

    Raises:
        ConfigError: malformed spec; CheckpointError: a dir that cannot be loaded.
    """
    head_config = dict(head_config or {})
    spec = str(spec).strip()
    record: dict = {"spec": spec, "teacher": str(teacher_dir) if teacher_dir else None}
    if Path(spec).is_dir():
        student = load_pretrained(spec, head=head, notes=notes, **head_config)
        prev = dict(student.config.bertforge.get("student") or {})
        record = {**prev, "from_dir": spec}
    elif ":" in spec and not spec.lower().startswith("layers:"):  # FAMILY:SHAPE, another family's student
        family, shape_spec = spec.split(":", 1)
        family = family.strip().lower()
        tc = teacher.config
        shape = parse_mobilebert_shape(shape_spec, tc.hidden_size, tc.num_attention_heads, tc.num_hidden_layers) \
            if family == "mobilebert" else parse_shape(shape_spec)
        cfg = cross_family_config(teacher.config, family, shape, **head_config)
        check_fits_in_memory(spec, cfg)
        student = TaskModel(cfg, head=head)
        record.update(shape=shape, family=cfg.model_type)
        te, se = teacher.encoder.embeddings, student.encoder.embeddings
        tw, sw = te.word_embeddings.weight, se.word_embeddings.weight
        if tw.shape == sw.shape:  # same vocabulary and width: start from the teacher's token embeddings
            with torch.no_grad():
                sw.copy_(tw)
            record["token_embeddings"] = "teacher"
            if family == "mobilebert":  # positions and segments too, where the teacher's are of the same shape
                for name in ("position_embeddings", "token_type_embeddings"):
                    t, s = getattr(te, name, None), getattr(se, name, None)
                    if t is not None and s is not None and t.weight.shape == s.weight.shape:
                        with torch.no_grad():
                            s.weight.copy_(t.weight)
                        record[name] = "teacher"
    elif spec.lower().startswith("layers:"):
        layers = parse_layers(spec, teacher.config.num_hidden_layers)
        student = copy_layers(teacher, layers, head=head, **head_config)
        record["layers"] = layers
    else:
        shape = parse_shape(spec)
        cfg = student_config(teacher.config, shape, **head_config)
        check_fits_in_memory(spec, cfg)
        student = TaskModel(cfg, head=head)
        record["shape"] = shape
    # the teacher's task record and tuned thresholds (multi-label) are not the student's
    bf = {k: v for k, v in student.config.bertforge.items() if k not in ("task", "max_seq_len", "thresholds")}
    student.config.bertforge = {**bf, "student": record}
    return student
