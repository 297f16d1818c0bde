"""The bundled default data: real English text shipped inside the ``gensim`` wheel (no network; the CLI calls it
"the embedded default": ``bertforge embedded-corpus``, ``embed-eval``).

``gensim/test/test_data/`` holds

* ``enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`` — 206 Wikipedia articles
  (MediaWiki XML dump; markup stripped here with :func:`gensim.corpora.wikicorpus.filter_wiki`);
* ``lee_background.cor`` — 300 ABC (Australian Broadcasting Corporation) news documents, one per line;
* ``lee.cor`` + ``similarities0-1.txt`` — the Lee 50-document corpus with averaged human similarity
  ratings in [0, 1] (Lee, Pincombe & Welsh 2005, "An empirical evaluation of models of text document
  similarity", CogSci); the ratings file is a 50×50 upper-triangular matrix;
* ``pang_lee_polarity.cor`` — 200 movie-review sentences labelled ``__label__pos`` / ``__label__neg``
  (a sample of Pang & Lee 2005 sentence polarity data).

:func:`build_corpus` turns the first two into pretraining/distillation text files in the standard
BERT layout (one sentence per line, a blank line between documents) and keeps a held-out slice of
whole documents for evaluation. The Lee 50 documents and the Pang–Lee sentences are evaluation data
only (:mod:`bertforge.runtime.embedder`); they never enter the corpus.
"""
from __future__ import annotations

import bz2
import hashlib
import json
import re
from pathlib import Path
from typing import Iterator, Optional

from ..errors import DataError
from .text_sources import split_sentences  # the pretraining pipeline's rule-based splitter
from ..io import atomic_write_text

WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEE_BACKGROUND = "lee_background.cor"
LEE_DOCS = "lee.cor"
LEE_SIMS = "similarities0-1.txt"
POLARITY = "pang_lee_polarity.cor"


def gensim_data_dir() -> Path:
    """The folder ``gensim/test/test_data`` of the installed gensim.

    Raises:
        DataError: gensim is not installed (``pip install gensim``) or ships no test data.
    """
    try:
        import gensim
    except ImportError:
        raise DataError("the embedded default data comes from gensim; pip install 'gensim>=4.3' "
                        "(or bertforge[embedded])") from None
    d = Path(gensim.__file__).parent / "test" / "test_data"
    if not (d / LEE_DOCS).is_file():
        raise DataError(f"{d} has no {LEE_DOCS}; reinstall gensim (a full wheel ships its test data)")
    return d


def _read_lines(path: Path) -> list:
    # lee.cor and pang_lee_polarity.cor are Windows-1252 (a "£", an em dash); the others UTF-8/ASCII
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace").splitlines()


# --------------------------------------------------------------------------------------- documents
_WIKI_QUOTES = re.compile(r"'{2,}")
_WIKI_HEADING = re.compile(r"^\s*=+.*=+\s*$")


def wiki_documents(path: Optional[Path] = None, min_words: int = 20) -> Iterator[tuple]:
    """Yield ``(title, [paragraph, …])`` for each article of the shipped Wikipedia dump.

    Markup is removed with gensim's ``filter_wiki`` (templates, links, tables, refs); remaining bold /
    italic quote runs, headings, list and table lines are dropped; redirects and paragraphs shorter than
    ``min_words`` words are skipped.
    """
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki
    path = Path(path) if path else gensim_data_dir() / WIKI_FILE
    with bz2.open(path) as f:
        for title, text, _pageid in extract_pages(f, filter_namespaces=("0",)):
            if text.lstrip().lower().startswith("#redirect"):
                continue
            clean = _WIKI_QUOTES.sub("", filter_wiki(text))
            paras = []
            for block in re.split(r"\n\s*\n", clean):
                lines = [ln for ln in block.splitlines()
                         if ln.strip() and not _WIKI_HEADING.match(ln)
                         and not ln.lstrip().startswith(("*", "#", "|", "{", "!", ":", ";"))]
                p = " ".join(" ".join(lines).split())
                p = re.sub(r"\(\s*[,;]?\s*\)", "", p)  # "( )" left where templates were removed
                p = re.sub(r"\s+([,.;:])", r"\1", p)
                if len(p.split()) >= min_words:
                    paras.append(p)
            if paras:
                yield title, paras


def lee_background_documents(path: Optional[Path] = None) -> Iterator[tuple]:
    """Yield ``(id, [text])`` for the 300 Lee background news documents (one per line)."""
    path = Path(path) if path else gensim_data_dir() / LEE_BACKGROUND
    for i, line in enumerate(_read_lines(path)):
        if line.strip():
            yield f"lee_background:{i}", [line.strip()]


