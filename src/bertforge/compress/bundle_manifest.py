"""A bundle's ``manifest.json``: its models, the SHA-256 of every file, golden inputs and their outputs;
:func:`verify_bundle` checks a bundle against it (what ``bertforge bundle verify`` runs).

Layout of a bundle folder ``B`` (written by :func:`bertforge.pipelines.bundle.bundle`)::

    B/manifest.json              {"bundle": 1, "models": {NAME: {...}}, "files": {relpath: sha256}}
    B/NAME/model.onnx            standard ONNX operators only (bertforge.compress.bundle_graph)
    B/NAME/model.fused.onnx      (--fused) the x86 graph with ONNX Runtime contrib ops, same outputs
    B/NAME/tokenizer.json        the tokenizer, no truncation or padding set

A model entry: ``kind`` (:data:`bertforge.compress.bundle_graph.KINDS`), ``graph``, ``fused_graph``,
``tokenizer``, ``inputs``, ``outputs``, ``max_length`` (texts are truncated to it, special tokens included,
longest-first for pairs), ``labels``, ``thresholds``, ``pooling``, ``dim``, ``words`` and ``aggregation`` (NER:
how a text is cut into words — ``whitespace``, the CoNLL words — and how a word's tag comes from its subwords —
``first`` / ``average`` / ``max``; as the dir records them), ``precision`` (fp32 / int8),
``tolerance`` (the largest |difference| a re-run may show, see :func:`tolerance`), ``golden`` (inputs,
their token ids and the outputs this graph gave), ``parity`` (the largest difference from bertforge's own
runner on the source dir when it was bundled).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import BertforgeError, CheckpointError

MANIFEST = "manifest.json"
VERSION = 1
#: a re-run's allowed |difference| by precision. FP32: the sums of a graph in float32 re-ordered by another
#: kernel or thread count differ by a few ulp of the largest partial sum (~1e-6 relative for H ≤ 1024);
#: INT8: the int32 products are exact, but an activation within one float ulp of a rounding boundary of its
#: dynamic quantization (step s = range/255) can round the other way, moving an output by ≤ s·max|W| ·
#: s_W — ~1e-4 of the output's scale for BERT-size activations.
TOLERANCE = {"fp32": 1e-5, "int8": 1e-4}


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_hashes(root) -> dict:
    """{relative path: sha256} of every file under ``root`` but the manifest."""
    root = Path(root)
    return {str(p.relative_to(root).as_posix()): sha256(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != MANIFEST}


def tolerance(precision: str, reference: np.ndarray, rounding: Optional[float] = None) -> float:
    """The |difference| allowed for an output: :data:`TOLERANCE` times max(1, max|reference|) (relative for
    outputs larger than 1, such as logits). INT8 with ``rounding`` (the manifest's ``int8_rounding``: how far
    the activations' dynamic rounding moves this model's outputs on its golden inputs): at least that — another
    kernel (WASM, AVX2, VNNI) whose float sums differ by an ulp rounds some activations that sit on a step
    boundary to the other step, a part of that same rounding error."""
    ref = np.asarray(reference, dtype=np.float64)
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    bound = TOLERANCE[precision] * scale
    return max(bound, float(rounding)) if precision == "int8" and rounding else bound


def read_manifest(path) -> dict:
    """The manifest of the bundle folder ``path``. Raises CheckpointError when there is none."""
    f = Path(path) / MANIFEST
    try:
        m = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise CheckpointError(f"{path} is not a bundle (no readable {MANIFEST}); make one with "
                              f"`bertforge bundle --model DIR --out {path}`") from None
    if not isinstance(m, dict) or m.get("bundle") != VERSION:
        raise CheckpointError(f"{f} is not a bertforge bundle manifest (version {VERSION})")
    return m


#: the kinds of model a bundle holds (bundle_graph.KINDS) and the graph inputs it may feed
_KINDS = ("embedding", "classification", "multi_label", "regression", "token_classification", "question_answering")
_FEEDS = ("input_ids", "attention_mask", "token_type_ids")


def check_manifest(path, manifest: dict) -> None:
    """Raise CheckpointError naming the first model entry of ``manifest`` a bundle cannot hold: an unknown kind or
    precision, a graph or tokenizer outside the folder or not hashed in ``files``, a max_length that is no positive
    integer, unknown inputs, no outputs or golden inputs, a NER word rule or aggregation it does not know, golden
    vectors of another width than the declared ``dim`` / ``truncate_dim``. (The twin of
    ``bertforge_lite.bundle.check_manifest``: lite imports no bertforge.)"""
    models, files = manifest.get("models"), manifest.get("files")
    if not isinstance(models, dict) or not models or not isinstance(files, dict):
        raise CheckpointError(f"bundle {path}: the manifest has no models or no files table")
    for name, e in models.items():
        def bad(what):
            return CheckpointError(f"bundle {path}: model {name!r}: {what} (the manifest was edited or is damaged; "
                                   f"re-make the bundle)")
        if not isinstance(e, dict) or e.get("kind") not in _KINDS:
            raise bad(f"kind {e.get('kind') if isinstance(e, dict) else e!r} is none of {', '.join(_KINDS)}")
        for key in ("graph", "tokenizer"):
            rel = e.get(key)
            if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts or rel not in files:
                raise bad(f"{key} {rel!r} is not a file of the bundle listed in its files table")
        ml = e.get("max_length")
        if isinstance(ml, bool) or not isinstance(ml, int) or ml < 1:
            raise bad(f"max_length {ml!r} is not a positive integer")
        if not e.get("inputs") or not set(e["inputs"]) <= set(_FEEDS) or not e.get("outputs"):
            raise bad(f"inputs {e.get('inputs')!r} / outputs {e.get('outputs')!r} are not a graph's")
        if e.get("precision") not in TOLERANCE or not isinstance(e.get("golden"), list) or not e["golden"]:
            raise bad("no precision or no golden inputs")
        if e.get("words") not in (None, "whitespace", "punctuation") or \
                e.get("aggregation") not in (None, "first", "average", "max"):
            raise bad(f"words {e.get('words')!r} / aggregation {e.get('aggregation')!r} are none a runtime knows "
                      f"(whitespace, punctuation / first, average, max)")
        if e["kind"] == "embedding":
            want = [v for v in ((e.get("pooling") or {}).get("truncate_dim"), e.get("dim")) if v is not None]
            for g in e["golden"]:
                n = len(g.get("outputs", {}).get("sentence_embedding", []))
                if any(n != w for w in want):
                    raise bad(f"its golden vectors have {n} dimensions, its declared dim / truncate_dim {want}")


def check_hashes(path, manifest: dict) -> None:
    """Raise CheckpointError naming the first file that is missing, added or whose SHA-256 changed."""
    path = Path(path)
    want = manifest.get("files") or {}
    have = file_hashes(path)
    for rel, digest in want.items():
        if rel not in have:
            raise CheckpointError(f"bundle {path}: {rel} is missing")
        if have[rel] != digest:
            raise CheckpointError(f"bundle {path}: {rel} changed (SHA-256 {have[rel][:12]}… ≠ manifest "
                                  f"{digest[:12]}…)")
    extra = sorted(set(have) - set(want))
    if extra:
        raise CheckpointError(f"bundle {path}: {extra[0]} is not in the manifest")


def encode(tok, entry: dict, item) -> dict:
    """One golden input (a text, or a [question, context] pair) → (1, T) int64 feeds of ``entry``'s graph."""
    tok.enable_truncation(max_length=int(entry["max_length"]), strategy="longest_first")
    try:
        enc = tok.encode(*item) if isinstance(item, (list, tuple)) else tok.encode(item)
    finally:
        tok.no_truncation()
    feeds = {"input_ids": np.asarray([enc.ids], np.int64),
             "attention_mask": np.asarray([enc.attention_mask], np.int64),
             "token_type_ids": np.asarray([enc.type_ids], np.int64)}
    return {k: v for k, v in feeds.items() if k in entry["inputs"]}


