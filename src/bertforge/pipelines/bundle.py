"""``bertforge bundle``: one torch-free folder that turns text into the final answer (:func:`bundle`), and
its check (:func:`verify`).

    >>> import bertforge
    >>> r = bertforge.bundle({"student": "runs/student-int8"}, "runs/student-bundle")
    >>> bertforge.bundle_verify("runs/student-bundle")

Each model dir becomes a standard-ONNX graph whose outputs are the answers (pooled, truncated and normalised
vectors; probabilities, labels and thresholded labels; NER tags and their scores; QA start / end scores:
:mod:`bertforge.compress.bundle_graph`), its tokenizer and a manifest entry with golden inputs and the
outputs they gave (:mod:`bertforge.compress.bundle_manifest`). The outputs are checked against bertforge's
own runner on the source dir before anything is written (``parity`` in the manifest). ``bertforge_lite``
(``lite/``) and the page in ``web/`` run a bundle without torch.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import BertforgeError, CheckpointError, ConfigError
from .rundir import RunDir

#: the golden inputs of a bundle: plain, accented, combining marks, CJK, emoji, zero-width, empty, and one
#: longer than any bundle's max length (it shows the truncation)
GOLDEN_TEXTS = ("The movie was great fun.", "Crème brûlée in Zürich, naïve café.", "e\u0301le\u0300ve",
                "東京で会いましょう。", "I love it 😀👍🏽", "zero\u200bwidth\u200cjoin\u200d", "",
                " ".join(["a long text that goes on"] * 120))
GOLDEN_QA = (("Who wrote it?", "It was written by Ada Lovelace in London."),
             ("Where?", "The meeting is in Paris on Monday."), ("", "An empty question."))
#: bertforge's runner vs the bundled graph at bundle time: FP32 sums re-ordered (the bundle's standard ops
#: vs the runner's kernels); an INT8 dir's graph rewritten from contrib ops may flip an activation's
#: quantization by one step (see bundle_manifest.TOLERANCE), so its bound is 10× wider
PARITY = {"fp32": 1e-4, "int8": 2e-2}


@dataclass
class BundleResult:
    """The bundle folder written and its manifest."""

    out: Path
    manifest: dict

    def __repr__(self) -> str:  # the manifest holds every golden output: too long to print whole
        models = ", ".join(f"{n}: {e['kind']} {e['precision']}" for n, e in self.manifest["models"].items())
        return f"BundleResult(out={str(self.out)!r}, models={{{models}}})"


@dataclass
class _Names:
    """The Python names of ``bundle``'s options, for its errors (:func:`~bertforge.pipelines.options.python_names`)."""
    out: str
    fused: bool
    overwrite: bool


def bundle(models, out, *, fused: bool = False, overwrite: bool = False) -> BundleResult:
    """Bundle ``models`` (a dir, or {name: dir}) into the folder ``out``.

    Raises:
        CheckpointError / ConfigError / BertforgeError: a dir that cannot be bundled (one line saying why),
            an ``out`` that exists without ``overwrite``; nothing is left in ``out`` then.
    """
    from .options import python_names
    with python_names(_Names):
        return bundle_with(models, out, fused=fused, overwrite=overwrite)


def bundle_with(models, out, *, fused: bool = False, overwrite: bool = False) -> BundleResult:
    """:func:`bundle` with errors worded for the command line (``--out``, ``--overwrite``): the verb's call."""
    from ..checkpoint.modeldir import ModelDir
    pairs = _named(models)
    opened = {name: ModelDir.open(d) for name, d in pairs.items()}
    run_dir = RunDir(out, inputs=tuple(md.path for md in opened.values()), overwrite=overwrite)
    from ..compress.bundle_manifest import MANIFEST, VERSION, file_hashes
    entries = {}
    with run_dir as work, tempfile.TemporaryDirectory(prefix="bertforge-bundle-") as scratch:
        for name, md in opened.items():
            entries[name] = _bundle_one(md, Path(work) / name, Path(scratch) / name, fused)
            entries[name] = {k: (f"{name}/{v}" if k in ("graph", "fused_graph", "tokenizer") and v else v)
                             for k, v in entries[name].items()}
        manifest = {"bundle": VERSION, "models": entries, "files": file_hashes(work)}
        (Path(work) / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False), encoding="utf-8")
    return BundleResult(Path(run_dir.out), manifest)


def verify(path, threads: int = 1) -> dict:
    """Re-check bundle ``path`` (hashes, golden inputs): {model: max |difference|}. Raises CheckpointError /
    BertforgeError in one line on the first difference (:func:`bertforge.compress.bundle_manifest.verify_bundle`)."""
    from ..compress.bundle_manifest import verify_bundle
    return verify_bundle(path, threads)


