"""The files of a model dir, read and written without torch: ``config.json`` and its ``bertforge`` section, the
weight files a dir holds (FP32 shards, the PyTorch INT8 file, ONNX graphs, a static table), and the
sentence-transformers layout (``modules.json``, ``1_Pooling/``, ``sentence_bert_config.json``,
``config_sentence_transformers.json``).

This is the one module that knows file names and the ``bertforge`` section's key; everything above reads a dir
through :class:`bertforge.checkpoint.modeldir.ModelDir`, which calls these readers once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import CheckpointError

CONFIG_FILE = "config.json"
#: the key of bertforge's own section in ``config.json`` (task, labels' thresholds, max length, recipe notes …)
META_KEY = "bertforge"
#: the weights of ``quantize --backend torch`` (torch.ao dynamic INT8 Linear layers + FP32 rest)
INT8_FILE = "model.int8.safetensors"
#: the record of ``quantize --bits`` beside its ``model.onnx`` (bits per layer, true and file sizes, Hessian
#: sensitivities, round-to-nearest beside the result): its presence makes a dir's format ``low-bit``
LOWBIT_RECORD = "lowbit.json"
#: ``model_type`` of a static embedding dir (one token table, mean pooling; ``distill --method static``)
STATIC_MODEL_TYPE = "static"
#: the index files ``transformers`` writes beside the shards of a checkpoint saved in pieces
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: how the ``model_type`` of a dir only bertforge computes right begins (``bertforge-mean-pooled-bert``: a sequence
#: head on a pooling ``transformers``' class for it does not read; the family is in the ``bertforge`` section's
#: ``family``): ``transformers`` knows no such type, so its Auto classes refuse the dir instead of loading it
#: into another function (:func:`bertforge.checkpoint.write.config_to_hf`)
BERTFORGE_MODEL_TYPE = "bertforge-"


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``; {} for a missing, unreadable or non-object file (optional files)."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def read_config(path) -> dict:
    """The ``config.json`` of checkpoint dir ``path`` as a dict. Raises CheckpointError, in one line saying
    what to pass instead, for a missing dir, a file, a dir without ``config.json`` (a run that stopped before
    its final model) and a file that is not a JSON object."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"model directory {path} does not exist; pass a checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file, not a checkpoint directory; pass the folder that "
                              "holds config.json")
    cfg = path / CONFIG_FILE
    if not cfg.is_file():
        steps = sorted((d for d in (path / "checkpoints").glob("step-*") if d.name[5:].isdigit()),
                       key=lambda d: int(d.name[5:])) if (path / "checkpoints").is_dir() else []
        if steps:
            raise CheckpointError(f"{path} holds checkpoints but no final model (the run stopped early); finish "
                                  f"it by re-running its command with --resume, or pass {steps[-1]}")
        if (path / "manifest.json").is_file():
            raise CheckpointError(f"{path} is a bundle (manifest.json), not a checkpoint: run it with bertforge_lite "
                                  f"(`python -m bertforge_lite {path} \"text\"`), or pass the dir it was bundled from")
        raise CheckpointError(f"{path} has no config.json; pass a checkpoint directory written by "
                              "transformers or bertforge")
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{cfg} is not valid JSON ({type(e).__name__}: {str(e)[:80]}); restore or re-save "
                              f"it") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{cfg} holds a JSON {type(data).__name__}, not an object of model settings; "
                              f"restore or re-save it")
    return data


# --------------------------------------------------------------------------- bertforge's own section
def meta_section(cfg: dict) -> dict:
    """A copy of the ``bertforge`` section of a ``config.json`` dict ({} when absent or not an object)."""
    m = cfg.get(META_KEY) if isinstance(cfg, dict) else None
    return dict(m) if isinstance(m, dict) else {}


def with_meta(cfg: dict, **fields) -> dict:
    """A copy of ``cfg`` whose ``bertforge`` section has ``fields`` set (the other keys kept)."""
    return {**cfg, META_KEY: {**meta_section(cfg), **fields}}