def golden_outputs(session, entry: dict, tok, inputs: list) -> list:
    """Run ``inputs`` one at a time through ``session``; [{"input", "input_ids", "outputs": {name: list}}].
    An input that gives no token (an empty text under a tokenizer that adds no special tokens) is left out."""
    out = []
    for item in inputs:
        feeds = encode(tok, entry, item)
        if feeds["input_ids"].shape[1] == 0:
            continue
        res = session.run(list(entry["outputs"]), feeds)
        row = {"input": item, "input_ids": feeds["input_ids"][0].tolist()}
        if "token_type_ids" in feeds:
            row["type_ids"] = feeds["token_type_ids"][0].tolist()
        row["outputs"] = {n: r[0].tolist() for n, r in zip(entry["outputs"], res)}
        out.append(row)
    return out


def compare_golden(entry: dict, got: list) -> tuple:
    """(max |difference| over ``entry``'s golden outputs and ``got`` (as :func:`golden_outputs` gives), the
    first failure as a message or None)."""
    worst = 0.0
    for want, have in zip(entry["golden"], got):
        if want["input_ids"] != have["input_ids"]:
            return worst, f"token ids of golden input {want['input']!r:.60} differ from the manifest"
        for name, ref in want["outputs"].items():
            a, b = np.asarray(ref), np.asarray(have["outputs"][name])
            if a.shape != b.shape:
                return worst, f"output {name} of golden input {want['input']!r:.60} has shape {b.shape}, " \
                              f"manifest {a.shape}"
            if a.dtype == bool or np.issubdtype(a.dtype, np.integer):
                if not np.array_equal(a, b):
                    return worst, f"output {name} of golden input {want['input']!r:.60} differs"
                continue
            d = float(np.abs(a - b).max()) if a.size else 0.0
            worst = max(worst, d)
            bound = tolerance(entry["precision"], a, entry.get("int8_rounding"))
            if d > bound:
                return worst, f"output {name} of golden input {want['input']!r:.60} differs by {d:.2e} " \
                              f"(> {bound:.1e}, {entry['precision']})"
    return worst, None


def verify_bundle(path, threads: int = 1) -> dict:
    """Check bundle ``path``: every file's SHA-256, then each model's golden inputs re-run with ONNX Runtime
    (token ids equal, outputs within :func:`tolerance`). Returns {model: max |difference|}.

    Raises:
        CheckpointError: no manifest, a damaged manifest entry (check_manifest), a file missing / added /
            changed. BertforgeError: a golden input differs.
    """
    import onnxruntime as ort
    from tokenizers import Tokenizer
    path = Path(path)
    manifest = read_manifest(path)
    check_manifest(path, manifest)
    check_hashes(path, manifest)
    report = {}
    for name, entry in manifest["models"].items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(path / entry["graph"]), opts, providers=["CPUExecutionProvider"])
        tok = Tokenizer.from_file(str(path / entry["tokenizer"]))
        worst, err = compare_golden(entry, golden_outputs(sess, entry, tok, [g["input"] for g in entry["golden"]]))
        if err:
            raise BertforgeError(f"bundle {path} model {name}: {err}")
        report[name] = worst
    return report


__all__ = ["MANIFEST", "VERSION", "TOLERANCE", "sha256", "file_hashes", "tolerance", "read_manifest", "check_manifest",
           "check_hashes", "encode", "golden_outputs", "compare_golden", "verify_bundle"]
