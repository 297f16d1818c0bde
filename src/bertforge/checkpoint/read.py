"""Reading Hugging Face checkpoint directories: weight files, shards, hub names, and :func:`load_pretrained`.

A bertforge checkpoint *is* a ``transformers`` checkpoint dir: ``config.json`` (with ``model_type`` and
``architectures``), ``model.safetensors``, ``tokenizer.json`` + ``tokenizer_config.json``. The per-family
maps between our parameter names and Hugging Face's, the config translation and writing a dir
(``save_pretrained``) are in :mod:`bertforge.checkpoint.write`, below :class:`~bertforge.task_model.TaskModel`;
this module sits above it, since loading builds a model with the head a dir was saved with.

Loading accepts ``model.safetensors`` or ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``,
never unpickling code), base-model dirs (``BertModel``, keys without prefix) and task dirs
(``BertForSequenceClassification``, keys under ``bert.``). Weights are never pickled on save.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import torch

from ..errors import BertforgeError, CheckpointError, ConfigError
from ..heads import HEADS, MLM_HEAD, MLM_HEADS
from .modeldir import EMBEDDED, _head_from_arch, resolve_model_dir, saved_head_name  # noqa: F401
from .layout import (SHARD_INDEXES, deployed_format, read_config, shard_index, token_positions,  # noqa: F401
                     weight_files)
from ..task_model import TaskModel
from .write import PREFIX, config_from_hf, encoder_key_map

# ------------------------------------------------------------------------------------------ loading
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


def check_seq_len(seq_len, cfg: dict, flag: str = "--max-seq-len") -> None:
    """Raise :class:`ConfigError` when ``seq_len`` exceeds :func:`token_positions` of ``cfg`` (None passes)."""
    limit = token_positions(cfg)
    if seq_len is not None and seq_len > limit:
        raise ConfigError(f"{flag} {seq_len} exceeds the model's {limit} positions; pass {flag} {limit} or less")


def split_prefix(state: dict, fam: str) -> tuple[dict, dict]:
    """Split a state dict into (base-model keys without prefix, top-level head keys)."""
    p = PREFIX[fam] + "."
    base_roots = ("embeddings.", "encoder.", "pooler.", "transformer.", "embeddings_project.")
    if fam == "modernbert":  # a bare ModernBertModel: layers.* and final_norm.* at the top
        base_roots += ("layers.", "final_norm.")
    base, head = {}, {}
    for k, v in state.items():
        if k.startswith(p):
            base[k[len(p):]] = v
        elif k.startswith(base_roots):
            base[k] = v
        else:
            head[k] = v
    return base, head


def require_saved_head(cfg: dict, head: str, who: str, task: str, fix: str) -> None:
    """ConfigError unless the checkpoint of ``cfg`` (named ``who`` in the message) was saved with ``head``,
    the head ``task`` needs: loading it with another head would run freshly initialised weights."""
    has = saved_head_name(cfg)
    if has != head:
        what = f"a {has}" if has not in (None, "base") else "no task"
        raise ConfigError(f"{who} has {what} head but task {task} needs {head}; {fix}")


def load_pretrained(path, head: Optional[str] = None, strict_head: bool = False, notes: bool = True,
                    **config_overrides) -> TaskModel:
    """Load a HF/bertforge checkpoint dir into a :class:`TaskModel`.

    Args:
        path: checkpoint directory, or ``"minilm"`` (the embedded checkpoint).
        head: head name (``sequence_classification`` …); default: the head the dir was saved with, else
            ``base``. A head whose weights are absent (or of another label count) is freshly initialised,
            with a note on stderr (e.g. fine-tuning from a pretrained encoder).
        strict_head: raise instead of initialising the head fresh (evaluation of a trained head).
        notes: print the notes on what starts fresh or is dropped (head, pooler, layers) on stderr; False
            when other weights replace these next (a training run's ``--resume`` loads its checkpoint).
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
    if d.get("model_type") == "static":  # models.static.STATIC_MODEL_TYPE: a table, no encoder to build
        raise CheckpointError(f"{path} is a static embedding model (one table, no transformer); it embeds "
                              f"text (embed, embed-eval, retrieval-eval, export, bench, serve) but cannot be "
                              f"fine-tuned, distilled from or pruned; pass the transformer it came from")
    config = config_from_hf(d)
    state = read_state_dict(path)
    base, head_state = split_prefix(state, config.model_type)
    if "add_pooling_layer" not in d and config.model_type in ("bert", "roberta", "albert", "mobilebert", "mpnet"):
        config.add_pooling_layer = any(k.startswith("pooler") for k in base)
    saved_head = saved_head_name(d)
    if head is None and saved_head not in (None, "base") and _embedding_dir_without_head(path, saved_head, config,
                                                                                        head_state):
        head = "base"  # e.g. all-mpnet-base-v2: config.json says MPNetForMaskedLM, the dir holds the encoder only
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
    if config.num_hidden_layers < saved_layers and notes:
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
        same = head == saved_head or (head == MLM_HEAD and saved_head in MLM_HEADS)
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
    if fresh_head and notes:
        print(f"bertforge: {fresh_head[1]}", file=sys.stderr)
    _check_shapes(new_state, own, path)
    if model.encoder.pooler is not None and not config.add_pooling_layer and notes:
        print(f"bertforge: {path} has no pooler weights; the {head} head's pooler is initialised fresh",
              file=sys.stderr)
    model.load_state_dict(new_state, strict=False)
    if model.head is not None:
        model.head.tie_weights(model.encoder)
    model.source_dir = str(path)
    from ..models.pooling import read_pooling
    pooling = read_pooling(path)
    if pooling.declared:  # a sentence-transformers dir: its pooling travels with the model (saved again)
        model.pooling = pooling
    return model.eval()  # ready for inference, as transformers' from_pretrained; training calls .train()


def _embedding_dir_without_head(path: Path, saved_head: str, config, head_state: dict) -> bool:
    """Whether ``path`` is a sentence-transformers dir (a declared pooling) holding none of the weights of the
    head its ``config.json`` names: its model is the encoder, so it loads as ``base`` (no fresh head to run)."""
    from ..models.pooling import read_pooling
    keys = HEADS[saved_head].hf_keys(config) if saved_head in HEADS else {}
    return bool(keys) and not any(k in head_state for k in keys.values()) and read_pooling(path).declared


def _check_shapes(new_state: dict, own: dict, path) -> None:
    for k, v in new_state.items():
        if k in own and own[k].shape != v.shape:
            raise CheckpointError(f"{path}: weight {k} has shape {tuple(v.shape)} but the config gives "
                                  f"{tuple(own[k].shape)}; config.json and the weights disagree")


__all__ = ["load_pretrained", "read_config", "read_state_dict", "weight_files", "shard_index", "read_weight_file",
           "deployed_format", "token_positions", "check_seq_len", "saved_head_name", "require_saved_head",
           "resolve_model_dir", "split_prefix", "EMBEDDED", "MLM_HEADS", "config_from_hf"]