# --------------------------------------------------------------------------- what weights a dir holds
def shard_index(path: Path):
    """``(index file, weight_map)`` of a sharded checkpoint dir (the first of :data:`SHARD_INDEXES` there),
    else None. Raises CheckpointError for an index without a ``weight_map``."""
    index = next((path / n for n in SHARD_INDEXES if (path / n).is_file()), None)
    if index is None:
        return None
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        if not all(isinstance(v, str) for v in weight_map.values()):  # names must be strings
            raise TypeError("a shard name that is not a string")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise CheckpointError(f"{index} is not a shard index with a weight_map ({type(e).__name__}); "
                              f"re-save the checkpoint") from None
    return index, weight_map


def weight_files(path: Path) -> list:
    """The files that hold a checkpoint dir's FP32 weights, as :func:`bertforge.checkpoint.read.read_state_dict`
    reads them: ``[model.safetensors]`` or ``[pytorch_model.bin]``, else the shards a ``*.index.json`` lists
    (each checked to be a file beside it); [] when there are none.
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


def deployed_format(path: Path) -> Optional[tuple]:
    """``(what, bench backend)`` when ``path`` holds a ``bertforge export``/``quantize`` output instead of
    FP32 weights — ``("an ONNX graph (model.onnx)", "onnxruntime")`` or ``("a PyTorch INT8 model
    (model.int8.safetensors)", "torch")`` — else None."""
    path = Path(path)
    if is_lowbit_dir(path):
        return "a low-bit ONNX graph (model.onnx, lowbit.json)", "onnxruntime"
    if (path / "model.onnx").is_file():
        return "an ONNX graph (model.onnx)", "onnxruntime"
    if (path / INT8_FILE).is_file():
        return "a PyTorch INT8 model (model.int8.safetensors)", "torch"
    return None


def find_graph(path: Path) -> Optional[Path]:
    """The ``.onnx`` file ``path`` names: itself, a dir's ``model.onnx``, or the one ``.onnx`` file of a dir
    without FP32 weights; None when there is none. Raises CheckpointError for a dir with several."""
    path = Path(path)
    if path.is_file():
        return path if path.suffix == ".onnx" else None
    if (path / "model.onnx").is_file():
        return path / "model.onnx"
    if not path.is_dir() or weight_files(path):
        return None
    graphs = sorted(path.glob("*.onnx"))
    if len(graphs) > 1:
        raise CheckpointError(f"{path} holds several .onnx files ({', '.join(g.name for g in graphs)}); "
                              f"pass one of them")
    return graphs[0] if graphs else None


def model_family(cfg: dict):
    """The model family of a ``config.json`` dict: its ``model_type`` (``bert``, ``modernbert``, ``static`` …),
    or, for a dir written for bertforge alone (``model_type`` ``bertforge-…``, :data:`BERTFORGE_MODEL_TYPE`),
    the family its ``bertforge`` section records (``family``). None when the dict says neither."""
    t = cfg.get("model_type") if isinstance(cfg, dict) else None
    if isinstance(t, str) and t.startswith(BERTFORGE_MODEL_TYPE):
        fam = meta_section(cfg).get("family")
        return fam if isinstance(fam, str) and fam else t
    return t if isinstance(t, str) else None


def token_positions(cfg: dict) -> int:
    """Token positions a checkpoint's ``config.json`` dict can embed: ``max_position_embeddings`` (512 when
    absent), minus, for RoBERTa, the pad_token_id + 1 positions below its first (2 with the usual pad id 1),
    for MPNet the 2 below its first (its padding id is always 1)."""
    n = cfg.get("max_position_embeddings", 512)
    if model_family(cfg) == "mpnet":
        n -= 2
    if model_family(cfg) == "roberta":
        pad = cfg.get("pad_token_id")
        n -= (pad if isinstance(pad, int) and pad >= 0 else 1) + 1
    return n


def is_static_config(cfg: dict) -> bool:
    """Whether a ``config.json`` dict describes a static embedding model."""
    return isinstance(cfg, dict) and cfg.get("model_type") == STATIC_MODEL_TYPE


def is_static_dir(path) -> bool:
    """Whether ``path`` is a dir whose ``config.json`` says ``model_type: "static"`` (False for anything
    unreadable: the caller's own loader reports that)."""
    return is_static_config(read_json_object(Path(path) / CONFIG_FILE))


def is_lowbit_dir(path) -> bool:
    """Whether ``path`` holds the low-bit graph of ``quantize --bits``: ``model.onnx`` with ``lowbit.json``
    beside it."""
    return (Path(path) / LOWBIT_RECORD).is_file() and (Path(path) / "model.onnx").is_file()


def is_quantized_dir(path) -> bool:
    """Whether ``path`` holds the PyTorch INT8 weights of ``quantize --backend torch``."""
    return (Path(path) / INT8_FILE).is_file()


# ------------------------------------------------------------------- the sentence-transformers layout
#: the pooling modes, in the order sentence-transformers' ``1_Pooling/config.json`` lists them
POOLING_MODES = ("mean", "cls", "max")
#: the ``1_Pooling/config.json`` key of each mode (sentence-transformers' ``models.Pooling``)
_ST_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}
_ST_TRANSFORMER = "sentence_transformers.models.Transformer"
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
#: sentence-transformers' model settings file (``truncate_dim``: the dimension a Matryoshka model serves)
ST_MODEL_CONFIG = "config_sentence_transformers.json"