#: ``bertforge.bundle_verify``
bundle_verify = verify


def _named(models) -> dict:
    if isinstance(models, (str, Path)):
        models = [models]
    if isinstance(models, dict):
        pairs = {str(k): v for k, v in models.items()}
    else:
        pairs = {}
        for m in models:
            name, _, d = str(m).partition("=") if "=" in str(m) else ("", "", str(m))
            name = name or Path(d).name or "model"
            if name in pairs:
                raise ConfigError(f"two models are named {name!r} (a bundle holds each name once); name them: "
                                  f"--model a=DIR --model b=DIR")
            pairs[name] = d
    if not pairs:
        raise ConfigError("bundle needs at least one --model DIR")
    for name in pairs:
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"model name {name!r}: use letters, digits, '-', '_' or '.'")
    return pairs


def model_kind(md) -> str:
    """The bundle kind of a model dir: ``embedding`` for an encoder or a static table, else its head's kind.
    Raises CheckpointError for a head a bundle does not serve (masked-LM, pretraining heads …)."""
    from ..compress.bundle_graph import KINDS
    from ..runtime.base import head_kind
    if md.is_static:
        return "embedding"
    kind = head_kind(md.head, md.config)
    if kind == "base":
        return "embedding"
    if kind == "classification" and md.config.get("problem_type") == "multi_label_classification":
        return "multi_label"
    if kind not in KINDS:
        raise CheckpointError(f"cannot bundle {md.path}: its {kind} head is a training head; bundle an encoder "
                              f"or a classification, regression, NER or QA model")
    return kind


def _graphs(md, scratch: Path, fused: bool) -> tuple:
    """(standard-op source graph, fused source graph or None, its output name, precision) for ``md``."""
    if md.format in ("torch-int8", "low-bit", "bundle"):
        raise CheckpointError(f"cannot bundle {md.path}: it holds {md.describe()}; bundle its FP32 checkpoint or "
                              f"the INT8 dir of `bertforge quantize` (ONNX Runtime)")
    if md.is_static:
        if md.graph is not None:
            return md.graph, None, "last_hidden_state", "fp32"
        from ..compress.onnx import deploy_static
        from ..models.static import load_static
        deploy_static(load_static(md.path), scratch / "std", source_dir=md.path)
        return scratch / "std" / "model.onnx", None, "last_hidden_state", "fp32"
    if md.graph is not None:
        out = md.onnx_record.get("output") or ("last_hidden_state" if md.head in (None, "base") else "logits")
        return md.graph, (md.graph if fused else None), out, "int8" if md.is_int8 else "fp32"
    from ..checkpoint.read import load_pretrained
    from ..compress.onnx import deploy, output_name
    model = load_pretrained(md.path).eval()
    deploy(model, scratch / "std", source_dir=md.path, optimize=False, fused=False, check=True)
    if fused:
        deploy(model, scratch / "fused", source_dir=md.path, optimize=True, fused=True, check=True)
    return (scratch / "std" / "model.onnx", (scratch / "fused" / "model.onnx") if fused else None,
            output_name(model), "fp32")