def _held_out(key: str, fraction: float) -> bool:
    """Deterministic document split: a stable hash of the document id, not Python's salted hash()."""
    h = int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < fraction


def build_corpus(out_dir, heldout_fraction: float = 0.05, max_documents: Optional[int] = None,
                 min_sentence_words: int = 3) -> dict:
    """Write the embedded corpus to ``out_dir``: ``train.txt`` and ``heldout.txt`` (one sentence per
    line, a blank line between documents) and ``corpus.json`` (counts and provenance).

    Wikipedia paragraphs of one article form one document; each Lee background story is one document.
    Whole documents go to the held-out slice (``heldout_fraction`` of them, chosen by a stable hash of
    the document id), so no held-out sentence has a neighbour in training.

    Args:
        out_dir: folder to write (created).
        heldout_fraction: share of documents kept for evaluation, in (0, 1).
        max_documents: keep only the first N documents of each source (smoke runs).
        min_sentence_words: drop shorter sentence fragments.
    Returns:
        the ``corpus.json`` dict (``train``/``heldout`` documents, sentences, words; file paths).
    Raises:
        DataError: gensim missing; ConfigError-like values are reported as DataError.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise DataError(f"heldout_fraction={heldout_fraction} must be in (0, 1)")
    out_dir = Path(out_dir)
    parts = {"train": [], "heldout": []}
    stats = {k: {"documents": 0, "sentences": 0, "words": 0} for k in parts}
    sources = {"wikipedia": wiki_documents(), "lee_background": lee_background_documents()}
    per_source = {}
    for src, docs in sources.items():
        n = 0
        for doc_id, paras in docs:
            if max_documents is not None and n >= max_documents:
                break
            sents = [s for p in paras for s in split_sentences(p) if len(s.split()) >= min_sentence_words]
            if not sents:
                continue
            n += 1
            split = "heldout" if _held_out(f"{src}:{doc_id}", heldout_fraction) else "train"
            parts[split].append("\n".join(sents))
            st = stats[split]
            st["documents"] += 1
            st["sentences"] += len(sents)
            st["words"] += sum(len(s.split()) for s in sents)
        per_source[src] = n
    empty = [k for k in ("train", "heldout") if not parts[k]]
    if empty:
        raise DataError(f"the embedded corpus's {empty[0]} part came out empty ({stats['train']['documents']} "
                        f"train / {stats['heldout']['documents']} held-out documents); raise --max-documents"
                        f"{' or --heldout-fraction' if empty[0] == 'heldout' else ' or lower --heldout-fraction'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, docs in parts.items():
        atomic_write_text(out_dir / f"{split}.txt", "\n\n".join(docs) + "\n")
    info = {"sources": {"wikipedia": WIKI_FILE, "lee_background": LEE_BACKGROUND},
            "gensim_data_dir": str(gensim_data_dir()), "documents_per_source": per_source,
            "heldout_fraction": heldout_fraction, **stats,
            "files": {k: str(out_dir / f"{k}.txt") for k in parts}}
    atomic_write_text(out_dir / "corpus.json", json.dumps(info, indent=2))
    return info


# -------------------------------------------------------------------------------- evaluation data
def lee_corpus() -> tuple:
    """The Lee 50-document corpus: ``(documents: list[str] of 50, ratings: (50, 50) float array)``.

    ``ratings[i, j]`` (i < j) is the mean human similarity rating of documents i and j, in [0, 1];
    the file stores the upper triangle (ones on the diagonal, zeros below). The matrix is returned
    symmetrised. Raises DataError if the files disagree in size.
    """
    import numpy as np
    d = gensim_data_dir()
    docs = [ln.strip() for ln in _read_lines(d / LEE_DOCS) if ln.strip()]
    sims = np.loadtxt(d / LEE_SIMS)
    if sims.shape != (len(docs), len(docs)):
        raise DataError(f"{d / LEE_SIMS} is {sims.shape} but {d / LEE_DOCS} has {len(docs)} documents")
    sims = np.triu(sims) + np.triu(sims, 1).T
    return docs, sims


def polarity_sentences() -> tuple:
    """The 200 Pang–Lee polarity sentences: ``(texts: list[str], labels: list[int])``, 1 = positive."""
    texts, labels = [], []
    for ln in _read_lines(gensim_data_dir() / POLARITY):
        if not ln.strip():
            continue
        lab, _, text = ln.partition(" ")
        if lab not in ("__label__pos", "__label__neg"):
            raise DataError(f"{POLARITY}: unexpected label {lab!r}")
        texts.append(text.strip())
        labels.append(1 if lab == "__label__pos" else 0)
    return texts, labels


__all__ = ["build_corpus", "wiki_documents", "lee_background_documents",
           "lee_corpus", "polarity_sentences", "gensim_data_dir"]