def check_pooling_mode(mode: str) -> None:
    """ValueError for a pooling mode not in :data:`POOLING_MODES`."""
    if mode not in POOLING_MODES:
        raise ValueError(f"unknown pooling {mode!r}; choose one of {', '.join(POOLING_MODES)}")


@dataclass(frozen=True)
class Pooling:
    """How a dir's token states become one sentence vector: ``mode`` (mean / cls / max), ``normalize``
    (L2 to unit length), ``max_seq_length`` (tokens the model was trained to embed; None: its positions),
    and ``declared`` (whether the dir says so, rather than the default ``mean``, not normalised)."""

    mode: str = "mean"
    normalize: bool = False
    max_seq_length: Optional[int] = None
    declared: bool = False


def read_pooling(model_dir) -> Pooling:
    """The pooling a model dir declares, in the sentence-transformers layout: ``1_Pooling/config.json``
    (mode; ``pooling_mode_mean_sqrt_len_tokens`` and weighted modes are read as mean), a
    ``sentence_transformers.models.Normalize`` entry in ``modules.json`` (normalize) and
    ``sentence_bert_config.json`` (``max_seq_length``). A dir without them (any plain HF checkpoint, an
    ``.onnx`` file's folder) gives ``Pooling("mean", False)``: Sentence-BERT's default (Reimers & Gurevych
    2019, §3). ``model_dir`` may be a file: its folder is read. Never raises for a missing/garbled file."""
    d = Path(model_dir)
    d = d.parent if d.is_file() else d
    modules = []
    try:
        m = json.loads((d / "modules.json").read_text(encoding="utf-8"))
        modules = m if isinstance(m, list) else []
    except (OSError, ValueError):
        pass
    pool_path = next((str(x.get("path") or "1_Pooling") for x in modules
                      if isinstance(x, dict) and x.get("type") == _ST_POOLING), "1_Pooling")
    cfg = read_json_object(d / pool_path / CONFIG_FILE)
    mode = "mean"
    if cfg.get("pooling_mode_cls_token") and not cfg.get("pooling_mode_mean_tokens"):
        mode = "cls"
    elif cfg.get("pooling_mode_max_tokens") and not cfg.get("pooling_mode_mean_tokens"):
        mode = "max"
    normalize = any(isinstance(x, dict) and x.get("type") == _ST_NORMALIZE for x in modules)
    st = read_json_object(d / "sentence_bert_config.json")
    msl = st.get("max_seq_length")
    msl = msl if isinstance(msl, int) and not isinstance(msl, bool) and msl > 0 else None
    return Pooling(mode, normalize, msl, declared=bool(cfg) or bool(modules))