def _bundle_one(md, dst: Path, scratch: Path, fused: bool) -> dict:
    from ..compress.bundle_graph import OUTPUTS, bundle_graph
    from ..compress.bundle_manifest import golden_outputs
    from ..compress.ort import session
    from ..runtime.base import INPUT_NAMES
    kind = model_kind(md)
    scratch.mkdir(parents=True)
    dst.mkdir(parents=True)
    src, fused_src, src_out, precision = _graphs(md, scratch, fused)
    labels = md.labels if kind not in ("embedding", "question_answering") else None
    thresholds = _thresholds(md, labels) if kind == "multi_label" else None
    pooling = ({"mode": md.pooling.mode, "normalize": bool(md.pooling.normalize),
                "truncate_dim": md.truncate_dim} if kind == "embedding" else None)
    if md.is_static and kind == "embedding":
        from ..checkpoint.modeldir import Meta
        pooling["normalize"] = bool(Meta.from_config(md.config).get("normalize", True))
    bundle_graph(src, dst / "model.onnx", kind, src_out, pooling=pooling, thresholds=thresholds)
    if fused_src is not None:
        bundle_graph(fused_src, dst / "model.fused.onnx", kind, src_out, pooling=pooling, thresholds=thresholds,
                     standard=False)
    tok = md.tokenizer()
    tok.save(str(dst / "tokenizer.json"))
    sess = session(dst / "model.onnx")
    inputs = [i.name for i in sess.get_inputs()]
    unknown = [i for i in inputs if i not in INPUT_NAMES]
    if unknown:
        raise CheckpointError(f"cannot bundle {md.path}: its graph takes {unknown[0]!r}; a bundle feeds "
                              f"{', '.join(INPUT_NAMES)}")
    max_length = min(md.max_seq_len or 256, md.positions) if md.positions else (md.max_seq_len or 256)
    entry = {"kind": kind, "source": md.path.name, "graph": "model.onnx",
             "fused_graph": "model.fused.onnx" if fused_src is not None else None, "tokenizer": "tokenizer.json",
             "inputs": inputs, "outputs": list(OUTPUTS[kind]), "max_length": int(max_length),
             "truncation": "longest_first, right; max_length counts the special tokens",
             "labels": labels, "thresholds": thresholds, "pooling": pooling, "precision": precision,
             "model_type": md.model_type or ("static" if md.is_static else None)}
    if kind == "token_classification":  # how the runtime cuts a text into words and reads a word's tag
        from ..tasks.ner import ner_settings
        entry["words"], entry["aggregation"] = ner_settings(md.meta.raw, str(md.path))
    golden_in = [list(p) for p in GOLDEN_QA] if kind == "question_answering" else list(GOLDEN_TEXTS)
    entry["golden"] = golden_outputs(sess, entry, tok, golden_in)
    entry["dim"] = len(entry["golden"][0]["outputs"]["sentence_embedding"]) if kind == "embedding" else None
    entry["parity"] = _parity(md, entry, kind)
    if precision == "int8":
        entry["int8_rounding"] = _activation_rounding(dst / "model.onnx", entry, tok)
    if entry["parity"] > PARITY[precision]:
        raise BertforgeError(f"cannot bundle {md.path}: the bundled graph differs from bertforge's runner by "
                             f"{entry['parity']:.2e} (> {PARITY[precision]:.0e}); please report this model")
    return entry


def _activation_rounding(graph: Path, entry: dict, tok) -> Optional[float]:
    """Max over the golden inputs and float outputs of |INT8 graph − the same graph with float activations|
    (:func:`bertforge.compress.bundle_graph.without_activation_rounding`): how far the activations' dynamic
    rounding moves this model's answers; another INT8 kernel that rounds some boundary values the other way
    stays within it (bundle_manifest.tolerance)."""
    import onnx
    import onnxruntime as ort
    from ..compress.bundle_graph import without_activation_rounding
    from ..compress.bundle_manifest import golden_outputs
    m = without_activation_rounding(onnx.load(str(graph)))
    if m is None:
        return None
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # the weights' quantized copies are left unused on purpose
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ref = golden_outputs(sess, entry, tok, [g["input"] for g in entry["golden"]])
    worst = 0.0
    for a, b in zip(entry["golden"], ref):
        for k, v in a["outputs"].items():
            x, y = np.asarray(v), np.asarray(b["outputs"][k])
            if x.dtype.kind == "f" and x.size:
                worst = max(worst, float(np.abs(x - y).max()))
    return worst


def _thresholds(md, labels) -> list:
    from ..tasks.multilabel import active_thresholds
    n = len(labels or ()) or int(md.config.get("num_labels") or 0)
    return [float(x) for x in active_thresholds(md.meta.thresholds, n)]


def _parity(md, entry: dict, kind: str) -> float:
    """Max |bundle golden output − bertforge's runner on the source dir| (embedding: the pooled vector of
    :class:`~bertforge.runtime.embedder.Embedder`; other kinds: the logits at the real tokens)."""
    from ..runtime.base import split_qa
    texts = [g["input"] for g in entry["golden"]]
    if kind == "embedding":
        from ..runtime.embedder import load_embedder
        ref = load_embedder(md.path).embed(texts, max_seq_len=entry["max_length"], batch_size=1)
        got = np.asarray([g["outputs"]["sentence_embedding"] for g in entry["golden"]])
        return float(np.abs(ref - got).max())
    from ..runtime import load_runner
    runner = load_runner(md.path)
    worst = 0.0
    for g in entry["golden"]:
        ids = np.asarray([g["input_ids"]], np.int64)
        am = np.ones_like(ids)
        tt = np.asarray([g["type_ids"]], np.int64) if "type_ids" in g else None
        out = runner(ids, am, tt, outputs=("logits",))
        if kind == "question_answering":
            out = split_qa(out)
            pairs = [("start_logits", out["start_logits"][0]), ("end_logits", out["end_logits"][0])]
        else:
            pairs = [("logits", out["logits"][0])]
        for name, ref in pairs:
            worst = max(worst, float(np.abs(np.asarray(g["outputs"][name]) - ref).max()))
    return worst


__all__ = ["BundleResult", "GOLDEN_TEXTS", "GOLDEN_QA", "bundle", "bundle_with", "verify", "bundle_verify", "model_kind"]
