"""Token-classification data: CoNLL column files and JSONL ``tokens``/``tags``; IOB1 → IOB2; subword
label alignment and sliding windows.

CoNLL-2003 (Tjong Kim Sang & De Meulder 2003) files hold one token per line with space-separated
columns (``token POS chunk NER``), a blank line between sentences and ``-DOCSTART-`` lines between
documents. The original ``eng.train`` uses IOB1 (``I-X`` opens a chunk; ``B-X`` only separates two
adjacent chunks of the same type); most redistributed copies use IOB2 (every chunk opens with
``B-X``). Both are read and normalised to IOB2 (:func:`iob1_to_iob2`, idempotent on IOB2).

Subword alignment follows Devlin et al. 2018 §5.3: a word's label goes on its first subword; the
other subwords, the special tokens and padding get −100 (ignored by the loss), and at prediction time a
word's tag is read from its first subword (``aggregation="first"``) — or from all its subwords
(``"average"`` / ``"max"``, as ``transformers``' ``TokenClassificationPipeline`` ``aggregation_strategy``
names them; :func:`aggregate_pieces`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..errors import DataError
from .readers import ID_COLUMNS, split_lines

IGNORE_INDEX = -100
#: how a word's score vector comes from its subwords' logits (:func:`aggregate_pieces`)
AGGREGATIONS = ("first", "average", "max")


@dataclass
class TokenExample:
    """One sentence: ``tokens`` (words) and ``tags`` (IOB2 strings, same length) or None."""

    tokens: list
    tags: Optional[list] = None
    guid: Optional[str] = None
    doc: Optional[int] = None  # document number (CoNLL ``-DOCSTART-`` segments); None = standalone
    id: Optional[Union[str, int]] = None  # JSONL: the row's id field; else the sentence's first line number
    text: Optional[str] = None  # the raw text the words were cut from (plain-text input); None for files
    offsets: Optional[list] = None  # per word, its (start, end) character span in ``text``


# ------------------------------------------------------------------------------------------ schemes
def iob1_to_iob2(tags: list) -> list:
    """IOB1 → IOB2: an ``I-X`` that opens a chunk (after ``O``, at the start, or after another type)
    becomes ``B-X``. Valid IOB2 input is returned unchanged. E.g. ``[I-PER, I-PER, O, I-LOC, B-LOC]``
    → ``[B-PER, I-PER, O, B-LOC, B-LOC]``.
    """
    out, prev = [], "O"
    for t in tags:
        if t.startswith("I-"):
            typ = t[2:]
            if prev == "O" or prev[2:] != typ:
                t = "B-" + typ
        out.append(t)
        prev = t
    return out


def detect_scheme(sentences_tags) -> str:
    """``"IOB2"`` when every chunk opens with ``B-``, else ``"IOB1"`` (some ``I-X`` opens a chunk)."""
    for tags in sentences_tags:
        if iob1_to_iob2(tags) != list(tags):
            return "IOB1"
    return "IOB2"


def _check_tags(tags, where):
    for t in tags:
        if t != "O" and not (len(t) > 2 and t[:2] in ("B-", "I-")):
            raise DataError(f"{where} tag {t!r} is not IOB (O, B-TYPE, I-TYPE); convert the file "
                            f"to IOB1/IOB2 tags")


# ------------------------------------------------------------------------------------------ readers
def read_conll(path, tag_column: int = -1, max_samples: Optional[int] = None,
               require_tags: bool = True, scheme: str = "auto") -> list:
    """Read a CoNLL column file into :class:`TokenExample` sentences (tags normalised to IOB2).

    Args:
        path: text file; columns separated by spaces or tabs; token = column 0; tag = ``tag_column``.
        tag_column: column of the NER tag (default last; CoNLL-2003's is 3).
        require_tags: False reads one-column (token only) files for prediction.
        scheme: ``auto`` | ``IOB1`` | ``IOB2`` — input scheme; every one is returned as IOB2.
    Raises:
        DataError: missing/empty/non-UTF-8 file, a line with too few columns, non-IOB tags.
    """
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise DataError(f"{path} does not exist or is empty; pass a CoNLL file (token ... tag per line)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8; re-encode it as UTF-8") from None
    out, toks, tags, start, doc = [], [], [], 1, 0
    has_tags = None

    def flush():
        nonlocal toks, tags
        if toks:
            out.append(TokenExample(toks, tags if has_tags else None, f"{path.name}:{start}", doc, start))
        toks, tags = [], []

    for lineno, line in enumerate(split_lines(text), 1):
        if max_samples is not None and len(out) >= max_samples:
            break
        cols = line.split()
        cells = line.split("\t")
        if len(cells) > 1 and any(" " in c.strip() for c in cells):  # GLUE-style "sentence<TAB>label" rows
            raise DataError(f"{path}:{lineno} holds tab-separated cells of several words, not a CoNLL line; a "
                            f"token task reads one token per line (token ... tag), blank lines between sentences")
        if not cols:
            flush()
            start = lineno + 1
            continue
        if cols[0] == "-DOCSTART-":
            flush()
            start = lineno + 1
            doc += 1
            continue
        if not toks:
            start = lineno
        if has_tags is None:
            has_tags = len(cols) > 1
            if require_tags and not has_tags:
                raise DataError(f"{path}:{lineno} has one column but a tag column is needed; pass a "
                                f"labelled file (token ... tag)")
        toks.append(cols[0])
        if has_tags:
            if len(cols) < 2 or (tag_column >= 0 and len(cols) <= tag_column):
                raise DataError(f"{path}:{lineno} has {len(cols)} columns; expected token ... tag "
                                f"(tag column {tag_column})")
            tags.append(cols[tag_column])
    if max_samples is None or len(out) < max_samples:
        flush()
    if not out:
        raise DataError(f"{path} has no sentences; pass a CoNLL file (token ... tag per line)")
    return _normalise(out, path, scheme)


def read_token_jsonl(path, tokens_field: str = "tokens", tags_field: str = "tags",
                     max_samples: Optional[int] = None, require_tags: bool = True,
                     scheme: str = "auto") -> list:
    """Read JSONL with one ``{"tokens": [...], "tags": [...]}`` object per line (tags as strings).

    Raises:
        DataError: bad JSON, missing fields, tokens/tags of different lengths, non-IOB tags.
    """
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise DataError(f"{path} does not exist or is empty; pass a JSONL file of tokens/tags")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8; re-encode it as UTF-8") from None
    out = []
    for lineno, line in enumerate(split_lines(text), 1):
        if max_samples is not None and len(out) >= max_samples:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno} is not valid JSON ({e.msg}); one object per line") from None
        if not isinstance(row, dict) or tokens_field not in row:
            raise DataError(f"{path}:{lineno} has no {tokens_field!r} field; write "
                            f'{{"{tokens_field}": [...], "{tags_field}": [...]}}')
        for field_name in (tokens_field, tags_field):
            if row.get(field_name) is not None and not isinstance(row[field_name], list):
                raise DataError(f"{path}:{lineno} field {field_name!r} is a {type(row[field_name]).__name__}, "
                                f"not a list; write one list item per token")
        for field_name in (tokens_field, tags_field):
            bad = next((t for t in row.get(field_name) or [] if not isinstance(t, str)), "")
            if bad != "":
                raise DataError(f"{path}:{lineno} field {field_name!r} holds {json.dumps(bad)[:30]}, not a "
                                f"string; write every token and tag as a string")
        if not row[tokens_field]:
            raise DataError(f"{path}:{lineno} has no tokens; drop the line or give the sentence's tokens")
        toks = list(row[tokens_field])
        tags = row.get(tags_field)
        if tags is None and require_tags:
            raise DataError(f"{path}:{lineno} has no {tags_field!r} field; add the tags")
        if tags is not None:
            tags = [str(t) for t in tags]
            if len(tags) != len(toks):
                raise DataError(f"{path}:{lineno} has {len(toks)} tokens but {len(tags)} tags; give one "
                                f"tag per token")
        row_id = next((row[c] for c in ID_COLUMNS if isinstance(row.get(c), (str, int))
                       and not isinstance(row.get(c), bool)), lineno)
        out.append(TokenExample(toks, tags, f"{path.name}:{lineno}", id=row_id))
    if not out:
        raise DataError(f"{path} has no examples; pass a non-empty JSONL file")
    return _normalise(out, path, scheme)


def _normalise(examples: list, path: Path, scheme: str) -> list:
    if scheme not in ("auto", "IOB1", "IOB2"):
        raise DataError(f"tag scheme {scheme!r}; choose auto, IOB1 or IOB2")
    for e in examples:
        if e.tags is not None:
            _check_tags(e.tags, e.guid or path)  # guid: "file:line"
            e.tags = iob1_to_iob2(e.tags)
    return examples


def read_token_examples(path, max_samples=None, require_tags=True, tokens_field="tokens",
                        tags_field="tags") -> list:
    """``.jsonl``/``.json`` → :func:`read_token_jsonl`; anything else → :func:`read_conll`."""
    if Path(path).suffix.lower() in (".jsonl", ".json"):
        return read_token_jsonl(path, tokens_field, tags_field, max_samples, require_tags)
    return read_conll(path, max_samples=max_samples, require_tags=require_tags)


def label_list(examples: list) -> list:
    """Sorted IOB2 label set seen in ``examples``: ``O`` first, then per type ``B-X, I-X``."""
    types = sorted({t[2:] for e in examples for t in (e.tags or []) if t != "O"})
    return ["O"] + [f"{p}-{t}" for t in types for p in ("B", "I")]


# ------------------------------------------------------------------------------ alignment, windows
def align_labels(word_ids: list, word_labels: list) -> list:
    """Word labels → one label per subword: the first subword of each word carries its word's label,
    every other position (continuation subwords, special tokens whose word id is None) gets −100.

    Args:
        word_ids: per subword, the index of its word or None (``tokenizers.Encoding.word_ids``).
        word_labels: per word, a label id.
    """
    out, prev = [], None
    for w in word_ids:
        if w is None:
            out.append(IGNORE_INDEX)
        elif w != prev:
            out.append(word_labels[w])
        else:
            out.append(IGNORE_INDEX)
        prev = w
    return out


def encode_token_windows(tok, examples: list, max_seq_len: int, label2id: Optional[dict] = None,
                         stride: Optional[int] = None) -> list:
    """Tokenize pre-split words and cut sentences longer than ``max_seq_len`` into overlapping windows.

    Each window is ``prefix specials + subwords[s:e] + suffix specials`` (the tokenizer's own [CLS] …
    [SEP] or <s> … </s>); consecutive windows overlap by ``stride`` subwords (default a quarter of
    the window). Returns a list of dicts: ``input_ids``, ``token_type_ids``, ``labels`` (when tags and
    ``label2id`` are given; −100 except at first subwords), ``example_index``, ``word_index``
    (per position, the word whose first subword sits there, else −1) and ``piece_word`` (per position, the
    word any of whose subwords sits there, else −1: what :func:`words_from_windows` aggregates over).
    Raises:
        DataError: a tag not in ``label2id``; ``max_seq_len`` too small for the special tokens.
    """
    encs = tok.encode_batch([e.tokens for e in examples], is_pretokenized=True)
    out = []
    for ei, (e, enc) in enumerate(zip(examples, encs)):
        ids, wids = enc.ids, enc.word_ids
        n_pre = 0
        while n_pre < len(wids) and wids[n_pre] is None:
            n_pre += 1
        n_suf = 0
        while n_suf < len(wids) - n_pre and wids[len(wids) - 1 - n_suf] is None:
            n_suf += 1
        pre, suf = ids[:n_pre], ids[len(ids) - n_suf:]
        body_ids, body_w = ids[n_pre:len(ids) - n_suf], wids[n_pre:len(wids) - n_suf]
        first = [-1] * len(body_w)
        piece = [-1 if w is None else w for w in body_w]
        prev = None
        for i, w in enumerate(body_w):
            if w is not None and w != prev:
                first[i] = w
            prev = w
        room = max_seq_len - n_pre - n_suf
        if room < 2:
            raise DataError(f"max_seq_len {max_seq_len} leaves no room for tokens; use 16 or more")
        step = room - (stride if stride is not None else room // 4)
        step = max(1, step)
        labels = None
        if e.tags is not None and label2id is not None:
            bad = [t for t in e.tags if t not in label2id]
            if bad:
                raise DataError(f"{e.guid}: tag {bad[0]!r} is not in the label set {list(label2id)}; "
                                f"train with data.labels including it")
            labels = [label2id[t] for t in e.tags]
        s = 0
        while True:
            t_end = min(len(body_ids), s + room)
            wi = first[s:t_end]
            d = {"input_ids": pre + body_ids[s:t_end] + suf,
                 "token_type_ids": [0] * (n_pre + t_end - s + n_suf),
                 "example_index": ei,
                 "word_index": [-1] * n_pre + wi + [-1] * n_suf,
                 "piece_word": [-1] * n_pre + piece[s:t_end] + [-1] * n_suf,
                 "window_start": s}
            if labels is not None:
                d["labels"] = [IGNORE_INDEX] * n_pre + [labels[w] if w >= 0 else IGNORE_INDEX for w in wi] \
                    + [IGNORE_INDEX] * n_suf
            out.append(d)
            if t_end >= len(body_ids):
                break
            s += step
    return out


def pack_sentences(tok, examples: list, room: int) -> tuple:
    """Concatenate consecutive sentences of the same document into sequences of at most ``room``
    subwords (BERT's "maximal document context" for CoNLL NER, Devlin et al. 2018 §5.3); a sentence
    longer than ``room`` stays alone (it is windowed later). Sentences with ``doc`` None are never
    merged.

    Returns ``(packed, spans)``: the packed :class:`TokenExample` list and, per packed example, the
    list of ``(sentence_index, n_words)`` it holds, in order.
    """
    lens = [len(e.ids) for e in tok.encode_batch([e.tokens for e in examples], is_pretokenized=True,
                                                 add_special_tokens=False)]
    packed, spans = [], []
    cur, cur_len = [], 0
    for i, (e, n) in enumerate(zip(examples, lens)):
        same_doc = cur and e.doc is not None and examples[cur[-1]].doc == e.doc
        if cur and (not same_doc or cur_len + n > room):
            packed.append(cur)
            cur, cur_len = [], 0
        cur.append(i)
        cur_len += n
    if cur:
        packed.append(cur)
    out = []
    for idx in packed:
        es = [examples[i] for i in idx]
        tags = None if any(e.tags is None for e in es) else [t for e in es for t in e.tags]
        out.append(TokenExample([w for e in es for w in e.tokens], tags, es[0].guid, es[0].doc))
        spans.append([(i, len(examples[i].tokens)) for i in idx])
    return out, spans


def unpack_words(per_packed: list, spans: list, n_sentences: int) -> list:
    """Inverse of :func:`pack_sentences` on per-word values: per packed example → per sentence."""
    out = [None] * n_sentences
    for vals, sp in zip(per_packed, spans):
        k = 0
        for i, n in sp:
            out[i] = vals[k:k + n]
            k += n
    return out


def _softmax(z):
    import numpy as np
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def aggregate_pieces(pieces, aggregation: str = "first"):
    """One word's score vector (C,) from its subwords' logits ``pieces`` (n, C), in order, as
    ``transformers``' ``TokenClassificationPipeline`` aggregates them (its ``aggregation_strategy``):

    * ``first`` — the first subword's logits (the piece the model was trained to label; the default);
    * ``average`` — the mean of the subwords' softmax probabilities, returned as their log (so that a
      softmax of the result gives the mean back and its argmax is the averaged label);
    * ``max`` — the logits of the subword whose top softmax probability is the highest.

    Raises ValueError for another ``aggregation``."""
    import numpy as np
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r}: choose one of {', '.join(AGGREGATIONS)}")
    if aggregation == "first" or len(pieces) == 1:
        return pieces[0]
    p = _softmax(np.stack([np.asarray(z) for z in pieces]))
    if aggregation == "average":
        return np.log(np.maximum(p.mean(0), 1e-30)).astype(np.float32)
    return pieces[int(p.max(-1).argmax())]  # max


def words_from_windows(windows: list, window_logits: list, n_words: list, aggregation: str = "first") -> list:
    """Assemble per-word score vectors from window logits.

    A word seen in several windows takes the window where its first subword has the most context
    (max of min(left, right) distance to the window edge; BERT's "max context" rule, Devlin et al.
    2018 §4.2 / run_squad.py). Words without any subword (e.g. only control characters) get None.
    Within that window the word's subwords give its vector by ``aggregation`` (:func:`aggregate_pieces`:
    ``first`` — its first subword's logits —, ``average`` or ``max``; windows without ``piece_word`` read
    first subwords only).

    Args:
        windows: the dicts of :func:`encode_token_windows` (``example_index``, ``word_index``, ``piece_word``).
        window_logits: per window, an array (T_w, C).
        n_words: per example, its number of words.
    Returns: per example, a list (one per word) of arrays (C,) or None.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r}: choose one of {', '.join(AGGREGATIONS)}")
    best = [[None] * n for n in n_words]
    score = [[-1.0] * n for n in n_words]
    for w, z in zip(windows, window_logits):
        ex = w["example_index"]
        wi = w["word_index"]
        valid = [i for i, x in enumerate(wi) if x >= 0]
        if not valid:
            continue
        pieces = None
        if aggregation != "first" and w.get("piece_word") is not None:
            pieces = {}
            for i, x in enumerate(w["piece_word"]):
                if x >= 0:
                    pieces.setdefault(x, []).append(i)
        lo, hi = valid[0], valid[-1]
        for i in valid:
            c = min(i - lo, hi - i) + 0.01 * (hi - lo)
            word = wi[i]
            if c > score[ex][word]:
                score[ex][word] = c
                best[ex][word] = z[i] if pieces is None else \
                    aggregate_pieces([z[j] for j in pieces[word]], aggregation)
    return best