def write_pooling(model_dir, mode: str = "mean", normalize: bool = False, hidden_size: Optional[int] = None,
                  max_seq_length: Optional[int] = None, do_lower_case: bool = False) -> None:
    """Write the sentence-transformers layout into an HF checkpoint dir (``config.json`` +
    ``model.safetensors`` + tokenizer already there): ``modules.json`` (Transformer → Pooling
    [→ Normalize]), ``1_Pooling/config.json``, ``sentence_bert_config.json`` and, with ``normalize``,
    ``2_Normalize/``. ``SentenceTransformer(model_dir)`` then loads it and gives the vectors
    :func:`read_pooling` + :func:`bertforge.models.pooling.pool` give. ``hidden_size``: the vector width
    (default: ``hidden_size`` of ``config.json``). Files are written atomically. Raises ValueError for an
    unknown ``mode``."""
    from ..io import atomic_write_text
    check_pooling_mode(mode)
    d = Path(model_dir)
    if hidden_size is None:
        hidden_size = read_json_object(d / CONFIG_FILE).get("hidden_size")
    modules = [{"idx": 0, "name": "0", "path": "", "type": _ST_TRANSFORMER},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST_POOLING}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _ST_NORMALIZE})
        (d / "2_Normalize").mkdir(parents=True, exist_ok=True)
    (d / "1_Pooling").mkdir(parents=True, exist_ok=True)
    cfg = {"word_embedding_dimension": hidden_size,
           **{k: (m == mode) for m, k in _ST_KEYS.items()},
           "pooling_mode_mean_sqrt_len_tokens": False}
    atomic_write_text(d / "1_Pooling" / CONFIG_FILE, json.dumps(cfg, indent=2))
    st = {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case}
    if max_seq_length is None:
        st.pop("max_seq_length")
    atomic_write_text(d / "sentence_bert_config.json", json.dumps(st, indent=2))
    atomic_write_text(d / "modules.json", json.dumps(modules, indent=2))


def carry_pooling(src_dir, dst_dir) -> bool:
    """Write the pooling ``src_dir`` declares into ``dst_dir`` (an export, a quantized copy of the same model),
    so that the copy embeds as the original does. Returns whether there was one to carry."""
    p = read_pooling(src_dir)
    if not p.declared:
        return False
    write_pooling(dst_dir, p.mode, p.normalize, max_seq_length=p.max_seq_length)
    return True


#: the sentence-transformers files that declare how a dir embeds (besides ``config.json``'s own section)
ST_DECLARATIONS = ("modules.json", "sentence_bert_config.json", ST_MODEL_CONFIG)


def carry_declarations(src_dir, dst_dir, hidden_size: Optional[int] = None) -> list:
    """Copy everything ``src_dir`` declares about how it embeds into ``dst_dir`` (an export, a quantized or
    pruned copy of the same model, or a student distilled from it), whole: ``modules.json``,
    ``sentence_bert_config.json`` (max length), ``config_sentence_transformers.json`` (``truncate_dim``,
    prompts, similarity function) and the settings files of the modules ``modules.json`` lists
    (``1_Pooling/config.json``, ``2_Normalize/`` …) — so a key added later travels with no change to the steps.
    The transformer's own files (weights, ``config.json``, tokenizer) are the caller's.

    ``hidden_size``: the width of ``dst_dir``'s model when it differs from the source's (a distilled student):
    the pooling's ``word_embedding_dimension`` is rewritten to it, and a ``truncate_dim`` wider than it is
    dropped (a vector cannot be cut to more coordinates than it has). Returns the relative paths written.
    Files are written atomically."""
    from ..io import atomic_write_text
    src, dst = Path(src_dir), Path(dst_dir)
    src = src.parent if src.is_file() else src
    written = []
    for name in ST_DECLARATIONS:
        if (src / name).is_file():
            text = (src / name).read_text(encoding="utf-8")
            if name == ST_MODEL_CONFIG and hidden_size is not None:
                text = _fit_truncate_dim(text, hidden_size)
            atomic_write_text(dst / name, text)
            written.append(name)
    modules = []
    try:
        m = json.loads((src / "modules.json").read_text(encoding="utf-8"))
        modules = m if isinstance(m, list) else []
    except (OSError, ValueError):
        pass
    for mod in modules:
        sub = str(mod.get("path") or "") if isinstance(mod, dict) else ""
        if not sub or Path(sub).is_absolute() or ".." in Path(sub).parts or not (src / sub).is_dir():
            continue  # the transformer itself (path ""), or nothing to copy
        (dst / sub).mkdir(parents=True, exist_ok=True)
        for f in sorted((src / sub).glob("*.json")):
            text = f.read_text(encoding="utf-8")
            if hidden_size is not None and f.name == CONFIG_FILE:
                text = _with_key(text, "word_embedding_dimension", int(hidden_size))
            atomic_write_text(dst / sub / f.name, text)
            written.append(f"{sub}/{f.name}")
    return written


