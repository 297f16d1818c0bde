"""Raw pretraining text: files and HF hub datasets → documents → sentences (step 1 of
:mod:`bertforge.data.corpus`, which tokenizes, caches and cuts them into training sequences).

Local text files are read line by line (streaming). ``doc_sep`` says where a document ends: ``file`` (one
document per file), ``blank`` (a blank line ends a document — BERT's ``create_pretraining_data`` format;
Devlin et al. 2018 App. A.2), ``heading`` (WikiText ``= Title =`` lines start one), or ``auto`` (``heading``
when the file has WikiText headings, ``blank`` for one sentence per line with blank lines between documents,
else ``file``). Lines of one paragraph are joined (hard-wrapped books), then split into sentences by a
rule-based splitter. A name that is not a local file is read from the HF hub with
``datasets.load_dataset(name, streaming=True)`` (column ``text``; one row = one document).

Imports neither torch nor numpy.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, Optional

from ..errors import DataError
from .tokenizers_train import iter_lines

_HEADING = re.compile(r"^ ?= [^=].* = ?$")
# sentence end: . ! ? (optionally followed by closing quotes/brackets), then whitespace, then a likely start
_SENT_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'”’)\]]))\s+(?=[\"'“‘(\[]?[A-Z0-9])")
_ABBREV = re.compile(r"(?:^|\s)(?:Mr|Mrs|Ms|Dr|St|Prof|Sr|Jr|Mt|Capt|Col|Gen|Lt|Rev|No|vs|etc|i\.e|e\.g)\.$")


def split_sentences(text: str) -> list:
    """Rule-based sentence splitter: break after . ! ? followed by space and an upper-case/digit start."""
    text = " ".join(text.split())
    if not text:
        return []
    out: list = []
    for s in _SENT_END.split(text):
        s = s.strip()
        if not s:
            continue
        if out and _ABBREV.search(out[-1]):
            out[-1] = out[-1] + " " + s  # "Mr. Weston": not a sentence end
        else:
            out.append(s)
    return out


def _detect_doc_sep(path: str) -> str:
    """``heading`` if WikiText headings appear; ``blank`` if the file looks like BERT's
    ``create_pretraining_data`` format (one sentence per line — ≥ 80% of lines end a sentence — with
    blank lines between documents); else ``file`` (e.g. a hard-wrapped book)."""
    lines, blanks, ends = 0, 0, 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for k, line in enumerate(f):
            if _HEADING.match(line.rstrip("\n")):
                return "heading"
            t = line.strip()
            if not t:
                blanks += 1
            else:
                lines += 1
                ends += t[-1] in ".!?\"')»”’"
            if k > 2000:
                break
    if blanks and lines and ends >= 0.8 * lines:
        return "blank"
    return "file"


def iter_documents(path: str, doc_sep: str = "auto") -> Iterator[list]:
    """Yield the documents of one text file, each a list of sentences (streamed line by line)."""
    mode = _detect_doc_sep(path) if doc_sep == "auto" else doc_sep
    if mode not in ("file", "blank", "heading"):
        raise DataError(f"doc_sep={doc_sep!r}; choose auto, file, blank or heading")
    doc: list = []
    para: list = []

    def flush_para():
        if para:
            doc.extend(split_sentences(" ".join(para)))
            para.clear()

    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.strip()
            if mode == "heading" and _HEADING.match(raw.rstrip("\n")):
                flush_para()
                if doc:
                    yield doc
                doc = []
                continue
            if not line:
                flush_para()
                if mode == "blank" and doc:
                    yield doc
                    doc = []
                continue
            if mode == "heading" and line.startswith("="):
                flush_para()  # sub-heading: a paragraph boundary, not a sentence
                continue
            para.append(line)
    flush_para()
    if doc:
        yield doc


def hub_dataset(source: str) -> Optional[tuple]:
    """``(name, config or None)`` when ``source`` names a HF hub dataset (``wikitext:wikitext-2-raw-v1``,
    ``Salesforce/wikitext``, ``NAME:CONFIG``) rather than a local file; None for anything path-like: an
    existing path, one starting with ``.``, ``/`` or ``~``, one whose name has a file extension, or one whose
    folder exists here (then a missing file is reported as missing)."""
    p = Path(source)
    if p.exists() or source.startswith((".", "/", "~")) or "\\" in source:
        return None
    name, _, config = source.partition(":")
    if not re.fullmatch(r"[\w-]+(/[\w.-]+)?", name) or "." in name.rsplit("/", 1)[-1]:
        return None
    if "/" in name and Path(name).parent.is_dir():
        return None
    return name, (config or None)


def open_hub_dataset(source: str):
    """``datasets.load_dataset(name, config, split="train", streaming=True)`` for a :func:`hub_dataset` name.

    Raises:
        DataError: the dataset cannot be reached (offline, misspelt, private, no ``train`` split)."""
    name, config = hub_dataset(source)
    try:
        import datasets
        return datasets.load_dataset(name, config, split="train", streaming=True)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise DataError(f"corpus {source!r} is not a local file and could not be streamed from the HF hub "
                        f"({first}); pass text files, or a dataset name (NAME or NAME:CONFIG with a 'text' "
                        f"column) while online") from None


def _hub_texts(source: str) -> Iterator[str]:
    """The non-empty ``text`` values of a :func:`hub_dataset`'s rows (one row = one document)."""
    for row in open_hub_dataset(source):
        text = row.get("text") if isinstance(row, dict) else None
        if text:
            yield text


