"""A bertforge bundle run with onnxruntime, numpy and tokenizers only.

The graph already holds everything after the encoder (pooling, truncation, normalisation, softmax /
sigmoid, thresholds, tag argmax), so this module only tokenizes, pads, runs and turns arrays into Python
answers. Texts longer than the manifest's ``max_length`` tokens (special tokens included) are truncated,
pairs longest-first. A text that gives no token at all raises ValueError (NER: a text without a word has no
entity). A NER text is cut into words at whitespace, as the manifest's ``words`` says, and tagged per word.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Optional

import numpy as np

MANIFEST = "manifest.json"
VERSION = 1
#: allowed |difference| of a re-run, relative above 1 (the bound bertforge writes the manifest with); an INT8
#: model's at least its manifest ``int8_rounding`` (how far its activations' dynamic rounding moves its outputs)
TOLERANCE = {"fp32": 1e-5, "int8": 1e-4}
#: how a NER model cuts a text into words (the manifest's ``words``; bertforge.tasks.ner.WORD_RULES):
#: ``whitespace`` — the CoNLL words a model is fine-tuned on —, or ``punctuation``
WORD_RULES = {"whitespace": re.compile(r"\S+"), "punctuation": re.compile(r"\w+|[^\w\s]")}
#: how a word's tag comes from its sub-tokens (the manifest's ``aggregation``; bertforge.data.conll.aggregate_pieces)
AGGREGATIONS = ("first", "average", "max")


class BundleError(Exception):
    """A bundle that is missing, changed, or asked for what its model does not do (one line)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(path) -> dict:
    f = Path(path) / MANIFEST
    try:
        m = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise BundleError(f"{path} is not a bundle (no readable {MANIFEST})") from None
    if not isinstance(m, dict) or m.get("bundle") != VERSION:
        raise BundleError(f"{f} is not a bertforge bundle manifest (version {VERSION})")
    return m


def check_files(path, manifest: dict) -> None:
    """Raise BundleError naming the first file missing, added, or whose SHA-256 differs from the manifest."""
    path = Path(path)
    want = manifest.get("files") or {}
    have = {p.relative_to(path).as_posix(): p for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != MANIFEST}
    for rel, digest in want.items():
        if rel not in have:
            raise BundleError(f"bundle {path}: {rel} is missing")
        if _sha256(have[rel]) != digest:
            raise BundleError(f"bundle {path}: {rel} changed (its SHA-256 is not the manifest's)")
    extra = sorted(set(have) - set(want))
    if extra:
        raise BundleError(f"bundle {path}: {extra[0]} is not in the manifest")


KINDS = ("embedding", "classification", "multi_label", "regression", "token_classification", "question_answering")
_FEEDS = ("input_ids", "attention_mask", "token_type_ids")


def check_manifest(path, manifest: dict) -> None:
    """Raise BundleError naming the first entry of ``manifest`` that a bundle cannot hold: an unknown kind or
    precision, a graph or tokenizer outside the folder or not hashed in ``files``, a max_length that is no
    positive integer, unknown inputs, no outputs or golden inputs, a NER word rule or aggregation it does not know,
    golden vectors of another width than the declared ``dim`` / ``truncate_dim``. (bertforge's twin:
    bertforge.compress.bundle_manifest.check_manifest.)"""
    models, files = manifest.get("models"), manifest.get("files")
    if not isinstance(models, dict) or not models or not isinstance(files, dict):
        raise BundleError(f"bundle {path}: the manifest has no models or no files table")
    for name, e in models.items():
        def bad(what):
            return BundleError(f"bundle {path}: model {name!r}: {what} (the manifest was edited or is damaged; "
                               f"re-make the bundle)")
        if not isinstance(e, dict) or e.get("kind") not in KINDS:
            raise bad(f"kind {e.get('kind') if isinstance(e, dict) else e!r} is none of {', '.join(KINDS)}")
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


def _texts(texts, pairs: bool = False) -> tuple:
    """(list of texts, True when one text — a str — was given). Raises BundleError for anything else than
    strings (``pairs``: or (question, context) pairs of strings), or text that is not valid Unicode."""
    if isinstance(texts, str):
        texts, one = [texts], True
    else:
        one = False
        if texts is None or isinstance(texts, (bytes, dict)) or not hasattr(texts, "__iter__"):
            raise BundleError(f"texts must be a string or a list of strings, not {type(texts).__name__}")
        texts = list(texts)
    for i, t in enumerate(texts):
        parts = t if pairs and isinstance(t, (list, tuple)) and len(t) == 2 else (t,)
        for x in parts:
            if not isinstance(x, str):
                raise BundleError(f"text {i} is {_a(type(x).__name__)} {type(x).__name__}; pass strings")
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise BundleError(f"text {i} is not valid Unicode (it holds a lone surrogate, e.g. bytes that "
                                  f"were not UTF-8); decode it as UTF-8 first") from None
    return texts, one