def _with_key(text: str, key: str, value) -> str:
    """``text`` (a JSON object) with ``key`` set to ``value`` where the object has that key."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text
    if isinstance(obj, dict) and key in obj:
        obj[key] = value
        return json.dumps(obj, indent=2)
    return text


def _fit_truncate_dim(text: str, hidden_size: int) -> str:
    """``config_sentence_transformers.json`` text without a ``truncate_dim`` wider than ``hidden_size``."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text
    if isinstance(obj, dict) and isinstance(obj.get("truncate_dim"), int) and obj["truncate_dim"] > hidden_size:
        import warnings
        warnings.warn(f"truncate_dim {obj['truncate_dim']} is wider than the new model's {hidden_size} "
                      f"dimensions; the copy serves all {hidden_size}", stacklevel=3)
        obj.pop("truncate_dim")
        return json.dumps(obj, indent=2)
    return text


def write_truncate_dim(model_dir, dim: int) -> None:
    """Record in ``model_dir`` that its vectors are served cut to their first ``dim`` coordinates (a
    Matryoshka model, Kusupati et al. 2022): ``truncate_dim`` in ``config_sentence_transformers.json``, which
    ``SentenceTransformer(model_dir)`` applies; other keys of that file are kept. Written atomically."""
    from ..io import atomic_write_text
    d = Path(model_dir)
    cfg = read_json_object(d / ST_MODEL_CONFIG)
    cfg["truncate_dim"] = int(dim)
    atomic_write_text(d / ST_MODEL_CONFIG, json.dumps(cfg, indent=2))


def read_truncate_dim(model_dir) -> Optional[int]:
    """The ``truncate_dim`` a dir records (:func:`write_truncate_dim`), or None."""
    d = Path(model_dir)
    v = read_json_object((d.parent if d.is_file() else d) / ST_MODEL_CONFIG).get("truncate_dim")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


@dataclass(frozen=True)
class Prompts:
    """The prompts a sentence-transformers dir declares in ``config_sentence_transformers.json``: ``prompts``
    (name → the text put before every input, e.g. ``{"query": "query: "}``) and ``default_prompt_name`` (the
    one used when a caller names none; None: no prompt). ``SentenceTransformer.encode(prompt_name=…)`` and
    text-embeddings-inference's ``prompt_name`` read the same two keys."""

    prompts: dict = field(default_factory=dict)
    default_prompt_name: Optional[str] = None

    def text(self, name: Optional[str] = None) -> str:
        """The prompt text of ``name`` (None: the default prompt's, or "" without one). Raises KeyError for a
        name the dir does not declare."""
        if name is None:
            return self.prompts[self.default_prompt_name] if self.default_prompt_name else ""
        return self.prompts[name]


def read_prompts(model_dir) -> Prompts:
    """The :class:`Prompts` of ``config_sentence_transformers.json`` in ``model_dir`` (a file: its folder);
    ``Prompts()`` when the file is missing or no JSON object.

    Raises:
        CheckpointError: ``prompts`` is not an object of texts, or ``default_prompt_name`` is not a name in it
            (what sentence-transformers refuses at load too)."""
    d = Path(model_dir)
    f = (d.parent if d.is_file() else d) / ST_MODEL_CONFIG
    cfg = read_json_object(f)
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in prompts.items()):
        raise CheckpointError(f"{f}: 'prompts' must be an object of name → prompt text; fix or remove it")
    default = cfg.get("default_prompt_name")
    if default is not None and (not isinstance(default, str) or default not in prompts):
        names = ", ".join(map(repr, prompts)) or "none"
        raise CheckpointError(f"{f}: default_prompt_name {json.dumps(default)[:60]} is not one of its prompts "
                              f"({names}); fix it or remove the key")
    return Prompts(dict(prompts), default)


__all__ = ["CONFIG_FILE", "META_KEY", "BERTFORGE_MODEL_TYPE", "model_family", "INT8_FILE", "STATIC_MODEL_TYPE",
           "SHARD_INDEXES", "read_json_object",
           "read_config", "meta_section", "with_meta", "shard_index", "weight_files", "deployed_format",
           "find_graph", "is_static_config", "is_static_dir", "is_quantized_dir", "is_lowbit_dir", "LOWBIT_RECORD", "POOLING_MODES", "Pooling",
           "check_pooling_mode", "read_pooling", "write_pooling", "carry_pooling", "write_truncate_dim",
           "read_truncate_dim", "Prompts", "read_prompts", "ST_MODEL_CONFIG", "token_positions", "carry_declarations", "ST_DECLARATIONS"]