def _iter_hub_documents(source: str) -> Iterator[list]:
    for text in _hub_texts(source):
        sents = split_sentences(text)
        if sents:
            yield sents


def iter_corpus_lines(sources: list) -> Iterator[str]:
    """The non-blank lines of ``sources`` (text files, or the ``text`` rows of :func:`hub_dataset` names),
    stripped: what a tokenizer is trained on."""
    for src in sources:
        if hub_dataset(str(src)):
            for text in _hub_texts(str(src)):
                yield from (ln.strip() for ln in text.splitlines() if ln.strip())
        else:
            yield from iter_lines([src])


def source_meta(sources: list) -> list:
    """Per source, what a cache key needs: ``[resolved path, size, mtime]`` of a file (checked with
    :func:`require_corpus_file`), ``[name, 0, 0]`` of a :func:`hub_dataset` name. Reaches no network."""
    meta = []
    for s in map(str, sources):
        if hub_dataset(s):
            meta.append([s, 0, 0])
        else:
            p = require_corpus_file(s)
            st = p.stat()
            meta.append([str(p.resolve()), st.st_size, int(st.st_mtime)])
    return meta


def reach_hub_sources(sources: list) -> None:
    """Open every hub dataset among ``sources`` now, before a cache is built from them, so that an offline
    or misspelt name is one DataError (inside the builders it would surface as their own error)."""
    for s in map(str, sources):
        if hub_dataset(s):
            open_hub_dataset(s)


def require_corpus_file(path, hint: str = "pass text files") -> Path:
    """``path`` as a Path when it is a file; DataError naming the fix for a directory or a missing path."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"corpus {p} is a directory; pass the text files in it (e.g. {p}/*.txt)")
    if not p.is_file():
        raise DataError(f"corpus file {p} does not exist; {hint}")
    with open(p, "rb") as f:
        head = f.read(1 << 16)
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # not just a character cut at the end of the sample
            raise DataError(f"corpus file {p} is not UTF-8 text (byte {e.start}); pass plain text files") \
                from None
    if b"\x00" in head:
        raise DataError(f"corpus file {p} holds NUL bytes (a binary file?); pass plain text files")
    return p


__all__ = ["split_sentences", "iter_documents", "hub_dataset", "open_hub_dataset", "iter_corpus_lines",
           "source_meta", "reach_hub_sources", "require_corpus_file"]