class Bundle:
    """One model of a bundle folder ``path`` (``model``: its name; may be left out when there is one).

    ``threads``: ONNX Runtime intra-op threads (None: its default). ``check``: verify every file's SHA-256
    on load (:meth:`verify` does it too). Methods: :meth:`embed`, :meth:`classify`, :meth:`ner`, :meth:`qa`,
    :meth:`run` (raw outputs), :meth:`encode` (token ids), :meth:`verify`.
    """

    def __init__(self, path, model: Optional[str] = None, threads: Optional[int] = None, check: bool = False):
        import onnxruntime as ort
        from tokenizers import Tokenizer
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        models = self.manifest["models"]
        check_manifest(self.path, self.manifest)
        if model is None:
            if len(models) != 1:
                raise BundleError(f"bundle {path} holds {', '.join(models)}; name one (model=... in Python, "
                                  f"--model on the command line)")
            model = next(iter(models))
        if model not in models:
            raise BundleError(f"bundle {path} has no model {model!r}; it holds {', '.join(models)}")
        if check:
            check_files(self.path, self.manifest)
        self.name, self.entry = model, models[model]
        self.kind = self.entry["kind"]
        self.labels = self.entry.get("labels")
        self.max_length = int(self.entry["max_length"])
        opts = ort.SessionOptions()
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise BundleError(f"threads={threads!r}: a number of threads ≥ 1 (or None: ONNX Runtime's default)")
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        graph, tok = self.path / self.entry["graph"], self.path / self.entry["tokenizer"]
        try:
            self.session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own classes (NoSuchFile, InvalidProtobuf, Fail …)
            raise BundleError(f"bundle {path}: {self.entry['graph']} cannot be loaded by onnxruntime "
                              f"({str(e).splitlines()[0][:160]}); `verify` checks the files") from None
        try:
            self.tokenizer = Tokenizer.from_file(str(tok))
        except Exception as e:
            raise BundleError(f"bundle {path}: {self.entry['tokenizer']} is not a readable tokenizer "
                              f"({str(e).splitlines()[0][:160]}); `verify` checks the files") from None
        self.tokenizer.enable_truncation(max_length=self.max_length, strategy="longest_first")
        self.tokenizer.no_padding()

    # ------------------------------------------------------------------------------------- low level
    def encode(self, items: list) -> list:
        """Texts (or (question, context) pairs) → ``tokenizers.Encoding`` each, truncated to max_length."""
        items, _ = _texts(items, pairs=True)
        encs = self.tokenizer.encode_batch([tuple(x) if isinstance(x, (list, tuple)) else x for x in items])
        for i, e in enumerate(encs):
            if not e.ids:
                raise ValueError(f"text {i} ({items[i]!r:.40}) gives no token; give a non-empty text")
        return encs

    def feeds(self, encs: list) -> dict:
        """Padded (B, T) int64 inputs of the graph for ``encs``."""
        t = max(len(e.ids) for e in encs)
        ids = np.zeros((len(encs), t), np.int64)
        am = np.zeros_like(ids)
        tt = np.zeros_like(ids)
        for i, e in enumerate(encs):
            n = len(e.ids)
            ids[i, :n], am[i, :n], tt[i, :n] = e.ids, 1, e.type_ids
        all_ = {"input_ids": ids, "attention_mask": am, "token_type_ids": tt}
        return {k: all_[k] for k in self.entry["inputs"]}

    def run(self, items: list, batch_size: int = 32) -> dict:
        """Every output of the graph for ``items`` as {name: list of per-item arrays} (token-level outputs cut
        to each item's length)."""
        names = list(self.entry["outputs"])
        out: dict = {n: [] for n in names}
        for s in range(0, len(items), batch_size):
            encs = self.encode(items[s:s + batch_size])
            res = self.session.run(names, self.feeds(encs))
            for n, r in zip(names, res):
                for i, e in enumerate(encs):
                    out[n].append(r[i, :len(e.ids)] if n in _TOKEN_LEVEL or
                                  (n == "logits" and self.kind == "token_classification") else r[i])
        return out

    def _need(self, *kinds) -> None:
        if self.kind not in kinds:
            what = {"embedding": "embed", "token_classification": "ner", "question_answering": "qa"}
            raise BundleError(f"bundle model {self.name!r} is {_a(self.kind)} {self.kind} model; it cannot do this — "
                              f"use .{what.get(self.kind, 'classify')}()")

    # ------------------------------------------------------------------------------------- answers
    def embed(self, texts, batch_size: int = 32) -> np.ndarray:
        """(N, D) float32 sentence vectors (pooled, truncated, normalised as the model declares) of a list of
        texts; one text (a str) gives one (D,) vector."""
        self._need("embedding")
        texts, one = _texts(texts)
        if not texts:
            return np.zeros((0, int(self.entry.get("dim") or 0)), np.float32)
        vecs = np.stack(self.run(texts, batch_size)["sentence_embedding"]).astype(np.float32)
        return vecs[0] if one else vecs

    def classify(self, texts: list, batch_size: int = 32) -> list:
        """Per text: ``{"label", "score", "scores"}`` (classification: argmax and softmax), ``{"labels",
        "scores"}`` (multi-label: the labels at or above their saved thresholds) or ``{"score"}``
        (regression); one text (a str) gives its one answer."""
        self._need("classification", "multi_label", "regression")
        texts, one = _texts(texts)
        if not texts:
            return []
        out = self.run(texts, batch_size)
        names = self.labels or [str(i) for i in range(len(out["scores"][0]))] if out["scores"] else []
        res = []
        for i, s in enumerate(out["scores"]):
            if self.kind == "regression":
                res.append({"score": float(s[0])})
                continue
            scores = {names[j]: float(p) for j, p in enumerate(s)}
            if self.kind == "multi_label":
                res.append({"labels": [names[j] for j, on in enumerate(out["predicted"][i]) if on],
                            "scores": scores})
            else:
                k = int(out["label"][i])
                res.append({"label": names[k], "score": float(s[k]), "scores": scores})
        return res[0] if one else res

    def ner(self, texts: list, batch_size: int = 32, aggregation: Optional[str] = None) -> list:
        """Per text, its entities ``{"label", "text", "start", "end", "score"}``: the text is cut into words as the
        manifest says (``words``: at whitespace, the CoNLL words the model was fine-tuned on), each word gets one
        IOB2 tag from its sub-tokens (``aggregation``, default the manifest's: ``first`` — its first sub-token's —,
        ``average`` of their probabilities, or the sub-token of ``max`` probability) and the tags are chunked;
        ``start`` / ``end`` are character offsets in the text (on word boundaries), ``score`` the mean probability
        of the entity's word tags. One text (a str) gives its one list of entities. A word past ``max_length``
        tokens is tagged O."""
        self._need("token_classification")
        how = aggregation if aggregation is not None else self.entry.get("aggregation") or "first"
        if how not in AGGREGATIONS:
            raise BundleError(f"aggregation={how!r}: choose one of {', '.join(AGGREGATIONS)}")
        texts, one = _texts(texts)
        if not texts:
            return []
        rule = WORD_RULES[self.entry.get("words") or "whitespace"]
        res = []
        for s in range(0, len(texts), batch_size):
            chunk = texts[s:s + batch_size]
            spans = [[(m.start(), m.end()) for m in rule.finditer(t)] for t in chunk]
            encs = self.tokenizer.encode_batch([[t[a:b] for a, b in sp] for t, sp in zip(chunk, spans)],
                                               is_pretokenized=True)
            run = [i for i, e in enumerate(encs) if spans[i] and e.ids]
            logits = self.session.run(["logits"], self.feeds([encs[i] for i in run]))[0] if run else []
            z_of = {i: z[:len(encs[i].ids)] for i, z in zip(run, logits)}
            res += [_entities(t, sp, encs[i].word_ids, z_of[i], self.labels, how) if i in z_of else []
                    for i, (t, sp) in enumerate(zip(chunk, spans))]
        return res[0] if one else res

    def qa(self, question: str, context: str, max_answer_tokens: int = 30) -> dict:
        """The best answer span in ``context``: ``{"answer", "start", "end", "score"}`` (character offsets,
        score = start + end logit), the span with the highest score among spans of context tokens whose end
        is not before their start and that are at most ``max_answer_tokens`` long."""
        enc, (score, a, j) = self.answer_span(question, context, max_answer_tokens)
        if a < 0:
            return {"answer": "", "start": -1, "end": -1, "score": score}
        start, end = enc.offsets[a][0], enc.offsets[j][1]
        return {"answer": context[start:end], "start": int(start), "end": int(end), "score": score}

    def answer_span(self, question: str, context: str, max_answer_tokens: int = 30) -> tuple:
        """:meth:`qa`'s pick in token positions: ``(encoding, (score, start, end))``, ``start`` = ``end`` = -1 and
        score -inf when no context token is left."""
        self._need("question_answering")
        _texts([(question, context)], pairs=True)
        enc = self.encode([(question, context)])[0]
        out = self.run([(question, context)])
        s, e = out["start_logits"][0], out["end_logits"][0]
        ctx = np.asarray([i for i, sid in enumerate(enc.sequence_ids) if sid == 1])
        best = (float("-inf"), -1, -1)
        for a in ctx:
            ends = ctx[(ctx >= a) & (ctx < a + max_answer_tokens)]
            j = ends[np.argmax(e[ends])]
            if s[a] + e[j] > best[0]:
                best = (float(s[a] + e[j]), int(a), int(j))
        return enc, best

    # ------------------------------------------------------------------------------------- check
    def verify(self) -> float:
        """Check every file's SHA-256 and re-run the golden inputs: token ids equal, outputs within the
        manifest precision's tolerance. Returns the largest difference; raises BundleError on the first one."""
        check_files(self.path, self.manifest)
        return verify_entry(self, self.entry)


def _a(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


_TOKEN_LEVEL = ("tag_ids", "tag_scores", "start_logits", "end_logits")


def verify_entry(b: Bundle, entry: dict) -> float:
    worst = 0.0
    tol = TOLERANCE[entry["precision"]]
    for g in entry["golden"]:
        item = g["input"]
        enc = b.encode([item])[0]
        if list(enc.ids) != g["input_ids"]:
            raise BundleError(f"model {b.name}: token ids of golden input {item!r:.50} differ from the manifest")
        res = b.session.run(list(entry["outputs"]), b.feeds([enc]))
        for name, r in zip(entry["outputs"], res):
            want, have = np.asarray(g["outputs"][name]), r[0]
            if want.dtype == bool or np.issubdtype(want.dtype, np.integer):
                if not np.array_equal(want, have):
                    raise BundleError(f"model {b.name}: output {name} of golden input {item!r:.50} differs")
                continue
            d = float(np.abs(want - have).max()) if want.size else 0.0
            bound = tol * max(1.0, float(np.abs(want).max()) if want.size else 1.0)
            if entry["precision"] == "int8" and entry.get("int8_rounding"):
                bound = max(bound, float(entry["int8_rounding"]))  # another kernel rounds some activations apart
            worst = max(worst, d)
            if d > bound:
                raise BundleError(f"model {b.name}: output {name} of golden input {item!r:.50} differs by "
                                  f"{d:.2e} (> {bound:.1e})")
    return worst


def verify(path, threads: Optional[int] = 1) -> dict:
    """Verify every model of bundle ``path``: {model: largest difference}. Raises BundleError."""
    m = read_manifest(path)
    check_manifest(path, m)
    check_files(path, m)
    return {name: verify_entry(b, b.entry) for name in m["models"]
            for b in [Bundle(path, name, threads=threads)]}


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _entities(text: str, spans: list, word_ids: list, logits: np.ndarray, labels, how: str) -> list:
    """IOB2 chunks of one tag per word (``spans``: each word's character span in ``text``; ``word_ids``: per
    token its word or None; ``logits`` (T, C)); a word's probabilities are its first sub-token's (``first``), the
    mean of its sub-tokens' (``average``) or those of its sub-token with the highest top probability (``max``)
    — bertforge's aggregate_pieces; a word without a sub-token is O."""
    pieces: dict = {}
    for i, w in enumerate(word_ids):
        if w is not None:
            pieces.setdefault(w, []).append(i)
    ents, cur = [], None
    for w, (a, b) in enumerate(spans):
        kind, p = None, 0.0
        if w in pieces:
            probs = _softmax(np.asarray(logits[pieces[w]], np.float64))
            if how == "average":
                v = probs.mean(0)
            elif how == "max":
                v = probs[int(probs.max(-1).argmax())]
            else:
                v = probs[0]
            k = int(v.argmax())
            tag, p = labels[k] if labels else str(k), float(v[k])
            kind = tag[2:] if tag[:2] in ("B-", "I-") else None
            if kind is not None and tag.startswith("I-") and cur is not None and cur["label"] == kind:
                cur["end"], cur["_s"] = b, cur["_s"] + [p]
                continue
        if cur is not None:
            ents.append(cur)
            cur = None
        if kind is not None:
            cur = {"label": kind, "start": a, "end": b, "_s": [p]}
    if cur is not None:
        ents.append(cur)
    return [{"label": e["label"], "text": text[e["start"]:e["end"]], "start": int(e["start"]),
             "end": int(e["end"]), "score": float(np.mean(e["_s"]))} for e in ents]
